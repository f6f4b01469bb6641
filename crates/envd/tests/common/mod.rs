//! The berth-envd process fixture shared by the integration tests.
// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
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

    /// Starts the real binary serving on `listener`, handed over the way berth's sandbox
    /// launcher does (a descriptor named by `BERTH_INIT_LISTEN_FD`), with a `--listen`
    /// address no host has: it serves only if it takes the socket. Returns at once: the
    /// socket already queues connections.
    pub fn start_on(listener: TcpListener) -> Envd {
        let port = listener.local_addr().unwrap().port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_berth-envd"));
        command
            .args(["--listen", "192.0.2.1:9"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        hand_over_at_3(&mut command, listener.as_raw_fd());
        let child = command.spawn().unwrap();
        Envd {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Makes descriptor `fd` of this process descriptor 3 of `command`'s, named by
/// `BERTH_INIT_LISTEN_FD=3`.
pub fn hand_over_at_3(command: &mut Command, fd: RawFd) {
    command.env("BERTH_INIT_LISTEN_FD", "3");
    // SAFETY: between fork and exec only dup2(2) and fcntl(2), async-signal-safe, on a
    // descriptor the caller keeps open until the spawn returns.
    unsafe {
        command.pre_exec(move || {
            // dup2 onto itself would keep close-on-exec: cleared by hand then.
            let result = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if result < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The status line of one plain HTTP/1.1 `GET /health`, or `None` while nothing listens.
pub async fn health_status(port: u16) -> Option<String> {
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
