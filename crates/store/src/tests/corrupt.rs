//! A value that does not decode is an error naming table, column and row, never a
//! default. Each test damages one row with raw SQL, as a bad manual edit would.

use super::*;

fn assert_corrupt<T: std::fmt::Debug>(
    result: Result<T>,
    table: &str,
    column: &str,
    row: &str,
    kind: fn(&Corruption) -> bool,
) {
    match result {
        Err(err @ StoreError::CorruptColumn { .. }) => {
            let message = err.to_string();
            let StoreError::CorruptColumn {
                table: t,
                column: c,
                row: r,
                source,
            } = err
            else {
                unreachable!()
            };
            assert_eq!((t, c, r.as_str()), (table, column, row), "{message}");
            assert!(kind(&source), "unexpected corruption: {source:?}");
            assert!(
                message.contains(&format!("{table}.{column}")) && message.contains(row),
                "the message names the place: {message}"
            );
        }
        other => panic!("expected {table}.{column} of {row} to be corrupt, got {other:?}"),
    }
}

fn json(c: &Corruption) -> bool {
    matches!(c, Corruption::Json(_))
}

fn sql_type(c: &Corruption) -> bool {
    matches!(c, Corruption::Type(_))
}

fn unknown(c: &Corruption) -> bool {
    matches!(c, Corruption::UnknownValue { .. })
}

fn time(c: &Corruption) -> bool {
    matches!(c, Corruption::Time { .. })
}

/// A store with one sandbox `ibad` of team `t` next to a healthy `igood`.
fn with_sandboxes(db: &TestDb) -> (Store, Team) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    store
        .insert_sandbox(&sandbox(&team.id, "ibad", 1_000))
        .unwrap();
    store
        .insert_sandbox(&sandbox(&team.id, "igood", 2_000))
        .unwrap();
    (store, team)
}

fn corrupt_sandbox_metadata_is_an_error_not_an_empty_map(db: &TestDb) {
    let (store, team) = with_sandboxes(db);
    db.execute("UPDATE sandboxes SET metadata = '{\"user\": ' WHERE id = 'ibad'");
    assert_corrupt(
        store.running_sandbox(&team.id, "ibad"),
        "sandboxes",
        "metadata",
        "ibad",
        json,
    );
    assert_corrupt(
        store.list_sandboxes(&team.id, &SandboxFilter::default(), 10, None),
        "sandboxes",
        "metadata",
        "ibad",
        json,
    );
    assert_corrupt(
        store.all_running_sandboxes(),
        "sandboxes",
        "metadata",
        "ibad",
        json,
    );
    // Other rows still read.
    assert!(store.running_sandbox(&team.id, "igood").unwrap().is_some());
}

fn metadata_of_the_wrong_json_shape_is_corrupt_too(db: &TestDb) {
    let (store, team) = with_sandboxes(db);
    db.execute("UPDATE sandboxes SET metadata = '[\"user\"]' WHERE id = 'ibad'");
    assert_corrupt(
        store.sandbox(&team.id, "ibad"),
        "sandboxes",
        "metadata",
        "ibad",
        json,
    );
}

fn corrupt_env_vars_status_lifecycle_and_times_are_errors(db: &TestDb) {
    let (store, team) = with_sandboxes(db);
    let damage = |sql: &str| db.execute(sql);

    damage("UPDATE sandboxes SET env_vars = 'K=V' WHERE id = 'ibad'");
    assert_corrupt(
        store.sandbox(&team.id, "ibad"),
        "sandboxes",
        "env_vars",
        "ibad",
        json,
    );
    damage("UPDATE sandboxes SET env_vars = '{}' WHERE id = 'ibad'");

    // Only SQLite stores a word in a flag column; Postgres's BOOLEAN refuses it.
    if db.backend() == Backend::Sqlite {
        damage("UPDATE sandboxes SET auto_pause = 'yes' WHERE id = 'ibad'");
        assert_corrupt(
            store.sandbox(&team.id, "ibad"),
            "sandboxes",
            "auto_pause",
            "ibad",
            sql_type,
        );
        damage("UPDATE sandboxes SET auto_pause = 0 WHERE id = 'ibad'");
    }

    damage("UPDATE sandboxes SET cpu_count = -1 WHERE id = 'ibad'");
    assert_corrupt(
        store.sandbox(&team.id, "ibad"),
        "sandboxes",
        "cpu_count",
        "ibad",
        sql_type,
    );
    damage("UPDATE sandboxes SET cpu_count = 2 WHERE id = 'ibad'");

    damage("UPDATE sandboxes SET started_at_ms = 9000000000000000000 WHERE id = 'ibad'");
    assert_corrupt(
        store.sandbox(&team.id, "ibad"),
        "sandboxes",
        "started_at_ms",
        "ibad",
        time,
    );
    damage("UPDATE sandboxes SET started_at_ms = 1000 WHERE id = 'ibad'");

    // A status this berth does not know is not silently "killed".
    damage("UPDATE sandboxes SET status = 'zombie' WHERE id = 'ibad'");
    assert_corrupt(
        store.sandbox(&team.id, "ibad"),
        "sandboxes",
        "status",
        "ibad",
        unknown,
    );
    let message = store.sandbox(&team.id, "ibad").unwrap_err().to_string();
    assert!(
        message.contains("\"zombie\" is not one of running, paused or killed"),
        "{message}"
    );
}

fn corrupt_snapshot_env_vars_are_an_error(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    store
        .put_snapshot(&SnapshotRecord {
            id: "s1".into(),
            team_id: team.id.clone(),
            name: "one".into(),
            source_sandbox_id: "i1".into(),
            template_id: "base".into(),
            build_id: "b".into(),
            cpu_count: 1,
            memory_mb: 1,
            disk_size_mb: 1,
            env_vars: [("K".to_string(), "V".to_string())].into(),
            envd_access_token: None,
            checkpoint_id: "s1".into(),
            size_bytes: 1,
            created_at: at(1),
            memory: true,
            network: None,
            volume_mounts: Vec::new(),
        })
        .unwrap();
    db.execute("UPDATE snapshots SET env_vars = '{\"K\": 1}' WHERE id = 's1'");
    assert_corrupt(
        store.snapshot(&team.id, "one"),
        "snapshots",
        "env_vars",
        "s1",
        json,
    );
    assert_corrupt(
        store.list_snapshots(&team.id, None, None, 10, None),
        "snapshots",
        "env_vars",
        "s1",
        json,
    );
}

fn corrupt_webhook_events_and_event_data_are_errors(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    let hook = WebhookRecord {
        id: "w1".into(),
        team_id: team.id.clone(),
        name: "h".into(),
        url: "http://127.0.0.1:9/".into(),
        enabled: true,
        events: vec![],
        secret: "s".into(),
        created_at: now(),
    };
    store.create_webhook(&hook).unwrap();
    let event = EventRecord {
        id: "e1".into(),
        team_id: team.id.clone(),
        sandbox_id: "i1".into(),
        template_id: "base".into(),
        build_id: "b".into(),
        event_type: "sandbox.lifecycle.created".into(),
        data: Some(serde_json::json!({"a": 1})),
        timestamp: now(),
        execution_id: "x1".into(),
    };
    store.record_event(&event, |e| e.id.clone()).unwrap();

    db.execute("UPDATE events SET data = '{oops' WHERE id = 'e1'");
    assert_corrupt(
        store.events(&team.id, None, &[], true, 0, 10),
        "events",
        "data",
        "e1",
        json,
    );

    db.execute("UPDATE webhooks SET events = 'all' WHERE id = 'w1'");
    assert_corrupt(store.webhooks(&team.id), "webhooks", "events", "w1", json);
    assert_corrupt(
        store.webhook(&team.id, "w1"),
        "webhooks",
        "events",
        "w1",
        json,
    );
    // Queuing deliveries needs the subscriptions: the event is refused, not sent to all.
    let next = EventRecord {
        id: "e2".into(),
        ..event
    };
    assert_corrupt(
        store.record_event(&next, |e| e.id.clone()),
        "webhooks",
        "events",
        "w1",
        json,
    );
    let recorded = db.count("SELECT COUNT(*) AS n FROM events WHERE id = 'e2'");
    assert_eq!(recorded, 0, "the refused event was rolled back");
}

fn an_unknown_log_level_is_an_error(db: &TestDb) {
    let store = db.open();
    store
        .append_log("i1", berth_api::LogLevel::Info, "hello")
        .unwrap();
    db.execute("UPDATE sandbox_logs SET level = 'loud'");
    assert_corrupt(
        store.logs("i1", None, true, berth_api::LogLevel::Debug, None, 10),
        "sandbox_logs",
        "level",
        "1",
        unknown,
    );
}

fn a_corrupt_metric_names_its_composite_key(db: &TestDb) {
    let store = db.open();
    let sample = MetricSample {
        timestamp_unix: 7,
        cpu_count: 1,
        cpu_used_pct: 0.5,
        mem_used: 1,
        mem_total: 2,
        mem_cache: 0,
        disk_used: 1,
        disk_total: 2,
    };
    store.insert_metric("i1", &sample).unwrap();
    // A value of the wrong type (SQLite) or out of its field's range (Postgres, whose
    // columns refuse wrong types).
    let column = match db.backend() {
        Backend::Sqlite => {
            db.execute("UPDATE sandbox_metrics SET cpu_used_pct = 'high'");
            "cpu_used_pct"
        }
        Backend::Postgres => {
            db.execute("UPDATE sandbox_metrics SET cpu_count = -1");
            "cpu_count"
        }
    };
    assert_corrupt(
        store.latest_metric("i1"),
        "sandbox_metrics",
        column,
        "(i1, 7)",
        sql_type,
    );
}

on_both_backends!(
    corrupt_sandbox_metadata_is_an_error_not_an_empty_map,
    metadata_of_the_wrong_json_shape_is_corrupt_too,
    corrupt_env_vars_status_lifecycle_and_times_are_errors,
    corrupt_snapshot_env_vars_are_an_error,
    corrupt_webhook_events_and_event_data_are_errors,
    an_unknown_log_level_is_an_error,
    a_corrupt_metric_names_its_composite_key,
);
