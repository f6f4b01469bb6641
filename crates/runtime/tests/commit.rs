//! `commit_upper`: a sandbox's changes become a layer that mounts under the next
//! sandbox exactly as they looked. Privileged: run as root.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use berth_runtime::{Runtime, SandboxSpec};
use common::TestRuntime;

#[test]
fn a_committed_upper_is_a_layer_with_owners_whiteouts_and_opaque_dirs() {
    let t = TestRuntime::new();
    let info = t.rt.create(&t.spec("commit")).unwrap();
    t.sh_ok(
        &info.id,
        0,
        "set -e
         mkdir -p /srv/data && echo mine > /srv/data/owned && chown 1000:1000 /srv/data/owned
         rm /etc/hostname
         rm -rf /usr/share/doc && mkdir /usr/share/doc && echo fresh > /usr/share/doc/only
         ln /srv/data/owned /srv/data/hardlink
         ln -s owned /srv/data/symlink
         truncate -s 64M /srv/data/sparse && printf x | dd of=/srv/data/sparse bs=1 seek=1000000 conv=notrunc 2>/dev/null
         cp /bin/true /srv/data/suid && chmod 4755 /srv/data/suid
         python3 -c \"import os; os.setxattr('/srv/data/owned', 'user.note', b'kept')\"",
    );
    let uid_base = t.rt.sandbox_uid_base(&info.id).unwrap();
    assert!(uid_base >= 1 << 30);
    let layer = tempfile::tempdir_in(&t.state).unwrap();
    let stats = t.rt.commit_upper(&info.id, layer.path()).unwrap();
    assert!(t.rt.list().is_empty(), "the sandbox is gone");
    assert!(stats.whiteouts >= 1 && stats.entries > 5, "{stats:?}");

    let root = layer.path();
    let owned = std::fs::metadata(root.join("srv/data/owned")).unwrap();
    assert_eq!(
        (owned.uid(), owned.gid()),
        (1000, 1000),
        "owners are 0-based"
    );
    assert_eq!(std::fs::metadata(root.join("srv")).unwrap().uid(), 0);
    assert_eq!(owned.nlink(), 2, "hard link kept");
    let whiteout = std::fs::symlink_metadata(root.join("etc/hostname")).unwrap();
    assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0);
    let mut value = [0u8; 8];
    let opaque = nix_getxattr(
        &root.join("usr/share/doc"),
        "user.overlay.opaque",
        &mut value,
    );
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert!(nix_getxattr(root, "user.overlay.origin", &mut value).is_none());
    assert_eq!(
        nix_getxattr(&root.join("srv/data/owned"), "user.note", &mut value).as_deref(),
        Some(&b"kept"[..])
    );
    let sparse = std::fs::metadata(root.join("srv/data/sparse")).unwrap();
    assert_eq!(sparse.len(), 64 << 20);
    assert!(sparse.blocks() * 512 < 1 << 20, "holes kept");
    assert_eq!(
        std::fs::metadata(root.join("srv/data/suid"))
            .unwrap()
            .mode()
            & 0o7777,
        0o4755
    );

    // Stacked under a new sandbox, the layer shows the first sandbox's view.
    let mut spec = t.spec("commit-next");
    spec.layers.push(root.to_path_buf());
    let next = t.rt.create(&SandboxSpec { ..spec }).unwrap();
    assert_eq!(
        t.sh_ok(&next.id, 0, "cat /srv/data/owned; stat -c %u /srv/data/owned; ls /usr/share/doc; test -e /etc/hostname || echo gone; readlink /srv/data/symlink"),
        "mine\n1000\nonly\ngone\nowned"
    );
    assert_eq!(t.sh_ok(&next.id, 1000, "cat /srv/data/hardlink"), "mine");
    t.rt.kill(&next.id).unwrap();
}

fn nix_getxattr(path: &std::path::Path, name: &str, buf: &mut [u8]) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}
