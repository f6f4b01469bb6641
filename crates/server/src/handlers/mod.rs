//! The REST routes. Every handler takes a [`Caller`] (except `/health` and the OpenAPI
//! document) and only ever sees its caller's team's objects: another team's object is
//! answered exactly like a missing one.

mod events;
mod keys;
pub(crate) mod sandboxes;
mod secrets;
mod snapshots;
mod teams;
mod template_builds;
mod templates;
mod unimplemented;
mod volume_content;
mod volumes;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post, put};
use axum::Router;
use berth_api::ApiError;

use crate::SharedState;

pub use events::*;
pub use keys::*;
pub use sandboxes::*;
pub use secrets::*;
pub use snapshots::*;
pub use teams::*;
pub use template_builds::*;
pub use templates::*;
pub use volumes::*;

/// Check a requested time to live against the operator's longest (`max`).
pub(crate) fn validate_timeout(max: crate::MaxLifetime, seconds: i64) -> Result<i64, ApiError> {
    let max = max.seconds();
    if !(0..=max).contains(&seconds) {
        return Err(ApiError::BadRequest(format!(
            "timeout must be between 0 and {max} seconds, got {seconds}"
        )));
    }
    Ok(seconds)
}

/// Health check (no auth).
#[utoipa::path(get, path = "/health", tag = "health",
    responses((status = 204, description = "The service is healthy")))]
pub async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(crate::openapi::openapi_document())
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> (StatusCode, axum::Json<berth_api::Error>) {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        axum::Json(berth_api::Error {
            code: 405,
            message: "method not allowed on this route".into(),
        }),
    )
}

/// Read every API request body completely before routing (bodies are small: at most
/// [`crate::MAX_API_BODY_BYTES`]). A handler or extractor that refuses a request early
/// (401, 404, 501 …) would otherwise leave an unread body on a keep-alive connection,
/// which makes hyper drop the connection under the client's next request.
async fn buffer_body(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match axum::body::to_bytes(body, crate::MAX_API_BODY_BYTES).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(_) => {
            let mut response = ApiError::PayloadTooLarge {
                limit: crate::MAX_API_BODY_BYTES,
            }
            .into_response();
            // The rest of the body is still in flight: this connection cannot be reused.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

pub fn router(state: SharedState) -> Router {
    let api = Router::new()
        .route("/health", get(health))
        .route("/openapi.json", get(openapi_json))
        .route(
            "/sandboxes",
            get(sandboxes::list_sandboxes_v1).post(sandboxes::create_sandbox_v1),
        )
        .route(
            "/v2/sandboxes",
            get(sandboxes::list_sandboxes_v2).post(sandboxes::create_sandbox_v2),
        )
        .route("/sandboxes/metrics", get(sandboxes::sandboxes_metrics))
        .route(
            "/sandboxes/{sandboxID}",
            get(sandboxes::get_sandbox).delete(sandboxes::kill_sandbox),
        )
        .route(
            "/sandboxes/{sandboxID}/timeout",
            post(sandboxes::set_timeout),
        )
        .route("/sandboxes/{sandboxID}/refreshes", post(sandboxes::refresh))
        .route(
            "/sandboxes/{sandboxID}/network",
            axum::routing::put(sandboxes::update_network),
        )
        .route(
            "/sandboxes/{sandboxID}/pause",
            post(sandboxes::pause_sandbox),
        )
        .route(
            "/sandboxes/{sandboxID}/resume",
            post(sandboxes::resume_sandbox),
        )
        .route(
            "/sandboxes/{sandboxID}/connect",
            post(sandboxes::connect_v1),
        )
        .route(
            "/v2/sandboxes/{sandboxID}/connect",
            post(sandboxes::connect_v2),
        )
        .route("/sandboxes/{sandboxID}/logs", get(sandboxes::logs_v1))
        .route("/v2/sandboxes/{sandboxID}/logs", get(sandboxes::logs_v2))
        .route(
            "/sandboxes/{sandboxID}/metrics",
            get(sandboxes::sandbox_metrics),
        )
        .route("/teams", get(teams::list_teams))
        .route("/teams/{teamID}/metrics", get(teams::team_metrics))
        .route("/teams/{teamID}/metrics/max", get(teams::team_metrics_max))
        .route("/api-keys", get(keys::list_keys).post(keys::create_key))
        .route(
            "/api-keys/{apiKeyID}",
            axum::routing::patch(keys::update_key).delete(keys::delete_key),
        )
        .route(
            "/v2/templates",
            get(templates::list_templates_v2).post(unimplemented::legacy_build),
        )
        .route(
            "/templates",
            get(templates::list_templates_v1).post(unimplemented::legacy_build),
        )
        .route(
            "/templates/{templateID}",
            get(templates::get_template)
                .delete(snapshots::delete_template)
                .patch(templates::update_template_v1)
                .post(unimplemented::legacy_build),
        )
        .route(
            "/v2/templates/{templateID}",
            patch(templates::update_template_v2),
        )
        .route("/v3/templates", post(template_builds::request_build_v3))
        .route(
            "/templates/{templateID}/files/{hash}",
            get(template_builds::file_upload_link),
        )
        .route(
            "/v2/templates/{templateID}/builds/{buildID}",
            post(template_builds::start_build_v2),
        )
        .route(
            "/templates/{templateID}/builds/{buildID}",
            delete(template_builds::cancel_build).post(unimplemented::legacy_build),
        )
        .route(
            "/templates/{templateID}/builds/{buildID}/status",
            get(template_builds::build_status_route),
        )
        .route(
            "/templates/{templateID}/builds/{buildID}/logs",
            get(template_builds::build_logs_route),
        )
        .route(
            "/templates/tags",
            post(template_builds::assign_tags).delete(template_builds::delete_tags),
        )
        .route(
            "/templates/{templateID}/tags",
            get(template_builds::list_tags),
        )
        .route("/sandboxes/{sandboxID}/fork", post(snapshots::fork_sandbox))
        .route(
            "/sandboxes/{sandboxID}/snapshots",
            post(snapshots::create_snapshot),
        )
        .route("/snapshots", get(snapshots::list_snapshots))
        .route(
            "/templates/aliases/{alias}",
            get(templates::get_template_alias),
        )
        .route("/events/sandboxes", get(events::team_events))
        .route("/events/sandboxes/{sandboxID}", get(events::sandbox_events))
        .route(
            "/events/webhooks",
            get(events::list_webhooks).post(events::create_webhook),
        )
        .route(
            "/events/webhooks/{webhookID}",
            get(events::get_webhook)
                .patch(events::update_webhook)
                .delete(events::delete_webhook),
        )
        .route(
            "/events/webhooks/{webhookID}/deliveries",
            get(events::webhook_deliveries),
        )
        .route(
            "/volumes",
            get(volumes::list_volumes).post(volumes::create_volume),
        )
        .route(
            "/volumes/{volumeID}",
            get(volumes::get_volume).delete(volumes::delete_volume),
        )
        .route(
            "/secrets",
            get(secrets::list_secrets).post(secrets::create_secret),
        )
        .route(
            "/secrets/{secretID}",
            get(secrets::get_secret)
                .post(secrets::update_secret)
                .delete(secrets::delete_secret),
        );
    // COPY uploads stream to the build engine's upload store, like volume content.
    let uploads = Router::new().route(
        crate::templates::UPLOAD_ROUTE,
        put(crate::templates::upload_handler).layer(DefaultBodyLimit::disable()),
    );
    api.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(crate::MAX_API_BODY_BYTES))
        .layer(middleware::from_fn(buffer_body))
        // File uploads stream: outside the body buffer and its limit.
        .merge(volume_content::routes())
        .merge(uploads)
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_outside_range_are_refused() {
        let day = crate::MaxLifetime::default();
        assert!(validate_timeout(day, -1).is_err());
        assert!(validate_timeout(day, 24 * 60 * 60 + 1).is_err());
        assert_eq!(validate_timeout(day, 300).unwrap(), 300);
        let unlimited = crate::MaxLifetime::Unlimited;
        assert_eq!(
            validate_timeout(unlimited, 400 * 24 * 3600).unwrap(),
            400 * 24 * 3600
        );
        assert!(validate_timeout(unlimited, -1).is_err());
    }
}
