use super::*;
use crate::schema::{MIGRATIONS, VERSION};

/// A database at schema `version`, as an older berth left it.
fn database_at(version: usize) -> (tempfile::TempDir, rusqlite::Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = raw(&dir);
    for sql in &MIGRATIONS[..version] {
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "user_version", version as i64)
        .unwrap();
    (dir, conn)
}

#[test]
fn version_2_databases_gain_metadata_rows_for_filtering() {
    let (dir, conn) = database_at(2);
    conn.execute(
        "INSERT INTO teams (id, name, is_default, created_at_ms) VALUES ('t', 't', 1, 0)",
        [],
    )
    .unwrap();
    for (id, metadata) in [
        ("i1", r#"{"app":"web","env":"prod"}"#),
        ("i2", r#"{"app":"db"}"#),
        ("i3", "{broken"),
    ] {
        conn.execute(
            "INSERT INTO sandboxes (id, team_id, template_id, build_id, cpu_count, memory_mb, \
             disk_size_mb, metadata, envd_version, started_at_ms, end_at_ms, status) \
             VALUES (?1, 't', 'base', 'b', 1, 1, 1, ?2, '0.6.4', 1000, 2000, 'running')",
            rusqlite::params![id, metadata],
        )
        .unwrap();
    }
    drop(conn);

    let store = Store::open(dir.path()).unwrap();
    let version: i64 = raw(&dir)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version as usize, VERSION);
    let web = SandboxFilter {
        metadata: vec![("app".into(), "web".into())],
        ..Default::default()
    };
    let page = store.list_sandboxes("t", &web, 10, None).unwrap();
    assert_eq!(ids(&page.sandboxes), ["i1"]);
    // The broken row was skipped by the backfill and is reported when read.
    assert!(matches!(
        store.sandbox("t", "i3"),
        Err(StoreError::CorruptColumn {
            column: "metadata",
            ..
        })
    ));
}

#[test]
fn a_database_from_a_newer_berth_is_refused() {
    let (dir, conn) = database_at(VERSION);
    conn.pragma_update(None, "user_version", VERSION as i64 + 1)
        .unwrap();
    drop(conn);
    let err = Store::open(dir.path())
        .err()
        .expect("opened a newer schema");
    assert!(
        matches!(err, StoreError::NewerSchema { found, known } if found == VERSION as i64 + 1 && known == VERSION),
        "{err}"
    );
}

#[test]
fn a_failed_migration_is_rolled_back_and_named() {
    let (dir, conn) = database_at(VERSION - 1);
    // The second column the newest migration adds already exists: it cannot apply.
    conn.execute_batch("ALTER TABLE webhook_deliveries ADD COLUMN response_code INTEGER")
        .unwrap();
    drop(conn);
    let err = Store::open(dir.path())
        .err()
        .expect("migration applied twice");
    assert!(
        matches!(err, StoreError::Migration { version, .. } if version == VERSION),
        "{err}"
    );
    let conn = raw(&dir);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version as usize, VERSION - 1);
    let first_change: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM pragma_table_info('webhook_deliveries') WHERE name = 'status'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(first_change, 0, "the failed migration changed nothing");
}

#[test]
fn paused_rows_from_before_pause_times_take_their_last_paused_event() {
    let (dir, conn) = database_at(8);
    conn.execute(
        "INSERT INTO teams (id, name, is_default, created_at_ms) VALUES ('t', 't', 1, 0)",
        [],
    )
    .unwrap();
    for id in ["i1", "i2"] {
        conn.execute(
            "INSERT INTO sandboxes (id, team_id, template_id, build_id, cpu_count, memory_mb, \
             disk_size_mb, metadata, envd_version, started_at_ms, end_at_ms, status) \
             VALUES (?1, 't', 'base', 'b', 1, 1, 1, '{}', '0.6.4', 1000, 2000, 'paused')",
            [id],
        )
        .unwrap();
    }
    conn.execute(
        "INSERT INTO events (id, team_id, sandbox_id, template_id, build_id, event_type, \
         timestamp_ms) VALUES ('e1', 't', 'i1', 'base', 'b', 'sandbox.lifecycle.paused', 5000)",
        [],
    )
    .unwrap();
    drop(conn);
    let store = Store::open(dir.path()).unwrap();
    let paused = store.paused_sandboxes_by_age().unwrap();
    assert_eq!(paused[0].id, "i2");
    assert_eq!(paused[0].paused_at, at(1000), "no event: the start");
    assert_eq!(paused[1].paused_at, at(5000));
}
