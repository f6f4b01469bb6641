//! The operator's Prometheus metrics (`berth up --metrics-listen`), in the text
//! exposition format (prometheus-client).
//!
//! Two kinds: event metrics recorded where things happen (lifecycle latencies, CRIU
//! dump and restore durations and image sizes, store call latencies, build durations,
//! reaper, webhook and sweeper failures, retention evictions, proxied requests), and
//! state read when scraped (sandboxes by state and template from the store, warm pool
//! sizes, the proxy's connections and bytes, this process's resource use from
//! `/proc/self`). Labels carry only closed sets (operation,
//! outcome, state) and template names: never a key, token, team or sandbox id, so
//! cardinality stays bounded and a scrape leaks nothing an operator should not log.

use std::future::Future;
use std::time::Instant;

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::AppState;

/// A sandbox operation whose latency is recorded.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values as Prometheus users spell them
pub enum Operation {
    create,
    resume,
    pause,
    fork,
    snapshot,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    ok,
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: Operation,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    state: &'static str,
    template: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemplateLabels {
    template: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CriuLabels {
    action: &'static str,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SweeperLabels {
    sweeper: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    kind: &'static str,
    rule: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 5 ms .. ~82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

fn store_histogram() -> Histogram {
    // 20 µs .. ~0.65 s.
    Histogram::new(exponential_buckets(0.00002, 2.0, 16))
}

fn image_size_histogram() -> Histogram {
    // 256 KiB .. 8 GiB.
    Histogram::new(exponential_buckets(262_144.0, 2.0, 16))
}

fn build_histogram() -> Histogram {
    // 1 s .. ~68 min.
    Histogram::new(exponential_buckets(1.0, 2.0, 13))
}

/// Every metric of one server, and the registry that renders them.
pub struct Metrics {
    registry: Mutex<Registry>,
    operations: Histograms<OperationLabels>,
    builds: Histograms<OutcomeLabels>,
    reaper_failures: Family<FailureLabels, Counter>,
    webhook_failures: Family<FailureLabels, Counter>,
    evictions: Family<EvictionLabels, Counter>,
    sweeper_failures: Family<SweeperLabels, Counter>,
    criu: Histograms<CriuLabels>,
    criu_images: Histogram,
    store_queries: Histogram,
    store_waits: Histogram,
    proxy_connections_opened: Counter,
    proxy_connections_open: Gauge,
    proxy_bytes: Family<DirectionLabels, Counter>,
    proxied: Family<StatusLabels, Counter>,
    sandboxes: Family<SandboxLabels, Gauge>,
    pooled: Family<TemplateLabels, Gauge>,
    process: ProcessGauges,
}

#[derive(Default)]
struct ProcessGauges {
    cpu_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    resident_bytes: Gauge,
    open_fds: Gauge,
    threads: Gauge,
    start_time_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut metrics = Metrics {
            registry: Mutex::new(Registry::with_prefix("berth")),
            operations: Family::new_with_constructor(latency_histogram),
            builds: Family::new_with_constructor(build_histogram),
            reaper_failures: Family::default(),
            webhook_failures: Family::default(),
            evictions: Family::default(),
            sweeper_failures: Family::default(),
            criu: Family::new_with_constructor(latency_histogram),
            criu_images: image_size_histogram(),
            store_queries: store_histogram(),
            store_waits: store_histogram(),
            proxy_connections_opened: Counter::default(),
            proxy_connections_open: Gauge::default(),
            proxy_bytes: Family::default(),
            proxied: Family::default(),
            sandboxes: Family::default(),
            pooled: Family::default(),
            process: ProcessGauges::default(),
        };
        let registry = metrics.registry.get_mut();
        registry.register_with_unit(
            "sandbox_operation_duration",
            "Latency of sandbox operations through the API (create, resume, pause, fork, snapshot)",
            Unit::Seconds,
            metrics.operations.clone(),
        );
        registry.register_with_unit(
            "template_build_duration",
            "Template builds from request to end",
            Unit::Seconds,
            metrics.builds.clone(),
        );
        registry.register(
            "reaper_failures",
            "Sandboxes the reaper failed to pause or kill at their end time",
            metrics.reaper_failures.clone(),
        );
        registry.register(
            "webhook_delivery_failures",
            "Failed webhook delivery attempts (retry) and deliveries given up (dropped)",
            metrics.webhook_failures.clone(),
        );
        registry.register(
            "retention_evictions",
            "Paused sandboxes (kind=paused) and snapshots (kind=snapshot) evicted by retention, by rule",
            metrics.evictions.clone(),
        );
        registry.register(
            "sweeper_failures",
            "Failures of background sweepers: retention passes and evictions (retention), MCP lease releases (mcp_leases)",
            metrics.sweeper_failures.clone(),
        );
        registry.register_with_unit(
            "criu_duration",
            "CRIU dumps (pause, snapshot, fork) and restores (resume, starts from checkpoints, trial restores)",
            Unit::Seconds,
            metrics.criu.clone(),
        );
        registry.register_with_unit(
            "criu_image_size",
            "Size of the images each successful CRIU dump wrote",
            Unit::Bytes,
            metrics.criu_images.clone(),
        );
        registry.register_with_unit(
            "store_query_duration",
            "How long each store call held the database connection (one statement or transaction)",
            Unit::Seconds,
            metrics.store_queries.clone(),
        );
        registry.register_with_unit(
            "store_wait_duration",
            "How long each store call waited for the database connection",
            Unit::Seconds,
            metrics.store_waits.clone(),
        );
        registry.register(
            "proxy_connections_opened",
            "Connections the sandbox proxy opened into sandboxes",
            metrics.proxy_connections_opened.clone(),
        );
        registry.register(
            "proxy_connections_open",
            "Connections into sandboxes the sandbox proxy holds now (idle pooled ones included)",
            metrics.proxy_connections_open.clone(),
        );
        registry.register_with_unit(
            "proxy",
            "Bytes through the sandbox proxy's connections into sandboxes (to_sandbox, from_sandbox)",
            Unit::Bytes,
            metrics.proxy_bytes.clone(),
        );
        registry.register(
            "proxy_requests",
            "Requests and upgrades forwarded into sandboxes, by answer status class",
            metrics.proxied.clone(),
        );
        registry.register(
            "sandboxes",
            "Live sandboxes by state and template",
            metrics.sandboxes.clone(),
        );
        registry.register(
            "pool_sandboxes",
            "Sandboxes waiting in warm pools, by template",
            metrics.pooled.clone(),
        );
        let process = &metrics.process;
        registry.register_with_unit(
            "process_cpu",
            "CPU time this process used (user + system)",
            Unit::Seconds,
            process.cpu_seconds.clone(),
        );
        registry.register_with_unit(
            "process_resident_memory",
            "Resident memory of this process",
            Unit::Bytes,
            process.resident_bytes.clone(),
        );
        registry.register(
            "process_open_fds",
            "Open file descriptors of this process",
            process.open_fds.clone(),
        );
        registry.register(
            "process_threads",
            "Threads of this process",
            process.threads.clone(),
        );
        registry.register_with_unit(
            "process_start_time",
            "When this process started, in seconds since the epoch",
            Unit::Seconds,
            process.start_time_seconds.clone(),
        );
        metrics
    }

    /// Runs `operation`, recording its latency and whether it succeeded.
    pub async fn timed<T, E>(
        &self,
        operation: Operation,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let result = work.await;
        let outcome = if result.is_ok() {
            Outcome::ok
        } else {
            Outcome::error
        };
        self.operations
            .get_or_create(&OperationLabels { operation, outcome })
            .observe(started.elapsed().as_secs_f64());
        result
    }

    pub fn build_finished(&self, ok: bool, seconds: f64) {
        let outcome = if ok { Outcome::ok } else { Outcome::error };
        self.builds
            .get_or_create(&OutcomeLabels { outcome })
            .observe(seconds);
    }

    /// `kind`: `pause` (auto-pause failed, killed instead), `kill`, `list`.
    pub fn reaper_failed(&self, kind: &'static str) {
        self.reaper_failures
            .get_or_create(&FailureLabels { kind })
            .inc();
    }

    /// `kind`: `retry` or `dropped`.
    pub fn webhook_failed(&self, kind: &'static str) {
        self.webhook_failures
            .get_or_create(&FailureLabels { kind })
            .inc();
    }

    pub(crate) fn evicted(&self, eviction: &crate::retention::Eviction) {
        use crate::retention::Eviction;
        let (kind, rule) = match eviction {
            Eviction::Paused { rule, .. } => ("paused", rule.key()),
            Eviction::Snapshot { rule, .. } => ("snapshot", rule.key()),
        };
        self.evictions
            .get_or_create(&EvictionLabels { kind, rule })
            .inc();
    }

    /// `sweeper`: `retention` or `mcp_leases`.
    pub fn sweeper_failed(&self, sweeper: &'static str, failures: u64) {
        self.sweeper_failures
            .get_or_create(&SweeperLabels { sweeper })
            .inc_by(failures);
    }

    /// What tells these metrics of every CRIU run (see `berth_checkpoint::observe_criu`).
    pub fn criu_observer(&self) -> std::sync::Arc<dyn berth_checkpoint::CriuObserver> {
        std::sync::Arc::new(CriuTimer {
            durations: self.criu.clone(),
            images: self.criu_images.clone(),
        })
    }

    /// What tells these metrics of every store call (see `Store::observe_queries`).
    pub fn store_observer(&self) -> std::sync::Arc<dyn berth_store::QueryObserver> {
        std::sync::Arc::new(StoreTimer {
            queries: self.store_queries.clone(),
            waits: self.store_waits.clone(),
        })
    }

    pub fn proxied(&self, status: u16) {
        let status = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.proxied.get_or_create(&StatusLabels { status }).inc();
    }

    /// The text exposition of every metric, state metrics read now.
    pub(crate) fn render(&self, state: &AppState) -> String {
        let registry = self.registry.lock();
        self.sandboxes.clear();
        for (status, listed) in [
            ("running", state.store.all_running_sandboxes()),
            ("paused", state.store.all_paused_sandboxes()),
        ] {
            match listed {
                Ok(sandboxes) => {
                    for sandbox in sandboxes {
                        let template = sandbox.alias.clone().unwrap_or(sandbox.template_id);
                        self.sandboxes
                            .get_or_create(&SandboxLabels {
                                state: status,
                                template,
                            })
                            .inc();
                    }
                }
                Err(err) => tracing::warn!(%err, "listing sandboxes for /metrics"),
            }
        }
        self.pooled.clear();
        for (template, waiting) in state.pools.waiting_by_template() {
            self.pooled
                .get_or_create(&TemplateLabels { template })
                .set(i64::try_from(waiting).unwrap_or(i64::MAX));
        }
        let proxy = state.connections.stats();
        // Counters only go up: add what the proxy counted since the last scrape.
        let catch_up = |counter: &Counter, total: u64| {
            counter.inc_by(total.saturating_sub(counter.get()));
        };
        catch_up(&self.proxy_connections_opened, proxy.connections_opened);
        catch_up(
            &self.proxy_bytes.get_or_create(&DirectionLabels {
                direction: "to_sandbox",
            }),
            proxy.bytes_to_sandboxes,
        );
        catch_up(
            &self.proxy_bytes.get_or_create(&DirectionLabels {
                direction: "from_sandbox",
            }),
            proxy.bytes_from_sandboxes,
        );
        self.proxy_connections_open
            .set(i64::try_from(proxy.connections_open).unwrap_or(i64::MAX));
        self.process.read();
        let mut text = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &registry) {
            tracing::warn!(%err, "encoding /metrics");
        }
        text
    }
}

struct CriuTimer {
    durations: Histograms<CriuLabels>,
    images: Histogram,
}

impl berth_checkpoint::CriuObserver for CriuTimer {
    fn finished(&self, run: berth_checkpoint::CriuRun) {
        let action = match run.action {
            berth_checkpoint::CriuAction::Dump => "dump",
            berth_checkpoint::CriuAction::Restore => "restore",
        };
        let outcome = if run.ok { Outcome::ok } else { Outcome::error };
        self.durations
            .get_or_create(&CriuLabels { action, outcome })
            .observe(run.duration.as_secs_f64());
        if let Some(bytes) = run.image_bytes {
            self.images.observe(bytes as f64);
        }
    }
}

struct StoreTimer {
    queries: Histogram,
    waits: Histogram,
}

impl berth_store::QueryObserver for StoreTimer {
    fn query_finished(&self, waited: std::time::Duration, held: std::time::Duration) {
        self.waits.observe(waited.as_secs_f64());
        self.queries.observe(held.as_secs_f64());
    }
}

impl ProcessGauges {
    /// Reads `/proc/self`; a field that cannot be read keeps its last value.
    fn read(&self) {
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().collect())
                .unwrap_or_default();
            // utime and stime are fields 14 and 15, starttime 22 (1-based, pid first).
            let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
            if let (Some(user), Some(system)) = (field(14), field(15)) {
                self.cpu_seconds.set((user + system) as f64 / ticks);
            }
            if let (Some(start), Some(boot)) = (field(22), boot_time()) {
                self.start_time_seconds
                    .set(boot as f64 + start as f64 / ticks);
            }
        }
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            for line in status.lines() {
                let value = |prefix: &str| {
                    line.strip_prefix(prefix)
                        .and_then(|rest| rest.split_whitespace().next())
                        .and_then(|v| v.parse::<i64>().ok())
                };
                if let Some(kib) = value("VmRSS:") {
                    self.resident_bytes.set(kib * 1024);
                }
                if let Some(threads) = value("Threads:") {
                    self.threads.set(threads);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds
                .set(i64::try_from(entries.count()).unwrap_or(i64::MAX));
        }
    }
}

/// The boot time in seconds since the epoch (`btime` of /proc/stat).
fn boot_time() -> Option<u64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn operations_are_timed_with_their_outcome() {
        let metrics = Metrics::new();
        let ok: Result<(), ()> = metrics.timed(Operation::create, async { Ok(()) }).await;
        assert!(ok.is_ok());
        let failed: Result<(), ()> = metrics.timed(Operation::fork, async { Err(()) }).await;
        assert!(failed.is_err());
        metrics.webhook_failed("retry");
        metrics.proxied(502);
        metrics.sweeper_failed("mcp_leases", 2);
        metrics.criu_observer().finished(berth_checkpoint::CriuRun {
            action: berth_checkpoint::CriuAction::Dump,
            ok: true,
            duration: std::time::Duration::from_millis(70),
            image_bytes: Some(5 << 20),
        });
        berth_store::QueryObserver::query_finished(
            &*metrics.store_observer(),
            std::time::Duration::ZERO,
            std::time::Duration::from_micros(300),
        );
        metrics.process.read();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry.lock()).unwrap();
        assert!(text.contains(
            r#"berth_sandbox_operation_duration_seconds_count{operation="create",outcome="ok"} 1"#
        ));
        assert!(text.contains(
            r#"berth_sandbox_operation_duration_seconds_count{operation="fork",outcome="error"} 1"#
        ));
        assert!(text.contains(r#"berth_webhook_delivery_failures_total{kind="retry"} 1"#));
        assert!(text.contains(r#"berth_proxy_requests_total{status="5xx"} 1"#));
        assert!(text.contains(r#"berth_sweeper_failures_total{sweeper="mcp_leases"} 2"#));
        assert!(text.contains(r#"berth_criu_duration_seconds_count{action="dump",outcome="ok"} 1"#));
        assert!(text.contains("berth_criu_image_size_bytes_sum 5242880"));
        assert!(text.contains("berth_store_query_duration_seconds_count 1"));
        assert!(text.contains("berth_process_threads "));
        assert!(!text.contains("berth_process_resident_memory_bytes 0\n"));
    }
}
