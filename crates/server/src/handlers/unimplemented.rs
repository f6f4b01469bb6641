//! Routes of E2B's API that later berth issues fill in. They authenticate like every
//! route, then answer 501 naming what is missing: never a fake success. They are left
//! out of the OpenAPI document, which lists only what berth implements.

use axum::routing::{any, post, MethodRouter};
use axum::Router;
use berth_api::ApiError;

use crate::auth::Caller;
use crate::SharedState;

const BUILDS: &str = "building and changing templates";

/// The handler for a missing `feature`, under any method.
fn missing(feature: &'static str) -> MethodRouter<SharedState> {
    any(move |_caller: Caller| async move {
        Err::<(), ApiError>(ApiError::NotImplemented(feature.to_string()))
    })
}

/// Methods of a path whose GET berth implements.
fn writes(feature: &'static str) -> MethodRouter<SharedState> {
    let handler = move |_caller: Caller| async move {
        Err::<(), ApiError>(ApiError::NotImplemented(feature.to_string()))
    };
    post(handler).patch(handler).delete(handler)
}

/// Create and update methods of a path whose GET and DELETE berth implements.
fn updates(feature: &'static str) -> MethodRouter<SharedState> {
    let handler = move |_caller: Caller| async move {
        Err::<(), ApiError>(ApiError::NotImplemented(feature.to_string()))
    };
    post(handler).patch(handler)
}

pub fn add_routes(router: Router<SharedState>) -> Router<SharedState> {
    router
        .route("/v3/templates", missing(BUILDS))
        .route("/templates/{templateID}/files/{hash}", missing(BUILDS))
        .route("/templates/{templateID}/builds/{buildID}", missing(BUILDS))
        .route(
            "/templates/{templateID}/builds/{buildID}/status",
            missing(BUILDS),
        )
        .route(
            "/templates/{templateID}/builds/{buildID}/logs",
            missing(BUILDS),
        )
        .route(
            "/v2/templates/{templateID}/builds/{buildID}",
            missing(BUILDS),
        )
        .route("/v2/templates/{templateID}", missing(BUILDS))
        .route("/templates/tags", missing(BUILDS))
        .route("/templates/{templateID}/tags", missing(BUILDS))
        .route("/templates", writes(BUILDS))
        .route("/v2/templates", writes(BUILDS))
        .route("/templates/{templateID}", updates(BUILDS))
}
