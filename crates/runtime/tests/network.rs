//! Sandbox networking from inside real sandboxes (berth's `base` template) against a
//! fake internet of the test's own hosts: default egress, policies set at create and
//! live, isolation from the host and other sandboxes, root inside unable to reconfigure,
//! pause/resume and fork. Privileged. Traffic goes only to the test's own hosts.

mod common;

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;

use berth_net::testing::FakeInternet;
use berth_net::{E2bNetworkConfig, NetworkPolicy};
use berth_runtime::{Durability, LinuxRuntime, Runtime};
use common::checkpoint::{criu, KillGuard};
use common::TestRuntime;

fn policy(allow_internet: Option<bool>, json: &str) -> NetworkPolicy {
    let config: E2bNetworkConfig = serde_json::from_str(json).unwrap();
    NetworkPolicy::from_e2b_create(allow_internet, Some(&config)).unwrap()
}

/// `curl http://addr:port/` inside sandbox `id` as `uid`: the body, or None.
fn fetch(t: &TestRuntime, id: &str, uid: u32, addr: Ipv4Addr, port: u16) -> Option<String> {
    let out = t.sh(
        id,
        uid,
        &format!("curl -s --max-time 3 http://{addr}:{port}/"),
    );
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The source address the sandbox uses toward `addr`.
fn own_address(t: &TestRuntime, id: &str, addr: Ipv4Addr) -> String {
    t.sh_ok(
        id,
        1000,
        &format!(
            "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.connect(('{addr}', 80)); print(s.getsockname()[0])\""
        ),
    )
}

fn internet_with_servers(hosts: usize) -> FakeInternet {
    let mut internet = FakeInternet::new(hosts);
    for addr in internet
        .hosts()
        .into_iter()
        .chain([internet.outside_host()])
    {
        internet.serve_http(addr, 80);
    }
    internet
}

#[test]
fn default_egress_and_isolation_from_the_host_and_other_sandboxes() {
    let mut internet = internet_with_servers(1);
    let t = TestRuntime::with_network(&mut internet, |_| {});
    let a = internet.host(0);
    let one = t.rt.create(&t.spec("net-one")).unwrap();
    let two = t.rt.create(&t.spec("net-two")).unwrap();
    let _guards = [&one, &two].map(|s| KillGuard {
        rt: &t.rt,
        id: s.id.clone(),
    });
    let net = t.rt.network().unwrap();
    let (one_net, two_net) = (net.sandbox(&one.id).unwrap(), net.sandbox(&two.id).unwrap());

    // As an unprivileged user and as root.
    for uid in [1000, 0] {
        let body = fetch(&t, &one.id, uid, a, 80).expect("default egress");
        assert_eq!(body, format!("{a}:80 saw {}\n", internet.host_side()));
    }
    assert_eq!(own_address(&t, &one.id, a), one_net.addr.to_string());
    assert_eq!(
        t.sh_ok(&one.id, 1000, "cat /etc/resolv.conf"),
        format!("nameserver {}", one_net.gateway)
    );
    assert_eq!(
        fetch(&t, &one.id, 0, internet.outside_host(), 80),
        None,
        "outside the ceiling"
    );

    // Listeners on the host: its address on the fake internet's link, and the gateway.
    let listeners = [
        TcpListener::bind((internet.host_side(), 0)).unwrap(),
        TcpListener::bind((one_net.gateway, 0)).unwrap(),
    ];
    for listener in &listeners {
        let local = listener.local_addr().unwrap();
        let std::net::IpAddr::V4(ip) = local.ip() else {
            unreachable!()
        };
        assert_eq!(
            fetch(&t, &one.id, 0, ip, local.port()),
            None,
            "host listener {local}"
        );
    }
    // Another sandbox, listening as root on port 80 (allowed by the namespace's sysctl).
    t.sh_ok(
        &two.id,
        0,
        "setsid python3 -m http.server --bind 0.0.0.0 80 </dev/null >/dev/null 2>&1 & sleep 0.5",
    );
    assert_eq!(
        fetch(&t, &two.id, 0, Ipv4Addr::LOCALHOST, 80).map(|b| !b.is_empty()),
        Some(true)
    );
    assert_eq!(
        fetch(&t, &one.id, 0, two_net.addr, 80),
        None,
        "sandbox to sandbox"
    );

    // Root inside cannot reconfigure its network or open raw sockets.
    for script in [
        "ip addr add 10.99.0.1/32 dev eth0",
        "ip route replace default dev eth0",
        "ip link set eth0 down",
        "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
        "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'",
    ] {
        let out = t.sh(&one.id, 0, script);
        assert!(!out.status.success(), "`{script}` succeeded as root inside");
    }
    assert!(fetch(&t, &one.id, 0, a, 80).is_some(), "still works");

    // envd-style access from the host still goes through the sandbox's loopback.
    t.sh_ok(
        &one.id,
        0,
        "setsid python3 -m http.server --bind 127.0.0.1 8123 </dev/null >/dev/null 2>&1 & sleep 0.5",
    );
    assert!(t.rt.connect(&one.id, 8123).is_ok());

    let addr = one_net.addr;
    t.rt.kill(&one.id).unwrap();
    net.settle();
    assert!(net.sandbox(&one.id).is_none());
    assert!(!one_net.netns_path.exists());
    assert_eq!(net.conntrack_entries(addr).unwrap(), 0);
}

#[test]
fn policies_at_create_and_live() {
    let mut internet = internet_with_servers(2);
    let t = TestRuntime::with_network(&mut internet, |_| {});
    let (a, b) = (internet.host(0), internet.host(1));

    let none =
        t.rt.create_with_network(&t.spec("net-none"), &policy(Some(false), "{}"))
            .unwrap();
    let _g1 = KillGuard {
        rt: &t.rt,
        id: none.id.clone(),
    };
    assert_eq!(fetch(&t, &none.id, 0, a, 80), None, "no internet access");
    assert_eq!(fetch(&t, &none.id, 0, b, 80), None);

    let one_ip =
        t.rt.create_with_network(
            &t.spec("net-one-ip"),
            &policy(
                None,
                &format!(r#"{{"allowOut":["{b}"],"denyOut":["0.0.0.0/0"]}}"#),
            ),
        )
        .unwrap();
    let _g2 = KillGuard {
        rt: &t.rt,
        id: one_ip.id.clone(),
    };
    assert_eq!(fetch(&t, &one_ip.id, 0, a, 80), None, "deny all");
    assert!(fetch(&t, &one_ip.id, 0, b, 80).is_some(), "allow one IP");

    // Live: deny one IP, then clear.
    let id = one_ip.id.as_str();
    t.rt.set_network_policy(id, &policy(None, &format!(r#"{{"denyOut":["{a}"]}}"#)))
        .unwrap();
    assert_eq!(fetch(&t, id, 0, a, 80), None, "deny one IP");
    assert!(fetch(&t, id, 0, b, 80).is_some());
    t.rt.set_network_policy(id, &NetworkPolicy::default())
        .unwrap();
    assert!(fetch(&t, id, 0, a, 80).is_some(), "cleared");
    assert_eq!(t.rt.network_policy(id), Some(NetworkPolicy::default()));

    assert!(matches!(
        t.rt.set_network_policy("inope", &NetworkPolicy::default()),
        Err(berth_runtime::RuntimeError::NotFound(_))
    ));
}

#[test]
fn restart_keeps_networks_and_policies() {
    let mut internet = internet_with_servers(2);
    let t = TestRuntime::with_network(&mut internet, |_| {});
    let (a, b) = (internet.host(0), internet.host(1));
    let denied_b = policy(None, &format!(r#"{{"denyOut":["{b}"]}}"#));
    let info =
        t.rt.create_with_network(&t.spec("net-restart"), &denied_b)
            .unwrap();
    let _guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    // A second daemon on the same state (as after kill -9 and a restart).
    let again = t.reopen();
    let report = again.recover().unwrap();
    assert_eq!(report.reattached.len(), 1);
    assert_eq!(again.network_policy(&info.id), Some(denied_b));
    assert!(fetch(&t, &info.id, 0, a, 80).is_some());
    assert_eq!(fetch(&t, &info.id, 0, b, 80), None);
}

fn checkpoint_dir(t: &TestRuntime, name: &str) -> PathBuf {
    let dir = t.state.join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn pause_resume_keeps_connectivity_and_policy_and_forks_get_their_own_address() {
    let criu = criu();
    let mut internet = internet_with_servers(2);
    let t = TestRuntime::with_network(&mut internet, |_| {});
    let (a, b) = (internet.host(0), internet.host(1));
    let denied_b = policy(None, &format!(r#"{{"denyOut":["{b}"]}}"#));
    let info =
        t.rt.create_with_network(&t.spec("net-pause"), &denied_b)
            .unwrap();
    let id = info.id.clone();
    let _guard = KillGuard {
        rt: &t.rt,
        id: id.clone(),
    };
    let net = t.rt.network().unwrap();
    let before = net.sandbox(&id).unwrap();
    assert!(fetch(&t, &id, 0, a, 80).is_some());

    let images = checkpoint_dir(&t, &id);
    t.rt.pause_with_memory(&criu, &id, &images).unwrap();
    assert!(
        before.netns_path.exists(),
        "the namespace is kept while paused"
    );
    {
        // The same state without networking refuses to resume it: CRIU would restore
        // the tree into the host's network namespace.
        let plain = LinuxRuntime::new(common::test_config(&t.state, t.cgroup_parent())).unwrap();
        let refused = plain.resume_paused(&criu, &id);
        assert!(
            matches!(
                refused,
                Err(berth_runtime::RuntimeError::Network(
                    berth_net::NetError::CheckpointNeedsNetwork { .. }
                ))
            ),
            "{refused:?}"
        );
        assert!(plain.is_paused(&id));
    }
    t.rt.resume_paused(&criu, &id).unwrap();
    assert_eq!(
        net.sandbox(&id),
        Some(before.clone()),
        "same address and link"
    );
    assert!(fetch(&t, &id, 0, a, 80).is_some(), "egress after resume");
    assert_eq!(fetch(&t, &id, 0, b, 80), None, "policy after resume");
    assert_eq!(own_address(&t, &id, a), before.addr.to_string());

    // Fork: a new sandbox from a checkpoint, with its own namespace and address, and
    // the source's policy.
    let path = checkpoint_dir(&t, "net-fork-checkpoint");
    t.rt.checkpoint_into(&criu, &id, &path, Durability::Durable)
        .unwrap();
    assert_eq!(
        LinuxRuntime::read_checkpoint(&path).unwrap().network,
        Some(denied_b.clone())
    );
    let fork =
        t.rt.restore_checkpoint(&criu, &path, &t.spec("net-fork"))
            .unwrap();
    let _fork_guard = KillGuard {
        rt: &t.rt,
        id: fork.id.clone(),
    };
    let forked = net.sandbox(&fork.id).unwrap();
    assert_ne!(forked.addr, before.addr);
    assert_ne!(forked.netns_path, before.netns_path);
    assert_eq!(own_address(&t, &fork.id, a), forked.addr.to_string());
    assert!(fetch(&t, &fork.id, 0, a, 80).is_some(), "fork egress");
    assert_eq!(
        fetch(&t, &fork.id, 0, b, 80),
        None,
        "fork inherits the policy"
    );
    assert_eq!(t.rt.network_policy(&fork.id), Some(denied_b));
    // The source is unaffected.
    assert!(fetch(&t, &id, 0, a, 80).is_some());
    // A runtime without networking refuses it: it could not enforce the policy.
    let plain = TestRuntime::new();
    let refused = plain
        .rt
        .restore_checkpoint(&criu, &path, &plain.spec("net-fork-plain"));
    assert!(
        matches!(
            refused,
            Err(berth_runtime::RuntimeError::Network(
                berth_net::NetError::Disabled
            ))
        ),
        "{refused:?}"
    );
    std::fs::remove_dir_all(&path).unwrap();
}

#[test]
fn envd_answers_with_networking() {
    let mut internet = internet_with_servers(1);
    let envd = common::envd_binary();
    let t = TestRuntime::with_network(&mut internet, move |config| {
        common::use_envd(config, envd.clone());
    });
    let info = t.rt.create(&t.spec("net-envd")).unwrap();
    let _guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    assert!(t.wait_envd_health(&info.id).contains("20"));
}

#[test]
fn a_daemon_crash_is_reconciled_at_restart() {
    let mut internet = internet_with_servers(1);
    let t = TestRuntime::with_network(&mut internet, |_| {});
    let a = internet.host(0);
    let live = t.rt.create(&t.spec("net-live")).unwrap();
    let dead = t.rt.create(&t.spec("net-dead")).unwrap();
    let _guards = [&live, &dead].map(|s| KillGuard {
        rt: &t.rt,
        id: s.id.clone(),
    });
    let net = t.rt.network().unwrap();
    let dead_net = net.sandbox(&dead.id).unwrap();
    assert!(fetch(&t, &dead.id, 0, a, 80).is_some());
    // One sandbox dies while its daemon is gone (kill -9 of the daemon, then of it).
    // SAFETY: SIGKILL to the sandbox's init, a process this test made.
    assert_eq!(unsafe { libc::kill(dead.init_pid, libc::SIGKILL) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{}/stat", dead.init_pid)).exists()
        && std::fs::read_to_string(format!("/proc/{}/stat", dead.init_pid))
            .is_ok_and(|s| !s.contains(") Z "))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let again = t.reopen();
    let report = again.recover().unwrap();
    assert!(report.cleaned.contains(&dead.id), "{report:?}");
    let net2 = again.network().unwrap();
    assert!(net2.sandbox(&dead.id).is_none());
    assert!(!dead_net.netns_path.exists());
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&links.stdout).contains(&format!("{}:", dead_net.veth)));
    assert!(!net2
        .list_table()
        .unwrap()
        .contains(&format!("{} ", dead_net.addr)));
    assert!(
        fetch(&t, &live.id, 0, a, 80).is_some(),
        "the live one keeps its network"
    );
}

fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Measures (prints, asserts nothing about time) what networking adds to create and kill,
/// in process, and checks that nothing of the sandboxes is left.
#[test]
fn create_and_kill_cost_with_and_without_networking() {
    let mut internet = FakeInternet::new(1);
    let plain = TestRuntime::new();
    let networked = TestRuntime::with_network(&mut internet, |_| {});
    let rounds = 100;
    let mut report = Vec::new();
    for (name, t) in [("loopback only", &plain), ("networking", &networked)] {
        let (mut create, mut kill) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let spec = t.spec("net-cost");
            let started = std::time::Instant::now();
            let info = t.rt.create(&spec).unwrap();
            create.push(started.elapsed());
            let started = std::time::Instant::now();
            t.rt.kill(&info.id).unwrap();
            kill.push(started.elapsed());
        }
        create.sort();
        kill.sort();
        report.push(format!(
            "{name}: create median {:?} p99 {:?}; kill median {:?} p99 {:?} ({rounds} rounds)",
            percentile(&create, 0.5),
            percentile(&create, 0.99),
            percentile(&kill, 0.5),
            percentile(&kill, 0.99)
        ));
    }
    eprintln!("{}", report.join("\n"));
    let net = networked.rt.network().unwrap();
    net.settle();
    assert!(net.ids().is_empty());
    assert_eq!(
        std::fs::read_dir(networked.state.join("net/netns"))
            .unwrap()
            .count(),
        0
    );
}

/// Stands in for berth's DNS server and egress proxy on the gateway: DNS from any
/// sandbox (to any address) arrives at the DNS port; with domain rules, TCP 80/443 to an
/// address not allowed by CIDR arrives at the HTTP/TLS ports; with no internet access,
/// not even DNS leaves.
#[test]
fn dns_and_domain_traffic_go_to_the_egress_ports_on_the_gateway() {
    use std::net::UdpSocket;
    use std::time::Duration;
    let mut internet = internet_with_servers(1);
    let t = TestRuntime::with_network(&mut internet, |_| {});
    let a = internet.host(0);
    let net = t.rt.network().unwrap();
    let ports = net.config().ports;
    let gateway = net.gateway();
    let dns = UdpSocket::bind((gateway, ports.dns)).unwrap();
    dns.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let tls = TcpListener::bind((gateway, ports.tls)).unwrap();
    let http = TcpListener::bind((gateway, ports.http)).unwrap();

    let send_dns = |id: &str| {
        t.sh_ok(
            id,
            1000,
            &format!(
                "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
                 s.sendto(b'{id}', ('{a}', 53))\""
            ),
        );
    };
    let open = t.rt.create(&t.spec("net-dns")).unwrap();
    let none =
        t.rt.create_with_network(&t.spec("net-nodns"), &policy(Some(false), "{}"))
            .unwrap();
    let domains =
        t.rt.create_with_network(
            &t.spec("net-domains"),
            &policy(
                None,
                r#"{"allowOut":["*.example.test"],"denyOut":["0.0.0.0/0"]}"#,
            ),
        )
        .unwrap();
    let _guards = [&open, &none, &domains].map(|s| KillGuard {
        rt: &t.rt,
        id: s.id.clone(),
    });
    let addr_of = |id: &str| std::net::IpAddr::V4(net.sandbox(id).unwrap().addr);

    send_dns(&none.id);
    send_dns(&open.id);
    let mut buf = [0u8; 64];
    let (n, from) = dns.recv_from(&mut buf).unwrap();
    assert_eq!(
        &buf[..n],
        open.id.as_bytes(),
        "only the sandbox with egress got through"
    );
    assert_eq!(from.ip(), addr_of(&open.id));

    for (listener, port, scheme) in [(&tls, 443, "https"), (&http, 80, "http")] {
        let id = domains.id.clone();
        let url = format!("{scheme}://{a}:{port}/");
        std::thread::scope(|scope| {
            scope.spawn(|| t.sh(&id, 1000, &format!("curl -s -k --max-time 2 {url}")));
            let (_conn, peer) = listener.accept().unwrap();
            assert_eq!(peer.ip(), addr_of(&id), "{scheme} went to the egress proxy");
        });
    }
    // Without domain rules, port 80 goes straight out to the test host.
    assert!(fetch(&t, &open.id, 0, a, 80).is_some());
}
