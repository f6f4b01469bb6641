//! The berth-envd process fixture shared by the integration tests.
// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running envd on a free loopback port; stopped (and its processes with it) on drop.
pub struct Envd {
    child: Child,
    base: String,
}

impl Envd {
    /// Starts the real binary and waits until `GET /health` answers 204.
    pub async fn start() -> Envd {
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let child = Command::new(env!("CARGO_BIN_EXE_berth-envd"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let envd = Envd {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..500 {
            if let Some(status) = health_status(port).await {
                assert!(status.starts_with("HTTP/1.1 204"), "/health: {status}");
                return envd;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("berth-envd did not answer /health");
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The status line of one plain HTTP/1.1 `GET /health`, or `None` while nothing listens.
async fn health_status(port: u16) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: envd\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.ok()?;
    let text = String::from_utf8_lossy(&response);
    text.lines().next().map(str::to_owned)
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
