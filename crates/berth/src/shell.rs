//! `berth sandbox shell`: a login shell on a PTY inside a sandbox, wired to this
//! terminal. The local terminal is put in raw mode (restored on every exit path by a
//! guard), keystrokes go to envd's `SendInput`, window size changes (SIGWINCH) to
//! `Update`, and the PTY's output is written through unchanged. Without a terminal on
//! stdin it still works, with an 80x24 PTY and no raw mode (for pipes).

use std::io::Write;
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use berth_client::{PtyEvent, PtyRequest};
use rustix::termios::{self, OptionalActions, Termios};
use tokio::io::AsyncReadExt;

use crate::remote::Remote;

/// Restores the terminal's settings when dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !termios::isatty(stdin.as_fd()) {
            return Ok(None);
        }
        let saved = termios::tcgetattr(stdin.as_fd()).context("reading the terminal settings")?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw)
            .context("putting the terminal in raw mode")?;
        Ok(Some(RawMode { saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &self.saved);
    }
}

/// The terminal's size in columns and rows (80x24 when stdout is not a terminal).
fn window_size() -> (u32, u32) {
    match termios::tcgetwinsize(std::io::stdout().as_fd()) {
        Ok(size) if size.ws_col > 0 && size.ws_row > 0 => {
            (u32::from(size.ws_col), u32::from(size.ws_row))
        }
        _ => (80, 24),
    }
}

/// Runs the shell until it exits; the result is its exit code.
pub async fn run(remote: &Remote, sandbox_id: &str) -> Result<i32> {
    let envd = remote.envd(sandbox_id).await?;
    let (cols, rows) = window_size();
    let mut pty = envd
        .start_pty(&PtyRequest::login_shell(cols, rows))
        .await
        .map_err(|err| remote.explain(err, &format!("starting a shell in {sandbox_id}")))?;
    let pid = pty.pid();
    let raw = RawMode::enter()?;

    let input = {
        let envd = envd.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buffer = [0u8; 4096];
            loop {
                match stdin.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => {
                        if envd.send_pty_input(pid, &buffer[..read]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        })
    };
    let resizes = {
        let envd = envd.clone();
        let mut winch =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                .context("listening for window size changes")?;
        tokio::spawn(async move {
            while winch.recv().await.is_some() {
                let (cols, rows) = window_size();
                let _ = envd.resize_pty(pid, cols, rows).await;
            }
        })
    };

    let mut exit_code = 255;
    let outcome = loop {
        match pty.next_event().await {
            Ok(Some(PtyEvent::Output(bytes))) => {
                let mut out = std::io::stdout().lock();
                out.write_all(&bytes)
                    .and_then(|()| out.flush())
                    .context("writing to the terminal")?;
            }
            Ok(Some(PtyEvent::Exited {
                exit_code: code,
                error,
            })) => {
                if let Some(code) = code {
                    exit_code = code;
                }
                if let Some(error) = error.filter(|_| code.is_none()) {
                    break Err(anyhow::anyhow!("the shell ended: {error}"));
                }
            }
            Ok(None) => break Ok(()),
            Err(err) => break Err(remote.explain(err, "reading the shell's output")),
        }
    };
    input.abort();
    resizes.abort();
    drop(raw);
    outcome.map(|()| exit_code)
}
