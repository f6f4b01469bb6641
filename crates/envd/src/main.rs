use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use berth_envd::process::ProcessService;
use berth_envd::reaper::Reaper;
use berth_envd::state::EnvdState;
use clap::Parser;
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
    // As a sandbox's PID 1, envd has no SIGTERM or SIGINT handler: the kernel then drops
    // those (and every other signal but SIGCHLD's) when they come from inside the
    // sandbox, so root inside cannot stop envd; the host ends a sandbox with SIGKILL.
    let stop_signals = if is_init {
        None
    } else {
        Some((
            signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            signal(SignalKind::interrupt()).context("listening for SIGINT")?,
        ))
    };

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
        match stop_signals {
            Some((mut sigterm, mut sigint)) => tokio::select! {
                _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
                _ = sigint.recv() => tracing::info!("SIGINT: stopping"),
            },
            None => std::future::pending().await,
        }
    };
    berth_envd::server::serve(listener, router, stop).await?;
    processes.terminate_all(SHUTDOWN_GRACE).await;
    Ok(())
}
