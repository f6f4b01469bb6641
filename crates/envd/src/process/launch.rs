//! Starting one child process without copying envd: `clone(CLONE_VM | CLONE_VFORK)`.
//!
//! A `fork` of envd copies its page tables, flushes the TLBs of the CPUs its other
//! threads ran on (an IPI each: a VM exit on a virtual machine), takes a copy-on-write
//! fault for every page the child touches before `exec`, and the `exec` then tears the
//! copy down again. The child made here shares envd's memory and runs on a stack of its
//! own until its `execve` (or its exit), while the spawning thread waits: the way glibc's
//! `posix_spawn` starts a child. `posix_spawn` itself cannot switch credentials or raise
//! the OOM score, so the child's steps are written out here.
//!
//! Everything the child needs is prepared before the clone (C strings, pointer arrays,
//! descriptors, the PATH candidates). The child makes plain system calls only: no
//! allocation, no locks, no panics, and it writes no shared memory but the one slot
//! where it leaves the errno of the step that failed. All signals are blocked across the
//! clone, so none of envd's handlers can run on the child's stack; the child resets
//! every caught signal to its default before unblocking.

use std::ffi::{c_char, c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::sched::CloneFlags;

use super::child::{Credentials, SpawnSpec};

/// The OOM score children start with: +500 adds half the sandbox's memory limit to
/// their badness, so the OOM killer picks any of them before envd (whose own memory is
/// far less than half the limit).
const WORKLOAD_OOM_SCORE_ADJ: &[u8] = b"500";

/// The search path when the child's environment has no `PATH` (glibc's `execvp`'s).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// The highest signal number on Linux.
const LAST_SIGNAL: i32 = 64;

/// Errors of `execve` after which the next PATH candidate is tried (as `execvp` does).
const TRY_NEXT: [i32; 5] = [
    libc::ENOENT,
    libc::ENOTDIR,
    libc::ESTALE,
    libc::ENODEV,
    libc::ETIMEDOUT,
];

/// A child's program, arguments, environment, descriptors and identity, as C values.
#[derive(Debug)]
pub struct Launch {
    /// The paths `execve` tries in order: the program itself when it names a path,
    /// else the program in each directory of the child's `PATH`.
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    /// What becomes the child's stdin, stdout and stderr; the parent's copies close
    /// when the launch is dropped.
    stdio: [OwnedFd; 3],
    credentials: Option<Credentials>,
    controlling_terminal: bool,
}

impl Launch {
    /// Prepares `spec` with `stdio` as the child's descriptors 0, 1 and 2.
    pub fn new(spec: &SpawnSpec, stdio: [OwnedFd; 3]) -> io::Result<Self> {
        let candidates = if spec.program.contains('/') {
            vec![c_string(spec.program.as_bytes())?]
        } else {
            let path = spec
                .env
                .iter()
                .rev()
                .find(|(key, _)| key == "PATH")
                .map_or(DEFAULT_PATH, |(_, value)| value.as_str());
            path.split(':')
                .map(|dir| match dir {
                    "" => c_string(spec.program.as_bytes()),
                    dir => c_string(format!("{dir}/{}", spec.program).as_bytes()),
                })
                .collect::<io::Result<_>>()?
        };
        let argv = std::iter::once(spec.program.as_bytes())
            .chain(spec.args.iter().map(|arg| arg.as_bytes()))
            .map(c_string)
            .collect::<io::Result<_>>()?;
        // Sorted by name, as `std::process::Command` passed them: `env` prints the same
        // order every time.
        let mut env: Vec<&(String, String)> = spec.env.iter().collect();
        env.sort_by(|a, b| a.0.cmp(&b.0));
        let envp = env
            .into_iter()
            .map(|(key, value)| c_string(format!("{key}={value}").as_bytes()))
            .collect::<io::Result<_>>()?;
        let [stdin, stdout, stderr] = stdio;
        Ok(Self {
            candidates,
            argv,
            envp,
            cwd: c_string(spec.cwd.as_os_str().as_bytes())?,
            stdio: [
                above_stdio(stdin)?,
                above_stdio(stdout)?,
                above_stdio(stderr)?,
            ],
            credentials: spec.credentials.clone(),
            controlling_terminal: spec.pty.is_some(),
        })
    }

    /// Starts the child on `stack` and returns its pid once it has called `execve`.
    /// The caller must reap the pid; a child whose steps failed is reaped here.
    pub fn start(&self, stack: &mut ChildStack) -> io::Result<i32> {
        let argv = null_terminated(&self.argv);
        let envp = null_terminated(&self.envp);
        let steps = ChildSteps {
            launch: self,
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            failed: AtomicI32::new(0),
        };
        // SAFETY: PR_GET_DUMPABLE reads a flag of this process.
        let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
        let blocked = SignalsBlocked::new()?;
        let child_steps = &steps;
        let run: nix::sched::CloneCb = Box::new(move || {
            // SAFETY: the child runs these steps on its own stack while the parent waits
            // (CLONE_VFORK); they only read what `steps` points at and make system calls.
            unsafe { child_steps.run() }
        });
        // SAFETY: the child shares our memory until it calls `execve` or exits, and we
        // are suspended until then, so everything `steps` points at outlives its use. Its
        // stack is `stack`, used by no one else (one clone at a time per stack), far
        // larger than the steps need. Signals are blocked, so none of our handlers run
        // on the child's stack.
        let cloned = unsafe {
            nix::sched::clone(
                run,
                stack.usable(),
                CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
                Some(libc::SIGCHLD),
            )
        };
        drop(blocked);
        // A child's switch to another uid marked the memory it shared with us as not
        // dumpable (the kernel's guard for a process that changed identity), which
        // would keep CRIU and /proc out of envd. Its exec has given it memory of its
        // own; ours goes back to what it was. A checkpoint that lands between the
        // switch and this line fails, and the sandbox keeps running (with `fork` the
        // child's own copy had the same window, from its switch to its exec).
        // SAFETY: PR_GET_DUMPABLE / PR_SET_DUMPABLE read and set a flag of this
        // process, here back to its value from before the clone.
        unsafe {
            if dumpable == 1 && libc::prctl(libc::PR_GET_DUMPABLE) != 1 {
                libc::prctl(libc::PR_SET_DUMPABLE, 1);
            }
        }
        let pid = cloned.map_err(io::Error::from)?.as_raw();
        match steps.failed.load(Ordering::Acquire) {
            0 => Ok(pid),
            errno => {
                reap(pid);
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    }
}

/// What the child reads: the launch and its pointer arrays, and where it leaves the
/// errno of a failed step.
struct ChildSteps<'a> {
    launch: &'a Launch,
    argv: *const *const c_char,
    envp: *const *const c_char,
    failed: AtomicI32,
}

impl ChildSteps<'_> {
    /// The child's side: returns only by exiting.
    ///
    /// # Safety
    /// Only in the child of a `CLONE_VM | CLONE_VFORK` clone made with all signals
    /// blocked, while the `Launch` and the pointer arrays are alive.
    unsafe fn run(&self) -> isize {
        // SAFETY: the caller upholds this function's contract; every call below is a
        // system call (or glibc's plain wrapper of one) on values prepared in the parent.
        unsafe {
            let launch = self.launch;
            // Handlers are envd's code on envd's data: put every caught signal back to its
            // default (exec would, but a signal may arrive before it). SIGPIPE, which the
            // Rust runtime ignores, starts at its default too, as `std::process` does.
            for signal in 1..=LAST_SIGNAL {
                let mut current: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, ptr::null(), &mut current) != 0 {
                    continue;
                }
                let caught =
                    current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN;
                if caught || signal == libc::SIGPIPE {
                    let mut default: libc::sigaction = std::mem::zeroed();
                    default.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(signal, &default, ptr::null_mut());
                }
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::pthread_sigmask(libc::SIG_SETMASK, &none, ptr::null_mut()) != 0 {
                self.fail_with(libc::EINVAL);
            }
            for (target, fd) in launch.stdio.iter().enumerate() {
                // Every source is above 2 (`above_stdio`), so no dup2 overwrites another's
                // source; the copies lose close-on-exec.
                if libc::dup2(fd.as_raw_fd(), target as i32) < 0 {
                    self.fail();
                }
            }
            if libc::chdir(launch.cwd.as_ptr()) < 0 {
                self.fail();
            }
            if libc::setsid() < 0 {
                self.fail();
            }
            // As a sandbox's init, envd is shielded from the OOM killer (the host set -1000
            // where it may). Its children get a raised OOM score, so a memory hog or a fork
            // bomb is what the OOM killer takes even where the host could not shield envd.
            // Raising a score is always allowed; where it fails (envd as a host process
            // without /proc) there is nothing to protect.
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
            if launch.controlling_terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                self.fail();
            }
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) < 0
            {
                self.fail();
            }
            if let Some(credentials) = &launch.credentials {
                // Raw system calls: glibc's wrappers would also switch every thread of the
                // process, and this child shares envd's memory, not its threads. Last
                // before exec: a new uid makes the memory it shares with envd
                // non-dumpable, which `start` undoes once the exec has happened.
                if libc::syscall(
                    libc::SYS_setgroups,
                    credentials.groups.len(),
                    credentials.groups.as_ptr(),
                ) < 0
                {
                    self.fail();
                }
                let gid = credentials.gid;
                if libc::syscall(libc::SYS_setresgid, gid, gid, gid) < 0 {
                    self.fail();
                }
                let uid = credentials.uid;
                if libc::syscall(libc::SYS_setresuid, uid, uid, uid) < 0 {
                    self.fail();
                }
            }
            // As `execvp`: a candidate that is missing is skipped; one that exists but may
            // not be run is remembered and reported if none runs.
            let mut denied = false;
            let mut last = libc::ENOENT;
            for candidate in &launch.candidates {
                libc::execve(candidate.as_ptr(), self.argv, self.envp);
                last = errno();
                if last == libc::EACCES {
                    denied = true;
                } else if !TRY_NEXT.contains(&last) {
                    break;
                }
            }
            self.fail_with(if denied && TRY_NEXT.contains(&last) {
                libc::EACCES
            } else {
                last
            })
        }
    }

    /// Leaves the current errno for the parent and exits.
    fn fail(&self) -> ! {
        self.fail_with(errno())
    }

    fn fail_with(&self, errno: i32) -> ! {
        self.failed.store(errno, Ordering::Release);
        // SAFETY: `_exit` ends the child at once, running nothing of envd's.
        unsafe { libc::_exit(127) }
    }
}

/// The stack a child runs on until its `execve`. One per spawning thread, reused: a
/// child has left it by the time its clone returns, and clones on one thread are one at
/// a time.
#[derive(Debug)]
pub struct ChildStack {
    mapping: *mut c_void,
}

/// The child's steps and the libc calls under them need a few KiB; 256 KiB of address
/// space (pages are touched only as used) leaves ample room.
const STACK_BYTES: usize = 256 * 1024;

/// A page below the stack without access, so an overflow faults instead of writing
/// envd's memory.
const GUARD_BYTES: usize = 4096;

// SAFETY: the mapping is owned by this value alone; moving it to another thread moves
// that ownership.
unsafe impl Send for ChildStack {}

impl ChildStack {
    pub fn new() -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let mapping = unsafe {
            libc::mmap(
                ptr::null_mut(),
                GUARD_BYTES + STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if mapping == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { mapping };
        // SAFETY: the first page of the mapping made above.
        if unsafe { libc::mprotect(mapping, GUARD_BYTES, libc::PROT_NONE) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The stack above the guard page.
    fn usable(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is GUARD_BYTES + STACK_BYTES long, readable and writable
        // above the guard page, and borrowed mutably through `self` alone.
        unsafe {
            std::slice::from_raw_parts_mut(self.mapping.cast::<u8>().add(GUARD_BYTES), STACK_BYTES)
        }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, which nothing uses any more.
        unsafe { libc::munmap(self.mapping, GUARD_BYTES + STACK_BYTES) };
    }
}

/// Blocks every signal on this thread until dropped, then restores the mask.
struct SignalsBlocked {
    previous: libc::sigset_t,
}

impl SignalsBlocked {
    fn new() -> io::Result<Self> {
        // SAFETY: sigset_t is plain data, filled by sigfillset and pthread_sigmask.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            let mut previous: libc::sigset_t = std::mem::zeroed();
            match libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous) {
                0 => Ok(Self { previous }),
                errno => Err(io::Error::from_raw_os_error(errno)),
            }
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, ptr::null_mut()) };
    }
}

fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a NUL byte in the program, an argument, the environment or the working directory",
        )
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect()
}

/// `fd`, or a close-on-exec copy of it above 2 when it is one of 0–2 (possible when envd
/// itself started with a standard descriptor closed).
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one we then own.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `copy` is a fresh descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

fn errno() -> i32 {
    // SAFETY: reads this thread's errno through the pointer glibc hands out.
    unsafe { *libc::__errno_location() }
}

/// Waits for a child that exited without running its program.
fn reap(pid: i32) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        let reaped = unsafe { libc::waitpid(pid, &mut status, 0) };
        if reaped >= 0 || errno() != libc::EINTR {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn spec(program: &str, args: &[&str], path: &str) -> SpawnSpec {
        SpawnSpec {
            program: program.into(),
            args: args.iter().map(|arg| arg.to_string()).collect(),
            env: vec![
                ("PATH".into(), path.into()),
                ("BERTH_TEST".into(), "a b".into()),
            ],
            cwd: "/".into(),
            credentials: None,
            stdin: false,
            pty: None,
        }
    }

    /// Starts `spec` and returns its exit code and stdout.
    fn run(spec: &SpawnSpec) -> io::Result<(i32, String)> {
        let null = || OwnedFd::from(File::open("/dev/null").unwrap());
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let launch = Launch::new(spec, [null(), write, null()])?;
        let pid = launch.start(&mut ChildStack::new().unwrap());
        drop(launch);
        let pid = pid?;
        let mut out = String::new();
        File::from(read).read_to_string(&mut out).unwrap();
        let mut status = 0;
        // SAFETY: waitpid on the child started above with a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        Ok((libc::WEXITSTATUS(status), out))
    }

    fn status_field(status: &str, name: &str) -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        u64::from_str_radix(line[name.len()..].trim(), 16).unwrap()
    }

    #[test]
    fn arguments_environment_and_stdout_reach_the_child() {
        let (code, out) = run(&spec(
            "sh",
            &["-c", "echo \"$0|$BERTH_TEST|$(pwd)\"; exit 4"],
            "/usr/bin:/bin",
        ))
        .unwrap();
        assert_eq!((code, out.as_str()), (4, "sh|a b|/\n"));
    }

    #[test]
    fn the_child_starts_with_no_signal_blocked_or_ignored() {
        // The spawning thread blocks every signal across the clone and the Rust runtime
        // ignores SIGPIPE; neither may reach the program.
        let (_, status) = run(&spec("cat", &["/proc/self/status"], "/usr/bin:/bin")).unwrap();
        assert_eq!(status_field(&status, "SigBlk:"), 0, "{status}");
        let sigpipe = 1 << (libc::SIGPIPE - 1);
        assert_eq!(status_field(&status, "SigIgn:") & sigpipe, 0, "{status}");
    }

    #[test]
    fn the_path_is_searched_like_execvp() {
        let dir = tempfile::tempdir().unwrap();
        let not_runnable = dir.path().join("berth-not-runnable");
        std::fs::write(&not_runnable, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&not_runnable, std::fs::Permissions::from_mode(0o644)).unwrap();
        let dirs = format!(
            "/nonexistent-berth-dir:{}:/usr/bin:/bin",
            dir.path().display()
        );

        assert_eq!(run(&spec("true", &[], &dirs)).unwrap().0, 0);
        let missing = run(&spec("berth-no-such-program", &[], &dirs)).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        // Found but not executable, and nothing runnable after it: EACCES, as execvp.
        let denied = run(&spec("berth-not-runnable", &[], &dirs)).unwrap_err();
        assert_eq!(denied.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn envd_stays_dumpable_after_a_child_switches_identity() {
        // SAFETY: PR_GET_DUMPABLE reads a flag of this process.
        let dumpable = || unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
        assert_eq!(dumpable(), 1, "the test process starts dumpable");
        let mut as_nobody = spec("id", &["-u"], "/usr/bin:/bin");
        as_nobody.credentials = Some(Credentials {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        });
        assert_eq!(run(&as_nobody).unwrap(), (0, "65534\n".to_string()));
        // The child's new uid made the memory it shared with us non-dumpable until its
        // exec; CRIU and /proc need it dumpable again.
        assert_eq!(dumpable(), 1);
    }

    #[test]
    fn a_failed_step_is_the_error_of_that_step() {
        let mut missing_cwd = spec("true", &[], "/usr/bin:/bin");
        missing_cwd.cwd = "/nonexistent-berth-dir".into();
        assert_eq!(
            run(&missing_cwd).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let nul = spec("true", &["a\0b"], "/usr/bin:/bin");
        assert_eq!(run(&nul).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
