//! The Registry v2 HTTP API: manifests and blobs of one repository, with the auth
//! dance registries ask for (anonymous, Basic, or a Bearer token from the realm a
//! `WWW-Authenticate` challenge names).

use std::io::Read;
use std::time::Duration;

use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::StatusCode;
use serde::Deserialize;

use crate::error::OciError;

/// Username and password for a registry (E2B's `fromImageRegistry` of type `registry`).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Largest manifest or config document accepted (registries cap manifests at 4 MiB).
const MAX_DOCUMENT: u64 = 8 << 20;

/// How the client currently authenticates to the registry.
#[derive(Debug, Clone)]
enum Auth {
    Anonymous,
    Basic,
    Bearer(String),
}

/// A client for one repository of one registry.
pub(crate) struct Repository {
    http: Client,
    /// `http(s)://host[:port]`, no trailing slash.
    base_url: String,
    /// For messages: the registry as the reference or mirror names it.
    registry: String,
    repository: String,
    credentials: Option<Credentials>,
    auth: Auth,
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }
}

/// Parses `Bearer realm="…",service="…",scope="…"` (quoted values may hold commas).
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek() {
                if *c == ',' {
                    break;
                }
                value.push(*c);
                chars.next();
            }
        }
        params.push((key.trim().to_string(), value.trim().to_string()));
    }
    (!scheme.is_empty()).then(|| Challenge {
        scheme: scheme.to_string(),
        params,
    })
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

impl Repository {
    pub(crate) fn new(
        http: Client,
        base_url: String,
        registry: String,
        repository: String,
        credentials: Option<Credentials>,
    ) -> Repository {
        Repository {
            http,
            base_url,
            registry,
            repository,
            credentials,
            auth: Auth::Anonymous,
        }
    }

    pub(crate) fn registry(&self) -> &str {
        &self.registry
    }

    /// A manifest (index or image manifest) by tag or digest: its bytes and media type.
    pub(crate) fn manifest(&mut self, reference: &str) -> Result<(Vec<u8>, String), OciError> {
        let url = format!(
            "{}/v2/{}/manifests/{reference}",
            self.base_url, self.repository
        );
        let response = self.get(&url, Some(crate::manifest::MANIFEST_ACCEPT), true)?;
        let response = self.check(response, &url, || format!("manifest {reference}"))?;
        let media_type = header_str(response.headers(), CONTENT_TYPE)
            .map(|t| t.split(';').next().unwrap_or("").trim().to_string())
            .unwrap_or_default();
        let bytes = read_limited(response, &self.registry, "manifest")?;
        Ok((bytes, media_type))
    }

    /// A small blob (an image config) read whole.
    pub(crate) fn small_blob(&mut self, digest: &str) -> Result<Vec<u8>, OciError> {
        let response = self.blob(digest)?;
        read_limited(response, &self.registry, "config blob")
    }

    /// A blob as a stream of its bytes (the caller verifies the digest).
    pub(crate) fn blob(&mut self, digest: &str) -> Result<Response, OciError> {
        let url = format!("{}/v2/{}/blobs/{digest}", self.base_url, self.repository);
        let response = self.get(&url, None, false)?;
        self.check(response, &url, || format!("blob {digest}"))
    }

    /// GET with the current auth; on a 401, answer the challenge once and retry.
    fn get(
        &mut self,
        url: &str,
        accept: Option<&str>,
        bounded: bool,
    ) -> Result<Response, OciError> {
        let response = self.send(url, accept, bounded)?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenge = header_str(response.headers(), WWW_AUTHENTICATE).and_then(parse_challenge);
        match challenge {
            Some(c) if c.scheme.eq_ignore_ascii_case("bearer") => {
                let token = self.fetch_token(&c)?;
                self.auth = Auth::Bearer(token);
            }
            Some(c) if c.scheme.eq_ignore_ascii_case("basic") && self.credentials.is_some() => {
                self.auth = Auth::Basic;
            }
            _ => return Err(self.unauthorized(StatusCode::UNAUTHORIZED)),
        }
        let retried = self.send(url, accept, bounded)?;
        if retried.status() == StatusCode::UNAUTHORIZED {
            return Err(self.unauthorized(StatusCode::UNAUTHORIZED));
        }
        Ok(retried)
    }

    fn send(&self, url: &str, accept: Option<&str>, bounded: bool) -> Result<Response, OciError> {
        let mut request = self.http.get(url);
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        if bounded {
            request = request.timeout(Duration::from_secs(120));
        }
        self.authorize(request)
            .send()
            .map_err(|source| OciError::Connect {
                registry: self.registry.clone(),
                source,
            })
    }

    fn authorize(&self, request: RequestBuilder) -> RequestBuilder {
        match (&self.auth, &self.credentials) {
            (Auth::Bearer(token), _) => request.bearer_auth(token),
            (Auth::Basic, Some(c)) => request.basic_auth(&c.username, Some(&c.password)),
            _ => request,
        }
    }

    /// A pull token from the challenge's realm, with the credentials when there are some.
    fn fetch_token(&self, challenge: &Challenge) -> Result<String, OciError> {
        let realm = challenge.param("realm").unwrap_or_default().to_string();
        let token_error = |detail: String| OciError::Token {
            registry: self.registry.clone(),
            realm: realm.clone(),
            detail,
        };
        let parsed = reqwest::Url::parse(&realm)
            .map_err(|e| token_error(format!("the realm is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(token_error("the realm is not an http(s) URL".into()));
        }
        let scope = challenge
            .param("scope")
            .map(str::to_string)
            .unwrap_or_else(|| format!("repository:{}:pull", self.repository));
        let mut query = vec![("scope", scope)];
        if let Some(service) = challenge.param("service") {
            query.push(("service", service.to_string()));
        }
        let mut request = self
            .http
            .get(parsed)
            .query(&query)
            .timeout(Duration::from_secs(60));
        if let Some(c) = &self.credentials {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let response = request.send().map_err(|e| token_error(e.to_string()))?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(self.unauthorized(status));
        }
        if !status.is_success() {
            return Err(token_error(format!("it answered {status}")));
        }
        let body: TokenResponse = response
            .json()
            .map_err(|e| token_error(format!("unreadable token response: {e}")))?;
        body.token
            .or(body.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| token_error("the response holds no token".into()))
    }

    fn check(
        &self,
        response: Response,
        url: &str,
        what: impl FnOnce() -> String,
    ) -> Result<Response, OciError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        Err(match status {
            StatusCode::NOT_FOUND => OciError::NotFound {
                registry: self.registry.clone(),
                repository: self.repository.clone(),
                what: what(),
            },
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => self.unauthorized(status),
            _ => OciError::Status {
                registry: self.registry.clone(),
                url: url.to_string(),
                status: status.as_u16(),
            },
        })
    }

    fn unauthorized(&self, status: StatusCode) -> OciError {
        OciError::Unauthorized {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            status: status.as_u16(),
        }
    }
}

fn header_str(headers: &HeaderMap, name: reqwest::header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn read_limited(
    response: Response,
    registry: &str,
    what: &'static str,
) -> Result<Vec<u8>, OciError> {
    let mut bytes = Vec::new();
    response
        .take(MAX_DOCUMENT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| OciError::Malformed {
            registry: registry.to_string(),
            what,
            detail: format!("reading it failed: {e}"),
        })?;
    if bytes.len() as u64 > MAX_DOCUMENT {
        return Err(OciError::Malformed {
            registry: registry.to_string(),
            what,
            detail: format!("larger than {MAX_DOCUMENT} bytes"),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_parse_with_quoted_commas() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "Bearer");
        assert_eq!(c.param("realm"), Some("https://auth.example/token"));
        assert_eq!(c.param("service"), Some("registry.example"));
        assert_eq!(c.param("scope"), Some("repository:a/b:pull,push"));
    }

    #[test]
    fn basic_challenges_and_unquoted_values_parse() {
        let c = parse_challenge(r#"Basic realm="basic-realm""#).unwrap();
        assert_eq!(c.scheme, "Basic");
        assert_eq!(c.param("REALM"), Some("basic-realm"));
        let c = parse_challenge("Bearer realm=http://127.0.0.1:1/t, service=x").unwrap();
        assert_eq!(c.param("realm"), Some("http://127.0.0.1:1/t"));
        assert_eq!(c.param("service"), Some("x"));
        assert!(parse_challenge("").is_none());
    }

    #[test]
    fn credentials_never_print_the_password() {
        let c = Credentials {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
