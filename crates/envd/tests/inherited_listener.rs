//! berth-envd on a listening socket made for it before it started, as berth's sandbox
//! launcher hands it over (`BERTH_INIT_LISTEN_FD`): it serves there from its first
//! moment (a request sent before it runs waits in the backlog), the commands it runs do
//! not inherit the socket, and a descriptor that is not a listening socket is refused.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth_envd_proto::connect::encode_envelope;
use serde_json::json;

mod common;
use common::{hand_over_at_3, health_status, Envd};

#[tokio::test]
async fn it_serves_on_the_socket_it_is_handed_from_its_first_request() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let _envd = Envd::start_on(listener);
    // One attempt, sent before envd can have started: it is queued, not refused, and
    // answered by envd (its `--listen` address is one it could not bind).
    let status = health_status(port).await;
    assert!(
        status
            .as_deref()
            .is_some_and(|s| s.starts_with("HTTP/1.1 204")),
        "/health: {status:?}"
    );
}

#[test]
fn commands_it_runs_do_not_inherit_the_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", listener.as_raw_fd()))
        .unwrap()
        .ino();
    let _envd = Envd::start_on(listener);
    let out = tempfile::NamedTempFile::new().unwrap();
    let script = format!(
        "for f in /proc/$$/fd/*; do readlink \"$f\"; done > {}",
        out.path().display()
    );
    let request = json!({"process": {"cmd": "/bin/bash", "args": ["-c", script]}});
    let body = encode_envelope(0, &serde_json::to_vec(&request).unwrap());
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "POST /process.Process/Start HTTP/1.1\r\nHost: envd\r\nConnection: close\r\n\
         Content-Type: application/connect+json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream.write_all(&body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    assert!(
        response.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&response)
    );
    let targets = std::fs::read_to_string(out.path()).unwrap();
    assert!(
        targets.contains("/dev/null") || targets.contains("pipe:"),
        "{targets}"
    );
    assert!(
        !targets.contains(&format!("socket:[{inode}]")),
        "the command holds envd's listening socket: {targets}"
    );
}

/// envd's exit status and stderr when handed `fd` (None: a variable naming no
/// descriptor).
fn refused(fd: Option<std::os::fd::RawFd>) -> (std::process::ExitStatus, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth-envd"));
    command
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match fd {
        Some(fd) => hand_over_at_3(&mut command, fd),
        None => {
            command.env("BERTH_INIT_LISTEN_FD", "three");
        }
    }
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("envd kept running on a descriptor it should refuse");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

#[test]
fn a_descriptor_that_is_not_a_listening_socket_is_refused() {
    let (status, stderr) = refused(None);
    assert!(!status.success());
    assert!(stderr.contains("BERTH_INIT_LISTEN_FD"), "{stderr}");

    let file = tempfile::tempfile().unwrap();
    let (status, stderr) = refused(Some(file.as_raw_fd()));
    assert!(!status.success());
    assert!(stderr.contains("not a socket"), "{stderr}");

    let connected_only = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let (status, stderr) = refused(Some(connected_only.as_raw_fd()));
    assert!(!status.success());
    assert!(stderr.contains("not a listening socket"), "{stderr}");
}
