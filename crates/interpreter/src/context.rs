//! Contexts: a kernel with an id, a language and a working directory, and the
//! registry of them (including the default context of each language).
//!
//! A context's kernel sits behind one async mutex: an execution holds it from the first
//! env-var snippet to the last, so executions in one context run one at a time, in
//! arrival order, while other contexts run concurrently. Restarts take the same lock.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::error::{InterpreterError, KernelError, RequestError};
use crate::kernel::{Kernel, LaunchOptions};
use crate::kernelspec::KernelspecCatalog;
use crate::language::Language;
use crate::output::{ExecutionTracker, OutputEvent};

/// How often a quiet execution writes a keepalive line.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long an abandoned execution gets to stop after an interrupt before its kernel
/// is restarted, so the context is usable again whatever the code does with SIGINT.
const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
/// Bound on the server's own silent snippets (env vars, cwd).
const SNIPPET_TIMEOUT: Duration = Duration::from_secs(30);

/// What every kernel is started with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub catalog: KernelspecCatalog,
    pub runtime_dir: PathBuf,
    pub start_timeout: Duration,
    /// The cwd of contexts created without one (E2B: `/home/user`).
    pub default_cwd: String,
}

/// What `GET /contexts` and `POST /contexts` return.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ContextInfo {
    pub id: String,
    pub language: &'static str,
    pub cwd: String,
}

struct Slot {
    /// `None` after a failed restart; the next execution tries again.
    kernel: Option<Kernel>,
    /// The sandbox-level variables last applied to this kernel.
    sandbox_env: BTreeMap<String, String>,
}

pub struct Context {
    pub id: String,
    pub language: Language,
    pub cwd: String,
    slot: tokio::sync::Mutex<Slot>,
}

impl Context {
    pub fn info(&self) -> ContextInfo {
        ContextInfo {
            id: self.id.clone(),
            language: self.language.name(),
            cwd: self.cwd.clone(),
        }
    }

    async fn start_kernel(&self, settings: &Settings) -> Result<Kernel, KernelError> {
        let spec = settings.catalog.find(self.language)?;
        let options = LaunchOptions {
            runtime_dir: settings.runtime_dir.clone(),
            cwd: PathBuf::from(&self.cwd),
            start_timeout: settings.start_timeout,
            transport: self.language.transport(),
        };
        let kernel = Kernel::start(&spec, &options).await?;
        if let Some(code) = self.language.cwd_code(&self.cwd) {
            run_snippet(&kernel, &code).await;
        }
        Ok(kernel)
    }

    /// Replaces the kernel with a fresh one (state is lost; cwd is kept).
    pub async fn restart(&self, settings: &Settings) -> Result<(), KernelError> {
        let mut slot = self.slot.lock().await;
        if let Some(old) = slot.kernel.take() {
            old.shutdown().await;
        }
        slot.sandbox_env.clear();
        slot.kernel = Some(self.start_kernel(settings).await?);
        Ok(())
    }

    async fn shutdown(&self) {
        if let Some(kernel) = self.slot.lock().await.kernel.take() {
            kernel.shutdown().await;
        }
    }

    /// Runs `code` and writes its events, as NDJSON lines ending with
    /// `end_of_execution`, to `sink`. `env` applies to this execution only;
    /// `sandbox_env` (the sandbox's variables, when known) to every execution from now
    /// on. If the receiver of `sink` goes away the kernel is interrupted.
    pub async fn execute(
        &self,
        settings: &Settings,
        code: &str,
        env: &BTreeMap<String, String>,
        sandbox_env: Option<BTreeMap<String, String>>,
        sink: &mpsc::Sender<Bytes>,
    ) {
        let mut slot = self.slot.lock().await;
        let dead = slot
            .kernel
            .as_ref()
            .map_or(Some("not running".to_string()), Kernel::exit_status);
        if let Some(status) = dead {
            tracing::warn!(context = self.id, %status, "kernel is gone; starting a new one");
            slot.kernel = None;
            slot.sandbox_env.clear();
            match self.start_kernel(settings).await {
                Ok(kernel) => slot.kernel = Some(kernel),
                Err(error) => {
                    let _ = send(
                        sink,
                        &OutputEvent::error("KernelStartFailed", error.to_string()),
                    )
                    .await;
                    let _ = send(sink, &OutputEvent::EndOfExecution).await;
                    return;
                }
            }
        }
        let Slot {
            kernel: Some(kernel),
            sandbox_env: applied,
        } = &mut *slot
        else {
            return;
        };

        let mut before = Vec::new();
        if let Some(sandbox_env) = sandbox_env {
            for (name, value) in &sandbox_env {
                if applied.get(name) != Some(value) {
                    before.push((name.clone(), Some(value.clone())));
                }
            }
            for name in applied.keys() {
                if !sandbox_env.contains_key(name) {
                    before.push((name.clone(), None));
                }
            }
            *applied = sandbox_env;
        }
        before.extend(env.iter().map(|(k, v)| (k.clone(), Some(v.clone()))));
        if !before.is_empty() {
            run_snippet(kernel, &self.language.env_code(&before)).await;
        }

        let outcome =
            stream_execution(kernel, code, sink, self.language.trailing_output_grace()).await;

        let _ = send(sink, &OutputEvent::EndOfExecution).await;
        if outcome == Outcome::KernelGone {
            // Restart now, while the lock is held, so the next execution finds a kernel.
            slot.kernel = None;
            slot.sandbox_env.clear();
            match self.start_kernel(settings).await {
                Ok(kernel) => slot.kernel = Some(kernel),
                Err(error) => tracing::error!(context = self.id, %error, "restart failed"),
            }
            return;
        }
        if !env.is_empty() {
            // Back to the sandbox's value, else to what the kernel was started with (the
            // server's own environment), else unset.
            let restore: Vec<_> = env
                .keys()
                .map(|name| {
                    let value = applied
                        .get(name)
                        .cloned()
                        .or_else(|| std::env::var(name).ok());
                    (name.clone(), value)
                })
                .collect();
            run_snippet(kernel, &self.language.env_code(&restore)).await;
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Done,
    KernelGone,
}

/// Streams one execution's events to `sink` until it is over. A vanished client gets
/// the kernel interrupted; a kernel that ignores the interrupt is treated as gone.
async fn stream_execution(
    kernel: &Kernel,
    code: &str,
    sink: &mpsc::Sender<Bytes>,
    trailing_grace: Duration,
) -> Outcome {
    let mut request = match kernel.execute(code, false).await {
        Ok(request) => request,
        Err(error) => {
            let _ = send(
                sink,
                &OutputEvent::error("KernelUnavailable", error.to_string()),
            )
            .await;
            return Outcome::KernelGone;
        }
    };
    let mut tracker = ExecutionTracker::default();
    let mut client_gone = false;
    let mut interrupted_at: Option<tokio::time::Instant> = None;
    let mut keepalive = tokio::time::interval(KEEPALIVE_INTERVAL);
    keepalive.reset();
    while !tracker.finished() {
        tokio::select! {
            event = request.next() => {
                let Some(event) = event else { return Outcome::KernelGone };
                if let Some(output) = tracker.handle(event) {
                    if !client_gone && send(sink, &output).await.is_err() {
                        client_gone = true;
                    }
                }
            }
            _ = sink.closed(), if !client_gone => client_gone = true,
            _ = keepalive.tick(), if !client_gone => {
                if send(sink, &OutputEvent::Keepalive).await.is_err() {
                    client_gone = true;
                }
            }
            _ = sleep_until(tracker.reply_deadline()) => break,
            _ = sleep_until(interrupted_at.map(|at| at + INTERRUPT_GRACE)) => {
                tracing::warn!("kernel did not stop after an interrupt; restarting it");
                return Outcome::KernelGone;
            }
        }
        if client_gone && interrupted_at.is_none() {
            tracing::info!("client went away during an execution; interrupting the kernel");
            if let Err(error) = kernel.interrupt().await {
                tracing::warn!(%error, "interrupt failed");
            }
            interrupted_at = Some(tokio::time::Instant::now());
        }
    }
    if !trailing_grace.is_zero() && !client_gone {
        while let Ok(Some(event)) = tokio::time::timeout(trailing_grace, request.next()).await {
            if let Some(output) = tracker.handle(event) {
                if send(sink, &output).await.is_err() {
                    break;
                }
            }
        }
    }
    if kernel.exit_status().is_some() {
        Outcome::KernelGone
    } else {
        Outcome::Done
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

/// Runs one of the server's own silent snippets and waits for it; failures are logged
/// (they show up as the variable missing in the user's code, not as a broken stream).
async fn run_snippet(kernel: &Kernel, code: &str) {
    let run = async {
        let mut request = kernel.execute(code, true).await?;
        let mut tracker = ExecutionTracker::default();
        while !tracker.finished() {
            let event = tokio::select! {
                event = request.next() => event,
                _ = sleep_until(tracker.reply_deadline()) => break,
            };
            let Some(event) = event else { break };
            if let Some(OutputEvent::Error { name, value, .. }) = tracker.handle(event) {
                tracing::warn!(%name, %value, code, "server snippet failed");
            }
        }
        Ok::<(), KernelError>(())
    };
    match tokio::time::timeout(SNIPPET_TIMEOUT, run).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, "server snippet could not run"),
        Err(_) => {
            tracing::warn!(code, "server snippet timed out; interrupting");
            let _ = kernel.interrupt().await;
        }
    }
}

async fn send(sink: &mpsc::Sender<Bytes>, event: &OutputEvent) -> Result<(), ()> {
    sink.send(Bytes::from(event.to_line()))
        .await
        .map_err(|_| ())
}

/// All contexts, in creation order, and which one is each language's default.
pub struct Registry {
    settings: Settings,
    contexts: RwLock<Vec<Arc<Context>>>,
    /// Per language: the id of its default context. One async lock per language, so
    /// two first executions in JavaScript start one kernel, not two, while Python's
    /// default is looked up without waiting.
    defaults: HashMap<Language, tokio::sync::Mutex<Option<String>>>,
}

impl Registry {
    pub fn new(settings: Settings) -> Registry {
        Registry {
            settings,
            contexts: RwLock::new(Vec::new()),
            defaults: Language::ALL
                .into_iter()
                .map(|language| (language, tokio::sync::Mutex::new(None)))
                .collect(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Context>>> {
        // Only pushes and removes happen under the write lock; poisoned is still whole.
        self.contexts
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<Context>>> {
        self.contexts
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts a new context's kernel in `cwd` (default: the configured cwd).
    pub async fn create(
        &self,
        language: Language,
        cwd: Option<String>,
    ) -> Result<Arc<Context>, InterpreterError> {
        let cwd = cwd
            .filter(|cwd| !cwd.is_empty())
            .unwrap_or_else(|| self.settings.default_cwd.clone());
        if !std::path::Path::new(&cwd).is_dir() {
            return Err(RequestError::CwdNotFound { cwd }.into());
        }
        let context = Context {
            id: uuid::Uuid::new_v4().to_string(),
            language,
            cwd,
            slot: tokio::sync::Mutex::new(Slot {
                kernel: None,
                sandbox_env: BTreeMap::new(),
            }),
        };
        let kernel = context.start_kernel(&self.settings).await?;
        context.slot.lock().await.kernel = Some(kernel);
        let context = Arc::new(context);
        self.write().push(context.clone());
        tracing::info!(id = context.id, %language, cwd = context.cwd, "context created");
        Ok(context)
    }

    pub fn list(&self) -> Vec<ContextInfo> {
        self.read().iter().map(|context| context.info()).collect()
    }

    pub fn get(&self, id: &str) -> Result<Arc<Context>, RequestError> {
        self.read()
            .iter()
            .find(|context| context.id == id)
            .cloned()
            .ok_or_else(|| RequestError::UnknownContext { id: id.to_string() })
    }

    /// The language's default context, created on first use (or again after it was
    /// removed).
    pub async fn default_for(&self, language: Language) -> Result<Arc<Context>, InterpreterError> {
        let mut default = self.defaults[&language].lock().await;
        if let Some(id) = default.as_deref() {
            if let Ok(context) = self.get(id) {
                return Ok(context);
            }
        }
        let context = self.create(language, None).await?;
        *default = Some(context.id.clone());
        Ok(context)
    }

    pub async fn remove(&self, id: &str) -> Result<(), RequestError> {
        let context = {
            let mut contexts = self.write();
            let index = contexts
                .iter()
                .position(|context| context.id == id)
                .ok_or_else(|| RequestError::UnknownContext { id: id.to_string() })?;
            contexts.remove(index)
        };
        context.shutdown().await;
        tracing::info!(id, "context removed");
        Ok(())
    }

    pub async fn restart(&self, id: &str) -> Result<(), InterpreterError> {
        let context = self.get(id)?;
        context.restart(&self.settings).await?;
        tracing::info!(id, "context restarted");
        Ok(())
    }

    /// Stops every kernel (server shutdown).
    pub async fn shutdown(&self) {
        let contexts: Vec<_> = self.write().drain(..).collect();
        for context in contexts {
            context.shutdown().await;
        }
    }
}
