//! The parts of E2B's API berth does not provide: they authenticate like every route,
//! then answer 501 naming what is missing, never a fake success, and are left out of the
//! OpenAPI document. What is left is E2B's legacy template build API (a Dockerfile built
//! by E2B's builders and pushed to its registry); berth builds through `POST
//! /v3/templates`, as SDK 2.x and the E2B CLI do.

use berth_api::ApiError;

use crate::auth::Caller;

const LEGACY_BUILDS: &str =
    "the legacy template build API (berth builds through POST /v3/templates, as SDK 2.x and the E2B CLI do)";

/// The POST of the legacy build routes, beside the methods berth implements on the same
/// paths.
pub async fn legacy_build(_caller: Caller) -> ApiError {
    ApiError::NotImplemented(LEGACY_BUILDS.to_string())
}
