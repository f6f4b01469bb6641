//! Per-restore views of a checkpoint's CRIU images, for restoring one checkpoint many
//! times as different sandboxes (snapshots, fork).
//!
//! A CRIU image is a 4-byte head magic (`IMG_COMMON_MAGIC`), a 4-byte image magic, then
//! entries of a little-endian `u32` length followed by one protobuf message (criu
//! `image.c`, `protobuf.c`). Almost everything CRIU records is relative to the dumped
//! namespaces: task credentials come from inside the user namespace, and the host ids
//! CRIU sees (ghost files, IPC objects, memfds, unix socket and tty owners, mount
//! options) are translated into the namespace's ids on dump (`userns_uid`). Two images
//! tie a dump to its source: the user namespace's uid/gid maps (`userns-<n>.img`, whose
//! `lower_first` are host ids) and the uts namespace's hostname (`utsns-<n>.img`).
//! [`prepare_restore_images`] rewrites those two into a new directory and hard-links
//! every other image from the shared, read-only checkpoint. Not symlinks: CRIU opens some
//! images (e.g. `pagemap`) from restored tasks that have already switched to the
//! sandbox's root, where an absolute link target does not resolve.

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use prost::Message;

const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
const USERNS_MAGIC: u32 = 0x5547_4906;
const UTSNS_MAGIC: u32 = 0x5447_3203;

/// `uid_gid_extent` of criu's `images/userns.proto`.
#[derive(Clone, PartialEq, Message)]
struct UidGidExtent {
    #[prost(uint32, required, tag = "1")]
    first: u32,
    #[prost(uint32, required, tag = "2")]
    lower_first: u32,
    #[prost(uint32, required, tag = "3")]
    count: u32,
}

/// `userns_entry` of criu's `images/userns.proto`.
#[derive(Clone, PartialEq, Message)]
struct UsernsEntry {
    #[prost(message, repeated, tag = "1")]
    uid_map: Vec<UidGidExtent>,
    #[prost(message, repeated, tag = "2")]
    gid_map: Vec<UidGidExtent>,
}

/// `utsns_entry` of criu's `images/utsns.proto`.
#[derive(Clone, PartialEq, Message)]
struct UtsnsEntry {
    #[prost(string, required, tag = "1")]
    nodename: String,
    #[prost(string, required, tag = "2")]
    domainname: String,
}

/// How a restore's images differ from the checkpoint's.
#[derive(Debug, Clone)]
pub struct ImageRewrite {
    /// New first host id of the restored user namespace's uid and gid maps: every extent
    /// keeps its inside ids and size and moves by the same offset, so the lowest
    /// `lower_first` of each map becomes this.
    pub lower_ids: u32,
    /// New hostname of the restored uts namespace.
    pub hostname: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("CRIU image {0}: {1}")]
    Malformed(String, String),
    #[error("checkpoint {0} has no user namespace image (not a sandbox's dump)")]
    NoUserns(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ImageError {
    let what = what.into();
    move |source| ImageError::Io { what, source }
}

/// Makes `dst` (must not exist) an images directory for one restore of the checkpoint
/// in `src`: the user and uts namespace images rewritten as `rewrite` says, every other
/// entry a hard link to its file in `src` (CRIU only reads images on restore, so restores
/// may share them), or a copy when `dst` is on another filesystem.
pub fn prepare_restore_images(
    src: &Path,
    dst: &Path,
    rewrite: &ImageRewrite,
) -> Result<(), ImageError> {
    let src = fs::canonicalize(src).map_err(io_err(format!("resolve {}", src.display())))?;
    std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o700)
        .create(dst)
        .map_err(io_err(format!("create {}", dst.display())))?;
    let mut saw_userns = false;
    for entry in fs::read_dir(&src).map_err(io_err(format!("list {}", src.display())))? {
        let entry = entry.map_err(io_err(format!("list {}", src.display())))?;
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        let from = entry.path();
        let to = dst.join(&name);
        if name_str.starts_with("userns-") && name_str.ends_with(".img") {
            saw_userns = true;
            rewrite_image(&from, &to, USERNS_MAGIC, |bytes| {
                let mut entry = UsernsEntry::decode(bytes).map_err(|e| e.to_string())?;
                shift_lower(&mut entry.uid_map, rewrite.lower_ids)?;
                shift_lower(&mut entry.gid_map, rewrite.lower_ids)?;
                Ok(entry.encode_to_vec())
            })?;
        } else if name_str.starts_with("utsns-") && name_str.ends_with(".img") {
            rewrite_image(&from, &to, UTSNS_MAGIC, |bytes| {
                let mut entry = UtsnsEntry::decode(bytes).map_err(|e| e.to_string())?;
                entry.nodename = rewrite.hostname.clone();
                Ok(entry.encode_to_vec())
            })?;
        } else {
            link_or_copy(&from, &to)?;
        }
    }
    if !saw_userns {
        return Err(ImageError::NoUserns(src.display().to_string()));
    }
    Ok(())
}

fn link_or_copy(from: &Path, to: &Path) -> Result<(), ImageError> {
    match fs::hard_link(from, to) {
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => fs::copy(from, to).map(drop),
        other => other,
    }
    .map_err(io_err(format!("link {}", to.display())))
}

/// Moves every extent of `map` so that the lowest `lower_first` becomes `lower_ids`.
fn shift_lower(map: &mut [UidGidExtent], lower_ids: u32) -> Result<(), String> {
    let Some(lowest) = map.iter().map(|e| e.lower_first).min() else {
        return Ok(());
    };
    for extent in map {
        extent.lower_first = (extent.lower_first - lowest)
            .checked_add(lower_ids)
            .filter(|last| last.checked_add(extent.count).is_some())
            .ok_or_else(|| format!("id map moved past 2^32 (base {lower_ids})"))?;
    }
    Ok(())
}

/// Copies the image `from` to `to` with every entry passed through `edit`.
fn rewrite_image(
    from: &Path,
    to: &Path,
    magic: u32,
    edit: impl Fn(&[u8]) -> Result<Vec<u8>, String>,
) -> Result<(), ImageError> {
    let shown = from.display().to_string();
    let bytes = fs::read(from).map_err(io_err(format!("read {shown}")))?;
    let bad = |why: String| ImageError::Malformed(shown.clone(), why);
    let word = |at: usize| -> Option<u32> {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if word(0) != Some(IMG_COMMON_MAGIC) || word(4) != Some(magic) {
        return Err(bad("unexpected magic".into()));
    }
    let mut out = bytes[..8].to_vec();
    let mut at = 8;
    while at < bytes.len() {
        let len = word(at).ok_or_else(|| bad("truncated entry length".into()))? as usize;
        let body = bytes
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| bad("truncated entry".into()))?;
        let edited = edit(body).map_err(bad)?;
        let edited_len = u32::try_from(edited.len()).map_err(|_| bad("entry too large".into()))?;
        out.extend_from_slice(&edited_len.to_le_bytes());
        out.extend_from_slice(&edited);
        at += 4 + len;
    }
    // CRIU's own mode for images (its restore tasks read them as the tree's root; the
    // caller keeps the directory from other users), whatever our umask.
    let write = || -> io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(to)?;
        file.set_permissions(fs::Permissions::from_mode(0o644))?;
        io::Write::write_all(&mut file, &out)
    };
    write().map_err(io_err(format!("write {}", to.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(magic: u32, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = IMG_COMMON_MAGIC.to_le_bytes().to_vec();
        out.extend_from_slice(&magic.to_le_bytes());
        for entry in entries {
            out.extend_from_slice(&(entry.len() as u32).to_le_bytes());
            out.extend_from_slice(entry);
        }
        out
    }

    fn extent(first: u32, lower_first: u32, count: u32) -> UidGidExtent {
        UidGidExtent {
            first,
            lower_first,
            count,
        }
    }

    #[test]
    fn rewrites_id_maps_and_hostname_and_links_the_rest() {
        let src = tempfile::tempdir().unwrap();
        let userns = UsernsEntry {
            uid_map: vec![extent(0, 1 << 30, 65536)],
            gid_map: vec![
                extent(0, 1 << 30, 1000),
                extent(1000, (1 << 30) + 1000, 64536),
            ],
        };
        let utsns = UtsnsEntry {
            nodename: "isource".into(),
            domainname: "(none)".into(),
        };
        fs::write(
            src.path().join("userns-11.img"),
            image(USERNS_MAGIC, &[userns.encode_to_vec()]),
        )
        .unwrap();
        fs::write(
            src.path().join("utsns-12.img"),
            image(UTSNS_MAGIC, &[utsns.encode_to_vec()]),
        )
        .unwrap();
        fs::write(src.path().join("pages-1.img"), b"memory").unwrap();

        let parent = tempfile::tempdir().unwrap();
        let dst = parent.path().join("images");
        let base = (1 << 30) + 3 * 65536;
        prepare_restore_images(
            src.path(),
            &dst,
            &ImageRewrite {
                lower_ids: base,
                hostname: "ifork".into(),
            },
        )
        .unwrap();

        let read_entry = |name: &str| {
            let bytes = fs::read(dst.join(name)).unwrap();
            assert_eq!(&bytes[..4], &IMG_COMMON_MAGIC.to_le_bytes());
            let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
            assert_eq!(bytes.len(), 12 + len);
            bytes[12..].to_vec()
        };
        let back = UsernsEntry::decode(&read_entry("userns-11.img")[..]).unwrap();
        assert_eq!(back.uid_map, vec![extent(0, base, 65536)]);
        assert_eq!(
            back.gid_map,
            vec![extent(0, base, 1000), extent(1000, base + 1000, 64536)]
        );
        let back = UtsnsEntry::decode(&read_entry("utsns-12.img")[..]).unwrap();
        assert_eq!(back.nodename, "ifork");
        assert_eq!(back.domainname, "(none)");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            fs::metadata(dst.join("pages-1.img")).unwrap().ino(),
            fs::metadata(src.path().join("pages-1.img")).unwrap().ino()
        );
        assert_eq!(fs::read(dst.join("pages-1.img")).unwrap(), b"memory");
        // The checkpoint itself is untouched.
        let original = fs::read(src.path().join("userns-11.img")).unwrap();
        assert_eq!(original, image(USERNS_MAGIC, &[userns.encode_to_vec()]));
    }

    #[test]
    fn refuses_foreign_images() {
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("userns-1.img"), image(UTSNS_MAGIC, &[])).unwrap();
        let parent = tempfile::tempdir().unwrap();
        let rewrite = ImageRewrite {
            lower_ids: 0,
            hostname: "x".into(),
        };
        let err = prepare_restore_images(src.path(), &parent.path().join("a"), &rewrite);
        assert!(matches!(err, Err(ImageError::Malformed(..))), "{err:?}");

        let empty = tempfile::tempdir().unwrap();
        let err = prepare_restore_images(empty.path(), &parent.path().join("b"), &rewrite);
        assert!(matches!(err, Err(ImageError::NoUserns(_))), "{err:?}");
    }
}
