//! berth-runtime: the Linux isolation engine.
//!
//! Owns everything a sandbox is made of on the host: namespaces, the overlay root over
//! read-only template layers, cgroup limits, the per-sandbox network namespace, the
//! on-disk record of what was created, and the template store. It knows nothing of HTTP
//! or of the E2B API; the server drives it through the [`Runtime`] trait so another
//! backend (a microVM where real KVM exists) can slot in behind the same seam.

mod cgroup;
mod disk;
pub mod launch;
mod linux;
mod record;
mod seccomp;
mod sys;

pub use linux::{LinuxRuntime, LinuxRuntimeConfig, DEFAULT_ENVD_ARGS, UID_RANGE_SIZE};

use std::path::PathBuf;
use std::time::SystemTime;

/// What to create. Limits are already validated by the caller.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SandboxSpec {
    /// Sandbox id (`i` + 20 chars of `[a-z0-9]`), also the hostname.
    pub id: String,
    /// Template id the sandbox was made from (recorded, not interpreted).
    pub template: String,
    /// Read-only template layers for the overlay root, lowest first.
    pub layers: Vec<PathBuf>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
}

/// What the runtime knows about a live sandbox.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub template: String,
    /// Host pid of the sandbox's init (berth-envd).
    pub init_pid: i32,
    pub created_at: SystemTime,
    pub spec: SandboxSpec,
}

/// Resource usage sampled from the sandbox's cgroup and disk.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct SandboxStats {
    pub cpu_count: u32,
    /// Cumulative CPU time in nanoseconds (callers derive a percentage from two samples).
    pub cpu_usage_ns: u64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// Outcome of reattaching to on-disk state after a daemon restart.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    /// Sandboxes found alive and reattached.
    pub reattached: Vec<SandboxInfo>,
    /// Sandboxes whose remains were found dead and removed.
    pub cleaned: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

/// The seam between the control plane and an isolation backend.
pub trait Runtime: Send + Sync + 'static {
    /// Create and start a sandbox; returns once its init process runs.
    fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, RuntimeError>;
    /// Kill every process and remove every mount, cgroup, netns and byte of disk.
    fn kill(&self, id: &str) -> Result<(), RuntimeError>;
    fn freeze(&self, id: &str) -> Result<(), RuntimeError>;
    fn thaw(&self, id: &str) -> Result<(), RuntimeError>;
    fn stats(&self, id: &str) -> Result<SandboxStats, RuntimeError>;
    fn list(&self) -> Vec<SandboxInfo>;
    /// Find sandboxes recorded on disk by an earlier daemon; reattach or clean them.
    fn recover(&self) -> Result<RecoveryReport, RuntimeError>;
    /// Open a TCP connection to `port` on the sandbox's loopback (envd is 49983),
    /// created inside the sandbox's network namespace so nothing is exposed elsewhere.
    fn connect(&self, id: &str, port: u16) -> Result<std::net::TcpStream, RuntimeError>;
    /// Where the runtime keeps its state (records, upper dirs, templates).
    fn state_dir(&self) -> PathBuf;
}
