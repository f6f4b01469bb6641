//! berth's own numbers: create → envd `/health` answering, and idle-sandbox density,
//! through `berth_runtime::LinuxRuntime`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use berth_runtime::{LinuxRuntime, LinuxRuntimeConfig, Runtime, SandboxSpec};

/// envd's port inside every sandbox (E2B's).
const ENVD_PORT: u16 = 49983;
/// How long a sandbox may take to answer `/health` before the sample counts as failed.
const HEALTH_DEADLINE: Duration = Duration::from_secs(30);
/// Pause between connection attempts while envd is starting.
const HEALTH_RETRY: Duration = Duration::from_micros(250);

/// cgroup parent of the bench's sandboxes (a berth server uses "berth").
const CGROUP_PARENT: &str = "berth-bench";

/// Sizes of a benchmark sandbox (E2B's defaults for the base template).
const CPU_COUNT: u32 = 2;
pub const MEMORY_MB: u64 = 512;
const DISK_SIZE_MB: u64 = 1024;

/// A runtime in the benchmark's own state dir and cgroup parent. Every sandbox it
/// created is killed on drop, its host network and mounts released, and the state dir
/// removed.
pub struct SandboxBench {
    runtime: LinuxRuntime,
    layers: Vec<PathBuf>,
    live: Mutex<Vec<String>>,
    /// Declared after `runtime`: fields drop in order, and the runtime must be gone
    /// (its pool of ready disks unmounted) before the state dir can be removed.
    _state: StateCleanup,
}

/// Removes the bench's state dir and cgroup parents once the runtime is dropped.
struct StateCleanup {
    state_dir: PathBuf,
}

impl Drop for StateCleanup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.state_dir) {
            eprintln!("cleanup: remove {}: {e}", self.state_dir.display());
        }
        // The runtime made a parent group under each controller; it is empty now.
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.flatten() {
                let _ = std::fs::remove_dir(controller.path().join(CGROUP_PARENT));
            }
        }
    }
}

/// One sandbox's start: create returned, then envd answered.
#[derive(Debug, Clone, Copy)]
pub struct StartTimes {
    pub create: Duration,
    pub ready: Duration,
}

/// Idle sandboxes held at once, and what they cost the host.
#[derive(Debug, Clone)]
pub struct Density {
    pub created: usize,
    pub stopped_by: String,
    /// MemAvailable before creating minus MemAvailable with all of them up (bytes).
    pub mem_drop_on_create: i64,
    /// MemAvailable after killing them all minus MemAvailable with all of them up: the
    /// same cost seen from the other side, a check against noise from other processes.
    pub mem_rise_on_kill: i64,
    /// Sum of the sandboxes' memory cgroup usage (bytes).
    pub cgroup_memory: u64,
    /// Kernel slab with all of them up minus before (bytes).
    pub slab_growth: i64,
    pub kill_all: Duration,
}

impl SandboxBench {
    pub fn new(
        state_dir: &Path,
        envd: &Path,
        launcher: &Path,
        layers: Vec<PathBuf>,
        max_sandboxes: u32,
        criu_state_dir: Option<&Path>,
        network: bool,
    ) -> anyhow::Result<SandboxBench> {
        let mut config = LinuxRuntimeConfig::new(state_dir, envd);
        if network {
            // Egress through the host, with a ceiling admitting only the benchmarking
            // range (no sandbox of the bench talks to anything else).
            let mut net = berth_net::NetConfig::new(state_dir);
            net.sandbox_cidr = "10.202.0.0/16".parse().expect("bench pool");
            net.ceiling = berth_net::Ceiling::parse(&["198.18.0.0/15"], &[] as &[&str])
                .context("bench egress ceiling")?;
            config.network = Some(net);
        }
        if let Some(dir) = criu_state_dir {
            config.criu_state_dir = dir.to_path_buf();
        }
        config.launcher_binary = launcher.to_path_buf();
        config.cgroup_parent = CGROUP_PARENT.into();
        // A uid range of its own, away from a berth server's default one.
        config.uid_base = 3 << 29;
        config.max_sandboxes = max_sandboxes;
        let runtime = LinuxRuntime::new(config).context("start LinuxRuntime")?;
        // Sandboxes left by an interrupted earlier run of the bench are ours to remove.
        let report = runtime.recover().context("recover earlier bench state")?;
        for leftover in report.reattached {
            runtime
                .kill(&leftover.id)
                .context("kill leftover bench sandbox")?;
        }
        Ok(SandboxBench {
            runtime,
            layers,
            live: Mutex::new(Vec::new()),
            _state: StateCleanup {
                state_dir: state_dir.to_path_buf(),
            },
        })
    }

    pub fn runtime(&self) -> &LinuxRuntime {
        &self.runtime
    }

    /// The id of the bench's sandbox `tag`.
    pub fn sandbox_id(&self, tag: &str) -> String {
        format!("bench-{}-{tag}", std::process::id())
    }

    /// Kill sandbox `id` (made by the runtime directly, e.g. a restore) on drop.
    pub fn track(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.to_owned());
    }

    /// Create sandbox `tag`, wait for envd's `/health`, return the times.
    pub fn start(&self, tag: &str) -> anyhow::Result<(String, StartTimes)> {
        self.start_sized(tag, MEMORY_MB)
    }

    /// [`SandboxBench::start`] with a memory limit of `memory_mb`.
    pub fn start_sized(&self, tag: &str, memory_mb: u64) -> anyhow::Result<(String, StartTimes)> {
        let id = self.sandbox_id(tag);
        let spec = SandboxSpec {
            id: id.clone(),
            template: "base".into(),
            layers: self.layers.clone(),
            cpu_count: CPU_COUNT,
            memory_mb,
            disk_size_mb: DISK_SIZE_MB,
            volumes: Vec::new(),
        };
        let started = Instant::now();
        self.runtime
            .create(&spec)
            .with_context(|| format!("create {id}"))?;
        let create = started.elapsed();
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.clone());
        self.wait_healthy(&id)?;
        let ready = started.elapsed();
        Ok((id, StartTimes { create, ready }))
    }

    /// Kill sandbox `id` and return how long that took.
    pub fn kill(&self, id: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|live| live != id);
        self.runtime
            .kill(id)
            .with_context(|| format!("kill {id}"))?;
        Ok(started.elapsed())
    }

    fn wait_healthy(&self, id: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + HEALTH_DEADLINE;
        let mut last_error = String::new();
        while Instant::now() < deadline {
            match self.health(id) {
                Ok(()) => return Ok(()),
                Err(e) => last_error = format!("{e:#}"),
            }
            std::thread::sleep(HEALTH_RETRY);
        }
        bail!("{id}: envd /health did not answer within {HEALTH_DEADLINE:?}: {last_error}")
    }

    /// One `GET /health` over a connection made inside the sandbox's network namespace.
    fn health(&self, id: &str) -> anyhow::Result<()> {
        let mut stream = self.runtime.connect(id, ENVD_PORT)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let status_line = response.split(|b| *b == b'\n').next().unwrap_or_default();
        let status = String::from_utf8_lossy(status_line);
        let code = status.split_whitespace().nth(1).unwrap_or_default();
        if code.starts_with('2') {
            Ok(())
        } else {
            Err(anyhow!("/health answered {:?}", status.trim()))
        }
    }

    /// Create idle sandboxes (each answering `/health`) until one fails or `max` exist,
    /// measure host memory, then kill them all.
    pub fn density(
        &self,
        max: usize,
        mut on_progress: impl FnMut(usize),
    ) -> anyhow::Result<Density> {
        settle();
        let before = MemInfo::read()?;
        let mut ids = Vec::new();
        let mut stopped_by = format!("reached the maximum of {max}");
        for i in 0..max {
            match self.start(&format!("d{i}")) {
                Ok((id, _)) => ids.push(id),
                Err(e) => {
                    stopped_by = format!("sandbox {} failed: {e:#}", i + 1);
                    break;
                }
            }
            if (i + 1) % 50 == 0 {
                on_progress(i + 1);
            }
        }
        settle();
        let after = MemInfo::read()?;
        let mut cgroup_memory = 0;
        for id in &ids {
            cgroup_memory += self.runtime.stats(id).map(|s| s.mem_used).unwrap_or(0);
        }
        let kill_started = Instant::now();
        for id in &ids {
            self.kill(id)?;
        }
        let kill_all = kill_started.elapsed();
        settle();
        let released = MemInfo::read()?;
        Ok(Density {
            created: ids.len(),
            stopped_by,
            mem_drop_on_create: before.available as i64 - after.available as i64,
            mem_rise_on_kill: released.available as i64 - after.available as i64,
            cgroup_memory,
            slab_growth: after.slab as i64 - before.slab as i64,
            kill_all,
        })
    }
}

impl Drop for SandboxBench {
    fn drop(&mut self) {
        let live = std::mem::take(&mut *self.live.lock().unwrap_or_else(|e| e.into_inner()));
        for id in live {
            if let Err(e) = self.runtime.kill(&id) {
                eprintln!("cleanup: kill {id}: {e}");
            }
        }
        // The envd filesystem, the resource views and, with networking, the gateway
        // link and nftables table outlive a daemon by design; the bench's go with it.
        if let Err(e) = self.runtime.release_network_if_idle() {
            eprintln!("cleanup: release the network, envd filesystem and views: {e}");
        }
    }
}

/// Let page cache writeback and RCU-freed memory settle before reading /proc/meminfo.
fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::thread::sleep(Duration::from_secs(2));
}

/// The /proc/meminfo fields density is judged by, in bytes.
struct MemInfo {
    available: u64,
    slab: u64,
}

impl MemInfo {
    fn read() -> anyhow::Result<MemInfo> {
        let text = std::fs::read_to_string("/proc/meminfo")?;
        let field = |name: &str| -> anyhow::Result<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map(|kib| kib * 1024)
                .ok_or_else(|| anyhow!("/proc/meminfo has no {name}"))
        };
        Ok(MemInfo {
            available: field("MemAvailable")?,
            slab: field("Slab")?,
        })
    }
}
