//! Prints create and kill latency (not a benchmark gate: nothing here asserts a time).
//! `cargo test --release -p berth-runtime --test latency -- --ignored --nocapture`

mod common;

use std::time::{Duration, Instant};

use berth_runtime::Runtime;
use common::TestRuntime;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
#[ignore = "measurement, run explicitly"]
fn print_create_kill_latency() {
    let t = TestRuntime::new();
    // Format the disk image for this size once, outside the measurement.
    let warm = t.rt.create(&t.spec("warm")).unwrap();
    t.rt.kill(&warm.id).unwrap();
    let (mut creates, mut kills) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let spec = t.spec("lat");
        let start = Instant::now();
        t.rt.create(&spec).unwrap();
        creates.push(start.elapsed());
        let start = Instant::now();
        t.rt.kill(&spec.id).unwrap();
        kills.push(start.elapsed());
    }
    creates.sort();
    kills.sort();
    println!(
        "create p50 {:?} p99 {:?}; kill p50 {:?} p99 {:?}",
        percentile(&creates, 0.5),
        percentile(&creates, 0.99),
        percentile(&kills, 0.5),
        percentile(&kills, 0.99)
    );
}
