//! Two daemons on one host (different state dirs, the same cgroup parent, as two `berth
//! up` with different `--state-dir` have): starting the second must not touch the
//! first's sandboxes. Privileged.

mod common;

use std::path::PathBuf;

use berth_runtime::{LinuxRuntime, Runtime};
use common::TestRuntime;

/// A second daemon's runtime and state dir, removed on drop (runtime first).
struct OtherDaemon {
    rt: Option<LinuxRuntime>,
    state: PathBuf,
}

impl Drop for OtherDaemon {
    fn drop(&mut self) {
        drop(self.rt.take());
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

#[test]
fn recovery_leaves_live_sandboxes_of_another_state_dir_alone() {
    let t = TestRuntime::new();
    let live = t.rt.create(&t.spec("theirs")).unwrap();
    t.sh_ok(&live.id, 0, "true");

    let state = PathBuf::from("/var/lib/berth-test").join(common::unique("berth-test-other"));
    std::fs::create_dir_all(&state).unwrap();
    let mut other = OtherDaemon { rt: None, state };
    let rt = other
        .rt
        .insert(LinuxRuntime::new(common::test_config(&other.state, t.cgroup_parent())).unwrap());
    let report = rt.recover().unwrap();
    assert!(
        report.reattached.is_empty() && report.cleaned.is_empty(),
        "{report:?}"
    );

    // The first daemon's sandbox still runs and answers.
    assert_eq!(t.sh_ok(&live.id, 0, "echo alive"), "alive");
    t.rt.kill(&live.id).unwrap();
}

#[test]
fn recovery_leaves_the_empty_groups_of_another_daemons_paused_sandbox_alone() {
    let t = TestRuntime::new();
    let paused = t.rt.create(&t.spec("paused")).unwrap();
    t.rt.pause(&paused.id, false).unwrap();
    let groups: Vec<PathBuf> = ["pids", "memory"]
        .iter()
        .map(|controller| {
            PathBuf::from("/sys/fs/cgroup")
                .join(controller)
                .join(t.cgroup_parent())
                .join(&paused.id)
        })
        .filter(|group| group.is_dir())
        .collect();
    assert!(!groups.is_empty(), "a paused sandbox keeps its groups");

    let state = PathBuf::from("/var/lib/berth-test").join(common::unique("berth-test-other"));
    std::fs::create_dir_all(&state).unwrap();
    let mut other = OtherDaemon { rt: None, state };
    let rt = other
        .rt
        .insert(LinuxRuntime::new(common::test_config(&other.state, t.cgroup_parent())).unwrap());
    let report = rt.recover().unwrap();
    assert!(report.cleaned.is_empty(), "{report:?}");
    assert!(
        groups.iter().all(|group| group.is_dir()),
        "its groups are kept"
    );

    t.rt.resume(&paused.id, false).unwrap();
    assert_eq!(t.sh_ok(&paused.id, 0, "echo back"), "back");
    t.rt.kill(&paused.id).unwrap();
}

/// Host uid of namespaced root in the sandbox whose init is `pid`.
fn host_root_uid(pid: i32) -> u32 {
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    map.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn two_daemons_never_give_two_sandboxes_one_uid_range() {
    let t = TestRuntime::new();
    let state = PathBuf::from("/var/lib/berth-test").join(common::unique("berth-test-other"));
    std::fs::create_dir_all(&state).unwrap();
    let mut other = OtherDaemon { rt: None, state };
    let rt = other
        .rt
        .insert(LinuxRuntime::new(common::test_config(&other.state, t.cgroup_parent())).unwrap());
    let mine: Vec<_> = (0..3)
        .map(|i| t.rt.create(&t.spec(&format!("mine{i}"))).unwrap())
        .collect();
    let theirs: Vec<_> = (0..3)
        .map(|i| rt.create(&t.spec(&format!("theirs{i}"))).unwrap())
        .collect();
    let mut bases: Vec<u32> = mine
        .iter()
        .chain(&theirs)
        .map(|s| host_root_uid(s.init_pid))
        .collect();
    bases.sort_unstable();
    bases.dedup();
    assert_eq!(
        bases.len(),
        6,
        "each sandbox has its own host range: {bases:?}"
    );
    for sandbox in &theirs {
        rt.kill(&sandbox.id).unwrap();
    }
    for sandbox in &mine {
        t.rt.kill(&sandbox.id).unwrap();
    }
}
