//! Latency samples and a concurrent runner that collects them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Latencies of one measurement, plus the failures seen while collecting them.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    pub durations: Vec<Duration>,
    pub failures: usize,
    pub first_error: Option<String>,
}

impl Samples {
    /// The `p`-th percentile (0-100), nearest-rank, or None without samples.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.durations.is_empty() {
            return None;
        }
        let mut sorted = self.durations.clone();
        sorted.sort();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }

    pub fn p50(&self) -> Option<Duration> {
        self.percentile(50.0)
    }

    pub fn p99(&self) -> Option<Duration> {
        self.percentile(99.0)
    }
}

/// Run `one(i)` for i in 0..total on `concurrency` threads; each call returns the
/// latency it measured.
pub fn run_concurrently<F>(concurrency: usize, total: usize, one: F) -> Samples
where
    F: Fn(usize) -> anyhow::Result<Duration> + Sync,
{
    let next = AtomicUsize::new(0);
    let samples = Mutex::new(Samples::default());
    std::thread::scope(|scope| {
        for _ in 0..concurrency {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= total {
                    break;
                }
                let result = one(i);
                let mut samples = samples.lock().unwrap_or_else(|e| e.into_inner());
                match result {
                    Ok(d) => samples.durations.push(d),
                    Err(e) => {
                        samples.failures += 1;
                        samples.first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            });
        }
    });
    samples.into_inner().unwrap_or_else(|e| e.into_inner())
}

pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples = Samples {
            durations: (1..=100).rev().map(Duration::from_millis).collect(),
            ..Samples::default()
        };
        assert_eq!(samples.p50(), Some(Duration::from_millis(50)));
        assert_eq!(samples.p99(), Some(Duration::from_millis(99)));
        assert_eq!(samples.percentile(100.0), Some(Duration::from_millis(100)));
        assert_eq!(Samples::default().p50(), None);
    }

    #[test]
    fn runner_calls_every_index_once_and_counts_failures() {
        let seen = Mutex::new(Vec::new());
        let samples = run_concurrently(4, 20, |i| {
            seen.lock().unwrap().push(i);
            if i % 5 == 0 {
                anyhow::bail!("index {i} fails");
            }
            Ok(Duration::from_micros(i as u64))
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        assert_eq!(samples.durations.len(), 16);
        assert_eq!(samples.failures, 4);
        assert!(samples.first_error.unwrap().contains("fails"));
    }
}
