//! berth-client: a typed async client for any E2B-compatible endpoint.
//!
//! Owns two things: [`ApiClient`] for the REST control plane (`X-API-Key`), and
//! [`EnvdClient`] for a sandbox's envd reached through a sandbox URL (header routing with
//! `E2b-Sandbox-Id`/`E2b-Sandbox-Port`) or through `https://49983-<id>.<domain>`.
//! It has no special case for berth: the same code talks to berth and to E2B's cloud.
//!
//! It spells no wire itself: requests and answers are `berth-api` models (unknown fields
//! ignored, so newer servers and E2B's cloud parse), envd's messages, headers, paths and
//! Connect framing come from `berth-envd-proto`. The one untyped call is
//! [`ApiClient::request`], for callers that relay the API's JSON unchanged. API failures
//! come back as [`ClientError::Api`] with the server's status and body untouched. The API
//! key is never part of an error message or a `Debug` output.

#![forbid(unsafe_code)]

mod api;
mod envd;
mod error;
mod templates;

pub use api::{encode_segment, ApiClient, ApiResponse, LogQuery, Page, SandboxQuery};
/// envd's filesystem entry, as [`EnvdClient::list_dir`] returns it.
pub use berth_envd_proto::filesystem::EntryInfo as FsEntry;
pub use envd::{
    EnvdClient, EnvdEndpoint, ExecError, ExecOutput, ExecRequest, OutputSink, PtyEvent, PtyRequest,
    PtyStream,
};
pub use error::ClientError;
