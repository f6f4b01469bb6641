//! The HTTP routes beside `/mcp`: the one-time connect page and session storage uploads.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Form, Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::error::McpError;
use crate::identity::IdentityResolver;
use crate::server::Mcp;
use crate::sessions::storage_path;

const MAX_UPLOAD_BYTES: usize = 256 * 1024 * 1024;

#[derive(Clone)]
struct WebState {
    mcp: Mcp,
    resolver: Arc<dyn IdentityResolver>,
}

pub(crate) fn routes(mcp: Mcp, resolver: Arc<dyn IdentityResolver>) -> Router {
    Router::new()
        .route(
            "/mcp/connect/{token}",
            get(connect_page).post(connect_submit),
        )
        .route(
            "/mcp/sessions/{session_id}/storage/{*path}",
            put(storage_upload).layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES)),
        )
        .with_state(WebState { mcp, resolver })
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title>\
         <meta name=\"referrer\" content=\"no-referrer\"></head><body \
         style=\"font-family:sans-serif;max-width:36em;margin:3em auto\"><h1>{title}</h1>{body}</body></html>"
    )
}

fn form(api_url: &str, error: Option<&str>) -> String {
    let error = error
        .map(|message| format!("<p style=\"color:#b00\">{}</p>", escape(message)))
        .unwrap_or_default();
    page(
        "Connect an E2B-compatible API",
        &format!(
            "{error}<p>Your key is stored encrypted and is only used for your own tool calls.</p>\
             <form method=\"post\" autocomplete=\"off\">\
             <p><label>API URL<br><input name=\"api_url\" size=\"50\" value=\"{}\"></label></p>\
             <p><label>API key<br><input name=\"api_key\" type=\"password\" size=\"50\"></label></p>\
             <p><label>Sandbox URL (optional; for header-routed envd)<br>\
             <input name=\"sandbox_url\" size=\"50\"></label></p>\
             <p><button type=\"submit\">Connect</button></p></form>",
            escape(api_url)
        ),
    )
}

fn expired() -> Response {
    (
        StatusCode::NOT_FOUND,
        Html(page(
            "Link expired",
            "<p>This connect link was already used or has expired. Ask the agent for a new one.</p>",
        )),
    )
        .into_response()
}

async fn connect_page(State(state): State<WebState>, Path(token): Path<String>) -> Response {
    match state.mcp.components.connections.link_identity(&token) {
        Ok(Some(_)) => Html(form(&state.mcp.config().default_api_url, None)).into_response(),
        Ok(None) => expired(),
        Err(error) => {
            tracing::warn!(%error, "connect page lookup failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[derive(Deserialize)]
struct ConnectForm {
    api_url: String,
    api_key: String,
    #[serde(default)]
    sandbox_url: Option<String>,
}

async fn connect_submit(
    State(state): State<WebState>,
    Path(token): Path<String>,
    Form(submitted): Form<ConnectForm>,
) -> Response {
    let connections = &state.mcp.components.connections;
    let identity = match connections.link_identity(&token) {
        Ok(Some(identity)) => identity,
        Ok(None) => return expired(),
        Err(error) => {
            tracing::warn!(%error, "connect token lookup failed");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    let outcome = state
        .mcp
        .connect(
            &identity,
            &submitted.api_url,
            &submitted.api_key,
            submitted.sandbox_url.as_deref(),
        )
        .await;
    match outcome {
        Ok(()) => {
            if let Err(error) = connections.retire_link(&token) {
                tracing::warn!(%error, "deleting a used connect token failed");
            }
            Html(page(
                "Connected",
                "<p>The key is connected. You can close this page and retry the tool call.</p>",
            ))
            .into_response()
        }
        Err(error) => {
            let status = match error {
                McpError::KeyRejected { .. } | McpError::Invalid(_) => StatusCode::BAD_REQUEST,
                _ => StatusCode::BAD_GATEWAY,
            };
            (
                status,
                Html(form(&submitted.api_url, Some(&error.to_string()))),
            )
                .into_response()
        }
    }
}

async fn storage_upload(
    State(state): State<WebState>,
    Path((session_id, path)): Path<(String, String)>,
    request_parts: axum::extract::Request,
) -> Response {
    let (parts, body) = request_parts.into_parts();
    let Some(identity) = state
        .resolver
        .identity(&parts)
        .map(|identity| identity.name)
    else {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "no identity"})),
        )
            .into_response();
    };
    // The first identity to use a session owns it (MCP session ids are random UUIDs);
    // another identity gets the same answer as for a session that does not exist.
    let stored_session = format!("http:{session_id}");
    match state
        .mcp
        .components
        .sessions
        .claim(&stored_session, &identity)
    {
        Ok(true) => {}
        Ok(false) => {
            return (
                StatusCode::NOT_FOUND,
                Json(json!({"message": "unknown session"})),
            )
                .into_response()
        }
        Err(error) => {
            tracing::warn!(%error, "session lookup failed");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    }
    let root = state.mcp.session_storage_dir(&stored_session);
    let Some(target) = storage_path(&root, &path) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"message": "bad path"})),
        )
            .into_response();
    };
    let bytes: Bytes = match axum::body::to_bytes(body, MAX_UPLOAD_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    };
    let written = async {
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        tokio::fs::write(&target, &bytes).await
    }
    .await;
    match written {
        Ok(()) => (
            StatusCode::CREATED,
            Json(json!({"session_path": path, "bytes": bytes.len()})),
        )
            .into_response(),
        Err(error) => {
            tracing::warn!(%error, "writing to session storage failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
