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
pub mod state;
pub mod users;
