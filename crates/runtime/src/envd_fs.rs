//! The filesystem a sandbox's init binary (envd) is bound from: a small tmpfs of the
//! daemon's at `<state>/envd`, holding each init binary by content
//! (`<sha256 prefix>/<file name>`).
//!
//! Bound from there, a sandbox's `/proc/self/mountinfo` shows `/<hash>/berth-envd` on a
//! tmpfs named `berth-envd`, not the binary's host path and the host's block device.
//! CRIU records the bind as an external mount by its host path (`--external mnt[]`), so
//! the tmpfs stays mounted while the daemon holds any sandbox, running or paused, and
//! across daemon restarts; [`release`] removes it when none is left. A checkpoint
//! restores wherever the same binary, by content, is installed again, which every
//! start does for the daemon's own envd.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::sys::{self, FsContext, MOUNT_ATTR_NODEV};

const DIR: &str = "envd";
const TMPFS_MAGIC: i64 = 0x0102_1994;
/// The mode of the filesystem's directories: the launcher (as the sandbox's root, an
/// unprivileged host uid) reaches the binary through them; nobody else lists them.
const TRAVERSE_ONLY: u32 = 0o711;
/// The binaries' mode: readable as well as executable, because a process that execs a
/// file it cannot read is not dumpable, and CRIU could not checkpoint the sandbox. They
/// hold no state (the same binaries berth ships world-readable).
const BINARY: u32 = 0o755;
/// Room for the envd versions of every sandbox alive, which stay until the last of
/// them goes: a limit, not a reservation (tmpfs takes memory only for the files in it).
/// A release envd is 8 MiB, a debug build 28 and an unstripped release build 36; with
/// 64 MiB, a daemon started with a third build while sandboxes of two others lived
/// failed to start (ENOSPC installing its envd).
const SIZE: &std::ffi::CStr = c"512m";

/// Copies `binary` into the daemon's envd filesystem under `state_dir` (mounting it
/// first when it is not mounted) and returns the path of the copy.
pub(crate) fn install(state_dir: &Path, binary: &Path) -> io::Result<PathBuf> {
    let root = state_dir.join(DIR);
    if !is_tmpfs_mount(&root)? {
        crate::perms::create_dir_all(&root, crate::perms::TRAVERSE_DIR)?;
        mount(&root)?;
    }
    sweep_partials(&root);
    let mut source = fs::File::open(binary)?;
    let mut contents = Vec::new();
    source.read_to_end(&mut contents)?;
    let hash = Sha256::digest(&contents);
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let name = binary
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "init binary has no name"))?;
    let dir = root.join(hex);
    let installed = dir.join(name);
    if installed.is_file() {
        return Ok(installed);
    }
    match fs::create_dir(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => fs::set_permissions(&dir, fs::Permissions::from_mode(TRAVERSE_ONLY))?,
    }
    // Written beside and renamed: a daemon starting meanwhile never binds half a file.
    let partial = dir.join(format!(".{}.partial", std::process::id()));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(BINARY)
            .open(&partial)?;
        file.write_all(&contents)?;
        file.set_permissions(fs::Permissions::from_mode(BINARY))?;
        drop(file);
        fs::rename(&partial, &installed)
    })();
    if let Err(err) = written {
        // A partial copy left behind would hold its share of the filesystem for good.
        let _ = fs::remove_file(&partial);
        return Err(err);
    }
    Ok(installed)
}

/// Removes the copies a daemon killed mid-install left (`.<pid>.partial` of a pid that
/// no longer runs): the filesystem outlives daemons while any sandbox lives, and each
/// would hold its share of it until then. A pid that runs again is left alone: it may be
/// another daemon copying now.
fn sweep_partials(root: &Path) {
    let Ok(dirs) = fs::read_dir(root) else {
        return;
    };
    for file in dirs
        .flatten()
        .filter_map(|dir| fs::read_dir(dir.path()).ok())
        .flat_map(|files| files.flatten())
    {
        let name = file.file_name();
        let pid = name
            .to_str()
            .and_then(|name| name.strip_prefix('.')?.strip_suffix(".partial"))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new("/proc").join(pid.to_string()).exists() {
                let _ = fs::remove_file(file.path());
            }
        }
    }
}

/// Unmounts the daemon's envd filesystem under `state_dir`, if mounted. Only when the
/// daemon holds no sandbox: running ones keep their bind either way, but a paused one's
/// restore needs the path.
pub(crate) fn release(state_dir: &Path) -> io::Result<bool> {
    let root = state_dir.join(DIR);
    if !is_tmpfs_mount(&root)? {
        return Ok(false);
    }
    let path = sys::cpath(&root)?;
    // SAFETY: umount2 with a valid NUL-terminated path.
    sys::check(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) }.into())?;
    let _ = fs::remove_dir(&root);
    Ok(true)
}

/// True when `dir` is the root of a tmpfs mount (not merely inside one).
fn is_tmpfs_mount(dir: &Path) -> io::Result<bool> {
    let meta = match fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let parent = fs::metadata(dir.parent().unwrap_or(Path::new("/")))?;
    if meta.dev() == parent.dev() {
        return Ok(false);
    }
    let path = sys::cpath(dir)?;
    // SAFETY: statfs is plain data; zeroed is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    sys::check(unsafe { libc::statfs(path.as_ptr(), &mut st) }.into())?;
    Ok(st.f_type as i64 == TMPFS_MAGIC)
}

fn mount(root: &Path) -> io::Result<()> {
    let fs = FsContext::open(c"tmpfs")?;
    fs.set_string(c"source", c"berth-envd")?;
    fs.set_string(c"size", SIZE)?;
    fs.set_string(c"mode", c"0711")?;
    let mount = fs.create_mount(MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOSUID)?;
    sys::move_mount_to(mount.as_fd(), &sys::cpath(root)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Privileged: installs into a fresh tmpfs, is idempotent per content, and a new
    /// binary gets its own directory beside the first.
    #[test]
    fn binaries_are_kept_by_content_on_a_tmpfs_of_their_own() {
        let state = tempfile::tempdir().unwrap();
        let first = state.path().join("bin-a");
        fs::create_dir(&first).unwrap();
        fs::write(first.join("berth-envd"), b"version one").unwrap();
        let installed = install(state.path(), &first.join("berth-envd")).unwrap();
        assert!(is_tmpfs_mount(&state.path().join(DIR)).unwrap());
        assert_eq!(fs::read(&installed).unwrap(), b"version one");
        assert_eq!(fs::metadata(&installed).unwrap().mode() & 0o777, BINARY);
        assert_eq!(
            fs::metadata(installed.parent().unwrap()).unwrap().mode() & 0o777,
            TRAVERSE_ONLY
        );
        assert_eq!(
            fs::metadata(state.path().join(DIR)).unwrap().mode() & 0o777,
            TRAVERSE_ONLY
        );
        assert_eq!(installed.file_name().unwrap(), "berth-envd");
        assert_eq!(
            install(state.path(), &first.join("berth-envd")).unwrap(),
            installed
        );
        fs::write(first.join("berth-envd"), b"version two").unwrap();
        let second = install(state.path(), &first.join("berth-envd")).unwrap();
        assert_ne!(second.parent(), installed.parent());
        assert_eq!(fs::read(&installed).unwrap(), b"version one");
        assert!(release(state.path()).unwrap());
        assert!(!state.path().join(DIR).exists());
        assert!(!release(state.path()).unwrap());
    }

    /// A state dir with a placeholder envd at `<state>/bin/berth-envd`, installed.
    fn installed_placeholder() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let state = tempfile::tempdir().unwrap();
        let source = state.path().join("bin");
        fs::create_dir(&source).unwrap();
        fs::write(source.join("berth-envd"), b"placeholder").unwrap();
        let installed = install(state.path(), &source.join("berth-envd")).unwrap();
        (state, source, installed)
    }

    /// Privileged: a copy that cannot be put in place leaves no partial file behind
    /// (its room on the filesystem would be lost until the last sandbox goes).
    #[test]
    fn a_failed_install_leaves_no_partial_copy() {
        let (state, source, _) = installed_placeholder();
        let root = state.path().join(DIR);
        // The next version's place is taken by a directory that is not empty.
        fs::write(source.join("berth-envd"), b"next version").unwrap();
        let hash = Sha256::digest(b"next version");
        let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
        let blocked = root.join(&hex).join("berth-envd");
        fs::create_dir_all(blocked.join("in-the-way")).unwrap();
        assert!(install(state.path(), &source.join("berth-envd")).is_err());
        let left: Vec<_> = fs::read_dir(root.join(&hex))
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("berth-envd")],
            "{left:?}"
        );
        fs::remove_dir_all(&blocked).unwrap();
        assert!(release(state.path()).unwrap());
    }

    /// Privileged: a copy left by a process that died mid-install is removed by the next
    /// install; one of a process that still runs is not.
    #[test]
    fn the_next_install_removes_copies_of_dead_installers() {
        let (state, source, installed) = installed_placeholder();
        let dir = installed.parent().unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let dead = gone.id();
        gone.wait().unwrap();
        let dead_copy = dir.join(format!(".{dead}.partial"));
        let live_copy = dir.join(format!(".{}.partial", std::process::id()));
        fs::write(&dead_copy, b"half").unwrap();
        fs::write(&live_copy, b"half").unwrap();
        assert_eq!(
            install(state.path(), &source.join("berth-envd")).unwrap(),
            installed
        );
        assert!(
            !dead_copy.exists(),
            "the dead installer's copy is still there"
        );
        assert!(live_copy.exists(), "a running installer's copy was removed");
        fs::remove_file(&live_copy).unwrap();
        assert!(release(state.path()).unwrap());
    }
}
