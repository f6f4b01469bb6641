//! Access control: the `X-Access-Token` set at `/init`, and signed file URLs.
//!
//! When `/init` set an access token, every route except `GET /health`, `GET /files` and
//! `POST /files` needs `X-Access-Token` equal to it. The two `/files` routes accept either
//! the token or a URL signature instead (so an SDK can hand out a download/upload link),
//! the v1 signature of [`berth_envd_proto::signature`].
//! Without a token set, nothing is checked. All comparisons are constant-time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_envd_proto::headers::ACCESS_TOKEN;
pub use berth_envd_proto::signature::{constant_time_eq, file_signature, FileOperation};

use crate::state::EnvdState;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error(
        "unauthorized access, please provide a valid access token or method signing if supported"
    )]
    MissingOrWrongToken,
    #[error("access token present in header but does not match")]
    TokenMismatch,
    #[error("missing signature query parameter")]
    MissingSignature,
    #[error("invalid signature")]
    InvalidSignature,
    #[error("signature is already expired")]
    SignatureExpired,
}

/// Whether a request carrying `presented` passes when `expected` is the token set at
/// `/init` (`None`: no token set, everything passes).
pub fn token_allows(expected: Option<&str>, presented: Option<&str>) -> bool {
    match expected {
        None => true,
        Some(expected) => {
            presented.is_some_and(|p| constant_time_eq(expected.as_bytes(), p.as_bytes()))
        }
    }
}

/// A `/files` request's credentials, as sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileCredentials<'a> {
    /// `X-Access-Token` header.
    pub header_token: Option<&'a str>,
    /// `signature` query parameter.
    pub signature: Option<&'a str>,
    /// `signature_expiration` query parameter.
    pub signature_expiration: Option<i64>,
    /// `username` query parameter (part of what is signed).
    pub username: Option<&'a str>,
    /// `path` query parameter, raw (part of what is signed).
    pub path: &'a str,
}

/// Checks a `/files` request: without a token set everything passes; a sent
/// `X-Access-Token` must match; otherwise a valid, unexpired signature is required.
/// `now` is the current unix time in seconds.
pub fn check_file_access(
    access_token: Option<&str>,
    operation: FileOperation,
    credentials: &FileCredentials<'_>,
    now: i64,
) -> Result<(), AuthError> {
    let Some(access_token) = access_token else {
        return Ok(());
    };
    if let Some(header_token) = credentials.header_token.filter(|t| !t.is_empty()) {
        return if constant_time_eq(access_token.as_bytes(), header_token.as_bytes()) {
            Ok(())
        } else {
            Err(AuthError::TokenMismatch)
        };
    }
    let signature = credentials.signature.ok_or(AuthError::MissingSignature)?;
    let expected = file_signature(
        credentials.path,
        operation,
        credentials.username.unwrap_or(""),
        access_token,
        credentials.signature_expiration,
    );
    if !constant_time_eq(expected.as_bytes(), signature.as_bytes()) {
        return Err(AuthError::InvalidSignature);
    }
    match credentials.signature_expiration {
        Some(expiration) if expiration < now => Err(AuthError::SignatureExpired),
        _ => Ok(()),
    }
}

/// Current unix time in seconds.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Routes reachable without `X-Access-Token`: health, and the `/files` routes, which do
/// their own check because they also accept signatures.
fn is_open_route(method: &Method, path: &str) -> bool {
    matches!(
        (method, path),
        (&Method::GET, "/health") | (&Method::GET, "/files") | (&Method::POST, "/files")
    )
}

/// axum middleware enforcing the access token on every route but the open ones; mount
/// with `axum::middleware::from_fn_with_state(state, auth::require_access_token)`.
pub async fn require_access_token(
    State(state): State<Arc<EnvdState>>,
    request: Request,
    next: Next,
) -> Response {
    if !is_open_route(request.method(), request.uri().path()) {
        let presented = request
            .headers()
            .get(ACCESS_TOKEN)
            .and_then(|v| v.to_str().ok());
        let allowed = {
            let defaults = state
                .defaults
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            token_allows(defaults.access_token.as_deref(), presented)
        };
        if !allowed {
            return unauthorized(&AuthError::MissingOrWrongToken);
        }
    }
    next.run(request).await
}

/// The JSON 401 E2B's envd answers with.
pub fn unauthorized(error: &AuthError) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(serde_json::json!({ "code": 401, "message": error.to_string() })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_allows_only_the_set_token() {
        assert!(token_allows(None, None));
        assert!(token_allows(None, Some("anything")));
        assert!(token_allows(Some("tok"), Some("tok")));
        assert!(!token_allows(Some("tok"), None));
        assert!(!token_allows(Some("tok"), Some("")));
        assert!(!token_allows(Some("tok"), Some("tok2")));
    }

    fn creds<'a>(
        header_token: Option<&'a str>,
        signature: Option<&'a str>,
        expiration: Option<i64>,
    ) -> FileCredentials<'a> {
        FileCredentials {
            header_token,
            signature,
            signature_expiration: expiration,
            username: Some("user"),
            path: "a.txt",
        }
    }

    #[test]
    fn file_access_without_token_is_open() {
        let c = creds(None, Some("garbage"), Some(0));
        assert_eq!(
            check_file_access(None, FileOperation::Read, &c, 100),
            Ok(())
        );
    }

    #[test]
    fn file_access_by_header_token() {
        let read = FileOperation::Read;
        let ok = creds(Some("tok"), None, None);
        assert_eq!(check_file_access(Some("tok"), read, &ok, 0), Ok(()));
        let wrong = creds(Some("nope"), None, None);
        assert_eq!(
            check_file_access(Some("tok"), read, &wrong, 0),
            Err(AuthError::TokenMismatch)
        );
        let none = creds(None, None, None);
        assert_eq!(
            check_file_access(Some("tok"), read, &none, 0),
            Err(AuthError::MissingSignature)
        );
    }

    #[test]
    fn file_access_by_signature() {
        let read = FileOperation::Read;
        let sig = file_signature("a.txt", read, "user", "tok", None);
        let c = creds(None, Some(&sig), None);
        assert_eq!(check_file_access(Some("tok"), read, &c, 0), Ok(()));
        // A read signature does not grant writes, nor another path or user.
        assert_eq!(
            check_file_access(Some("tok"), FileOperation::Write, &c, 0),
            Err(AuthError::InvalidSignature)
        );
        let other_path = FileCredentials { path: "b.txt", ..c };
        assert_eq!(
            check_file_access(Some("tok"), read, &other_path, 0),
            Err(AuthError::InvalidSignature)
        );
        let other_user = FileCredentials {
            username: None,
            ..c
        };
        assert_eq!(
            check_file_access(Some("tok"), read, &other_user, 0),
            Err(AuthError::InvalidSignature)
        );
        assert_eq!(
            check_file_access(Some("other-token"), read, &c, 0),
            Err(AuthError::InvalidSignature)
        );
    }

    #[test]
    fn signature_expiration_is_signed_and_enforced() {
        let write = FileOperation::Write;
        let sig = file_signature("a.txt", write, "user", "tok", Some(1000));
        let c = creds(None, Some(&sig), Some(1000));
        assert_eq!(check_file_access(Some("tok"), write, &c, 999), Ok(()));
        assert_eq!(check_file_access(Some("tok"), write, &c, 1000), Ok(()));
        assert_eq!(
            check_file_access(Some("tok"), write, &c, 1001),
            Err(AuthError::SignatureExpired)
        );
        // Extending the expiration without re-signing breaks the signature.
        let extended = creds(None, Some(&sig), Some(5000));
        assert_eq!(
            check_file_access(Some("tok"), write, &extended, 1001),
            Err(AuthError::InvalidSignature)
        );
        // Dropping the expiration too.
        let dropped = creds(None, Some(&sig), None);
        assert_eq!(
            check_file_access(Some("tok"), write, &dropped, 1001),
            Err(AuthError::InvalidSignature)
        );
    }

    #[test]
    fn open_routes() {
        assert!(is_open_route(&Method::GET, "/health"));
        assert!(is_open_route(&Method::GET, "/files"));
        assert!(is_open_route(&Method::POST, "/files"));
        assert!(!is_open_route(&Method::POST, "/files/compose"));
        assert!(!is_open_route(&Method::POST, "/init"));
        assert!(!is_open_route(&Method::GET, "/envs"));
        assert!(!is_open_route(&Method::POST, "/filesystem.Filesystem/Stat"));
    }
}
