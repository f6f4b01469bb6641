//! Multi-statement writes racing from several stores on one database (as several berth
//! processes would): each is one transaction that behaves as if it ran alone.

use std::sync::{Arc, Barrier};

use super::*;

/// Runs `work(i)` for `i` in `0..n` on `n` threads, each with a store of its own, all
/// released at once; returns their results in order.
fn race<T: Send + 'static>(
    db: &TestDb,
    n: usize,
    work: impl Fn(&Store, usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let config = db.config();
    let work = Arc::new(work);
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (config, work, barrier) = (config.clone(), work.clone(), barrier.clone());
            std::thread::spawn(move || {
                let store = Store::connect(&config).unwrap();
                barrier.wait();
                work(&store, i)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn racing_first_teams_make_exactly_one_default(db: &TestDb) {
    drop(db.open());
    let teams = race(db, 6, |store, i| {
        store.create_team(&format!("t{i}")).unwrap()
    });
    assert_eq!(teams.iter().filter(|team| team.is_default).count(), 1);
    // Racing for one name: one wins, the others are told it exists.
    let outcomes = race(db, 4, |store, _| store.create_team("same"));
    assert_eq!(outcomes.iter().filter(|made| made.is_ok()).count(), 1);
    assert!(outcomes
        .iter()
        .filter_map(|made| made.as_ref().err())
        .all(|err| matches!(err, StoreError::TeamExists { .. })));
}

fn racing_secret_updates_get_consecutive_versions(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    let sealed = |version: i64| SealedVersion {
        kek_version: 1,
        wrapped_key: vec![1, 2, 3],
        ciphertext: version.to_be_bytes().to_vec(),
    };
    let id = Store::new_secret_id();
    store
        .insert_secret(&id, &team.id, "token", &Default::default(), &sealed(1))
        .unwrap();
    let team_id = team.id.clone();
    let versions = race(db, 6, move |store, _| {
        store
            .add_secret_version(&team_id, "token", None, |_, version| Ok(sealed(version)))
            .unwrap()
            .current_version
    });
    let mut versions = versions;
    versions.sort_unstable();
    assert_eq!(versions, (2..=7).collect::<Vec<_>>());
    let stored = store.all_secret_versions().unwrap();
    assert_eq!(stored.len(), 7);
    for (_, version, sealed_value) in stored {
        // Each version holds what was sealed for it (a retried attempt resealed).
        assert_eq!(sealed_value.ciphertext, version.to_be_bytes().to_vec());
    }
}

fn racing_snapshots_of_one_name_leave_one(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    let team_id = team.id.clone();
    let replaced = race(db, 5, move |store, i| {
        let id = format!("s{i}");
        store
            .put_snapshot(&SnapshotRecord {
                id: id.clone(),
                team_id: team_id.clone(),
                name: "nightly".into(),
                source_sandbox_id: "i1".into(),
                template_id: "base".into(),
                build_id: "b".into(),
                cpu_count: 1,
                memory_mb: 1,
                disk_size_mb: 1,
                env_vars: Default::default(),
                envd_access_token: None,
                checkpoint_id: id,
                size_bytes: 1,
                created_at: at(1_000),
                memory: true,
                network: None,
                volume_mounts: Vec::new(),
            })
            .unwrap()
    });
    let (listed, _) = store
        .list_snapshots(&team.id, None, None, 10, None)
        .unwrap();
    assert_eq!(listed.len(), 1);
    // Every put but the first replaced one other: each checkpoint is handed back once
    // (to be deleted), except the one that stays.
    let mut handed_back: Vec<String> = replaced.into_iter().flatten().collect();
    handed_back.push(listed[0].checkpoint_id.clone());
    handed_back.sort();
    assert_eq!(handed_back, ["s0", "s1", "s2", "s3", "s4"]);
}

fn racing_api_instances_each_lose_a_lapsed_node_once(db: &TestDb) {
    let store = db.open();
    for id in ["n1", "n2", "n3"] {
        let node = NodeRegistration {
            id: id.into(),
            url: format!("http://{id}:3100"),
            cpu_capacity: 2,
            memory_capacity_mb: 1024,
            slots: 10,
        };
        store
            .register_node(&node, std::time::Duration::ZERO)
            .unwrap();
    }
    let later = now() + time::Duration::seconds(1);
    let lost = race(db, 6, move |store, _| {
        store.mark_lapsed_nodes_lost(later).unwrap()
    });
    let mut lost: Vec<String> = lost.into_iter().flatten().collect();
    lost.sort();
    assert_eq!(lost, ["n1", "n2", "n3"]);
}

/// The server calls the store from async tasks, on multi- and current-thread
/// runtimes, and drops it there.
fn store_calls_work_inside_an_async_runtime(db: &TestDb) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let config = db.config();
    runtime.block_on(async move {
        let store = Store::connect(&config).unwrap();
        let team = store.create_team("t").unwrap();
        let spawned = tokio::spawn(async move {
            store.insert_sandbox(&sandbox(&team.id, "i1", 1)).unwrap();
            store.running_sandbox(&team.id, "i1").unwrap().is_some()
        });
        assert!(spawned.await.unwrap());
    });
}

on_both_backends!(
    racing_first_teams_make_exactly_one_default,
    racing_secret_updates_get_consecutive_versions,
    racing_snapshots_of_one_name_leave_one,
    racing_api_instances_each_lose_a_lapsed_node_once,
    store_calls_work_inside_an_async_runtime,
);
