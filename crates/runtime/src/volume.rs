//! Volumes: persistent, size-limited filesystems that outlive sandboxes and that several
//! sandboxes mount at once.
//!
//! **Storage.** A volume is an ext4 image `<state>/volumes/<id>/volume.img` (a sparse copy
//! of the formatted template for the operator's volume size, like sandbox disks): a full
//! volume is a real ENOSPC inside every sandbox that mounts it and in the content API, and
//! host disk use never exceeds the volume's size. Creation builds the volume in
//! `<id>.tmp/` (image, root owned by uid/gid [`VOLUME_OWNER`] — the `user` of berth's and
//! E2B's templates — mode 0755, `lost+found` removed) and renames it into place last, so
//! a crash leaves a whole volume or a `.tmp` that the next create of that id replaces.
//!
//! **One filesystem, many mounts.** The image is attached to one loop device while in
//! use, and the daemon keeps one detached mount of it (the *anchor*, never attached in
//! the host's mount namespace). Each sandbox gets a fresh detached mount of the same
//! device — the kernel hands out the same superblock, so every sandbox and the content
//! API see one filesystem — idmapped to the sandbox's uid range: files are stored with
//! the ids they have inside sandboxes (0..65535), so a file `user` writes in one sandbox
//! belongs to `user` in every other, although each sandbox maps those ids to its own host
//! range. After a daemon restart, sandboxes still running hold mounts of the volume; the
//! loop device backing its image is found again (`/sys/block/loop*/loop/backing_file`)
//! and reused, never a second device on the same image.
//!
//! **Checkpoints.** A volume is external to checkpoints (see `checkpoint`): CRIU records
//! the sandbox's volume mounts by key and each restore (resume, fork, snapshot start)
//! binds a fresh idmapped mount of the same volume back, so forks share the volume rather
//! than copy it.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::disk::{self, DiskStore};
use crate::sys::{self, check};
use crate::RuntimeError;

/// uid and gid owning a new volume's root directory.
pub const VOLUME_OWNER: u32 = 1000;
const IMAGE_FILE: &str = "volume.img";

/// One volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeMount {
    /// Id of the volume (the runtime's name for it; the control plane maps names).
    pub volume: String,
    /// Absolute path inside the sandbox.
    pub path: PathBuf,
}

/// Why a mount path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountPathError {
    #[error("must be an absolute path")]
    NotAbsolute,
    #[error("must not be / (a volume cannot replace the root filesystem)")]
    Root,
    #[error("must be a plain path: no `.` or `..` components, empty components or NUL")]
    NotNormal,
    #[error("is longer than 4096 bytes or has a component longer than 255")]
    TooLong,
    #[error("is a system directory ({0}) or inside one")]
    System(&'static str),
    #[error("is already a mount path of this sandbox")]
    Duplicate,
    #[error("is inside, or contains, another mount path of this sandbox ({0})")]
    Nested(String),
}

/// Directories no volume may be mounted on or below: the kernel's and the runtime's
/// mounts, and the system's programs, libraries and configuration.
const SYSTEM_TREES: &[&str] = &[
    "/proc", "/sys", "/dev", "/run", "/etc", "/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64",
    "/libx32", "/boot",
];
/// Directories no volume may replace (mounting below them is fine).
const SYSTEM_DIRS: &[&str] = &[
    "/home", "/root", "/tmp", "/var", "/opt", "/srv", "/mnt", "/media",
];

/// Checks one mount path on its own (absolute, normal, not a system path).
pub fn validate_mount_path(path: &str) -> Result<(), MountPathError> {
    if !path.starts_with('/') {
        return Err(MountPathError::NotAbsolute);
    }
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(MountPathError::Root);
    }
    if path.len() > 4096 {
        return Err(MountPathError::TooLong);
    }
    let components: Vec<&str> = trimmed[1..].split('/').collect();
    for component in &components {
        if component.is_empty()
            || *component == "."
            || *component == ".."
            || component.contains('\0')
        {
            return Err(MountPathError::NotNormal);
        }
        if component.len() > 255 {
            return Err(MountPathError::TooLong);
        }
    }
    for tree in SYSTEM_TREES {
        if trimmed == *tree || trimmed.starts_with(&format!("{tree}/")) {
            return Err(MountPathError::System(tree));
        }
    }
    if let Some(dir) = SYSTEM_DIRS.iter().find(|dir| trimmed == **dir) {
        return Err(MountPathError::System(dir));
    }
    Ok(())
}

/// Checks a sandbox's mount paths together: each on its own, no duplicates, none inside
/// another. Returns the index of the offending path with the error.
pub fn validate_mount_paths<'a>(
    paths: impl IntoIterator<Item = &'a str>,
) -> Result<(), (usize, MountPathError)> {
    let mut seen: Vec<&str> = Vec::new();
    for (i, path) in paths.into_iter().enumerate() {
        validate_mount_path(path).map_err(|e| (i, e))?;
        let path = path.trim_end_matches('/');
        for other in &seen {
            if *other == path {
                return Err((i, MountPathError::Duplicate));
            }
            if other.starts_with(&format!("{path}/")) || path.starts_with(&format!("{other}/")) {
                return Err((i, MountPathError::Nested((*other).to_string())));
            }
        }
        seen.push(path);
    }
    Ok(())
}

/// Volume ids are path components: 1-64 of `[A-Za-z0-9_-]`.
pub(crate) fn valid_volume_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A volume in use: its loop device and the daemon's anchor mount.
struct Attached {
    device: String,
    anchor: OwnedFd,
}

/// The Linux runtime's volumes (see the module doc).
pub(crate) struct VolumeStore {
    dir: PathBuf,
    size_mb: u64,
    attached: Mutex<HashMap<String, Arc<Attached>>>,
}

fn io_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> RuntimeError {
    let op = op.into();
    move |source| RuntimeError::Io { op, source }
}

impl VolumeStore {
    pub(crate) fn new(state_dir: &Path, size_mb: u64) -> io::Result<Self> {
        let dir = state_dir.join("volumes");
        fs::create_dir_all(&dir)?;
        // Volume images are the daemon's alone: sandboxes get mounts, never paths.
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        Ok(Self {
            dir,
            size_mb: size_mb.max(16),
            attached: Mutex::new(HashMap::new()),
        })
    }

    fn volume_dir(&self, id: &str) -> Result<PathBuf, RuntimeError> {
        if !valid_volume_id(id) {
            return Err(RuntimeError::InvalidVolumeId(id.to_owned()));
        }
        Ok(self.dir.join(id))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Attached>>> {
        self.attached.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates empty volume `id` of the operator's size.
    pub(crate) fn create(&self, disks: &DiskStore, id: &str) -> Result<(), RuntimeError> {
        let dir = self.volume_dir(id)?;
        if dir.exists() {
            return Err(RuntimeError::VolumeExists(id.to_owned()));
        }
        let tmp = self.dir.join(format!("{id}.tmp"));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_err("remove a half-created volume"))?;
        }
        let built = (|| -> io::Result<()> {
            fs::create_dir(&tmp)?;
            let image = tmp.join(IMAGE_FILE);
            disks.new_image(self.size_mb, &image)?;
            let mount = disk::mount_image(&image)?;
            prepare_root(mount.as_fd())?;
            sys::syncfs_mount(mount.as_fd())?;
            // The last reference: the filesystem and its loop device go before the rename.
            drop(mount);
            fs::File::open(&image)?.sync_all()?;
            fs::rename(&tmp, &dir)?;
            fs::File::open(&self.dir)?.sync_all()
        })();
        built.map_err(|e| {
            let _ = fs::remove_dir_all(&tmp);
            io_err(format!("create volume {id}"))(e)
        })
    }

    /// Deletes volume `id` and its data. The caller makes sure no sandbox mounts it.
    pub(crate) fn delete(&self, id: &str) -> Result<(), RuntimeError> {
        let dir = self.volume_dir(id)?;
        // Dropping the anchor releases the filesystem (and, autoclear, its loop device)
        // unless something still mounts it.
        self.lock().remove(id);
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(RuntimeError::VolumeNotFound(id.to_owned()))
            }
            other => other.map_err(io_err(format!("delete volume {id}"))),
        }
    }

    /// Volume `id` in use: attached to its loop device (the one already backing it, if a
    /// sandbox still mounts it) with the daemon's anchor mount.
    fn attach(&self, id: &str) -> Result<Arc<Attached>, RuntimeError> {
        let dir = self.volume_dir(id)?;
        let mut attached = self.lock();
        if let Some(volume) = attached.get(id) {
            return Ok(volume.clone());
        }
        let image = dir.join(IMAGE_FILE);
        if !image.is_file() {
            return Err(RuntimeError::VolumeNotFound(id.to_owned()));
        }
        let op = format!("attach volume {id}");
        let existing = disk::loop_device_of(&image).map_err(io_err(op.clone()))?;
        let (device, anchor) = match existing {
            Some(device) => {
                let anchor = disk::mount_device(&device).map_err(io_err(op.clone()))?;
                (device, anchor)
            }
            None => {
                let (handle, device) = disk::attach_loop(&image).map_err(io_err(op.clone()))?;
                let anchor = disk::mount_device(&device).map_err(io_err(op.clone()))?;
                drop(handle);
                (device, anchor)
            }
        };
        let volume = Arc::new(Attached { device, anchor });
        attached.insert(id.to_owned(), volume.clone());
        Ok(volume)
    }

    /// A new detached mount of volume `id`, idmapped through `userns` (a user namespace
    /// whose map is the sandbox's), for one sandbox.
    pub(crate) fn mount_for(
        &self,
        id: &str,
        userns: std::os::fd::BorrowedFd<'_>,
    ) -> Result<OwnedFd, RuntimeError> {
        let volume = self.attach(id)?;
        let mount =
            disk::mount_device(&volume.device).map_err(io_err(format!("mount volume {id}")))?;
        sys::mount_setattr_idmap(mount.as_fd(), userns)
            .map_err(io_err(format!("idmap volume {id}")))?;
        Ok(mount)
    }

    /// The root directory of volume `id` (an fd; resolve paths beneath it only).
    pub(crate) fn root(&self, id: &str) -> Result<OwnedFd, RuntimeError> {
        let volume = self.attach(id)?;
        open_dir_at(volume.anchor.as_fd()).map_err(io_err(format!("open volume {id}")))
    }
}

/// `.` of a directory or mount fd, opened read-only as a directory.
fn open_dir_at(dir: std::os::fd::BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: openat with a valid dirfd and a NUL-terminated path.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    } as libc::c_long)?;
    // SAFETY: openat returned a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A new volume's root: owned by [`VOLUME_OWNER`], mode 0755, without `lost+found`.
fn prepare_root(mount: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    let root = open_dir_at(mount)?;
    // SAFETY: valid dir fd and NUL-terminated name.
    let removed =
        unsafe { libc::unlinkat(root.as_raw_fd(), c"lost+found".as_ptr(), libc::AT_REMOVEDIR) };
    check(removed.into()).or_else(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => Ok(0),
        _ => Err(e),
    })?;
    // SAFETY: plain fchown/fchmod on an fd we own.
    check(unsafe { libc::fchown(root.as_raw_fd(), VOLUME_OWNER, VOLUME_OWNER) }.into())?;
    // SAFETY: as above.
    check(unsafe { libc::fchmod(root.as_raw_fd(), 0o755) }.into())?;
    Ok(())
}

/// The components of an absolute mount path, for walking it inside a sandbox.
pub(crate) fn relative_components(path: &Path) -> io::Result<Vec<&std::ffi::OsStr>> {
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(part) => parts.push(part),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("mount path {} is not a plain absolute path", path.display()),
                ))
            }
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_must_be_plain_absolute_and_outside_the_system() {
        assert!(validate_mount_path("/mnt/data").is_ok());
        assert!(validate_mount_path("/home/user/data/").is_ok());
        assert!(validate_mount_path("/data").is_ok());
        assert_eq!(
            validate_mount_path("data"),
            Err(MountPathError::NotAbsolute)
        );
        assert_eq!(validate_mount_path("/"), Err(MountPathError::Root));
        assert_eq!(validate_mount_path("//"), Err(MountPathError::Root));
        assert_eq!(
            validate_mount_path("/mnt/../etc"),
            Err(MountPathError::NotNormal)
        );
        assert_eq!(
            validate_mount_path("/mnt//x"),
            Err(MountPathError::NotNormal)
        );
        assert_eq!(
            validate_mount_path("/mnt/./x"),
            Err(MountPathError::NotNormal)
        );
        assert_eq!(
            validate_mount_path("/proc"),
            Err(MountPathError::System("/proc"))
        );
        assert_eq!(
            validate_mount_path("/etc/ssl"),
            Err(MountPathError::System("/etc"))
        );
        assert_eq!(
            validate_mount_path("/usr/local/x"),
            Err(MountPathError::System("/usr"))
        );
        assert_eq!(
            validate_mount_path("/home"),
            Err(MountPathError::System("/home"))
        );
        assert_eq!(
            validate_mount_path("/tmp"),
            Err(MountPathError::System("/tmp"))
        );
        assert!(validate_mount_path("/tmp/cache").is_ok());
        assert!(validate_mount_path("/procfs").is_ok());
    }

    #[test]
    fn mount_path_sets_refuse_duplicates_and_nesting() {
        assert!(validate_mount_paths(["/mnt/a", "/mnt/b"]).is_ok());
        assert_eq!(
            validate_mount_paths(["/mnt/a", "/mnt/a/"]),
            Err((1, MountPathError::Duplicate))
        );
        assert_eq!(
            validate_mount_paths(["/mnt/a/b", "/mnt/a"]),
            Err((1, MountPathError::Nested("/mnt/a/b".into())))
        );
        assert!(validate_mount_paths(["/mnt/a", "/mnt/ab"]).is_ok());
    }
}
