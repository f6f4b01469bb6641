//! The `base` template behaves like E2B's default sandbox. Privileged: run as root.

mod common;

use berth_runtime::Runtime;
use common::TestRuntime;

#[test]
fn base_behaves_like_e2b() {
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("e2b")).unwrap();
    assert_eq!(t.sh_ok(&info.id, 1000, "whoami"), "user");
    assert_eq!(
        t.sh_ok(&info.id, 1000, "getent passwd user | cut -d: -f6"),
        "/home/user"
    );
    assert_eq!(t.sh_ok(&info.id, 1000, "stat -c %U /home/user"), "user");
    let sudo = t.sh(&info.id, 1000, "sudo -n true");
    assert!(sudo.status.success(), "{sudo:?}");
    assert_eq!(String::from_utf8_lossy(&sudo.stderr), "", "sudo complained");
    assert_eq!(t.sh_ok(&info.id, 1000, "sudo -n whoami"), "root");
    assert_eq!(
        t.sh_ok(
            &info.id,
            1000,
            "sudo -n sh -c 'echo ok > /etc/written-by-sudo && cat /etc/written-by-sudo'"
        ),
        "ok"
    );
    assert_eq!(t.sh_ok(&info.id, 1000, "python3 -c 'print(6*7)'"), "42");
    assert_eq!(t.sh_ok(&info.id, 1000, "node -e 'console.log(6*7)'"), "42");
    assert_eq!(
        t.sh_ok(&info.id, 1000, "cd && pwd && touch ~/f && ls ~/f"),
        "/home/user\n/home/user/f"
    );
    // Root inside is namespaced: the template's files keep their inside owners.
    assert_eq!(
        t.sh_ok(
            &info.id,
            0,
            "stat -c %u:%g /usr/bin/sudo /etc/passwd | sort -u"
        ),
        "0:0"
    );
}
