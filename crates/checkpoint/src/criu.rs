//! Locating and provisioning CRIU.
//!
//! Debian 12 ships CRIU 3.17, which fails on the kernels berth targets
//! (`vdso: Unexpected rt vDSO area bounds`), and Debian 13's CRIU 4.1 cannot dump a
//! process holding an INET socket (every sandbox: envd listens) on kernels ≥ 6.16, which
//! restrict `SO_PASSCRED`/`SO_PASSSEC` to unix and netlink sockets; CRIU 4.2 handles that.
//! So berth needs CRIU ≥ 4.2. When the host has one it is used as is. Otherwise
//! [`Criu::provision`] downloads Debian forky's `criu`
//! package and its whole dependency closure (libc included) into
//! `<state>/criu/prefix` with apt running on a private root (`<state>/criu/apt`), then
//! runs the binary through the prefix's own `ld-linux` with `--library-path`, so the
//! host's libc and package sources stay untouched.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// The Debian suite whose CRIU (4.2.1) is provisioned, and where apt fetches it from.
/// Trixie's 4.1.1 is too old (see the module docs).
const SUITE: &str = "forky";
const MIRROR: &str = "http://deb.debian.org/debian";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";
const MINIMUM: CriuVersion = CriuVersion {
    major: 4,
    minor: 2,
    patch: 0,
};

#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` failed ({status}): {output}")]
    CommandFailed {
        command: String,
        status: String,
        output: String,
    },
    #[error("cannot read CRIU's version from {0:?}")]
    UnparsableVersion(String),
    #[error(
        "CRIU {found} is too old: 3.x fails on this kernel (vDSO bounds) and 4.1 cannot \
         dump INET sockets on kernels >= 6.16; CRIU >= 4.2 is needed (berth provisions one \
         privately)"
    )]
    TooOld { found: CriuVersion },
    #[error("no usable CRIU: the host has none >= 4.2 and none is provisioned under {0}")]
    Missing(PathBuf),
    #[error("apt-get and dpkg-deb are needed to provision CRIU ({0})")]
    NoApt(String),
    #[error("criu {action} failed ({status}); log {log}: {errors}")]
    Checkpoint {
        action: &'static str,
        status: String,
        log: PathBuf,
        errors: String,
    },
    #[error("criu restore left no usable pid in {0}")]
    NoPid(PathBuf),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> CriuError {
    let what = what.into();
    move |source| CriuError::Io { what, source }
}

/// A CRIU release number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CriuVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for CriuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl CriuVersion {
    /// Parses `criu --version` output (`Version: 4.1.1`, possibly followed by a
    /// `GitID:` line); a missing patch number reads as 0.
    pub fn parse_output(output: &str) -> Result<Self, CriuError> {
        let bad = || CriuError::UnparsableVersion(output.to_string());
        let number = output
            .lines()
            .find_map(|l| l.trim().strip_prefix("Version:"))
            .ok_or_else(bad)?
            .trim();
        let mut parts = number.split('.').map(|p| p.parse::<u32>());
        let major = parts.next().ok_or_else(bad)?.map_err(|_| bad())?;
        let minor = parts.next().unwrap_or(Ok(0)).map_err(|_| bad())?;
        let patch = parts.next().unwrap_or(Ok(0)).map_err(|_| bad())?;
        Ok(Self {
            major,
            minor,
            patch,
        })
    }
}

/// How to start CRIU.
#[derive(Debug, Clone)]
enum Launch {
    /// A CRIU on the host's PATH (or an absolute path).
    Host(PathBuf),
    /// A provisioned CRIU run through its prefix's dynamic loader.
    Private { prefix: PathBuf },
}

/// A CRIU known to be ≥ 4.2.
#[derive(Debug, Clone)]
pub struct Criu {
    launch: Launch,
    version: CriuVersion,
    /// A tmpfs of ours mounted over `/run` in CRIU's own mount namespace (see
    /// [`kdat_run_dir`]); None when the host's `/run` already is a tmpfs.
    kdat_run: Option<PathBuf>,
    /// Every cgroup hierarchy mounted once, for CRIU's `--cgroup-yard` (see
    /// [`cgroup_yard_dir`]); None: CRIU mounts its own on each run.
    cgroup_yard: Option<CgroupYard>,
}

/// Berth's cgroup yard and the hierarchies it was last completed for.
#[derive(Debug, Clone)]
struct CgroupYard {
    dir: PathBuf,
    /// The state dir it lives in, to complete it again.
    state_dir: PathBuf,
    /// `/proc/self/cgroup` when the yard was last completed. A hierarchy can appear on
    /// the host at any time (systemd mounts `hugetlb`, `net_cls` and `perf_event` on its
    /// first start), and CRIU fails a dump or restore whose tree is in a hierarchy
    /// missing from the yard (`couldn't open <yard>/hugetlb`).
    hierarchies: Arc<Mutex<String>>,
}

impl CgroupYard {
    fn make(state_dir: &Path) -> Option<Self> {
        let hierarchies = fs::read_to_string("/proc/self/cgroup").ok()?;
        Some(Self {
            dir: cgroup_yard_dir(state_dir, &hierarchies)?,
            state_dir: state_dir.to_path_buf(),
            hierarchies: Arc::new(Mutex::new(hierarchies)),
        })
    }

    /// The yard, first completed with any hierarchy mounted since it last was; None
    /// when that fails (CRIU then mounts a yard of its own).
    fn current(&self) -> Option<&Path> {
        let now = fs::read_to_string("/proc/self/cgroup").ok()?;
        let mut known = self.hierarchies.lock().unwrap_or_else(|e| e.into_inner());
        if *known != now {
            cgroup_yard_dir(&self.state_dir, &now)?;
            *known = now;
        }
        Some(&self.dir)
    }
}

impl Criu {
    /// The CRIU berth would use, without provisioning anything: the host's when it is
    /// new enough, else the one provisioned under `state_dir`.
    pub fn locate(state_dir: &Path) -> Result<Self, CriuError> {
        let host = Self::host();
        if let Ok(criu) = &host {
            return Ok(criu.clone().with_state_caches(state_dir));
        }
        let prefix = prefix_dir(state_dir);
        if prefix.join("usr/sbin/criu").exists() {
            return Self::private(prefix).map(|criu| criu.with_state_caches(state_dir));
        }
        match host {
            Err(e @ CriuError::TooOld { .. }) => Err(e),
            _ => Err(CriuError::Missing(prefix)),
        }
    }

    /// Like [`Criu::locate`], but provisions forky's CRIU privately when neither the
    /// host nor the state directory has a usable one. Reports progress lines.
    pub fn ensure(state_dir: &Path, mut progress: impl FnMut(&str)) -> Result<Self, CriuError> {
        match Self::locate(state_dir) {
            Ok(criu) => Ok(criu),
            Err(CriuError::TooOld { found }) => {
                progress(&format!(
                    "CRIU {found} is too old for this kernel; provisioning CRIU from Debian {SUITE}"
                ));
                Self::provision(state_dir, progress)
            }
            Err(CriuError::Missing(_)) => Self::provision(state_dir, progress),
            Err(e) => Err(e),
        }
    }

    /// The host's CRIU, if it is ≥ 4.2.
    pub fn host() -> Result<Self, CriuError> {
        let program = PathBuf::from("criu");
        let version = version_of(Command::new(&program))?;
        if version < MINIMUM {
            return Err(CriuError::TooOld { found: version });
        }
        Ok(Self {
            launch: Launch::Host(program),
            version,
            kdat_run: None,
            cgroup_yard: None,
        })
    }

    fn private(prefix: PathBuf) -> Result<Self, CriuError> {
        let launch = Launch::Private { prefix };
        let version = version_of(launch.command())?;
        if version < MINIMUM {
            return Err(CriuError::TooOld { found: version });
        }
        Ok(Self {
            launch,
            version,
            kdat_run: None,
            cgroup_yard: None,
        })
    }

    /// Downloads forky's `criu` and its dependency closure with apt on a private root
    /// and unpacks it into `<state>/criu/prefix`. Idempotent; concurrent callers
    /// serialize on a lock file and the prefix appears atomically (rename).
    pub fn provision(state_dir: &Path, mut progress: impl FnMut(&str)) -> Result<Self, CriuError> {
        for tool in ["apt-get", "dpkg-deb"] {
            if which(tool).is_none() {
                return Err(CriuError::NoApt(format!("{tool} not found")));
            }
        }
        let base = state_dir.join("criu");
        fs::create_dir_all(&base).map_err(io_err(format!("create {}", base.display())))?;
        let lock = File::create(base.join(".lock")).map_err(io_err("create criu lock file"))?;
        lock.lock().map_err(io_err("lock criu provisioning"))?;

        let prefix = prefix_dir(state_dir);
        if prefix.join("usr/sbin/criu").exists() {
            match Self::private(prefix.clone()) {
                Err(CriuError::TooOld { found }) => {
                    progress(&format!("criu: replacing the provisioned CRIU {found}"));
                    // Renamed first: a CRIU still running from it keeps its open files.
                    let old = base.join(format!("prefix.old.{}", std::process::id()));
                    fs::rename(&prefix, &old).map_err(io_err("move old criu prefix aside"))?;
                    fs::remove_dir_all(&old).map_err(io_err("remove old criu prefix"))?;
                }
                other => return other,
            }
        }
        let apt = AptRoot::create(&base.join("apt"))?;
        progress(&format!("criu: fetching the Debian {SUITE} package index"));
        apt.run(&["update"])?;
        progress("criu: downloading criu and its libraries");
        apt.run(&["install", "-y", "--download-only", "criu"])?;

        let staging = base.join("prefix.tmp");
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(io_err("remove stale criu staging dir"))?;
        }
        fs::create_dir_all(&staging).map_err(io_err("create criu staging dir"))?;
        let mut debs: Vec<PathBuf> = fs::read_dir(apt.archives())
            .map_err(io_err("list downloaded packages"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "deb"))
            .collect();
        debs.sort();
        for (i, deb) in debs.iter().enumerate() {
            progress(&format!(
                "criu: unpacking {}/{} {}",
                i + 1,
                debs.len(),
                deb.file_name().unwrap_or_default().to_string_lossy()
            ));
            let mut cmd = Command::new("dpkg-deb");
            cmd.arg("-x").arg(deb).arg(&staging);
            run(cmd)?;
        }
        let criu = Self::private(staging.clone())?;
        fs::rename(&staging, &prefix).map_err(io_err("move criu prefix into place"))?;
        fs::remove_dir_all(apt.archives()).map_err(io_err("remove downloaded packages"))?;
        progress(&format!("criu: CRIU {} ready", criu.version));
        Self::private(prefix)
    }

    pub fn version(&self) -> CriuVersion {
        self.version
    }

    /// True when this is a private, provisioned CRIU rather than the host's.
    pub fn is_private(&self) -> bool {
        matches!(self.launch, Launch::Private { .. })
    }

    /// Lets CRIU keep its kernel-probe cache under `state_dir` when the host's `/run`
    /// cannot (see [`kdat_run_dir`]), and find the cgroup hierarchies mounted there
    /// (see [`cgroup_yard_dir`]); each unchanged when that is not possible.
    fn with_state_caches(mut self, state_dir: &Path) -> Self {
        self.kdat_run = kdat_run_dir(state_dir);
        self.cgroup_yard = CgroupYard::make(state_dir);
        self
    }

    /// Adds `--cgroup-yard` to a dump or restore when the yard is mounted.
    fn yard_arg(&self, cmd: &mut Command) {
        if let Some(yard) = self.cgroup_yard.as_ref().and_then(CgroupYard::current) {
            cmd.arg("--cgroup-yard").arg(yard);
        }
    }

    /// A command that runs CRIU; append its arguments (`dump`, `restore`, …).
    pub fn command(&self) -> Command {
        self.launch.command()
    }

    /// [`Criu::command`] for trees with their own mount namespace (sandboxes): CRIU runs
    /// in a private mount namespace whose `/run` keeps its kernel-probe cache (see
    /// [`kdat_run_dir`]). Not for trees sharing the caller's mount namespace: CRIU
    /// compares the tree's mount namespace with its own.
    pub fn sandbox_command(&self) -> Command {
        let mut cmd = self.launch.command();
        if let Some(run) = self
            .kdat_run
            .as_ref()
            .and_then(|dir| std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok())
        {
            // SAFETY: between fork and exec the hook makes only raw syscalls (unshare,
            // mount) on memory prepared before the fork.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || private_run(&run));
            }
        }
        cmd
    }

    /// Checkpoints the process tree rooted at `dump.pid` (with its namespaces) into
    /// `dump.images`. Mounts bound in from the host are recorded as external, the
    /// network is not locked (a sandbox's netns has no traffic CRIU must hold), and
    /// established TCP connections are saved so their owners survive the dump.
    pub fn dump(&self, dump: &Dump) -> Result<(), CriuError> {
        self.run_logged(self.dump_command(dump), "dump", &dump.images)
    }

    /// [`Criu::dump`] with `script` as CRIU's action script: an executable CRIU runs
    /// without arguments at each step of the dump, naming the step in
    /// `CRTOOLS_SCRIPT_ACTION` and the tree's root in `CRTOOLS_INIT_PID`; its output goes
    /// to the dump log. The `post-dump` step runs once every image is written and before
    /// the tree is resumed or killed (criu `cr_dump_finish` runs the post-dump scripts
    /// before `pstree_switch_state`), so the tree is still stopped: the place to copy
    /// files that must match the memory images. A failing script fails the dump and the
    /// tree keeps running.
    pub fn dump_with_action_script(&self, dump: &Dump, script: &Path) -> Result<(), CriuError> {
        let mut cmd = self.dump_command(dump);
        cmd.arg("--action-script").arg(script);
        self.run_logged(cmd, "dump", &dump.images)
    }

    fn dump_command(&self, dump: &Dump) -> Command {
        let mut cmd = if dump.own_mount_namespace {
            self.sandbox_command()
        } else {
            self.command()
        };
        cmd.arg("dump")
            .arg("--tree")
            .arg(dump.pid.to_string())
            .arg("--images-dir")
            .arg(&dump.images)
            .args(["--log-file", DUMP_LOG, "--network-lock", "skip"])
            .args(["--external", "mnt[]", "--tcp-established", "--file-locks"]);
        if dump.leave_running {
            cmd.arg("--leave-running");
        }
        if let Some(freezer) = &dump.freeze_cgroup {
            cmd.arg("--freeze-cgroup").arg(freezer);
        }
        self.yard_arg(&mut cmd);
        for (mount_point, key) in &dump.external_mounts {
            cmd.arg("--external")
                .arg(format!("mnt[{}]:{key}", mount_point.display()));
        }
        if let Some(netns) = &dump.netns {
            join_netns(&mut cmd, netns.clone(), false);
            cmd.args(["--external", &format!("mnt[/sys]:{SYSFS_KEY}")]);
        }
        cmd
    }

    /// Restores a tree checkpointed by [`Criu::dump`], detached from CRIU, and returns the host pid of its root.
    /// TCP connections saved by the dump are closed: their peers are gone.
    pub fn restore(&self, restore: &Restore) -> Result<i32, CriuError> {
        self.restore_with_cgroup_roots(restore, &[])
    }

    /// [`Criu::restore`] with the tree's cgroups moved per hierarchy: for each
    /// `(controller, root)` the dumped tree's group of that cgroup v1 controller (and the
    /// root of its cgroup namespace there) becomes `root`, a path in that controller's
    /// hierarchy; controllers not named keep their dumped paths. (`Restore::cgroup_root`
    /// moves every hierarchy, also those the tree merely shares with its parent.)
    pub fn restore_with_cgroup_roots(
        &self,
        restore: &Restore,
        cgroup_roots: &[(&str, &str)],
    ) -> Result<i32, CriuError> {
        let pidfile = restore.work.join("restore.pid");
        let log = restore.work.join(RESTORE_LOG);
        // A tree restored onto its own root has its own mount namespace.
        let mut cmd = if restore.root.is_some() {
            self.sandbox_command()
        } else {
            self.command()
        };
        cmd.arg("restore")
            .arg("--restore-detached")
            .arg("--images-dir")
            .arg(&restore.images)
            .arg("--work-dir")
            .arg(&restore.work)
            .arg("--log-file")
            .arg(&log)
            .arg("--pidfile")
            .arg(&pidfile)
            .args(["--external", "mnt[]", "--tcp-close", "--file-locks"]);
        if let Some(root) = &restore.root {
            cmd.arg("--root").arg(root);
        }
        for (key, source) in &restore.external_mounts {
            cmd.arg("--external")
                .arg(format!("mnt[{key}]:{}", source.display()));
        }
        if let Some(netns) = &restore.netns {
            join_netns(&mut cmd, netns.clone(), true);
            cmd.args(["--external", &format!("mnt[{SYSFS_KEY}]:/sys")]);
        }
        if let Some(cgroup_root) = &restore.cgroup_root {
            cmd.arg("--cgroup-root").arg(cgroup_root);
        }
        if restore.leave_stopped {
            cmd.arg("--leave-stopped");
        }
        self.yard_arg(&mut cmd);
        for (controller, root) in cgroup_roots {
            cmd.arg("--cgroup-root").arg(format!("{controller}:{root}"));
        }
        self.run_logged(cmd, "restore", &restore.work)?;
        fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|pid| *pid > 0)
            .ok_or(CriuError::NoPid(pidfile))
    }

    /// Runs a dump (`dir`: its images directory, which holds its log) or a restore
    /// (`dir`: its work directory, likewise), reporting it to the CRIU observer.
    fn run_logged(
        &self,
        mut cmd: Command,
        action: &'static str,
        dir: &Path,
    ) -> Result<(), CriuError> {
        let (kind, log) = match action {
            "dump" => (crate::CriuAction::Dump, dir.join(DUMP_LOG)),
            _ => (crate::CriuAction::Restore, dir.join(RESTORE_LOG)),
        };
        let log = log.as_path();
        let started = std::time::Instant::now();
        let status = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let ok = matches!(&status, Ok(status) if status.success());
        let images = (kind == crate::CriuAction::Dump).then_some(dir);
        crate::observe::report(kind, ok, started.elapsed(), images);
        let status = status.map_err(io_err(format!("run criu {action}")))?;
        if status.success() {
            return Ok(());
        }
        Err(CriuError::Checkpoint {
            action,
            status: status.to_string(),
            log: log.to_path_buf(),
            errors: log_errors(log),
        })
    }
}

const DUMP_LOG: &str = "dump.log";

/// The key naming a sandbox's `/sys` between a dump and a restore (see `join_netns`).
const SYSFS_KEY: &str = "berth-sysfs";

/// Makes CRIU start in network namespace `netns`. CRIU dumps and restores only the
/// namespaces in which a tree differs from CRIU's own, so a tree in CRIU's network
/// namespace is dumped without it and restored into it. That is how a namespace the host
/// owns is kept out of the images: CRIU's "external" namespaces cannot be used for it,
/// because with a user namespace in the tree CRIU insists that every other namespace be
/// owned by it (`check_user_ns`), and a host-owned one is exactly not.
///
/// Such a tree's `/sys` is a sysfs the host mounted for that namespace (the tree's own
/// user namespace may not mount one), so it is external too: for a `restore`, CRIU gets
/// a mount namespace of its own with a fresh read-only sysfs of `netns` on `/sys`, which
/// it binds back into the tree.
fn join_netns(cmd: &mut Command, netns: std::sync::Arc<std::os::fd::OwnedFd>, restore: bool) {
    let fd = netns.as_raw_fd();
    // SAFETY: between fork and exec the hook makes only raw syscalls (setns, unshare,
    // mount) with valid arguments; `netns` is moved into the closure, so its fd stays
    // open until then.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            let _keep = &netns;
            if libc::setns(fd, libc::CLONE_NEWNET) < 0 {
                return Err(io::Error::last_os_error());
            }
            if restore
                && (libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_SLAVE | libc::MS_REC,
                        std::ptr::null(),
                    ) != 0
                    || libc::mount(
                        c"sysfs".as_ptr(),
                        c"/sys".as_ptr(),
                        c"sysfs".as_ptr(),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        std::ptr::null(),
                    ) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
const RESTORE_LOG: &str = "restore.log";

/// What [`Criu::dump`] checkpoints.
#[derive(Debug, Clone)]
pub struct Dump {
    /// Host pid of the tree's root (a sandbox's init).
    pub pid: i32,
    /// Existing, empty directory for the images.
    pub images: PathBuf,
    /// Keep the tree running after the dump (snapshots, fork) instead of killing it.
    pub leave_running: bool,
    /// The tree has its own mount namespace (a sandbox): lets CRIU run in a private one
    /// (see [`Criu::sandbox_command`]).
    pub own_mount_namespace: bool,
    /// The tree's network namespace when the host owns and keeps it (a berth sandbox
    /// with networking): CRIU runs in it, so it is left out of the images (see
    /// `join_netns`) and must be given to the restore ([`Restore::netns`]).
    pub netns: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// Mounts of the tree recorded as external rather than dumped: (mount point inside
    /// the tree's mount namespace, key). Their contents stay where they are; a restore
    /// names what to bind at each key ([`Restore::external_mounts`]).
    pub external_mounts: Vec<(PathBuf, String)>,
    /// The tree's freezer cgroup (v1: its `freezer` group; v2: its group), frozen by the
    /// caller before the dump: CRIU seizes the frozen tasks and, with `leave_running`,
    /// freezes the group again before it lets them go, so the tree never runs between
    /// the dump and whoever thaws it (criu `--freeze-cgroup`; see `freezer_restore_state`
    /// in criu's `seize.c`).
    pub freeze_cgroup: Option<PathBuf>,
}

/// What [`Criu::restore`] brings back.
#[derive(Debug, Clone)]
pub struct Restore {
    /// Images written by [`Criu::dump`]; only read, so several restores may share them.
    pub images: PathBuf,
    /// Writable directory of this restore (log, pidfile).
    pub work: PathBuf,
    /// The root filesystem to restore onto, already mounted, for a tree that had its
    /// own mount namespace; `None` restores into the caller's mount namespace.
    pub root: Option<PathBuf>,
    /// Put the tree's cgroups under this path instead of the dumped one (forks).
    pub cgroup_root: Option<String>,
    /// The network namespace to restore a tree dumped with [`Dump::netns`] into (the same
    /// one after a pause, a new one per fork); CRIU runs in it.
    pub netns: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// For each key of [`Dump::external_mounts`]: the path (in the restoring CRIU's
    /// mount namespace) bound at that mount point.
    pub external_mounts: Vec<(String, PathBuf)>,
    /// Leave every restored task stopped (`--leave-stopped`): a trial restore that
    /// proves the images restore without running anything of them.
    pub leave_stopped: bool,
}

/// The error lines of a CRIU log, minus the harmless ones this host always prints.
fn log_errors(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error"))
        // CAP_SYS_RESOURCE is missing in this environment; CRIU carries on without it.
        .filter(|l| !l.contains("RLIMIT_NOFILE"))
        // CRIU probes for iptables tools; a sandbox netns has no rules that need them.
        .filter(|l| !l.contains("tables"))
        .collect();
    tail(&lines.join("\n"), 4000)
}

impl Launch {
    /// CRIU runs with umask 022 whatever the caller's: its restored tasks open some
    /// images after entering the tree's user namespace, as an unprivileged host uid, so
    /// image files must be readable by others; callers keep them from other users with
    /// the images directory's owner and mode. (CRIU restores each task's own umask.)
    fn command(&self) -> Command {
        let mut cmd = self.base_command();
        // SAFETY: between fork and exec the hook only calls umask(2), which cannot fail.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::umask(0o022);
                Ok(())
            });
        }
        cmd
    }

    fn base_command(&self) -> Command {
        match self {
            Launch::Host(program) => Command::new(program),
            Launch::Private { prefix } => {
                let libs = prefix.join(LIB_DIR);
                let mut cmd = Command::new(libs.join("ld-linux-x86-64.so.2"));
                cmd.arg("--library-path")
                    .arg(&libs)
                    .arg(prefix.join("usr/sbin/criu"));
                cmd
            }
        }
    }
}

/// CRIU probes the kernel on every run (netns and nftables probes, ptrace, …: about 50
/// ms here) unless it finds its cache, `/run/criu.kdat`, which it only writes when `/run`
/// is a tmpfs (so a reboot clears it). Where the host's `/run` is not one, berth keeps a
/// small tmpfs at `<state>/criu/run` and CRIU runs in a private mount namespace with it
/// bound over `/run` (see [`private_run`]). None when `/run` is a tmpfs already or the
/// tmpfs cannot be mounted (not root): CRIU then just probes each time.
fn kdat_run_dir(state_dir: &Path) -> Option<PathBuf> {
    if is_tmpfs(Path::new("/run")) {
        return None;
    }
    let dir = state_dir.join("criu").join("run");
    fs::create_dir_all(&dir).ok()?;
    if !is_tmpfs(&dir) {
        if let Err(err) = mount_fs(&dir, c"tmpfs", c"tmpfs", c"size=1m,mode=0700") {
            tracing::debug!(
                dir = %dir.display(),
                %err,
                "no tmpfs for CRIU's kernel-probe cache"
            );
            return None;
        }
    }
    Some(dir)
}

/// CRIU mounts every cgroup hierarchy of the tree in a temporary "yard" on each dump
/// and restore; the cgroup2 mount alone took 15–20 ms of each here (the kernel drains
/// dying cgroups first, and a host that kills sandboxes has many). Mounted once at
/// `<state>/criu/cgyard` (a small tmpfs, so a reboot clears it), laid out as CRIU's own
/// yard (a directory per hierarchy named by its controllers, `name=` dropped, cgroup2
/// as `unified`), CRIU opens them from there (`--cgroup-yard`). The hierarchies are
/// this process's, `hierarchies` as read from `/proc/self/cgroup`; CRIU's children see
/// the same ones. Mounts only what is missing, so it also completes a yard made before
/// a hierarchy appeared. None when any mount fails (not root, say): CRIU then mounts its
/// own yard as before.
fn cgroup_yard_dir(state_dir: &Path, hierarchies: &str) -> Option<PathBuf> {
    let base = state_dir.join("criu");
    fs::create_dir_all(&base).ok()?;
    // Daemons sharing the CRIU state dir must not stack two yards.
    let lock = File::create(base.join("cgyard.lock")).ok()?;
    lock.lock().ok()?;
    let yard = base.join("cgyard");
    let made = (|| -> io::Result<()> {
        fs::create_dir_all(&yard)?;
        if !is_tmpfs(&yard) {
            mount_fs(&yard, c"tmpfs", c"tmpfs", c"size=64k,mode=0700")?;
        }
        for line in hierarchies.lines() {
            let (v2, controllers, name) = yard_entry(line)
                .ok_or_else(|| io::Error::other(format!("unreadable cgroup line {line:?}")))?;
            let dir = yard.join(name);
            fs::create_dir_all(&dir)?;
            if is_cgroupfs(&dir) {
                continue;
            }
            // CRIU mounts a named hierarchy with `none,name=…` too.
            let options = match controllers.starts_with("name=") {
                true => format!("none,{controllers}"),
                false => controllers.to_owned(),
            };
            let options = std::ffi::CString::new(options).map_err(io::Error::other)?;
            if v2 {
                mount_fs(&dir, c"cgroup2", c"cgroup2", c"")?;
            } else {
                mount_fs(&dir, c"cgroup", c"cgroup", &options)?;
            }
        }
        Ok(())
    })();
    match made {
        Ok(()) => Some(yard),
        Err(err) => {
            tracing::debug!(yard = %yard.display(), %err, "no cgroup yard of berth's own");
            None
        }
    }
}

/// `(cgroup2, mount options, yard directory name)` of one `/proc/self/cgroup` line
/// (`id:controllers:path`), named as CRIU names its yard's directories.
fn yard_entry(line: &str) -> Option<(bool, &str, &str)> {
    let mut fields = line.splitn(3, ':');
    let (_, controllers) = (fields.next()?, fields.next()?);
    fields.next()?;
    Some(match controllers {
        "" => (true, "", "unified"),
        named if named.starts_with("name=") => (false, named, &named["name=".len()..]),
        other => (false, other, other),
    })
}

fn mount_fs(
    target: &Path,
    source: &std::ffi::CStr,
    fstype: &std::ffi::CStr,
    options: &std::ffi::CStr,
) -> io::Result<()> {
    let target =
        std::ffi::CString::new(target.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: mount(2) with valid NUL-terminated strings.
    let mounted = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            options.as_ptr().cast(),
        )
    };
    if mounted != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn is_cgroupfs(path: &Path) -> bool {
    fs_type(path).is_some_and(|t| t == libc::CGROUP_SUPER_MAGIC || t == libc::CGROUP2_SUPER_MAGIC)
}

fn is_tmpfs(path: &Path) -> bool {
    fs_type(path) == Some(libc::TMPFS_MAGIC)
}

/// The filesystem type (`statfs`'s `f_type`) of the filesystem holding `path`.
fn fs_type(path: &Path) -> Option<libc::c_long> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs into a zeroed struct with a valid path.
    unsafe {
        let mut stat: libc::statfs = std::mem::zeroed();
        (libc::statfs(c_path.as_ptr(), &mut stat) == 0).then_some(stat.f_type)
    }
}

/// In the forked child before exec: a private mount namespace (slave, so nothing leaks
/// to the host) whose `/run` is `run`.
fn private_run(run: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: raw syscalls with valid NUL-terminated strings; the child is single-threaded.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0
            || libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_SLAVE | libc::MS_REC,
                std::ptr::null(),
            ) != 0
            || libc::mount(
                run.as_ptr(),
                c"/run".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn prefix_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("criu").join("prefix")
}

fn version_of(mut cmd: Command) -> Result<CriuVersion, CriuError> {
    cmd.arg("--version");
    let out = run(cmd)?;
    CriuVersion::parse_output(&out)
}

/// Runs a command to completion, returning stdout, or a `CommandFailed` carrying stderr.
fn run(mut cmd: Command) -> Result<String, CriuError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("run {shown}")))?;
    if !out.status.success() {
        let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
        if text.trim().is_empty() {
            text = String::from_utf8_lossy(&out.stdout).into_owned();
        }
        return Err(CriuError::CommandFailed {
            command: shown,
            status: out.status.to_string(),
            output: tail(&text, 2000),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn tail(text: &str, max: usize) -> String {
    let start = text.len().saturating_sub(max);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].trim().to_string()
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// apt on a private root: its own sources list, lists, cache and an empty dpkg status,
/// so the download is the whole dependency closure and nothing of the host changes.
struct AptRoot {
    root: PathBuf,
}

impl AptRoot {
    fn create(root: &Path) -> Result<Self, CriuError> {
        for dir in [
            "etc/apt/sources.list.d",
            "etc/apt/preferences.d",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
            "var/lib/dpkg",
        ] {
            let d = root.join(dir);
            fs::create_dir_all(&d).map_err(io_err(format!("create {}", d.display())))?;
        }
        let status = root.join("var/lib/dpkg/status");
        if !status.exists() {
            File::create(&status).map_err(io_err("create private dpkg status"))?;
        }
        fs::write(
            root.join("etc/apt/sources.list"),
            format!("deb [signed-by={KEYRING}] {MIRROR} {SUITE} main\n"),
        )
        .map_err(io_err("write private apt sources"))?;
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    fn archives(&self) -> PathBuf {
        self.root.join("var/cache/apt/archives")
    }

    fn run(&self, args: &[&str]) -> Result<String, CriuError> {
        let r = self.root.display();
        let options: Vec<OsString> = [
            format!("Dir={r}"),
            format!("Dir::State::status={r}/var/lib/dpkg/status"),
            format!("Dir::Etc::SourceList={r}/etc/apt/sources.list"),
            format!("Dir::Etc::SourceParts={r}/etc/apt/sources.list.d"),
            format!("Dir::Etc::Preferences={r}/etc/apt/preferences"),
            format!("Dir::Etc::PreferencesParts={r}/etc/apt/preferences.d"),
            "APT::Architecture=amd64".to_string(),
            "APT::Install-Recommends=0".to_string(),
            // The private root is berth's alone; the host's dpkg lock is not involved.
            "Debug::NoLocking=1".to_string(),
        ]
        .into_iter()
        .flat_map(|o| [OsString::from("-o"), OsString::from(o)])
        .collect();
        let mut cmd = Command::new("apt-get");
        cmd.args(options)
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive");
        run(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yard_directories_are_named_as_criu_names_them() {
        assert_eq!(yard_entry("0::/"), Some((true, "", "unified")));
        assert_eq!(
            yard_entry("4:memory:/a/b"),
            Some((false, "memory", "memory"))
        );
        assert_eq!(
            yard_entry("3:cpu,cpuacct:/"),
            Some((false, "cpu,cpuacct", "cpu,cpuacct"))
        );
        assert_eq!(
            yard_entry("9:name=systemd:/x:y"),
            Some((false, "name=systemd", "systemd"))
        );
        assert_eq!(yard_entry("garbage"), None);
    }

    #[test]
    fn parses_versions() {
        let v = CriuVersion::parse_output("Version: 4.1.1\n").unwrap();
        assert_eq!(v.to_string(), "4.1.1");
        let v = CriuVersion::parse_output("Version: 3.17\nGitID: v3.17\n").unwrap();
        assert_eq!((v.major, v.minor, v.patch), (3, 17, 0));
        assert!(v < MINIMUM);
        assert!(CriuVersion::parse_output("Version: 4.1.1\n").unwrap() < MINIMUM);
        assert!(CriuVersion::parse_output("Version: 4.2.1\n").unwrap() >= MINIMUM);
        assert!(CriuVersion::parse_output("criu: command not found").is_err());
        assert!(CriuVersion::parse_output("Version: x.y").is_err());
    }

    #[test]
    fn tail_keeps_char_boundaries() {
        assert_eq!(tail("ééé", 3), "é");
        assert_eq!(tail("short", 100), "short");
    }

    #[test]
    fn private_command_goes_through_the_prefix_loader() {
        let launch = Launch::Private {
            prefix: PathBuf::from("/s/criu/prefix"),
        };
        let cmd = launch.command();
        assert_eq!(
            cmd.get_program(),
            "/s/criu/prefix/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
        );
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args[0], "--library-path");
        assert_eq!(args[2], "/s/criu/prefix/usr/sbin/criu");
    }
}
