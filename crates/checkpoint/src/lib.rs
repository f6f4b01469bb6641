//! berth-checkpoint: CRIU, the memory-checkpoint engine behind pause, snapshots and fork.
//!
//! Owns finding a CRIU that works on this kernel — the host's when it is 4.2 or newer,
//! otherwise a private copy of Debian forky's CRIU 4.2 provisioned under berth's state
//! directory — and running it. It must not touch the host's package sources or libc:
//! the private copy is fetched by apt with a private configuration (so signatures are
//! still verified against the host's Debian keyring) and runs through its own dynamic
//! loader. It also reads and rewrites the few CRIU images that tie a dump to its source
//! (user namespace id maps, hostname) so one checkpoint can be restored as several
//! sandboxes, and lists the names a restore will create ([`images`]). It knows nothing of HTTP or of sandboxes' layout.

pub mod criu;
pub mod images;
mod observe;

pub use criu::{Criu, CriuError, CriuVersion, Dump, Restore};
pub use images::{
    forget_file_sizes, ghost_names, prepare_restore_images, GhostName, ImageError, ImageRewrite,
};
pub use observe::{observe_criu, CriuAction, CriuObserver, CriuRun};
