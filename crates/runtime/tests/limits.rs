//! Limits hold inside the sandbox and nowhere else. Privileged: run as root.

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use berth_runtime::Runtime;
use common::TestRuntime;

fn pids_file(id: &str, parent_of: &TestRuntime, file: &str) -> Option<String> {
    let parent = parent_of.state.file_name()?.to_str()?.to_owned();
    ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"]
        .iter()
        .find_map(|root| std::fs::read_to_string(format!("{root}/{parent}/{id}/{file}")).ok())
}

#[test]
fn fork_bomb_fills_the_workload_group_and_leaves_the_sandbox_a_reserve() {
    let t = TestRuntime::new();
    let bomb = t.rt.create(&t.spec("bomb")).unwrap();
    let neighbour = t.rt.create(&t.spec("calm")).unwrap();
    let mut child =
        t.rt.exec_command(
            &bomb.id,
            1000,
            1000,
            &["/bin/sh", "-c", "f() { f | f & }; f; sleep 30"],
        )
        .unwrap()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let workload = format!("{}/workload", bomb.id);
    let number = |group: &str, file: &str| -> u64 {
        pids_file(group, &t, file).unwrap().trim().parse().unwrap()
    };
    let limit_hits = |group: &str| -> u64 {
        let events = pids_file(group, &t, "pids.events").unwrap_or_default();
        events
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    // Commands run in the workload group, whose limit sits below the sandbox's.
    let workload_max = number(&workload, "pids.max");
    assert!(workload_max < t.rt.config().pids_max, "{workload_max}");
    // Wait until the bomb has hit the workload limit at least once.
    let deadline = Instant::now() + Duration::from_secs(60);
    while limit_hits(&workload) == 0 {
        assert!(
            Instant::now() < deadline,
            "fork bomb never reached the workload pids limit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let current = number(&workload, "pids.current");
    assert!(
        current <= workload_max,
        "pids.current {current} above the limit"
    );
    // The sandbox's own group, where its init lives, keeps the reserve.
    assert!(number(&bomb.id, "pids.current") < t.rt.config().pids_max);
    assert_eq!(
        limit_hits(&bomb.id),
        0,
        "the sandbox's own limit was reached"
    );
    // The host and a neighbour still answer.
    assert!(std::process::Command::new("true")
        .status()
        .unwrap()
        .success());
    assert_eq!(t.sh_ok(&neighbour.id, 0, "echo alive"), "alive");
    t.rt.kill(&bomb.id)
        .expect("kill a sandbox in the middle of a fork bomb");
    let _ = child.wait();
    assert_eq!(t.sh_ok(&neighbour.id, 0, "echo alive"), "alive");
}

#[test]
fn memory_bomb_is_killed_inside() {
    let t = TestRuntime::new();
    let mut spec = t.spec("mem");
    spec.memory_mb = 128;
    let info = t.rt.create(&spec).unwrap();
    let out = t.sh(
        &info.id,
        1000,
        "python3 -c 'a = []\nwhile True: a.append(bytearray(8 << 20))'",
    );
    // sh reports a SIGKILLed child as 128 + 9: the OOM killer, not a MemoryError.
    assert_eq!(out.status.code(), Some(137), "memory bomb: {out:?}");
    // The bomb died, not the sandbox: its init and new commands still run.
    assert_eq!(t.sh_ok(&info.id, 0, "cat /proc/1/comm"), "sleep");
    let stats = t.rt.stats(&info.id).unwrap();
    assert_eq!(stats.mem_total, 128 << 20);
    assert!(stats.mem_used <= 128 << 20, "{stats:?}");
}

#[test]
fn disk_fill_gives_enospc_and_host_use_stays_bounded() {
    let t = TestRuntime::new();
    let mut spec = t.spec("disk");
    spec.disk_size_mb = 64;
    let info = t.rt.create(&spec).unwrap();
    let out = t.sh(
        &info.id,
        1000,
        "dd if=/dev/urandom of=/home/user/fill bs=1M count=200 2>&1; sync",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("No space left on device"), "{text}");
    let image = t.state.join("sandboxes").join(&info.id).join("disk.img");
    let host_bytes = std::fs::metadata(&image).unwrap().blocks() * 512;
    assert!(
        host_bytes <= 64 << 20,
        "host uses {host_bytes} bytes for a 64 MiB disk"
    );
    let stats = t.rt.stats(&info.id).unwrap();
    assert!(
        stats.disk_total <= 64 << 20 && stats.disk_used > 32 << 20,
        "{stats:?}"
    );
    // Deleting frees the space again inside.
    t.sh_ok(
        &info.id,
        1000,
        "rm /home/user/fill && echo ok > /home/user/small",
    );
}

#[test]
fn cpu_count_sets_the_cfs_quota() {
    let t = TestRuntime::new();
    let mut spec = t.spec("cpu");
    spec.cpu_count = 2;
    let info = t.rt.create(&spec).unwrap();
    let parent = t.state.file_name().unwrap().to_str().unwrap().to_owned();
    let v1 = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/cpu/{parent}/{}/cpu.cfs_quota_us",
        info.id
    ));
    let v2 = std::fs::read_to_string(format!("/sys/fs/cgroup/{parent}/{}/cpu.max", info.id));
    match (v1, v2) {
        (Ok(quota), _) => assert_eq!(quota.trim(), "200000"),
        (_, Ok(max)) => assert_eq!(max.trim(), "200000 100000"),
        _ => panic!("no cpu controller file found"),
    }
    t.sh(&info.id, 0, "timeout 0.3 sh -c 'while :; do :; done'");
    assert!(t.rt.stats(&info.id).unwrap().cpu_usage_ns > 0);
}

/// The device rules of the root blkio group (`major:minor bytes` lines) for `file`.
fn throttle_rules(file: &str) -> String {
    std::fs::read_to_string(format!("/sys/fs/cgroup/blkio/{file}")).unwrap_or_default()
}

#[test]
fn a_sandbox_disk_gets_its_io_limits_while_it_runs_and_loses_them_after() {
    if !std::path::Path::new("/sys/fs/cgroup/blkio").is_dir() {
        eprintln!("skipped: no cgroup v1 blkio hierarchy on this host");
        return;
    }
    let limits = berth_runtime::DiskLimits {
        read_bytes_per_sec: 40 << 20,
        write_bytes_per_sec: 20 << 20,
        read_iops: 3000,
        write_iops: 2000,
    };
    let t = TestRuntime::with(|config| config.disk_limits = limits);
    let info = t.rt.create(&t.spec("throttled")).unwrap();
    // The loop device under the sandbox's disk image, as `major:minor`.
    let image = t.state.join("sandboxes").join(&info.id).join("disk.img");
    let device = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .find(|d| {
            std::fs::read_to_string(d.path().join("loop/backing_file"))
                .is_ok_and(|b| std::path::Path::new(b.trim_end()) == image)
        })
        .map(|d| std::fs::read_to_string(d.path().join("dev")).unwrap())
        .expect("a loop device backs the sandbox's disk");
    let device = device.trim().to_owned();
    let rule = |value: u64| format!("{device} {value}");
    for (file, value) in [
        ("blkio.throttle.read_bps_device", 40u64 << 20),
        ("blkio.throttle.write_bps_device", 20 << 20),
        ("blkio.throttle.read_iops_device", 3000),
        ("blkio.throttle.write_iops_device", 2000),
    ] {
        let rules = throttle_rules(file);
        assert!(rules.lines().any(|l| l == rule(value)), "{file}: {rules}");
    }
    // Writes past the limit still complete (the limit slows, it does not fail them).
    t.sh_ok(
        &info.id,
        1000,
        "dd if=/dev/zero of=/home/user/f bs=1M count=8 oflag=direct 2>/dev/null && echo ok",
    );
    t.rt.kill(&info.id).unwrap();
    let prefix = format!("{device} ");
    for file in [
        "blkio.throttle.read_bps_device",
        "blkio.throttle.write_bps_device",
    ] {
        let rules = throttle_rules(file);
        assert!(
            !rules.lines().any(|l| l.starts_with(&prefix)),
            "{file} keeps a rule for a gone sandbox: {rules}"
        );
    }
}
