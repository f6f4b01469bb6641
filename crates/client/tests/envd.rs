//! `EnvdClient` against the real `berth-envd` binary running as a plain host process on a
//! loopback port (`BERTH_ENVD_BIN`, else the workspace build, built if missing): commands
//! with output, exit codes and a time limit, files both ways, and the access token that
//! the shared `/init` body sets.

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth_client::{ClientError, EnvdClient, EnvdEndpoint, ExecError, ExecRequest, OutputSink};
use berth_envd_proto::connect::Code;
use berth_envd_proto::http::InitRequest;

/// The berth-envd binary: `BERTH_ENVD_BIN`, else the one beside this test's target dir.
fn envd_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTH_ENVD_BIN") {
        return PathBuf::from(path);
    }
    // <target>/debug/deps/envd-<hash> → <target>/debug/berth-envd
    let exe = std::env::current_exe().expect("the test binary's path");
    let built = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary lives in <target>/<profile>/deps")
        .join("berth-envd");
    if !built.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "berth-envd", "--bin", "berth-envd"])
            .status()
            .expect("run cargo build -p berth-envd");
        assert!(status.success(), "building berth-envd failed");
    }
    built
}

/// A running envd on a free loopback port; stopped on drop.
struct Envd {
    child: Child,
    url: String,
}

impl Envd {
    async fn start() -> Envd {
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let child = Command::new(envd_binary())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let envd = Envd {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        for _ in 0..500 {
            if let Ok(response) = http.get(format!("{}/health", envd.url)).send().await {
                assert_eq!(response.status().as_u16(), 204);
                return envd;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("berth-envd did not answer /health");
    }

    fn client(&self, token: Option<&str>) -> EnvdClient {
        EnvdClient::new(
            reqwest::Client::new(),
            &EnvdEndpoint::SandboxUrl(self.url.clone()),
            "itest",
            token.map(str::to_owned),
        )
    }
}

impl Drop for Envd {
    fn drop(&mut self) {
        // SIGTERM lets envd stop the processes it started before it exits.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..250 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Default)]
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl OutputSink for Collected {
    fn stdout(&mut self, chunk: &[u8]) {
        self.stdout.extend_from_slice(chunk);
    }
    fn stderr(&mut self, chunk: &[u8]) {
        self.stderr.extend_from_slice(chunk);
    }
}

fn command(text: &str) -> ExecRequest {
    ExecRequest {
        command: text.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn exec_streams_output_and_reports_exit_codes() {
    let envd = Envd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = envd.client(None);
    let mut sink = Collected::default();
    let request = ExecRequest {
        command: "echo \"$GREETING\"; pwd; echo oops >&2; exit 3".into(),
        cwd: Some(dir.path().to_string_lossy().into_owned()),
        envs: HashMap::from([("GREETING".into(), "hello".into())]),
        // Generous: a host login shell can wait 60 s for a lock of the host's own
        // profile (pyenv's rehash lock, left behind when the deadline test beside this
        // one kills its shell mid-rehash on a loaded CI host).
        timeout_ms: Some(180_000),
    };
    let output = client.exec(&request, &mut sink).await.unwrap();
    assert_eq!(output.exit_code, Some(3));
    assert_eq!(output.error, None);
    assert_eq!(
        String::from_utf8(sink.stdout).unwrap(),
        format!("hello\n{}\n", dir.path().display())
    );
    assert_eq!(sink.stderr, b"oops\n");

    let mut sink = Collected::default();
    let many = client
        .exec(&command("seq 1 20000"), &mut sink)
        .await
        .unwrap();
    assert_eq!(many.exit_code, Some(0));
    let expected: String = (1..=20000).map(|n| format!("{n}\n")).collect();
    assert_eq!(String::from_utf8(sink.stdout).unwrap(), expected);
}

#[tokio::test]
async fn a_time_limit_ends_the_command_with_deadline_exceeded() {
    let envd = Envd::start().await;
    let mut sink = Collected::default();
    let request = ExecRequest {
        timeout_ms: Some(300),
        ..command("sleep 30; echo late")
    };
    let output = envd.client(None).exec(&request, &mut sink).await.unwrap();
    assert!(sink.stdout.is_empty());
    match output.error {
        Some(ExecError::Stream(error)) => assert_eq!(error.code, Code::DeadlineExceeded),
        other => panic!("expected deadline_exceeded, got {other:?}"),
    }
}

#[tokio::test]
async fn files_round_trip_and_missing_files_are_api_errors() {
    let envd = Envd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = envd.client(None);
    let path = dir.path().join("nested/dir/hello.txt");
    let path_text = path.to_string_lossy().into_owned();
    let written = client
        .write_file(&path_text, b"hi there\n".to_vec())
        .await
        .unwrap();
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].path, path_text);
    assert_eq!(written[0].name, "hello.txt");
    assert_eq!(written[0].kind, "file");
    assert_eq!(std::fs::read(&path).unwrap(), b"hi there\n");
    assert_eq!(client.read_file(&path_text).await.unwrap(), b"hi there\n");

    let missing = dir.path().join("absent").to_string_lossy().into_owned();
    match client.read_file(&missing).await {
        Err(ClientError::Api { status: 404, body }) => {
            assert_eq!(body["code"], 404, "{body}");
            assert!(
                body["message"].as_str().unwrap().contains("absent"),
                "{body}"
            );
        }
        other => panic!("expected a 404, got {other:?}"),
    }
}

#[tokio::test]
async fn the_access_token_set_by_init_is_sent_on_every_call() {
    let envd = Envd::start().await;
    let init = InitRequest {
        access_token: Some("secret-token".into()),
        env_vars: BTreeMap::from([("FROM_INIT".into(), "yes".into())]),
        ..Default::default()
    };
    let answer = reqwest::Client::new()
        .post(format!("{}/init", envd.url))
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 204);

    let mut sink = Collected::default();
    match envd.client(None).exec(&command("true"), &mut sink).await {
        Err(ClientError::Api { status: 401, .. }) => {}
        other => panic!("expected 401 without the token, got {other:?}"),
    }
    let output = envd
        .client(Some("secret-token"))
        .exec(&command("echo $FROM_INIT"), &mut sink)
        .await
        .unwrap();
    assert_eq!(output.exit_code, Some(0));
    assert_eq!(sink.stdout, b"yes\n");
}
