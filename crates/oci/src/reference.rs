//! Image references as Docker writes them: `[registry/]repository[:tag][@digest]`.

use std::fmt;

use crate::error::OciError;

/// Docker Hub's name in references, and the host its API is served from.
pub const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReference {
    /// Registry as written (`docker.io` when none was), e.g. `127.0.0.1:5000`.
    pub registry: String,
    /// Repository path, e.g. `library/ubuntu`.
    pub repository: String,
    /// Tag (default `latest` when neither tag nor digest is given).
    pub tag: Option<String>,
    /// `sha256:<hex>` when pinned by digest.
    pub digest: Option<String>,
}

impl ImageReference {
    pub fn parse(reference: &str) -> Result<ImageReference, OciError> {
        let invalid = |reason| OciError::InvalidReference {
            reference: reference.to_string(),
            reason,
        };
        if reference.is_empty() || reference.len() > 4096 {
            return Err(invalid("empty or too long"));
        }
        if reference
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid("contains whitespace"));
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest.to_string())),
            None => (reference, None),
        };
        if let Some(digest) = &digest {
            validate_digest(digest).map_err(|_| invalid("the digest must be sha256:<64 hex>"))?;
        }
        // A registry is the first component if it looks like a host (has '.' or ':'
        // or is `localhost`); otherwise the reference names Docker Hub.
        let (registry, remainder) = match rest.split_once('/') {
            Some((first, remainder))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), remainder)
            }
            _ => (DOCKER_HUB.to_string(), rest),
        };
        if !valid_registry(&registry) {
            return Err(invalid("the registry must be host[:port]"));
        }
        // A tag follows the last ':' after the last '/'.
        let last_slash = remainder.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match remainder[last_slash..].rfind(':') {
            Some(i) => {
                let split = last_slash + i;
                (
                    remainder[..split].to_string(),
                    Some(remainder[split + 1..].to_string()),
                )
            }
            None => (remainder.to_string(), None),
        };
        if let Some(tag) = &tag {
            let valid = !tag.is_empty()
                && tag.len() <= 128
                && tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
                && !tag.starts_with(['.', '-']);
            if !valid {
                return Err(invalid("the tag must be 1-128 of [A-Za-z0-9_.-]"));
            }
        }
        let valid_repository = !repository.is_empty()
            && repository.split('/').all(|part| {
                !part.is_empty()
                    && part.bytes().all(|b| {
                        b.is_ascii_lowercase()
                            || b.is_ascii_digit()
                            || matches!(b, b'_' | b'.' | b'-')
                    })
                    && part.as_bytes()[0].is_ascii_alphanumeric()
            });
        if !valid_repository {
            return Err(invalid(
                "the repository must be lowercase [a-z0-9._-] components separated by '/'",
            ));
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Ok(ImageReference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What to ask the manifests endpoint for: the digest if pinned, else the tag.
    pub fn manifest_reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// The host serving the registry API for this reference (Docker Hub's API lives on
    /// another name than the one references use).
    pub(crate) fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// `host[:port]` with a DNS name, IPv4 address or `[IPv6]` host.
fn valid_registry(registry: &str) -> bool {
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, port)) => (ip, port.strip_prefix(':')),
            None => return false,
        }
    } else {
        match registry.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        }
    };
    let host_ok = if registry.starts_with('[') {
        host.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.split('.').all(|label| {
                !label.is_empty()
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
    };
    host_ok && port.is_none_or(|p| !p.is_empty() && p.parse::<u16>().is_ok())
}

/// `sha256:<64 lowercase hex>`; returns the hex part.
pub(crate) fn validate_digest(digest: &str) -> Result<&str, ()> {
    let hex = digest.strip_prefix("sha256:").ok_or(())?;
    let valid = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if valid {
        Ok(hex)
    } else {
        Err(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> ImageReference {
        ImageReference::parse(s).unwrap()
    }

    #[test]
    fn docker_hub_short_names_get_library_and_latest() {
        let r = parse("ubuntu");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.repository, "library/ubuntu");
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(parse("e2bdev/base:1.2").repository, "e2bdev/base");
        assert_eq!(parse("e2bdev/base:1.2").tag.as_deref(), Some("1.2"));
    }

    #[test]
    fn registries_with_ports_tags_and_digests() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let r = parse(&format!("127.0.0.1:5000/team/app:v1@{digest}"));
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "team/app");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.digest.as_deref(), Some(digest.as_str()));
        assert_eq!(r.manifest_reference(), digest);
        let r = parse("localhost/app");
        assert_eq!(r.registry, "localhost");
        assert_eq!(r.tag.as_deref(), Some("latest"));
        let r = parse(&format!("localhost:5000/app@{digest}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.to_string(), format!("localhost:5000/app@{digest}"));
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in [
            "",
            "Ubuntu",
            "ubuntu:",
            "ubuntu:bad tag",
            "reg.io//x",
            "x@sha256:12",
            "x@md5:aaaa",
            "../etc",
            "reg..io/x",
            "reg.io:99999/x",
        ] {
            assert!(ImageReference::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
