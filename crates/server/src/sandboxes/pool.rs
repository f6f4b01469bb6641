//! Warm pools: sandboxes started ahead of demand, so a create is a claim.
//!
//! For every template a create has used since start, up to `pool_size` sandboxes are
//! kept started with envd answering but not yet initialised: no row, no event, no
//! metrics, invisible to listings. A create that fits (same template and resources, no
//! volumes) takes one — handed out once, under the pool's lock — and the pipeline then
//! does what it does for any new sandbox from the envd-ready stage on: `/init` with the
//! caller's env vars and a new access token, the network policy asked for, the row, the
//! event. Its id was drawn at random when it was prepared and never shown before, so it
//! is the claimant's own. Pooled sandboxes are fresh: none is ever given back.
//!
//! Refilling runs in the background one sandbox at a time (a CPU budget: a create is
//! CPU-bound on small hosts and must not starve live sandboxes), only while the host has
//! memory to spare, and not in the moments right after a claim while the pool still
//! holds a sandbox for the next one: a claimant's first calls come then, and a
//! preparation beside them would take half of a 2-CPU host from them. A template's pool is emptied when the template goes, every pool when
//! the server stops; a pooled sandbox left by a crash has no row and is removed by
//! recovery at the next start.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_runtime::{SandboxInfo, SandboxSpec};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{blocking, kill_in_runtime, new_sandbox_id};
use crate::error::Stage;
use crate::{envd, AppState, SharedState};

/// Refill stops while the host has less memory than this available.
const MIN_AVAILABLE_BYTES: u64 = 1 << 30;
/// Pause between two refills, so a burst of claims does not become a burst of creates.
const REFILL_SPACING: Duration = Duration::from_millis(20);
/// How long after a claim a pool that still holds a sandbox waits before refilling.
const AFTER_CLAIM_QUIET: Duration = Duration::from_millis(250);

/// What pooled sandboxes are made of; a create can take one only on an exact match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct PoolKey {
    pub template: String,
    pub layers: Vec<std::path::PathBuf>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
}

impl PoolKey {
    pub fn of(spec: &SandboxSpec) -> PoolKey {
        PoolKey {
            template: spec.template.clone(),
            layers: spec.layers.clone(),
            cpu_count: spec.cpu_count,
            memory_mb: spec.memory_mb,
            disk_size_mb: spec.disk_size_mb,
        }
    }

    fn spec(&self, id: String) -> SandboxSpec {
        SandboxSpec {
            id,
            template: self.template.clone(),
            layers: self.layers.clone(),
            cpu_count: self.cpu_count,
            memory_mb: self.memory_mb,
            disk_size_mb: self.disk_size_mb,
            volumes: Vec::new(),
        }
    }
}

/// A started, never-initialised sandbox.
pub(super) struct Prepared {
    pub info: SandboxInfo,
}

/// The pools of one server.
pub struct WarmPools {
    size: usize,
    pools: Mutex<HashMap<PoolKey, VecDeque<Prepared>>>,
    wakeup: Notify,
    /// Set when the server stops: the refill task finishes the sandbox it is preparing
    /// (a runtime create cannot be cancelled half way) and returns, so drain sees it.
    stopping: std::sync::atomic::AtomicBool,
    /// Held by the refill task from the start of a preparation until its sandbox is
    /// pooled or, its pool drained meanwhile, killed; [`drain`] waits for it, so no
    /// sandbox of a drained pool outlives the drain.
    preparing: tokio::sync::Mutex<()>,
    /// When a sandbox was last claimed.
    last_claim: Mutex<Option<Instant>>,
}

impl WarmPools {
    /// Pools of `size` sandboxes per template (0: no pools).
    pub fn new(size: usize) -> WarmPools {
        WarmPools {
            size,
            pools: Mutex::new(HashMap::new()),
            wakeup: Notify::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            preparing: tokio::sync::Mutex::new(()),
            last_claim: Mutex::new(None),
        }
    }

    /// A prepared sandbox of `key`, taken out of its pool; registers `key` for refilling
    /// either way (the first create of a template starts its pool).
    pub(super) fn claim(&self, key: &PoolKey) -> Option<Prepared> {
        if self.size == 0 {
            return None;
        }
        let claimed = self
            .pools
            .lock()
            .entry(key.clone())
            .or_default()
            .pop_front();
        if claimed.is_some() {
            *self.last_claim.lock() = Some(Instant::now());
        }
        self.wakeup.notify_one();
        claimed
    }

    /// Asks the refill task to return after the sandbox it is preparing.
    pub(crate) fn stop(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.wakeup.notify_one();
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sandboxes waiting in the pools.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.pools.lock().values().map(VecDeque::len).sum()
    }

    /// Sandboxes waiting, per template (pools of one template with other sizes summed).
    pub(crate) fn waiting_by_template(&self) -> HashMap<String, usize> {
        let mut waiting = HashMap::new();
        for (key, pool) in self.pools.lock().iter() {
            *waiting.entry(key.template.clone()).or_default() += pool.len();
        }
        waiting
    }

    /// The key most short of sandboxes, if any is, with how long to hold off before
    /// refilling it: the rest of the quiet time after the last claim when its pool still
    /// has a sandbox to hand out, else nothing (a claim meanwhile would start cold).
    fn most_needed(&self, now: Instant) -> Option<(PoolKey, Duration)> {
        let (key, waiting) = self
            .pools
            .lock()
            .iter()
            .filter(|(_, waiting)| waiting.len() < self.size)
            .min_by_key(|(_, waiting)| waiting.len())
            .map(|(key, waiting)| (key.clone(), waiting.len()))?;
        let hold_off = match *self.last_claim.lock() {
            Some(claimed) if waiting > 0 => {
                AFTER_CLAIM_QUIET.saturating_sub(now.saturating_duration_since(claimed))
            }
            _ => Duration::ZERO,
        };
        Some((key, hold_off))
    }

    /// Removes and returns every pooled sandbox of `template` (all when `None`).
    fn take_all(&self, template: Option<&str>) -> Vec<Prepared> {
        let mut pools = self.pools.lock();
        let mut taken = Vec::new();
        pools.retain(|key, waiting| {
            if template.is_none_or(|t| t == key.template) {
                taken.extend(waiting.drain(..));
                false
            } else {
                true
            }
        });
        taken
    }
}

/// Kill every pooled sandbox of `template` (every one when `None`) and forget its pool:
/// the template is gone, or the server stops.
pub async fn drain(state: &AppState, template: Option<&str>) {
    let taken = state.pools.take_all(template);
    // A sandbox being prepared for a drained pool is killed by the refill task when it
    // is ready; wait for that.
    drop(state.pools.preparing.lock().await);
    for prepared in taken {
        if let Err(err) = kill_in_runtime(state, &prepared.info.id).await {
            tracing::warn!(sandbox = %prepared.info.id, %err, "removing a pooled sandbox");
        }
    }
}

/// Keeps the pools full, one sandbox at a time, until [`WarmPools::stop`].
pub async fn refill(state: SharedState) {
    loop {
        if state.pools.is_stopping() {
            return;
        }
        let Some((key, hold_off)) = state.pools.most_needed(Instant::now()) else {
            state.pools.wakeup.notified().await;
            continue;
        };
        if !hold_off.is_zero() {
            pause(&state, hold_off).await;
            continue;
        }
        if !memory_to_spare(key.memory_mb) {
            pause(&state, Duration::from_secs(5)).await;
            continue;
        }
        let preparing = state.pools.preparing.lock().await;
        // Drained between the pick and the lock: the drain did not wait for this one.
        if !state.pools.pools.lock().contains_key(&key) {
            continue;
        }
        match prepare(&state, &key).await {
            Ok(prepared) => {
                let unwanted = {
                    let mut pools = state.pools.pools.lock();
                    match pools.get_mut(&key) {
                        Some(waiting) => {
                            waiting.push_back(prepared);
                            None
                        }
                        // Drained meanwhile (template deleted, server stopping).
                        None => Some(prepared.info.id),
                    }
                };
                if let Some(id) = unwanted {
                    let _ = kill_in_runtime(&state, &id).await;
                }
            }
            Err(err) => {
                drop(preparing);
                tracing::warn!(template = %key.template, %err, "preparing a pooled sandbox; retrying later");
                pause(&state, Duration::from_secs(5)).await;
                continue;
            }
        }
        drop(preparing);
        tokio::time::sleep(REFILL_SPACING).await;
    }
}

/// Waits `delay`, or less when a claim or the stop comes meanwhile. The wakeup is not
/// passed on: the loop looks at the pools and the stop flag again right after, and a
/// wakeup stored for the next wait would end that wait at once, again and again.
async fn pause(state: &AppState, delay: Duration) {
    let _ = tokio::time::timeout(delay, state.pools.wakeup.notified()).await;
}

/// One sandbox of `key`, started and answering `/health`.
async fn prepare(state: &AppState, key: &PoolKey) -> Result<Prepared, crate::ServiceError> {
    let id = new_sandbox_id();
    let spec = key.spec(id.clone());
    let runtime = state.runtime.clone();
    let info = blocking(&id, Stage::Create, move || runtime.create(&spec)).await?;
    if let Err(source) =
        envd::wait_healthy(&state.runtime, &state.connections, &id, envd::READY_LIMIT).await
    {
        let _ = kill_in_runtime(state, &id).await;
        return Err(crate::ServiceError::Envd {
            sandbox: id,
            stage: Stage::Create,
            source,
        });
    }
    // Confined now, while nobody waits: the claim's own confine then finds the
    // spawner in place and skips the move (a few ms on cgroup v1).
    let runtime = state.runtime.clone();
    let confined = id.clone();
    if let Err(err) = blocking(&id, Stage::Create, move || {
        runtime.confine_workload(&confined)
    })
    .await
    {
        let _ = kill_in_runtime(state, &id).await;
        return Err(err);
    }
    Ok(Prepared { info })
}

/// Whether the host can hold another sandbox of `memory_mb` beside the floor.
fn memory_to_spare(memory_mb: u64) -> bool {
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else {
        return false;
    };
    let available_kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok());
    available_kib.is_some_and(|kib| kib * 1024 > MIN_AVAILABLE_BYTES + memory_mb * 1024 * 1024)
}

/// Claimed sandboxes leave the pool at once; this keeps a handle on the state for the
/// refill task's lifetime.
pub(crate) fn spawn_refill(state: &SharedState) -> Option<tokio::task::JoinHandle<()>> {
    (state.pools.size > 0).then(|| tokio::spawn(refill(Arc::clone(state))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(template: &str) -> PoolKey {
        PoolKey {
            template: template.into(),
            layers: vec!["/l".into()],
            cpu_count: 1,
            memory_mb: 128,
            disk_size_mb: 64,
        }
    }

    fn prepared(id: &str) -> Prepared {
        let spec = key("t").spec(id.into());
        Prepared {
            info: SandboxInfo {
                id: id.into(),
                template: "t".into(),
                init_pid: 1,
                created_at: std::time::SystemTime::now(),
                spec,
            },
        }
    }

    #[test]
    fn a_sandbox_is_handed_out_once_and_only_for_its_key() {
        let pools = WarmPools::new(2);
        assert!(
            pools.claim(&key("t")).is_none(),
            "the first claim registers the pool"
        );
        pools
            .pools
            .lock()
            .get_mut(&key("t"))
            .unwrap()
            .push_back(prepared("i1"));
        assert!(pools.claim(&key("other")).is_none());
        let mut other_resources = key("t");
        other_resources.memory_mb = 256;
        assert!(pools.claim(&other_resources).is_none());
        assert_eq!(pools.claim(&key("t")).unwrap().info.id, "i1");
        assert!(pools.claim(&key("t")).is_none());
    }

    #[test]
    fn the_emptiest_pool_is_refilled_first_and_size_zero_pools_nothing() {
        let pools = WarmPools::new(2);
        pools.claim(&key("a"));
        pools.claim(&key("b"));
        pools
            .pools
            .lock()
            .get_mut(&key("a"))
            .unwrap()
            .push_back(prepared("i1"));
        let now = Instant::now();
        assert_eq!(pools.most_needed(now).unwrap().0.template, "b");
        let none = WarmPools::new(0);
        assert!(none.claim(&key("a")).is_none());
        assert!(none.most_needed(now).is_none());
    }

    #[test]
    fn a_pool_that_still_holds_a_sandbox_is_refilled_only_once_claims_are_quiet() {
        let pools = WarmPools::new(2);
        pools.claim(&key("a"));
        for id in ["i1", "i2"] {
            pools
                .pools
                .lock()
                .get_mut(&key("a"))
                .unwrap()
                .push_back(prepared(id));
        }
        assert!(pools.most_needed(Instant::now()).is_none(), "full");
        pools.claim(&key("a")).unwrap();
        let claimed = Instant::now();
        let (_, hold_off) = pools.most_needed(claimed).unwrap();
        assert!(hold_off > Duration::ZERO && hold_off <= AFTER_CLAIM_QUIET);
        let (_, hold_off) = pools.most_needed(claimed + AFTER_CLAIM_QUIET).unwrap();
        assert_eq!(hold_off, Duration::ZERO, "quiet long enough");
        pools.claim(&key("a")).unwrap();
        let (_, hold_off) = pools.most_needed(Instant::now()).unwrap();
        assert_eq!(
            hold_off,
            Duration::ZERO,
            "an empty pool is refilled at once"
        );
    }

    #[test]
    fn draining_a_template_takes_only_its_sandboxes() {
        let pools = WarmPools::new(2);
        pools.claim(&key("a"));
        pools.claim(&key("b"));
        pools
            .pools
            .lock()
            .get_mut(&key("a"))
            .unwrap()
            .push_back(prepared("i1"));
        pools
            .pools
            .lock()
            .get_mut(&key("b"))
            .unwrap()
            .push_back(prepared("i2"));
        let taken = pools.take_all(Some("a"));
        assert_eq!(taken.len(), 1);
        assert_eq!(pools.waiting(), 1);
        assert_eq!(pools.take_all(None).len(), 1);
        assert_eq!(pools.waiting(), 0);
    }
}
