//! The COPY upload store: the tar (gzipped or not) the SDK uploads for a COPY step,
//! kept under `<state>/builds/files/<scope>/<filesHash>`.
//!
//! The SDK's `filesHash` is not a hash of the upload: it is sha256 over
//! `"COPY <src> <dest>"` and then, for every file in tar order, its relative path,
//! `st_mode` in decimal, its size (not for directories), and its bytes (a symlink's
//! target for links). Everything it covers is in the tar except the step's `src` and
//! `dest`, so [`FileStore::put`] can only check that an upload is a whole, readable
//! archive; [`sdk_files_hash`] recomputes the SDK's hash when a COPY step applies it
//! (then `src` and `dest` are known) and a mismatch fails the step and drops the blob.
//! Writes go to a temporary file, are fsynced and renamed, so a present blob is whole;
//! a retried or concurrent upload of one hash just writes it again.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::error::BuildError;

/// Content-addressed store of COPY uploads.
#[derive(Debug, Clone)]
pub struct FileStore {
    root: PathBuf,
}

impl FileStore {
    /// Opens `<state_dir>/builds/files`, removing temporary files of dead writers.
    pub fn open(state_dir: &Path) -> Result<FileStore, BuildError> {
        let root = state_dir.join("builds").join("files");
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(&root)
            .map_err(|e| BuildError::io("create", &root, e))?;
        let store = FileStore { root };
        store.remove_dead_temporaries();
        Ok(store)
    }

    /// Is the upload for `hash` in `scope` present?
    pub fn has(&self, scope: &str, hash: &str) -> bool {
        self.path(scope, hash).is_ok_and(|p| p.is_file())
    }

    /// Stores the upload `body` for `hash` in `scope`; returns its size. The body must
    /// be a tar or tar.gz archive read to its end.
    pub fn put(&self, scope: &str, hash: &str, mut body: impl Read) -> Result<u64, BuildError> {
        let target = self.path(scope, hash)?;
        let dir = target.parent().expect("blob paths have a parent");
        fs::create_dir_all(dir).map_err(|e| BuildError::io("create", dir, e))?;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let temp = dir.join(format!(
            ".{hash}.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut file = File::create(&temp).map_err(|e| BuildError::io("create", &temp, e))?;
            let size = io::copy(&mut body, &mut file)
                .map_err(|e| BuildError::io("receive upload into", &temp, e))?;
            file.sync_all()
                .map_err(|e| BuildError::io("fsync", &temp, e))?;
            drop(file);
            check_archive(&temp).map_err(|detail| BuildError::BadUpload {
                hash: hash.to_string(),
                detail,
            })?;
            fs::rename(&temp, &target).map_err(|e| BuildError::io("rename", &target, e))?;
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| BuildError::io("fsync", dir, e))?;
            Ok(size)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }

    /// Forgets an upload (a COPY found it does not match its hash).
    pub fn remove(&self, scope: &str, hash: &str) -> Result<(), BuildError> {
        let path = self.path(scope, hash)?;
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(BuildError::io("remove", &path, e))
            }
            _ => Ok(()),
        }
    }

    /// Where the upload for `hash` in `scope` lives.
    pub fn path(&self, scope: &str, hash: &str) -> Result<PathBuf, BuildError> {
        let hash_ok = hash.len() == 64
            && hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hash_ok {
            return Err(BuildError::InvalidFilesHash(hash.to_string()));
        }
        let scope_ok = !scope.is_empty()
            && scope.len() <= 128
            && !scope.starts_with('.')
            && scope
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !scope_ok {
            return Err(BuildError::InvalidScope(scope.to_string()));
        }
        Ok(self.root.join(scope).join(hash))
    }

    fn remove_dead_temporaries(&self) {
        let Ok(scopes) = fs::read_dir(&self.root) else {
            return;
        };
        for scope in scopes.flatten() {
            let Ok(entries) = fs::read_dir(scope.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let pid = name
                    .strip_suffix(".tmp")
                    .and_then(|n| n.split('.').nth(2))
                    .and_then(|p| p.parse::<i32>().ok())
                    .and_then(rustix::process::Pid::from_raw);
                if let Some(pid) = pid {
                    if rustix::process::test_kill_process(pid).is_err() {
                        let _ = fs::remove_file(entry.path());
                    }
                }
            }
        }
    }
}

/// The upload as a tar stream (gunzipped when it is gzip).
pub(crate) fn open_archive(path: &Path) -> io::Result<Box<dyn Read>> {
    let mut reader = BufReader::new(File::open(path)?);
    let gzip = reader.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip {
        Box::new(flate2::read::MultiGzDecoder::new(reader))
    } else {
        Box::new(reader)
    })
}

/// Is the file at `path` a gzip stream?
pub(crate) fn is_gzip(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; 2];
    let n = File::open(path)?.read(&mut magic)?;
    Ok(n == 2 && magic == [0x1f, 0x8b])
}

fn check_archive(path: &Path) -> Result<(), String> {
    let mut archive = tar::Archive::new(open_archive(path).map_err(|e| e.to_string())?);
    let mut count = 0usize;
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        io::copy(&mut entry, &mut io::sink()).map_err(|e| e.to_string())?;
        count += 1;
    }
    if count == 0 {
        return Err("the archive is empty".into());
    }
    Ok(())
}

/// The SDK's `filesHash` of a COPY of `src` to `dest` whose upload is at `path`.
pub fn sdk_files_hash(src: &str, dest: &str, path: &Path) -> io::Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(format!("COPY {src} {dest}").as_bytes());
    let mut archive = tar::Archive::new(open_archive(path)?);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = String::from_utf8_lossy(&entry.path_bytes())
            .trim_end_matches('/')
            .to_string();
        let header = entry.header();
        let perms = header.mode()? & 0o7777;
        hasher.update(name.as_bytes());
        match header.entry_type() {
            tar::EntryType::Directory => {
                hasher.update((libc_mode::DIR | perms).to_string().as_bytes());
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                // lstat of a symlink: S_IFLNK | 0777, size = target length.
                hasher.update((libc_mode::LNK | 0o777).to_string().as_bytes());
                hasher.update(target.len().to_string().as_bytes());
                hasher.update(&target);
            }
            tar::EntryType::Link => {
                // A hard link is hashed as the file it names: find that file's bytes.
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                let (size, mode, bytes) = hard_link_target(path, &target)?;
                hasher.update((libc_mode::REG | mode).to_string().as_bytes());
                hasher.update(size.to_string().as_bytes());
                hasher.update(&bytes);
            }
            _ => {
                hasher.update((libc_mode::REG | perms).to_string().as_bytes());
                hasher.update(header.size()?.to_string().as_bytes());
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = entry.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                }
            }
        }
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn hard_link_target(path: &Path, target: &[u8]) -> io::Result<(u64, u32, Vec<u8>)> {
    let mut archive = tar::Archive::new(open_archive(path)?);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.path_bytes().as_ref() == target {
            let mode = entry.header().mode()? & 0o7777;
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            return Ok((bytes.len() as u64, mode, bytes));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "hard link to a file not in the archive",
    ))
}

/// The client side of a COPY, for berth's own CLI (`berth template build -f
/// Dockerfile`): packs what `src` names under `context` into the gzipped tar `out` as
/// the SDK does (sorted paths relative to the context, directories walked, symlinks
/// kept as links) and returns its `filesHash`, computed from that archive with
/// [`sdk_files_hash`] so it is exactly what the server recomputes. `src` is a path or
/// a pattern with `*`/`?` in any segment; `**` and `.dockerignore` are not supported.
pub fn pack_copy_source(context: &Path, src: &str, dest: &str, out: &Path) -> io::Result<String> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    if src.starts_with('/') || src.split('/').any(|part| part == "..") {
        return Err(invalid(format!(
            "COPY source {src:?} must stay inside the context"
        )));
    }
    if src.contains("**") {
        return Err(invalid(format!(
            "COPY source {src:?}: ** patterns are not supported"
        )));
    }
    let mut matches = vec![PathBuf::new()];
    for part in src.split('/').filter(|p| !p.is_empty() && *p != ".") {
        let mut next = Vec::new();
        for base in &matches {
            if part.contains(['*', '?']) {
                let Ok(entries) = fs::read_dir(context.join(base)) else {
                    continue;
                };
                let mut names: Vec<String> = entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| wildcard(part, name))
                    .collect();
                names.sort();
                next.extend(names.into_iter().map(|n| base.join(n)));
            } else if fs::symlink_metadata(context.join(base).join(part)).is_ok() {
                next.push(base.join(part));
            }
        }
        matches = next;
    }
    let mut files = std::collections::BTreeSet::new();
    for found in matches {
        let mut stack = vec![found];
        while let Some(relative) = stack.pop() {
            let meta = fs::symlink_metadata(context.join(&relative))?;
            if meta.is_dir() {
                for entry in fs::read_dir(context.join(&relative))? {
                    stack.push(relative.join(entry?.file_name()));
                }
            }
            if !relative.as_os_str().is_empty() {
                files.insert(relative);
            }
        }
    }
    if files.is_empty() {
        return Err(invalid(format!(
            "no files match COPY source {src:?} in {}",
            context.display()
        )));
    }
    let gz = flate2::write::GzEncoder::new(File::create(out)?, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    for relative in &files {
        let path = context.join(relative);
        if fs::symlink_metadata(&path)?.is_dir() {
            tar.append_dir(relative, &path)?;
        } else {
            tar.append_path_with_name(&path, relative)?;
        }
    }
    tar.into_inner()?.finish()?.sync_all()?;
    sdk_files_hash(src, dest, out)
}

/// Shell-style `*` and `?` matching of one path segment (no leading-dot rule: the SDK
/// matches dotfiles too).
fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// File type bits of `st_mode`.
mod libc_mode {
    pub const REG: u32 = 0o100000;
    pub const DIR: u32 = 0o040000;
    pub const LNK: u32 = 0o120000;
}

/// Writes `bytes` to `path` atomically (temp file, fsync, rename).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let temp = path.with_extension(format!(
        "tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut file = File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The upload is made with Python's tarfile as the SDK makes it, and the expected
    /// hash by the steps of e2b 2.63's `calculate_files_hash`, in Python.
    #[test]
    fn packed_sources_hash_as_the_server_recomputes() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = dir.path().join("ctx");
        fs::create_dir_all(ctx.join("app/sub")).unwrap();
        fs::write(ctx.join("app/a.txt"), "a").unwrap();
        fs::write(ctx.join("app/sub/b.txt"), "b").unwrap();
        fs::write(ctx.join("one.json"), "{}").unwrap();
        fs::write(ctx.join("two.json"), "[]").unwrap();
        std::os::unix::fs::symlink("a.txt", ctx.join("app/link")).unwrap();
        let out = dir.path().join("up.tar.gz");
        let hash = pack_copy_source(&ctx, "app", "/srv/app", &out).unwrap();
        assert_eq!(sdk_files_hash("app", "/srv/app", &out).unwrap(), hash);
        let mut names: Vec<String> = tar::Archive::new(open_archive(&out).unwrap())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["app", "app/a.txt", "app/link", "app/sub", "app/sub/b.txt"]
        );
        pack_copy_source(&ctx, "*.json", "/etc/", &out).unwrap();
        let count = tar::Archive::new(open_archive(&out).unwrap())
            .entries()
            .unwrap()
            .count();
        assert_eq!(count, 2);
        assert!(pack_copy_source(&ctx, "../etc", "/x", &out).is_err());
        assert!(pack_copy_source(&ctx, "nothing*", "/x", &out).is_err());
        assert!(wildcard("*.j?on", "a.json") && !wildcard("*.json", "a.yaml"));
    }

    #[test]
    fn hash_of_an_upload_matches_the_sdk_algorithm() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = dir.path().join("ctx");
        fs::create_dir_all(ctx.join("app/sub")).unwrap();
        fs::write(ctx.join("app/a.txt"), "alpha\n").unwrap();
        fs::write(ctx.join("app/sub/b.sh"), "#!/bin/sh\necho b\n").unwrap();
        fs::set_permissions(
            ctx.join("app/sub/b.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("a.txt", ctx.join("app/link")).unwrap();
        // The upload exactly as the SDK makes it: tarfile, gzip, sorted paths.
        let upload = dir.path().join("upload.tar.gz");
        let script = r#"
import os, sys, tarfile
ctx, out = sys.argv[1], sys.argv[2]
files = []
for root, dirs, names in os.walk(os.path.join(ctx, "app")):
    files.append(root)
    files.extend(os.path.join(root, n) for n in names)
files = sorted(set(files))
with tarfile.open(out, "w:gz") as tar:
    for f in files:
        tar.add(f, arcname=os.path.relpath(f, ctx), recursive=False)
import hashlib, stat
h = hashlib.sha256(b"COPY app /srv/app")
for f in files:
    rel = os.path.relpath(f, ctx)
    h.update(rel.encode())
    if os.path.islink(f):
        st = os.lstat(f)
        h.update(str(st.st_mode).encode()); h.update(str(st.st_size).encode())
        h.update(os.readlink(f).encode()); continue
    st = os.stat(f)
    h.update(str(st.st_mode).encode())
    if not stat.S_ISDIR(st.st_mode): h.update(str(st.st_size).encode())
    if stat.S_ISREG(st.st_mode): h.update(open(f, "rb").read())
print(h.hexdigest())
"#;
        let output = Command::new("python3")
            .args(["-c", script])
            .arg(&ctx)
            .arg(&upload)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let expected = String::from_utf8(output.stdout).unwrap().trim().to_string();
        assert_eq!(
            sdk_files_hash("app", "/srv/app", &upload).unwrap(),
            expected
        );
        assert_ne!(sdk_files_hash("app", "/other", &upload).unwrap(), expected);

        let store = FileStore::open(dir.path()).unwrap();
        assert!(!store.has("team1", &expected));
        store
            .put("team1", &expected, File::open(&upload).unwrap())
            .unwrap();
        assert!(store.has("team1", &expected));
        assert!(!store.has("team2", &expected), "scopes are separate");
        // Retry-safe: the same upload again is fine.
        store
            .put("team1", &expected, File::open(&upload).unwrap())
            .unwrap();
        let err = store
            .put("team1", &"0".repeat(64), &b"not a tar at all"[..])
            .unwrap_err();
        assert!(matches!(err, BuildError::BadUpload { .. }), "{err}");
        assert!(!store.has("team1", &"0".repeat(64)));
        assert!(matches!(
            store.put("../x", &expected, &b""[..]),
            Err(BuildError::InvalidScope(_))
        ));
        assert!(matches!(
            store.put("t", "../../etc", &b""[..]),
            Err(BuildError::InvalidFilesHash(_))
        ));
        let leftovers = fs::read_dir(store.root.join("team1")).unwrap().count();
        assert_eq!(leftovers, 1, "only the blob, no temporaries");
    }
}
