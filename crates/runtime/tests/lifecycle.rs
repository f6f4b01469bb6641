//! Create, run, stats, freeze/thaw, kill. Privileged: run as root.

mod common;

use berth_runtime::Runtime;
use common::TestRuntime;

#[test]
fn create_exec_kill() {
    let t = TestRuntime::new();
    let spec = t.spec("life");
    let info = t.rt.create(&spec).expect("create");
    assert_eq!(t.sh_ok(&info.id, 0, "hostname"), spec.id);
    assert_eq!(t.sh_ok(&info.id, 0, "id -u"), "0");
    assert_eq!(t.sh_ok(&info.id, 1000, "id -u"), "1000");
    // PID 1 inside is the init (sleep); nothing of the host is visible.
    assert_eq!(t.sh_ok(&info.id, 0, "cat /proc/1/comm"), "sleep");
    t.sh_ok(&info.id, 0, "echo hi > /root/file && cat /root/file");
    let stats = t.rt.stats(&info.id).expect("stats");
    assert!(stats.mem_used > 0 && stats.disk_total > 0, "{stats:?}");
    t.rt.freeze(&info.id).expect("freeze");
    t.rt.thaw(&info.id).expect("thaw");
    t.rt.kill(&info.id).expect("kill");
    assert!(t.rt.list().is_empty());
    assert!(!t.state.join("sandboxes").join(&info.id).exists());
}
