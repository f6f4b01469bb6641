//! Machine-wide claims on uid ranges, so two daemons on one host (different state dirs)
//! never give two sandboxes the same host ids.
//!
//! One claim file per range in a shared directory, named by the range's first host uid
//! (so daemons agree whatever their slot numbering), holding the owner: the claiming
//! daemon's state dir and the sandbox id. Claims and releases run under an exclusive
//! `flock` of the directory's `.lock` file, so two daemons never take one range at once.
//! A claim is stale, and may be taken over, when the owner's sandbox directory is gone (the
//! daemon removed it, or its state dir was deleted) and no process on the host runs as a
//! uid of the range; a live sandbox always has one (made before its claim, removed after
//! its processes are dead), even while its daemon is stopped, so ranges of sandboxes that
//! outlive their daemon stay claimed, and so do ranges whose processes outlive their
//! directory (a state dir deleted under running sandboxes: `berth gc` collects those). Claims are not
//! fsynced: after a crash, recovery claims the ranges of the sandboxes it keeps again.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Who holds a range.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Owner {
    state_dir: PathBuf,
    sandbox: String,
}

impl Owner {
    /// True while the owner's sandbox exists on disk.
    fn is_live(&self) -> bool {
        self.state_dir
            .join("sandboxes")
            .join(&self.sandbox)
            .is_dir()
    }
}

/// The claim directory of one daemon (its state dir names it as owner).
#[derive(Debug)]
pub(crate) struct SlotRegistry {
    dir: PathBuf,
    state_dir: PathBuf,
}

/// Held while claims are read or changed.
struct DirLock(File);

impl Drop for DirLock {
    fn drop(&mut self) {
        // SAFETY: flock on an fd we own.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// What [`SlotRegistry::claim`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The range is ours now (or already was, for this sandbox).
    Taken,
    /// Another live sandbox holds it.
    Held,
}

impl SlotRegistry {
    pub(crate) fn new(dir: &Path, state_dir: &Path) -> io::Result<Self> {
        // Claims name state dirs and sandboxes: root's alone.
        crate::perms::create_dir_all(dir, crate::perms::PRIVATE_DIR)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            state_dir: fs::canonicalize(state_dir)?,
        })
    }

    fn lock(&self) -> io::Result<DirLock> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(crate::perms::PRIVATE_FILE)
            .open(self.dir.join(".lock"))?;
        // SAFETY: flock on an fd we own; blocks until the other holder is done (short).
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(DirLock(file))
    }

    fn path(&self, uid_base: u32) -> PathBuf {
        self.dir.join(uid_base.to_string())
    }

    fn read(&self, uid_base: u32) -> Option<Owner> {
        let bytes = fs::read(self.path(uid_base)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Claims the range starting at host uid `uid_base` for `sandbox`, taking over a
    /// stale claim.
    pub(crate) fn claim(&self, uid_base: u32, sandbox: &str) -> io::Result<Claim> {
        let _lock = self.lock()?;
        let ours = Owner {
            state_dir: self.state_dir.clone(),
            sandbox: sandbox.to_owned(),
        };
        if let Some(owner) = self.read(uid_base) {
            if owner == ours {
                return Ok(Claim::Taken);
            }
            // Checked only for a claim that looks stale, which is rare: a kill releases.
            if owner.is_live() || range_in_use(uid_base) {
                return Ok(Claim::Held);
            }
        }
        let tmp = self.dir.join(format!(".{uid_base}.tmp"));
        crate::perms::write_private(&tmp, &serde_json::to_vec(&ours).map_err(io::Error::other)?)?;
        fs::rename(&tmp, self.path(uid_base))?;
        Ok(Claim::Taken)
    }

    /// True when another daemon (another state dir) holds a range for a live sandbox
    /// `sandbox`: its cgroups are that daemon's, even while they hold no process (a
    /// paused sandbox keeps its groups).
    pub(crate) fn held_elsewhere(&self, sandbox: &str) -> bool {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return false;
        };
        entries
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
            .filter_map(|entry| serde_json::from_slice::<Owner>(&fs::read(entry.path()).ok()?).ok())
            .any(|owner| {
                owner.sandbox == sandbox && owner.state_dir != self.state_dir && owner.is_live()
            })
    }

    /// Gives up the range at `uid_base` if `sandbox` of this daemon holds it.
    pub(crate) fn release(&self, uid_base: u32, sandbox: &str) -> io::Result<()> {
        let _lock = self.lock()?;
        let ours = Owner {
            state_dir: self.state_dir.clone(),
            sandbox: sandbox.to_owned(),
        };
        if self.read(uid_base).as_ref() == Some(&ours) {
            fs::remove_file(self.path(uid_base))?;
        }
        Ok(())
    }
}

/// Does any process on the host run as a uid of the range starting at `uid_base`? (A
/// `/proc/<pid>` directory belongs to its process's effective uid.)
fn range_in_use(uid_base: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let range = uid_base..uid_base.saturating_add(crate::linux::UID_RANGE_SIZE);
    let Ok(entries) = fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        entry.file_name().to_string_lossy().parse::<u32>().is_ok()
            && entry.metadata().is_ok_and(|m| range.contains(&m.uid()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Far above the ranges berth hands out (from 2^30), so no real sandbox's processes
    /// are in the tests' ranges.
    const TEST_BASE: u32 = 3 << 30;

    /// Two daemons (state dirs `a` and `b`) sharing the claim directory `claims`, all
    /// under the returned temporary directory.
    fn two_daemons() -> (tempfile::TempDir, SlotRegistry, SlotRegistry) {
        let root = tempfile::tempdir().unwrap();
        let claims = root.path().join("claims");
        let [a, b] = ["a", "b"].map(|name| {
            let state = root.path().join(name);
            fs::create_dir_all(&state).unwrap();
            SlotRegistry::new(&claims, &state).unwrap()
        });
        (root, a, b)
    }

    fn record(state: &Path, id: &str) {
        fs::create_dir_all(state.join("sandboxes").join(id)).unwrap();
    }

    #[test]
    fn a_live_sandbox_of_another_daemon_is_held_elsewhere() {
        let (root, a, b) = two_daemons();
        record(&root.path().join("a"), "ia");
        assert_eq!(a.claim(TEST_BASE, "ia").unwrap(), Claim::Taken);
        assert!(b.held_elsewhere("ia"));
        assert!(!a.held_elsewhere("ia"), "a's own");
        assert!(!b.held_elsewhere("unknown"));
        fs::remove_dir_all(root.path().join("a/sandboxes/ia")).unwrap();
        assert!(!b.held_elsewhere("ia"), "its directory is gone");
    }

    #[test]
    fn two_daemons_never_share_a_range_and_stale_claims_are_taken_over() {
        let (root, a, b) = two_daemons();
        let claims = root.path().join("claims");
        let (a_state, b_state) = (root.path().join("a"), root.path().join("b"));

        record(&a_state, "ia");
        assert_eq!(a.claim(TEST_BASE, "ia").unwrap(), Claim::Taken);
        assert_eq!(
            a.claim(TEST_BASE, "ia").unwrap(),
            Claim::Taken,
            "idempotent"
        );
        assert_eq!(b.claim(TEST_BASE, "ib").unwrap(), Claim::Held);
        b.release(TEST_BASE, "ib").unwrap();
        assert_eq!(
            b.claim(TEST_BASE, "ib").unwrap(),
            Claim::Held,
            "not b's to release"
        );

        // a's sandbox is gone without a release (crash): the claim is stale.
        fs::remove_dir_all(a_state.join("sandboxes/ia")).unwrap();
        record(&b_state, "ib");
        assert_eq!(b.claim(TEST_BASE, "ib").unwrap(), Claim::Taken);
        assert_eq!(a.claim(TEST_BASE, "ia").unwrap(), Claim::Held);
        b.release(TEST_BASE, "ib").unwrap();
        assert!(!claims.join(TEST_BASE.to_string()).exists());
    }

    #[test]
    fn a_claim_whose_directory_is_gone_stays_while_its_processes_run() {
        use std::os::unix::process::CommandExt;
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("skipped: needs root to run a process as a uid of the range");
            return;
        }
        let (root, a, b) = two_daemons();
        let (a_state, b_state) = (root.path().join("a"), root.path().join("b"));
        let base = TEST_BASE + crate::linux::UID_RANGE_SIZE;
        record(&a_state, "ia");
        assert_eq!(a.claim(base, "ia").unwrap(), Claim::Taken);
        let mut orphan = std::process::Command::new("sleep")
            .arg("60")
            .uid(base + 1000)
            .spawn()
            .unwrap();
        fs::remove_dir_all(a_state.join("sandboxes/ia")).unwrap();
        record(&b_state, "ib");
        let held = b.claim(base, "ib").unwrap();
        orphan.kill().unwrap();
        orphan.wait().unwrap();
        assert_eq!(
            held,
            Claim::Held,
            "a range whose processes run is not taken over"
        );
        assert_eq!(
            b.claim(base, "ib").unwrap(),
            Claim::Taken,
            "free once they are gone"
        );
    }
}
