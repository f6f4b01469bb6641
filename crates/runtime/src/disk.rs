//! Per-sandbox disk: a sparse ext4 image on a loop device holding the overlay upper and
//! work directories, so a full disk is a real ENOSPC inside the sandbox and host disk use
//! can never exceed the sandbox's `disk_size_mb`.
//!
//! Formatting is done once per size: `disk-templates/ext4-<MB>M.img` is made with
//! `mkfs.ext4` on first need (no journal, no reserved blocks, lazy inode tables), and each
//! sandbox gets a sparse copy of it (only the few hundred KiB of metadata are copied).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::sys::{check, cpath};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `struct loop_info64` from <linux/loop.h>.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` from <linux/loop.h>.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

pub(crate) struct DiskStore {
    templates_dir: PathBuf,
    format_lock: Mutex<()>,
}

impl DiskStore {
    pub(crate) fn new(templates_dir: PathBuf) -> io::Result<Self> {
        fs::create_dir_all(&templates_dir)?;
        Ok(Self {
            templates_dir,
            format_lock: Mutex::new(()),
        })
    }

    /// The pre-formatted image for `size_mb`, formatting it on first need.
    fn template_image(&self, size_mb: u64) -> io::Result<PathBuf> {
        let image = self.templates_dir.join(format!("ext4-{size_mb}M.img"));
        if image.exists() {
            return Ok(image);
        }
        let _guard = self.format_lock.lock().unwrap_or_else(|e| e.into_inner());
        if image.exists() {
            return Ok(image);
        }
        let tmp = self.templates_dir.join(format!(".ext4-{size_mb}M.img.tmp"));
        File::create(&tmp)?.set_len(size_mb * 1024 * 1024)?;
        let output = Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-b",
                "4096",
                "-m",
                "0",
                "-O",
                "^has_journal,^resize_inode",
            ])
            .args(["-E", "lazy_itable_init=1,nodiscard"])
            .arg(&tmp)
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("running mkfs.ext4: {e}")))?;
        if !output.status.success() {
            let _ = fs::remove_file(&tmp);
            return Err(io::Error::other(format!(
                "mkfs.ext4 failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, &image)?;
        Ok(image)
    }

    /// Creates `image` (a sparse copy of the template for `size_mb`), attaches it to a
    /// loop device and mounts it at `mountpoint`, then makes `upper` and `work` in it owned
    /// by `owner` (the sandbox's root on the host).
    pub(crate) fn create(
        &self,
        size_mb: u64,
        image: &Path,
        mountpoint: &Path,
        owner: u32,
    ) -> io::Result<()> {
        let template = self.template_image(size_mb)?;
        copy_sparse(&template, image)?;
        fs::create_dir_all(mountpoint)?;
        mount_image(image, mountpoint)?;
        for dir in ["upper", "work"] {
            let path = mountpoint.join(dir);
            fs::create_dir(&path)?;
            std::os::unix::fs::chown(&path, Some(owner), Some(owner))?;
        }
        Ok(())
    }
}

/// Unmounts the disk at `mountpoint` (lazily: the dying sandbox's mount namespace may
/// still pin it for a moment); the loop device detaches itself (autoclear) once the last
/// reference goes. Ok if nothing is mounted there.
pub(crate) fn unmount(mountpoint: &Path) -> io::Result<()> {
    let c = cpath(mountpoint)?;
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } < 0 {
        let err = io::Error::last_os_error();
        if !matches!(err.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) {
            return Err(err);
        }
    }
    Ok(())
}

/// (used, total) bytes of the filesystem mounted at `mountpoint`.
pub(crate) fn usage(mountpoint: &Path) -> io::Result<(u64, u64)> {
    let c = cpath(mountpoint)?;
    // SAFETY: statvfs is plain data; zeroed is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let block = st.f_frsize;
    Ok(((st.f_blocks - st.f_bfree) * block, st.f_blocks * block))
}

/// Copies only the data extents of `src` into a new file `dst` of the same length.
fn copy_sparse(src: &Path, dst: &Path) -> io::Result<()> {
    let input = File::open(src)?;
    let output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)?;
    let len = input.metadata()?.len();
    output.set_len(len)?;
    let mut offset: i64 = 0;
    while (offset as u64) < len {
        // SAFETY: plain lseek on an fd we own.
        let data = unsafe { libc::lseek(input.as_raw_fd(), offset, libc::SEEK_DATA) };
        if data < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(err);
        }
        // SAFETY: as above.
        let hole = check(
            unsafe { libc::lseek(input.as_raw_fd(), data, libc::SEEK_HOLE) } as libc::c_long,
        )?;
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            // SAFETY: valid fds and offset pointers.
            let n = check(unsafe {
                libc::copy_file_range(
                    input.as_raw_fd(),
                    &mut off_in,
                    output.as_raw_fd(),
                    &mut off_out,
                    (hole - off_in) as usize,
                    0,
                )
            } as libc::c_long)?;
            if n == 0 {
                break;
            }
        }
        offset = hole;
    }
    Ok(())
}

/// Binds `image` to a free loop device (autoclear, direct I/O) and mounts it as ext4.
fn mount_image(image: &Path, mountpoint: &Path) -> io::Result<()> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(image)?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/loop-control")?;
    // Two creators can be handed the same free device; the loser gets EBUSY and retries.
    for _ in 0..64 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument.
        let number =
            check(unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) } as libc::c_long)?;
        let device_path = format!("/dev/loop{number}");
        let device = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&device_path)
        {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // SAFETY: all-zero is a valid loop_config.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = backing.as_raw_fd() as u32;
        config.block_size = 4096;
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        // SAFETY: config is a valid loop_config for the duration of the call.
        if unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_CONFIGURE,
                &config as *const LoopConfig,
            )
        } < 0
        {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EBUSY) {
                continue;
            }
            return Err(io::Error::new(
                err.kind(),
                format!("LOOP_CONFIGURE {device_path}: {err}"),
            ));
        }
        let source = std::ffi::CString::new(device_path.clone()).map_err(io::Error::other)?;
        let target = cpath(mountpoint)?;
        // SAFETY: valid NUL-terminated strings.
        let ret = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                c"ext4".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME,
                c"noinit_itable,discard".as_ptr().cast(),
            )
        };
        if ret < 0 {
            let err = io::Error::last_os_error();
            return Err(io::Error::new(
                err.kind(),
                format!("mount {device_path}: {err}"),
            ));
        }
        // The mount holds the device now; dropping `device` lets autoclear detach it later.
        return Ok(());
    }
    Err(io::Error::other("no free loop device after 64 attempts"))
}
