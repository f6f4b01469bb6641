//! `POST /init` (the runtime sets the sandbox-wide defaults; internal, the public proxy
//! refuses it) and `GET /envs` (the default environment variables).
//!
//! `/init` stores the access token, merges the env vars, and sets the default user and
//! workdir; absent or empty fields leave the current value alone. Once a token is set,
//! `/init` itself needs it (so code inside the sandbox cannot take envd over). Fields that
//! concern a VM guest are accepted and ignored: `timestamp` (the sandbox shares the host's
//! clock), `volumeMounts` (the runtime mounts volumes), `caBundle` (certificates belong
//! in the template; envd must not rewrite the trust store of a host it runs on in tests),
//! `hyperloopIP`, `lifecycleID`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use berth_envd_proto::headers::ACCESS_TOKEN;
use berth_envd_proto::http::InitRequest;

use super::{defaults, HttpError};
use crate::auth::{token_allows, AuthError};
use crate::state::EnvdState;

/// `POST /init`.
pub async fn post_init(
    State(state): State<Arc<EnvdState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, HttpError> {
    let presented = headers.get(ACCESS_TOKEN).and_then(|v| v.to_str().ok());
    if !token_allows(defaults(&state).access_token.as_deref(), presented) {
        return Err(HttpError::new(
            StatusCode::UNAUTHORIZED,
            AuthError::MissingOrWrongToken.to_string(),
        ));
    }
    let request: InitRequest = if body.iter().all(u8::is_ascii_whitespace) {
        InitRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| HttpError::bad_request(format!("invalid /init body: {e}")))?
    };
    let mut defaults = state
        .defaults
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(token) = request.access_token.filter(|t| !t.is_empty()) {
        defaults.access_token = Some(token);
    }
    defaults.env_vars.extend(request.env_vars);
    if !request.default_user.is_empty() {
        defaults.user = Some(request.default_user);
    }
    if !request.default_workdir.is_empty() {
        defaults.workdir = Some(request.default_workdir);
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /envs`.
pub async fn get_envs(State(state): State<Arc<EnvdState>>) -> Json<HashMap<String, String>> {
    Json(defaults(&state).env_vars)
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use serde_json::json;

    use super::super::test_http::{json, send};
    use super::super::test_support::Sandbox;
    use super::*;

    fn init(body: serde_json::Value, token: Option<&str>) -> Request<Body> {
        let mut request = Request::post("/init").header("content-type", "application/json");
        if let Some(token) = token {
            request = request.header("x-access-token", token);
        }
        request.body(Body::from(body.to_string())).unwrap()
    }

    #[tokio::test]
    async fn init_sets_defaults_and_then_requires_its_token() {
        let sb = Sandbox::new("init");
        let response = send(
            &sb,
            init(
                json!({"accessToken": "tok", "envVars": {"A": "1"}, "defaultUser": "root",
                       "defaultWorkdir": "/tmp", "timestamp": "2026-01-01T00:00:00Z",
                       "volumeMounts": [], "unknownField": true}),
                None,
            ),
        )
        .await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        let d = defaults(&sb.state);
        assert_eq!(d.access_token.as_deref(), Some("tok"));
        assert_eq!(d.user.as_deref(), Some("root"));
        assert_eq!(d.workdir.as_deref(), Some("/tmp"));

        json(
            &sb,
            init(json!({"envVars": {"B": "2"}}), None),
            StatusCode::UNAUTHORIZED,
        )
        .await;
        json(
            &sb,
            init(json!({"envVars": {"B": "2"}}), Some("bad")),
            StatusCode::UNAUTHORIZED,
        )
        .await;
        let response = send(
            &sb,
            init(
                json!({"envVars": {"B": "2"}, "defaultUser": ""}),
                Some("tok"),
            ),
        )
        .await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        let d = defaults(&sb.state);
        assert_eq!(d.env_vars.len(), 2);
        assert_eq!(
            d.user.as_deref(),
            Some("root"),
            "empty fields leave values alone"
        );

        let envs = Request::get("/envs").body(Body::empty()).unwrap();
        assert_eq!(
            json(&sb, envs, StatusCode::OK).await,
            json!({"A": "1", "B": "2"})
        );
    }

    #[tokio::test]
    async fn init_accepts_empty_body_and_rejects_garbage() {
        let sb = Sandbox::new("init-body");
        let empty = Request::post("/init").body(Body::empty()).unwrap();
        assert_eq!(send(&sb, empty).await.status(), StatusCode::NO_CONTENT);
        let garbage = Request::post("/init").body(Body::from("{nope")).unwrap();
        let err = json(&sb, garbage, StatusCode::BAD_REQUEST).await;
        assert!(err["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid /init body"));
    }
}
