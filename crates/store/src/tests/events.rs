use super::*;

fn hook(id: &str, team: &str, events: &[&str]) -> WebhookRecord {
    WebhookRecord {
        id: id.into(),
        team_id: team.into(),
        name: "hook".into(),
        url: "http://127.0.0.1:9/".into(),
        enabled: true,
        events: events.iter().map(|e| e.to_string()).collect(),
        secret: "s".into(),
        created_at: now(),
    }
}

fn event(id: &str, team: &str, kind: &str) -> EventRecord {
    EventRecord {
        id: id.into(),
        team_id: team.into(),
        sandbox_id: "i1".into(),
        template_id: "base".into(),
        build_id: "b".into(),
        event_type: format!("sandbox.lifecycle.{kind}"),
        data: Some(serde_json::json!({ "n": id })),
        timestamp: now(),
        execution_id: format!("exec-{id}"),
    }
}

fn events_page_filter_and_queue_deliveries(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    store
        .create_webhook(&hook("w1", &team.id, &["sandbox.lifecycle.killed"]))
        .unwrap();
    for (i, kind) in ["created", "updated", "killed"].iter().enumerate() {
        store
            .record_event(&event(&format!("e{i}"), &team.id, kind), |e| e.id.clone())
            .unwrap();
    }
    let newest = store.events(&team.id, None, &[], false, 0, 10).unwrap();
    let ids: Vec<_> = newest.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["e2", "e1", "e0"]);
    assert_eq!(newest[0].data, Some(serde_json::json!({ "n": "e2" })));
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
    let two_types = store
        .events(
            &team.id,
            None,
            &[
                "sandbox.lifecycle.killed".into(),
                "sandbox.lifecycle.created".into(),
            ],
            true,
            0,
            10,
        )
        .unwrap();
    let ids: Vec<_> = two_types.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["e0", "e2"]);
    assert!(store
        .events(&team.id, Some("i2"), &[], true, 0, 10)
        .unwrap()
        .is_empty());
    assert!(store
        .events("other", None, &[], true, 0, 10)
        .unwrap()
        .is_empty());

    let due = store
        .claim_due_deliveries(now(), 10, std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].body, "e2");
    assert_eq!(due[0].url, "http://127.0.0.1:9/");
    let refused = DeliveryAttempt {
        delivered: false,
        response_code: Some(503),
        error: Some("receiver answered 503".into()),
    };
    store
        .record_delivery_attempt(due[0].id, &refused, Some(now() + time::Duration::hours(1)))
        .unwrap();
    assert!(store
        .claim_due_deliveries(now(), 10, std::time::Duration::from_secs(60))
        .unwrap()
        .is_empty());
    assert!(store.next_delivery_at().unwrap().unwrap() > now());
    let pending = store.webhook_deliveries(&team.id, "w1", 10).unwrap();
    assert_eq!(pending[0].status, DeliveryStatus::Pending);
    assert_eq!(
        (pending[0].attempts, pending[0].response_code),
        (1, Some(503))
    );
    assert!(pending[0].next_attempt_at.is_some());
    let delivered = DeliveryAttempt {
        delivered: true,
        response_code: Some(204),
        error: None,
    };
    store
        .record_delivery_attempt(due[0].id, &delivered, None)
        .unwrap();
    assert!(store.next_delivery_at().unwrap().is_none());
    let history = store.webhook_deliveries(&team.id, "w1", 10).unwrap();
    assert_eq!(history.len(), 1, "a finished delivery stays in the history");
    assert_eq!(history[0].status, DeliveryStatus::Delivered);
    assert_eq!(history[0].event_type, "sandbox.lifecycle.killed");
    assert_eq!(
        (history[0].attempts, history[0].response_code),
        (2, Some(204))
    );
    assert_eq!(history[0].last_error, None);
    assert!(history[0].last_attempt_at.is_some() && history[0].next_attempt_at.is_none());
    assert!(matches!(
        store.webhook_deliveries("other", "w1", 10),
        Err(StoreError::NotFound {
            what: "webhook",
            ..
        })
    ));
}

fn webhooks_update_disable_and_delete_with_their_deliveries(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    store.create_webhook(&hook("w1", &team.id, &[])).unwrap();
    let changed = store
        .update_webhook(
            &team.id,
            "w1",
            &WebhookChanges {
                name: Some("renamed".into()),
                events: Some(vec!["sandbox.lifecycle.created".into()]),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(changed.name, "renamed");
    assert_eq!(store.webhooks(&team.id).unwrap()[0].events, changed.events);
    assert!(matches!(
        store.update_webhook("other", "w1", &WebhookChanges::default()),
        Err(StoreError::NotFound {
            what: "webhook",
            ..
        })
    ));

    store
        .record_event(&event("e1", &team.id, "created"), |e| e.id.clone())
        .unwrap();
    assert_eq!(
        store
            .claim_due_deliveries(now(), 10, std::time::Duration::from_secs(60))
            .unwrap()
            .len(),
        1
    );
    // Claimed: nobody else gets it until the claim lapses.
    assert!(store
        .claim_due_deliveries(now(), 10, std::time::Duration::from_secs(60))
        .unwrap()
        .is_empty());
    store
        .update_webhook(
            &team.id,
            "w1",
            &WebhookChanges {
                enabled: Some(false),
                ..Default::default()
            },
        )
        .unwrap();
    store
        .record_event(&event("e2", &team.id, "created"), |e| e.id.clone())
        .unwrap();
    let lapsed = now() + time::Duration::seconds(61);
    assert_eq!(
        store
            .claim_due_deliveries(lapsed, 10, std::time::Duration::from_secs(60))
            .unwrap()
            .len(),
        1,
        "a lapsed claim is due again, and a disabled webhook gets nothing new"
    );

    store.delete_webhook(&team.id, "w1").unwrap();
    assert!(store.webhook(&team.id, "w1").unwrap().is_none());
    assert!(store.next_delivery_at().unwrap().is_none());
    assert!(matches!(
        store.delete_webhook(&team.id, "w1"),
        Err(StoreError::NotFound { .. })
    ));
}

fn a_webhooks_history_keeps_its_newest_finished_deliveries(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    store.create_webhook(&hook("w1", &team.id, &[])).unwrap();
    let total = DELIVERY_HISTORY + 3;
    for i in 0..total {
        store
            .record_event(&event(&format!("e{i}"), &team.id, "created"), |e| {
                e.id.clone()
            })
            .unwrap();
    }
    let failed = DeliveryAttempt {
        delivered: false,
        response_code: None,
        error: Some("connection refused".into()),
    };
    let due = store
        .claim_due_deliveries(now(), total, std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(due.len(), total);
    for delivery in &due {
        store
            .record_delivery_attempt(delivery.id, &failed, None)
            .unwrap();
    }
    let history = store.webhook_deliveries(&team.id, "w1", 1000).unwrap();
    assert_eq!(history.len(), DELIVERY_HISTORY);
    assert_eq!(history[0].id, due.last().unwrap().id, "newest first");
    assert!(history.iter().all(|d| d.status == DeliveryStatus::Failed));
    assert_eq!(history[0].last_error.as_deref(), Some("connection refused"));
    let lapsed = now() + time::Duration::seconds(61);
    assert!(store
        .claim_due_deliveries(lapsed, 10, std::time::Duration::from_secs(60))
        .unwrap()
        .is_empty());
}

fn two_claimers_never_get_the_same_delivery(db: &TestDb) {
    let store = db.open();
    let other = db.open();
    let team = store.create_team("t").unwrap();
    store.create_webhook(&hook("w1", &team.id, &[])).unwrap();
    for i in 0..40 {
        store
            .record_event(&event(&format!("e{i}"), &team.id, "created"), |e| {
                e.id.clone()
            })
            .unwrap();
    }
    let claim = |store: Store| {
        std::thread::spawn(move || {
            let mut got = Vec::new();
            loop {
                let batch = store
                    .claim_due_deliveries(now(), 3, std::time::Duration::from_secs(60))
                    .unwrap();
                if batch.is_empty() {
                    return got;
                }
                got.extend(batch.into_iter().map(|d| d.id));
            }
        })
    };
    let (first, second) = (claim(store), claim(other));
    let (first, second) = (first.join().unwrap(), second.join().unwrap());
    let mut all: Vec<i64> = first.iter().chain(&second).copied().collect();
    all.sort();
    all.dedup();
    assert_eq!(
        all.len(),
        first.len() + second.len(),
        "a delivery was claimed twice"
    );
    assert_eq!(all.len(), 40);
}

on_both_backends!(
    events_page_filter_and_queue_deliveries,
    webhooks_update_disable_and_delete_with_their_deliveries,
    a_webhooks_history_keeps_its_newest_finished_deliveries,
    two_claimers_never_get_the_same_delivery,
);
