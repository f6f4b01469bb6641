//! A hook telling the operator's metrics about every CRIU run: how long each dump and
//! restore took, and how large a dump's images are. Process-wide, like CRIU itself:
//! set once by the program (`berth up`), read by every [`crate::Criu`].

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What CRIU was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CriuAction {
    Dump,
    Restore,
}

/// One finished CRIU run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CriuRun {
    pub action: CriuAction,
    pub ok: bool,
    pub duration: Duration,
    /// Bytes of the images a successful dump wrote (its images directory).
    pub image_bytes: Option<u64>,
}

/// Told of every CRIU run.
pub trait CriuObserver: Send + Sync {
    fn finished(&self, run: CriuRun);
}

static OBSERVER: OnceLock<Arc<dyn CriuObserver>> = OnceLock::new();

/// Tells `observer` of every CRIU run from now on (the first observer set stays).
pub fn observe_criu(observer: Arc<dyn CriuObserver>) {
    let _ = OBSERVER.set(observer);
}

/// Reports a run that took `duration`; for a successful dump, measures `images`.
pub(crate) fn report(action: CriuAction, ok: bool, duration: Duration, images: Option<&Path>) {
    let Some(observer) = OBSERVER.get() else {
        return;
    };
    let image_bytes = match (ok, images) {
        (true, Some(dir)) => Some(bytes_in(dir)),
        _ => None,
    };
    observer.finished(CriuRun {
        action,
        ok,
        duration,
        image_bytes,
    });
}

/// Sizes of the files directly in `dir` (CRIU writes its images flat; the dump log is
/// among them and small).
fn bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.metadata().ok())
                .filter(|meta| meta.is_file())
                .map(|meta| meta.len())
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_is_measured_by_its_images() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pages-1.img"), vec![0u8; 3000]).unwrap();
        std::fs::write(dir.path().join("core-1.img"), vec![0u8; 96]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        assert_eq!(bytes_in(dir.path()), 3096);
        assert_eq!(bytes_in(&dir.path().join("missing")), 0);
    }
}
