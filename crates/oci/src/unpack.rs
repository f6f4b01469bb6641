//! One OCI layer tar → one berth layer directory in the overlay format the runtime's
//! overlay reads (mounted with `userxattr` inside a user namespace, layers idmapped).
//!
//! What that overlay honours, as measured on kernel 6.18 (see `tests/pull.rs`):
//! a 0/0 character device is a whiteout, `user.overlay.opaque=y` makes a directory
//! opaque; `trusted.overlay.*` is ignored there (a user namespace cannot read the
//! trusted namespace). So `.wh.<name>` becomes a 0/0 char device `<name>` and
//! `.wh..wh..opq` becomes `user.overlay.opaque=y` on its directory.
//!
//! Safety: every path is relative and free of `..` (else the layer is refused), and
//! nothing is ever written through a symlink: each parent of an entry must be a real
//! directory of this layer (missing ones are created). Only this thread writes the
//! staging directory, so the checks cannot race. Owners are kept numerically (host ids
//! 0..65535, which the runtime idmaps per sandbox); `user.*` xattrs are kept except
//! `user.overlay.*` (the overlay's own, which an image must not forge); other xattrs,
//! device nodes and sockets are skipped and counted.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, Timespec, Timestamps};

use crate::error::OciError;

/// Counts of what an unpack did, for the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnpackStats {
    pub entries: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    pub skipped_devices: u64,
    pub skipped_xattrs: u64,
    pub bytes: u64,
}

const OPAQUE_XATTR: &str = "user.overlay.opaque";
const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const BLOCK: usize = 4096;

/// Unpacks the tar stream `archive` into `rootfs` (an empty directory). `digest`
/// names the layer in errors.
pub fn unpack_layer(
    archive: impl Read,
    rootfs: &Path,
    digest: &str,
) -> Result<UnpackStats, OciError> {
    let mut unpacker = Unpacker {
        rootfs,
        digest,
        stats: UnpackStats::default(),
        dir_times: HashMap::new(),
    };
    let mut archive = tar::Archive::new(archive);
    let entries = archive
        .entries()
        .map_err(|e| unpacker.bad_archive(e.to_string()))?;
    for entry in entries {
        let entry = entry.map_err(|e| unpacker.bad_archive(e.to_string()))?;
        unpacker.entry(entry)?;
    }
    // Directory times last: creating their children changed them.
    for (path, mtime) in std::mem::take(&mut unpacker.dir_times) {
        set_times(&path, mtime).map_err(|e| OciError::io("set times of", &path, e))?;
    }
    Ok(unpacker.stats)
}

struct Unpacker<'a> {
    rootfs: &'a Path,
    digest: &'a str,
    stats: UnpackStats,
    dir_times: HashMap<PathBuf, i64>,
}

/// Metadata of one entry, PAX overrides applied.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    xattrs: Vec<(CString, Vec<u8>)>,
}

impl Unpacker<'_> {
    fn bad_archive(&self, detail: String) -> OciError {
        OciError::BadArchive {
            digest: self.digest.to_string(),
            detail,
        }
    }

    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), OciError> {
        self.stats.entries += 1;
        let raw_path = entry.path_bytes().into_owned();
        let Some(relative) = self.relative(&raw_path)? else {
            // The layer root itself ("./"): nothing to create.
            return Ok(());
        };
        let meta = self.meta(&mut entry, &relative)?;
        let name = relative
            .file_name()
            .map(|n| n.as_bytes().to_vec())
            .unwrap_or_default();
        let parent_rel = relative.parent().unwrap_or(Path::new(""));
        if name == OPAQUE_MARKER {
            let dir = self.ensure_dir(parent_rel)?;
            set_xattr(&dir, OPAQUE_XATTR, b"y")
                .map_err(|e| OciError::io("mark opaque", &dir, e))?;
            self.stats.opaque_dirs += 1;
            return Ok(());
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.starts_with(WHITEOUT_PREFIX) || hidden.is_empty() {
                // Other AUFS metadata (.wh..wh.plnk and friends): not part of the tree.
                return Ok(());
            }
            let parent = self.ensure_dir(parent_rel)?;
            let target = parent.join(OsStr::from_bytes(hidden));
            remove_existing(&target)?;
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &target,
                FileType::CharacterDevice,
                Mode::from_raw_mode(0o000),
                rustix::fs::makedev(0, 0),
            )
            .map_err(|e| OciError::io("create whiteout", &target, e.into()))?;
            self.stats.whiteouts += 1;
            return Ok(());
        }
        let parent = self.ensure_dir(parent_rel)?;
        let target = parent.join(relative.file_name().expect("relative paths have a name"));
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Directory => {
                match fs::symlink_metadata(&target) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove_existing(&target)?;
                        fs::create_dir(&target).map_err(|e| OciError::io("create", &target, e))?;
                    }
                    Err(_) => {
                        fs::create_dir(&target).map_err(|e| OciError::io("create", &target, e))?;
                    }
                }
                self.apply(&target, &meta)?;
                self.dir_times.insert(target, meta.mtime);
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                remove_existing(&target)?;
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc_o_nofollow())
                    .mode(0o600)
                    .open(&target)
                    .map_err(|e| OciError::io("create", &target, e))?;
                let written = write_sparse(&mut entry, &mut file)
                    .map_err(|e| OciError::io("write", &target, e))?;
                self.stats.bytes += written;
                drop(file);
                self.apply(&target, &meta)?;
                set_times(&target, meta.mtime)
                    .map_err(|e| OciError::io("set times of", &target, e))?;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| self.bad_archive(format!("symlink {relative:?} has no target")))?
                    .into_owned();
                remove_existing(&target)?;
                symlink(OsStr::from_bytes(&link), &target)
                    .map_err(|e| OciError::io("create symlink", &target, e))?;
                std::os::unix::fs::lchown(&target, Some(meta.uid), Some(meta.gid))
                    .map_err(|e| OciError::io("chown", &target, e))?;
                self.xattrs(&target, &meta)?;
                set_times(&target, meta.mtime)
                    .map_err(|e| OciError::io("set times of", &target, e))?;
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        self.bad_archive(format!("hard link {relative:?} has no target"))
                    })?
                    .into_owned();
                let bad_link = || OciError::BadHardLink {
                    digest: self.digest.to_string(),
                    path: relative.display().to_string(),
                    target: String::from_utf8_lossy(&link).into_owned(),
                };
                let source_rel = self.relative(&link)?.ok_or_else(bad_link)?;
                let source = self.existing_path(&source_rel).ok_or_else(bad_link)?;
                match fs::symlink_metadata(&source) {
                    Ok(m) if !m.is_dir() => {}
                    _ => return Err(bad_link()),
                }
                if source != target {
                    remove_existing(&target)?;
                    fs::hard_link(&source, &target)
                        .map_err(|e| OciError::io("hard link", &target, e))?;
                }
            }
            tar::EntryType::Fifo => {
                remove_existing(&target)?;
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &target,
                    FileType::Fifo,
                    Mode::from_raw_mode(0o600),
                    0,
                )
                .map_err(|e| OciError::io("create fifo", &target, e.into()))?;
                self.apply(&target, &meta)?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                // A sandbox's /dev is its own tmpfs; device nodes in a layer would be
                // unusable there (nodev) and are never needed.
                self.stats.skipped_devices += 1;
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => {}
            other => {
                return Err(
                    self.bad_archive(format!("entry {relative:?} has unsupported type {other:?}"))
                )
            }
        }
        Ok(())
    }

    /// The entry path made relative and checked; None for the root itself.
    fn relative(&self, raw: &[u8]) -> Result<Option<PathBuf>, OciError> {
        let traversal = || OciError::PathTraversal {
            digest: self.digest.to_string(),
            path: String::from_utf8_lossy(raw).into_owned(),
        };
        let mut relative = PathBuf::new();
        for component in Path::new(OsStr::from_bytes(raw)).components() {
            match component {
                Component::Normal(part) => relative.push(part),
                Component::CurDir => {}
                Component::RootDir | Component::ParentDir | Component::Prefix(_) => {
                    return Err(traversal())
                }
            }
        }
        Ok((!relative.as_os_str().is_empty()).then_some(relative))
    }

    /// The host path of `relative` if every parent is a real directory of this layer.
    fn existing_path(&self, relative: &Path) -> Option<PathBuf> {
        let mut path = self.rootfs.to_path_buf();
        let mut components = relative.components().peekable();
        while let Some(component) = components.next() {
            path.push(component);
            if components.peek().is_some() && !is_real_dir(&path) {
                return None;
            }
        }
        Some(path)
    }

    /// The host path of directory `relative`, creating missing directories (0755,
    /// root) and refusing to pass through anything that is not a real directory.
    fn ensure_dir(&self, relative: &Path) -> Result<PathBuf, OciError> {
        let mut path = self.rootfs.to_path_buf();
        for component in relative.components() {
            path.push(component);
            match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    // A file or symlink where the tar later puts children: the later
                    // entry wins, as a directory.
                    remove_existing(&path)?;
                    create_implied_dir(&path)?;
                }
                Err(_) => create_implied_dir(&path)?,
            }
        }
        Ok(path)
    }

    fn meta<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        relative: &Path,
    ) -> Result<Meta, OciError> {
        let header = entry.header();
        let mut uid = header.uid().map_err(|e| self.bad_archive(e.to_string()))?;
        let mut gid = header.gid().map_err(|e| self.bad_archive(e.to_string()))?;
        let mut mtime = header
            .mtime()
            .map_err(|e| self.bad_archive(e.to_string()))? as i64;
        let mode = header.mode().map_err(|e| self.bad_archive(e.to_string()))? & 0o7777;
        let mut xattrs = Vec::new();
        if let Some(extensions) = entry
            .pax_extensions()
            .map_err(|e| self.bad_archive(e.to_string()))?
        {
            for extension in extensions {
                let extension = extension.map_err(|e| self.bad_archive(e.to_string()))?;
                let key = extension.key_bytes();
                let value = extension.value_bytes();
                let number = || {
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.split('.').next())
                        .and_then(|v| v.parse::<i64>().ok())
                };
                match key {
                    b"uid" => uid = number().unwrap_or(-1i64) as u64,
                    b"gid" => gid = number().unwrap_or(-1i64) as u64,
                    b"mtime" => mtime = number().unwrap_or(mtime),
                    _ => {
                        if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                            let keep =
                                name.starts_with(b"user.") && !name.starts_with(b"user.overlay.");
                            match CString::new(name) {
                                Ok(name) if keep => xattrs.push((name, value.to_vec())),
                                _ => self.stats.skipped_xattrs += 1,
                            }
                        }
                    }
                }
            }
        }
        for id in [uid, gid] {
            if id > 65_535 {
                return Err(OciError::UnmappableOwner {
                    digest: self.digest.to_string(),
                    path: relative.display().to_string(),
                    id,
                });
            }
        }
        Ok(Meta {
            mode,
            uid: uid as u32,
            gid: gid as u32,
            mtime,
            xattrs,
        })
    }

    /// Owner, then mode (chown clears set-id bits), then xattrs.
    fn apply(&self, path: &Path, meta: &Meta) -> Result<(), OciError> {
        std::os::unix::fs::lchown(path, Some(meta.uid), Some(meta.gid))
            .map_err(|e| OciError::io("chown", path, e))?;
        fs::set_permissions(path, fs::Permissions::from_mode(meta.mode))
            .map_err(|e| OciError::io("chmod", path, e))?;
        self.xattrs(path, meta)
    }

    fn xattrs(&self, path: &Path, meta: &Meta) -> Result<(), OciError> {
        for (name, value) in &meta.xattrs {
            rustix::fs::lsetxattr(
                path,
                name.as_c_str(),
                value,
                rustix::fs::XattrFlags::empty(),
            )
            .map_err(|e| OciError::io("set xattr on", path, e.into()))?;
        }
        Ok(())
    }
}

fn libc_o_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Removes whatever is at `path` (a whole tree for a directory); nothing there is fine.
fn remove_existing(path: &Path) -> Result<(), OciError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            fs::remove_dir_all(path).map_err(|e| OciError::io("replace", path, e))
        }
        Ok(_) => fs::remove_file(path).map_err(|e| OciError::io("replace", path, e)),
        Err(_) => Ok(()),
    }
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let name = CString::new(name).expect("xattr names have no NUL");
    rustix::fs::lsetxattr(path, &name, value, rustix::fs::XattrFlags::empty())?;
    Ok(())
}

fn set_times(path: &Path, mtime: i64) -> io::Result<()> {
    let time = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &Timestamps {
            last_access: time,
            last_modification: time,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// Copies `reader` into `file`, leaving holes where whole blocks are zero, so sparse
/// files (and files full of zeros) stay small. Returns the file's length.
pub(crate) fn write_sparse(reader: &mut impl Read, file: &mut fs::File) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 * BLOCK];
    let mut length = 0u64;
    loop {
        let n = read_full(reader, &mut buf)?;
        if n == 0 {
            break;
        }
        for block in buf[..n].chunks(BLOCK) {
            if block.iter().all(|b| *b == 0) {
                file.seek(SeekFrom::Current(block.len() as i64))?;
            } else {
                file.write_all(block)?;
            }
        }
        length += n as u64;
    }
    file.set_len(length)?;
    Ok(length)
}

fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Allocated bytes of `path` (for tests of sparseness).
/// A directory the archive implies but does not list: 0755, as image builders make
/// them, whatever berth's (owner-only) umask.
fn create_implied_dir(path: &Path) -> Result<(), OciError> {
    fs::create_dir(path).map_err(|e| OciError::io("create", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .map_err(|e| OciError::io("chmod", path, e))
}

#[cfg(test)]
fn allocated(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::blocks(&fs::metadata(path).unwrap()) * 512
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    fn header(path: &str, kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_path(path).unwrap();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        h
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32, uid: u64) {
        let mut h = header(path, tar::EntryType::Regular, data.len() as u64, mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn dir(b: &mut tar::Builder<Vec<u8>>, path: &str) {
        b.append(&header(path, tar::EntryType::Directory, 0, 0o755), &[][..])
            .unwrap();
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
        let mut h = header(path, kind, 0, 0o777);
        h.set_link_name(target).unwrap();
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }

    /// A tar whose entry path is written raw into the header (the tar crate refuses
    /// to build hostile paths itself).
    fn raw_path_tar(path: &[u8]) -> Vec<u8> {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1);
        h.set_mode(0o644);
        h.set_cksum();
        let mut bytes = h.as_bytes().to_vec();
        bytes.extend_from_slice(b"x");
        bytes.resize(1024, 0);
        bytes.extend_from_slice(&[0u8; 1024]);
        bytes
    }

    #[test]
    fn files_links_whiteouts_and_opaque_dirs_convert() {
        let root = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        dir(&mut b, "./");
        dir(&mut b, "etc/");
        file(&mut b, "etc/hostname", b"box\n", 0o644, 0);
        file(&mut b, "usr/bin/tool", b"#!/bin/sh\n", 0o4755, 1000);
        link(&mut b, tar::EntryType::Symlink, "usr/bin/alias", "tool");
        link(&mut b, tar::EntryType::Link, "usr/bin/hard", "usr/bin/tool");
        file(&mut b, "etc/.wh.motd", b"", 0o644, 0);
        dir(&mut b, "var/cache/");
        file(&mut b, "var/cache/.wh..wh..opq", b"", 0o644, 0);
        file(&mut b, "var/cache/kept", b"k", 0o600, 0);
        file(&mut b, ".wh..wh.plnk", b"", 0o644, 0);
        let mut dev = header("dev/null", tar::EntryType::Char, 0, 0o666);
        dev.set_device_major(1).unwrap();
        dev.set_device_minor(3).unwrap();
        dev.set_cksum();
        b.append(&dev, &[][..]).unwrap();
        let tar = b.into_inner().unwrap();

        let stats = unpack_layer(&tar[..], root.path(), "sha256:test").unwrap();
        let r = root.path();
        assert_eq!(fs::read_to_string(r.join("etc/hostname")).unwrap(), "box\n");
        let tool = fs::metadata(r.join("usr/bin/tool")).unwrap();
        assert_eq!(tool.mode() & 0o7777, 0o4755, "set-uid kept after chown");
        assert_eq!((tool.uid(), tool.gid()), (1000, 1000));
        assert_eq!(tool.nlink(), 2);
        assert_eq!(
            fs::read_link(r.join("usr/bin/alias")).unwrap(),
            Path::new("tool")
        );
        let whiteout = fs::symlink_metadata(r.join("etc/motd")).unwrap();
        assert!(whiteout.file_type().is_char_device());
        assert_eq!(whiteout.rdev(), 0);
        let mut value = [0u8; 8];
        let n = rustix::fs::lgetxattr(r.join("var/cache"), OPAQUE_XATTR, &mut value).unwrap();
        assert_eq!(&value[..n], b"y");
        assert!(r.join("var/cache/kept").is_file());
        assert!(!r.join("dev/null").exists());
        assert!(!r.join(".wh..wh.plnk").exists());
        assert_eq!(stats.whiteouts, 1);
        assert_eq!(stats.opaque_dirs, 1);
        assert_eq!(stats.skipped_devices, 1);
        assert_eq!(
            fs::metadata(r.join("etc/hostname")).unwrap().mtime(),
            1_700_000_000
        );
    }

    #[test]
    fn traversal_paths_are_refused() {
        for path in [&b"../escape"[..], b"/etc/passwd", b"a/../../b"] {
            let root = tempfile::tempdir().unwrap();
            let err = unpack_layer(&raw_path_tar(path)[..], root.path(), "sha256:t").unwrap_err();
            assert!(
                matches!(err, OciError::PathTraversal { .. }),
                "{path:?}: {err}"
            );
        }
    }

    #[test]
    fn nothing_is_written_through_a_symlink() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        link(
            &mut b,
            tar::EntryType::Symlink,
            "escape",
            outside.path().to_str().unwrap(),
        );
        file(&mut b, "escape/owned", b"x", 0o644, 0);
        link(&mut b, tar::EntryType::Symlink, "etc", "/etc");
        link(&mut b, tar::EntryType::Link, "stolen", "etc/shadow");
        let tar = b.into_inner().unwrap();
        let err = unpack_layer(&tar[..], root.path(), "sha256:t").unwrap_err();
        assert!(matches!(err, OciError::BadHardLink { .. }), "{err}");
        assert!(!outside.path().join("owned").exists());
        // The symlinked parent was replaced by a real directory of the layer.
        assert!(is_real_dir(&root.path().join("escape")));
        assert!(!root.path().join("stolen").exists());
    }

    #[test]
    fn owners_beyond_a_sandbox_range_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "f", b"x", 0o644, 70_000);
        let tar = b.into_inner().unwrap();
        let err = unpack_layer(&tar[..], root.path(), "sha256:t").unwrap_err();
        assert!(matches!(err, OciError::UnmappableOwner { id: 70_000, .. }));
    }

    #[test]
    fn zero_blocks_become_holes() {
        let root = tempfile::tempdir().unwrap();
        let mut data = vec![0u8; 4 << 20];
        data[0] = 1;
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "sparse", &data, 0o644, 0);
        let tar = b.into_inner().unwrap();
        unpack_layer(&tar[..], root.path(), "sha256:t").unwrap();
        let path = root.path().join("sparse");
        assert_eq!(fs::read(&path).unwrap(), data);
        assert!(
            allocated(&path) < 64 * 1024,
            "{} allocated",
            allocated(&path)
        );
    }

    #[test]
    fn image_xattrs_cannot_forge_overlay_markers() {
        let root = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        b.append_pax_extensions([
            ("SCHILY.xattr.user.overlay.opaque", &b"y"[..]),
            ("SCHILY.xattr.user.mime", &b"text/plain"[..]),
            ("SCHILY.xattr.security.capability", &b"\x01"[..]),
        ])
        .unwrap();
        dir(&mut b, "d/");
        let tar = b.into_inner().unwrap();
        let stats = unpack_layer(&tar[..], root.path(), "sha256:t").unwrap();
        let d = root.path().join("d");
        let mut value = [0u8; 32];
        assert!(rustix::fs::lgetxattr(&d, OPAQUE_XATTR, &mut value).is_err());
        let n = rustix::fs::lgetxattr(&d, "user.mime", &mut value).unwrap();
        assert_eq!(&value[..n], b"text/plain");
        assert_eq!(stats.skipped_xattrs, 2);
    }
}
