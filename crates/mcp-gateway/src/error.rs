//! The gateway's errors: one variant per cause, each saying which server and what to do.
//! Their text is what the SDKs show (`Failed to start MCP gateway: <stderr>`).

use std::path::PathBuf;

/// A config that cannot be served as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("the config is not valid JSON: {0}")]
    Json(String),
    #[error(
        "the config must be a JSON object of servers, e.g. \
         {{\"github/<owner>/<repo>\": {{\"run_cmd\": \"...\"}}}}"
    )]
    NotAnObject,
    #[error(
        "server {key:?}: E2B's catalog servers run from Docker images of the Docker MCP \
         Catalog, which berth cannot run; start a stdio MCP server from a git repository \
         instead: \"github/<owner>/<repo>\": {{\"run_cmd\": \"...\", \"install_cmd\": \"...\"}}"
    )]
    CatalogServer { key: String },
    #[error(
        "server {key:?}: a custom server's key is github/<owner>/<repo>, each part made of \
         letters, digits, '-', '_' and '.'"
    )]
    BadRepository { key: String },
    #[error("server {key:?}: its configuration must be an object with \"run_cmd\"")]
    NotAnObjectServer { key: String },
    #[error("server {key:?}: {field:?} must be {expected}")]
    FieldType {
        key: String,
        field: String,
        expected: &'static str,
    },
    #[error(
        "server {key:?}: unknown field {field:?} (a custom server takes run_cmd, install_cmd \
         and envs)"
    )]
    UnknownField { key: String, field: String },
    #[error("server {key:?}: \"run_cmd\" is required: the command that starts a stdio MCP server")]
    MissingRunCmd { key: String },
}

/// Why the gateway could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("GATEWAY_ACCESS_TOKEN is not set: it is the token MCP clients must present")]
    NoToken,
    #[error("listening on {addr}: {source} (is another MCP gateway running in this sandbox?)")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("serving MCP: {0}")]
    Serve(std::io::Error),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("preparing {}: {source}", path.display())]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("server {server:?}: cannot run {program}: {source}")]
    Spawn {
        server: String,
        program: String,
        source: std::io::Error,
    },
    #[error(
        "server {server:?}: cloning {url} failed ({status}){}",
        section("git", output)
    )]
    Clone {
        server: String,
        url: String,
        status: String,
        output: String,
    },
    #[error(
        "server {server:?}: install_cmd failed ({status}){}",
        section("its output", output)
    )]
    Install {
        server: String,
        status: String,
        output: String,
    },
    #[error(
        "server {server:?}: run_cmd did not start an MCP server: {reason}{}",
        section("its stderr", stderr)
    )]
    Initialize {
        server: String,
        reason: String,
        stderr: String,
    },
    #[error("server {server:?}: listing its {what} failed: {reason}")]
    List {
        server: String,
        what: &'static str,
        reason: String,
    },
    #[error(
        "servers {first:?} and {second:?} both offer the {kind} {name:?}; one gateway \
         cannot route it to both (run them in separate sandboxes)"
    )]
    Collision {
        kind: &'static str,
        name: String,
        first: String,
        second: String,
    },
    #[error("starting the gateway in the background: {0}")]
    Detach(std::io::Error),
    #[error("the gateway exited while starting{}", section("its log", log))]
    DetachedExited { log: String },
}

/// A titled block of captured output, or nothing when there is none.
fn section(title: &str, text: &str) -> String {
    let text = text.trim_end();
    if text.is_empty() {
        String::new()
    } else {
        format!("\n--- {title} (last lines) ---\n{text}")
    }
}
