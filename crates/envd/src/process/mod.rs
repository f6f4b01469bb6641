//! The Process service (`/process.Process/*`): start, observe and control processes.
//!
//! # Process lifetime and timeouts
//!
//! A process lives until it exits or is signalled; a client disconnecting never kills
//! it (E2B's envd kills a process when the stream that started it goes away; berth
//! does not, so background commands survive the script that started them).
//!
//! - **`Connect-Timeout-Ms` on `Start`** is the command's time limit, as the SDKs'
//!   `commands.run(..., timeout=N)` mean it: if the limit passes while the `Start`
//!   stream is still attached, envd kills the process group (SIGKILL) and the stream
//!   ends with `deadline_exceeded`. A client that gives up on the same deadline
//!   itself may close the stream a moment before envd's timer fires; a `Start` stream
//!   that closes within [`DEADLINE_SLACK`] of its deadline therefore counts as timed
//!   out too. A `Start` stream that closes earlier (script exit, `disconnect()`,
//!   network loss) *detaches* the process: its time limit is dropped and it keeps
//!   running. `timeout=0` (no header) means no limit.
//! - **`Connect-Timeout-Ms` on `Connect`** bounds only that stream; the process is
//!   never touched when it passes.
//! - Unary calls are bounded by their own `Connect-Timeout-Ms`.
//! - `Keepalive-Ping-Interval: <s>` makes idle `Start`/`Connect` streams carry
//!   keepalive events every `<s>` seconds.
//! - Output is pushed to every attached stream as it is read (stdout and stderr each
//!   in order). A stream that has not taken an event for [`SLOW_SUBSCRIBER_GRACE`]
//!   with [`SUBSCRIBER_BUFFER`] events queued is cut off with `resource_exhausted`;
//!   the process itself never blocks on a slow client.
//! - After exit the process leaves `List` at once but stays reachable by pid or tag
//!   for [`FINISHED_RETENTION`]: `Connect` then replays its start and end events.
//!   Signals, input and resizes for it answer `not_found`.
//! - Signals go to the process group (each process leads its own session), so a
//!   kill also stops the command's children.

pub(crate) mod child;
pub(crate) mod launch;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::http::HeaderMap;
use axum::Router;
use berth_envd_proto::connect::{Code, ConnectError};
use berth_envd_proto::process::{
    process_event, process_input, process_selector, stream_input_request, CloseStdinRequest,
    CloseStdinResponse, ConnectRequest, ConnectResponse, ListRequest, ListResponse, ProcessEvent,
    ProcessInfo, ProcessInput, ProcessSelector, SendInputRequest, SendInputResponse,
    SendSignalRequest, SendSignalResponse, Signal, StartRequest, StartResponse, StreamInputRequest,
    StreamInputResponse, UpdateRequest, UpdateResponse,
};
use berth_envd_proto::routes;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::connect::{self, MessageStream, RpcContext};
use crate::reaper::Reaper;
use crate::state::EnvdState;
use crate::users::{self, User, UserError};
use child::{AsyncPipe, Credentials, SpawnSpec, TerminalSize};

/// How long a finished process stays reachable by `Connect`.
pub const FINISHED_RETENTION: Duration = Duration::from_secs(30);
/// A `Start` stream closing this close to its deadline counts as timed out.
pub const DEADLINE_SLACK: Duration = Duration::from_secs(1);
/// Events queued per attached stream before the process waits for it.
pub const SUBSCRIBER_BUFFER: usize = 256;
/// How long a full stream may hold up output before it is cut off.
pub const SLOW_SUBSCRIBER_GRACE: Duration = Duration::from_secs(10);

const READ_CHUNK: usize = 32 * 1024;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Processes envd started, running or recently finished.
#[derive(Debug)]
pub struct ProcessService {
    state: Arc<EnvdState>,
    reaper: Arc<Reaper>,
    table: Mutex<HashMap<u32, Arc<ManagedProcess>>>,
}

#[derive(Debug)]
struct ManagedProcess {
    info: ProcessInfo,
    stdin: tokio::sync::Mutex<Option<AsyncPipe>>,
    stdin_enabled: bool,
    pty: Option<Arc<AsyncPipe>>,
    shared: Mutex<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    subscribers: Vec<Subscriber>,
    next_subscriber: u64,
    end: Option<process_event::EndEvent>,
}

#[derive(Debug)]
struct Subscriber {
    id: u64,
    sender: mpsc::Sender<ProcessEvent>,
}

enum Subscription {
    Live(mpsc::Receiver<ProcessEvent>),
    Finished(process_event::EndEvent),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ManagedProcess {
    fn pid(&self) -> u32 {
        self.info.pid
    }

    fn is_running(&self) -> bool {
        lock(&self.shared).end.is_none()
    }

    fn subscribe(&self) -> Subscription {
        let mut shared = lock(&self.shared);
        if let Some(end) = &shared.end {
            return Subscription::Finished(end.clone());
        }
        let (sender, receiver) = mpsc::channel(SUBSCRIBER_BUFFER);
        let id = shared.next_subscriber;
        shared.next_subscriber += 1;
        shared.subscribers.push(Subscriber { id, sender });
        Subscription::Live(receiver)
    }

    async fn publish(&self, event: ProcessEvent) {
        let subscribers: Vec<(u64, mpsc::Sender<ProcessEvent>)> = lock(&self.shared)
            .subscribers
            .iter()
            .map(|s| (s.id, s.sender.clone()))
            .collect();
        let mut gone = Vec::new();
        for (id, sender) in subscribers {
            let sent =
                tokio::time::timeout(SLOW_SUBSCRIBER_GRACE, sender.send(event.clone())).await;
            if !matches!(sent, Ok(Ok(()))) {
                gone.push(id);
            }
        }
        if !gone.is_empty() {
            lock(&self.shared)
                .subscribers
                .retain(|s| !gone.contains(&s.id));
        }
    }

    /// Sends `signal` to the process group, or the process if it has no group.
    fn signal(&self, signal: i32) -> std::io::Result<()> {
        let pid = self.pid() as i32;
        // SAFETY: kill(2) with plain integer arguments.
        if unsafe { libc::kill(-pid, signal) } == 0 {
            return Ok(());
        }
        // SAFETY: as above.
        if unsafe { libc::kill(pid, signal) } == 0 {
            return Ok(());
        }
        Err(std::io::Error::last_os_error())
    }
}

impl ProcessService {
    pub fn new(state: Arc<EnvdState>, reaper: Arc<Reaper>) -> Arc<Self> {
        Arc::new(Self {
            state,
            reaper,
            table: Mutex::new(HashMap::new()),
        })
    }

    /// The service's routes, under `/process.Process/`.
    pub fn router(self: &Arc<Self>) -> Router {
        let start = Arc::clone(self);
        let connect_service = Arc::clone(self);
        let list = Arc::clone(self);
        let send_input = Arc::clone(self);
        let stream_input = Arc::clone(self);
        let send_signal = Arc::clone(self);
        let close_stdin = Arc::clone(self);
        let update = Arc::clone(self);
        Router::new()
            .route(
                routes::PROCESS_START,
                connect::server_stream(move |ctx: RpcContext, request: StartRequest| {
                    let service = Arc::clone(&start);
                    async move { service.start(&ctx, request) }
                }),
            )
            .route(
                routes::PROCESS_CONNECT,
                connect::server_stream(move |_ctx: RpcContext, request: ConnectRequest| {
                    let service = Arc::clone(&connect_service);
                    async move { service.connect(request) }
                }),
            )
            .route(
                routes::PROCESS_LIST,
                connect::unary(move |_ctx: RpcContext, _request: ListRequest| {
                    let service = Arc::clone(&list);
                    async move { Ok(service.list()) }
                }),
            )
            .route(
                routes::PROCESS_SEND_INPUT,
                connect::unary(move |_ctx: RpcContext, request: SendInputRequest| {
                    let service = Arc::clone(&send_input);
                    async move { service.send_input(request).await }
                }),
            )
            .route(
                routes::PROCESS_STREAM_INPUT,
                connect::client_stream(
                    move |_ctx: RpcContext, requests: MessageStream<StreamInputRequest>| {
                        let service = Arc::clone(&stream_input);
                        async move { service.stream_input(requests).await }
                    },
                ),
            )
            .route(
                routes::PROCESS_SEND_SIGNAL,
                connect::unary(move |_ctx: RpcContext, request: SendSignalRequest| {
                    let service = Arc::clone(&send_signal);
                    async move { service.send_signal(request) }
                }),
            )
            .route(
                routes::PROCESS_CLOSE_STDIN,
                connect::unary(move |_ctx: RpcContext, request: CloseStdinRequest| {
                    let service = Arc::clone(&close_stdin);
                    async move { service.close_stdin(request).await }
                }),
            )
            .route(
                routes::PROCESS_UPDATE,
                connect::unary(move |_ctx: RpcContext, request: UpdateRequest| {
                    let service = Arc::clone(&update);
                    async move { service.update(request) }
                }),
            )
    }

    /// Sends SIGTERM to every running process group, waits up to `grace` for them to
    /// exit, then SIGKILLs what is left. Used when envd itself is asked to stop.
    pub async fn terminate_all(&self, grace: Duration) {
        let running: Vec<Arc<ManagedProcess>> = lock(&self.table)
            .values()
            .filter(|p| p.is_running())
            .cloned()
            .collect();
        for process in &running {
            let _ = process.signal(libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && running.iter().any(|p| p.is_running()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for process in running.iter().filter(|p| p.is_running()) {
            let _ = process.signal(libc::SIGKILL);
        }
    }

    fn request_user(&self, headers: &HeaderMap) -> Result<User, ConnectError> {
        request_user(&self.state, headers)
    }

    fn start(
        self: &Arc<Self>,
        ctx: &RpcContext,
        request: StartRequest,
    ) -> Result<impl Stream<Item = Result<StartResponse, ConnectError>> + use<>, ConnectError> {
        let user = self.request_user(&ctx.headers)?;
        let config = request
            .process
            .ok_or_else(|| ConnectError::invalid_argument("process config is required"))?;
        if config.cmd.is_empty() {
            return Err(ConnectError::invalid_argument(
                "process cmd must not be empty",
            ));
        }
        let (default_workdir, init_env) = {
            let defaults = self
                .state
                .defaults
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            (defaults.workdir.clone(), defaults.env_vars.clone())
        };
        let cwd = match &config.cwd {
            Some(cwd) => users::resolve_path(cwd, &user, default_workdir.as_deref())
                .map_err(|err| ConnectError::invalid_argument(err.to_string()))?,
            None => match &default_workdir {
                Some(workdir) => users::resolve_path(workdir, &user, None)
                    .map_err(|err| ConnectError::invalid_argument(err.to_string()))?,
                None => user.home.clone(),
            },
        };
        if !cwd.is_dir() {
            return Err(ConnectError::invalid_argument(format!(
                "cwd '{}' does not exist or is not a directory",
                cwd.display()
            )));
        }
        if let Some(tag) = &request.tag {
            if self.find_by_tag(tag).is_some_and(|p| p.is_running()) {
                return Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("a running process already has tag '{tag}'"),
                ));
            }
        }
        let pty_size = request.pty.as_ref().map(|pty| {
            let size = pty.size.unwrap_or_default();
            TerminalSize {
                cols: clamp_dimension(size.cols, 80),
                rows: clamp_dimension(size.rows, 24),
            }
        });
        let spec = SpawnSpec {
            program: config.cmd.clone(),
            args: config.args.clone(),
            env: process_env(&user, &init_env, &config.envs),
            cwd,
            credentials: credentials_for(&user),
            stdin: request.stdin.unwrap_or(true),
            pty: pty_size,
        };
        let spawned = child::spawn(&self.reaper, &spec).map_err(|err| {
            let code = match err.kind() {
                std::io::ErrorKind::NotFound => Code::InvalidArgument,
                std::io::ErrorKind::PermissionDenied => Code::PermissionDenied,
                _ => Code::Internal,
            };
            ConnectError::new(code, format!("failed to start '{}': {err}", config.cmd))
        })?;
        let pid = spawned.pid as u32;
        let process = Arc::new(ManagedProcess {
            info: ProcessInfo {
                config: Some(config),
                pid,
                tag: request.tag,
            },
            stdin: tokio::sync::Mutex::new(spawned.stdin),
            stdin_enabled: spec.stdin && spec.pty.is_none(),
            pty: spawned.pty.map(Arc::new),
            shared: Mutex::new(Shared::default()),
        });
        let subscription = process.subscribe();
        lock(&self.table).insert(pid, Arc::clone(&process));
        tokio::spawn(pump(
            Arc::clone(self),
            Arc::clone(&process),
            spawned.stdout,
            spawned.stderr,
            spawned.exit,
        ));
        let guard = DeadlineGuard {
            process: Arc::clone(&process),
            deadline: ctx.deadline,
        };
        Ok(event_stream(pid, subscription, Some(guard))
            .map(|event| event.map(|event| StartResponse { event: Some(event) })))
    }

    fn connect(
        &self,
        request: ConnectRequest,
    ) -> Result<impl Stream<Item = Result<ConnectResponse, ConnectError>> + use<>, ConnectError>
    {
        let process = self.select(request.process.as_ref())?;
        let subscription = process.subscribe();
        Ok(event_stream(process.pid(), subscription, None)
            .map(|event| event.map(|event| ConnectResponse { event: Some(event) })))
    }

    fn list(&self) -> ListResponse {
        let mut processes: Vec<ProcessInfo> = lock(&self.table)
            .values()
            .filter(|p| p.is_running())
            .map(|p| p.info.clone())
            .collect();
        processes.sort_by_key(|info| info.pid);
        ListResponse { processes }
    }

    async fn send_input(
        &self,
        request: SendInputRequest,
    ) -> Result<SendInputResponse, ConnectError> {
        let process = self.select_running(request.process.as_ref())?;
        write_input(&process, request.input).await?;
        Ok(SendInputResponse {})
    }

    async fn stream_input(
        &self,
        mut requests: MessageStream<StreamInputRequest>,
    ) -> Result<StreamInputResponse, ConnectError> {
        let mut process = None;
        while let Some(request) = requests.next().await {
            match request?.event {
                Some(stream_input_request::Event::Start(start)) => {
                    process = Some(self.select_running(start.process.as_ref())?);
                }
                Some(stream_input_request::Event::Data(data)) => {
                    let target = process.as_ref().ok_or_else(|| {
                        ConnectError::new(
                            Code::FailedPrecondition,
                            "the first StreamInput message must be a start event naming the process",
                        )
                    })?;
                    write_input(target, data.input).await?;
                }
                Some(stream_input_request::Event::Keepalive(_)) | None => {}
            }
        }
        Ok(StreamInputResponse {})
    }

    fn send_signal(&self, request: SendSignalRequest) -> Result<SendSignalResponse, ConnectError> {
        let process = self.select_running(request.process.as_ref())?;
        let signal = match Signal::try_from(request.signal) {
            Ok(Signal::Sigkill) => libc::SIGKILL,
            Ok(Signal::Sigterm) => libc::SIGTERM,
            _ => {
                return Err(ConnectError::invalid_argument(format!(
                    "unsupported signal {}; use SIGNAL_SIGTERM or SIGNAL_SIGKILL",
                    request.signal
                )))
            }
        };
        process.signal(signal).map_err(|err| {
            ConnectError::internal(format!("failed to signal process {}: {err}", process.pid()))
        })?;
        Ok(SendSignalResponse {})
    }

    async fn close_stdin(
        &self,
        request: CloseStdinRequest,
    ) -> Result<CloseStdinResponse, ConnectError> {
        let process = self.select_running(request.process.as_ref())?;
        if process.pty.is_some() {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                "a PTY process has no separate stdin to close; send Ctrl-D (0x04) as input instead",
            ));
        }
        if !process.stdin_enabled {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                format!("process {} was started without stdin", process.pid()),
            ));
        }
        process.stdin.lock().await.take();
        Ok(CloseStdinResponse {})
    }

    fn update(&self, request: UpdateRequest) -> Result<UpdateResponse, ConnectError> {
        let process = self.select_running(request.process.as_ref())?;
        if let Some(pty) = request.pty {
            let master = process.pty.as_ref().ok_or_else(|| {
                ConnectError::new(
                    Code::FailedPrecondition,
                    format!("process {} has no PTY to resize", process.pid()),
                )
            })?;
            let size = pty.size.unwrap_or_default();
            let size = TerminalSize {
                cols: clamp_dimension(size.cols, 80),
                rows: clamp_dimension(size.rows, 24),
            };
            child::resize(master, size).map_err(|err| {
                ConnectError::internal(format!("failed to resize the PTY: {err}"))
            })?;
        }
        Ok(UpdateResponse {})
    }

    fn find_by_tag(&self, tag: &str) -> Option<Arc<ManagedProcess>> {
        let table = lock(&self.table);
        // A running process wins over finished ones with the same tag.
        table
            .values()
            .filter(|p| p.info.tag.as_deref() == Some(tag))
            .max_by_key(|p| (p.is_running(), p.pid()))
            .cloned()
    }

    fn select(
        &self,
        selector: Option<&ProcessSelector>,
    ) -> Result<Arc<ManagedProcess>, ConnectError> {
        match selector.and_then(|s| s.selector.as_ref()) {
            Some(process_selector::Selector::Pid(pid)) => {
                lock(&self.table).get(pid).cloned().ok_or_else(|| {
                    ConnectError::not_found(format!("process with pid {pid} not found"))
                })
            }
            Some(process_selector::Selector::Tag(tag)) => self.find_by_tag(tag).ok_or_else(|| {
                ConnectError::not_found(format!("process with tag {tag} not found"))
            }),
            None => Err(ConnectError::invalid_argument(
                "a process selector (pid or tag) is required",
            )),
        }
    }

    fn select_running(
        &self,
        selector: Option<&ProcessSelector>,
    ) -> Result<Arc<ManagedProcess>, ConnectError> {
        let process = self.select(selector)?;
        if process.is_running() {
            Ok(process)
        } else {
            Err(ConnectError::not_found(format!(
                "process with pid {} has already exited",
                process.pid()
            )))
        }
    }

    fn forget_later(self: &Arc<Self>, process: &Arc<ManagedProcess>) {
        let service = Arc::downgrade(self);
        let process = Arc::downgrade(process);
        tokio::spawn(async move {
            tokio::time::sleep(FINISHED_RETENTION).await;
            if let (Some(service), Some(process)) = (service.upgrade(), process.upgrade()) {
                let mut table = lock(&service.table);
                if table
                    .get(&process.pid())
                    .is_some_and(|entry| Arc::ptr_eq(entry, &process))
                {
                    table.remove(&process.pid());
                }
            }
        });
    }
}

/// The user a call runs as: `Authorization: Basic` names it, else the `/init` default,
/// else envd's own user.
pub fn request_user(state: &EnvdState, headers: &HeaderMap) -> Result<User, ConnectError> {
    let explicit = match headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|value| value.to_str())
    {
        Some(Ok(value)) => users::basic_auth_username(value).map_err(user_error)?,
        Some(Err(_)) => {
            return Err(ConnectError::new(
                Code::Unauthenticated,
                "invalid Authorization header: not ASCII",
            ))
        }
        None => None,
    };
    let default_user = state
        .defaults
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .user
        .clone();
    state
        .users
        .resolve(explicit.as_deref(), default_user.as_deref())
        .map_err(user_error)
}

fn user_error(err: UserError) -> ConnectError {
    let code = match err {
        // E2B's envd: a user that does not exist cannot be authenticated as.
        UserError::UnknownUser(_) | UserError::InvalidAuthorization(_) => Code::Unauthenticated,
        UserError::Read { .. } => Code::Internal,
    };
    ConnectError::new(code, err.to_string())
}

fn clamp_dimension(value: u32, default: u16) -> u16 {
    match value {
        0 => default,
        v => u16::try_from(v).unwrap_or(u16::MAX),
    }
}

/// Switch credentials when envd is root (always, to drop root's own groups) or when
/// the user differs from envd's; an unprivileged envd running its own user keeps
/// them as they are.
fn credentials_for(user: &User) -> Option<Credentials> {
    let euid = rustix::process::geteuid().as_raw();
    (euid == 0 || euid != user.uid).then(|| Credentials {
        uid: user.uid,
        gid: user.gid,
        groups: user.all_gids(),
    })
}

/// envd's own environment, then the user's identity, then `/init`'s variables, then
/// the request's (later wins).
fn process_env(
    user: &User,
    init_env: &HashMap<String, String>,
    request_env: &HashMap<String, String>,
) -> Vec<(String, String)> {
    let mut env: HashMap<String, String> = std::env::vars().collect();
    env.entry("PATH".into())
        .or_insert_with(|| DEFAULT_PATH.into());
    env.insert("HOME".into(), user.home.display().to_string());
    env.insert("USER".into(), user.name.clone());
    env.insert("LOGNAME".into(), user.name.clone());
    if user.shell != Path::new("") {
        env.insert("SHELL".into(), user.shell.display().to_string());
    }
    env.extend(init_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(request_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.into_iter().collect()
}

async fn write_input(
    process: &ManagedProcess,
    input: Option<ProcessInput>,
) -> Result<(), ConnectError> {
    let input = input
        .and_then(|input| input.input)
        .ok_or_else(|| ConnectError::invalid_argument("input (stdin or pty) is required"))?;
    let write_failed = |err: std::io::Error| {
        ConnectError::new(
            Code::FailedPrecondition,
            format!("writing input to process {} failed: {err}", process.pid()),
        )
    };
    match (input, &process.pty) {
        (process_input::Input::Pty(data) | process_input::Input::Stdin(data), Some(master)) => {
            master.write_all(&data).await.map_err(write_failed)
        }
        (process_input::Input::Pty(_), None) => Err(ConnectError::new(
            Code::FailedPrecondition,
            format!("process {} has no PTY; send stdin instead", process.pid()),
        )),
        (process_input::Input::Stdin(data), None) => {
            let stdin = process.stdin.lock().await;
            match stdin.as_ref() {
                Some(pipe) => pipe.write_all(&data).await.map_err(write_failed),
                None if process.stdin_enabled => Err(ConnectError::new(
                    Code::FailedPrecondition,
                    format!("stdin of process {} is closed", process.pid()),
                )),
                None => Err(ConnectError::new(
                    Code::FailedPrecondition,
                    format!("process {} was started without stdin", process.pid()),
                )),
            }
        }
    }
}

/// Kills the process when its `Start` stream goes away at (or just before) the
/// `Connect-Timeout-Ms` deadline; see the module doc.
struct DeadlineGuard {
    process: Arc<ManagedProcess>,
    deadline: Option<Instant>,
}

impl Drop for DeadlineGuard {
    fn drop(&mut self) {
        let Some(deadline) = self.deadline else {
            return;
        };
        if Instant::now() + DEADLINE_SLACK >= deadline && self.process.is_running() {
            let _ = self.process.signal(libc::SIGKILL);
        }
    }
}

/// The events one `Start` or `Connect` stream sends: start, then live output, then end.
fn event_stream(
    pid: u32,
    subscription: Subscription,
    guard: Option<DeadlineGuard>,
) -> Pin<Box<dyn Stream<Item = Result<ProcessEvent, ConnectError>> + Send>> {
    let start = ProcessEvent {
        event: Some(process_event::Event::Start(process_event::StartEvent {
            pid,
        })),
    };
    let head = futures::stream::iter([Ok(start)]);
    match subscription {
        Subscription::Finished(end) => {
            let end = ProcessEvent {
                event: Some(process_event::Event::End(end)),
            };
            drop(guard);
            Box::pin(head.chain(futures::stream::iter([Ok(end)])))
        }
        Subscription::Live(receiver) => {
            struct Live {
                receiver: mpsc::Receiver<ProcessEvent>,
                ended: bool,
                _guard: Option<DeadlineGuard>,
            }
            let live = Live {
                receiver,
                ended: false,
                _guard: guard,
            };
            let tail = futures::stream::unfold(live, |mut live| async move {
                if live.ended {
                    return None;
                }
                match live.receiver.recv().await {
                    Some(event) => {
                        live.ended = matches!(event.event, Some(process_event::Event::End(_)));
                        Some((Ok(event), live))
                    }
                    None => {
                        live.ended = true;
                        Some((
                            Err(ConnectError::new(
                                Code::ResourceExhausted,
                                "this stream fell too far behind the process's output and was cut off",
                            )),
                            live,
                        ))
                    }
                }
            });
            Box::pin(head.chain(tail))
        }
    }
}

fn data_event(output: process_event::data_event::Output) -> ProcessEvent {
    ProcessEvent {
        event: Some(process_event::Event::Data(process_event::DataEvent {
            output: Some(output),
        })),
    }
}

/// Moves a process's output to its subscribers until it exits, then publishes the end.
async fn pump(
    service: Arc<ProcessService>,
    process: Arc<ManagedProcess>,
    stdout: Option<AsyncPipe>,
    stderr: Option<AsyncPipe>,
    mut exit: tokio::sync::oneshot::Receiver<ExitStatus>,
) {
    use process_event::data_event::Output;
    let oom_kills_at_start = oom_kills();
    let pty = process.pty.clone();
    let mut stdout = stdout;
    let mut stderr = stderr;
    let mut pty_open = pty.is_some();
    let mut out_buf = vec![0u8; READ_CHUNK];
    let mut err_buf = vec![0u8; READ_CHUNK];
    let mut pty_buf = vec![0u8; READ_CHUNK];
    let status = loop {
        if stdout.is_none() && stderr.is_none() && !pty_open {
            break (&mut exit).await.ok();
        }
        tokio::select! {
            read = read_some(stdout.as_ref(), &mut out_buf) => match read {
                Some(n) if n > 0 => process.publish(data_event(Output::Stdout(out_buf[..n].to_vec()))).await,
                _ => stdout = None,
            },
            read = read_some(stderr.as_ref(), &mut err_buf) => match read {
                Some(n) if n > 0 => process.publish(data_event(Output::Stderr(err_buf[..n].to_vec()))).await,
                _ => stderr = None,
            },
            read = read_some(pty.as_deref().filter(|_| pty_open), &mut pty_buf) => match read {
                Some(n) if n > 0 => process.publish(data_event(Output::Pty(pty_buf[..n].to_vec()))).await,
                _ => pty_open = false,
            },
            status = &mut exit => break status.ok(),
        }
    };
    // The process is gone; what it wrote is already in the pipe buffers. Children it
    // left behind may keep the pipes open, so drain only what is there now.
    for (pipe, is_stderr) in [(stdout.as_ref(), false), (stderr.as_ref(), true)] {
        if let Some(pipe) = pipe {
            while let Ok(n) = pipe.try_read(&mut out_buf) {
                if n == 0 {
                    break;
                }
                let chunk = out_buf[..n].to_vec();
                let output = if is_stderr {
                    Output::Stderr(chunk)
                } else {
                    Output::Stdout(chunk)
                };
                process.publish(data_event(output)).await;
            }
        }
    }
    if let Some(master) = pty.as_deref().filter(|_| pty_open) {
        while let Ok(n) = master.try_read(&mut pty_buf) {
            if n == 0 {
                break;
            }
            process
                .publish(data_event(Output::Pty(pty_buf[..n].to_vec())))
                .await;
        }
    }
    let mut end = end_event(status);
    if status.is_some_and(killed_by_sigkill) && oom_kills() > oom_kills_at_start {
        let line = OOM_LINE.as_bytes().to_vec();
        let output = if pty.is_some() {
            Output::Pty(line)
        } else {
            Output::Stderr(line)
        };
        process.publish(data_event(output)).await;
        end.exit_code = 128 + libc::SIGKILL;
        end.error = Some(OOM_LINE.trim_end().to_string());
    }
    process
        .publish(ProcessEvent {
            event: Some(process_event::Event::End(end.clone())),
        })
        .await;
    {
        let mut shared = lock(&process.shared);
        shared.end = Some(end);
        // Dropping the senders ends every live stream after its end event.
        shared.subscribers.clear();
    }
    process.stdin.lock().await.take();
    service.forget_later(&process);
}

async fn read_some(pipe: Option<&AsyncPipe>, buf: &mut [u8]) -> Option<usize> {
    match pipe {
        Some(pipe) => pipe.read(buf).await.ok(),
        None => std::future::pending().await,
    }
}

/// What a command killed by the OOM killer gets on stderr, and as its end event's error.
const OOM_LINE: &str =
    "berth: out of memory: killed by the OOM killer (the sandbox's memory limit was reached)\n";

/// SIGKILLed, or a shell reporting that its last command was (128 + 9).
fn killed_by_sigkill(status: ExitStatus) -> bool {
    status.signal() == Some(libc::SIGKILL) || status.code() == Some(128 + libc::SIGKILL)
}

/// The kernel's count of OOM kills (`oom_kill` in /proc/vmstat), if readable. It is
/// host-wide, so a SIGKILL during which it grew is taken as the OOM killer's: a kill
/// by hand at the very moment another OOM kill happens would be misreported.
fn oom_kills() -> Option<u64> {
    let vmstat = std::fs::read_to_string("/proc/vmstat").ok()?;
    vmstat
        .lines()
        .find_map(|line| line.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// The end event for an exit status, worded like Go's `ProcessState.String()` (what
/// E2B's envd reports): `exit status 3`, `signal: killed`.
fn end_event(status: Option<ExitStatus>) -> process_event::EndEvent {
    let Some(status) = status else {
        return process_event::EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some("the process's exit status was lost".into()),
        };
    };
    if let Some(code) = status.code() {
        return process_event::EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        };
    }
    let signal = status.signal().unwrap_or(0);
    let mut text = format!("signal: {}", signal_name(signal));
    if status.core_dumped() {
        text.push_str(" (core dumped)");
    }
    process_event::EndEvent {
        exit_code: -1,
        exited: false,
        status: text,
        error: None,
    }
}

fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "hangup",
        libc::SIGINT => "interrupt",
        libc::SIGQUIT => "quit",
        libc::SIGILL => "illegal instruction",
        libc::SIGTRAP => "trace/breakpoint trap",
        libc::SIGABRT => "aborted",
        libc::SIGBUS => "bus error",
        libc::SIGFPE => "floating point exception",
        libc::SIGKILL => "killed",
        libc::SIGUSR1 => "user defined signal 1",
        libc::SIGSEGV => "segmentation fault",
        libc::SIGUSR2 => "user defined signal 2",
        libc::SIGPIPE => "broken pipe",
        libc::SIGALRM => "alarm clock",
        libc::SIGTERM => "terminated",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sigkill_directly_or_through_a_shell_counts_as_one() {
        assert!(killed_by_sigkill(ExitStatus::from_raw(libc::SIGKILL)));
        assert!(killed_by_sigkill(ExitStatus::from_raw(137 << 8)));
        assert!(!killed_by_sigkill(ExitStatus::from_raw(libc::SIGTERM)));
        assert!(!killed_by_sigkill(ExitStatus::from_raw(1 << 8)));
        assert!(oom_kills().is_some(), "/proc/vmstat has oom_kill");
    }

    #[test]
    fn end_events_read_like_go() {
        let exited = end_event(Some(ExitStatus::from_raw(3 << 8)));
        assert_eq!((exited.exit_code, exited.exited), (3, true));
        assert_eq!(exited.status, "exit status 3");
        let killed = end_event(Some(ExitStatus::from_raw(libc::SIGKILL)));
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.status, "signal: killed");
        let term = end_event(Some(ExitStatus::from_raw(libc::SIGTERM)));
        assert_eq!(term.status, "signal: terminated");
    }

    #[test]
    fn later_environment_sources_win() {
        let user = User {
            name: "alice".into(),
            uid: 1000,
            gid: 1000,
            groups: vec![],
            home: "/home/alice".into(),
            shell: "/bin/bash".into(),
        };
        let init = HashMap::from([
            ("A".to_string(), "init".to_string()),
            ("B".to_string(), "init".to_string()),
        ]);
        let request = HashMap::from([("B".to_string(), "request".to_string())]);
        let env: HashMap<String, String> =
            process_env(&user, &init, &request).into_iter().collect();
        assert_eq!(env["HOME"], "/home/alice");
        assert_eq!(env["USER"], "alice");
        assert_eq!(env["SHELL"], "/bin/bash");
        assert_eq!(env["A"], "init");
        assert_eq!(env["B"], "request");
        assert!(env.contains_key("PATH"));
    }

    #[test]
    fn pty_dimensions_default_and_clamp() {
        assert_eq!(clamp_dimension(0, 80), 80);
        assert_eq!(clamp_dimension(120, 80), 120);
        assert_eq!(clamp_dimension(1 << 20, 80), u16::MAX);
    }
}
