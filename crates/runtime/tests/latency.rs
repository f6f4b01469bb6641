//! Prints create and kill latency, and create until envd answers /health (a measurement,
//! not a gate: nothing here asserts a time).
//! `cargo test --release -p berth-runtime --test latency -- --ignored --nocapture`

mod common;

use std::time::{Duration, Instant};

use berth_runtime::Runtime;
use common::TestRuntime;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name}: p50 {:?} p90 {:?} p99 {:?} (n={})",
        percentile(&samples, 0.5),
        percentile(&samples, 0.9),
        percentile(&samples, 0.99),
        samples.len()
    );
}

#[test]
#[ignore = "measurement, run explicitly"]
fn print_create_kill_latency() {
    let t = TestRuntime::with_envd();
    // Format the disk image for this size once, outside the measurement.
    let warm = t.rt.create(&t.spec("warm")).unwrap();
    t.rt.kill(&warm.id).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let (mut creates, mut ready, mut kills) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..100 {
        let spec = t.spec("lat");
        let start = Instant::now();
        t.rt.create(&spec).unwrap();
        creates.push(start.elapsed());
        t.wait_envd_health(&spec.id);
        ready.push(start.elapsed());
        let start = Instant::now();
        t.rt.kill(&spec.id).unwrap();
        kills.push(start.elapsed());
    }
    report("create (init exec'd)", creates);
    report("create until envd /health answers", ready);
    report("kill", kills);
}

fn mem_available_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = meminfo
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
#[ignore = "measurement, run explicitly"]
fn print_idle_sandbox_memory() {
    let t = TestRuntime::with_envd();
    let warm = t.rt.create(&t.spec("warm")).unwrap();
    t.wait_envd_health(&warm.id);
    t.rt.kill(&warm.id).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let count = 100;
    let before = mem_available_kib();
    let mut ids = Vec::new();
    for _ in 0..count {
        let info = t.rt.create(&t.spec("idle")).unwrap();
        t.wait_envd_health(&info.id);
        ids.push(info.id);
    }
    std::thread::sleep(Duration::from_secs(2));
    let after = mem_available_kib();
    let charged: u64 = ids.iter().map(|id| t.rt.stats(id).unwrap().mem_used).sum();
    println!(
        "{count} idle envd sandboxes: {} KiB charged to each sandbox's memory cgroup on average",
        charged / 1024 / count
    );
    println!(
        "{count} idle envd sandboxes: host MemAvailable dropped {} MiB, {} KiB per sandbox",
        (before - after) / 1024,
        (before - after) / count
    );
    for id in ids {
        t.rt.kill(&id).unwrap();
    }
}

#[test]
#[ignore = "measurement, run explicitly"]
fn print_concurrent_create_latency() {
    let t = TestRuntime::with_envd();
    let warm = t.rt.create(&t.spec("warm")).unwrap();
    t.rt.kill(&warm.id).unwrap();
    for concurrency in [10, 50] {
        std::thread::sleep(Duration::from_secs(1));
        let samples = std::sync::Mutex::new(Vec::new());
        let creates = std::sync::Mutex::new(Vec::new());
        let ids = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..concurrency {
                scope.spawn(|| {
                    let spec = t.spec("conc");
                    let start = Instant::now();
                    t.rt.create(&spec).unwrap();
                    creates.lock().unwrap().push(start.elapsed());
                    t.wait_envd_health(&spec.id);
                    samples.lock().unwrap().push(start.elapsed());
                    ids.lock().unwrap().push(spec.id);
                });
            }
        });
        report(
            &format!("create (init exec'd) at concurrency {concurrency}"),
            creates.into_inner().unwrap(),
        );
        report(
            &format!("create until /health at concurrency {concurrency}"),
            samples.into_inner().unwrap(),
        );
        for id in ids.into_inner().unwrap() {
            t.rt.kill(&id).unwrap();
        }
    }
}
