//! 500 create/kill cycles leave nothing behind. Privileged.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use berth_runtime::Runtime;
use common::TestRuntime;

/// What the test process and the host hold; must be the same before and after.
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    mounts: usize,
    net_namespaces: BTreeSet<String>,
    fds: usize,
    threads: String,
    loop_devices: usize,
    children: usize,
}

fn count_dir(path: &Path) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

fn count_subdirs(path: &Path) -> usize {
    std::fs::read_dir(path)
        .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0)
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

fn footprint() -> Footprint {
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
        net_namespaces,
        fds: count_dir(Path::new("/proc/self/fd")),
        threads: status
            .lines()
            .find(|l| l.starts_with("Threads:"))
            .unwrap()
            .to_owned(),
        loop_devices,
        children,
    }
}

#[test]
fn five_hundred_create_kill_cycles_leak_nothing() {
    let before = footprint();
    let t = TestRuntime::new();
    for i in 0..500 {
        let info = t.rt.create(&t.spec("cycle")).unwrap();
        if i % 50 == 0 {
            t.sh_ok(&info.id, 0, "echo data > /root/f && sleep 0.01 &");
        }
        t.rt.kill(&info.id).unwrap();
    }
    // Nothing of any sandbox is left while the runtime still runs...
    let groups: usize = ["cpu", "cpuacct", "memory", "pids", "freezer", ""]
        .iter()
        .map(|c| count_subdirs(&Path::new("/sys/fs/cgroup").join(c).join(t.cgroup_parent())))
        .sum();
    assert_eq!(groups, 0, "sandbox cgroups left");
    assert_eq!(
        count_dir(&t.state.join("sandboxes")),
        0,
        "sandbox dirs left"
    );
    assert_eq!(dir_bytes(&t.state.join("sandboxes")), 0);
    // ...and once it is gone (with its pool of ready disks), the process and host are
    // as before. Lazily detached disks and dying namespaces settle asynchronously.
    drop(t);
    let mut after = footprint();
    for _ in 0..100 {
        if after == before {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        after = footprint();
    }
    assert_eq!(before, after);
}
