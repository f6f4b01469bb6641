//! berth-envd: the daemon inside every sandbox, wire-compatible with E2B's envd 0.6.x.
//!
//! Serves the Process and Filesystem RPC services over the Connect protocol and the
//! HTTP routes (`/health`, `/metrics`, `/envs`, `/files`, `/init`) on one port
//! (49983). It depends on nothing of the server: it is a small static binary that runs
//! as the sandbox's init, or on a plain host for tests.

pub mod auth;
pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;
pub mod reaper;
pub mod server;
pub mod state;
pub mod users;

/// The envd version berth reports (`envdVersion`) to the SDKs, which gate features on
/// it: stdin control ≥0.3.0, default user ≥0.4.0, close stdin ≥0.5.2, octet-stream
/// uploads ≥0.5.7, file metadata ≥0.6.2, entry info in watch events ≥0.6.3, watching
/// network mounts ≥0.6.4. All of them are implemented.
pub const ENVD_VERSION: &str = "0.6.4";
