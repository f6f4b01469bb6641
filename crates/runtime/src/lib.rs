//! berth-runtime: the Linux isolation engine.
//!
//! Owns everything a sandbox is made of on the host: namespaces, the overlay root over
//! read-only template layers, cgroup limits, the per-sandbox network namespace, the
//! on-disk record of what was created, and the template store. It knows nothing of HTTP
//! or of the E2B API; the server drives it through the [`Runtime`] trait so another
//! backend (a microVM where real KVM exists) can slot in behind the same seam.
//!
//! # The Linux backend ([`LinuxRuntime`])
//!
//! **Process model.** The daemon is multi-threaded, so it never does setup work in a
//! forked copy of itself. `create` clones the sandbox's init with `clone3(CLONE_PIDFD)`
//! straight into new user, pid, mount, uts, ipc and network namespaces; the child only
//! waits for a go byte, switches to namespaced root and execs `berth-launch init` (a
//! binary of this crate, found next to the daemon's executable unless configured). While
//! the child waits, the daemon writes its uid/gid maps and prepares the idmapped template
//! layers. `berth-launch` then does all mount work single-threaded (see [`launch`]) while
//! the daemon moves it into its cgroups (a cgroup move can wait for an RCU grace period,
//! so the two overlap), enters a new cgroup namespace and execs `berth-envd` as PID 1 and
//! session leader of the sandbox's pid namespace. Kernel objects the launcher allocates
//! before the move (a few mount structures) stay charged to the daemon's memory cgroup. The init is the daemon's
//! child (reaped on `kill`); after a daemon restart it belongs to the host's init.
//!
//! **User ids: one range per sandbox.** Sandbox slot `n` maps its uids/gids 0–65535 to
//! host `uid_base + n * 65536` onwards; berth owns the host ids from `uid_base` (default
//! 2^30 = 1073741824) for `max_sandboxes` (default 10,000) slots, a region no distribution
//! tool allocates from (it is not in /etc/subuid; change `uid_base` if a host uses it).
//! Ranges are claimed machine-wide (see `slots`), so daemons with different state dirs on
//! one host never hand out the same range. A shared range would be simpler and would let
//! all sandboxes share one idmapped layer mount, but the kernel keeps some per-uid
//! accounting across user namespaces (e.g. pipe buffer pages per user), so one sandbox
//! could exhaust it for all others, and a process that ever escaped its mount namespace
//! would own every other sandbox's files. A private range costs one idmapped mount per
//! layer per create (well under a millisecond).
//!
//! **Root filesystem.** Template layers stay owned by host uid 0 as debootstrap made
//! them; the daemon clones each (`open_tree(OPEN_TREE_CLONE)`) and idmaps it to the
//! sandbox's range (`mount_setattr(MOUNT_ATTR_IDMAP)`), passes the detached mounts over
//! SCM_RIGHTS, and the launcher attaches them in its own mount namespace on a scratch
//! tmpfs laid over the sandbox's `root` directory (opened by the cloned child before it
//! dropped the daemon's credentials: the state directory is root's alone) and mounts the
//! overlay there, with `userxattr`, naming layers relative to the scratch so the
//! overlay's options in the sandbox's `mountinfo` hold no host path. Mounting inside the
//! user namespace is deliberate: the
//! overlay then writes its upper layer with namespaced root's credentials, which hold no
//! host capability (no CAP_SYS_RESOURCE to dig into reserved blocks, no way to change
//! project ids). Then a fresh `/proc` (kcore, keys, timer_list, sched_debug, … masked;
//! sys, bus, fs, irq read-only), read-only `/sys` (firmware, powercap masked), a `/dev`
//! with only null, zero, full, random, urandom, tty bound from the host plus a private
//! devpts and the usual symlinks (userns mounts are nodev, so no other host device is
//! reachable), a tmpfs `/run` (sized at half the memory limit, charged to the sandbox's
//! memory cgroup; `/dev` and `/dev/shm` are directories of it), `/tmp` on the disk, masks
//! that are read-only binds of an empty directory of `/run/berth/boot` (a directory of
//! `/run` holding the sandbox's boot id, under a read-only bind of itself; every tmpfs
//! costs each checkpoint and restore a `tar` run of its contents, so `/run` is the only
//! one), and the init binary bound read-only at `/run/berth/<name>`; then
//! `pivot_root` and the old root is detached. The init's stdout and stderr go to
//! `/run/berth/init.log` inside the sandbox.
//!
//! **Disk.** The upper and work dirs live on a per-sandbox ext4 image on a loop device
//! (see `disk`): a full disk is a real ENOSPC, and host disk use is bounded by
//! `disk_size_mb`. The disk is a detached mount passed to the launcher with the layers and
//! attached only inside the sandbox's mount namespace, so the host's mount table (which
//! every new mount namespace starts as a copy of) does not grow with the number of
//! sandboxes, and the disk is released with the namespace. A background pool keeps a few
//! ready disks per size.
//!
//! **Limits.** cgroup v1 (one group per controller, absolute paths under
//! `/sys/fs/cgroup/<ctrl>/berth/<id>`) or v2 (`/sys/fs/cgroup/berth/<id>`), detected at
//! run time: CFS quota = `cpu_count` CPUs, on v1 also a cpuset of `cpu_count` CPUs (see
//! `cgroup`), memory limit (the OOM killer acts inside the group only), a pids limit,
//! freezer for freeze/thaw.
//!
//! **Resource views.** `free`, `/proc/meminfo`, `nproc`, `/proc/cpuinfo`, `/proc/stat`
//! and `/sys/devices/system/cpu/online` show the sandbox's limits: LXCFS, one per state
//! dir, outliving daemon restarts, serves those files from the cgroups of the reading
//! sandbox's init, and each start binds them over the sandbox's own (see `views`).
//! Without LXCFS sandboxes start all the same and see the host's numbers.
//!
//! **Hardening.** A capability bounding set of Docker's defaults minus NET_RAW and MKNOD,
//! and a seccomp filter refusing everything Docker's default profile refuses and more
//! (see `seccomp`), installed without NO_NEW_PRIVS so setuid `sudo` still works: root
//! inside is namespaced root.
//!
//! **Network.** Each sandbox has its own network namespace. Without a network config it
//! has only loopback (the init is cloned with `CLONE_NEWNET`). With one (see `network`
//! and berth-net), the host creates and pins the namespace, links it to the host by a
//! veth with egress under the sandbox's policy, and the init is cloned into it; the
//! namespace belongs to the host's user namespace, so root inside cannot reconfigure
//! it. [`Runtime::connect`] makes the TCP connection from a thread that has entered the
//! sandbox's namespace through the init's pidfd, so no port is exposed anywhere.
//!
//! **Kill.** SIGKILL to the init through its pidfd (a pid namespace dies with its init),
//! then anything left in the cgroups, then the cgroups; the sandbox directory is renamed
//! into `trash/` at once. The daemon keeps a reference to each sandbox's disk mount, so
//! the ext4 shutdown does not run in the dying init's exit path; a janitor thread drops
//! that reference and deletes the directory (unlinking the image is slow on a busy disk),
//! so disk bytes return shortly after `kill` returns. Dropping the runtime waits for the
//! janitor to finish.
//!
//! **Recovery.** Each sandbox has `<state>/sandboxes/<id>/record.json` (see `record`);
//! `recover` reattaches sandboxes whose init is still the same process (pid plus start
//! time) and removes everything of the others, plus empty cgroups without a record. A
//! populated group without a record is left alone: it is a live sandbox of another daemon
//! on the same host (another state dir, same cgroup parent), not a leftover of ours; so
//! is an empty one whose uid range another daemon claims for a live sandbox (a paused
//! sandbox keeps its groups with no process in them). A memory pause is answered before
//! its images are on disk and made durable about a second later (see `durability`); it
//! may keep the dumped tree frozen for a quick resume (see `kept`), and `recover` ends
//! such a tree left by a crash, as the images are the pause;
//! `recover` finishes one left unsynced in the same host boot and removes one from an
//! earlier boot.
//!
//! **For checkpointing (CRIU).** The init is PID 1 and session leader of its own pid
//! namespace and holds no fd from outside its mount namespace (stdio is `/dev/null` and
//! the log file inside). External mounts a dump must name: the device binds under
//! `/dev`, the init binary bind, the overlay's lower layers, the volumes and the
//! resource views (FUSE, which CRIU cannot dump; keyed, so a restore binds whichever
//! LXCFS runs then); the disk (upper) is mounted inside the sandbox's namespace from a
//! loop device.

mod attach_warmth;
mod blkio;
mod cgroup;
mod disk;
mod durability;
mod envd_fs;
mod host;
mod kept;
pub mod launch;
mod linux;
mod perms;
mod record;
mod restorable;
mod seccomp;
mod slots;
mod sys;
mod views;
mod volume;

pub use blkio::DiskLimits;
pub use host::HostRuntime;
pub use kept::KeepPaused;
pub use linux::{
    default_envd_args, CheckpointInfo, CommitStats, Durability, ExecOptions, LinuxRuntime,
    LinuxRuntimeConfig, PackedCheckpoint, DEFAULT_INIT_LISTEN, DEFAULT_VOLUME_SIZE_MB,
    UID_RANGE_SIZE,
};
pub use perms::tighten_tree as tighten_private_tree;
pub use views::{find_lxcfs, probe_views, Probe as ViewsProbe};
pub use volume::{
    validate_mount_path, validate_mount_paths, MountPathError, VolumeMount, VOLUME_OWNER,
};

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
    /// Volumes mounted read-write at their paths (validated by the caller with
    /// [`validate_mount_paths`]); kept across pause/resume and carried by checkpoints.
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
}

impl SandboxSpec {
    /// The spec with each layer once, at its highest place. Overlayfs refuses a lower dir
    /// listed twice (ELOOP), and a build step that changes nothing yields the layer it
    /// started from; the lower copy of a repeated layer is entirely covered by the upper
    /// one, so dropping it changes nothing the sandbox sees.
    pub fn with_distinct_layers(&self) -> SandboxSpec {
        let mut seen = std::collections::HashSet::new();
        let mut layers: Vec<PathBuf> = self
            .layers
            .iter()
            .rev()
            .filter(|layer| seen.insert(layer.as_path()))
            .cloned()
            .collect();
        layers.reverse();
        SandboxSpec {
            layers,
            ..self.clone()
        }
    }
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

/// A sandbox brought back by [`Runtime::resume`].
#[derive(Debug, Clone)]
pub struct ResumedSandbox {
    pub info: SandboxInfo,
    /// True when its processes continue from memory; false when its init started afresh
    /// (and needs initialising again).
    pub memory_restored: bool,
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
    /// Paused sandboxes found (kept with their checkpoint; see `LinuxRuntime::resume`).
    pub paused: Vec<String>,
}

/// Why a runtime operation failed: one variant per cause, so the control plane can tell
/// "no capacity" from "no such sandbox" from a broken host without parsing text.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("sandbox {0} already exists")]
    AlreadyExists(String),
    #[error("invalid sandbox id {0:?}: expected 1-64 characters of [A-Za-z0-9_-]")]
    InvalidId(String),
    #[error("invalid checkpoint id {0:?}: expected 1-64 characters of [A-Za-z0-9_-]")]
    InvalidCheckpointId(String),
    #[error("a sandbox needs at least one template layer")]
    NoLayers,
    #[error("all {max} sandbox slots are in use: kill or pause sandboxes, or raise max_sandboxes")]
    NoFreeSlot { max: u32 },
    #[error("{what} {path} not found")]
    MissingBinary { what: &'static str, path: PathBuf },
    #[error("CRIU is not available: {0}")]
    CriuUnavailable(#[source] Box<berth_checkpoint::CriuError>),
    #[error("sandbox {id} failed to start: {reason}")]
    StartFailed { id: String, reason: String },
    #[error("sandbox {0}: its init did not exit after SIGKILL")]
    InitDidNotExit(String),
    #[error("sandbox {0} is running, not paused")]
    NotPaused(String),
    #[error("sandbox {0} was paused without memory")]
    PausedWithoutMemory(String),
    #[error("checkpoint {0} not found")]
    CheckpointNotFound(String),
    #[error("checkpoint {0} already exists")]
    CheckpointExists(String),
    /// The sandbox's own files would make the dump fail to restore; nothing was kept.
    #[error("sandbox {id} cannot be checkpointed as it is: {reason}")]
    Unrestorable { id: String, reason: String },
    #[error("checkpoint metadata {path} is unreadable: {source}")]
    BadCheckpoint {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("checkpoint {path} has format {found}; this berth reads format {supported}")]
    CheckpointFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("sandbox {id}: {what} must be the checkpoint's")]
    CheckpointMismatch { id: String, what: &'static str },
    #[error("sandbox {id}: criu {op}: {source}")]
    Criu {
        id: String,
        op: &'static str,
        #[source]
        source: Box<berth_checkpoint::CriuError>,
    },
    #[error("sandbox {id}: preparing restore images: {source}")]
    Images {
        id: String,
        #[source]
        source: Box<berth_checkpoint::ImageError>,
    },
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("a runtime worker thread panicked during {0}")]
    WorkerPanicked(&'static str),
    #[error("sandbox {0} was reattached after a restart; its disk can no longer be committed")]
    DiskDetached(String),
    #[error("the {backend} runtime does not offer {what}")]
    Unsupported {
        backend: &'static str,
        what: &'static str,
    },
    #[error(transparent)]
    Network(#[from] berth_net::NetError),
    #[error("{what}: {source}")]
    Transfer {
        what: String,
        #[source]
        source: Box<berth_template::TemplateError>,
    },
    #[error("invalid volume id {0:?}: expected 1-64 characters of [A-Za-z0-9_-]")]
    InvalidVolumeId(String),
    #[error("volume {0} not found")]
    VolumeNotFound(String),
    #[error("volume {0} already exists")]
    VolumeExists(String),
    #[error("volume mount path {path:?} {reason}")]
    InvalidMountPath {
        path: String,
        #[source]
        reason: MountPathError,
    },
}

impl RuntimeError {
    /// True when the host is out of a resource (slots, disk), so retrying later or
    /// elsewhere can succeed: the caller's request itself was fine.
    pub fn is_capacity(&self) -> bool {
        match self {
            RuntimeError::NoFreeSlot { .. } => true,
            RuntimeError::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENOSPC) | Some(libc::ENOMEM) | Some(libc::EAGAIN)
            ),
            RuntimeError::Network(berth_net::NetError::PoolExhausted { .. }) => true,
            _ => false,
        }
    }
}

/// The seam between the control plane and an isolation backend.
pub trait Runtime: Send + Sync + 'static {
    /// Create and start a sandbox; returns once its init process runs.
    fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, RuntimeError>;
    /// Kill every process and remove every mount, cgroup, netns and byte of disk.
    fn kill(&self, id: &str) -> Result<(), RuntimeError>;
    fn freeze(&self, id: &str) -> Result<(), RuntimeError>;
    fn thaw(&self, id: &str) -> Result<(), RuntimeError>;
    /// Puts what sandbox `id`'s envd starts from now on into the sandbox's workload
    /// group, whose limits sit just below the sandbox's, so a workload that exhausts
    /// them leaves envd its reserve. Call once envd answers, after every start, resume
    /// or restore. False where the backend has no such group (then the workload shares
    /// the sandbox's limits with envd).
    fn confine_workload(&self, id: &str) -> Result<bool, RuntimeError> {
        let _ = id;
        Ok(false)
    }
    fn stats(&self, id: &str) -> Result<SandboxStats, RuntimeError>;
    /// Ids of running sandboxes whose init (envd) has exited on its own: crashed, or
    /// ended from outside berth. Their processes are gone; the caller kills them to free
    /// what they still hold and to report them gone.
    fn exited(&self) -> Vec<String> {
        Vec::new()
    }
    fn list(&self) -> Vec<SandboxInfo>;
    /// Find sandboxes recorded on disk by an earlier daemon; reattach or clean them.
    fn recover(&self) -> Result<RecoveryReport, RuntimeError>;
    /// Open a TCP connection to `port` on the sandbox's loopback (envd is 49983),
    /// created inside the sandbox's network namespace so nothing is exposed elsewhere.
    fn connect(&self, id: &str, port: u16) -> Result<std::net::TcpStream, RuntimeError>;
    /// Stop sandbox `id`, keeping its disk and, with `memory`, a checkpoint of every
    /// process's state; its RAM is freed (a backend may keep the stopped processes a
    /// while for a quick resume: `LinuxRuntimeConfig::keep_paused`) and it leaves
    /// [`Runtime::list`] until [`Runtime::resume`]. Paused sandboxes survive daemon
    /// restarts and reboots.
    fn pause(&self, id: &str, memory: bool) -> Result<(), RuntimeError>;
    /// Bring paused sandbox `id` back under the same id: processes continue (paused with
    /// memory, unless `keep_memory` is false: then the checkpoint is dropped) or a fresh
    /// init starts on the kept disk. On failure it stays paused.
    fn resume(&self, id: &str, keep_memory: bool) -> Result<ResumedSandbox, RuntimeError>;
    /// Checkpoint running sandbox `id` as new checkpoint `checkpoint_id` while it keeps
    /// running: every process's memory and a copy of its disk from the same instant.
    /// The checkpoint is whole or absent, never half-written, and (`Durability::Durable`)
    /// on disk before this returns. Where it lives is the runtime's business; callers
    /// name it only by id.
    fn checkpoint(
        &self,
        id: &str,
        checkpoint_id: &str,
        durability: Durability,
    ) -> Result<CheckpointInfo, RuntimeError>;
    /// Start new sandbox `id` from checkpoint `checkpoint_id` (only read: several
    /// restores may share it) on its own copy of the disk, with the checkpoint's template
    /// and limits: its processes continue from the checkpoint's memory, or (`memory`
    /// false) a fresh init boots on the disk.
    fn restore(
        &self,
        checkpoint_id: &str,
        id: &str,
        memory: bool,
    ) -> Result<SandboxInfo, RuntimeError>;
    /// Proves checkpoint `checkpoint_id` restores with its memory: a trial restore with
    /// nothing of it running, removed at once. Backends without memory checkpoints have
    /// nothing to prove.
    fn verify_checkpoint(&self, checkpoint_id: &str) -> Result<(), RuntimeError> {
        let _ = checkpoint_id;
        Ok(())
    }
    /// Delete checkpoint `checkpoint_id`; deleting one that does not exist is not an error.
    fn delete_checkpoint(&self, checkpoint_id: &str) -> Result<(), RuntimeError>;
    /// Ids of every checkpoint the runtime holds (to reconcile with what owns them).
    fn checkpoints(&self) -> Result<Vec<String>, RuntimeError>;
    /// Paused sandbox `id` as new checkpoint `checkpoint_id` (its memory if it was paused
    /// with it, and its disk), to move it to another machine: there it is restored under
    /// the same id and paused again. The paused sandbox itself stays as it was.
    fn export_paused(&self, id: &str, checkpoint_id: &str) -> Result<CheckpointInfo, RuntimeError> {
        let _ = (id, checkpoint_id);
        Err(RuntimeError::Unsupported {
            backend: "this",
            what: "moving paused sandboxes between machines",
        })
    }
    /// Checkpoint `checkpoint_id` packed for another machine's
    /// [`Runtime::import_checkpoint`] (a node serving a snapshot another node starts).
    fn pack_checkpoint(&self, checkpoint_id: &str) -> Result<PackedCheckpoint, RuntimeError> {
        let _ = checkpoint_id;
        Err(RuntimeError::Unsupported {
            backend: "this",
            what: "moving checkpoints between machines",
        })
    }
    /// Stores checkpoint `checkpoint_id` sent by another machine (read from `from`,
    /// checked against the sender's `tree_hash`), standing on `layers` (this machine's
    /// paths of the layers it was made on, lowest first).
    fn import_checkpoint(
        &self,
        checkpoint_id: &str,
        tree_hash: &str,
        layers: Vec<PathBuf>,
        from: &mut dyn std::io::Read,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let _ = (checkpoint_id, tree_hash, layers, from);
        Err(RuntimeError::Unsupported {
            backend: "this",
            what: "moving checkpoints between machines",
        })
    }
    /// [`Runtime::create`] under a network policy (`create` uses E2B's default: internet
    /// access). Backends without networking refuse: a policy they cannot enforce must
    /// not be accepted silently.
    fn create_with_network(
        &self,
        spec: &SandboxSpec,
        policy: &berth_net::NetworkPolicy,
    ) -> Result<SandboxInfo, RuntimeError> {
        let _ = (spec, policy);
        Err(berth_net::NetError::Disabled.into())
    }
    /// Replaces sandbox `id`'s network policy atomically (running or paused); existing
    /// connections to destinations it now denies are cut. Kept across pause/resume and
    /// restarts; checkpoints (forks, snapshots) carry it.
    fn set_network_policy(
        &self,
        id: &str,
        policy: &berth_net::NetworkPolicy,
    ) -> Result<(), RuntimeError> {
        let _ = (id, policy);
        Err(berth_net::NetError::Disabled.into())
    }
    /// Creates empty volume `id` (of the backend's volume size) for sandboxes to mount
    /// ([`SandboxSpec::volumes`]); it lives until [`Runtime::delete_volume`].
    fn create_volume(&self, id: &str) -> Result<(), RuntimeError>;
    /// Deletes volume `id` and its data. The caller makes sure no live sandbox mounts it.
    fn delete_volume(&self, id: &str) -> Result<(), RuntimeError>;
    /// The root directory of volume `id`, as an open directory: files are reached only
    /// by resolving paths beneath it (`openat2` with `RESOLVE_IN_ROOT`). Owners are the
    /// ids files have inside sandboxes.
    fn open_volume(&self, id: &str) -> Result<std::os::fd::OwnedFd, RuntimeError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_layer_is_kept_once_at_its_highest_place() {
        let spec = SandboxSpec {
            id: "i0".into(),
            template: "t".into(),
            layers: ["a", "x", "b", "x", "c"].map(PathBuf::from).to_vec(),
            cpu_count: 1,
            memory_mb: 64,
            disk_size_mb: 64,
            volumes: Vec::new(),
        };
        let distinct = spec.with_distinct_layers();
        assert_eq!(
            distinct.layers,
            ["a", "b", "x", "c"].map(PathBuf::from).to_vec()
        );
        assert_eq!(distinct.with_distinct_layers().layers, distinct.layers);
    }
}
