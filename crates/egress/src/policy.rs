//! Egress policy: what one sandbox may reach, and the pure decisions made from it.
//!
//! The lead builds an [`EgressPolicy`] per sandbox (from E2B's `allow_internet_access`,
//! `network.allowOut` / `denyOut` and `rules`) and hands it out through a
//! [`PolicySource`]. Everything here is pure: the proxy and the DNS server call these
//! functions once per connection or query with the policy they just looked up.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::error::PolicyError;
use crate::inject::HeaderRule;

/// Answers "which policy applies to traffic from this sandbox address?".
///
/// Implemented by the daemon. Called once per proxied connection and once per DNS query,
/// and again while a connection lives (to cut connections a policy update denies), so
/// it must be cheap (a map lookup) and must not block.
pub trait PolicySource: Send + Sync {
    /// The policy of the sandbox whose address is `sandbox_addr`, or `None` when no
    /// sandbox owns that address (such traffic is refused).
    fn lookup(&self, sandbox_addr: IpAddr) -> Option<Arc<EgressPolicy>>;
}

/// A port or port range a rule applies to (E2B's `host:80`, `host:1-1024`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    All,
    Range { first: u16, last: u16 },
}

impl Ports {
    pub fn contains(self, port: u16) -> bool {
        match self {
            Ports::All => true,
            Ports::Range { first, last } => (first..=last).contains(&port),
        }
    }
}

/// An address rule: a CIDR (a bare IP is a /32 or /128) and the ports it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetRule {
    pub net: IpNet,
    pub ports: Ports,
}

impl NetRule {
    pub fn all_ports(net: IpNet) -> Self {
        NetRule {
            net,
            ports: Ports::All,
        }
    }

    fn matches(&self, ip: IpAddr, port: u16) -> bool {
        self.net.contains(&ip) && self.ports.contains(port)
    }
}

/// A domain pattern: `example.com` (that name only), `*.example.com` (every name under
/// it, **not** `example.com` itself: E2B's matcher is a suffix match on `.example.com`),
/// or `*` (every name). Matching is ASCII case-insensitive and ignores one trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainPattern {
    Exact(String),
    /// Holds the suffix with its leading dot, lower-cased: `.example.com`.
    Subdomains(String),
    Any,
}

impl DomainPattern {
    pub fn parse(pattern: &str) -> Result<Self, PolicyError> {
        let invalid = || PolicyError::InvalidDomain(pattern.to_string());
        if pattern == "*" {
            return Ok(DomainPattern::Any);
        }
        let (wildcard, name) = match pattern.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, pattern),
        };
        let name = normalize_hostname(name).ok_or_else(invalid)?;
        Ok(if wildcard {
            DomainPattern::Subdomains(format!(".{name}"))
        } else {
            DomainPattern::Exact(name)
        })
    }

    /// `host` must already be normalized ([`normalize_hostname`]).
    pub fn matches(&self, host: &str) -> bool {
        match self {
            DomainPattern::Exact(name) => host == name,
            DomainPattern::Subdomains(suffix) => {
                host.len() > suffix.len() && host.ends_with(suffix)
            }
            DomainPattern::Any => true,
        }
    }
}

/// A domain allow rule and the ports it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRule {
    pub pattern: DomainPattern,
    pub ports: Ports,
}

/// Lower-cases a host name, drops one trailing dot, and checks it is a plausible DNS
/// name (letters, digits, `-`, `_`, dots between non-empty labels of at most 63 bytes,
/// at most 253 bytes). IP literals are not names: `None`.
pub fn normalize_hostname(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > 253 || host.parse::<IpAddr>().is_ok() {
        return None;
    }
    let valid_labels = host.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    valid_labels.then(|| host.to_ascii_lowercase())
}

/// Address ranges no sandbox may reach whatever its policy says (berth's one list, kept
/// in `berth-net` with the sandbox rule set that enforces the same ranges).
pub use berth_net::BUILTIN_DENIED;

/// The operator's upper bound, shared by every sandbox's policy: addresses that are
/// never dialed (built-in ranges plus `--egress-deny`), and optionally the only
/// addresses and names that may be (`--egress-allow`).
#[derive(Debug, Clone)]
pub struct Ceiling {
    denied: Vec<IpNet>,
    allowed_nets: Option<Vec<IpNet>>,
    allowed_domains: Option<Vec<DomainPattern>>,
}

impl Default for Ceiling {
    fn default() -> Self {
        Ceiling {
            denied: BUILTIN_DENIED
                .iter()
                .map(|net| net.parse().expect("built-in denied ranges are valid CIDRs"))
                .collect(),
            allowed_nets: None,
            allowed_domains: None,
        }
    }
}

impl Ceiling {
    /// Adds operator-denied ranges to the built-in ones.
    pub fn deny(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        self.denied.extend(nets);
        self
    }

    /// Restricts every dial to these ranges (still minus the denied ones).
    pub fn allow_only_nets(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        self.allowed_nets = Some(nets.into_iter().collect());
        self
    }

    /// Restricts every name dialed or forwarded by DNS to these patterns.
    pub fn allow_only_domains(mut self, patterns: impl IntoIterator<Item = DomainPattern>) -> Self {
        self.allowed_domains = Some(patterns.into_iter().collect());
        self
    }

    /// Does `--egress-allow` restrict destinations at all?
    fn restricts(&self) -> bool {
        self.allowed_nets.is_some() || self.allowed_domains.is_some()
    }

    fn denies(&self, ip: IpAddr) -> bool {
        self.denied.iter().any(|net| net.contains(&ip))
    }

    /// May any sandbox dial this address directly (not reached by a name)? Only inside
    /// the allowed ranges, when the ceiling has any.
    pub fn admits_addr(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        !self.denies(ip)
            && (!self.restricts()
                || self
                    .allowed_nets
                    .as_ref()
                    .is_some_and(|nets| nets.iter().any(|net| net.contains(&ip))))
    }

    /// May a sandbox dial `ip`, reached by resolving `host` (normalized)? An allowed
    /// range or an allowed domain admits it; a denied range never does.
    pub fn admits_named(&self, host: &str, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.admits_addr(ip)
            || (!self.denies(ip)
                && self
                    .allowed_domains
                    .as_ref()
                    .is_some_and(|patterns| patterns.iter().any(|p| p.matches(host))))
    }

    /// May any sandbox reach this (normalized) name? A ceiling that also admits address
    /// ranges admits every name: what it resolves to is checked when dialed
    /// ([`Ceiling::admits_named`]), so the name of a host inside the ranges resolves.
    pub fn admits_name(&self, host: &str) -> bool {
        match &self.allowed_domains {
            None => true,
            Some(patterns) => {
                self.allowed_nets.is_some() || patterns.iter().any(|p| p.matches(host))
            }
        }
    }
}

/// What one sandbox may reach.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    /// E2B's `allow_internet_access`: false means no egress at all, DNS included.
    pub internet: bool,
    /// `allowOut` addresses; they win over `deny_nets`.
    pub allow_nets: Vec<NetRule>,
    /// `denyOut`.
    pub deny_nets: Vec<NetRule>,
    /// `allowOut` domains, enforced by Host (port 80) and SNI (port 443).
    pub allow_domains: Vec<DomainRule>,
    /// `network.rules`: headers set on requests to these domains (phase 2 of issue 14).
    pub header_rules: Vec<HeaderRule>,
    pub ceiling: Arc<Ceiling>,
}

/// One `allowOut` / `denyOut` entry as E2B writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    Net(NetRule),
    Domain(DomainRule),
}

impl Rule {
    /// Parses `8.8.8.8`, `8.8.8.0/24`, `8.8.8.8:80`, `10.0.0.0/8:1-1024`, `[::1]:80`,
    /// `2001:db8::/32`, `example.com`, `*.example.com:443`, `*`.
    pub fn parse(entry: &str) -> Result<Rule, PolicyError> {
        let entry = entry.trim();
        let (host, ports) = split_ports(entry)?;
        if let Ok(net) = host.parse::<IpNet>() {
            return Ok(Rule::Net(NetRule { net, ports }));
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Rule::Net(NetRule {
                net: IpNet::from(ip),
                ports,
            }));
        }
        Ok(Rule::Domain(DomainRule {
            pattern: DomainPattern::parse(host)?,
            ports,
        }))
    }
}

fn split_ports(entry: &str) -> Result<(&str, Ports), PolicyError> {
    let (host, port_part) = if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| PolicyError::InvalidRule(entry.to_string()))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(ports) => (host, Some(ports)),
                None => return Err(PolicyError::InvalidRule(entry.to_string())),
            },
        }
    } else if entry.matches(':').count() > 1 {
        (entry, None)
    } else {
        match entry.rsplit_once(':') {
            Some((host, ports)) => (host, Some(ports)),
            None => (entry, None),
        }
    };
    let ports = match port_part {
        None | Some("") => Ports::All,
        Some(spec) => {
            let bad = || PolicyError::InvalidPorts(entry.to_string());
            let parse = |s: &str| s.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad);
            let (first, last) = match spec.split_once('-') {
                Some((a, b)) => (parse(a)?, parse(b)?),
                None => (parse(spec)?, parse(spec)?),
            };
            if first > last {
                return Err(bad());
            }
            Ports::Range { first, last }
        }
    };
    Ok((host, ports))
}

/// Why traffic was refused. Also the index of the refusal counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    UnknownSource,
    NoInternet,
    DestinationDenied,
    NoHostname,
    DomainNotAllowed,
    ResolvedAddressDenied,
    ResolveFailed,
    UpstreamUnreachable,
    UpstreamTlsFailed,
    SecretUnavailable,
    BadRequest,
    TooManyConnections,
    SniffFailed,
    Loop,
    PolicyChanged,
}

impl RefuseReason {
    pub const ALL: [RefuseReason; 15] = [
        RefuseReason::UnknownSource,
        RefuseReason::NoInternet,
        RefuseReason::DestinationDenied,
        RefuseReason::NoHostname,
        RefuseReason::DomainNotAllowed,
        RefuseReason::ResolvedAddressDenied,
        RefuseReason::ResolveFailed,
        RefuseReason::UpstreamUnreachable,
        RefuseReason::UpstreamTlsFailed,
        RefuseReason::SecretUnavailable,
        RefuseReason::BadRequest,
        RefuseReason::TooManyConnections,
        RefuseReason::SniffFailed,
        RefuseReason::Loop,
        RefuseReason::PolicyChanged,
    ];

    /// Stable label, for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            RefuseReason::UnknownSource => "unknown_source",
            RefuseReason::NoInternet => "no_internet",
            RefuseReason::DestinationDenied => "destination_denied",
            RefuseReason::NoHostname => "no_hostname",
            RefuseReason::DomainNotAllowed => "domain_not_allowed",
            RefuseReason::ResolvedAddressDenied => "resolved_address_denied",
            RefuseReason::ResolveFailed => "resolve_failed",
            RefuseReason::UpstreamUnreachable => "upstream_unreachable",
            RefuseReason::UpstreamTlsFailed => "upstream_tls_failed",
            RefuseReason::SecretUnavailable => "secret_unavailable",
            RefuseReason::BadRequest => "bad_request",
            RefuseReason::TooManyConnections => "too_many_connections",
            RefuseReason::SniffFailed => "sniff_failed",
            RefuseReason::Loop => "loop",
            RefuseReason::PolicyChanged => "policy_changed",
        }
    }

    /// The one-line text a refused HTTP client reads.
    pub fn message(self) -> &'static str {
        match self {
            RefuseReason::UnknownSource => "traffic from an unknown sandbox address",
            RefuseReason::NoInternet => "this sandbox has no internet access",
            RefuseReason::DestinationDenied => {
                "the destination address is denied by the sandbox's network policy"
            }
            RefuseReason::NoHostname => {
                "the request names no host, and its destination address is not allowed"
            }
            RefuseReason::DomainNotAllowed => {
                "the host is not allowed by the sandbox's network policy"
            }
            RefuseReason::ResolvedAddressDenied => {
                "the host resolves only to denied (private or reserved) addresses"
            }
            RefuseReason::ResolveFailed => "the host could not be resolved",
            RefuseReason::UpstreamUnreachable => "the upstream server could not be reached",
            RefuseReason::UpstreamTlsFailed => {
                "the upstream server's TLS certificate could not be verified"
            }
            RefuseReason::SecretUnavailable => {
                "a secret named by the sandbox's header rule is unavailable"
            }
            RefuseReason::BadRequest => "malformed or unsupported HTTP request",
            RefuseReason::TooManyConnections => "too many concurrent connections from this sandbox",
            RefuseReason::SniffFailed => "no HTTP request head or TLS ClientHello arrived in time",
            RefuseReason::Loop => "the destination is the egress proxy itself",
            RefuseReason::PolicyChanged => {
                "the sandbox's network policy no longer allows this connection"
            }
        }
    }
}

/// Where a proxied connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Connect to the original destination address.
    Original,
    /// Resolve this (normalized) name and dial it; never the original address.
    Name(String),
    Refuse(RefuseReason),
}

impl EgressPolicy {
    /// An unrestricted policy under `ceiling` (E2B's default: internet on, no rules).
    pub fn open(ceiling: Arc<Ceiling>) -> Self {
        EgressPolicy {
            internet: true,
            allow_nets: Vec::new(),
            deny_nets: Vec::new(),
            allow_domains: Vec::new(),
            header_rules: Vec::new(),
            ceiling,
        }
    }

    /// Builds a policy from E2B's fields, with E2B's validation: `denyOut` holds
    /// addresses only, and domains in `allowOut` require `denyOut` to contain
    /// `0.0.0.0/0`.
    pub fn from_e2b(
        internet: bool,
        allow_out: &[String],
        deny_out: &[String],
        header_rules: Vec<HeaderRule>,
        ceiling: Arc<Ceiling>,
    ) -> Result<Self, PolicyError> {
        let mut policy = EgressPolicy {
            internet,
            ..EgressPolicy::open(ceiling)
        };
        for entry in deny_out {
            match Rule::parse(entry)? {
                Rule::Net(rule) => policy.deny_nets.push(rule),
                Rule::Domain(_) => return Err(PolicyError::DomainInDenyOut(entry.clone())),
            }
        }
        for entry in allow_out {
            match Rule::parse(entry)? {
                Rule::Net(rule) => policy.allow_nets.push(rule),
                Rule::Domain(rule) => policy.allow_domains.push(rule),
            }
        }
        let denies_all_v4 = policy
            .deny_nets
            .iter()
            .any(|r| r.net == IpNet::V4(Default::default()) && r.ports == Ports::All);
        if !policy.allow_domains.is_empty() && !denies_all_v4 {
            return Err(PolicyError::DomainsNeedDenyAll);
        }
        policy.header_rules = header_rules;
        Ok(policy)
    }

    /// True when `denyOut` covers every address (E2B's deny-all), so DNS answers only
    /// names an allowed domain could match.
    pub fn restricted(&self) -> bool {
        self.deny_nets
            .iter()
            .any(|r| r.net.prefix_len() == 0 && r.ports == Ports::All)
    }

    /// The sandbox's own CIDR rules (allow wins over deny), then the ceiling.
    pub fn addr_allowed(&self, ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_canonical();
        self.internet && self.sandbox_allows_addr(ip, port) && self.ceiling.admits_addr(ip)
    }

    /// The sandbox's own CIDR rules alone (allow wins over deny).
    fn sandbox_allows_addr(&self, ip: IpAddr, port: u16) -> bool {
        self.allow_nets.iter().any(|r| r.matches(ip, port))
            || !self.deny_nets.iter().any(|r| r.matches(ip, port))
    }

    /// An allowed domain rule covers this normalized name on this port.
    pub fn name_allowed(&self, host: &str, port: u16) -> bool {
        self.internet
            && self.ceiling.admits_name(host)
            && self
                .allow_domains
                .iter()
                .any(|r| r.ports.contains(port) && r.pattern.matches(host))
    }

    /// Whether DNS should forward a query for this normalized name.
    pub fn resolvable(&self, host: &str) -> bool {
        self.internet
            && self.ceiling.admits_name(host)
            && (!self.restricted() || self.allow_domains.iter().any(|r| r.pattern.matches(host)))
    }

    /// The header rule for a name, if any (the first that matches).
    pub fn header_rule(&self, host: &str) -> Option<&HeaderRule> {
        self.header_rules.iter().find(|r| r.pattern.matches(host))
    }

    /// Whether a connection must be sniffed (Host / SNI read) before routing: always
    /// when the original address alone does not decide it, or when a header rule may
    /// apply.
    pub fn needs_hostname(&self, original_ip: IpAddr, port: u16) -> bool {
        !self.header_rules.is_empty() || !self.addr_allowed(original_ip, port)
    }

    /// Routes a connection to `original` whose request named `host` (normalized).
    ///
    /// A name covered by a header rule is always dialed by name, so secrets reach only
    /// the real server; it must still be reachable under the policy (by domain, or
    /// because its original address is allowed). Otherwise an allowed original address
    /// is dialed as is, and failing that an allowed domain is dialed by name.
    pub fn route(&self, original_ip: IpAddr, port: u16, host: Option<&str>) -> Route {
        if !self.internet {
            return Route::Refuse(RefuseReason::NoInternet);
        }
        let addr_ok = self.addr_allowed(original_ip, port);
        if let Some(host) = host {
            // A policy whose own rules allow this address leaves it to the ceiling,
            // whose allowed domains admit the host by name (a names-only ceiling admits
            // no address directly: the registries of a test berth).
            let name_ok = self.name_allowed(host, port)
                || (self.sandbox_allows_addr(original_ip.to_canonical(), port)
                    && self.ceiling.admits_named(host, original_ip));
            if self.header_rule(host).is_some()
                && (name_ok || addr_ok)
                && self.ceiling.admits_name(host)
            {
                return Route::Name(host.to_string());
            }
            if addr_ok {
                return Route::Original;
            }
            if name_ok {
                return Route::Name(host.to_string());
            }
            return Route::Refuse(if self.allow_domains.is_empty() {
                RefuseReason::DestinationDenied
            } else {
                RefuseReason::DomainNotAllowed
            });
        }
        if addr_ok {
            Route::Original
        } else if self.allow_domains.is_empty() {
            Route::Refuse(RefuseReason::DestinationDenied)
        } else {
            Route::Refuse(RefuseReason::NoHostname)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn policy(allow: &[&str], deny: &[&str]) -> EgressPolicy {
        EgressPolicy::from_e2b(
            true,
            &strings(allow),
            &strings(deny),
            Vec::new(),
            Arc::new(Ceiling::default()),
        )
        .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn wildcard_matches_subdomains_not_apex() {
        let p = DomainPattern::parse("*.Example.com.").unwrap();
        assert!(p.matches("api.example.com"));
        assert!(p.matches("a.b.example.com"));
        assert!(!p.matches("example.com"));
        assert!(!p.matches("badexample.com"));
        let exact = DomainPattern::parse("example.com").unwrap();
        assert!(exact.matches(&normalize_hostname("EXAMPLE.com.").unwrap()));
        assert!(!exact.matches("api.example.com"));
        assert!(DomainPattern::parse("*").unwrap().matches("anything.test"));
        assert!(DomainPattern::parse("exa mple.com").is_err());
        assert!(DomainPattern::parse("*.").is_err());
    }

    #[test]
    fn hostnames_are_normalized_and_ip_literals_are_not_names() {
        assert_eq!(normalize_hostname("API.Test."), Some("api.test".into()));
        assert_eq!(normalize_hostname("198.18.0.1"), None);
        assert_eq!(normalize_hostname("::1"), None);
        assert_eq!(normalize_hostname("a..b"), None);
        assert_eq!(normalize_hostname("evil.com@x"), None);
        assert_eq!(normalize_hostname(""), None);
    }

    #[test]
    fn rules_parse_like_e2b() {
        assert_eq!(
            Rule::parse("8.8.8.8").unwrap(),
            Rule::Net(NetRule::all_ports("8.8.8.8/32".parse().unwrap()))
        );
        assert_eq!(
            Rule::parse("10.0.0.0/8:1-1024").unwrap(),
            Rule::Net(NetRule {
                net: "10.0.0.0/8".parse().unwrap(),
                ports: Ports::Range {
                    first: 1,
                    last: 1024
                }
            })
        );
        assert_eq!(
            Rule::parse("[::1]:80").unwrap(),
            Rule::Net(NetRule {
                net: "::1/128".parse().unwrap(),
                ports: Ports::Range {
                    first: 80,
                    last: 80
                }
            })
        );
        assert!(matches!(
            Rule::parse("2001:db8::/32").unwrap(),
            Rule::Net(_)
        ));
        assert!(matches!(
            Rule::parse("*.example.com:443").unwrap(),
            Rule::Domain(DomainRule {
                ports: Ports::Range {
                    first: 443,
                    last: 443
                },
                ..
            })
        ));
        assert!(Rule::parse("host:0").is_err());
        assert!(Rule::parse("host:9-1").is_err());
        assert!(Rule::parse("[::1").is_err());
    }

    #[test]
    fn from_e2b_validates_like_e2b() {
        let ceiling = Arc::new(Ceiling::default());
        let err = EgressPolicy::from_e2b(
            true,
            &strings(&["example.com"]),
            &[],
            Vec::new(),
            ceiling.clone(),
        );
        assert!(matches!(err, Err(PolicyError::DomainsNeedDenyAll)));
        let err =
            EgressPolicy::from_e2b(true, &[], &strings(&["example.com"]), Vec::new(), ceiling);
        assert!(matches!(err, Err(PolicyError::DomainInDenyOut(_))));
    }

    #[test]
    fn allow_wins_over_deny_and_ceiling_wins_over_both() {
        let p = policy(&["198.18.0.10"], &["198.18.0.0/24"]);
        assert!(p.addr_allowed(ip("198.18.0.10"), 80));
        assert!(!p.addr_allowed(ip("198.18.0.11"), 80));
        assert!(p.addr_allowed(ip("198.19.0.1"), 80));
        let p = policy(&["10.0.0.0/8", "127.0.0.1"], &[]);
        assert!(!p.addr_allowed(ip("10.1.2.3"), 80));
        assert!(!p.addr_allowed(ip("127.0.0.1"), 80));
        assert!(
            !p.addr_allowed(ip("::ffff:127.0.0.1"), 80),
            "IPv4-mapped addresses are checked as IPv4"
        );
        assert!(!p.addr_allowed(ip("169.254.169.254"), 80));
        assert!(!p.addr_allowed(ip("fd00::1"), 80));
    }

    #[test]
    fn ports_limit_rules() {
        let p = policy(&["198.18.0.10:443"], &["0.0.0.0/0"]);
        assert!(p.addr_allowed(ip("198.18.0.10"), 443));
        assert!(!p.addr_allowed(ip("198.18.0.10"), 80));
    }

    #[test]
    fn operator_ceiling_limits_nets_and_names() {
        let ceiling = Ceiling::default()
            .deny(["198.18.5.0/24".parse().unwrap()])
            .allow_only_nets(["198.18.0.0/15".parse().unwrap()])
            .allow_only_domains([DomainPattern::parse("*.test").unwrap()]);
        assert!(ceiling.admits_addr(ip("198.18.0.1")));
        assert!(!ceiling.admits_addr(ip("198.18.5.1")));
        assert!(!ceiling.admits_addr(ip("203.0.113.1")));
        // By name: an allowed domain admits any address that is not denied; an allowed
        // range admits its addresses whatever the name.
        assert!(ceiling.admits_named("a.test", ip("203.0.113.1")));
        assert!(!ceiling.admits_named("a.test", ip("198.18.5.1")));
        assert!(!ceiling.admits_named("a.example", ip("203.0.113.1")));
        assert!(ceiling.admits_named("a.example", ip("198.18.0.1")));
        assert!(ceiling.admits_name("a.test"));
        assert!(
            ceiling.admits_name("a.example"),
            "may resolve into the ranges"
        );
        let names_only =
            Ceiling::default().allow_only_domains([DomainPattern::parse("*.test").unwrap()]);
        assert!(
            !names_only.admits_addr(ip("203.0.113.1")),
            "no direct dials"
        );
        assert!(names_only.admits_named("a.test", ip("203.0.113.1")));
        assert!(!names_only.admits_name("a.example"));
    }

    #[test]
    fn routes_follow_e2b() {
        let p = policy(&["*.test-internet.example", "198.18.0.10"], &["0.0.0.0/0"]);
        let denied = ip("198.18.0.20");
        assert_eq!(
            p.route(ip("198.18.0.10"), 80, Some("x.other")),
            Route::Original
        );
        assert_eq!(
            p.route(denied, 80, Some("api.test-internet.example")),
            Route::Name("api.test-internet.example".into())
        );
        assert_eq!(
            p.route(denied, 80, Some("test-internet.example")),
            Route::Refuse(RefuseReason::DomainNotAllowed)
        );
        assert_eq!(
            p.route(denied, 443, None),
            Route::Refuse(RefuseReason::NoHostname)
        );
        let no_internet = EgressPolicy {
            internet: false,
            ..p.clone()
        };
        assert_eq!(
            no_internet.route(ip("198.18.0.10"), 80, None),
            Route::Refuse(RefuseReason::NoInternet)
        );
        let ip_only = policy(&["198.18.0.10"], &["0.0.0.0/0"]);
        assert_eq!(
            ip_only.route(denied, 80, Some("a.b")),
            Route::Refuse(RefuseReason::DestinationDenied)
        );
    }

    #[test]
    fn an_open_policy_reaches_the_names_a_names_only_ceiling_admits() {
        let ceiling = Arc::new(
            Ceiling::default()
                .deny(["198.18.5.0/24".parse().unwrap()])
                .allow_only_domains([DomainPattern::parse("deb.debian.org").unwrap()]),
        );
        let open = EgressPolicy::open(ceiling.clone());
        let registry = ip("203.0.113.80");
        assert_eq!(
            open.route(registry, 80, Some("deb.debian.org")),
            Route::Name("deb.debian.org".into())
        );
        assert_eq!(
            open.route(registry, 80, Some("other.example")),
            Route::Refuse(RefuseReason::DestinationDenied)
        );
        assert_eq!(
            open.route(registry, 443, None),
            Route::Refuse(RefuseReason::DestinationDenied)
        );
        assert_eq!(
            open.route(ip("198.18.5.1"), 80, Some("deb.debian.org")),
            Route::Refuse(RefuseReason::DestinationDenied),
            "a denied range stays denied by name"
        );
        let denies_it =
            EgressPolicy::from_e2b(true, &[], &["203.0.113.0/24".into()], Vec::new(), ceiling)
                .unwrap();
        assert_eq!(
            denies_it.route(registry, 80, Some("deb.debian.org")),
            Route::Refuse(RefuseReason::DestinationDenied),
            "the sandbox's own deny wins"
        );
    }

    #[test]
    fn dns_forwards_only_names_a_restricted_policy_could_allow() {
        let p = policy(&["*.test-internet.example"], &["0.0.0.0/0"]);
        assert!(p.restricted());
        assert!(p.resolvable("api.test-internet.example"));
        assert!(!p.resolvable("test-internet.example"));
        assert!(!p.resolvable("exfil-data.attacker.example"));
        let open = policy(&[], &[]);
        assert!(!open.restricted());
        assert!(open.resolvable("anything.example"));
        let off = EgressPolicy {
            internet: false,
            ..open
        };
        assert!(!off.resolvable("anything.example"));
    }
}
