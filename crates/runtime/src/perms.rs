//! Modes of everything the runtime keeps under the state directory.
//!
//! Records, disk images and checkpoints are root's alone: files 0600, directories 0700,
//! set explicitly whatever the process umask. Nothing of a sandbox walks the state
//! directory: the daemon opens the template layers and disk and hands the launcher
//! detached mounts, and the cloned child opens the sandbox's `root` directory while it
//! still has the daemon's credentials (see `launch`).
//!
//! The one exception is CRIU images. CRIU's restore tasks open some images (namespaces,
//! ttys, …) through the images directory both before and after they have become the
//! sandbox's root in its user namespace (an unprivileged host uid), so image files are
//! 0644 (CRIU runs with umask 022) in a 0711 directory, and what keeps them from other
//! users is that every such directory sits in a 0700 one: `checkpoints/<id>/images`,
//! a paused sandbox's `sandboxes/<id>/checkpoint`, a restore's
//! `sandboxes/<id>/restore-images` (hard links to a checkpoint's images).
//!
//! [`tighten_sandbox_dirs`] brings state written by an older berth (0644 records, 0755
//! or 0711 directories) to these modes at start.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Owner-only directory.
pub(crate) const PRIVATE_DIR: u32 = 0o700;
/// Owner-only file.
pub(crate) const PRIVATE_FILE: u32 = 0o600;
/// A directory others may traverse but not list: the state dir and `volume-mounts/`
/// (see `LinuxRuntime::volume_mounts_dir`).
pub(crate) const TRAVERSE_DIR: u32 = 0o711;
/// A directory of CRIU images (see the module docs).
pub(crate) const IMAGES_DIR: u32 = 0o711;

/// Creates directory `path` with exactly `mode` (the umask can only narrow a mode, so
/// it is set again after the create).
pub(crate) fn create_dir(path: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new().mode(mode).create(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Like [`create_dir`] for `path` and any missing parents (parents get `mode` too);
/// an existing `path` gets `mode`.
pub(crate) fn create_dir_all(path: &Path, mode: u32) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            create_dir_all(parent, mode)?;
        }
    }
    match fs::DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Writes `bytes` to a new owner-only file at `path` (replacing one there).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> io::Result<fs::File> {
    let mut file = create_private(path)?;
    file.write_all(bytes)?;
    Ok(file)
}

/// Replaces `dir/name` with an owner-only file of `bytes`: written to `.<name>.tmp` and
/// renamed over it, so a reader sees the old file or the new one, never a part. With
/// `durable`, the file and the rename are on disk when it returns.
pub(crate) fn replace_private(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    durable: bool,
) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let file = write_private(&tmp, bytes)?;
    if durable {
        file.sync_all()?;
    }
    drop(file);
    fs::rename(&tmp, dir.join(name))?;
    if durable {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Opens `path` for writing as a new, empty owner-only file (truncating one there and
/// narrowing its mode).
pub(crate) fn create_private(path: &Path) -> io::Result<fs::File> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE)
        .open(path)?;
    file.set_permissions(fs::Permissions::from_mode(PRIVATE_FILE))?;
    Ok(file)
}

/// Makes `dir`, in an owner-only directory, a directory CRIU can restore from.
pub(crate) fn images_dir(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(IMAGES_DIR))
}

/// Sets `path` to `mode` unless it already has it or is a symlink; true when changed.
pub(crate) fn tighten(path: &Path, mode: u32) -> io::Result<bool> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() || meta.permissions().mode() & 0o7777 == mode {
        return Ok(false);
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(true)
}

/// CRIU writes `inventory.img` into every images directory.
const CRIU_INVENTORY: &str = "inventory.img";

/// Owner-only modes for everything below `dir` (not crossing mounts, not following
/// symlinks), except that directories of CRIU images keep their files' modes and get
/// [`IMAGES_DIR`] (restores need both; what keeps them from other users is the
/// owner-only directory they sit in). Returns how many paths changed.
///
/// Other processes may add and remove entries during the walk (a running berth claims
/// and releases uid slots, writes and deletes checkpoints): a path gone by the time it
/// is reached is skipped, never an error.
pub fn tighten_tree(dir: &Path) -> io::Result<usize> {
    let device = match fs::symlink_metadata(dir) {
        Ok(meta) => meta.dev(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut changed = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        changed += match tighten_one(&path, device, &mut stack) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            result => result?,
        };
    }
    Ok(changed)
}

/// One path of [`tighten_tree`]'s walk; a directory's entries go on `stack`.
fn tighten_one(path: &Path, device: u64, stack: &mut Vec<std::path::PathBuf>) -> io::Result<usize> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() || meta.dev() != device {
        return Ok(0);
    }
    if !meta.is_dir() {
        return Ok(usize::from(tighten(path, PRIVATE_FILE)?));
    }
    if path.join(CRIU_INVENTORY).is_file() {
        return Ok(usize::from(tighten(path, IMAGES_DIR)?));
    }
    let changed = usize::from(tighten(path, PRIVATE_DIR)?);
    for entry in fs::read_dir(path)? {
        stack.push(entry?.path());
    }
    Ok(changed)
}

/// Brings `<state>/sandboxes/` and `<state>/checkpoints/` to the runtime's modes;
/// returns how many paths changed.
pub(crate) fn tighten_sandbox_dirs(state: &Path) -> io::Result<usize> {
    let mut changed = 0;
    for dir in ["sandboxes", "checkpoints"] {
        let dir = state.join(dir);
        if dir.exists() {
            changed += tighten_tree(&dir)?;
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn old_state_is_brought_to_owner_only_modes() {
        let state = tempfile::tempdir().unwrap();
        let sandbox = state.path().join("sandboxes/i1");
        for dir in ["layers/0", "disk", "checkpoint"] {
            fs::create_dir_all(sandbox.join(dir)).unwrap();
        }
        fs::create_dir_all(state.path().join("checkpoints/snap/images")).unwrap();
        for file in [
            "sandboxes/i1/record.json",
            "sandboxes/i1/checkpoint/pages-1.img",
            "sandboxes/i1/checkpoint/inventory.img",
            "checkpoints/snap/checkpoint.json",
            "checkpoints/snap/images/pages-1.img",
            "checkpoints/snap/images/inventory.img",
        ] {
            fs::write(state.path().join(file), b"secret").unwrap();
            fs::set_permissions(state.path().join(file), fs::Permissions::from_mode(0o644))
                .unwrap();
        }
        for dir in ["sandboxes", "sandboxes/i1", "checkpoints/snap/images"] {
            fs::set_permissions(state.path().join(dir), fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::os::unix::fs::symlink("/etc", sandbox.join("link")).unwrap();
        let changed = tighten_sandbox_dirs(state.path()).unwrap();
        assert!(changed >= 6, "{changed}");
        assert_eq!(mode(&state.path().join("sandboxes")), PRIVATE_DIR);
        assert_eq!(mode(&sandbox), PRIVATE_DIR);
        assert_eq!(mode(&sandbox.join("layers/0")), PRIVATE_DIR);
        assert_eq!(mode(&sandbox.join("record.json")), PRIVATE_FILE);
        assert_eq!(mode(&sandbox.join("checkpoint")), IMAGES_DIR);
        assert_eq!(mode(&sandbox.join("checkpoint/pages-1.img")), 0o644);
        let snap = state.path().join("checkpoints/snap");
        assert_eq!(mode(&snap), PRIVATE_DIR);
        assert_eq!(mode(&snap.join("checkpoint.json")), PRIVATE_FILE);
        assert_eq!(mode(&snap.join("images")), IMAGES_DIR);
        assert_eq!(mode(&snap.join("images/pages-1.img")), 0o644);
        assert_eq!(mode(Path::new("/etc")), 0o755, "symlinks are not followed");
        assert_eq!(tighten_sandbox_dirs(state.path()).unwrap(), 0);
    }

    #[test]
    fn created_modes_ignore_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        create_dir_all(&nested, PRIVATE_DIR).unwrap();
        assert_eq!(mode(&nested), PRIVATE_DIR);
        let file = dir.path().join("f");
        write_private(&file, b"x").unwrap();
        assert_eq!(mode(&file), PRIVATE_FILE);
    }
}
