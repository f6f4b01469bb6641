//! Shared fixtures for berth-net's privileged tests (root, real kernel).
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use berth_net::testing::FakeInternet;
use berth_net::{Ceiling, HostNetwork, NetConfig, NetError};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A daemon's network on its own state dir and pool, with a ceiling admitting only
/// `internet`'s test block, guarded so its veths forward only there. Destroyed on drop.
pub struct TestNetwork {
    pub net: Option<HostNetwork>,
    pub state: tempfile::TempDir,
}

impl TestNetwork {
    pub fn new(internet: &mut FakeInternet) -> Self {
        Self::with(internet, |_| {})
    }

    /// Like `new`, with the config adjusted (limits, ports) before the start.
    pub fn with(internet: &mut FakeInternet, adjust: impl Fn(&mut NetConfig)) -> Self {
        let state = tempfile::Builder::new()
            .prefix("berth-net-test")
            .tempdir()
            .unwrap();
        let net = start_on(state.path(), internet, &adjust);
        let prefix = format!("{}v", net.link_prefix());
        let network = Self {
            net: Some(net),
            state,
        };
        internet.guard(&prefix);
        network
    }

    pub fn net(&self) -> &HostNetwork {
        self.net.as_ref().unwrap()
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        if let Some(net) = self.net.take() {
            if let Err(err) = net.destroy() {
                eprintln!("destroying the test network: {err}");
            }
        }
    }
}

/// Starts a network on `state` with a pool of its own: a /24 in 10.(100..200).x.0 that
/// overlaps nothing on the host (other daemons' pools included).
pub fn start_on(
    state: &Path,
    internet: &FakeInternet,
    adjust: &dyn Fn(&mut NetConfig),
) -> HostNetwork {
    let pid = std::process::id();
    for attempt in 0..200 {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst) + attempt;
        let second = 100 + (pid + n / 250) % 100;
        let third = (pid.wrapping_mul(7) + n) % 250;
        let mut config = NetConfig::new(state);
        config.sandbox_cidr = format!("10.{second}.{third}.0/24").parse().unwrap();
        config.ceiling = Ceiling::parse(&[internet.net().to_string()], &[] as &[&str]).unwrap();
        adjust(&mut config);
        match HostNetwork::start(config) {
            Ok(net) => return net,
            Err(NetError::PoolOverlaps { .. }) => continue,
            Err(e) => panic!("start network: {e}"),
        }
    }
    panic!("no free pool");
}

/// Starts a network on `state` again (a restarted daemon) with `like`'s pool and ceiling.
pub fn restart(state: &Path, like: &NetConfig) -> HostNetwork {
    let mut config = NetConfig::new(state);
    config.sandbox_cidr = like.sandbox_cidr;
    config.ceiling = like.ceiling.clone();
    HostNetwork::start(config).expect("restart network")
}

/// Runs `argv` in the network namespace pinned at `pin`, as host root.
pub fn in_netns(pin: &Path, argv: &[&str]) -> Output {
    Command::new("nsenter")
        .arg(format!("--net={}", pin.display()))
        .arg("--")
        .args(argv)
        .output()
        .expect("nsenter")
}

/// `curl` of `http://addr:port/` from the namespace at `pin`: the body, or None.
pub fn fetch(pin: &Path, addr: Ipv4Addr, port: u16) -> Option<String> {
    let url = format!("http://{addr}:{port}/");
    let out = in_netns(pin, &["curl", "-s", "--max-time", "3", &url]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Links whose names start with `prefix`.
pub fn links_with_prefix(prefix: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .filter(|name| name.starts_with(prefix))
        .collect()
}
