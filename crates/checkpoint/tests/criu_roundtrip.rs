//! Checkpoints a real process with the CRIU berth selects and restores it, proving the
//! private loader launch works end to end. Needs root and a CRIU ≥ 4 on the host or
//! provisioned under the state dir (`scripts/install-deps.sh` provisions one).

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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

#[test]
fn dump_and_restore_keep_memory() {
    let criu = Criu::locate(&state_dir()).expect("a usable CRIU (run scripts/install-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("value");
    let images = dir.path().join("images");
    fs::create_dir(&images).unwrap();

    // The value lives only in the process's memory; it is written out on SIGUSR1.
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
    let child = child.spawn().unwrap();
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
