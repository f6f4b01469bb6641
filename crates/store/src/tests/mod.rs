//! Store tests, one module per aggregate, each run on both backends: on SQLite in a temp
//! dir, and on Postgres in a schema of its own (dropped afterwards) of the server
//! `BERTH_TEST_DATABASE_URL` names.
//!
//! Each file lists its tests in one `on_both_backends!`, which makes `sqlite::<test>`
//! and `postgres::<test>`. The Postgres ones are `#[ignore]`d so that a plain `cargo
//! test -p berth-store` needs no server; run them with a throwaway cluster:
//!
//! ```text
//! scripts/with-postgres.sh cargo test -p berth-store -- --ignored
//! ```
//!
//! (scripts/test.sh does, in its own step). Run without a server, they fail and say so.

use std::path::Path;

use time::OffsetDateTime;

use crate::columns::{from_ms, now};
use crate::db::params;
use crate::*;

/// The environment variable naming the Postgres server the Postgres half runs on
/// (`postgres://…`; each test makes a schema of its own in that database).
pub(crate) const DATABASE_URL_VAR: &str = "BERTH_TEST_DATABASE_URL";

/// How `scripts/test.sh` runs the Postgres half (named by `#[ignore]` and by failures).
pub(crate) const POSTGRES_RUN: &str =
    "scripts/with-postgres.sh cargo test -p berth-store -- --ignored";

/// Runs each listed test (a `fn(&TestDb)`) on SQLite and, ignored unless asked for, on
/// Postgres.
macro_rules! on_both_backends {
    ($($test:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $test() {
                    super::$test(&crate::tests::TestDb::sqlite());
                }
            )+
        }
        mod postgres {
            $(
                #[test]
                #[ignore = "needs Postgres: scripts/with-postgres.sh cargo test -p berth-store -- --ignored"]
                fn $test() {
                    super::$test(&crate::tests::TestDb::postgres());
                }
            )+
        }
    };
}

/// Runs each listed test (a `fn(&TestDb)`) on Postgres only (what SQLite cannot have:
/// several processes' connections at once, a server to refuse us).
macro_rules! on_postgres {
    ($($test:ident),+ $(,)?) => {
        mod postgres_only {
            $(
                #[test]
                #[ignore = "needs Postgres: scripts/with-postgres.sh cargo test -p berth-store -- --ignored"]
                fn $test() {
                    super::$test(&crate::tests::TestDb::postgres());
                }
            )+
        }
    };
}

mod concurrency;
mod connections;
mod corrupt;
mod events;
mod nodes;
mod sandboxes;
mod schema;
mod secrets;
mod snapshots;
mod teams;
mod telemetry;
mod templates;
mod volumes;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// A fresh, empty database of one backend, removed when dropped.
pub(crate) struct TestDb {
    backend: Backend,
    /// The state directory (SQLite's database lives here).
    dir: tempfile::TempDir,
    /// Postgres: the server's URL, and the schema this test owns in it.
    postgres: Option<(String, String)>,
}

impl TestDb {
    pub(crate) fn sqlite() -> Self {
        TestDb {
            backend: Backend::Sqlite,
            dir: tempfile::tempdir().unwrap(),
            postgres: None,
        }
    }

    pub(crate) fn postgres() -> Self {
        let url = std::env::var(DATABASE_URL_VAR).unwrap_or_else(|_| {
            panic!(
                "this test runs the store on Postgres, and {DATABASE_URL_VAR} names no server: \
                 run it with a throwaway cluster, `{POSTGRES_RUN}`, or point \
                 {DATABASE_URL_VAR} at a database the test may create schemas in"
            )
        });
        let schema = format!("berth_test_{}", uuid::Uuid::new_v4().simple());
        admin(&url)
            .conn()
            .unwrap()
            .batch(&format!("CREATE SCHEMA {schema}"))
            .unwrap_or_else(|err| panic!("creating a test schema on {DATABASE_URL_VAR}: {err}"));
        TestDb {
            backend: Backend::Postgres,
            dir: tempfile::tempdir().unwrap(),
            postgres: Some((url, schema)),
        }
    }

    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// The SQLite state directory (also made for Postgres tests, unused there).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The URL of this test's database (Postgres: the test's schema first in the search
    /// path).
    pub(crate) fn url(&self) -> Option<String> {
        self.postgres.as_ref().map(|(url, schema)| {
            let separator = if url.contains('?') { '&' } else { '?' };
            format!("{url}{separator}options=-c%20search_path%3D{schema}")
        })
    }

    pub(crate) fn config(&self) -> DatabaseConfig {
        DatabaseConfig::from_url(self.url().as_deref(), self.dir()).unwrap()
    }

    /// A store on this database, migrated.
    pub(crate) fn open(&self) -> Store {
        Store::connect(&self.config()).unwrap()
    }

    /// A store on this database left at schema `version` (as an older berth left it).
    pub(crate) fn at_version(&self, version: usize) -> Store {
        let store = Store::unmigrated(&self.config()).unwrap();
        crate::schema::migrate_to(&mut store.conn().unwrap(), version).unwrap();
        store
    }

    /// Runs `sql` on a connection of its own, as an operator's sqlite3 or psql would.
    pub(crate) fn execute(&self, sql: &str) -> usize {
        Store::unmigrated(&self.config())
            .unwrap()
            .conn()
            .unwrap()
            .execute(sql, params![])
            .unwrap_or_else(|err| panic!("{sql}: {err}"))
    }

    /// The integer the query's column `n` holds (its first row; 0 without one).
    pub(crate) fn count(&self, sql: &str) -> i64 {
        Store::unmigrated(&self.config())
            .unwrap()
            .conn()
            .unwrap()
            .query_count(sql, params![])
            .unwrap_or_else(|err| panic!("{sql}: {err}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some((url, schema)) = &self.postgres {
            let dropped = admin(url)
                .conn()
                .and_then(|mut conn| conn.batch(&format!("DROP SCHEMA {schema} CASCADE")));
            if let Err(err) = dropped {
                eprintln!("dropping test schema {schema}: {err}");
            }
        }
    }
}

/// A connection to the server itself (not a test's schema), unmigrated.
fn admin(url: &str) -> Store {
    let config = DatabaseConfig::from_url(Some(url), Path::new("/nonexistent"))
        .unwrap_or_else(|err| panic!("{DATABASE_URL_VAR}: {err}"));
    Store::unmigrated(&config).unwrap()
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

fn every_store_call_is_reported_to_the_query_observer(db: &TestDb) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    struct Counting(AtomicUsize);
    impl QueryObserver for Counting {
        fn query_finished(&self, _waited: std::time::Duration, _held: std::time::Duration) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let store = db.open();
    let observer = Arc::new(Counting(AtomicUsize::new(0)));
    store.observe_queries(observer.clone());
    let team = store.create_team("a").unwrap();
    store.team_usage(&team.id).unwrap();
    assert!(observer.0.load(Ordering::Relaxed) >= 2);
}

on_both_backends!(every_store_call_is_reported_to_the_query_observer);
