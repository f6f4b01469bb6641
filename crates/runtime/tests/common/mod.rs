//! Shared fixtures for the privileged runtime tests (run as root on a real kernel).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use berth_runtime::{LinuxRuntime, LinuxRuntimeConfig, Runtime, SandboxSpec};

pub mod checkpoint;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The template layers to run sandboxes on: `BERTH_TEST_ROOTFS` if set, else berth's
/// `base` template (built on first need into /var/lib/berth, then cached).
pub fn layers() -> Vec<PathBuf> {
    static LAYERS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    LAYERS
        .get_or_init(|| {
            if let Some(rootfs) = std::env::var_os("BERTH_TEST_ROOTFS") {
                return vec![PathBuf::from(rootfs)];
            }
            let store = berth_template::TemplateStore::open(berth_template::DEFAULT_STATE_DIR)
                .expect("open template store");
            store
                .ensure_base(|p| eprintln!("base template: {p:?}"))
                .expect("base template")
                .layers
        })
        .clone()
}

/// A runtime with its own state dir and cgroup parent, torn down on drop.
pub struct TestRuntime {
    // Field order matters: the runtime (and its pool and janitor threads) must be gone
    // before `_cleanup` removes the state dir and cgroup parent.
    pub rt: LinuxRuntime,
    pub state: PathBuf,
    cgroup_parent: String,
    /// The runtime's network config, for [`TestRuntime::reopen`].
    network: Option<berth_net::NetConfig>,
    _cleanup: StateCleanup,
}

/// Removes a test runtime's state dir and cgroup parent.
struct StateCleanup {
    state: PathBuf,
    cgroup_parent: String,
}

impl Drop for StateCleanup {
    fn drop(&mut self) {
        for ctrl in ["cpu", "cpuacct", "cpuset", "memory", "pids", "freezer", ""] {
            let _ = std::fs::remove_dir(
                Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(&self.cgroup_parent),
            );
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// The init used by tests: the host's `sleep infinity` (the rootfs has a compatible libc).
/// Makes the real berth-envd at `envd` the init, as `berth up` runs it (the launcher
/// hands it its listening socket).
pub fn use_envd(config: &mut LinuxRuntimeConfig, envd: PathBuf) {
    config.envd_binary = envd;
    config.envd_args = berth_runtime::default_envd_args();
    config.init_listen = Some(berth_runtime::DEFAULT_INIT_LISTEN);
}

pub fn test_config(state: &Path, cgroup_parent: &str) -> LinuxRuntimeConfig {
    let mut config = LinuxRuntimeConfig::new(state, "/usr/bin/sleep");
    config.envd_args = vec!["infinity".into()];
    // `sleep` serves nothing: a connection to envd's port must be refused, not queued.
    config.init_listen = None;
    config.launcher_binary = PathBuf::from(env!("CARGO_BIN_EXE_berth-launch"));
    config.cgroup_parent = cgroup_parent.to_owned();
    config.pids_max = 256;
    config
}

/// The berth-envd binary: `BERTH_ENVD_BIN`, else the workspace build (built if missing).
pub fn envd_binary() -> PathBuf {
    static ENVD: OnceLock<PathBuf> = OnceLock::new();
    ENVD.get_or_init(|| {
        if let Some(path) = std::env::var_os("BERTH_ENVD_BIN") {
            return PathBuf::from(path);
        }
        let launcher = Path::new(env!("CARGO_BIN_EXE_berth-launch"));
        let built = launcher.with_file_name("berth-envd");
        if !built.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["build", "-p", "berth-envd", "--bin", "berth-envd"])
                .status()
                .expect("run cargo build -p berth-envd");
            assert!(status.success(), "building berth-envd failed");
        }
        built
    })
    .clone()
}

impl TestRuntime {
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    /// A runtime whose init is the real berth-envd.
    pub fn with_envd() -> Self {
        let envd = envd_binary();
        Self::with(move |config| use_envd(config, envd))
    }

    pub fn with(adjust: impl FnOnce(&mut LinuxRuntimeConfig)) -> Self {
        let name = unique("berth-test");
        let state = PathBuf::from("/var/lib/berth-test").join(&name);
        std::fs::create_dir_all(&state).unwrap();
        let mut config = test_config(&state, &name);
        adjust(&mut config);
        let rt = LinuxRuntime::new(config).expect("runtime");
        let cleanup = StateCleanup {
            state: state.clone(),
            cgroup_parent: name.clone(),
        };
        Self {
            network: rt.config().network.clone(),
            rt,
            state,
            cgroup_parent: name,
            _cleanup: cleanup,
        }
    }

    /// A runtime with sandbox networking whose ceiling admits only `internet`'s test
    /// block, guarded so its veths forward nowhere else, on a pool (a /24 of 10.x) no
    /// other daemon on the host uses.
    pub fn with_network(
        internet: &mut berth_net::testing::FakeInternet,
        adjust: impl Fn(&mut LinuxRuntimeConfig),
    ) -> Self {
        let pid = std::process::id();
        for attempt in 0..200 {
            let n = COUNTER.fetch_add(1, Ordering::SeqCst) + attempt;
            let name = unique("berth-test");
            let state = PathBuf::from("/var/lib/berth-test").join(&name);
            std::fs::create_dir_all(&state).unwrap();
            let mut config = test_config(&state, &name);
            adjust(&mut config);
            let mut net = berth_net::NetConfig::new(&state);
            net.sandbox_cidr = format!(
                "10.{}.{}.0/24",
                100 + (pid + n / 250) % 100,
                (pid * 7 + n) % 250
            )
            .parse()
            .unwrap();
            net.ceiling =
                berth_net::Ceiling::parse(&[internet.net().to_string()], &[] as &[&str]).unwrap();
            config.network = Some(net.clone());
            let cleanup = StateCleanup {
                state: state.clone(),
                cgroup_parent: name.clone(),
            };
            match LinuxRuntime::new(config) {
                Ok(rt) => {
                    internet.guard(&format!("{}v", rt.network().unwrap().link_prefix()));
                    return Self {
                        network: Some(net),
                        rt,
                        state,
                        cgroup_parent: name,
                        _cleanup: cleanup,
                    };
                }
                Err(berth_runtime::RuntimeError::Network(berth_net::NetError::PoolOverlaps {
                    ..
                })) => continue,
                Err(e) => panic!("runtime with network: {e}"),
            }
        }
        panic!("no free sandbox pool");
    }

    /// A second runtime on the same state, as a restarted daemon would make.
    pub fn reopen(&self) -> LinuxRuntime {
        let mut config = test_config(&self.state, &self.cgroup_parent);
        config.network = self.network.clone();
        LinuxRuntime::new(config).expect("runtime")
    }

    /// GET `path` from envd inside sandbox `id` through [`Runtime::connect`]; the raw response.
    pub fn envd_get(&self, id: &str, path: &str) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut stream = self.rt.connect(id, 49983).map_err(std::io::Error::other)?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    }

    /// Polls envd's /health until it answers; the status line.
    pub fn wait_envd_health(&self, id: &str) -> String {
        // Generous: a loaded CI machine can take seconds to schedule a fresh envd.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if let Ok(response) = self.envd_get(id, "/health") {
                if let Some(status) = response.lines().next() {
                    return status.to_owned();
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("envd in {id} never answered /health");
    }

    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    pub fn spec(&self, name: &str) -> SandboxSpec {
        SandboxSpec {
            id: unique(name),
            template: "test".into(),
            layers: layers(),
            cpu_count: 1,
            memory_mb: 256,
            disk_size_mb: 256,
            volumes: Vec::new(),
        }
    }

    /// Runs `sh -c script` inside sandbox `id` as `uid`.
    pub fn sh(&self, id: &str, uid: u32, script: &str) -> Output {
        self.rt
            .exec_command(id, uid, uid, &["/bin/sh", "-c", script])
            .unwrap()
            .output()
            .unwrap()
    }

    /// Like `sh` but asserts success and returns trimmed stdout.
    pub fn sh_ok(&self, id: &str, uid: u32, script: &str) -> String {
        let out = self.sh(id, uid, script);
        assert!(
            out.status.success(),
            "`{script}` failed ({}): stdout={} stderr={}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for TestRuntime {
    fn drop(&mut self) {
        for info in self.rt.list() {
            let _ = self.rt.kill(&info.id);
        }
        if let Some(net) = self.rt.network() {
            if let Err(err) = net.destroy() {
                eprintln!("removing the test runtime's network: {err}");
            }
        }
    }
}
