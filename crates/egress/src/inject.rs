//! Header rules (E2B's `network.rules`): headers set on requests to a domain, whose
//! values may name secrets (`${e2b.secrets.NAME}`) resolved per request.

use std::fmt;
use std::net::IpAddr;

use crate::error::PolicyError;
use crate::policy::DomainPattern;

/// Resolves secret names to values for one sandbox. Implemented by the daemon (its
/// vault). Called once per injected request so an updated secret applies to the next
/// request; it must not block for long (it runs on the proxy's async workers).
pub trait SecretResolver: Send + Sync {
    /// The current value of secret `name` as seen by the sandbox at `sandbox_addr`, or
    /// `None` when it has no such secret. The value is never logged by this crate.
    fn resolve(&self, sandbox_addr: IpAddr, name: &str) -> Option<SecretValue>;
}

/// A secret's value. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: impl Into<String>) -> Self {
        SecretValue(value.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// One piece of a header value template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Secret(String),
}

/// A header value with `${e2b.secrets.NAME}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTemplate {
    parts: Vec<Part>,
}

const SECRET_PREFIX: &str = "e2b.secrets.";

impl HeaderTemplate {
    /// Parses a value; `header` names the header for error messages.
    pub fn parse(header: &str, value: &str) -> Result<Self, PolicyError> {
        let invalid = || PolicyError::InvalidHeaderValue {
            name: header.to_string(),
        };
        if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(invalid());
        }
        let mut parts = Vec::new();
        let mut rest = value;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                parts.push(Part::Literal(rest[..start].to_string()));
            }
            let after = &rest[start + 2..];
            let end = after.find('}').ok_or_else(invalid)?;
            let placeholder = &after[..end];
            let name = placeholder
                .strip_prefix(SECRET_PREFIX)
                .filter(|n| {
                    !n.is_empty()
                        && n.bytes().all(|b| {
                            b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'
                        })
                })
                .ok_or_else(|| PolicyError::UnknownPlaceholder {
                    name: header.to_string(),
                    placeholder: placeholder.to_string(),
                })?;
            parts.push(Part::Secret(name.to_string()));
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_string()));
        }
        Ok(HeaderTemplate { parts })
    }

    /// The secret names this value uses.
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Secret(name) => Some(name.as_str()),
            Part::Literal(_) => None,
        })
    }

    /// The value with secrets filled in. `Err(name)`: that secret is unavailable, or
    /// its value cannot be sent in a header (it holds CR, LF or another control byte).
    pub(crate) fn render(
        &self,
        resolve: &dyn Fn(&str) -> Option<SecretValue>,
    ) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Secret(name) => {
                    let value = resolve(name).ok_or_else(|| name.clone())?;
                    if value
                        .expose()
                        .bytes()
                        .any(|b| b.is_ascii_control() && b != b'\t')
                    {
                        return Err(name.clone());
                    }
                    out.push_str(value.expose());
                }
            }
        }
        Ok(out)
    }
}

/// Headers to set (replacing any the client sent) on requests to matching domains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderRule {
    pub pattern: DomainPattern,
    /// Header names are stored lower-cased; matching is case-insensitive.
    headers: Vec<(String, HeaderTemplate)>,
}

impl HeaderRule {
    /// A rule for `domain` (an E2B domain pattern) setting these headers.
    pub fn new<'a>(
        domain: &str,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, PolicyError> {
        let pattern = DomainPattern::parse(domain)?;
        let headers = headers
            .into_iter()
            .map(|(name, value)| {
                let valid_name = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !valid_name {
                    return Err(PolicyError::InvalidHeaderName(name.to_string()));
                }
                Ok((
                    name.to_ascii_lowercase(),
                    HeaderTemplate::parse(name, value)?,
                ))
            })
            .collect::<Result<_, _>>()?;
        Ok(HeaderRule { pattern, headers })
    }

    pub fn headers(&self) -> impl Iterator<Item = (&str, &HeaderTemplate)> {
        self.headers.iter().map(|(n, t)| (n.as_str(), t))
    }

    pub(crate) fn sets(&self, header: &str) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(header))
    }
}

/// Why forwarding requests stopped early.
#[derive(Debug)]
pub(crate) enum InjectError {
    Io(std::io::Error),
    /// Malformed, oversized, or ambiguous framing (both Content-Length and
    /// Transfer-Encoding, or several differing Content-Lengths): refused rather than
    /// guessed, so no request can be smuggled past the injection.
    BadRequest,
    /// The named secret could not be resolved (its value is never carried here).
    SecretUnavailable(String),
}

impl From<std::io::Error> for InjectError {
    fn from(e: std::io::Error) -> Self {
        InjectError::Io(e)
    }
}

enum Body {
    None,
    Length(u64),
    Chunked,
}

const MAX_LINE: u64 = 8 * 1024;

/// Renders every header of `rule` once; `Err(name)` names the first unavailable secret.
pub(crate) fn render_headers(
    rule: &HeaderRule,
    resolve: &dyn Fn(&str) -> Option<SecretValue>,
) -> Result<Vec<(String, String)>, String> {
    rule.headers
        .iter()
        .map(|(name, template)| Ok((name.clone(), template.render(resolve)?)))
        .collect()
}

/// Forwards HTTP/1.1 requests from `client` to `upstream`, setting `rule`'s headers on
/// each (replacing any the client sent). Bodies are copied by their framing, so
/// keep-alive and pipelined requests are each rewritten; after an upgrade request
/// (WebSocket, CONNECT) the rest is copied as is. Ends at the client's EOF between
/// requests, shutting `upstream` down for writing.
pub(crate) async fn forward_requests<R, W>(
    client: &mut R,
    upstream: &mut W,
    rule: &HeaderRule,
    resolve: &(dyn Fn(&str) -> Option<SecretValue> + Sync),
    max_head: usize,
    on_request: &(dyn Fn() + Sync),
    count: &(dyn Fn(usize) + Sync),
) -> Result<(), InjectError>
where
    R: tokio::io::AsyncBufRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    loop {
        let Some(head) = read_head(client, max_head).await? else {
            upstream.shutdown().await?;
            return Ok(());
        };
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(InjectError::BadRequest),
        }
        let (Some(method), Some(path), Some(version)) =
            (request.method, request.path, request.version)
        else {
            return Err(InjectError::BadRequest);
        };
        let body = framing(request.headers)?;
        let upgrade = method.eq_ignore_ascii_case("CONNECT")
            || request
                .headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case("upgrade"));
        let rendered = render_headers(rule, resolve).map_err(InjectError::SecretUnavailable)?;

        let mut out = Vec::with_capacity(head.len() + 256);
        out.extend_from_slice(format!("{method} {path} HTTP/1.{version}\r\n").as_bytes());
        for h in request.headers.iter().filter(|h| !rule.sets(h.name)) {
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
        for (name, value) in &rendered {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        upstream.write_all(&out).await?;
        count(out.len());
        on_request();

        match body {
            Body::None => {}
            Body::Length(n) => copy_exact(client, upstream, n, count).await?,
            Body::Chunked => loop {
                let line = read_line(client).await?;
                upstream.write_all(&line).await?;
                count(line.len());
                let size_text = std::str::from_utf8(&line)
                    .map_err(|_| InjectError::BadRequest)?
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim();
                let size =
                    u64::from_str_radix(size_text, 16).map_err(|_| InjectError::BadRequest)?;
                if size == 0 {
                    // Trailer section, up to its empty line.
                    loop {
                        let line = read_line(client).await?;
                        upstream.write_all(&line).await?;
                        count(line.len());
                        if line == b"\r\n" || line == b"\n" {
                            break;
                        }
                    }
                    break;
                }
                copy_exact(client, upstream, size, count).await?;
                let crlf = read_line(client).await?;
                if crlf != b"\r\n" && crlf != b"\n" {
                    return Err(InjectError::BadRequest);
                }
                upstream.write_all(&crlf).await?;
                count(crlf.len());
            },
        }
        upstream.flush().await?;
        if upgrade {
            // Whatever follows is the upgraded protocol, not HTTP requests.
            let copied = tokio::io::copy_buf(client, upstream).await?;
            count(usize::try_from(copied).unwrap_or(usize::MAX));
            upstream.shutdown().await?;
            return Ok(());
        }
    }
}

fn framing(headers: &[httparse::Header<'_>]) -> Result<Body, InjectError> {
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let value = std::str::from_utf8(h.value).map_err(|_| InjectError::BadRequest)?;
            let last = value.rsplit(',').next().unwrap_or("").trim();
            if !last.eq_ignore_ascii_case("chunked") {
                return Err(InjectError::BadRequest);
            }
            chunked = true;
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(h.value)
                .map_err(|_| InjectError::BadRequest)?
                .trim();
            if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Err(InjectError::BadRequest);
            }
            let n: u64 = value.parse().map_err(|_| InjectError::BadRequest)?;
            if length.is_some_and(|l| l != n) {
                return Err(InjectError::BadRequest);
            }
            length = Some(n);
        }
    }
    match (chunked, length) {
        (true, Some(_)) => Err(InjectError::BadRequest),
        (true, None) => Ok(Body::Chunked),
        (false, Some(n)) => Ok(Body::Length(n)),
        (false, None) => Ok(Body::None),
    }
}

/// The next request head (through its empty line); `None` at a clean EOF before it.
async fn read_head<R: tokio::io::AsyncBufRead + Unpin>(
    client: &mut R,
    max: usize,
) -> Result<Option<Vec<u8>>, InjectError> {
    use tokio::io::AsyncBufReadExt;
    let mut head = Vec::new();
    loop {
        let buf = client.fill_buf().await?;
        if buf.is_empty() {
            return if head.iter().all(|b| *b == b'\r' || *b == b'\n') {
                Ok(None)
            } else {
                Err(InjectError::BadRequest)
            };
        }
        let old = head.len();
        head.extend_from_slice(buf);
        let available = buf.len();
        let start = old.saturating_sub(3);
        if let Some(p) = head[start..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = start + p + 4;
            head.truncate(end);
            client.consume(end - old);
            return Ok(Some(head));
        }
        client.consume(available);
        if head.len() > max {
            return Err(InjectError::BadRequest);
        }
    }
}

async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    client: &mut R,
) -> Result<Vec<u8>, InjectError> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut line = Vec::new();
    client.take(MAX_LINE).read_until(b'\n', &mut line).await?;
    if !line.ends_with(b"\n") {
        return Err(InjectError::BadRequest);
    }
    Ok(line)
}

async fn copy_exact<R, W>(
    client: &mut R,
    upstream: &mut W,
    n: u64,
    count: &(dyn Fn(usize) + Sync),
) -> Result<(), InjectError>
where
    R: tokio::io::AsyncBufRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let copied = tokio::io::copy_buf(&mut client.take(n), upstream).await?;
    count(usize::try_from(copied).unwrap_or(usize::MAX));
    if copied != n {
        return Err(InjectError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_render() {
        let t = HeaderTemplate::parse("Authorization", "Bearer ${e2b.secrets.API_KEY}!").unwrap();
        assert_eq!(t.secrets().collect::<Vec<_>>(), ["API_KEY"]);
        let rendered = t
            .render(&|name| (name == "API_KEY").then(|| SecretValue::new("s3cr3t")))
            .unwrap();
        assert_eq!(rendered, "Bearer s3cr3t!");
        assert_eq!(t.render(&|_| None), Err("API_KEY".to_string()));
        let crlf = t.render(&|_| Some(SecretValue::new("a\r\nX-Evil: 1")));
        assert_eq!(
            crlf,
            Err("API_KEY".to_string()),
            "a secret cannot smuggle header lines"
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        assert!(matches!(
            HeaderTemplate::parse("h", "${e2b.secrets.X"),
            Err(PolicyError::InvalidHeaderValue { .. })
        ));
        assert!(matches!(
            HeaderTemplate::parse("h", "${env.HOME}"),
            Err(PolicyError::UnknownPlaceholder { .. })
        ));
        assert!(matches!(
            HeaderTemplate::parse("h", "a\nb"),
            Err(PolicyError::InvalidHeaderValue { .. })
        ));
        assert!(matches!(
            HeaderRule::new("a.test", [("bad name", "v")]),
            Err(PolicyError::InvalidHeaderName(_))
        ));
    }

    #[test]
    fn secret_values_never_show_in_debug() {
        let v = SecretValue::new("hunter2");
        assert!(!format!("{v:?}").contains("hunter2"));
    }

    async fn rewrite(input: &[u8], rule: &HeaderRule) -> Result<Vec<u8>, InjectError> {
        let mut client = tokio::io::BufReader::new(input);
        let mut out = Vec::new();
        let resolve = |name: &str| (name == "TOKEN").then(|| SecretValue::new("s3cr3t"));
        forward_requests(
            &mut client,
            &mut out,
            rule,
            &resolve,
            64 * 1024,
            &|| {},
            &|_| {},
        )
        .await?;
        Ok(out)
    }

    fn rule() -> HeaderRule {
        HeaderRule::new(
            "api.test",
            [("Authorization", "Bearer ${e2b.secrets.TOKEN}")],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn pipelined_requests_with_both_framings_are_each_rewritten() {
        let input = b"POST /a HTTP/1.1\r\nHost: api.test\r\nauthorization: Bearer fake\r\nContent-Length: 5\r\n\r\nhello\
GET /b HTTP/1.1\r\nHost: api.test\r\n\r\n\
POST /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n";
        let out = String::from_utf8(rewrite(input, &rule()).await.unwrap()).unwrap();
        assert_eq!(
            out.matches("authorization: Bearer s3cr3t\r\n").count(),
            3,
            "{out}"
        );
        assert!(!out.contains("fake"), "the client's own value is replaced");
        assert!(out.contains("\r\n\r\nhello"));
        assert!(out.contains("5;ext=1\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"));
        assert!(
            out.find("/a").unwrap() < out.find("/b").unwrap()
                && out.find("/b").unwrap() < out.find("/c").unwrap()
        );
    }

    #[tokio::test]
    async fn body_bytes_that_look_like_requests_are_not_rewritten() {
        let smuggled = b"GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n";
        let mut input = format!(
            "POST /a HTTP/1.1\r\nHost: api.test\r\nContent-Length: {}\r\n\r\n",
            smuggled.len()
        )
        .into_bytes();
        input.extend_from_slice(smuggled);
        let out = String::from_utf8(rewrite(&input, &rule()).await.unwrap()).unwrap();
        assert_eq!(
            out.matches("s3cr3t").count(),
            1,
            "only the real request carries the secret"
        );
    }

    #[tokio::test]
    async fn ambiguous_framing_and_missing_secrets_stop_forwarding() {
        let both = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(
            rewrite(both, &rule()).await,
            Err(InjectError::BadRequest)
        ));
        let differing = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd";
        assert!(matches!(
            rewrite(differing, &rule()).await,
            Err(InjectError::BadRequest)
        ));
        let missing = HeaderRule::new("api.test", [("X-Key", "${e2b.secrets.NOPE}")]).unwrap();
        let err = rewrite(b"GET / HTTP/1.1\r\n\r\n", &missing).await;
        assert!(matches!(err, Err(InjectError::SecretUnavailable(name)) if name == "NOPE"));
        let truncated = b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
        assert!(rewrite(truncated, &rule()).await.is_err());
    }
}
