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

#[test]
fn concurrent_creates_and_kills() {
    let t = TestRuntime::new();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..3 {
                    let spec = t.spec("conc");
                    let info = t.rt.create(&spec).expect("create");
                    assert_eq!(t.sh_ok(&info.id, 0, "hostname"), spec.id);
                    t.rt.kill(&info.id).expect("kill");
                }
            });
        }
    });
    assert!(t.rt.list().is_empty());
    assert_eq!(
        std::fs::read_dir(t.state.join("sandboxes"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn killing_an_unknown_or_dead_sandbox() {
    let t = TestRuntime::new();
    assert!(matches!(
        t.rt.kill("nope"),
        Err(berth_runtime::RuntimeError::NotFound(_))
    ));
    let info = t.rt.create(&t.spec("dies")).unwrap();
    // The init dies on its own (as a crashed envd would); kill still cleans up.
    // SAFETY: plain kill(2) of a pid we created.
    assert_eq!(unsafe { libc::kill(info.init_pid, libc::SIGKILL) }, 0);
    t.rt.kill(&info.id).expect("kill after the init died");
    assert!(!t.state.join("sandboxes").join(&info.id).exists());
    assert!(t.rt.create(&t.spec("bad/id")).is_err());
}

#[test]
fn freeze_stops_every_process_until_thaw() {
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("frz")).unwrap();
    t.sh_ok(
        &info.id,
        0,
        "(while :; do date +%s%N > /tmp/tick.new && mv /tmp/tick.new /tmp/tick; sleep 0.01; done) >/dev/null 2>&1 & sleep 0.1",
    );
    // The host reads the sandbox's /tmp through its init's root.
    let tick = std::path::PathBuf::from(format!("/proc/{}/root/tmp/tick", info.init_pid));
    let read = || std::fs::read_to_string(&tick).unwrap();
    t.rt.freeze(&info.id).unwrap();
    let frozen = read();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(read(), frozen, "a process ran while the sandbox was frozen");
    t.rt.thaw(&info.id).unwrap();
    let mut moved = false;
    for _ in 0..300 {
        if read() != frozen {
            moved = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(moved, "processes did not resume after thaw");
    // A frozen sandbox can still be killed.
    t.rt.freeze(&info.id).unwrap();
    t.rt.kill(&info.id).unwrap();
}
