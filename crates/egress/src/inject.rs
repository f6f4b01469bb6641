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
}
