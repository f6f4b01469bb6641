//! Write-back of memory pauses: a pause is answered once its CRIU images and the flushed
//! disk are in the page cache, and made durable just after, off the caller's path.
//!
//! Making a pause durable is one `syncfs` of the state filesystem. At 64 MiB resident it
//! was a quarter of the whole pause (~30 ms of ~130), and it also writes back whatever
//! other sandboxes left dirty. So a memory pause writes its `paused.json` marker without
//! syncing it. The marker names the host boot it was written in. The sandbox is then
//! handed to the [`PauseFlusher`]: one thread, which waits [`FLUSH_DELAY`] after a pause,
//! then makes every pause still waiting durable with a single `syncfs`, and writes each
//! one's `paused.durable.json` (fsynced). That file records which pause it stands for,
//! so a stale one from an earlier pause never vouches for a later one. A sandbox
//! resumed within the delay is never synced at all: its images are gone, and a
//! write-back running under its resume would make the resume's own fsyncs wait.
//!
//! **What a crash does.** A pause without its durable file is still sound in the same
//! boot: a berth crash loses no page cache, and recovery finishes the write-back itself
//! (see [`LinuxRuntime::recover`]). After a host restart, such a pause may have reached
//! the disk only in part, so recovery removes the sandbox rather than restore torn
//! images; the server then reports it killed. While berth runs, the window is about
//! [`FLUSH_DELAY`] after a pause answered (longer while write-back fails: a failed
//! `syncfs` vouches for nothing in its batch, logs a warning, and is tried again every
//! few seconds). A clean stop of berth waits for the flusher ([`PauseFlusher::settle`])
//! and makes pauses answered after that durable before answering them.
//!
//! **What this trusts.** The boot id stands for "the page cache survived". Two cases
//! break that and are not covered: berth killed (not stopped) within that second and
//! not started again before the host reboots, even cleanly, loses those pauses (the
//! reboot wrote them, but nothing vouches for them); and a state filesystem whose
//! device went away and came back without a reboot (the page cache is gone, the boot id
//! is not) has its unsynced pauses trusted.
//!
//! [`LinuxRuntime::recover`]: crate::Runtime::recover

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::perms;
use crate::sys;

/// Beside `paused.json` once that pause is on disk.
pub(crate) const DURABLE_FILE: &str = "paused.durable.json";
/// How long after a pause the flusher waits before syncing it. The kernel itself writes
/// dirty pages back after 5 to 30 s, so this keeps the window for a host crash well
/// under what any unsynced write has.
pub(crate) const FLUSH_DELAY: Duration = Duration::from_secs(1);

/// What `paused.durable.json` holds: the pause it vouches for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct DurableMarker {
    pub paused_at: SystemTime,
}

impl DurableMarker {
    /// Writes the marker into sandbox directory `dir`, durably (the caller has synced
    /// what it vouches for).
    pub(crate) fn write(&self, dir: &Path) -> io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(io::Error::other)?;
        perms::replace_private(dir, DURABLE_FILE, &bytes, true)
    }

    pub(crate) fn read(dir: &Path) -> Option<Self> {
        serde_json::from_slice(&fs::read(dir.join(DURABLE_FILE)).ok()?).ok()
    }

    /// Removes a marker left by an earlier pause of the sandbox in `dir`.
    pub(crate) fn remove(dir: &Path) {
        let _ = fs::remove_file(dir.join(DURABLE_FILE));
    }
}

/// The host's boot id: it changes with every boot, and only then.
fn host_boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
}

/// One pause waiting to be made durable.
struct Pending {
    dir: PathBuf,
    images: PathBuf,
    paused_at: SystemTime,
    queued: Instant,
}

enum Job {
    Flush(Pending),
    /// Answered once every job sent before it is done.
    Settle(mpsc::Sender<()>),
}

/// How long a pause whose write-back failed waits before the flusher tries again.
const RETRY_DELAY: Duration = Duration::from_secs(5);

/// The thread that makes answered pauses durable, in batches.
pub(crate) struct PauseFlusher {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Option<JoinHandle<()>>,
    /// Set by [`PauseFlusher::settle`]: pauses answered after it (a stop is under way)
    /// are made durable before they are answered.
    inline: AtomicBool,
    state: Arc<StateFs>,
    /// This host boot's id, read once: it cannot change while the daemon runs.
    boot_id: Option<String>,
}

/// The state filesystem, through one descriptor held for the daemon's life: `syncfs`
/// on it reports every write-back error since its previous call on it, even one some
/// other `syncfs` already saw (a new descriptor would only see errors from its open on).
struct StateFs {
    dir: fs::File,
    device: u64,
}

impl StateFs {
    /// Syncs the filesystem holding `images` (the state filesystem, or, for images
    /// elsewhere, theirs).
    fn sync_for(&self, images: &fs::File) -> io::Result<()> {
        if images.metadata()?.dev() == self.device {
            // SAFETY: syncfs on a descriptor this struct owns.
            sys::check(unsafe { libc::syncfs(self.dir.as_raw_fd()) }.into()).map(drop)
        } else {
            sys::syncfs_mount(images.as_fd())
        }
    }
}

impl PauseFlusher {
    /// A flusher for pauses under `state_dir`.
    pub(crate) fn new(state_dir: &Path) -> io::Result<Self> {
        let dir = fs::File::open(state_dir)?;
        let device = dir.metadata()?.dev();
        let state = Arc::new(StateFs { dir, device });
        let (sender, receiver) = mpsc::channel::<Job>();
        let thread_state = state.clone();
        let thread = std::thread::Builder::new()
            .name("berth-pause-flush".into())
            .spawn(move || run(&receiver, &thread_state))?;
        Ok(PauseFlusher {
            sender: Mutex::new(Some(sender)),
            thread: Some(thread),
            inline: AtomicBool::new(false),
            state,
            boot_id: host_boot_id(),
        })
    }

    /// The host boot pauses are written in (None when the kernel does not say).
    pub(crate) fn boot_id(&self) -> Option<&str> {
        self.boot_id.as_deref()
    }

    /// Makes the pause of the sandbox in `dir` durable on the caller's thread (a stop
    /// is settling, the flusher is gone, or a start finishes an earlier pause).
    pub(crate) fn flush_now(&self, dir: PathBuf, images: PathBuf, paused_at: SystemTime) {
        let pending = Pending {
            dir,
            images,
            paused_at,
            queued: Instant::now(),
        };
        // What fails is warned of by `flush_batch`; a start in this boot tries again.
        flush_batch(&self.state, vec![pending]);
    }

    /// Queues the pause of the sandbox in `dir` (images in `images`, marker written
    /// with `paused_at`) to be made durable; once a stop is settling, makes it durable
    /// now instead.
    pub(crate) fn queue(&self, dir: PathBuf, images: PathBuf, paused_at: SystemTime) {
        let pending = Pending {
            dir,
            images,
            paused_at,
            queued: Instant::now(),
        };
        if self.inline.load(Ordering::SeqCst) {
            flush_batch(&self.state, vec![pending]);
            return;
        }
        let sent = self
            .sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|sender| sender.send(Job::Flush(pending)));
        if let Some(Err(mpsc::SendError(Job::Flush(pending)))) = sent {
            // The thread is gone: do it here rather than leave it undone.
            flush_batch(&self.state, vec![pending]);
        }
    }

    /// Waits until every pause queued so far is durable; pauses answered from now on
    /// are made durable before their answer.
    pub(crate) fn settle(&self) {
        self.inline.store(true, Ordering::SeqCst);
        let (done, wait) = mpsc::channel();
        let sent = self
            .sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|sender| sender.send(Job::Settle(done)).is_ok());
        if sent {
            let _ = wait.recv();
        }
    }
}

impl Drop for PauseFlusher {
    fn drop(&mut self) {
        drop(self.sender.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The flusher thread: waits [`FLUSH_DELAY`] after the first pause of a batch, makes the
/// batch durable with one `syncfs`, and keeps what failed for another try.
fn run(receiver: &mpsc::Receiver<Job>, state: &StateFs) {
    let mut retry: Vec<Pending> = Vec::new();
    loop {
        let first = if retry.is_empty() {
            receiver.recv().ok()
        } else {
            match receiver.recv_timeout(RETRY_DELAY) {
                Ok(job) => Some(job),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                // Closing: one last try for what failed.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    flush_batch(state, std::mem::take(&mut retry));
                    return;
                }
            }
        };
        let mut batch = Vec::new();
        let mut settled = Vec::new();
        match first {
            Some(Job::Flush(pending)) => {
                std::thread::sleep(FLUSH_DELAY.saturating_sub(pending.queued.elapsed()));
                batch.push(pending);
            }
            Some(Job::Settle(done)) => settled.push(done),
            None if retry.is_empty() => return,
            None => {}
        }
        // Everything queued by now shares one syncfs.
        for job in receiver.try_iter() {
            match job {
                Job::Flush(pending) => batch.push(pending),
                Job::Settle(done) => settled.push(done),
            }
        }
        batch.append(&mut retry);
        retry = flush_batch(state, batch);
        for done in settled {
            let _ = done.send(());
        }
    }
}

/// Makes `batch` durable: one `syncfs`, then each pause's durable marker. Returns the
/// pauses to try again (all of them when the sync failed: a failed write-back may be
/// any of theirs); pauses whose images are gone (resumed or killed) are dropped.
fn flush_batch(state: &StateFs, batch: Vec<Pending>) -> Vec<Pending> {
    let mut open = Vec::new();
    for pending in batch {
        // Resumed or killed meanwhile: nothing to sync or vouch for.
        if let Ok(images) = fs::File::open(&pending.images) {
            open.push((pending, images));
        }
    }
    let Some((_, first_images)) = open.first() else {
        return Vec::new();
    };
    let mut synced = state.sync_for(first_images);
    // Images on another filesystem than the first's are synced there too.
    for (_, images) in &open[1..] {
        if synced.is_ok() && images.metadata().map(|m| m.dev()).ok() != Some(state.device) {
            synced = sys::syncfs_mount(images.as_fd());
        }
    }
    if let Err(err) = synced {
        tracing::warn!(%err, pauses = open.len(), "writing paused sandboxes' images to disk failed; trying again");
        return open.into_iter().map(|(pending, _)| pending).collect();
    }
    let mut failed = Vec::new();
    for (pending, _) in open {
        let marker = DurableMarker {
            paused_at: pending.paused_at,
        };
        if let Err(err) = marker.write(&pending.dir) {
            if pending.dir.is_dir() {
                tracing::warn!(dir = %pending.dir.display(), %err, "recording a pause as durable failed; trying again");
                failed.push(pending);
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox directory with an images directory in it, under `root`.
    fn paused_sandbox(root: &Path, name: &str) -> (PathBuf, PathBuf) {
        let dir = root.join(name);
        let images = dir.join("checkpoint");
        fs::create_dir_all(&images).unwrap();
        (dir, images)
    }

    #[test]
    fn a_queued_pause_gets_its_durable_marker_by_settle() {
        let root = tempfile::tempdir().unwrap();
        let (dir, images) = paused_sandbox(root.path(), "sandbox");
        let paused_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let flusher = PauseFlusher::new(root.path()).unwrap();
        flusher.queue(dir.clone(), images, paused_at);
        flusher.settle();
        assert_eq!(DurableMarker::read(&dir), Some(DurableMarker { paused_at }));
    }

    #[test]
    fn a_pause_resumed_before_its_flush_gets_no_marker() {
        let root = tempfile::tempdir().unwrap();
        let (dir, images) = paused_sandbox(root.path(), "sandbox");
        let flusher = PauseFlusher::new(root.path()).unwrap();
        // The first job's images exist, so the batch is synced; the second one's images
        // are gone (resumed): no marker vouches for it.
        let (other, other_images) = paused_sandbox(root.path(), "other");
        fs::remove_dir_all(&images).unwrap();
        flusher.queue(other.clone(), other_images, SystemTime::now());
        flusher.queue(dir.clone(), images, SystemTime::now());
        flusher.settle();
        assert!(DurableMarker::read(&other).is_some());
        assert!(DurableMarker::read(&dir).is_none());
    }

    #[test]
    fn a_second_pause_soon_after_the_first_is_the_one_vouched_for() {
        let root = tempfile::tempdir().unwrap();
        let (dir, images) = paused_sandbox(root.path(), "sandbox");
        let first = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
        let second = SystemTime::UNIX_EPOCH + Duration::from_secs(2);
        let flusher = PauseFlusher::new(root.path()).unwrap();
        flusher.queue(dir.clone(), images.clone(), first);
        flusher.queue(dir.clone(), images, second);
        flusher.settle();
        assert_eq!(
            DurableMarker::read(&dir),
            Some(DurableMarker { paused_at: second })
        );
    }

    #[test]
    fn once_a_stop_settles_a_pause_is_durable_when_queued() {
        let root = tempfile::tempdir().unwrap();
        let (dir, images) = paused_sandbox(root.path(), "sandbox");
        let flusher = PauseFlusher::new(root.path()).unwrap();
        flusher.settle();
        let paused_at = SystemTime::now();
        flusher.queue(dir.clone(), images, paused_at);
        assert_eq!(DurableMarker::read(&dir), Some(DurableMarker { paused_at }));
    }
}
