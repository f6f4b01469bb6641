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
