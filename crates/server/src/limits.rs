//! The operator's limits: how long a sandbox may be asked to live, what each team may
//! hold at once (quotas), and how long paused sandboxes and snapshots are kept
//! (retention, carried out by `crate::retention`).
//!
//! They can change while the server runs: [`LimitsHandle::replace`] (what `berth up`
//! does on SIGHUP or when its config file changes) swaps them whole, and every check
//! reads the current ones, so a change applies to the next request. What is running
//! is never touched by a change: a lower quota refuses new starts, a shorter lifetime
//! bounds new timeouts, and retention applies at its next pass.
//!
//! Quotas are per team and count only what runs (a paused sandbox holds no CPU or
//! memory), except snapshot storage, which counts every snapshot of the team. Every
//! refusal is E2B's 429 `{code, message}` (the SDKs raise their rate-limit error),
//! like E2B's own concurrency limit; the message names the limit, the team's use and
//! the setting that raises it. Starts that run at the same time may each pass before
//! either is recorded: a quota holds to within the starts in flight.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::Notify;

use crate::error::ServiceError;
use crate::AppState;

/// The longest a sandbox may be asked to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxLifetime {
    Seconds(i64),
    /// Any timeout the API can express (int32 seconds).
    Unlimited,
}

impl Default for MaxLifetime {
    /// E2B's largest plan: 24 hours.
    fn default() -> Self {
        MaxLifetime::Seconds(24 * 60 * 60)
    }
}

impl MaxLifetime {
    pub fn seconds(self) -> i64 {
        match self {
            MaxLifetime::Seconds(seconds) => seconds,
            MaxLifetime::Unlimited => i64::from(i32::MAX),
        }
    }
}

/// Everything the operator limits. `None` everywhere: no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// The longest timeout a sandbox may be given (create, connect, resume, timeout,
    /// fork, snapshot starts).
    pub max_lifetime: MaxLifetime,
    /// What each team may hold.
    pub quotas: TeamQuotas,
    /// What is evicted, oldest first.
    pub retention: Retention,
}

/// Per-team quotas (each team gets the same ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TeamQuotas {
    /// Running sandboxes.
    pub max_sandboxes: Option<u64>,
    /// CPUs given to running sandboxes, summed.
    pub max_cpu: Option<u64>,
    /// Memory given to running sandboxes, summed, in MiB.
    pub max_memory_mb: Option<u64>,
    /// Bytes of all the team's snapshots, in MiB.
    pub max_snapshot_storage_mb: Option<u64>,
}

/// When paused sandboxes and snapshots are evicted. A snapshot in use (see
/// `crate::retention`) is never evicted, whatever these say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// A sandbox paused longer than this is killed.
    pub paused_max_age: Option<Duration>,
    /// A team keeps at most this many paused sandboxes; the longest paused go first.
    pub paused_max_count: Option<u64>,
    /// A snapshot older than this is deleted.
    pub snapshot_max_age: Option<Duration>,
    /// A team's snapshots are deleted, oldest first, while they take more than this
    /// many MiB.
    pub snapshot_max_storage_mb: Option<u64>,
}

impl Retention {
    /// True when some rule is set (the retention pass has work to consider).
    pub fn is_set(&self) -> bool {
        *self != Retention::default()
    }
}

/// The current limits, replaceable while the server runs.
#[derive(Clone)]
pub struct LimitsHandle {
    current: Arc<RwLock<Arc<Limits>>>,
    changed: Arc<Notify>,
}

impl LimitsHandle {
    pub(crate) fn new(limits: Limits) -> LimitsHandle {
        LimitsHandle {
            current: Arc::new(RwLock::new(Arc::new(limits))),
            changed: Arc::new(Notify::new()),
        }
    }

    /// The limits in force now.
    pub fn current(&self) -> Arc<Limits> {
        self.current.read().clone()
    }

    /// Puts `limits` in force for every request from now on, and runs retention
    /// under them at once.
    pub fn replace(&self, limits: Limits) {
        *self.current.write() = Arc::new(limits);
        self.changed.notify_one();
    }

    /// Resolves at the next [`LimitsHandle::replace`] (or at once if one happened since
    /// the last wait).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await
    }
}

/// A team resource a quota bounds, beyond the number of running sandboxes (which
/// keeps E2B's own words, [`ServiceError::TeamSandboxLimit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaResource {
    Cpu,
    MemoryMb,
    SnapshotStorageMb,
}

impl QuotaResource {
    /// The config file key and `berth up` flag that raise it.
    pub fn setting(self) -> &'static str {
        match self {
            QuotaResource::Cpu => "team_quotas.max_cpu (--team-max-cpu)",
            QuotaResource::MemoryMb => "team_quotas.max_memory_mb (--team-max-memory-mb)",
            QuotaResource::SnapshotStorageMb => {
                "team_quotas.max_snapshot_storage_mb (--team-max-snapshot-storage-mb)"
            }
        }
    }

    /// What is counted, with its unit.
    pub fn counted(self) -> &'static str {
        match self {
            QuotaResource::Cpu => "CPUs of running sandboxes",
            QuotaResource::MemoryMb => "MiB of memory of running sandboxes",
            QuotaResource::SnapshotStorageMb => "MiB of snapshots",
        }
    }

    /// What the caller can do about it.
    pub fn remedy(self) -> &'static str {
        match self {
            QuotaResource::Cpu | QuotaResource::MemoryMb => "kill or pause some sandboxes",
            QuotaResource::SnapshotStorageMb => "delete some snapshots",
        }
    }
}

/// What a start asks of its team's quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Need {
    pub sandboxes: u64,
    pub cpu_count: u64,
    pub memory_mb: u64,
}

impl Need {
    /// `count` sandboxes of `cpu_count` CPUs and `memory_mb` MiB each.
    pub fn sandboxes(count: u64, cpu_count: u32, memory_mb: u64) -> Need {
        Need {
            sandboxes: count,
            cpu_count: count.saturating_mul(u64::from(cpu_count)),
            memory_mb: count.saturating_mul(memory_mb),
        }
    }
}

/// Refuses a start that would take team `team_id` past a quota of `quotas`.
fn check(
    quotas: &TeamQuotas,
    used: berth_store::TeamUsage,
    need: Need,
) -> Result<(), ServiceError> {
    if let Some(limit) = quotas.max_sandboxes {
        if used.sandboxes.saturating_add(need.sandboxes) > limit {
            return Err(ServiceError::TeamSandboxLimit { limit });
        }
    }
    for (resource, limit, used, asked) in [
        (
            QuotaResource::Cpu,
            quotas.max_cpu,
            used.cpu_count,
            need.cpu_count,
        ),
        (
            QuotaResource::MemoryMb,
            quotas.max_memory_mb,
            used.memory_mb,
            need.memory_mb,
        ),
    ] {
        if let Some(limit) = limit {
            if used.saturating_add(asked) > limit {
                return Err(ServiceError::TeamQuota {
                    resource,
                    limit,
                    used,
                    asked,
                });
            }
        }
    }
    Ok(())
}

/// Refuses starting what `need` describes for team `team_id` beyond its quotas.
pub(crate) fn check_team_quota(
    state: &AppState,
    team_id: &str,
    need: Need,
) -> Result<(), ServiceError> {
    let limits = state.limits.current();
    let quotas = &limits.quotas;
    if quotas.max_sandboxes.is_none() && quotas.max_cpu.is_none() && quotas.max_memory_mb.is_none()
    {
        return Ok(());
    }
    check(quotas, state.store.team_usage(team_id)?, need)
}

/// Refuses a snapshot of `size_bytes` (0 before it is taken: is any room left?) for
/// team `team_id` beyond its snapshot storage; `replacing` is the name of the snapshot
/// it replaces, whose bytes do not count.
pub(crate) fn check_snapshot_storage(
    state: &AppState,
    team_id: &str,
    replacing: Option<&str>,
    size_bytes: u64,
) -> Result<(), ServiceError> {
    let Some(limit) = state.limits.current().quotas.max_snapshot_storage_mb else {
        return Ok(());
    };
    let stored = state.store.snapshot_storage(team_id, replacing)?;
    let (used, asked) = (mib_rounded_up(stored), mib_rounded_up(size_bytes));
    let full = if size_bytes == 0 {
        stored >= limit.saturating_mul(MIB)
    } else {
        stored.saturating_add(size_bytes) > limit.saturating_mul(MIB)
    };
    if full {
        return Err(ServiceError::TeamQuota {
            resource: QuotaResource::SnapshotStorageMb,
            limit,
            used,
            asked,
        });
    }
    Ok(())
}

const MIB: u64 = 1024 * 1024;

fn mib_rounded_up(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_store::TeamUsage;

    fn used(sandboxes: u64, cpu_count: u64, memory_mb: u64) -> TeamUsage {
        TeamUsage {
            sandboxes,
            cpu_count,
            memory_mb,
        }
    }

    #[test]
    fn no_quota_refuses_nothing() {
        let none = TeamQuotas::default();
        assert!(check(
            &none,
            used(1000, 4000, 1 << 30),
            Need::sandboxes(10, 8, 1 << 20)
        )
        .is_ok());
    }

    #[test]
    fn each_quota_refuses_what_would_pass_it_and_admits_up_to_it() {
        let quotas = TeamQuotas {
            max_sandboxes: Some(3),
            max_cpu: Some(4),
            max_memory_mb: Some(2048),
            max_snapshot_storage_mb: None,
        };
        assert!(check(&quotas, used(1, 2, 512), Need::sandboxes(1, 2, 1024)).is_ok());
        assert!(matches!(
            check(&quotas, used(2, 2, 512), Need::sandboxes(2, 1, 64)),
            Err(ServiceError::TeamSandboxLimit { limit: 3 })
        ));
        assert!(matches!(
            check(&quotas, used(1, 3, 512), Need::sandboxes(1, 2, 512)),
            Err(ServiceError::TeamQuota {
                resource: QuotaResource::Cpu,
                limit: 4,
                used: 3,
                asked: 2
            })
        ));
        assert!(matches!(
            check(&quotas, used(0, 0, 0), Need::sandboxes(2, 1, 1536)),
            Err(ServiceError::TeamQuota {
                resource: QuotaResource::MemoryMb,
                asked: 3072,
                ..
            })
        ));
    }

    #[test]
    fn quota_refusals_are_e2b_429s_naming_the_setting() {
        let err = ServiceError::TeamQuota {
            resource: QuotaResource::Cpu,
            limit: 4,
            used: 3,
            asked: 2,
        };
        let api = crate::error::to_api(&err);
        assert_eq!(api.status(), 429);
        let text = api.to_string();
        assert!(text.contains("team_quotas.max_cpu"), "{text}");
        assert!(text.contains("limit of 4 CPUs"), "{text}");
    }

    #[test]
    fn a_replacement_is_seen_by_the_next_reader() {
        let handle = LimitsHandle::new(Limits::default());
        let mut stricter = Limits::default();
        stricter.quotas.max_cpu = Some(1);
        handle.replace(stricter.clone());
        assert_eq!(*handle.current(), stricter);
    }
}
