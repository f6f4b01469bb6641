//! 500 create/kill cycles leave nothing behind. Privileged.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use berth_runtime::Runtime;
use common::TestRuntime;

#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    mounts: usize,
    cgroups: usize,
    net_namespaces: BTreeSet<String>,
    fds: usize,
    threads: String,
    loop_devices: usize,
    state_bytes: u64,
    children: usize,
}

fn count_dir(path: &Path) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

fn dir_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            total += meta.blocks() * 512;
            if meta.is_dir() {
                total += dir_bytes(&entry.path());
            }
        }
    }
    total
}

fn footprint(t: &TestRuntime) -> Footprint {
    let cgroups = ["cpu", "cpuacct", "memory", "pids", "freezer", ""]
        .iter()
        .map(|c| count_dir(&Path::new("/sys/fs/cgroup").join(c).join(t.cgroup_parent())))
        .sum();
    let net_namespaces = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path().join("ns/net")).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .collect();
    let me = std::process::id().to_string();
    let children = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                == Some(me.as_str())
        })
        .count();
    let loop_devices = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("loop/backing_file").exists())
        .count();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    Footprint {
        mounts: std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .count(),
        cgroups,
        net_namespaces,
        fds: count_dir(Path::new("/proc/self/fd")),
        threads: status
            .lines()
            .find(|l| l.starts_with("Threads:"))
            .unwrap()
            .to_owned(),
        loop_devices,
        state_bytes: dir_bytes(&t.state.join("sandboxes")),
        children,
    }
}

#[test]
fn five_hundred_create_kill_cycles_leak_nothing() {
    let t = TestRuntime::new();
    // Warm up once so lazily made things (the formatted disk image) exist before the count.
    let warm = t.rt.create(&t.spec("warm")).unwrap();
    t.rt.kill(&warm.id).unwrap();
    let before = footprint(&t);
    for i in 0..500 {
        let info = t.rt.create(&t.spec("cycle")).unwrap();
        if i % 50 == 0 {
            t.sh_ok(&info.id, 0, "echo data > /root/f && sleep 0.01 &");
        }
        t.rt.kill(&info.id).unwrap();
    }
    // Lazily detached disks and exiting namespaces settle asynchronously; give them time.
    let mut after = footprint(&t);
    for _ in 0..100 {
        if after == before {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        after = footprint(&t);
    }
    assert_eq!(before, after);
}
