//! berth-template: the template store.
//!
//! A template is a stack of read-only rootfs layers (lowest first) plus the config a
//! sandbox made from it starts with (default user, default workdir, environment). This
//! crate owns the on-disk store of layers and template manifests under berth's state
//! directory and builds the `base` template with debootstrap. It knows nothing of
//! namespaces, mounts of running sandboxes or HTTP: the runtime receives the layer paths
//! and does the isolation.
//!
//! Layout under `<state_dir>/templates/`:
//! - `layers/<id>/rootfs/` — one read-only layer. `<id>` is a sha256: of the recipe that
//!   built it, or of the layer's content. A layer directory only ever appears by an
//!   atomic rename of a finished build, so a present directory is a complete layer.
//! - `layers/<id>/layer.json` — what produced the layer (for humans and `list`).
//! - `manifests/<template>.json` — the template: its layer ids and config; written with
//!   write + fsync + rename.
//! - `superseded/<template>@<version>.json` — a build of the template that a rebuild
//!   replaced, kept (with its layers) because sandboxes, paused sandboxes and snapshots
//!   name it by its pinned reference; `<version>` is [`layers_version`] of its layers.
//! - `staging/` — builds in progress; leftovers of crashed builds are removed.
//! - `locks/<id>.lock` — flock held while a layer is built, so concurrent builders of
//!   the same layer wait for one build and then share its result.
//!
//! Layers also move between machines (a `berth node` fetching a template another node
//! built): [`TemplateStore::pack_layer`] on the sender, [`TemplateStore::import_layer`]
//! on the receiver, verified by tree hash ([`archive`]).

pub mod archive;
mod base;
mod error;
mod layer;
mod lock;
mod manifest;
mod store;

pub use base::{BaseRecipe, SetupStep, BASE_TEMPLATE_ID, DEFAULT_MIRROR};
pub use error::TemplateError;
pub use layer::{LayerId, StagedLayer};
pub use manifest::{TemplateConfig, TemplateManifest};
pub use store::{layers_version, pinned_reference, Template, TemplateStore, DEFAULT_STATE_DIR};

use std::time::Duration;

/// A step of a template build, reported as it happens so a CLI can render progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildProgress {
    /// Another process is building the same layer; this caller waits for its result.
    WaitingForBuilder { layer: LayerId },
    /// A build stage started (e.g. "debootstrap", "setup", "commit").
    Stage { name: String, detail: String },
    /// One line of output from a build tool (debootstrap's `I: Retrieving …` lines).
    Output { line: String },
    /// debootstrap fetched one more package; `count` is the number fetched so far.
    PackageRetrieved { count: usize, name: String },
    /// The layer is complete and in the store.
    LayerReady {
        layer: LayerId,
        elapsed: Duration,
        size_bytes: u64,
    },
}
