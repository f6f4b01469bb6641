use super::*;

fn volume_names_are_unique_per_team_and_tokens_unique(db: &TestDb) {
    let store = db.open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    let first = store.insert_volume(&a.id, "data").unwrap();
    assert!(first.token.starts_with("vol_"));
    assert!(matches!(
        store.insert_volume(&a.id, "data"),
        Err(StoreError::NameTaken { .. })
    ));
    let other = store.insert_volume(&b.id, "data").unwrap();
    assert_ne!(first.token, other.token);
    assert_eq!(store.volume(&a.id, &first.id).unwrap(), Some(first.clone()));
    assert_eq!(store.volume(&b.id, &first.id).unwrap(), None);
    assert_eq!(
        store.volume_by_name(&a.id, "data").unwrap(),
        Some(first.clone())
    );
    assert_eq!(store.volume_any_team(&other.id).unwrap(), Some(other));
    assert_eq!(store.list_volumes(&a.id).unwrap(), vec![first]);
}

fn a_volume_mounted_by_a_live_sandbox_is_not_deleted(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    let volume = store.insert_volume(&team.id, "data").unwrap();
    let mut record = sandbox(&team.id, "i1", 1);
    record.volume_mounts = vec![VolumeMountRecord {
        volume_id: volume.id.clone(),
        name: "data".into(),
        path: "/mnt/data".into(),
    }];
    store.insert_sandbox(&record).unwrap();
    assert_eq!(
        store
            .sandbox(&team.id, "i1")
            .unwrap()
            .unwrap()
            .volume_mounts,
        record.volume_mounts
    );
    assert_eq!(store.sandboxes_mounting(&volume.id).unwrap(), vec!["i1"]);
    match store.delete_volume(&team.id, &volume.id) {
        Err(StoreError::InUse { users, .. }) => assert_eq!(users, vec!["i1"]),
        other => panic!("{other:?}"),
    }
    store.mark_paused("i1", true).unwrap();
    assert!(store.delete_volume(&team.id, &volume.id).is_err());
    store.mark_killed("i1").unwrap();
    assert!(store.sandboxes_mounting(&volume.id).unwrap().is_empty());
    assert_eq!(
        store.delete_volume(&team.id, &volume.id).unwrap().id,
        volume.id
    );
    assert!(matches!(
        store.delete_volume(&team.id, &volume.id),
        Err(StoreError::NotFound { .. })
    ));
}

on_both_backends!(
    volume_names_are_unique_per_team_and_tokens_unique,
    a_volume_mounted_by_a_live_sandbox_is_not_deleted,
);
