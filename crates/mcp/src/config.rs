use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Which tools the server offers (`--toolset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Toolset {
    /// The six session tools (everruns-e2b-capability.md).
    Session,
    /// The 38 connector tools (scalekit-e2b-connector.txt).
    Connector,
    /// Both; the two shared names get one superset schema (see `tools.rs`).
    #[default]
    All,
}

impl FromStr for Toolset {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "session" => Ok(Toolset::Session),
            "connector" => Ok(Toolset::Connector),
            "all" => Ok(Toolset::All),
            other => Err(format!(
                "unknown toolset {other:?} (expected session, connector or all)"
            )),
        }
    }
}

/// What the sweeper does with a sandbox whose lease ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReleaseAction {
    #[default]
    Kill,
    Pause,
}

/// Lease timing. Every tool use renews a sandbox's lease to `now + ttl`; an ended
/// session's leases expire at once.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub ttl: Duration,
    pub sweep_interval: Duration,
    pub release_action: ReleaseAction,
    /// First retry delay after a failed release; doubles per attempt up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30 * 60),
            sweep_interval: Duration::from_secs(10),
            release_action: ReleaseAction::Kill,
            initial_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(600),
        }
    }
}

/// Caps on text returned by `e2b_exec` (per stream) and `e2b_read_file`.
#[derive(Debug, Clone, Copy)]
pub struct OutputLimits {
    pub max_lines: usize,
    pub max_bytes: usize,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_lines: 2000,
            max_bytes: 64 * 1024,
        }
    }
}

/// Everything the MCP server needs; the `berth` binary fills it from its flags.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// berth's state directory; this crate keeps its files under `<state_dir>/mcp/`.
    pub state_dir: PathBuf,
    pub toolset: Toolset,
    /// Base URL of the running berth server, used to build connect links
    /// (`<public_url>/mcp/connect/<token>`), e.g. `http://127.0.0.1:3000`.
    pub public_url: String,
    /// API URL prefilled in the connect form (berth itself by default).
    pub default_api_url: String,
    pub lease: LeaseConfig,
    pub output_limits: OutputLimits,
    /// Written to `berth.agent_id` / `berth.org_id` metadata when set.
    pub agent_id: Option<String>,
    pub org_id: Option<String>,
    /// Hosts accepted by `/mcp` (DNS-rebinding guard); loopback names by default.
    pub allowed_hosts: Vec<String>,
}

impl McpConfig {
    pub fn new(state_dir: PathBuf, public_url: &str) -> Self {
        Self {
            state_dir,
            toolset: Toolset::All,
            public_url: public_url.trim_end_matches('/').to_owned(),
            default_api_url: public_url.trim_end_matches('/').to_owned(),
            lease: LeaseConfig::default(),
            output_limits: OutputLimits::default(),
            agent_id: None,
            org_id: None,
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
        }
    }

    pub(crate) fn mcp_dir(&self) -> PathBuf {
        self.state_dir.join("mcp")
    }
}
