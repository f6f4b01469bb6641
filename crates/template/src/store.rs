//! The on-disk store of layers and template manifests.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::base::{BaseRecipe, BASE_TEMPLATE_ID};
use crate::error::{IoContext, TemplateError};
use crate::layer::{disk_usage, LayerId, StagedLayer};
use crate::lock::FileLock;
use crate::manifest::{write_atomically, TemplateConfig, TemplateManifest};
use crate::BuildProgress;

/// Where berth keeps its state unless told otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/berth";

/// A template resolved against the store: everything a runtime needs to make a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub id: String,
    /// Absolute paths of the layers' rootfs directories, lowest first. Read-only: the
    /// runtime mounts them as overlay lower dirs and never writes into them.
    pub layers: Vec<PathBuf>,
    /// The same layers by id, lowest first.
    pub layer_ids: Vec<LayerId>,
    pub default_user: String,
    pub default_workdir: String,
    pub envs: BTreeMap<String, String>,
    /// Started in the background in each sandbox (E2B `startCmd`).
    pub start_cmd: Option<String>,
    /// Succeeds once the start command is ready (E2B `readyCmd`).
    pub ready_cmd: Option<String>,
    /// Memory checkpoint taken when the start command was ready: sandboxes of this
    /// template are restored from it (`Runtime::restore`) instead of booting.
    pub checkpoint: Option<String>,
    /// Seconds since the Unix epoch when the template was last written.
    pub created_at: u64,
}

impl Template {
    /// Which build of the template this is: [`layers_version`] of its layers.
    pub fn version(&self) -> String {
        layers_version(&self.layer_ids)
    }

    /// A name for exactly this build, `<id>@<version>`, that [`TemplateStore::get`]
    /// resolves even after the template is rebuilt (see [`TemplateStore::put`]).
    pub fn pinned_reference(&self) -> String {
        pinned_reference(&self.id, &self.version())
    }

    /// The template's config, e.g. to start a derived template from it.
    pub fn config(&self) -> TemplateConfig {
        TemplateConfig {
            default_user: self.default_user.clone(),
            default_workdir: self.default_workdir.clone(),
            envs: self.envs.clone(),
            start_cmd: self.start_cmd.clone(),
            ready_cmd: self.ready_cmd.clone(),
            checkpoint: self.checkpoint.clone(),
        }
    }
}

/// The version of a template made of `layers` (lowest first): a UUID drawn from their
/// sha256, so two builds with the same layers have the same version.
pub fn layers_version(layers: &[LayerId]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for id in layers {
        hasher.update(id.as_str().as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// `<id>@<version>`: one build of template `id`.
pub fn pinned_reference(id: &str, version: &str) -> String {
    format!("{id}@{version}")
}

/// What `layers/<id>/layer.json` records about how a layer was made.
#[derive(Debug, Serialize)]
struct LayerRecord<'a> {
    id: &'a LayerId,
    source: &'a str,
    created_at: u64,
}

/// Handle on `<state_dir>/templates`. Cheap to clone; every method goes to disk, so
/// several processes can share one store.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    root: PathBuf,
}

impl TemplateStore {
    /// Open (creating if needed) the store under `state_dir`, and remove staging
    /// leftovers of builders that died.
    pub fn open(state_dir: impl AsRef<Path>) -> Result<TemplateStore, TemplateError> {
        let store = TemplateStore {
            root: state_dir.as_ref().join("templates"),
        };
        // Root's alone: sandboxes never walk the store, they get idmapped clones of
        // layers the daemon opened.
        for dir in ["layers", "manifests", "superseded", "staging", "locks"] {
            let path = store.root.join(dir);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .ctx("create", &path)?;
        }
        store.remove_dead_staging()?;
        Ok(store)
    }

    /// `<state_dir>/templates`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The rootfs directory of layer `id` (whether or not it exists).
    pub fn layer_rootfs(&self, id: &LayerId) -> PathBuf {
        self.layer_dir(id).join("rootfs")
    }

    /// The id of the layer whose rootfs is `path` ([`TemplateStore::layer_rootfs`]
    /// backwards), if `path` is one of this store's.
    pub fn layer_id_of(&self, path: &Path) -> Option<LayerId> {
        let relative = path.strip_prefix(self.root.join("layers")).ok()?;
        let mut parts = relative.components();
        let id = parts.next()?.as_os_str().to_str()?.to_owned();
        match (parts.next()?.as_os_str().to_str()?, parts.next()) {
            ("rootfs", None) => LayerId::try_from(id).ok(),
            _ => None,
        }
    }

    pub fn has_layer(&self, id: &LayerId) -> bool {
        self.layer_dir(id).is_dir()
    }

    /// Look a template up and resolve its layers to paths. `reference` is a template
    /// id (its current build) or a pinned reference `<id>@<version>` (that build, also
    /// after the template was rebuilt).
    pub fn get(&self, reference: &str) -> Result<Template, TemplateError> {
        let (id, version) = match reference.split_once('@') {
            Some((id, version)) => (id, Some(version)),
            None => (reference, None),
        };
        validate_template_id(id)?;
        let not_found = || TemplateError::NotFound(reference.to_string());
        let current = self.manifest_path(id);
        let Some(version) = version else {
            if !current.exists() {
                return Err(not_found());
            }
            return self.resolve(TemplateManifest::read(&current)?);
        };
        validate_version(reference, version)?;
        if current.exists() {
            let manifest = TemplateManifest::read(&current)?;
            if layers_version(&manifest.layers) == version {
                return self.resolve(manifest);
            }
        }
        let superseded = self.superseded_path(id, version);
        if !superseded.exists() {
            return Err(not_found());
        }
        self.resolve(TemplateManifest::read(&superseded)?)
    }

    /// All templates, sorted by id.
    pub fn list(&self) -> Result<Vec<Template>, TemplateError> {
        let mut templates = Vec::new();
        for path in manifest_files(&self.root.join("manifests"))? {
            templates.push(self.resolve(TemplateManifest::read(&path)?)?);
        }
        templates.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(templates)
    }

    /// Write (or replace) template `id` as `layers` (lowest first) with `config`. Every
    /// layer must already be in the store. A replaced build with other layers is kept
    /// under `superseded/`, so sandboxes, pauses and snapshots made from it (which name
    /// it by [`Template::pinned_reference`]) still find the layers they stand on.
    pub fn put(
        &self,
        id: &str,
        layers: Vec<LayerId>,
        config: TemplateConfig,
    ) -> Result<Template, TemplateError> {
        validate_template_id(id)?;
        let manifest = TemplateManifest {
            id: id.to_string(),
            layers,
            config,
            created_at: unix_now(),
        };
        let template = self.resolve(manifest.clone())?;
        let current = self.manifest_path(id);
        if current.exists() {
            let replaced = TemplateManifest::read(&current)?;
            let version = layers_version(&replaced.layers);
            if version != template.version() {
                replaced.write(&self.superseded_path(id, &version))?;
            }
        }
        manifest.write(&current)?;
        Ok(template)
    }

    /// Make template `new_id` = `parent`'s layers + `layer` on top. `config` defaults
    /// to the parent's. This is how template builds, snapshots and forks stack on
    /// `base` without copying it.
    pub fn derive(
        &self,
        parent: &str,
        new_id: &str,
        layer: LayerId,
        config: Option<TemplateConfig>,
    ) -> Result<Template, TemplateError> {
        let parent = self.get(parent)?;
        // The parent's checkpoint ran on the parent's layers, not on these.
        let config = config.unwrap_or_else(|| TemplateConfig {
            checkpoint: None,
            ..parent.config()
        });
        let mut layers = parent.layer_ids;
        layers.push(layer);
        self.put(new_id, layers, config)
    }

    /// Forget template `id`. Its layers stay (other templates or running sandboxes may
    /// use them).
    pub fn remove(&self, id: &str) -> Result<(), TemplateError> {
        validate_template_id(id)?;
        let path = self.manifest_path(id);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(TemplateError::NotFound(id.to_string()))
            }
            Err(e) => Err(TemplateError::io("remove", path, e)),
        }
    }

    /// Delete layers that no template names and that are not in `in_use` (layers of
    /// running sandboxes, which the caller knows). Returns the removed ids. Old `base`
    /// layers left behind by a recipe change go this way.
    pub fn remove_unreferenced_layers(
        &self,
        in_use: &[LayerId],
    ) -> Result<Vec<LayerId>, TemplateError> {
        let mut referenced = self.referenced_layers()?;
        referenced.extend(in_use.iter().cloned());
        let layers = self.root.join("layers");
        let mut removed = Vec::new();
        for entry in fs::read_dir(&layers).ctx("read dir", &layers)? {
            let entry = entry.ctx("read dir", &layers)?;
            let Ok(id) = LayerId::try_from(entry.file_name().to_string_lossy().into_owned()) else {
                continue;
            };
            if !referenced.contains(&id) {
                self.remove_layer(&id)?;
                removed.push(id);
            }
        }
        Ok(removed)
    }

    /// Delete those of `candidates` (e.g. the layers of a removed template) that no
    /// template names any more; other unreferenced layers (a build in progress may
    /// have just committed one) are left alone. Returns the removed ids.
    pub fn remove_layers_if_unreferenced(
        &self,
        candidates: &[LayerId],
    ) -> Result<Vec<LayerId>, TemplateError> {
        let referenced = self.referenced_layers()?;
        let mut removed = Vec::new();
        for id in candidates {
            if !referenced.contains(id) && self.has_layer(id) && !removed.contains(id) {
                self.remove_layer(id)?;
                removed.push(id.clone());
            }
        }
        Ok(removed)
    }

    /// Builds replaced by a rebuild of their template (see [`TemplateStore::put`]),
    /// sorted by id; [`Template::pinned_reference`] names each.
    pub fn superseded(&self) -> Result<Vec<Template>, TemplateError> {
        let mut templates = Vec::new();
        for path in manifest_files(&self.root.join("superseded"))? {
            templates.push(self.resolve(TemplateManifest::read(&path)?)?);
        }
        templates.sort_by(|a, b| a.id.cmp(&b.id).then(a.created_at.cmp(&b.created_at)));
        Ok(templates)
    }

    /// Forget superseded build `version` of template `id` (nothing made from it is left).
    /// Its layers stay until a sweep finds no manifest naming them.
    pub fn remove_superseded(&self, id: &str, version: &str) -> Result<(), TemplateError> {
        validate_template_id(id)?;
        let reference = pinned_reference(id, version);
        validate_version(&reference, version)?;
        let path = self.superseded_path(id, version);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(TemplateError::NotFound(reference))
            }
            Err(e) => Err(TemplateError::io("remove", path, e)),
        }
    }

    /// Layers some manifest, current or superseded, names.
    fn referenced_layers(&self) -> Result<std::collections::BTreeSet<LayerId>, TemplateError> {
        let mut referenced = std::collections::BTreeSet::new();
        for dir in ["manifests", "superseded"] {
            for path in manifest_files(&self.root.join(dir))? {
                referenced.extend(TemplateManifest::read(&path)?.layers);
            }
        }
        Ok(referenced)
    }

    fn remove_layer(&self, id: &LayerId) -> Result<(), TemplateError> {
        let _lock = FileLock::acquire(&self.lock_path(id))?;
        let dir = self.layer_dir(id);
        // Rename first so a half-deleted layer never looks complete.
        let doomed = self
            .root
            .join("staging")
            .join(format!("{id}.{}", std::process::id()));
        fs::rename(&dir, &doomed).ctx("move layer out", &dir)?;
        fs::remove_dir_all(&doomed).ctx("remove layer", &doomed)
    }

    /// Layer `id` as a tar stream for another machine, with its tree hash (which the
    /// receiver checks, see [`crate::archive`]).
    pub fn pack_layer(
        &self,
        id: &LayerId,
    ) -> Result<(String, crate::archive::Packed), TemplateError> {
        let rootfs = self.layer_rootfs(id);
        if !rootfs.is_dir() {
            return Err(TemplateError::MissingLayer {
                template: String::new(),
                layer: id.to_string(),
            });
        }
        let hash = crate::archive::tree_hash(&rootfs)?;
        Ok((hash, crate::archive::pack(&rootfs)?))
    }

    /// Puts layer `id`, sent by another machine as a tar stream (see
    /// [`TemplateStore::pack_layer`]) whose tree hash was `tree_hash`, into the store.
    /// Nothing is published unless the unpacked tree has that hash. A layer the store
    /// has already (another importer was first) is kept and the stream ignored.
    pub fn import_layer(
        &self,
        id: &LayerId,
        tree_hash: &str,
        from: &mut dyn std::io::Read,
    ) -> Result<PathBuf, TemplateError> {
        let _lock = FileLock::acquire(&self.lock_path(id))?;
        if self.has_layer(id) {
            return Ok(self.layer_rootfs(id));
        }
        self.remove_staging_matching(|name| name.starts_with(&format!("{id}.")))?;
        let mut staged = StagedLayer {
            dir: self
                .root
                .join("staging")
                .join(format!("{id}.{}", std::process::id())),
            committed: false,
        };
        let rootfs = staged.rootfs();
        create_rootfs(&rootfs)?;
        crate::archive::unpack(from, &rootfs)?;
        crate::archive::verify(&rootfs, tree_hash)?;
        self.publish(&staged.dir, id, "imported")?;
        staged.committed = true;
        Ok(self.layer_rootfs(id))
    }

    /// An empty layer to fill, e.g. with a copy of a sandbox's overlay upper dir.
    pub fn stage_layer(&self) -> Result<StagedLayer, TemplateError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "new.{}.{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let staged = StagedLayer {
            dir: self.root.join("staging").join(name),
            committed: false,
        };
        let rootfs = staged.rootfs();
        create_rootfs(&rootfs)?;
        Ok(staged)
    }

    /// Move a filled staged layer into the store under the hash of its content. If an
    /// identical layer is already there, the staged copy is dropped and that one reused.
    pub fn commit_layer(&self, mut staged: StagedLayer) -> Result<LayerId, TemplateError> {
        let id = LayerId::of_tree(&staged.rootfs())?;
        let _lock = FileLock::acquire(&self.lock_path(&id))?;
        if !self.has_layer(&id) {
            self.publish(&staged.dir, &id, "content")?;
            staged.committed = true;
        }
        Ok(id)
    }

    /// Return layer `id`'s rootfs, building it with `build` first if the store lacks it.
    /// `build` fills the rootfs directory it is given. Concurrent callers for the same
    /// id (threads or processes) build once: the others wait, then use the result. A
    /// build that fails or is interrupted leaves nothing that looks like a layer.
    pub fn ensure_layer<F>(
        &self,
        id: &LayerId,
        source: &str,
        progress: &mut dyn FnMut(BuildProgress),
        build: F,
    ) -> Result<PathBuf, TemplateError>
    where
        F: FnOnce(&Path, &mut dyn FnMut(BuildProgress)) -> Result<(), TemplateError>,
    {
        if self.has_layer(id) {
            return Ok(self.layer_rootfs(id));
        }
        let lock_path = self.lock_path(id);
        let _lock = match FileLock::try_acquire(&lock_path)? {
            Some(lock) => lock,
            None => {
                progress(BuildProgress::WaitingForBuilder { layer: id.clone() });
                FileLock::acquire(&lock_path)?
            }
        };
        if self.has_layer(id) {
            return Ok(self.layer_rootfs(id));
        }
        let started = Instant::now();
        // We hold the id's lock, so any staging dir for this id is a dead builder's.
        self.remove_staging_matching(|name| name.starts_with(&format!("{id}.")))?;
        let mut staged = StagedLayer {
            dir: self
                .root
                .join("staging")
                .join(format!("{id}.{}", std::process::id())),
            committed: false,
        };
        let rootfs = staged.rootfs();
        create_rootfs(&rootfs)?;
        build(&rootfs, progress)?;
        progress(BuildProgress::Stage {
            name: "commit".into(),
            detail: format!("syncing and publishing layer {id}"),
        });
        let size_bytes = disk_usage(&rootfs);
        self.publish(&staged.dir, id, source)?;
        staged.committed = true;
        progress(BuildProgress::LayerReady {
            layer: id.clone(),
            elapsed: started.elapsed(),
            size_bytes,
        });
        Ok(self.layer_rootfs(id))
    }

    /// The `base` template, built on first need and rebuilt when its recipe changes.
    pub fn ensure_base(
        &self,
        progress: impl FnMut(BuildProgress),
    ) -> Result<Template, TemplateError> {
        self.ensure_recipe(&BaseRecipe::default(), progress)
    }

    /// Template `recipe.template_id`, built from `recipe` unless the store already has
    /// the layer that recipe names.
    pub fn ensure_recipe(
        &self,
        recipe: &BaseRecipe,
        mut progress: impl FnMut(BuildProgress),
    ) -> Result<Template, TemplateError> {
        let layer = recipe.layer_id();
        match self.get(&recipe.template_id) {
            Ok(t) if t.layer_ids == [layer.clone()] && t.config() == recipe.config => return Ok(t),
            Ok(_) | Err(TemplateError::NotFound(_)) | Err(TemplateError::MissingLayer { .. }) => {}
            Err(e) => return Err(e),
        }
        let source = format!("recipe for template {}", recipe.template_id);
        self.ensure_layer(&layer, &source, &mut progress, |rootfs, progress| {
            recipe.build(rootfs, progress)
        })?;
        self.put(&recipe.template_id, vec![layer], recipe.config.clone())
    }

    /// Is `base` built from the current recipe, without building it?
    pub fn base_is_current(&self) -> bool {
        let recipe = BaseRecipe::default();
        self.get(BASE_TEMPLATE_ID)
            .is_ok_and(|t| t.layer_ids == [recipe.layer_id()])
    }

    fn resolve(&self, manifest: TemplateManifest) -> Result<Template, TemplateError> {
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for id in &manifest.layers {
            if !self.has_layer(id) {
                return Err(TemplateError::MissingLayer {
                    template: manifest.id.clone(),
                    layer: id.to_string(),
                });
            }
            layers.push(self.layer_rootfs(id));
        }
        Ok(Template {
            id: manifest.id,
            layers,
            layer_ids: manifest.layers,
            default_user: manifest.config.default_user,
            default_workdir: manifest.config.default_workdir,
            envs: manifest.config.envs,
            start_cmd: manifest.config.start_cmd,
            ready_cmd: manifest.config.ready_cmd,
            checkpoint: manifest.config.checkpoint,
            created_at: manifest.created_at,
        })
    }

    /// Atomically turn `staging_dir` (holding `rootfs/`) into `layers/<id>`. The caller
    /// holds `id`'s lock.
    fn publish(&self, staging_dir: &Path, id: &LayerId, source: &str) -> Result<(), TemplateError> {
        let record = LayerRecord {
            id,
            source,
            created_at: unix_now(),
        };
        let mut bytes = serde_json::to_vec_pretty(&record).expect("layer record serializes");
        bytes.push(b'\n');
        write_atomically(&staging_dir.join("layer.json"), &bytes)?;
        // Flush the whole tree before the rename makes it look complete.
        let dir = fs::File::open(staging_dir).ctx("open", staging_dir)?;
        rustix::fs::syncfs(&dir).map_err(|e| TemplateError::io("syncfs", staging_dir, e.into()))?;
        let target = self.layer_dir(id);
        fs::rename(staging_dir, &target).ctx("rename layer into place", &target)?;
        let layers = self.root.join("layers");
        fs::File::open(&layers)
            .and_then(|d| d.sync_all())
            .ctx("fsync dir", &layers)
    }

    /// Staging entries are named `<id>.<pid>` or `new.<pid>.<n>`; remove those whose
    /// process is gone.
    fn remove_dead_staging(&self) -> Result<(), TemplateError> {
        self.remove_staging_matching(|name| {
            let pid = name
                .split('.')
                .nth(1)
                .and_then(|p| p.parse::<i32>().ok())
                .and_then(rustix::process::Pid::from_raw);
            match pid {
                Some(pid) => rustix::process::test_kill_process(pid).is_err(),
                None => false,
            }
        })
    }

    fn remove_staging_matching(&self, matches: impl Fn(&str) -> bool) -> Result<(), TemplateError> {
        let staging = self.root.join("staging");
        for entry in fs::read_dir(&staging).ctx("read dir", &staging)? {
            let entry = entry.ctx("read dir", &staging)?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = entry.path();
            // A leftover with something mounted inside is not ours to delete through.
            if matches(name) && !has_mounts_under(&path) {
                fs::remove_dir_all(&path).ctx("remove stale staging", &path)?;
            }
        }
        Ok(())
    }

    fn layer_dir(&self, id: &LayerId) -> PathBuf {
        self.root.join("layers").join(id.as_str())
    }

    fn manifest_path(&self, id: &str) -> PathBuf {
        self.root.join("manifests").join(format!("{id}.json"))
    }

    fn superseded_path(&self, id: &str, version: &str) -> PathBuf {
        self.root
            .join("superseded")
            .join(format!("{}.json", pinned_reference(id, version)))
    }

    fn lock_path(&self, id: &LayerId) -> PathBuf {
        self.root.join("locks").join(format!("{id}.lock"))
    }
}

fn validate_template_id(id: &str) -> Result<(), TemplateError> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with(['.', '-'])
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(TemplateError::InvalidId(id.to_string()))
    }
}

/// A version is what [`layers_version`] makes: a lowercase hyphenated UUID.
fn validate_version(reference: &str, version: &str) -> Result<(), TemplateError> {
    let valid = version.len() == 36
        && version
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'a'..=b'f' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(TemplateError::InvalidId(reference.to_string()))
    }
}

/// The manifests in `dir`: its `*.json` files that are not hidden (temporaries of
/// [`write_atomically`] are).
fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, TemplateError> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).ctx("read dir", dir)? {
        let path = entry.ctx("read dir", dir)?.path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
        if path.extension().is_some_and(|e| e == "json") && !hidden {
            files.push(path);
        }
    }
    Ok(files)
}

/// Is anything mounted at or below `path` in this mount namespace?
fn has_mounts_under(path: &Path) -> bool {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return true;
    };
    let prefix = path.as_os_str().to_string_lossy();
    mountinfo.lines().any(|line| {
        line.split(' ').nth(4).is_some_and(|mount_point| {
            mount_point == prefix || mount_point.starts_with(&format!("{prefix}/"))
        })
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A staged layer's rootfs: the image's `/`, so 0755 whatever the umask (its parents
/// are the store's, 0700).
fn create_rootfs(rootfs: &Path) -> Result<(), TemplateError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(rootfs)
        .ctx("create", rootfs)?;
    fs::set_permissions(rootfs, fs::Permissions::from_mode(0o755)).ctx("chmod", rootfs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// A scratch state dir removed on drop, even when the test fails.
    struct StateDir(PathBuf);

    impl StateDir {
        fn new(tag: &str) -> StateDir {
            let dir = std::env::temp_dir().join(format!(
                "berth-store-{tag}-{}-{}",
                std::process::id(),
                unix_now()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            StateDir(dir)
        }
    }

    impl Drop for StateDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn config(user: &str) -> TemplateConfig {
        TemplateConfig {
            default_user: user.into(),
            default_workdir: format!("/home/{user}"),
            envs: BTreeMap::new(),
            ..TemplateConfig::default()
        }
    }

    fn write_file(rootfs: &Path, name: &str, contents: &str) -> Result<(), TemplateError> {
        fs::write(rootfs.join(name), contents).ctx("write", rootfs.join(name))
    }

    #[test]
    fn ensure_layer_builds_once_then_reuses() {
        let state = StateDir::new("once");
        let store = TemplateStore::open(&state.0).unwrap();
        let id = LayerId::of_bytes(b"recipe-1");
        let builds = AtomicUsize::new(0);
        for _ in 0..2 {
            let rootfs = store
                .ensure_layer(&id, "test", &mut |_| {}, |rootfs, _| {
                    builds.fetch_add(1, Ordering::SeqCst);
                    write_file(rootfs, "marker", "built")
                })
                .unwrap();
            assert_eq!(fs::read_to_string(rootfs.join("marker")).unwrap(), "built");
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(store
            .root()
            .join("layers")
            .join(id.as_str())
            .join("layer.json")
            .is_file());
    }

    #[test]
    fn concurrent_builders_of_one_layer_build_once() {
        let state = StateDir::new("concurrent");
        let store = TemplateStore::open(&state.0).unwrap();
        let id = LayerId::of_bytes(b"shared-recipe");
        let builds = Arc::new(AtomicUsize::new(0));
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let (store, id, builds) = (store.clone(), id.clone(), builds.clone());
            std::thread::spawn(move || {
                store
                    .ensure_layer(&id, "test", &mut |_| {}, |rootfs, _| {
                        builds.fetch_add(1, Ordering::SeqCst);
                        entered_tx.send(()).unwrap();
                        // Hold the build open until the second caller is waiting on us.
                        release_rx.recv().unwrap();
                        write_file(rootfs, "marker", "first")
                    })
                    .unwrap()
            })
        };
        entered_rx.recv().unwrap();
        let second = {
            let (store, id, builds) = (store.clone(), id.clone(), builds.clone());
            std::thread::spawn(move || {
                let mut events = Vec::new();
                let rootfs = store
                    .ensure_layer(&id, "test", &mut |e| events.push(e), |rootfs, _| {
                        builds.fetch_add(1, Ordering::SeqCst);
                        write_file(rootfs, "marker", "second")
                    })
                    .unwrap();
                (rootfs, events)
            })
        };
        // The second caller cannot get the lock while the first builds.
        assert!(FileLock::try_acquire(&store.lock_path(&id))
            .unwrap()
            .is_none());
        release_tx.send(()).unwrap();
        let first_rootfs = first.join().unwrap();
        let (second_rootfs, _events) = second.join().unwrap();
        assert_eq!(first_rootfs, second_rootfs);
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert_eq!(
            fs::read_to_string(first_rootfs.join("marker")).unwrap(),
            "first"
        );
    }

    #[test]
    fn failed_build_leaves_no_layer_and_next_call_rebuilds() {
        let state = StateDir::new("failed");
        let store = TemplateStore::open(&state.0).unwrap();
        let id = LayerId::of_bytes(b"flaky");
        let err = store
            .ensure_layer(&id, "test", &mut |_| {}, |rootfs, _| {
                write_file(rootfs, "half", "written")?;
                Err(TemplateError::BuildFailed {
                    stage: "test".into(),
                    status: "exit 1".into(),
                    output_tail: String::new(),
                })
            })
            .unwrap_err();
        assert!(matches!(err, TemplateError::BuildFailed { .. }));
        assert!(!store.has_layer(&id));
        let rootfs = store
            .ensure_layer(&id, "test", &mut |_| {}, |rootfs, _| {
                write_file(rootfs, "whole", "yes")
            })
            .unwrap();
        assert!(rootfs.join("whole").is_file());
        assert!(!rootfs.join("half").exists());
        assert_eq!(
            fs::read_dir(store.root().join("staging")).unwrap().count(),
            0
        );
    }

    #[test]
    fn crashed_builder_staging_is_removed_on_open() {
        let state = StateDir::new("crashed");
        let store = TemplateStore::open(&state.0).unwrap();
        // A pid that cannot be alive: above the kernel's pid_max limit (2^22).
        let dead = store.root().join("staging").join(format!(
            "{}.{}",
            LayerId::of_bytes(b"x"),
            (1 << 22) + 1
        ));
        fs::create_dir_all(dead.join("rootfs/etc")).unwrap();
        let live = store
            .root()
            .join("staging")
            .join(format!("new.{}.999", std::process::id()));
        fs::create_dir_all(&live).unwrap();
        TemplateStore::open(&state.0).unwrap();
        assert!(!dead.exists());
        assert!(live.exists());
    }

    #[test]
    fn a_rebuild_keeps_the_replaced_build_under_its_pinned_reference() {
        let state = StateDir::new("rebuild");
        let store = TemplateStore::open(&state.0).unwrap();
        let old_layer = LayerId::of_bytes(b"old");
        let new_layer = LayerId::of_bytes(b"new");
        for (id, file) in [(&old_layer, "old"), (&new_layer, "new")] {
            store
                .ensure_layer(id, "test", &mut |_| {}, |r, _| write_file(r, file, "1"))
                .unwrap();
        }
        let old = store
            .put("t", vec![old_layer.clone()], config("user"))
            .unwrap();
        assert_eq!(store.get(&old.pinned_reference()).unwrap(), old);
        // Same layers again: nothing is superseded.
        store
            .put("t", vec![old_layer.clone()], config("root"))
            .unwrap();
        assert!(store.superseded().unwrap().is_empty());

        let new = store
            .put("t", vec![new_layer.clone()], config("user"))
            .unwrap();
        assert_ne!(old.version(), new.version());
        assert_eq!(store.get("t").unwrap().layer_ids, vec![new_layer.clone()]);
        assert_eq!(
            store.get(&new.pinned_reference()).unwrap().layer_ids,
            vec![new_layer]
        );
        let pinned_old = store.get(&old.pinned_reference()).unwrap();
        assert_eq!(pinned_old.layer_ids, vec![old_layer.clone()]);
        assert_eq!(
            pinned_old.default_user, "root",
            "the build as it was last written"
        );
        assert_eq!(
            store.list().unwrap().len(),
            1,
            "superseded builds are not listed"
        );
        assert_eq!(store.superseded().unwrap(), vec![pinned_old]);
        // The old layer stays while its superseded manifest names it.
        assert!(store.remove_unreferenced_layers(&[]).unwrap().is_empty());
        assert!(store.has_layer(&old_layer));
        store.remove_superseded("t", &old.version()).unwrap();
        assert!(matches!(
            store.get(&old.pinned_reference()),
            Err(TemplateError::NotFound(_))
        ));
        assert!(matches!(
            store.remove_superseded("t", &old.version()),
            Err(TemplateError::NotFound(_))
        ));
        assert_eq!(
            store.remove_unreferenced_layers(&[]).unwrap(),
            vec![old_layer.clone()]
        );

        let unknown = pinned_reference("t", &layers_version(&[LayerId::of_bytes(b"x")]));
        assert!(matches!(store.get(&unknown), Err(TemplateError::NotFound(r)) if r == unknown));
        for bad in [
            "t@",
            "t@v1",
            "t@../../etc/passwd",
            "../t@00000000-0000-4000-8000-000000000000",
        ] {
            assert!(
                matches!(store.get(bad), Err(TemplateError::InvalidId(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_layer_moves_to_another_store_verified_and_a_changed_one_is_refused() {
        let sender_state = StateDir::new("sender");
        let receiver_state = StateDir::new("receiver");
        let sender = TemplateStore::open(&sender_state.0).unwrap();
        let receiver = TemplateStore::open(&receiver_state.0).unwrap();
        let id = LayerId::of_bytes(b"recipe-moved");
        sender
            .ensure_layer(&id, "test", &mut |_| {}, |rootfs, _| {
                fs::create_dir(rootfs.join("etc")).ctx("mkdir", rootfs)?;
                write_file(rootfs, "etc/os-release", "berth")
            })
            .unwrap();

        let (hash, mut stream) = sender.pack_layer(&id).unwrap();
        let rootfs = receiver.import_layer(&id, &hash, &mut stream).unwrap();
        assert_eq!(
            fs::read_to_string(rootfs.join("etc/os-release")).unwrap(),
            "berth"
        );
        assert_eq!(crate::archive::tree_hash(&rootfs).unwrap(), hash);
        receiver
            .put("moved", vec![id.clone()], config("user"))
            .unwrap();
        assert_eq!(receiver.get("moved").unwrap().layer_ids, vec![id.clone()]);

        let other = LayerId::of_bytes(b"recipe-other");
        let (_, mut stream) = sender.pack_layer(&id).unwrap();
        let wrong = "0".repeat(64);
        assert!(matches!(
            receiver.import_layer(&other, &wrong, &mut stream),
            Err(TemplateError::TreeMismatch { .. })
        ));
        assert!(
            !receiver.has_layer(&other),
            "a tree that arrived different is not published"
        );
        assert!(matches!(
            sender.pack_layer(&other),
            Err(TemplateError::MissingLayer { .. })
        ));
    }

    #[test]
    fn a_layer_path_names_its_layer() {
        let state = StateDir::new("layer-of");
        let store = TemplateStore::open(&state.0).unwrap();
        let id = LayerId::of_bytes(b"named");
        assert_eq!(
            store.layer_id_of(&store.layer_rootfs(&id)),
            Some(id.clone())
        );
        assert_eq!(store.layer_id_of(&store.layer_dir(&id)), None);
        assert_eq!(
            store.layer_id_of(
                Path::new("/elsewhere/layers")
                    .join(id.as_str())
                    .join("rootfs")
                    .as_path()
            ),
            None
        );
    }

    #[test]
    fn derive_stacks_a_layer_on_the_parent() {
        let state = StateDir::new("derive");
        let store = TemplateStore::open(&state.0).unwrap();
        let base_layer = LayerId::of_bytes(b"base");
        store
            .ensure_layer(&base_layer, "test", &mut |_| {}, |r, _| {
                write_file(r, "a", "1")
            })
            .unwrap();
        store
            .put("base", vec![base_layer.clone()], config("user"))
            .unwrap();

        let staged = store.stage_layer().unwrap();
        write_file(&staged.rootfs(), "b", "2").unwrap();
        let top = store.commit_layer(staged).unwrap();
        let child = store.derive("base", "child", top.clone(), None).unwrap();

        assert_eq!(child.layer_ids, vec![base_layer, top.clone()]);
        assert_eq!(child.default_user, "user");
        assert!(child.layers[1].join("b").is_file());
        assert_eq!(store.get("child").unwrap(), child);
        let ids: Vec<_> = store.list().unwrap().into_iter().map(|t| t.id).collect();
        assert_eq!(ids, vec!["base", "child"]);

        // The same content committed again reuses the layer.
        let again = store.stage_layer().unwrap();
        write_file(&again.rootfs(), "b", "2").unwrap();
        assert_eq!(store.commit_layer(again).unwrap(), top);
        assert_eq!(
            fs::read_dir(store.root().join("staging")).unwrap().count(),
            0
        );
    }

    #[test]
    fn unreferenced_layers_are_removed_and_referenced_ones_kept() {
        let state = StateDir::new("gc");
        let store = TemplateStore::open(&state.0).unwrap();
        let [named, running, orphan] = ["named", "running", "orphan"].map(|seed| {
            let id = LayerId::of_bytes(seed.as_bytes());
            store
                .ensure_layer(&id, "test", &mut |_| {}, |r, _| write_file(r, "f", "x"))
                .unwrap();
            id
        });
        store.put("t", vec![named.clone()], config("user")).unwrap();
        let removed = store
            .remove_unreferenced_layers(std::slice::from_ref(&running))
            .unwrap();
        assert_eq!(removed, vec![orphan.clone()]);
        assert!(store.has_layer(&named) && store.has_layer(&running));
        assert!(!store.has_layer(&orphan));
        assert_eq!(
            fs::read_dir(store.root().join("staging")).unwrap().count(),
            0
        );
    }

    #[test]
    fn only_unreferenced_candidates_are_removed() {
        let state = StateDir::new("gc-candidates");
        let store = TemplateStore::open(&state.0).unwrap();
        let [shared, own, building] = ["shared", "own", "building"].map(|seed| {
            let id = LayerId::of_bytes(seed.as_bytes());
            store
                .ensure_layer(&id, "test", &mut |_| {}, |r, _| write_file(r, "f", seed))
                .unwrap();
            id
        });
        store
            .put("keeps", vec![shared.clone()], config("user"))
            .unwrap();
        // `own` and `shared` were the removed template's; `building` is nobody's yet.
        let removed = store
            .remove_layers_if_unreferenced(&[shared.clone(), own.clone(), own.clone()])
            .unwrap();
        assert_eq!(removed, vec![own.clone()]);
        assert!(store.has_layer(&shared) && store.has_layer(&building));
        assert!(!store.has_layer(&own));
    }

    #[test]
    fn lookups_report_typed_errors() {
        let state = StateDir::new("errors");
        let store = TemplateStore::open(&state.0).unwrap();
        assert!(matches!(store.get("nope"), Err(TemplateError::NotFound(_))));
        assert!(matches!(
            store.get("../etc"),
            Err(TemplateError::InvalidId(_))
        ));
        assert!(matches!(
            store.put("t", vec![LayerId::of_bytes(b"absent")], config("user")),
            Err(TemplateError::MissingLayer { .. })
        ));
        assert!(matches!(
            store.remove("nope"),
            Err(TemplateError::NotFound(_))
        ));
    }

    #[test]
    fn dropped_staged_layer_removes_itself() {
        let state = StateDir::new("dropped");
        let store = TemplateStore::open(&state.0).unwrap();
        let staged = store.stage_layer().unwrap();
        let dir = staged.dir.clone();
        write_file(&staged.rootfs(), "x", "y").unwrap();
        drop(staged);
        assert!(!dir.exists());
    }
}
