//! Directory watches on inotify, with E2B's (fsnotify's) event mapping:
//! create and moved-in → CREATE, modify → WRITE, delete → REMOVE, moved-out → RENAME,
//! attribute change → CHMOD. Event names are relative to the watched directory.
//!
//! A recursive watch adds a watch for every subdirectory, and for each directory that
//! appears later; entries that appeared inside a new directory before its watch was in
//! place are reported as CREATE when the watch is added, so `mkdir -p a/b/c` or a moved-in
//! tree is not missed. A non-recursive watch sees only direct children.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use berth_envd_proto::filesystem::EventType;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// One change, before it is turned into a wire event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Path relative to the watched directory (`.` for the directory itself).
    pub name: String,
    /// Absolute path, for entry info.
    pub path: PathBuf,
    pub kind: EventType,
}

/// Gives tokio the raw fd of the inotify instance it owns.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

fn watch_mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_DONT_FOLLOW
}

/// A live watch on one directory (and its subdirectories when recursive).
pub struct DirWatcher {
    inotify: AsyncFd<InotifyFd>,
    root: PathBuf,
    recursive: bool,
    /// Watched directories by descriptor.
    dirs: HashMap<WatchDescriptor, PathBuf>,
    /// Changes found while adding watches, not yet handed out.
    pending: VecDeque<Change>,
}

impl DirWatcher {
    /// Starts watching `root`, which must be a directory.
    pub fn new(root: &Path, recursive: bool) -> io::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // SAFETY: the fd belongs to the `Inotify` moved into the `AsyncFd`, which keeps
        // it open for as long as it is registered and closes it only when dropped.
        let inotify =
            unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE) }
                .map_err(|e| io::Error::other(e.to_string()))?;
        let mut watcher = Self {
            inotify,
            root: root.to_owned(),
            recursive,
            dirs: HashMap::new(),
            pending: VecDeque::new(),
        };
        watcher.add_watch(root)?;
        if recursive {
            watcher.add_subtree(root, false);
        }
        Ok(watcher)
    }

    fn add_watch(&mut self, dir: &Path) -> io::Result<()> {
        let wd = self.inotify.get_ref().0.add_watch(dir, watch_mask())?;
        self.dirs.insert(wd, dir.to_owned());
        Ok(())
    }

    /// Watches every directory below `dir`; with `report`, every entry found is a CREATE
    /// (it appeared before its parent was watched).
    fn add_subtree(&mut self, dir: &Path, report: bool) {
        let mut stack = vec![dir.to_owned()];
        while let Some(current) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&current) else {
                continue;
            };
            let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let path = entry.path();
                if report {
                    self.pending
                        .push_back(self.change(&path, EventType::Create));
                }
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                // A directory that vanished or cannot be watched is simply not watched.
                if is_dir && self.add_watch(&path).is_ok() {
                    stack.push(path);
                }
            }
        }
    }

    fn change(&self, path: &Path, kind: EventType) -> Change {
        let name = match path.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.to_string_lossy().into_owned(),
            Err(_) => path.to_string_lossy().into_owned(),
        };
        Change {
            name,
            path: path.to_owned(),
            kind,
        }
    }

    /// The next changes, waiting for them. An error (queue overflow, fd failure) ends
    /// the watch.
    pub async fn next(&mut self) -> io::Result<Vec<Change>> {
        loop {
            if !self.pending.is_empty() {
                return Ok(self.pending.drain(..).collect());
            }
            let mut ready = self.inotify.readable().await?;
            let events =
                match ready.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from)) {
                    Ok(Ok(events)) => events,
                    Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => continue,
                };
            for event in events {
                self.translate(event.wd, event.mask, event.name)?;
            }
        }
    }

    fn translate(
        &mut self,
        wd: WatchDescriptor,
        mask: AddWatchFlags,
        name: Option<OsString>,
    ) -> io::Result<()> {
        if mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            return Err(io::Error::other(
                "too many filesystem events: the watch queue overflowed",
            ));
        }
        if mask.contains(AddWatchFlags::IN_IGNORED) {
            self.dirs.remove(&wd);
            return Ok(());
        }
        let Some(dir) = self.dirs.get(&wd).cloned() else {
            return Ok(());
        };
        let path = match &name {
            Some(name) => dir.join(name),
            None => dir.clone(),
        };
        if name.is_none() && path != self.root {
            // DELETE_SELF / MOVE_SELF of a subdirectory: its parent already reported it.
            return Ok(());
        }
        let mut kinds = Vec::new();
        if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
            kinds.push(EventType::Create);
        }
        if mask.intersects(AddWatchFlags::IN_MOVED_FROM | AddWatchFlags::IN_MOVE_SELF) {
            kinds.push(EventType::Rename);
        }
        if mask.contains(AddWatchFlags::IN_ATTRIB) {
            kinds.push(EventType::Chmod);
        }
        if mask.contains(AddWatchFlags::IN_MODIFY) {
            kinds.push(EventType::Write);
        }
        if mask.intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_DELETE_SELF) {
            kinds.push(EventType::Remove);
        }
        for kind in kinds {
            self.pending.push_back(self.change(&path, kind));
        }
        let new_dir = mask.contains(AddWatchFlags::IN_ISDIR)
            && mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
        if self.recursive && new_dir && self.add_watch(&path).is_ok() {
            self.add_subtree(&path, true);
        }
        Ok(())
    }
}

/// Filesystem magic numbers of network and FUSE filesystems (linux/magic.h), whose
/// events may never arrive.
const NETWORK_FS_MAGICS: [i64; 5] = [0x6969, 0xFF53_4D42, 0x517B, 0xFE53_4D42, 0x6573_5546];

/// Whether `path` is on NFS, CIFS/SMB or FUSE.
pub fn is_network_mount(path: &Path) -> io::Result<bool> {
    let stat = rustix::fs::statfs(path)?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets.
    let magic = stat.f_type as i64;
    Ok(NETWORK_FS_MAGICS.contains(&magic))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("berth-envd-watch-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Collects changes until `want` is among them (bounded so a bug fails, not hangs).
    async fn collect_until(watcher: &mut DirWatcher, want: &Change) -> Vec<Change> {
        let mut seen = Vec::new();
        while !seen.contains(want) {
            let next = tokio::time::timeout(Duration::from_secs(20), watcher.next())
                .await
                .unwrap_or_else(|_| panic!("no {want:?}; saw {seen:?}"))
                .unwrap();
            seen.extend(next);
        }
        seen
    }

    fn change(root: &Path, name: &str, kind: EventType) -> Change {
        Change {
            name: name.to_owned(),
            path: root.join(name),
            kind,
        }
    }

    #[tokio::test]
    async fn reports_create_write_chmod_rename_remove() {
        let tmp = TempDir::new("kinds");
        let root = tmp.0.clone();
        let mut watcher = DirWatcher::new(&root, false).unwrap();
        std::fs::write(root.join("a"), b"x").unwrap();
        let seen = collect_until(&mut watcher, &change(&root, "a", EventType::Write)).await;
        assert_eq!(seen[0], change(&root, "a", EventType::Create));
        std::fs::set_permissions(
            root.join("a"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        collect_until(&mut watcher, &change(&root, "a", EventType::Chmod)).await;
        std::fs::rename(root.join("a"), root.join("b")).unwrap();
        let seen = collect_until(&mut watcher, &change(&root, "b", EventType::Create)).await;
        assert!(seen.contains(&change(&root, "a", EventType::Rename)));
        std::fs::remove_file(root.join("b")).unwrap();
        collect_until(&mut watcher, &change(&root, "b", EventType::Remove)).await;
    }

    #[tokio::test]
    async fn recursive_watch_follows_new_directories() {
        let tmp = TempDir::new("recursive");
        let root = tmp.0.clone();
        std::fs::create_dir(root.join("existing")).unwrap();
        let mut watcher = DirWatcher::new(&root, true).unwrap();
        std::fs::write(root.join("existing/f"), b"1").unwrap();
        collect_until(
            &mut watcher,
            &change(&root, "existing/f", EventType::Create),
        )
        .await;
        std::fs::create_dir_all(root.join("new/deep/er")).unwrap();
        collect_until(
            &mut watcher,
            &change(&root, "new/deep/er", EventType::Create),
        )
        .await;
        std::fs::write(root.join("new/deep/er/g"), b"2").unwrap();
        collect_until(
            &mut watcher,
            &change(&root, "new/deep/er/g", EventType::Write),
        )
        .await;
    }

    #[tokio::test]
    async fn non_recursive_watch_ignores_grandchildren() {
        let tmp = TempDir::new("flat");
        let root = tmp.0.clone();
        std::fs::create_dir(root.join("sub")).unwrap();
        let mut watcher = DirWatcher::new(&root, false).unwrap();
        std::fs::write(root.join("sub/hidden"), b"1").unwrap();
        std::fs::write(root.join("visible"), b"1").unwrap();
        let seen = collect_until(&mut watcher, &change(&root, "visible", EventType::Create)).await;
        assert!(seen.iter().all(|c| !c.name.starts_with("sub/")), "{seen:?}");
    }

    #[test]
    fn local_dirs_are_not_network_mounts() {
        assert!(!is_network_mount(Path::new("/")).unwrap());
    }
}
