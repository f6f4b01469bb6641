//! Peer baselines: the same rootfs and namespaces started by `unshare`, `bwrap` and
//! `crun`, each running `/bin/true`; the latency is spawn → exit.

use std::ffi::CString;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Host range the peers map the sandbox's root to (like berth's per-sandbox userns).
const PEER_UID_BASE: u32 = 100_000;
/// cgroup parent (under every v1 controller) that crun's per-run groups go into.
const CRUN_CGROUP_PARENT: &str = "berth-bench-crun";
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
const UNIFIED_MOUNT: &str = "/sys/fs/cgroup/unified";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// util-linux `unshare` with every namespace and a chroot: the floor.
    Unshare,
    /// bubblewrap: read-only bind of the rootfs, fresh /proc, minimal /dev, tmpfs /tmp.
    Bwrap,
    /// crun: an OCI bundle over the rootfs with cgroup limits like berth's.
    Crun,
}

impl Peer {
    pub const ALL: [Peer; 3] = [Peer::Unshare, Peer::Bwrap, Peer::Crun];

    pub fn name(self) -> &'static str {
        match self {
            Peer::Unshare => "unshare (floor)",
            Peer::Bwrap => "bwrap",
            Peer::Crun => "crun",
        }
    }

    fn program(self) -> &'static str {
        match self {
            Peer::Unshare => "unshare",
            Peer::Bwrap => "bwrap",
            Peer::Crun => "crun",
        }
    }
}

/// Prepared peer runs over one rootfs; removes its bundle, state and cgroups on drop.
pub struct PeerBench {
    rootfs: PathBuf,
    work_dir: PathBuf,
    /// crun 1.8 refuses hybrid cgroup hosts whose unified hierarchy has controllers
    /// (this machine's has hugetlb); crun then runs in a mount namespace without it.
    hide_unified: bool,
}

impl PeerBench {
    pub fn new(rootfs: &Path) -> anyhow::Result<PeerBench> {
        let work_dir =
            std::env::temp_dir().join(format!("berth-bench-peers-{}", std::process::id()));
        fs::create_dir_all(work_dir.join("crun-state"))?;
        let bench = PeerBench {
            rootfs: rootfs.to_path_buf(),
            work_dir,
            hide_unified: fs::read_to_string(Path::new(UNIFIED_MOUNT).join("cgroup.controllers"))
                .is_ok_and(|c| !c.trim().is_empty()),
        };
        Ok(bench)
    }

    /// Is the peer's tool installed?
    pub fn available(peer: Peer) -> bool {
        Command::new(peer.program())
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Start one sandbox with `peer`, run `/bin/true`, wait for it to exit.
    pub fn run_once(&self, peer: Peer, index: usize) -> anyhow::Result<Duration> {
        let bundle = self.work_dir.join(format!("bundle-{index}"));
        if peer == Peer::Crun {
            // Each run gets its own bundle so concurrent runs get their own cgroups.
            fs::create_dir_all(&bundle)?;
            let config = crun_config(&self.rootfs, &format!("/{CRUN_CGROUP_PARENT}/run-{index}"));
            fs::write(bundle.join("config.json"), serde_json::to_vec(&config)?)?;
        }
        let result = self.time_run(peer, index, &bundle);
        if peer == Peer::Crun {
            let _ = fs::remove_dir_all(&bundle);
        }
        result
    }

    fn time_run(&self, peer: Peer, index: usize, bundle: &Path) -> anyhow::Result<Duration> {
        let mut command = self.command(peer, index, bundle)?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let output = command
            .output()
            .with_context(|| format!("spawn {}", peer.program()))?;
        let elapsed = started.elapsed();
        if !output.status.success() {
            bail!(
                "{} failed ({}): {}",
                peer.program(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(elapsed)
    }

    fn command(&self, peer: Peer, index: usize, bundle: &Path) -> anyhow::Result<Command> {
        let mut command = Command::new(peer.program());
        match peer {
            Peer::Unshare => {
                command
                    .args(["--user", "--map-root-user", "--pid", "--fork", "--mount"])
                    .args(["--uts", "--ipc", "--net", "--cgroup"])
                    .arg(format!("--root={}", self.rootfs.display()))
                    .arg("/bin/true");
            }
            Peer::Bwrap => {
                command
                    .args(["--unshare-user", "--uid", "0", "--gid", "0"])
                    .args(["--unshare-pid", "--unshare-net", "--unshare-uts"])
                    .args(["--unshare-ipc", "--unshare-cgroup", "--die-with-parent"])
                    .arg("--ro-bind")
                    .arg(&self.rootfs)
                    .arg("/")
                    .args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"])
                    .args(["--hostname", "sandbox", "/bin/true"]);
            }
            Peer::Crun => {
                command
                    .arg("--root")
                    .arg(self.work_dir.join("crun-state"))
                    .args(["run", "--bundle"])
                    .arg(bundle)
                    .arg(format!("berth-bench-{}-{index}", std::process::id()));
                if self.hide_unified {
                    let unified = CString::new(UNIFIED_MOUNT)?;
                    let root = CString::new("/")?;
                    // SAFETY: runs in the forked child before exec and only makes raw
                    // syscalls on CStrings allocated before the fork (async-signal-safe).
                    unsafe {
                        command.pre_exec(move || {
                            if libc::unshare(libc::CLONE_NEWNS) != 0
                                || libc::mount(
                                    std::ptr::null(),
                                    root.as_ptr(),
                                    std::ptr::null(),
                                    libc::MS_REC | libc::MS_PRIVATE,
                                    std::ptr::null(),
                                ) != 0
                                || libc::umount2(unified.as_ptr(), libc::MNT_DETACH) != 0
                            {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                }
            }
        }
        Ok(command)
    }
}

impl Drop for PeerBench {
    fn drop(&mut self) {
        // crun removes each run's own group; the shared parent is ours to remove.
        if let Ok(controllers) = fs::read_dir(CGROUP_MOUNT) {
            for controller in controllers.flatten() {
                let _ = fs::remove_dir(controller.path().join(CRUN_CGROUP_PARENT));
            }
        }
        let _ = fs::remove_dir_all(&self.work_dir);
    }
}

/// An OCI runtime config equivalent to a berth sandbox: user namespace mapped to an
/// unprivileged range, pid/net/ipc/uts/mount/cgroup namespaces, read-only rootfs,
/// fresh /proc with masked paths, minimal /dev, tmpfs /tmp, memory/pids/cpu limits.
fn crun_config(rootfs: &Path, cgroups_path: &str) -> serde_json::Value {
    let id_map = serde_json::json!([{ "containerID": 0, "hostID": PEER_UID_BASE, "size": 65536 }]);
    serde_json::json!({
        "ociVersion": "1.0.0",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": ["/bin/true"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                "effective": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                "permitted": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
            },
            "noNewPrivileges": true
        },
        "root": { "path": rootfs, "readonly": true },
        "hostname": "sandbox",
        "mounts": [
            { "destination": "/proc", "type": "proc", "source": "proc" },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
            { "destination": "/dev/pts", "type": "devpts", "source": "devpts",
              "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] },
            { "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
              "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] },
            { "destination": "/sys", "type": "sysfs", "source": "sysfs",
              "options": ["nosuid", "noexec", "nodev", "ro"] },
            { "destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "nodev", "mode=1777"] }
        ],
        "linux": {
            "uidMappings": id_map,
            "gidMappings": id_map,
            "namespaces": [
                { "type": "pid" }, { "type": "network" }, { "type": "ipc" },
                { "type": "uts" }, { "type": "user" }, { "type": "mount" },
                { "type": "cgroup" }
            ],
            "cgroupsPath": cgroups_path,
            "resources": {
                "memory": { "limit": 512u64 << 20 },
                "pids": { "limit": 4096 },
                "cpu": { "quota": 200_000, "period": 100_000 }
            },
            "maskedPaths": [
                "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"
            ],
            "readonlyPaths": [
                "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"
            ]
        }
    })
}
