//! `berth node` and `berth api`: the two roles of a split deployment (see
//! `berth_server::cluster`), and `berth node drain`.
//!
//! A node is `berth up` without the public face: the same runtime, network, builds and
//! recovery, serving API instances on an internal listener that admits only requests
//! carrying the node token, registered in the shared database under its name with its
//! capacity and a lease it renews. An API instance is the public face without a runtime:
//! REST, the sandbox proxy (through tunnels to nodes), `/mcp` and the dashboard, relaying
//! to nodes whatever needs one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use berth_cluster::NodeToken;
use berth_server::cluster::{ApiRole, NodeRole, NodesRunSandboxes, Role};
use berth_server::{Server, ServerConfig};
use berth_store::{DatabaseConfig, NodeRegistration, Store};
use clap::{Args, Subcommand};

/// `berth node`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodeArgs {
    #[command(subcommand)]
    command: Option<NodeCommand>,
    #[command(flatten)]
    cluster: NodeOptions,
    #[command(flatten)]
    up: crate::UpArgs,
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Stop placing new sandboxes on node NAME (its sandboxes keep running); with
    /// `--undo`, place on it again.
    Drain {
        name: String,
        #[arg(long)]
        undo: bool,
    },
    /// The registered nodes, their leases and what they hold.
    Ls {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct NodeOptions {
    /// This node's name in the cluster: unique, and the same across its restarts
    /// (default: the host name).
    #[arg(long, env = "BERTH_NODE_NAME")]
    node_name: Option<String>,
    /// Where API instances reach this node's listener, `http://HOST:PORT` (default:
    /// `--listen`, when that is not a wildcard address).
    #[arg(long, env = "BERTH_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// File of the cluster's node token(s), one per line (the first is sent to other
    /// nodes, every one is admitted; make one with `openssl rand -hex 32`).
    #[arg(long, env = "BERTH_NODE_TOKEN_FILE")]
    node_token_file: Option<PathBuf>,
    /// Seconds a registration or renewal counts; renewed every third of it. A node
    /// silent for longer is reported lost with its running sandboxes.
    #[arg(long, env = "BERTH_NODE_LEASE_SECS", default_value_t = 10)]
    lease_secs: u64,
    /// CPUs this node offers sandboxes (default: its CPUs times 4: sandboxes are mostly
    /// idle, and each one's own CPU quota still holds).
    #[arg(long, env = "BERTH_NODE_CPUS")]
    cpus: Option<u32>,
    /// Memory in MiB this node offers sandboxes (default: its memory less 1 GiB).
    #[arg(long, env = "BERTH_NODE_MEMORY_MB")]
    memory_mb: Option<u64>,
    /// Most sandboxes (running or paused) on this node.
    #[arg(long, env = "BERTH_NODE_SLOTS", default_value_t = 1000)]
    slots: u32,
}

/// `berth api`.
#[derive(Args)]
pub struct ApiArgs {
    /// Address of the listener serving the API and the sandbox proxy.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Domain of `<port>-<sandboxId>.<domain>` sandbox hosts (default
    /// `localhost:<listen port>`).
    #[arg(long, env = "BERTH_DOMAIN")]
    domain: Option<String>,
    /// File of the cluster's node token(s), one per line; the first is sent to nodes.
    #[arg(long, env = "BERTH_NODE_TOKEN_FILE")]
    node_token_file: PathBuf,
    /// Seconds between looks for nodes whose lease lapsed.
    #[arg(long, env = "BERTH_LEASE_CHECK_SECS", default_value_t = 2)]
    lease_check_secs: u64,
    /// Serve Prometheus metrics at `GET /metrics` on this address.
    #[arg(long, env = "BERTH_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Longest timeout a sandbox may be given, in seconds, or `unlimited`.
    #[arg(long, env = "BERTH_MAX_SANDBOX_LIFETIME", default_value = "86400", value_parser = crate::limits_config::parse_lifetime)]
    max_sandbox_lifetime: berth_server::MaxLifetime,
    /// Most running sandboxes per team (unset: no limit).
    #[arg(long, env = "BERTH_TEAM_MAX_SANDBOXES")]
    team_max_sandboxes: Option<u64>,
    #[command(flatten)]
    mcp: crate::public::McpArgs,
}

/// Opens the database API instances and nodes share (`--database`, required here):
/// `postgres://…`, or `sqlite:DIR` when every process runs on this machine.
fn open_database(database: Option<&str>, state_dir: &Path) -> Result<Store> {
    crate::open_store(&database_config(database, state_dir)?)
}

fn database_config(database: Option<&str>, state_dir: &Path) -> Result<DatabaseConfig> {
    let url =
        database.context("--database is required: the database API instances and nodes share")?;
    DatabaseConfig::from_url(Some(url), state_dir).context("--database / BERTH_DATABASE_URL")
}

pub fn node(state_dir: &Path, database: Option<&str>, args: NodeArgs) -> Result<()> {
    match args.command {
        Some(NodeCommand::Drain { name, undo }) => {
            let store = open_database(database, state_dir)?;
            if !store.set_node_draining(&name, !undo)? {
                bail!("no node {name:?} is registered (see `berth node ls`)");
            }
            match undo {
                false => eprintln!("node {name}: draining (no new sandboxes are placed on it)"),
                true => eprintln!("node {name}: taking new sandboxes again"),
            }
            Ok(())
        }
        Some(NodeCommand::Ls { json }) => list_nodes(open_database(database, state_dir)?, json),
        None => serve_node(state_dir, database, args.cluster, args.up),
    }
}

fn list_nodes(store: Store, json: bool) -> Result<()> {
    let now = time::OffsetDateTime::now_utc();
    let usage = store.node_usage()?;
    let nodes = store.nodes()?;
    let state = |node: &berth_store::NodeRecord| match () {
        _ if node.lost => "lost",
        _ if node.lease_until <= now => "lapsing",
        _ if node.stopping => "stopping",
        _ if node.draining => "draining",
        _ => "up",
    };
    if json {
        let rows: Vec<serde_json::Value> = nodes
            .iter()
            .map(|node| {
                let used = usage
                    .iter()
                    .find(|(id, _)| *id == node.id)
                    .map(|(_, u)| u.clone())
                    .unwrap_or_default();
                serde_json::json!({
                    "name": node.id, "url": node.url, "state": state(node),
                    "cpus": node.cpu_capacity, "memoryMB": node.memory_capacity_mb,
                    "slots": node.slots, "cpusReserved": used.cpu_reserved,
                    "memoryReservedMB": used.memory_reserved_mb, "sandboxes": used.sandboxes,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("NAME\tSTATE\tURL\tSANDBOXES\tCPUS\tMEMORY_MB");
    for node in &nodes {
        let used = usage
            .iter()
            .find(|(id, _)| *id == node.id)
            .map(|(_, u)| u.clone())
            .unwrap_or_default();
        println!(
            "{}\t{}\t{}\t{}/{}\t{}/{}\t{}/{}",
            node.id,
            state(node),
            node.url,
            used.sandboxes,
            node.slots,
            used.cpu_reserved,
            node.cpu_capacity,
            used.memory_reserved_mb,
            node.memory_capacity_mb
        );
    }
    Ok(())
}

fn read_token(path: Option<&Path>) -> Result<NodeToken> {
    let path = path
        .context("--node-token-file is required (make one with `openssl rand -hex 32 > FILE`)")?;
    Ok(NodeToken::read(path)?)
}

fn serve_node(
    state_dir: &Path,
    database: Option<&str>,
    options: NodeOptions,
    up: crate::UpArgs,
) -> Result<()> {
    let token = read_token(options.node_token_file.as_deref())?;
    let name = match options.node_name {
        Some(name) => name,
        None => rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
    };
    let url = match options.advertise_url {
        Some(url) => url,
        None if !up.listen.ip().is_unspecified() => format!("http://{}", up.listen),
        None => bail!("--advertise-url is required when --listen is a wildcard address"),
    };
    url.parse::<berth_cluster::NodeAddr>()
        .context("--advertise-url")?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let memory_mb = total_memory_mb()?;
    let registration = NodeRegistration {
        id: name,
        url,
        cpu_capacity: options.cpus.unwrap_or(cpus * 4),
        memory_capacity_mb: options
            .memory_mb
            .unwrap_or_else(|| memory_mb.saturating_sub(1024)),
        slots: options.slots,
    };
    let store = open_database(database, state_dir)?;
    crate::up(
        state_dir,
        up,
        &[],
        crate::Mode::Node {
            store: Arc::new(store),
            role: NodeRole {
                registration,
                token,
                lease: Duration::from_secs(options.lease_secs.max(3)),
            },
        },
    )
}

pub(crate) fn total_memory_mb() -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib / 1024)
        .context("no MemTotal in /proc/meminfo")
}

pub fn api(state_dir: &Path, database: Option<&str>, args: ApiArgs) -> Result<()> {
    let token = read_token(Some(&args.node_token_file))?;
    let database = database_config(database, state_dir)?;
    let store = Arc::new(crate::open_store(&database)?);
    let (_, first_run) = crate::ensure_default_team(&store)?;
    // Holds nothing but what the agent tools and the vault keep locally.
    let templates = berth_template::TemplateStore::open(state_dir)
        .context("opening the (empty) template store")?;
    let tokio = tokio::runtime::Runtime::new().context("starting tokio")?;
    tokio.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let domain = args.domain.clone().unwrap_or_else(|| {
            crate::default_domain(listener.local_addr().map(|a| a.port()).unwrap_or(80))
        });
        let serving_ca_dir = state_dir.join(crate::SERVING_CA_DIR);
        let tls = crate::public::serving_tls(&serving_ca_dir, &domain)?;
        let config = ServerConfig {
            domain: Some(domain.clone()),
            tls: Some(tls),
            secrets_key_file: Some(crate::secrets_key_file(state_dir)),
            pool_size: 0,
            limits: berth_server::Limits {
                max_lifetime: args.max_sandbox_lifetime,
                quotas: berth_server::TeamQuotas {
                    max_sandboxes: args.team_max_sandboxes,
                    ..Default::default()
                },
                ..Default::default()
            },
            role: Role::Api(ApiRole {
                token,
                lease_check: Duration::from_secs(args.lease_check_secs.max(1)),
            }),
            ..Default::default()
        };
        let server = Server::start(
            store.clone(),
            Arc::new(NodesRunSandboxes),
            templates,
            config,
        )
        .await
        .context("starting the API")?;
        // Until here a stop signal ends the process outright (nothing serves yet).
        let shutdown = crate::ShutdownSignal::listen()?;
        let metrics = crate::public::serve_metrics(&server, args.metrics_listen).await?;
        let url = crate::client_url(listener.local_addr()?);
        let public = crate::public::PublicFace::start(
            &crate::public::Listening {
                state_dir,
                database: &database,
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
        )?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let extra = public.routes(&server);
        let serving = tokio::spawn(server.serve(listener, extra, async move {
            let _ = stop_rx.await;
        }));
        shutdown.received().await;
        shutdown_note!("shutting down");
        let _ = stop_tx.send(());
        public.stop();
        if let Some(metrics) = metrics {
            metrics.cancel();
        }
        match tokio::time::timeout(crate::SHUTDOWN_GRACE, serving).await {
            Ok(Ok(result)) => result.context("serving"),
            Ok(Err(join)) => bail!("server task failed: {join}"),
            Err(_) => {
                shutdown_note!(
                    "closing connections still open after {:?}",
                    crate::SHUTDOWN_GRACE
                );
                Ok(())
            }
        }
    })
}
