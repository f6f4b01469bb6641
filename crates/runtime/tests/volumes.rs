//! Volumes: shared between sandboxes with different uid ranges, owned by `user` inside,
//! size-limited (ENOSPC inside, not a full host disk), surviving kill and a daemon restart,
//! and external to checkpoints: pause/resume with memory and forks mount the same volume.
//! Privileged (loop devices, mounts); the checkpoint tests need CRIU >= 4.2.

mod common;

use std::path::PathBuf;

use berth_runtime::{Durability, Runtime, RuntimeError, SandboxSpec, VolumeMount};
use common::checkpoint::{ask, criu, start_holder, KillGuard};
use common::{unique, TestRuntime};

fn with_volume(t: &TestRuntime, name: &str, volume: &str, path: &str) -> SandboxSpec {
    SandboxSpec {
        volumes: vec![VolumeMount {
            volume: volume.to_owned(),
            path: PathBuf::from(path),
        }],
        ..t.spec(name)
    }
}

/// Waits (a bound, not a measurement) until `file` inside sandbox `id` contains `text`.
fn wait_for_content(t: &TestRuntime, id: &str, file: &str, text: &str) {
    for _ in 0..200 {
        if t.sh_ok(id, 0, &format!("cat {file}")).contains(text) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{file} never contained {text:?}");
}

/// Deletes a volume when the test ends (after the sandboxes using it are gone).
struct VolumeGuard<'a> {
    rt: &'a dyn Runtime,
    id: String,
}

impl Drop for VolumeGuard<'_> {
    fn drop(&mut self) {
        let _ = self.rt.delete_volume(&self.id);
    }
}

#[test]
fn two_sandboxes_share_a_volume_owned_by_user_and_it_outlives_them() {
    let t = TestRuntime::with(|config| config.volume_size_mb = 64);
    let volume = unique("vol");
    t.rt.create_volume(&volume).unwrap();
    let _volume_guard = VolumeGuard {
        rt: &t.rt,
        id: volume.clone(),
    };
    let a =
        t.rt.create(&with_volume(&t, "vol-a", &volume, "/mnt/data"))
            .unwrap();
    let _a = KillGuard {
        rt: &t.rt,
        id: a.id.clone(),
    };
    let b =
        t.rt.create(&with_volume(&t, "vol-b", &volume, "/home/user/shared"))
            .unwrap();
    let _b = KillGuard {
        rt: &t.rt,
        id: b.id.clone(),
    };
    // `user` (1000) owns the volume's root inside both sandboxes, though their host ids differ.
    assert_eq!(t.sh_ok(&a.id, 1000, "stat -c %u:%g /mnt/data"), "1000:1000");
    assert_eq!(
        t.sh_ok(&b.id, 1000, "stat -c %u:%g /home/user/shared"),
        "1000:1000"
    );
    t.sh_ok(&a.id, 1000, "echo from-a > /mnt/data/a.txt");
    assert_eq!(
        t.sh_ok(
            &b.id,
            1000,
            "cat /home/user/shared/a.txt; stat -c %U /home/user/shared/a.txt"
        ),
        "from-a\nuser"
    );
    t.sh_ok(&b.id, 1000, "echo from-b >> /home/user/shared/a.txt");
    assert_eq!(
        t.sh_ok(&a.id, 1000, "cat /mnt/data/a.txt"),
        "from-a\nfrom-b"
    );
    let listing = t.sh_ok(&a.id, 0, "ls -A /mnt/data");
    assert_eq!(
        listing, "a.txt",
        "a new volume holds nothing else (no lost+found)"
    );

    // Full: ENOSPC inside, and the host disk only holds the volume's size.
    let full = t.sh(
        &a.id,
        1000,
        "dd if=/dev/zero of=/mnt/data/fill bs=1M count=200 2>&1; echo status=$?",
    );
    let text = String::from_utf8_lossy(&full.stdout).into_owned();
    assert!(text.contains("No space left on device"), "{text}");
    let image = t.state.join("volumes").join(&volume).join("volume.img");
    let allocated =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&image).unwrap()) * 512;
    assert!(
        allocated <= 64 << 20,
        "volume image holds {allocated} bytes"
    );
    t.sh_ok(&a.id, 1000, "rm /mnt/data/fill");

    // The content API's view: the same files, owned by the ids they have inside.
    let root = t.rt.open_volume(&volume).unwrap();
    let path = format!(
        "/proc/self/fd/{}/a.txt",
        std::os::fd::AsRawFd::as_raw_fd(&root)
    );
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 1000);
    drop(root);

    t.rt.kill(&a.id).unwrap();
    t.rt.kill(&b.id).unwrap();
    let c =
        t.rt.create(&with_volume(&t, "vol-c", &volume, "/data"))
            .unwrap();
    let _c = KillGuard {
        rt: &t.rt,
        id: c.id.clone(),
    };
    assert_eq!(t.sh_ok(&c.id, 1000, "cat /data/a.txt"), "from-a\nfrom-b");
}

#[test]
fn mount_paths_and_volumes_are_checked() {
    let t = TestRuntime::new();
    let err =
        t.rt.create(&with_volume(&t, "vol-bad", "nosuchvolume", "/mnt/x"))
            .unwrap_err();
    assert!(matches!(err, RuntimeError::VolumeNotFound(_)), "{err}");
    let volume = unique("vol");
    t.rt.create_volume(&volume).unwrap();
    let _volume_guard = VolumeGuard {
        rt: &t.rt,
        id: volume.clone(),
    };
    for path in ["/proc/x", "/", "relative", "/etc"] {
        let err =
            t.rt.create(&with_volume(&t, "vol-bad", &volume, path))
                .unwrap_err();
        assert!(
            matches!(err, RuntimeError::InvalidMountPath { .. }),
            "{path}: {err}"
        );
    }
    assert!(t.rt.list().is_empty(), "a refused create left a sandbox");
}

#[test]
fn a_symlink_on_the_mount_path_is_refused() {
    let t = TestRuntime::new();
    let volume = unique("vol");
    t.rt.create_volume(&volume).unwrap();
    let _volume_guard = VolumeGuard {
        rt: &t.rt,
        id: volume.clone(),
    };
    // The template's /var/run is a symlink to /run: a mount there must not follow it.
    let err =
        t.rt.create(&with_volume(&t, "vol-link", &volume, "/var/run/x"))
            .unwrap_err();
    assert!(err.to_string().contains("symlink"), "{err}");
}

#[test]
fn a_volume_is_external_to_pause_and_fork() {
    let criu = criu();
    let t = TestRuntime::with(|config| config.volume_size_mb = 64);
    let volume = unique("vol");
    t.rt.create_volume(&volume).unwrap();
    let _volume_guard = VolumeGuard {
        rt: &t.rt,
        id: volume.clone(),
    };
    let source =
        t.rt.create(&with_volume(&t, "vol-src", &volume, "/mnt/data"))
            .unwrap();
    let _source = KillGuard {
        rt: &t.rt,
        id: source.id.clone(),
    };
    start_holder(&t, &source.id, 1);
    let secret = ask(&t.rt, &source.id);
    // A process holding a file of the volume open across the checkpoints.
    t.sh_ok(
        &source.id,
        1000,
        ": > /tmp/loop; echo before > /mnt/data/log; setsid sh -c 'echo in-its-session >> /tmp/loop; exec 3>>/mnt/data/log; while sleep 0.05; do [ -e /mnt/data/go ] && { echo held-fd >&3; rm -f /mnt/data/go; }; done' </dev/null >/dev/null 2>&1 &",
    );
    // Started from the host, the loop is in the host's session until its `setsid`: CRIU
    // refuses to dump a task whose session leader is outside the sandbox.
    wait_for_content(&t, &source.id, "/tmp/loop", "in-its-session");

    t.rt.pause_with_memory(&criu, &source.id, &t.state.join("pause-images"))
        .unwrap();
    // While paused, the volume's files stay reachable (the content API's view).
    let root = t.rt.open_volume(&volume).unwrap();
    let log = format!(
        "/proc/self/fd/{}/log",
        std::os::fd::AsRawFd::as_raw_fd(&root)
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "before\n");
    drop(root);
    let resumed = t.rt.resume_paused(&criu, &source.id).unwrap();
    assert_eq!(ask(&t.rt, &resumed.id), secret, "memory lost across pause");
    t.sh_ok(&resumed.id, 1000, "touch /mnt/data/go");
    wait_for_content(&t, &resumed.id, "/mnt/data/log", "held-fd");

    // A fork mounts the same volume, not a copy: its writes show in the source.
    let checkpoint = unique("volckpt");
    t.rt.checkpoint(&source.id, &checkpoint, Durability::Durable)
        .unwrap();
    let fork =
        t.rt.restore(&checkpoint, &unique("vol-fork"), true)
            .unwrap();
    let _fork = KillGuard {
        rt: &t.rt,
        id: fork.id.clone(),
    };
    t.rt.delete_checkpoint(&checkpoint).unwrap();
    assert_eq!(fork.spec.volumes, source.spec.volumes);
    assert_eq!(ask(&t.rt, &fork.id), secret, "the fork lost the memory");
    t.sh_ok(&fork.id, 1000, "echo from-fork > /mnt/data/fork.txt");
    assert_eq!(
        t.sh_ok(&source.id, 1000, "cat /mnt/data/fork.txt"),
        "from-fork"
    );
    assert_eq!(
        t.sh_ok(&fork.id, 1000, "stat -c %U /mnt/data/fork.txt"),
        "user"
    );
}

#[test]
fn after_a_restart_the_volume_is_reused_not_mounted_twice() {
    let t = TestRuntime::with(|config| config.volume_size_mb = 64);
    let volume = unique("vol");
    t.rt.create_volume(&volume).unwrap();
    let _volume_guard = VolumeGuard {
        rt: &t.rt,
        id: volume.clone(),
    };
    let a =
        t.rt.create(&with_volume(&t, "vol-old", &volume, "/mnt/data"))
            .unwrap();
    let _a = KillGuard {
        rt: &t.rt,
        id: a.id.clone(),
    };
    t.sh_ok(&a.id, 1000, "echo before-restart > /mnt/data/x");
    // A second daemon on the same state (the first one's sandbox keeps running).
    let restarted = t.reopen();
    restarted.recover().unwrap();
    let b = restarted
        .create(&with_volume(&t, "vol-new", &volume, "/mnt/data"))
        .unwrap();
    let _b = KillGuard {
        rt: &restarted,
        id: b.id.clone(),
    };
    let out = restarted
        .exec_command(
            &b.id,
            1000,
            1000,
            &["/bin/sh", "-c", "cat /mnt/data/x; echo after > /mnt/data/y"],
        )
        .unwrap()
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "before-restart\n");
    assert_eq!(t.sh_ok(&a.id, 1000, "cat /mnt/data/y"), "after");
    let image =
        std::fs::canonicalize(t.state.join("volumes").join(&volume).join("volume.img")).unwrap();
    let backing: Vec<String> = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|b| std::path::Path::new(b.trim_end()) == image)
        .collect();
    assert_eq!(
        backing.len(),
        1,
        "the image is on more than one loop device"
    );
}
