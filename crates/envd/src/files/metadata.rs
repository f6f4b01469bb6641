//! User metadata on files: `X-Metadata-<key>: <value>` upload headers stored as
//! `user.e2b.<key>` extended attributes, and read back for `EntryInfo.metadata`.
//!
//! Rules (E2B's `envd.yaml`): the key is the header name without the prefix, lowercased;
//! keys and values are printable US-ASCII (0x20–0x7E); a key is at most 246 bytes (the
//! 255-byte xattr name limit minus the prefix); keys (with the prefix) plus values total
//! at most 4096 bytes; the first of repeated headers wins; an upload replaces the file's
//! whole metadata set, so an upload without metadata clears it. Anything else is a 400.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use axum::http::HeaderMap;

use super::HttpError;

/// Header prefix, lowercase as `http` stores header names.
const HEADER_PREFIX: &str = "x-metadata-";
/// Extended attribute namespace the metadata lives in.
pub const XATTR_PREFIX: &str = "user.e2b.";
/// Longest key: Linux's 255-byte xattr name limit minus [`XATTR_PREFIX`].
pub const MAX_KEY_BYTES: usize = 255 - XATTR_PREFIX.len();
/// Budget for all keys (prefixed) and values of one file.
pub const MAX_TOTAL_BYTES: usize = 4096;

fn is_printable_ascii(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| (0x20..=0x7e).contains(b))
}

/// The metadata an upload request carries, validated.
pub fn from_headers(headers: &HeaderMap) -> Result<BTreeMap<String, String>, HttpError> {
    let mut metadata = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        if metadata.contains_key(key) {
            continue;
        }
        if key.is_empty() {
            return Err(HttpError::bad_request(
                "invalid metadata header 'X-Metadata-': the key is empty",
            ));
        }
        if !is_printable_ascii(key.as_bytes()) {
            return Err(HttpError::bad_request(format!(
                "invalid metadata key '{key}': only printable ASCII is allowed"
            )));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(HttpError::bad_request(format!(
                "invalid metadata key '{key}': longer than {MAX_KEY_BYTES} bytes"
            )));
        }
        let value = value.as_bytes();
        if !is_printable_ascii(value) {
            return Err(HttpError::bad_request(format!(
                "invalid metadata value for key '{key}': only printable ASCII is allowed"
            )));
        }
        let value = String::from_utf8(value.to_vec()).expect("printable ASCII is UTF-8");
        metadata.insert(key.to_owned(), value);
    }
    let total: usize = metadata
        .iter()
        .map(|(k, v)| XATTR_PREFIX.len() + k.len() + v.len())
        .sum();
    if total > MAX_TOTAL_BYTES {
        return Err(HttpError::bad_request(format!(
            "metadata too large: {total} bytes (keys with the '{XATTR_PREFIX}' prefix plus values), at most {MAX_TOTAL_BYTES}"
        )));
    }
    Ok(metadata)
}

/// The filesystem cannot hold user xattrs at all.
fn is_unsupported(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EOPNOTSUPP)
}

/// Splits a `listxattr` buffer into the e2b keys it names.
fn e2b_keys(list: &[u8]) -> impl Iterator<Item = &str> {
    list.split(|b| *b == 0)
        .filter_map(|name| std::str::from_utf8(name).ok())
        .filter_map(|name| name.strip_prefix(XATTR_PREFIX))
}

fn fd_xattr_names(fd: impl AsFd) -> io::Result<Vec<u8>> {
    loop {
        let size = rustix::fs::flistxattr_query(fd.as_fd())?;
        let mut list = vec![0u8; size];
        match rustix::fs::flistxattr(fd.as_fd(), &mut list[..]) {
            Ok(n) => {
                list.truncate(n);
                return Ok(list);
            }
            // Grew between the two calls: ask again.
            Err(rustix::io::Errno::RANGE) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Makes `metadata` the file's exact e2b metadata set (stale keys removed).
pub fn replace_on_fd(
    fd: impl AsFd,
    path: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<(), HttpError> {
    let fd = fd.as_fd();
    let existing = match fd_xattr_names(fd) {
        Ok(list) => list,
        Err(e) if is_unsupported(&e) && metadata.is_empty() => return Ok(()),
        Err(e) if is_unsupported(&e) => {
            return Err(HttpError::bad_request(format!(
            "cannot store metadata on '{}': the filesystem does not support extended attributes",
            path.display()
        )))
        }
        Err(e) => return Err(HttpError::io("error listing metadata of", path, &e)),
    };
    for stale in e2b_keys(&existing).filter(|k| !metadata.contains_key(*k)) {
        match rustix::fs::fremovexattr(fd, format!("{XATTR_PREFIX}{stale}")) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => return Err(HttpError::io("error removing metadata of", path, &e.into())),
        }
    }
    for (key, value) in metadata {
        rustix::fs::fsetxattr(
            fd,
            format!("{XATTR_PREFIX}{key}"),
            value.as_bytes(),
            rustix::fs::XattrFlags::empty(),
        )
        .map_err(|e| {
            let err: io::Error = e.into();
            if is_unsupported(&err) {
                HttpError::bad_request(format!(
                    "cannot store metadata on '{}': the filesystem does not support extended attributes",
                    path.display()
                ))
            } else {
                HttpError::io("error storing metadata on", path, &err)
            }
        })?;
    }
    Ok(())
}

/// The e2b metadata of `path` (not following a final symlink). A filesystem without
/// xattr support, or a vanished attribute, simply contributes nothing.
pub fn read(path: &Path) -> io::Result<BTreeMap<String, String>> {
    let mut metadata = BTreeMap::new();
    let list = loop {
        let size = match rustix::fs::llistxattr_query(path) {
            Ok(size) => size,
            Err(rustix::io::Errno::OPNOTSUPP) => return Ok(metadata),
            Err(e) => return Err(e.into()),
        };
        if size == 0 {
            return Ok(metadata);
        }
        let mut list = vec![0u8; size];
        match rustix::fs::llistxattr(path, &mut list[..]) {
            Ok(n) => {
                list.truncate(n);
                break list;
            }
            Err(rustix::io::Errno::RANGE) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    for key in e2b_keys(&list) {
        let name = format!("{XATTR_PREFIX}{key}");
        let value = loop {
            let size = match rustix::fs::lgetxattr_query(path, &name) {
                Ok(size) => size,
                Err(rustix::io::Errno::NODATA) => break None,
                Err(e) => return Err(e.into()),
            };
            let mut value = vec![0u8; size];
            match rustix::fs::lgetxattr(path, &name, &mut value[..]) {
                Ok(n) => {
                    value.truncate(n);
                    break Some(value);
                }
                Err(rustix::io::Errno::RANGE) => continue,
                Err(rustix::io::Errno::NODATA) => break None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(value) = value {
            metadata.insert(key.to_owned(), String::from_utf8_lossy(&value).into_owned());
        }
    }
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderName, HeaderValue, StatusCode};

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn parses_lowercased_keys_first_value_wins() {
        let m = from_headers(&headers(&[
            ("X-Metadata-Owner", b"alice"),
            ("x-metadata-owner", b"bob"),
            ("X-Metadata-Empty", b""),
            ("Content-Type", b"text/plain"),
        ]))
        .unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m["owner"], "alice");
        assert_eq!(m["empty"], "");
    }

    #[test]
    fn rejects_bad_keys_and_values() {
        let bad = |pairs: &[(&str, &[u8])]| {
            let err = from_headers(&headers(pairs)).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            err.message
        };
        assert!(bad(&[("x-metadata-", b"v")]).contains("key is empty"));
        assert!(bad(&[("x-metadata-k", b"caf\xc3\xa9")]).contains("value for key 'k'"));
        assert!(bad(&[("x-metadata-k", b"tab\there")]).contains("printable ASCII"));
        let long_key = format!("x-metadata-{}", "k".repeat(MAX_KEY_BYTES + 1));
        assert!(bad(&[(&long_key, b"v")]).contains("longer than 246 bytes"));
        let max_key = format!("x-metadata-{}", "k".repeat(MAX_KEY_BYTES));
        assert!(from_headers(&headers(&[(&max_key, b"v")])).is_ok());
    }

    #[test]
    fn total_budget_counts_prefix_keys_and_values() {
        // One key "a" with a value filling the budget exactly.
        let exact = "v".repeat(MAX_TOTAL_BYTES - XATTR_PREFIX.len() - 1);
        assert!(from_headers(&headers(&[("x-metadata-a", exact.as_bytes())])).is_ok());
        let over = format!("{exact}v");
        let err = from_headers(&headers(&[("x-metadata-a", over.as_bytes())])).unwrap_err();
        assert!(
            err.message.contains("metadata too large"),
            "{}",
            err.message
        );
    }

    /// A temp file, removed on drop.
    struct TempFile(std::path::PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn replace_sets_removes_and_reads_back() {
        let tmp = TempFile(
            std::env::temp_dir().join(format!("berth-envd-metadata-{}", std::process::id())),
        );
        let file = std::fs::File::create(&tmp.0).unwrap();
        // Foreign user xattrs must survive and must not show up as metadata.
        rustix::fs::fsetxattr(
            &file,
            "user.other",
            b"keep",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        let first: BTreeMap<String, String> = [("a".into(), "1".into()), ("b".into(), "2".into())]
            .into_iter()
            .collect();
        replace_on_fd(&file, &tmp.0, &first).unwrap();
        assert_eq!(read(&tmp.0).unwrap(), first);
        let second: BTreeMap<String, String> = [("b".into(), "3".into())].into_iter().collect();
        replace_on_fd(&file, &tmp.0, &second).unwrap();
        assert_eq!(read(&tmp.0).unwrap(), second);
        replace_on_fd(&file, &tmp.0, &BTreeMap::new()).unwrap();
        assert!(read(&tmp.0).unwrap().is_empty());
        let mut keep = [0u8; 8];
        let n = rustix::fs::fgetxattr(&file, "user.other", &mut keep[..]).unwrap();
        assert_eq!(&keep[..n], b"keep");
    }
}
