//! The seccomp filter applied to every sandbox process (x86_64).
//!
//! A deny list covering everything Docker's default profile refuses (kernel modules,
//! kexec, mount API, namespace creation and joining, keyrings, bpf, perf, clock setting,
//! handle-based opens, userfaultfd, io_uring, swap, reboot, NUMA policy, ptrace-like memory
//! access of other processes), plus a few more (TIOCSTI, vsock, the newest mount
//! syscalls, ptrace of PID 1). Foreign architectures and the x32 ABI are refused outright. Namespaced
//! root keeps what `sudo` needs (setuid family, capabilities within the bounding set).

use std::io;

// Offsets into `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARG0_LOW: u32 = 16;
const DATA_ARG1_LOW: u32 = 24;

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_JSET_K: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;

const CLONE_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;
const TIOCSTI: u32 = 0x5412;
const AF_VSOCK: u32 = 40;
/// personality(2) values Docker allows: PER_LINUX, PER_LINUX32, UNAME26 variants, query.
const ALLOWED_PERSONALITIES: [u32; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

// Syscalls newer than some libc releases know about (x86_64 numbers).
const SYS_CREATE_MODULE: i64 = 174;
const SYS_GET_KERNEL_SYMS: i64 = 177;
const SYS_QUERY_MODULE: i64 = 178;
const SYS_MEMFD_SECRET: i64 = 447;
const SYS_PROCESS_MRELEASE: i64 = 448;
const SYS_STATMOUNT: i64 = 457;
const SYS_LSM_SET_SELF_ATTR: i64 = 460;
const SYS_LISTMOUNT: i64 = 458;
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// Syscalls refused with EPERM.
#[cfg(target_arch = "x86_64")]
const DENIED: &[i64] = &[
    libc::SYS_acct,
    libc::SYS_add_key,
    libc::SYS_bpf,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    SYS_CREATE_MODULE,
    libc::SYS_delete_module,
    libc::SYS_finit_module,
    SYS_GET_KERNEL_SYMS,
    libc::SYS_get_mempolicy,
    libc::SYS_init_module,
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_kcmp,
    libc::SYS_kexec_file_load,
    libc::SYS_kexec_load,
    libc::SYS_keyctl,
    libc::SYS_lookup_dcookie,
    libc::SYS_mbind,
    libc::SYS_modify_ldt,
    libc::SYS_mount,
    libc::SYS_move_pages,
    libc::SYS_name_to_handle_at,
    libc::SYS_nfsservctl,
    libc::SYS_open_by_handle_at,
    libc::SYS_perf_event_open,
    libc::SYS_pivot_root,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    SYS_QUERY_MODULE,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_reboot,
    libc::SYS_request_key,
    libc::SYS_set_mempolicy,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_setns,
    libc::SYS_settimeofday,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_sysfs,
    libc::SYS__sysctl,
    libc::SYS_syslog,
    libc::SYS_umount2,
    libc::SYS_unshare,
    libc::SYS_uselib,
    libc::SYS_userfaultfd,
    libc::SYS_ustat,
    libc::SYS_vhangup,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_fanotify_init,
    libc::SYS_pidfd_getfd,
    libc::SYS_afs_syscall,
    libc::SYS_tuxcall,
    libc::SYS_security,
    libc::SYS_vserver,
    libc::SYS_getpmsg,
    libc::SYS_putpmsg,
    SYS_MEMFD_SECRET,
    SYS_PROCESS_MRELEASE,
    SYS_STATMOUNT,
    SYS_LISTMOUNT,
    SYS_LSM_SET_SELF_ATTR,
    SYS_OPEN_TREE_ATTR,
];

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn errno(e: i32) -> u32 {
    SECCOMP_RET_ERRNO | (e as u32 & 0xffff)
}

/// Builds the BPF program.
#[cfg(target_arch = "x86_64")]
pub(crate) fn build_filter() -> io::Result<Vec<libc::sock_filter>> {
    let mut prog = vec![
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, DATA_NR),
        jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, errno(libc::EPERM)),
    ];
    for &nr in DENIED {
        prog.push(jump(BPF_JEQ_K, nr as u32, 0, 1));
        prog.push(stmt(BPF_RET_K, errno(libc::EPERM)));
    }
    // clone3 passes flags in memory the filter cannot read: ENOSYS makes libc use clone.
    prog.push(jump(BPF_JEQ_K, libc::SYS_clone3 as u32, 0, 1));
    prog.push(stmt(BPF_RET_K, errno(libc::ENOSYS)));
    // clone(flags, ...): refuse new namespaces.
    prog.extend([
        jump(BPF_JEQ_K, libc::SYS_clone as u32, 0, 3),
        stmt(BPF_LD_W_ABS, DATA_ARG0_LOW),
        jump(BPF_JSET_K, CLONE_NAMESPACE_FLAGS, 0, 1),
        stmt(BPF_RET_K, errno(libc::EPERM)),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ]);
    // ioctl(fd, TIOCSTI): no typing into another process's terminal.
    prog.extend([
        jump(BPF_JEQ_K, libc::SYS_ioctl as u32, 0, 3),
        stmt(BPF_LD_W_ABS, DATA_ARG1_LOW),
        jump(BPF_JEQ_K, TIOCSTI, 0, 1),
        stmt(BPF_RET_K, errno(libc::EPERM)),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ]);
    // ptrace(request, 1, ...): nothing inside attaches to, stops or pokes envd (PID 1;
    // no process inside can make a pid namespace of its own, so 1 is always envd).
    // Tracing any other process of the sandbox works as usual.
    prog.extend([
        jump(BPF_JEQ_K, libc::SYS_ptrace as u32, 0, 3),
        stmt(BPF_LD_W_ABS, DATA_ARG1_LOW),
        jump(BPF_JEQ_K, 1, 0, 1),
        stmt(BPF_RET_K, errno(libc::EPERM)),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ]);
    // socket(AF_VSOCK, ...): no channel to the hypervisor host.
    prog.extend([
        jump(BPF_JEQ_K, libc::SYS_socket as u32, 0, 3),
        stmt(BPF_LD_W_ABS, DATA_ARG0_LOW),
        jump(BPF_JEQ_K, AF_VSOCK, 0, 1),
        stmt(BPF_RET_K, errno(libc::EAFNOSUPPORT)),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ]);
    // personality(persona): only the values Docker allows.
    let n = ALLOWED_PERSONALITIES.len() as u8;
    prog.push(jump(BPF_JEQ_K, libc::SYS_personality as u32, 0, n + 2));
    prog.push(stmt(BPF_LD_W_ABS, DATA_ARG0_LOW));
    for (i, &p) in ALLOWED_PERSONALITIES.iter().enumerate() {
        // On a match jump over the remaining compares and the EPERM to the ALLOW below.
        prog.push(jump(BPF_JEQ_K, p, n - i as u8, 0));
    }
    prog.push(stmt(BPF_RET_K, errno(libc::EPERM)));
    prog.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    Ok(prog)
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn build_filter() -> io::Result<Vec<libc::sock_filter>> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "the sandbox seccomp filter is only defined for x86_64",
    ))
}

/// Installs the filter on the calling thread. Deliberately without NO_NEW_PRIVS so that
/// setuid `sudo` keeps working; this needs CAP_SYS_ADMIN in the sandbox's user namespace.
pub(crate) fn install(prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: fprog points at a valid program that outlives the call.
    crate::sys::check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &fprog,
        )
    })?;
    Ok(())
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn every_jump_stays_inside_the_program() {
        let prog = build_filter().unwrap();
        for (i, ins) in prog.iter().enumerate() {
            if ins.code & 0x07 == 0x05 {
                assert!(
                    i + 1 + (ins.jt as usize) < prog.len(),
                    "jt out of range at {i}"
                );
                assert!(
                    i + 1 + (ins.jf as usize) < prog.len(),
                    "jf out of range at {i}"
                );
            }
        }
        assert_eq!(prog.last().unwrap().k, SECCOMP_RET_ALLOW);
        assert!(prog.len() < 4096);
    }
}
