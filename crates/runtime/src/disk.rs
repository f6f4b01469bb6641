//! Per-sandbox disk: a sparse ext4 image on a loop device holding the overlay upper and
//! work directories, so a full disk is a real ENOSPC inside the sandbox and host disk use
//! can never exceed the sandbox's `disk_size_mb`.
//!
//! Formatting is done once per size: `disk-templates/ext4-<MB>M.img` is made with
//! `mkfs.ext4` on first need (no journal, no reserved blocks, lazy inode tables), and each
//! sandbox gets a sparse copy of it (only the few hundred KiB of metadata are copied).
//!
//! The disk is never mounted in the host's mount namespace: it is a detached mount
//! (`fsmount`) handed to the launcher, which attaches it inside the sandbox's own mount
//! namespace. So the host mount table does not grow with the number of sandboxes (every
//! new mount namespace starts as a copy of it), and the disk goes away by itself with the
//! sandbox's mount namespace (the loop device is autoclear).
//!
//! Attaching a loop device and mounting ext4 costs tens of milliseconds on a busy host, so
//! a background thread keeps a few ready disks per size already asked for: images in
//! `disk-pool/<pid>.<n>/<seq>/` plus their detached mounts, held open by the daemon.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::perms;
use crate::sys::{check, cpath, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const MOUNT_ATTR_NOATIME: u64 = 0x10;

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
    shared: Arc<Shared>,
    refill: Option<JoinHandle<()>>,
}

struct Shared {
    templates_dir: PathBuf,
    /// This instance's pool directory.
    pool_dir: PathBuf,
    pool_target: usize,
    format_lock: Mutex<()>,
    pool: Mutex<Pool>,
    wake: Condvar,
}

/// A ready disk: the directory holding its `disk.img`, and its detached mount.
struct PooledDisk {
    dir: PathBuf,
    mount: OwnedFd,
}

#[derive(Default)]
struct Pool {
    ready: HashMap<u64, Vec<PooledDisk>>,
    /// Sizes sandboxes have asked for, kept stocked.
    wanted: BTreeSet<u64>,
    next_entry: u64,
    stop: bool,
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

impl DiskStore {
    /// `pool_target` ready disks are kept per size in use (0 turns the pool off).
    pub(crate) fn new(state_dir: &Path, pool_target: usize) -> io::Result<Self> {
        let templates_dir = state_dir.join("disk-templates");
        perms::create_dir_all(&templates_dir, perms::PRIVATE_DIR)?;
        let pool_root = state_dir.join("disk-pool");
        perms::create_dir_all(&pool_root, perms::PRIVATE_DIR)?;
        remove_dead_pools(&pool_root);
        let pool_dir = pool_root.join(format!(
            "{}.{}",
            std::process::id(),
            INSTANCE.fetch_add(1, Ordering::Relaxed)
        ));
        perms::create_dir_all(&pool_dir, perms::PRIVATE_DIR)?;
        let shared = Arc::new(Shared {
            templates_dir,
            pool_dir,
            pool_target,
            format_lock: Mutex::new(()),
            pool: Mutex::new(Pool::default()),
            wake: Condvar::new(),
        });
        let refill = if pool_target > 0 {
            let shared = Arc::clone(&shared);
            Some(
                std::thread::Builder::new()
                    .name("berth-disk-pool".into())
                    .spawn(move || shared.refill_loop())?,
            )
        } else {
            None
        };
        Ok(Self { shared, refill })
    }

    /// A disk of `size_mb` whose image lives at `image`, as a detached mount whose `upper`
    /// and `work` directories are owned by `owner` (the sandbox's root on the host): a
    /// pooled one if ready, else made on the spot.
    pub(crate) fn create(&self, size_mb: u64, image: &Path, owner: u32) -> io::Result<OwnedFd> {
        let pooled = {
            let mut pool = self.shared.lock_pool();
            pool.wanted.insert(size_mb);
            pool.ready.get_mut(&size_mb).and_then(Vec::pop)
        };
        self.shared.wake.notify_all();
        let from_pool = pooled.and_then(|disk| {
            let moved = fs::rename(disk.dir.join("disk.img"), image);
            let _ = fs::remove_dir_all(&disk.dir);
            moved.ok().map(|()| disk.mount)
        });
        let mount = match from_pool {
            Some(mount) => mount,
            None => self.shared.make(size_mb, image)?,
        };
        for dir in [c"upper", c"work"] {
            chown_at(mount.as_fd(), dir, owner)?;
        }
        Ok(mount)
    }
}

impl DiskStore {
    /// A fresh, empty ext4 image of `size_mb` at `image` (a sparse copy of the formatted
    /// template for that size).
    pub(crate) fn new_image(&self, size_mb: u64, image: &Path) -> io::Result<()> {
        copy_sparse(&self.shared.template_image(size_mb)?, image)
    }
}

impl Drop for DiskStore {
    fn drop(&mut self) {
        self.shared.lock_pool().stop = true;
        self.shared.wake.notify_all();
        if let Some(refill) = self.refill.take() {
            let _ = refill.join();
        }
        // Dropping the mounts detaches their loop devices; then the images can go.
        self.shared.lock_pool().ready.clear();
        let _ = fs::remove_dir_all(&self.shared.pool_dir);
    }
}

impl Shared {
    fn lock_pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refill_loop(&self) {
        let mut pool = self.lock_pool();
        loop {
            if pool.stop {
                return;
            }
            let short = pool
                .wanted
                .iter()
                .copied()
                .find(|size| pool.ready.get(size).map_or(0, Vec::len) < self.pool_target);
            let Some(size) = short else {
                pool = self.wake.wait(pool).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            let dir = self.pool_dir.join(pool.next_entry.to_string());
            pool.next_entry += 1;
            drop(pool);
            let made = fs::create_dir(&dir).and_then(|()| self.make(size, &dir.join("disk.img")));
            pool = self.lock_pool();
            match made {
                Ok(mount) if !pool.stop => pool
                    .ready
                    .entry(size)
                    .or_default()
                    .push(PooledDisk { dir, mount }),
                Ok(_) => {
                    let _ = fs::remove_dir_all(&dir);
                }
                Err(e) => {
                    // Creates still work without the pool; stop stocking this size.
                    tracing::warn!("disk pool: cannot prepare a {size} MiB disk: {e}");
                    pool.wanted.remove(&size);
                    let _ = fs::remove_dir_all(&dir);
                }
            }
        }
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
        perms::create_private(&tmp)?.set_len(size_mb * 1024 * 1024)?;
        let output = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-m", "0"])
            .args(["-O", "^has_journal,^resize_inode"])
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

    /// Makes a fresh disk: a sparse copy of the template image for `size_mb` at `image`,
    /// on a loop device, as a detached mount with empty `upper` and `work` dirs.
    fn make(&self, size_mb: u64, image: &Path) -> io::Result<OwnedFd> {
        let template = self.template_image(size_mb)?;
        copy_sparse(&template, image)?;
        let mount = mount_image(image)?;
        for dir in [c"upper", c"work"] {
            // The upper's mode is the sandbox's `/`: exactly 0755, whatever the umask.
            // SAFETY: valid dir fd and NUL-terminated name.
            check(unsafe { libc::mkdirat(mount.as_raw_fd(), dir.as_ptr(), 0o755) }.into())?;
            // SAFETY: as above.
            check(unsafe { libc::fchmodat(mount.as_raw_fd(), dir.as_ptr(), 0o755, 0) }.into())?;
        }
        Ok(mount)
    }
}

fn chown_at(dir: BorrowedFd<'_>, name: &std::ffi::CStr, owner: u32) -> io::Result<()> {
    // SAFETY: valid dir fd and NUL-terminated name.
    check(unsafe { libc::fchownat(dir.as_raw_fd(), name.as_ptr(), owner, owner, 0) }.into())?;
    Ok(())
}

/// Removes the pools of daemons that are gone (`<pid>.<n>` with no such pid). Their
/// mounts died with them, so only image files are left.
fn remove_dead_pools(pool_root: &Path) {
    let Ok(pools) = fs::read_dir(pool_root) else {
        return;
    };
    for pool in pools.flatten() {
        let name = pool.file_name().to_string_lossy().into_owned();
        let pid = name.split('.').next().and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| Path::new("/proc").join(p.to_string()).exists());
        if !alive {
            let _ = fs::remove_dir_all(pool.path());
        }
    }
}

/// Deletes killed sandboxes' directories, and a resume's spent images, off the caller's
/// path: unlinking a large image takes tens of milliseconds on a busy host. `kill`
/// renames the directory into `trash/` first, so nothing of the sandbox remains under its
/// id, and a restarted daemon finishes whatever is left in `trash/`.
///
/// The disk reference goes at once, but the files wait [`DISPOSAL_DELAY`]: deleting a
/// resumed sandbox's images (their page cache freed page by page) right after the resume
/// landed in its first command, 17–20 ms against 7–8 with the deletion a second later (one
/// `connect` → `commands.run` at 64 MiB on the project's machine), and a kill's in a
/// create that follows it. A stopping daemon deletes what is left without waiting.
pub(crate) struct Janitor {
    trash_dir: PathBuf,
    next: AtomicU64,
    sender: Mutex<Option<mpsc::Sender<Disposal>>>,
    thread: Option<JoinHandle<()>>,
}

/// A dead sandbox's directory (already in `trash/`) and the daemon's disk reference.
type Disposal = (PathBuf, Option<OwnedFd>);

/// How long the janitor leaves a directory before deleting it.
const DISPOSAL_DELAY: Duration = Duration::from_secs(1);

impl Janitor {
    pub(crate) fn new(state_dir: &Path) -> io::Result<Self> {
        let trash_dir = state_dir.join("trash");
        perms::create_dir_all(&trash_dir, perms::PRIVATE_DIR)?;
        let (sender, receiver) = mpsc::channel::<Disposal>();
        let thread = std::thread::Builder::new()
            .name("berth-janitor".into())
            .spawn(move || dispose_when_due(&receiver))?;
        // Leftovers of an earlier daemon.
        for entry in fs::read_dir(&trash_dir)?.flatten() {
            let _ = sender.send((entry.path(), None));
        }
        Ok(Self {
            trash_dir,
            next: AtomicU64::new(0),
            sender: Mutex::new(Some(sender)),
            thread: Some(thread),
        })
    }

    /// Moves `dir` out of the way (now), then releases `disk` and deletes `dir` (soon).
    /// Ok if `dir` is missing.
    pub(crate) fn dispose(&self, dir: &Path, name: &str, disk: Option<OwnedFd>) -> io::Result<()> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let target = self
            .trash_dir
            .join(format!("{name}.{}.{n}", std::process::id()));
        match fs::rename(dir, &target) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        }
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = sender.as_ref() {
            let _ = sender.send((target, disk));
        }
        Ok(())
    }
}

/// The janitor's thread: drops each disk reference as it arrives and deletes each
/// directory [`DISPOSAL_DELAY`] after it arrived; once the channel closes (the daemon
/// stops), the rest at once.
fn dispose_when_due(receiver: &mpsc::Receiver<Disposal>) {
    let mut waiting: VecDeque<(PathBuf, Instant)> = VecDeque::new();
    loop {
        let received = match waiting.front() {
            Some((_, due)) => receiver.recv_timeout(due.saturating_duration_since(Instant::now())),
            None => receiver
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match received {
            Ok((dir, disk)) => {
                // The last reference to a dead sandbox's disk: ext4 shuts down here.
                drop(disk);
                waiting.push_back((dir, Instant::now() + DISPOSAL_DELAY));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                for (dir, _) in waiting {
                    let _ = fs::remove_dir_all(&dir);
                }
                return;
            }
        }
        let now = Instant::now();
        while waiting.front().is_some_and(|(_, due)| *due <= now) {
            if let Some((dir, _)) = waiting.pop_front() {
                let _ = fs::remove_dir_all(&dir);
            }
        }
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        // Closing the channel lets the thread finish the queue and exit.
        self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// (used, total) bytes of the filesystem at `path`.
pub(crate) fn usage(path: &Path) -> io::Result<(u64, u64)> {
    let c = cpath(path)?;
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
pub(crate) fn copy_sparse(src: &Path, dst: &Path) -> io::Result<()> {
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
        let hole = check(unsafe { libc::lseek(input.as_raw_fd(), data, libc::SEEK_HOLE) })?;
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

/// Binds `image` to a free loop device (autoclear, direct I/O) and returns a detached
/// ext4 mount of it.
pub(crate) fn mount_image(image: &Path) -> io::Result<OwnedFd> {
    let (device, device_path) = attach_loop(image)?;
    let mount = mount_device(&device_path);
    // The mount holds the device from here on; dropping `device` lets autoclear detach
    // it once the last mount of it is gone.
    drop(device);
    mount
}

/// [`mount_image`] of an image this daemon mounted before (a paused sandbox's disk).
/// Dropping the last mount of an image tears its filesystem down only when every copy
/// of that descriptor is closed, and copies outlive ours: a child forked meanwhile (CRIU,
/// a helper) holds them until it execs, and a mount namespace copied from the host's
/// while a restore had the sandbox's root mounted there (any `unshare`, `ip netns exec`
/// elsewhere on the host) keeps one for as long as it lives. A second filesystem mounted
/// on the image while the first is alive would read inodes the first has not written
/// back, and the first would still write to the image when it finally goes. So while a
/// loop device still backs the image, its filesystem is mounted again: the kernel hands
/// out that same, living superblock. Otherwise the image gets a new loop device.
pub(crate) fn mount_image_again(image: &Path) -> io::Result<OwnedFd> {
    if let Some(device_path) = loop_device_of(image)? {
        // Held open, the device cannot be auto-cleared under the mount below.
        let held = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&device_path);
        if let Ok(held) = held {
            if loop_device_of(image)?.as_deref() == Some(device_path.as_str()) {
                let mount = mount_device(&device_path);
                drop(held);
                match mount {
                    Ok(mount) => return Ok(mount),
                    Err(err) => tracing::warn!(
                        image = %image.display(), device = %device_path, %err,
                        "mounting the living filesystem of a disk image again; attaching the image anew"
                    ),
                }
            }
        }
    }
    mount_image(image)
}

/// A detached ext4 mount of block device `device_path`. When the device's filesystem is
/// already mounted somewhere, the kernel hands out the same superblock again: this is
/// how several mounts of one volume share its one filesystem.
pub(crate) fn mount_device(device_path: &str) -> io::Result<OwnedFd> {
    let fs = FsContext::open(c"ext4")?;
    let source = CString::new(device_path).map_err(io::Error::other)?;
    fs.set_string(c"source", &source)?;
    fs.set_flag(c"discard")?;
    fs.set_flag(c"noinit_itable")?;
    fs.create_mount(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOATIME)
        .map_err(|e| io::Error::new(e.kind(), format!("mount {device_path}: {e}")))
}

/// Binds `image` to a free loop device (autoclear, direct I/O); returns the open device
/// (keep it until the device is mounted, or autoclear detaches it) and its path.
pub(crate) fn attach_loop(image: &Path) -> io::Result<(File, String)> {
    let rw_cloexec = |path: &Path| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
    };
    let backing = rw_cloexec(image)?;
    let control = rw_cloexec(Path::new("/dev/loop-control"))?;
    // Concurrent creators are all handed the same lowest free device; one wins it, the
    // others get EBUSY and retry after a short random pause, so a burst of creates
    // spreads over the devices instead of colliding on the same one again.
    for attempt in 0..LOOP_ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(loop_retry_pause(attempt));
        }
        // SAFETY: LOOP_CTL_GET_FREE takes no argument.
        let number = check(unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) }.into())?;
        let device_path = format!("/dev/loop{number}");
        let device = match rw_cloexec(Path::new(&device_path)) {
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
        let ret = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_CONFIGURE,
                &config as *const LoopConfig,
            )
        };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EBUSY) {
                continue;
            }
            return Err(io::Error::new(
                err.kind(),
                format!("LOOP_CONFIGURE {device_path}: {err}"),
            ));
        }
        return Ok((device, device_path));
    }
    Err(io::Error::other(format!(
        "no free loop device after {LOOP_ATTEMPTS} attempts"
    )))
}

/// The loop device (`/dev/loopN`) already backed by `image`, if any: a filesystem on it
/// is still mounted somewhere (by a running sandbox), and mounting the image through a
/// second device would put two filesystems on one image.
pub(crate) fn loop_device_of(image: &Path) -> io::Result<Option<String>> {
    let image = fs::canonicalize(image)?;
    for entry in fs::read_dir("/sys/block")?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        if Path::new(backing.trim_end_matches('\n')) == image {
            return Ok(Some(format!("/dev/{name}")));
        }
    }
    Ok(None)
}

/// How many times [`attach_loop`] asks for a free loop device before giving up.
const LOOP_ATTEMPTS: u32 = 1000;

/// A random pause before retry `attempt`: up to 50 µs per earlier attempt, at most 5 ms.
fn loop_retry_pause(attempt: u32) -> std::time::Duration {
    let bound = (u64::from(attempt) * 50).min(5_000);
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom into a buffer we own; a short read only makes the pause shorter.
    unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_NONBLOCK) };
    std::time::Duration::from_micros(u64::from_ne_bytes(bytes) % (bound + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handed-over directories leave their place at once and are deleted by the
    /// janitor; a stopping janitor deletes the ones still waiting before it returns.
    #[test]
    fn the_janitor_deletes_what_it_was_handed_also_when_it_stops_early() {
        let state = tempfile::tempdir().unwrap();
        let janitor = Janitor::new(state.path()).unwrap();
        let spent = |name: &str| {
            let dir = state.path().join(name);
            fs::create_dir_all(dir.join("inner")).unwrap();
            fs::write(dir.join("inner/pages.img"), b"pages").unwrap();
            dir
        };
        let first = spent("first");
        janitor.dispose(&first, "first", None).unwrap();
        assert!(
            !first.exists(),
            "a handed-over directory stayed in its place"
        );
        let trash = state.path().join("trash");
        let deadline = Instant::now() + Duration::from_secs(30);
        while fs::read_dir(&trash).unwrap().next().is_some() {
            assert!(Instant::now() < deadline, "the janitor never deleted it");
            std::thread::sleep(Duration::from_millis(50));
        }
        let second = spent("second");
        janitor.dispose(&second, "second", None).unwrap();
        janitor
            .dispose(&state.path().join("missing"), "missing", None)
            .unwrap();
        drop(janitor);
        assert_eq!(fs::read_dir(&trash).unwrap().count(), 0);
    }

    /// Privileged: a burst of simultaneous mounts, more than there were retries before,
    /// each gets its own loop device (all are handed the same free one first).
    #[test]
    fn simultaneous_mounts_each_get_a_loop_device() {
        const BURST: usize = 128;
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("0.img");
        File::create(&first).unwrap().set_len(16 << 20).unwrap();
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-O", "^has_journal"])
            .arg(&first)
            .status()
            .unwrap();
        assert!(mkfs.success());
        let images: Vec<PathBuf> = (0..BURST)
            .map(|i| {
                let image = dir.path().join(format!("{i}.img"));
                if i > 0 {
                    copy_sparse(&first, &image).unwrap();
                }
                image
            })
            .collect();
        let start = std::sync::Barrier::new(BURST);
        let mounts: Vec<io::Result<OwnedFd>> = std::thread::scope(|scope| {
            let handles: Vec<_> = images
                .iter()
                .map(|image| {
                    let start = &start;
                    scope.spawn(move || {
                        start.wait();
                        mount_image(image)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let failures: Vec<String> = mounts
            .iter()
            .filter_map(|m| m.as_ref().err().map(ToString::to_string))
            .collect();
        // Dropping the detached mounts releases the loop devices (autoclear).
        drop(mounts);
        assert!(
            failures.is_empty(),
            "{} failed: {failures:?}",
            failures.len()
        );
    }

    /// Privileged: a child forked by another thread holds a copy of a disk mount's
    /// descriptor until it execs, so dropping ours does not unmount it. A second
    /// filesystem on the image made then would read inodes the first has not written
    /// back (seen: an owner change lost); `mount_image_again` mounts the living one.
    #[test]
    fn mounting_again_while_a_forked_child_holds_the_mount_sees_its_changes() {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::process::CommandExt;

        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        File::create(&image).unwrap().set_len(16 << 20).unwrap();
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096"])
            .arg(&image)
            .status()
            .unwrap();
        assert!(mkfs.success());
        let mount = mount_image(&image).unwrap();
        let entry = |mount: &OwnedFd| format!("/proc/self/fd/{}/lost+found", mount.as_raw_fd());
        std::os::unix::fs::lchown(entry(&mount), Some(4242), None).unwrap();
        let (forked_tx, forked_rx) = std::sync::mpsc::channel();
        let spawner = std::thread::spawn(move || {
            let mut command = Command::new("/bin/true");
            // SAFETY: the hook only calls usleep(3), which is async-signal-safe.
            unsafe {
                command.pre_exec(|| {
                    libc::usleep(300_000);
                    Ok(())
                });
            }
            forked_tx.send(()).unwrap();
            command.status().unwrap();
        });
        forked_rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(mount);
        let again = mount_image_again(&image).unwrap();
        let owner = fs::symlink_metadata(entry(&again)).unwrap().uid();
        spawner.join().unwrap();
        assert_eq!(
            owner, 4242,
            "the second mount read inodes the first had not written"
        );
    }

    /// Privileged: while some other holder keeps the first filesystem of an image alive
    /// for good (a copied mount namespace does), mounting the image again gives the same
    /// filesystem, not a second one on the same blocks.
    #[test]
    fn mounting_again_while_the_filesystem_lives_shares_it() {
        use std::os::unix::fs::MetadataExt;

        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        File::create(&image).unwrap().set_len(16 << 20).unwrap();
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096"])
            .arg(&image)
            .status()
            .unwrap();
        assert!(mkfs.success());
        let first = mount_image(&image).unwrap();
        let held = first.try_clone().unwrap();
        drop(first);
        let again = mount_image_again(&image).unwrap();
        let root = |mount: &OwnedFd| format!("/proc/self/fd/{}", mount.as_raw_fd());
        assert_eq!(
            fs::metadata(root(&held)).unwrap().dev(),
            fs::metadata(root(&again)).unwrap().dev(),
            "a second filesystem on the image"
        );
        fs::write(format!("{}/written-again", root(&again)), "x").unwrap();
        assert_eq!(
            fs::read_to_string(format!("{}/written-again", root(&held))).unwrap(),
            "x"
        );
        drop(again);
        drop(held);
    }
}
