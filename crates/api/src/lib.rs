//! berth-api: the E2B REST API's models and errors, shared by the server and clients.
//!
//! Owns the wire shapes: exact field names and status codes the official E2B SDKs parse,
//! and the single mapping from [`ApiError`] to an HTTP status and `{code, message}` body.
//! It holds no behaviour: no I/O, no storage, no HTTP serving (the `axum` feature only
//! adds the response conversion).

#![forbid(unsafe_code)]

pub mod error;
pub mod models;
mod template_builds;

pub use error::{ApiError, Error};
pub use models::*;
pub use template_builds::*;
