//! One running Jupyter kernel: its process (in its own process group), its ZeroMQ
//! sockets (shell, iopub, control, through `jupyter-zmq-client`) and the routing of
//! every message it sends back to whoever is waiting for the request it answers.
//!
//! Two reader tasks (shell replies, iopub broadcasts) hand each message to the
//! [`Request`] whose `msg_id` is its parent; a third task waits for the process and,
//! when it exits, ends every open request with [`KernelEvent::Exited`], so a kernel
//! that dies mid-execution never leaves a stream hanging.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jupyter_protocol::connection_info::Transport;
use jupyter_protocol::{
    ConnectionInfo, ExecuteRequest, InterruptRequest, JupyterMessage, JupyterMessageContent,
    KernelInfoRequest, ShutdownRequest,
};
use jupyter_zmq_client::{DealerSendConnection, RuntimeError};
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::error::KernelError;
use crate::kernelspec::{InterruptMode, Kernelspec};

/// Lines of the kernel process's own stdout/stderr kept for error messages.
const OUTPUT_TAIL_LINES: usize = 40;
/// How long a kernel_info_request waits before another is sent while starting: iopub
/// subscriptions take a moment to reach the kernel, and until then its broadcasts are
/// lost, so start-up repeats the request until one of its iopub messages arrives.
const HANDSHAKE_RETRY: Duration = Duration::from_millis(200);
/// How long a kernel gets to exit after `shutdown_request` before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// What a request hears from the kernel.
#[derive(Debug)]
pub enum KernelEvent {
    /// A broadcast on iopub (stream, display_data, execute_result, error, status, …).
    IoPub(Box<JupyterMessage>),
    /// The reply on the shell channel.
    Reply(Box<JupyterMessage>),
    /// The kernel process exited; nothing more will come.
    Exited(String),
}

/// Where to start a kernel.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Directory for connection files (they hold the HMAC key: created 0600).
    pub runtime_dir: PathBuf,
    pub cwd: PathBuf,
    pub start_timeout: Duration,
    pub transport: Transport,
}

/// TCP kernels start one at a time: a port peeked for one kernel is free again until
/// that kernel binds it, and a second kernel starting meanwhile could be handed it.
static TCP_LAUNCH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Messages waiting for their parent request, and whether the kernel is gone.
#[derive(Default)]
struct Routes {
    waiting: HashMap<String, mpsc::UnboundedSender<KernelEvent>>,
    exited: Option<String>,
}

type SharedRoutes = Arc<Mutex<Routes>>;

fn lock(routes: &SharedRoutes) -> std::sync::MutexGuard<'_, Routes> {
    // A panic while holding this lock leaves the map consistent (single inserts and
    // removes), so a poisoned lock is still safe to use.
    routes
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn dispatch(routes: &SharedRoutes, message: JupyterMessage, reply: bool) {
    let Some(parent) = message.parent_header.as_ref().map(|h| h.msg_id.clone()) else {
        return;
    };
    tracing::trace!(
        msg_type = message.header.msg_type,
        parent,
        reply,
        "kernel message"
    );
    let routes = lock(routes);
    if let Some(sender) = routes.waiting.get(&parent) {
        let event = if reply {
            KernelEvent::Reply(Box::new(message))
        } else {
            KernelEvent::IoPub(Box::new(message))
        };
        // A request that stopped listening is removed by its own Drop.
        let _ = sender.send(event);
    }
}

/// An open request: the events of the kernel's answer, until dropped.
pub struct Request {
    msg_id: String,
    events: mpsc::UnboundedReceiver<KernelEvent>,
    routes: SharedRoutes,
}

impl Request {
    /// The next event; `None` never happens before [`KernelEvent::Exited`] because the
    /// route is only removed when this request is dropped or the kernel exits.
    pub async fn next(&mut self) -> Option<KernelEvent> {
        self.events.recv().await
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        lock(&self.routes).waiting.remove(&self.msg_id);
    }
}

/// A running kernel. Dropping it kills the kernel's whole process group.
pub struct Kernel {
    kernelspec: String,
    interrupt_mode: InterruptMode,
    process_group: Pid,
    shell: tokio::sync::Mutex<DealerSendConnection>,
    control: tokio::sync::Mutex<DealerSendConnection>,
    routes: SharedRoutes,
    exit: watch::Receiver<Option<String>>,
    output: Arc<Mutex<VecDeque<String>>>,
    /// How to reach the kernel again (see [`Kernel::reconnect`]).
    connection: ConnectionInfo,
    start_timeout: Duration,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    _files: RuntimeFiles,
}

/// The connection file and socket files of a kernel, removed with it.
struct RuntimeFiles(Vec<PathBuf>);

impl Drop for RuntimeFiles {
    fn drop(&mut self) {
        for file in &self.0 {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl Kernel {
    /// Starts the kernel and returns once it answered a kernel_info_request on shell
    /// and its iopub broadcasts reach us (so no output of the first execution is lost).
    /// All of it, including the wait for another TCP kernel's start, within
    /// `options.start_timeout`.
    pub async fn start(spec: &Kernelspec, options: &LaunchOptions) -> Result<Kernel, KernelError> {
        let deadline = tokio::time::Instant::now() + options.start_timeout;
        let timed_out = |output: String| KernelError::StartTimeout {
            kernelspec: spec.name.clone(),
            seconds: options.start_timeout.as_secs(),
            output,
        };
        let _tcp_launch = match options.transport {
            Transport::TCP => Some(
                tokio::time::timeout_at(deadline, TCP_LAUNCH.lock())
                    .await
                    .map_err(|_| {
                        timed_out("(none: it waited for another kernel to start)".into())
                    })?,
            ),
            Transport::IPC => None,
        };
        let name = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let (ip, ports, listeners) = match options.transport {
            Transport::TCP => {
                let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
                let (ports, listeners) = jupyter_zmq_client::peek_ports_with_listeners(ip, 5)
                    .await
                    .map_err(KernelError::Ports)?;
                (ip.to_string(), ports, listeners)
            }
            // Socket files <runtime_dir>/<name>-<n>; short, for the 108-byte limit.
            Transport::IPC => (
                options
                    .runtime_dir
                    .join(&name)
                    .to_string_lossy()
                    .into_owned(),
                vec![1, 2, 3, 4, 5],
                Vec::new(),
            ),
        };
        let connection = ConnectionInfo {
            transport: options.transport.clone(),
            ip: ip.clone(),
            stdin_port: ports[0],
            control_port: ports[1],
            hb_port: ports[2],
            shell_port: ports[3],
            iopub_port: ports[4],
            signature_scheme: "hmac-sha256".to_string(),
            key: uuid::Uuid::new_v4().to_string(),
            kernel_name: Some(spec.name.clone()),
        };
        let connection_file = options.runtime_dir.join(format!("{name}.json"));
        write_private(
            &connection_file,
            &serde_json::to_vec(&connection).unwrap_or_default(),
        )
        .map_err(|source| KernelError::ConnectionFile {
            path: connection_file.clone(),
            source,
        })?;
        let mut files = RuntimeFiles(vec![connection_file.clone()]);
        if options.transport == Transport::IPC {
            files
                .0
                .extend(ports.iter().map(|n| PathBuf::from(format!("{ip}-{n}"))));
        }
        let argv = spec.argv(&connection_file)?;
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .current_dir(&options.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: SIGINT reaches the kernel and what it started,
            // and a kill takes all of them.
            .process_group(0)
            .kill_on_drop(true);
        if let Some(env) = &spec.spec.env {
            command.envs(env);
        }
        let spawned = command.spawn();
        // The ports were held until the kernel existed; it binds them first thing.
        drop(listeners);
        let mut child = spawned.map_err(|source| KernelError::Spawn {
            command: argv.join(" "),
            source,
        })?;
        let process_group = child
            .id()
            .and_then(|pid| Pid::from_raw(pid as i32))
            .ok_or_else(|| KernelError::Spawn {
                command: argv.join(" "),
                source: std::io::Error::other("the kernel exited before its pid was read"),
            })?;

        let output = Arc::new(Mutex::new(VecDeque::new()));
        let mut tasks = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            tasks.push(tokio::spawn(keep_tail(
                stdout,
                output.clone(),
                spec.name.clone(),
            )));
        }
        if let Some(stderr) = child.stderr.take() {
            tasks.push(tokio::spawn(keep_tail(
                stderr,
                output.clone(),
                spec.name.clone(),
            )));
        }
        let routes: SharedRoutes = Arc::default();
        let (exit_sender, exit) = watch::channel(None);
        tasks.push(tokio::spawn(wait_for_exit(
            child,
            routes.clone(),
            exit_sender,
        )));

        let mut kernel_tasks = KernelTasks(tasks);
        let connected = tokio::time::timeout_at(
            deadline,
            connect(
                &connection,
                routes.clone(),
                &mut kernel_tasks.0,
                exit.clone(),
            ),
        )
        .await;
        let tail = || tail_text(&output);
        let (shell, control) = match connected {
            Ok(Ok(pair)) => pair,
            Ok(Err(ConnectFailure::Zmq(error))) => {
                kill_group(process_group);
                return Err(KernelError::Connect(error));
            }
            Ok(Err(ConnectFailure::Exited(status))) => {
                return Err(KernelError::ExitedDuringStart {
                    kernelspec: spec.name.clone(),
                    status,
                    output: tail(),
                });
            }
            Err(_) => {
                kill_group(process_group);
                return Err(timed_out(tail()));
            }
        };
        let kernel = Kernel {
            kernelspec: spec.name.clone(),
            interrupt_mode: spec.interrupt_mode(),
            process_group,
            shell: tokio::sync::Mutex::new(shell),
            control: tokio::sync::Mutex::new(control),
            routes,
            exit,
            output,
            connection,
            start_timeout: options.start_timeout,
            tasks: Mutex::new(std::mem::take(&mut kernel_tasks.0)),
            _files: files,
        };
        match kernel.handshake(deadline, options.start_timeout).await {
            Ok(()) => Ok(kernel),
            Err(KernelError::Dead { status }) => Err(KernelError::ExitedDuringStart {
                kernelspec: kernel.kernelspec.clone(),
                status,
                output: tail_text(&kernel.output),
            }),
            Err(error) => Err(error),
        }
    }

    /// Repeats kernel_info_request until one of its iopub broadcasts (the busy/idle
    /// status around it) arrives: that proves the kernel reads shell and that our iopub
    /// subscription is live. (The reply itself is not needed, and some kernels send
    /// kernel_info replies the protocol crate cannot parse.)
    async fn handshake(
        &self,
        deadline: tokio::time::Instant,
        timeout: Duration,
    ) -> Result<(), KernelError> {
        // Every request stays open: a late broadcast for an earlier one counts too.
        let mut requests = Vec::new();
        let (events, mut heard) = mpsc::unbounded_channel();
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(KernelError::StartTimeout {
                    kernelspec: self.kernelspec.clone(),
                    seconds: timeout.as_secs(),
                    output: tail_text(&self.output),
                });
            }
            let mut request = self.send_shell(KernelInfoRequest {}.into()).await?;
            let events = events.clone();
            requests.push(tokio::spawn(async move {
                while let Some(event) = request.next().await {
                    let done = matches!(event, KernelEvent::IoPub(_) | KernelEvent::Exited(_));
                    let _ = events.send(event);
                    if done {
                        break;
                    }
                }
            }));
            let window_end = (now + HANDSHAKE_RETRY).min(deadline);
            while let Ok(event) = tokio::time::timeout_at(window_end, heard.recv()).await {
                match event {
                    Some(KernelEvent::IoPub(_)) => {
                        requests.iter().for_each(JoinHandle::abort);
                        return Ok(());
                    }
                    Some(KernelEvent::Exited(status)) => {
                        requests.iter().for_each(JoinHandle::abort);
                        return Err(KernelError::Dead { status });
                    }
                    Some(KernelEvent::Reply(_)) | None => {}
                }
            }
        }
    }

    /// Sends a message on shell and returns the request that receives its answer. A
    /// kernel whose connections are gone while it still runs (a sandbox restored from a
    /// checkpoint: CRIU restores TCP connections closed, the kernel's listeners stay) is
    /// reconnected once and the message sent again.
    async fn send_shell(&self, message: JupyterMessage) -> Result<Request, KernelError> {
        match self.send_shell_once(message.clone()).await {
            Err(KernelError::Send(error)) if self.exit_status().is_none() => {
                tracing::info!(kernelspec = %self.kernelspec, %error, "kernel connection lost; reconnecting");
                self.reconnect().await?;
                self.send_shell_once(message).await
            }
            other => other,
        }
    }

    async fn send_shell_once(&self, message: JupyterMessage) -> Result<Request, KernelError> {
        let msg_id = message.header.msg_id.clone();
        let request = self.open(msg_id)?;
        self.shell
            .lock()
            .await
            .send(message)
            .await
            .map_err(KernelError::Send)?;
        Ok(request)
    }

    /// New iopub, shell and control connections to the running kernel, live (an iopub
    /// broadcast of a kernel_info_request arrived) before it returns.
    async fn reconnect(&self) -> Result<(), KernelError> {
        let mut shell = self.shell.lock().await;
        let mut control = self.control.lock().await;
        let mut tasks = Vec::new();
        let connected = tokio::time::timeout(
            self.start_timeout,
            connect(
                &self.connection,
                self.routes.clone(),
                &mut tasks,
                self.exit.clone(),
            ),
        )
        .await;
        let (new_shell, new_control) = match connected {
            Ok(Ok(pair)) => pair,
            Ok(Err(ConnectFailure::Zmq(error))) => return Err(KernelError::Connect(error)),
            Ok(Err(ConnectFailure::Exited(status))) => return Err(KernelError::Dead { status }),
            Err(_) => {
                return Err(KernelError::StartTimeout {
                    kernelspec: self.kernelspec.clone(),
                    seconds: self.start_timeout.as_secs(),
                    output: tail_text(&self.output),
                })
            }
        };
        *shell = new_shell;
        *control = new_control;
        drop((shell, control));
        {
            let mut kept = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
            kept.extend(tasks);
        }
        self.live(self.start_timeout).await
    }

    /// Like [`Kernel::handshake`], sending without reconnecting.
    async fn live(&self, timeout: Duration) -> Result<(), KernelError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut request = self.send_shell_once(KernelInfoRequest {}.into()).await?;
            let window_end = (tokio::time::Instant::now() + HANDSHAKE_RETRY).min(deadline);
            while let Ok(event) = tokio::time::timeout_at(window_end, request.next()).await {
                match event {
                    Some(KernelEvent::IoPub(_)) => return Ok(()),
                    Some(KernelEvent::Exited(status)) => return Err(KernelError::Dead { status }),
                    Some(KernelEvent::Reply(_)) => {}
                    None => break,
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KernelError::StartTimeout {
                    kernelspec: self.kernelspec.clone(),
                    seconds: timeout.as_secs(),
                    output: tail_text(&self.output),
                });
            }
        }
    }

    fn open(&self, msg_id: String) -> Result<Request, KernelError> {
        let (sender, events) = mpsc::unbounded_channel();
        let mut routes = lock(&self.routes);
        if let Some(status) = &routes.exited {
            return Err(KernelError::Dead {
                status: status.clone(),
            });
        }
        routes.waiting.insert(msg_id.clone(), sender);
        drop(routes);
        Ok(Request {
            msg_id,
            events,
            routes: self.routes.clone(),
        })
    }

    /// Sends an execute_request. `silent` runs it without history, execution count or
    /// results (the server's own env-var snippets).
    pub async fn execute(&self, code: &str, silent: bool) -> Result<Request, KernelError> {
        let request = ExecuteRequest {
            code: code.to_string(),
            silent,
            store_history: !silent,
            user_expressions: None,
            allow_stdin: false,
            stop_on_error: true,
        };
        self.send_shell(request.into()).await
    }

    /// Interrupts what the kernel is running, the way its kernelspec asks for.
    pub async fn interrupt(&self) -> Result<(), KernelError> {
        match self.interrupt_mode {
            InterruptMode::Signal => {
                rustix::process::kill_process_group(self.process_group, Signal::INT)
                    .map_err(|errno| KernelError::Interrupt(errno.into()))
            }
            InterruptMode::Message => self
                .control
                .lock()
                .await
                .send(InterruptRequest {}.into())
                .await
                .map_err(KernelError::Send),
        }
    }

    /// `Some(status)` once the kernel process has exited.
    pub fn exit_status(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    /// Asks the kernel to shut down, waits briefly, then kills whatever is left.
    pub async fn shutdown(self) {
        let sent = self
            .control
            .lock()
            .await
            .send(ShutdownRequest { restart: false }.into())
            .await;
        if sent.is_ok() {
            let mut exit = self.exit.clone();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, exit.wait_for(Option::is_some)).await;
        }
        drop(self);
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        kill_group(self.process_group);
        let tasks = self.tasks.get_mut().unwrap_or_else(|e| e.into_inner());
        for task in tasks.iter() {
            task.abort();
        }
    }
}

/// Tasks of a kernel that is still starting: aborted if start-up fails.
struct KernelTasks(Vec<JoinHandle<()>>);

impl Drop for KernelTasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

enum ConnectFailure {
    Zmq(RuntimeError),
    Exited(String),
}

/// Connects iopub, shell and control (each `connect` retries until the kernel has
/// bound its port) and starts the reader tasks; fails early if the kernel exits.
async fn connect(
    info: &ConnectionInfo,
    routes: SharedRoutes,
    tasks: &mut Vec<JoinHandle<()>>,
    mut exit: watch::Receiver<Option<String>>,
) -> Result<(DealerSendConnection, DealerSendConnection), ConnectFailure> {
    let session = uuid::Uuid::new_v4().to_string();
    let sockets = async {
        if info.transport == Transport::TCP {
            // Connecting to a port nobody listens on yet can make Linux pick that very
            // port as the connection's source: a TCP self-connect that then steals
            // the kernel's port. Wait until the kernel listens.
            let ports = [info.shell_port, info.iopub_port, info.control_port];
            while !ports.iter().all(|port| tcp_listening(*port)) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let iopub = jupyter_zmq_client::create_client_iopub_connection(info, "", &session).await?;
        let identity = jupyter_zmq_client::peer_identity_for_session(&session)?;
        let shell = jupyter_zmq_client::create_client_shell_connection_with_identity(
            info, &session, identity,
        )
        .await?;
        let control = jupyter_zmq_client::create_client_control_connection(info, &session).await?;
        Ok::<_, RuntimeError>((iopub, shell, control))
    };
    let (mut iopub, shell, control) = tokio::select! {
        sockets = sockets => sockets.map_err(ConnectFailure::Zmq)?,
        status = exit.wait_for(Option::is_some) => {
            let status = status.ok().and_then(|s| s.clone()).unwrap_or_else(|| "unknown".into());
            return Err(ConnectFailure::Exited(status));
        }
    };
    let (shell_send, mut shell_recv) = shell.split();
    let (control_send, mut control_recv) = control.split();
    let iopub_routes = routes.clone();
    tasks.push(tokio::spawn(async move {
        loop {
            match iopub.read().await {
                Ok(message) => dispatch(&iopub_routes, message, false),
                Err(error) if ends_the_socket(&error) => {
                    tracing::debug!(%error, "iopub closed");
                    break;
                }
                Err(error) => {
                    tracing::debug!(%error, "iopub message the protocol crate cannot read; dropped")
                }
            }
        }
    }));
    tasks.push(tokio::spawn(async move {
        loop {
            match shell_recv.read().await {
                Ok(message) => dispatch(&routes, message, true),
                Err(error) if ends_the_socket(&error) => {
                    tracing::debug!(%error, "shell closed");
                    break;
                }
                Err(error) => {
                    tracing::debug!(%error, "shell reply the protocol crate cannot read; dropped")
                }
            }
        }
    }));
    // Control replies (interrupt_reply, shutdown_reply) carry nothing the server needs,
    // but unread they would pile up in the socket.
    tasks.push(tokio::spawn(async move {
        loop {
            match control_recv.read().await {
                Ok(message) => tracing::debug!(msg_type = message.header.msg_type, "control reply"),
                Err(error) if ends_the_socket(&error) => break,
                Err(_) => {}
            }
        }
    }));
    Ok((shell_send, control_send))
}

/// Whether a read error means the socket is gone, as opposed to one message that could
/// not be read (a malformed header, bad framing or signature, content the protocol crate
/// cannot parse): those are dropped and the socket read on. JJava, for one, publishes a
/// status message whose header has no `session` right after it starts; a reader that
/// stopped there never heard the kernel again (a context start then waited out its
/// timeout whenever iopub connected before that message went out).
fn ends_the_socket(error: &RuntimeError) -> bool {
    matches!(error, RuntimeError::ZmqError(_))
}

/// Whether something listens on `port` (from /proc/net/tcp and tcp6 — the JVM binds
/// 127.0.0.1 as an IPv4-mapped IPv6 socket; no side effects, unlike probing with
/// connect or bind).
fn tcp_listening(port: u16) -> bool {
    const LISTEN: &str = "0A";
    let wanted = format!(":{port:04X}");
    let mut readable = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(table) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        let listening = table.lines().skip(1).any(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1).unwrap_or_default();
            let state = fields.nth(1).unwrap_or_default();
            local.ends_with(&wanted) && state == LISTEN
        });
        if listening {
            return true;
        }
    }
    // Without /proc there is nothing to wait for.
    !readable
}

/// Waits for the kernel process and ends every open request when it exits.
async fn wait_for_exit(
    mut child: tokio::process::Child,
    routes: SharedRoutes,
    exit: watch::Sender<Option<String>>,
) {
    let status = match child.wait().await {
        Ok(status) => describe(status),
        Err(error) => format!("wait failed: {error}"),
    };
    let waiting: Vec<_> = {
        let mut routes = lock(&routes);
        routes.exited = Some(status.clone());
        routes.waiting.drain().collect()
    };
    for (_, sender) in waiting {
        let _ = sender.send(KernelEvent::Exited(status.clone()));
    }
    let _ = exit.send(Some(status));
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

fn kill_group(group: Pid) {
    // The group may already be gone; nothing else to do then.
    let _ = rustix::process::kill_process_group(group, Signal::KILL);
}

async fn keep_tail(
    stream: impl AsyncRead + Unpin,
    tail: Arc<Mutex<VecDeque<String>>>,
    kernelspec: String,
) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(kernel = kernelspec, "{line}");
        let mut tail = tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if tail.len() == OUTPUT_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

fn tail_text(tail: &Arc<Mutex<VecDeque<String>>>) -> String {
    let tail = tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if tail.is_empty() {
        return "(none)".into();
    }
    tail.iter().cloned().collect::<Vec<_>>().join("\n")
}

fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents)
}

/// Whether an iopub message is the kernel going idle after the request it answers.
pub fn is_idle(message: &JupyterMessage) -> bool {
    matches!(
        &message.content,
        JupyterMessageContent::Status(status)
            if status.execution_state == jupyter_protocol::ExecutionState::Idle
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_message_does_not_end_the_socket() {
        // JJava's early status message: a header without `session`.
        let header = serde_json::from_str::<jupyter_protocol::Header>(
            r#"{"msg_id":"1","username":"kernel","date":"2026-12-02T06:09:50Z","msg_type":"status","version":"5.3"}"#,
        )
        .unwrap_err();
        assert!(!ends_the_socket(&RuntimeError::SerdeError(header)));
        assert!(!ends_the_socket(&RuntimeError::MissingDelimiter));
        assert!(!ends_the_socket(&RuntimeError::InsufficientMessageParts(2)));
        assert!(ends_the_socket(&RuntimeError::ZmqError(
            zeromq::ZmqError::NoMessage
        )));
    }

    #[test]
    fn sees_loopback_listeners() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(tcp_listening(port));
        drop(listener);
        assert!(!tcp_listening(port));
    }
}
