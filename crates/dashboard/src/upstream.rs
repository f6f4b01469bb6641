//! The control plane, called in-process: the server's router as a tower service.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use berth_envd_proto::headers::{ACCESS_TOKEN, SANDBOX_ID, SANDBOX_PORT};
use berth_envd_proto::ENVD_PORT;
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::error::DashboardError;
use crate::session::{Session, CSRF_HEADER};
use crate::Shared;

/// Largest API body the relay forwards (the API's own limit is the same).
const MAX_RELAY_BODY: usize = 1024 * 1024;
/// API key header of the REST API.
const API_KEY: &str = "x-api-key";

#[derive(Clone)]
pub struct Upstream {
    api: Router,
}

impl Upstream {
    pub fn new(api: Router) -> Self {
        Upstream { api }
    }

    /// Sends `request` to the server's router.
    pub async fn call(&self, request: Request) -> Response {
        match self.api.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }

    /// An API call with `key`; returns the status and the whole body.
    pub async fn api(
        &self,
        key: &str,
        method: Method,
        path_and_query: &str,
        json: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), DashboardError> {
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(API_KEY, key)
            .header(ACCEPT, "application/json");
        if json.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(json.map(Body::from).unwrap_or_else(Body::empty))
            .map_err(|_| DashboardError::BadPath)?;
        let response = self.call(request).await;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(DashboardError::UpstreamBody)?
            .to_bytes();
        Ok((status, body))
    }

    /// The sandbox `id` as the key's team sees it (`GET /sandboxes/{id}`): the API's
    /// 404 for another team's sandbox becomes [`DashboardError::NotFound`].
    pub async fn sandbox(&self, key: &str, id: &str) -> Result<serde_json::Value, DashboardError> {
        if !is_plain_id(id) {
            return Err(DashboardError::NotFound);
        }
        let (status, body) = self
            .api(key, Method::GET, &format!("/sandboxes/{id}"), None)
            .await?;
        match status {
            StatusCode::OK => serde_json::from_slice(&body).map_err(DashboardError::Decode),
            StatusCode::NOT_FOUND => Err(DashboardError::NotFound),
            status => Err(DashboardError::Api {
                status,
                message: api_message(&body),
            }),
        }
    }

    /// Webhook `id` of the key's team, as the API returns it.
    pub async fn webhook(&self, key: &str, id: &str) -> Result<serde_json::Value, DashboardError> {
        if !is_plain_id(id) {
            return Err(DashboardError::NotFound);
        }
        let (status, body) = self
            .api(key, Method::GET, &format!("/events/webhooks/{id}"), None)
            .await?;
        match status {
            StatusCode::OK => serde_json::from_slice(&body).map_err(DashboardError::Decode),
            StatusCode::NOT_FOUND => Err(DashboardError::NotFound),
            status => Err(DashboardError::Api {
                status,
                message: api_message(&body),
            }),
        }
    }

    /// A request to envd of sandbox `id` through the proxy, with its access token.
    pub fn envd_request(
        id: &str,
        access_token: Option<&str>,
        method: Method,
        path_and_query: &str,
    ) -> axum::http::request::Builder {
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(SANDBOX_ID, id)
            .header(SANDBOX_PORT, ENVD_PORT.to_string());
        if let Some(token) = access_token {
            request = request.header(ACCESS_TOKEN, token);
        }
        request
    }
}

/// The `message` of an API error body, or the body itself.
pub fn api_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|value| value.get("message")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}

/// Sandbox ids are `[a-z0-9]`; anything else cannot name one (and must not reach a URL).
pub fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

/// Checks the CSRF token a script request carries in [`CSRF_HEADER`].
pub fn check_csrf_header(session: &Session, request: &Request) -> Result<(), DashboardError> {
    let offered = request
        .headers()
        .get(CSRF_HEADER)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if session.csrf_matches(offered) {
        Ok(())
    } else {
        Err(DashboardError::Csrf)
    }
}

/// `/dashboard/api/<path>` → the REST API's `/<path>` with the session's key. Only the
/// method, path, query, content type and body pass; no header of the browser's could
/// make the proxy treat the call as sandbox traffic, and `/proxy/` paths are refused.
pub async fn relay(
    State(state): State<Shared>,
    Path(path): Path<String>,
    request: Request,
) -> Response {
    let Some(session) = state.sessions.find(request.headers()) else {
        return DashboardError::SignedOut.into_response();
    };
    if request.method() != Method::GET {
        if let Err(error) = check_csrf_header(&session, &request) {
            return error.into_response();
        }
    }
    if path.starts_with("proxy/") || path.contains("..") || path.contains("//") {
        return DashboardError::BadPath.into_response();
    }
    let target = match request.uri().query() {
        Some(query) => format!("/{path}?{query}"),
        None => format!("/{path}"),
    };
    let method = request.method().clone();
    let content_type = request.headers().get(CONTENT_TYPE).cloned();
    let body = match axum::body::to_bytes(request.into_body(), MAX_RELAY_BODY).await {
        Ok(body) => body,
        Err(_) => return DashboardError::TooLarge.into_response(),
    };
    let mut upstream = Request::builder()
        .method(method)
        .uri(target)
        .header(API_KEY, &session.api_key);
    if let Some(content_type) = content_type {
        upstream = upstream.header(CONTENT_TYPE, content_type);
    }
    let Ok(upstream) = upstream.body(Body::from(body)) else {
        return DashboardError::BadPath.into_response();
    };
    let response = state.upstream.call(upstream).await;
    let (parts, body) = response.into_parts();
    let mut relayed = Response::new(body);
    *relayed.status_mut() = parts.status;
    if let Some(content_type) = parts.headers.get(CONTENT_TYPE) {
        relayed
            .headers_mut()
            .insert(CONTENT_TYPE, content_type.clone());
    }
    relayed
        .headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-store"));
    relayed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_name_sandboxes() {
        assert!(is_plain_id("abc123"));
        assert!(!is_plain_id(""));
        assert!(!is_plain_id("../teams"));
        assert!(!is_plain_id("a?b=c"));
        assert!(!is_plain_id("a/b"));
    }

    #[test]
    fn api_message_reads_e2b_error_bodies() {
        assert_eq!(api_message(br#"{"code":404,"message":"nope"}"#), "nope");
        assert_eq!(api_message(b"plain"), "plain");
    }
}
