use super::*;
use berth_api::LogLevel;

fn logs_filter_by_level_search_and_direction(db: &TestDb) {
    let store = db.open();
    store.append_log("i1", LogLevel::Debug, "booting").unwrap();
    store
        .append_log("i1", LogLevel::Info, "envd ready")
        .unwrap();
    store
        .append_log("i1", LogLevel::Error, "envd died")
        .unwrap();
    store
        .append_log("i2", LogLevel::Error, "envd other")
        .unwrap();
    let info = store
        .logs("i1", None, true, LogLevel::Info, None, 10)
        .unwrap();
    assert_eq!(info.len(), 2);
    let backward = store
        .logs("i1", None, false, LogLevel::Debug, Some("envd"), 1)
        .unwrap();
    assert_eq!(backward[0].message, "envd died");
    assert_eq!(backward[0].level, LogLevel::Error);
    let forward = store
        .logs("i1", None, true, LogLevel::Debug, Some("envd"), 10)
        .unwrap();
    let messages: Vec<_> = forward.iter().map(|l| l.message.as_str()).collect();
    assert_eq!(messages, ["envd ready", "envd died"]);
    assert!(
        store
            .logs("i1", None, true, LogLevel::Debug, Some("ENVD"), 10)
            .unwrap()
            .is_empty(),
        "search is case-sensitive"
    );
    let all = store
        .logs("i1", None, true, LogLevel::Debug, None, 10)
        .unwrap();
    assert_eq!(all.len(), 3);
    let first_ms = all[0].timestamp_ms;
    let last_ms = all[2].timestamp_ms;
    assert_eq!(
        store
            .logs("i1", Some(last_ms + 1), true, LogLevel::Debug, None, 10)
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        store
            .logs("i1", Some(first_ms - 1), false, LogLevel::Debug, None, 10)
            .unwrap()
            .len(),
        0
    );
}

fn metrics_replace_per_second_and_read_in_range(db: &TestDb) {
    let store = db.open();
    let sample = |t: i64, cpu: f64| MetricSample {
        timestamp_unix: t,
        cpu_count: 2,
        cpu_used_pct: cpu,
        mem_used: 1 << 20,
        mem_total: 1 << 30,
        mem_cache: 0,
        disk_used: 5,
        disk_total: 10,
    };
    store.insert_metric("i1", &sample(10, 1.0)).unwrap();
    store.insert_metric("i1", &sample(10, 2.0)).unwrap();
    store.insert_metric("i1", &sample(20, 3.0)).unwrap();
    store.insert_metric("i2", &sample(15, 9.0)).unwrap();
    assert_eq!(
        store.metrics("i1", 0, 100).unwrap(),
        [sample(10, 2.0), sample(20, 3.0)]
    );
    assert_eq!(store.metrics("i1", 11, 20).unwrap(), [sample(20, 3.0)]);
    assert_eq!(store.latest_metric("i1").unwrap(), Some(sample(20, 3.0)));
    assert!(store.latest_metric("i3").unwrap().is_none());
}

on_both_backends!(
    logs_filter_by_level_search_and_direction,
    metrics_replace_per_second_and_read_in_range,
);
