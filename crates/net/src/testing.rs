//! A fake internet for tests (feature `test-support`): a network namespace behind a veth
//! to the host, holding test hosts in 198.18.0.0/15 with HTTP servers, so sandboxes can
//! be given egress that reaches nothing but the test's own hosts.
//!
//! Each instance takes its own block `198.18.N.0/24` (hosts `.1`, `.2`, …) plus
//! `198.19.N.1`, a host meant to sit outside the test's ceiling; `198.19.N.254` is the
//! host side of the link. Set the daemon's ceiling to [`FakeInternet::net`] and
//! install [`FakeInternet::guard`] so the daemon's veths can forward nowhere but here.
//! Everything is removed on drop. The shell equivalent is `scripts/fake-internet.sh`.
//!
//! Setup uses the `ip` and `nft` tools (test code, not berth's hot path) and panics on
//! failure.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ipnet::Ipv4Net;

static COUNTER: AtomicU32 = AtomicU32::new(0);
/// Live instances in this process and the `ip_forward` value before the first.
static FORWARDING: Mutex<(usize, Option<String>)> = Mutex::new((0, None));

/// Runs a command, panicking with its output on failure.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn try_run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The test's internet. See the module docs.
pub struct FakeInternet {
    /// Name under /run/netns.
    pub netns: String,
    /// Host side of the veth.
    pub link: String,
    block: u8,
    hosts: usize,
    servers: Vec<Server>,
    guards: Vec<String>,
}

impl FakeInternet {
    /// A fake internet with `hosts` test hosts (198.18.N.1 …) plus the outside host.
    pub fn new(hosts: usize) -> Self {
        assert!((1..200).contains(&hosts));
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("{:x}", (pid << 8 | n) & 0xff_ffff);
        let netns = format!("bfi-{tag}");
        let link = format!("bfi{tag}");
        {
            let mut forwarding = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
            if forwarding.0 == 0 {
                forwarding.1 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").ok();
            }
            forwarding.0 += 1;
        }
        run("ip", &["netns", "add", &netns]);
        let mut me = Self {
            netns,
            link,
            block: 0,
            hosts,
            servers: Vec::new(),
            guards: Vec::new(),
        };
        run(
            "ip",
            &[
                "link", "add", &me.link, "type", "veth", "peer", "name", "eth0", "netns", &me.netns,
            ],
        );
        run("ip", &["link", "set", &me.link, "up"]);
        // A block no other fake internet on the host uses: its routes are ours alone.
        let start = (pid.wrapping_mul(31).wrapping_add(n * 7) % 250) as u8;
        let block = (0..250u8)
            .map(|i| start.wrapping_add(i) % 250 + 1)
            .find(|b| {
                try_run(
                    "ip",
                    &["route", "add", &format!("198.18.{b}.0/24"), "dev", &me.link],
                )
            })
            .expect("a free 198.18.N.0/24 block");
        me.block = block;
        run(
            "ip",
            &[
                "route",
                "add",
                &format!("198.19.{block}.0/24"),
                "dev",
                &me.link,
            ],
        );
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/32", me.host_side()),
                "dev",
                &me.link,
            ],
        );
        let ns = ["netns", "exec", me.netns.as_str()];
        let in_ns = |args: &[&str]| {
            let mut all: Vec<&str> = ns.to_vec();
            all.extend_from_slice(args);
            run("ip", &all);
        };
        in_ns(&["ip", "link", "set", "lo", "up"]);
        in_ns(&["ip", "link", "set", "eth0", "up"]);
        for addr in me.hosts().into_iter().chain([me.outside_host()]) {
            in_ns(&["ip", "addr", "add", &format!("{addr}/32"), "dev", "eth0"]);
        }
        in_ns(&["ip", "route", "add", "default", "dev", "eth0"]);
        me
    }

    /// Test host `i` (0-based).
    pub fn host(&self, i: usize) -> Ipv4Addr {
        assert!(i < self.hosts);
        Ipv4Addr::new(198, 18, self.block, i as u8 + 1)
    }

    pub fn hosts(&self) -> Vec<Ipv4Addr> {
        (0..self.hosts).map(|i| self.host(i)).collect()
    }

    /// The block holding the test hosts: the ceiling a test gives its daemon.
    pub fn net(&self) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::new(198, 18, self.block, 0), 24).expect("a /24")
    }

    /// A test host outside [`FakeInternet::net`].
    pub fn outside_host(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.block, 1)
    }

    /// The host's address on the link (a host address sandboxes must not reach).
    pub fn host_side(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.block, 254)
    }

    /// Serves HTTP on `addr:port` inside the fake internet: every request gets
    /// `200` with body `<addr>:<port> saw <client ip>\n`.
    pub fn serve_http(&mut self, addr: Ipv4Addr, port: u16) {
        let netns = std::fs::File::open(format!("/run/netns/{}", self.netns)).expect("netns");
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            // SAFETY: setns on a valid namespace fd; only this thread moves.
            let entered = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } == 0;
            let listener = entered
                .then(|| TcpListener::bind((addr, port)).ok())
                .flatten();
            let Some(listener) = listener else {
                let _ = ready_tx.send(false);
                return;
            };
            listener.set_nonblocking(true).expect("nonblocking");
            let _ = ready_tx.send(true);
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut stream, peer)) => {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut buf = [0u8; 4096];
                        let mut seen = Vec::new();
                        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        }
                        let body = format!("{addr}:{port} saw {}\n", peer.ip());
                        let _ = write!(
                            stream,
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        assert!(
            ready_rx.recv().unwrap_or(false),
            "HTTP server on {addr}:{port}"
        );
        self.servers.push(Server {
            stop,
            thread: Some(thread),
        });
    }

    /// Installs a forwarding guard (its own table): packets from links whose names start
    /// with `veth_prefix` (a berth daemon's sandbox veths) are forwarded only to this
    /// fake internet's link.
    pub fn guard(&mut self, veth_prefix: &str) {
        let table = format!(
            "bfi_guard_{}_{}",
            self.link.trim_start_matches("bfi"),
            self.guards.len()
        );
        run(
            "nft",
            &[&format!(
                "add table inet {table}; add chain inet {table} guard {{ type filter hook forward \
                 priority -300; policy accept; }}; add rule inet {table} guard \
                 iifname \"{veth_prefix}*\" oifname != \"{}\" drop",
                self.link
            )],
        );
        self.guards.push(table);
    }

    /// Runs `argv` inside the fake internet's namespace.
    pub fn exec(&self, argv: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .args(argv)
            .output()
            .expect("ip netns exec")
    }
}

impl Drop for FakeInternet {
    fn drop(&mut self) {
        for server in &mut self.servers {
            server.stop.store(true, Ordering::SeqCst);
            if let Some(thread) = server.thread.take() {
                let _ = thread.join();
            }
        }
        for table in &self.guards {
            try_run("nft", &["delete", "table", "inet", table]);
        }
        // Deleting the link removes its routes and address.
        try_run("ip", &["link", "del", &self.link]);
        try_run("ip", &["netns", "del", &self.netns]);
        let mut forwarding = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
        forwarding.0 -= 1;
        if forwarding.0 == 0 {
            if let Some(value) = forwarding.1.take() {
                let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", value);
            }
        }
    }
}
