//! Routes of E2B's API that later berth issues fill in. They authenticate like every
//! route, then answer 501 naming what is missing: never a fake success. They are left
//! out of the OpenAPI document, which lists only what berth implements.

use axum::routing::{any, MethodRouter};
use axum::Router;
use berth_api::ApiError;

use crate::auth::Caller;
use crate::SharedState;

const NETWORK: &str = "sandbox network policy";
const LEGACY_BUILDS: &str =
    "the legacy template build API (berth builds through POST /v3/templates, as SDK 2.x and the E2B CLI do)";
const VOLUMES: &str = "volumes";
const SECRETS: &str = "secrets";

/// The handler for a missing `feature`, under any method.
fn missing(feature: &'static str) -> MethodRouter<SharedState> {
    any(move |_caller: Caller| async move {
        Err::<(), ApiError>(ApiError::NotImplemented(feature.to_string()))
    })
}

pub fn add_routes(router: Router<SharedState>) -> Router<SharedState> {
    router
        .route("/sandboxes/{sandboxID}/network", missing(NETWORK))
        .route("/volumes", missing(VOLUMES))
        .route("/volumes/{volumeID}", missing(VOLUMES))
        .route("/secrets", missing(SECRETS))
        .route("/secrets/{secretID}", missing(SECRETS))
}

/// The POST of the legacy build routes (Dockerfile pushed to E2B's registry), beside
/// the methods berth implements on the same paths.
pub async fn legacy_build(_caller: Caller) -> ApiError {
    ApiError::NotImplemented(LEGACY_BUILDS.to_string())
}
