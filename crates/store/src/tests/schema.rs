use super::*;
use crate::schema::VERSION;

/// The schema version the database records.
fn recorded_version(db: &TestDb) -> i64 {
    match db.backend() {
        Backend::Sqlite => db.count("SELECT user_version AS n FROM pragma_user_version"),
        Backend::Postgres => {
            db.count("SELECT coalesce(max(version), 0) AS n FROM berth_schema_migrations")
        }
    }
}

#[test]
fn version_2_databases_gain_metadata_rows_for_filtering() {
    // SQLite only: Postgres databases start at the current schema, with no rows to fill.
    let db = TestDb::sqlite();
    drop(db.at_version(2));
    db.execute("INSERT INTO teams (id, name, is_default, created_at_ms) VALUES ('t', 't', 1, 0)");
    for (id, metadata) in [
        ("i1", r#"{"app":"web","env":"prod"}"#),
        ("i2", r#"{"app":"db"}"#),
        ("i3", "{broken"),
    ] {
        db.execute(&format!(
            "INSERT INTO sandboxes (id, team_id, template_id, build_id, cpu_count, memory_mb, \
             disk_size_mb, metadata, envd_version, started_at_ms, end_at_ms, status) \
             VALUES ('{id}', 't', 'base', 'b', 1, 1, 1, '{metadata}', '0.6.4', 1000, 2000, \
             'running')"
        ));
    }

    let store = db.open();
    assert_eq!(recorded_version(&db) as usize, VERSION);
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

fn a_fresh_database_is_migrated_once_to_the_newest_schema(db: &TestDb) {
    drop(db.open());
    drop(db.open());
    assert_eq!(recorded_version(db) as usize, VERSION);
    if db.backend() == Backend::Postgres {
        let steps = db.count("SELECT COUNT(*) AS n FROM berth_schema_migrations");
        assert_eq!(steps as usize, VERSION, "one row per step");
    }
}

fn a_database_from_a_newer_berth_is_refused(db: &TestDb) {
    drop(db.at_version(VERSION));
    match db.backend() {
        Backend::Sqlite => {
            db.execute(&format!("PRAGMA user_version = {}", VERSION + 1));
        }
        Backend::Postgres => {
            db.execute(&format!(
                "INSERT INTO berth_schema_migrations (version, applied_at_ms) VALUES ({}, 0)",
                VERSION + 1
            ));
        }
    }
    let err = Store::connect(&db.config())
        .err()
        .expect("opened a newer schema");
    assert!(
        matches!(err, StoreError::NewerSchema { found, known } if found == VERSION as i64 + 1 && known == VERSION),
        "{err}"
    );
}

fn a_failed_migration_is_rolled_back_and_named(db: &TestDb) {
    // Migration 11 (webhook delivery history) adds several columns.
    const HISTORY: usize = 11;
    drop(db.at_version(HISTORY - 1));
    // The second column it adds already exists: it cannot apply.
    db.execute("ALTER TABLE webhook_deliveries ADD COLUMN response_code BIGINT");
    let err = Store::connect(&db.config())
        .err()
        .expect("migration applied twice");
    assert!(
        matches!(err, StoreError::Migration { version, .. } if version == HISTORY),
        "{err}"
    );
    assert_eq!(recorded_version(db) as usize, HISTORY - 1);
    let first_change = match db.backend() {
        Backend::Sqlite => db.count(
            "SELECT COUNT(*) AS n FROM pragma_table_info('webhook_deliveries') \
             WHERE name = 'status'",
        ),
        Backend::Postgres => db.count(
            "SELECT COUNT(*) AS n FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = 'webhook_deliveries' \
             AND column_name = 'status'",
        ),
    };
    assert_eq!(first_change, 0, "the failed migration changed nothing");
}

fn paused_rows_from_before_pause_times_take_their_last_paused_event(db: &TestDb) {
    drop(db.at_version(9));
    db.execute(
        "INSERT INTO teams (id, name, is_default, created_at_ms) VALUES ('t', 't', TRUE, 0)",
    );
    for id in ["i1", "i2"] {
        db.execute(&format!(
            "INSERT INTO sandboxes (id, team_id, template_id, build_id, cpu_count, memory_mb, \
             disk_size_mb, metadata, envd_version, started_at_ms, end_at_ms, status) \
             VALUES ('{id}', 't', 'base', 'b', 1, 1, 1, '{{}}', '0.6.4', 1000, 2000, 'paused')"
        ));
    }
    db.execute(
        "INSERT INTO events (id, team_id, sandbox_id, template_id, build_id, event_type, \
         timestamp_ms) VALUES ('e1', 't', 'i1', 'base', 'b', 'sandbox.lifecycle.paused', 5000)",
    );
    let store = db.open();
    let paused = store.paused_sandboxes_by_age().unwrap();
    assert_eq!(paused[0].id, "i2");
    assert_eq!(paused[0].paused_at, at(1000), "no event: the start");
    assert_eq!(paused[1].paused_at, at(5000));
}

/// Text orders by bytes on Postgres as on SQLite only where the column says so: every
/// text column of every step carries `COLLATE "C"`.
fn every_postgres_text_column_orders_by_bytes(db: &TestDb) {
    drop(db.open());
    let others = db.count(
        "SELECT COUNT(*) AS n FROM information_schema.columns \
         WHERE table_schema = current_schema() AND data_type = 'text' \
         AND coalesce(collation_name, '') <> 'C'",
    );
    assert_eq!(others, 0, "text columns without COLLATE \"C\"");
    // What the columns' collation changes: this database's own (the test cluster's
    // default, ICU en-US) puts 'a' before 'B'.
    let natural = db.count("SELECT CAST(CASE WHEN 'a' < 'B' THEN 1 ELSE 0 END AS BIGINT) AS n");
    assert_eq!(
        natural, 1,
        "the test database's default collation is byte order"
    );
    let store = db.open();
    let team = store.create_team("t").unwrap();
    // Byte order puts upper case before lower case and '-' before digits; a
    // natural-language collation would not.
    for id in ["b", "B", "a-1", "a1", "A"] {
        store.insert_sandbox(&sandbox(&team.id, id, 1_000)).unwrap();
    }
    let filter = SandboxFilter {
        ascending: true,
        ..Default::default()
    };
    let page = store.list_sandboxes(&team.id, &filter, 10, None).unwrap();
    assert_eq!(ids(&page.sandboxes), ["A", "B", "a-1", "a1", "b"]);
}

/// Several processes starting at once on one fresh database: one migrates, the others
/// wait for it and find the schema current.
fn concurrent_starts_migrate_once(db: &TestDb) {
    let config = db.config();
    let started: Vec<_> = (0..4)
        .map(|_| {
            let config = config.clone();
            std::thread::spawn(move || Store::connect(&config).map(drop))
        })
        .collect();
    for start in started {
        start.join().unwrap().unwrap();
    }
    let steps = db.count("SELECT COUNT(*) AS n FROM berth_schema_migrations");
    assert_eq!(steps as usize, VERSION);
}

on_both_backends!(
    a_fresh_database_is_migrated_once_to_the_newest_schema,
    a_database_from_a_newer_berth_is_refused,
    a_failed_migration_is_rolled_back_and_named,
    paused_rows_from_before_pause_times_take_their_last_paused_event,
);

on_postgres!(
    every_postgres_text_column_orders_by_bytes,
    concurrent_starts_migrate_once,
);
