//! What clients meet beside the REST API and the sandbox proxy, the same on `berth up`
//! and `berth api`: the agent tools on `/mcp`, the dashboard, the lines the SDKs need
//! (`E2B_API_URL`, …) and the Prometheus listener.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use berth_server::Server;
use berth_store::{DatabaseConfig, Store};
use clap::Args;

/// How `/mcp` is served.
#[derive(Args, Clone)]
pub struct McpArgs {
    /// Which agent tools `/mcp` offers: session, connector or all.
    #[arg(long, env = "BERTH_MCP_TOOLSET", default_value = "all")]
    pub mcp_toolset: berth_mcp::Toolset,
    /// Extra Host names `/mcp` accepts (a DNS-rebinding guard: loopback names, the
    /// listen address and `--domain` are always accepted). Comma-separated in the env.
    #[arg(
        long = "mcp-allowed-host",
        env = "BERTH_MCP_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub mcp_allowed_hosts: Vec<String>,
}

/// The agent tools and the dashboard of a listener, with the tools' sweeper.
pub struct PublicFace {
    mcp: berth_mcp::Mcp,
    store: Arc<Store>,
    url: String,
    sweeping: tokio_util::sync::CancellationToken,
}

/// Where a public listener is, and what it answers for.
pub struct Listening<'a> {
    pub state_dir: &'a Path,
    /// Where the state is (named in the hint on making a key).
    pub database: &'a DatabaseConfig,
    pub url: &'a str,
    pub listen: SocketAddr,
    /// `--domain` as given (None: the default, `localhost:<port>`).
    pub domain: Option<&'a str>,
    /// The domain sandbox hosts are reported under.
    pub sandbox_domain: &'a str,
    /// Where the serving CA of the listener's TLS is.
    pub serving_ca: &'a Path,
}

impl PublicFace {
    /// Opens the agent tools' state, starts their sweeper (its failed releases counted by
    /// `lease_sweep_failed`) and prints the lines the SDKs need (a new key only on the
    /// first run, and only to a terminal).
    pub fn start(
        at: &Listening<'_>,
        mcp_args: &McpArgs,
        store: &Arc<Store>,
        first_run: bool,
        lease_sweep_failed: impl Fn(usize) + Send + Sync + 'static,
    ) -> Result<PublicFace> {
        crate::remote::record_api_url(at.state_dir, at.url)?;
        let mut mcp_config = berth_mcp::McpConfig::new(at.state_dir.to_path_buf(), at.url);
        mcp_config.toolset = mcp_args.mcp_toolset;
        let listen_ip = at.listen.ip();
        if !listen_ip.is_unspecified() && !listen_ip.is_loopback() {
            mcp_config.allowed_hosts.push(listen_ip.to_string());
        }
        mcp_config.allowed_hosts.extend(
            at.domain
                .map(str::to_owned)
                .into_iter()
                .chain(mcp_args.mcp_allowed_hosts.clone()),
        );
        let mcp = berth_mcp::Mcp::open(mcp_config).context("opening the agent tools' state")?;
        let sweeping = tokio_util::sync::CancellationToken::new();
        let _sweeper = mcp.spawn_sweeper_reporting(sweeping.clone(), move |report| {
            lease_sweep_failed(report.failed)
        });
        let to_terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
        let key_line = key_line(store, at.database, first_run, to_terminal)?;
        let (url, domain) = (at.url, at.sandbox_domain);
        // One write: a reader that stops after the lines it wants (a script taking the
        // first three) must not see the rest fail on its closed pipe.
        print!("E2B_API_URL={url}\nE2B_SANDBOX_URL={url}\n{key_line}\nE2B_DOMAIN={domain}\n");
        if let Some(hint) = crate::sandbox_host_hint(domain) {
            eprintln!("{hint}");
        }
        eprintln!(
            "TLS on the same port (https://{domain}, https://<port>-<sandbox>.{domain}): \
             clients trust {} (e.g. SSL_CERT_FILE, NODE_EXTRA_CA_CERTS)",
            at.serving_ca.join("ca.crt").display()
        );
        eprintln!("dashboard on {url}/dashboard/");
        Ok(PublicFace {
            mcp,
            store: store.clone(),
            url: url.to_owned(),
            sweeping,
        })
    }

    /// `/mcp` and the dashboard, to serve beside `server`'s API.
    pub fn routes(&self, server: &Server) -> axum::Router {
        let mcp_routes = self.mcp.http_router(Arc::new(ApiKeyIdentity {
            store: self.store.clone(),
            api_url: self.url.clone(),
        }));
        // The dashboard calls the API and the sandbox proxy in-process, through the
        // server's own router.
        mcp_routes.merge(berth_dashboard::router(server.router()))
    }

    pub fn stop(&self) {
        self.sweeping.cancel();
    }
}

/// TLS for the listener from the serving CA in `dir` (made on first use), issuing
/// leaves for `domain`'s names.
pub fn serving_tls(dir: &Path, domain: &str) -> Result<berth_server::ServingTls> {
    let ca = berth_ca::CertificateAuthority::load_or_create(dir, "berth serving CA")
        .context("loading the listener's serving CA")?;
    Ok(berth_server::ServingTls::new(Arc::new(ca), Some(domain)))
}

/// Serves `server`'s Prometheus metrics on `addr`, if given; cancel the token to stop.
pub async fn serve_metrics(
    server: &Server,
    addr: Option<SocketAddr>,
) -> Result<Option<tokio_util::sync::CancellationToken>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
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
    Ok(Some(stop))
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

/// What is printed about the API key: on the first run and to a terminal, a new key of
/// the default team (shown this once; keys are stored hashed); otherwise where to get
/// one, so no key ends up in a log or a pipe.
pub fn key_line(
    store: &Store,
    database: &DatabaseConfig,
    first_run: bool,
    to_terminal: bool,
) -> Result<String> {
    let create = match database {
        DatabaseConfig::Sqlite { state_dir } => {
            format!("berth keys create --state-dir {}", state_dir.display())
        }
        // The URL may hold the password: name the variable, not its value.
        DatabaseConfig::Postgres(_) => {
            "berth keys create (with the same --database / BERTH_DATABASE_URL)".to_string()
        }
    };
    if !first_run {
        return Ok(format!(
            "# E2B_API_KEY was printed on first run; make another with: {create}"
        ));
    }
    if !to_terminal {
        return Ok(format!(
            "# no E2B_API_KEY printed: stdout is not a terminal (keys never go to logs); make one with: {create}"
        ));
    }
    let (team, _) = crate::ensure_default_team(store)?;
    let (_, raw) = store.create_api_key(&team.id, "default")?;
    Ok(format!("E2B_API_KEY={raw}"))
}
