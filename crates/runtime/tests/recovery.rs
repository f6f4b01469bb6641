//! A restarted daemon reattaches live sandboxes and cleans dead ones. Privileged.

mod common;

use berth_runtime::Runtime;
use common::TestRuntime;

#[test]
fn recover_reattaches_live_and_cleans_dead() {
    let t = TestRuntime::new();
    let live = t.rt.create(&t.spec("live")).unwrap();
    let dead = t.rt.create(&t.spec("dead")).unwrap();
    t.sh_ok(&live.id, 0, "echo kept > /root/kept");
    // The dead sandbox's init dies while no daemon watches (left a zombie: nobody reaps).
    // SAFETY: plain kill(2) of a pid we created.
    assert_eq!(unsafe { libc::kill(dead.init_pid, libc::SIGKILL) }, 0);
    let stat_path = format!("/proc/{}/stat", dead.init_pid);
    while !std::fs::read_to_string(&stat_path)
        .unwrap()
        .rsplit_once(')')
        .unwrap()
        .1
        .starts_with(" Z")
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Leftovers of a create that crashed before writing anything but its directory.
    let ghost = t.state.join("sandboxes").join("ghost");
    std::fs::create_dir_all(&ghost).unwrap();
    let orphan_cgroup = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
        .iter()
        .map(|root| std::path::Path::new(root).join(t.cgroup_parent()))
        .find(|p| p.exists())
        .unwrap()
        .join("orphan");
    std::fs::create_dir(&orphan_cgroup).unwrap();

    let restarted = t.reopen();
    let report = restarted.recover().unwrap();
    let reattached: Vec<&str> = report.reattached.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(reattached, [live.id.as_str()]);
    let mut cleaned = report.cleaned.clone();
    cleaned.sort();
    let mut expected = vec![dead.id.clone(), "ghost".to_owned(), "orphan".to_owned()];
    expected.sort();
    assert_eq!(cleaned, expected);
    assert!(!ghost.exists() && !orphan_cgroup.exists());
    assert!(!t.state.join("sandboxes").join(&dead.id).exists());

    // The reattached sandbox is fully usable through the new runtime.
    assert_eq!(restarted.list().len(), 1);
    assert!(restarted.stats(&live.id).unwrap().mem_used > 0);
    restarted.freeze(&live.id).unwrap();
    restarted.thaw(&live.id).unwrap();
    let out = restarted
        .exec_command(&live.id, 0, 0, &["cat", "/root/kept"])
        .unwrap()
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "kept");
    restarted.kill(&live.id).unwrap();
    assert!(!t.state.join("sandboxes").join(&live.id).exists());
    // A second recovery finds nothing.
    let again = restarted.recover().unwrap();
    assert!(
        again.reattached.is_empty() && again.cleaned.is_empty(),
        "{again:?}"
    );
}
