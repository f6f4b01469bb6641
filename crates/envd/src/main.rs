use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use berth_envd::process::ProcessService;
use berth_envd::reaper::Reaper;
use berth_envd::state::EnvdState;
use clap::Parser;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use tokio::signal::unix::{signal, SignalKind};

/// berth's in-sandbox daemon, wire-compatible with E2B's envd.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:49983")]
    listen: SocketAddr,
}

/// How long processes get to exit on SIGTERM before envd SIGKILLs them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Names the descriptor of a listening socket made for envd before it started: berth's
/// sandbox launcher binds envd's port ahead of the exec, so a connection made while envd
/// starts waits in the backlog instead of being refused. COMPATIBILITY: berth-runtime's
/// `launch::INIT_LISTEN_FD_ENV`; both change together or not at all.
const INHERITED_LISTENER_ENV: &str = "BERTH_INIT_LISTEN_FD";

/// Backlog of envd's listening socket, whoever made it (tokio's default for its own).
const LISTEN_BACKLOG: i32 = 1024;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Before any thread exists: it edits the environment.
    let inherited = inherited_listener().context("taking the socket made for envd")?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the async runtime")?;
    runtime.block_on(run(args, inherited))
}

/// The listening socket named by [`INHERITED_LISTENER_ENV`], if any, its variable removed
/// from envd's environment. No command envd runs inherits it: a child marks every
/// descriptor above stderr close-on-exec before its exec (`process::child`).
fn inherited_listener() -> anyhow::Result<Option<std::net::TcpListener>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    let Some(value) = std::env::var_os(INHERITED_LISTENER_ENV) else {
        return Ok(None);
    };
    std::env::remove_var(INHERITED_LISTENER_ENV);
    let fd: RawFd = value
        .to_str()
        .and_then(|v| v.parse().ok())
        .filter(|fd| *fd > 2)
        .with_context(|| format!("{INHERITED_LISTENER_ENV}={value:?} is not a descriptor"))?;
    // SAFETY: the launcher left this descriptor open for envd alone and named it; nothing
    // else in this process knows it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let listening = nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::AcceptConn)
        .with_context(|| format!("descriptor {fd} is not a socket"))?;
    anyhow::ensure!(listening, "descriptor {fd} is not a listening socket");
    // SAFETY: listen(2) again on a listening socket we own only resizes its backlog.
    if unsafe { libc::listen(socket.as_raw_fd(), LISTEN_BACKLOG) } < 0 {
        return Err(std::io::Error::last_os_error()).context("resizing the backlog");
    }
    let listener = std::net::TcpListener::from(socket);
    listener
        .set_nonblocking(true)
        .context("making the socket non-blocking")?;
    Ok(Some(listener))
}

async fn run(args: Args, inherited: Option<std::net::TcpListener>) -> anyhow::Result<()> {
    let is_init = std::process::id() == 1;
    // Both listeners exist before any child can be spawned or any signal arrive.
    let reaper = Reaper::start(is_init).context("listening for SIGCHLD")?;
    let stop_requested = stop_signals(is_init)?;
    let state = Arc::new(EnvdState::default());
    let processes = ProcessService::new(Arc::clone(&state), reaper);
    let router = berth_envd::server::router(state, &processes);
    let listener = match inherited {
        Some(listener) => tokio::net::TcpListener::from_std(listener)
            .context("serving on the socket made for envd")?,
        None => tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?,
    };
    tracing::info!(
        "berth-envd {} (envd {}) listening on {}",
        env!("CARGO_PKG_VERSION"),
        berth_envd::ENVD_VERSION,
        listener.local_addr()?
    );
    let stop = async {
        let _ = stop_requested.await;
    };
    berth_envd::server::serve(listener, router, stop).await?;
    processes.terminate_all(SHUTDOWN_GRACE).await;
    Ok(())
}

/// Resolves when envd is asked to stop: SIGTERM or SIGINT. As a sandbox's PID 1 only a
/// signal from outside the sandbox counts (its sender is invisible in the sandbox's pid
/// namespace: `si_pid` 0); one sent from inside, even by root, is logged and ignored,
/// and the kernel drops every other signal without a handler sent to a namespace's init
/// from inside. So nothing inside can stop envd; the host ends a sandbox with SIGKILL.
fn stop_signals(is_init: bool) -> anyhow::Result<tokio::sync::oneshot::Receiver<()>> {
    let (stop, stopped) = tokio::sync::oneshot::channel();
    if !is_init {
        let mut sigterm = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
        let mut sigint = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
        tokio::spawn(async move {
            tokio::select! {
                _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
                _ = sigint.recv() => tracing::info!("SIGINT: stopping"),
            }
            let _ = stop.send(());
        });
        return Ok(stopped);
    }
    let mut signals = SignalsInfo::<WithOrigin>::new([libc::SIGTERM, libc::SIGINT])
        .context("listening for SIGTERM and SIGINT")?;
    std::thread::Builder::new()
        .name("envd-signals".into())
        .spawn(move || {
            for origin in signals.forever() {
                match origin.process.map(|sender| sender.pid) {
                    Some(sender) if sender != 0 => tracing::warn!(
                        signal = origin.signal,
                        sender,
                        "ignoring a stop signal sent from inside the sandbox"
                    ),
                    _ => {
                        tracing::info!(signal = origin.signal, "stopping");
                        let _ = stop.send(());
                        return;
                    }
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(stopped)
}
