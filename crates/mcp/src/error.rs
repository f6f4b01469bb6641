use berth_client::ClientError;

use berth_vault::VaultError;

/// Failures of the MCP library itself. Tool-level failures (API errors, unknown
/// sandboxes) are not errors here: they become tool results the agent can read.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("state database: {0}")]
    Database(#[from] rusqlite::Error),
    #[error("vault: {0}")]
    Vault(#[from] VaultError),
    /// A sealed record opened but is not the JSON this version writes there.
    #[error("sealed record {context} is not readable: {source}")]
    Record {
        context: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `berth connect` with a key the API refused; carries the API's status only.
    #[error("the API at {api_url} rejected the key (HTTP {status})")]
    KeyRejected { api_url: String, status: u16 },
    #[error("MCP transport: {0}")]
    Transport(String),
    #[error("invalid input: {0}")]
    Invalid(String),
}

impl McpError {
    pub(crate) fn io(context: &'static str, source: std::io::Error) -> Self {
        McpError::Io { context, source }
    }
}
