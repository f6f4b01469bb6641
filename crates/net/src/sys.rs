//! The raw system interfaces this crate uses, each behind a safe function: libnftables,
//! netlink sockets, namespace and mount syscalls.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// `struct nft_ctx` of libnftables (opaque).
#[repr(C)]
struct NftCtxRaw {
    _private: [u8; 0],
}

#[link(name = "nftables")]
extern "C" {
    fn nft_ctx_new(flags: u32) -> *mut NftCtxRaw;
    fn nft_ctx_free(ctx: *mut NftCtxRaw);
    fn nft_ctx_buffer_output(ctx: *mut NftCtxRaw) -> libc::c_int;
    fn nft_ctx_buffer_error(ctx: *mut NftCtxRaw) -> libc::c_int;
    fn nft_ctx_get_output_buffer(ctx: *mut NftCtxRaw) -> *const libc::c_char;
    fn nft_ctx_get_error_buffer(ctx: *mut NftCtxRaw) -> *const libc::c_char;
    fn nft_run_cmd_from_buffer(ctx: *mut NftCtxRaw, buf: *const libc::c_char) -> libc::c_int;
}

/// A libnftables context. Every [`Nft::run`] is one netlink transaction: the kernel
/// applies all of a buffer's commands or none.
pub(crate) struct Nft {
    ctx: *mut NftCtxRaw,
}

// SAFETY: an nft_ctx is plain heap state of libnftables with no thread affinity; `run`
// takes `&mut self`, so it is never used from two threads at once.
unsafe impl Send for Nft {}

impl Nft {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: nft_ctx_new(NFT_CTX_DEFAULT = 0) returns a new context or NULL.
        let ctx = unsafe { nft_ctx_new(0) };
        if ctx.is_null() {
            return Err(io::Error::other("nft_ctx_new failed"));
        }
        // SAFETY: ctx is a valid context; these only switch output to internal buffers.
        unsafe {
            nft_ctx_buffer_output(ctx);
            nft_ctx_buffer_error(ctx);
        }
        Ok(Self { ctx })
    }

    /// Runs `commands` (nft syntax) as one transaction; Ok(stdout) or Err(stderr).
    pub(crate) fn run(&mut self, commands: &str) -> Result<String, String> {
        let buf = CString::new(commands).map_err(|_| "commands hold a NUL byte".to_owned())?;
        // SAFETY: ctx is valid and buf a NUL-terminated string that outlives the call.
        let ret = unsafe { nft_run_cmd_from_buffer(self.ctx, buf.as_ptr()) };
        // SAFETY: the buffers are owned by ctx and valid until the next run or free; they
        // are copied out at once.
        let (out, err) = unsafe {
            (
                text(nft_ctx_get_output_buffer(self.ctx)),
                text(nft_ctx_get_error_buffer(self.ctx)),
            )
        };
        if ret == 0 {
            Ok(out)
        } else {
            Err(err)
        }
    }
}

/// # Safety
/// `ptr` is NULL or a NUL-terminated string.
unsafe fn text(ptr: *const libc::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: see the function contract.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

impl Drop for Nft {
    fn drop(&mut self) {
        // SAFETY: ctx came from nft_ctx_new and is freed once.
        unsafe { nft_ctx_free(self.ctx) }
    }
}

/// A netlink socket of `protocol` (NETLINK_ROUTE, NETLINK_NETFILTER), in the calling
/// thread's network namespace.
pub(crate) fn netlink_socket(protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let fd = check(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    })?;
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; zeroed is a valid (kernel-assigned port) address.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: valid socket and address of the given size.
    check(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    })?;
    let timeout = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    // SAFETY: valid socket and option buffer; a reply that never comes fails the call
    // instead of hanging the daemon.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    let on: libc::c_int = 1;
    // SAFETY: valid socket and option buffer. Extended acks carry the kernel's reason.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            libc::NETLINK_EXT_ACK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    Ok(fd)
}

pub(crate) fn send(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()> {
    // SAFETY: valid socket and buffer.
    let n = unsafe { libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid socket and writable buffer of the given length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Moves the calling thread into a new network namespace (owned by the caller's user
/// namespace: the host's, for the daemon).
pub(crate) fn unshare_net() -> io::Result<()> {
    // SAFETY: unshare(2) with a flag; affects only the calling thread.
    check(unsafe { libc::unshare(libc::CLONE_NEWNET) }).map(drop)
}

/// Bind-mounts `source` onto the existing file `target`.
pub(crate) fn bind_mount(source: &Path, target: &Path) -> io::Result<()> {
    let (source, target) = (cpath(source)?, cpath(target)?);
    // SAFETY: mount(2) with valid NUL-terminated paths.
    check(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    })
    .map(drop)
}

/// Detaches the mount at `target`; Ok when nothing is mounted there.
pub(crate) fn unmount(target: &Path) -> io::Result<()> {
    let target = cpath(target)?;
    // SAFETY: umount2(2) with a valid NUL-terminated path.
    match check(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => Ok(()),
        other => other.map(drop),
    }
}

/// While alive, the calling thread runs under `SCHED_IDLE`: it gets a CPU only when
/// nothing else of normal priority wants one. For background work nobody waits on,
/// which must not hold a lock the foreground needs meanwhile (no priority inheritance
/// would lift it), nor start a thread (which would inherit the policy). Dropping it
/// restores the thread's earlier policy.
pub(crate) struct IdlePriority {
    earlier: Option<(libc::c_int, libc::sched_param)>,
}

impl IdlePriority {
    /// Lowers the calling thread; a thread whose policy cannot be changed stays as it was.
    pub(crate) fn enter() -> Self {
        // On Linux, pid 0 names the calling thread alone.
        // SAFETY: sched_getscheduler(0) reads the calling thread's policy.
        let policy = unsafe { libc::sched_getscheduler(0) };
        let mut param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_getparam(0) writes the calling thread's param into ours.
        if policy < 0 || unsafe { libc::sched_getparam(0, &mut param) } < 0 {
            return Self { earlier: None };
        }
        let idle = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler(2) on the calling thread with a valid param.
        let lowered = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) } == 0;
        Self {
            earlier: lowered.then_some((policy, param)),
        }
    }
}

impl Drop for IdlePriority {
    fn drop(&mut self) {
        if let Some((policy, param)) = self.earlier {
            // SAFETY: as in `enter`, restoring what sched_getscheduler/getparam read.
            if unsafe { libc::sched_setscheduler(0, policy, &param) } < 0 {
                let err = io::Error::last_os_error();
                tracing::warn!(%err, "restoring a thread's scheduling policy");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::IdlePriority;

    fn policy() -> libc::c_int {
        // SAFETY: reads the calling thread's policy.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn idle_priority_lowers_only_its_thread_and_only_while_alive() {
        // In threads of their own: the harness's threads keep their policy.
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel();
        let bystander = std::thread::spawn(move || {
            for () in asked {
                tell.send(policy()).unwrap();
            }
        });
        std::thread::spawn(move || {
            assert_eq!(policy(), libc::SCHED_OTHER);
            let idle = IdlePriority::enter();
            assert_eq!(policy(), libc::SCHED_IDLE);
            ask.send(()).unwrap();
            assert_eq!(told.recv().unwrap(), libc::SCHED_OTHER, "another thread");
            drop(idle);
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
        bystander.join().unwrap();
    }
}
