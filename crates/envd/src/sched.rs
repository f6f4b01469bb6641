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
//! (cheap: three system calls). On kernels without custom slices (before 6.12) the
//! request changes nothing.

use std::io;

/// EEVDF's shortest custom slice: the kernel clamps requests to 0.1–100 ms.
const SHORT_SLICE_NS: u64 = 100_000;

/// `SCHED_FLAG_RESET_ON_FORK` of `sched_setattr(2)`.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// `struct sched_attr` as of its first version (`SCHED_ATTR_SIZE_VER0`, 48 bytes).
#[repr(C)]
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

/// Gives the calling thread the shortest slice, keeping its policy and nice value, with
/// reset-on-fork.
pub fn request_short_slice() -> io::Result<()> {
    // SAFETY: clearing errno through glibc's pointer, then getpriority(2) of the calling
    // thread (who 0); -1 is a valid nice value, so errno tells an error from it.
    let nice = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    if nice == -1 && io::Error::last_os_error().raw_os_error() != Some(0) {
        return Err(io::Error::last_os_error());
    }
    // The thread's own policy, named (`SCHED_FLAG_KEEP_POLICY` would also keep its
    // reset-on-fork setting, ignoring ours); sched_getscheduler adds its reset-on-fork
    // bit to the policy.
    // SAFETY: sched_getscheduler(2) of the calling thread (pid 0).
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(io::Error::last_os_error());
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: (policy & !libc::SCHED_RESET_ON_FORK) as u32,
        sched_flags: SCHED_FLAG_RESET_ON_FORK,
        sched_nice: nice,
        sched_priority: 0,
        sched_runtime: SHORT_SLICE_NS,
        sched_deadline: 0,
        sched_period: 0,
    };
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

    /// `sched_getattr(2)` of thread `tid`: (flags, runtime), runtime being the slice
    /// for the normal policy.
    fn sched_attr_of(tid: i32) -> (u64, u64) {
        let mut attr = SchedAttr {
            size: 0,
            sched_policy: 0,
            sched_flags: 0,
            sched_nice: 0,
            sched_priority: 0,
            sched_runtime: 0,
            sched_deadline: 0,
            sched_period: 0,
        };
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
        assert_eq!(done, 0, "{}", io::Error::last_os_error());
        (attr.sched_flags, attr.sched_runtime)
    }

    #[test]
    fn a_thread_gets_the_short_slice_and_its_children_do_not() {
        std::thread::spawn(|| {
            // SAFETY: gettid(2) of the calling thread.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
            let (_, default_slice) = sched_attr_of(tid);
            if default_slice == 0 {
                // Before 6.6 there is no slice to read, before 6.12 none to choose.
                eprintln!("skipped: this kernel has no custom scheduler slices");
                return;
            }
            request_short_slice().unwrap();
            let (flags, slice) = sched_attr_of(tid);
            assert_eq!(flags & SCHED_FLAG_RESET_ON_FORK, SCHED_FLAG_RESET_ON_FORK);
            assert_eq!(slice, SHORT_SLICE_NS, "a kernel with custom slices (6.12+)");
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
