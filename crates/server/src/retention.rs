//! Retention: paused sandboxes and snapshots evicted by the operator's rules
//! ([`crate::Retention`]), oldest first, each eviction logged and recorded as an event.
//!
//! One pass gathers the facts (paused sandboxes with their pause times, snapshots with
//! their sizes, the snapshots in use), computes the evictions in a pure function
//! ([`plan`]) and carries them out. It runs every [`PASS_EVERY`] and at once when the
//! limits are replaced.
//!
//! **A snapshot in use is never evicted**: one that a live (running or paused) sandbox
//! was started from, or that a start is restoring from right now. Its bytes still count
//! towards its team's storage, so other snapshots go first. (Template builds cannot
//! start from a snapshot in berth, so no build pins one.) The executor checks again
//! under the locks the starts take, so a start that begins after the plan keeps its
//! snapshot; a paused sandbox resumed after the plan is not killed either.
//!
//! A paused sandbox evicted is killed (`sandbox.lifecycle.killed`, eventData `{reason:
//! "retention", rule, pausedAt}`); a snapshot evicted is deleted with its checkpoint
//! (`sandbox.snapshot.deleted`, eventData `{reason: "retention", rule, snapshotID,
//! name, sizeBytes}`).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use berth_store::{PausedSandbox, SnapshotRecord};
use time::OffsetDateTime;

use crate::{sandboxes, Retention, SharedState};

/// How often retention runs without being woken.
const PASS_EVERY: Duration = Duration::from_secs(30);

/// Which rule evicts something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    PausedMaxAge,
    PausedMaxCount,
    SnapshotMaxAge,
    SnapshotMaxStorage,
}

impl Rule {
    /// The config file key of the rule (also in event data).
    pub fn key(self) -> &'static str {
        match self {
            Rule::PausedMaxAge => "retention.paused_max_age",
            Rule::PausedMaxCount => "retention.paused_max_count",
            Rule::SnapshotMaxAge => "retention.snapshot_max_age",
            Rule::SnapshotMaxStorage => "retention.snapshot_max_storage_mb",
        }
    }
}

/// One thing to evict, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Eviction {
    Paused {
        id: String,
        paused_at: OffsetDateTime,
        rule: Rule,
    },
    Snapshot {
        team_id: String,
        id: String,
        rule: Rule,
    },
}

/// What a pass decides on.
pub(crate) struct Facts {
    pub now: OffsetDateTime,
    /// Every paused sandbox, longest paused first.
    pub paused: Vec<PausedSandbox>,
    /// Every snapshot, oldest first.
    pub snapshots: Vec<SnapshotRecord>,
    /// Snapshots that must stay (see the module doc).
    pub in_use: HashSet<String>,
}

/// What `retention` evicts of `facts`: paused sandboxes first, then snapshots, each
/// oldest first.
pub(crate) fn plan(retention: &Retention, facts: &Facts) -> Vec<Eviction> {
    let mut evictions = Vec::new();
    let older_than =
        |at: OffsetDateTime, age: Option<Duration>| age.is_some_and(|age| facts.now - at > age);

    let mut kept_paused: BTreeMap<&str, Vec<&PausedSandbox>> = BTreeMap::new();
    for paused in &facts.paused {
        if older_than(paused.paused_at, retention.paused_max_age) {
            evictions.push(Eviction::Paused {
                id: paused.id.clone(),
                paused_at: paused.paused_at,
                rule: Rule::PausedMaxAge,
            });
        } else {
            kept_paused.entry(&paused.team_id).or_default().push(paused);
        }
    }
    if let Some(max) = retention.paused_max_count {
        for kept in kept_paused.values() {
            let excess = kept
                .len()
                .saturating_sub(usize::try_from(max).unwrap_or(usize::MAX));
            for paused in &kept[..excess] {
                evictions.push(Eviction::Paused {
                    id: paused.id.clone(),
                    paused_at: paused.paused_at,
                    rule: Rule::PausedMaxCount,
                });
            }
        }
    }

    // Per team: what its snapshots take, and the ones that may go, oldest first.
    let mut stored: BTreeMap<&str, u64> = BTreeMap::new();
    let mut evictable: BTreeMap<&str, Vec<&SnapshotRecord>> = BTreeMap::new();
    for snapshot in &facts.snapshots {
        let in_use = facts.in_use.contains(&snapshot.id);
        if !in_use && older_than(snapshot.created_at, retention.snapshot_max_age) {
            evictions.push(Eviction::Snapshot {
                team_id: snapshot.team_id.clone(),
                id: snapshot.id.clone(),
                rule: Rule::SnapshotMaxAge,
            });
            continue;
        }
        *stored.entry(&snapshot.team_id).or_default() += snapshot.size_bytes;
        if !in_use {
            evictable
                .entry(&snapshot.team_id)
                .or_default()
                .push(snapshot);
        }
    }
    if let Some(max_mb) = retention.snapshot_max_storage_mb {
        let max_bytes = max_mb.saturating_mul(1024 * 1024);
        for (team, mut total) in stored {
            for snapshot in evictable.get(team).into_iter().flatten() {
                if total <= max_bytes {
                    break;
                }
                total -= snapshot.size_bytes;
                evictions.push(Eviction::Snapshot {
                    team_id: snapshot.team_id.clone(),
                    id: snapshot.id.clone(),
                    rule: Rule::SnapshotMaxStorage,
                });
            }
        }
    }
    evictions
}

/// The retention task: a pass every [`PASS_EVERY`] and whenever the limits change.
pub async fn run(state: SharedState) {
    loop {
        let retention = state.limits.current().retention;
        if retention.is_set() {
            if let Err(err) = pass(&state, &retention).await {
                state.prometheus.sweeper_failed("retention", 1);
                tracing::error!(error = %crate::error::error_chain(&err), "retention pass");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(PASS_EVERY) => {}
            () = state.limits.changed() => {}
        }
    }
}

async fn pass(state: &SharedState, retention: &Retention) -> Result<(), crate::ServiceError> {
    let facts = Facts {
        now: OffsetDateTime::now_utc(),
        paused: state.store.paused_sandboxes_by_age()?,
        snapshots: state.store.all_snapshots()?,
        in_use: state.store.snapshots_in_use()?,
    };
    for eviction in plan(retention, &facts) {
        let done = match &eviction {
            Eviction::Paused {
                id,
                paused_at,
                rule,
            } => {
                let reason = format!("retention: {}", rule.key());
                let data = serde_json::json!({
                    "reason": "retention",
                    "rule": rule.key(),
                    "pausedAt": paused_at
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default(),
                });
                let evicted = sandboxes::evict_paused(state, id, &reason, data).await;
                if let Ok(true) = evicted {
                    tracing::warn!(sandbox = %id, rule = rule.key(), "retention killed a paused sandbox");
                }
                evicted
            }
            Eviction::Snapshot { team_id, id, rule } => {
                let data = serde_json::json!({ "reason": "retention", "rule": rule.key() });
                sandboxes::evict_snapshot(state, team_id, id, rule.key(), data).await
            }
        };
        match done {
            Ok(true) => state.prometheus.evicted(&eviction),
            Ok(false) => {}
            Err(err) => {
                state.prometheus.sweeper_failed("retention", 1);
                tracing::error!(?eviction, error = %crate::error::error_chain(&err), "retention eviction failed");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_700_000_000 + seconds).unwrap()
    }

    fn paused(id: &str, team: &str, seconds: i64) -> PausedSandbox {
        PausedSandbox {
            id: id.into(),
            team_id: team.into(),
            paused_at: at(seconds),
        }
    }

    fn snapshot(id: &str, team: &str, seconds: i64, mib: u64) -> SnapshotRecord {
        SnapshotRecord {
            id: id.into(),
            team_id: team.into(),
            name: id.into(),
            source_sandbox_id: "isrc".into(),
            template_id: "base".into(),
            build_id: "b".into(),
            cpu_count: 1,
            memory_mb: 512,
            disk_size_mb: 1024,
            env_vars: Default::default(),
            envd_access_token: None,
            checkpoint_id: id.into(),
            size_bytes: mib * 1024 * 1024,
            created_at: at(seconds),
            memory: true,
            network: None,
            volume_mounts: Vec::new(),
        }
    }

    fn facts(
        now: i64,
        paused: Vec<PausedSandbox>,
        snapshots: Vec<SnapshotRecord>,
        in_use: &[&str],
    ) -> Facts {
        Facts {
            now: at(now),
            paused,
            snapshots,
            in_use: in_use.iter().map(|id| id.to_string()).collect(),
        }
    }

    fn evicted(evictions: &[Eviction]) -> Vec<(&str, Rule)> {
        evictions
            .iter()
            .map(|eviction| match eviction {
                Eviction::Paused { id, rule, .. } | Eviction::Snapshot { id, rule, .. } => {
                    (id.as_str(), *rule)
                }
            })
            .collect()
    }

    #[test]
    fn no_rule_evicts_nothing() {
        let facts = facts(
            1_000_000,
            vec![paused("p1", "a", 0)],
            vec![snapshot("s1", "a", 0, 100_000)],
            &[],
        );
        assert!(plan(&Retention::default(), &facts).is_empty());
    }

    #[test]
    fn paused_sandboxes_go_by_age_then_by_count_per_team_longest_paused_first() {
        let retention = Retention {
            paused_max_age: Some(Duration::from_secs(100)),
            paused_max_count: Some(1),
            ..Default::default()
        };
        let facts = facts(
            200,
            vec![
                paused("old", "a", 50),
                paused("a1", "a", 120),
                paused("a2", "a", 150),
                paused("a3", "a", 180),
                paused("b1", "b", 190),
            ],
            Vec::new(),
            &[],
        );
        assert_eq!(
            evicted(&plan(&retention, &facts)),
            [
                ("old", Rule::PausedMaxAge),
                ("a1", Rule::PausedMaxCount),
                ("a2", Rule::PausedMaxCount),
            ]
        );
    }

    #[test]
    fn snapshots_in_use_are_kept_but_count_towards_storage() {
        let retention = Retention {
            snapshot_max_storage_mb: Some(10),
            ..Default::default()
        };
        // Team a: 4 + 4 (in use) + 4 + 4 = 16 MiB over 10: the oldest not in use go
        // until 8 MiB are left; team b is under its limit.
        let facts = facts(
            1000,
            vec![],
            vec![
                snapshot("s1", "a", 1, 4),
                snapshot("used", "a", 2, 4),
                snapshot("s3", "a", 3, 4),
                snapshot("s4", "a", 4, 4),
                snapshot("b1", "b", 0, 9),
            ],
            &["used"],
        );
        assert_eq!(
            evicted(&plan(&retention, &facts)),
            [
                ("s1", Rule::SnapshotMaxStorage),
                ("s3", Rule::SnapshotMaxStorage)
            ]
        );
    }

    #[test]
    fn old_snapshots_go_unless_in_use_and_what_age_frees_counts_for_storage() {
        let retention = Retention {
            snapshot_max_age: Some(Duration::from_secs(60)),
            snapshot_max_storage_mb: Some(5),
            ..Default::default()
        };
        let facts = facts(
            100,
            vec![],
            vec![
                snapshot("old", "a", 10, 4),
                snapshot("old-used", "a", 20, 1),
                snapshot("new", "a", 90, 4),
            ],
            &["old-used"],
        );
        assert_eq!(
            evicted(&plan(&retention, &facts)),
            [("old", Rule::SnapshotMaxAge)],
            "5 MiB are left: the limit holds without touching the new one"
        );
    }

    #[test]
    fn a_team_whose_snapshots_are_all_in_use_keeps_them_over_its_storage() {
        let retention = Retention {
            snapshot_max_storage_mb: Some(1),
            ..Default::default()
        };
        let facts = facts(10, vec![], vec![snapshot("s1", "a", 1, 4)], &["s1"]);
        assert!(plan(&retention, &facts).is_empty());
    }
}
