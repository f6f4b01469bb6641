//! The build queue: builds run on their own threads, a bounded number at a time, with
//! status and log entries kept in memory and on disk so a restarted daemon can tell
//! which builds were interrupted.
//!
//! On disk, per build: `<state>/builds/runs/<build_id>/status.json` (written
//! atomically at each state change; `ready`/`error` is written last, after the
//! template manifest) and `log.jsonl` (one entry per line, appended).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use berth_oci::{ImagePuller, Platform};
use berth_runtime::{LinuxRuntime, Runtime, SandboxInfo};
use berth_template::TemplateStore;
use serde::{Deserialize, Serialize};

use crate::error::BuildError;
use crate::executor::{Executor, TEMPLATE_CHECKPOINT_PREFIX};
use crate::files::{write_atomically, FileStore};
use crate::request::BuildRequest;

/// Build sandboxes' ids start with this; leftovers of a dead daemon are killed at start.
pub const SANDBOX_PREFIX: &str = "bld-";

/// Gives a build sandbox its network. Called right after each build sandbox is created
/// (before any step runs in it); the returned lease is dropped when the sandbox is
/// killed. Without one, build sandboxes have loopback only. This is where sandbox
/// networking (egress policy, the operator's ceiling, the package registries) plugs in.
pub trait BuildNetwork: Send + Sync {
    fn attach(
        &self,
        sandbox: &SandboxInfo,
    ) -> Result<Box<dyn std::any::Any + Send>, Box<dyn std::error::Error + Send + Sync>>;
}

/// Receives `(build id, entry)` for every log entry.
pub type LogSink = Arc<dyn Fn(&str, &LogEntry) + Send + Sync>;

/// Engine settings.
#[derive(Clone)]
pub struct EngineConfig {
    /// berth's state dir (`builds/` lives here; the template store is passed in).
    pub state_dir: PathBuf,
    /// Builds running at once; more wait (status `waiting`).
    pub max_concurrent_builds: usize,
    /// Platform images are pulled for.
    pub platform: Platform,
    /// How long the ready command may keep failing (E2B: 10 minutes).
    pub ready_timeout: Duration,
    /// Longest a single step may run (None: no limit).
    pub step_timeout: Option<Duration>,
    pub network: Option<Arc<dyn BuildNetwork>>,
    /// Called with every log entry as it is made (e.g. to store it in the database).
    pub on_log: Option<LogSink>,
}

impl EngineConfig {
    pub fn new(state_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            state_dir: state_dir.into(),
            max_concurrent_builds: 2,
            platform: Platform::linux_amd64(),
            ready_timeout: Duration::from_secs(600),
            step_timeout: None,
            network: None,
            on_log: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// One build log line, as E2B's `BuildLogEntry` (timestamp, level, step, message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    pub level: LogLevel,
    /// "base", "1".. (the request's steps, 1-based as the SDK counts them), "finalize".
    pub step: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BuildState {
    Waiting,
    Building,
    Ready,
    Error,
}

impl BuildState {
    /// Ready or failed: nothing runs for it any more.
    pub fn is_finished(self) -> bool {
        matches!(self, BuildState::Ready | BuildState::Error)
    }
}

/// Why a build failed (E2B's `reason`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildFailure {
    pub message: String,
    pub step: Option<String>,
}

/// A build's state, as `GET …/builds/{id}/status` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildStatus {
    pub build_id: String,
    pub template_id: String,
    pub state: BuildState,
    pub reason: Option<BuildFailure>,
    pub created_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    /// Steps that ran rather than coming from the cache.
    pub executed_steps: Vec<String>,
}

struct Record {
    status: Mutex<BuildStatus>,
    logs: Mutex<Vec<LogEntry>>,
    cancelled: AtomicBool,
    finished: Condvar,
}

pub(crate) struct Inner {
    pub config: EngineConfig,
    pub runtime: Arc<LinuxRuntime>,
    pub store: TemplateStore,
    pub puller: ImagePuller,
    pub files: FileStore,
    builds: Mutex<HashMap<String, Arc<Record>>>,
    running: Mutex<usize>,
    slot_freed: Condvar,
}

/// Runs template builds. Cheap to clone.
#[derive(Clone)]
pub struct BuildEngine {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl BuildEngine {
    /// Opens the engine: builds a previous daemon left `waiting` or `building` are
    /// marked failed (interrupted) and returned, and leftover build sandboxes are
    /// killed. Call after the runtime's `recover`.
    pub fn new(
        config: EngineConfig,
        runtime: Arc<LinuxRuntime>,
        store: TemplateStore,
        puller: ImagePuller,
    ) -> Result<(BuildEngine, Vec<BuildStatus>), BuildError> {
        let runs = config.state_dir.join("builds").join("runs");
        let cache = config.state_dir.join("builds").join("cache");
        // Build logs and cached step results: root's alone.
        for dir in [&runs, &cache] {
            std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
                .create(dir)
                .map_err(|e| BuildError::io("create", dir, e))?;
        }
        let files = FileStore::open(&config.state_dir)?;
        for sandbox in runtime.list() {
            if sandbox.id.starts_with(SANDBOX_PREFIX) {
                let _ = runtime.kill(&sandbox.id);
            }
        }
        let inner = Arc::new(Inner {
            config,
            runtime,
            store,
            puller,
            files,
            builds: Mutex::new(HashMap::new()),
            running: Mutex::new(0),
            slot_freed: Condvar::new(),
        });
        let engine = BuildEngine { inner };
        let mut interrupted = Vec::new();
        for entry in fs::read_dir(&runs).map_err(|e| BuildError::io("read", &runs, e))? {
            let Ok(entry) = entry else { continue };
            let id = entry.file_name().to_string_lossy().into_owned();
            if let Some(mut status) = engine.read_status(&id) {
                if !status.state.is_finished() {
                    status.state = BuildState::Error;
                    status.reason = Some(BuildFailure {
                        message: BuildError::Interrupted.to_string(),
                        step: None,
                    });
                    status.finished_at_ms = Some(now_ms());
                    engine.write_status(&status);
                    interrupted.push(status);
                }
            }
        }
        Ok((engine, interrupted))
    }

    /// The COPY upload store (`GET /templates/{id}/files/{hash}` and its upload URL).
    pub fn files(&self) -> &FileStore {
        &self.inner.files
    }

    pub fn store(&self) -> &TemplateStore {
        &self.inner.store
    }

    /// Queues `request`; it runs in the background. Fails only if the id is taken.
    pub fn start(&self, request: BuildRequest) -> Result<BuildStatus, BuildError> {
        let id = request.build_id.clone();
        let valid = !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(BuildError::InvalidBuildId(id));
        }
        if let Err(e @ berth_template::TemplateError::InvalidId(_)) =
            self.inner.store.get(&request.template_id)
        {
            return Err(e.into());
        }
        let status = BuildStatus {
            build_id: id.clone(),
            template_id: request.template_id.clone(),
            state: BuildState::Waiting,
            reason: None,
            created_at_ms: now_ms(),
            finished_at_ms: None,
            executed_steps: Vec::new(),
        };
        let record = Arc::new(Record {
            status: Mutex::new(status.clone()),
            logs: Mutex::new(Vec::new()),
            cancelled: AtomicBool::new(false),
            finished: Condvar::new(),
        });
        {
            let mut builds = lock(&self.inner.builds);
            if builds.contains_key(&id) || self.run_dir(&id).exists() {
                return Err(BuildError::AlreadyExists(id));
            }
            let dir = self.run_dir(&id);
            fs::create_dir_all(&dir).map_err(|e| BuildError::io("create", &dir, e))?;
            builds.insert(id.clone(), record.clone());
        }
        self.write_status(&status);
        let engine = self.clone();
        std::thread::Builder::new()
            .name(format!("berth-build-{id}"))
            .spawn(move || engine.run(request, record))
            .map_err(|e| BuildError::io("spawn build thread for", &id, e))?;
        Ok(status)
    }

    /// Builds queued or running now.
    pub fn active_builds(&self) -> usize {
        lock(&self.inner.builds).len()
    }

    /// Status of build `id` (also of builds of earlier daemons).
    pub fn status(&self, id: &str) -> Option<BuildStatus> {
        if let Some(record) = lock(&self.inner.builds).get(id) {
            return Some(lock(&record.status).clone());
        }
        self.read_status(id)
    }

    /// Up to `limit` log entries of build `id` from `offset` (E2B's `logsOffset`).
    pub fn logs(&self, id: &str, offset: usize, limit: usize) -> Vec<LogEntry> {
        if let Some(record) = lock(&self.inner.builds).get(id) {
            return lock(&record.logs)
                .iter()
                .skip(offset)
                .take(limit)
                .cloned()
                .collect();
        }
        let Ok(file) = fs::File::open(self.run_dir(id).join("log.jsonl")) else {
            return Vec::new();
        };
        BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            .filter_map(|line| serde_json::from_str(&line).ok())
            .skip(offset)
            .take(limit)
            .collect()
    }

    /// Cancels build `id`: its processes are killed, its sandboxes and staging removed;
    /// it ends in `error` with reason "build cancelled". A build that has finished is
    /// not found, also in the moment between its final status and leaving memory.
    pub fn cancel(&self, id: &str) -> Result<(), BuildError> {
        let record = lock(&self.inner.builds)
            .get(id)
            .cloned()
            .filter(|r| !lock(&r.status).state.is_finished())
            .ok_or_else(|| BuildError::NotFound(id.to_string()))?;
        record.cancelled.store(true, Ordering::Relaxed);
        self.inner.slot_freed.notify_all();
        Ok(())
    }

    /// Waits until build `id` is ready or failed (or `timeout` passes); its status.
    pub fn wait(&self, id: &str, timeout: Duration) -> Option<BuildStatus> {
        let record = lock(&self.inner.builds).get(id).cloned();
        let Some(record) = record else {
            return self.read_status(id);
        };
        let deadline = Instant::now() + timeout;
        let mut status = lock(&record.status);
        while !status.state.is_finished() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            status = record
                .finished
                .wait_timeout(status, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Some(status.clone())
    }

    /// The id of the memory checkpoint sandboxes of `template_id` start from, if its
    /// build had a start command.
    pub fn template_checkpoint(&self, template_id: &str) -> Option<String> {
        self.inner
            .store
            .get(template_id)
            .ok()
            .and_then(|t| t.checkpoint)
    }

    /// Deletes template checkpoints no template manifest names, current or superseded
    /// (left by removed templates and failed builds). Returns their ids. Call it when no
    /// restore from one runs.
    pub fn remove_unreferenced_checkpoints(&self) -> Result<Vec<String>, BuildError> {
        let store = &self.inner.store;
        let referenced: Vec<String> = store
            .list()?
            .into_iter()
            .chain(store.superseded()?)
            .filter_map(|t| t.checkpoint)
            .collect();
        let mut removed = Vec::new();
        for id in self.inner.runtime.checkpoints()? {
            if id.starts_with(TEMPLATE_CHECKPOINT_PREFIX) && !referenced.contains(&id) {
                self.inner.runtime.delete_checkpoint(&id)?;
                removed.push(id);
            }
        }
        Ok(removed)
    }

    fn run(&self, request: BuildRequest, record: Arc<Record>) {
        let id = request.build_id.clone();
        let log = |level: LogLevel, step: Option<&str>, message: String| {
            self.log(&id, &record, level, step, message);
        };
        let result = match self.take_slot(&record) {
            Err(e) => Err(e),
            Ok(()) => {
                self.set_state(&record, BuildState::Building, None, Vec::new());
                let mut executor = Executor {
                    inner: &self.inner,
                    request: &request,
                    cancelled: &record.cancelled,
                    log: &log,
                    sandbox_seq: 0,
                    executed: Vec::new(),
                };
                let result = executor.run();
                lock(&record.status).executed_steps = executor.executed.clone();
                *self.running() -= 1;
                self.inner.slot_freed.notify_one();
                result.map(|output| output.executed_steps)
            }
        };
        match result {
            Ok(executed) => {
                log(LogLevel::Info, Some("finalize"), "build finished".into());
                self.set_state(&record, BuildState::Ready, None, executed);
            }
            Err(e) => {
                let reason = BuildFailure {
                    message: e.to_string(),
                    step: e.step_name().map(str::to_string),
                };
                log(LogLevel::Error, e.step_name(), format!("build failed: {e}"));
                let executed = lock(&record.status).executed_steps.clone();
                self.set_state(&record, BuildState::Error, Some(reason), executed);
            }
        }
        record.finished.notify_all();
        // Finished builds are served from disk: memory holds only live ones.
        lock(&self.inner.builds).remove(&id);
    }

    fn running(&self) -> MutexGuard<'_, usize> {
        lock(&self.inner.running)
    }

    /// Waits for a free build slot (or cancellation).
    fn take_slot(&self, record: &Record) -> Result<(), BuildError> {
        let mut running = self.running();
        while *running >= self.inner.config.max_concurrent_builds.max(1) {
            if record.cancelled.load(Ordering::Relaxed) {
                return Err(BuildError::Cancelled);
            }
            running = self
                .inner
                .slot_freed
                .wait_timeout(running, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if record.cancelled.load(Ordering::Relaxed) {
            return Err(BuildError::Cancelled);
        }
        *running += 1;
        Ok(())
    }

    fn set_state(
        &self,
        record: &Record,
        state: BuildState,
        reason: Option<BuildFailure>,
        executed: Vec<String>,
    ) {
        let status = {
            let mut status = lock(&record.status);
            status.state = state;
            status.reason = reason;
            status.executed_steps = executed;
            if state.is_finished() {
                status.finished_at_ms = Some(now_ms());
            }
            status.clone()
        };
        self.write_status(&status);
    }

    fn log(&self, id: &str, record: &Record, level: LogLevel, step: Option<&str>, message: String) {
        let entry = LogEntry {
            timestamp_ms: now_ms(),
            level,
            step: step.map(str::to_string),
            message,
        };
        if let Some(on_log) = &self.inner.config.on_log {
            on_log(id, &entry);
        }
        let path = self.run_dir(id).join("log.jsonl");
        let appended = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| {
                let mut line = serde_json::to_vec(&entry).expect("log entries serialize");
                line.push(b'\n');
                f.write_all(&line)
            });
        if let Err(e) = appended {
            tracing::warn!(build = %id, error = %e, "writing a build log");
        }
        lock(&record.logs).push(entry);
    }

    fn run_dir(&self, id: &str) -> PathBuf {
        self.inner
            .config
            .state_dir
            .join("builds")
            .join("runs")
            .join(id)
    }

    fn read_status(&self, id: &str) -> Option<BuildStatus> {
        if id.contains('/') || id.starts_with('.') {
            return None;
        }
        let bytes = fs::read(self.run_dir(id).join("status.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn write_status(&self, status: &BuildStatus) {
        let path = self.run_dir(&status.build_id).join("status.json");
        let bytes = serde_json::to_vec_pretty(status).expect("status serializes");
        if let Err(e) = write_atomically(&path, &bytes) {
            tracing::warn!(build = %status.build_id, error = %e, "writing build status");
        }
    }
}
