//! berth: the one binary.
//!
//! `berth up` runs the E2B-compatible API, the sandbox proxy and the Linux runtime on
//! one listener, with state under a state directory; `berth keys …` manages API keys in
//! the same state directory, also while `berth up` runs; `berth provision` prepares the
//! base template and CRIU ahead of time; `berth mcp` serves the agent tools over stdio
//! and `berth connect` stores a user's API key for them. This crate only wires the
//! library crates together and renders output; the behaviour lives in them.

/// A line for the operator on stderr while berth shuts down. Whoever read its output may
/// be gone by then (a service manager stopping the whole process group), and
/// `eprintln!` panics on a closed stderr, which would skip the cleanup after it (the
/// sandbox network, the egress proxy): a line that cannot be written is dropped.
macro_rules! shutdown_note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod builds;
mod cluster_cli;
mod doctor;
mod egress;
mod gc;
mod host_templates;
mod install;
mod limits_config;
mod public;
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
use berth_store::{DatabaseConfig, Store};
use berth_template::{BuildProgress, TemplateStore};
use clap::{Args, Parser, Subcommand};

mod state_dir;

/// Name of the team and key made on first run.
const DEFAULT_TEAM: &str = "default";
/// How long `berth up` waits for open connections after a shutdown signal.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

const DEFAULT_STATE_DIR: &str = "/var/lib/berth";
/// Where the listener's serving CA lives under the state dir (`ca.crt`, `ca.key` 0600).
pub(crate) const SERVING_CA_DIR: &str = "serving-ca";

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
    /// Where the control plane keeps its state: a Postgres URL,
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE` (a password not in the URL is
    /// taken from PGPASSWORD), shared by every berth process given the same URL, or
    /// `sqlite:DIR` for `berth.db` in DIR. Unset: `berth.db` in the state directory
    /// (`berth node` and `berth api` need it set). Templates, sandboxes and checkpoints
    /// stay in the state directory either way.
    #[arg(
        long,
        env = "BERTH_DATABASE_URL",
        global = true,
        hide_env_values = true
    )]
    database: Option<String>,
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
    /// Run one machine of a split deployment: its runtime and sandboxes, for `berth api`
    /// instances (an internal listener admitting only the node token); `berth node
    /// drain NAME` stops placements on a node, `berth node ls` lists them.
    Node(cluster_cli::NodeArgs),
    /// Serve clients in a split deployment: the API, the sandbox proxy, agent tools and
    /// the dashboard, relaying whatever needs a sandbox to the node that holds it.
    Api(cluster_cli::ApiArgs),
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Provision what `berth up` needs, with progress: the `base` template and a CRIU
    /// that works on this kernel (the host's >= 4.2, else a private copy); with
    /// `--template`, also build host templates (`code-interpreter-v1`, `mcp-gateway`)
    /// with the same runtime, network and egress settings `berth up` takes (not while a
    /// `berth up` runs on the same state dir: that one builds them on first use).
    Provision(ProvisionArgs),
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

impl Command {
    /// Whether the command works on the state dir (and so first brings its modes in
    /// line). Client verbs talk REST like any client: they only read the API URL a
    /// local `berth up` recorded, and must work for users who cannot change the state
    /// dir.
    fn owns_state_dir(&self) -> bool {
        !matches!(
            self,
            Command::Sandbox { .. }
                | Command::Template { .. }
                | Command::Volume { .. }
                | Command::Secret { .. }
                | Command::Completions { .. }
        )
    }
}

#[derive(Args)]
struct ProvisionArgs {
    /// Host template to build (repeatable): `code-interpreter-v1`, `mcp-gateway`.
    #[arg(long = "template")]
    templates: Vec<String>,
    #[command(flatten)]
    up: UpArgs,
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
pub(crate) struct UpArgs {
    /// Address of the one listener serving both the API and the sandbox proxy.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:3000")]
    pub(crate) listen: SocketAddr,
    /// Domain of `<port>-<sandboxId>.<domain>` sandbox hosts (needs wildcard DNS), as
    /// the SDKs' `get_host` should append it (a port included when clients reach the
    /// listener on one). Default: `localhost:<listen port>`, which resolves to loopback
    /// where `*.localhost` does (browsers, curl; glibc with `libnss-myhostname`).
    #[arg(long, env = "BERTH_DOMAIN")]
    domain: Option<String>,
    /// The berth-envd binary run as every sandbox's init (default: next to this binary).
    #[arg(long, env = "BERTH_ENVD_BIN")]
    envd_binary: Option<PathBuf>,
    /// Do not build the `base` template at start (it must then already exist or
    /// sandboxes must use other installed templates).
    #[arg(long, env = "BERTH_SKIP_BASE")]
    skip_base: bool,
    #[command(flatten)]
    mcp: public::McpArgs,
    /// State directory whose `criu/` holds a provisioned CRIU (default: the state dir);
    /// lets several berth instances share one provisioned CRIU.
    #[arg(long, env = "BERTH_CRIU_STATE_DIR")]
    criu_state_dir: Option<PathBuf>,
    /// Ranges webhooks may deliver to although berth refuses them by default (loopback,
    /// private, link-local, the host's own addresses): deliberate internal receivers.
    /// Comma-separated CIDRs.
    #[arg(
        long = "webhook-allow",
        env = "BERTH_WEBHOOK_ALLOW",
        value_delimiter = ','
    )]
    webhook_allow: Vec<ipnet::IpNet>,
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
    /// Seconds a memory pause keeps the sandbox's processes frozen, so a resume within
    /// them thaws instead of restoring the images (0: never; the images are written
    /// either way).
    #[arg(long, env = "BERTH_KEEP_PAUSED_SECS", default_value_t = 300)]
    keep_paused_secs: u64,
    /// Most memory, in MiB, paused sandboxes' kept processes may hold together (the
    /// longest kept are ended first). Default: an eighth of the host's memory.
    #[arg(long, env = "BERTH_KEEP_PAUSED_MIB")]
    keep_paused_mib: Option<u64>,
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
    /// Most each sandbox's disk is read, in MiB per second (0: no limit). Reads served
    /// from the page cache do not count.
    #[arg(long, env = "BERTH_SANDBOX_DISK_READ_MIBPS", default_value_t = 512)]
    sandbox_disk_read_mibps: u64,
    /// Most each sandbox's disk is written, in MiB per second (0: no limit), write-back
    /// of its page cache included.
    #[arg(long, env = "BERTH_SANDBOX_DISK_WRITE_MIBPS", default_value_t = 256)]
    sandbox_disk_write_mibps: u64,
    /// Most I/O operations per second on each sandbox's disk, each way (0: no limit).
    #[arg(long, env = "BERTH_SANDBOX_DISK_IOPS", default_value_t = 0)]
    sandbox_disk_iops: u64,
    /// PEM file of further roots the egress proxy trusts for upstream servers of
    /// `network.rules` domains (besides the host's trust store): private CAs, tests.
    #[arg(long, env = "BERTH_EGRESS_EXTRA_ROOTS")]
    egress_extra_roots: Option<PathBuf>,
    /// The static berth-interpreter binary put into `code-interpreter-v1` (default:
    /// next to this binary; without one that template is unavailable).
    #[arg(long, env = "BERTH_INTERPRETER_BIN")]
    interpreter_binary: Option<PathBuf>,
    /// Build `code-interpreter-v1` from this directory (shaped like the repository's
    /// `templates/code-interpreter-v1/`: other pins, more packages) instead of the
    /// definition compiled into berth. A changed definition is rebuilt at start; the
    /// previous build keeps serving until the new one is ready.
    #[arg(long, env = "BERTH_CODE_INTERPRETER_DEFINITION")]
    code_interpreter_definition: Option<PathBuf>,
    /// The static mcp-gateway binary put into the `mcp-gateway` template (default: next
    /// to this binary; without one that template is unavailable).
    #[arg(long, env = "BERTH_MCP_GATEWAY_BIN")]
    mcp_gateway_binary: Option<PathBuf>,
    /// Base URL the MCP gateway clones `github/<owner>/<repo>` servers from
    /// (`<url>/<owner>/<repo>`): a mirror or a git server of your own instead of GitHub.
    #[arg(long, env = "BERTH_MCP_GIT_URL", default_value = "https://github.com")]
    mcp_git_url: String,
    /// PEM roots that `code-interpreter-v1`'s build (and the template) trusts, for a
    /// TLS-intercepting proxy in front of the package registries.
    #[arg(long, env = "BERTH_BUILD_CA_FILE")]
    build_ca_file: Option<PathBuf>,
    /// Serve Prometheus metrics at `GET /metrics` on this address (a listener of its own,
    /// without authentication: keep it on loopback or a private network).
    #[arg(long, env = "BERTH_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    limits: limits_config::LimitArgs,
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
    // Everything berth writes under its state directory (database, records, disks,
    // checkpoints, keys, logs) is readable by root alone unless a mode is set on purpose
    // (the few directories sandboxes traverse, template content, sandboxes' own files).
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
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
    if cli.command.owns_state_dir() {
        state_dir::secure(&cli.state_dir)?;
    }
    // Parsed when a command opens the store, so a bad URL fails only those.
    let database = || {
        DatabaseConfig::from_url(cli.database.as_deref(), &cli.state_dir)
            .context("--database / BERTH_DATABASE_URL")
    };
    match cli.command {
        Command::Up(args) => up(&cli.state_dir, args, &[], Mode::Standalone(database()?)),
        Command::Node(args) => cluster_cli::node(&cli.state_dir, cli.database.as_deref(), args),
        Command::Api(args) => cluster_cli::api(&cli.state_dir, cli.database.as_deref(), args),
        Command::Keys { command } => keys(&database()?, command),
        Command::Provision(args) if args.templates.is_empty() => provision(&cli.state_dir),
        Command::Provision(args) => up(
            &cli.state_dir,
            args.up,
            &args.templates,
            Mode::Standalone(database()?),
        ),
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
        Command::RotateKek => rotate_kek(&cli.state_dir, &database()?),
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
pub(crate) fn secrets_key_file(state_dir: &Path) -> PathBuf {
    state_dir.join("secrets").join("kek")
}

fn rotate_kek(state_dir: &Path, database: &DatabaseConfig) -> Result<()> {
    let store = open_store(database)?;
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

pub(crate) fn open_store(database: &DatabaseConfig) -> Result<Store> {
    let store = Store::connect(database)
        .with_context(|| format!("opening state in {}", database.describe()))?;
    eprintln!("state: {}", database.describe());
    Ok(store)
}

/// The default team, created on first use. Returns the team and whether this call
/// created it.
pub(crate) fn ensure_default_team(store: &Store) -> Result<(berth_store::Team, bool)> {
    if let Some(team) = store.default_team()? {
        return Ok((team, false));
    }
    match store.create_team(DEFAULT_TEAM) {
        Ok(team) => Ok((team, true)),
        // Another berth process made it between our check and our insert.
        Err(berth_store::StoreError::TeamExists { .. }) => Ok((
            store
                .team_by_name(DEFAULT_TEAM)?
                .context("default team vanished")?,
            false,
        )),
        Err(err) => Err(err.into()),
    }
}

fn keys(database: &DatabaseConfig, command: KeysCommand) -> Result<()> {
    let store = open_store(database)?;
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
    // Without a terminal the spinner draws nothing: progress goes out as lines instead,
    // so a log (scripts/up.sh keeps one then) shows it too.
    let plain = !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let result = templates.ensure_base(|event| {
        if plain {
            match &event {
                BuildProgress::WaitingForBuilder { .. } => {
                    eprintln!("template base: waiting for another berth process building it")
                }
                BuildProgress::Stage { name, detail } => {
                    eprintln!("template base: {name}: {detail}")
                }
                BuildProgress::PackageRetrieved { count, name } if count % 25 == 0 => {
                    eprintln!("template base: retrieved {count} packages ({name})")
                }
                BuildProgress::LayerReady {
                    elapsed,
                    size_bytes,
                    ..
                } => eprintln!(
                    "template base: layer built in {:.1}s, {} MiB",
                    elapsed.as_secs_f64(),
                    size_bytes / (1024 * 1024)
                ),
                _ => {}
            }
        }
        progress_event(&spinner, event)
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

/// The spinner's rendering of one base-template build event.
fn progress_event(spinner: &indicatif::ProgressBar, event: BuildProgress) {
    match event {
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
    }
}

/// Builds host templates `names` one after the other, their build logs on stderr.
async fn build_host_templates(server: &Server, names: &[String]) -> Result<()> {
    for name in names {
        let started = std::time::Instant::now();
        eprintln!("template {name}: building (steps already built come from the cache)");
        server
            .build_host_template(name, |entry| {
                let step = entry.step.as_deref().unwrap_or("-");
                eprintln!("template {name} [{step}] {}", entry.message.trim_end());
            })
            .await
            .with_context(|| format!("building template {name}"))?;
        eprintln!(
            "template {name}: ready ({:.0}s)",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn default_envd_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("berth-envd")))
        .unwrap_or_else(|| PathBuf::from("berth-envd"))
}

/// The URL clients use for `listen` (a wildcard address is reached over loopback).
pub(crate) fn client_url(listen: SocketAddr) -> String {
    let host = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{host}:{}", listen.port())
}

/// SIGTERM and SIGINT, caught from the moment this is made. Made before a daemon prints
/// where it serves, so a supervisor's stop that follows that line at once is a clean stop
/// rather than the signal's default action (death, with everything left running).
pub(crate) struct ShutdownSignal {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    /// Starts catching the signals; needs a running tokio runtime.
    pub(crate) fn listen() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            terminate: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
        })
    }

    /// Returns when either signal has arrived (since [`ShutdownSignal::listen`]).
    pub(crate) async fn received(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
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

/// Runs `berth up`; with `build_only` host templates named, builds those instead of
/// serving (`berth provision --template`) and returns once they are ready.
/// Who `up` serves: clients (`berth up`), or API instances (`berth node`).
pub(crate) enum Mode {
    /// Its own store, in this database.
    Standalone(DatabaseConfig),
    Node {
        store: Arc<Store>,
        role: berth_server::cluster::NodeRole,
    },
}

pub(crate) fn up(state_dir: &Path, args: UpArgs, build_only: &[String], mode: Mode) -> Result<()> {
    let state_dir = state_dir.to_path_buf();
    let interpreter = args
        .interpreter_binary
        .clone()
        .unwrap_or_else(host_templates::default_interpreter_binary);
    host_templates::check_git_url(&args.mcp_git_url)?;
    let mcp_gateway = args
        .mcp_gateway_binary
        .clone()
        .unwrap_or_else(host_templates::default_mcp_gateway_binary);
    let host_templates: Vec<berth_server::HostTemplate> = host_templates::code_interpreter(
        &state_dir,
        match &args.code_interpreter_definition {
            Some(dir) => host_templates::DefinitionSource::Directory(dir),
            None => host_templates::DefinitionSource::Embedded,
        },
        &interpreter,
        args.build_ca_file.as_deref(),
    )?
    .into_iter()
    .chain(host_templates::mcp_gateway(
        &state_dir,
        &mcp_gateway,
        &args.mcp_git_url,
    )?)
    .collect();
    for name in build_only {
        if !host_templates.iter().any(|t| t.name == *name) {
            bail!(
                "no host template {name:?} to build (host templates: {}, {}; each needs its \
                 binary beside berth)",
                host_templates::CODE_INTERPRETER,
                host_templates::MCP_GATEWAY
            );
        }
    }
    let flag_limits = args.limits.flags();
    let (limits, config_text) = match &args.limits.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the config file {}", path.display()))?;
            let limits = limits_config::parse(path, &text, &flag_limits)
                .context("the config file is refused")?;
            (limits, Some((path.clone(), text)))
        }
        None => (flag_limits.clone(), None),
    };
    eprintln!("limits: {}", limits_config::describe(&limits));
    let store = match &mode {
        Mode::Standalone(database) => Arc::new(open_store(database)?),
        Mode::Node { store, .. } => store.clone(),
    };
    let (_, first_run) = ensure_default_team(&store)?;
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
    runtime_config.keep_paused = berth_runtime::KeepPaused {
        linger: Duration::from_secs(args.keep_paused_secs),
        budget_bytes: match args.keep_paused_mib {
            Some(mib) => mib << 20,
            None => (cluster_cli::total_memory_mb()? << 20) / 8,
        },
    };
    runtime_config.disk_limits = berth_runtime::DiskLimits {
        read_bytes_per_sec: args.sandbox_disk_read_mibps << 20,
        write_bytes_per_sec: args.sandbox_disk_write_mibps << 20,
        read_iops: args.sandbox_disk_iops,
        write_iops: args.sandbox_disk_iops,
    };
    let runtime = Arc::new(LinuxRuntime::new(runtime_config).context("starting the runtime")?);
    // Pause, resume, snapshots and fork need CRIU; find or provision it now, in the
    // background, so the first pause does not wait for a download.
    let provisioning = runtime.clone();
    let network_owner = runtime.clone();
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
        let domain = args.domain.clone().unwrap_or_else(|| {
            default_domain(listener.local_addr().map(|a| a.port()).unwrap_or(80))
        });
        let serving_ca_dir = state_dir.join(SERVING_CA_DIR);
        let tls = public::serving_tls(&serving_ca_dir, &domain)?;
        let config = ServerConfig {
            domain: Some(domain.clone()),
            webhooks: berth_server::WebhookConfig {
                allow: args.webhook_allow.clone(),
                ..Default::default()
            },
            template_limits: args.builds.limits(),
            secrets_key_file: Some(secrets_key_file(&state_dir)),
            // A provisioning run serves no sandboxes: nothing to keep warm.
            pool_size: if build_only.is_empty() {
                args.pool_size
            } else {
                0
            },
            host_templates,
            limits,
            role: match &mode {
                Mode::Standalone(_) => berth_server::cluster::Role::Standalone,
                Mode::Node { role, .. } => berth_server::cluster::Role::Node(role.clone()),
            },
            tls: match &mode {
                Mode::Standalone(_) => Some(tls),
                // A node's listener serves API instances only, in plain HTTP.
                Mode::Node { .. } => None,
            },
            ..Default::default()
        };
        let server = Server::start_with_builds(
            store.clone(),
            runtime,
            templates,
            config,
            Some(build_engine),
        )
        .await
        .context("starting the control plane")?;
        if !build_only.is_empty() {
            let built = build_host_templates(&server, build_only).await;
            if let Some(egress) = egress {
                egress.shutdown(Duration::from_secs(1)).await;
            }
            // Like a stop: no network table or envd filesystem left behind.
            if let Err(err) = network_owner.release_network_if_idle() {
                eprintln!("warning: removing the sandbox network: {err}");
            }
            return built;
        }
        // Until here a stop signal ends the process outright (nothing serves yet).
        let shutdown = ShutdownSignal::listen()?;
        let _host_template_refresh = server.spawn_host_template_refresh();
        berth_checkpoint::observe_criu(server.criu_observer());
        let _config_reload = limits_config::spawn_reload(config_text, flag_limits, server.limits())
            .context("listening for SIGHUP")?;
        let metrics = public::serve_metrics(&server, args.metrics_listen).await?;
        let url = client_url(listener.local_addr()?);
        let public = match &mode {
            Mode::Standalone(database) => Some(public::PublicFace::start(
                &public::Listening {
                    state_dir: &state_dir,
                    database,
                    url: &url,
                    listen: args.listen,
                    domain: args.domain.as_deref(),
                    sandbox_domain: &domain,
                    serving_ca: &serving_ca_dir,
                },
                &args.mcp,
                &store,
                first_run,
                server.lease_sweep_reporter(),
            )?),
            Mode::Node { role, .. } => {
                eprintln!(
                    "node {} serving API instances at {} (advertised as {})",
                    role.registration.id, url, role.registration.url
                );
                None
            }
        };
        let extra = public
            .as_ref()
            .map_or_else(axum::Router::new, |public| public.routes(&server));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(listener, extra, async move {
            let _ = stop_rx.await;
        }));
        shutdown.received().await;
        shutdown_note!("shutting down");
        if let Mode::Node { role, .. } = &mode {
            // No new sandboxes from now; back within the lease, it keeps the ones it has.
            if let Err(err) = store.mark_node_stopping(&role.registration.id) {
                shutdown_note!("warning: telling the cluster this node is stopping: {err}");
            }
        }
        let _ = stop_tx.send(());
        if let Some(public) = &public {
            public.stop();
        }
        if let Some(metrics) = metrics {
            metrics.cancel();
        }
        // Long-lived proxied streams must not hold the shutdown forever.
        match tokio::time::timeout(SHUTDOWN_GRACE, serving).await {
            Ok(Ok(result)) => result.context("serving")?,
            Ok(Err(join)) => bail!("server task failed: {join}"),
            Err(_) => shutdown_note!("closing connections still open after {SHUTDOWN_GRACE:?}"),
        }
        if let Some(egress) = egress {
            egress.shutdown(Duration::from_secs(1)).await;
        }
        // Pauses answered in the last moments reach the disk before berth goes, so a
        // host restarted right after finds them whole.
        let settling = network_owner.clone();
        let _ = tokio::task::spawn_blocking(move || settling.settle_pauses()).await;
        match network_owner.release_network_if_idle() {
            Ok(true) => shutdown_note!("no sandboxes left: the sandbox network is removed"),
            Ok(false) => {}
            Err(err) => shutdown_note!("warning: removing the sandbox network: {err}"),
        }
        Ok(())
    })
}

/// The sandbox host domain when none is configured: `localhost`, with the listener's
/// port unless it is HTTP's own.
pub(crate) fn default_domain(port: u16) -> String {
    if port == 80 {
        "localhost".to_owned()
    } else {
        format!("localhost:{port}")
    }
}

/// What to tell the operator when `<port>-<id>.<domain>` names do not resolve here:
/// for `localhost` domains, the one package that makes glibc (so Python and Node)
/// resolve every `*.localhost` name to loopback, as browsers and curl already do.
pub(crate) fn sandbox_host_hint(domain: &str) -> Option<String> {
    let host = domain.rsplit_once(':').map_or(domain, |(host, _)| host);
    let probe = format!("49983-berthprobe.{host}:80");
    if std::net::ToSocketAddrs::to_socket_addrs(&probe).is_ok() {
        return None;
    }
    Some(if host == "localhost" || host.ends_with(".localhost") {
        format!(
            "note: sandbox hosts (<port>-<sandboxId>.{host}) do not resolve on this machine \
             for Python and Node; browsers and curl resolve them already. To make them \
             resolve for every program: apt-get install libnss-myhostname"
        )
    } else {
        format!(
            "note: sandbox hosts (<port>-<sandboxId>.{host}) do not resolve here: point \
             wildcard DNS *.{host} at this server"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_domain_carries_the_listeners_port() {
        assert_eq!(default_domain(80), "localhost");
        assert_eq!(default_domain(3000), "localhost:3000");
    }

    #[test]
    fn the_first_key_is_printed_only_to_a_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let database = DatabaseConfig::from_url(None, dir.path()).unwrap();
        let store = open_store(&database).unwrap();
        let (team, first_run) = ensure_default_team(&store).unwrap();
        assert!(first_run);
        let piped = public::key_line(&store, &database, true, false).unwrap();
        assert!(
            piped.starts_with("# no E2B_API_KEY printed") && piped.contains("berth keys create"),
            "{piped}"
        );
        assert!(!piped.contains("e2b_"), "{piped}");
        assert!(store.list_api_keys(&team.id).unwrap().is_empty());
        let shown = public::key_line(&store, &database, true, true).unwrap();
        let raw = shown.strip_prefix("E2B_API_KEY=").expect("a key line");
        assert!(raw.starts_with("e2b_"), "{shown}");
        assert_eq!(store.list_api_keys(&team.id).unwrap().len(), 1);
        let later = public::key_line(&store, &database, false, true).unwrap();
        assert!(later.starts_with('#') && !later.contains("e2b_"), "{later}");
    }

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
