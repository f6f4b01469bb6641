//! Snapshots and fork: a running sandbox checkpointed with its disk while it keeps
//! running, and new sandboxes restored from such a checkpoint.
//!
//! **Checkpoint** (`LinuxRuntime::checkpoint`) runs `criu dump --leave-running` on the
//! sandbox's init tree. The disk must match the memory images exactly (an open file's
//! offset, a write the process believes done), so it is copied while CRIU still holds
//! every task stopped: CRIU's action script runs at `post-dump` after the images are
//! written and before the tasks are resumed. The script syncs the sandbox's filesystem
//! (`sync -f /proc/<init>/root/`: syncfs on the overlay root syncs its upper layer, the
//! sandbox's ext4 disk, down through the loop device into `disk.img`) and copies
//! `disk.img` sparsely. It is a small shell script file rather than a `berth-launch`
//! subcommand because CRIU execs the script path without arguments, and the launcher
//! may be the daemon's own executable recognised by its `argv[0]` (see
//! `launch::run_if_launcher`), which CRIU cannot set; `sync` and `cp` are coreutils, on
//! every host. A failing script fails the dump and the sandbox keeps running.
//!
//! The checkpoint is built in `<dest>.tmp` and renamed to `dest` once complete and on
//! disk, so a crash leaves a complete checkpoint or none (plus a stale `.tmp` the next
//! checkpoint to the same `dest` removes):
//!
//! ```text
//! dest/checkpoint.json   what was checkpointed (spec, uid base, size)
//! dest/disk.img          the sandbox's disk, sparse
//! dest/images/           CRIU images (plus CRIU's dump.log)
//! ```
//!
//! **Restore** (`LinuxRuntime::restore_checkpoint`) makes a new sandbox: new slot (uid
//! range), cgroups, directory and record, like `create`, and then brings the checkpoint's
//! processes back in it. The checkpoint is only read, so any number of restores may run
//! from it at once:
//!
//! - *User ids.* The CRIU images hold the source's uid/gid maps (host ids); a per-restore
//!   images directory gets rewritten copies pointing at the new slot's range, and hard
//!   links to every other image (copies if the checkpoint is on another filesystem than
//!   the state dir) (`berth_checkpoint::images`; all other ids in the images are
//!   namespace-relative). The disk's files are owned by host ids of the source's disk
//!   range (`checkpoint.json`'s `uid_base`) and the copy keeps them: its mount is
//!   idmapped from that range into the new one (`pause::idmap_disk`), so nothing is
//!   re-owned and a fork costs the same however many files the source wrote. The
//!   sandbox's record keeps that range (`disk_uid_base`) for its later pauses, resumes
//!   and checkpoints, so a fork of a fork maps from the first source's range.
//! - *Hostname.* The uts namespace image gets the new id as nodename.
//! - *Cgroups.* CRIU's `--cgroup-root` per berth-managed controller puts the tree (and
//!   its cgroup namespace root) in the new sandbox's groups, created with the new spec's
//!   limits beforehand; other hierarchies keep the dumped paths, as at create.
//! - *Root and mounts.* The root is rebuilt on the host under the new sandbox's
//!   directory exactly as resume does (`HostRoot`); the other external mounts (device
//!   binds, the init binary) are keyed by host paths, not by the sandbox directory.
//! - *Network.* Without networking the sandbox's namespace (loopback only) is part of
//!   the dump. With it CRIU runs inside the namespace, which leaves it out of the dump,
//!   and each restore joins a new one of its own with a new address, under the source's
//!   policy (kept in `checkpoint.json`); TCP connections are closed (`--tcp-close`).
//!
//! On failure everything of the new sandbox goes (processes, cgroups, slot, directory).
//!
//! **Moving** a checkpoint to another machine (a node starting a snapshot another node
//! made): `Runtime::pack_checkpoint` gives its metadata, its tree hash and a tar stream
//! of the directory; `Runtime::import_checkpoint` unpacks that into `<id>.tmp`, refuses
//! it unless the tree hash matches, puts the receiving machine's paths of the same layers
//! in its metadata and renames it into place. Nothing else in a checkpoint names the
//! machine: the init binary's bind is an external mount CRIU finds again by its place in
//! the sandbox (a test restores on a daemon whose envd lives under another state dir),
//! and the network, uid range and cgroups are the restoring sandbox's own.

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use std::time::SystemTime;

use berth_checkpoint::{prepare_restore_images, Criu, Dump, ImageRewrite, Restore};

use super::pause::{self, HostRoot};
use super::{dump_externals, io_err, valid_id, DiskOrigin, LinuxRuntime, Sandbox};
use crate::disk;
use crate::perms;
use crate::restorable;
use crate::sys;
use crate::{RuntimeError, SandboxInfo, SandboxSpec};

const META_FILE: &str = "checkpoint.json";
const DISK_FILE: &str = "disk.img";
const IMAGES_DIR: &str = "images";
const HOOK_FILE: &str = "post-dump-hook";
/// Bumped when the layout of a checkpoint changes incompatibly.
const FORMAT: u32 = 1;

/// A checkpoint on its way to another machine: read `stream` to its end for the files;
/// the receiver checks them against `tree_hash`.
pub struct PackedCheckpoint {
    pub info: CheckpointInfo,
    pub tree_hash: String,
    pub stream: berth_template::archive::Packed,
}

/// Whether a checkpoint must survive a host crash once it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Synced before it is renamed into place: a snapshot's, which outlives the call.
    Durable,
    /// Left to the page cache: a fork's, deleted when the fork is done (and by the next
    /// start if a crash came first, as no snapshot owns it). It saves a sync of the
    /// whole memory image and disk copy, which a crash would make useless anyway.
    Transient,
}

/// What a checkpoint holds, as recorded in its `checkpoint.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CheckpointInfo {
    /// The sandbox that was checkpointed.
    pub source: String,
    pub template: String,
    /// Template layers the checkpointed processes run on; restores use the same.
    pub layers: Vec<PathBuf>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub created_at: SystemTime,
    /// Bytes the checkpoint takes on disk (allocated blocks; `disk.img` is sparse).
    pub size_bytes: u64,
    /// The source's network policy (None when it had no network): sandboxes restored
    /// from the checkpoint start under it, each with an address of its own.
    #[serde(default)]
    pub network: Option<berth_net::NetworkPolicy>,
    /// The source's volume mounts: external to the checkpoint, so sandboxes restored from
    /// it mount the same volumes (not copies) at the same paths.
    #[serde(default)]
    pub volumes: Vec<crate::VolumeMount>,
}

impl CheckpointInfo {
    /// The spec of sandbox `id` restored from this checkpoint: its template, layers,
    /// limits and volume mounts.
    pub fn spec_for(&self, id: &str) -> SandboxSpec {
        SandboxSpec {
            id: id.to_owned(),
            template: self.template.clone(),
            layers: self.layers.clone(),
            cpu_count: self.cpu_count,
            memory_mb: self.memory_mb,
            disk_size_mb: self.disk_size_mb,
            volumes: self.volumes.clone(),
        }
    }
}

/// `checkpoint.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Metadata {
    format: u32,
    #[serde(flatten)]
    info: CheckpointInfo,
    /// First host id of the range owning `disk.img`'s files: the source's own range, or,
    /// when the source was itself restored from a checkpoint (a fork of a fork), the
    /// range of the first sandbox that wrote that disk. A restore idmaps it into its own.
    uid_base: u32,
}

impl Metadata {
    /// Sets the checkpoint's size from what `tmp` holds (the metadata file, a few
    /// hundred bytes, counted as one block up front).
    fn measure(&mut self, tmp: &Path) -> Result<(), RuntimeError> {
        self.info.size_bytes = allocated_bytes(tmp).map_err(io_err("measure checkpoint"))? + 4096;
        Ok(())
    }

    /// Writes this metadata into the checkpoint being built in `tmp`, makes all of it
    /// durable and renames it to `dest`: a crash leaves the whole checkpoint or only
    /// the `.tmp` the next build there removes. A transient checkpoint is renamed
    /// without the syncs.
    fn publish(&self, tmp: &Path, dest: &Path, durability: Durability) -> Result<(), RuntimeError> {
        perms::write_private(
            &tmp.join(META_FILE),
            &serde_json::to_vec_pretty(self)
                .map_err(io::Error::other)
                .map_err(io_err("encode metadata"))?,
        )
        .map_err(io_err("write metadata"))?;
        if durability == Durability::Transient {
            return fs::rename(tmp, dest).map_err(io_err(format!("rename to {}", dest.display())));
        }
        // One syncfs instead of an fsync per file: a dump has dozens of images and each
        // fsync is a journal commit (~16 ms here); syncfs commits once for all of them.
        let dir = File::open(tmp).map_err(io_err("open checkpoint dir"))?;
        syncfs(&dir).map_err(io_err("sync checkpoint"))?;
        fs::rename(tmp, dest).map_err(io_err(format!("rename to {}", dest.display())))?;
        let parent = dest.parent().unwrap_or(Path::new("."));
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io_err("sync checkpoint parent dir"))
    }

    fn read(checkpoint: &Path) -> Result<Self, RuntimeError> {
        let path = checkpoint.join(META_FILE);
        let bytes = fs::read(&path).map_err(io_err(format!("read {}", path.display())))?;
        let meta: Self =
            serde_json::from_slice(&bytes).map_err(|source| RuntimeError::BadCheckpoint {
                path: path.clone(),
                source,
            })?;
        if meta.format != FORMAT {
            return Err(RuntimeError::CheckpointFormat {
                path,
                found: meta.format,
                supported: FORMAT,
            });
        }
        Ok(meta)
    }
}

impl LinuxRuntime {
    /// Checkpoints running sandbox `id` into the new directory `dest` (its parent must
    /// exist; `dest` must not) while the sandbox keeps running: its processes' memory and
    /// a copy of its disk taken at the same instant. The checkpoint is self-contained and
    /// read-only afterwards; [`LinuxRuntime::restore_checkpoint`] makes sandboxes from it.
    /// A frozen sandbox is thawed (CRIU cannot seize frozen tasks). Only one checkpoint
    /// into a given `dest` may run at a time.
    pub fn checkpoint_into(
        &self,
        criu: &Criu,
        id: &str,
        dest: &Path,
        durability: Durability,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let sandbox = self.get(id)?;
        if dest.exists() {
            return Err(RuntimeError::CheckpointExists(dest.display().to_string()));
        }
        let tmp = tmp_path(dest);
        if tmp.exists() {
            // A crashed earlier checkpoint into the same place.
            fs::remove_dir_all(&tmp).map_err(io_err(format!("remove {}", tmp.display())))?;
        }
        let result = self.build_checkpoint(criu, &sandbox, &tmp, dest, durability);
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        result
    }

    fn build_checkpoint(
        &self,
        criu: &Criu,
        sandbox: &Sandbox,
        tmp: &Path,
        dest: &Path,
        durability: Durability,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let id = sandbox.info.id.as_str();
        let images = tmp.join(IMAGES_DIR);
        perms::create_dir(tmp, perms::PRIVATE_DIR)
            .and_then(|()| perms::create_dir(&images, perms::IMAGES_DIR))
            .map_err(io_err(format!("create {}", images.display())))?;
        let hook = tmp.join(HOOK_FILE);
        let report = tmp.join(restorable::REFUSAL_FILE);
        restorable::write_post_dump_hook(
            &hook,
            &self.config.launcher_binary,
            &images,
            &report,
            Some((&self.sandbox_dir(id).join(DISK_FILE), &tmp.join(DISK_FILE))),
        )
        .map_err(io_err("write post-dump hook"))?;
        let _ = self.cgroups.set_frozen(id, false);
        let created_at = SystemTime::now();
        criu.dump_with_action_script(
            &Dump {
                pid: sandbox.info.init_pid,
                images,
                leave_running: true,
                own_mount_namespace: true,
                netns: self.sandbox_netns(id)?,
                external_mounts: dump_externals(&sandbox.info),
                freeze_cgroup: None,
            },
            &hook,
        )
        .map_err(|source| {
            restorable::refusal(id, &report).unwrap_or_else(|| RuntimeError::Criu {
                id: id.to_owned(),
                op: "dump",
                source: Box::new(source),
            })
        })?;
        fs::remove_file(&hook).map_err(io_err("remove post-dump hook"))?;
        let spec = &sandbox.info.spec;
        let mut meta = Metadata {
            format: FORMAT,
            info: CheckpointInfo {
                source: id.to_owned(),
                template: spec.template.clone(),
                layers: spec.layers.clone(),
                cpu_count: spec.cpu_count,
                memory_mb: spec.memory_mb,
                disk_size_mb: spec.disk_size_mb,
                created_at,
                size_bytes: 0,
                network: self.network_policy(id),
                volumes: spec.volumes.clone(),
            },
            uid_base: sandbox.disk_uid_base,
        };
        meta.measure(tmp)?;
        meta.publish(tmp, dest, durability)?;
        Ok(meta.info)
    }

    /// Creates sandbox `spec.id` from the checkpoint at `checkpoint`: a new sandbox (own
    /// uid range, cgroups, disk copy, directory and record; `kill`, `list`, `recover`
    /// treat it like any other) whose processes continue from the checkpoint's memory
    /// and whose hostname is its id. `spec.layers`, `spec.template` and
    /// `spec.disk_size_mb` must be the checkpoint's (see [`LinuxRuntime::read_checkpoint`]);
    /// `cpu_count` and `memory_mb` are the new sandbox's limits. The checkpoint is only
    /// read: restores from one checkpoint may run concurrently. On failure nothing of the
    /// new sandbox is left.
    pub fn restore_checkpoint(
        &self,
        criu: &Criu,
        checkpoint: &Path,
        spec: &SandboxSpec,
    ) -> Result<SandboxInfo, RuntimeError> {
        self.restore_checkpoint_as(Revival::Memory(criu), checkpoint, spec)
    }

    /// Proves the checkpoint at `checkpoint` restores: a trial restore of it, as sandbox
    /// `trial_id`, with every task left stopped (nothing of it runs, so nothing it would
    /// do happens twice), removed again at once. The error is the restore's.
    pub fn verify_checkpoint_at(
        &self,
        criu: &Criu,
        checkpoint: &Path,
        trial_id: &str,
    ) -> Result<(), RuntimeError> {
        let spec = Metadata::read(checkpoint)?.info.spec_for(trial_id);
        self.restore_checkpoint_as(Revival::Trial(criu), checkpoint, &spec)?;
        crate::Runtime::kill(self, trial_id)
    }

    /// Like [`LinuxRuntime::restore_checkpoint`], but only the checkpoint's disk is used:
    /// a fresh init boots on a copy of it (a filesystem-only snapshot).
    pub fn restore_checkpoint_filesystem(
        &self,
        checkpoint: &Path,
        spec: &SandboxSpec,
    ) -> Result<SandboxInfo, RuntimeError> {
        self.restore_checkpoint_as(Revival::Disk, checkpoint, spec)
    }

    /// The restore, of the memory or of the disk alone, as `how` says.
    fn restore_checkpoint_as(
        &self,
        how: Revival<'_>,
        checkpoint: &Path,
        spec: &SandboxSpec,
    ) -> Result<SandboxInfo, RuntimeError> {
        if !valid_id(&spec.id) {
            return Err(RuntimeError::InvalidId(spec.id.clone()));
        }
        let meta = Metadata::read(checkpoint)?;
        let source = &meta.info;
        for (differs, what) in [
            (spec.layers != source.layers, "layers"),
            (spec.volumes != source.volumes, "volume mounts"),
            (spec.template != source.template, "template"),
            (spec.disk_size_mb != source.disk_size_mb, "disk size"),
        ] {
            if differs {
                return Err(RuntimeError::CheckpointMismatch {
                    id: spec.id.clone(),
                    what,
                });
            }
        }
        // CRIU detaches the restored tree: tracked by pidfd, never reaped by us. A fresh
        // boot's init is our child.
        let own_child = matches!(how, Revival::Disk);
        let info = self.bring_up(spec, own_child, Some(meta.uid_base), |slot, dir| {
            let _warm = self.make_cgroups(spec)?;
            self.attach_network(&spec.id, meta.info.network.as_ref())?;
            self.restore_into(how, checkpoint, &meta, spec, slot, dir)
        })?;
        if let Revival::Memory(_) = how {
            self.complete_views(&info.id, info.init_pid);
        }
        Ok(info)
    }

    /// Paused sandbox `id` as new checkpoint `dest`, to move it to another machine
    /// (a drained node's paused sandboxes): its CRIU images, if memory was kept (a
    /// pause's dump has a checkpoint's shape: own mount namespace, network namespace
    /// outside), and its disk, hard-linked (the sandbox stays paused and untouched while
    /// they travel), with the metadata a restore needs. Built in `<dest>.tmp` and
    /// renamed when whole.
    pub(crate) fn export_paused_into(
        &self,
        id: &str,
        dest: &Path,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let (images, paused_at) = self.paused_state(id)?;
        // It is leaving this host: processes kept for a quick resume here go (a restore
        // of the export on this host, into the same groups, would freeze with them).
        self.kept.end(id);
        if dest.exists() {
            return Err(RuntimeError::CheckpointExists(dest.display().to_string()));
        }
        let dir = self.sandbox_dir(id);
        let record = crate::record::Record::read(&dir).map_err(io_err("read record"))?;
        let tmp = tmp_path(dest);
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_err(format!("remove {}", tmp.display())))?;
        }
        let result = (|| {
            perms::create_dir(&tmp, perms::PRIVATE_DIR)
                .map_err(io_err(format!("create {}", tmp.display())))?;
            fs::hard_link(dir.join(DISK_FILE), tmp.join(DISK_FILE))
                .map_err(io_err("link the paused disk"))?;
            if let Some(images) = &images {
                let into = tmp.join(IMAGES_DIR);
                perms::create_dir(&into, perms::IMAGES_DIR)
                    .map_err(io_err(format!("create {}", into.display())))?;
                for entry in fs::read_dir(images).map_err(io_err("list pause images"))? {
                    let entry = entry.map_err(io_err("list pause images"))?;
                    fs::hard_link(entry.path(), into.join(entry.file_name()))
                        .map_err(io_err("link a pause image"))?;
                }
            }
            let spec = &record.spec;
            let mut meta = Metadata {
                format: FORMAT,
                info: CheckpointInfo {
                    source: id.to_owned(),
                    template: spec.template.clone(),
                    layers: spec.layers.clone(),
                    cpu_count: spec.cpu_count,
                    memory_mb: spec.memory_mb,
                    disk_size_mb: spec.disk_size_mb,
                    created_at: paused_at,
                    size_bytes: 0,
                    network: self.network_policy(id),
                    volumes: spec.volumes.clone(),
                },
                uid_base: self.disk_uid_base(&record),
            };
            meta.measure(&tmp)?;
            meta.publish(&tmp, dest, Durability::Durable)?;
            Ok(meta.info)
        })();
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        result
    }

    /// Checkpoint `checkpoint_id` packed for another machine: what it holds, its tree
    /// hash (the receiver checks it) and its files as a tar stream.
    pub(crate) fn pack_checkpoint_at(checkpoint: &Path) -> Result<PackedCheckpoint, RuntimeError> {
        let info = Metadata::read(checkpoint)?.info;
        let transfer = |source: berth_template::TemplateError| RuntimeError::Transfer {
            what: format!("packing checkpoint {}", checkpoint.display()),
            source: Box::new(source),
        };
        let tree_hash = berth_template::archive::tree_hash(checkpoint).map_err(transfer)?;
        let stream = berth_template::archive::pack(checkpoint).map_err(transfer)?;
        Ok(PackedCheckpoint {
            info,
            tree_hash,
            stream,
        })
    }

    /// Puts a checkpoint packed by another machine ([`PackedCheckpoint`]) at
    /// `checkpoint`, once it arrived exactly as sent, with `layers` (this machine's
    /// paths of the same layers, lowest first) in place of the sender's. Built in
    /// `<checkpoint>.tmp` and renamed when whole, like a checkpoint made here.
    pub(crate) fn import_checkpoint_at(
        checkpoint: &Path,
        tree_hash: &str,
        layers: Vec<PathBuf>,
        from: &mut dyn io::Read,
    ) -> Result<CheckpointInfo, RuntimeError> {
        if checkpoint.exists() {
            return Err(RuntimeError::CheckpointExists(
                checkpoint.display().to_string(),
            ));
        }
        let tmp = tmp_path(checkpoint);
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_err(format!("remove {}", tmp.display())))?;
        }
        let transfer = |source: berth_template::TemplateError| RuntimeError::Transfer {
            what: format!("receiving checkpoint {}", checkpoint.display()),
            source: Box::new(source),
        };
        let result = (|| {
            perms::create_dir(&tmp, perms::PRIVATE_DIR)
                .map_err(io_err(format!("create {}", tmp.display())))?;
            berth_template::archive::unpack(from, &tmp).map_err(transfer)?;
            berth_template::archive::verify(&tmp, tree_hash).map_err(transfer)?;
            let mut meta = Metadata::read(&tmp)?;
            if meta.info.layers.len() != layers.len() {
                return Err(RuntimeError::CheckpointMismatch {
                    id: meta.info.source.clone(),
                    what: "the number of layers given for it",
                });
            }
            meta.info.layers = layers;
            meta.publish(&tmp, checkpoint, Durability::Durable)?;
            Ok(meta.info)
        })();
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        result
    }

    /// What the checkpoint at `checkpoint` holds (its `checkpoint.json`).
    pub fn read_checkpoint(checkpoint: &Path) -> Result<CheckpointInfo, RuntimeError> {
        Metadata::read(checkpoint).map(|m| m.info)
    }

    /// The restore proper, into the prepared directory `dir` of slot `slot`: cgroups, disk
    /// copy, images, root, CRIU. Returns the init's pidfd and pid and the disk mount.
    fn restore_into(
        &self,
        how: Revival<'_>,
        checkpoint: &Path,
        meta: &Metadata,
        spec: &SandboxSpec,
        slot: u32,
        dir: &Path,
    ) -> Result<(OwnedFd, i32, Option<OwnedFd>), RuntimeError> {
        let uid_base = self.uid_base_of(slot);
        let image = dir.join(DISK_FILE);
        disk::copy_sparse(&checkpoint.join(DISK_FILE), &image).map_err(io_err("copy disk"))?;
        // The copy keeps the source's owners; this mount shows them in the sandbox's range.
        let disk = disk::mount_image(&image).map_err(io_err("mount disk copy"))?;
        pause::idmap_disk(&disk, meta.uid_base, uid_base)
            .map_err(io_err("idmap the disk copy into the sandbox's uid range"))?;
        let (criu, trial) = match how {
            Revival::Memory(criu) => (criu, false),
            Revival::Trial(criu) => (criu, true),
            Revival::Disk => {
                let (pidfd, pid, disk) = self.start(spec, slot, dir, DiskOrigin::Kept(disk))?;
                return Ok((pidfd, pid, Some(disk)));
            }
        };
        let images = dir.join("restore-images");
        prepare_restore_images(
            &checkpoint.join(IMAGES_DIR),
            &images,
            &ImageRewrite {
                lower_ids: uid_base,
                hostname: spec.id.clone(),
            },
        )
        .map_err(|source| RuntimeError::Images {
            id: spec.id.clone(),
            source: Box::new(source),
        })?;
        perms::images_dir(&images).map_err(io_err("open the restore images to CRIU's tasks"))?;
        // Its own new namespace and address (attached by the caller), joined by CRIU.
        let netns = self.netns_for_start(&spec.id)?.map(std::sync::Arc::new);
        Self::check_restore_netns(&images, netns.as_ref())?;
        self.ensure_init_binary()?;
        let root = HostRoot::mount(self, dir, spec, uid_base, disk)?;
        let work = dir.join("restore");
        perms::create_dir(&work, perms::PRIVATE_DIR).map_err(io_err("create restore work dir"))?;
        let roots = self.cgroups.criu_roots(&spec.id);
        let per_controller: Vec<(&str, &str)> = roots
            .iter()
            .filter_map(|(c, r)| c.map(|c| (c, r.as_str())))
            .collect();
        let global = roots
            .iter()
            .find(|(c, _)| c.is_none())
            .map(|(_, r)| r.clone());
        let pid = criu
            .restore_with_cgroup_roots(
                &Restore {
                    images: images.clone(),
                    work: work.clone(),
                    root: Some(dir.join("root")),
                    cgroup_root: global,
                    netns,
                    external_mounts: [root.volume_externals(), self.view_restore_sources()]
                        .concat(),
                    leave_stopped: trial,
                },
                &per_controller,
            )
            .map_err(|source| RuntimeError::Criu {
                id: spec.id.clone(),
                op: "restore",
                source: Box::new(source),
            })?;
        let disk = root.release();
        if !trial {
            thaw_restored(&self.cgroups, &spec.id);
        }
        let pidfd = sys::pidfd_open(pid).map_err(io_err("open restored init"))?;
        self.discard(&images, &spec.id, "restore-images");
        self.discard(&work, &spec.id, "restore");
        Ok((pidfd, pid, disk))
    }
}

/// Makes sure restored sandbox `id` runs: the images of a pause that kept its tree
/// record its group as frozen (CRIU's `freezer.state` with `--freeze-cgroup`), which a
/// restore could apply to its groups; no restored sandbox is meant to stay frozen.
pub(super) fn thaw_restored(cgroups: &crate::cgroup::Cgroups, id: &str) {
    if cgroups.is_frozen(id) {
        if let Err(err) = cgroups.set_frozen(id, false) {
            tracing::warn!(sandbox = %id, %err, "thawing a restored sandbox");
        }
    }
}

/// How a checkpoint comes back as a sandbox.
#[derive(Clone, Copy)]
enum Revival<'a> {
    /// Its processes continue from its memory.
    Memory(&'a Criu),
    /// From its memory with every task left stopped: a trial that runs nothing.
    Trial(&'a Criu),
    /// A fresh init boots on a copy of its disk.
    Disk,
}

/// Flushes the whole filesystem holding `file`.
fn syncfs(file: &File) -> io::Result<()> {
    // SAFETY: syncfs on an open fd we own.
    sys::check(unsafe { libc::syncfs(file.as_raw_fd()) }.into())?;
    Ok(())
}

fn tmp_path(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Bytes allocated to the files under `dir`.
fn allocated_bytes(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += meta.blocks() * 512;
        if meta.is_dir() {
            total += allocated_bytes(&entry.path())?;
        }
    }
    Ok(total)
}
