//! Metric sampling: every running sandbox's cgroup and disk usage is read from the
//! runtime on a fixed interval and stored as a time series.

use std::time::{Duration, Instant};

use berth_store::MetricSample;
use time::OffsetDateTime;

use crate::{AppState, SharedState};

/// E2B samples every 5 seconds; so does berth.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// A cumulative CPU time reading and when it was taken.
#[derive(Debug, Clone, Copy)]
pub struct CpuReading {
    usage_ns: u64,
    at: Instant,
}

/// Take one sample of `sandbox_id` and store it.
async fn sample(state: &AppState, sandbox_id: &str) {
    let runtime = state.runtime.clone();
    let id = sandbox_id.to_string();
    let stats = match tokio::task::spawn_blocking(move || runtime.stats(&id)).await {
        Ok(Ok(stats)) => stats,
        Ok(Err(err)) => {
            tracing::debug!(sandbox = %sandbox_id, %err, "reading sandbox stats");
            return;
        }
        Err(_) => return,
    };
    let now = Instant::now();
    let previous = {
        let mut readings = state
            .cpu_readings
            .lock();
        readings.insert(
            sandbox_id.to_string(),
            CpuReading {
                usage_ns: stats.cpu_usage_ns,
                at: now,
            },
        )
    };
    let cpu_used_pct = match previous {
        Some(before) => cpu_percent(before, stats.cpu_usage_ns, now, stats.cpu_count),
        None => 0.0,
    };
    let sample = MetricSample {
        timestamp_unix: OffsetDateTime::now_utc().unix_timestamp(),
        cpu_count: stats.cpu_count,
        cpu_used_pct,
        mem_used: stats.mem_used,
        mem_total: stats.mem_total,
        mem_cache: stats.mem_cache,
        disk_used: stats.disk_used,
        disk_total: stats.disk_total,
    };
    if let Err(err) = state.store.insert_metric(sandbox_id, &sample) {
        tracing::warn!(sandbox = %sandbox_id, %err, "storing metric sample");
    }
}

/// Share of the sandbox's CPUs used between two readings, in percent (0..=100).
fn cpu_percent(before: CpuReading, usage_ns: u64, now: Instant, cpu_count: u32) -> f64 {
    let wall_ns = now.duration_since(before.at).as_nanos() as f64;
    if wall_ns <= 0.0 || cpu_count == 0 {
        return 0.0;
    }
    let used = usage_ns.saturating_sub(before.usage_ns) as f64;
    (used / (wall_ns * f64::from(cpu_count)) * 100.0).clamp(0.0, 100.0)
}

/// Sample a new sandbox right away, so its first metrics exist without waiting a
/// whole interval.
pub fn sample_soon(state: SharedState, sandbox_id: String) {
    tokio::spawn(async move { sample(&state, &sandbox_id).await });
}

/// Drop the CPU reading of a sandbox that is gone.
pub fn forget(state: &AppState, sandbox_id: &str) {
    state
        .cpu_readings
        .lock()
        .remove(sandbox_id);
}

pub async fn run(state: SharedState) {
    let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let running = match state.store.all_running_sandboxes() {
            Ok(running) => running,
            Err(err) => {
                tracing::error!(%err, "listing sandboxes to sample");
                continue;
            }
        };
        for sandbox in running {
            sample(&state, &sandbox.id).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_percent_is_share_of_all_cpus() {
        let start = Instant::now();
        let before = CpuReading {
            usage_ns: 0,
            at: start,
        };
        let later = start + Duration::from_secs(1);
        // One full CPU-second over one second on two CPUs is half the capacity.
        assert_eq!(cpu_percent(before, 1_000_000_000, later, 2), 50.0);
        assert_eq!(cpu_percent(before, 0, later, 2), 0.0);
        assert_eq!(cpu_percent(before, 10_000_000_000, later, 1), 100.0);
    }
}
