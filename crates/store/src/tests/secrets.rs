use super::*;

fn sealed(tag: u8) -> SealedVersion {
    SealedVersion {
        kek_version: 1,
        wrapped_key: vec![tag; 4],
        ciphertext: vec![tag; 8],
    }
}

fn secrets_version_by_appending_and_are_found_by_id_or_name(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    let other = store.create_team("o").unwrap();
    let id = Store::new_secret_id();
    assert!(id.starts_with("sec_"));
    let created = store
        .insert_secret(&id, &team.id, "api_key", &Default::default(), &sealed(1))
        .unwrap();
    assert_eq!(created.current_version, 1);
    assert!(matches!(
        store.insert_secret(
            &Store::new_secret_id(),
            &team.id,
            "api_key",
            &Default::default(),
            &sealed(2)
        ),
        Err(StoreError::NameTaken { .. })
    ));
    assert_eq!(
        store.secret(&team.id, "api_key").unwrap(),
        Some(created.clone())
    );
    assert_eq!(store.secret(&team.id, &id).unwrap(), Some(created.clone()));
    assert_eq!(store.secret(&other.id, &id).unwrap(), None);

    let metadata: berth_api::StringMap = [("env".to_string(), "prod".to_string())].into();
    let updated = store
        .add_secret_version(&team.id, "api_key", Some(&metadata), |secret, version| {
            assert_eq!((secret, version), (id.as_str(), 2));
            Ok(sealed(3))
        })
        .unwrap();
    assert_eq!(updated.current_version, 2);
    assert_eq!(updated.metadata, metadata);
    let (secret_id, version, value) = store
        .current_secret_value(&team.id, "api_key")
        .unwrap()
        .unwrap();
    assert_eq!((secret_id.as_str(), version), (id.as_str(), 2));
    assert_eq!(value, sealed(3));
    assert_eq!(store.all_secret_versions().unwrap().len(), 2);
    store
        .replace_secret_version(
            &id,
            1,
            &SealedVersion {
                kek_version: 2,
                ..sealed(9)
            },
        )
        .unwrap();
    assert_eq!(store.all_secret_versions().unwrap()[0].2.kek_version, 2);

    assert_eq!(store.delete_secret(&team.id, &id).unwrap().id, id);
    assert!(store
        .current_secret_value(&team.id, "api_key")
        .unwrap()
        .is_none());
    assert!(store.all_secret_versions().unwrap().is_empty());
    // The name is free again.
    store
        .insert_secret(
            &Store::new_secret_id(),
            &team.id,
            "api_key",
            &Default::default(),
            &sealed(1),
        )
        .unwrap();
}

fn secrets_page_newest_first(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    for i in 0..5 {
        store
            .insert_secret(
                &Store::new_secret_id(),
                &team.id,
                &format!("s{i}"),
                &Default::default(),
                &sealed(i),
            )
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let first = store.list_secrets(&team.id, 2, None).unwrap();
    assert_eq!(
        first
            .secrets
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["s4", "s3"]
    );
    let second = store
        .list_secrets(&team.id, 10, first.next_token.as_deref())
        .unwrap();
    assert_eq!(second.secrets.len(), 3);
    assert!(second.next_token.is_none());
}

on_both_backends!(
    secrets_version_by_appending_and_are_found_by_id_or_name,
    secrets_page_newest_first,
);
