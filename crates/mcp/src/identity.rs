//! Who is behind a request: the [`IdentityResolver`] seam the embedding server fills, the
//! [`Identity`] it answers with, and the 401 for requests to `/mcp` without one.
//!
//! An identity can carry a [`TrustedConnection`]: the server already checked a credential
//! of the request (berth's `X-API-Key`) and vouches that it works against an API (berth
//! itself), so tool calls use it without a round trip through the connect page. The key
//! lives in memory for the request; it is sealed in the vault only when a sandbox is
//! tracked with it (so the sweeper can still release that sandbox after a restart), and
//! it is never logged: `Debug` shows only the API URL.

use std::fmt;
use std::sync::Arc;

use serde_json::json;

/// JSON-RPC error code (server-defined range) of a request to `/mcp` without identity.
const UNAUTHENTICATED_CODE: i64 = -32001;

/// A backend connection the embedding server vouches for: an API URL and the key the
/// caller presented, already validated by that server.
#[derive(Clone, PartialEq, Eq)]
pub struct TrustedConnection {
    api_url: String,
    api_key: String,
}

impl TrustedConnection {
    pub fn new(api_url: &str, api_key: &str) -> Self {
        Self {
            api_url: api_url.trim_end_matches('/').to_owned(),
            api_key: api_key.to_owned(),
        }
    }

    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    pub(crate) fn api_key(&self) -> &str {
        &self.api_key
    }
}

impl fmt::Debug for TrustedConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustedConnection")
            .field("api_url", &self.api_url)
            .finish_non_exhaustive()
    }
}

/// The user of one request, and the connection the server vouches for, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Names the user: connections, sessions and sandboxes are kept per name.
    pub name: String,
    /// Used for this user's tool calls unless they connected a backend explicitly
    /// (connect page, `berth connect`), which wins.
    pub trusted: Option<TrustedConnection>,
}

impl Identity {
    /// An identity with no connection of its own (it connects through the connect page).
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            trusted: None,
        }
    }

    /// An identity whose tool calls reach `connection` with no connect step.
    pub fn trusted(name: impl Into<String>, connection: TrustedConnection) -> Self {
        Self {
            name: name.into(),
            trusted: Some(connection),
        }
    }
}

/// Names the identity behind an HTTP request to `/mcp` (and the storage upload route).
/// The server supplies one that matches its own authentication.
pub trait IdentityResolver: Send + Sync + 'static {
    fn identity(&self, parts: &http::request::Parts) -> Option<Identity>;

    /// What a request without an identity lacks, for the 401 answer of `/mcp`.
    fn unauthenticated_message(&self) -> String {
        "this request carries no identity".into()
    }
}

/// Takes the identity from a request header (for deployments where a trusted front end
/// authenticates users and sets it). It vouches for no connection.
#[derive(Debug, Clone)]
pub struct HeaderIdentity(pub http::HeaderName);

impl Default for HeaderIdentity {
    fn default() -> Self {
        Self(http::HeaderName::from_static("x-berth-user"))
    }
}

impl IdentityResolver for HeaderIdentity {
    fn identity(&self, parts: &http::request::Parts) -> Option<Identity> {
        parts
            .headers
            .get(&self.0)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|value| !value.is_empty())
            .map(Identity::named)
    }

    fn unauthenticated_message(&self) -> String {
        format!("missing {} header", self.0)
    }
}

/// Answers 401 with a JSON-RPC error (which MCP clients surface as the request's error)
/// when the resolver finds no identity in the request.
pub(crate) async fn require_identity(
    axum::extract::State(resolver): axum::extract::State<Arc<dyn IdentityResolver>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = request.into_parts();
    if resolver.identity(&parts).is_some() {
        return next
            .run(axum::extract::Request::from_parts(parts, body))
            .await;
    }
    let error = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": UNAUTHENTICATED_CODE, "message": resolver.unauthenticated_message()},
    });
    (http::StatusCode::UNAUTHORIZED, axum::Json(error)).into_response()
}

/// The default identity for stdio (`--user` unset): the OS user running the process.
pub fn os_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("uid-{}", current_uid()))
}

fn current_uid() -> u32 {
    // /proc/self/status is enough here and avoids an unsafe getuid() call.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_trusted_key() {
        let identity = Identity::trusted(
            "team:1",
            TrustedConnection::new("http://127.0.0.1:3000/", "e2b_trustedcanary"),
        );
        let shown = format!("{identity:?}");
        assert!(!shown.contains("trustedcanary"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:3000"), "{shown}");
        assert_eq!(identity.trusted.unwrap().api_url(), "http://127.0.0.1:3000");
    }

    #[test]
    fn header_identity_names_the_user_and_vouches_for_nothing() {
        let (parts, ()) = http::Request::builder()
            .header("x-berth-user", " carol ")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(
            HeaderIdentity::default().identity(&parts),
            Some(Identity::named("carol"))
        );
        let (empty, ()) = http::Request::builder()
            .header("x-berth-user", "")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(HeaderIdentity::default().identity(&empty), None);
    }
}
