//! Nodes (leases, draining, loss) and placements.

use std::time::Duration;

use super::*;
use crate::columns::now;

fn registration(id: &str) -> NodeRegistration {
    NodeRegistration {
        id: id.into(),
        url: format!("http://{id}:3100"),
        cpu_capacity: 8,
        memory_capacity_mb: 4096,
        slots: 100,
    }
}

fn a_node_registers_renews_and_is_lost_once_when_its_lease_lapses(db: &TestDb) {
    let store = db.open();
    let a = store
        .register_node(&registration("a"), Duration::from_secs(10))
        .unwrap();
    assert!(a.accepting(now()));
    store
        .register_node(&registration("b"), Duration::ZERO)
        .unwrap();
    assert!(store
        .renew_node_lease("a", Duration::from_secs(10))
        .unwrap());
    assert!(!store
        .renew_node_lease("nobody", Duration::from_secs(10))
        .unwrap());

    let later = now() + time::Duration::seconds(1);
    assert_eq!(
        store.mark_lapsed_nodes_lost(later).unwrap(),
        vec!["b".to_string()]
    );
    assert!(store.mark_lapsed_nodes_lost(later).unwrap().is_empty());
    let b = store.node("b").unwrap().unwrap();
    assert!(b.lost && !b.accepting(now()));
    // A lost node renews nothing; it registers anew (a restart) and is a member again.
    assert!(!store
        .renew_node_lease("b", Duration::from_secs(10))
        .unwrap());
    let back = store
        .register_node(&registration("b"), Duration::from_secs(10))
        .unwrap();
    assert!(!back.lost && back.accepting(now()));

    assert!(store.set_node_draining("a", true).unwrap());
    let again = store
        .register_node(&registration("a"), Duration::from_secs(10))
        .unwrap();
    assert!(
        again.draining && !again.accepting(now()),
        "a restart keeps draining"
    );
    assert!(!store.set_node_draining("nobody", true).unwrap());
    assert_eq!(
        store
            .nodes()
            .unwrap()
            .iter()
            .map(|n| n.id.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}

fn placements_name_one_node_per_object(db: &TestDb) {
    let store = db.open();
    store.place(PlacedKind::Sandbox, "s1", "a").unwrap();
    store.place(PlacedKind::Checkpoint, "s1", "b").unwrap();
    assert_eq!(
        store
            .placement(PlacedKind::Sandbox, "s1")
            .unwrap()
            .as_deref(),
        Some("a")
    );
    assert_eq!(
        store
            .placement(PlacedKind::Checkpoint, "s1")
            .unwrap()
            .as_deref(),
        Some("b")
    );
    store.place(PlacedKind::Sandbox, "s1", "c").unwrap();
    assert_eq!(
        store
            .placement(PlacedKind::Sandbox, "s1")
            .unwrap()
            .as_deref(),
        Some("c")
    );
    store.place(PlacedKind::Sandbox, "s2", "c").unwrap();
    assert_eq!(
        store.placed_on(PlacedKind::Sandbox, "c").unwrap(),
        ["s1", "s2"]
    );
    store.remove_placement(PlacedKind::Sandbox, "s1").unwrap();
    assert_eq!(store.placement(PlacedKind::Sandbox, "s1").unwrap(), None);
    assert!(
        store.node_usage().unwrap().is_empty(),
        "placements of no sandbox row count nothing"
    );
}

fn usage_sums_running_sandboxes_and_counts_paused_ones(db: &TestDb) {
    let store = db.open();
    let team = store.create_team("t").unwrap();
    for (id, node) in [("s1", "a"), ("s2", "a"), ("s3", "b")] {
        store.place(PlacedKind::Sandbox, id, node).unwrap();
        store.insert_sandbox(&sandbox(&team.id, id, 1_000)).unwrap();
    }
    store.mark_paused("s2", true).unwrap();
    store
        .insert_sandbox(&sandbox(&team.id, "unplaced", 1_000))
        .unwrap();
    store.place(PlacedKind::Sandbox, "s4", "b").unwrap();
    store
        .insert_sandbox(&sandbox(&team.id, "s4", 1_000))
        .unwrap();
    store.mark_killed("s4").unwrap();
    assert_eq!(
        store.node_usage().unwrap(),
        vec![
            (
                "a".to_string(),
                NodeUsage {
                    cpu_reserved: 2,
                    memory_reserved_mb: 512,
                    sandboxes: 2
                }
            ),
            (
                "b".to_string(),
                NodeUsage {
                    cpu_reserved: 2,
                    memory_reserved_mb: 512,
                    sandboxes: 1
                }
            ),
        ]
    );
}

on_both_backends!(
    a_node_registers_renews_and_is_lost_once_when_its_lease_lapses,
    placements_name_one_node_per_object,
    usage_sums_running_sandboxes_and_counts_paused_ones,
    a_stopping_node_takes_nothing_new_but_keeps_its_lease,
);

fn a_stopping_node_takes_nothing_new_but_keeps_its_lease(db: &TestDb) {
    let store = db.open();
    let node = store
        .register_node(&registration("s"), Duration::from_secs(60))
        .unwrap();
    assert!(node.accepting(now()));
    store.mark_node_stopping("s").unwrap();
    let stopping = store.node("s").unwrap().unwrap();
    assert!(stopping.stopping && !stopping.accepting(now()));
    assert!(
        store.mark_lapsed_nodes_lost(now()).unwrap().is_empty(),
        "its lease still runs"
    );
    assert!(store
        .renew_node_lease("s", Duration::from_secs(60))
        .unwrap());
    let back = store
        .register_node(&registration("s"), Duration::from_secs(60))
        .unwrap();
    assert!(!back.stopping && back.accepting(now()));
}
