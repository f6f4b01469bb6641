//! Moving a directory tree to another machine: packed as a tar stream and checked on
//! arrival against the sender's tree hash.
//!
//! GNU tar does the packing because a layer (or a checkpoint) needs everything it
//! keeps: numeric owners, modes, extended attributes (overlayfs' `user.overlay.*`
//! whiteouts and opaque marks in a layer), device nodes, symlinks, hard links, and
//! sparse files kept sparse (a checkpoint's `disk.img`). The tree hash is
//! [`LayerId::of_tree`]'s (paths, modes, owners, devices, xattrs, contents), computed by
//! the sender before it packs and by the receiver after it unpacked: a tree that
//! arrives in any way different is refused before anything uses it.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use crate::error::{IoContext, TemplateError};
use crate::layer::LayerId;

/// Lines of tar's stderr kept for an error message.
const STDERR_TAIL_BYTES: usize = 2048;

/// The tree hash of `dir` (see the module doc).
pub fn tree_hash(dir: &Path) -> Result<String, TemplateError> {
    Ok(LayerId::of_tree(dir)?.as_str().to_owned())
}

/// A tree being packed: read it to the end for the whole tar stream. Dropping it early
/// stops the packer.
pub struct Packed {
    child: Child,
    stdout: ChildStdout,
}

impl Read for Packed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.stdout.read(buf)?;
        if n == 0 && !buf.is_empty() {
            // The stream is over: a packer that failed must not look like a short tree.
            let status = self.child.wait()?;
            if !status.success() {
                return Err(std::io::Error::other(format!(
                    "tar (packing) {status}: {}",
                    stderr_tail(&mut self.child)
                )));
            }
        }
        Ok(n)
    }
}

impl Drop for Packed {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // The reader gave up before the end; nothing waits for the rest.
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Starts packing `dir`'s contents (not `dir` itself).
pub fn pack(dir: &Path) -> Result<Packed, TemplateError> {
    let mut child = Command::new("tar")
        .args(["--create", "--file=-", "--numeric-owner", "--sparse"])
        .args(["--xattrs", "--xattrs-include=*"])
        .arg("--directory")
        .arg(dir)
        .arg(".")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| spawn_error(source, dir))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    Ok(Packed { child, stdout })
}

/// Unpacks the tar stream `from` into `dir` (which must exist), keeping owners, modes
/// and extended attributes as packed.
pub fn unpack(from: &mut dyn Read, dir: &Path) -> Result<(), TemplateError> {
    let mut child = Command::new("tar")
        .args(["--extract", "--file=-", "--numeric-owner", "--same-owner"])
        .args(["--same-permissions", "--xattrs", "--xattrs-include=*"])
        .arg("--directory")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| spawn_error(source, dir))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let copied = std::io::copy(from, &mut stdin).and_then(|_| stdin.flush());
    drop(stdin);
    let status = child.wait().ctx("wait for tar", dir)?;
    if let Err(source) = copied {
        return Err(TemplateError::Transfer {
            what: format!("receiving a tree into {}", dir.display()),
            detail: source.to_string(),
        });
    }
    if !status.success() {
        return Err(TemplateError::Transfer {
            what: format!("unpacking a tree into {}", dir.display()),
            detail: format!("tar {status}: {}", stderr_tail(&mut child)),
        });
    }
    Ok(())
}

/// Checks that `dir` is the tree the sender hashed as `expected`.
pub fn verify(dir: &Path, expected: &str) -> Result<(), TemplateError> {
    let found = tree_hash(dir)?;
    if found != expected {
        return Err(TemplateError::TreeMismatch {
            path: dir.to_path_buf(),
            expected: expected.to_owned(),
            found,
        });
    }
    Ok(())
}

fn spawn_error(source: std::io::Error, dir: &Path) -> TemplateError {
    if source.kind() == std::io::ErrorKind::NotFound {
        TemplateError::ToolMissing {
            tool: "tar",
            package: "tar",
        }
    } else {
        TemplateError::io("start tar for", dir, source)
    }
}

fn stderr_tail(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(stderr) = child.stderr.as_mut() {
        let _ = stderr.read_to_string(&mut text);
    }
    let start = text.len().saturating_sub(STDERR_TAIL_BYTES);
    let start = (start..=text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn tree(root: &Path) {
        std::fs::create_dir_all(root.join("etc/deep")).unwrap();
        std::fs::write(root.join("etc/deep/file"), b"contents").unwrap();
        std::fs::set_permissions(
            root.join("etc/deep/file"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        symlink("deep/file", root.join("etc/link")).unwrap();
        std::fs::hard_link(root.join("etc/deep/file"), root.join("etc/hard")).unwrap();
        // A sparse file: 64 MiB apparent, a few bytes written.
        let sparse = std::fs::File::create(root.join("disk.img")).unwrap();
        sparse.set_len(64 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        sparse.write_at(b"end", (64 << 20) - 3).unwrap();
        rustix::fs::setxattr(
            root.join("etc/deep"),
            "user.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
    }

    #[test]
    fn a_tree_moves_whole_and_a_changed_one_is_refused() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        tree(from.path());
        let hash = tree_hash(from.path()).unwrap();
        let mut packed = pack(from.path()).unwrap();
        unpack(&mut packed, to.path()).unwrap();
        verify(to.path(), &hash).unwrap();
        let disk = std::fs::metadata(to.path().join("disk.img")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(
            disk.blocks() * 512 < 1 << 20,
            "the sparse file stayed sparse"
        );

        std::fs::write(to.path().join("etc/deep/file"), b"Contents").unwrap();
        assert!(matches!(
            verify(to.path(), &hash),
            Err(TemplateError::TreeMismatch { .. })
        ));
    }

    #[test]
    fn a_broken_stream_is_an_error() {
        let to = tempfile::tempdir().unwrap();
        let mut garbage: &[u8] = b"this is not a tar stream at all, not even close";
        assert!(matches!(
            unpack(&mut garbage, to.path()),
            Err(TemplateError::Transfer { .. })
        ));
    }
}
