//! berth-envd as PID 1 of a fresh pid namespace (as in a sandbox): it reaps orphans
//! re-parented to it, still reports its own children's exit statuses, ignores SIGTERM
//! sent from inside its namespace and stops on SIGTERM from outside. Needs root (for `unshare --pid`), like the rest of berth's runtime tests.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth_envd_proto::connect::{decode_envelope, encode_envelope};
use serde_json::{json, Value};

struct NamespacedEnvd {
    unshare: Child,
    base: String,
}

impl NamespacedEnvd {
    fn start() -> NamespacedEnvd {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test needs root to create a pid namespace"
        );
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        // --kill-child: envd gets SIGKILL when unshare dies, so a failed test leaves
        // nothing behind (a SIGKILL, because what a test may be checking is that envd
        // does not stop on other signals).
        let unshare = Command::new("unshare")
            .args([
                "--pid",
                "--mount",
                "--mount-proc",
                "--kill-child=SIGKILL",
                "--",
            ])
            .arg(env!("CARGO_BIN_EXE_berth-envd"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let envd = NamespacedEnvd {
            unshare,
            base: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..500 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return envd;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("berth-envd in a pid namespace did not start listening");
    }

    /// Runs a bash script through Process/Start; returns (stdout, end event).
    fn run(&self, script: &str) -> (String, Value) {
        let request = json!({"process": {"cmd": "/bin/bash", "args": ["-c", script]}});
        let body = encode_envelope(0, &serde_json::to_vec(&request).unwrap());
        let response = ureq_post(&format!("{}/process.Process/Start", self.base), &body);
        let mut rest = &response[..];
        let mut stdout = Vec::new();
        let mut end = Value::Null;
        while !rest.is_empty() {
            let (envelope, used) = decode_envelope(rest, usize::MAX).unwrap();
            rest = &rest[used..];
            let frame: Value = serde_json::from_slice(&envelope.payload).unwrap();
            if let Some(data) = frame["event"]["data"]["stdout"].as_str() {
                use base64::Engine;
                stdout.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .unwrap(),
                );
            }
            if !frame["event"]["end"].is_null() {
                end = frame["event"]["end"].clone();
            }
        }
        (String::from_utf8(stdout).unwrap(), end)
    }
}

impl Drop for NamespacedEnvd {
    fn drop(&mut self) {
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// A blocking HTTP/1.1 POST with a Connect stream body; returns the response body.
fn ureq_post(url: &str, body: &[u8]) -> Vec<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use http_body_util::{BodyExt, Full};
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Full<bytes::Bytes>>();
        let request = hyper::Request::post(url)
            .header("content-type", "application/connect+json")
            .body(Full::new(bytes::Bytes::copy_from_slice(body)))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), hyper::StatusCode::OK);
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    })
}

#[test]
fn as_init_it_reaps_orphans_keeps_exit_codes_and_stops_on_sigterm_from_outside_only() {
    let mut envd = NamespacedEnvd::start();

    let (stdout, end) = envd.run("echo $$; exit 7");
    assert_eq!(end["status"], "exit status 7");
    assert_ne!(stdout.trim(), "1", "the command itself must not be PID 1");

    // The orphan's parent exits at once, so the orphan is re-parented to envd (PID 1).
    let (orphan, end) = envd.run("sh -c 'exit 0' & echo $!");
    assert_eq!(end["status"], "exit status 0");
    let orphan: u32 = orphan.trim().parse().unwrap();
    let mut reaped = false;
    for _ in 0..200 {
        let (state, _) = envd.run(&format!(
            "if [ -e /proc/{orphan}/stat ]; then cut -d' ' -f3 /proc/{orphan}/stat; else echo gone; fi"
        ));
        if state.trim() == "gone" {
            reaped = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(reaped, "orphan {orphan} was never reaped by envd as PID 1");

    let (parent, _) = envd.run("sleep 60 & echo $!");
    let parent: u32 = parent.trim().parse().unwrap();
    assert!(parent > 1);

    // Root inside cannot stop envd: a SIGTERM from inside the namespace is ignored.
    envd.run("kill -TERM 1; kill -INT 1");
    let (alive, _) = envd.run("echo alive");
    assert_eq!(
        alive.trim(),
        "alive",
        "envd stopped on a SIGTERM from inside"
    );

    // unshare blocks SIGTERM while it waits, so signal envd (its child, the namespace's
    // init) directly: an init with a handler does receive signals from outside. envd
    // stops its processes and exits, which ends the namespace and unshare.
    let unshare_pid = envd.unshare.id();
    let children =
        std::fs::read_to_string(format!("/proc/{unshare_pid}/task/{unshare_pid}/children"))
            .unwrap();
    let envd_pid: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: kill(2) on the envd this test started.
    assert_eq!(unsafe { libc::kill(envd_pid, libc::SIGTERM) }, 0);
    let mut exited = false;
    for _ in 0..500 {
        if matches!(envd.unshare.try_wait(), Ok(Some(_))) {
            exited = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(exited, "unshare did not exit after SIGTERM");
    let port_free = (0..250).any(|_| {
        let url = envd.base.trim_start_matches("http://");
        let free = std::net::TcpStream::connect(url).is_err();
        if !free {
            std::thread::sleep(Duration::from_millis(20));
        }
        free
    });
    assert!(port_free, "envd still listens after SIGTERM");
}
