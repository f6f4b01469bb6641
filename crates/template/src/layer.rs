//! Layer ids and staged (not yet committed) layers.

use std::fmt;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{IoContext, TemplateError};

/// A layer's id: 64 lowercase hex digits of a sha256, either of the recipe that built
/// it (so a changed recipe names a new layer) or of its content (for layers made from a
/// directory, e.g. a snapshot's upper dir). Used verbatim as a directory name, so it
/// never contains ':' or ',' (overlayfs option separators).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LayerId(String);

impl LayerId {
    /// The id of whatever `bytes` describe (a serialized recipe, usually).
    pub fn of_bytes(bytes: &[u8]) -> LayerId {
        LayerId(hex(&Sha256::digest(bytes)))
    }

    /// The id of a directory tree's content: paths, types, modes, owners, device
    /// numbers, xattrs (overlay whiteouts and opaque markers), link targets and file
    /// bytes. Two trees that would mount identically get the same id.
    pub fn of_tree(root: &Path) -> Result<LayerId, TemplateError> {
        let mut hasher = Sha256::new();
        hash_entry(&mut hasher, root, Path::new(""))?;
        Ok(LayerId(hex(&hasher.finalize())))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for LayerId {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        let valid = value.len() == 64
            && value
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if valid {
            Ok(LayerId(value))
        } else {
            Err(format!("layer id {value:?} is not 64 lowercase hex digits"))
        }
    }
}

impl From<LayerId> for String {
    fn from(id: LayerId) -> String {
        id.0
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hash_entry(hasher: &mut Sha256, root: &Path, relative: &Path) -> Result<(), TemplateError> {
    let path = root.join(relative);
    let meta = fs::symlink_metadata(&path).ctx("stat", &path)?;
    let file_type = meta.file_type();
    // Length-prefix every field so no two different trees produce the same stream.
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    field(relative.as_os_str().as_encoded_bytes());
    field(&meta.mode().to_le_bytes());
    field(&meta.uid().to_le_bytes());
    field(&meta.gid().to_le_bytes());
    if file_type.is_char_device() || file_type.is_block_device() {
        field(&meta.rdev().to_le_bytes());
    }
    for (name, value) in xattrs(&path)? {
        field(&name);
        field(&value);
    }
    if file_type.is_symlink() {
        let target = fs::read_link(&path).ctx("readlink", &path)?;
        field(target.as_os_str().as_encoded_bytes());
    } else if file_type.is_file() {
        field(&meta.len().to_le_bytes());
        let mut file = fs::File::open(&path).ctx("open", &path)?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = file.read(&mut buf).ctx("read", &path)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
    } else if file_type.is_dir() {
        let mut names: Vec<_> = fs::read_dir(&path)
            .ctx("read dir", &path)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .ctx("read dir", &path)?;
        names.sort();
        for name in names {
            hash_entry(hasher, root, &relative.join(name))?;
        }
    }
    Ok(())
}

/// An extended attribute's name and value.
type Xattr = (Vec<u8>, Vec<u8>);

/// Extended attributes of `path` (not following symlinks), sorted by name.
fn xattrs(path: &Path) -> Result<Vec<Xattr>, TemplateError> {
    let mut names = vec![0u8; 4096];
    let len = match rustix::fs::llistxattr(path, &mut names) {
        Ok(len) => len,
        Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
        Err(errno) => return Err(TemplateError::io("listxattr", path, errno.into())),
    };
    let mut attrs = Vec::new();
    for name in names[..len].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let mut value = vec![0u8; 64 * 1024];
        let c_name = std::ffi::CString::new(name).expect("xattr names have no NUL");
        let n = rustix::fs::lgetxattr(path, &c_name, &mut value)
            .map_err(|errno| TemplateError::io("getxattr", path, errno.into()))?;
        value.truncate(n);
        attrs.push((name.to_vec(), value));
    }
    attrs.sort();
    Ok(attrs)
}

/// A layer being assembled in the store's staging area. Fill [`StagedLayer::rootfs`],
/// then hand it to [`crate::TemplateStore::commit_layer`]. Dropped without commit, it
/// removes its directory.
#[derive(Debug)]
pub struct StagedLayer {
    /// `staging/<name>/`; holds `rootfs/`.
    pub(crate) dir: PathBuf,
    pub(crate) committed: bool,
}

impl StagedLayer {
    /// The directory to fill; becomes the layer's `rootfs/`.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }
}

impl Drop for StagedLayer {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Bytes used by a tree (allocated blocks, hard links counted once).
pub(crate) fn disk_usage(root: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir() {
            if let Ok(entries) = fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn tree(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("berth-layer-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("etc")).unwrap();
        fs::write(dir.join("etc/hostname"), "sandbox\n").unwrap();
        symlink("hostname", dir.join("etc/name")).unwrap();
        dir
    }

    #[test]
    fn recipe_ids_are_stable_and_distinct() {
        assert_eq!(LayerId::of_bytes(b"recipe"), LayerId::of_bytes(b"recipe"));
        assert_ne!(LayerId::of_bytes(b"recipe"), LayerId::of_bytes(b"recipe2"));
        assert_eq!(LayerId::of_bytes(b"x").as_str().len(), 64);
    }

    #[test]
    fn tree_id_follows_content_mode_and_links() {
        let a = tree("a");
        let b = tree("b");
        let same = LayerId::of_tree(&a).unwrap();
        assert_eq!(same, LayerId::of_tree(&b).unwrap());

        fs::write(b.join("etc/hostname"), "other\n").unwrap();
        let content_changed = LayerId::of_tree(&b).unwrap();
        assert_ne!(same, content_changed);

        fs::write(b.join("etc/hostname"), "sandbox\n").unwrap();
        fs::set_permissions(b.join("etc/hostname"), fs::Permissions::from_mode(0o600)).unwrap();
        assert_ne!(same, LayerId::of_tree(&b).unwrap());

        fs::set_permissions(b.join("etc/hostname"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(a.join("etc/hostname"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::remove_file(b.join("etc/name")).unwrap();
        symlink("elsewhere", b.join("etc/name")).unwrap();
        assert_ne!(LayerId::of_tree(&a).unwrap(), LayerId::of_tree(&b).unwrap());

        fs::remove_dir_all(&a).unwrap();
        fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn layer_id_rejects_separators_and_wrong_length() {
        assert!(LayerId::try_from("ab:cd".to_string()).is_err());
        assert!(LayerId::try_from("a".repeat(63)).is_err());
        assert!(LayerId::try_from("A".repeat(64)).is_err());
        assert!(LayerId::try_from("a".repeat(64)).is_ok());
    }
}
