//! Sandbox-sized resource views: inside a sandbox `free`, `/proc/meminfo`, `nproc`,
//! `/proc/cpuinfo`, `/proc/stat`, `/sys/devices/system/cpu/online` and `df` show the
//! sandbox's limits, through pause/resume, checkpoint/restore, a daemon restart and a
//! dead or missing LXCFS. Privileged; needs `lxcfs` (Debian's package) and CRIU >= 4.2
//! (provisioned under /var/lib/berth on first need).

mod common;

use std::path::PathBuf;
use std::time::Instant;

use berth_runtime::{Durability, LinuxRuntime, Runtime};
use common::checkpoint::{alive, criu, KillGuard};
use common::TestRuntime;

/// Where a test runtime's LXCFS serves its `proc` directory.
fn lxcfs_mount(t: &TestRuntime) -> PathBuf {
    t.state.join("views/proc")
}

/// The pid of a test runtime's LXCFS, from its pid file.
fn lxcfs_pid(t: &TestRuntime) -> Option<i32> {
    std::fs::read_to_string(t.state.join("views/lxcfs.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn host_mounts() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap()
}

fn host_cpus() -> usize {
    std::thread::available_parallelism().unwrap().get()
}

fn host_mem_total_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    field_kib(&meminfo, "MemTotal")
}

fn field_kib(meminfo: &str, key: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {meminfo}"))
}

/// What the sandbox's workload (uid 1000, in the workload cgroup) sees.
struct Seen {
    mem_total_kib: u64,
    free_total_mib: u64,
    nproc: usize,
    processors: usize,
    online: String,
    stat_cpus: usize,
}

fn seen(t: &TestRuntime, id: &str) -> Seen {
    let out = t.sh_ok(
        id,
        1000,
        "grep ^MemTotal: /proc/meminfo; free -m | awk '/^Mem:/ {print $2}'; nproc; \
         grep -c ^processor /proc/cpuinfo; cat /sys/devices/system/cpu/online; \
         grep -c '^cpu[0-9]' /proc/stat",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    Seen {
        mem_total_kib: field_kib(lines[0], "MemTotal"),
        free_total_mib: lines[1].trim().parse().unwrap(),
        nproc: lines[2].trim().parse().unwrap(),
        processors: lines[3].trim().parse().unwrap(),
        online: lines[4].trim().to_owned(),
        stat_cpus: lines[5].trim().parse().unwrap(),
    }
}

/// `MemFree` inside sandbox `id`, in MiB.
fn mem_free_mib(t: &TestRuntime, id: &str) -> u64 {
    field_kib(&t.sh_ok(id, 1000, "cat /proc/meminfo"), "MemFree") / 1024
}

/// The sandbox's own cpuset (its cgroup's `cpuset.cpus`).
fn pinned_cpus(t: &TestRuntime, id: &str) -> String {
    std::fs::read_to_string(format!(
        "/sys/fs/cgroup/cpuset/{}/{id}/cpuset.cpus",
        t.cgroup_parent()
    ))
    .unwrap()
    .trim()
    .to_owned()
}

/// Number of CPUs in a kernel CPU list.
fn count_cpus(list: &str) -> usize {
    list.split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// Asserts the sandbox sees `cpus` CPUs and `memory_mb` of memory everywhere it looks.
fn assert_sized(t: &TestRuntime, id: &str, cpus: usize, memory_mb: u64) {
    let seen = seen(t, id);
    assert_eq!(seen.mem_total_kib, memory_mb * 1024, "{id}: MemTotal");
    assert_eq!(seen.free_total_mib, memory_mb, "{id}: free -m");
    assert_eq!(seen.nproc, cpus, "{id}: nproc");
    assert_eq!(seen.processors, cpus, "{id}: /proc/cpuinfo");
    assert_eq!(
        count_cpus(&seen.online),
        cpus,
        "{id}: online {}",
        seen.online
    );
    assert_eq!(seen.online, pinned_cpus(t, id), "{id}: online vs cpuset");
    assert_eq!(seen.stat_cpus, cpus, "{id}: /proc/stat");
}

#[test]
fn a_sandbox_sees_its_own_memory_cpus_disk_and_uptime() {
    let t = TestRuntime::new();
    let before_create = Instant::now();
    let mut spec = t.spec("sized");
    spec.cpu_count = 1;
    spec.memory_mb = 512;
    spec.disk_size_mb = 1024;
    let one = t.rt.create(&spec).unwrap();
    let _one = KillGuard {
        rt: &t.rt,
        id: one.id.clone(),
    };
    assert_sized(&t, &one.id, 1, 512);
    // The total is the sandbox's limit although commands run in the workload group,
    // whose limit is lower (envd's reserve): LXCFS reads the group of the pid
    // namespace's init. Memory the workload takes shows as no longer free.
    let idle = mem_free_mib(&t, &one.id);
    t.sh_ok(&one.id, 1000, "head -c 100M /dev/zero > /dev/shm/ballast");
    let busy = mem_free_mib(&t, &one.id);
    assert!(busy + 90 <= idle, "free {idle} MiB, then {busy} MiB");
    // Python's and glibc's CPU counts agree.
    assert_eq!(
        t.sh_ok(
            &one.id,
            1000,
            "python3 -c 'import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))'"
        ),
        "1 1"
    );
    // df shows the sandbox's disk, not the host's.
    let df: u64 = t
        .sh_ok(&one.id, 1000, "df -m --output=size / | tail -1")
        .trim()
        .parse()
        .unwrap();
    assert!((900..=1024).contains(&df), "df / says {df} MiB");
    // uptime counts from the sandbox's boot (its time namespace), not the host's.
    let uptime: f64 = t
        .sh_ok(&one.id, 1000, "cut -d' ' -f1 /proc/uptime")
        .parse()
        .unwrap();
    assert!(
        uptime <= before_create.elapsed().as_secs_f64() + 1.0,
        "uptime {uptime}"
    );
    // The view shows in the mount table without any host path.
    let mountinfo = t.sh_ok(&one.id, 0, "cat /proc/self/mountinfo");
    let views: Vec<&str> = mountinfo
        .lines()
        .filter(|l| l.contains("fuse.lxcfs"))
        .collect();
    assert_eq!(views.len(), 4, "{mountinfo}");
    assert!(
        !mountinfo.contains(&t.state.to_string_lossy().into_owned()),
        "{mountinfo}"
    );

    // A second one-CPU sandbox goes to another CPU; one asking for more CPUs than the
    // host has sees the host's.
    let mut spec = t.spec("second");
    spec.cpu_count = 1;
    spec.memory_mb = 256;
    let two = t.rt.create(&spec).unwrap();
    let _two = KillGuard {
        rt: &t.rt,
        id: two.id.clone(),
    };
    assert_sized(&t, &two.id, 1, 256);
    if host_cpus() > 1 {
        assert_ne!(pinned_cpus(&t, &one.id), pinned_cpus(&t, &two.id));
    }
    let mut spec = t.spec("wide");
    spec.cpu_count = 64;
    let wide = t.rt.create(&spec).unwrap();
    let _wide = KillGuard {
        rt: &t.rt,
        id: wide.id.clone(),
    };
    assert_sized(&t, &wide.id, host_cpus(), spec.memory_mb);
}

#[test]
fn views_follow_a_sandbox_through_pause_checkpoint_and_restore() {
    let criu = criu();
    let t = TestRuntime::new();
    let mut spec = t.spec("cycle");
    spec.memory_mb = 384;
    let source = t.rt.create(&spec).unwrap();
    let _source = KillGuard {
        rt: &t.rt,
        id: source.id.clone(),
    };
    let id = source.id.as_str();
    assert_sized(&t, id, 1, 384);

    // Pause with memory and resume: the same views, the clock going on.
    let images = t.state.join("checkpoints").join(format!("{id}-pause"));
    std::fs::create_dir_all(images.parent().unwrap()).unwrap();
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    t.rt.resume_paused(&criu, id).unwrap();
    assert_sized(&t, id, 1, 384);
    // Pause without memory and resume: a fresh boot with views.
    t.rt.pause(id, false).unwrap();
    t.rt.resume(id, false).unwrap();
    assert_sized(&t, id, 1, 384);

    // A restored copy sees its own groups: memory its workload takes shows there and
    // not in the source.
    let checkpoint = t.state.join("checkpoints").join("views-fork");
    t.rt.checkpoint_into(&criu, id, &checkpoint, Durability::Durable)
        .unwrap();
    let fork_spec = LinuxRuntime::read_checkpoint(&checkpoint)
        .unwrap()
        .spec_for(&common::unique("fork"));
    let fork =
        t.rt.restore_checkpoint(&criu, &checkpoint, &fork_spec)
            .unwrap();
    let _fork = KillGuard {
        rt: &t.rt,
        id: fork.id.clone(),
    };
    assert_sized(&t, &fork.id, 1, 384);
    let (source_before, fork_before) = (mem_free_mib(&t, id), mem_free_mib(&t, &fork.id));
    t.sh_ok(&fork.id, 1000, "head -c 120M /dev/zero > /dev/shm/ballast");
    let (source_after, fork_after) = (mem_free_mib(&t, id), mem_free_mib(&t, &fork.id));
    assert!(
        fork_after + 110 <= fork_before,
        "the fork's use is its own: free {fork_before} MiB, then {fork_after} MiB"
    );
    assert!(
        source_after + 60 > source_before,
        "the source's use stays its own: free {source_before} MiB, then {source_after} MiB"
    );
    let _ = std::fs::remove_dir_all(&checkpoint);
}

/// Like `top`: a process keeping the views open and reading them again and again.
const WATCHER: &str = r#"
import os, time
files = [open(p) for p in ("/proc/meminfo", "/proc/stat", "/proc/cpuinfo")]
while True:
    total = None
    for f in files:
        f.seek(0)
        text = f.read()
        if total is None:
            total = text.split()[1]
    with open("/root/watch.tmp", "w") as out:
        out.write("%s %d" % (total, time.monotonic_ns()))
    os.rename("/root/watch.tmp", "/root/watch")
    time.sleep(0.01)
"#;

#[test]
fn a_process_holding_the_views_open_is_paused_and_forked_with_them() {
    let criu = criu();
    let t = TestRuntime::new();
    let source = t.rt.create(&t.spec("watch")).unwrap();
    let _source = KillGuard {
        rt: &t.rt,
        id: source.id.clone(),
    };
    let id = source.id.as_str();
    t.sh_ok(
        id,
        0,
        &format!(
            "cat > /root/watch.py <<'EOF'\n{WATCHER}\nEOF\n\
             setsid python3 /root/watch.py </dev/null >/dev/null 2>&1 &\n\
             while [ ! -e /root/watch ]; do sleep 0.01; done"
        ),
    );
    // The watcher's latest reading: MemTotal in kB, and a tick that moves while it runs.
    let reading = |t: &TestRuntime, id: &str| -> (String, u64) {
        let text = t.sh_ok(id, 0, "cat /root/watch");
        let (total, tick) = text.split_once(' ').unwrap();
        (total.to_owned(), tick.parse().unwrap())
    };
    let moving = |t: &TestRuntime, id: &str| -> String {
        let (total, first) = reading(t, id);
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while reading(t, id).1 == first {
            assert!(
                Instant::now() < deadline,
                "{id}: the watcher stopped reading"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        total
    };
    assert_eq!(moving(&t, id), "262144");

    let images = t.state.join("checkpoints").join("watch-pause");
    std::fs::create_dir_all(images.parent().unwrap()).unwrap();
    t.rt.pause_with_memory(&criu, id, &images).unwrap();
    t.rt.resume_paused(&criu, id).unwrap();
    assert_eq!(moving(&t, id), "262144", "the watcher after a resume");

    let checkpoint = t.state.join("checkpoints").join("watch-fork");
    t.rt.checkpoint_into(&criu, id, &checkpoint, Durability::Durable)
        .unwrap();
    let spec = LinuxRuntime::read_checkpoint(&checkpoint)
        .unwrap()
        .spec_for(&common::unique("watch-fork"));
    let fork = t.rt.restore_checkpoint(&criu, &checkpoint, &spec).unwrap();
    let _fork = KillGuard {
        rt: &t.rt,
        id: fork.id.clone(),
    };
    assert_eq!(moving(&t, &fork.id), "262144", "the watcher in a fork");
    let _ = std::fs::remove_dir_all(&checkpoint);
}

#[test]
fn views_outlive_a_daemon_restart_and_a_dead_lxcfs_is_replaced() {
    let criu = criu();
    let t = TestRuntime::new();
    let first = t.rt.create(&t.spec("restart")).unwrap();
    let _first = KillGuard {
        rt: &t.rt,
        id: first.id.clone(),
    };
    assert_sized(&t, &first.id, 1, 256);
    let lxcfs = lxcfs_pid(&t).expect("LXCFS runs");

    // A restarted daemon reattaches the sandbox; LXCFS, detached from the daemon, kept
    // serving it all along.
    let restarted = t.reopen();
    let report = restarted.recover().unwrap();
    assert!(report.reattached.iter().any(|s| s.id == first.id));
    assert_eq!(lxcfs_pid(&t), Some(lxcfs));
    assert_sized(&t, &first.id, 1, 256);
    drop(restarted);
    assert!(
        alive(lxcfs),
        "a daemon holding sandboxes left LXCFS running"
    );

    // LXCFS dies: the sandbox's views stop answering, but starts go on, a new LXCFS
    // takes over and the running sandbox gets its views again.
    // SAFETY: kill(2) of the LXCFS this test's runtime started.
    unsafe { libc::kill(lxcfs, libc::SIGKILL) };
    while alive(lxcfs) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let broken = t.sh(&first.id, 1000, "cat /proc/meminfo");
    assert!(!broken.status.success(), "a dead LXCFS still answered");
    let second = t.rt.create(&t.spec("after")).unwrap();
    let _second = KillGuard {
        rt: &t.rt,
        id: second.id.clone(),
    };
    assert_ne!(lxcfs_pid(&t), Some(lxcfs));
    assert_sized(&t, &second.id, 1, 256);
    assert_sized(&t, &first.id, 1, 256);
    // And it pauses and resumes with them (the repaired mounts are external too).
    let images = t.state.join("checkpoints").join("repaired");
    std::fs::create_dir_all(images.parent().unwrap()).unwrap();
    t.rt.pause_with_memory(&criu, &first.id, &images).unwrap();
    t.rt.resume_paused(&criu, &first.id).unwrap();
    assert_sized(&t, &first.id, 1, 256);
}

#[test]
fn without_lxcfs_sandboxes_start_and_restore_with_the_hosts_files() {
    let criu = criu();
    let t = TestRuntime::new();
    // A checkpoint made with views...
    let source = t.rt.create(&t.spec("viewed")).unwrap();
    let _source = KillGuard {
        rt: &t.rt,
        id: source.id.clone(),
    };
    assert_sized(&t, &source.id, 1, 256);
    let checkpoint = t.state.join("checkpoints").join("viewed");
    std::fs::create_dir_all(checkpoint.parent().unwrap()).unwrap();
    t.rt.checkpoint_into(&criu, &source.id, &checkpoint, Durability::Durable)
        .unwrap();
    let lxcfs = lxcfs_pid(&t).expect("LXCFS runs");

    // ...restores on a host whose LXCFS is dead and that has none to start: the restored
    // sandbox binds the host's files, and a new sandbox starts without views.
    let mut config = common::test_config(&t.state, t.cgroup_parent());
    config.lxcfs_binary = None;
    let bare = LinuxRuntime::new(config).unwrap();
    // SAFETY: kill(2) of the LXCFS this test's runtime started.
    unsafe { libc::kill(lxcfs, libc::SIGKILL) };
    while alive(lxcfs) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let spec = LinuxRuntime::read_checkpoint(&checkpoint)
        .unwrap()
        .spec_for(&common::unique("restored"));
    let restored = bare.restore_checkpoint(&criu, &checkpoint, &spec).unwrap();
    let _restored = KillGuard {
        rt: &bare,
        id: restored.id.clone(),
    };
    let fresh = bare.create(&t.spec("bare")).unwrap();
    let _fresh = KillGuard {
        rt: &bare,
        id: fresh.id.clone(),
    };
    let sh = |id: &str, script: &str| -> String {
        let out = bare
            .exec_command(id, 1000, 1000, &["/bin/sh", "-c", script])
            .unwrap()
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for id in [&restored.id, &fresh.id] {
        let meminfo = sh(id, "cat /proc/meminfo");
        assert_eq!(
            field_kib(&meminfo, "MemTotal"),
            host_mem_total_kib(),
            "{id}"
        );
        // The pin still holds where the views are missing.
        assert_eq!(sh(id, "nproc").trim(), "1", "{id}");
    }
    // Both pause and resume: one has the host's files bound (external to the dump),
    // the other nothing (its restore is given keys its images do not use).
    for id in [&restored.id, &fresh.id] {
        let images = t.state.join("checkpoints").join(format!("{id}-pause"));
        bare.pause_with_memory(&criu, id, &images).unwrap();
        bare.resume_paused(&criu, id).unwrap();
        assert_eq!(
            field_kib(&sh(id, "cat /proc/meminfo"), "MemTotal"),
            host_mem_total_kib()
        );
    }
    // Once LXCFS serves again, a resume from memory puts the views in place of the
    // host's files, and the source, whose views died with the old LXCFS, gets them back.
    let images = t.state.join("checkpoints").join("back");
    bare.pause_with_memory(&criu, &restored.id, &images)
        .unwrap();
    t.rt.resume_paused(&criu, &restored.id).unwrap();
    assert_sized(&t, &restored.id, 1, 256);
    assert_sized(&t, &source.id, 1, 256);
    let _ = std::fs::remove_dir_all(&checkpoint);
}

#[test]
fn an_idle_runtime_leaves_no_lxcfs_behind() {
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("gone")).unwrap();
    let lxcfs = lxcfs_pid(&t).expect("LXCFS runs");
    let mount = lxcfs_mount(&t);
    let mounts = host_mounts();
    assert!(mounts.contains(&format!(" {} ", mount.display())));
    // Only the files sandboxes use are mounted in the state dir: not LXCFS's cgroupfs
    // emulation, through which a `rm -r` of the state dir would reach host cgroups.
    let views = t.state.join("views");
    let mounted: Vec<&str> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&*views.to_string_lossy()))
        .collect();
    assert_eq!(
        mounted,
        [
            views.join("proc").to_string_lossy(),
            views.join("cpu-online").to_string_lossy()
        ]
    );
    t.rt.kill(&info.id).unwrap();
    assert!(t.rt.release_network_if_idle().is_ok());
    assert!(!host_mounts().contains(&format!(" {} ", mount.display())));
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while alive(lxcfs) && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!alive(lxcfs), "LXCFS still runs");
    assert!(!t.state.join("views").exists());
}
