//! Privileged tests of the host side on a real kernel: namespaces made by
//! `HostNetwork::attach` (entered with nsenter as host root) against a fake internet.
//! Traffic goes only to the test's own hosts in its own namespaces.

mod common;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use berth_net::testing::FakeInternet;
use berth_net::{E2bNetworkConfig, NetworkPolicy};
use common::*;

fn policy(allow_internet: Option<bool>, json: &str) -> NetworkPolicy {
    let config: E2bNetworkConfig = serde_json::from_str(json).unwrap();
    NetworkPolicy::from_e2b_create(allow_internet, Some(&config)).unwrap()
}

#[test]
fn egress_reaches_only_allowed_test_hosts_and_policy_changes_live() {
    let mut internet = FakeInternet::new(2);
    let (a, b, outside) = (internet.host(0), internet.host(1), internet.outside_host());
    for addr in [a, b, outside] {
        internet.serve_http(addr, 80);
    }
    let t = TestNetwork::new(&mut internet);
    let net = t.net();
    let sbx = net.attach("sbx-egress", &NetworkPolicy::default()).unwrap();
    let pin = &sbx.netns_path;

    let body = fetch(pin, a, 80).expect("default egress reaches the test host");
    assert_eq!(
        body,
        format!("{a}:80 saw {}\n", internet.host_side()),
        "masqueraded"
    );
    assert!(fetch(pin, b, 80).is_some());
    assert_eq!(fetch(pin, outside, 80), None, "outside the ceiling");

    // Listeners on the host side: the fake internet's host address and the gateway.
    let host_listener = TcpListener::bind((internet.host_side(), 0)).unwrap();
    let gw_listener = TcpListener::bind((sbx.gateway, 0)).unwrap();
    for listener in [&host_listener, &gw_listener] {
        let addr = listener.local_addr().unwrap();
        let std::net::IpAddr::V4(ip) = addr.ip() else {
            unreachable!()
        };
        assert_eq!(fetch(pin, ip, addr.port()), None, "host listener {addr}");
    }

    net.set_policy(
        "sbx-egress",
        &policy(None, &format!(r#"{{"denyOut":["{a}"]}}"#)),
    )
    .unwrap();
    assert_eq!(fetch(pin, a, 80), None, "deny one IP");
    assert!(fetch(pin, b, 80).is_some());

    net.set_policy(
        "sbx-egress",
        &policy(
            None,
            &format!(r#"{{"allowOut":["{b}"],"denyOut":["0.0.0.0/0"]}}"#),
        ),
    )
    .unwrap();
    assert_eq!(fetch(pin, a, 80), None, "deny all");
    assert!(fetch(pin, b, 80).is_some(), "allow one IP");

    net.set_policy("sbx-egress", &policy(Some(false), "{}"))
        .unwrap();
    assert_eq!(fetch(pin, b, 80), None, "no internet");
    assert_eq!(net.policy("sbx-egress"), Some(policy(Some(false), "{}")));

    net.set_policy("sbx-egress", &NetworkPolicy::default())
        .unwrap();
    assert!(fetch(pin, a, 80).is_some(), "cleared");

    let addr = sbx.addr;
    net.detach("sbx-egress").unwrap();
    net.settle();
    assert!(!pin.exists());
    assert!(!links_with_prefix(&sbx.veth).contains(&sbx.veth));
    assert!(!net.list_table().unwrap().contains(&addr.to_string()));
    assert_eq!(net.conntrack_entries(addr).unwrap(), 0);
}

#[test]
fn live_update_cuts_an_open_connection() {
    let mut internet = FakeInternet::new(1);
    let a = internet.host(0);
    // A server that keeps the connection open: nc in the fake internet.
    let mut server = std::process::Command::new("ip")
        .args(["netns", "exec", &internet.netns, "python3", "-c"])
        .arg(format!(
            "import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('{a}',7000));s.listen(1);print('ready',flush=True)\nc,_=s.accept()\n\
             while True:\n  d=c.recv(100)\n  if not d: break\n  c.sendall(d)\n"
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
    }
    let t = TestNetwork::new(&mut internet);
    let net = t.net();
    let sbx = net.attach("sbx-cut", &NetworkPolicy::default()).unwrap();
    // The client echoes once, waits for the policy change, then tries again.
    let client = std::process::Command::new("nsenter")
        .arg(format!("--net={}", sbx.netns_path.display()))
        .args(["python3", "-c"])
        .arg(format!(
            "import socket,time,sys\nc=socket.create_connection(('{a}',7000),timeout=3)\n\
             c.sendall(b'one');assert c.recv(10)==b'one';print('first',flush=True)\n\
             sys.stdin.readline()\n\
             try:\n  c.sendall(b'two');d=c.recv(10);print('second',d,flush=True)\n\
             except Exception as e:\n  print('cut',type(e).__name__,flush=True)\n"
        ))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut client = client;
    let mut out = std::io::BufReader::new(client.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::{BufRead, Write};
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "first");
    net.set_policy(
        "sbx-cut",
        &policy(None, &format!(r#"{{"denyOut":["{a}"]}}"#)),
    )
    .unwrap();
    client.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("cut"), "the connection survived: {line}");
    let _ = client.wait();
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn sandbox_root_cannot_reconfigure_its_namespace() {
    let mut internet = FakeInternet::new(1);
    let t = TestNetwork::new(&mut internet);
    let sbx = t
        .net()
        .attach("sbx-root", &NetworkPolicy::default())
        .unwrap();
    // Root of a user namespace of its own, as in a sandbox, inside the sandbox's netns.
    let as_userns_root = |script: &str| {
        in_netns(
            &sbx.netns_path,
            &["unshare", "--user", "--map-root-user", "sh", "-c", script],
        )
    };
    for script in [
        "ip addr add 10.99.0.1/32 dev eth0",
        "ip route replace default dev eth0",
        "ip link set eth0 down",
        "nft add table inet escape",
        "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
        "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'",
    ] {
        let out = as_userns_root(script);
        assert!(
            !out.status.success(),
            "`{script}` succeeded as namespaced root"
        );
    }
    // The sysctls that let unprivileged processes bind low ports and ping.
    let out = in_netns(
        &sbx.netns_path,
        &[
            "cat",
            "/proc/sys/net/ipv4/ip_unprivileged_port_start",
            "/proc/sys/net/ipv6/conf/all/disable_ipv6",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n1\n");
    let out =
        as_userns_root("python3 -c 'import socket; s=socket.socket(); s.bind((\"0.0.0.0\", 80))'");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn spoofed_sources_are_dropped() {
    let mut internet = FakeInternet::new(1);
    let a = internet.host(0);
    internet.serve_http(a, 80);
    let t = TestNetwork::new(&mut internet);
    let net = t.net();
    let one = net
        .attach("sbx-spoof-1", &NetworkPolicy::default())
        .unwrap();
    let two = net
        .attach("sbx-spoof-2", &NetworkPolicy::default())
        .unwrap();
    assert!(fetch(&one.netns_path, a, 80).is_some());
    // As host root (a sandbox cannot), give sandbox one a second address: the other
    // sandbox's, then one outside the pool; traffic from either is dropped.
    for spoofed in [two.addr, Ipv4Addr::new(198, 18, 250, 250)] {
        let out = in_netns(
            &one.netns_path,
            &["ip", "addr", "add", &format!("{spoofed}/32"), "dev", "eth0"],
        );
        assert!(out.status.success());
        let url = format!("http://{a}/");
        let out = in_netns(
            &one.netns_path,
            &[
                "curl",
                "-s",
                "--max-time",
                "2",
                "--interface",
                &spoofed.to_string(),
                &url,
            ],
        );
        assert!(!out.status.success(), "spoofed {spoofed} got through");
        in_netns(
            &one.netns_path,
            &["ip", "addr", "del", &format!("{spoofed}/32"), "dev", "eth0"],
        );
    }
    // Sandbox to sandbox.
    let listener = in_netns(
        &two.netns_path,
        &["sh", "-c", "timeout 3 python3 -m http.server --bind 0.0.0.0 8000 >/dev/null 2>&1 & sleep 0.5; echo started"],
    );
    assert!(listener.status.success());
    assert_eq!(
        fetch(&one.netns_path, two.addr, 8000),
        None,
        "sandbox to sandbox"
    );
}

#[test]
fn restart_keeps_known_networks_and_reconcile_removes_the_rest() {
    let mut internet = FakeInternet::new(1);
    let a = internet.host(0);
    internet.serve_http(a, 80);
    let mut t = TestNetwork::new(&mut internet);
    let config = t.net().config().clone();
    let keep = t
        .net()
        .attach("sbx-keep", &policy(None, r#"{"denyOut":["198.18.250.1"]}"#))
        .unwrap();
    let gone = t
        .net()
        .attach("sbx-gone", &NetworkPolicy::default())
        .unwrap();
    // The daemon goes away without cleaning up (as after kill -9).
    drop(t.net.take());
    let net = restart(t.state.path(), &config);
    t.net = Some(net);
    let net = t.net();
    assert_eq!(net.sandbox("sbx-keep"), Some(keep.clone()));
    assert_eq!(
        net.policy("sbx-keep"),
        Some(policy(None, r#"{"denyOut":["198.18.250.1"]}"#))
    );
    assert!(
        fetch(&keep.netns_path, a, 80).is_some(),
        "connectivity after a restart"
    );
    let report = net
        .reconcile(&BTreeSet::from(["sbx-keep".to_owned()]))
        .unwrap();
    assert_eq!(report.removed, ["sbx-gone"]);
    assert!(!gone.netns_path.exists());
    assert!(links_with_prefix(&gone.veth).is_empty());
    assert!(fetch(&keep.netns_path, a, 80).is_some());
    // A record whose namespace and link vanished (a reboot) is rebuilt by ensure.
    std::process::Command::new("ip")
        .args(["link", "del", &keep.veth])
        .status()
        .unwrap();
    assert_eq!(fetch(&keep.netns_path, a, 80), None);
    net.ensure("sbx-keep").unwrap();
    assert!(fetch(&keep.netns_path, a, 80).is_some(), "rebuilt");
}

/// Detached sandboxes' conntrack entries go in a sweep they share, without anyone
/// waiting for it, and an address is handed out again only after its sweep.
#[test]
fn conntrack_sweeps_are_shared_and_come_before_an_address_returns() {
    let mut internet = FakeInternet::new(1);
    let a = internet.host(0);
    internet.serve_http(a, 80);
    // A /29: five sandbox addresses, so the sixth attach needs a detached one's.
    let t = TestNetwork::with(&mut internet, |config| {
        config.sandbox_cidr = ipnet::Ipv4Net::new(config.sandbox_cidr.network(), 29).unwrap();
    });
    let net = t.net();
    let sandboxes: Vec<_> = (0..5)
        .map(|i| {
            net.attach(&format!("sbx-sweep-{i}"), &NetworkPolicy::default())
                .unwrap()
        })
        .collect();
    for sbx in &sandboxes {
        assert!(fetch(&sbx.netns_path, a, 80).is_some());
        assert!(net.conntrack_entries(sbx.addr).unwrap() > 0);
    }

    // Two detached together, nobody settling: their entries go by themselves.
    net.detach("sbx-sweep-1").unwrap();
    net.detach("sbx-sweep-2").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while [1, 2]
        .iter()
        .any(|&i| net.conntrack_entries(sandboxes[i].addr).unwrap() > 0)
    {
        assert!(
            Instant::now() < deadline,
            "entries left 30 s after a detach"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        net.conntrack_entries(sandboxes[3].addr).unwrap() > 0,
        "others kept"
    );

    // The pool is full but for detached addresses: the next attach gets one of them,
    // swept first, so the new sandbox meets none of its predecessor's connections.
    let sixth = net
        .attach("sbx-sweep-5", &NetworkPolicy::default())
        .unwrap();
    net.attach("sbx-sweep-6", &NetworkPolicy::default())
        .unwrap();
    assert!(matches!(
        net.attach("sbx-sweep-7", &NetworkPolicy::default()),
        Err(berth_net::NetError::PoolExhausted { .. })
    ));
    net.detach("sbx-sweep-0").unwrap();
    let reused = net
        .attach("sbx-sweep-7", &NetworkPolicy::default())
        .unwrap();
    assert_eq!(reused.addr, sandboxes[0].addr);
    assert_eq!(
        net.conntrack_entries(reused.addr).unwrap(),
        0,
        "swept before reuse"
    );
    assert!(fetch(&reused.netns_path, a, 80).is_some());
    assert!(fetch(&sixth.netns_path, a, 80).is_some());
    for id in [
        "sbx-sweep-3",
        "sbx-sweep-4",
        "sbx-sweep-5",
        "sbx-sweep-6",
        "sbx-sweep-7",
    ] {
        net.detach(id).unwrap();
    }
    net.settle();
    for sbx in &sandboxes {
        assert_eq!(net.conntrack_entries(sbx.addr).unwrap(), 0, "{}", sbx.addr);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn five_hundred_cycles_leave_nothing_behind() {
    let mut internet = FakeInternet::new(1);
    let a = internet.host(0);
    internet.serve_http(a, 80);
    let t = TestNetwork::new(&mut internet);
    let net = t.net();
    let table_before = net.list_table().unwrap();
    let (mut attach, mut detach) = (Vec::new(), Vec::new());
    let mut addrs = BTreeSet::new();
    for i in 0..500 {
        let id = format!("sbx-cycle-{i}");
        let started = Instant::now();
        let sbx = net.attach(&id, &NetworkPolicy::default()).unwrap();
        attach.push(started.elapsed());
        if i % 50 == 0 {
            // Some traffic, so conntrack has entries to flush.
            assert!(fetch(&sbx.netns_path, a, 80).is_some());
            assert!(net.conntrack_entries(sbx.addr).unwrap() > 0);
        }
        addrs.insert(sbx.addr);
        let started = Instant::now();
        net.detach(&id).unwrap();
        detach.push(started.elapsed());
    }
    net.settle();
    attach.sort();
    detach.sort();
    eprintln!(
        "network attach: median {:?} p99 {:?}; detach: median {:?} p99 {:?} (500 cycles)",
        percentile(&attach, 0.5),
        percentile(&attach, 0.99),
        percentile(&detach, 0.5),
        percentile(&detach, 0.99)
    );
    assert_eq!(
        links_with_prefix(&format!("{}v", net.link_prefix())),
        Vec::<String>::new()
    );
    assert_eq!(
        std::fs::read_dir(t.state.path().join("net/netns"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(t.state.path().join("net/sandboxes"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(net.list_table().unwrap(), table_before, "no elements left");
    for addr in &addrs {
        assert_eq!(net.conntrack_entries(*addr).unwrap(), 0, "{addr}");
    }
    let routes = std::process::Command::new("ip")
        .args(["route"])
        .output()
        .unwrap();
    let routes = String::from_utf8_lossy(&routes.stdout);
    for addr in &addrs {
        assert!(
            !routes.contains(&format!("{addr} ")),
            "route to {addr} left"
        );
    }
}

#[test]
fn connection_cap_refuses_new_connections_past_the_limit() {
    let mut internet = FakeInternet::new(1);
    let a = internet.host(0);
    // A server that holds every connection open.
    let mut server = std::process::Command::new("ip")
        .args(["netns", "exec", &internet.netns, "python3", "-c"])
        .arg(format!(
            "import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('{a}',7001));s.listen(16);print('ready',flush=True)\nheld=[]\n\
             while True:\n  held.append(s.accept()[0])\n"
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
    }
    let t = TestNetwork::with(&mut internet, |config| config.limits.max_connections = 3);
    let sbx = t
        .net()
        .attach("sbx-cap", &NetworkPolicy::default())
        .unwrap();
    let out = in_netns(
        &sbx.netns_path,
        &[
            "python3",
            "-c",
            &format!(
                "import socket\nheld=[]\nfor i in range(5):\n  try:\n    \
                 held.append(socket.create_connection(('{a}',7001),timeout=2)); print('ok')\n  \
                 except OSError as e: print('refused')\n"
            ),
        ],
    );
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok\nok\nok\nrefused\nrefused\n"
    );
}

#[test]
fn bandwidth_cap_is_enforced() {
    let mut internet = FakeInternet::new(1);
    let a = internet.host(0);
    // 4 MiB from the fake internet: 32 s at the cap below, well under a second without.
    let mut server = std::process::Command::new("ip")
        .args(["netns", "exec", &internet.netns, "python3", "-c"])
        .arg(format!(
            "import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('{a}',7002));s.listen(8);print('ready',flush=True)\nbody=b'x'*(4<<20)\n\
             while True:\n  c,_=s.accept()\n  n=int(c.recv(16))\n  \
             try: c.sendall(body[:n])\n  except OSError: pass\n  c.close()\n"
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
    }
    let t = TestNetwork::with(&mut internet, |config| {
        config.limits.ingress_bytes_per_sec = 128 * 1024;
    });
    let sbx = t
        .net()
        .attach("sbx-rate", &NetworkPolicy::default())
        .unwrap();
    let download = |bytes: usize| {
        let out = in_netns(
            &sbx.netns_path,
            &[
                "python3",
                "-c",
                &format!(
                    "import socket,time\nc=socket.create_connection(('{a}',7002),timeout=3)\n\
                     c.sendall(b'{bytes}');c.settimeout(None);got=0;end=time.time()+4\n\
                     c.settimeout(1)\nwhile time.time()<end:\n  try: d=c.recv(65536)\n  \
                     except socket.timeout: continue\n  if not d: break\n  got+=len(d)\n\
                     print(got)\n"
                ),
            ],
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<usize>()
            .unwrap_or(0)
    };
    assert_eq!(download(1024), 1024, "small transfers pass");
    let got = download(4 << 20);
    // The same transfer without the cap (another daemon, default limits) completes.
    let uncapped = TestNetwork::new(&mut internet);
    let free = uncapped
        .net()
        .attach("sbx-free", &NetworkPolicy::default())
        .unwrap();
    let out = in_netns(
        &free.netns_path,
        &[
            "python3",
            "-c",
            &format!(
                "import socket\nc=socket.create_connection(('{a}',7002),timeout=3)\n\
             c.sendall(b'{}');c.settimeout(10);got=0\nwhile True:\n  d=c.recv(65536)\n  \
             if not d: break\n  got+=len(d)\nprint(got)\n",
                4 << 20
            ),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (4 << 20).to_string()
    );
    let _ = server.kill();
    let _ = server.wait();
    // 4 s at 128 KiB/s plus a burst of a quarter of that: about 0.5 MiB, never 4 MiB.
    assert!(got < 2 << 20, "{got} bytes in 4 s through a 128 KiB/s cap");
    assert!(got > 0);
}
