use super::*;

fn snapshot(id: &str, team: &str, name: &str, at_ms: i64) -> SnapshotRecord {
    SnapshotRecord {
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
        checkpoint_id: format!("ckpt-{id}"),
        size_bytes: 42,
        created_at: at(at_ms),
        memory: true,
        network: Some(serde_json::json!({"allowInternetAccess": false})),
        volume_mounts: Vec::new(),
    }
}

fn snapshots_are_per_team_replaced_by_name_and_paged(db: &TestDb) {
    let store = db.open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
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
        Some("ckpt-s1".to_string()),
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
        store.delete_snapshot(&a.id, "one").unwrap().checkpoint_id,
        "ckpt-s3"
    );
    assert!(matches!(
        store.delete_snapshot(&a.id, "one"),
        Err(StoreError::NotFound {
            what: "snapshot",
            ..
        })
    ));
    let mut checkpoints = store.snapshot_checkpoints().unwrap();
    checkpoints.sort();
    assert_eq!(checkpoints, ["ckpt-s2", "ckpt-s4"]);
}

fn snapshot_pages_follow_the_keyset_through_ties_and_inserts(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    for (id, at_ms) in [("sb", 5), ("sa", 5), ("sc", 5), ("sd", 1)] {
        store
            .put_snapshot(&snapshot(id, &team.id, id, at_ms))
            .unwrap();
    }
    let (first, next) = store.list_snapshots(&team.id, None, None, 2, None).unwrap();
    let names: Vec<_> = first.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(names, ["sc", "sb"]);
    // A newer snapshot between pages does not shift the next page.
    store
        .put_snapshot(&snapshot("snew", &team.id, "new", 9))
        .unwrap();
    let (second, next) = store
        .list_snapshots(&team.id, None, None, 2, next.as_deref())
        .unwrap();
    let names: Vec<_> = second.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(names, ["sa", "sd"]);
    assert!(next.is_none());

    let (by_name, next) = store
        .list_snapshots(&team.id, None, Some("sa"), 10, None)
        .unwrap();
    assert_eq!(by_name.len(), 1);
    assert!(next.is_none());
    for bad in ["sa", "\0", "c2FuZGJveGVzLWRlc2M6MTppZA"] {
        assert!(
            matches!(
                store.list_snapshots(&team.id, None, None, 2, Some(bad)),
                Err(StoreError::InvalidCursor { .. })
            ),
            "{bad:?} accepted"
        );
    }
}

fn snapshot_storage_is_per_team_and_can_leave_out_a_name(db: &TestDb) {
    let store = db.open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    store
        .put_snapshot(&snapshot("s1", &a.id, "one", 2))
        .unwrap();
    store
        .put_snapshot(&snapshot("s2", &a.id, "two", 1))
        .unwrap();
    store
        .put_snapshot(&snapshot("s3", &b.id, "one", 3))
        .unwrap();
    assert_eq!(store.snapshot_storage(&a.id, None).unwrap(), 84);
    assert_eq!(store.snapshot_storage(&a.id, Some("one")).unwrap(), 42);
    assert_eq!(store.snapshot_storage("nobody", None).unwrap(), 0);
    let all: Vec<String> = store
        .all_snapshots()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(all, ["s2", "s1", "s3"], "oldest first");
}

on_both_backends!(
    snapshots_are_per_team_replaced_by_name_and_paged,
    snapshot_pages_follow_the_keyset_through_ties_and_inserts,
    snapshot_storage_is_per_team_and_can_leave_out_a_name,
);
