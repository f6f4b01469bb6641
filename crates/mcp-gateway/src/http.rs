//! The gateway's HTTP side: streamable-HTTP MCP at `/mcp` behind `Authorization: Bearer
//! <token>` (compared in constant time; anything else is a 401 with
//! `WWW-Authenticate: Bearer`), and an unauthenticated `GET /health`.
//!
//! The `Host` header is not checked (rmcp's DNS-rebinding guard): clients reach the
//! gateway through berth's proxy under `50005-<sandbox>.<domain>` and from inside the
//! sandbox under `localhost`, and a request without the token gets nothing anyway.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use subtle::ConstantTimeEq;

use crate::aggregate::{Gateway, Handler};

/// Whether `header` (an `Authorization` value) carries `token` as a bearer token.
pub fn authorized(header: Option<&http::HeaderValue>, token: &str) -> bool {
    let Some(presented) = header
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, rest) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
    else {
        return false;
    };
    !token.is_empty() && bool::from(presented.as_bytes().ct_eq(token.as_bytes()))
}

async fn require_token(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    if authorized(request.headers().get(http::header::AUTHORIZATION), &token) {
        return next.run(request).await;
    }
    (
        http::StatusCode::UNAUTHORIZED,
        [(http::header::WWW_AUTHENTICATE, "Bearer realm=\"mcp-gateway\"")],
        "missing or wrong MCP gateway token: send Authorization: Bearer <the sandbox's MCP token>\n",
    )
        .into_response()
}

/// `/mcp` (token required) and `/health`.
pub fn router(gateway: Arc<Gateway>, token: &str) -> axum::Router {
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(Handler(gateway.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let token: Arc<str> = Arc::from(token);
    axum::Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(token, require_token))
        .route("/health", axum::routing::get(|| async { "ok\n" }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let value = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert!(authorized(Some(&value("Bearer s3cret")), "s3cret"));
        assert!(authorized(Some(&value("bearer s3cret")), "s3cret"));
        assert!(!authorized(Some(&value("Bearer s3cre")), "s3cret"));
        assert!(!authorized(Some(&value("Bearer s3cretX")), "s3cret"));
        assert!(!authorized(Some(&value("Basic s3cret")), "s3cret"));
        assert!(!authorized(Some(&value("s3cret")), "s3cret"));
        assert!(!authorized(None, "s3cret"));
        assert!(!authorized(Some(&value("Bearer ")), ""));
    }
}
