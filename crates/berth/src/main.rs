//! berth: the one binary.
//!
//! `berth up` runs the E2B-compatible API, the sandbox proxy and the Linux runtime on
//! one listener, with state under a state directory; `berth keys …` manages API keys in
//! the same state directory, also while `berth up` runs; `berth provision` prepares the
//! base template and CRIU ahead of time; `berth mcp` serves the agent tools over stdio
//! and `berth connect` stores a user's API key for them. This crate only wires the
//! library crates together and renders output; the behaviour lives in them.

mod builds;
mod doctor;
mod egress;
mod gc;
mod install;
mod remote;
mod sandbox_cli;
mod shell;
mod store_cli;
mod template_cli;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use berth_runtime::{LinuxRuntime, LinuxRuntimeConfig};
use berth_server::{Server, ServerConfig};
use berth_store::Store;
use berth_template::{BuildProgress, TemplateStore};
use clap::{Args, Parser, Subcommand};

/// Name of the team and key made on first run.
const DEFAULT_TEAM: &str = "default";
/// How long `berth up` waits for open connections after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

const DEFAULT_STATE_DIR: &str = "/var/lib/berth";

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "Self-hosted, E2B-compatible sandboxes"
)]
struct Cli {
    /// Where berth keeps its database, templates and sandboxes.
    #[arg(
        long,
        env = "BERTH_STATE_DIR",
        default_value = DEFAULT_STATE_DIR,
        global = true
    )]
    state_dir: PathBuf,
    /// Log lines on stderr as text, or as one JSON object per line (with the span
    /// fields: request ids on every line of an API request, sandbox ids where known).
    #[arg(long, env = "BERTH_LOG_FORMAT", default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API, the sandbox proxy and the runtime on one machine.
    Up(UpArgs),
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Provision what `berth up` needs, with progress: the `base` template and a CRIU
    /// that works on this kernel (the host's >= 4.2, else a private copy).
    Provision,
    /// Serve the agent tools (MCP) over stdin/stdout.
    Mcp(McpArgs),
    /// Connect a user's E2B-compatible API key for the agent tools (key read from stdin).
    Connect(ConnectArgs),
    /// Sandboxes of the key's team: ls, create, exec, shell, logs, kill, pause, resume,
    /// fork, snapshot (through the API of a running berth or any E2B-compatible endpoint).
    Sandbox {
        #[command(flatten)]
        api: remote::ApiArgs,
        #[command(subcommand)]
        command: sandbox_cli::SandboxCommand,
    },
    /// Build, list and delete templates through the API.
    Template {
        #[command(flatten)]
        api: remote::ApiArgs,
        #[command(subcommand)]
        command: template_cli::TemplateCommand,
    },
    /// The team's volumes through the API.
    Volume {
        #[command(flatten)]
        api: remote::ApiArgs,
        #[command(subcommand)]
        command: store_cli::VolumeCommand,
    },
    /// The team's secrets through the API (values read from stdin, never printed).
    Secret {
        #[command(flatten)]
        api: remote::ApiArgs,
        #[command(subcommand)]
        command: store_cli::SecretCommand,
    },
    /// Check this host for what `berth up` needs and print the fix for what is missing
    /// (exit status 1 when a check fails).
    Doctor {
        /// State directory whose `criu/` holds a provisioned CRIU (default: as `berth up`).
        #[arg(long, env = "BERTH_CRIU_STATE_DIR")]
        criu_state_dir: Option<PathBuf>,
        /// Print the checks as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List what no daemon owns any more (processes and cgroups of sandboxes whose
    /// directory is gone, loop devices backed by their deleted disks); --yes removes it.
    Gc {
        /// Remove what was found.
        #[arg(long)]
        yes: bool,
        /// Consider every daemon's orphans, not only --state-dir's.
        #[arg(long)]
        all_state_dirs: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write and enable a systemd unit running `berth up` at boot, and its env file
    /// (`/etc/default/berth`, kept when present).
    Install(install::InstallArgs),
    /// Print a shell completion script, e.g. `berth completions bash >
    /// /etc/bash_completion.d/berth`.
    Completions { shell: clap_complete::Shell },
    /// Add a key-encryption key version and re-encrypt every secret and MCP connection
    /// under it (also while `berth up` runs).
    RotateKek,
}

#[derive(Args)]
struct McpArgs {
    /// Which tools to offer: session, connector or all.
    #[arg(long, default_value = "all")]
    toolset: berth_mcp::Toolset,
    /// Identity whose connection and sandboxes the tools use (default: the OS user).
    #[arg(long)]
    user: Option<String>,
    /// Session id (names the session's sandboxes and storage; random when unset).
    #[arg(long)]
    session: Option<String>,
    /// URL of the running `berth up`, used in connect links.
    #[arg(long, env = "BERTH_URL", default_value = "http://127.0.0.1:3000")]
    url: String,
}

#[derive(Args)]
struct ConnectArgs {
    /// Identity to connect (default: the OS user).
    #[arg(long)]
    user: Option<String>,
    /// The E2B-compatible API to use (berth itself, or E2B's cloud).
    #[arg(long)]
    api_url: String,
    /// Sandbox URL for envd traffic when it differs from the API's host.
    #[arg(long)]
    sandbox_url: Option<String>,
    /// URL of the running `berth up`, used in connect links.
    #[arg(long, env = "BERTH_URL", default_value = "http://127.0.0.1:3000")]
    url: String,
}

#[derive(Args)]
struct UpArgs {
    /// Address of the one listener serving both the API and the sandbox proxy.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Domain of `<port>-<sandboxId>.<domain>` sandbox hosts (needs wildcard DNS).
    #[arg(long, env = "BERTH_DOMAIN")]
    domain: Option<String>,
    /// The berth-envd binary run as every sandbox's init (default: next to this binary).
    #[arg(long, env = "BERTH_ENVD_BIN")]
    envd_binary: Option<PathBuf>,
    /// Do not build the `base` template at start (it must then already exist or
    /// sandboxes must use other installed templates).
    #[arg(long, env = "BERTH_SKIP_BASE")]
    skip_base: bool,
    /// Which agent tools `/mcp` offers: session, connector or all.
    #[arg(long, env = "BERTH_MCP_TOOLSET", default_value = "all")]
    mcp_toolset: berth_mcp::Toolset,
    /// Extra Host names `/mcp` accepts (a DNS-rebinding guard: loopback names, the
    /// listen address and `--domain` are always accepted). Comma-separated in the env.
    #[arg(
        long = "mcp-allowed-host",
        env = "BERTH_MCP_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    mcp_allowed_hosts: Vec<String>,
    /// State directory whose `criu/` holds a provisioned CRIU (default: the state dir);
    /// lets several berth instances share one provisioned CRIU.
    #[arg(long, env = "BERTH_CRIU_STATE_DIR")]
    criu_state_dir: Option<PathBuf>,
    #[command(flatten)]
    builds: builds::BuildArgs,
    /// Address pool of sandboxes (one address each); must not overlap the host's routes.
    /// Two berth daemons on one host need distinct pools.
    #[arg(long, env = "BERTH_SANDBOX_CIDR", default_value = berth_net::DEFAULT_SANDBOX_CIDR)]
    sandbox_cidr: ipnet::Ipv4Net,
    /// Sandboxes get only loopback: no egress, no network policies.
    #[arg(long, env = "BERTH_NO_NETWORK")]
    no_network: bool,
    /// The operator's egress ceiling: sandboxes may reach only these CIDRs, addresses and
    /// domains (`*.example.com` too), whatever their own policy says. Unset: the internet.
    #[arg(long, env = "BERTH_EGRESS_ALLOW", value_delimiter = ',')]
    egress_allow: Vec<String>,
    /// CIDRs or addresses no sandbox may reach (on top of the built-in private,
    /// loopback and link-local ranges).
    #[arg(long, env = "BERTH_EGRESS_DENY", value_delimiter = ',')]
    egress_deny: Vec<String>,
    /// Sandboxes kept started per template in use, so a create is a claim (0: none).
    #[arg(long, env = "BERTH_POOL_SIZE", default_value_t = 2)]
    pool_size: usize,
    /// Most connections (conntrack entries) one sandbox may hold through the host.
    #[arg(long, env = "BERTH_SANDBOX_MAX_CONNECTIONS", default_value_t = berth_net::Limits::default().max_connections)]
    sandbox_max_connections: u32,
    /// Bandwidth cap of one sandbox, each way, in megabits per second.
    #[arg(long, env = "BERTH_SANDBOX_MBPS", default_value_t = 1000)]
    sandbox_mbps: u64,
    /// DNS servers (`ip:port`) sandboxes' queries are forwarded to (default: the host's
    /// /etc/resolv.conf).
    #[arg(long, env = "BERTH_DNS_UPSTREAM", value_delimiter = ',')]
    dns_upstream: Vec<SocketAddr>,
    /// Size of every new volume in MiB (a full volume is ENOSPC inside sandboxes; the
    /// image is sparse on the host).
    #[arg(long, env = "BERTH_VOLUME_SIZE_MB", default_value_t = berth_runtime::DEFAULT_VOLUME_SIZE_MB)]
    volume_size_mb: u64,
    /// PEM file of further roots the egress proxy trusts for upstream servers of
    /// `network.rules` domains (besides the host's trust store): private CAs, tests.
    #[arg(long, env = "BERTH_EGRESS_EXTRA_ROOTS")]
    egress_extra_roots: Option<PathBuf>,
    /// Serve Prometheus metrics at `GET /metrics` on this address (a listener of its own,
    /// without authentication: keep it on loopback or a private network).
    #[arg(long, env = "BERTH_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Longest timeout a sandbox may be given, in seconds, or `unlimited`.
    #[arg(long, env = "BERTH_MAX_SANDBOX_LIFETIME", default_value = "86400", value_parser = parse_lifetime)]
    max_sandbox_lifetime: berth_server::MaxLifetime,
    /// Most running sandboxes per team; creates, resumes and forks beyond it get E2B's
    /// 429 (unset: no limit).
    #[arg(long, env = "BERTH_TEAM_MAX_SANDBOXES")]
    team_max_sandboxes: Option<usize>,
}

fn parse_lifetime(text: &str) -> Result<berth_server::MaxLifetime, String> {
    if text.eq_ignore_ascii_case("unlimited") || text.eq_ignore_ascii_case("none") {
        return Ok(berth_server::MaxLifetime::Unlimited);
    }
    match text.parse::<i64>() {
        Ok(seconds) if seconds > 0 && seconds <= i64::from(i32::MAX) => {
            Ok(berth_server::MaxLifetime::Seconds(seconds))
        }
        _ => Err(format!(
            "expected seconds (1..={}) or `unlimited`, got {text:?}",
            i32::MAX
        )),
    }
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create an API key; the key is printed once, as the last line.
    Create {
        /// Team of the key; created if it does not exist (default: the default team).
        #[arg(long)]
        team: Option<String>,
        /// Name of the key.
        #[arg(long, default_value = "cli")]
        name: String,
    },
    /// List API keys (masked) of every team.
    List,
    /// Delete an API key by id.
    Revoke {
        /// Key id, as shown by `berth keys list`.
        id: String,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    match cli.command {
        Command::Up(args) => up(&cli.state_dir, args),
        Command::Keys { command } => keys(&cli.state_dir, command),
        Command::Provision => provision(&cli.state_dir),
        Command::Mcp(args) => mcp_stdio(&cli.state_dir, args),
        Command::Connect(args) => connect(&cli.state_dir, args),
        Command::Sandbox { api, command } => remote_command(&cli.state_dir, &api, |remote| {
            Box::pin(async move { sandbox_cli::run(remote, command).await })
        }),
        Command::Template { api, command } => remote_command(&cli.state_dir, &api, |remote| {
            Box::pin(async move { template_cli::run(remote, command).await.map(|()| 0) })
        }),
        Command::Volume { api, command } => remote_command(&cli.state_dir, &api, |remote| {
            Box::pin(async move { store_cli::volume(remote, command).await.map(|()| 0) })
        }),
        Command::Secret { api, command } => remote_command(&cli.state_dir, &api, |remote| {
            Box::pin(async move { store_cli::secret(remote, command).await.map(|()| 0) })
        }),
        Command::Doctor {
            criu_state_dir: criu,
            json,
        } => {
            let criu = criu_state_dir(&cli.state_dir, criu);
            if !doctor::run(&cli.state_dir, &criu, json)? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Gc {
            yes,
            all_state_dirs,
            json,
        } => gc::run(&cli.state_dir, all_state_dirs, yes, json),
        Command::Install(args) => install::run(&cli.state_dir, args),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "berth",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::RotateKek => rotate_kek(&cli.state_dir),
    }
}

/// Runs one REST-talking verb and exits with its exit code. The process exits without
/// dropping the tokio runtime: a shell's stdin reader may still be blocked in `read`.
fn remote_command(
    state_dir: &Path,
    api: &remote::ApiArgs,
    verb: impl for<'a> FnOnce(
        &'a remote::Remote,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<i32>> + 'a>>,
) -> Result<()> {
    let remote = remote::Remote::connect(api, state_dir)?;
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    let code = runtime.block_on(verb(&remote))?;
    std::process::exit(code)
}

/// Where the secrets vault keeps its key-encryption keys (unless `BERTH_KEK` is set).
fn secrets_key_file(state_dir: &Path) -> PathBuf {
    state_dir.join("secrets").join("kek")
}

fn rotate_kek(state_dir: &Path) -> Result<()> {
    let store = open_store(state_dir)?;
    let secrets = berth_server::rotate_secrets_kek(&store, &secrets_key_file(state_dir))
        .context("rotating the secrets vault's key")?;
    eprintln!(
        "secrets: key version {}, {} version(s) re-encrypted",
        secrets.kek_version, secrets.versions_resealed
    );
    let mcp = berth_mcp::Mcp::open(berth_mcp::McpConfig::new(state_dir.to_path_buf(), ""))
        .context("opening the agent tools' state")?;
    let connections = mcp
        .rotate_kek()
        .context("rotating the agent tools' vault key")?;
    eprintln!(
        "mcp connections: key version {}, {} record(s) re-encrypted",
        connections.kek_version, connections.records_reencrypted
    );
    Ok(())
}

fn provision(state_dir: &Path) -> Result<()> {
    let templates = TemplateStore::open(state_dir).context("opening the template store")?;
    provision_base(&templates)?;
    let criu = berth_checkpoint::Criu::ensure(state_dir, |line| eprintln!("{line}"))
        .context("provisioning CRIU")?;
    let origin = if criu.is_private() {
        "private copy"
    } else {
        "host"
    };
    eprintln!("criu: {} ({origin})", criu.version());
    Ok(())
}

fn mcp_stdio(state_dir: &Path, args: McpArgs) -> Result<()> {
    let mut config = berth_mcp::McpConfig::new(state_dir.to_path_buf(), &args.url);
    config.toolset = args.toolset;
    let identity = args.user.unwrap_or_else(berth_mcp::os_user);
    tokio::runtime::Runtime::new()
        .context("starting tokio")?
        .block_on(berth_mcp::run_stdio(config, identity, args.session))
        .context("serving MCP over stdio")
}

fn connect(state_dir: &Path, args: ConnectArgs) -> Result<()> {
    let config = berth_mcp::McpConfig::new(state_dir.to_path_buf(), &args.url);
    let identity = args.user.unwrap_or_else(berth_mcp::os_user);
    tokio::runtime::Runtime::new()
        .context("starting tokio")?
        .block_on(berth_mcp::run_connect(
            config,
            &identity,
            &args.api_url,
            args.sandbox_url.as_deref(),
        ))
        .context("connecting the API key")?;
    eprintln!("connected {identity} to {}", args.api_url);
    Ok(())
}

/// The identity of an `/mcp` request is the team of its `X-API-Key`: agents reaching
/// berth's own listener authenticate the way the API does. The key was just checked, so
/// it is also the agent's connection to this berth (`api_url`): no connect page needed.
struct ApiKeyIdentity {
    store: Arc<Store>,
    api_url: String,
}

impl berth_mcp::IdentityResolver for ApiKeyIdentity {
    fn identity(&self, parts: &http::request::Parts) -> Option<berth_mcp::Identity> {
        let key = parts.headers.get("x-api-key")?.to_str().ok()?;
        let (team, _) = self.store.authenticate(key).ok()??;
        Some(berth_mcp::Identity::trusted(
            format!("team:{}", team.id),
            berth_mcp::TrustedConnection::new(&self.api_url, key),
        ))
    }

    fn unauthenticated_message(&self) -> String {
        "missing or invalid X-API-Key: /mcp takes an API key of this berth server".into()
    }
}

fn open_store(state_dir: &Path) -> Result<Store> {
    Store::open(state_dir).with_context(|| format!("opening state in {}", state_dir.display()))
}

/// The default team, created on first use. Returns the team and, when the team was
/// just created, its first key (raw, to be shown once).
fn ensure_default_team(store: &Store) -> Result<(berth_store::Team, Option<String>)> {
    if let Some(team) = store.default_team()? {
        return Ok((team, None));
    }
    let team = match store.create_team(DEFAULT_TEAM) {
        Ok(team) => team,
        // Another berth process made it between our check and our insert.
        Err(berth_store::StoreError::TeamExists { .. }) => store
            .team_by_name(DEFAULT_TEAM)?
            .context("default team vanished")?,
        Err(err) => return Err(err.into()),
    };
    let (_, raw) = store.create_api_key(&team.id, "default")?;
    Ok((team, Some(raw)))
}

fn keys(state_dir: &Path, command: KeysCommand) -> Result<()> {
    let store = open_store(state_dir)?;
    match command {
        KeysCommand::Create { team, name } => {
            let team = match team {
                None => ensure_default_team(&store)?.0,
                Some(team_name) => match store.team_by_name(&team_name)? {
                    Some(team) => team,
                    None => match store.create_team(&team_name) {
                        Ok(team) => {
                            eprintln!("created team {team_name} ({})", team.id);
                            team
                        }
                        Err(berth_store::StoreError::TeamExists { .. }) => {
                            store.team_by_name(&team_name)?.context("team vanished")?
                        }
                        Err(err) => return Err(err.into()),
                    },
                },
            };
            let (record, raw) = store.create_api_key(&team.id, &name)?;
            eprintln!("created key {} for team {}", record.id, team.name);
            println!("{raw}");
        }
        KeysCommand::List => {
            println!(
                "{:<36}  {:<16}  {:<16}  {:<14}  CREATED",
                "ID", "TEAM", "NAME", "KEY"
            );
            for (team, key) in store.list_all_api_keys()? {
                let created = key
                    .created_at
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default();
                println!(
                    "{:<36}  {:<16}  {:<16}  {:<14}  {created}",
                    key.id,
                    team,
                    key.name,
                    key.mask.display()
                );
            }
        }
        KeysCommand::Revoke { id } => match store.revoke_api_key(&id) {
            Ok(()) => println!("revoked {id}"),
            Err(berth_store::StoreError::NotFound { .. }) => bail!("no API key with id {id}"),
            Err(err) => return Err(err.into()),
        },
    }
    Ok(())
}

/// Build (or find) the `base` template, rendering progress on stderr.
fn provision_base(templates: &TemplateStore) -> Result<()> {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_style(
        indicatif::ProgressStyle::with_template("{spinner} template base: {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner.set_message("checking");
    let result = templates.ensure_base(|event| match event {
        BuildProgress::WaitingForBuilder { .. } => {
            spinner.set_message("waiting for another berth process building it")
        }
        BuildProgress::Stage { name, detail } => spinner.set_message(format!("{name}: {detail}")),
        BuildProgress::Output { line } => spinner.set_message(line.trim().to_string()),
        BuildProgress::PackageRetrieved { count, name } => {
            spinner.set_message(format!("retrieved {count} packages ({name})"))
        }
        BuildProgress::LayerReady {
            elapsed,
            size_bytes,
            ..
        } => spinner.println(format!(
            "template base: layer built in {:.1}s, {} MiB",
            elapsed.as_secs_f64(),
            size_bytes / (1024 * 1024)
        )),
    });
    match result {
        Ok(_) => {
            spinner.finish_with_message("ready");
            Ok(())
        }
        Err(err) => {
            spinner.abandon_with_message("failed");
            Err(err).context("provisioning the base template")
        }
    }
}

fn default_envd_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("berth-envd")))
        .unwrap_or_else(|| PathBuf::from("berth-envd"))
}

/// The URL clients use for `listen` (a wildcard address is reached over loopback).
fn client_url(listen: SocketAddr) -> String {
    let host = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{host}:{}", listen.port())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(stream) => stream,
        Err(err) => {
            tracing::error!(%err, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

/// Where CRIU is found or provisioned: the given dir, else this state dir if it already
/// holds one, else the default state dir's when that holds one (so a `berth up` with a
/// fresh `--state-dir` does not fetch CRIU again), else this state dir.
fn criu_state_dir(state_dir: &Path, given: Option<PathBuf>) -> PathBuf {
    if let Some(dir) = given {
        return dir;
    }
    let default = Path::new(DEFAULT_STATE_DIR);
    if !state_dir.join("criu").exists() && default.join("criu").exists() {
        return default.to_path_buf();
    }
    state_dir.to_path_buf()
}

fn up(state_dir: &Path, args: UpArgs) -> Result<()> {
    let state_dir = state_dir.to_path_buf();
    let store = Arc::new(open_store(&state_dir)?);
    let (_, first_key) = ensure_default_team(&store)?;
    let templates = TemplateStore::open(&state_dir).context("opening the template store")?;
    if !args.skip_base {
        provision_base(&templates)?;
    }
    let envd_binary = args.envd_binary.unwrap_or_else(default_envd_binary);
    let mut runtime_config = LinuxRuntimeConfig::new(&state_dir, &envd_binary);
    runtime_config.criu_state_dir = criu_state_dir(&state_dir, args.criu_state_dir);
    if !args.no_network {
        let mut network = berth_net::NetConfig::new(&state_dir);
        network.sandbox_cidr = args.sandbox_cidr;
        network.ceiling = berth_net::Ceiling::parse(&args.egress_allow, &args.egress_deny)
            .context("--egress-allow / --egress-deny")?;
        let bytes_per_sec = args.sandbox_mbps * 1_000_000 / 8;
        network.limits = berth_net::Limits {
            max_connections: args.sandbox_max_connections,
            egress_bytes_per_sec: bytes_per_sec,
            ingress_bytes_per_sec: bytes_per_sec,
        };
        runtime_config.network = Some(network);
    }
    runtime_config.volume_size_mb = args.volume_size_mb;
    let runtime = Arc::new(LinuxRuntime::new(runtime_config).context("starting the runtime")?);
    // Pause, resume, snapshots and fork need CRIU; find or provision it now, in the
    // background, so the first pause does not wait for a download.
    let provisioning = runtime.clone();
    std::thread::spawn(move || match provisioning.criu() {
        Ok(criu) => eprintln!("criu {} ready", criu.version()),
        Err(err) => eprintln!("warning: pause, snapshots and fork are unavailable: {err}"),
    });

    let build_engine =
        builds::engine(&state_dir, runtime.clone(), templates.clone(), &args.builds)?;

    let tokio = tokio::runtime::Runtime::new().context("starting tokio")?;
    tokio.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let egress = match runtime.network() {
            Some(net) => {
                let flags = egress::EgressFlags {
                    allow: &args.egress_allow,
                    deny: &args.egress_deny,
                    dns_upstreams: &args.dns_upstream,
                };
                let sandbox_net = runtime.clone();
                let interception = egress::Interception {
                    ca_dir: state_dir.join("egress-ca"),
                    extra_roots: match &args.egress_extra_roots {
                        Some(path) => egress::read_roots(path)?,
                        None => Vec::new(),
                    },
                    secrets: Arc::new(
                        berth_server::SecretsResolver::open(
                            store.clone(),
                            &secrets_key_file(&state_dir),
                            move |addr| match addr {
                                std::net::IpAddr::V4(v4) => {
                                    sandbox_net.network()?.lookup(v4).map(|(id, _)| id)
                                }
                                std::net::IpAddr::V6(_) => None,
                            },
                        )
                        .context("opening the secrets vault for the egress proxy")?,
                    ),
                };
                let handle = egress::start(runtime.clone(), &flags, interception).await?;
                eprintln!(
                    "sandbox network {} (gateway {}), DNS and egress proxy on {}",
                    net.config().sandbox_cidr,
                    net.gateway(),
                    handle.dns_addr
                );
                Some(handle)
            }
            None => None,
        };
        let config = ServerConfig {
            domain: args.domain.clone(),
            template_limits: args.builds.limits(),
            secrets_key_file: Some(secrets_key_file(&state_dir)),
            pool_size: args.pool_size,
            max_lifetime: args.max_sandbox_lifetime,
            team_max_sandboxes: args.team_max_sandboxes,
            ..Default::default()
        };
        let server =
            Server::start_with_builds(store.clone(), runtime, templates, config, Some(build_engine))
                .await
                .context("starting the control plane")?;
        let metrics = match args.metrics_listen {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("listening for /metrics on {addr}"))?;
                eprintln!("metrics on http://{}/metrics", listener.local_addr()?);
                let stop = tokio_util::sync::CancellationToken::new();
                let serving = axum::serve(listener, server.metrics_router())
                    .with_graceful_shutdown(stop.clone().cancelled_owned());
                tokio::spawn(async move {
                    if let Err(err) = serving.await {
                        eprintln!("warning: /metrics listener failed: {err}");
                    }
                });
                Some(stop)
            }
            None => None,
        };
        let url = client_url(listener.local_addr()?);
        remote::record_api_url(&state_dir, &url)?;
        let mut mcp_config = berth_mcp::McpConfig::new(state_dir.clone(), &url);
        mcp_config.toolset = args.mcp_toolset;
        let listen_ip = args.listen.ip();
        if !listen_ip.is_unspecified() && !listen_ip.is_loopback() {
            mcp_config.allowed_hosts.push(listen_ip.to_string());
        }
        mcp_config
            .allowed_hosts
            .extend(args.domain.iter().cloned().chain(args.mcp_allowed_hosts.clone()));
        let mcp = berth_mcp::Mcp::open(mcp_config).context("opening the agent tools' state")?;
        let sweeping = tokio_util::sync::CancellationToken::new();
        let _sweeper = mcp.spawn_sweeper(sweeping.clone());
        let mcp_routes = mcp.http_router(Arc::new(ApiKeyIdentity {
            store,
            api_url: url.clone(),
        }));
        println!("E2B_API_URL={url}");
        println!("E2B_SANDBOX_URL={url}");
        match first_key {
            Some(key) => println!("E2B_API_KEY={key}"),
            None => println!(
                "# E2B_API_KEY was printed on first run; make another with: berth keys create --state-dir {}",
                state_dir.display()
            ),
        }
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(listener, mcp_routes, async move {
            let _ = stop_rx.await;
        }));
        shutdown_signal().await;
        eprintln!("shutting down");
        let _ = stop_tx.send(());
        sweeping.cancel();
        if let Some(metrics) = metrics {
            metrics.cancel();
        }
        // Long-lived proxied streams must not hold the shutdown forever.
        match tokio::time::timeout(SHUTDOWN_GRACE, serving).await {
            Ok(Ok(result)) => result.context("serving")?,
            Ok(Err(join)) => bail!("server task failed: {join}"),
            Err(_) => eprintln!("closing connections still open after {SHUTDOWN_GRACE:?}"),
        }
        if let Some(egress) = egress {
            egress.shutdown(Duration::from_secs(1)).await;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criu_is_looked_for_where_it_already_is() {
        let dir = tempfile::tempdir().unwrap();
        let given = dir.path().join("given");
        assert_eq!(criu_state_dir(dir.path(), Some(given.clone())), given);
        std::fs::create_dir(dir.path().join("criu")).unwrap();
        assert_eq!(criu_state_dir(dir.path(), None), dir.path());
        let fresh = dir.path().join("fresh");
        let expected = if Path::new(DEFAULT_STATE_DIR).join("criu").exists() {
            PathBuf::from(DEFAULT_STATE_DIR)
        } else {
            fresh.clone()
        };
        assert_eq!(criu_state_dir(&fresh, None), expected);
    }

    #[test]
    fn lifetimes_are_seconds_or_unlimited() {
        use berth_server::MaxLifetime;
        assert_eq!(parse_lifetime("600"), Ok(MaxLifetime::Seconds(600)));
        assert_eq!(parse_lifetime("unlimited"), Ok(MaxLifetime::Unlimited));
        assert!(parse_lifetime("0").is_err());
        assert!(parse_lifetime("1h").is_err());
    }

    #[test]
    fn wildcard_listen_addresses_are_reached_over_loopback() {
        assert_eq!(
            client_url("0.0.0.0:3000".parse().unwrap()),
            "http://127.0.0.1:3000"
        );
        assert_eq!(
            client_url("127.0.0.1:80".parse().unwrap()),
            "http://127.0.0.1:80"
        );
        assert_eq!(
            client_url("[::]:3000".parse().unwrap()),
            "http://[::1]:3000"
        );
    }
}
