use super::*;

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    (dir, store)
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
        started_at: from_ms(started_ms),
        end_at: from_ms(started_ms + 60_000),
        status: SandboxStatus::Running,
        env_vars: Default::default(),
        timeout_secs: 300,
        lifecycle: Default::default(),
    }
}

#[test]
fn first_team_is_default_and_names_are_unique() {
    let (_dir, store) = open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    assert!(a.is_default);
    assert!(!b.is_default);
    assert!(matches!(
        store.create_team("a"),
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.default_team().unwrap().unwrap(), a);
}

#[test]
fn keys_authenticate_by_hash_only_and_revoke() {
    let (dir, store) = open();
    let team = store.create_team("t").unwrap();
    let (record, raw) = store.create_api_key(&team.id, "k").unwrap();
    let (found_team, found_key) = store.authenticate(&raw).unwrap().unwrap();
    assert_eq!(found_team.id, team.id);
    assert_eq!(found_key.id, record.id);
    assert!(found_key.last_used.is_some());
    assert!(store.authenticate("e2b_00").unwrap().is_none());

    // The raw key is nowhere in the database file.
    drop(store);
    let bytes = std::fs::read(dir.path().join(DATABASE_FILE)).unwrap();
    let wal = std::fs::read(dir.path().join("berth.db-wal")).unwrap_or_default();
    let needle = raw.as_bytes();
    for haystack in [&bytes, &wal] {
        assert!(!haystack.windows(needle.len()).any(|w| w == needle));
    }
    let store = Store::open(dir.path()).unwrap();
    store.revoke_api_key(&record.id).unwrap();
    assert!(store.authenticate(&raw).unwrap().is_none());
}

#[test]
fn deleting_another_teams_key_is_not_found() {
    let (_dir, store) = open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    let (key, raw) = store.create_api_key(&a.id, "k").unwrap();
    assert!(matches!(
        store.delete_api_key(&b.id, &key.id),
        Err(StoreError::NotFound(_))
    ));
    assert!(store.authenticate(&raw).unwrap().is_some());
}

#[test]
fn sandboxes_are_scoped_filtered_and_paged() {
    let (_dir, store) = open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    for i in 0..5 {
        store
            .insert_sandbox(&sandbox(&a.id, &format!("ia{i}"), 1_000 + i))
            .unwrap();
    }
    store.insert_sandbox(&sandbox(&b.id, "ib0", 1_000)).unwrap();
    assert!(store.running_sandbox(&b.id, "ia0").unwrap().is_none());
    assert!(store.running_sandbox(&a.id, "ia0").unwrap().is_some());

    let filter = SandboxFilter::default();
    let first = store.list_sandboxes(&a.id, &filter, 2, None).unwrap();
    assert_eq!(first.total, 5);
    let ids: Vec<_> = first.sandboxes.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["ia4", "ia3"]);
    let token = first.next_token.unwrap();
    let second = store
        .list_sandboxes(&a.id, &filter, 2, Some(&token))
        .unwrap();
    let ids: Vec<_> = second.sandboxes.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["ia2", "ia1"]);
    let third = store
        .list_sandboxes(&a.id, &filter, 2, second.next_token.as_deref())
        .unwrap();
    assert_eq!(third.sandboxes.len(), 1);
    assert!(third.next_token.is_none());

    let by_meta = SandboxFilter {
        metadata: vec![("user".into(), "bob".into())],
        ..Default::default()
    };
    assert_eq!(
        store
            .list_sandboxes(&a.id, &by_meta, 10, None)
            .unwrap()
            .total,
        0
    );

    assert!(store.mark_killed("ia0").unwrap());
    assert!(!store.mark_killed("ia0").unwrap());
    assert_eq!(
        store
            .list_sandboxes(&a.id, &filter, 10, None)
            .unwrap()
            .total,
        4
    );
    assert!(store.sandbox(&a.id, "ia0").unwrap().is_some());
}

#[test]
fn events_page_filter_and_queue_deliveries() {
    let (_dir, store) = open();
    let team = store.create_team("t").unwrap();
    store
        .create_webhook(&WebhookRecord {
            id: "w1".into(),
            team_id: team.id.clone(),
            name: "hook".into(),
            url: "http://127.0.0.1:9/".into(),
            enabled: true,
            events: vec!["sandbox.lifecycle.killed".into()],
            secret: "s".into(),
            created_at: now(),
        })
        .unwrap();
    for (i, kind) in ["created", "updated", "killed"].iter().enumerate() {
        let event = EventRecord {
            id: format!("e{i}"),
            team_id: team.id.clone(),
            sandbox_id: "i1".into(),
            template_id: "base".into(),
            build_id: "b".into(),
            event_type: format!("sandbox.lifecycle.{kind}"),
            data: None,
            timestamp: now(),
        };
        store.record_event(&event, |e| e.id.clone()).unwrap();
    }
    let newest = store.events(&team.id, None, &[], false, 0, 10).unwrap();
    let ids: Vec<_> = newest.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["e2", "e1", "e0"]);
    let oldest = store.events(&team.id, Some("i1"), &[], true, 1, 1).unwrap();
    assert_eq!(oldest[0].id, "e1");
    let killed = store
        .events(
            &team.id,
            None,
            &["sandbox.lifecycle.killed".into()],
            true,
            0,
            10,
        )
        .unwrap();
    assert_eq!(killed.len(), 1);
    assert!(store
        .events("other", None, &[], true, 0, 10)
        .unwrap()
        .is_empty());

    let due = store.due_deliveries(now(), 10).unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].body, "e2");
    store
        .retry_delivery(due[0].id, now() + time::Duration::hours(1))
        .unwrap();
    assert!(store.due_deliveries(now(), 10).unwrap().is_empty());
    store.finish_delivery(due[0].id).unwrap();
    assert!(store.next_delivery_at().unwrap().is_none());
}

#[test]
fn logs_filter_by_level_search_and_direction() {
    let (_dir, store) = open();
    store
        .append_log("i1", berth_api::LogLevel::Debug, "booting")
        .unwrap();
    store
        .append_log("i1", berth_api::LogLevel::Info, "envd ready")
        .unwrap();
    store
        .append_log("i1", berth_api::LogLevel::Error, "envd died")
        .unwrap();
    let info = store
        .logs("i1", None, true, berth_api::LogLevel::Info, None, 10)
        .unwrap();
    assert_eq!(info.len(), 2);
    let backward = store
        .logs(
            "i1",
            None,
            false,
            berth_api::LogLevel::Debug,
            Some("envd"),
            1,
        )
        .unwrap();
    assert_eq!(backward[0].message, "envd died");
}

#[test]
fn second_open_sees_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap();
    let team = first.create_team("t").unwrap();
    let second = Store::open(dir.path()).unwrap();
    let (_, raw) = second.create_api_key(&team.id, "from the CLI").unwrap();
    assert!(first.authenticate(&raw).unwrap().is_some());
}

#[test]
fn idempotency_keys_are_remembered_and_expire() {
    let (_dir, store) = open();
    store.remember_idempotency_key("t", "k", "i1").unwrap();
    assert_eq!(
        store.idempotent_sandbox("t", "k").unwrap().as_deref(),
        Some("i1")
    );
    assert!(store.idempotent_sandbox("other", "k").unwrap().is_none());
    assert_eq!(
        store
            .forget_idempotency_keys(now() - time::Duration::hours(1))
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .forget_idempotency_keys(now() + time::Duration::seconds(1))
            .unwrap(),
        1
    );
    assert!(store.idempotent_sandbox("t", "k").unwrap().is_none());
}

#[test]
fn pause_and_resume_move_between_live_states_once() {
    let (_dir, store) = open();
    let team = store.create_team("a").unwrap();
    let mut record = sandbox(&team.id, "ip0", 1_000);
    record.env_vars = [("K".to_string(), "V".to_string())].into();
    record.lifecycle = Lifecycle {
        auto_pause: true,
        auto_pause_memory: false,
        auto_resume: false,
    };
    store.insert_sandbox(&record).unwrap();
    assert!(store.mark_paused("ip0", false).unwrap());
    assert!(!store.mark_paused("ip0", true).unwrap(), "already paused");
    let paused = store.live_sandbox(&team.id, "ip0").unwrap().unwrap();
    assert_eq!(paused.status, SandboxStatus::Paused { memory: false });
    assert_eq!(paused.env_vars.get("K").map(String::as_str), Some("V"));
    assert_eq!(paused.lifecycle, record.lifecycle);
    assert!(store.running_sandbox(&team.id, "ip0").unwrap().is_none());
    assert!(
        store
            .expired_sandboxes(from_ms(i64::MAX / 2))
            .unwrap()
            .is_empty(),
        "paused never expires"
    );
    let running_only = SandboxFilter::default();
    assert!(store
        .list_sandboxes(&team.id, &running_only, 10, None)
        .unwrap()
        .sandboxes
        .is_empty());
    let both = SandboxFilter {
        states: StateFilter {
            running: true,
            paused: true,
        },
        ..Default::default()
    };
    let page = store.list_sandboxes(&team.id, &both, 10, None).unwrap();
    assert_eq!(page.sandboxes.len(), 1);
    assert_eq!(page.total, 0, "the total counts running sandboxes only");

    assert!(store.mark_resumed("ip0", from_ms(5_000)).unwrap());
    assert!(
        !store.mark_resumed("ip0", from_ms(5_000)).unwrap(),
        "already running"
    );
    assert_eq!(
        store
            .running_sandbox(&team.id, "ip0")
            .unwrap()
            .unwrap()
            .end_at,
        from_ms(5_000)
    );
    assert!(store.mark_paused("ip0", true).unwrap());
    assert!(
        store.mark_killed("ip0").unwrap(),
        "a paused sandbox can be killed"
    );
    assert!(store.live_sandbox(&team.id, "ip0").unwrap().is_none());
}

#[test]
fn snapshots_are_per_team_replaced_by_name_and_paged() {
    let (_dir, store) = open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    let snapshot = |id: &str, team: &str, name: &str, at: i64| SnapshotRecord {
        id: id.into(),
        team_id: team.into(),
        name: name.into(),
        source_sandbox_id: "isrc".into(),
        template_id: "base".into(),
        build_id: "b1".into(),
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 1024,
        env_vars: Default::default(),
        envd_access_token: Some("tok".into()),
        path: format!("/ckpt/{id}"),
        size_bytes: 42,
        created_at: from_ms(at),
        memory: true,
    };
    assert_eq!(
        store
            .put_snapshot(&snapshot("s1", &a.id, "one", 1))
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .put_snapshot(&snapshot("s2", &a.id, "two", 2))
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .put_snapshot(&snapshot("s3", &a.id, "one", 3))
            .unwrap(),
        Some("/ckpt/s1".to_string()),
        "same name replaces, handing back the old checkpoint"
    );
    store
        .put_snapshot(&snapshot("s4", &b.id, "one", 4))
        .unwrap();
    assert_eq!(store.snapshot(&a.id, "one").unwrap().unwrap().id, "s3");
    assert_eq!(store.snapshot(&a.id, "s2").unwrap().unwrap().name, "two");
    assert!(
        store.snapshot(&b.id, "two").unwrap().is_none(),
        "other team's"
    );
    let (first, next) = store.list_snapshots(&a.id, None, None, 1, None).unwrap();
    assert_eq!(first[0].id, "s3");
    let (second, next) = store
        .list_snapshots(&a.id, None, None, 1, next.as_deref())
        .unwrap();
    assert_eq!(second[0].id, "s2");
    assert!(next.is_none());
    assert_eq!(
        store
            .list_snapshots(&a.id, Some("other"), None, 10, None)
            .unwrap()
            .0
            .len(),
        0
    );
    assert_eq!(
        store.delete_snapshot(&a.id, "one").unwrap().path,
        "/ckpt/s3"
    );
    assert!(matches!(
        store.delete_snapshot(&a.id, "one"),
        Err(StoreError::NotFound(_))
    ));
    let mut paths = store.snapshot_paths().unwrap();
    paths.sort();
    assert_eq!(paths, ["/ckpt/s2", "/ckpt/s4"]);
}
