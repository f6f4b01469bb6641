//! Advisory file locks (flock) that serialize builders across threads and processes.

use std::fs::{File, OpenOptions};
use std::path::Path;

use rustix::fs::{flock, FlockOperation};

use crate::error::{IoContext, TemplateError};

/// An exclusive flock, released when dropped (closing the file releases it).
#[derive(Debug)]
pub(crate) struct FileLock {
    _file: File,
}

impl FileLock {
    /// Take the lock without waiting; `Ok(None)` if someone else holds it.
    pub(crate) fn try_acquire(path: &Path) -> Result<Option<FileLock>, TemplateError> {
        let file = open_lock_file(path)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(FileLock { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(errno) => Err(TemplateError::io("flock", path, errno.into())),
        }
    }

    /// Wait until the lock is free, then take it.
    pub(crate) fn acquire(path: &Path) -> Result<FileLock, TemplateError> {
        let file = open_lock_file(path)?;
        loop {
            match flock(&file, FlockOperation::LockExclusive) {
                Ok(()) => return Ok(FileLock { _file: file }),
                Err(rustix::io::Errno::INTR) => continue,
                Err(errno) => return Err(TemplateError::io("flock", path, errno.into())),
            }
        }
    }
}

fn open_lock_file(path: &Path) -> Result<File, TemplateError> {
    // Each acquisition opens its own file description: flock locks belong to the open
    // file description, so two threads of one process also exclude each other.
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ctx("open lock file", path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_until_first_releases() {
        let dir = tempdir("lock");
        let path = dir.join("x.lock");
        let first = FileLock::acquire(&path).unwrap();
        assert!(FileLock::try_acquire(&path).unwrap().is_none());
        drop(first);
        assert!(FileLock::try_acquire(&path).unwrap().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempdir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "berth-template-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
