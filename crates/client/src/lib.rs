//! berth-client: a typed async client for any E2B-compatible endpoint.
//!
//! Owns two things: [`ApiClient`] for the REST control plane (`X-API-Key`), and
//! [`EnvdClient`] for a sandbox's envd reached through a sandbox URL (header routing with
//! `E2b-Sandbox-Id`/`E2b-Sandbox-Port`) or through `https://49983-<id>.<domain>`.
//! It has no special case for berth: the same code talks to berth and to E2B's cloud.
//! API failures come back as [`ClientError::Api`] with the server's status and body
//! untouched. The API key is never part of an error message or a `Debug` output.

#![forbid(unsafe_code)]

mod api;
mod envd;
mod error;

pub use api::{encode_segment, ApiClient, ApiResponse};
pub use envd::{EnvdClient, EnvdEndpoint, ExecOutput, ExecRequest, OutputSink};
pub use error::ClientError;
