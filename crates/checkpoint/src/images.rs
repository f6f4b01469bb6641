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
//!
//! [`forget_file_sizes`] drops the size CRIU recorded for some open files, so a restore
//! does not refuse them for having another size then (files whose content, and so
//! size, changes by itself, like the resource views of `/proc`).
//!
//! [`ghost_names`] reads which names a restore will create in the restored filesystem:
//! CRIU keeps the contents of a deleted file that a process still holds open (a "ghost")
//! and, on restore, recreates it under a name beside the original (`criu/files-reg.c`,
//! `ghost_path`) before reopening and unlinking it. A restore fails if that name exists.

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use prost::Message;

const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
const FILES_MAGIC: u32 = 0x5630_3138;
const USERNS_MAGIC: u32 = 0x5547_4906;
const UTSNS_MAGIC: u32 = 0x5447_3203;
/// `IMG_SERVICE_MAGIC`: the head of images that are not per-namespace (ghost files).
const IMG_SERVICE_MAGIC: u32 = 0x5510_5940;
/// `remap_type` GHOST of criu's `images/remap-file-path.proto`.
const REMAP_TYPE_GHOST: i32 = 1;
/// `fd_types` REG of criu's `images/fdinfo.proto`.
const FD_TYPE_REG: i32 = 1;
/// Old images mark ghost remaps with this bit of `remap_id` instead of `remap_type`.
const REMAP_GHOST_BIT: u32 = 1 << 31;

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

/// `remap_file_path_entry` of criu's `images/remap-file-path.proto`.
#[derive(Clone, PartialEq, Message)]
struct RemapFilePathEntry {
    #[prost(uint32, required, tag = "1")]
    orig_id: u32,
    #[prost(uint32, required, tag = "2")]
    remap_id: u32,
    #[prost(int32, optional, tag = "3")]
    remap_type: Option<i32>,
}

/// The fields of `file_entry` (criu's `images/fdinfo.proto`) read here.
#[derive(Clone, PartialEq, Message)]
struct FileEntry {
    #[prost(int32, required, tag = "1")]
    kind: i32,
    #[prost(uint32, required, tag = "2")]
    id: u32,
    #[prost(message, optional, tag = "3")]
    reg: Option<RegFileEntry>,
}

/// `file_entry.reg` (criu's `images/fdinfo.proto`).
const FILE_ENTRY_REG: u32 = 3;
/// `reg_file_entry.name` and `reg_file_entry.size` (criu's `images/regfile.proto`).
const REG_FILE_NAME: u32 = 6;
const REG_FILE_SIZE: u32 = 8;

/// The fields of `reg_file_entry` (criu's `images/regfile.proto`) read here.
#[derive(Clone, PartialEq, Message)]
struct RegFileEntry {
    #[prost(string, required, tag = "6")]
    name: String,
}

/// The fields of `ghost_file_entry` (criu's `images/ghost-file.proto`) read here.
#[derive(Clone, PartialEq, Message)]
struct GhostFileEntry {
    #[prost(uint32, required, tag = "3")]
    mode: u32,
}

/// A name a restore creates in the restored filesystem for a deleted, still-open file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GhostName {
    /// The deleted file, as an absolute path in the dumped mount namespace.
    pub file: String,
    /// The name CRIU creates for it (a deleted directory comes back at its own path).
    /// When its parent directory is gone too, CRIU goes up one directory at a time, as
    /// [`GhostName::candidates`] lists.
    pub name: String,
}

impl GhostName {
    /// `name`, then the same final component in each ancestor directory up to `/`:
    /// the places CRIU tries in turn when a parent directory does not exist.
    pub fn candidates(&self) -> Vec<String> {
        let (dir, last) = self.name.rsplit_once('/').unwrap_or(("", &self.name));
        let mut out = vec![self.name.clone()];
        let mut dir = dir;
        while let Some((parent, _)) = dir.rsplit_once('/') {
            out.push(format!("{parent}/{last}"));
            dir = parent;
        }
        out
    }
}

/// The names every ghost file of the dump in `images` gets on restore.
pub fn ghost_names(images: &Path) -> Result<Vec<GhostName>, ImageError> {
    let remaps = images.join("remap-fpath.img");
    if !remaps.exists() {
        return Ok(Vec::new());
    }
    let mut ghosts = Vec::new();
    for entry in read_entries(&remaps, None)? {
        let remap = RemapFilePathEntry::decode(entry.as_slice())
            .map_err(|e| ImageError::Malformed(remaps.display().to_string(), e.to_string()))?;
        let ghost = match remap.remap_type {
            Some(kind) => kind == REMAP_TYPE_GHOST,
            None => remap.remap_id & REMAP_GHOST_BIT != 0,
        };
        if ghost {
            ghosts.push((remap.orig_id, remap.remap_id & !REMAP_GHOST_BIT));
        }
    }
    if ghosts.is_empty() {
        return Ok(Vec::new());
    }
    let files = images.join("files.img");
    let mut paths = std::collections::HashMap::new();
    for entry in read_entries(&files, None)? {
        let file = FileEntry::decode(entry.as_slice())
            .map_err(|e| ImageError::Malformed(files.display().to_string(), e.to_string()))?;
        if let (FD_TYPE_REG, Some(reg)) = (file.kind, file.reg) {
            paths.insert(file.id, reg.name);
        }
    }
    let mut names = Vec::new();
    for (orig_id, remap_id) in ghosts {
        let Some(file) = paths.get(&orig_id) else {
            return Err(ImageError::Malformed(
                files.display().to_string(),
                format!("no regular file {orig_id} for ghost {remap_id:x}"),
            ));
        };
        let image = images.join(format!("ghost-file-{remap_id:x}.img"));
        // The entry is followed by the file's raw contents, not by more entries.
        let is_dir = match read_entries(&image, Some(1))?.first() {
            Some(entry) => {
                let ghost = GhostFileEntry::decode(entry.as_slice()).map_err(|e| {
                    ImageError::Malformed(image.display().to_string(), e.to_string())
                })?;
                ghost.mode & libc::S_IFMT == libc::S_IFDIR
            }
            None => false,
        };
        let name = if is_dir {
            file.clone()
        } else {
            format!("{file}.cr.{remap_id:x}.ghost")
        };
        names.push(GhostName {
            file: file.clone(),
            name,
        });
    }
    Ok(names)
}

/// Drops the size CRIU recorded for each open regular file of the dump in `images`
/// whose path (absolute, in the dumped mount namespace) is one of `paths`, so a restore
/// reopens it whatever its size then. CRIU checks that a reopened file has the size it
/// had at the dump (`validate_file` in criu's `files-reg.c`), which suits a file on
/// disk; for a file whose size follows its ever-changing content, it fails restores at
/// random. Everything else in the image stays as CRIU wrote it, unknown fields
/// included. Returns how many entries changed; a dump without open files is left alone.
pub fn forget_file_sizes(images: &Path, paths: &[&str]) -> Result<usize, ImageError> {
    let files = images.join("files.img");
    if !files.exists() {
        return Ok(0);
    }
    let wanted: Vec<&str> = paths.iter().map(|p| p.trim_start_matches('/')).collect();
    let changed = std::cell::Cell::new(0);
    let edited = images.join(".files.img.edited");
    let _ = fs::remove_file(&edited);
    rewrite_image(&files, &edited, FILES_MAGIC, |entry| {
        let (entry, forgot) = forget_size(entry, &wanted)?;
        changed.set(changed.get() + usize::from(forgot));
        Ok(entry)
    })?;
    if changed.get() == 0 {
        let _ = fs::remove_file(&edited);
        return Ok(0);
    }
    fs::rename(&edited, &files).map_err(io_err(format!("replace {}", files.display())))?;
    Ok(changed.get())
}

/// One field of a protobuf message as it is on the wire.
struct WireField<'a> {
    tag: u32,
    /// The whole field: key and value.
    raw: &'a [u8],
    /// A length-delimited field's payload.
    payload: Option<&'a [u8]>,
}

/// The fields of protobuf message `bytes`, in order. Groups (deprecated, unused by
/// CRIU) are refused.
fn wire_fields(bytes: &[u8]) -> Result<Vec<WireField<'_>>, String> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    let mut rest = bytes;
    let mut fields = Vec::new();
    while !rest.is_empty() {
        let start = bytes.len() - rest.len();
        let (tag, wire_type) = decode_key(&mut rest).map_err(|e| e.to_string())?;
        let mut payload = None;
        let skip = match wire_type {
            WireType::Varint => {
                decode_varint(&mut rest).map_err(|e| e.to_string())?;
                0
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let len = decode_varint(&mut rest).map_err(|e| e.to_string())?;
                let len = usize::try_from(len).map_err(|_| "field too long".to_owned())?;
                payload = Some(rest.get(..len).ok_or("truncated field")?);
                len
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(format!("field {tag} is a group"));
            }
        };
        rest = rest.get(skip..).ok_or("truncated field")?;
        let end = bytes.len() - rest.len();
        fields.push(WireField {
            tag,
            raw: &bytes[start..end],
            payload,
        });
    }
    Ok(fields)
}

/// `file_entry` bytes without the size of its regular file when that file's name is
/// one of `wanted` (paths without their leading `/`); whether it changed.
fn forget_size(entry: &[u8], wanted: &[&str]) -> Result<(Vec<u8>, bool), String> {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let fields = wire_fields(entry)?;
    let Some(reg) = fields
        .iter()
        .find(|f| f.tag == FILE_ENTRY_REG)
        .and_then(|f| f.payload)
    else {
        return Ok((entry.to_vec(), false));
    };
    let reg_fields = wire_fields(reg)?;
    let named = reg_fields.iter().any(|f| {
        f.tag == REG_FILE_NAME
            && f.payload
                .and_then(|name| std::str::from_utf8(name).ok())
                .is_some_and(|name| wanted.contains(&name.trim_start_matches('/')))
    });
    if !named || !reg_fields.iter().any(|f| f.tag == REG_FILE_SIZE) {
        return Ok((entry.to_vec(), false));
    }
    let mut new_reg = Vec::with_capacity(reg.len());
    for field in reg_fields.iter().filter(|f| f.tag != REG_FILE_SIZE) {
        new_reg.extend_from_slice(field.raw);
    }
    let mut out = Vec::with_capacity(entry.len());
    for field in &fields {
        if field.tag == FILE_ENTRY_REG {
            encode_key(FILE_ENTRY_REG, WireType::LengthDelimited, &mut out);
            encode_varint(new_reg.len() as u64, &mut out);
            out.extend_from_slice(&new_reg);
        } else {
            out.extend_from_slice(field.raw);
        }
    }
    Ok((out, true))
}

/// The protobuf bodies of the image at `path`, after its magic head: all of them, or
/// the first `limit`.
fn read_entries(path: &Path, limit: Option<usize>) -> Result<Vec<Vec<u8>>, ImageError> {
    let shown = path.display().to_string();
    let bytes = fs::read(path).map_err(io_err(format!("read {shown}")))?;
    let bad = |why: &str| ImageError::Malformed(shown.clone(), why.to_owned());
    let word = |at: usize| -> Option<u32> {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut at = match word(0) {
        Some(IMG_COMMON_MAGIC | IMG_SERVICE_MAGIC) => 8,
        _ => return Err(bad("unexpected magic")),
    };
    let mut entries = Vec::new();
    while at < bytes.len() && limit.is_none_or(|limit| entries.len() < limit) {
        let len = word(at).ok_or_else(|| bad("truncated entry length"))? as usize;
        let body = bytes
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| bad("truncated entry"))?;
        entries.push(body.to_vec());
        at += 4 + len;
    }
    Ok(entries)
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
    fn ghost_names_are_beside_the_deleted_files_and_directories_keep_theirs() {
        const REMAP_FPATH_MAGIC: u32 = 0x5944_2601;
        const FILES_MAGIC: u32 = 0x5637_3004;
        const GHOST_FILE_MAGIC: u32 = 0x5258_3605;
        let dir = tempfile::tempdir().unwrap();
        let remap = |orig_id, remap_id, remap_type| {
            RemapFilePathEntry {
                orig_id,
                remap_id,
                remap_type,
            }
            .encode_to_vec()
        };
        let reg = |id, name: &str| {
            FileEntry {
                kind: FD_TYPE_REG,
                id,
                reg: Some(RegFileEntry { name: name.into() }),
            }
            .encode_to_vec()
        };
        fs::write(
            dir.path().join("remap-fpath.img"),
            image(
                REMAP_FPATH_MAGIC,
                &[
                    remap(3, 0x1a, Some(REMAP_TYPE_GHOST)),
                    remap(4, 7, Some(0)),
                    remap(5, 2 | REMAP_GHOST_BIT, None),
                ],
            ),
        )
        .unwrap();
        fs::write(
            dir.path().join("files.img"),
            image(
                FILES_MAGIC,
                &[
                    reg(3, "/home/user/held"),
                    reg(4, "/tmp/linked"),
                    reg(5, "/tmp/gone"),
                ],
            ),
        )
        .unwrap();
        let ghost = |mode| {
            let mut out = IMG_SERVICE_MAGIC.to_le_bytes().to_vec();
            out.extend_from_slice(&GHOST_FILE_MAGIC.to_le_bytes());
            let body = GhostFileEntry { mode }.encode_to_vec();
            out.extend_from_slice(&(body.len() as u32).to_le_bytes());
            out.extend_from_slice(&body);
            out.extend_from_slice(b"the file's contents, not an entry");
            out
        };
        fs::write(dir.path().join("ghost-file-1a.img"), ghost(0o100644)).unwrap();
        fs::write(dir.path().join("ghost-file-2.img"), ghost(0o040755)).unwrap();
        let names = ghost_names(dir.path()).unwrap();
        assert_eq!(
            names,
            vec![
                GhostName {
                    file: "/home/user/held".into(),
                    name: "/home/user/held.cr.1a.ghost".into(),
                },
                GhostName {
                    file: "/tmp/gone".into(),
                    name: "/tmp/gone".into(),
                },
            ]
        );
        assert_eq!(
            names[0].candidates(),
            [
                "/home/user/held.cr.1a.ghost",
                "/home/held.cr.1a.ghost",
                "/held.cr.1a.ghost"
            ]
        );
        // A dump without deleted files has no remap image at all.
        let empty = tempfile::tempdir().unwrap();
        assert!(ghost_names(empty.path()).unwrap().is_empty());
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

    /// A `reg_file_entry` with more fields than this crate models, as CRIU writes it.
    #[derive(Clone, PartialEq, Message)]
    struct FullRegFile {
        #[prost(uint32, required, tag = "1")]
        id: u32,
        #[prost(uint32, required, tag = "2")]
        flags: u32,
        #[prost(uint64, required, tag = "3")]
        pos: u64,
        #[prost(string, required, tag = "6")]
        name: String,
        #[prost(sint32, optional, tag = "7")]
        mnt_id: Option<i32>,
        #[prost(uint64, optional, tag = "8")]
        size: Option<u64>,
        #[prost(uint32, optional, tag = "10")]
        mode: Option<u32>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct FullFileEntry {
        #[prost(int32, required, tag = "1")]
        kind: i32,
        #[prost(uint32, required, tag = "2")]
        id: u32,
        #[prost(message, optional, tag = "3")]
        reg: Option<FullRegFile>,
        #[prost(bytes, optional, tag = "9")]
        other: Option<Vec<u8>>,
    }

    #[test]
    fn sizes_of_the_named_files_alone_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let file = |id, name: &str| FullFileEntry {
            kind: FD_TYPE_REG,
            id,
            reg: Some(FullRegFile {
                id,
                flags: 0o100000,
                pos: 77,
                name: name.into(),
                mnt_id: Some(1234),
                size: Some(1181),
                mode: Some(0o100444),
            }),
            other: Some(b"kept".to_vec()),
        };
        let entries = [
            file(1, "/proc/stat"),
            file(2, "/home/user/data"),
            file(3, "proc/meminfo"),
            FullFileEntry {
                kind: 5,
                id: 4,
                reg: None,
                other: None,
            },
        ];
        let bytes: Vec<Vec<u8>> = entries.iter().map(|e| e.encode_to_vec()).collect();
        fs::write(dir.path().join("files.img"), image(FILES_MAGIC, &bytes)).unwrap();
        let changed = forget_file_sizes(
            dir.path(),
            &["/proc/stat", "/proc/meminfo", "/proc/cpuinfo"],
        )
        .unwrap();
        assert_eq!(changed, 2);
        let back: Vec<FullFileEntry> = read_entries(&dir.path().join("files.img"), None)
            .unwrap()
            .iter()
            .map(|e| FullFileEntry::decode(e.as_slice()).unwrap())
            .collect();
        let mut expected = entries.to_vec();
        for index in [0, 2] {
            expected[index].reg.as_mut().unwrap().size = None;
        }
        assert_eq!(back, expected);
        // Nothing left to forget: the image is not rewritten.
        assert_eq!(forget_file_sizes(dir.path(), &["/proc/stat"]).unwrap(), 0);
        assert!(!dir.path().join(".files.img.edited").exists());
        // A dump without files.img has nothing to forget.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(forget_file_sizes(empty.path(), &["/proc/stat"]).unwrap(), 0);
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
