//! Refusing a dump that could not be restored because of what the sandbox did to its
//! own filesystem, so pause and checkpoint fail with the reason instead of every later
//! resume, fork and restore failing.
//!
//! CRIU keeps a deleted file that a process still holds open (a "ghost") inside the
//! dump and, on restore, recreates it under a name beside the original before reopening
//! it (`berth_checkpoint::ghost_names`). Root inside the sandbox can create that name
//! first, and the restore then fails with `EEXIST`. The check runs as CRIU's post-dump
//! action (`berth-launch check-dump`): every dumped task is still stopped, so the
//! filesystem it looks at, through the root task's `/proc/<pid>/root`, is exactly the
//! one dumped, and a refusal there makes CRIU let the tasks run on.
//!
//! The same action makes open resource views restorable. CRIU records each open
//! regular file's size and refuses a restore where the size differs. LXCFS reports its
//! files' sizes as the length of their content at that moment, and `/proc/stat` grows
//! with its counters, so a process holding a view open, as `top` does, would make
//! restores fail at random. The action drops the recorded sizes of the view files
//! (`berth_checkpoint::forget_file_sizes`); CRIU then reopens them by path as it
//! reopens procfs files, whose size is 0.

use std::fmt::Write as _;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use berth_checkpoint::GhostName;
use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The file the check writes its refusal into, in the directory the caller names.
pub(crate) const REFUSAL_FILE: &str = "dump-refused";

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// The ghosts of the dump in `images` whose restore name already exists in the
/// filesystem rooted at `root` (the root task's `/proc/<pid>/root`), each with the
/// name that is in the way.
pub(crate) fn collisions(images: &Path, root: &Path) -> io::Result<Vec<(GhostName, String)>> {
    let names = berth_checkpoint::ghost_names(images).map_err(io::Error::other)?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let root = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut found = Vec::new();
    for ghost in names {
        // CRIU tries the name's directory, then each ancestor's, until one exists.
        for candidate in ghost.candidates() {
            let (dir, last) = candidate.rsplit_once('/').unwrap_or(("", &candidate));
            let Some(dir) = open_dir(&root, dir)? else {
                continue;
            };
            if rustix::fs::statat(&dir, last, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                found.push((ghost.clone(), candidate.clone()));
            }
            break;
        }
    }
    Ok(found)
}

/// Directory `dir` (absolute inside the sandbox) beneath `root`, or None if it is not
/// there (or is not a directory).
fn open_dir(root: &OwnedFd, dir: &str) -> io::Result<Option<OwnedFd>> {
    let relative = dir.trim_start_matches('/');
    let relative = if relative.is_empty() { "." } else { relative };
    match rustix::fs::openat2(
        root.as_fd(),
        relative,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// What a refusal says: each name in the way and the deleted file it blocks.
pub(crate) fn describe(collisions: &[(GhostName, String)]) -> String {
    let mut text = String::new();
    for (ghost, name) in collisions {
        if !text.is_empty() {
            text.push_str("; ");
        }
        let _ = write!(
            text,
            "{name} is in the way of the deleted, still-open file {} (the restore recreates it under that name): remove or rename {name}, or close the file",
            ghost.file
        );
    }
    text
}

/// Writes the action script CRIU runs at each dump step (an executable at `path`). At
/// `post-dump`, with every task still stopped, it runs the check ([`check_dump_main`]
/// through `launcher`, reporting into `report`) and then, with `disk_copy` =
/// `(disk, copy)`, flushes the sandbox's filesystem and copies its disk image.
pub(crate) fn write_post_dump_hook(
    path: &Path,
    launcher: &Path,
    images: &Path,
    report: &Path,
    disk_copy: Option<(&Path, &Path)>,
) -> io::Result<()> {
    let mut script = format!(
        "#!/bin/sh\n\
         [ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\n\
         set -e\n\
         {} check-dump --images {} --root \"/proc/$CRTOOLS_INIT_PID/root\" --report {}\n",
        shell_quote(launcher)?,
        shell_quote(images)?,
        shell_quote(report)?,
    );
    if let Some((disk, copy)) = disk_copy {
        let _ = write!(
            script,
            "sync -f \"/proc/$CRTOOLS_INIT_PID/root/\"\n\
             cp --sparse=always {} {}\n",
            shell_quote(disk)?,
            shell_quote(copy)?
        );
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)?;
    io::Write::write_all(&mut file, script.as_bytes())
}

/// The refusal the check left in `report` after a failed dump of sandbox `id`, if any.
pub(crate) fn refusal(id: &str, report: &Path) -> Option<crate::RuntimeError> {
    let reason = std::fs::read_to_string(report).ok()?;
    Some(crate::RuntimeError::Unrestorable {
        id: id.to_owned(),
        reason,
    })
}

/// `path` as one single-quoted shell word.
fn shell_quote(path: &Path) -> io::Result<String> {
    let text = path
        .to_str()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path is not UTF-8"))?;
    Ok(format!("'{}'", text.replace('\'', r"'\''")))
}

/// `berth-launch check-dump --images DIR --root DIR --report FILE`: CRIU's post-dump
/// action. Makes open resource views restorable, then exits 0 when the dump can be
/// restored; otherwise the reason goes to FILE and the exit status is 1, which fails
/// the dump.
pub(crate) fn check_dump_main(args: &[String]) -> io::Result<i32> {
    let mut images = None;
    let mut root = None;
    let mut report = None;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().map(PathBuf::from).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{flag} needs a value"))
        })?;
        match flag.as_str() {
            "--images" => images = Some(value),
            "--root" => root = Some(value),
            "--report" => report = Some(value),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unknown flag {flag}"),
                ))
            }
        }
    }
    let missing = |flag| io::Error::new(io::ErrorKind::InvalidInput, format!("{flag} is required"));
    let images = images.ok_or_else(|| missing("--images"))?;
    let root = root.ok_or_else(|| missing("--root"))?;
    let report = report.ok_or_else(|| missing("--report"))?;
    if let Err(e) = berth_checkpoint::forget_file_sizes(&images, &crate::views::targets()) {
        std::fs::write(
            &report,
            format!("could not prepare the dump's open resource views for restore: {e}"),
        )?;
        return Ok(1);
    }
    let refusal = match collisions(&images, &root) {
        Ok(found) if found.is_empty() => return Ok(0),
        Ok(found) => describe(&found),
        Err(e) => format!("could not check the dump's deleted files: {e}"),
    };
    std::fs::write(&report, refusal)?;
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_what_is_in_the_way_and_what_it_blocks() {
        let ghost = GhostName {
            file: "/home/user/held".into(),
            name: "/home/user/held.cr.1.ghost".into(),
        };
        let text = describe(&[(ghost, "/home/user/held.cr.1.ghost".into())]);
        assert!(text.starts_with("/home/user/held.cr.1.ghost is in the way of the deleted, still-open file /home/user/held"), "{text}");
    }
}
