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

/// The most of a refused request's body read before answering; a larger one is cut
/// off with its connection.
const REFUSED_BODY_DRAIN_LIMIT: usize = 64 * 1024;

async fn require_token(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    if authorized(request.headers().get(http::header::AUTHORIZATION), &token) {
        return next.run(request).await;
    }
    // Read what is left of a small body before refusing: answering first makes hyper
    // close the connection under a proxy still writing the body, which then reports a
    // failed write (a 502) instead of this 401.
    let _ = axum::body::to_bytes(request.into_body(), REFUSED_BODY_DRAIN_LIMIT).await;
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads one response with a `Content-Length` body from `stream`: its status line.
    async fn read_response(stream: &mut tokio::net::TcpStream) -> Option<String> {
        let mut received = Vec::new();
        loop {
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            received.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&received).into_owned();
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                continue;
            };
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))?
                .parse()
                .ok()?;
            if body.len() >= length {
                return head.lines().next().map(str::to_owned);
            }
        }
    }

    #[tokio::test]
    async fn a_refusal_keeps_the_connection_when_the_body_comes_after_the_headers() {
        let gateway = Arc::new(Gateway::new(Vec::new()).await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, router(gateway, "s3cret"))
                .await
                .unwrap();
        });
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        // As a proxy streaming the request sends it: the head, then the body.
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: x\r\nauthorization: Bearer wrong\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        stream.write_all(body.as_bytes()).await.unwrap();
        let status = read_response(&mut stream).await;
        assert_eq!(status.as_deref(), Some("HTTP/1.1 401 Unauthorized"));
        // The same connection serves the next request.
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let status = read_response(&mut stream).await;
        assert_eq!(status.as_deref(), Some("HTTP/1.1 200 OK"));
        server.abort();
    }

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
