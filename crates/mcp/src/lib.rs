//! berth-mcp: berth's MCP server library, built on the official Rust MCP SDK (`rmcp`).
//!
//! Owns the agent tools: the session tool set (6 tools, per-session sandbox tracking,
//! session storage uploads) and the connector tool set (38 tools, one REST call each),
//! the connections vault (per-identity API key + URL, envelope-encrypted), one-time
//! connect links and their HTML form, and leases that release sandboxes an agent left
//! behind. It talks to any E2B-compatible endpoint through `berth-client` and never
//! touches the server's own state: the `berth` binary calls [`run_stdio`] for `berth mcp`,
//! mounts [`Mcp::http_router`] for `/mcp`, and calls [`run_connect`] for `berth connect`.
//!
//! State lives under `<state_dir>/mcp/`: `mcp.sqlite3` (connections, connect tokens,
//! sessions, leases, sealed secrets), `kek` (key-encryption keys unless `BERTH_KEK` is
//! set), `sessions/<hash>/storage/` (session storage for `upload_files`).

mod config;
mod connector;
mod error;
mod output;
mod server;
mod session;
mod store;
mod sweeper;
mod tools;
mod vault;
mod web;

pub use config::{LeaseConfig, McpConfig, OutputLimits, ReleaseAction, Toolset};
pub use error::McpError;
pub use server::{
    os_user, run_connect, run_stdio, HeaderIdentity, IdentityResolver, Mcp, RotationReport,
};
pub use sweeper::SweepReport;
pub use vault::KEK_ENV;
