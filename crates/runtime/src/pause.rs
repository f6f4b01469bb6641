//! Pause and resume with memory: a whole sandbox checkpointed by CRIU and brought back
//! under the same id.
//!
//! **Pause** dumps the process tree rooted at the init (with its namespaces), leaving it
//! frozen, and hands it with the daemon's reference to the disk to `kept`, which holds
//! them until a resume thaws the tree or ends them, right after the answer when keeping
//! is off; the ext4 mount and its loop device then go away with the dead mount
//! namespace. (Where the cgroup cannot be frozen, the dump kills the tree and the disk
//! reference is dropped at once.) The sandbox keeps its directory (disk image,
//! record), its cgroups and its uid slot; a `paused.json` marker next to the record, written
//! last (temp file + rename), is what makes it paused: a crash before that leaves a dead
//! sandbox that recovery cleans, a crash after it a paused one. The pause is answered
//! before its images are on disk; `durability` makes them durable right after and says
//! what a crash in between does.
//!
//! **Resume** rebuilds the root the way `create` did, but in the host's mount namespace,
//! because CRIU restores the tree's mount namespace on top of a root it is given
//! (`--root`): each template layer cloned and idmapped to the sandbox's uid range (through
//! a short-lived process in a user namespace carrying that range's map), the disk image
//! mounted again, and an overlay over them with `userxattr`, as the launcher mounts it.
//! After the restore the host mounts are detached at once (the restored namespace holds
//! its own copies), so the host mount table does not grow. Unlike at create, the overlay
//! is mounted by host root rather than by the sandbox's namespaced root. The record
//! naming the restored init is written before the marker goes: a crash in between leaves
//! a marker beside a running init, and the next start finishes the resume
//! ([`LinuxRuntime::finish_interrupted_resume`]) rather than listing it paused.
//!
//! The restored init is not the daemon's child (CRIU detaches it), so it is tracked like a
//! sandbox reattached after a restart: by pidfd, never reaped by us.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use std::time::SystemTime;

use berth_checkpoint::{Criu, Dump, Restore};

use super::{
    dump_externals, io_err, kill_init, valid_id, volume_key, CloneArgs, DiskOrigin, LinuxRuntime,
    UID_RANGE_SIZE,
};
use crate::disk;
use crate::durability::DurableMarker;
use crate::kept::KeptTree;
use crate::record::{self, Record};
use crate::restorable;
use crate::sys::{self, cpath, FsContext, MOUNT_ATTR_NODEV};
use crate::{RuntimeError, SandboxInfo};

const PAUSED_FILE: &str = "paused.json";
/// CRIU's action script for a memory pause, beside the record while the dump runs.
const DUMP_HOOK_FILE: &str = "pause-dump-hook";

/// What `paused.json` holds: where the checkpoint is, if memory was kept.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct PausedMarker {
    /// CRIU images; None when only the disk was kept.
    images: Option<PathBuf>,
    paused_at: SystemTime,
    /// The host boot this marker was written in, set when it was written before its
    /// images were durable (see `durability`); absent: synced before the marker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    written_in_boot: Option<String>,
}

impl PausedMarker {
    /// Writes the marker after what it points to is durable, durably: it says the
    /// checkpoint (or kept disk) is the sandbox's state, so it must not reach the disk
    /// before what it points to, nor be lost after we answered.
    fn write(&self, dir: &Path) -> io::Result<()> {
        self.replace(dir, true)
    }

    /// Writes the marker without syncing anything: the pause flusher makes it and what
    /// it points to durable together.
    fn write_unsynced(&self, dir: &Path) -> io::Result<()> {
        self.replace(dir, false)
    }

    fn replace(&self, dir: &Path, durable: bool) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        crate::perms::replace_private(dir, PAUSED_FILE, &bytes, durable)
    }

    fn read(dir: &Path) -> Option<Self> {
        let bytes = fs::read(dir.join(PAUSED_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

fn criu_err(
    id: &str,
    op: &'static str,
) -> impl FnOnce(berth_checkpoint::CriuError) -> RuntimeError {
    let id = id.to_owned();
    move |source| RuntimeError::Criu {
        id,
        op,
        source: Box::new(source),
    }
}

impl LinuxRuntime {
    /// Checkpoints every process of sandbox `id` with its memory into `images` (created
    /// here; must not exist) and stops it: the dump leaves the tree frozen, kept for a
    /// quick resume or ended right after the answer, freeing its RAM (see `kept`). The
    /// disk, cgroups and uid slot are kept; the sandbox leaves [`crate::Runtime::list`]
    /// until [`LinuxRuntime::resume_paused`]. On failure the sandbox keeps running.
    pub fn pause_with_memory(
        &self,
        criu: &Criu,
        id: &str,
        images: &Path,
    ) -> Result<(), RuntimeError> {
        let sandbox = self.get(id)?;
        // The tree stays frozen from before the dump until it is resumed or ended (see
        // `kept`). Unfrozen, CRIU ends it inside the dump; it cannot seize frozen tasks
        // unless it is told their freezer, so a failed freeze is undone.
        let frozen = match self.cgroups.set_frozen(id, true) {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(sandbox = %id, %err, "freezing a sandbox for its pause: the dump ends its processes");
                let _ = self.cgroups.set_frozen(id, false);
                false
            }
        };
        let thaw_on_failure = || {
            if frozen {
                let _ = self.cgroups.set_frozen(id, false);
            }
        };
        if let Err(err) = crate::perms::create_dir(images, crate::perms::IMAGES_DIR) {
            thaw_on_failure();
            return Err(io_err(format!("create {}", images.display()))(err));
        }
        let netns = match self.sandbox_netns(id) {
            Ok(netns) => netns,
            Err(err) => {
                thaw_on_failure();
                let _ = fs::remove_dir_all(images);
                return Err(err);
            }
        };
        let dump = Dump {
            pid: sandbox.info.init_pid,
            images: images.to_path_buf(),
            leave_running: frozen,
            own_mount_namespace: true,
            // The namespace, link and rules stay while the sandbox is paused.
            netns,
            external_mounts: dump_externals(&sandbox.info),
            freeze_cgroup: frozen.then(|| self.cgroups.freezer_dir(id)),
        };
        let dir = self.sandbox_dir(id);
        let hook = dir.join(DUMP_HOOK_FILE);
        let report = dir.join(restorable::REFUSAL_FILE);
        let _ = fs::remove_file(&hook);
        let _ = fs::remove_file(&report);
        if let Err(err) = restorable::write_post_dump_hook(
            &hook,
            &self.config.launcher_binary,
            images,
            &report,
            None,
        ) {
            thaw_on_failure();
            let _ = fs::remove_dir_all(images);
            return Err(io_err("write post-dump hook")(err));
        }
        let dumped = criu.dump_with_action_script(&dump, &hook);
        let _ = fs::remove_file(&hook);
        if let Err(e) = dumped {
            thaw_on_failure();
            let _ = fs::remove_dir_all(images);
            let refused = restorable::refusal(id, &report);
            let _ = fs::remove_file(&report);
            return Err(refused.unwrap_or_else(|| criu_err(id, "dump")(e)));
        }
        let removed = self
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if removed.is_none() {
            // Killed while being dumped: nothing is left to pause.
            let _ = fs::remove_dir_all(images);
            return Err(RuntimeError::NotFound(id.to_owned()));
        }
        let dumped_tree = if frozen {
            self.take_dumped_tree(&sandbox)
        } else {
            // The dump killed the tree; processes outside it go too.
            self.end_processes(id, &sandbox.pidfd, sandbox.own_child)?;
            // The tree is already dumped and gone: a failed flush is reported, not
            // undone (the kernel still writes the disk back when the filesystem goes).
            if let Err(err) = release_disk_flushed(self, &sandbox) {
                tracing::warn!(sandbox = %id, %err, "flushing a paused sandbox's disk");
            }
            None
        };
        let result = self.mark_paused(id, images);
        if let Some(tree) = dumped_tree {
            if result.is_ok() {
                self.kept.keep(id, tree);
            } else {
                self.kept.end_untaken(id, tree);
            }
        }
        result
    }

    /// After a dump that left `sandbox`'s tree frozen: its disk flushed (so the disk
    /// image and the memory images agree on disk once the pause flusher ran) and
    /// everything a resume needs to thaw it or `kept` to end it, or None when it cannot
    /// be held (then it is ended here, as a dump that killed it would have).
    fn take_dumped_tree(&self, sandbox: &super::Sandbox) -> Option<KeptTree> {
        let id = sandbox.info.id.as_str();
        let disk = self.take_disk(sandbox);
        if let Some(disk) = &disk {
            if let Err(err) = sys::syncfs_mount(disk.as_fd()) {
                tracing::warn!(sandbox = %id, %err, "flushing a paused sandbox's disk");
            }
        }
        let bytes = self
            .cgroups
            .usage(id)
            .map_or(u64::MAX, |usage| usage.mem_used);
        match sandbox.pidfd.try_clone() {
            Ok(pidfd) => Some(KeptTree::new(
                sandbox.info.clone(),
                sandbox.slot,
                pidfd,
                sandbox.own_child,
                disk,
                sandbox.disk_uid_base,
                bytes,
            )),
            Err(err) => {
                tracing::warn!(sandbox = %id, %err, "keeping a paused sandbox's processes: they end with the pause");
                self.kept.end_frozen(id, &sandbox.pidfd, sandbox.own_child);
                None
            }
        }
    }

    /// Writes the marker that makes sandbox `id`, dumped into `images`, paused.
    fn mark_paused(&self, id: &str, images: &Path) -> Result<(), RuntimeError> {
        let dir = self.sandbox_dir(id);
        // CRIU does not fsync its images; one syncfs of the state filesystem does (it
        // also flushes the disk image file the sandbox's filesystem wrote to). It runs
        // on the pause flusher, after the answer, unless the boot cannot be named.
        let paused_at = SystemTime::now();
        DurableMarker::remove(&dir);
        let Some(boot) = self.pause_flusher.boot_id().map(str::to_owned) else {
            let images_dir = fs::File::open(images).map_err(io_err("open images dir"))?;
            sys::syncfs_mount(images_dir.as_fd()).map_err(io_err("sync checkpoint"))?;
            let marker = PausedMarker {
                images: Some(images.to_path_buf()),
                paused_at,
                written_in_boot: None,
            };
            return marker.write(&dir).map_err(io_err("write paused marker"));
        };
        let marker = PausedMarker {
            images: Some(images.to_path_buf()),
            paused_at,
            written_in_boot: Some(boot),
        };
        marker
            .write_unsynced(&dir)
            .map_err(io_err("write paused marker"))?;
        self.pause_flusher
            .queue(dir, images.to_path_buf(), paused_at);
        Ok(())
    }

    /// Waits until every memory pause answered so far is on disk (a clean stop calls
    /// this, so a host restarted right after finds them whole).
    /// The processes kept for quick resumes are ended too: the images are the pauses.
    pub fn settle_pauses(&self) {
        self.kept.end_all();
        self.pause_flusher.settle();
    }

    /// Whether the pause recorded in sandbox directory `dir` can be trusted at a daemon
    /// start, finishing its write-back if it was answered before being durable: true for
    /// a pause synced before its marker, one the flusher made durable, and one written in
    /// this very boot (nothing of the page cache was lost: it is made durable here);
    /// false for one written in an earlier boot and never made durable (its images and
    /// disk may be torn).
    pub(super) fn settle_unsynced_pause(&self, dir: &Path) -> bool {
        let Some(marker) = PausedMarker::read(dir) else {
            return true;
        };
        let (Some(boot), Some(images)) = (marker.written_in_boot, marker.images) else {
            return true;
        };
        if DurableMarker::read(dir).is_some_and(|durable| durable.paused_at == marker.paused_at) {
            return true;
        }
        // A boot id that cannot be read now says nothing about a restart: keep the pause
        // (and sync it), as the pause itself syncs inline when it cannot name the boot.
        if self.pause_flusher.boot_id().is_some_and(|now| now != boot) {
            return false;
        }
        // Left unsynced, it still restores from the page cache; the flusher warns.
        self.pause_flusher
            .flush_now(dir.to_path_buf(), images, marker.paused_at);
        true
    }

    /// Finishes a resume of the sandbox in `dir` that stopped (a crash, or a failed
    /// removal) after the record named the new init and before `paused.json` went: that
    /// init runs, so the sandbox is running, and the marker, its durable twin and the
    /// checkpoint it names go, as the resume would have removed them. Without this the
    /// sandbox would be listed paused while it runs, and a second resume would start a
    /// second copy of it.
    pub(super) fn finish_interrupted_resume(&self, dir: &Path, id: &str) {
        let Some(marker) = PausedMarker::read(dir) else {
            return;
        };
        let Some((_, pidfd, pid)) = Self::live_init(dir) else {
            return;
        };
        // A frozen init beside the marker is the tree an earlier daemon kept for a quick
        // resume (a resume thaws it before the marker goes), and one with a SIGKILL on
        // it the tree it was ending (thawed to die): the images are the pause.
        if self.cgroups.is_frozen(id) || record::process_being_killed(pid) {
            tracing::info!(sandbox = %id, "ending the processes an earlier daemon kept or was ending after their pause");
            self.kept.end_frozen(id, &pidfd, false);
            return;
        }
        tracing::warn!(sandbox = %id, "a resume was interrupted after its sandbox ran again: finishing it");
        if let Err(err) = fs::remove_file(dir.join(PAUSED_FILE)) {
            tracing::warn!(sandbox = %id, %err, "removing the paused marker of a resumed sandbox");
            return;
        }
        DurableMarker::remove(dir);
        if let Some(images) = marker.images {
            self.discard(&images, id, "images");
        }
        let work = dir.join("restore");
        if work.exists() {
            self.discard(&work, id, "restore");
        }
    }

    /// Stops sandbox `id` keeping only its disk: every process is killed, the disk
    /// unmounted; cgroups and uid slot are kept. [`LinuxRuntime::resume_paused`] starts a
    /// fresh init on the same disk.
    pub fn pause_filesystem(&self, id: &str) -> Result<(), RuntimeError> {
        let sandbox = self
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
        let _ = self.cgroups.set_frozen(id, false);
        kill_init(&sandbox.pidfd)?;
        self.end_processes(id, &sandbox.pidfd, sandbox.own_child)?;
        // Flush the disk before the marker says it is the sandbox's state.
        release_disk_flushed(self, &sandbox).map_err(io_err("sync sandbox disk"))?;
        let marker = PausedMarker {
            images: None,
            paused_at: SystemTime::now(),
            written_in_boot: None,
        };
        marker
            .write(&self.sandbox_dir(id))
            .map_err(io_err("write paused marker"))
    }

    /// Brings sandbox `id`, paused with memory, back under the same id: its processes
    /// continue where they were (the checkpoint is deleted once it runs) and
    /// [`crate::Runtime::connect`] reaches it again. On failure it stays paused.
    pub fn resume_paused(&self, criu: &Criu, id: &str) -> Result<SandboxInfo, RuntimeError> {
        let marker = self.paused(id)?;
        let dir = self.sandbox_dir(id);
        let Some(images) = marker.images.clone() else {
            return Err(RuntimeError::PausedWithoutMemory(id.to_owned()));
        };
        if let Some(tree) = self.kept.take(id) {
            // Killed behind our back (its groups removed, its init killed): the images
            // are the pause.
            let init_running =
                sys::pidfd_wait_exit(tree.pidfd.as_fd(), 0).is_ok_and(|exited| !exited);
            if init_running && self.cgroups.is_frozen(id) {
                return self.resume_kept(id, &dir, &images, tree);
            }
            tracing::warn!(sandbox = %id, "the processes kept for a quick resume are gone: restoring the images");
            self.kept.end_untaken(id, tree);
        }
        let mut record = Record::read(&dir).map_err(io_err("read record"))?;
        let spec = record.spec.clone();
        // Gone after a reboot; making them again is harmless otherwise. CRIU's restore
        // moves every task into them.
        let _warm = self.make_cgroups(&spec)?;
        let netns = self.netns_for_start(id)?.map(std::sync::Arc::new);
        Self::check_restore_netns(&images, netns.as_ref())?;
        self.ensure_init_binary()?;
        let uid_base = self.uid_base_of(record.slot);
        let disk_uid_base = self.disk_uid_base(&record);
        let disk = mount_kept_disk(&dir, disk_uid_base, uid_base).map_err(io_err("mount disk"))?;
        let root = HostRoot::mount(self, &dir, &spec, uid_base, disk)?;
        let work = dir.join("restore");
        crate::perms::create_dir_all(&work, crate::perms::PRIVATE_DIR)
            .map_err(io_err("create restore work dir"))?;
        let restored = criu.restore(&Restore {
            images: images.clone(),
            work: work.clone(),
            root: Some(dir.join("root")),
            cgroup_root: None,
            netns,
            external_mounts: [root.volume_externals(), self.view_restore_sources()].concat(),
            leave_stopped: false,
        });
        let pid = restored.map_err(criu_err(id, "restore"))?;
        super::checkpoint::thaw_restored(&self.cgroups, id);
        let disk = root.release();
        let pidfd = sys::pidfd_open(pid).map_err(io_err("open restored init"))?;
        // Not our child: CRIU detaches the restored tree. On failure its images are intact.
        self.record_resumed(id, &dir, &mut record, pid, &pidfd, false)?;
        DurableMarker::remove(&dir);
        // Unlinking a memory image takes milliseconds: the janitor does it after the answer.
        self.discard(&images, id, "images");
        self.discard(&work, id, "restore");
        let info = SandboxInfo {
            id: id.to_owned(),
            template: spec.template.clone(),
            init_pid: pid,
            created_at: record.created_at,
            spec,
        };
        let info = self.register(info, record.slot, pidfd, false, disk, disk_uid_base);
        self.complete_views(id, pid);
        Ok(info)
    }

    /// `resume_paused` of a sandbox whose processes were kept: they are thawed, then the
    /// marker goes (the record names their init already). A crash in between leaves the
    /// marker beside a running init, which the next start finishes as a resume. When the
    /// thaw fails the tree is ended and the sandbox stays paused, its images intact.
    fn resume_kept(
        &self,
        id: &str,
        dir: &Path,
        images: &Path,
        tree: KeptTree,
    ) -> Result<SandboxInfo, RuntimeError> {
        if let Err(err) = self.cgroups.set_frozen(id, false) {
            self.kept.end_untaken(id, tree);
            return Err(io_err("thaw the kept processes")(err));
        }
        if let Err(err) = fs::remove_file(dir.join(PAUSED_FILE)) {
            // Still paused on disk: it must not run. Its images are the pause.
            self.kept.end_untaken(id, tree);
            return Err(io_err("remove the paused marker")(err));
        }
        DurableMarker::remove(dir);
        self.discard(images, id, "images");
        Ok(self.register(
            tree.info,
            tree.slot,
            tree.pidfd,
            tree.own_child,
            tree.disk,
            tree.disk_uid_base,
        ))
    }

    /// True when sandbox `id` is paused (its disk and maybe a checkpoint kept, no process
    /// running).
    pub fn is_paused(&self, id: &str) -> bool {
        self.paused_marker(id).is_some()
    }

    /// Paused sandbox `id`'s CRIU images (None: paused without memory) and when it was
    /// paused; an error when it runs or does not exist.
    pub(super) fn paused_state(
        &self,
        id: &str,
    ) -> Result<(Option<PathBuf>, SystemTime), RuntimeError> {
        self.paused(id)
            .map(|marker| (marker.images, marker.paused_at))
    }

    /// True when sandbox `id` is paused with a checkpoint of its memory.
    pub fn paused_with_memory(&self, id: &str) -> bool {
        self.paused_marker(id)
            .is_some_and(|marker| marker.images.is_some())
    }

    /// Turns a pause with memory into one without: the checkpoint is deleted (after the
    /// marker stops naming it, so a crash never leaves a marker without its images).
    pub(super) fn drop_checkpoint(&self, id: &str) {
        // Kept processes are the memory being dropped.
        self.kept.end(id);
        let dir = self.sandbox_dir(id);
        let Some(PausedMarker {
            images: Some(images),
            paused_at,
            written_in_boot,
        }) = self.paused_marker(id)
        else {
            return;
        };
        // The kept disk becomes the whole state: on disk before the marker says so, when
        // the pause is not known to be durable yet.
        let vouched = written_in_boot.is_none()
            || DurableMarker::read(&dir).is_some_and(|durable| durable.paused_at == paused_at);
        let synced = if vouched {
            Ok(())
        } else {
            fs::File::open(&images).and_then(|images| sys::syncfs_mount(images.as_fd()))
        };
        if let Err(err) = &synced {
            tracing::warn!(sandbox = %id, %err, "syncing a pause before dropping its memory; the memory is kept");
        }
        let marker = PausedMarker {
            images: None,
            paused_at,
            written_in_boot: None,
        };
        if synced.is_ok() && marker.write(&dir).is_ok() {
            let _ = fs::remove_dir_all(images);
        }
    }

    /// Resumes a sandbox paused without memory: a new init on the kept disk.
    pub fn resume_paused_filesystem(&self, id: &str) -> Result<SandboxInfo, RuntimeError> {
        self.paused(id)?;
        let dir = self.sandbox_dir(id);
        let mut record = Record::read(&dir).map_err(io_err("read record"))?;
        let spec = record.spec.clone();
        let _warm = self.make_cgroups(&spec)?;
        let (pidfd, pid, disk) = self.start(
            &spec,
            record.slot,
            &dir,
            DiskOrigin::Remount {
                disk_uid_base: self.disk_uid_base(&record),
            },
        )?;
        self.record_resumed(id, &dir, &mut record, pid, &pidfd, true)?;
        let info = SandboxInfo {
            id: id.to_owned(),
            template: spec.template.clone(),
            init_pid: pid,
            created_at: record.created_at,
            spec,
        };
        let disk_uid_base = self.disk_uid_base(&record);
        Ok(self.register(info, record.slot, pidfd, true, Some(disk), disk_uid_base))
    }

    /// Makes the resume of sandbox `id` (in `dir`) its state on disk: the record names
    /// the new init `pid`, then `paused.json` goes. When either fails the sandbox is
    /// still paused on disk, so the new init is ended (reaped when `own_child`) and the
    /// two never disagree; a crash between the two steps is finished at the next start
    /// by [`LinuxRuntime::finish_interrupted_resume`].
    fn record_resumed(
        &self,
        id: &str,
        dir: &Path,
        record: &mut Record,
        pid: i32,
        pidfd: &OwnedFd,
        own_child: bool,
    ) -> Result<(), RuntimeError> {
        record.init_pid = Some(pid);
        record.init_start_ticks = record::process_start_ticks(pid);
        let written = record
            .write(dir)
            .and_then(|()| fs::remove_file(dir.join(PAUSED_FILE)));
        if let Err(e) = written {
            let _ = kill_init(pidfd).and_then(|()| self.end_processes(id, pidfd, own_child));
            return Err(io_err("write record")(e));
        }
        Ok(())
    }

    /// The marker of paused sandbox `id`: an error when it runs or does not exist.
    fn paused(&self, id: &str) -> Result<PausedMarker, RuntimeError> {
        if self
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(id)
        {
            return Err(RuntimeError::NotPaused(id.to_owned()));
        }
        self.paused_marker(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))
    }

    fn paused_marker(&self, id: &str) -> Option<PausedMarker> {
        if !valid_id(id) {
            return None;
        }
        PausedMarker::read(&self.sandbox_dir(id))
    }

    /// `kill` of a paused sandbox: its cgroups, directory (disk image) and checkpoint go,
    /// and its slot is freed.
    pub(super) fn kill_paused(&self, id: &str) -> Result<(), RuntimeError> {
        let marker = self
            .paused_marker(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
        self.kept.end(id);
        let dir = self.sandbox_dir(id);
        let slot = Record::read(&dir).ok().map(|r| r.slot);
        let result = self.teardown(id, None, None);
        if let Some(images) = marker.images.filter(|images| !images.starts_with(&dir)) {
            let _ = fs::remove_dir_all(images);
        }
        if let Some(slot) = slot {
            self.release_slot(slot, id);
        }
        result
    }

    /// For `recover`: the slot of the paused sandbox in `dir`, which must be kept (not
    /// cleaned as dead), or None if it is not paused.
    pub(super) fn paused_slot(dir: &Path) -> Option<u32> {
        PausedMarker::read(dir)?;
        Record::read(dir).ok().map(|r| r.slot)
    }
}

/// The sandbox's root rebuilt in the host's mount namespace for CRIU: an overlay of the
/// idmapped layers and the disk, made of descriptors as the launcher makes it (so the
/// restored sandbox's `mountinfo` names no host path either) and attached on the
/// sandbox directory's `root`, and its volumes (idmapped mounts, bound back into the
/// tree as CRIU external mounts: see [`LinuxRuntime::volume_mounts_dir`] for where).
/// Dropping it detaches them all.
pub(super) struct HostRoot {
    /// Attached mountpoints, in attach order.
    attached: Vec<CString>,
    disk: Option<OwnedFd>,
    /// (CRIU key, host path) of each volume mount.
    volumes: Vec<(String, PathBuf)>,
    /// The directory of the volume mountpoints, removed on drop.
    volume_dir: Option<PathBuf>,
}

impl HostRoot {
    /// Mounts the sandbox's root at `dir/root` on its layers and `disk`, the sandbox's
    /// disk mount (idmapped into the range at `uid_base` where its files are not).
    pub(super) fn mount(
        runtime: &LinuxRuntime,
        dir: &Path,
        spec: &crate::SandboxSpec,
        uid_base: u32,
        disk: OwnedFd,
    ) -> Result<Self, RuntimeError> {
        let layers = &spec.layers;
        let mut root = Self {
            attached: Vec::new(),
            disk: None,
            volumes: Vec::new(),
            volume_dir: None,
        };
        let userns = userns_with_map(&format!("0 {uid_base} {UID_RANGE_SIZE}\n"))
            .map_err(io_err("make id-mapping namespace"))?;
        if !spec.volumes.is_empty() {
            root.volume_dir = Some(runtime.volume_mounts_dir(&spec.id, uid_base)?);
        }
        for (i, volume) in spec.volumes.iter().enumerate() {
            let mountpoint = root
                .volume_dir
                .as_ref()
                .expect("made above")
                .join(i.to_string());
            crate::perms::create_dir(&mountpoint, crate::perms::PRIVATE_DIR)
                .map_err(io_err("create volume mountpoint"))?;
            let mount = runtime.volumes.mount_for(&volume.volume, userns.as_fd())?;
            root.attach(
                &mount,
                cpath(&mountpoint).map_err(io_err("volume mountpoint"))?,
            )?;
            root.volumes.push((volume_key(i), mountpoint));
        }
        let overlay = FsContext::open(c"overlay").map_err(io_err("fsopen overlay"))?;
        // Topmost layer first. The detached trees must stay open until the overlay is
        // created: closing the last descriptor of one dissolves it.
        let mut trees = Vec::with_capacity(layers.len());
        for layer in layers.iter().rev() {
            let path = cpath(layer).map_err(io_err("layer path"))?;
            let tree =
                sys::open_tree_clone(libc::AT_FDCWD, &path, libc::AT_RECURSIVE as libc::c_uint)
                    .map_err(io_err(format!("open_tree {}", layer.display())))?;
            sys::mount_setattr_idmap(tree.as_fd(), userns.as_fd())
                .map_err(io_err(format!("idmap {}", layer.display())))?;
            overlay
                .set_fd(c"lowerdir+", tree.as_fd())
                .map_err(io_err("overlay lowerdir+"))?;
            trees.push(tree);
        }
        for (key, sub) in [(c"upperdir", c"upper"), (c"workdir", c"work")] {
            let sub_dir = sys::open_dir_path(disk.as_fd(), sub)
                .map_err(io_err(format!("open the disk's {}", sub.to_string_lossy())))?;
            overlay
                .set_fd(key, sub_dir.as_fd())
                .map_err(io_err(format!("overlay {}", key.to_string_lossy())))?;
        }
        overlay
            .set_flag(c"userxattr")
            .map_err(io_err("overlay userxattr"))?;
        let mount = overlay
            .create_mount(MOUNT_ATTR_NODEV)
            .map_err(io_err("mount overlay"))?;
        drop(trees);
        let root_dir = dir.join("root");
        crate::perms::create_dir_all(&root_dir, crate::perms::PRIVATE_DIR)
            .map_err(io_err("create root mountpoint"))?;
        root.attach(&mount, cpath(&root_dir).map_err(io_err("root mountpoint"))?)?;
        root.disk = Some(disk);
        Ok(root)
    }

    fn attach(&mut self, mount: &OwnedFd, target: CString) -> Result<(), RuntimeError> {
        sys::move_mount_to(mount.as_fd(), &target)
            .map_err(io_err(format!("attach {}", target.to_string_lossy())))?;
        self.attached.push(target);
        Ok(())
    }

    /// The volume mounts as CRIU external mounts of a restore.
    pub(super) fn volume_externals(&self) -> Vec<(String, PathBuf)> {
        self.volumes.clone()
    }

    /// Detaches the host mounts and returns the daemon's reference to the disk mount.
    pub(super) fn release(mut self) -> Option<OwnedFd> {
        self.disk.take()
    }
}

impl Drop for HostRoot {
    fn drop(&mut self) {
        for target in self.attached.iter().rev() {
            // SAFETY: umount2 with a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        if let Some(dir) = self.volume_dir.take() {
            for (_, mountpoint) in &self.volumes {
                let _ = fs::remove_dir(mountpoint);
            }
            let _ = fs::remove_dir(dir);
        }
    }
}

/// Drops the daemon's last reference to `sandbox`'s disk mount, flushed first: a child
/// forked meanwhile may hold a copy of the descriptor for a moment, and then the ext4
/// shutdown (and its write-back) happens after this returns, not here.
fn release_disk_flushed(runtime: &LinuxRuntime, sandbox: &super::Sandbox) -> io::Result<()> {
    let disk = runtime.take_disk(sandbox);
    disk.as_ref()
        .map_or(Ok(()), |disk| sys::syncfs_mount(disk.as_fd()))
}

/// Mounts `dir/disk.img` again (see [`disk::mount_image_again`]) as sandbox `dir`'s disk
/// for a start or restore in the range at `uid_base`; its files are owned in the range
/// at `disk_uid_base` (see [`idmap_disk`]).
pub(super) fn mount_kept_disk(
    dir: &Path,
    disk_uid_base: u32,
    uid_base: u32,
) -> io::Result<OwnedFd> {
    let disk = disk::mount_image_again(&dir.join("disk.img"))?;
    idmap_disk(&disk, disk_uid_base, uid_base)?;
    Ok(disk)
}

/// Makes the detached disk mount `disk` show the files owned by an id in
/// `[disk_uid_base, +65536)` as owned by the same offset from `uid_base`, and store what
/// is written through it back in the disk's range. A fork's disk copy keeps its
/// source's owners this way instead of being re-owned file by file (which cost time in
/// proportion to the files the source wrote). Nothing to do when the ranges are the same.
///
/// Host root keeps its own id through the mount: an overlay mounted on the host for a
/// restore does its upper-layer bookkeeping (`work/`, copy-up temporaries) as the
/// mounter, and without a mapping for it the overlay would come up read-only. Files the
/// disk holds as host root appear as they did without the idmap.
pub(super) fn idmap_disk(disk: &OwnedFd, disk_uid_base: u32, uid_base: u32) -> io::Result<()> {
    if disk_uid_base == uid_base {
        return Ok(());
    }
    let map = format!("{disk_uid_base} {uid_base} {UID_RANGE_SIZE}\n0 0 1\n");
    let userns = userns_with_map(&map)?;
    sys::mount_setattr_idmap(disk.as_fd(), userns.as_fd())
}

/// A user namespace whose uid and gid maps are `map` (`/proc/<pid>/uid_map` lines), for
/// idmapping mounts: made by a short-lived child (a multi-threaded process cannot
/// unshare a user namespace), which is killed once the namespace is open.
fn userns_with_map(map: &str) -> io::Result<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: (libc::CLONE_NEWUSER | libc::CLONE_PIDFD) as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    // SAFETY: fork-like clone3 (no stack given); the child only makes raw syscalls.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        // The child of a multi-threaded process: only raw syscalls until it is killed.
        loop {
            // SAFETY: pause(2) has no arguments.
            unsafe { libc::syscall(libc::SYS_pause) };
        }
    }
    let pid = sys::check(ret)?;
    // SAFETY: CLONE_PIDFD stored a new fd owned by us.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let userns = fs::write(format!("/proc/{pid}/uid_map"), map)
        .and_then(|()| fs::write(format!("/proc/{pid}/gid_map"), map))
        .and_then(|()| fs::File::open(format!("/proc/{pid}/ns/user")))
        .map(OwnedFd::from);
    // Ended and reaped whatever happened above: it holds a copy of every descriptor of
    // the daemon, other sandboxes' disk mounts among them.
    let killed = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
    let reaped =
        sys::pidfd_wait_exit(pidfd.as_fd(), 10_000).and_then(|_| sys::pidfd_reap(pidfd.as_fd()));
    killed.and(reaped)?;
    userns
}
