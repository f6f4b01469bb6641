//! The state directory's modes, checked at every start.
//!
//! berth runs with umask 077 (see `main`) and the crates set the few modes that must be
//! wider explicitly, so new state is root's alone. State written by an older berth (a
//! 0644 database and WAL, 0755 checkpoint directories, 0644 CRIU images) is tightened
//! here, with one log line saying how much changed. The rules, per entry of the state
//! dir (symlinks are never followed: a symlinked entry, e.g. a template store shared
//! between state dirs, belongs to whoever made it):
//!
//! - the state dir itself and `volume-mounts/` are 0711: CRIU's restore tasks, as the
//!   sandbox's root uid, reach a volume's mount in `volume-mounts/<id>/` (that uid's
//!   own 0700 directory) through them; every other entry is 0700 or 0600, so a 0711
//!   directory lets other users reach nothing;
//! - `sandboxes/` is 0700 (the runtime tightens what is inside);
//! - `envd/` (the tmpfs sandboxes bind the envd binary from) and its directories are
//!   0711: the sandbox's root uid reaches the binary (0755, as shipped: it holds no
//!   state), nobody lists them;
//! - `views/` (LXCFS's files bound at `proc` and `cpu-online`, its pid file and log) is
//!   0711: CRIU's restore tasks, as the sandbox's root uid, bind the resource views from
//!   there (see berth-runtime's `views`); the files show each reader its own `/proc`
//!   numbers, and the pid file and log are 0600;
//! - `templates/` and its direct subdirectories, and each layer's directory, are 0700,
//!   its manifests 0600, its checkpoints owner-only throughout (CRIU images as the
//!   runtime keeps them: see `berth_runtime::tighten_private_tree`); a layer's `rootfs`
//!   is the template's filesystem and keeps its modes;
//! - `criu/` is 0700 (its contents are a CRIU installation, left as installed);
//! - directories of berth's own state (builds, mcp, net, checkpoints, disk pools, the
//!   trash, uid claims, volumes, secrets' key, the egress and serving CAs) are owner-only
//!   throughout, without crossing mounts, CRIU images as above;
//! - any other directory is made 0700 (what is inside is then unreachable) and any file
//!   0600.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};

/// Directories holding nothing but berth's own state: owner-only all the way down.
const PRIVATE_TREES: &[&str] = &[
    "builds",
    "checkpoints",
    "disk-pool",
    "disk-templates",
    "egress-ca",
    "mcp",
    "net",
    "secrets",
    "serving-ca",
    "trash",
    "uid-slots",
    "volumes",
];

/// Brings the state dir's entries to their modes (see the module docs) and logs what
/// changed. A state dir that does not exist yet is left to the code that creates it.
pub fn secure(state_dir: &Path) -> Result<()> {
    if !state_dir.exists() {
        return Ok(());
    }
    let changed =
        tighten_state(state_dir).with_context(|| format!("securing {}", state_dir.display()))?;
    if changed > 0 {
        tracing::warn!(
            state = %state_dir.display(),
            paths = changed,
            "made berth's state readable by root only (it was readable by other users)"
        );
    }
    Ok(())
}

fn tighten_state(state_dir: &Path) -> io::Result<usize> {
    let mut changed = usize::from(set_mode(state_dir, 0o711)?);
    for entry in fs::read_dir(state_dir)? {
        changed += unless_gone(tighten_state_entry(&entry?.path()))?;
    }
    Ok(changed)
}

/// A running berth (or another CLI call) adds and removes entries while this walks:
/// a path gone by the time it is reached has nothing left to tighten.
fn unless_gone(result: io::Result<usize>) -> io::Result<usize> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        result => result,
    }
}

fn tighten_state_entry(path: &Path) -> io::Result<usize> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(0);
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    Ok(match name.as_ref() {
        _ if !meta.is_dir() => usize::from(set_mode(path, 0o600)?),
        "sandboxes" => usize::from(set_mode(path, 0o700)?),
        // Restores mount volumes below it, in directories of the sandboxes' own
        // root uids (see berth-runtime's `volume_mounts_dir`).
        "volume-mounts" => usize::from(set_mode(path, 0o711)?),
        // The tmpfs sandboxes bind envd from: traversable, never listable (see
        // berth-runtime's `envd_fs`).
        "envd" => usize::from(set_mode(path, 0o711)?),
        // LXCFS's mount, reached by restores as the sandbox's root uid (see
        // berth-runtime's `views`); never walked (it is a FUSE view of /proc).
        "views" => tighten_views(path)?,
        "templates" => tighten_templates(path)?,
        name if PRIVATE_TREES.contains(&name) => berth_runtime::tighten_private_tree(path)?,
        _ => usize::from(set_mode(path, 0o700)?),
    })
}

/// `views/` 0711, LXCFS's pid file and log 0600; the rest is LXCFS's files bound there
/// (a stat or chmod would ask LXCFS, which refuses, and fails while it is dead) and
/// their mountpoints.
fn tighten_views(views: &Path) -> io::Result<usize> {
    let mut changed = usize::from(set_mode(views, 0o711)?);
    for name in ["lxcfs.pid", "lxcfs.log"] {
        let path = views.join(name);
        if fs::symlink_metadata(&path).is_ok_and(|meta| meta.is_file()) {
            changed += usize::from(set_mode(&path, 0o600)?);
        }
    }
    Ok(changed)
}

fn tighten_templates(templates: &Path) -> io::Result<usize> {
    let mut changed = usize::from(set_mode(templates, 0o700)?);
    for entry in fs::read_dir(templates)? {
        changed += unless_gone(tighten_template_entry(&entry?.path()))?;
    }
    Ok(changed)
}

fn tighten_template_entry(path: &Path) -> io::Result<usize> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(0);
    }
    if !meta.is_dir() {
        return Ok(usize::from(set_mode(path, 0o600)?));
    }
    let mut changed = usize::from(set_mode(path, 0o700)?);
    match path.file_name().and_then(|n| n.to_str()) {
        Some("checkpoints") => changed += berth_runtime::tighten_private_tree(path)?,
        // Layer directories hold `rootfs` (template content, untouched) and berth's
        // bookkeeping next to it.
        Some("layers") | Some("staging") => {
            for layer in fs::read_dir(path)? {
                changed += unless_gone(tighten_layer(&layer?.path()))?;
            }
        }
        _ => {
            for file in fs::read_dir(path)? {
                changed += unless_gone(tighten_if_file(&file?.path()))?;
            }
        }
    }
    Ok(changed)
}

/// A layer directory and berth's files in it; its `rootfs` is template content.
fn tighten_layer(layer: &Path) -> io::Result<usize> {
    if !fs::symlink_metadata(layer)?.is_dir() {
        return Ok(0);
    }
    let mut changed = usize::from(set_mode(layer, 0o700)?);
    for inner in fs::read_dir(layer)? {
        changed += unless_gone(tighten_if_file(&inner?.path()))?;
    }
    Ok(changed)
}

fn tighten_if_file(path: &Path) -> io::Result<usize> {
    if fs::symlink_metadata(path)?.is_file() {
        return Ok(usize::from(set_mode(path, 0o600)?));
    }
    Ok(0)
}

/// Sets `path`'s permission bits to `mode`; false when they already were.
fn set_mode(path: &Path, mode: u32) -> io::Result<bool> {
    let meta = fs::symlink_metadata(path)?;
    if meta.permissions().mode() & 0o7777 == mode {
        return Ok(false);
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn an_older_layout_is_tightened_and_template_content_kept() {
        let state = tempfile::tempdir().unwrap();
        let s = state.path();
        for dir in [
            "sandboxes/i1",
            "templates/layers/abc/rootfs/usr/bin",
            "templates/manifests",
            "templates/checkpoints/t-1/images",
            "mcp",
            "criu/prefix/usr/sbin",
            "volumes-of-the-future",
            "views/proc",
        ] {
            fs::create_dir_all(s.join(dir)).unwrap();
        }
        for file in [
            "berth.db",
            "berth.db-wal",
            "templates/manifests/base.json",
            "templates/layers/abc/rootfs/usr/bin/tool",
            "templates/checkpoints/t-1/images/pages-1.img",
            "templates/checkpoints/t-1/images/inventory.img",
            "templates/checkpoints/t-1/checkpoint.json",
            "mcp/mcp.sqlite3",
            "criu/prefix/usr/sbin/criu",
            "views/lxcfs.log",
            "views/cpu-online",
        ] {
            fs::write(s.join(file), b"x").unwrap();
        }
        for path in [
            "",
            "berth.db",
            "berth.db-wal",
            "templates",
            "templates/layers/abc/rootfs/usr/bin/tool",
            "templates/checkpoints/t-1/images/pages-1.img",
            "mcp/mcp.sqlite3",
            "criu/prefix/usr/sbin/criu",
            "views/cpu-online",
        ] {
            fs::set_permissions(s.join(path), fs::Permissions::from_mode(0o755)).unwrap();
        }
        let changed = tighten_state(s).unwrap();
        assert!(changed >= 8, "{changed}");
        assert_eq!(mode(s), 0o711);
        assert_eq!(mode(&s.join("sandboxes")), 0o700);
        assert_eq!(mode(&s.join("berth.db")), 0o600);
        assert_eq!(mode(&s.join("berth.db-wal")), 0o600);
        assert_eq!(mode(&s.join("templates")), 0o700);
        assert_eq!(mode(&s.join("templates/layers/abc")), 0o700);
        assert_eq!(mode(&s.join("templates/manifests/base.json")), 0o600);
        assert_eq!(
            mode(&s.join("templates/checkpoints/t-1/checkpoint.json")),
            0o600
        );
        assert_eq!(
            mode(&s.join("templates/checkpoints/t-1/images")),
            0o711,
            "CRIU's restore tasks open images from it"
        );
        assert_eq!(
            mode(&s.join("templates/checkpoints/t-1/images/pages-1.img")),
            0o755,
            "CRIU images keep their modes (the owner-only t-1 keeps them from others)"
        );
        assert_eq!(
            mode(&s.join("templates/layers/abc/rootfs/usr/bin/tool")),
            0o755,
            "template content keeps its modes"
        );
        assert_eq!(mode(&s.join("mcp/mcp.sqlite3")), 0o600);
        assert_eq!(mode(&s.join("criu")), 0o700);
        assert_eq!(mode(&s.join("criu/prefix/usr/sbin/criu")), 0o755);
        assert_eq!(mode(&s.join("volumes-of-the-future")), 0o700);
        assert_eq!(
            mode(&s.join("views")),
            0o711,
            "restores bind the views from LXCFS's mount in it as the sandbox's root"
        );
        assert_eq!(mode(&s.join("views/lxcfs.log")), 0o600);
        assert_eq!(
            mode(&s.join("views/cpu-online")),
            0o755,
            "a view's mountpoint is left alone (LXCFS's file when mounted)"
        );
        assert_eq!(
            tighten_state(s).unwrap(),
            0,
            "a second pass changes nothing"
        );
    }

    #[test]
    fn symlinked_entries_are_not_followed() {
        let state = tempfile::tempdir().unwrap();
        let shared = tempfile::tempdir().unwrap();
        fs::set_permissions(shared.path(), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(shared.path(), state.path().join("templates")).unwrap();
        tighten_state(state.path()).unwrap();
        assert_eq!(mode(shared.path()), 0o755);
    }

    #[test]
    fn entries_that_come_and_go_during_the_walk_are_no_error() {
        // A running berth claims and releases uid slots, writes and removes checkpoints
        // and commits staged layers while a CLI call secures the same state dir.
        let state = tempfile::tempdir().unwrap();
        let s = state.path().to_path_buf();
        for dir in [
            "uid-slots",
            "checkpoints",
            "templates/staging",
            "templates/manifests",
        ] {
            fs::create_dir_all(s.join(dir)).unwrap();
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let slot = s.join(format!("uid-slots/{}", n % 512));
                    let checkpoint = s.join(format!("checkpoints/c{}", n % 16));
                    let layer = s.join(format!("templates/staging/l{}", n % 16));
                    let manifest = s.join(format!("templates/manifests/m{}", n % 16));
                    if (n / 512).is_multiple_of(2) {
                        let _ = fs::write(&slot, "claimed");
                        let _ = fs::create_dir_all(checkpoint.join("images"));
                        let _ = fs::create_dir_all(&layer);
                        let _ = fs::write(layer.join("meta"), "x");
                        let _ = fs::write(&manifest, "{}");
                    } else {
                        let _ = fs::remove_file(&slot);
                        let _ = fs::remove_dir_all(&checkpoint);
                        let _ = fs::remove_dir_all(&layer);
                        let _ = fs::remove_file(&manifest);
                    }
                }
            })
        };
        let walks: Vec<_> = (0..1000).map(|_| tighten_state(&s).map(|_| ())).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
        let failed: Vec<_> = walks.into_iter().filter_map(Result::err).collect();
        assert!(
            failed.is_empty(),
            "{} of 1000 walks failed: {:?}",
            failed.len(),
            failed.first()
        );
    }
}
