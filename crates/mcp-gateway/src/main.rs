//! `mcp-gateway`: start the MCP servers of a sandbox's `mcp` config behind one
//! authenticated streamable-HTTP endpoint (see the crate docs).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use berth_mcp_gateway::detach::{self, Detached, Outcome};
use berth_mcp_gateway::{backend, config, Options, DEFAULT_GIT_URL, GIT_URL_ENV, TOKEN_ENV};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "berth's MCP gateway: the servers of an `mcp` config behind one streamable-HTTP endpoint",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// The servers, as the SDKs send them: {"github/<owner>/<repo>": {"run_cmd": …,
    /// "install_cmd": …, "envs": {…}}, …}. The access token is read from
    /// GATEWAY_ACCESS_TOKEN.
    #[arg(long)]
    config: Option<String>,
    /// Address the gateway serves `/mcp` on.
    #[arg(long, default_value = "0.0.0.0:50005")]
    listen: String,
    /// Where the access token is written (0600) for the SDKs' `get_mcp_token()`.
    #[arg(long, default_value = "/etc/mcp-gateway/.token")]
    token_file: PathBuf,
    /// Repositories are cloned into <dir>/<owner>/<repo>.
    #[arg(long, default_value = "/opt/mcp-servers")]
    servers_dir: PathBuf,
    /// The gateway's and its servers' log.
    #[arg(long, default_value = "/var/log/mcp-gateway/gateway.log")]
    log_file: PathBuf,
    /// Base URL `github/<owner>/<repo>` is cloned from (`<url>/<owner>/<repo>`).
    #[arg(long, env = GIT_URL_ENV, default_value = DEFAULT_GIT_URL)]
    git_url: String,
    /// Seconds each server gets to answer `initialize` once started.
    #[arg(long, default_value_t = 60)]
    init_timeout_secs: u64,
    /// Serve in this process, logging to stderr, instead of returning once ready.
    #[arg(long)]
    foreground: bool,
    /// The background half of a normal start (config on stdin, report on stdout).
    #[arg(long, hide = true)]
    detached: bool,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Pre-pull catalog servers into a template (E2B's `add_mcp_server`): not available
    /// on berth, which runs no Docker images.
    Pull { servers: Vec<String> },
}

impl Cli {
    fn options(&self) -> Options {
        Options {
            listen: self.listen.clone(),
            token_file: self.token_file.clone(),
            servers: backend::Settings {
                git_base: self.git_url.clone(),
                servers_dir: self.servers_dir.clone(),
                init_timeout: Duration::from_secs(self.init_timeout_secs),
            },
        }
    }

    /// The arguments of the detached half (the config goes over stdin).
    fn detached_args(&self) -> Vec<String> {
        vec![
            "--detached".into(),
            "--listen".into(),
            self.listen.clone(),
            "--token-file".into(),
            self.token_file.display().to_string(),
            "--servers-dir".into(),
            self.servers_dir.display().to_string(),
            "--log-file".into(),
            self.log_file.display().to_string(),
            "--git-url".into(),
            self.git_url.clone(),
            "--init-timeout-secs".into(),
            self.init_timeout_secs.to_string(),
        ]
    }
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    if let Err(error) = run(cli) {
        eprintln!("mcp-gateway: {error:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(Sub::Pull { servers }) = &cli.command {
        bail!(
            "cannot pull {}: E2B's catalog servers are Docker images, which berth does not \
             run; configure servers from git repositories at create time instead \
             (\"github/<owner>/<repo>\": {{\"run_cmd\": \"...\"}})",
            servers.join(", ")
        );
    }
    let token = std::env::var(TOKEN_ENV).unwrap_or_default();
    if cli.detached {
        return run_detached(&cli, &token);
    }
    let Some(text) = &cli.config else {
        bail!("--config is required: the servers to start, as JSON");
    };
    // Refused here, before anything starts in the background.
    let servers = config::parse(text)?;
    if token.is_empty() {
        return Err(berth_mcp_gateway::GatewayError::NoToken.into());
    }
    if cli.foreground {
        let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
        return runtime.block_on(async {
            let started = berth_mcp_gateway::start(&servers, &token, &cli.options()).await?;
            eprintln!("mcp-gateway: {}", started.summary);
            started.serve().await.map_err(anyhow::Error::from)
        });
    }
    match detach::spawn_and_wait(&cli.detached_args(), text, &cli.log_file)? {
        Outcome::Ready(summary) => {
            println!("mcp-gateway: {summary}");
            Ok(())
        }
        Outcome::Failed(reason) => bail!("{reason}"),
    }
}

fn run_detached(cli: &Cli, token: &str) -> anyhow::Result<()> {
    let (detached, text) = Detached::begin()?;
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(async {
        let started = match config::parse(&text) {
            Ok(servers) => berth_mcp_gateway::start(&servers, token, &cli.options()).await,
            Err(error) => Err(error.into()),
        };
        let started = match started {
            Ok(started) => started,
            Err(error) => {
                tracing::error!("{error}");
                detached.report(&Outcome::Failed(error.to_string()))?;
                return Err(error.into());
            }
        };
        tracing::info!("{}", started.summary);
        detached.report(&Outcome::Ready(started.summary.clone()))?;
        started.serve().await.map_err(anyhow::Error::from)
    })
}
