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
//! Design: [`Mcp`] wires components that each own one concern.
//! - the tools registry (`tools`): the tool tables, built once into the MCP tool list and
//!   a kind per name; a call's arguments are checked against the table, deserialised into
//!   the tool's own struct and handed to that tool's handler (typed dispatch);
//! - connections (`connections`): which backend and key an identity's calls use: an
//!   explicit connection (connect page, `berth connect`; key sealed in the vault), else
//!   the [`TrustedConnection`] the request's [`Identity`] carries (berth's own key on
//!   `berth up`), else a connect link;
//! - sessions (`sessions`): session ownership and storage, tracked sandboxes with their
//!   sealed state, leases;
//! - the sweeper (`sweeper`): releases sandboxes whose lease ran out;
//! - the vault (crate `berth-vault`, shared with the control plane's secrets: AES-256-GCM
//!   envelopes under versioned KEKs) under `secrets`, the only reader and writer of sealed
//!   records.
//!
//! State lives under `<state_dir>/mcp/`: `mcp.sqlite3` (connections, connect tokens,
//! sessions, leases, sealed secrets), `kek` (key-encryption keys unless `BERTH_KEK` is
//! set), `sessions/<hash>/storage/` (session storage for `upload_files`).

#![forbid(unsafe_code)]

mod config;
mod connections;
mod error;
mod identity;
mod secrets;
mod server;
mod sessions;
mod store;
mod sweeper;
mod tools;
mod web;

pub use berth_vault::{VaultError, KEK_ENV};
pub use config::{LeaseConfig, McpConfig, OutputLimits, ReleaseAction, Toolset};
pub use error::McpError;
pub use identity::{os_user, HeaderIdentity, Identity, IdentityResolver, TrustedConnection};
pub use secrets::RotationReport;
pub use server::{run_connect, run_stdio, Mcp};
pub use sweeper::SweepReport;
