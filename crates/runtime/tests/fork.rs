//! Snapshots and fork through CRIU: a running sandbox checkpointed with its disk while it
//! keeps running, and new sandboxes restored from the checkpoint, each with the source's
//! memory and files but its own id, hostname, uid range, cgroups and disk. Privileged;
//! needs CRIU >= 4.2 (provisioned under /var/lib/berth on first need).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use berth_runtime::{Durability, LinuxRuntime, Runtime, RuntimeError, SandboxInfo};
use common::checkpoint::{alive, ask, assert_clean, criu, start_holder, KillGuard};
use common::TestRuntime;

fn checkpoint_path(t: &TestRuntime, name: &str) -> PathBuf {
    let dir = t.state.join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn uid_map(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/uid_map"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Removes a checkpoint directory when the test ends.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn three_forks_of_a_running_sandbox_share_memory_not_identity() {
    let criu = criu();
    let t = TestRuntime::new();
    let source = t.rt.create(&t.spec("fork-src")).unwrap();
    let _source_guard = KillGuard {
        rt: &t.rt,
        id: source.id.clone(),
    };
    let src = source.id.as_str();
    start_holder(&t, src, 1);
    let secret = ask(&t.rt, src);
    t.sh_ok(
        src,
        0,
        "echo source > /root/who; echo in-tmp > /tmp/file; chmod u+s /root/who",
    );
    t.sh_ok(src, 1000, "echo user > /tmp/user-file");

    let path = checkpoint_path(&t, "three");
    let _remove = RemoveDir(path.clone());
    let started = Instant::now();
    let info =
        t.rt.checkpoint_into(&criu, src, &path, Durability::Durable)
            .unwrap();
    let checkpointed_in = started.elapsed();
    assert_eq!(info.source, src);
    assert!(info.size_bytes > 1 << 20, "{info:?}");
    for file in ["checkpoint.json", "disk.img", "images/inventory.img"] {
        assert!(path.join(file).exists(), "{file} missing");
    }
    assert!(!Path::new(&format!("{}.tmp", path.display())).exists());
    assert_eq!(
        LinuxRuntime::read_checkpoint(&path).unwrap().size_bytes,
        info.size_bytes
    );

    // The source keeps running, unchanged.
    assert!(alive(source.init_pid));
    assert_eq!(ask(&t.rt, src), secret);

    let started = Instant::now();
    let forks: Vec<SandboxInfo> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let spec = t.spec("fork");
                let (rt, criu, path) = (&t.rt, &criu, &path);
                scope.spawn(move || rt.restore_checkpoint(criu, path, &spec))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    let forked_in = started.elapsed();
    eprintln!(
        "checkpoint {checkpointed_in:?} ({} KiB), 3 concurrent restores {forked_in:?}",
        info.size_bytes / 1024
    );
    let _guards: Vec<KillGuard> = forks
        .iter()
        .map(|f| KillGuard {
            rt: &t.rt,
            id: f.id.clone(),
        })
        .collect();

    let mut maps = vec![uid_map(source.init_pid)];
    for fork in &forks {
        let id = fork.id.as_str();
        assert_eq!(ask(&t.rt, id), secret, "{id}: the in-memory secret changed");
        assert_eq!(t.sh_ok(id, 0, "hostname"), id);
        assert_eq!(
            t.sh_ok(id, 0, "cat /root/who /tmp/file /tmp/user-file"),
            "source\nin-tmp\nuser"
        );
        // Files keep their owners and modes inside the new uid range.
        assert_eq!(
            t.sh_ok(id, 0, "stat -c '%u %a' /root/who /tmp/user-file"),
            "0 4644\n1000 644"
        );
        assert_eq!(t.sh_ok(id, 1000, "touch /tmp/u; stat -c %u /tmp/u"), "1000");
        assert!(t.rt.stats(id).unwrap().mem_used > 0);
        t.sh_ok(id, 0, &format!("echo {id} > /root/who"));
        maps.push(uid_map(fork.init_pid));
    }
    // Each sandbox maps its root to its own host range.
    let mut distinct = maps.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{maps:?}");
    for map in &maps {
        assert!(map.starts_with("0 ") && map.ends_with(" 65536"), "{map}");
    }
    // Writes stay in their own sandbox.
    assert_eq!(t.sh_ok(src, 0, "cat /root/who"), "source");
    for fork in &forks {
        assert_eq!(t.sh_ok(&fork.id, 0, "cat /root/who"), fork.id);
    }
    let listed: Vec<String> = t.rt.list().into_iter().map(|s| s.id).collect();
    for fork in &forks {
        assert!(listed.contains(&fork.id));
    }

    for fork in &forks {
        t.rt.kill(&fork.id).unwrap();
        assert!(!alive(fork.init_pid));
    }
    // Killing the forks leaves the source and the checkpoint alone.
    assert_eq!(ask(&t.rt, src), secret);
    assert!(path.join("checkpoint.json").exists());
    t.rt.kill(src).unwrap();
    for id in forks.iter().map(|f| f.id.as_str()).chain([src]) {
        assert_clean(&t, id, &[]);
    }
}

/// A fork's disk copy keeps its source's owners on disk and is idmapped into the fork's
/// range, never re-owned file by file: the files' ctimes are the source's (a chown would
/// have set them), and owners, modes and new files are right inside the fork through a
/// pause with memory, a pause without, and a fork of the fork.
#[test]
fn a_forks_disk_is_idmapped_not_reowned_through_pauses_and_a_second_fork() {
    let criu = criu();
    let t = TestRuntime::new();
    let source = t.rt.create(&t.spec("idmap-src")).unwrap();
    let _source_guard = KillGuard {
        rt: &t.rt,
        id: source.id.clone(),
    };
    let src = source.id.as_str();
    t.sh_ok(
        src,
        0,
        "echo root > /root/r; chmod u+s /root/r; echo user > /tmp/u; chown 1000:1000 /tmp/u",
    );
    let owners = "stat -c '%u %g %a' /root/r /tmp/u";
    let expected = "0 0 4644\n1000 1000 644";
    assert_eq!(t.sh_ok(src, 0, owners), expected);
    let ctimes = "stat -c %Z.%z /root/r /tmp/u";
    let source_ctimes = t.sh_ok(src, 0, ctimes);

    let first = checkpoint_path(&t, "idmap-first");
    let _remove_first = RemoveDir(first.clone());
    t.rt.checkpoint_into(&criu, src, &first, Durability::Durable)
        .unwrap();
    let fork =
        t.rt.restore_checkpoint(&criu, &first, &t.spec("idmap-fork"))
            .unwrap();
    let _fork_guard = KillGuard {
        rt: &t.rt,
        id: fork.id.clone(),
    };
    let id = fork.id.as_str();
    assert_ne!(uid_map(fork.init_pid), uid_map(source.init_pid));
    assert_eq!(t.sh_ok(id, 0, owners), expected);
    assert_eq!(t.sh_ok(id, 0, ctimes), source_ctimes);
    t.sh_ok(id, 1000, "echo mine > /tmp/new");
    let all = "stat -c '%u %g %a' /root/r /tmp/u /tmp/new";
    let all_expected = "0 0 4644\n1000 1000 644\n1000 1000 644";

    let images = checkpoint_path(&t, "idmap-paused");
    let _remove_images = RemoveDir(images.clone());
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    t.rt.resume_paused(&criu, id).unwrap();
    assert_eq!(
        t.sh_ok(id, 0, all),
        all_expected,
        "after a pause with memory"
    );
    t.rt.pause_filesystem(id).unwrap();
    t.rt.resume_paused_filesystem(id).unwrap();
    assert_eq!(
        t.sh_ok(id, 0, all),
        all_expected,
        "after a pause without memory"
    );
    assert_eq!(
        t.sh_ok(id, 1000, "touch /tmp/later; stat -c %u /tmp/later"),
        "1000"
    );
    // A copy-up and a new file through the overlay the sandbox mounted itself.
    assert_eq!(
        t.sh_ok(
            id,
            0,
            "echo again >> /root/r; touch /root/later; stat -c %u /root/later"
        ),
        "0"
    );
    t.sh_ok(id, 0, "printf 'root\\n' > /root/r; chmod u+s /root/r");

    let fork_ctimes = t.sh_ok(id, 0, ctimes);
    let second = checkpoint_path(&t, "idmap-second");
    let _remove_second = RemoveDir(second.clone());
    t.rt.checkpoint_into(&criu, id, &second, Durability::Durable)
        .unwrap();
    let grandchild =
        t.rt.restore_checkpoint(&criu, &second, &t.spec("idmap-fork2"))
            .unwrap();
    let _grandchild_guard = KillGuard {
        rt: &t.rt,
        id: grandchild.id.clone(),
    };
    let gid = grandchild.id.as_str();
    assert_eq!(t.sh_ok(gid, 0, all), all_expected, "in a fork of the fork");
    assert_eq!(t.sh_ok(gid, 0, ctimes), fork_ctimes);
    assert_eq!(
        t.sh_ok(gid, 1000, "touch /tmp/g; stat -c '%u %g' /tmp/g"),
        "1000 1000"
    );
    // Writes stay in their own sandbox.
    t.sh_ok(gid, 0, "echo grandchild > /root/r");
    assert_eq!(t.sh_ok(id, 0, "cat /root/r"), "root");
    assert_eq!(t.sh_ok(src, 0, "cat /root/r"), "root");

    // A commit reads the disk through the daemon's idmapped mount: owners come out
    // 0-based as for any sandbox.
    t.sh_ok(gid, 0, "echo k > /root/k; chown 1000:1000 /root/k");
    let layer = tempfile::tempdir_in(&t.state).unwrap();
    t.rt.commit_upper(gid, layer.path()).unwrap();
    let owner = |name: &str| {
        let meta = std::fs::metadata(layer.path().join(name)).unwrap();
        (meta.uid(), meta.gid())
    };
    assert_eq!((owner("root/r"), owner("root/k")), ((0, 0), (1000, 1000)));

    let ids = [gid.to_owned(), id.to_owned(), src.to_owned()];
    for sandbox in &ids[1..] {
        t.rt.kill(sandbox).unwrap();
    }
    for sandbox in &ids {
        assert_clean(&t, sandbox, &[]);
    }
}

/// A process writing a sequence into a file through one fd (offset in memory, data on
/// disk): after restore the file continues exactly where the process thinks it is.
const WRITER: &str = r#"
import os, time
f = open('/root/seq', 'w')
n = 0
while True:
    n += 1
    f.write('%d\n' % n)
    f.flush()
    time.sleep(0.0005)
"#;

#[test]
fn restored_disk_matches_restored_memory() {
    let criu = criu();
    let t = TestRuntime::new();
    let source = t.rt.create(&t.spec("fork-disk")).unwrap();
    let _source_guard = KillGuard {
        rt: &t.rt,
        id: source.id.clone(),
    };
    let src = source.id.as_str();
    t.sh_ok(
        src,
        0,
        &format!(
            "cat > /root/writer.py <<'EOF'\n{WRITER}\nEOF\n\
             setsid python3 /root/writer.py </dev/null >/dev/null 2>&1 &\n\
             while [ ! -s /root/seq ]; do sleep 0.01; done"
        ),
    );
    // Written right before the checkpoint and not synced: only in the page cache.
    let digest = t.sh_ok(
        src,
        0,
        "head -c 8M /dev/urandom > /root/fresh; md5sum < /root/fresh",
    );
    let path = checkpoint_path(&t, "disk");
    let _remove = RemoveDir(path.clone());
    t.rt.checkpoint_into(&criu, src, &path, Durability::Durable)
        .unwrap();

    let fork =
        t.rt.restore_checkpoint(&criu, &path, &t.spec("fork-disk"))
            .unwrap();
    let _fork_guard = KillGuard {
        rt: &t.rt,
        id: fork.id.clone(),
    };
    assert_eq!(t.sh_ok(&fork.id, 0, "md5sum < /root/fresh"), digest);
    // Let the restored writer go on, then check the file is one unbroken sequence.
    std::thread::sleep(std::time::Duration::from_millis(300));
    for id in [src, fork.id.as_str()] {
        let seq = t.sh_ok(id, 0, "cat /root/seq");
        let numbers: Vec<u64> = seq
            .lines()
            .map(|l| l.parse().unwrap_or_else(|_| panic!("{id}: bad line {l:?}")))
            .collect();
        assert!(numbers.len() > 10, "{id}: {} lines", numbers.len());
        for (i, n) in numbers.iter().enumerate() {
            assert_eq!(*n, i as u64 + 1, "{id}: sequence broken at line {i}");
        }
    }
    t.rt.kill(&fork.id).unwrap();
    t.rt.kill(src).unwrap();
    assert_clean(&t, &fork.id, &[]);
    assert_clean(&t, src, &[]);
}

/// A trial restore proves a checkpoint good without running it and leaves nothing; a
/// checkpoint whose images are damaged fails it with CRIU's restore error.
#[test]
fn a_trial_restore_proves_a_checkpoint_and_leaves_nothing() {
    let criu = criu();
    let t = TestRuntime::new();
    let source = t.rt.create(&t.spec("trial-source")).unwrap();
    let _guard = KillGuard {
        rt: &t.rt,
        id: source.id.clone(),
    };
    let checkpoint = checkpoint_path(&t, "trial-checkpoint");
    t.rt.checkpoint_into(&criu, &source.id, &checkpoint, Durability::Durable)
        .unwrap();

    let trial = "trial-good";
    t.rt.verify_checkpoint_at(&criu, &checkpoint, trial)
        .expect("a good checkpoint restores");
    assert!(t.rt.list().iter().all(|s| s.id != trial));
    assert_clean(&t, trial, &[]);
    // The source never stopped.
    assert_eq!(t.sh_ok(&source.id, 0, "echo alive"), "alive");

    // Damage the process tree image: the trial restore fails, and says it was CRIU's.
    std::fs::write(checkpoint.join("images").join("pstree.img"), b"broken").unwrap();
    let damaged = "trial-damaged";
    let err =
        t.rt.verify_checkpoint_at(&criu, &checkpoint, damaged)
            .unwrap_err();
    assert!(
        matches!(err, RuntimeError::Criu { op: "restore", .. }),
        "{err}"
    );
    assert_clean(&t, damaged, &[]);
    let _ = std::fs::remove_dir_all(&checkpoint);
}

#[test]
fn a_checkpoint_moved_to_another_daemon_restores_there_with_its_memory() {
    // Two daemons with their own state dirs (so their envd binaries are bound from
    // different host paths), as two machines of a cluster would be.
    let here = TestRuntime::new();
    let there = TestRuntime::new();
    let source = here.rt.create(&here.spec("move-src")).unwrap();
    let _source_guard = KillGuard {
        rt: &here.rt,
        id: source.id.clone(),
    };
    start_holder(&here, &source.id, 1);
    let secret = ask(&here.rt, &source.id);
    here.sh_ok(&source.id, 0, "echo moved > /root/who");
    here.rt
        .checkpoint(&source.id, "moving", Durability::Durable)
        .unwrap();

    let mut packed = here.rt.pack_checkpoint("moving").unwrap();
    let layers = packed.info.layers.clone();
    let imported = there
        .rt
        .import_checkpoint(
            "moved",
            &packed.tree_hash,
            layers.clone(),
            &mut packed.stream,
        )
        .unwrap();
    drop(packed);
    here.rt.delete_checkpoint("moving").unwrap();
    let _remove = RemoveDir(there.state.join("checkpoints/moved"));
    assert_eq!(imported.source, source.id);
    assert_eq!(imported.layers, layers);

    let restored = there.rt.restore("moved", &unique_id(), true).unwrap();
    let _restored_guard = KillGuard {
        rt: &there.rt,
        id: restored.id.clone(),
    };
    assert_eq!(ask(&there.rt, &restored.id), secret, "memory came across");
    assert_eq!(there.sh_ok(&restored.id, 0, "cat /root/who"), "moved");

    // A copy that arrives different is refused and leaves nothing.
    here.rt
        .checkpoint(&source.id, "again", Durability::Durable)
        .unwrap();
    let mut packed = here.rt.pack_checkpoint("again").unwrap();
    let wrong = "0".repeat(64);
    let refused = there
        .rt
        .import_checkpoint(
            "again",
            &wrong,
            packed.info.layers.clone(),
            &mut packed.stream,
        )
        .unwrap_err();
    assert!(
        matches!(refused, RuntimeError::Transfer { .. }),
        "{refused}"
    );
    drop(packed);
    here.rt.delete_checkpoint("again").unwrap();
    assert!(!there.state.join("checkpoints/again").exists());
    assert!(!there.state.join("checkpoints/again.tmp").exists());
}

/// Moves paused sandbox `id` of `here` to `there` as checkpoint `name`: exported, packed,
/// imported, and `here`'s copy of the checkpoint deleted (the sandbox stays paused here).
fn export_paused_to(here: &TestRuntime, there: &TestRuntime, id: &str, name: &str) {
    here.rt.export_paused(id, name).unwrap();
    let mut packed = here.rt.pack_checkpoint(name).unwrap();
    let layers = packed.info.layers.clone();
    there
        .rt
        .import_checkpoint(name, &packed.tree_hash, layers, &mut packed.stream)
        .unwrap();
    drop(packed);
    here.rt.delete_checkpoint(name).unwrap();
}

fn unique_id() -> String {
    common::unique("moved")
}

#[test]
fn a_paused_sandbox_moves_to_another_daemon_and_stays_paused_there() {
    let here = TestRuntime::new();
    let there = TestRuntime::new();
    let source = here.rt.create(&here.spec("move-paused")).unwrap();
    let id = source.id.clone();
    let _here_guard = KillGuard {
        rt: &here.rt,
        id: id.clone(),
    };
    start_holder(&here, &id, 1);
    let secret = ask(&here.rt, &id);
    here.sh_ok(&id, 0, "echo paused-here > /root/who");
    here.rt.pause(&id, true).unwrap();

    // Exported, packed, received: the source stays paused meanwhile.
    export_paused_to(&here, &there, &id, "move-paused");
    assert!(here.rt.is_paused(&id));

    // Restored under the same id with its memory, then paused again there.
    there.rt.restore("move-paused", &id, true).unwrap();
    let _there_guard = KillGuard {
        rt: &there.rt,
        id: id.clone(),
    };
    there.rt.delete_checkpoint("move-paused").unwrap();
    assert_eq!(
        there.sh_ok(&id, 0, "hostname; cat /root/who"),
        format!("{id}\npaused-here")
    );
    there.rt.pause(&id, true).unwrap();
    here.rt.kill(&id).unwrap();
    assert!(!here.state.join("sandboxes").join(&id).exists());

    there.rt.resume(&id, true).unwrap();
    assert_eq!(ask(&there.rt, &id), secret, "the memory moved with it");
}

/// A fork paused with memory and moved to another daemon: the export names the range
/// owning the fork's disk (its source's), and the other daemon idmaps it into its own.
#[test]
fn a_paused_fork_moves_to_another_daemon_with_its_owners() {
    let here = TestRuntime::new();
    let there = TestRuntime::new();
    let source = here.rt.create(&here.spec("move-fork-src")).unwrap();
    let _source_guard = KillGuard {
        rt: &here.rt,
        id: source.id.clone(),
    };
    here.sh_ok(
        &source.id,
        0,
        "echo u > /root/u; chown 1000:1000 /root/u; echo r > /root/r",
    );
    here.rt
        .checkpoint(&source.id, "move-fork-src", Durability::Durable)
        .unwrap();
    let fork = here
        .rt
        .restore("move-fork-src", &unique_id(), true)
        .unwrap();
    here.rt.delete_checkpoint("move-fork-src").unwrap();
    let id = fork.id.clone();
    let _here_guard = KillGuard {
        rt: &here.rt,
        id: id.clone(),
    };
    here.sh_ok(&id, 1000, "echo f > /tmp/f");
    here.rt.pause(&id, true).unwrap();

    export_paused_to(&here, &there, &id, "move-fork");
    there.rt.restore("move-fork", &id, true).unwrap();
    let _there_guard = KillGuard {
        rt: &there.rt,
        id: id.clone(),
    };
    there.rt.delete_checkpoint("move-fork").unwrap();
    assert_ne!(
        there.rt.sandbox_uid_base(&id).unwrap(),
        here.rt.sandbox_uid_base(&source.id).unwrap(),
        "the disk's owners are mapped, not the same range"
    );
    assert_eq!(
        there.sh_ok(&id, 0, "stat -c '%u %g' /root/r /root/u /tmp/f"),
        "0 0\n1000 1000\n1000 1000"
    );
    assert_eq!(
        there.sh_ok(&id, 1000, "touch /tmp/t; stat -c %u /tmp/t"),
        "1000"
    );
    here.rt.kill(&id).unwrap();
}
