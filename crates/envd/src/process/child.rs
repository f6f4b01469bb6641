//! Spawning one child process (pipes or a PTY, as an OS user) and async I/O on its
//! file descriptors. The child itself is started by [`Launch`](super::launch::Launch)
//! on the reaper's spawner thread.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::oneshot;

use super::launch::Launch;
use crate::reaper::Reaper;

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
    let mut pty_master = None;
    let (mut stdin, mut stdout, mut stderr) = (None, None, None);
    let child_stdio = if let Some(size) = spec.pty {
        let winsize = libc::winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&nix_winsize(winsize)), None).map_err(io::Error::from)?;
        set_cloexec(&pty.master)?;
        set_cloexec(&pty.slave)?;
        pty_master = Some(pty.master);
        [pty.slave.try_clone()?, pty.slave.try_clone()?, pty.slave]
    } else {
        let child_stdin = if spec.stdin {
            let (read, write) = pipe()?;
            stdin = Some(write);
            read
        } else {
            OwnedFd::from(File::open("/dev/null")?)
        };
        let (out_read, out_write) = pipe()?;
        let (err_read, err_write) = pipe()?;
        stdout = Some(out_read);
        stderr = Some(err_read);
        [child_stdin, out_write, err_write]
    };
    let launch = Launch::new(spec, child_stdio)?;
    // The parent's copies of the child's ends (a PTY slave) close with `launch`, once the
    // child runs.
    let (pid, exit) = reaper.spawn(launch)?;
    Ok(SpawnedChild {
        pid,
        stdin: stdin.map(AsyncPipe::new).transpose()?,
        stdout: stdout.map(AsyncPipe::new).transpose()?,
        stderr: stderr.map(AsyncPipe::new).transpose()?,
        pty: pty_master.map(AsyncPipe::new).transpose()?,
        exit,
    })
}

/// A pipe whose ends close on exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
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
