//! Template builds: commands run as any user with any environment, and a sandbox's
//! filesystem change turned into a template layer.
//!
//! **Commit** (`LinuxRuntime::commit_upper`) takes a dup of the daemon's reference to
//! the sandbox's disk mount, kills the sandbox (its mount namespace goes and with it
//! the overlay, so nothing writes any more; our reference keeps the ext4 mounted), and
//! copies `upper/` from that detached mount into a host directory:
//!
//! - owners shift from the sandbox's uid/gid range back to 0-based (layers are stored
//!   with the ids the image means; every sandbox idmaps them into its own range);
//! - overlay whiteouts (0/0 char devices) and `user.overlay.opaque` stay, so the
//!   directory is valid as a lower layer of the next overlay; the overlay's own
//!   bookkeeping (`user.overlay.origin`, `impure`, `uuid`) is dropped: it names inodes of
//!   this one overlay;
//! - `user.*` xattrs stay; other xattrs (file capabilities and ACLs, which carry the
//!   sandbox's host ids) are dropped and counted;
//! - hard links stay links, holes stay holes, times are kept; any other device node is
//!   refused (a sandbox cannot make one).
//!
//! The disk is the sandbox's own filesystem and the sandbox ran hostile code, so the
//! copy never follows a symlink of it and reads each file through a descriptor opened
//! with `O_NOFOLLOW`.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{io_err, LinuxRuntime, UID_RANGE_SIZE};
use crate::RuntimeError;

/// What to run inside a sandbox with [`LinuxRuntime::exec_command_as`].
#[derive(Debug, Clone)]
pub struct ExecOptions {
    pub uid: u32,
    pub gid: u32,
    /// Working directory inside the sandbox (must exist).
    pub cwd: String,
    /// The whole environment, `KEY=value`.
    pub env: Vec<String>,
    pub argv: Vec<String>,
}

/// What [`LinuxRuntime::commit_upper`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    pub entries: u64,
    pub bytes: u64,
    pub whiteouts: u64,
    pub dropped_xattrs: u64,
}

const OVERLAY_XATTR_PREFIX: &[u8] = b"user.overlay.";
/// Overlay markers a lower layer needs (opaque dirs, xattr whiteouts).
const KEPT_OVERLAY_XATTRS: [&[u8]; 2] = [b"user.overlay.opaque", b"user.overlay.whiteout"];

impl LinuxRuntime {
    /// A command running `options.argv` inside sandbox `id` (same namespaces, cgroups,
    /// seccomp filter and capabilities as its own processes) with exactly the given
    /// user, working directory and environment. Its stdio is the caller's to set.
    pub fn exec_command_as(
        &self,
        id: &str,
        options: &ExecOptions,
    ) -> Result<std::process::Command, RuntimeError> {
        let sandbox = self.get(id)?;
        let mut cmd = std::process::Command::new(&self.config.launcher_binary);
        std::os::unix::process::CommandExt::arg0(&mut cmd, crate::launch::LAUNCHER_ARGV0);
        cmd.arg("exec")
            .arg("--pid")
            .arg(sandbox.info.init_pid.to_string());
        for dir in self.cgroups.workload_dirs(id) {
            cmd.arg("--cgroup").arg(dir);
        }
        cmd.args(["--uid", &options.uid.to_string()])
            .args(["--gid", &options.gid.to_string()])
            .args(["--cwd", &options.cwd]);
        for var in &options.env {
            cmd.arg("--env").arg(var);
        }
        cmd.arg("--").args(&options.argv);
        cmd.env_clear().env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        Ok(cmd)
    }

    /// First host uid of sandbox `id`'s range (its uid 0).
    pub fn sandbox_uid_base(&self, id: &str) -> Result<u32, RuntimeError> {
        Ok(self.uid_base_of(self.get(id)?.slot))
    }

    /// Kills sandbox `id` (as [`crate::Runtime::kill`]: nothing of it is left) and
    /// copies what it changed in its root filesystem (the overlay upper dir) into `dest`,
    /// an existing empty host directory, as a layer: owners 0-based, whiteouts and
    /// opaque markers kept (see the module docs).
    pub fn commit_upper(&self, id: &str, dest: &Path) -> Result<CommitStats, RuntimeError> {
        let sandbox = self.get(id)?;
        let disk: Option<OwnedFd> = sandbox
            .disk
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|fd| fd.try_clone())
            .transpose()
            .map_err(io_err("dup disk mount"))?;
        let uid_base = self.uid_base_of(sandbox.slot);
        drop(sandbox);
        let killed = crate::Runtime::kill(self, id);
        let Some(disk) = disk else {
            killed?;
            return Err(RuntimeError::DiskDetached(id.to_owned()));
        };
        killed?;
        let upper = PathBuf::from(format!("/proc/self/fd/{}/upper", disk.as_raw_fd()));
        let mut copier = Copier {
            uid_base,
            stats: CommitStats::default(),
            links: HashMap::new(),
            dir_times: Vec::new(),
        };
        copier
            .copy_children(&upper, dest)
            .map_err(io_err("copy the sandbox's changes into a layer"))?;
        for (path, atime, mtime) in copier.dir_times.drain(..).rev() {
            set_times(&path, atime, mtime).map_err(io_err("set directory times"))?;
        }
        drop(disk);
        Ok(copier.stats)
    }
}

/// Seconds and nanoseconds.
type Times = (i64, i64);

struct Copier {
    uid_base: u32,
    stats: CommitStats,
    /// (dev, ino) of multiply-linked files already copied → their copy.
    links: HashMap<(u64, u64), PathBuf>,
    /// Directories whose times are set last (their children change them).
    dir_times: Vec<(PathBuf, Times, Times)>,
}

impl Copier {
    fn copy_children(&mut self, src: &Path, dest: &Path) -> io::Result<()> {
        let mut names: Vec<_> = fs::read_dir(src)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for name in names {
            self.copy_entry(&src.join(&name), &dest.join(&name))?;
        }
        Ok(())
    }

    fn shift(&self, id: u32, path: &Path) -> io::Result<u32> {
        id.checked_sub(self.uid_base)
            .filter(|offset| *offset < UID_RANGE_SIZE)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is owned by host id {id}, outside the sandbox's range",
                        path.display()
                    ),
                )
            })
    }

    fn copy_entry(&mut self, src: &Path, dest: &Path) -> io::Result<()> {
        let meta = fs::symlink_metadata(src)?;
        let file_type = meta.file_type();
        self.stats.entries += 1;
        let (uid, gid) = (self.shift(meta.uid(), src)?, self.shift(meta.gid(), src)?);
        if file_type.is_char_device() && meta.rdev() == 0 {
            mknod(dest, libc::S_IFCHR, 0)?;
            std::os::unix::fs::lchown(dest, Some(uid), Some(gid))?;
            self.stats.whiteouts += 1;
            return Ok(());
        }
        if file_type.is_dir() {
            fs::create_dir(dest)?;
            self.finish(src, dest, &meta, uid, gid)?;
            self.copy_children(src, dest)?;
            self.dir_times
                .push((dest.to_path_buf(), atime(&meta), mtime(&meta)));
            return Ok(());
        }
        if file_type.is_symlink() {
            let target = fs::read_link(src)?;
            std::os::unix::fs::symlink(&target, dest)?;
            std::os::unix::fs::lchown(dest, Some(uid), Some(gid))?;
            self.copy_xattrs(src, dest)?;
            return set_times(dest, atime(&meta), mtime(&meta));
        }
        if file_type.is_file() {
            if meta.nlink() > 1 {
                if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                    return fs::hard_link(first, dest);
                }
                self.links
                    .insert((meta.dev(), meta.ino()), dest.to_path_buf());
            }
            let mut from = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(src)?;
            let mut to = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dest)?;
            self.stats.bytes += copy_sparse(&mut from, &mut to, meta.len())?;
            drop(to);
            self.finish(src, dest, &meta, uid, gid)?;
            return set_times(dest, atime(&meta), mtime(&meta));
        }
        if file_type.is_fifo() {
            mknod(dest, libc::S_IFIFO, 0)?;
            return self.finish(src, dest, &meta, uid, gid);
        }
        if file_type.is_socket() {
            // A listening socket's inode is meaningless without its process.
            self.stats.entries -= 1;
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is a device node, which a sandbox cannot make",
                src.display()
            ),
        ))
    }

    /// Owner, then mode (chown clears set-id bits), then xattrs.
    fn finish(
        &mut self,
        src: &Path,
        dest: &Path,
        meta: &fs::Metadata,
        uid: u32,
        gid: u32,
    ) -> io::Result<()> {
        std::os::unix::fs::lchown(dest, Some(uid), Some(gid))?;
        fs::set_permissions(dest, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        self.copy_xattrs(src, dest)
    }

    fn copy_xattrs(&mut self, src: &Path, dest: &Path) -> io::Result<()> {
        for (name, value) in xattrs(src)? {
            let bytes = name.as_bytes();
            let keep = if bytes.starts_with(OVERLAY_XATTR_PREFIX) {
                KEPT_OVERLAY_XATTRS.contains(&bytes)
            } else {
                bytes.starts_with(b"user.")
            };
            if !keep {
                // Overlay bookkeeping is expected; anything else is worth counting.
                if !bytes.starts_with(OVERLAY_XATTR_PREFIX) {
                    self.stats.dropped_xattrs += 1;
                }
                continue;
            }
            let path = cstr(dest)?;
            // SAFETY: valid NUL-terminated path and name, value buffer of its length.
            let ret = unsafe {
                libc::lsetxattr(
                    path.as_ptr(),
                    name.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            };
            if ret < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn mknod(path: &Path, kind: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let path = cstr(path)?;
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::mknod(path.as_ptr(), kind, dev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Extended attributes of `path` (not following symlinks).
fn xattrs(path: &Path) -> io::Result<Vec<(CString, Vec<u8>)>> {
    let c_path = cstr(path)?;
    let mut names = vec![0u8; 64 * 1024];
    // SAFETY: valid path and a buffer of the given size.
    let len = unsafe { libc::llistxattr(c_path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if len < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENOTSUP) => Ok(Vec::new()),
            _ => Err(err),
        };
    }
    let mut out = Vec::new();
    for name in names[..len as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
    {
        let name = CString::new(name).expect("xattr names have no NUL");
        let mut value = vec![0u8; 64 * 1024];
        // SAFETY: valid path, name and buffer.
        let n = unsafe {
            libc::lgetxattr(
                c_path.as_ptr(),
                name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        value.truncate(n as usize);
        out.push((name, value));
    }
    Ok(out)
}

fn atime(meta: &fs::Metadata) -> Times {
    (meta.atime(), meta.atime_nsec())
}

fn mtime(meta: &fs::Metadata) -> Times {
    (meta.mtime(), meta.mtime_nsec())
}

fn set_times(path: &Path, atime: Times, mtime: Times) -> io::Result<()> {
    let path = cstr(path)?;
    let times = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    let ret = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Copies the data ranges of `from` (SEEK_DATA/SEEK_HOLE), leaving holes as holes.
fn copy_sparse(from: &mut fs::File, to: &mut fs::File, len: u64) -> io::Result<u64> {
    let fd = from.as_raw_fd();
    let mut offset: i64 = 0;
    let mut copied = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    while (offset as u64) < len {
        // SAFETY: lseek on our own open fd.
        let data = unsafe { libc::lseek(fd, offset, libc::SEEK_DATA) };
        if data < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        from.seek(SeekFrom::Start(data as u64))?;
        to.seek(SeekFrom::Start(data as u64))?;
        let mut remaining = (hole - data) as u64;
        while remaining > 0 {
            let want = remaining.min(buf.len() as u64) as usize;
            let n = from.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            to.write_all(&buf[..n])?;
            remaining -= n as u64;
            copied += n as u64;
        }
        offset = hole;
    }
    to.set_len(len)?;
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_copies_keep_holes_and_bytes() {
        let dir = std::env::temp_dir().join(format!("berth-commit-sparse-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let src = dir.join("src");
        let mut f = fs::File::create(&src).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start(8 << 20)).unwrap();
        f.write_all(b"tail").unwrap();
        drop(f);
        let dst = dir.join("dst");
        let mut from = fs::File::open(&src).unwrap();
        let mut to = fs::File::create(&dst).unwrap();
        copy_sparse(&mut from, &mut to, fs::metadata(&src).unwrap().len()).unwrap();
        assert_eq!(fs::read(&src).unwrap(), fs::read(&dst).unwrap());
        assert!(fs::metadata(&dst).unwrap().blocks() * 512 < 1 << 20);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kept_overlay_xattrs_are_the_lower_layer_markers() {
        assert!(KEPT_OVERLAY_XATTRS.contains(&&b"user.overlay.opaque"[..]));
        assert!(!KEPT_OVERLAY_XATTRS.contains(&&b"user.overlay.origin"[..]));
    }
}
