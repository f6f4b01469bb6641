use super::*;

fn first_team_is_default_and_names_are_unique(db: &TestDb) {
    let store = db.open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    assert!(a.is_default);
    assert!(!b.is_default);
    assert!(matches!(
        store.create_team("a"),
        Err(StoreError::TeamExists { name }) if name == "a"
    ));
    assert_eq!(store.default_team().unwrap().unwrap(), a);
    assert_eq!(store.team_by_name("b").unwrap().unwrap(), b);
}

fn keys_authenticate_by_hash_only_and_revoke(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    let (record, raw) = store.create_api_key(&team.id, "k").unwrap();
    let (found_team, found_key) = store.authenticate(&raw).unwrap().unwrap();
    assert_eq!(found_team.id, team.id);
    assert_eq!(found_key.id, record.id);
    assert!(found_key.last_used.is_some());
    assert!(store.authenticate("e2b_00").unwrap().is_none());

    // The raw key is nowhere in the database.
    drop(store);
    match db.backend() {
        Backend::Sqlite => {
            let bytes = std::fs::read(db.dir().join(DATABASE_FILE)).unwrap();
            let wal = std::fs::read(db.dir().join("berth.db-wal")).unwrap_or_default();
            let needle = raw.as_bytes();
            for haystack in [&bytes, &wal] {
                assert!(!haystack.windows(needle.len()).any(|w| w == needle));
            }
        }
        Backend::Postgres => {
            let holding = db.count(&format!(
                "SELECT COUNT(*) AS n FROM api_keys k \
                 WHERE strpos(CAST(k AS TEXT), '{raw}') > 0"
            ));
            assert_eq!(holding, 0);
        }
    }
    let store = db.open();
    store.revoke_api_key(&record.id).unwrap();
    assert!(store.authenticate(&raw).unwrap().is_none());
}

fn deleting_another_teams_key_is_not_found(db: &TestDb) {
    let store = db.open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    let (key, raw) = store.create_api_key(&a.id, "k").unwrap();
    assert!(matches!(
        store.delete_api_key(&b.id, &key.id),
        Err(StoreError::NotFound { what: "API key", id }) if id == key.id
    ));
    assert!(store.authenticate(&raw).unwrap().is_some());
}

fn keys_list_rename_and_show_their_team(db: &TestDb) {
    let store = db.open();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    let (ka, _) = store.create_api_key(&a.id, "one").unwrap();
    store.create_api_key(&b.id, "two").unwrap();
    store.rename_api_key(&a.id, &ka.id, "renamed").unwrap();
    assert!(store.rename_api_key(&b.id, &ka.id, "stolen").is_err());
    let listed = store.list_api_keys(&a.id).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "renamed");
    assert_eq!(listed[0].mask, ka.mask);
    let all: Vec<(String, String)> = store
        .list_all_api_keys()
        .unwrap()
        .into_iter()
        .map(|(team, key)| (team, key.name))
        .collect();
    assert_eq!(
        all,
        [("a".into(), "renamed".into()), ("b".into(), "two".into())]
    );
}

fn second_open_sees_the_same_state(db: &TestDb) {
    let first = db.open();
    let team = first.create_team("t").unwrap();
    let second = db.open();
    let (_, raw) = second.create_api_key(&team.id, "from the CLI").unwrap();
    assert!(first.authenticate(&raw).unwrap().is_some());
}

on_both_backends!(
    first_team_is_default_and_names_are_unique,
    keys_authenticate_by_hash_only_and_revoke,
    deleting_another_teams_key_is_not_found,
    keys_list_rename_and_show_their_team,
    second_open_sees_the_same_state,
);
