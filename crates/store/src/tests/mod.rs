//! Store tests, one module per aggregate, on a fresh database in a temp dir each.

mod corrupt;
mod events;
mod sandboxes;
mod schema;
mod secrets;
mod snapshots;
mod teams;
mod telemetry;
mod templates;
mod volumes;

use time::OffsetDateTime;

use crate::columns::{from_ms, now};
use crate::*;

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    (dir, store)
}

/// A second connection to the same database, as an operator's `sqlite3` would have.
fn raw(dir: &tempfile::TempDir) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap()
}

fn at(ms: i64) -> OffsetDateTime {
    from_ms(ms).unwrap()
}

fn sandbox(team: &str, id: &str, started_ms: i64) -> SandboxRecord {
    SandboxRecord {
        id: id.into(),
        team_id: team.into(),
        template_id: "base".into(),
        alias: Some("base".into()),
        build_id: "b1".into(),
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 1024,
        metadata: [("user".to_string(), "alice".to_string())].into(),
        envd_version: "0.6.4".into(),
        envd_access_token: None,
        allow_internet_access: None,
        started_at: at(started_ms),
        end_at: at(started_ms + 60_000),
        status: SandboxStatus::Running,
        env_vars: Default::default(),
        timeout_secs: 300,
        lifecycle: Default::default(),
        network: None,
        traffic_access_token: None,
        volume_mounts: Vec::new(),
        execution_id: format!("exec-{id}"),
        from_snapshot: None,
    }
}

fn ids(records: &[SandboxRecord]) -> Vec<&str> {
    records.iter().map(|s| s.id.as_str()).collect()
}

#[test]
fn every_store_call_is_reported_to_the_query_observer() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    struct Counting(AtomicUsize);
    impl QueryObserver for Counting {
        fn query_finished(&self, _waited: std::time::Duration, _held: std::time::Duration) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let (_dir, store) = open();
    let observer = Arc::new(Counting(AtomicUsize::new(0)));
    store.observe_queries(observer.clone());
    let team = store.create_team("a").unwrap();
    store.team_usage(&team.id).unwrap();
    assert!(observer.0.load(Ordering::Relaxed) >= 2);
}
