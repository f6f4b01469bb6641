//! A short scheduler time slice for envd's threads that wake for a moment and sleep
//! again, so a wakeup runs at once instead of after the sandbox's busy task.
//!
//! envd's threads share the sandbox's CPU cgroup with the commands they start. Under
//! EEVDF a task that wakes there runs when its deadline comes first, and a command that
//! has just started (with the default slice, 1.4 ms on this 2-CPU host) usually keeps
//! the CPU until its own slice is used: the spawner, woken on that CPU by its child's
//! `execve`, then waited out a login shell's whole start-up (1.6–2.2 ms per command)
//! before it could announce the process, while the other CPU was idle. A thread with a
//! short slice has an early deadline when it wakes and runs first (0.12–0.16 ms from
//! clone to the spawner's return, measured). This takes no CPU share from anyone: the
//! slice is how long a turn lasts, not how many turns come.
//!
//! Children must not inherit it (a workload with 0.1 ms turns would switch ten times as
//! often), so the request also sets reset-on-fork: a child of such a thread starts with
//! the default slice (and, were envd's policy or nice value raised, the default ones).
//! The thread keeps its policy and nice value. CRIU restores a thread's policy and nice
//! value but not its slice, so callers ask again where they may have been restored
//! (one system call when nothing changed). On kernels without custom slices (before
//! 6.12) the request changes nothing.

use std::io;

/// EEVDF's shortest custom slice: the kernel clamps requests to 0.1–100 ms.
const SHORT_SLICE_NS: u64 = 100_000;

/// `SCHED_FLAG_RESET_ON_FORK` of `sched_setattr(2)`.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// `struct sched_attr` as of its first version (`SCHED_ATTR_SIZE_VER0`, 48 bytes).
#[repr(C)]
#[derive(Debug, Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// `sched_getattr(2)` of thread `tid` (0: the calling thread). For the normal policies
/// `sched_runtime` is the thread's slice.
fn attr_of(tid: i32) -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: sched_getattr(2) fills at most `size` bytes of the struct we own.
    let done = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            std::mem::size_of::<SchedAttr>() as u32,
            0,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// Gives the calling thread the shortest slice, keeping its policy, priority and nice
/// value, with reset-on-fork. Makes no change when the thread has them already.
pub fn request_short_slice() -> io::Result<()> {
    let mut attr = attr_of(0)?;
    if attr.sched_runtime == SHORT_SLICE_NS && attr.sched_flags & SCHED_FLAG_RESET_ON_FORK != 0 {
        return Ok(());
    }
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    attr.sched_flags = SCHED_FLAG_RESET_ON_FORK;
    attr.sched_runtime = SHORT_SLICE_NS;
    // SAFETY: sched_setattr(2) on the calling thread (pid 0) reads a fully initialised
    // attribute struct whose `size` names its length.
    let done = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_gets_the_short_slice_and_its_children_do_not() {
        std::thread::spawn(|| {
            let default_slice = attr_of(0).unwrap().sched_runtime;
            if default_slice == 0 {
                // Before 6.6 there is no slice to read, before 6.12 none to choose.
                eprintln!("skipped: this kernel has no custom scheduler slices");
                return;
            }
            request_short_slice().unwrap();
            let attr = attr_of(0).unwrap();
            assert_eq!(
                attr.sched_flags & SCHED_FLAG_RESET_ON_FORK,
                SCHED_FLAG_RESET_ON_FORK
            );
            assert_eq!(
                attr.sched_runtime, SHORT_SLICE_NS,
                "a kernel with custom slices (6.12+)"
            );
            // Asking again (after a restore, say) is allowed and changes nothing.
            request_short_slice().unwrap();
            let child = std::process::Command::new("grep")
                .args(["^se.slice", "/proc/self/sched"])
                .output()
                .unwrap();
            let line = String::from_utf8(child.stdout).unwrap();
            let child_slice: u64 = line.rsplit(':').next().unwrap().trim().parse().unwrap();
            assert_eq!(child_slice, default_slice, "{line}");
        })
        .join()
        .unwrap();
    }
}
