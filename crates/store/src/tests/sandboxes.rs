use super::*;
use crate::cursor::{self, Listing, Position};

/// Every page of a listing, following cursors to the end.
fn all_pages(store: &Store, team: &str, filter: &SandboxFilter, limit: usize) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut token = None;
    loop {
        let page = store
            .list_sandboxes(team, filter, limit, token.as_deref())
            .unwrap();
        assert!(page.sandboxes.len() <= limit);
        pages.push(page.sandboxes.iter().map(|s| s.id.clone()).collect());
        match page.next_token {
            Some(next) => token = Some(next),
            None => return pages,
        }
    }
}

fn with_metadata(mut record: SandboxRecord, pairs: &[(&str, &str)]) -> SandboxRecord {
    record.metadata = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    record
}

fn sandboxes_are_scoped_filtered_and_paged(db: &TestDb) {
    let store = db.open();
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
    assert_eq!(ids(&first.sandboxes), ["ia4", "ia3"]);
    let token = first.next_token.unwrap();
    let second = store
        .list_sandboxes(&a.id, &filter, 2, Some(&token))
        .unwrap();
    assert_eq!(ids(&second.sandboxes), ["ia2", "ia1"]);
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

fn ties_in_start_time_are_ordered_by_id_in_both_directions(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    // Inserted out of id order, all started in the same millisecond.
    for id in ["ic", "ia", "ie", "ib", "id"] {
        store.insert_sandbox(&sandbox(&team.id, id, 7_000)).unwrap();
    }
    store
        .insert_sandbox(&sandbox(&team.id, "iz", 6_000))
        .unwrap();
    let newest_first = all_pages(&store, &team.id, &SandboxFilter::default(), 2);
    assert_eq!(
        newest_first,
        [vec!["ie", "id"], vec!["ic", "ib"], vec!["ia", "iz"]]
    );
    let oldest_first = SandboxFilter {
        ascending: true,
        ..Default::default()
    };
    assert_eq!(
        all_pages(&store, &team.id, &oldest_first, 4),
        [vec!["iz", "ia", "ib", "ic"], vec!["id", "ie"]]
    );
}

fn a_cursor_after_the_last_row_gives_an_empty_last_page(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    for i in 0..3 {
        store
            .insert_sandbox(&sandbox(&team.id, &format!("i{i}"), 1_000 + i))
            .unwrap();
    }
    let filter = SandboxFilter::default();
    // Exactly `limit` rows left: no cursor is handed out for an empty page.
    let page = store.list_sandboxes(&team.id, &filter, 3, None).unwrap();
    assert_eq!(page.sandboxes.len(), 3);
    assert!(page.next_token.is_none());

    let last = Position {
        ms: 1_000,
        id: "i0".into(),
    };
    let after_last = cursor::encode(Listing::Sandboxes { ascending: false }, &last);
    let page = store
        .list_sandboxes(&team.id, &filter, 3, Some(&after_last))
        .unwrap();
    assert!(page.sandboxes.is_empty());
    assert!(page.next_token.is_none());
    assert_eq!(page.total, 3, "the total ignores the cursor");

    // A cursor whose row has since been killed still marks its place.
    let first = store.list_sandboxes(&team.id, &filter, 2, None).unwrap();
    assert!(store.mark_killed("i1").unwrap());
    let rest = store
        .list_sandboxes(&team.id, &filter, 2, first.next_token.as_deref())
        .unwrap();
    assert_eq!(ids(&rest.sandboxes), ["i0"]);
    assert!(rest.next_token.is_none());
}

fn rows_inserted_between_pages_are_neither_duplicated_nor_skipped(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    for i in 1..=6 {
        store
            .insert_sandbox(&sandbox(&team.id, &format!("i{i}"), i * 1_000))
            .unwrap();
    }
    let filter = SandboxFilter::default();
    let first = store.list_sandboxes(&team.id, &filter, 2, None).unwrap();
    assert_eq!(ids(&first.sandboxes), ["i6", "i5"]);

    // One newer than everything (before the cursor: an offset would shift and repeat
    // i5) and one inside the unread range (must show up where it sorts).
    store
        .insert_sandbox(&sandbox(&team.id, "inew", 10_000))
        .unwrap();
    store
        .insert_sandbox(&sandbox(&team.id, "imid", 3_500))
        .unwrap();

    let mut seen = ids(&first.sandboxes)
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    let mut token = first.next_token;
    while let Some(current) = token {
        let page = store
            .list_sandboxes(&team.id, &filter, 2, Some(&current))
            .unwrap();
        seen.extend(page.sandboxes.iter().map(|s| s.id.clone()));
        token = page.next_token;
    }
    assert_eq!(seen, ["i6", "i5", "i4", "imid", "i3", "i2", "i1"]);
}

fn metadata_filters_need_every_pair_exactly(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    let rows = [
        ("i1", vec![("app", "web"), ("env", "prod")]),
        ("i2", vec![("app", "web"), ("env", "dev")]),
        ("i3", vec![("app", "db"), ("env", "prod")]),
        ("i4", vec![("weird.key\"'", "a=b&c"), ("app", "web")]),
        ("i5", vec![]),
    ];
    for (n, (id, pairs)) in rows.iter().enumerate() {
        let record = with_metadata(sandbox(&team.id, id, 1_000 + n as i64), pairs);
        store.insert_sandbox(&record).unwrap();
    }
    let matching = |pairs: &[(&str, &str)]| {
        let filter = SandboxFilter {
            metadata: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ascending: true,
            ..Default::default()
        };
        let page = store.list_sandboxes(&team.id, &filter, 100, None).unwrap();
        assert_eq!(page.total as usize, page.sandboxes.len());
        page.sandboxes
            .iter()
            .map(|s| s.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(matching(&[("app", "web")]), ["i1", "i2", "i4"]);
    assert_eq!(matching(&[("app", "web"), ("env", "prod")]), ["i1"]);
    assert_eq!(matching(&[("env", "prod"), ("app", "web")]), ["i1"]);
    assert_eq!(matching(&[("weird.key\"'", "a=b&c")]), ["i4"]);
    assert!(
        matching(&[("app", "WEB")]).is_empty(),
        "values match exactly"
    );
    assert!(matching(&[("ap", "web")]).is_empty(), "keys match exactly");
    assert!(matching(&[("app", "web"), ("app", "db")]).is_empty());
    assert_eq!(matching(&[]).len(), 5);
    // The metadata itself reads back from the record.
    let i4 = store.sandbox(&team.id, "i4").unwrap().unwrap();
    assert_eq!(
        i4.metadata.get("weird.key\"'").map(String::as_str),
        Some("a=b&c")
    );
}

fn filters_and_paging_combine(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    let other = store.create_team("o").unwrap();
    for i in 0..10i64 {
        let mut record = with_metadata(
            sandbox(&team.id, &format!("i{i}"), 1_000 * (i + 1)),
            &[("tag", if i % 2 == 0 { "even" } else { "odd" })],
        );
        if i >= 8 {
            record.template_id = "other".into();
            record.alias = None;
        }
        store.insert_sandbox(&record).unwrap();
        store
            .insert_sandbox(&with_metadata(
                sandbox(&other.id, &format!("o{i}"), 1_000 * (i + 1)),
                &[("tag", "even")],
            ))
            .unwrap();
    }
    assert!(store.mark_paused("i4", true).unwrap());
    assert!(store.mark_killed("i6").unwrap());

    let even = SandboxFilter {
        metadata: vec![("tag".into(), "even".into())],
        template: Some("base".into()),
        started_after: Some(at(2_000)),
        ascending: false,
        states: StateFilter {
            running: true,
            paused: true,
        },
    };
    // Even ids, base template (not i8), started at or after 2 s (not i0), live (not i6).
    assert_eq!(all_pages(&store, &team.id, &even, 1), [["i4"], ["i2"]]);
    let first = store.list_sandboxes(&team.id, &even, 1, None).unwrap();
    assert_eq!(first.total, 1, "i2 runs; i4 is paused");

    let paused_only = SandboxFilter {
        states: StateFilter {
            running: false,
            paused: true,
        },
        ..even.clone()
    };
    let page = store
        .list_sandboxes(&team.id, &paused_only, 10, None)
        .unwrap();
    assert_eq!(ids(&page.sandboxes), ["i4"]);
    assert_eq!(page.total, 0);

    let by_alias = SandboxFilter {
        template: Some("other".into()),
        ascending: true,
        ..Default::default()
    };
    assert_eq!(all_pages(&store, &team.id, &by_alias, 5), [["i8", "i9"]]);

    let nothing = SandboxFilter {
        states: StateFilter {
            running: false,
            paused: false,
        },
        ..Default::default()
    };
    let page = store.list_sandboxes(&team.id, &nothing, 10, None).unwrap();
    assert!(page.sandboxes.is_empty() && page.next_token.is_none() && page.total == 0);
}

fn bad_cursors_are_typed_errors(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    for i in 0..3 {
        store
            .insert_sandbox(&sandbox(&team.id, &format!("i{i}"), 1_000 + i))
            .unwrap();
    }
    let newest_first = SandboxFilter::default();
    let token = store
        .list_sandboxes(&team.id, &newest_first, 1, None)
        .unwrap()
        .next_token
        .unwrap();
    let oldest_first = SandboxFilter {
        ascending: true,
        ..Default::default()
    };
    let snapshot_cursor = cursor::encode(
        Listing::Snapshots,
        &Position {
            ms: 1,
            id: "s".into(),
        },
    );
    for (filter, bad) in [
        (&newest_first, "\0garbage"),
        (&newest_first, "i1"),
        (&newest_first, ""),
        (&newest_first, snapshot_cursor.as_str()),
        (&oldest_first, token.as_str()),
    ] {
        let result = store.list_sandboxes(&team.id, filter, 1, Some(bad));
        assert!(
            matches!(result, Err(StoreError::InvalidCursor { .. })),
            "{bad:?} was accepted"
        );
    }
    // An empty state filter still checks the cursor.
    let nothing = SandboxFilter {
        states: StateFilter {
            running: false,
            paused: false,
        },
        ..Default::default()
    };
    assert!(matches!(
        store.list_sandboxes(&team.id, &nothing, 1, Some("\0")),
        Err(StoreError::InvalidCursor { .. })
    ));
}

/// SQLite's plan for one page of `filter`, after a cursor.
fn page_plan(conn: &rusqlite::Connection, filter: &SandboxFilter) -> String {
    let after = Position {
        ms: 5_000,
        id: "i9".into(),
    };
    let (sql, bindings) =
        crate::sandboxes::page_query("t", filter, filter.states.statuses(), Some(after), 10);
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let rows = stmt
        .query_map(rusqlite::params_from_iter(bindings.params()), |r| {
            r.get::<_, String>(3)
        })
        .unwrap();
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .unwrap()
        .join("\n")
}

#[test]
fn listings_seek_through_the_team_state_start_index() {
    let db = TestDb::sqlite();
    drop(db.open());
    let conn = rusqlite::Connection::open(db.dir().join(DATABASE_FILE)).unwrap();
    // The default listing (running, newest first) reads the index in order: no sort.
    let plan = page_plan(&conn, &SandboxFilter::default());
    assert!(
        plan.contains("INDEX sandboxes_team_status_started"),
        "{plan}"
    );
    assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    // Both states and metadata: still by the index (then a sort of the live rows), the
    // metadata checked by primary key.
    let plan = page_plan(
        &conn,
        &SandboxFilter {
            metadata: vec![("app".into(), "web".into())],
            states: StateFilter {
                running: true,
                paused: true,
            },
            ..Default::default()
        },
    );
    assert!(
        plan.contains("INDEX sandboxes_team_status_started"),
        "{plan}"
    );
    assert!(plan.contains("SEARCH m USING INDEX"), "{plan}");
    assert!(!plan.contains("SCAN sandboxes"), "{plan}");
}

fn idempotency_keys_are_remembered_and_expire(db: &TestDb) {
    let store = db.open();
    store.remember_idempotency_key("t", "k", "i0").unwrap();
    store.remember_idempotency_key("t", "k", "i1").unwrap();
    assert_eq!(
        store.idempotent_sandbox("t", "k").unwrap().as_deref(),
        Some("i1"),
        "the newest create wins"
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

fn pause_and_resume_move_between_live_states_once(db: &TestDb) {
    let store = db.open();
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
    assert_eq!(ids(&store.all_paused_sandboxes().unwrap()), ["ip0"]);
    assert!(
        store
            .expired_sandboxes(at(i64::MAX / 2_000_000))
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

    assert!(store.mark_resumed("ip0", at(5_000), "exec-2").unwrap());
    assert!(
        !store.mark_resumed("ip0", at(5_000), "exec-2").unwrap(),
        "already running"
    );
    let resumed = store.running_sandbox(&team.id, "ip0").unwrap().unwrap();
    assert_eq!(resumed.end_at, at(5_000));
    assert_eq!(
        resumed.execution_id, "exec-2",
        "a resume starts a new execution"
    );
    assert!(store.mark_paused("ip0", true).unwrap());
    assert!(
        store.mark_killed("ip0").unwrap(),
        "a paused sandbox can be killed"
    );
    assert!(store.live_sandbox(&team.id, "ip0").unwrap().is_none());
    assert!(store.live_sandbox_any_team("ip0").unwrap().is_none());
}

fn end_times_drive_expiry_and_kill_keeps_the_earlier_end(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    store
        .insert_sandbox(&sandbox(&team.id, "i1", 1_000))
        .unwrap();
    store
        .insert_sandbox(&sandbox(&team.id, "i2", 2_000))
        .unwrap();
    assert_eq!(store.next_end_at().unwrap(), Some(at(61_000)));
    store.set_end_at(&team.id, "i1", at(90_000)).unwrap();
    assert_eq!(store.next_end_at().unwrap(), Some(at(62_000)));
    assert!(matches!(
        store.set_end_at("other", "i1", at(1)),
        Err(StoreError::NotFound {
            what: "sandbox",
            ..
        })
    ));
    assert_eq!(ids(&store.expired_sandboxes(at(62_000)).unwrap()), ["i2"]);
    assert_eq!(ids(&store.all_running_sandboxes().unwrap()), ["i1", "i2"]);

    // Killed long after its end time passed: the end time stays when it was.
    assert!(store.mark_killed("i2").unwrap());
    assert_eq!(
        store.sandbox(&team.id, "i2").unwrap().unwrap().end_at,
        at(62_000)
    );
    let spans = store
        .team_sandbox_spans(&team.id, at(0), at(100_000))
        .unwrap();
    assert_eq!(spans.len(), 2);
    assert!(spans.contains(&(at(1_000), None)));
    assert!(spans.contains(&(at(2_000), Some(at(62_000)))));
    assert_eq!(store.next_end_at().unwrap(), Some(at(90_000)));
}

fn team_usage_sums_running_sandboxes_and_paused_ones_carry_their_pause_time(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("a").unwrap();
    let other = store.create_team("b").unwrap();
    for (id, team_id) in [("iu1", &team.id), ("iu2", &team.id), ("iu3", &other.id)] {
        store.insert_sandbox(&sandbox(team_id, id, 1_000)).unwrap();
    }
    let mut from_snapshot = sandbox(&team.id, "iu4", 2_000);
    from_snapshot.from_snapshot = Some("s1".into());
    store.insert_sandbox(&from_snapshot).unwrap();
    assert_eq!(
        store.team_usage(&team.id).unwrap(),
        TeamUsage {
            sandboxes: 3,
            cpu_count: 6,
            memory_mb: 1536
        }
    );
    assert_eq!(
        store
            .live_sandbox(&team.id, "iu4")
            .unwrap()
            .unwrap()
            .from_snapshot
            .as_deref(),
        Some("s1")
    );
    assert_eq!(store.snapshots_in_use().unwrap(), ["s1".to_string()].into());

    let before = now();
    assert!(store.mark_paused("iu2", true).unwrap());
    assert!(store.mark_paused("iu4", false).unwrap());
    assert_eq!(store.team_usage(&team.id).unwrap().sandboxes, 1);
    let paused = store.paused_sandboxes_by_age().unwrap();
    assert_eq!(
        paused.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        ["iu2", "iu4"]
    );
    assert!(paused[0].paused_at >= before - time::Duration::milliseconds(1));
    assert_eq!(
        store.snapshots_in_use().unwrap(),
        ["s1".to_string()].into(),
        "a paused sandbox still holds its snapshot"
    );
    assert!(store.mark_resumed("iu2", at(9_000), "exec").unwrap());
    assert_eq!(
        store.paused_sandboxes_by_age().unwrap().len(),
        1,
        "a resume forgets the pause"
    );
    assert!(store.mark_killed("iu4").unwrap());
    assert!(store.snapshots_in_use().unwrap().is_empty());
}

on_both_backends!(
    sandboxes_are_scoped_filtered_and_paged,
    ties_in_start_time_are_ordered_by_id_in_both_directions,
    a_cursor_after_the_last_row_gives_an_empty_last_page,
    rows_inserted_between_pages_are_neither_duplicated_nor_skipped,
    metadata_filters_need_every_pair_exactly,
    filters_and_paging_combine,
    bad_cursors_are_typed_errors,
    idempotency_keys_are_remembered_and_expire,
    pause_and_resume_move_between_live_states_once,
    end_times_drive_expiry_and_kill_keeps_the_earlier_end,
    team_usage_sums_running_sandboxes_and_paused_ones_carry_their_pause_time,
);
