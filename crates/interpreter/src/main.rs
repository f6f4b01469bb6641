//! `berth-interpreter`: serve the code-interpreter API (see the crate docs).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::serve::ListenerExt;
use berth_interpreter::envd::EnvdClient;
use berth_interpreter::{router, AppState, KernelspecCatalog, Language, Registry, Settings};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "berth's code-interpreter server (E2B's port-49999 API over Jupyter kernels)"
)]
struct Args {
    /// Address to listen on.
    #[arg(
        long,
        env = "BERTH_INTERPRETER_LISTEN",
        default_value = "0.0.0.0:49999"
    )]
    listen: String,
    /// Jupyter data directories searched first for kernelspecs (`<dir>/kernels/<name>`),
    /// before Jupyter's standard ones. Repeatable; colon-separated in the env var.
    #[arg(
        long = "jupyter-path",
        env = "BERTH_INTERPRETER_JUPYTER_PATH",
        value_delimiter = ':'
    )]
    jupyter_path: Vec<PathBuf>,
    /// Search only the --jupyter-path directories, not Jupyter's standard ones.
    #[arg(long)]
    only_jupyter_path: bool,
    /// Directory for kernel connection files (default: a private one under /tmp).
    #[arg(long, env = "BERTH_INTERPRETER_RUNTIME_DIR")]
    runtime_dir: Option<PathBuf>,
    /// Working directory of contexts created without one.
    #[arg(long, env = "BERTH_INTERPRETER_CWD", default_value = "/home/user")]
    default_cwd: String,
    /// Languages whose default context starts before /health reports ready.
    #[arg(
        long,
        env = "BERTH_INTERPRETER_WARM",
        value_delimiter = ',',
        default_value = "python"
    )]
    warm: Vec<String>,
    /// envd's base URL, asked for the sandbox's env vars; empty to not ask.
    #[arg(
        long,
        env = "BERTH_INTERPRETER_ENVD_URL",
        default_value = "http://127.0.0.1:49983"
    )]
    envd_url: String,
    /// Seconds a kernel gets to start and answer. Below the SDKs' 60 s request timeout,
    /// so a kernel that never answers is reported by this server (naming the kernel and
    /// its last output) rather than as the client's own timeout.
    #[arg(long, default_value_t = 45)]
    kernel_start_timeout: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,zeromq=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let warm = args
        .warm
        .iter()
        .filter(|name| !name.trim().is_empty())
        .map(|name| Language::parse(name))
        .collect::<Result<Vec<_>, _>>()
        .context("--warm")?;
    let runtime_dir = match args.runtime_dir {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("berth-interpreter-{}", std::process::id())),
    };
    create_private_dir(&runtime_dir)
        .with_context(|| format!("creating the runtime dir {}", runtime_dir.display()))?;
    let envd = if args.envd_url.is_empty() {
        None
    } else {
        Some(EnvdClient::new(&args.envd_url).context("--envd-url")?)
    };
    let state = Arc::new(AppState {
        registry: Registry::new(Settings {
            catalog: if args.only_jupyter_path {
                KernelspecCatalog::only(args.jupyter_path)
            } else {
                KernelspecCatalog::new(args.jupyter_path)
            },
            runtime_dir: runtime_dir.clone(),
            start_timeout: Duration::from_secs(args.kernel_start_timeout),
            default_cwd: args.default_cwd,
        }),
        envd,
        ready: Default::default(),
    });

    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(address = %listener.local_addr()?, "listening");
    // Small streamed lines must not wait for a delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::warn!(%error, "TCP_NODELAY");
        }
    });
    let server = axum::serve(listener, router(state.clone()));

    let warm_state = state.clone();
    tokio::spawn(async move {
        for language in warm {
            if let Err(error) = warm_state.registry.default_for(language).await {
                // The server still serves; the context is retried on first use.
                tracing::error!(%language, %error, "warm-up failed");
            }
        }
        warm_state.ready.store(true, Ordering::Release);
        tracing::info!("ready");
    });

    server
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("serving")?;
    state.registry.shutdown().await;
    let _ = std::fs::remove_dir_all(&runtime_dir);
    Ok(())
}

fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(_) => return futures::future::pending().await,
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
