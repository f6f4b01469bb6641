//! Pause and resume with memory through CRIU: a value held only in a process's memory
//! survives, envd answers again, and kill (after resume or while paused) leaves nothing.
//! Privileged; needs CRIU >= 4 (provisioned under /var/lib/berth on first need).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_checkpoint::Criu;
use berth_runtime::{
    Durability, KeepPaused, LinuxRuntime, RecoveryReport, Runtime, RuntimeError, SandboxInfo,
};
use common::checkpoint::{alive, ask, assert_clean, criu, leftovers, start_holder, KillGuard};
use common::TestRuntime;

fn images_dir(t: &TestRuntime, id: &str) -> PathBuf {
    let dir = t.state.join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(id)
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
    t.sh_ok(id, 0, "echo on-disk > /root/file; echo in-tmp > /tmp/file");

    let images = images_dir(&t, id);
    let started = Instant::now();
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    let paused_in = started.elapsed();
    assert!(t.rt.is_paused(id));
    // Without keeping, the dumped tree is ended right after the answer.
    assert!(wait_gone(info.init_pid), "the paused tree was never ended");
    assert!(t.rt.list().iter().all(|s| s.id != id));
    assert!(matches!(
        t.rt.connect(id, 49983),
        Err(RuntimeError::NotFound(_))
    ));
    assert!(images.join("inventory.img").exists());
    // While paused the sandbox holds no mount or loop device on the host.
    let state = leftovers(&t, id, &[&images]);
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
        "on-disk\nin-tmp"
    );
    // Same uid range as before: files created now are owned by the sandbox's root.
    assert_eq!(t.sh_ok(id, 0, "touch /root/new; stat -c %u /root/new"), "0");
    assert_eq!(t.sh_ok(id, 1000, "touch /tmp/u; stat -c %u /tmp/u"), "1000");
    assert!(t.rt.stats(id).unwrap().mem_used > 0);

    drop(guard);
    assert!(!alive(resumed.init_pid));
    assert_clean(&t, id, &[&images]);
}

/// The sandbox's boot id (a UUID, not the host's) and its uptime (since its start).
fn boot(t: &TestRuntime, id: &str) -> (String, f64) {
    let out = t.sh_ok(
        id,
        0,
        "cat /proc/sys/kernel/random/boot_id; cut -d' ' -f1 /proc/uptime",
    );
    let (boot_id, uptime) = out.split_once('\n').expect("two lines");
    assert_eq!(boot_id.len(), 36, "{boot_id}");
    (
        boot_id.to_string(),
        uptime.parse().expect("uptime in seconds"),
    )
}

#[test]
fn a_sandbox_boots_with_its_own_boot_id_and_clock_and_only_a_memory_resume_keeps_them() {
    let criu = criu();
    let t = TestRuntime::new();
    let started = Instant::now();
    let info = t.rt.create(&t.spec("boot")).unwrap();
    let _guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    let id = info.id.as_str();
    let host_boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let (boot_id, uptime) = boot(&t, id);
    assert_ne!(boot_id, host_boot_id.trim());
    // The clock started with the sandbox (within the second the offset rounds off).
    assert!(
        uptime <= started.elapsed().as_secs_f64() + 1.0,
        "uptime {uptime} s, sandbox started {:?} ago",
        started.elapsed()
    );
    assert!(!t
        .sh(id, 0, "echo x > /proc/sys/kernel/random/boot_id")
        .status
        .success());

    // With memory: the same boot, its clock going on from where it stood.
    let images = images_dir(&t, id);
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    t.rt.resume_paused(&criu, id).unwrap();
    let (kept_id, later) = boot(&t, id);
    assert_eq!(kept_id, boot_id);
    assert!(later >= uptime, "uptime went back: {uptime} then {later}");
    assert!(later <= started.elapsed().as_secs_f64() + 1.0);

    // Files only: a new boot.
    t.rt.pause_filesystem(id).unwrap();
    let resumed_at = Instant::now();
    t.rt.resume_paused_filesystem(id).unwrap();
    let (new_id, fresh) = boot(&t, id);
    assert_ne!(new_id, boot_id);
    assert_ne!(new_id, host_boot_id.trim());
    assert!(
        fresh <= resumed_at.elapsed().as_secs_f64() + 1.0,
        "uptime {fresh} after a new boot"
    );
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
    assert_clean(&t, id, &[&images]);
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
    // A stopping daemon ends the dumped tree before it exits (a crashed one leaves it
    // frozen: see the kept-tree restart test); this one lives on beside the next.
    assert!(wait_gone(info.init_pid), "the paused tree was never ended");
    let resumed = after_restart(&t, early_guard, |restarted, report| {
        assert_eq!(report.paused, std::slice::from_ref(&id));
        assert!(report.cleaned.is_empty() && report.reattached.is_empty());
        let started = Instant::now();
        let resumed = restarted.resume_paused(&criu, &id).unwrap();
        let resumed_in = started.elapsed();
        eprintln!("pause {paused_in:?}, resume {resumed_in:?} (64 MiB resident holder)");
        assert_eq!(ask(restarted, &id), before, "the in-memory secret changed");
        assert_eq!(before.split(' ').nth(1), Some("67108864"));
        resumed
    });
    assert!(!alive(resumed.init_pid));
    // No leftover check: the first runtime, alive in this process, still holds the disk
    // reference it kept (a crashed daemon's is closed with it).
}

/// Hands the sandbox `early_guard` guards over to a restarted runtime (from here its
/// guard owns the cleanup): reopens, recovers and gives both to `then`; the sandbox is
/// killed after it.
fn after_restart<R>(
    t: &TestRuntime,
    early_guard: KillGuard<'_>,
    then: impl FnOnce(&LinuxRuntime, RecoveryReport) -> R,
) -> R {
    let id = early_guard.id.clone();
    std::mem::forget(early_guard);
    let restarted = t.reopen();
    let _guard = KillGuard { rt: &restarted, id };
    let report = restarted.recover().unwrap();
    then(&restarted, report)
}

/// A JSON file's contents.
fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `paused.json` of sandbox `id`, and where its pause's durable marker goes.
fn markers(t: &TestRuntime, id: &str) -> (PathBuf, PathBuf) {
    let dir = t.state.join("sandboxes").join(id);
    (dir.join("paused.json"), dir.join("paused.durable.json"))
}

/// A sandbox holding a 1 MiB secret: its guard, its info, where a pause puts its images
/// (its own directory, as the server pauses) and the secret as it answered.
fn holder<'a>(t: &'a TestRuntime, name: &str) -> (KillGuard<'a>, SandboxInfo, PathBuf, String) {
    let info = t.rt.create(&t.spec(name)).unwrap();
    let guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    start_holder(t, &info.id, 1);
    let before = ask(&t.rt, &info.id);
    let images = t.state.join("sandboxes").join(&info.id).join("checkpoint");
    (guard, info, images, before)
}

/// A [`holder`] paused with memory and settled: its guard, images and secret.
fn paused_holder<'a>(
    t: &'a TestRuntime,
    criu: &Criu,
    name: &str,
) -> (KillGuard<'a>, PathBuf, String) {
    let (guard, info, images, before) = holder(t, name);
    t.rt.pause_with_memory(criu, &info.id, &images).unwrap();
    t.rt.settle_pauses();
    (guard, images, before)
}

#[test]
fn a_pause_is_made_durable_after_its_answer_and_a_restart_in_the_same_boot_finishes_it() {
    let criu = criu();
    let t = TestRuntime::new();
    let (early_guard, images, before) = paused_holder(&t, &criu, "pause-durable");
    let id = early_guard.id.clone();
    let (paused, durable) = markers(&t, &id);
    let marker = json(&paused);
    assert_eq!(json(&durable)["paused_at"], marker["paused_at"]);
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(marker["written_in_boot"], boot_id.trim());

    // The daemon died after answering, before its flusher ran: same boot, nothing of the
    // page cache lost, so the next daemon finishes the write-back and keeps the pause.
    std::fs::remove_file(&durable).unwrap();
    after_restart(&t, early_guard, |restarted, report| {
        assert_eq!(report.paused, std::slice::from_ref(&id));
        assert!(durable.exists(), "the restart made the pause durable");
        restarted.resume_paused(&criu, &id).unwrap();
        assert_eq!(ask(restarted, &id), before, "the in-memory secret changed");
        assert!(
            !paused.exists() && !durable.exists(),
            "markers left after resume"
        );
    });
    assert_clean(&t, &id, &[&images]);
}

#[test]
fn a_pause_not_on_disk_when_the_host_went_down_is_removed_not_restored() {
    let criu = criu();
    let t = TestRuntime::new();
    let (early_guard, images, _) = paused_holder(&t, &criu, "pause-torn");
    let id = early_guard.id.clone();
    // As a host crash right after the answer leaves it: a marker written in another
    // boot, never vouched for.
    let (paused, durable) = markers(&t, &id);
    std::fs::remove_file(&durable).unwrap();
    let mut marker = json(&paused);
    marker["written_in_boot"] = "00000000-0000-0000-0000-000000000000".into();
    std::fs::write(&paused, serde_json::to_vec(&marker).unwrap()).unwrap();

    after_restart(&t, early_guard, |restarted, report| {
        assert!(report.paused.is_empty(), "{:?}", report.paused);
        assert_eq!(report.cleaned, std::slice::from_ref(&id));
        assert!(!restarted.is_paused(&id));
    });
    assert_clean(&t, &id, &[&images]);
}

#[test]
fn a_resume_cut_off_before_its_marker_went_is_finished_on_restart() {
    let criu = criu();
    let t = TestRuntime::new();
    let (early_guard, images, before) = paused_holder(&t, &criu, "resume-cut");
    let id = early_guard.id.clone();
    let (paused, durable) = markers(&t, &id);
    let (paused_bytes, durable_bytes) = (
        std::fs::read(&paused).unwrap(),
        std::fs::read(&durable).unwrap(),
    );
    // A daemon resumes it and dies between writing the record of the restored init and
    // removing the markers: the sandbox runs, its markers still say paused.
    let dying = t.reopen();
    dying.recover().unwrap();
    let resumed = dying.resume_paused(&criu, &id).unwrap();
    drop(dying);
    std::fs::write(&paused, paused_bytes).unwrap();
    std::fs::write(&durable, durable_bytes).unwrap();

    after_restart(&t, early_guard, |restarted, report| {
        assert!(report.paused.is_empty(), "{:?}", report.paused);
        let reattached: Vec<_> = report.reattached.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(reattached, [id.as_str()]);
        assert_eq!(report.reattached[0].init_pid, resumed.init_pid);
        assert!(!restarted.is_paused(&id));
        assert!(!paused.exists() && !durable.exists(), "markers left");
        assert_eq!(ask(restarted, &id), before, "the in-memory secret changed");
        assert!(matches!(
            restarted.resume_paused(&criu, &id),
            Err(RuntimeError::NotPaused(_))
        ));
    });
    assert!(!alive(resumed.init_pid));
    assert_clean(&t, &id, &[&images]);
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
    assert_clean(&t, id, &[&images]);
}

/// Root inside replaces what the masks of `/proc/acpi` & co. once were bound from
/// (`/run/berth/empty`) with a symlink, and tampers with `/run/berth` (the masks' and
/// `/dev`'s sources): pause, resume and a sandbox restored from a checkpoint still come
/// back, masks and `/dev` in place, since neither source can be deleted or replaced.
#[test]
fn a_sandbox_cannot_poison_its_masks_for_later_restores() {
    let criu = criu();
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("poison")).unwrap();
    let _guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    let id = info.id.as_str();
    let masked = "ls -A /proc/acpi /sys/firmware 2>&1 | wc -l; touch /sys/firmware/x 2>&1 | grep -c 'Read-only'; \
                  echo x > /dev/null && head -c1 /dev/zero | wc -c; test -d /dev/pts && test -d /dev/shm && echo dev";
    let before = t.sh_ok(id, 0, masked);
    let (boot_id, _) = boot(&t, id);
    t.sh_ok(
        id,
        0,
        "rm -rf /run/berth/empty; ln -s /etc /run/berth/empty; mkdir -p /run/berth/x",
    );
    // The boot id's directory (with the masks' source) is under a read-only bind of
    // itself, a mountpoint: neither emptied nor moved. /dev's source holds mountpoints:
    // it cannot be deleted, only moved.
    t.sh_ok(
        id,
        0,
        "rm -rf /run/berth/boot 2>/dev/null; mv /run/berth/boot /run/berth/moved 2>/dev/null; \
         ln -sf /etc/hostname /run/berth/boot/boot_id 2>/dev/null; \
         rmdir /run/berth/boot/masked 2>/dev/null; touch /run/berth/boot/masked/x 2>/dev/null; \
         umount /run/berth/boot 2>/dev/null; \
         rm -rf /run/berth/dev 2>/dev/null; mv /run/berth/dev /run/berth/dev-moved; \
         ln -s /etc /run/berth/dev; true",
    );
    let images = images_dir(&t, id);
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    t.rt.resume_paused(&criu, id)
        .expect("a resume after the sandbox tampered with /run/berth");
    assert_eq!(t.sh_ok(id, 0, masked), before, "masks after resume");
    assert_eq!(boot(&t, id).0, boot_id, "boot id after resume");

    let checkpoint = images_dir(&t, "poison-snapshot");
    t.rt.checkpoint_into(&criu, id, &checkpoint, Durability::Durable)
        .unwrap();
    let restored =
        t.rt.restore_checkpoint(&criu, &checkpoint, &t.spec("poison-fork"))
            .expect("a restore after the sandbox tampered with /run/berth");
    let _restored_guard = KillGuard {
        rt: &t.rt,
        id: restored.id.clone(),
    };
    assert_eq!(
        t.sh_ok(&restored.id, 0, masked),
        before,
        "masks after restore"
    );
    let _ = std::fs::remove_dir_all(&checkpoint);
}

/// Keeping on, for `linger`, with room for any test sandbox.
fn keeping(linger: Duration) -> KeepPaused {
    KeepPaused {
        linger,
        budget_bytes: 1 << 30,
    }
}

/// Whether sandbox `id`'s group is frozen, and the CPU time its tasks have used (ns).
fn frozen_and_cpu(t: &TestRuntime, id: &str) -> (bool, u64) {
    let v1 = Path::new("/sys/fs/cgroup/freezer")
        .join(t.cgroup_parent())
        .join(id);
    if v1.exists() {
        let state = std::fs::read_to_string(v1.join("freezer.state")).unwrap();
        let cpu = std::fs::read_to_string(
            Path::new("/sys/fs/cgroup/cpuacct")
                .join(t.cgroup_parent())
                .join(id)
                .join("cpuacct.usage"),
        )
        .unwrap();
        return (state.trim() == "FROZEN", cpu.trim().parse().unwrap());
    }
    let v2 = Path::new("/sys/fs/cgroup").join(t.cgroup_parent()).join(id);
    let frozen = std::fs::read_to_string(v2.join("cgroup.events"))
        .unwrap()
        .lines()
        .any(|l| l == "frozen 1");
    let stat = std::fs::read_to_string(v2.join("cpu.stat")).unwrap();
    let usec: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .unwrap()
        .parse()
        .unwrap();
    (frozen, usec * 1000)
}

/// Waits up to 30 s for `pid` to be gone.
fn wait_gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

#[test]
fn a_kept_pause_resumes_the_same_processes_and_its_images_stay_the_pause() {
    let criu = criu();
    let t = TestRuntime::with(|config| config.keep_paused = keeping(Duration::from_secs(600)));
    let (guard, info, images, before) = holder(&t, "kept");
    let id = info.id.as_str();
    t.sh_ok(id, 0, "echo on-disk > /root/file");

    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    assert!(t.rt.is_paused(id));
    assert!(t.rt.list().iter().all(|s| s.id != id));
    assert!(matches!(
        t.rt.connect(id, 49983),
        Err(RuntimeError::NotFound(_))
    ));
    assert!(
        images.join("inventory.img").exists(),
        "a kept pause writes its images too"
    );
    // The dumped tree is still there, frozen: it uses no CPU while paused.
    assert!(
        alive(info.init_pid),
        "the paused sandbox's init was not kept"
    );
    let (frozen, cpu) = frozen_and_cpu(&t, id);
    assert!(frozen, "a kept tree must stay frozen while paused");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        frozen_and_cpu(&t, id),
        (true, cpu),
        "the kept tree ran while paused"
    );

    let resumed = t.rt.resume_paused(&criu, id).unwrap();
    assert_eq!(
        resumed.init_pid, info.init_pid,
        "the resume did not thaw the kept tree"
    );
    assert!(!t.rt.is_paused(id));
    assert!(!images.exists(), "checkpoint kept after resume");
    assert!(!frozen_and_cpu(&t, id).0);
    assert_eq!(ask(&t.rt, id), before, "the in-memory secret changed");
    assert_eq!(t.sh_ok(id, 0, "cat /root/file"), "on-disk");

    // Ending the kept tree (here: a clean stop) leaves the images as the pause, and
    // the next resume restores them.
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    t.rt.settle_pauses();
    assert!(
        wait_gone(info.init_pid),
        "settle_pauses left the kept tree running"
    );
    assert!(t.rt.is_paused(id));
    let restored = t.rt.resume_paused(&criu, id).unwrap();
    assert_ne!(restored.init_pid, info.init_pid);
    assert_eq!(ask(&t.rt, id), before, "the in-memory secret changed");
    assert_eq!(t.sh_ok(id, 0, "cat /root/file"), "on-disk");

    drop(guard);
    assert!(!alive(restored.init_pid));
    assert_clean(&t, id, &[&images]);
}

#[test]
fn without_keeping_a_pause_ends_its_tree_and_an_immediate_resume_restores_the_images() {
    let criu = criu();
    let t = TestRuntime::new();
    let (guard, info, images, before) = holder(&t, "unkept");
    let id = info.id.as_str();
    let mut paused = info.init_pid;
    for round in 0..3 {
        t.rt.pause_with_memory(&criu, id, &images).unwrap();
        // At once: the tree may still be ending; the resume waits for it and restores.
        let resumed = t.rt.resume_paused(&criu, id).unwrap();
        assert_ne!(
            resumed.init_pid, paused,
            "round {round}: a resume without keeping thawed the dumped tree"
        );
        assert!(
            !alive(paused),
            "round {round}: the dumped tree outlived the resume"
        );
        assert_eq!(ask(&t.rt, id), before, "round {round}: the secret changed");
        paused = resumed.init_pid;
    }
    // A kill right after a pause waits for the tree, and leaves nothing behind.
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    t.rt.kill(id).unwrap();
    assert!(
        !alive(paused),
        "kill returned before the dumped tree was dead"
    );
    drop(guard);
    assert_clean(&t, id, &[&images]);
}

#[test]
fn a_kept_tree_ends_when_its_linger_runs_out() {
    let criu = criu();
    let t = TestRuntime::with(|config| config.keep_paused = keeping(Duration::from_millis(300)));
    let (guard, info, images, before) = holder(&t, "kept-expiry");
    let id = info.id.as_str();
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    assert!(
        wait_gone(info.init_pid),
        "the kept tree outlived its linger"
    );
    assert!(t.rt.is_paused(id));
    let restored = t.rt.resume_paused(&criu, id).unwrap();
    assert_ne!(restored.init_pid, info.init_pid);
    assert_eq!(ask(&t.rt, id), before, "the in-memory secret changed");
    drop(guard);
    assert_clean(&t, id, &[&images]);
}

#[test]
fn a_tree_over_the_keep_budget_is_not_kept() {
    let criu = criu();
    let t = TestRuntime::with(|config| {
        config.keep_paused = KeepPaused {
            linger: Duration::from_secs(600),
            budget_bytes: 1,
        }
    });
    let info = t.rt.create(&t.spec("kept-budget")).unwrap();
    let guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    let id = info.id.as_str();
    let images = t.state.join("sandboxes").join(id).join("checkpoint");
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    assert!(wait_gone(info.init_pid), "a tree over the budget was kept");
    let restored = t.rt.resume_paused(&criu, id).unwrap();
    assert_ne!(restored.init_pid, info.init_pid);
    drop(guard);
    assert_clean(&t, id, &[&images]);
}

#[test]
fn a_kept_pause_is_killed_whole() {
    let criu = criu();
    let t = TestRuntime::with(|config| config.keep_paused = keeping(Duration::from_secs(600)));
    let (guard, info, images, _) = holder(&t, "kept-kill");
    let id = info.id.as_str();
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    assert!(alive(info.init_pid));
    t.rt.kill(id).unwrap();
    assert!(
        !alive(info.init_pid),
        "kill returned before the kept tree was dead"
    );
    assert!(matches!(t.rt.kill(id), Err(RuntimeError::NotFound(_))));
    drop(guard);
    assert_clean(&t, id, &[&images]);
}

#[test]
fn a_restart_ends_the_tree_an_earlier_daemon_kept_and_resumes_from_the_images() {
    let criu = criu();
    let t = TestRuntime::with(|config| config.keep_paused = keeping(Duration::from_secs(600)));
    let (early_guard, info, images, before) = holder(&t, "kept-restart");
    let id = info.id.clone();
    t.rt.pause_with_memory(&criu, &id, &images).unwrap();
    assert!(alive(info.init_pid));
    // The daemon that kept it is gone without a clean stop: the next one finds a frozen
    // init beside the paused marker.
    let resumed = after_restart(&t, early_guard, |restarted, report| {
        assert_eq!(report.paused, std::slice::from_ref(&id));
        assert!(report.reattached.is_empty(), "{report:?}");
        assert!(!alive(info.init_pid), "the restart left the kept tree");
        let resumed = restarted.resume_paused(&criu, &id).unwrap();
        assert_ne!(resumed.init_pid, info.init_pid);
        assert_eq!(ask(restarted, &id), before, "the in-memory secret changed");
        resumed
    });
    assert!(!alive(resumed.init_pid));
    // No leftover check: the first runtime, alive in this process, still holds the disk
    // reference it kept (a crashed daemon's is closed with it).
}

#[test]
fn exporting_a_kept_pause_ends_its_tree() {
    let criu = criu();
    let t = TestRuntime::with(|config| config.keep_paused = keeping(Duration::from_secs(600)));
    let info = t.rt.create(&t.spec("kept-export")).unwrap();
    let guard = KillGuard {
        rt: &t.rt,
        id: info.id.clone(),
    };
    let id = info.id.as_str();
    let images = t.state.join("sandboxes").join(id).join("checkpoint");
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    assert!(alive(info.init_pid));
    // Exported to move to another host: a restore of it into this host's groups of the
    // same id must not meet a frozen tree there.
    t.rt.export_paused(id, "kept-export-move").unwrap();
    assert!(
        !alive(info.init_pid),
        "the exported sandbox's kept tree still runs"
    );
    assert!(t.rt.is_paused(id));
    t.rt.delete_checkpoint("kept-export-move").unwrap();
    drop(guard);
    assert_clean(&t, id, &[&images]);
}

#[test]
fn a_kept_tree_killed_behind_the_runtimes_back_resumes_from_the_images() {
    let criu = criu();
    let t = TestRuntime::with(|config| config.keep_paused = keeping(Duration::from_secs(600)));
    let (guard, info, images, before) = holder(&t, "kept-lost");
    let id = info.id.as_str();
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    // Someone else (another daemon sharing the cgroup parent, an operator) kills it.
    // SAFETY: plain kill(2) of the sandbox init this test created.
    assert_eq!(unsafe { libc::kill(info.init_pid, libc::SIGKILL) }, 0);
    let freezer = Path::new("/sys/fs/cgroup/freezer")
        .join(t.cgroup_parent())
        .join(id);
    if freezer.exists() {
        std::fs::write(freezer.join("freezer.state"), "THAWED").unwrap();
    } else {
        std::fs::write(
            Path::new("/sys/fs/cgroup")
                .join(t.cgroup_parent())
                .join(id)
                .join("cgroup.freeze"),
            "0",
        )
        .unwrap();
    }
    assert!(wait_gone(info.init_pid));
    let restored = t.rt.resume_paused(&criu, id).unwrap();
    assert_ne!(restored.init_pid, info.init_pid);
    assert_eq!(ask(&t.rt, id), before, "the in-memory secret changed");
    drop(guard);
    assert_clean(&t, id, &[&images]);
}
