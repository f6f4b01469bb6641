//! Checkpoints a real process with the CRIU berth selects and restores it, proving the
//! private loader launch works end to end; and dumps after a cgroup hierarchy appeared
//! on the host. Needs root and a CRIU ≥ 4 on the host or provisioned under the state
//! dir (`scripts/install-deps.sh` provisions one).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use berth_checkpoint::{Criu, Dump, Restore};

fn state_dir() -> PathBuf {
    std::env::var_os("BERTH_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/berth"))
}

/// Kills the process it holds by pid when dropped, whether the test passed or not.
struct Reaped(i32);
impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a pid this test started; no memory is involved.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// Held by each test while it dumps: one of them adds a hierarchy to every process's
/// cgroups and removes it again.
static HIERARCHIES: Mutex<()> = Mutex::new(());

fn wait_for(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Python process, its own session, that writes a random value held only in its
/// memory to `out` at start and on SIGUSR1.
fn remembering_process(out: &Path) -> Child {
    let script = format!(
        "import os,signal,time\nv=os.urandom(8).hex()\n\
         signal.signal(signal.SIGUSR1, lambda *a: open({out:?},'w').write(v+'\\n'))\n\
         open({out:?},'w').write(v+'\\n')\nwhile True: time.sleep(0.05)\n",
        out = out.to_str().unwrap()
    );
    let mut child = Command::new("python3");
    child
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid() and close_range() are async-signal-safe. CRIU needs the tree to
    // be its own session and refuses fds inherited from outside (the test harness's).
    unsafe {
        child.pre_exec(|| {
            libc::setsid();
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        })
    };
    child.spawn().unwrap()
}

#[test]
fn dump_and_restore_keep_memory() {
    let _hierarchies = HIERARCHIES.lock().unwrap_or_else(|e| e.into_inner());
    let criu = Criu::locate(&state_dir()).expect("a usable CRIU (run scripts/install-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("value");
    let images = dir.path().join("images");
    fs::create_dir(&images).unwrap();

    let child = remembering_process(&out);
    let pid = child.id() as i32;
    let _guard = Reaped(pid);
    let before = wait_for(&out);
    fs::remove_file(&out).unwrap();

    criu.dump(&Dump {
        pid,
        images: images.clone(),
        leave_running: false,
        own_mount_namespace: false,
        netns: None,
        external_mounts: Vec::new(),
        freeze_cgroup: None,
    })
    .expect("criu dump");
    // The dump killed the process; collect it so the pid is free for the restore.
    drop(child);
    // SAFETY: waitpid on our own child; no memory is shared.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };

    let work = dir.path().join("work");
    fs::create_dir(&work).unwrap();
    let restored = criu
        .restore(&Restore {
            images: images.clone(),
            work,
            root: None,
            cgroup_root: None,
            netns: None,
            external_mounts: Vec::new(),
            leave_stopped: false,
        })
        .expect("criu restore");
    assert_eq!(restored, pid, "CRIU restores the tree under its old pid");
    // SAFETY: signal to the restored process, which CRIU gives the same pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
    let after = wait_for(&out);
    assert_eq!(before, after, "restored process lost its in-memory value");
}

/// A named cgroup v1 hierarchy of the test's own, mounted at a temporary directory;
/// unmounted there and from CRIU's yard when dropped. It never gets a group of its own:
/// a hierarchy whose last mount goes while it still has one (even one just removed)
/// outlives its mounts.
struct NamedHierarchy {
    name: String,
    mount: tempfile::TempDir,
    yard_entry: PathBuf,
}

impl NamedHierarchy {
    fn mount(yard: &Path) -> Self {
        let name = format!("berth-yard-test-{}", std::process::id());
        let mount = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "cgroup", "-o", &format!("none,name={name}"), "cgroup"])
            .arg(mount.path())
            .status()
            .unwrap();
        assert!(mounted.success(), "mounting a named cgroup hierarchy");
        Self {
            yard_entry: yard.join(&name),
            name,
            mount,
        }
    }
}

impl Drop for NamedHierarchy {
    fn drop(&mut self) {
        for point in [&self.yard_entry, &self.mount.path().to_path_buf()] {
            let _ = Command::new("umount").arg(point).status();
        }
        let _ = fs::remove_dir(&self.yard_entry);
        // The kernel ends an unmounted hierarchy a little later; until then it is still
        // listed, and a CRIU made meanwhile would mount it into its yard again.
        let listed = format!("name={}:", self.name);
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::read_to_string("/proc/self/cgroup").is_ok_and(|c| c.contains(&listed)) {
            if Instant::now() > deadline {
                // Mounted elsewhere meanwhile (another daemon's yard): it stays.
                eprintln!("cgroup hierarchy name={} is still there", self.name);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A group of the test's own in the host's `pids` hierarchy (the unified one where
/// there is none) holding one child of the test: a tree in groups other than CRIU's
/// own is what makes a dump record its cgroups, and so open every hierarchy in the
/// yard. When dropped, the child is killed and reaped and the group removed.
struct OwnGroup {
    dir: PathBuf,
    member: Option<Child>,
}

impl OwnGroup {
    fn new() -> Self {
        let parent = [
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
        ]
        .into_iter()
        .map(Path::new)
        .find(|dir| dir.join("cgroup.procs").exists())
        .expect("a cgroup hierarchy to make a group in");
        let dir = parent.join(format!("berth-yard-test-{}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        Self { dir, member: None }
    }

    /// Moves `child` into the group; its pid.
    fn enter(&mut self, child: Child) -> i32 {
        let pid = child.id() as i32;
        self.member = Some(child);
        fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        pid
    }
}

impl Drop for OwnGroup {
    fn drop(&mut self) {
        if let Some(mut child) = self.member.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_hierarchy_that_appears_after_the_yard_was_made_is_added_before_a_dump() {
    let _hierarchies = HIERARCHIES.lock().unwrap_or_else(|e| e.into_inner());
    let state = state_dir();
    let criu = Criu::locate(&state).expect("a usable CRIU (run scripts/install-deps.sh)");
    let yard = state.join("criu").join("cgyard");
    assert!(
        yard.is_dir(),
        "berth keeps a cgroup yard at {}",
        yard.display()
    );
    // What systemd does on its first start on a host without it: every process is now
    // in one more hierarchy, which the yard made above lacks.
    let hierarchy = NamedHierarchy::mount(&yard);
    assert!(
        fs::read_to_string("/proc/self/cgroup")
            .unwrap()
            .contains(&format!("name={}", hierarchy.name)),
        "the new hierarchy is listed for every process"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("value");
    let images = dir.path().join("images");
    fs::create_dir(&images).unwrap();
    let mut group = OwnGroup::new();
    let pid = group.enter(remembering_process(&out));
    wait_for(&out);

    criu.dump(&Dump {
        pid,
        images,
        leave_running: true,
        own_mount_namespace: false,
        netns: None,
        external_mounts: Vec::new(),
        freeze_cgroup: None,
    })
    .expect("a dump after a hierarchy appeared");
    // A cgroup mount of its own, not just the directory made before the mount: CRIU
    // mounting a yard of its own would also have let the dump pass.
    let yard_dev = fs::metadata(&yard).unwrap().dev();
    assert_ne!(
        fs::metadata(&hierarchy.yard_entry).map(|m| m.dev()).ok(),
        Some(yard_dev),
        "the yard gained the new hierarchy, mounted"
    );
    assert!(hierarchy.yard_entry.join("cgroup.procs").exists());
}
