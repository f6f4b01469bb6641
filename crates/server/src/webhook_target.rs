//! Where webhooks may deliver: the guard against server-side request forgery.
//!
//! A webhook URL is a request berth makes on a team's behalf, from the host, with the
//! host's network position. Without a guard any team could make berth POST to the
//! host's loopback services, the cloud metadata endpoint or the private network. So a
//! URL's host is checked at create and update time and again at every delivery, after
//! DNS resolution: every address it resolves to must be outside berth's denied ranges
//! ([`berth_net::BUILTIN_DENIED`]: loopback, link-local and metadata, private, CGNAT,
//! multicast, unspecified, reserved, and their IPv6 counterparts), IPv4-mapped and
//! IPv4-embedding IPv6 forms included, and not one of the host's own addresses. A name
//! with any refused address is refused as a whole (a mixed answer is what DNS rebinding
//! looks like). The delivery then connects to exactly the addresses it checked (see
//! `webhooks::deliver`): the name is resolved once per delivery, so a second answer
//! can never slip between the check and the connection. Redirects are not followed.
//!
//! The operator's allowlist (`berth up --webhook-allow CIDR,...`) admits deliberate
//! internal receivers; it wins over the denied ranges and the host's addresses.
//!
//! Resolution goes through [`WebhookResolver`], the system resolver by default, so tests
//! can answer names themselves (and change the answer between create and delivery).

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

/// A name lookup may take this long before the URL counts as unresolvable.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A resolver answer in flight.
pub type Resolution<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Turns a webhook URL's host name into addresses.
pub trait WebhookResolver: Send + Sync + 'static {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolution<'a>;
}

/// The host's resolver (`getaddrinfo`, through tokio).
#[derive(Debug, Default)]
pub struct SystemResolver;

impl WebhookResolver for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolution<'a> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host, port))
                .await?
                .map(|addr| addr.ip())
                .collect())
        })
    }
}

/// How webhook delivery is guarded (part of `ServerConfig`).
#[derive(Clone)]
pub struct WebhookConfig {
    /// Ranges deliveries may reach even though they are denied by default (deliberate
    /// internal receivers).
    pub allow: Vec<IpNet>,
    pub resolver: Arc<dyn WebhookResolver>,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            allow: Vec::new(),
            resolver: Arc::new(SystemResolver),
        }
    }
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("allow", &self.allow)
            .finish_non_exhaustive()
    }
}

/// Why an address is not a webhook receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// In one of berth's denied ranges (after unwrapping IPv4 carried in IPv6).
    DeniedRange(IpNet),
    /// One of this host's own addresses.
    HostAddress,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::DeniedRange(net) => write!(f, "in the denied range {net}"),
            Refusal::HostAddress => f.write_str("an address of this host"),
        }
    }
}

/// Why a webhook URL is refused or cannot be delivered to.
#[derive(Debug, thiserror::Error)]
pub enum WebhookTargetError {
    #[error("url \"{0}\" is not a valid URL")]
    InvalidUrl(String),
    #[error(
        "url \"{0}\" must be an http:// URL with a host (berth does not deliver over TLS yet)"
    )]
    UnsupportedUrl(String),
    #[error("webhook host {host} does not resolve: {source}")]
    Unresolvable {
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("webhook host {0} resolves to no address")]
    NoAddress(String),
    #[error(
        "webhook host {host} is {addr}, {why}: berth does not deliver there (an operator can \
         allow it with --webhook-allow)"
    )]
    Refused {
        host: String,
        addr: IpAddr,
        why: Refusal,
    },
    #[error("listing this host's addresses: {0}")]
    HostAddresses(#[source] berth_net::NetError),
}

impl WebhookTargetError {
    /// True when the URL itself is at fault (a 400 at create/update), not the host.
    pub fn is_bad_url(&self) -> bool {
        !matches!(self, WebhookTargetError::HostAddresses(_))
    }
}

/// A checked delivery target: the URL's parts and the only addresses to connect to.
#[derive(Debug, Clone)]
pub struct Target {
    pub uri: http::Uri,
    /// `host[:port]` as written in the URL, for the Host header.
    pub authority: String,
    pub addrs: Vec<SocketAddr>,
}

/// The guard: berth's denied ranges, the operator's allowlist, a resolver.
pub struct WebhookGuard {
    denied: Vec<IpNet>,
    allow: Vec<IpNet>,
    resolver: Arc<dyn WebhookResolver>,
}

impl WebhookGuard {
    pub fn new(config: &WebhookConfig) -> Self {
        WebhookGuard {
            denied: berth_net::BUILTIN_DENIED
                .iter()
                .map(|net| net.parse().expect("berth's denied ranges are valid CIDRs"))
                .collect(),
            allow: config.allow.clone(),
            resolver: config.resolver.clone(),
        }
    }

    /// Checks `url` now (resolving its host) and returns where a delivery may connect.
    pub async fn check(&self, url: &str) -> Result<Target, WebhookTargetError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| WebhookTargetError::InvalidUrl(url.to_string()))?;
        let authority = uri.authority().map(|a| {
            a.as_str()
                .rsplit('@')
                .next()
                .unwrap_or_default()
                .to_string()
        });
        let host = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
            .filter(|h| !h.is_empty());
        let (Some(host), Some(authority), Some("http")) = (host, authority, uri.scheme_str())
        else {
            return Err(WebhookTargetError::UnsupportedUrl(url.to_string()));
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(80);
        let addrs = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            // RFC 6761: these names are loopback whatever a resolver says.
            Err(_) if host == "localhost" || host.ends_with(".localhost") => {
                vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]
            }
            Err(_) => self.resolve(&host, port).await?,
        };
        if addrs.is_empty() {
            return Err(WebhookTargetError::NoAddress(host));
        }
        let own = berth_net::host_addresses().map_err(WebhookTargetError::HostAddresses)?;
        for &addr in &addrs {
            if let Some(why) = self.refusal(addr, &own) {
                return Err(WebhookTargetError::Refused { host, addr, why });
            }
        }
        Ok(Target {
            uri,
            authority,
            addrs: addrs
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect(),
        })
    }

    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<IpAddr>, WebhookTargetError> {
        let unresolvable = |source| WebhookTargetError::Unresolvable {
            host: host.to_string(),
            source,
        };
        tokio::time::timeout(RESOLVE_TIMEOUT, self.resolver.resolve(host, port))
            .await
            .map_err(|_| {
                unresolvable(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {RESOLVE_TIMEOUT:?}"),
                ))
            })?
            .map_err(unresolvable)
    }

    /// Why `addr` may not be delivered to, given the host's addresses `own`; None when it
    /// may.
    fn refusal(&self, addr: IpAddr, own: &[IpAddr]) -> Option<Refusal> {
        let canonical = addr.to_canonical();
        if self.allow.iter().any(|net| net.contains(&canonical)) {
            return None;
        }
        for candidate in std::iter::once(canonical).chain(embedded_ipv4(canonical).map(IpAddr::V4))
        {
            if let Some(net) = self.denied.iter().find(|net| net.contains(&candidate)) {
                return Some(Refusal::DeniedRange(*net));
            }
            if own.iter().any(|own| own.to_canonical() == candidate) {
                return Some(Refusal::HostAddress);
            }
        }
        None
    }
}

/// The IPv4 address an IPv6 address carries to IPv4 hosts through a translator or
/// tunnel: IPv4-compatible (`::a.b.c.d`, deprecated), NAT64 (`64:ff9b::/96`) and 6to4
/// (`2002:AABB:CCDD::/48`). (IPv4-mapped addresses are unwrapped by `to_canonical`.)
fn embedded_ipv4(addr: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = addr else {
        return None;
    };
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0, _, _] if v6 != Ipv6Addr::UNSPECIFIED && v6 != Ipv6Addr::LOCALHOST => {
            Some(low)
        }
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, a, b, ..] => Some(Ipv4Addr::new(
            (a >> 8) as u8,
            a as u8,
            (b >> 8) as u8,
            b as u8,
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fixed(HashMap<&'static str, Vec<IpAddr>>);

    impl WebhookResolver for Fixed {
        fn resolve<'a>(&'a self, host: &'a str, _port: u16) -> Resolution<'a> {
            let answer = self.0.get(host).cloned().ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("no such name {host}"))
            });
            Box::pin(async move { answer })
        }
    }

    fn guard(allow: &[&str]) -> WebhookGuard {
        let names = HashMap::from([
            ("public.test", vec!["198.18.0.7".parse().unwrap()]),
            ("inside.test", vec!["10.1.2.3".parse().unwrap()]),
            (
                "mixed.test",
                vec!["198.18.0.7".parse().unwrap(), "127.0.0.1".parse().unwrap()],
            ),
        ]);
        WebhookGuard::new(&WebhookConfig {
            allow: allow.iter().map(|n| n.parse().unwrap()).collect(),
            resolver: Arc::new(Fixed(names)),
        })
    }

    fn refused(result: Result<Target, WebhookTargetError>) -> String {
        match result {
            Err(err @ WebhookTargetError::Refused { .. }) => err.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn internal_destinations_are_refused_in_every_spelling() {
        let guard = guard(&[]);
        for url in [
            "http://127.0.0.1:9/hook",
            "http://127.1.2.3/",
            "http://localhost:8080/x",
            "http://api.localhost/",
            "http://LOCALHOST./",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[fe80::1]/",
            "http://[fd00::1]/",
            "http://[ff02::1]/",
            "http://0.0.0.0/",
            "http://[::]/",
            "http://10.0.0.1/",
            "http://172.16.5.4/",
            "http://192.168.1.1/",
            "http://100.64.0.1/",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
            "http://[64:ff9b::7f00:1]/",
            "http://[2002:a9fe:a9fe::1]/",
            "http://[::7f00:1]/",
            "http://inside.test/",
            "http://mixed.test/",
        ] {
            let text = refused(guard.check(url).await);
            assert!(
                text.contains("berth does not deliver there"),
                "{url}: {text}"
            );
        }
    }

    #[tokio::test]
    async fn the_host_s_own_addresses_are_refused() {
        let own = berth_net::host_addresses().unwrap();
        let guard = guard(&[]);
        for addr in own {
            let url = match addr {
                IpAddr::V4(v4) => format!("http://{v4}/"),
                IpAddr::V6(v6) => format!("http://[{v6}]/"),
            };
            assert!(guard.refusal(addr, &[addr]).is_some(), "{url}");
            refused(guard.check(&url).await);
        }
    }

    #[tokio::test]
    async fn public_names_and_the_allowlist_are_admitted() {
        let target = guard(&[])
            .check("http://public.test:8080/hook?a=1")
            .await
            .unwrap();
        assert_eq!(target.addrs, vec!["198.18.0.7:8080".parse().unwrap()]);
        assert_eq!(target.authority, "public.test:8080");
        let allowed = guard(&["127.0.0.0/8", "10.1.0.0/16"]);
        assert!(allowed.check("http://127.0.0.1:9/").await.is_ok());
        assert!(allowed.check("http://inside.test/").await.is_ok());
        assert!(allowed.check("http://[::ffff:127.0.0.2]/").await.is_ok());
        refused(allowed.check("http://10.2.0.1/").await);
    }

    #[tokio::test]
    async fn urls_that_are_not_http_with_a_host_or_do_not_resolve_are_bad() {
        let guard = guard(&[]);
        for url in [
            "not a url",
            "https://public.test/",
            "ftp://public.test/",
            "/relative",
        ] {
            let err = guard.check(url).await.unwrap_err();
            assert!(err.is_bad_url(), "{url}: {err}");
            assert!(
                matches!(
                    err,
                    WebhookTargetError::InvalidUrl(_) | WebhookTargetError::UnsupportedUrl(_)
                ),
                "{url}: {err}"
            );
        }
        let err = guard.check("http://nowhere.test/").await.unwrap_err();
        assert!(
            matches!(err, WebhookTargetError::Unresolvable { .. }),
            "{err}"
        );
    }
}
