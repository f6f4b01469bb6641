//! Relaying an API request to the node that must serve it, and its answer back.
//!
//! The request goes as the client sent it (method, path and query, headers — the API
//! key too: the node authenticates it against the shared database itself — and the
//! body, streamed), minus hop-by-hop headers, plus the node token. The `Host` header is
//! the client's, so URLs the node builds for the client (upload links) name the API.
//! The answer streams back unchanged.

use std::error::Error as StdError;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, Request, Response, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::token::{NodeToken, NODE_TOKEN_HEADER};
use crate::tunnel::NodeAddr;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Why a request could not be relayed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("node {node} did not take the request: {source}")]
    Unreachable {
        node: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("request path {path:?} cannot be relayed")]
    BadPath { path: String },
}

/// Relays requests to nodes over pooled HTTP/1.1 connections.
#[derive(Clone)]
pub struct Forwarder {
    client: Client<HttpConnector, UnsyncBoxBody<Bytes, BoxError>>,
    token: NodeToken,
}

/// Headers that belong to one connection, never relayed (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

impl Forwarder {
    pub fn new(token: NodeToken) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Forwarder { client, token }
    }

    /// Sends `request` to `node` and returns its answer.
    pub async fn forward<B>(
        &self,
        node: &NodeAddr,
        request: Request<B>,
    ) -> Result<Response<Incoming>, ForwardError>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_owned())
            .unwrap_or_else(|| "/".to_owned());
        parts.uri = format!("{node}{path}")
            .parse::<Uri>()
            .map_err(|_| ForwardError::BadPath { path })?;
        strip_hop_by_hop(&mut parts.headers);
        parts
            .headers
            .insert(NODE_TOKEN_HEADER, self.token.header_value());
        // The relayed request is HTTP/1.1 whatever the client spoke (h2 clients too).
        parts.version = http::Version::HTTP_11;
        let body = body.map_err(Into::into).boxed_unsync();
        self.client
            .request(Request::from_parts(parts, body))
            .await
            .map_err(|source| ForwardError::Unreachable {
                node: node.to_string(),
                source,
            })
    }
}

/// Removes hop-by-hop headers, including those a `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[tokio::test]
    async fn a_request_arrives_as_sent_with_the_token_and_without_hop_by_hop_headers() {
        // The "node": answers with what it received.
        let app = axum::Router::new().fallback(|request: axum::extract::Request| async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let header = |name: &str| {
                parts
                    .headers
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default()
            };
            format!(
                "{} {} host={} key={} token={} keepalive={} custom={} body={}",
                parts.method,
                parts.uri,
                header("host"),
                header("x-api-key"),
                header(NODE_TOKEN_HEADER).len(),
                header("keep-alive"),
                header("x-drop-me"),
                String::from_utf8_lossy(&body)
            )
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let node = NodeAddr {
            host: "127.0.0.1".into(),
            port,
        };

        let request = Request::post("http://api.example:3000/sandboxes/abc/pause?x=1")
            .header(header::HOST, "api.example:3000")
            .header("x-api-key", "e2b_key")
            .header(header::CONNECTION, "keep-alive, x-drop-me")
            .header("keep-alive", "timeout=5")
            .header("x-drop-me", "1")
            .header(NODE_TOKEN_HEADER, "forged")
            .body(Full::new(Bytes::from_static(b"{\"memory\":true}")))
            .unwrap();
        let response = Forwarder::new(NodeToken::repeated('f'))
            .forward(&node, request)
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "POST /sandboxes/abc/pause?x=1 host=api.example:3000 key=e2b_key token=40 keepalive= custom= body={\"memory\":true}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_node_is_named() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let node = NodeAddr {
            host: "127.0.0.1".into(),
            port,
        };
        let request = Request::get("/health")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let error = Forwarder::new(NodeToken::repeated('f'))
            .forward(&node, request)
            .await
            .unwrap_err();
        assert!(matches!(error, ForwardError::Unreachable { .. }));
        assert!(error.to_string().contains(&port.to_string()), "{error}");
    }
}
