//! `EntryInfo` of a path, as E2B's envd fills it.
//!
//! - `type`: file, directory, else unspecified; for a symlink, the type of what it
//!   finally points at (unspecified when that is missing), as E2B's envd reports it —
//!   `symlink_target` being set is what marks the entry as a link.
//! - `mode`: the permission bits (`0o777` part) of the entry, or of a symlink's target
//!   (0 when the target is missing), like Go's `FileMode.Perm()`.
//! - `permissions`: Go's `FileMode.String()` of the entry itself, e.g. `-rw-r--r--`,
//!   `drwxr-xr-x`, `Lrwxrwxrwx` (Go marks symlinks `L`), `dtrwxrwxrwx` (sticky).
//! - `owner`/`group`: names from `/etc/passwd`/`/etc/group`, numbers when unnamed.
//! - `symlink_target`: the fully resolved target of a symlink (the link's own path when
//!   it cannot be resolved).
//! - `metadata`: the `user.e2b.*` extended attributes.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use berth_envd_proto::filesystem::{EntryInfo, FileType};
use berth_envd_proto::timestamp::Timestamp;

use crate::files::metadata;
use crate::users::IdNames;

/// Go's `FileMode.String()` for a Unix `st_mode`.
pub fn permissions_string(st_mode: u32) -> String {
    let kind = st_mode & libc::S_IFMT;
    let mut out = String::with_capacity(12);
    // Go's order of type letters: d a l T L D p S u g c t ?.
    if kind == libc::S_IFDIR {
        out.push('d');
    }
    if kind == libc::S_IFLNK {
        out.push('L');
    }
    if kind == libc::S_IFBLK || kind == libc::S_IFCHR {
        out.push('D');
    }
    if kind == libc::S_IFIFO {
        out.push('p');
    }
    if kind == libc::S_IFSOCK {
        out.push('S');
    }
    if st_mode & libc::S_ISUID != 0 {
        out.push('u');
    }
    if st_mode & libc::S_ISGID != 0 {
        out.push('g');
    }
    if kind == libc::S_IFCHR {
        out.push('c');
    }
    if st_mode & libc::S_ISVTX != 0 {
        out.push('t');
    }
    if out.is_empty() {
        out.push('-');
    }
    const RWX: &[u8; 9] = b"rwxrwxrwx";
    for (i, letter) in RWX.iter().enumerate() {
        let bit = 1 << (8 - i);
        out.push(if st_mode & bit != 0 {
            char::from(*letter)
        } else {
            '-'
        });
    }
    out
}

fn timestamp(seconds: i64, nanos: i64) -> Timestamp {
    Timestamp {
        seconds,
        nanos: i32::try_from(nanos).unwrap_or(0),
    }
}

fn kind_of(file_type: std::fs::FileType) -> FileType {
    if file_type.is_dir() {
        FileType::Directory
    } else if file_type.is_file() {
        FileType::File
    } else {
        FileType::Unspecified
    }
}

/// The `EntryInfo` of `path` (not following a final symlink). `path` is reported as
/// given, so callers pass the path the client asked about.
pub fn entry_info(path: &Path, names: &IdNames) -> io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(path)?;
    let file_type = meta.file_type();
    let (entry_type, mode, symlink_target) = if file_type.is_symlink() {
        let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let (target_type, target_mode) = match std::fs::metadata(path) {
            Ok(target) => (kind_of(target.file_type()), target.mode() & 0o777),
            Err(_) => (FileType::Unspecified, 0),
        };
        (
            target_type,
            target_mode,
            Some(target.to_string_lossy().into_owned()),
        )
    } else {
        (kind_of(file_type), meta.mode() & 0o777, None)
    };
    let name = match path.file_name() {
        Some(name) => name.to_string_lossy().into_owned(),
        None => "/".to_owned(),
    };
    Ok(EntryInfo {
        name,
        r#type: entry_type as i32,
        path: path.to_string_lossy().into_owned(),
        size: i64::try_from(meta.size()).unwrap_or(i64::MAX),
        mode,
        permissions: permissions_string(meta.mode()),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
        modified_time: Some(timestamp(meta.mtime(), meta.mtime_nsec())),
        symlink_target,
        // Unreadable attributes must not hide the entry.
        metadata: metadata::read(path)
            .unwrap_or_default()
            .into_iter()
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_strings_match_go() {
        assert_eq!(permissions_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(permissions_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(permissions_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            permissions_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(
            permissions_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
        assert_eq!(permissions_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(permissions_string(libc::S_IFBLK | 0o660), "Drw-rw----");
        assert_eq!(permissions_string(libc::S_IFIFO | 0o600), "prw-------");
        assert_eq!(permissions_string(libc::S_IFSOCK | 0o777), "Srwxrwxrwx");
        assert_eq!(permissions_string(libc::S_IFREG), "----------");
    }

    #[test]
    fn entry_info_of_file_dir_and_symlinks() {
        let dir = std::env::temp_dir().join(format!("berth-envd-entry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        struct Cleanup<'a>(&'a Path);
        impl Drop for Cleanup<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(self.0);
            }
        }
        let _cleanup = Cleanup(&dir);
        let file = dir.join("f.txt");
        std::fs::write(&file, b"12345").unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o640))
            .unwrap();
        std::os::unix::fs::symlink(&file, dir.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.join("gone"), dir.join("broken")).unwrap();
        std::os::unix::fs::symlink(dir.join("sub"), dir.join("dirlink")).unwrap();
        let names = IdNames::default();
        let uid = rustix::process::geteuid().as_raw().to_string();

        let info = entry_info(&file, &names).unwrap();
        assert_eq!(info.name, "f.txt");
        assert_eq!(info.r#type, FileType::File as i32);
        assert_eq!(info.path, file.to_str().unwrap());
        assert_eq!(info.size, 5);
        assert_eq!(info.mode, 0o640);
        assert_eq!(info.permissions, "-rw-r-----");
        assert_eq!(info.owner, uid);
        assert!(info.modified_time.unwrap().seconds > 1_600_000_000);
        assert_eq!(info.symlink_target, None);

        let sub = entry_info(&dir.join("sub"), &names).unwrap();
        assert_eq!(sub.r#type, FileType::Directory as i32);
        assert!(sub.permissions.starts_with('d'));

        let link = entry_info(&dir.join("link"), &names).unwrap();
        assert_eq!(link.r#type, FileType::File as i32);
        assert_eq!(link.mode, 0o640);
        assert_eq!(link.permissions, "Lrwxrwxrwx");
        assert_eq!(
            link.symlink_target.as_deref(),
            Some(std::fs::canonicalize(&file).unwrap().to_str().unwrap())
        );

        let dir_link = entry_info(&dir.join("dirlink"), &names).unwrap();
        assert_eq!(dir_link.r#type, FileType::Directory as i32);
        assert_eq!(dir_link.permissions, "Lrwxrwxrwx");
        assert!(dir_link.symlink_target.unwrap().ends_with("/sub"));

        let broken = entry_info(&dir.join("broken"), &names).unwrap();
        assert_eq!(broken.r#type, FileType::Unspecified as i32);
        assert_eq!(broken.mode, 0);
        assert_eq!(
            broken.symlink_target.as_deref(),
            Some(dir.join("broken").to_str().unwrap())
        );

        let err = entry_info(&dir.join("missing"), &names).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
