//! Thin wrappers over the Linux syscalls the runtime needs that libc/nix do not wrap
//! (new mount API, pidfds, clone3, close_range). Each returns `io::Result`.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Converts a raw syscall return value into `io::Result`.
pub(crate) fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn owned(ret: libc::c_long) -> io::Result<OwnedFd> {
    let fd = check(ret)? as RawFd;
    // SAFETY: the kernel just returned this fd to us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `struct mount_attr` from <linux/mount.h>.
#[repr(C)]
#[derive(Default)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
pub(crate) const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_SET_FD: libc::c_uint = 5;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;

/// `open_tree(dirfd, path, OPEN_TREE_CLONE | flags)`: a detached copy of a mount tree.
pub(crate) fn open_tree_clone(
    dirfd: RawFd,
    path: &CStr,
    extra_flags: libc::c_uint,
) -> io::Result<OwnedFd> {
    // SAFETY: path is a valid NUL-terminated string; the kernel only reads it.
    owned(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dirfd,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | extra_flags,
        )
    })
}

/// Makes a detached mount idmapped through the mapping of user namespace `userns`.
pub(crate) fn mount_setattr_idmap(mount: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        userns_fd: userns.as_raw_fd() as u64,
        ..Default::default()
    };
    mount_setattr(mount.as_raw_fd(), c"", libc::AT_EMPTY_PATH as u32, &attr)
}

/// Sets or clears mount attributes (`MOUNT_ATTR_*`) on `path`, recursively.
pub(crate) fn mount_setattr_flags(path: &CStr, set: u64, clear: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        ..Default::default()
    };
    mount_setattr(libc::AT_FDCWD, path, libc::AT_RECURSIVE as u32, &attr)
}

/// Sets or clears mount attributes (`MOUNT_ATTR_*`) on the detached mount `mount`.
pub(crate) fn mount_setattr_detached(
    mount: BorrowedFd<'_>,
    set: u64,
    clear: u64,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        ..Default::default()
    };
    mount_setattr(mount.as_raw_fd(), c"", libc::AT_EMPTY_PATH as u32, &attr)
}

fn mount_setattr(dirfd: RawFd, path: &CStr, flags: u32, attr: &MountAttr) -> io::Result<()> {
    // SAFETY: all pointers are valid for the call; the size matches the struct.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// Attaches the detached mount `mount` at `target`.
pub(crate) fn move_mount_to(mount: BorrowedFd<'_>, target: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and NUL-terminated strings.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Attaches the detached mount `mount` on the directory `target` refers to.
pub(crate) fn move_mount_onto(mount: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid fds and empty NUL-terminated paths.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// An `O_PATH` descriptor of directory `name` in `dir` (no symlink followed).
pub(crate) fn open_dir_path(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: valid dirfd and NUL-terminated name.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    } as libc::c_long)
}

/// `fchdir(dir)`.
pub(crate) fn fchdir(dir: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::fchdir(dir.as_raw_fd()) }.into())?;
    Ok(())
}

/// A filesystem context being configured through `fsopen`/`fsconfig`.
pub(crate) struct FsContext(OwnedFd);

impl FsContext {
    pub(crate) fn open(fstype: &CStr) -> io::Result<Self> {
        // SAFETY: fstype is a valid NUL-terminated string.
        owned(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) }).map(Self)
    }

    fn config(
        &self,
        cmd: libc::c_uint,
        key: Option<&CStr>,
        value: *const libc::c_void,
        aux: libc::c_int,
    ) -> io::Result<()> {
        let key_ptr = key.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: pointers are null or valid NUL-terminated strings for the call.
        check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                cmd,
                key_ptr,
                value,
                aux,
            )
        })?;
        Ok(())
    }

    pub(crate) fn set_flag(&self, key: &CStr) -> io::Result<()> {
        self.config(FSCONFIG_SET_FLAG, Some(key), std::ptr::null(), 0)
    }

    pub(crate) fn set_string(&self, key: &CStr, value: &CStr) -> io::Result<()> {
        self.config(FSCONFIG_SET_STRING, Some(key), value.as_ptr().cast(), 0)
    }

    /// A parameter given as a descriptor (overlayfs layers: no path, so none is shown).
    pub(crate) fn set_fd(&self, key: &CStr, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.config(FSCONFIG_SET_FD, Some(key), std::ptr::null(), fd.as_raw_fd())
    }

    /// Creates the superblock and returns a detached mount of it.
    pub(crate) fn create_mount(&self, attr_flags: u64) -> io::Result<OwnedFd> {
        self.config(FSCONFIG_CMD_CREATE, None, std::ptr::null(), 0)?;
        // SAFETY: plain integer arguments.
        owned(unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                self.0.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                attr_flags,
            )
        })
    }
}

/// `pidfd_open(pid, 0)`.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: plain integer arguments.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`.
pub(crate) fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: valid fd, null siginfo is allowed.
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

/// Waits up to `timeout_ms` for the process behind `pidfd` to exit; true if it has.
pub(crate) fn pidfd_wait_exit(pidfd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: pfd is a valid pollfd array of length 1.
        let ret = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(ret > 0);
    }
}

/// Reaps the (exited) child behind `pidfd`; ECHILD means it is not our child.
pub(crate) fn pidfd_reap(pidfd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: siginfo is plain data, zeroed is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a siginfo_t.
    let ret = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::__WALL,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `close_range(first, u32::MAX, flags)`.
pub(crate) fn close_range_from(first: u32, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    check(unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, flags) })?;
    Ok(())
}

/// `setns(fd, nstype)`.
pub(crate) fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: valid fd.
    if unsafe { libc::setns(fd.as_raw_fd(), nstype) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Converts a path to a C string, rejecting interior NULs.
pub(crate) fn cpath(path: &std::path::Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Flushes the filesystem of `mount` (a directory fd, or a detached mount) to its device.
pub(crate) fn syncfs_mount(mount: BorrowedFd<'_>) -> io::Result<()> {
    // Mount fds from fsmount/open_tree are O_PATH, which syncfs refuses: open the root.
    // SAFETY: openat with a valid dirfd and a NUL-terminated path.
    let root = owned(unsafe {
        libc::openat(
            mount.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    } as libc::c_long)?;
    // SAFETY: syncfs on an fd we own.
    check(unsafe { libc::syncfs(root.as_raw_fd()) } as libc::c_long)?;
    Ok(())
}
