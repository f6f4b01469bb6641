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

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
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
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let is_init = std::process::id() == 1;
    // Both listeners exist before any child can be spawned or any signal arrive.
    let reaper = Reaper::start(is_init).context("listening for SIGCHLD")?;
    let stop_requested = stop_signals(is_init)?;
    let state = Arc::new(EnvdState::default());
    let processes = ProcessService::new(Arc::clone(&state), reaper);
    let router = berth_envd::server::router(state, &processes);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
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
