//! Sandbox-sized resource views: inside a sandbox `free` and `/proc/meminfo` show the
//! sandbox's memory limit and use, and `nproc`, `/proc/cpuinfo`, `/proc/stat` and
//! `/sys/devices/system/cpu/online` its CPUs, not the host's. Agents size their work by
//! these.
//!
//! **Who answers.** LXCFS (Debian's `lxcfs` 5.0, a FUSE filesystem) answers each read
//! of its files from the cgroups of the init of the reader's pid namespace. In a
//! sandbox that is envd, in `berth/<id>` rather than `workload`, so every process of a
//! sandbox sees the sandbox's memory limit and usage and the CPUs of its cpuset. Each
//! sandbox is pinned to `cpu_count` CPUs (see `cgroup`), and `nproc` counts that same
//! affinity mask. LXCFS keeps nothing per sandbox, so a sandbox restored into new
//! cgroups (fork, snapshot) sees its own groups at once. A FUSE server of berth's own
//! would be the same program written again, and would die with the daemon.
//!
//! **One LXCFS per state directory.** It is started on first need in a session of its
//! own, so a Ctrl-C to `berth up` does not reach it, and it outlives the daemon like
//! the sandboxes do: running sandboxes keep their views across `berth up` restarts, and
//! the next daemon finds it by its mounts. It mounts its filesystem at
//! `<state>/views/lxcfs`; berth binds only what sandboxes use out of it, LXCFS's `proc`
//! directory at `views/proc` and its CPU `online` file at `views/cpu-online`, and then
//! detaches LXCFS's own mount. LXCFS also emulates cgroupfs, and through that, a root
//! `rm -r` of the state dir could remove the host's empty cgroups. When the daemon holds
//! no sandbox, running or paused, the binds go and LXCFS exits with its filesystem
//! ([`Views::release`]), as the envd filesystem does (`envd_fs`). `views/` is 0711
//! because CRIU's restore tasks bind the files as the sandbox's root, an unprivileged
//! host uid. What LXCFS shows another host user there is what that user's own `/proc`
//! shows.
//!
//! **Into a sandbox.** At each start the daemon clones each view file (`open_tree`),
//! read-only, and the launcher attaches the clones over the sandbox's own `/proc` and
//! `/sys` files (`launch`). CRIU cannot dump a FUSE mount, so a memory checkpoint
//! declares each view mount external under a fixed key ([`dump_externals`]). A restore
//! binds the file of whichever LXCFS runs then under that key ([`Views::restore_sources`]).
//!
//! **When LXCFS is missing or dead**, sandboxes start all the same with the host's
//! files. A warning is logged once until LXCFS works again. A restore then binds the
//! host's own file under each key, so a view never fails a create, resume or fork.
//! The next start replaces a dead LXCFS, and the running sandboxes get their views
//! attached again (`LinuxRuntime::repair_views`). `berth doctor` reports both cases.
//!
//! **Not virtualised**: `/proc/uptime`, because each sandbox's time namespace already
//! counts from its boot and keeps counting across a memory resume, while LXCFS's count
//! starts at its init's start, which a CRIU restore resets. Also `/proc/loadavg`,
//! `/proc/diskstats` and `/proc/swaps`; a sandbox has no swap, since its swap limit is
//! its memory limit.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::perms;
use crate::sys::{
    self, cpath, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};

/// One file LXCFS serves and where a sandbox sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    /// The file's path inside a sandbox; also the host file a restore binds without LXCFS.
    pub target: &'static str,
    /// The file's path below [`DIR`] (see [`EXPORTS`]).
    source: &'static str,
    /// CRIU's key for the mount between a dump and a restore.
    key: &'static str,
}

/// The files a sandbox sees through LXCFS.
pub(crate) const VIEWS: [View; 4] = [
    View {
        target: "/proc/meminfo",
        source: "proc/meminfo",
        key: "berth-view-meminfo",
    },
    View {
        target: "/proc/cpuinfo",
        source: "proc/cpuinfo",
        key: "berth-view-cpuinfo",
    },
    View {
        target: "/proc/stat",
        source: "proc/stat",
        key: "berth-view-stat",
    },
    View {
        target: "/sys/devices/system/cpu/online",
        source: "cpu-online",
        key: "berth-view-cpu-online",
    },
];

/// The paths of [`VIEWS`] inside a sandbox.
pub(crate) fn targets() -> [&'static str; VIEWS.len()] {
    VIEWS.map(|view| view.target)
}

/// The directory under the state dir holding LXCFS's files, pid file and log.
pub(crate) const DIR: &str = "views";
/// Where LXCFS mounts its filesystem, inside [`DIR`]: detached once [`EXPORTS`] are bound.
const ROOT: &str = "lxcfs";
/// What of LXCFS's filesystem is bound into [`DIR`]: (path in LXCFS, path in [`DIR`],
/// a directory?). The first one also tells whether LXCFS serves ([`probe`]).
const EXPORTS: [(&str, &str, bool); 2] = [
    ("proc", "proc", true),
    ("sys/devices/system/cpu/online", "cpu-online", false),
];
const PIDFILE: &str = "lxcfs.pid";
const LOG: &str = "lxcfs.log";
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
/// How long a start may take before LXCFS counts as broken.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after a failed start sandboxes start without views before another try,
/// so a broken host does not add a start attempt to every create.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// What [`Views::ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Availability {
    /// LXCFS was already serving.
    Running,
    /// LXCFS was started just now. Views that running sandboxes got from an earlier,
    /// dead one no longer answer.
    Started,
    /// No views: sandboxes see the host's files.
    Unavailable,
}

/// What is at an LXCFS mountpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A FUSE filesystem that answers.
    Alive,
    /// A FUSE filesystem whose server is gone (`ENOTCONN`).
    Dead,
    /// Nothing mounted.
    Absent,
}

/// Where state dir `state_dir`'s LXCFS serves its files and whether it does now (for
/// `berth doctor`).
pub fn probe_views(state_dir: &Path) -> (PathBuf, Probe) {
    let dir = state_dir.join(DIR);
    let found = probe(&dir.join(EXPORTS[0].1));
    (dir, found)
}

/// What is mounted at `mountpoint` (see [`Probe`]).
pub(crate) fn probe(mountpoint: &Path) -> Probe {
    let Ok(path) = cpath(mountpoint) else {
        return Probe::Absent;
    };
    // SAFETY: statfs is plain data; zeroed is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer. On FUSE, statfs asks the server.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } < 0 {
        return match io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOTCONN) => Probe::Dead,
            _ => Probe::Absent,
        };
    }
    if st.f_type as i64 == FUSE_SUPER_MAGIC {
        Probe::Alive
    } else {
        Probe::Absent
    }
}

/// The LXCFS of one state directory.
pub(crate) struct Views {
    /// The `lxcfs` executable; None when the host has none.
    binary: Option<PathBuf>,
    /// `<state>/views`.
    dir: PathBuf,
    /// Serialises starts and stops; remembers a failure.
    health: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    /// No start is tried before then (after a failure).
    retry_after: Option<Instant>,
    /// A warning about missing views was logged and LXCFS has not worked since.
    warned: bool,
}

impl Views {
    /// The views of state dir `state_dir`, served by `binary` (None: none, sandboxes see
    /// the host's files). Nothing is started yet.
    pub(crate) fn new(state_dir: &Path, binary: Option<PathBuf>) -> Self {
        Self {
            binary,
            dir: state_dir.join(DIR),
            health: Mutex::new(Health::default()),
        }
    }

    /// `<state>/views/lxcfs`: where LXCFS mounts its filesystem (and its command line
    /// names).
    fn root(&self) -> PathBuf {
        self.dir.join(ROOT)
    }

    /// Makes sure LXCFS serves: a live one is kept, a dead one is unmounted and
    /// replaced, a missing one started. Never fails: without LXCFS sandboxes see the
    /// host's files, which is logged once.
    pub(crate) fn ensure(&self) -> Availability {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        match probe(&self.dir.join(EXPORTS[0].1)) {
            Probe::Alive => return Availability::Running,
            Probe::Dead => {
                tracing::warn!(
                    views = %self.dir.display(),
                    "LXCFS has died: running sandboxes' memory and CPU views stopped answering; starting a new one"
                );
                self.detach_all();
            }
            Probe::Absent => {}
        }
        let Some(binary) = &self.binary else {
            if !health.warned {
                tracing::warn!(
                    "lxcfs is not installed: sandboxes see the host's memory and CPUs in free, nproc and /proc (apt-get install lxcfs)"
                );
                health.warned = true;
            }
            return Availability::Unavailable;
        };
        if health.retry_after.is_some_and(|at| Instant::now() < at) {
            return Availability::Unavailable;
        }
        match self.start(binary) {
            Ok(()) => {
                if health.warned {
                    tracing::info!("LXCFS serves sandboxes' memory and CPU views again");
                }
                *health = Health::default();
                Availability::Started
            }
            Err(err) => {
                health.retry_after = Some(Instant::now() + RETRY_AFTER);
                if !health.warned {
                    tracing::warn!(
                        %err,
                        log = %self.dir.join(LOG).display(),
                        "LXCFS did not start: sandboxes see the host's memory and CPUs in free, nproc and /proc until it does (berth doctor)"
                    );
                    health.warned = true;
                }
                Availability::Unavailable
            }
        }
    }

    /// Starts LXCFS, waits until it answers, binds [`EXPORTS`] and detaches its own
    /// mount.
    fn start(&self, binary: &Path) -> io::Result<()> {
        perms::create_dir_all(&self.dir, perms::TRAVERSE_DIR)?;
        let mountpoint = self.root();
        for (path, is_dir) in [(ROOT, true)]
            .into_iter()
            .chain(EXPORTS.iter().map(|(_, path, is_dir)| (*path, *is_dir)))
        {
            let created = if is_dir {
                perms::create_dir(&self.dir.join(path), perms::PRIVATE_DIR)
            } else {
                perms::create_private(&self.dir.join(path)).map(drop)
            };
            match created {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        self.stop_recorded();
        let log = perms::create_private(&self.dir.join(LOG))?;
        let mut command = Command::new(binary);
        command
            .args([
                "--foreground",
                "--disable-swap",
                "--enable-pidfd",
                "--pidfile",
            ])
            .arg(self.dir.join(PIDFILE))
            .arg(&mountpoint)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: between fork and exec only raw syscalls: setsid(2) (a session of its
        // own, so no terminal signal for the daemon reaches it) and close_range(2)
        // marking every inherited descriptor close-on-exec.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                sys::close_range_from(3, libc::CLOSE_RANGE_CLOEXEC)
            });
        }
        let mut child = command.spawn()?;
        let deadline = Instant::now() + START_TIMEOUT;
        while probe(&mountpoint) != Probe::Alive {
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!("lxcfs exited ({status})")));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                detach(&mountpoint);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "lxcfs did not mount its filesystem",
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if let Err(err) = self.export() {
            self.detach_all();
            let _ = child.kill();
            let _ = child.wait();
            return Err(err);
        }
        // The daemon reaps it if it ends first; otherwise the host's init does.
        std::thread::Builder::new()
            .name("lxcfs-reaper".into())
            .spawn(move || {
                let _ = child.wait();
            })?;
        Ok(())
    }

    /// Binds [`EXPORTS`] from LXCFS's mount, then detaches that mount: its filesystem
    /// lives on in the binds.
    fn export(&self) -> io::Result<()> {
        let root = self.root();
        for (inside, path, _) in EXPORTS {
            let (source, target) = (cpath(&root.join(inside))?, cpath(&self.dir.join(path))?);
            // SAFETY: mount(2) with valid NUL-terminated paths and no data.
            let bound = unsafe {
                libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                )
            };
            if bound < 0 {
                let err = io::Error::last_os_error();
                return Err(io::Error::new(
                    err.kind(),
                    format!("bind LXCFS's {inside}: {err}"),
                ));
            }
        }
        let root = cpath(&root)?;
        // SAFETY: umount2 with a valid NUL-terminated path.
        sys::check(unsafe { libc::umount2(root.as_ptr(), libc::MNT_DETACH) }.into())?;
        Ok(())
    }

    /// Detaches whatever of LXCFS is mounted in [`DIR`].
    fn detach_all(&self) {
        for (_, path, _) in EXPORTS {
            detach(&self.dir.join(path));
        }
        detach(&self.root());
    }

    /// Clones of the view files, read-only, each with its path inside a sandbox.
    pub(crate) fn clone_mounts(&self) -> io::Result<Vec<(PathBuf, OwnedFd)>> {
        let root = &self.dir;
        VIEWS
            .iter()
            .map(|view| {
                let source = root.join(view.source);
                let mount = sys::open_tree_clone(libc::AT_FDCWD, &cpath(&source)?, 0)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", source.display())))?;
                sys::mount_setattr_detached(
                    mount.as_fd(),
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                    0,
                )?;
                Ok((PathBuf::from(view.target), mount))
            })
            .collect()
    }

    /// For a CRIU restore: what to bind under each view's key. LXCFS's files when
    /// `live`, else the host's own (the sandbox then sees the host's numbers, which
    /// [`Views::ensure`] has logged).
    pub(crate) fn restore_sources(&self, live: bool) -> Vec<(String, PathBuf)> {
        let root = &self.dir;
        VIEWS
            .iter()
            .map(|view| {
                let source = if live {
                    root.join(view.source)
                } else {
                    PathBuf::from(view.target)
                };
                (view.key.to_owned(), source)
            })
            .collect()
    }

    /// Unmounts LXCFS's files (it exits with its filesystem) and ends its process.
    /// Only when the daemon holds no sandbox: a paused one would resume with the host's
    /// files.
    pub(crate) fn release(&self) -> io::Result<bool> {
        let _health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let mounted = probe(&self.dir.join(EXPORTS[0].1)) != Probe::Absent;
        self.detach_all();
        self.stop_recorded();
        for (_, path, is_dir) in EXPORTS {
            let _ = if is_dir {
                fs::remove_dir(self.dir.join(path))
            } else {
                fs::remove_file(self.dir.join(path))
            };
        }
        let _ = fs::remove_dir(self.root());
        let _ = fs::remove_file(self.dir.join(LOG));
        let _ = fs::remove_dir(&self.dir);
        Ok(mounted)
    }

    /// Ends the LXCFS its pid file names, if that process still is this state dir's
    /// LXCFS (its command line names the mountpoint), and waits for it to exit.
    fn stop_recorded(&self) {
        let pidfile = self.dir.join(PIDFILE);
        let pid = fs::read_to_string(&pidfile)
            .ok()
            .and_then(|text| text.trim().parse::<libc::pid_t>().ok());
        if let Some(pid) = pid.filter(|pid| *pid > 0) {
            if let Ok(pidfd) = sys::pidfd_open(pid) {
                // Checked after the pidfd is open: the pid cannot be reused meanwhile.
                if is_lxcfs_at(pid, &self.root()) {
                    let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGTERM);
                    let _ = sys::pidfd_wait_exit(pidfd.as_fd(), 5_000);
                }
            }
        }
        let _ = fs::remove_file(pidfile);
    }
}

/// Is process `pid` an `lxcfs` serving `mountpoint`?
fn is_lxcfs_at(pid: libc::pid_t, mountpoint: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|b| *b == 0);
    let named_lxcfs = args
        .next()
        .is_some_and(|argv0| Path::new(std::ffi::OsStr::from_bytes(argv0)).ends_with("lxcfs"));
    named_lxcfs && args.any(|arg| arg == mountpoint.as_os_str().as_bytes())
}

fn detach(mountpoint: &Path) {
    if let Ok(path) = cpath(mountpoint) {
        // SAFETY: umount2 with a valid NUL-terminated path.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// True when `target` is a mountpoint in `mountinfo` (a `/proc/<pid>/mountinfo`).
fn mounted_at(mountinfo: &str, target: &str) -> bool {
    mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(target))
}

/// True when `target` is a mountpoint of an LXCFS filesystem in `mountinfo`.
fn lxcfs_at(mountinfo: &str, target: &str) -> bool {
    mountinfo.lines().any(|line| {
        let mut fields = line.split(' ');
        fields.nth(4) == Some(target)
            && fields
                .skip_while(|field| *field != "-")
                .nth(1)
                .is_some_and(|fstype| fstype == "fuse.lxcfs")
    })
}

/// True when every view of the sandbox whose init is host pid `init_pid` is served by
/// LXCFS (not missing, not the host's file bound in its place).
pub(crate) fn served(init_pid: i32) -> bool {
    let mountinfo = fs::read_to_string(format!("/proc/{init_pid}/mountinfo")).unwrap_or_default();
    VIEWS.iter().all(|view| lxcfs_at(&mountinfo, view.target))
}

/// The view mounts of the sandbox whose init is host pid `init_pid`, as CRIU external
/// mounts of a dump: (path inside the sandbox, key). Read from its mount table, so a
/// sandbox started without views (no LXCFS then) dumps none.
pub(crate) fn dump_externals(init_pid: i32) -> Vec<(PathBuf, String)> {
    let mountinfo = fs::read_to_string(format!("/proc/{init_pid}/mountinfo")).unwrap_or_default();
    VIEWS
        .iter()
        .filter(|view| mounted_at(&mountinfo, view.target))
        .map(|view| (PathBuf::from(view.target), view.key.to_owned()))
        .collect()
}

/// Attaches `mounts` (from [`Views::clone_mounts`]) in the mount namespace of running
/// sandbox init `init_pid`, each replacing whatever is mounted at its path (a view of a
/// dead LXCFS, or the host's file a restore bound without one).
pub(crate) fn attach_in(init_pid: i32, mounts: Vec<(PathBuf, OwnedFd)>) -> io::Result<()> {
    let mountinfo = fs::read_to_string(format!("/proc/{init_pid}/mountinfo"))?;
    let mntns = OwnedFd::from(fs::File::open(format!("/proc/{init_pid}/ns/mnt"))?);
    std::thread::Builder::new()
        .name("view-repair".into())
        .spawn(move || -> io::Result<()> {
            // A thread may enter another mount namespace once it has its own root and
            // working directory; this one ends right after.
            // SAFETY: unshare(2) of this thread's filesystem attributes only.
            sys::check(unsafe { libc::unshare(libc::CLONE_FS) }.into())?;
            sys::setns(mntns.as_fd(), libc::CLONE_NEWNS)?;
            for (target, mount) in &mounts {
                let path = cpath(target)?;
                if mounted_at(&mountinfo, &target.to_string_lossy()) {
                    // SAFETY: umount2 with a valid NUL-terminated path.
                    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
                }
                sys::move_mount_to(mount.as_fd(), &path)?;
            }
            Ok(())
        })?
        .join()
        .map_err(|_| io::Error::other("the view repair thread panicked"))?
}

/// The `lxcfs` executable on `PATH`, if any: what a runtime serves views with unless
/// configured otherwise.
pub fn find_lxcfs() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("lxcfs"))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_from_the_fifth_mountinfo_field() {
        let mountinfo = "\
            600 590 0:52 / / rw,relatime - overlay overlay rw\n\
            601 600 0:60 / /proc rw,nosuid - proc proc rw\n\
            602 601 0:42 /proc/meminfo /proc/meminfo ro,nosuid - fuse.lxcfs lxcfs rw\n";
        assert!(mounted_at(mountinfo, "/proc/meminfo"));
        assert!(mounted_at(mountinfo, "/proc"));
        assert!(!mounted_at(mountinfo, "/proc/stat"));
        // The root field of a bind names the same path; only the mountpoint counts.
        assert!(!mounted_at(
            "602 601 0:42 /proc/stat /elsewhere ro - fuse.lxcfs lxcfs rw\n",
            "/proc/stat"
        ));
    }

    #[test]
    fn only_an_lxcfs_mount_counts_as_a_served_view() {
        let mountinfo = "\
            602 601 0:42 /proc/meminfo /proc/meminfo ro,nosuid - fuse.lxcfs lxcfs rw\n\
            603 601 0:22 /meminfo /proc/stat ro,nosuid - proc proc rw\n";
        assert!(lxcfs_at(mountinfo, "/proc/meminfo"));
        assert!(
            !lxcfs_at(mountinfo, "/proc/stat"),
            "the host's file bound there"
        );
        assert!(!lxcfs_at(mountinfo, "/proc/cpuinfo"), "nothing there");
    }

    #[test]
    fn a_restore_without_lxcfs_binds_the_hosts_own_files() {
        let views = Views::new(Path::new("/state"), None);
        for (key, source) in views.restore_sources(false) {
            let view = VIEWS.iter().find(|v| v.key == key).unwrap();
            assert_eq!(source, Path::new(view.target));
        }
        for (key, source) in views.restore_sources(true) {
            let view = VIEWS.iter().find(|v| v.key == key).unwrap();
            assert_eq!(source, Path::new("/state/views").join(view.source));
        }
    }

    #[test]
    fn nothing_mounted_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(probe(dir.path()), Probe::Absent);
        assert_eq!(probe(&dir.path().join("missing")), Probe::Absent);
    }
}
