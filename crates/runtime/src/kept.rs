//! Paused sandboxes whose processes are kept, frozen, for a quick resume.
//!
//! A memory pause always writes its CRIU images: they are the pause, durable (see
//! `durability`), what a fork, an export or a later resume reads. With keeping on, the
//! pause also leaves the dumped tree in place, frozen in its cgroup, instead of killing
//! it: the group is frozen before the dump and CRIU freezes it again before it lets the
//! tasks go (`--freeze-cgroup` with `--leave-running`), so the tree never runs between the
//! dump and a resume and its memory is what the images hold. A resume that finds the tree
//! kept thaws it, in milliseconds whatever its memory, instead of restoring the images
//! (a copy of every page: about 75 ms at 64 MiB, a second at 512 MiB, on the project's
//! machine). Connections the tree held stay open, and its clocks count the paused time
//! (a restore from images closes them and leaves its monotonic clock where it stood).
//!
//! Without keeping the dump leaves the tree frozen all the same, and this module's
//! thread ends it right after the pause is answered ([`KeptTrees::keep`]): a dump that
//! kills the tree waits inside the pause for it to die and its memory to be freed
//! (paired runs on the project's machine: 7 ms at 64 MiB, 13–85 ms at 512 MiB). Until
//! it is dead, anything that needs it gone (a resume, which then restores the images; a
//! kill; an export) waits for it, as for any tree being ended.
//!
//! Keeping costs the host the tree's memory, so a kept tree is ended, and a later resume
//! restores the images as without keeping, when
//! - it has been kept for [`KeepPaused::linger`] (the thread ends it then);
//! - keeping it would take all kept trees past [`KeepPaused::budget_bytes`] (the longest
//!   kept go first, ended by the thread; a tree alone over the budget is not kept);
//! - the sandbox is killed, or resumed without its memory;
//! - the daemon stops cleanly, or starts and finds one left by a crash (a frozen init
//!   beside a paused marker: see `LinuxRuntime::finish_interrupted_resume`).
//!
//! Ending a tree: SIGKILL to its init, then thaw (a frozen task takes a pending SIGKILL
//! on its way out of the freezer, before any of its own code runs), then wait for the
//! init and kill whatever else is in its groups. Whoever removes a tree from the map owns
//! it; [`KeptTrees::take`] waits while another caller is still ending the same sandbox's
//! tree, so a restore never mounts a disk a dying tree still holds.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cgroup::Cgroups;
use crate::linux::{end_processes_in, kill_init};
use crate::SandboxInfo;

/// How long and how much paused sandboxes' processes are kept (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepPaused {
    /// How long a paused sandbox's frozen processes are kept; zero: never kept.
    pub linger: Duration,
    /// Most memory (the sandboxes' memory cgroups' usage at their pause) kept at once.
    pub budget_bytes: u64,
}

impl KeepPaused {
    /// Never keep: every resume restores its images.
    pub const OFF: Self = Self {
        linger: Duration::ZERO,
        budget_bytes: 0,
    };

    pub fn enabled(&self) -> bool {
        !self.linger.is_zero() && self.budget_bytes > 0
    }
}

/// A paused sandbox's frozen tree and what its runtime entry held.
#[derive(Debug)]
pub(crate) struct KeptTree {
    pub info: SandboxInfo,
    pub slot: u32,
    pub pidfd: OwnedFd,
    /// True when the init is the daemon's child (it must be reaped).
    pub own_child: bool,
    /// The daemon's reference to the sandbox's disk mount.
    pub disk: Option<OwnedFd>,
    pub disk_uid_base: u32,
    pub bytes: u64,
    kept_at: Instant,
}

impl KeptTree {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        info: SandboxInfo,
        slot: u32,
        pidfd: OwnedFd,
        own_child: bool,
        disk: Option<OwnedFd>,
        disk_uid_base: u32,
        bytes: u64,
    ) -> Self {
        Self {
            info,
            slot,
            pidfd,
            own_child,
            disk,
            disk_uid_base,
            bytes,
            kept_at: Instant::now(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    trees: HashMap<String, KeptTree>,
    /// Sandboxes whose tree someone took to end and has not finished ending.
    ending: HashSet<String>,
    /// Trees the thread is to end at once (listed in `ending` too).
    doomed: Vec<(String, KeptTree)>,
    stopping: bool,
}

impl Inner {
    /// Removes the trees `pick` selects and marks them ending, for [`Shared::end`].
    fn take_to_end(&mut self, pick: impl Fn(&KeptTree) -> bool) -> Vec<(String, KeptTree)> {
        let ids: Vec<String> = self
            .trees
            .iter()
            .filter(|(_, tree)| pick(tree))
            .map(|(id, _)| id.clone())
            .collect();
        let trees: Vec<(String, KeptTree)> = ids
            .into_iter()
            .filter_map(|id| self.trees.remove(&id).map(|tree| (id, tree)))
            .collect();
        self.ending.extend(trees.iter().map(|(id, _)| id.clone()));
        trees
    }

    /// Hands `tree` of sandbox `id` to the thread, to end at once.
    fn doom(&mut self, id: &str, tree: KeptTree) {
        self.ending.insert(id.to_owned());
        self.doomed.push((id.to_owned(), tree));
    }
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    /// Signalled when a tree is added, or finished ending, or the runtime stops.
    changed: Condvar,
    cgroups: Cgroups,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends `tree` of sandbox `id`, which the caller took (and marked ending).
    fn end(&self, id: &str, tree: KeptTree) {
        end_tree(&self.cgroups, id, tree);
        self.lock().ending.remove(id);
        self.changed.notify_all();
    }
}

/// The kept trees of one runtime and the thread that ends them when they expire or are
/// doomed.
#[derive(Debug)]
pub(crate) struct KeptTrees {
    policy: KeepPaused,
    shared: Arc<Shared>,
    ender: Option<JoinHandle<()>>,
}

impl KeptTrees {
    pub(crate) fn new(policy: KeepPaused, cgroups: Cgroups) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner::default()),
            changed: Condvar::new(),
            cgroups,
        });
        let linger = policy.enabled().then_some(policy.linger);
        let ender = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("berth-kept-paused".into())
                .spawn(move || end_when_due(&shared, linger))?
        };
        Ok(Self {
            policy,
            shared,
            ender: Some(ender),
        })
    }

    /// Keeps `tree` for sandbox `id`, ending the longest kept trees while the kept memory
    /// would pass the budget (`tree` itself when it alone is over it, or keeping is off).
    /// What is ended here, the thread ends, after the caller's pause is answered.
    pub(crate) fn keep(&self, id: &str, tree: KeptTree) {
        let mut inner = self.shared.lock();
        if !self.policy.enabled() || tree.bytes > self.policy.budget_bytes {
            tracing::debug!(sandbox = %id, bytes = tree.bytes, "paused sandbox not kept: its processes end");
            inner.doom(id, tree);
        } else {
            let mut kept: u64 = inner.trees.values().map(|t| t.bytes).sum();
            while kept + tree.bytes > self.policy.budget_bytes {
                let Some(oldest) = inner
                    .trees
                    .iter()
                    .min_by_key(|(_, t)| t.kept_at)
                    .map(|(id, _)| id.clone())
                else {
                    break;
                };
                let old = inner.trees.remove(&oldest).expect("listed just now");
                kept -= old.bytes;
                inner.doom(&oldest, old);
            }
            inner.trees.insert(id.to_owned(), tree);
        }
        drop(inner);
        self.shared.changed.notify_all();
    }

    /// Takes sandbox `id`'s kept tree, waiting while another caller ends it; None when it
    /// has none (any tree it had is dead by then).
    pub(crate) fn take(&self, id: &str) -> Option<KeptTree> {
        self.take_marked(id, false)
    }

    /// [`KeptTrees::take`], marking the tree ending (for [`Shared::end`]) when `ending`.
    fn take_marked(&self, id: &str, ending: bool) -> Option<KeptTree> {
        let mut inner = self.shared.lock();
        loop {
            if let Some(tree) = inner.trees.remove(id) {
                if ending {
                    inner.ending.insert(id.to_owned());
                }
                return Some(tree);
            }
            if !inner.ending.contains(id) {
                return None;
            }
            inner = self
                .shared
                .changed
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Ends sandbox `id`'s kept tree, if it has one, and returns once it is dead.
    pub(crate) fn end(&self, id: &str) {
        if let Some(tree) = self.take_marked(id, true) {
            self.shared.end(id, tree);
        }
    }

    /// Ends `tree` of sandbox `id`, never kept (its pause failed after the dump).
    pub(crate) fn end_untaken(&self, id: &str, tree: KeptTree) {
        end_tree(&self.shared.cgroups, id, tree);
    }

    /// Ends a frozen tree of sandbox `id` this map does not hold (one an earlier daemon
    /// kept, or one that could not be kept), whose init is `pidfd`.
    pub(crate) fn end_frozen(&self, id: &str, pidfd: &OwnedFd, own_child: bool) {
        end_frozen(&self.shared.cgroups, id, pidfd, own_child);
    }

    /// Ends every kept tree, and returns once those the thread was ending are dead too
    /// (a clean stop: the images are the pauses).
    pub(crate) fn end_all(&self) {
        let trees = {
            let mut inner = self.shared.lock();
            let mut trees = std::mem::take(&mut inner.doomed);
            trees.extend(inner.take_to_end(|_| true));
            trees
        };
        for (id, tree) in trees {
            self.shared.end(&id, tree);
        }
        let mut inner = self.shared.lock();
        while !inner.ending.is_empty() {
            inner = self
                .shared
                .changed
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for KeptTrees {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.changed.notify_all();
        if let Some(ender) = self.ender.take() {
            let _ = ender.join();
        }
        self.end_all();
    }
}

/// The thread: ends each doomed tree at once and, with keeping on (`linger`), each kept
/// tree `linger` after it was kept. Doomed trees are ended before it stops.
fn end_when_due(shared: &Shared, linger: Option<Duration>) {
    let mut inner = shared.lock();
    loop {
        let now = Instant::now();
        let mut trees = std::mem::take(&mut inner.doomed);
        if let Some(linger) = linger.filter(|_| !inner.stopping) {
            trees.extend(inner.take_to_end(|tree| now >= tree.kept_at + linger));
        }
        if !trees.is_empty() {
            drop(inner);
            for (id, tree) in trees {
                shared.end(&id, tree);
            }
            inner = shared.lock();
            continue;
        }
        if inner.stopping {
            return;
        }
        let next = linger.and_then(|linger| inner.trees.values().map(|t| t.kept_at + linger).min());
        inner = match next {
            Some(at) => {
                shared
                    .changed
                    .wait_timeout(inner, at.saturating_duration_since(now))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => shared
                .changed
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner),
        };
    }
}

/// Kills a kept tree and everything in its sandbox's groups, and drops its disk.
fn end_tree(cgroups: &Cgroups, id: &str, tree: KeptTree) {
    end_frozen(cgroups, id, &tree.pidfd, tree.own_child);
    drop(tree.disk);
}

/// Kills the frozen tree whose init is `pidfd` (reaped when `own_child`) and whatever
/// else is in sandbox `id`'s groups.
fn end_frozen(cgroups: &Cgroups, id: &str, pidfd: &OwnedFd, own_child: bool) {
    if let Err(err) = kill_init(pidfd) {
        tracing::warn!(sandbox = %id, %err, "killing a paused sandbox's kept init");
    }
    // Frozen tasks die once thawed: the SIGKILL is taken before user code runs.
    if let Err(err) = cgroups.set_frozen(id, false) {
        tracing::warn!(sandbox = %id, %err, "thawing a paused sandbox's kept processes to end them");
    }
    if let Err(err) = end_processes_in(cgroups, id, pidfd, own_child) {
        tracing::warn!(sandbox = %id, %err, "ending a paused sandbox's kept processes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeping_needs_both_a_linger_and_a_budget() {
        assert!(!KeepPaused::OFF.enabled());
        assert!(!KeepPaused {
            linger: Duration::from_secs(1),
            budget_bytes: 0
        }
        .enabled());
        assert!(!KeepPaused {
            linger: Duration::ZERO,
            budget_bytes: 1
        }
        .enabled());
        assert!(KeepPaused {
            linger: Duration::from_secs(1),
            budget_bytes: 1
        }
        .enabled());
    }
}
