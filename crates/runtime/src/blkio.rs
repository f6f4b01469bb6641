//! Per-sandbox disk bandwidth and IOPS limits, so one sandbox's disk storm does not
//! stall its neighbours.
//!
//! Each sandbox's disk is an ext4 filesystem on a loop device of its own, so a rule for
//! that device is a rule for that sandbox. The rules are blk-throttle limits in the
//! *root* group of the cgroup v1 `blkio` hierarchy: there they hold for every I/O to the
//! device, the sandbox's direct and synchronous writes and the kernel's write-back of its
//! page cache alike. (A rule in the sandbox's own group would miss write-back, which v1
//! charges to the flusher threads in the root group.) A rule is set when a running
//! sandbox takes its disk ([`DiskThrottle::apply`]) and removed when it lets go
//! ([`DiskThrottle::clear`]), so a loop device berth no longer uses keeps no rule.
//!
//! On cgroup v2 hosts (no v1 `blkio` mount) nothing is throttled: `io.max` needs the
//! `io` controller delegated to berth's groups, which the hosts berth is tested on do
//! not offer; the daemon logs this once when limits are configured.

use std::fs;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

/// Limits for each sandbox's disk; 0 is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskLimits {
    pub read_bytes_per_sec: u64,
    pub write_bytes_per_sec: u64,
    pub read_iops: u64,
    pub write_iops: u64,
}

impl DiskLimits {
    fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }

    /// `(file, value)` for each blk-throttle file of the root group.
    fn files(&self) -> [(&'static str, u64); 4] {
        [
            ("blkio.throttle.read_bps_device", self.read_bytes_per_sec),
            ("blkio.throttle.write_bps_device", self.write_bytes_per_sec),
            ("blkio.throttle.read_iops_device", self.read_iops),
            ("blkio.throttle.write_iops_device", self.write_iops),
        ]
    }
}

/// Writes and removes the device rules of sandbox disks.
#[derive(Debug, Clone)]
pub(crate) struct DiskThrottle {
    /// The root group of the v1 `blkio` hierarchy; None where there is none.
    root: Option<PathBuf>,
    limits: DiskLimits,
}

impl DiskThrottle {
    pub(crate) fn new(cgroup_mount: &Path, limits: DiskLimits) -> Self {
        let root = cgroup_mount.join("blkio");
        let root = root
            .join("blkio.throttle.write_bps_device")
            .exists()
            .then_some(root);
        if root.is_none() && !limits.is_unlimited() {
            tracing::warn!(
                "disk limits are configured but this host has no cgroup v1 blkio hierarchy; sandbox disks are not throttled"
            );
        }
        Self { root, limits }
    }

    /// Sets the limits on the device under `disk` (a mount of a sandbox's disk). With
    /// no limits configured this clears whatever an earlier configuration left.
    pub(crate) fn apply(&self, disk: BorrowedFd<'_>) -> io::Result<()> {
        self.write(disk, self.limits)
    }

    /// Removes the rules of the device under `disk`.
    pub(crate) fn clear(&self, disk: BorrowedFd<'_>) -> io::Result<()> {
        self.write(disk, DiskLimits::default())
    }

    fn write(&self, disk: BorrowedFd<'_>, limits: DiskLimits) -> io::Result<()> {
        let Some(root) = &self.root else {
            return Ok(());
        };
        let device = rustix::fs::fstat(disk)?.st_dev;
        let (major, minor) = (rustix::fs::major(device), rustix::fs::minor(device));
        for (file, value) in limits.files() {
            // Writing 0 removes the device's rule; removing one that is not there is
            // not an error.
            let path = root.join(file);
            fs::write(&path, format!("{major}:{minor} {value}"))
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }
}
