//! [`LinuxRuntime`]: sandboxes made of Linux namespaces, an overlay root, cgroups and a
//! per-sandbox ext4 disk. See the crate docs for the design decisions.

use berth_checkpoint::Criu;
use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::fs;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::attach_warmth::AttachWarmth;
use crate::blkio::DiskThrottle;
use crate::cgroup::{CgroupLimits, Cgroups};
use crate::disk::{self, DiskStore, Janitor};
use crate::envd_fs;
use crate::kept::{KeepPaused, KeptTrees};
use crate::launch::{self, LaunchConfig, CONTROL_FD, ROOT_FD};
use crate::perms;
use crate::record::{self, Record};
use crate::slots::{Claim, SlotRegistry};
use crate::sys::{self, cpath};
use crate::views::{self, Availability, Views};
use crate::volume::VolumeStore;
use crate::{
    RecoveryReport, ResumedSandbox, Runtime, RuntimeError, SandboxInfo, SandboxSpec, SandboxStats,
};

#[path = "checkpoint.rs"]
mod checkpoint;
#[path = "commit.rs"]
mod commit;
#[path = "network.rs"]
mod network;
#[path = "pause.rs"]
mod pause;

pub use checkpoint::{CheckpointInfo, Durability, PackedCheckpoint};
pub use commit::{CommitStats, ExecOptions};

/// Size of each sandbox's uid/gid range (a full 16-bit range, like a normal Linux system).
pub const UID_RANGE_SIZE: u32 = 65_536;
/// Size of a new volume unless configured (`LinuxRuntimeConfig::volume_size_mb`).
pub const DEFAULT_VOLUME_SIZE_MB: u64 = 2048;
/// The socket the launcher binds for the default init: envd's E2B port.
pub const DEFAULT_INIT_LISTEN: std::net::SocketAddrV4 =
    std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 49983);

/// Init arguments used by default: envd listening on [`DEFAULT_INIT_LISTEN`] (the
/// address it binds itself when no socket is handed to it).
pub fn default_envd_args() -> Vec<String> {
    vec!["--listen".into(), DEFAULT_INIT_LISTEN.to_string()]
}

/// How a [`LinuxRuntime`] is set up.
#[derive(Debug, Clone)]
pub struct LinuxRuntimeConfig {
    /// Records, per-sandbox disks and formatted disk images live here, root's alone (see
    /// `perms`): nothing of a sandbox walks it.
    pub state_dir: PathBuf,
    /// Host path of the (static) `berth-envd` binary, bind-mounted read-only into each
    /// sandbox and run as its init. Its directories must be searchable by all: the
    /// launcher binds it as the sandbox's root, an unprivileged host uid.
    pub envd_binary: PathBuf,
    /// Arguments passed to the init.
    pub envd_args: Vec<String>,
    /// A TCP address the launcher binds and listens on inside the sandbox before it
    /// execs the init, handing the socket over (see `launch::INIT_LISTEN_FD_ENV`): a
    /// connection made as soon as a create returns waits in its backlog until the init
    /// serves instead of being refused (default [`DEFAULT_INIT_LISTEN`], which envd
    /// takes; None for an init that does not).
    pub init_listen: Option<std::net::SocketAddrV4>,
    /// Host path of the `berth-launch` binary built by this crate (`cargo build -p
    /// berth-runtime --bin berth-launch`), or of a daemon executable that calls
    /// [`crate::launch::run_if_launcher`] first thing in `main`.
    pub launcher_binary: PathBuf,
    /// First host uid/gid of berth's range; sandbox slot `n` maps its uid 0..65536 to
    /// `uid_base + n * 65536`.
    pub uid_base: u32,
    /// Number of slots (= most sandboxes alive at once).
    pub max_sandboxes: u32,
    /// pids cgroup limit per sandbox (threads count).
    pub pids_max: u64,
    /// Where the cgroup hierarchies are mounted (v1: one dir per controller; v2: unified).
    pub cgroup_mount: PathBuf,
    /// Name of berth's parent group under each hierarchy.
    pub cgroup_parent: String,
    /// Ready-mounted disks kept per disk size in use (0: make each disk on demand).
    pub disk_pool_size: usize,
    /// State directory whose `criu/` holds (or will hold) a provisioned CRIU, when the
    /// host's is too old; default `state_dir`.
    pub criu_state_dir: PathBuf,
    /// Machine-wide directory of uid-range claims, shared by every daemon on the host
    /// whatever its state dir (default `/var/lib/berth/uid-slots`).
    pub uid_claims_dir: PathBuf,
    /// Sandbox networking (egress through the host, E2B network policy); None keeps
    /// every sandbox on its own loopback only. See `network`.
    pub network: Option<berth_net::NetConfig>,
    /// Size of every new volume (its ext4 image; sparse on the host). See `volume`.
    pub volume_size_mb: u64,
    /// Bandwidth and IOPS limits of each sandbox's disk (default: none). See `blkio`.
    pub disk_limits: crate::DiskLimits,
    /// The `lxcfs` executable that serves sandboxes their memory and CPU views (default:
    /// `lxcfs` on `PATH`); None: sandboxes see the host's. See `views`.
    pub lxcfs_binary: Option<PathBuf>,
    /// Whether, how long and how much a memory pause keeps the sandbox's processes,
    /// frozen, so a resume thaws them instead of restoring its images (default: off).
    /// See `kept`.
    pub keep_paused: KeepPaused,
}

impl LinuxRuntimeConfig {
    /// Defaults: launcher next to the current executable, uids from 2^30, 10,000 slots.
    pub fn new(state_dir: impl Into<PathBuf>, envd_binary: impl Into<PathBuf>) -> Self {
        let launcher_binary = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("berth-launch")))
            .unwrap_or_else(|| PathBuf::from("berth-launch"));
        let state_dir = state_dir.into();
        Self {
            criu_state_dir: state_dir.clone(),
            uid_claims_dir: PathBuf::from("/var/lib/berth/uid-slots"),
            state_dir,
            envd_binary: envd_binary.into(),
            envd_args: default_envd_args(),
            init_listen: Some(DEFAULT_INIT_LISTEN),
            launcher_binary,
            uid_base: 1 << 30,
            max_sandboxes: 10_000,
            pids_max: 4096,
            cgroup_mount: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: "berth".into(),
            disk_pool_size: 4,
            network: None,
            volume_size_mb: DEFAULT_VOLUME_SIZE_MB,
            disk_limits: crate::DiskLimits::default(),
            lxcfs_binary: views::find_lxcfs(),
            keep_paused: KeepPaused::OFF,
        }
    }
}

/// Where a starting sandbox's disk comes from.
#[derive(Debug)]
enum DiskOrigin {
    /// A fresh disk (create).
    New,
    /// The mount the caller made of `disk.img` in the sandbox directory (a
    /// filesystem-only snapshot's copy).
    Kept(OwnedFd),
    /// `disk.img` in the sandbox directory, mounted again (resume after a pause without
    /// memory); its files are owned in the range at `disk_uid_base`.
    Remount { disk_uid_base: u32 },
}

/// The mounts a start sends the launcher besides the layers and volumes.
struct StartMounts {
    /// The sandbox's disk.
    disk: OwnedFd,
    /// The resource views, in the order of `LaunchConfig::view_paths`.
    views: Vec<OwnedFd>,
    /// With networking, a sysfs of the sandbox's network namespace.
    sysfs: Option<OwnedFd>,
}

struct Sandbox {
    info: SandboxInfo,
    slot: u32,
    pidfd: OwnedFd,
    /// True when the init is our child (we must reap it); false after a daemon restart.
    own_child: bool,
    /// The daemon's reference to the sandbox's disk mount. Holding it keeps the ext4
    /// shutdown out of the dying init's exit path; the janitor drops it after a kill.
    /// None for sandboxes reattached after a restart.
    disk: Mutex<Option<OwnedFd>>,
    /// First id of the range owning the files on its disk: its own range's, except for
    /// a fork (or a moved sandbox), whose disk keeps its source's owners and is
    /// idmapped into this sandbox's range.
    disk_uid_base: u32,
}

/// The Linux-namespace backend of [`Runtime`].
pub struct LinuxRuntime {
    config: LinuxRuntimeConfig,
    cgroups: Cgroups,
    /// Held by every start once its groups exist ([`LinuxRuntime::make_cgroups`]), so its
    /// moves into cgroups skip the wait the first move after a quiet spell pays (see
    /// `attach_warmth`).
    attach_warmth: AttachWarmth,
    throttle: DiskThrottle,
    /// The envd binary sandboxes bind, on its own filesystem (see `envd_fs`); the lock
    /// serialises putting it back after the filesystem was released.
    init_binary: PathBuf,
    init_binary_lock: Mutex<()>,
    disks: DiskStore,
    janitor: Janitor,
    sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
    /// Slots in use, including sandboxes being created or killed.
    slots: Mutex<BTreeSet<u32>>,
    /// Claims on uid ranges shared with other daemons on this host.
    uid_claims: SlotRegistry,
    /// CRIU, located or provisioned on first need (pause, resume, checkpoint).
    criu: Mutex<Option<Criu>>,
    network: Option<berth_net::HostNetwork>,
    volumes: VolumeStore,
    /// The egress proxy's interception CA (PEM), trusted by sandboxes started from now on.
    egress_ca: Mutex<Option<String>>,
    /// The LXCFS serving sandboxes their memory and CPU views (see `views`).
    views: Views,
    /// Makes memory pauses durable after they are answered (see `durability`).
    pause_flusher: crate::durability::PauseFlusher,
    /// Paused sandboxes' frozen processes, kept for a quick resume (see `kept`).
    kept: KeptTrees,
}

/// Directory of a paused sandbox's CRIU images, inside its sandbox directory.
const CHECKPOINT_DIR: &str = "checkpoint";

fn io_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> RuntimeError {
    let op = op.into();
    move |source| RuntimeError::Io { op, source }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl LinuxRuntime {
    /// Prepares the state directory and cgroup parents. Call [`Runtime::recover`] next to
    /// pick up sandboxes of an earlier daemon.
    pub fn new(config: LinuxRuntimeConfig) -> Result<Self, RuntimeError> {
        // Root's alone, all of it (see `perms`).
        perms::create_dir_all(&config.state_dir.join("sandboxes"), perms::PRIVATE_DIR)
            .map_err(io_err("create state dir"))?;
        perms::tighten(&config.state_dir, perms::TRAVERSE_DIR)
            .map_err(io_err("chmod state dir"))?;
        perms::create_dir_all(&config.state_dir.join(VOLUME_MOUNTS), perms::TRAVERSE_DIR)
            .map_err(io_err("create the volume mounts dir"))?;
        if let Ok(entries) = fs::read_dir(config.state_dir.join(VOLUME_MOUNTS)) {
            for entry in entries.flatten() {
                remove_volume_mountpoints(&entry.path());
            }
        }
        perms::create_dir_all(&config.state_dir.join("checkpoints"), perms::PRIVATE_DIR)
            .map_err(io_err("create checkpoint dir"))?;
        let tightened = perms::tighten_sandbox_dirs(&config.state_dir)
            .map_err(io_err("tighten permissions of sandbox state"))?;
        if tightened > 0 {
            tracing::warn!(
                state = %config.state_dir.display(),
                paths = tightened,
                "made sandbox records, disks and checkpoints readable by root only (an older berth left them readable by other users)"
            );
        }
        let cgroups = Cgroups::detect(&config.cgroup_mount, &config.cgroup_parent)
            .map_err(io_err("set up cgroups"))?;
        let throttle = DiskThrottle::new(&config.cgroup_mount, config.disk_limits);
        let disks = DiskStore::new(&config.state_dir, config.disk_pool_size)
            .map_err(io_err("create disk template dir"))?;
        let janitor = Janitor::new(&config.state_dir).map_err(io_err("start janitor"))?;
        let uid_claims = SlotRegistry::new(&config.uid_claims_dir, &config.state_dir)
            .map_err(io_err("open uid range claims"))?;
        for (what, path) in [
            ("envd binary", &config.envd_binary),
            ("launcher binary", &config.launcher_binary),
        ] {
            if !path.is_file() {
                return Err(RuntimeError::MissingBinary {
                    what,
                    path: path.to_path_buf(),
                });
            }
        }
        let init_binary = envd_fs::install(&config.state_dir, &config.envd_binary)
            .map_err(io_err("install the envd binary on its filesystem"))?;
        let network = config
            .network
            .clone()
            .map(berth_net::HostNetwork::start)
            .transpose()?;
        let volumes = VolumeStore::new(&config.state_dir, config.volume_size_mb)
            .map_err(io_err("create volume dir"))?;
        let pause_flusher = crate::durability::PauseFlusher::new(&config.state_dir)
            .map_err(io_err("start the pause flusher"))?;
        let kept = KeptTrees::new(config.keep_paused, cgroups.clone())
            .map_err(io_err("start the thread ending kept paused sandboxes"))?;
        Ok(Self {
            kept,
            views: Views::new(&config.state_dir, config.lxcfs_binary.clone()),
            network,
            volumes,
            egress_ca: Mutex::new(None),
            config,
            attach_warmth: cgroups.attach_warmth(),
            cgroups,
            throttle,
            init_binary,
            init_binary_lock: Mutex::new(()),
            disks,
            janitor,
            sandboxes: Mutex::new(HashMap::new()),
            slots: Mutex::new(BTreeSet::new()),
            uid_claims,
            criu: Mutex::new(None),
            pause_flusher,
        })
    }

    /// Makes sure the init binary sandboxes bind is in place: its filesystem may have
    /// been released while no sandbox was held (by this runtime or another instance on
    /// the same state dir). Call before anything binds or restores it.
    pub(crate) fn ensure_init_binary(&self) -> Result<(), RuntimeError> {
        let _one = self
            .init_binary_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if self.init_binary.is_file() {
            return Ok(());
        }
        envd_fs::install(&self.config.state_dir, &self.config.envd_binary)
            .map(drop)
            .map_err(io_err("install the envd binary on its filesystem"))
    }

    /// Whether LXCFS serves resource views now, started if it was not running. When it
    /// had to be started, running sandboxes get their views attached again (the views
    /// of a dead LXCFS answer nothing, and a sandbox started without one has none).
    pub(crate) fn views_ready(&self) -> bool {
        match self.views.ensure() {
            Availability::Running => true,
            Availability::Started => {
                self.repair_views();
                true
            }
            Availability::Unavailable => false,
        }
    }

    /// The resource view mounts for a sandbox starting now, with their paths inside it;
    /// none (the host's files show) when LXCFS is unavailable, which is logged.
    fn view_mounts(&self, id: &str) -> Vec<(PathBuf, OwnedFd)> {
        if !self.views_ready() {
            return Vec::new();
        }
        self.views.clone_mounts().unwrap_or_else(|err| {
            tracing::warn!(sandbox = %id, %err, "the sandbox sees the host's memory and CPUs: its views could not be cloned");
            Vec::new()
        })
    }

    /// What a CRIU restore binds under each view's key: LXCFS's files, or the host's
    /// own when LXCFS is unavailable.
    pub(super) fn view_restore_sources(&self) -> Vec<(String, PathBuf)> {
        self.views.restore_sources(self.views_ready())
    }

    /// After a restore from memory: gives running sandbox `id` (init `init_pid`) the
    /// views it lacks, when LXCFS serves now. Its checkpoint may predate views, or have
    /// been made or restored while LXCFS was unavailable (then the host's files are
    /// bound in their place).
    pub(super) fn complete_views(&self, id: &str, init_pid: i32) {
        if views::served(init_pid) || !self.views_ready() {
            return;
        }
        let attached = self
            .views
            .clone_mounts()
            .and_then(|mounts| views::attach_in(init_pid, mounts));
        if let Err(err) = attached {
            tracing::warn!(sandbox = %id, %err, "attaching the sandbox's memory and CPU views");
        }
    }

    /// Attaches fresh views in every running sandbox, replacing what it had.
    fn repair_views(&self) {
        let running: Vec<(String, i32)> = self
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|s| (s.info.id.clone(), s.info.init_pid))
            .collect();
        for (id, pid) in running {
            let attached = self
                .views
                .clone_mounts()
                .and_then(|mounts| views::attach_in(pid, mounts));
            match attached {
                Ok(()) => {
                    tracing::info!(sandbox = %id, "attached the sandbox's memory and CPU views")
                }
                Err(err) => {
                    tracing::warn!(sandbox = %id, %err, "attaching the sandbox's memory and CPU views")
                }
            }
        }
    }

    /// True when the daemon holds no sandbox, running or paused.
    fn idle(&self) -> Result<bool, RuntimeError> {
        let held = match fs::read_dir(self.config.state_dir.join("sandboxes")) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .any(|entry| entry.path().is_dir()),
            // A state dir removed under the runtime (tests do) holds nothing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(io_err("read state dir")(e)),
        };
        Ok(!held && self.list().is_empty())
    }

    /// Removes the daemon's sandbox network (its nftables table and gateway link) when
    /// it holds no sandbox, running or paused: the daemon is going away and nothing a
    /// restart would reattach needs it. Returns whether it was removed. With sandboxes
    /// left it stays, so they keep their network across a restart.
    ///
    /// The envd binary's filesystem (`envd_fs`) and LXCFS (`views`) go in the same
    /// case, network or not.
    pub fn release_network_if_idle(&self) -> Result<bool, RuntimeError> {
        if !self.idle()? {
            return Ok(false);
        }
        envd_fs::release(&self.config.state_dir)
            .map_err(io_err("unmount the envd binary's filesystem"))?;
        self.views
            .release()
            .map_err(io_err("unmount the resource views"))?;
        let Some(network) = &self.network else {
            return Ok(false);
        };
        network.destroy()?;
        Ok(true)
    }

    pub fn config(&self) -> &LinuxRuntimeConfig {
        &self.config
    }

    /// Makes sandboxes started from now on (created, resumed without memory, restored
    /// without memory) trust `pem`, the egress proxy's interception CA: it is written to
    /// their system trust store and the environment of their init points Python, Node,
    /// curl and OpenSSL at it (see `launch::egress_ca_env`). Sandboxes restored from
    /// memory keep what their disk and processes had.
    pub fn set_egress_ca(&self, pem: Option<String>) {
        *self.egress_ca.lock().unwrap_or_else(|e| e.into_inner()) = pem;
    }

    /// The CRIU this runtime checkpoints with: the host's if new enough, else one
    /// provisioned under the state dir on first call (progress goes to the log).
    pub fn criu(&self) -> Result<Criu, RuntimeError> {
        let mut criu = self.criu.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(criu) = criu.as_ref() {
            return Ok(criu.clone());
        }
        let found = Criu::ensure(&self.config.criu_state_dir, |line| tracing::info!("{line}"))
            .map_err(|e| RuntimeError::CriuUnavailable(Box::new(e)))?;
        *criu = Some(found.clone());
        Ok(found)
    }

    /// A new directory for the host mounts of sandbox `id`'s volumes during a restore:
    /// `<state>/volume-mounts/<id>`, owned by the sandbox's root (`uid_base`) and 0700.
    /// CRIU's restore tasks open external mounts by path after they have become that
    /// uid, so it must be able to reach them, and no other uid may: the state dir and
    /// `volume-mounts/` are 0711 (traversable, not listable; every other entry is
    /// 0700/0600), and a volume's content is reachable only through its sandbox's
    /// directory here. Removed again by `HostRoot`'s drop.
    pub(super) fn volume_mounts_dir(
        &self,
        id: &str,
        uid_base: u32,
    ) -> Result<PathBuf, RuntimeError> {
        let dir = self.config.state_dir.join(VOLUME_MOUNTS).join(id);
        remove_volume_mountpoints(&dir);
        perms::create_dir(&dir, perms::PRIVATE_DIR)
            .map_err(io_err("create the sandbox's volume mounts dir"))?;
        std::os::unix::fs::chown(&dir, Some(uid_base), Some(uid_base))
            .map_err(io_err("chown the sandbox's volume mounts dir"))?;
        Ok(dir)
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.config.state_dir.join("sandboxes").join(id)
    }

    /// `<state>/checkpoints`: snapshots' and forks' checkpoints, one directory each.
    fn checkpoint_root(&self) -> PathBuf {
        self.config.state_dir.join("checkpoints")
    }

    /// Where checkpoint `checkpoint_id` lives; ids are validated so none escapes the root.
    fn checkpoint_dir(&self, checkpoint_id: &str) -> Result<PathBuf, RuntimeError> {
        if !valid_id(checkpoint_id) {
            return Err(RuntimeError::InvalidCheckpointId(checkpoint_id.to_owned()));
        }
        Ok(self.checkpoint_root().join(checkpoint_id))
    }

    fn get(&self, id: &str) -> Result<Arc<Sandbox>, RuntimeError> {
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))
    }

    /// First id of the range owning the files on the disk of the sandbox `record` is of.
    pub(super) fn disk_uid_base(&self, record: &Record) -> u32 {
        record
            .disk_uid_base
            .unwrap_or(self.uid_base_of(record.slot))
    }

    fn uid_base_of(&self, slot: u32) -> u32 {
        self.config.uid_base + slot * UID_RANGE_SIZE
    }

    /// A free slot for sandbox `id` (whose directory exists): free here and not claimed
    /// by a live sandbox of another daemon on this host.
    fn take_slot(&self, id: &str) -> Result<u32, RuntimeError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for slot in 0..self.config.max_sandboxes {
            if slots.contains(&slot) {
                continue;
            }
            let claimed = self
                .uid_claims
                .claim(self.uid_base_of(slot), id)
                .map_err(io_err("claim a uid range"))?;
            if claimed == Claim::Taken {
                slots.insert(slot);
                return Ok(slot);
            }
        }
        Err(RuntimeError::NoFreeSlot {
            max: self.config.max_sandboxes,
        })
    }

    /// Marks `slot` used by sandbox `id` found on disk (recovery).
    fn keep_slot(&self, slot: u32, id: &str) {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(slot);
        match self.uid_claims.claim(self.uid_base_of(slot), id) {
            Ok(Claim::Taken) => {}
            Ok(Claim::Held) => tracing::error!(
                sandbox = %id, slot,
                "another daemon's live sandbox claims this sandbox's uid range"
            ),
            Err(err) => tracing::warn!(sandbox = %id, %err, "claiming a uid range"),
        }
    }

    fn release_slot(&self, slot: u32, id: &str) {
        if let Err(err) = self.uid_claims.release(self.uid_base_of(slot), id) {
            tracing::warn!(sandbox = %id, %err, "releasing a uid range claim");
        }
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&slot);
    }

    /// Makes sandbox `spec.id`'s cgroups (its limits from `spec`; groups that exist
    /// are kept), then keeps task moves cheap until the returned hold is dropped (see
    /// `attach_warmth`): every start that moves tasks into new groups calls this first.
    /// In that order because a warming move holds the kernel's `cgroup_mutex` while it
    /// waits out its grace period, and making a group waits for that mutex: groups made
    /// after the warmth started waited the grace period out on the start's own path
    /// (4.6 ms of a 13.6 ms create, measured), while the warmth started after them
    /// overlaps that wait with the network, disk and mount work that follows.
    pub(super) fn make_cgroups(
        &self,
        spec: &SandboxSpec,
    ) -> Result<crate::attach_warmth::Hold, RuntimeError> {
        self.cgroups
            .create(&spec.id, self.cgroup_limits(spec))
            .map_err(io_err("create cgroups"))?;
        Ok(self.attach_warmth.hold())
    }

    fn cgroup_limits(&self, spec: &SandboxSpec) -> CgroupLimits {
        CgroupLimits {
            cpu_count: spec.cpu_count,
            memory_bytes: spec.memory_mb * 1024 * 1024,
            pids_max: self.config.pids_max,
        }
    }

    /// The steps every new sandbox goes through around `start` (which starts its init in
    /// the prepared directory with the given slot): its directory, a slot, its record
    /// before and after the start, and registration. On failure everything of it goes.
    /// `own_child`: the init is our child (reaped on kill), not a CRIU-restored tree.
    /// `disk_uid_base`: the range owning the files of the disk `start` brings (None: a
    /// new disk, in the sandbox's own range).
    pub(super) fn bring_up(
        &self,
        spec: &SandboxSpec,
        own_child: bool,
        disk_uid_base: Option<u32>,
        start: impl FnOnce(u32, &Path) -> Result<(OwnedFd, i32, Option<OwnedFd>), RuntimeError>,
    ) -> Result<SandboxInfo, RuntimeError> {
        let dir = self.sandbox_dir(&spec.id);
        perms::create_dir(&dir, perms::PRIVATE_DIR).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => RuntimeError::AlreadyExists(spec.id.clone()),
            _ => io_err("create sandbox dir")(e),
        })?;
        let slot = match self.take_slot(&spec.id) {
            Ok(slot) => slot,
            Err(e) => {
                let _ = fs::remove_dir(&dir);
                return Err(e);
            }
        };
        let mut record = Record {
            spec: spec.clone(),
            slot,
            created_at: SystemTime::now(),
            init_pid: None,
            init_start_ticks: None,
            // Named only when it is not the slot's own, as the field's readers expect.
            disk_uid_base: disk_uid_base.filter(|base| *base != self.uid_base_of(slot)),
        };
        let started = record
            .write(&dir)
            .map_err(io_err("write record"))
            .and_then(|()| start(slot, &dir));
        let (pidfd, pid, disk) = match started {
            Ok(v) => v,
            Err(e) => {
                let _ = self.teardown(&spec.id, None, None);
                self.release_slot(slot, &spec.id);
                return Err(e);
            }
        };
        record.init_pid = Some(pid);
        record.init_start_ticks = record::process_start_ticks(pid);
        if let Err(e) = record.write(&dir) {
            let _ = self.teardown(&spec.id, Some((&pidfd, own_child)), disk);
            self.release_slot(slot, &spec.id);
            return Err(io_err("write record")(e));
        }
        let info = SandboxInfo {
            id: spec.id.clone(),
            template: spec.template.clone(),
            init_pid: pid,
            created_at: record.created_at,
            spec: spec.clone(),
        };
        let disk_uid_base = self.disk_uid_base(&record);
        Ok(self.register(info, slot, pidfd, own_child, disk, disk_uid_base))
    }

    /// Makes a started sandbox known (list, connect, kill, …) and returns its info.
    fn register(
        &self,
        info: SandboxInfo,
        slot: u32,
        pidfd: OwnedFd,
        own_child: bool,
        disk: Option<OwnedFd>,
        disk_uid_base: u32,
    ) -> SandboxInfo {
        if let Some(disk) = &disk {
            if let Err(err) = self.throttle.apply(disk.as_fd()) {
                tracing::warn!(sandbox = %info.id, %err, "limiting the sandbox's disk I/O");
            }
        }
        let sandbox = Arc::new(Sandbox {
            info: info.clone(),
            slot,
            pidfd,
            own_child,
            disk: Mutex::new(disk),
            disk_uid_base,
        });
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(info.id.clone(), sandbox);
        info
    }

    /// A command that runs `argv` inside sandbox `id` as `uid`/`gid` (through
    /// `berth-launch exec`: same namespaces, cgroups, seccomp filter and capabilities as
    /// the sandbox's own processes). For tests and debugging; clients use envd.
    pub fn exec_command(
        &self,
        id: &str,
        uid: u32,
        gid: u32,
        argv: &[&str],
    ) -> Result<std::process::Command, RuntimeError> {
        let sandbox = self.get(id)?;
        let mut cmd = std::process::Command::new(&self.config.launcher_binary);
        std::os::unix::process::CommandExt::arg0(&mut cmd, launch::LAUNCHER_ARGV0);
        cmd.arg("exec")
            .arg("--pid")
            .arg(sandbox.info.init_pid.to_string());
        for dir in self.cgroups.workload_dirs(id) {
            cmd.arg("--cgroup").arg(dir);
        }
        let home = if uid == 0 {
            "/root".to_owned()
        } else {
            "/home/user".to_owned()
        };
        let user = if uid == 0 { "root" } else { "user" };
        cmd.args(["--uid", &uid.to_string(), "--gid", &gid.to_string()]);
        cmd.args([
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ]);
        cmd.args([
            "--env",
            &format!("HOME={home}"),
            "--env",
            &format!("USER={user}"),
            "--cwd",
            "/",
        ]);
        cmd.arg("--").args(argv);
        cmd.env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        Ok(cmd)
    }

    fn start(
        &self,
        spec: &SandboxSpec,
        slot: u32,
        dir: &Path,
        origin: DiskOrigin,
    ) -> Result<(OwnedFd, i32, OwnedFd), RuntimeError> {
        let uid_base = self.uid_base_of(slot);
        let disk = match origin {
            DiskOrigin::New => self
                .disks
                .create(spec.disk_size_mb.max(16), &dir.join("disk.img"), uid_base)
                .map_err(io_err("create sandbox disk"))?,
            DiskOrigin::Kept(mount) => mount,
            DiskOrigin::Remount { disk_uid_base } => {
                pause::mount_kept_disk(dir, disk_uid_base, uid_base)
                    .map_err(io_err("mount kept disk"))?
            }
        };
        self.ensure_init_binary()?;
        let root = dir.join("root");
        perms::create_dir_all(&root, perms::PRIVATE_DIR)
            .map_err(io_err("create root mountpoint"))?;
        let launch_config = LaunchConfig {
            hostname: spec.id.clone(),
            layers: spec.layers.len(),
            init_binary: self.init_binary.clone(),
            init_args: self.config.envd_args.clone(),
            init_listen: self.config.init_listen,
            init_env: vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                "HOME=/root".into(),
            ],
            tmpfs_bytes: (spec.memory_mb * 1024 * 1024 / 2).max(1 << 20),
            host_sysfs: false,
            nameserver: None,
            volume_paths: spec.volumes.iter().map(|v| v.path.clone()).collect(),
            view_paths: Vec::new(),
            egress_ca_pem: None,
        };
        let egress_ca_pem = self
            .egress_ca
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut launch_config = launch_config;
        if egress_ca_pem.is_some() {
            launch_config.init_env.extend(launch::egress_ca_env());
        }
        launch_config.egress_ca_pem = egress_ca_pem;
        let netns = self.netns_for_start(&spec.id)?;
        let sysfs = netns
            .as_ref()
            .map(network::sysfs_in)
            .transpose()
            .map_err(io_err("mount sysfs in the sandbox's network namespace"))?;
        let (view_paths, view_mounts) = self.view_mounts(&spec.id).into_iter().unzip();
        let launch_config = LaunchConfig {
            host_sysfs: sysfs.is_some(),
            nameserver: self.network.as_ref().map(|net| net.gateway()),
            view_paths,
            ..launch_config
        };
        let (parent_sock, child_sock) = socketpair().map_err(io_err("socketpair"))?;
        let launcher = cpath(&self.config.launcher_binary).map_err(io_err("launcher path"))?;
        let root = cpath(&root).map_err(io_err("root path"))?;
        let (pidfd, pid) = clone_launcher(&launcher, &root, child_sock, netns.as_ref())
            .map_err(io_err("clone sandbox init"))?;
        let result = disk
            .try_clone()
            .map_err(io_err("dup disk mount"))
            .and_then(|sent| {
                self.finish_start(
                    spec,
                    uid_base,
                    pid,
                    &parent_sock,
                    &launch_config,
                    StartMounts {
                        disk: sent,
                        views: view_mounts,
                        sysfs,
                    },
                )
            });
        if let Err(e) = result {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
            let _ = sys::pidfd_wait_exit(pidfd.as_fd(), 10_000);
            let _ = sys::pidfd_reap(pidfd.as_fd());
            return Err(e);
        }
        Ok((pidfd, pid, disk))
    }

    /// Parent side of the start handshake: id maps, cgroups, idmapped layers, config; the
    /// mounts sent besides the layers and volumes are in `mounts`.
    fn finish_start(
        &self,
        spec: &SandboxSpec,
        uid_base: u32,
        pid: i32,
        sock: &OwnedFd,
        config: &LaunchConfig,
        StartMounts { disk, views, sysfs }: StartMounts,
    ) -> Result<(), RuntimeError> {
        let map = format!("0 {uid_base} {UID_RANGE_SIZE}\n");
        fs::write(format!("/proc/{pid}/uid_map"), &map).map_err(io_err("write uid_map"))?;
        fs::write(format!("/proc/{pid}/gid_map"), &map).map_err(io_err("write gid_map"))?;
        let userns = fs::File::open(format!("/proc/{pid}/ns/user"))
            .map_err(io_err("open sandbox user namespace"))?;
        // The disk goes first, then the layers topmost first, then the volumes, the views
        // and the sysfs.
        let mut layers = Vec::with_capacity(spec.layers.len() + 1);
        layers.push(disk);
        for layer in spec.layers.iter().rev() {
            let path = cpath(layer).map_err(io_err("layer path"))?;
            let tree =
                sys::open_tree_clone(libc::AT_FDCWD, &path, libc::AT_RECURSIVE as libc::c_uint)
                    .map_err(io_err(format!("open_tree {}", layer.display())))?;
            sys::mount_setattr_idmap(tree.as_fd(), userns.as_fd())
                .map_err(io_err(format!("idmap {}", layer.display())))?;
            layers.push(tree);
        }
        for volume in &spec.volumes {
            layers.push(self.volumes.mount_for(&volume.volume, userns.as_fd())?);
        }
        layers.extend(views);
        layers.extend(sysfs);
        // The child waits for this byte before it execs the launcher as namespaced root.
        // SAFETY: writing one byte from a valid buffer to our socket.
        if unsafe { libc::write(sock.as_raw_fd(), b"g".as_ptr().cast(), 1) } != 1 {
            return Err(io_err("release sandbox init")(io::Error::last_os_error()));
        }
        launch::send_config(sock.as_fd(), config, &layers).map_err(io_err("send launch config"))?;
        drop(layers);
        // Moving a task between cgroups can wait for an RCU grace period (milliseconds on
        // a busy host), so it overlaps with the launcher's mount work; the launcher waits
        // for this second byte before it enters a cgroup namespace and execs the init.
        self.cgroups
            .attach(&spec.id, pid, self.cgroup_limits(spec))
            .map_err(io_err("attach init to cgroups"))?;
        shield_from_oom_killer(pid);
        let mut buf = vec![0u8; 4096];
        // SAFETY: writing one byte from a valid buffer to our socket.
        if unsafe { libc::write(sock.as_raw_fd(), b"c".as_ptr().cast(), 1) } != 1 {
            let err = io::Error::last_os_error();
            // The launcher failed before it waited for this byte: its reason is queued.
            // SAFETY: reading into our own buffer without blocking.
            let n = unsafe {
                libc::recv(
                    sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                return Err(RuntimeError::StartFailed {
                    id: spec.id.clone(),
                    reason: String::from_utf8_lossy(&buf[..n as usize]).into_owned(),
                });
            }
            return Err(io_err("confirm cgroups")(err));
        }
        match launcher_verdict(sock.as_fd()) {
            Ok(None) => Ok(()),
            Ok(Some(reason)) => Err(RuntimeError::StartFailed {
                id: spec.id.clone(),
                reason,
            }),
            Err(err) => Err(io_err("wait for sandbox init")(err)),
        }
    }

    /// Waits until the sandbox's init (`pidfd`) has exited, reaps it when it is our child,
    /// then kills anything still in the sandbox's groups (e.g. a `berth-launch exec`
    /// helper, or processes outside a dumped tree).
    fn end_processes(
        &self,
        id: &str,
        pidfd: &OwnedFd,
        own_child: bool,
    ) -> Result<(), RuntimeError> {
        end_processes_in(&self.cgroups, id, pidfd, own_child)
    }

    /// Removes everything a sandbox may have left: processes, cgroups, disk mount, files.
    fn teardown(
        &self,
        id: &str,
        pidfd: Option<(&OwnedFd, bool)>,
        disk: Option<OwnedFd>,
    ) -> Result<(), RuntimeError> {
        match pidfd {
            Some((pidfd, own_child)) => {
                kill_init(pidfd)?;
                self.end_processes(id, pidfd, own_child)?;
            }
            None => self
                .cgroups
                .kill_all(id)
                .map_err(io_err("kill remaining processes"))?,
        }
        self.cgroups.remove(id).map_err(io_err("remove cgroups"))?;
        self.janitor
            .dispose(&self.sandbox_dir(id), id, disk)
            .map_err(io_err("move sandbox dir to trash"))?;
        self.detach_network(id)
    }

    /// Deletes `dir`, a directory of sandbox `id` nothing uses any more (`what` names it
    /// in the trash), off the caller's path; in place if it cannot be moved to the trash.
    pub(crate) fn discard(&self, dir: &Path, id: &str, what: &str) {
        if self
            .janitor
            .dispose(dir, &format!("{id}-{what}"), None)
            .is_err()
        {
            let _ = fs::remove_dir_all(dir);
        }
    }

    /// The record in `dir` and its init, when that init still runs: a pidfd to it and
    /// its pid (checked by start time, so a reused pid is not taken for it).
    pub(crate) fn live_init(dir: &Path) -> Option<(Record, OwnedFd, i32)> {
        let record = Record::read(dir).ok()?;
        let pid = record.init_pid?;
        let ticks = record::process_start_ticks(pid)?;
        (Some(ticks) == record.init_start_ticks).then_some(())?;
        let pidfd = sys::pidfd_open(pid).ok()?;
        // The pid could have been reused between the check and the open.
        (record::process_start_ticks(pid) == Some(ticks)).then_some((record, pidfd, pid))
    }
}

impl LinuxRuntime {
    /// Takes `sandbox`'s disk mount from it (the daemon's reference), removing its
    /// device's I/O limits.
    fn take_disk(&self, sandbox: &Sandbox) -> Option<OwnedFd> {
        let disk = sandbox
            .disk
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(disk) = &disk {
            if let Err(err) = self.throttle.clear(disk.as_fd()) {
                tracing::warn!(sandbox = %sandbox.info.id, %err, "removing the disk's I/O limits");
            }
        }
        disk
    }

    /// `create` with the sandbox's network policy (None: the default, internet access).
    fn create_with(
        &self,
        spec: &SandboxSpec,
        policy: Option<&berth_net::NetworkPolicy>,
    ) -> Result<SandboxInfo, RuntimeError> {
        if !valid_id(&spec.id) {
            return Err(RuntimeError::InvalidId(spec.id.clone()));
        }
        if spec.layers.is_empty() {
            return Err(RuntimeError::NoLayers);
        }
        check_volume_mounts(spec)?;
        let spec = &spec.with_distinct_layers();
        self.bring_up(spec, true, None, |slot, dir| {
            let _warm = self.make_cgroups(spec)?;
            self.attach_network(&spec.id, policy)?;
            self.start(spec, slot, dir, DiskOrigin::New)
                .map(|(pidfd, pid, disk)| (pidfd, pid, Some(disk)))
        })
    }
}

impl Runtime for LinuxRuntime {
    fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        self.create_with(spec, None)
    }

    fn create_with_network(
        &self,
        spec: &SandboxSpec,
        policy: &berth_net::NetworkPolicy,
    ) -> Result<SandboxInfo, RuntimeError> {
        self.create_with(spec, Some(policy))
    }

    fn set_network_policy(
        &self,
        id: &str,
        policy: &berth_net::NetworkPolicy,
    ) -> Result<(), RuntimeError> {
        self.replace_network_policy(id, policy)
    }

    fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        let removed = self
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        let Some(sandbox) = removed else {
            return self.kill_paused(id);
        };
        // A frozen sandbox cannot die; thaw is harmless otherwise.
        let _ = self.cgroups.set_frozen(id, false);
        let disk = self.take_disk(&sandbox);
        let result = self.teardown(id, Some((&sandbox.pidfd, sandbox.own_child)), disk);
        self.release_slot(sandbox.slot, id);
        result
    }

    fn freeze(&self, id: &str) -> Result<(), RuntimeError> {
        self.get(id)?;
        self.cgroups.set_frozen(id, true).map_err(io_err("freeze"))
    }

    fn thaw(&self, id: &str) -> Result<(), RuntimeError> {
        self.get(id)?;
        self.cgroups.set_frozen(id, false).map_err(io_err("thaw"))
    }

    fn confine_workload(&self, id: &str) -> Result<bool, RuntimeError> {
        let sandbox = self.get(id)?;
        self.cgroups
            .confine_spawner(
                id,
                sandbox.info.init_pid,
                self.cgroup_limits(&sandbox.info.spec),
            )
            .map_err(io_err(
                "move envd's spawner thread into the workload cgroup",
            ))
    }

    fn stats(&self, id: &str) -> Result<SandboxStats, RuntimeError> {
        let sandbox = self.get(id)?;
        let usage = self
            .cgroups
            .usage(id)
            .map_err(io_err("read cgroup stats"))?;
        let (disk_used, disk_total) =
            // The overlay root reports its upper layer's filesystem: the sandbox's disk.
            disk::usage(Path::new(&format!("/proc/{}/root", sandbox.info.init_pid)))
                .map_err(io_err("read disk usage"))?;
        Ok(SandboxStats {
            cpu_count: sandbox.info.spec.cpu_count,
            cpu_usage_ns: usage.cpu_ns,
            mem_used: usage.mem_used,
            mem_total: usage.mem_limit,
            mem_cache: usage.mem_cache,
            disk_used,
            disk_total,
        })
    }

    fn exited(&self) -> Vec<String> {
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|s| sys::pidfd_wait_exit(s.pidfd.as_fd(), 0).unwrap_or(false))
            .map(|s| s.info.id.clone())
            .collect()
    }

    fn list(&self) -> Vec<SandboxInfo> {
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|s| s.info.clone())
            .collect()
    }

    fn recover(&self) -> Result<RecoveryReport, RuntimeError> {
        let mut report = RecoveryReport::default();
        let sandboxes_dir = self.config.state_dir.join("sandboxes");
        let entries = fs::read_dir(&sandboxes_dir).map_err(io_err("read state dir"))?;
        let mut seen = BTreeSet::new();
        for entry in entries.flatten() {
            let Ok(id) = entry.file_name().into_string() else {
                continue;
            };
            seen.insert(id.clone());
            if self
                .sandboxes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&id)
            {
                continue;
            }
            let dir = entry.path();
            self.finish_interrupted_resume(&dir, &id);
            if Self::paused_slot(&dir).is_some() && !self.settle_unsynced_pause(&dir) {
                tracing::warn!(sandbox = %id, "paused in an earlier boot of this host and not yet on disk when it went down: its checkpoint may be torn, so it is removed");
                self.teardown(&id, None, None)?;
                report.cleaned.push(id);
                continue;
            }
            if let Some(slot) = Self::paused_slot(&dir) {
                self.keep_slot(slot, &id);
                report.paused.push(id);
                continue;
            }
            match Self::live_init(&dir) {
                Some((record, pidfd, pid)) => {
                    // A running sandbox is never left frozen on purpose: a group still
                    // frozen is one whose memory pause an earlier daemon did not finish.
                    if self.cgroups.is_frozen(&id) {
                        tracing::warn!(sandbox = %id, "a pause did not finish before the daemon stopped: the sandbox runs on");
                        let _ = self.cgroups.set_frozen(&id, false);
                    }
                    self.keep_slot(record.slot, &id);
                    let disk_uid_base = self.disk_uid_base(&record);
                    let info = SandboxInfo {
                        id: id.clone(),
                        template: record.spec.template.clone(),
                        init_pid: pid,
                        created_at: record.created_at,
                        spec: record.spec,
                    };
                    let info = self.register(info, record.slot, pidfd, false, None, disk_uid_base);
                    report.reattached.push(info);
                }
                None => {
                    self.teardown(&id, None, None)?;
                    report.cleaned.push(id);
                }
            }
        }
        if !report.reattached.is_empty() {
            // LXCFS may have died while no daemon ran; a new one re-attaches the views
            // of every sandbox reattached here.
            self.views_ready();
        }
        // Empty groups whose sandbox directory is gone (a crash between the two
        // removals). A group that still holds processes is a live sandbox of another
        // daemon sharing this cgroup parent with a different state dir (every sandbox
        // of ours has a directory until its processes are dead): killing it would take
        // that daemon's sandbox down under its clients. So is an empty one whose range
        // another daemon claims for a live sandbox: a paused sandbox keeps its groups.
        // The process check counts tasks (`pids.current`), which a daemon in another
        // pid namespace (a containerised systemd) sees too where `cgroup.procs` lists
        // none of a neighbour's processes. Still, a group can fill between a check and
        // the rmdir. So a group is only removed if it is still empty at the rmdir:
        // nothing is killed, and a busy group is left to its owner.
        for id in self.cgroups.list_ids() {
            if !seen.contains(&id)
                && !self.cgroups.has_processes(&id)
                && !self.uid_claims.held_elsewhere(&id)
                && !self
                    .sandboxes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains_key(&id)
            {
                match self.cgroups.remove_if_empty(&id) {
                    Ok(true) => report.cleaned.push(id),
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(sandbox = %id, %err, "removing the empty groups of a sandbox with no directory")
                    }
                }
            }
        }
        let mut known: BTreeSet<String> = report.paused.iter().cloned().collect();
        known.extend(
            self.sandboxes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .cloned(),
        );
        self.reconcile_network(&known)?;
        Ok(report)
    }

    fn connect(&self, id: &str, port: u16) -> Result<TcpStream, RuntimeError> {
        let sandbox = self.get(id)?;
        let pidfd = sandbox.pidfd.try_clone().map_err(io_err("dup pidfd"))?;
        // setns(CLONE_NEWNET) changes only the calling thread, so use a throwaway one; the
        // socket stays in the sandbox's namespace after the thread is gone.
        std::thread::spawn(move || {
            sys::setns(pidfd.as_fd(), libc::CLONE_NEWNET)
                .map_err(io_err("enter sandbox network namespace"))?;
            TcpStream::connect(("127.0.0.1", port))
                .map_err(io_err(format!("connect to port {port}")))
        })
        .join()
        .map_err(|_| RuntimeError::WorkerPanicked("connect"))?
    }

    fn pause(&self, id: &str, memory: bool) -> Result<(), RuntimeError> {
        if !memory {
            return self.pause_filesystem(id);
        }
        let criu = self.criu()?;
        self.pause_with_memory(&criu, id, &self.sandbox_dir(id).join(CHECKPOINT_DIR))
    }

    fn resume(&self, id: &str, keep_memory: bool) -> Result<ResumedSandbox, RuntimeError> {
        if !keep_memory {
            self.drop_checkpoint(id);
        }
        let memory_restored = self.paused_with_memory(id);
        let info = if memory_restored {
            self.resume_paused(&self.criu()?, id)?
        } else {
            self.resume_paused_filesystem(id)?
        };
        Ok(ResumedSandbox {
            info,
            memory_restored,
        })
    }

    fn checkpoint(
        &self,
        id: &str,
        checkpoint_id: &str,
        durability: Durability,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let dest = self.checkpoint_dir(checkpoint_id)?;
        perms::create_dir_all(&self.checkpoint_root(), perms::PRIVATE_DIR)
            .map_err(io_err("create checkpoint dir"))?;
        let criu = self.criu()?;
        self.checkpoint_into(&criu, id, &dest, durability)
    }

    fn verify_checkpoint(&self, checkpoint_id: &str) -> Result<(), RuntimeError> {
        let checkpoint = self.checkpoint_dir(checkpoint_id)?;
        if !checkpoint.is_dir() {
            return Err(RuntimeError::CheckpointNotFound(checkpoint_id.to_owned()));
        }
        let mut random = [0u8; 8];
        // SAFETY: getrandom into a buffer we own; a short read only repeats zeros.
        unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
        let trial_id = format!("trial-{:016x}", u64::from_ne_bytes(random));
        self.verify_checkpoint_at(&self.criu()?, &checkpoint, &trial_id)
    }

    fn restore(
        &self,
        checkpoint_id: &str,
        id: &str,
        memory: bool,
    ) -> Result<SandboxInfo, RuntimeError> {
        let checkpoint = self.checkpoint_dir(checkpoint_id)?;
        if !checkpoint.is_dir() {
            return Err(RuntimeError::CheckpointNotFound(checkpoint_id.to_owned()));
        }
        let spec = LinuxRuntime::read_checkpoint(&checkpoint)?.spec_for(id);
        if memory {
            self.restore_checkpoint(&self.criu()?, &checkpoint, &spec)
        } else {
            self.restore_checkpoint_filesystem(&checkpoint, &spec)
        }
    }

    fn delete_checkpoint(&self, checkpoint_id: &str) -> Result<(), RuntimeError> {
        let checkpoint = self.checkpoint_dir(checkpoint_id)?;
        match fs::remove_dir_all(&checkpoint) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(io_err(format!("delete {}", checkpoint.display()))(e))
            }
            _ => Ok(()),
        }
    }

    fn create_volume(&self, id: &str) -> Result<(), RuntimeError> {
        self.volumes.create(&self.disks, id)
    }

    fn delete_volume(&self, id: &str) -> Result<(), RuntimeError> {
        self.volumes.delete(id)
    }

    fn open_volume(&self, id: &str) -> Result<OwnedFd, RuntimeError> {
        self.volumes.root(id)
    }

    fn export_paused(&self, id: &str, checkpoint_id: &str) -> Result<CheckpointInfo, RuntimeError> {
        let dest = self.checkpoint_dir(checkpoint_id)?;
        perms::create_dir_all(&self.checkpoint_root(), perms::PRIVATE_DIR)
            .map_err(io_err("create checkpoint dir"))?;
        self.export_paused_into(id, &dest)
    }

    fn pack_checkpoint(&self, checkpoint_id: &str) -> Result<PackedCheckpoint, RuntimeError> {
        let checkpoint = self.checkpoint_dir(checkpoint_id)?;
        if !checkpoint.is_dir() {
            return Err(RuntimeError::CheckpointNotFound(checkpoint_id.to_owned()));
        }
        LinuxRuntime::pack_checkpoint_at(&checkpoint)
    }

    fn import_checkpoint(
        &self,
        checkpoint_id: &str,
        tree_hash: &str,
        layers: Vec<PathBuf>,
        from: &mut dyn io::Read,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let checkpoint = self.checkpoint_dir(checkpoint_id)?;
        perms::create_dir_all(&self.checkpoint_root(), perms::PRIVATE_DIR)
            .map_err(io_err("create checkpoint dir"))?;
        LinuxRuntime::import_checkpoint_at(&checkpoint, tree_hash, layers, from)
    }

    fn checkpoints(&self) -> Result<Vec<String>, RuntimeError> {
        let entries = match fs::read_dir(self.checkpoint_root()) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list checkpoints")(e)),
        };
        Ok(entries
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|name| valid_id(name))
            .collect())
    }
}

/// Refuses a spec whose volume mounts are not a valid set of paths.
fn check_volume_mounts(spec: &SandboxSpec) -> Result<(), RuntimeError> {
    let paths: Vec<String> = spec
        .volumes
        .iter()
        .map(|v| v.path.to_string_lossy().into_owned())
        .collect();
    crate::validate_mount_paths(paths.iter().map(String::as_str)).map_err(|(i, reason)| {
        RuntimeError::InvalidMountPath {
            path: paths[i].clone(),
            reason,
        }
    })
}

/// The init's `oom_score_adj`: never chosen by the OOM killer.
const INIT_OOM_SCORE_ADJ: &str = "-1000";

/// envd must outlive what runs inside: when the sandbox's memory runs out, the cgroup's
/// OOM killer takes a workload process, never the init (envd also gives its children a
/// raised score). Set from the host, since lowering a score takes CAP_SYS_RESOURCE;
/// CRIU carries it through checkpoints. Without that capability (some containers) the
/// init keeps the default score, which is logged once: envd's children's raised score
/// then still makes them the OOM killer's choice unless they lower it themselves.
fn shield_from_oom_killer(pid: i32) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Err(error) = fs::write(format!("/proc/{pid}/oom_score_adj"), INIT_OOM_SCORE_ADJ) {
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                %error,
                "cannot shield sandbox inits from the OOM killer (berth lacks CAP_SYS_RESOURCE); a workload that lowers its own OOM score can get envd killed"
            );
        }
    }
}

/// Where restores mount volumes on the host (see [`LinuxRuntime::volume_mounts_dir`]).
const VOLUME_MOUNTS: &str = "volume-mounts";

/// Removes `dir` (a sandbox's directory in `volume-mounts/`) and its mountpoints, as a
/// daemon that died during a restore left them. Never walks into a mountpoint: a
/// mountpoint still mounted or not empty stays, and so does `dir`.
fn remove_volume_mountpoints(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let _ = fs::remove_dir(entry.path());
        }
    }
    let _ = fs::remove_dir(dir);
}

/// CRIU's key for the `index`th volume mount of a sandbox (see `volume`).
fn volume_key(index: usize) -> String {
    format!("berth-volume-{index}")
}

/// The mounts of running sandbox `info` a dump records as external: its volumes and
/// its resource views (see `views`).
pub(super) fn dump_externals(info: &SandboxInfo) -> Vec<(PathBuf, String)> {
    let mut externals: Vec<(PathBuf, String)> = info
        .spec
        .volumes
        .iter()
        .enumerate()
        .map(|(i, v)| (v.path.clone(), volume_key(i)))
        .collect();
    externals.extend(views::dump_externals(info.init_pid));
    externals
}

/// [`LinuxRuntime::end_processes`] on `cgroups`, for code without the runtime at hand
/// (see `kept`).
pub(crate) fn end_processes_in(
    cgroups: &Cgroups,
    id: &str,
    pidfd: &OwnedFd,
    own_child: bool,
) -> Result<(), RuntimeError> {
    if !sys::pidfd_wait_exit(pidfd.as_fd(), 30_000).map_err(io_err("wait for sandbox init"))? {
        return Err(RuntimeError::InitDidNotExit(id.to_owned()));
    }
    if own_child {
        let _ = sys::pidfd_reap(pidfd.as_fd());
    }
    cgroups
        .kill_all(id)
        .map_err(io_err("kill remaining processes"))
}

/// SIGKILL to a sandbox's init: a pid namespace dies with its init. An init already gone
/// is fine.
pub(crate) fn kill_init(pidfd: &OwnedFd) -> Result<(), RuntimeError> {
    match sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL) {
        Err(e) if e.raw_os_error() != Some(libc::ESRCH) => Err(io_err("kill sandbox init")(e)),
        _ => Ok(()),
    }
}

/// What the launcher says after the daemon's last byte: `None` when it exec'd the init
/// (its end of `sock` closes on exec: end of stream), else why it failed. A launcher that
/// fails before it reads that byte exits with the byte unread, and a seqpacket socket then
/// reports ECONNRESET to this end ahead of the reason queued before it: so that error is
/// followed by another read, which finds the reason, or nothing if the launcher died
/// without one (a failure all the same, never taken for the exec).
fn launcher_verdict(sock: BorrowedFd<'_>) -> io::Result<Option<String>> {
    let mut buf = vec![0u8; 4096];
    let mut reset = false;
    loop {
        // SAFETY: reading into our own buffer; the socket has a receive timeout.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n > 0 {
            return Ok(Some(
                String::from_utf8_lossy(&buf[..n as usize]).into_owned(),
            ));
        }
        if n == 0 {
            return match reset {
                false => Ok(None),
                true => Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "the launcher exited before it read the daemon's last byte, without saying why",
                )),
            };
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            // A timed socket wait returns EINTR on any signal (a stop and continue of the
            // daemon, say) instead of restarting.
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::ConnectionReset if !reset => reset = true,
            _ => return Err(err),
        }
    }
}

fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid 2-element out array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    let pair = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let timeout = libc::timeval {
        tv_sec: 30,
        tv_usec: 0,
    };
    // SAFETY: valid socket and option buffer.
    unsafe {
        libc::setsockopt(
            pair.0.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    Ok(pair)
}

/// `struct clone_args` from <linux/sched.h>.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Clones the sandbox init into new namespaces: a new network namespace too, unless
/// `netns` is given, in which case the clone runs on a thread that has entered it (so the
/// init starts there and the namespace stays the host's). The child is a copy of this
/// multi-threaded process, so it only makes raw syscalls on data prepared here: wait for
/// the parent's go byte (id maps written), become namespaced root, move the control
/// socket to fd 3 and exec `berth-launch init`.
fn clone_launcher(
    launcher: &CString,
    root: &CString,
    child_sock: OwnedFd,
    netns: Option<&OwnedFd>,
) -> io::Result<(OwnedFd, i32)> {
    let Some(netns) = netns else {
        return clone_launcher_here(launcher, root, child_sock, libc::CLONE_NEWNET);
    };
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // setns changes only this thread, which ends after the clone.
                sys::setns(netns.as_fd(), libc::CLONE_NEWNET)?;
                clone_launcher_here(launcher, root, child_sock, 0)
            })
            .join()
            .map_err(|_| io::Error::other("clone thread panicked"))?
    })
}

/// The clone itself, from the calling thread, with `extra_flags` added.
fn clone_launcher_here(
    launcher: &CString,
    root: &CString,
    child_sock: OwnedFd,
    extra_flags: libc::c_int,
) -> io::Result<(OwnedFd, i32)> {
    let argv: [*const libc::c_char; 3] =
        [c"berth-launch".as_ptr(), c"init".as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: (libc::CLONE_NEWUSER
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC
            | extra_flags
            | libc::CLONE_PIDFD) as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    let sock = child_sock.as_raw_fd();
    // SAFETY: fork-like clone3 (no stack given); the child only runs `child_exec`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        // SAFETY: we are the freshly cloned child; all pointers were prepared before clone.
        unsafe { child_exec(sock, root.as_ptr(), launcher.as_ptr(), &argv, &envp) }
    }
    sys::check(ret)?;
    drop(child_sock);
    // SAFETY: CLONE_PIDFD stored a new fd owned by us.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok((pidfd, ret as i32))
}

/// Runs in the cloned child: async-signal-safe raw syscalls only, no allocation. Opens
/// the sandbox's `root` directory at `ROOT_FD` while it still has the daemon's
/// credentials (the state directory is root's alone; the launcher runs as the sandbox's
/// root, an unprivileged host uid).
///
/// # Safety
/// Must only be called in the child right after `clone3`, with valid C string pointers.
unsafe fn child_exec(
    sock: RawFd,
    root: *const libc::c_char,
    path: *const libc::c_char,
    argv: &[*const libc::c_char; 3],
    envp: &[*const libc::c_char; 1],
) -> ! {
    let fail = |code: libc::c_long| -> ! {
        // SAFETY: exit_group never returns.
        unsafe { libc::syscall(libc::SYS_exit_group, code) };
        unreachable!()
    };
    let mut go = 0u8;
    // SAFETY: raw syscalls with valid arguments (whole block); see the function contract.
    unsafe {
        if libc::syscall(libc::SYS_read, sock, &mut go as *mut u8, 1) != 1 {
            fail(1);
        }
        // The control socket first, so the root directory's descriptor cannot land on
        // CONTROL_FD (the original socket descriptor is close-on-exec).
        if sock == CONTROL_FD {
            libc::syscall(libc::SYS_fcntl, sock, libc::F_SETFD, 0);
        } else if libc::syscall(libc::SYS_dup3, sock, CONTROL_FD, 0) < 0 {
            fail(3);
        }
        // Still the daemon's credentials here: the root directory is reachable.
        let root_fd = libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            root,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if root_fd < 0 {
            fail(4);
        }
        if root_fd == ROOT_FD as libc::c_long {
            libc::syscall(libc::SYS_fcntl, root_fd, libc::F_SETFD, 0);
        } else if libc::syscall(libc::SYS_dup3, root_fd, ROOT_FD, 0) < 0 {
            fail(5);
        }
        // Raw setres[ug]id: libc's wrappers would signal the parent's other threads.
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0
            || libc::syscall(libc::SYS_setresgid, 0, 0, 0) < 0
            || libc::syscall(libc::SYS_setresuid, 0, 0, 0) < 0
        {
            fail(2);
        }
        libc::syscall(libc::SYS_execve, path, argv.as_ptr(), envp.as_ptr());
    }
    fail(127)
}

impl Drop for LinuxRuntime {
    /// A runtime holding no sandbox leaves no envd filesystem and no LXCFS mounted
    /// behind it; with sandboxes left they stay for them and for the next daemon.
    fn drop(&mut self) {
        if self.idle().unwrap_or(false) {
            if let Err(err) = envd_fs::release(&self.config.state_dir) {
                tracing::warn!(%err, "unmounting the envd binary's filesystem");
            }
            if let Err(err) = self.views.release() {
                tracing::warn!(%err, "unmounting the resource views");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(sock: &OwnedFd, bytes: &[u8]) {
        // SAFETY: writing from a valid buffer to our own socket.
        let n = unsafe { libc::write(sock.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n, bytes.len() as isize, "{}", io::Error::last_os_error());
    }

    #[test]
    fn a_launcher_that_read_the_last_byte_and_exec_d_is_a_start() {
        let (daemon, launcher) = socketpair().unwrap();
        send(&daemon, b"c");
        let mut byte = [0u8; 1];
        // SAFETY: reading into our own buffer from our own socket.
        let read = unsafe { libc::recv(launcher.as_raw_fd(), byte.as_mut_ptr().cast(), 1, 0) };
        assert_eq!(read, 1);
        drop(launcher);
        assert_eq!(launcher_verdict(daemon.as_fd()).unwrap(), None);
    }

    #[test]
    fn a_launcher_that_failed_before_the_last_byte_still_says_why() {
        let (daemon, launcher) = socketpair().unwrap();
        send(&launcher, b"mount the root: EINVAL");
        send(&daemon, b"c");
        // It exits with the daemon's byte unread: the socket reports a reset first.
        drop(launcher);
        assert_eq!(
            launcher_verdict(daemon.as_fd()).unwrap().as_deref(),
            Some("mount the root: EINVAL")
        );
    }

    #[test]
    fn a_launcher_that_died_silently_before_the_last_byte_is_no_start() {
        let (daemon, launcher) = socketpair().unwrap();
        send(&daemon, b"c");
        drop(launcher);
        let err = launcher_verdict(daemon.as_fd()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    }
}
