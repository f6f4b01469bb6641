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
//! images; the server then reports it killed. The window is about [`FLUSH_DELAY`] after a
//! pause answered. A clean shutdown of berth waits for the flusher
//! ([`PauseFlusher::settle`]), and a clean host reboot syncs filesystems before it
//! restarts.
//!
//! [`LinuxRuntime::recover`]: crate::Runtime::recover

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;
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
        let tmp = dir.join(".paused.durable.json.tmp");
        let file =
            perms::write_private(&tmp, &serde_json::to_vec(self).map_err(io::Error::other)?)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, dir.join(DURABLE_FILE))?;
        fs::File::open(dir)?.sync_all()
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
pub(crate) fn host_boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
}

/// Makes a pause durable now: one `syncfs` of the filesystem holding `images` (the
/// images, the disk image and the marker), then its durable marker.
pub(crate) fn make_durable(dir: &Path, images: &Path, paused_at: SystemTime) -> io::Result<()> {
    let images_dir = fs::File::open(images)?;
    sys::syncfs_mount(images_dir.as_fd())?;
    DurableMarker { paused_at }.write(dir)
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

/// The thread that makes answered pauses durable, in batches.
pub(crate) struct PauseFlusher {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Option<JoinHandle<()>>,
}

impl PauseFlusher {
    pub(crate) fn new() -> io::Result<Self> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("berth-pause-flush".into())
            .spawn(move || {
                while let Ok(first) = receiver.recv() {
                    if let Job::Flush(pending) = &first {
                        std::thread::sleep(FLUSH_DELAY.saturating_sub(pending.queued.elapsed()));
                    }
                    // Everything queued by now shares one syncfs.
                    let mut batch = vec![first];
                    batch.extend(receiver.try_iter());
                    let mut synced = false;
                    let mut settled = Vec::new();
                    for job in batch {
                        match job {
                            Job::Settle(done) => settled.push(done),
                            Job::Flush(pending) => {
                                if let Err(err) = flush(&pending, &mut synced) {
                                    // The sandbox was resumed or killed meanwhile (its
                                    // images are gone), or the disk failed: recovery
                                    // judges a marker left without its durable file.
                                    tracing::debug!(dir = %pending.dir.display(), %err, "making a pause durable");
                                }
                            }
                        }
                    }
                    for done in settled {
                        let _ = done.send(());
                    }
                }
            })?;
        Ok(PauseFlusher {
            sender: Mutex::new(Some(sender)),
            thread: Some(thread),
        })
    }

    /// Queues the pause of the sandbox in `dir` (images in `images`, marker written
    /// with `paused_at`) to be made durable.
    pub(crate) fn queue(&self, dir: PathBuf, images: PathBuf, paused_at: SystemTime) {
        let job = Job::Flush(Pending {
            dir,
            images,
            paused_at,
            queued: Instant::now(),
        });
        let sent = self
            .sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|sender| sender.send(job));
        if let Some(Err(mpsc::SendError(Job::Flush(pending)))) = sent {
            // The thread is gone: do it here rather than leave it undone.
            let _ = flush(&pending, &mut false);
        }
    }

    /// Waits until every pause queued so far is durable.
    pub(crate) fn settle(&self) {
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

/// Syncs once per batch (`synced`), then writes the pause's durable marker, unless the
/// pause is no longer the sandbox's current one.
fn flush(pending: &Pending, synced: &mut bool) -> io::Result<()> {
    // Resumed (the images are gone) or killed meanwhile: nothing to sync or vouch for.
    let Ok(images_dir) = fs::File::open(&pending.images) else {
        return Ok(());
    };
    if !*synced {
        sys::syncfs_mount(images_dir.as_fd())?;
        *synced = true;
    }
    DurableMarker {
        paused_at: pending.paused_at,
    }
    .write(&pending.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_pause_gets_its_durable_marker_by_settle() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("sandbox");
        let images = dir.join("checkpoint");
        fs::create_dir_all(&images).unwrap();
        let paused_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let flusher = PauseFlusher::new().unwrap();
        flusher.queue(dir.clone(), images, paused_at);
        flusher.settle();
        assert_eq!(DurableMarker::read(&dir), Some(DurableMarker { paused_at }));
    }

    #[test]
    fn a_pause_resumed_before_its_flush_gets_no_marker() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("sandbox");
        let images = dir.join("checkpoint");
        fs::create_dir_all(&images).unwrap();
        let flusher = PauseFlusher::new().unwrap();
        // The first job's images exist, so the batch is synced; the second one's images
        // are gone (resumed): no marker vouches for it.
        let other = root.path().join("other");
        fs::create_dir_all(other.join("checkpoint")).unwrap();
        fs::remove_dir_all(&images).unwrap();
        flusher.queue(other.clone(), other.join("checkpoint"), SystemTime::now());
        flusher.queue(dir.clone(), images, SystemTime::now());
        flusher.settle();
        assert!(DurableMarker::read(&other).is_some());
        assert!(DurableMarker::read(&dir).is_none());
    }
}
