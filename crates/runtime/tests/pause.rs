//! Pause and resume with memory through CRIU: a value held only in a process's memory
//! survives, envd answers again, and kill (after resume or while paused) leaves nothing.
//! Privileged; needs CRIU >= 4 (provisioned under /var/lib/berth on first need).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_checkpoint::Criu;
use berth_runtime::{LinuxRuntime, Runtime, RuntimeError};
use common::TestRuntime;

/// CRIU from `BERTH_CRIU_STATE_DIR` (a state dir holding `criu/prefix`), else berth's.
fn criu() -> Criu {
    let state = std::env::var_os("BERTH_CRIU_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/berth"));
    Criu::ensure(&state, |p| eprintln!("{p}")).expect("CRIU >= 4")
}

/// Kills the sandbox (running or paused) when the test ends, even on failure: the
/// runtime's own cleanup only sees running sandboxes.
struct KillGuard<'a> {
    rt: &'a LinuxRuntime,
    id: String,
}

impl Drop for KillGuard<'_> {
    fn drop(&mut self) {
        let _ = self.rt.kill(&self.id);
    }
}

/// A Python process holding a random secret and `mib` MiB of ballast only in its memory;
/// it writes them to /root/answer whenever /root/ask appears.
const HOLDER: &str = r#"
import os, secrets, sys, time
secret = secrets.token_hex(16)
ballast = bytearray(os.urandom(1 << 20)) * int(sys.argv[1])
while True:
    if os.path.exists('/root/ask'):
        os.remove('/root/ask')
        with open('/root/answer.tmp', 'w') as f:
            f.write('%s %d' % (secret, len(ballast)))
        os.rename('/root/answer.tmp', '/root/answer')
    time.sleep(0.005)
"#;

fn start_holder(t: &TestRuntime, id: &str, mib: u32) {
    t.sh_ok(
        id,
        0,
        &format!(
            "cat > /root/holder.py <<'EOF'\n{HOLDER}\nEOF\n\
             setsid python3 /root/holder.py {mib} </dev/null >/dev/null 2>&1 &"
        ),
    );
}

/// Asks the holder for its secret; "<secret> <ballast bytes>".
fn ask(rt: &LinuxRuntime, id: &str) -> String {
    let out = rt
        .exec_command(
            id,
            0,
            0,
            &[
                "/bin/sh",
                "-c",
                "rm -f /root/answer; touch /root/ask; \
                 i=0; while [ ! -e /root/answer ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; \
                 cat /root/answer",
            ],
        )
        .unwrap()
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Everything of sandbox `id` still on the host: mounts, loop devices, cgroups, files,
/// the checkpoint.
fn leftovers(t: &TestRuntime, id: &str, images: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(id))
        .map(|l| format!("mount {l}"))
        .collect();
    found.extend(
        std::fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
            .filter(|backing| backing.contains(id))
            .map(|b| format!("loop device on {}", b.trim())),
    );
    for root in [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/freezer",
        "/sys/fs/cgroup",
    ] {
        let group = Path::new(root).join(t.cgroup_parent()).join(id);
        if group.exists() {
            found.push(format!("cgroup {}", group.display()));
        }
    }
    let mut paths = vec![t.state.join("sandboxes").join(id), images.to_path_buf()];
    paths.extend(
        std::fs::read_dir(t.state.join("trash"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains(id)),
    );
    found.extend(
        paths
            .into_iter()
            .filter(|p| p.exists())
            .map(|p| format!("path {}", p.display())),
    );
    found
}

/// Waits for the janitor's asynchronous part of a kill, then asserts nothing is left.
fn assert_clean(t: &TestRuntime, id: &str, images: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut left = leftovers(t, id, images);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = leftovers(t, id, images);
    }
    assert!(left.is_empty(), "left behind: {left:#?}");
}

fn images_dir(t: &TestRuntime, id: &str) -> PathBuf {
    let dir = t.state.join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(id)
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit_once(')').unwrap().1.starts_with(" Z"))
        .unwrap_or(false)
}

#[test]
fn memory_survives_pause_and_resume_and_kill_cleans_up() {
    let criu = criu();
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("pause")).unwrap();
    let guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    let id = info.id.as_str();
    start_holder(&t, id, 1);
    let before = ask(&t.rt, id);
    assert_eq!(before.split(' ').nth(1), Some("1048576"), "{before}");
    t.sh_ok(
        id,
        0,
        "echo on-disk > /root/file; echo in-tmpfs > /tmp/file",
    );

    let images = images_dir(&t, id);
    let started = Instant::now();
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    let paused_in = started.elapsed();
    assert!(t.rt.is_paused(id));
    assert!(!alive(info.init_pid));
    assert!(t.rt.list().iter().all(|s| s.id != id));
    assert!(matches!(
        t.rt.connect(id, 49983),
        Err(RuntimeError::NotFound(_))
    ));
    assert!(images.join("inventory.img").exists());
    // While paused the sandbox holds no mount or loop device on the host.
    let state = leftovers(&t, id, &images);
    assert!(
        state
            .iter()
            .all(|l| l.starts_with("path") || l.starts_with("cgroup")),
        "{state:#?}"
    );

    let started = Instant::now();
    let resumed = t.rt.resume_paused(&criu, id).unwrap();
    let resumed_in = started.elapsed();
    eprintln!("pause {paused_in:?}, resume {resumed_in:?} (1 MiB holder)");
    assert!(!t.rt.is_paused(id));
    assert!(!images.exists(), "checkpoint kept after resume");
    assert_eq!(ask(&t.rt, id), before, "the in-memory secret changed");
    assert_eq!(
        t.sh_ok(id, 0, "cat /root/file /tmp/file"),
        "on-disk\nin-tmpfs"
    );
    // Same uid range as before: files created now are owned by the sandbox's root.
    assert_eq!(t.sh_ok(id, 0, "touch /root/new; stat -c %u /root/new"), "0");
    assert_eq!(t.sh_ok(id, 1000, "touch /tmp/u; stat -c %u /tmp/u"), "1000");
    assert!(t.rt.stats(id).unwrap().mem_used > 0);

    drop(guard);
    assert!(!alive(resumed.init_pid));
    assert_clean(&t, id, &images);
}

#[test]
fn kill_while_paused_cleans_up() {
    let criu = criu();
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("paused-kill")).unwrap();
    let guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    let id = info.id.as_str();
    let images = images_dir(&t, id);
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    assert!(matches!(
        t.rt.pause_with_memory(&criu, id, &images_dir(&t, "again")),
        Err(RuntimeError::NotFound(_))
    ));
    t.rt.kill(id).unwrap();
    assert!(matches!(t.rt.kill(id), Err(RuntimeError::NotFound(_))));
    assert!(matches!(
        t.rt.resume_paused(&criu, id),
        Err(RuntimeError::NotFound(_))
    ));
    drop(guard);
    assert_clean(&t, id, &images);
}

#[test]
fn paused_sandbox_survives_a_daemon_restart() {
    let criu = criu();
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("paused-restart")).unwrap();
    let id = info.id.clone();
    let early_guard = KillGuard {
        rt: &t.rt,
        id: id.clone(),
    };
    start_holder(&t, &id, 64);
    let before = ask(&t.rt, &id);
    let images = images_dir(&t, &id);
    let started = Instant::now();
    t.rt.pause_with_memory(&criu, &id, &images).unwrap();
    let paused_in = started.elapsed();
    // From here the restarted runtime's guard owns the cleanup.
    std::mem::forget(early_guard);

    let restarted = t.reopen();
    let guard = KillGuard {
        rt: &restarted,
        id: id.clone(),
    };
    let report = restarted.recover().unwrap();
    assert_eq!(report.paused, std::slice::from_ref(&id));
    assert!(report.cleaned.is_empty() && report.reattached.is_empty());
    let started = Instant::now();
    let resumed = restarted.resume_paused(&criu, &id).unwrap();
    let resumed_in = started.elapsed();
    eprintln!("pause {paused_in:?}, resume {resumed_in:?} (64 MiB resident holder)");
    assert_eq!(ask(&restarted, &id), before, "the in-memory secret changed");
    assert_eq!(before.split(' ').nth(1), Some("67108864"));
    drop(guard);
    assert!(!alive(resumed.init_pid));
    assert_clean(&t, &id, &images);
}

#[test]
fn envd_answers_again_after_resume() {
    let criu = criu();
    let t = TestRuntime::with_envd();
    let info = t.rt.create(&t.spec("pause-envd")).unwrap();
    let guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    let id = info.id.as_str();
    let status = t.wait_envd_health(id);
    assert!(status.starts_with("HTTP/1.1 2"), "{status}");
    let images = images_dir(&t, id);
    let started = Instant::now();
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    let paused_in = started.elapsed();
    let started = Instant::now();
    t.rt.resume_paused(&criu, id).unwrap();
    let resumed_in = started.elapsed();
    eprintln!("pause {paused_in:?}, resume {resumed_in:?} (envd)");
    let status = t.wait_envd_health(id);
    assert!(status.starts_with("HTTP/1.1 2"), "{status}");
    assert_eq!(t.sh_ok(id, 0, "cat /proc/1/comm"), "berth-envd");
    drop(guard);
    assert_clean(&t, id, &images);
}
