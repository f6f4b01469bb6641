//! [`HostRuntime`]: a second [`Runtime`] that runs the real `berth-envd` as an ordinary
//! host process — no namespaces, no cgroups, no root needed — so everything above the
//! kernel (the API, the sandbox pipeline, the proxy, the agent tools) can be tested by
//! a plain `cargo test`.
//!
//! Each sandbox gets its own directory under the runtime's dir (its "disk": envd's
//! working directory) and its own loopback address `127.77.x.y`, on which its envd
//! listens at port 49983; [`Runtime::connect`] to any port of the sandbox goes to that
//! address. Nothing is isolated: this is a test double with real behaviour, never a
//! backend for untrusted code.
//!
//! Pause with memory stops the envd process (SIGSTOP; its memory stays where it is) and
//! resume continues it (SIGCONT) — the same observable contract as a CRIU checkpoint
//! within one runtime's lifetime. Pause without memory ends the process and keeps its
//! directory; resume starts a fresh envd on it. Checkpoints (snapshots, fork) are not
//! offered and fail with [`RuntimeError::Unsupported`]. Nothing survives the runtime:
//! dropping it kills every envd it started.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::{
    CheckpointInfo, RecoveryReport, ResumedSandbox, Runtime, RuntimeError, SandboxInfo,
    SandboxSpec, SandboxStats,
};

/// envd's port inside every sandbox.
const ENVD_PORT: u16 = 49983;

/// Hands out 127.77.0.1, 127.77.0.2, …: a loopback address per sandbox across every
/// `HostRuntime` of the process, so tests running in parallel never share one.
static NEXT_ADDRESS: AtomicU32 = AtomicU32::new(1);

enum State {
    Running(Child),
    /// SIGSTOPped: its memory is kept in place.
    PausedWithMemory(Child),
    /// Its process is gone; its directory is kept.
    PausedWithoutMemory,
}

struct HostSandbox {
    info: SandboxInfo,
    address: Ipv4Addr,
    state: State,
}

/// A runtime whose sandboxes are plain host processes (see the module doc).
pub struct HostRuntime {
    dir: PathBuf,
    envd_binary: PathBuf,
    max_sandboxes: usize,
    sandboxes: Mutex<HashMap<String, HostSandbox>>,
}

impl HostRuntime {
    /// Sandboxes live under `dir` (created if needed) and run `envd_binary`.
    pub fn new(
        dir: impl Into<PathBuf>,
        envd_binary: impl Into<PathBuf>,
    ) -> Result<Self, RuntimeError> {
        let dir = dir.into();
        let envd_binary = envd_binary.into();
        if !envd_binary.is_file() {
            return Err(RuntimeError::MissingBinary {
                what: "envd binary",
                path: envd_binary,
            });
        }
        fs::create_dir_all(dir.join("sandboxes")).map_err(io_err("create runtime dir"))?;
        Ok(HostRuntime {
            dir,
            envd_binary,
            max_sandboxes: usize::MAX,
            sandboxes: Mutex::new(HashMap::new()),
        })
    }

    /// Refuse creates beyond `max` sandboxes (running or paused), as a host out of
    /// slots does.
    pub fn with_max_sandboxes(mut self, max: usize) -> Self {
        self.max_sandboxes = max;
        self
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.dir.join("sandboxes").join(id)
    }

    fn sandboxes(&self) -> std::sync::MutexGuard<'_, HashMap<String, HostSandbox>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts envd for sandbox `id` in `dir`, listening on `address`.
    fn spawn_envd(&self, dir: &Path, address: Ipv4Addr) -> Result<Child, RuntimeError> {
        let mut command = Command::new(&self.envd_binary);
        command
            .arg("--listen")
            .arg(SocketAddr::from((address, ENVD_PORT)).to_string())
            .current_dir(dir)
            .env("HOME", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: the closure only makes async-signal-safe syscalls between fork and
        // exec: envd dies with the test process that started it, and (a setting kept
        // across exec) adopts its commands' orphans, so they stay in its tree.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0
                    || libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) < 0
                {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command.spawn().map_err(io_err("start envd"))
    }
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> RuntimeError {
    move |source| RuntimeError::Io {
        op: op.to_owned(),
        source,
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Every process under `root` (by parent links in `/proc`). envd is made a child
/// subreaper, so commands that daemonise are reparented to it and stay in its tree.
fn descendants(root: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // After "(comm)": state, then ppid.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// Signals envd (`child`) and every process under it.
fn signal_tree(child: &Child, signal: libc::c_int) {
    let mut pids = descendants(child.id());
    pids.push(child.id());
    for pid in pids {
        let Ok(pid) = i32::try_from(pid) else {
            continue;
        };
        // SAFETY: kill(2) with a pid read from /proc just now; envd itself is not yet
        // reaped, so its pid cannot have been reused.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

fn end(mut child: Child) {
    signal_tree(&child, libc::SIGKILL);
    let _ = child.wait();
}

fn unsupported(what: &'static str) -> RuntimeError {
    RuntimeError::Unsupported {
        backend: "host",
        what,
    }
}

impl Runtime for HostRuntime {
    fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        if !valid_id(&spec.id) {
            return Err(RuntimeError::InvalidId(spec.id.clone()));
        }
        if !spec.volumes.is_empty() {
            // Its sandboxes share the host's filesystem: nothing can be mounted for one.
            return Err(RuntimeError::Unsupported {
                backend: "host",
                what: "volume mounts",
            });
        }
        if self.sandboxes().len() >= self.max_sandboxes {
            return Err(RuntimeError::NoFreeSlot {
                max: u32::try_from(self.max_sandboxes).unwrap_or(u32::MAX),
            });
        }
        let dir = self.sandbox_dir(&spec.id);
        fs::create_dir(&dir).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => RuntimeError::AlreadyExists(spec.id.clone()),
            _ => io_err("create sandbox dir")(e),
        })?;
        let n = NEXT_ADDRESS.fetch_add(1, Ordering::Relaxed);
        let address = Ipv4Addr::new(127, 77, (n >> 8) as u8, (n & 0xff) as u8);
        let child = match self.spawn_envd(&dir, address) {
            Ok(child) => child,
            Err(err) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(err);
            }
        };
        let info = SandboxInfo {
            id: spec.id.clone(),
            template: spec.template.clone(),
            init_pid: child.id() as i32,
            created_at: SystemTime::now(),
            spec: spec.clone(),
        };
        self.sandboxes().insert(
            spec.id.clone(),
            HostSandbox {
                info: info.clone(),
                address,
                state: State::Running(child),
            },
        );
        Ok(info)
    }

    fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        let sandbox = self
            .sandboxes()
            .remove(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
        match sandbox.state {
            State::Running(child) | State::PausedWithMemory(child) => end(child),
            State::PausedWithoutMemory => {}
        }
        fs::remove_dir_all(self.sandbox_dir(id)).map_err(io_err("remove sandbox dir"))
    }

    fn freeze(&self, id: &str) -> Result<(), RuntimeError> {
        match &self.sandboxes().get(id).map(|s| &s.state) {
            Some(State::Running(child)) => {
                signal_tree(child, libc::SIGSTOP);
                Ok(())
            }
            _ => Err(RuntimeError::NotFound(id.to_owned())),
        }
    }

    fn thaw(&self, id: &str) -> Result<(), RuntimeError> {
        match &self.sandboxes().get(id).map(|s| &s.state) {
            Some(State::Running(child)) => {
                signal_tree(child, libc::SIGCONT);
                Ok(())
            }
            _ => Err(RuntimeError::NotFound(id.to_owned())),
        }
    }

    fn stats(&self, id: &str) -> Result<SandboxStats, RuntimeError> {
        let sandboxes = self.sandboxes();
        let Some(HostSandbox {
            info,
            state: State::Running(child),
            ..
        }) = sandboxes.get(id)
        else {
            return Err(RuntimeError::NotFound(id.to_owned()));
        };
        // envd's own usage (its commands are not counted: no cgroup to sum them in).
        let stat = fs::read_to_string(format!("/proc/{}/stat", child.id()))
            .map_err(io_err("read envd stat"))?;
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| {
            fields
                .get(n)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // After the command name: utime is field 14 of stat(5), rss 24 (1-based, counting
        // pid and comm), here 11 and 21.
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        Ok(SandboxStats {
            cpu_count: info.spec.cpu_count,
            cpu_usage_ns: (field(11) + field(12)) * 1_000_000_000 / ticks,
            mem_used: field(21) * page,
            mem_total: info.spec.memory_mb * 1024 * 1024,
            mem_cache: 0,
            disk_used: 0,
            disk_total: info.spec.disk_size_mb * 1024 * 1024,
        })
    }

    fn exited(&self) -> Vec<String> {
        self.sandboxes()
            .values_mut()
            .filter_map(|s| match &mut s.state {
                State::Running(child) => {
                    matches!(child.try_wait(), Ok(Some(_)) | Err(_)).then(|| s.info.id.clone())
                }
                _ => None,
            })
            .collect()
    }

    fn list(&self) -> Vec<SandboxInfo> {
        self.sandboxes()
            .values()
            .filter(|s| matches!(s.state, State::Running(_)))
            .map(|s| s.info.clone())
            .collect()
    }

    fn recover(&self) -> Result<RecoveryReport, RuntimeError> {
        // Nothing outlives the runtime that started it: leftover directories are dead.
        let mut report = RecoveryReport::default();
        let known: Vec<String> = self.sandboxes().keys().cloned().collect();
        let entries = fs::read_dir(self.dir.join("sandboxes")).map_err(io_err("list sandboxes"))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !known.contains(&name) {
                fs::remove_dir_all(entry.path()).map_err(io_err("remove dead sandbox"))?;
                report.cleaned.push(name);
            }
        }
        Ok(report)
    }

    fn connect(&self, id: &str, port: u16) -> Result<TcpStream, RuntimeError> {
        let address = match self.sandboxes().get(id) {
            Some(HostSandbox {
                address,
                state: State::Running(_),
                ..
            }) => *address,
            _ => return Err(RuntimeError::NotFound(id.to_owned())),
        };
        TcpStream::connect_timeout(&SocketAddr::from((address, port)), Duration::from_secs(5))
            .map_err(|source| RuntimeError::Io {
                op: format!("connect to port {port}"),
                source,
            })
    }

    fn pause(&self, id: &str, memory: bool) -> Result<(), RuntimeError> {
        let mut sandboxes = self.sandboxes();
        let sandbox = sandboxes
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
        let child = match std::mem::replace(&mut sandbox.state, State::PausedWithoutMemory) {
            State::Running(child) => child,
            paused => {
                // Like the Linux runtime: a paused sandbox is not a running one.
                sandbox.state = paused;
                return Err(RuntimeError::NotFound(id.to_owned()));
            }
        };
        if memory {
            signal_tree(&child, libc::SIGSTOP);
            sandbox.state = State::PausedWithMemory(child);
        } else {
            end(child);
        }
        Ok(())
    }

    fn resume(&self, id: &str, keep_memory: bool) -> Result<ResumedSandbox, RuntimeError> {
        let mut sandboxes = self.sandboxes();
        let sandbox = sandboxes
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
        let previous = std::mem::replace(&mut sandbox.state, State::PausedWithoutMemory);
        let (child, memory_restored) = match previous {
            State::Running(child) => {
                sandbox.state = State::Running(child);
                return Err(RuntimeError::NotPaused(id.to_owned()));
            }
            State::PausedWithMemory(child) if keep_memory => {
                signal_tree(&child, libc::SIGCONT);
                (child, true)
            }
            State::PausedWithMemory(child) => {
                end(child);
                (
                    self.spawn_envd(&self.sandbox_dir(id), sandbox.address)?,
                    false,
                )
            }
            State::PausedWithoutMemory => (
                self.spawn_envd(&self.sandbox_dir(id), sandbox.address)?,
                false,
            ),
        };
        sandbox.info.init_pid = child.id() as i32;
        sandbox.state = State::Running(child);
        Ok(ResumedSandbox {
            info: sandbox.info.clone(),
            memory_restored,
        })
    }

    fn checkpoint(
        &self,
        _id: &str,
        _checkpoint_id: &str,
        _durability: crate::Durability,
    ) -> Result<CheckpointInfo, RuntimeError> {
        Err(unsupported("checkpoints"))
    }

    fn restore(
        &self,
        _checkpoint_id: &str,
        _id: &str,
        _memory: bool,
    ) -> Result<SandboxInfo, RuntimeError> {
        Err(unsupported("checkpoints"))
    }

    fn delete_checkpoint(&self, _checkpoint_id: &str) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn checkpoints(&self) -> Result<Vec<String>, RuntimeError> {
        Ok(Vec::new())
    }

    /// A volume is a plain directory `volumes/<id>` owned by the test's own user, with no
    /// size limit; sandboxes of this runtime cannot mount it (see `create`).
    fn create_volume(&self, id: &str) -> Result<(), RuntimeError> {
        let dir = self.volume_dir(id)?;
        fs::create_dir_all(self.dir.join("volumes")).map_err(io_err("create volume dir"))?;
        match fs::create_dir(&dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(RuntimeError::VolumeExists(id.to_owned()))
            }
            other => other.map_err(io_err("create volume")),
        }
    }

    fn delete_volume(&self, id: &str) -> Result<(), RuntimeError> {
        match fs::remove_dir_all(self.volume_dir(id)?) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(RuntimeError::VolumeNotFound(id.to_owned()))
            }
            other => other.map_err(io_err("delete volume")),
        }
    }

    fn open_volume(&self, id: &str) -> Result<std::os::fd::OwnedFd, RuntimeError> {
        match fs::File::open(self.volume_dir(id)?) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(RuntimeError::VolumeNotFound(id.to_owned()))
            }
            other => other.map(Into::into).map_err(io_err("open volume")),
        }
    }
}

impl HostRuntime {
    fn volume_dir(&self, id: &str) -> Result<PathBuf, RuntimeError> {
        if !crate::volume::valid_volume_id(id) {
            return Err(RuntimeError::InvalidVolumeId(id.to_owned()));
        }
        Ok(self.dir.join("volumes").join(id))
    }
}

impl Drop for HostRuntime {
    fn drop(&mut self) {
        for (_, sandbox) in self.sandboxes().drain() {
            if let State::Running(child) | State::PausedWithMemory(child) = sandbox.state {
                end(child);
            }
        }
    }
}
