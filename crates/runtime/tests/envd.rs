//! The real berth-envd runs as the sandbox's init and is reachable through connect().

mod common;

use berth_runtime::Runtime;
use common::TestRuntime;

#[test]
fn envd_is_init_and_answers_health_through_connect() {
    let t = TestRuntime::with_envd();
    let info = t.rt.create(&t.spec("envd")).unwrap();
    let status = t.wait_envd_health(&info.id);
    assert!(status.starts_with("HTTP/1.1 2"), "{status}");
    assert_eq!(t.sh_ok(&info.id, 0, "cat /proc/1/comm"), "berth-envd");
    // envd is the session leader of the sandbox's pid namespace and holds only its own fds.
    assert_eq!(t.sh_ok(&info.id, 0, "ps -o sid= -p 1"), "1");
    let fds = t.sh_ok(
        &info.id,
        0,
        "ls -l /proc/1/fd | grep -c -E 'pipe:|socket:|anon_inode:|/' ",
    );
    assert!(!fds.is_empty());
    let targets = t.sh_ok(
        &info.id,
        0,
        "readlink /proc/1/fd/* | grep '^/' | sort -u | tr '\\n' ' '",
    );
    for target in targets.split_whitespace() {
        assert!(
            ["/dev/null", "/run/berth/init.log"].contains(&target)
                || target.starts_with("/dev/pts"),
            "envd holds unexpected fd {target}"
        );
    }
    t.rt.kill(&info.id).unwrap();
}

#[test]
fn envd_answers_a_request_made_the_moment_create_returns() {
    let t = TestRuntime::with_envd();
    let info = t.rt.create(&t.spec("envd-first")).unwrap();
    // One attempt, no retry: the launcher listened on envd's port before the exec, so
    // the connection waits in the backlog while envd starts instead of being refused.
    let response = t.envd_get(&info.id, "/health").unwrap();
    assert!(response.starts_with("HTTP/1.1 204"), "{response}");
    t.rt.kill(&info.id).unwrap();
}
