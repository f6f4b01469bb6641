//! berth-mcp-gateway: the `mcp-gateway` binary of berth's `mcp-gateway` template, what
//! the E2B SDKs run when a sandbox is created with `mcp={...}`:
//!
//! ```text
//! GATEWAY_ACCESS_TOKEN=<uuid> mcp-gateway --config '<the mcp object as JSON>'   (as root)
//! ```
//!
//! It starts every server the config names, serves all of them as one MCP server over
//! streamable HTTP at `http://0.0.0.0:50005/mcp` (clients outside reach it as
//! `https://50005-<sandbox>.<domain>/mcp` through berth's proxy), requires
//! `Authorization: Bearer <token>`, writes the token to `/etc/mcp-gateway/.token` (0600,
//! where the SDKs' `get_mcp_token()` reads it), and then returns: exit 0 once every
//! server answered and the gateway serves in the background, exit 1 with the reason on
//! stderr (the server, and its own stderr's last lines) if any server did not start; the
//! SDKs then kill the sandbox and raise `Failed to start MCP gateway: <stderr>`.
//!
//! Servers are E2B's custom-server form: `github/<owner>/<repo>` with `run_cmd` (a stdio
//! MCP server), `install_cmd` and `envs` ([`config`]); the repository is cloned from
//! `MCP_GATEWAY_GIT_URL` (default `https://github.com`; berth sets it for its sandboxes
//! from `berth up --mcp-git-url`) into `/opt/mcp-servers/<owner>/<repo>` ([`backend`]).
//! E2B's catalog servers (Docker images) are refused by name. Tools, resources and prompts
//! keep their servers' names; a name two servers share is refused ([`aggregate`]). The
//! log (the gateway's and every server's stderr) is `/var/log/mcp-gateway/gateway.log`,
//! where E2B keeps its gateway's.
//!
//! Detaching ([`detach`]): the command re-executes itself in a new session with the
//! config on stdin and its stderr on the log, and waits on a pipe for the child's one
//! report (ready, or the error), so no fork happens in a threaded process and the
//! command's own output pipes (envd's) are not held by the gateway.
//!
//! It owns the processes it starts and the files named above, nothing else of the
//! sandbox; it knows nothing of berth's server.

#![forbid(unsafe_code)]

pub mod aggregate;
pub mod backend;
pub mod config;
pub mod detach;
pub mod error;
pub mod http;

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use config::CustomServer;
pub use error::{ConfigError, GatewayError};

/// The env var the SDKs pass the access token in.
pub const TOKEN_ENV: &str = "GATEWAY_ACCESS_TOKEN";
/// The env var naming where `github/<owner>/<repo>` is cloned from.
pub const GIT_URL_ENV: &str = "MCP_GATEWAY_GIT_URL";
/// Where repositories come from unless [`GIT_URL_ENV`] says otherwise.
pub const DEFAULT_GIT_URL: &str = "https://github.com";
/// E2B's gateway port (`Sandbox.mcp_port`).
pub const PORT: u16 = 50005;

/// Where the gateway listens and what it writes.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: String,
    pub token_file: PathBuf,
    pub servers: backend::Settings,
}

/// A gateway whose servers all answered, bound and ready to serve.
pub struct Started {
    listener: tokio::net::TcpListener,
    router: axum::Router,
    /// One line saying what it serves.
    pub summary: String,
}

impl Started {
    /// Serves until the process ends.
    pub async fn serve(self) -> Result<(), GatewayError> {
        axum::serve(self.listener, self.router)
            .await
            .map_err(GatewayError::Serve)
    }
}

/// Binds the listener, starts `servers` one after the other, lists what they offer and
/// writes the token file. Nothing is served until [`Started::serve`].
pub async fn start(
    servers: &[CustomServer],
    token: &str,
    options: &Options,
) -> Result<Started, GatewayError> {
    if token.is_empty() {
        return Err(GatewayError::NoToken);
    }
    let listener = tokio::net::TcpListener::bind(&options.listen)
        .await
        .map_err(|source| GatewayError::Bind {
            addr: options.listen.clone(),
            source,
        })?;
    let mut upstreams = Vec::with_capacity(servers.len());
    for server in servers {
        tracing::info!(server = %server.name, "starting");
        upstreams.push(backend::start(server, &options.servers).await?);
    }
    let gateway = Arc::new(aggregate::Gateway::new(upstreams).await?);
    write_token(&options.token_file, token)?;
    let catalog = gateway.catalog();
    let summary = format!(
        "serving {} MCP server(s) ({} tools, {} resources, {} prompts) at http://{}/mcp (pid {})",
        gateway.upstreams().len(),
        catalog.tools.len(),
        catalog.resources.len(),
        catalog.prompts.len(),
        options.listen,
        std::process::id(),
    );
    Ok(Started {
        router: http::router(gateway, token),
        listener,
        summary,
    })
}

/// Writes `token` to `path` readable by its owner alone (write, fsync, rename).
fn write_token(path: &Path, token: &str) -> Result<(), GatewayError> {
    let failed = |source| GatewayError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed)?;
    }
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(failed)?;
    file.write_all(token.as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    std::fs::rename(&temporary, path).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_token_file_is_private_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etc/mcp-gateway/.token");
        write_token(&path, "first").unwrap();
        write_token(&path, "second").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
