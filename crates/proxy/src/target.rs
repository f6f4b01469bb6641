//! Deciding whether a request is meant for a sandbox, and for which one.

use std::fmt;

use berth_envd_proto::headers::{SANDBOX_ID, SANDBOX_PORT};
use berth_envd_proto::http::INTERNAL_ROUTES;
use http::header::HOST;
use http::Request;

/// First path segment of path-addressed requests: `/proxy/<sandboxId>/<port>/<rest>`
/// reaches `/<rest>` on `<port>` of the sandbox, for deployments without wildcard DNS.
pub const PATH_PREFIX_SEGMENT: &str = "proxy";

/// A sandbox id that passed routing validation: non-empty, `[a-z0-9]` only.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SandboxId(String);

impl SandboxId {
    /// Longest id accepted; E2B's ids are 21 characters, this leaves room without
    /// letting a header carry an unbounded string into lookups and logs.
    pub const MAX_LEN: usize = 64;

    /// Validates `raw` against `^[a-z0-9]+$`.
    pub fn parse(raw: &str) -> Result<Self, TargetError> {
        let valid = !raw.is_empty()
            && raw.len() <= Self::MAX_LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if valid {
            Ok(Self(raw.to_owned()))
        } else {
            Err(TargetError::InvalidSandboxId(truncate_for_message(raw)))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SandboxId({})", self.0)
    }
}

/// How a request named its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressing {
    /// `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers.
    Headers,
    /// `Host: <port>-<sandboxId>.<domain>`.
    Host,
    /// `/proxy/<sandboxId>/<port>/…` path prefix.
    PathPrefix,
    /// A signed `/files` URL naming no sandbox: the sandbox whose token signed it.
    Signature,
}

/// Where a proxied request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub sandbox_id: SandboxId,
    pub port: u16,
    pub addressing: Addressing,
    /// Path and query to send to the sandbox's port (the path prefix removed).
    pub path_and_query: String,
}

impl Target {
    /// The path part of [`Target::path_and_query`].
    pub fn path(&self) -> &str {
        self.path_and_query.split('?').next().unwrap_or("")
    }

    /// The query part of [`Target::path_and_query`], if any.
    pub fn query(&self) -> Option<&str> {
        self.path_and_query.split_once('?').map(|(_, query)| query)
    }
}

/// A request that addresses a sandbox but does so wrongly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("invalid sandbox id {0:?}: expected lowercase letters and digits")]
    InvalidSandboxId(String),
    #[error("invalid sandbox port {0:?}: expected a number from 1 to 65535")]
    InvalidPort(String),
    #[error("the E2b-Sandbox-Port header is required with E2b-Sandbox-Id")]
    MissingPort,
}

/// What the proxy needs to know to recognise sandbox traffic.
#[derive(Debug, Clone, Default)]
pub struct RoutingConfig {
    /// Domain of `<port>-<id>.<domain>` hosts, possibly with the listener's port
    /// (`localhost:3000`: the SDKs' `get_host` appends the domain as is, so a port in it
    /// reaches a listener that is not on 80). `None` accepts any host whose first label
    /// has the `<port>-<id>` shape.
    pub domain: Option<String>,
}

impl RoutingConfig {
    /// Decides whether `req` is meant for a sandbox. `None`: it is not (it belongs to
    /// the API). `Some(Err)`: it addresses a sandbox in a malformed way and should be
    /// answered with 400 by the proxy rather than reach the API.
    pub fn classify<B>(&self, req: &Request<B>) -> Option<Result<Target, TargetError>> {
        let path_and_query = req
            .uri()
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned();

        if let Some(raw_id) = req.headers().get(SANDBOX_ID) {
            return Some(classify_headers(req, raw_id, path_and_query));
        }
        if let Some(host) = request_host(req) {
            if let Some(label) = self.sandbox_host_label(host) {
                return Some(parse_host_label(label, path_and_query));
            }
        }
        classify_path_prefix(&path_and_query)
    }

    /// The `<port>-<id>` label of `host` when it is a sandbox host.
    fn sandbox_host_label<'h>(&self, host: &'h str) -> Option<&'h str> {
        let host = strip_host_port(host);
        let (label, rest) = host.split_once('.')?;
        if let Some(domain) = &self.domain {
            if !rest.eq_ignore_ascii_case(strip_host_port(domain).trim_end_matches('.')) {
                return None;
            }
        }
        let (port, id) = label.split_once('-')?;
        let port_shaped = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
        (port_shaped && !id.is_empty()).then_some(label)
    }
}

fn classify_headers<B>(
    req: &Request<B>,
    raw_id: &http::HeaderValue,
    path_and_query: String,
) -> Result<Target, TargetError> {
    let sandbox_id = SandboxId::parse(raw_id.to_str().unwrap_or(""))?;
    let raw_port = req
        .headers()
        .get(SANDBOX_PORT)
        .ok_or(TargetError::MissingPort)?;
    let port = parse_port(raw_port.to_str().unwrap_or(""))?;
    Ok(Target {
        sandbox_id,
        port,
        addressing: Addressing::Headers,
        path_and_query,
    })
}

fn parse_host_label(label: &str, path_and_query: String) -> Result<Target, TargetError> {
    let (raw_port, raw_id) = label.split_once('-').unwrap_or((label, ""));
    let port = parse_port(raw_port)?;
    let sandbox_id = SandboxId::parse(raw_id)?;
    Ok(Target {
        sandbox_id,
        port,
        addressing: Addressing::Host,
        path_and_query,
    })
}

fn classify_path_prefix(path_and_query: &str) -> Option<Result<Target, TargetError>> {
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    let mut segments = path.strip_prefix('/')?.splitn(4, '/');
    if segments.next()? != PATH_PREFIX_SEGMENT {
        return None;
    }
    let raw_id = segments.next().unwrap_or("");
    let raw_port = segments.next().unwrap_or("");
    let rest = segments.next().unwrap_or("");
    Some((|| {
        let sandbox_id = SandboxId::parse(raw_id)?;
        let port = parse_port(raw_port)?;
        let mut forwarded = format!("/{rest}");
        if let Some(query) = query {
            forwarded.push('?');
            forwarded.push_str(query);
        }
        Ok(Target {
            sandbox_id,
            port,
            addressing: Addressing::PathPrefix,
            path_and_query: forwarded,
        })
    })())
}

fn parse_port(raw: &str) -> Result<u16, TargetError> {
    match raw.parse::<u16>() {
        Ok(port) if port != 0 && raw.bytes().all(|b| b.is_ascii_digit()) => Ok(port),
        _ => Err(TargetError::InvalidPort(truncate_for_message(raw))),
    }
}

/// The host the client addressed: the URI authority (HTTP/2, absolute-form) or `Host`.
fn request_host<B>(req: &Request<B>) -> Option<&str> {
    req.uri()
        .host()
        .or_else(|| req.headers().get(HOST)?.to_str().ok())
}

fn strip_host_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host;
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

fn truncate_for_message(raw: &str) -> String {
    raw.chars().take(SandboxId::MAX_LEN).collect()
}

/// Whether `path` reaches one of envd's internal routes, after the normalisation a
/// server could apply (percent-decoding, duplicate slashes, dot segments, case,
/// trailing slash) so that no spelling slips through.
pub fn is_internal_envd_route(path: &str) -> bool {
    let decoded = percent_decode(path);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    segments.first().is_some_and(|first| {
        INTERNAL_ROUTES
            .iter()
            .any(|route| first.eq_ignore_ascii_case(route))
    })
}

/// Decodes `%XX` escapes repeatedly until the string stops changing, so double
/// encoding cannot hide a route either.
fn percent_decode(input: &str) -> String {
    let mut current = input.to_owned();
    loop {
        let bytes = current.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let escaped = (bytes[i] == b'%')
                .then(|| bytes.get(i + 1..i + 3))
                .flatten()
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok());
            match escaped {
                Some(byte) => {
                    out.push(byte);
                    i += 3;
                }
                None => {
                    out.push(bytes[i]);
                    i += 1;
                }
            }
        }
        let next = String::from_utf8_lossy(&out).into_owned();
        if next == current {
            return next;
        }
        current = next;
    }
}

#[cfg(test)]
mod tests {
    use berth_envd_proto::ENVD_PORT;

    use super::*;

    fn request(uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    fn routing(domain: Option<&str>) -> RoutingConfig {
        RoutingConfig {
            domain: domain.map(str::to_owned),
        }
    }

    #[test]
    fn api_requests_are_not_classified() {
        let config = routing(Some("berth.test"));
        for (uri, host) in [
            ("/sandboxes", "api.berth.test"),
            ("/v2/sandboxes?limit=2", "127.0.0.1:3000"),
            ("/health", "localhost"),
            ("/proxyx/abc/80/", "127.0.0.1"),
            ("/sandboxes/abc/proxy", "[::1]:3000"),
        ] {
            assert_eq!(
                config.classify(&request(uri, &[("host", host)])),
                None,
                "{uri} {host}"
            );
        }
    }

    #[test]
    fn headers_address_the_sandbox_and_keep_the_path() {
        let req = request(
            "/process.Process/Start?x=1",
            &[
                ("host", "127.0.0.1:3000"),
                ("E2b-Sandbox-Id", "iabc123"),
                ("E2b-Sandbox-Port", "49983"),
            ],
        );
        let target = routing(None).classify(&req).unwrap().unwrap();
        assert_eq!(target.sandbox_id.as_str(), "iabc123");
        assert_eq!(target.port, ENVD_PORT);
        assert_eq!(target.addressing, Addressing::Headers);
        assert_eq!(target.path_and_query, "/process.Process/Start?x=1");
        assert_eq!(target.path(), "/process.Process/Start");
        assert_eq!(target.query(), Some("x=1"));
    }

    #[test]
    fn header_errors_are_reported_not_sent_to_the_api() {
        let config = routing(None);
        let bad_id = request(
            "/",
            &[("E2b-Sandbox-Id", "ABC"), ("E2b-Sandbox-Port", "80")],
        );
        assert_eq!(
            config.classify(&bad_id),
            Some(Err(TargetError::InvalidSandboxId("ABC".into())))
        );
        let traversal = request(
            "/",
            &[("E2b-Sandbox-Id", "../x"), ("E2b-Sandbox-Port", "80")],
        );
        assert!(matches!(
            config.classify(&traversal),
            Some(Err(TargetError::InvalidSandboxId(_)))
        ));
        let no_port = request("/", &[("E2b-Sandbox-Id", "abc")]);
        assert_eq!(
            config.classify(&no_port),
            Some(Err(TargetError::MissingPort))
        );
        for port in ["0", "65536", "+80", "http", ""] {
            let req = request(
                "/",
                &[("E2b-Sandbox-Id", "abc"), ("E2b-Sandbox-Port", port)],
            );
            assert_eq!(
                config.classify(&req),
                Some(Err(TargetError::InvalidPort(port.into()))),
                "{port}"
            );
        }
    }

    #[test]
    fn host_addressing_with_and_without_a_domain() {
        let req = request("/index.html", &[("host", "8080-iabc.berth.test:3000")]);
        let target = routing(Some("berth.test")).classify(&req).unwrap().unwrap();
        assert_eq!((target.sandbox_id.as_str(), target.port), ("iabc", 8080));
        assert_eq!(target.addressing, Addressing::Host);
        assert_eq!(target.path_and_query, "/index.html");

        // A domain that carries the listener's port matches hosts with any port.
        let with_port = routing(Some("localhost:3000"))
            .classify(&request("/", &[("host", "8080-iabc.localhost:3000")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (with_port.sandbox_id.as_str(), with_port.port),
            ("iabc", 8080)
        );

        let other_domain = request("/", &[("host", "8080-iabc.elsewhere.test")]);
        assert_eq!(routing(Some("berth.test")).classify(&other_domain), None);
        let target = routing(None).classify(&other_domain).unwrap().unwrap();
        assert_eq!(target.port, 8080);

        let absolute = request("http://49983-xyz9.berth.test/health", &[]);
        let target = routing(Some("berth.test"))
            .classify(&absolute)
            .unwrap()
            .unwrap();
        assert_eq!(
            (target.sandbox_id.as_str(), target.port),
            ("xyz9", ENVD_PORT)
        );

        let bad_id = request("/", &[("host", "8080-i_bad.berth.test")]);
        assert!(matches!(
            routing(Some("berth.test")).classify(&bad_id),
            Some(Err(TargetError::InvalidSandboxId(_)))
        ));
        let bad_port = request("/", &[("host", "99999-iabc.berth.test")]);
        assert!(matches!(
            routing(Some("berth.test")).classify(&bad_port),
            Some(Err(TargetError::InvalidPort(_)))
        ));
    }

    #[test]
    fn path_prefix_is_stripped() {
        let config = routing(None);
        let target = config
            .classify(&request("/proxy/iabc/3000/api/items?page=2", &[]))
            .unwrap()
            .unwrap();
        assert_eq!((target.sandbox_id.as_str(), target.port), ("iabc", 3000));
        assert_eq!(target.addressing, Addressing::PathPrefix);
        assert_eq!(target.path_and_query, "/api/items?page=2");

        let root = config
            .classify(&request("/proxy/iabc/3000", &[]))
            .unwrap()
            .unwrap();
        assert_eq!(root.path_and_query, "/");
        let root_query = config
            .classify(&request("/proxy/iabc/3000?a=b", &[]))
            .unwrap()
            .unwrap();
        assert_eq!(root_query.path_and_query, "/?a=b");

        assert!(matches!(
            config.classify(&request("/proxy/IABC/3000/", &[])),
            Some(Err(TargetError::InvalidSandboxId(_)))
        ));
        assert!(matches!(
            config.classify(&request("/proxy/iabc/", &[])),
            Some(Err(TargetError::InvalidPort(_)))
        ));
    }

    #[test]
    fn headers_win_over_host_and_path() {
        let req = request(
            "/proxy/other/80/x",
            &[
                ("host", "8080-hostid.berth.test"),
                ("E2b-Sandbox-Id", "hdr"),
                ("E2b-Sandbox-Port", "1"),
            ],
        );
        let target = routing(Some("berth.test")).classify(&req).unwrap().unwrap();
        assert_eq!((target.sandbox_id.as_str(), target.port), ("hdr", 1));
        assert_eq!(target.path_and_query, "/proxy/other/80/x");
    }

    #[test]
    fn internal_routes_are_recognised_in_every_spelling() {
        for path in [
            "/init",
            "/init/",
            "//init",
            "/./init",
            "/INIT",
            "/%69nit",
            "/%2569nit",
            "/x/../init",
            "/freeze",
            "/unfreeze?x",
            "/collapse",
            "/fsfreeze",
            "/fsthaw",
            "\\init",
            "/init/sub",
        ] {
            let path = path.split('?').next().unwrap();
            assert!(is_internal_envd_route(path), "{path}");
        }
        for path in [
            "/",
            "/health",
            "/files",
            "/initial",
            "/files/init",
            "/process.Process/Start",
            "/%zz",
        ] {
            assert!(!is_internal_envd_route(path), "{path}");
        }
    }
}
