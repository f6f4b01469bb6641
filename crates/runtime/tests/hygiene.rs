//! 500 create/kill cycles leave nothing behind. Privileged.

mod common;

use std::path::{Path, PathBuf};

use berth_runtime::{LinuxRuntime, Runtime, SandboxSpec};

/// What the test process holds, and what the host holds under this runtime's state dir;
/// must be the same before and after. (Host-wide counts would also see other berth
/// instances running on a shared machine.)
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    /// Mounts under the state dir plus namespace-file mounts anywhere.
    mounts: Vec<String>,
    /// Loop devices backed by files under the state dir.
    loop_devices: Vec<String>,
    /// Files and dirs below the state dir's top-level directories (except the formatted
    /// disk image templates), with their bytes on disk.
    state_entries: Vec<(PathBuf, u64)>,
    fds: usize,
    threads: String,
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

fn entries_below(path: &Path, depth: usize, out: &mut Vec<(PathBuf, u64)>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        if depth == 0 && entry.file_name() == "disk-templates" {
            continue;
        }
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        if depth > 0 {
            out.push((entry.path(), meta.blocks() * 512));
        }
        if meta.is_dir() {
            entries_below(&entry.path(), depth + 1, out);
        }
    }
}

fn footprint(state: &Path) -> Footprint {
    let state_str = state.to_string_lossy().into_owned();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&state_str) || l.contains(" - nsfs "))
        .map(str::to_owned)
        .collect();
    let loop_devices = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|backing| backing.starts_with(&state_str))
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
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    Footprint {
        mounts,
        loop_devices,
        state_entries: {
            let mut entries = Vec::new();
            entries_below(state, 0, &mut entries);
            entries
        },
        fds: count_dir(Path::new("/proc/self/fd")),
        threads: status
            .lines()
            .find(|l| l.starts_with("Threads:"))
            .unwrap()
            .to_owned(),
        children,
    }
}

/// Kills what the runtime still runs (if the test failed midway) and removes its state.
struct Cleanup {
    rt: Option<LinuxRuntime>,
    state: PathBuf,
    cgroup_parent: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            for info in rt.list() {
                let _ = rt.kill(&info.id);
            }
        }
        for ctrl in ["cpu", "cpuacct", "cpuset", "memory", "pids", "freezer", ""] {
            let _ = std::fs::remove_dir(
                Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(&self.cgroup_parent),
            );
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

#[test]
fn five_hundred_create_kill_cycles_leak_nothing() {
    let name = common::unique("berth-hygiene");
    let state = PathBuf::from("/var/lib/berth-test").join(&name);
    std::fs::create_dir_all(&state).unwrap();
    let before = footprint(&state);
    let mut guard = Cleanup {
        rt: Some(LinuxRuntime::new(common::test_config(&state, &name)).unwrap()),
        state: state.clone(),
        cgroup_parent: name.clone(),
    };
    let rt = guard.rt.as_ref().unwrap();
    let layers = common::layers();
    for i in 0..500 {
        let spec = SandboxSpec {
            id: common::unique("cycle"),
            template: "test".into(),
            layers: layers.clone(),
            cpu_count: 1,
            memory_mb: 256,
            disk_size_mb: 256,
            volumes: Vec::new(),
        };
        let info = rt.create(&spec).unwrap();
        if i % 50 == 0 {
            let out = rt
                .exec_command(
                    &info.id,
                    0,
                    0,
                    &["/bin/sh", "-c", "echo data > /root/f && sleep 0.01 &"],
                )
                .unwrap()
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        }
        rt.kill(&info.id).unwrap();
    }
    // Nothing of any sandbox is left while the runtime still runs...
    let groups: usize = ["cpu", "cpuacct", "cpuset", "memory", "pids", "freezer", ""]
        .iter()
        .map(|c| count_subdirs(&Path::new("/sys/fs/cgroup").join(c).join(&name)))
        .sum();
    assert_eq!(groups, 0, "sandbox cgroups left");
    assert_eq!(count_dir(&state.join("sandboxes")), 0, "sandbox dirs left");
    // ...and once it is gone (its janitor done, its pool of ready disks removed), the
    // process and the state dir are as before. Lazily detached disks settle asynchronously.
    drop(guard.rt.take());
    let mut after = footprint(&state);
    for _ in 0..100 {
        if after == before {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        after = footprint(&state);
    }
    assert_eq!(before, after);
}
