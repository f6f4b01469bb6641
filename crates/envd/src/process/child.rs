//! Spawning one child process (pipes or a PTY, as an OS user) and async I/O on its
//! file descriptors.
//!
//! Children are forked from a multi-threaded process, so everything between fork and
//! exec is a raw syscall (async-signal-safe, no allocation): new session, controlling
//! terminal, a raised OOM score, supplementary groups, gid, uid, and marking every inherited descriptor
//! above stderr close-on-exec (`close_range(CLOSE_RANGE_CLOEXEC)`, which keeps std's
//! exec-error pipe working until the exec itself).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::oneshot;

use crate::reaper::Reaper;

/// The OOM score children start with: +500 adds half the sandbox's memory limit to
/// their badness, so the OOM killer picks any of them before envd (whose own memory is
/// far less than half the limit).
const WORKLOAD_OOM_SCORE_ADJ: &[u8] = b"500";

/// What to run and how.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub program: String,
    pub args: Vec<String>,
    /// The complete environment.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// Credentials to switch to; `None` keeps envd's own.
    pub credentials: Option<Credentials>,
    /// Give the child a stdin pipe (else `/dev/null`).
    pub stdin: bool,
    /// Run on a new PTY of this size instead of pipes.
    pub pty: Option<TerminalSize>,
}

/// An OS identity for the child.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, the primary group included.
    pub groups: Vec<u32>,
}

/// Columns and rows of a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminalSize {
    pub cols: u16,
    pub rows: u16,
}

/// A started child and the parent's ends of its I/O.
#[derive(Debug)]
pub struct SpawnedChild {
    pub pid: i32,
    pub stdin: Option<AsyncPipe>,
    pub stdout: Option<AsyncPipe>,
    pub stderr: Option<AsyncPipe>,
    /// The PTY master, for both directions.
    pub pty: Option<AsyncPipe>,
    pub exit: oneshot::Receiver<ExitStatus>,
}

/// Starts a child described by `spec`.
pub fn spawn(reaper: &Reaper, spec: &SpawnSpec) -> io::Result<SpawnedChild> {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd);

    let mut pty_master = None;
    if let Some(size) = spec.pty {
        let winsize = libc::winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&nix_winsize(winsize)), None).map_err(io::Error::from)?;
        set_cloexec(&pty.master)?;
        command
            .stdin(Stdio::from(pty.slave.try_clone()?))
            .stdout(Stdio::from(pty.slave.try_clone()?))
            .stderr(Stdio::from(pty.slave));
        pty_master = Some(pty.master);
    } else {
        command
            .stdin(if spec.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }

    let credentials = spec.credentials.clone();
    let controlling_terminal = spec.pty.is_some();
    // SAFETY: the closure runs between fork and exec and only makes raw syscalls on
    // values prepared before the fork; it allocates nothing and takes no locks.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            // As a sandbox's init, envd is shielded from the OOM killer (the host set
            // -1000 where it may). Its children get a raised OOM score, so a memory hog
            // or a fork bomb is what the OOM killer takes even where the host could not
            // shield envd. Raising a score is always allowed; where it fails (envd as a
            // host process without /proc) there is nothing to protect.
            let fd = libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd >= 0 {
                libc::write(
                    fd,
                    WORKLOAD_OOM_SCORE_ADJ.as_ptr().cast(),
                    WORKLOAD_OOM_SCORE_ADJ.len(),
                );
                libc::close(fd);
            }
            if controlling_terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(credentials) = &credentials {
                // Raw syscalls: they change only this (the child's only) thread, which
                // is what a forked child of a threaded parent needs.
                if libc::syscall(
                    libc::SYS_setgroups,
                    credentials.groups.len(),
                    credentials.groups.as_ptr(),
                ) < 0
                {
                    return Err(io::Error::last_os_error());
                }
                let gid = credentials.gid;
                if libc::syscall(libc::SYS_setresgid, gid, gid, gid) < 0 {
                    return Err(io::Error::last_os_error());
                }
                let uid = credentials.uid;
                if libc::syscall(libc::SYS_setresuid, uid, uid, uid) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }

    // The parent's copies of the PTY slave go away with `command`, once the child runs.
    let (mut child, exit) = reaper.spawn(command)?;
    let pid = i32::try_from(child.id()).expect("pids fit in i32");
    let stdin = child
        .stdin
        .take()
        .map(|s| AsyncPipe::new(s.into()))
        .transpose()?;
    let stdout = child
        .stdout
        .take()
        .map(|s| AsyncPipe::new(s.into()))
        .transpose()?;
    let stderr = child
        .stderr
        .take()
        .map(|s| AsyncPipe::new(s.into()))
        .transpose()?;
    let pty = pty_master.map(AsyncPipe::new).transpose()?;
    Ok(SpawnedChild {
        pid,
        stdin,
        stdout,
        stderr,
        pty,
        exit,
    })
}

fn nix_winsize(size: libc::winsize) -> nix::pty::Winsize {
    nix::pty::Winsize {
        ws_row: size.ws_row,
        ws_col: size.ws_col,
        ws_xpixel: size.ws_xpixel,
        ws_ypixel: size.ws_ypixel,
    }
}

fn set_cloexec(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_SETFD on a descriptor we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Resizes the terminal whose master is `master`.
pub fn resize(master: &AsyncPipe, size: TerminalSize) -> io::Result<()> {
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a valid winsize from the pointer.
    if unsafe { libc::ioctl(master.fd.as_raw_fd(), libc::TIOCSWINSZ, &winsize) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A non-blocking pipe end or PTY master driven by tokio.
#[derive(Debug)]
pub struct AsyncPipe {
    fd: AsyncFd<OwnedFd>,
}

/// `read` outcome on a pipe or PTY master.
fn map_read(result: io::Result<usize>) -> io::Result<usize> {
    match result {
        // A PTY master reports EIO once no process holds the slave: that is EOF.
        Err(err) if err.raw_os_error() == Some(libc::EIO) => Ok(0),
        other => other,
    }
}

impl AsyncPipe {
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: an OwnedFd always returns the same open descriptor, which it keeps
        // open until the AsyncFd (its owner) is dropped.
        let fd =
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
                .map_err(|err| err.into_parts().1)?;
        Ok(Self { fd })
    }

    fn raw_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: read into a valid, writable buffer of the given length.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Reads what is available, waiting for data; 0 means end of file.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|_| self.raw_read(buf)) {
                Ok(result) => return map_read(result),
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads what is available now; `Err(WouldBlock)` when nothing is.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        map_read(self.raw_read(buf))
    }

    /// Writes all of `data`, waiting while the pipe is full.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            let written = guard.try_io(|inner| {
                // SAFETY: write from a valid buffer of the given length.
                let n = unsafe { libc::write(inner.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            if let Ok(result) = written {
                data = &data[result?..];
            }
        }
        Ok(())
    }
}
