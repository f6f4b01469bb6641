//! Server-side sessions: the API key lives here, the browser holds a random id.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::http::header::{COOKIE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue};
use parking_lot::Mutex;

use crate::SESSION_IDLE;

/// Cookie holding the session id.
pub const SESSION_COOKIE: &str = "berth_session";
/// Cookie holding the login form's double-submit token.
pub const LOGIN_COOKIE: &str = "berth_login";
/// Header the dashboard's script sends the CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// Form field carrying the CSRF token.
pub const CSRF_FIELD: &str = "csrf";

/// One signed-in browser.
pub struct Session {
    /// The API key every call of this session is made with; never leaves the server.
    pub api_key: String,
    /// The team the key belongs to (usage charts).
    pub team_id: String,
    /// Required on every state-changing request of this session.
    pub csrf: String,
    last_used: Mutex<Instant>,
}

impl Session {
    /// Whether `offered` is this session's CSRF token.
    pub fn csrf_matches(&self, offered: &str) -> bool {
        constant_time_eq(self.csrf.as_bytes(), offered.as_bytes())
    }
}

#[derive(Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    /// Starts a session for `api_key` (already checked); returns its id.
    pub fn create(&self, api_key: String, team_id: String) -> String {
        let id = random_token();
        let session = Arc::new(Session {
            api_key,
            team_id,
            csrf: random_token(),
            last_used: Mutex::new(Instant::now()),
        });
        let mut sessions = self.by_id.lock();
        sessions.retain(|_, session| session.last_used.lock().elapsed() < SESSION_IDLE);
        sessions.insert(id.clone(), session);
        id
    }

    /// The live session the request's cookie names, marked used.
    pub fn find(&self, headers: &HeaderMap) -> Option<Arc<Session>> {
        let id = cookie(headers, SESSION_COOKIE)?;
        let mut sessions = self.by_id.lock();
        let session = sessions.get(&id)?.clone();
        let mut last_used = session.last_used.lock();
        if last_used.elapsed() >= SESSION_IDLE {
            drop(last_used);
            sessions.remove(&id);
            return None;
        }
        *last_used = Instant::now();
        drop(last_used);
        Some(session)
    }

    /// Ends the session the request's cookie names, if any.
    pub fn remove(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, SESSION_COOKIE) {
            self.by_id.lock().remove(&id);
        }
    }
}

/// 32 random bytes, hex.
pub fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
}

/// Whether the browser reached berth over TLS, as a TLS-terminating proxy in front of
/// it says (`X-Forwarded-Proto: https`); berth itself serves plain HTTP.
pub fn over_tls(request: &HeaderMap) -> bool {
    request
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"))
}

/// A `Set-Cookie` for a dashboard cookie: script cannot read it, other sites never
/// send it, it goes only to the dashboard's paths, and over TLS only when the page
/// came over TLS (`secure`). `None` clears it.
pub fn set_cookie(headers: &mut HeaderMap, name: &str, value: Option<&str>, secure: bool) {
    let secure = if secure { "; Secure" } else { "" };
    let line = match value {
        Some(value) => {
            format!("{name}={value}; HttpOnly; SameSite=Strict; Path=/dashboard{secure}")
        }
        None => format!("{name}=; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age=0{secure}"),
    };
    headers.append(
        SET_COOKIE,
        HeaderValue::from_str(&line).expect("cookie names and hex tokens are valid headers"),
    );
}

/// Compares without an early exit, so timing does not tell how much of a token matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(COOKIE, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn cookie_is_found_among_others() {
        let headers = with_cookie("a=1; berth_session=abc; b=2");
        assert_eq!(cookie(&headers, SESSION_COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&headers, LOGIN_COOKIE), None);
        // A name that only ends like ours is another cookie.
        let headers = with_cookie("xberth_session=evil");
        assert_eq!(cookie(&headers, SESSION_COOKIE), None);
    }

    #[test]
    fn sessions_are_found_by_cookie_and_end_on_remove() {
        let sessions = Sessions::default();
        let id = sessions.create("e2b_key".into(), "team".into());
        let headers = with_cookie(&format!("{SESSION_COOKIE}={id}"));
        let session = sessions.find(&headers).expect("session");
        assert_eq!(session.api_key, "e2b_key");
        assert!(session.csrf_matches(&session.csrf.clone()));
        assert!(!session.csrf_matches(""));
        assert!(!session.csrf_matches(&random_token()));
        assert!(sessions
            .find(&with_cookie(&format!("{SESSION_COOKIE}=nope")))
            .is_none());
        sessions.remove(&headers);
        assert!(sessions.find(&headers).is_none());
    }

    #[test]
    fn set_cookie_is_http_only_and_strict() {
        let mut headers = HeaderMap::new();
        set_cookie(&mut headers, SESSION_COOKIE, Some("abc"), false);
        let line = headers.get(SET_COOKIE).unwrap().to_str().unwrap();
        assert!(line.contains("HttpOnly") && line.contains("SameSite=Strict"));
        assert!(line.contains("Path=/dashboard") && !line.contains("Secure"));
        let mut request = HeaderMap::new();
        assert!(!over_tls(&request));
        request.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(over_tls(&request));
        let mut headers = HeaderMap::new();
        set_cookie(&mut headers, SESSION_COOKIE, Some("abc"), true);
        assert!(headers
            .get(SET_COOKIE)
            .unwrap()
            .to_str()
            .unwrap()
            .ends_with("; Secure"));
    }

    #[test]
    fn tokens_differ_and_compare_exactly() {
        let (a, b) = (random_token(), random_token());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert!(constant_time_eq(a.as_bytes(), a.as_bytes()));
        assert!(!constant_time_eq(a.as_bytes(), b.as_bytes()));
        assert!(!constant_time_eq(b"ab", b"abc"));
    }
}
