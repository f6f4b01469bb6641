use super::*;

fn request(
    team: &str,
    alias: &str,
    template_id: &str,
    build_id: &str,
    tags: &[&str],
) -> NewTemplateBuild {
    NewTemplateBuild {
        team_id: team.into(),
        alias: alias.into(),
        new_template_id: template_id.into(),
        build_id: build_id.into(),
        manifest_id: format!("build-{build_id}"),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        cpu_count: 2,
        memory_mb: 1024,
        disk_size_mb: 2048,
        envd_version: "0.6.4".into(),
    }
}

fn installed(name: &str, build_id: &str) -> InstalledTemplate {
    InstalledTemplate {
        name: name.into(),
        build_id: build_id.into(),
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 1024,
        envd_version: "0.6.4".into(),
        created_at: at(1_000),
    }
}

fn a_build_request_makes_the_template_once_and_supersedes_waiting_builds(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("a").unwrap();
    let (t1, b1) = store
        .request_template_build(&request(&team.id, "app", "tapp", "b1", &["default"]))
        .unwrap();
    assert_eq!(t1.id, "tapp");
    assert_eq!(t1.team_id.as_deref(), Some(team.id.as_str()));
    assert!(!t1.public);
    assert_eq!(b1.status, TemplateBuildStatus::Waiting);
    assert_eq!(b1.manifest_id, "build-b1");
    // Same alias again: same template (the new id is not used), the waiting build fails.
    let (t2, b2) = store
        .request_template_build(&request(&team.id, "app", "tother", "b2", &["v1"]))
        .unwrap();
    assert_eq!(t2.id, "tapp");
    assert_eq!(t2.build_count, 2);
    assert_eq!(b2.template_id, "tapp");
    let old = store.template_build("tapp", "b1").unwrap().unwrap();
    assert_eq!(old.status, TemplateBuildStatus::Error);
    assert!(old.reason.unwrap().message.contains("superseded"));
    assert!(store.template("tother").unwrap().is_none());
    // Another team may use the same alias for its own template.
    let other = store.create_team("b").unwrap();
    let (t3, _) = store
        .request_template_build(&request(&other.id, "app", "tb", "b3", &[]))
        .unwrap();
    assert_eq!(t3.id, "tb");
    assert_eq!(
        store
            .template_by_alias(Some(&team.id), "app")
            .unwrap()
            .unwrap()
            .id,
        "tapp"
    );
    assert_eq!(
        store
            .template_by_alias(Some(&other.id), "app")
            .unwrap()
            .unwrap()
            .id,
        "tb"
    );
}

fn tags_point_at_a_build_only_once_it_is_ready(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("a").unwrap();
    store
        .request_template_build(&request(&team.id, "app", "t", "b1", &["default", "v1"]))
        .unwrap();
    assert!(store
        .template_build_by_tag("t", "default")
        .unwrap()
        .is_none());
    assert!(store.start_template_build("b1").unwrap());
    assert!(
        !store.start_template_build("b1").unwrap(),
        "only a waiting build starts"
    );
    assert!(store.finish_template_build("b1").unwrap());
    assert!(!store.finish_template_build("b1").unwrap());
    assert_eq!(
        store.template_build_by_tag("t", "v1").unwrap().unwrap().id,
        "b1"
    );
    let ready = store.template_build("t", "b1").unwrap().unwrap();
    assert_eq!(ready.status, TemplateBuildStatus::Ready);
    assert!(ready.finished_at.is_some());

    // A failed rebuild leaves the tags where they were.
    store
        .request_template_build(&request(&team.id, "app", "t", "b2", &["default"]))
        .unwrap();
    store.start_template_build("b2").unwrap();
    let reason = BuildReason {
        message: "step 2 failed".into(),
        step: Some("2".into()),
    };
    assert!(store.fail_template_build("b2", &reason).unwrap());
    assert!(!store.fail_template_build("b2", &reason).unwrap());
    assert_eq!(
        store.template_build("t", "b2").unwrap().unwrap().reason,
        Some(reason)
    );
    assert_eq!(
        store
            .template_build_by_tag("t", "default")
            .unwrap()
            .unwrap()
            .id,
        "b1"
    );

    store
        .assign_template_tags("t", "b1", &["stable".into(), "prod".into()])
        .unwrap();
    let tags: Vec<String> = store
        .template_tags("t")
        .unwrap()
        .into_iter()
        .map(|t| t.tag)
        .collect();
    assert_eq!(tags, ["default", "prod", "stable", "v1"]);
    store
        .delete_template_tags("t", &["prod".into(), "never".into()])
        .unwrap();
    assert_eq!(store.template_tags("t").unwrap().len(), 3);
    assert!(store.unfinished_template_builds().unwrap().is_empty());
}

fn installed_templates_sync_with_the_host(db: &TestDb) {
    let store = db.open();
    assert!(store
        .sync_installed_templates(&[installed("base", "bb1"), installed("extra", "be1")], true)
        .unwrap()
        .is_empty());
    let base = store.template_by_alias(None, "base").unwrap().unwrap();
    assert_eq!(base.team_id, None);
    assert!(base.public);
    assert_eq!(
        store
            .template_build_by_tag("base", "default")
            .unwrap()
            .unwrap()
            .id,
        "bb1"
    );
    // base rebuilt (new layers), extra gone.
    let removed = store
        .sync_installed_templates(&[installed("base", "bb2")], true)
        .unwrap();
    assert_eq!(removed, ["extra"]);
    assert!(store.template("extra").unwrap().is_none());
    let build = store
        .template_build_by_tag("base", "default")
        .unwrap()
        .unwrap();
    assert_eq!(
        (build.id.as_str(), build.manifest_id.as_str()),
        ("bb2", "base")
    );
    assert_eq!(store.template("base").unwrap().unwrap().build_count, 2);
}

fn listings_show_installed_then_the_team_newest_first_and_page(db: &TestDb) {
    let store = db.open();
    store
        .sync_installed_templates(&[installed("base", "bb1")], true)
        .unwrap();
    let a = store.create_team("a").unwrap();
    let b = store.create_team("b").unwrap();
    for (i, alias) in ["one", "two", "three"].iter().enumerate() {
        store
            .request_template_build(&request(
                &a.id,
                alias,
                &format!("ta{i}"),
                &format!("ba{i}"),
                &[],
            ))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
    store
        .request_template_build(&request(&b.id, "theirs", "tb", "bb", &[]))
        .unwrap();
    let mut seen = Vec::new();
    let mut token = None;
    loop {
        let (page, next) = store.list_templates(&a.id, 2, token.as_deref()).unwrap();
        seen.extend(page.into_iter().map(|t| t.id));
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["base", "ta2", "ta1", "ta0"]);
    assert!(matches!(
        store.list_templates(&a.id, 2, Some("garbage")),
        Err(StoreError::InvalidCursor { .. })
    ));

    let (builds, next) = store.list_template_builds("ta0", 10, None).unwrap();
    assert_eq!(builds.len(), 1);
    assert!(next.is_none());
}

fn deleting_a_template_returns_its_builds_and_counts_users(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("a").unwrap();
    store
        .request_template_build(&request(&team.id, "app", "t", "b1", &[]))
        .unwrap();
    store.start_template_build("b1").unwrap();
    store.finish_template_build("b1").unwrap();
    let mut sandbox = sandbox(&team.id, "i1", 5);
    sandbox.template_id = "t".into();
    store.insert_sandbox(&sandbox).unwrap();
    assert_eq!(store.template_users("t").unwrap(), (1, 0));
    assert_eq!(
        store.template_build_users("t", &sandbox.build_id).unwrap(),
        (1, 0)
    );
    assert_eq!(store.template_build_users("t", "other").unwrap(), (0, 0));
    store.mark_killed("i1").unwrap();
    assert_eq!(store.template_users("t").unwrap(), (0, 0));
    assert_eq!(
        store.template_build_users("t", &sandbox.build_id).unwrap(),
        (0, 0)
    );
    store.set_template_public("t", true).unwrap();
    assert!(store.template("t").unwrap().unwrap().public);
    store.record_template_spawn("t").unwrap();
    assert_eq!(store.template("t").unwrap().unwrap().spawn_count, 1);
    assert_eq!(store.template_manifests().unwrap(), ["build-b1"]);
    let builds = store.delete_template("t").unwrap();
    assert_eq!(builds[0].manifest_id, "build-b1");
    assert!(store.template("t").unwrap().is_none());
    assert!(store.template_tags("t").unwrap().is_empty());
    assert!(matches!(
        store.delete_template("t"),
        Err(StoreError::NotFound { .. })
    ));
}

on_both_backends!(
    a_build_request_makes_the_template_once_and_supersedes_waiting_builds,
    tags_point_at_a_build_only_once_it_is_ready,
    installed_templates_sync_with_the_host,
    listings_show_installed_then_the_team_newest_first_and_page,
    deleting_a_template_returns_its_builds_and_counts_users,
);
