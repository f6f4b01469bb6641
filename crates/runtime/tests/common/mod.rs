//! Shared fixtures for the privileged runtime tests (run as root on a real kernel).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use berth_runtime::{LinuxRuntime, LinuxRuntimeConfig, Runtime, SandboxSpec};

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
    pub rt: LinuxRuntime,
    pub state: PathBuf,
    cgroup_parent: String,
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// The init used by tests: the host's `sleep infinity` (the rootfs has a compatible libc).
pub fn test_config(state: &Path, cgroup_parent: &str) -> LinuxRuntimeConfig {
    let mut config = LinuxRuntimeConfig::new(state, "/usr/bin/sleep");
    config.envd_args = vec!["infinity".into()];
    config.launcher_binary = PathBuf::from(env!("CARGO_BIN_EXE_berth-launch"));
    config.cgroup_parent = cgroup_parent.to_owned();
    config.pids_max = 256;
    config
}

impl TestRuntime {
    pub fn new() -> Self {
        let name = unique("berth-test");
        let state = PathBuf::from("/var/lib/berth-test").join(&name);
        std::fs::create_dir_all(&state).unwrap();
        let rt = LinuxRuntime::new(test_config(&state, &name)).expect("runtime");
        Self {
            rt,
            state,
            cgroup_parent: name,
        }
    }

    /// A second runtime on the same state, as a restarted daemon would make.
    pub fn reopen(&self) -> LinuxRuntime {
        LinuxRuntime::new(test_config(&self.state, &self.cgroup_parent)).expect("runtime")
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
        for ctrl in ["cpu", "cpuacct", "memory", "pids", "freezer", ""] {
            let _ = std::fs::remove_dir(
                Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(&self.cgroup_parent),
            );
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}
