//! E2B's network policy (`allow_internet_access` and `network` on create, `PUT
//! /sandboxes/{id}/network`), the operator's ceiling, and the effective policy the host
//! enforces: pure data and decisions, no I/O.
//!
//! Semantics (E2B's, see the crate docs for the enforcement):
//! - `allowOut` holds CIDRs, bare IPs or domains (`example.com`, `*.example.com`);
//!   `denyOut` CIDRs or IPs only. An address in both is allowed (allow wins).
//! - A domain in `allowOut` requires `denyOut` to contain `0.0.0.0/0` (or
//!   `allow_internet_access` false): domains are only meaningful as exceptions to deny-all.
//! - `allow_internet_access: false` behaves as `denyOut: ["0.0.0.0/0"]`; with nothing in
//!   `allowOut` the sandbox has no egress at all, DNS included.
//! - `rules` (per-domain header transforms) are validated here (10 domains, 1 transform
//!   each, 20 headers, `${e2b.secrets.NAME}` references well formed); injecting them is
//!   the egress proxy's job.
//! - IPv6: sandboxes have no IPv6 at all (disabled in their namespace, dropped on the
//!   host). IPv6 entries in a sandbox policy are accepted for compatibility and have no
//!   effect; the operator ceiling refuses them so an operator never believes one works.
//!
//! Every sandbox decision is bounded by the operator's [`Ceiling`] and by the built-in
//! denies ([`builtin_denied`] plus the pool and the host's addresses): a destination is
//! reachable only when all three admit it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

/// Most domains `rules` may name.
pub const MAX_RULE_DOMAINS: usize = 10;
/// Most transforms one domain of `rules` may have.
pub const MAX_TRANSFORMS_PER_DOMAIN: usize = 1;
/// Most headers one transform may set.
pub const MAX_HEADERS_PER_TRANSFORM: usize = 20;

/// Why a policy or ceiling was refused; each names the field (E2B's JSON path, or the
/// operator flag) and the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{field}: {value:?} is neither a CIDR, an IP address nor a domain name")]
    InvalidDestination { field: String, value: String },
    #[error("{field}: {value:?} is not a CIDR or IP address (deny rules take no domain names)")]
    InvalidDenyEntry { field: String, value: String },
    #[error(
        "{field}: domain {value:?} needs denyOut to contain 0.0.0.0/0 (domains are exceptions \
         to deny-all)"
    )]
    DomainWithoutDenyAll { field: String, value: String },
    #[error("{field}: {value:?} is not a domain name or *.domain pattern")]
    InvalidRuleDomain { field: String, value: String },
    #[error("{field}: {value} domains, at most {MAX_RULE_DOMAINS} are allowed")]
    TooManyRuleDomains { field: String, value: usize },
    #[error("{field}: {value} transforms, at most {MAX_TRANSFORMS_PER_DOMAIN} per domain")]
    TooManyTransforms { field: String, value: usize },
    #[error("{field}: {value} headers, at most {MAX_HEADERS_PER_TRANSFORM} per transform")]
    TooManyHeaders { field: String, value: usize },
    #[error("{field}: {value:?} is not a valid HTTP header name")]
    InvalidHeaderName { field: String, value: String },
    #[error("{field}: the value holds a control character or is too long")]
    InvalidHeaderValue { field: String, value: String },
    #[error("{field}: {value:?} is not a well-formed ${{e2b.secrets.NAME}} reference")]
    InvalidSecretReference { field: String, value: String },
    #[error("{field}: {value:?} is not a valid host mask")]
    InvalidMaskRequestHost { field: String, value: String },
    #[error("{field}: {value:?} is not supported by berth")]
    Unsupported { field: String, value: String },
    #[error("{field}: {value:?}: IPv6 egress is not supported (sandboxes have no IPv6)")]
    Ipv6NotSupported { field: String, value: String },
}

impl PolicyError {
    /// The field the error is about (`network.allowOut[2]`, `--egress-deny`, …).
    pub fn field(&self) -> &str {
        match self {
            Self::InvalidDestination { field, .. }
            | Self::InvalidDenyEntry { field, .. }
            | Self::DomainWithoutDenyAll { field, .. }
            | Self::InvalidRuleDomain { field, .. }
            | Self::TooManyRuleDomains { field, .. }
            | Self::TooManyTransforms { field, .. }
            | Self::TooManyHeaders { field, .. }
            | Self::InvalidHeaderName { field, .. }
            | Self::InvalidHeaderValue { field, .. }
            | Self::InvalidSecretReference { field, .. }
            | Self::InvalidMaskRequestHost { field, .. }
            | Self::Unsupported { field, .. }
            | Self::Ipv6NotSupported { field, .. } => field,
        }
    }
}

/// A domain name (`example.com`) or a wildcard over its subdomains (`*.example.com`,
/// which matches `a.example.com` and `a.b.example.com` but not `example.com`). Stored
/// lower-case without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DomainPattern {
    wildcard: bool,
    name: String,
}

impl DomainPattern {
    /// Parses `example.com` or `*.example.com`; None when it is not a DNS name.
    pub fn parse(text: &str) -> Option<Self> {
        let lower = text.trim_end_matches('.').to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, lower),
        };
        valid_dns_name(&name).then_some(Self { wildcard, name })
    }

    /// True when `host` (a DNS name, any case, optional trailing dot) is covered.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.wildcard {
            host.len() > self.name.len() + 1
                && host.ends_with(&self.name)
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host == self.name
        }
    }

    pub fn is_wildcard(&self) -> bool {
        self.wildcard
    }

    /// The name without the wildcard.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            write!(f, "*.{}", self.name)
        } else {
            f.write_str(&self.name)
        }
    }
}

impl TryFrom<String> for DomainPattern {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text).ok_or_else(|| format!("{text:?} is not a domain pattern"))
    }
}

impl From<DomainPattern> for String {
    fn from(pattern: DomainPattern) -> String {
        pattern.to_string()
    }
}

/// Letters, digits, `-` and `_` in dot-separated labels of 1–63 bytes, 253 at most in
/// all; a label does not start or end with `-`; the last label is not all digits (so an
/// IP address is never taken for a name).
fn valid_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    labels.iter().all(label_ok)
        && !labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
}

/// Parses a CIDR or a bare address (a host route); host bits are cleared, as E2B's Go
/// parser does (`10.0.0.1/8` is `10.0.0.0/8`).
fn parse_net(text: &str) -> Option<IpNet> {
    let text = text.trim();
    if let Ok(net) = IpNet::from_str(text) {
        return Some(net.trunc());
    }
    IpAddr::from_str(text).ok().map(IpNet::from)
}

/// One `allowOut` entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Destination {
    Net(IpNet),
    Domain(DomainPattern),
}

impl Destination {
    pub fn parse(text: &str) -> Option<Self> {
        parse_net(text)
            .map(Self::Net)
            .or_else(|| DomainPattern::parse(text.trim()).map(Self::Domain))
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Net(net) => write!(f, "{net}"),
            Self::Domain(domain) => write!(f, "{domain}"),
        }
    }
}

impl TryFrom<String> for Destination {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text).ok_or_else(|| format!("{text:?} is not a CIDR, IP or domain"))
    }
}

impl From<Destination> for String {
    fn from(destination: Destination) -> String {
        destination.to_string()
    }
}

/// One entry of `rules[domain]`: E2B's `{transform: {headers: {name: value}}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<HeaderTransform>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderTransform {
    /// Header name → value (which may hold `${e2b.secrets.NAME}` references).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// A sandbox's network policy, validated ([`NetworkPolicy::validate`]). This is what the
/// server stores with the sandbox and hands to the runtime; the serialised form is
/// berth's own (stable, camelCase), not E2B's wire shape (see [`E2bNetworkConfig`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicy {
    /// False behaves as `denyOut: ["0.0.0.0/0"]`.
    pub allow_internet_access: bool,
    pub allow_out: Vec<Destination>,
    pub deny_out: Vec<IpNet>,
    /// False: the sandbox's user ports need `e2b-traffic-access-token` (the sandbox
    /// proxy enforces it; no host network effect).
    pub allow_public_traffic: bool,
    /// Host header the sandbox proxy puts on requests into the sandbox.
    pub mask_request_host: Option<String>,
    /// Per-domain transforms for the egress proxy (the domain is not allowed by them).
    pub rules: BTreeMap<DomainPattern, Vec<TransformRule>>,
}

impl Default for NetworkPolicy {
    /// E2B's default: internet access, nothing denied, public traffic allowed.
    fn default() -> Self {
        Self {
            allow_internet_access: true,
            allow_out: Vec::new(),
            deny_out: Vec::new(),
            allow_public_traffic: true,
            mask_request_host: None,
            rules: BTreeMap::new(),
        }
    }
}

const ANY_V4: Ipv4Net = match Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 0) {
    Ok(net) => net,
    Err(_) => panic!("0.0.0.0/0"),
};

impl NetworkPolicy {
    /// Checks the cross-field rules (domains need deny-all; rule limits; header names,
    /// values and secret references). Field names in errors are E2B's JSON paths.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.allow_internet_access && !self.deny_out.contains(&IpNet::V4(ANY_V4)) {
            if let Some((i, domain)) = self
                .allow_out
                .iter()
                .enumerate()
                .find(|(_, d)| matches!(d, Destination::Domain(_)))
            {
                return Err(PolicyError::DomainWithoutDenyAll {
                    field: format!("network.allowOut[{i}]"),
                    value: domain.to_string(),
                });
            }
        }
        if let Some(mask) = &self.mask_request_host {
            let ok =
                !mask.is_empty() && mask.len() <= 255 && mask.bytes().all(|b| b.is_ascii_graphic());
            if !ok {
                return Err(PolicyError::InvalidMaskRequestHost {
                    field: "network.maskRequestHost".into(),
                    value: mask.clone(),
                });
            }
        }
        validate_rules(&self.rules)
    }

    /// True when the sandbox itself (before the ceiling) lets unlisted public
    /// destinations through.
    fn default_allows(&self) -> bool {
        self.allow_internet_access && !self.deny_out.iter().any(|n| n.prefix_len() == 0)
    }

    /// The sandbox's `allowOut` CIDRs (IPv4; see the module docs on IPv6).
    pub fn allowed_nets(&self) -> impl Iterator<Item = Ipv4Net> + '_ {
        self.allow_out.iter().filter_map(|d| match d {
            Destination::Net(IpNet::V4(net)) => Some(*net),
            _ => None,
        })
    }

    /// The nets the host denies for this sandbox: `denyOut` (IPv4), plus everything when
    /// internet access is off.
    pub fn denied_nets(&self) -> Vec<Ipv4Net> {
        if !self.allow_internet_access {
            return vec![ANY_V4];
        }
        self.deny_out
            .iter()
            .filter_map(|n| match n {
                IpNet::V4(net) => Some(*net),
                IpNet::V6(_) => None,
            })
            .collect()
    }

    pub fn allowed_domains(&self) -> impl Iterator<Item = &DomainPattern> {
        self.allow_out.iter().filter_map(|d| match d {
            Destination::Domain(domain) => Some(domain),
            Destination::Net(_) => None,
        })
    }
}

fn validate_rules(rules: &BTreeMap<DomainPattern, Vec<TransformRule>>) -> Result<(), PolicyError> {
    if rules.len() > MAX_RULE_DOMAINS {
        return Err(PolicyError::TooManyRuleDomains {
            field: "network.rules".into(),
            value: rules.len(),
        });
    }
    for (domain, list) in rules {
        let field = format!("network.rules[{:?}]", domain.to_string());
        if list.len() > MAX_TRANSFORMS_PER_DOMAIN {
            return Err(PolicyError::TooManyTransforms {
                field,
                value: list.len(),
            });
        }
        for (i, rule) in list.iter().enumerate() {
            let Some(transform) = &rule.transform else {
                continue;
            };
            let field = format!("{field}[{i}].transform.headers");
            if transform.headers.len() > MAX_HEADERS_PER_TRANSFORM {
                return Err(PolicyError::TooManyHeaders {
                    field,
                    value: transform.headers.len(),
                });
            }
            for (name, value) in &transform.headers {
                validate_header(&format!("{field}[{name:?}]"), name, value)?;
            }
        }
    }
    Ok(())
}

fn validate_header(field: &str, name: &str, value: &str) -> Result<(), PolicyError> {
    // RFC 9110 token characters.
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > 256 || !name.bytes().all(token) {
        return Err(PolicyError::InvalidHeaderName {
            field: field.to_owned(),
            value: name.to_owned(),
        });
    }
    let visible = |c: char| c == ' ' || c == '\t' || !c.is_control();
    if value.len() > 8192 || !value.chars().all(visible) {
        return Err(PolicyError::InvalidHeaderValue {
            field: field.to_owned(),
            value: value.to_owned(),
        });
    }
    secret_references(value).map_err(|bad| PolicyError::InvalidSecretReference {
        field: field.to_owned(),
        value: bad,
    })?;
    Ok(())
}

/// The secret names a header value refers to (`${e2b.secrets.NAME}`, NAME a secret name
/// as the secrets API takes them: letters, digits, `_` and `-`; matched
/// case-insensitively). Any other `${` is an error (the offending text is returned), so
/// a typo never reaches the internet verbatim.
pub fn secret_references(value: &str) -> Result<Vec<&str>, String> {
    let mut names = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(rest[start..].to_owned());
        };
        let inner = &after[..end];
        let name = inner.strip_prefix("e2b.secrets.").filter(|n| {
            !n.is_empty()
                && n.len() <= 128
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
        match name {
            Some(name) => names.push(name),
            None => return Err(format!("${{{inner}}}")),
        }
        rest = &after[end + 1..];
    }
    Ok(names)
}

/// E2B's `SandboxNetworkConfig` / `SandboxNetworkUpdateConfig` on the wire. Only for
/// mapping into [`NetworkPolicy`]; unknown fields are ignored as the E2B API does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bNetworkConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<BTreeMap<String, Vec<TransformRule>>>,
    /// Only in the update body (`PUT /sandboxes/{id}/network`); on create it is a
    /// top-level field of `NewSandbox`.
    #[serde(
        default,
        rename = "allow_internet_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
}

impl NetworkPolicy {
    /// The policy of `POST /sandboxes`: `allow_internet_access` (top level) and
    /// `network`. Missing means E2B's defaults.
    pub fn from_e2b_create(
        allow_internet_access: Option<bool>,
        network: Option<&E2bNetworkConfig>,
    ) -> Result<Self, PolicyError> {
        let empty = E2bNetworkConfig::default();
        let network = network.unwrap_or(&empty);
        let mut policy = Self::egress_from_e2b(network, allow_internet_access)?;
        policy.allow_public_traffic = network.allow_public_traffic.unwrap_or(true);
        policy.mask_request_host = network.mask_request_host.clone();
        policy.validate()?;
        Ok(policy)
    }

    /// The policy after `PUT /sandboxes/{id}/network`: the egress rules (allowOut,
    /// denyOut, rules, allow_internet_access) are replaced whole, an omitted one cleared;
    /// `allowPublicTraffic` and `maskRequestHost`, which the update body does not carry,
    /// stay as they were.
    pub fn from_e2b_update(&self, update: &E2bNetworkConfig) -> Result<Self, PolicyError> {
        let mut policy = Self::egress_from_e2b(update, update.allow_internet_access)?;
        policy.allow_public_traffic = self.allow_public_traffic;
        policy.mask_request_host = self.mask_request_host.clone();
        policy.validate()?;
        Ok(policy)
    }

    fn egress_from_e2b(
        network: &E2bNetworkConfig,
        allow_internet_access: Option<bool>,
    ) -> Result<Self, PolicyError> {
        if let Some(proxy) = network.egress_proxy.as_ref().filter(|v| !v.is_null()) {
            return Err(PolicyError::Unsupported {
                field: "network.egressProxy".into(),
                value: proxy.to_string(),
            });
        }
        let mut allow_out = Vec::new();
        for (i, text) in network.allow_out.iter().flatten().enumerate() {
            let destination =
                Destination::parse(text).ok_or_else(|| PolicyError::InvalidDestination {
                    field: format!("network.allowOut[{i}]"),
                    value: text.clone(),
                })?;
            allow_out.push(destination);
        }
        let mut deny_out = Vec::new();
        for (i, text) in network.deny_out.iter().flatten().enumerate() {
            let net = parse_net(text).ok_or_else(|| PolicyError::InvalidDenyEntry {
                field: format!("network.denyOut[{i}]"),
                value: text.clone(),
            })?;
            deny_out.push(net);
        }
        let mut rules = BTreeMap::new();
        for (domain, list) in network.rules.iter().flatten() {
            let pattern =
                DomainPattern::parse(domain).ok_or_else(|| PolicyError::InvalidRuleDomain {
                    field: "network.rules".into(),
                    value: domain.clone(),
                })?;
            rules.insert(pattern, list.clone());
        }
        Ok(Self {
            allow_internet_access: allow_internet_access.unwrap_or(true),
            allow_out,
            deny_out,
            allow_public_traffic: true,
            mask_request_host: None,
            rules,
        })
    }

    /// The policy in E2B's shapes, for responses: (`allowInternetAccess`, `network`).
    pub fn to_e2b(&self) -> (bool, E2bNetworkConfig) {
        let strings = |v: Vec<String>| (!v.is_empty()).then_some(v);
        let config = E2bNetworkConfig {
            allow_public_traffic: Some(self.allow_public_traffic),
            allow_out: strings(self.allow_out.iter().map(|d| d.to_string()).collect()),
            deny_out: strings(self.deny_out.iter().map(|n| n.to_string()).collect()),
            egress_proxy: None,
            mask_request_host: self.mask_request_host.clone(),
            rules: (!self.rules.is_empty()).then(|| {
                self.rules
                    .iter()
                    .map(|(d, r)| (d.to_string(), r.clone()))
                    .collect()
            }),
            allow_internet_access: None,
        };
        (self.allow_internet_access, config)
    }
}

/// Address ranges berth never connects anything to, whatever a policy, the ceiling or a
/// URL says: unspecified and "this network" (0/8), RFC 1918, CGNAT (100.64/10),
/// loopback, link-local and cloud metadata (169.254/16), multicast (224/4), reserved and
/// broadcast (240/4), and their IPv6 counterparts (unspecified, loopback, ULA,
/// link-local, multicast). The one list: sandbox egress in nftables
/// ([`builtin_denied`]; every IPv6 packet of a sandbox is dropped anyway), the egress
/// proxy's ceiling (`berth-egress`) and webhook delivery (`berth-server`); the pool and
/// the host's own addresses are added where they are known (see `nft`,
/// [`host_addresses`](crate::host_addresses)). 198.18.0.0/15 is deliberately absent: it
/// is the benchmarking range tests use as their fake internet.
pub const BUILTIN_DENIED: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// The addresses listed in `/proc/net/if_inet6` (one per line: 32 hex digits, then
/// index, prefix length, scope, flags, name).
pub(crate) fn parse_if_inet6(text: &str) -> impl Iterator<Item = std::net::Ipv6Addr> + '_ {
    text.lines().filter_map(|line| {
        let hex = line.split_whitespace().next()?;
        (hex.len() == 32)
            .then(|| u128::from_str_radix(hex, 16).ok())
            .flatten()
            .map(std::net::Ipv6Addr::from)
    })
}

/// The IPv4 part of [`BUILTIN_DENIED`], for the sandbox rule set.
pub fn builtin_denied() -> Vec<Ipv4Net> {
    BUILTIN_DENIED
        .iter()
        .filter_map(|n| Ipv4Net::from_str(n).ok())
        .collect()
}

/// The operator's upper bound on every sandbox's egress (`--egress-allow`,
/// `--egress-deny`). An empty allow list means "the public internet"; any entry makes it
/// a whitelist: CIDRs for direct traffic, domains for traffic through the egress proxy
/// (HTTP Host / TLS SNI) and DNS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ceiling {
    pub allow_nets: Vec<Ipv4Net>,
    pub allow_domains: Vec<DomainPattern>,
    pub deny_nets: Vec<Ipv4Net>,
}

impl Ceiling {
    /// Parses the flags' comma-separated entries (already split).
    pub fn parse<A: AsRef<str>, D: AsRef<str>>(
        allow: &[A],
        deny: &[D],
    ) -> Result<Self, PolicyError> {
        let mut ceiling = Self::default();
        for text in allow.iter().map(AsRef::as_ref) {
            match Destination::parse(text) {
                Some(Destination::Net(IpNet::V4(net))) => ceiling.allow_nets.push(net),
                Some(Destination::Domain(domain)) => ceiling.allow_domains.push(domain),
                Some(Destination::Net(IpNet::V6(_))) => {
                    return Err(PolicyError::Ipv6NotSupported {
                        field: "--egress-allow".into(),
                        value: text.to_owned(),
                    })
                }
                None => {
                    return Err(PolicyError::InvalidDestination {
                        field: "--egress-allow".into(),
                        value: text.to_owned(),
                    })
                }
            }
        }
        for text in deny.iter().map(AsRef::as_ref) {
            match parse_net(text) {
                Some(IpNet::V4(net)) => ceiling.deny_nets.push(net),
                Some(IpNet::V6(_)) => {
                    return Err(PolicyError::Ipv6NotSupported {
                        field: "--egress-deny".into(),
                        value: text.to_owned(),
                    })
                }
                None => {
                    return Err(PolicyError::InvalidDenyEntry {
                        field: "--egress-deny".into(),
                        value: text.to_owned(),
                    })
                }
            }
        }
        Ok(ceiling)
    }

    fn unrestricted(&self) -> bool {
        self.allow_nets.is_empty() && self.allow_domains.is_empty()
    }

    /// The ranges direct (non-proxied) traffic may go to before the ceiling's denies:
    /// everything when the allow list is empty, else its CIDRs (none when it has only
    /// domains).
    pub fn direct_nets(&self) -> Vec<Ipv4Net> {
        if self.unrestricted() {
            vec![ANY_V4]
        } else {
            self.allow_nets.clone()
        }
    }

    fn allows_ip(&self, ip: Ipv4Addr) -> bool {
        !contains(&self.deny_nets, ip) && (self.unrestricted() || contains(&self.allow_nets, ip))
    }

    fn admits_name(&self, name: &str) -> bool {
        self.unrestricted() || self.allow_domains.iter().any(|d| d.matches(name))
    }

    /// The effective policy of a sandbox: its own policy bounded by this ceiling and by
    /// the built-in denies plus `extra_denied` (the pool, the host's addresses).
    pub fn apply(&self, policy: &NetworkPolicy, extra_denied: &[Ipv4Net]) -> EffectivePolicy {
        let mut denied = builtin_denied();
        denied.extend_from_slice(extra_denied);
        EffectivePolicy {
            policy: policy.clone(),
            ceiling: self.clone(),
            always_denied: denied,
        }
    }
}

fn contains(nets: &[Ipv4Net], ip: Ipv4Addr) -> bool {
    nets.iter().any(|n| n.contains(&ip))
}

/// A sandbox's policy under the ceiling: the decisions the host, the egress proxy and the
/// DNS server make for it. Never wider than either the policy or the ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectivePolicy {
    pub policy: NetworkPolicy,
    pub ceiling: Ceiling,
    always_denied: Vec<Ipv4Net>,
}

impl EffectivePolicy {
    /// May the sandbox open a direct connection (any port) to `ip`?
    pub fn allows_ip(&self, ip: Ipv4Addr) -> bool {
        self.allows_connection(None, ip)
    }

    /// May a connection go to `ip`, reached by the egress proxy (or resolved by DNS) for
    /// `name`? A domain allowed by the sandbox or the ceiling admits an address their
    /// CIDR rules would not, but never an always-denied one (private ranges, metadata,
    /// the host) nor one the ceiling denies explicitly.
    pub fn allows_connection(&self, name: Option<&str>, ip: Ipv4Addr) -> bool {
        if contains(&self.always_denied, ip) || contains(&self.ceiling.deny_nets, ip) {
            return false;
        }
        let ceiling = self.ceiling.allows_ip(ip) || name.is_some_and(|n| self.ceiling_domain(n));
        let sandbox = self.sandbox_allows_ip(ip) || name.is_some_and(|n| self.sandbox_domain(n));
        ceiling && sandbox
    }

    /// Should the DNS server answer for `name`? Only when some connection to it could be
    /// allowed: both the sandbox and the ceiling admit unlisted destinations or list the
    /// name.
    pub fn resolves(&self, name: &str) -> bool {
        self.ceiling.admits_name(name)
            && (self.policy.default_allows() || self.sandbox_domain(name))
    }

    /// No egress at all (DNS included): internet access off or deny-all, with nothing
    /// allowed.
    pub fn no_egress(&self) -> bool {
        !self.policy.default_allows() && self.policy.allow_out.is_empty()
    }

    /// TCP 80/443 goes through the egress proxy: the sandbox or the ceiling allows
    /// domains (Host / SNI checks), or the sandbox has header rules (injection).
    pub fn proxied(&self) -> bool {
        self.policy.allowed_domains().next().is_some()
            || !self.ceiling.allow_domains.is_empty()
            || !self.policy.rules.is_empty()
    }

    fn sandbox_allows_ip(&self, ip: Ipv4Addr) -> bool {
        self.policy.allowed_nets().any(|n| n.contains(&ip))
            || !contains(&self.policy.denied_nets(), ip)
    }

    fn sandbox_domain(&self, name: &str) -> bool {
        self.policy.allowed_domains().any(|d| d.matches(name))
    }

    fn ceiling_domain(&self, name: &str) -> bool {
        self.ceiling.allow_domains.iter().any(|d| d.matches(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> E2bNetworkConfig {
        serde_json::from_str(json).unwrap()
    }

    fn ip(text: &str) -> Ipv4Addr {
        text.parse().unwrap()
    }

    #[test]
    fn parses_destinations() {
        assert_eq!(
            Destination::parse("8.8.8.8"),
            Some(Destination::Net("8.8.8.8/32".parse().unwrap()))
        );
        assert_eq!(
            Destination::parse("10.1.2.3/8"),
            Some(Destination::Net("10.0.0.0/8".parse().unwrap()))
        );
        assert!(matches!(
            Destination::parse("*.Example.COM."),
            Some(Destination::Domain(d)) if d.is_wildcard() && d.name() == "example.com"
        ));
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "-a.com",
            "a-.com",
            "1.2.3",
            "1.2.3.4/33",
            "ex ample.com",
            "a.*.com",
        ] {
            assert_eq!(Destination::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        let wild = DomainPattern::parse("*.example.com").unwrap();
        assert!(wild.matches("a.example.com"));
        assert!(wild.matches("A.B.Example.com."));
        assert!(!wild.matches("example.com"));
        assert!(!wild.matches("badexample.com"));
        let exact = DomainPattern::parse("example.com").unwrap();
        assert!(exact.matches("EXAMPLE.com"));
        assert!(!exact.matches("a.example.com"));
    }

    #[test]
    fn create_defaults_are_e2bs() {
        let policy = NetworkPolicy::from_e2b_create(None, None).unwrap();
        assert_eq!(policy, NetworkPolicy::default());
        let eff = Ceiling::default().apply(&policy, &[]);
        assert!(eff.allows_ip(ip("198.18.0.1")));
        assert!(!eff.proxied());
        assert!(eff.resolves("example.com"));
    }

    #[test]
    fn errors_name_field_and_value() {
        let err = NetworkPolicy::from_e2b_create(
            None,
            Some(&config(r#"{"allowOut":["1.1.1.1","not a host"]}"#)),
        )
        .unwrap_err();
        assert_eq!(
            err,
            PolicyError::InvalidDestination {
                field: "network.allowOut[1]".into(),
                value: "not a host".into()
            }
        );
        assert!(err.to_string().contains("network.allowOut[1]"));
        assert!(err.to_string().contains("not a host"));
        let err =
            NetworkPolicy::from_e2b_create(None, Some(&config(r#"{"denyOut":["example.com"]}"#)))
                .unwrap_err();
        assert_eq!(err.field(), "network.denyOut[0]");
    }

    #[test]
    fn domains_need_deny_all() {
        let err =
            NetworkPolicy::from_e2b_create(None, Some(&config(r#"{"allowOut":["example.com"]}"#)))
                .unwrap_err();
        assert!(
            matches!(err, PolicyError::DomainWithoutDenyAll { ref value, .. } if value == "example.com")
        );
        let err = NetworkPolicy::from_e2b_create(
            None,
            Some(&config(
                r#"{"allowOut":["example.com"],"denyOut":["8.8.8.8"]}"#,
            )),
        )
        .unwrap_err();
        assert!(matches!(err, PolicyError::DomainWithoutDenyAll { .. }));
        NetworkPolicy::from_e2b_create(
            None,
            Some(&config(
                r#"{"allowOut":["*.example.com"],"denyOut":["0.0.0.0/0"]}"#,
            )),
        )
        .unwrap();
        // No internet access is deny-all too.
        NetworkPolicy::from_e2b_create(
            Some(false),
            Some(&config(r#"{"allowOut":["example.com"]}"#)),
        )
        .unwrap();
    }

    #[test]
    fn allow_wins_over_deny() {
        let policy = NetworkPolicy::from_e2b_create(
            None,
            Some(&config(
                r#"{"allowOut":["198.18.0.7"],"denyOut":["198.18.0.0/24","0.0.0.0/0"]}"#,
            )),
        )
        .unwrap();
        let eff = Ceiling::default().apply(&policy, &[]);
        assert!(eff.allows_ip(ip("198.18.0.7")));
        assert!(!eff.allows_ip(ip("198.18.0.8")));
        assert!(!eff.allows_ip(ip("198.19.0.1")));
        assert!(!eff.no_egress());
        assert!(!eff.resolves("example.com"));
    }

    #[test]
    fn deny_one_ip() {
        let policy =
            NetworkPolicy::from_e2b_create(None, Some(&config(r#"{"denyOut":["198.18.0.7"]}"#)))
                .unwrap();
        let eff = Ceiling::default().apply(&policy, &[]);
        assert!(!eff.allows_ip(ip("198.18.0.7")));
        assert!(eff.allows_ip(ip("198.18.0.8")));
    }

    #[test]
    fn no_internet_means_nothing_not_even_dns() {
        let policy = NetworkPolicy::from_e2b_create(Some(false), None).unwrap();
        let eff = Ceiling::default().apply(&policy, &[]);
        assert!(eff.no_egress());
        assert!(!eff.allows_ip(ip("198.18.0.1")));
        assert!(!eff.resolves("example.com"));
        // …but allowOut still wins, as E2B says false behaves as denyOut 0.0.0.0/0.
        let policy = NetworkPolicy::from_e2b_create(
            Some(false),
            Some(&config(r#"{"allowOut":["198.18.0.1"]}"#)),
        )
        .unwrap();
        let eff = Ceiling::default().apply(&policy, &[]);
        assert!(!eff.no_egress());
        assert!(eff.allows_ip(ip("198.18.0.1")));
        assert!(!eff.allows_ip(ip("198.18.0.2")));
    }

    #[test]
    fn if_inet6_lines_become_addresses() {
        let text = "00000000000000000000000000000001 01 80 10 80       lo\n\
                    fe800000000000000000000000000001 02 40 20 80     eth0\n\
                    garbage\n";
        let found: Vec<_> = parse_if_inet6(text).collect();
        assert_eq!(
            found,
            vec![
                "::1".parse::<std::net::Ipv6Addr>().unwrap(),
                "fe80::1".parse().unwrap()
            ]
        );
    }

    #[test]
    fn the_builtin_list_covers_both_families() {
        let v4 = builtin_denied();
        assert!(v4
            .iter()
            .any(|n| n.contains(&Ipv4Addr::new(169, 254, 169, 254))));
        assert!(v4
            .iter()
            .all(|n| !n.contains(&Ipv4Addr::new(198, 18, 0, 1))));
        assert!(BUILTIN_DENIED.contains(&"::1/128") && BUILTIN_DENIED.contains(&"::/128"));
    }

    #[test]
    fn builtin_denies_beat_every_allow() {
        let policy = NetworkPolicy::from_e2b_create(
            None,
            Some(&config(
                r#"{"allowOut":["0.0.0.0/0","169.254.169.254","10.0.0.0/8"]}"#,
            )),
        )
        .unwrap();
        let ceiling = Ceiling::parse(&["0.0.0.0/0", "metadata.internal"], &[] as &[&str]).unwrap();
        let eff = ceiling.apply(&policy, &["203.0.113.9/32".parse().unwrap()]);
        for denied in [
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "127.0.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "203.0.113.9",
        ] {
            assert!(!eff.allows_ip(ip(denied)), "{denied}");
            // Not even by name through the proxy.
            assert!(
                !eff.allows_connection(Some("metadata.internal"), ip(denied)),
                "{denied}"
            );
        }
        assert!(eff.allows_ip(ip("198.18.0.1")));
    }

    #[test]
    fn ceiling_bounds_every_policy() {
        let ceiling =
            Ceiling::parse(&["198.18.0.0/24", "*.registry.test"], &["198.18.0.9"]).unwrap();
        let open = ceiling.apply(&NetworkPolicy::default(), &[]);
        assert!(open.allows_ip(ip("198.18.0.1")));
        assert!(!open.allows_ip(ip("198.18.0.9")), "ceiling deny");
        assert!(!open.allows_ip(ip("198.18.1.1")), "outside the ceiling");
        assert!(!open.allows_ip(ip("93.184.215.14")), "outside the ceiling");
        assert!(open.allows_connection(Some("pypi.registry.test"), ip("198.51.100.1")));
        assert!(!open.allows_connection(Some("pypi.registry.test"), ip("198.18.0.9")));
        assert!(!open.allows_connection(Some("evil.test"), ip("198.51.100.1")));
        assert!(open.resolves("pypi.registry.test"));
        assert!(!open.resolves("evil.test"));
        assert!(open.proxied());
        // A sandbox allowing more than the ceiling gets no more.
        let wide = NetworkPolicy::from_e2b_create(
            None,
            Some(&config(
                r#"{"allowOut":["0.0.0.0/0","evil.test"],"denyOut":["0.0.0.0/0"]}"#,
            )),
        )
        .unwrap();
        let eff = ceiling.apply(&wide, &[]);
        assert!(!eff.allows_ip(ip("198.51.100.1")));
        assert!(!eff.allows_connection(Some("evil.test"), ip("198.51.100.1")));
        assert!(!eff.resolves("evil.test"));
        // A sandbox allowing less gets less.
        let narrow = NetworkPolicy::from_e2b_create(
            None,
            Some(&config(
                r#"{"allowOut":["198.18.0.2"],"denyOut":["0.0.0.0/0"]}"#,
            )),
        )
        .unwrap();
        let eff = ceiling.apply(&narrow, &[]);
        assert!(eff.allows_ip(ip("198.18.0.2")));
        assert!(!eff.allows_ip(ip("198.18.0.1")));
        assert!(!eff.allows_connection(Some("pypi.registry.test"), ip("198.51.100.1")));
    }

    #[test]
    fn ceiling_rejects_bad_and_v6_entries() {
        let err = Ceiling::parse(&["::/0"], &[] as &[&str]).unwrap_err();
        assert_eq!(err.field(), "--egress-allow");
        let err = Ceiling::parse(&[] as &[&str], &["example.com"]).unwrap_err();
        assert!(
            matches!(err, PolicyError::InvalidDenyEntry { ref field, .. } if field == "--egress-deny")
        );
    }

    #[test]
    fn rules_limits_and_secret_references() {
        let ok = config(
            r#"{"rules":{"api.example.com":[{"transform":{"headers":
                {"Authorization":"Bearer ${e2b.secrets.API_TOKEN}","X-A":"b"}}}]}}"#,
        );
        let policy = NetworkPolicy::from_e2b_create(None, Some(&ok)).unwrap();
        assert_eq!(policy.rules.len(), 1);
        assert_eq!(
            secret_references("a ${e2b.secrets.A_1} b ${e2b.secrets._x} ${e2b.secrets.openai-key}")
                .unwrap(),
            vec!["A_1", "_x", "openai-key"]
        );
        for bad in [
            "${e2b.secrets.}",
            "${e2b.secret.A}",
            "${HOME}",
            "${e2b.secrets.A",
            "${e2b.secrets.a.b}",
            "${e2b.secrets.a b}",
        ] {
            let json = format!(
                r#"{{"rules":{{"a.com":[{{"transform":{{"headers":{{"X":{}}}}}}}]}}}}"#,
                serde_json::to_string(bad).unwrap()
            );
            let err = NetworkPolicy::from_e2b_create(None, Some(&config(&json))).unwrap_err();
            assert!(
                matches!(err, PolicyError::InvalidSecretReference { ref field, .. }
                    if field == r#"network.rules["a.com"][0].transform.headers["X"]"#),
                "{bad}: {err:?}"
            );
        }
        let eleven: BTreeMap<String, Vec<TransformRule>> =
            (0..11).map(|i| (format!("d{i}.com"), vec![])).collect();
        let err = NetworkPolicy::from_e2b_create(
            None,
            Some(&E2bNetworkConfig {
                rules: Some(eleven),
                ..Default::default()
            }),
        )
        .unwrap_err();
        assert!(matches!(
            err,
            PolicyError::TooManyRuleDomains { value: 11, .. }
        ));
        let two = config(r#"{"rules":{"a.com":[{},{}]}}"#);
        assert!(matches!(
            NetworkPolicy::from_e2b_create(None, Some(&two)).unwrap_err(),
            PolicyError::TooManyTransforms { value: 2, .. }
        ));
        let headers: BTreeMap<String, String> =
            (0..21).map(|i| (format!("X-{i}"), "v".into())).collect();
        let many = E2bNetworkConfig {
            rules: Some(BTreeMap::from([(
                "a.com".to_owned(),
                vec![TransformRule {
                    transform: Some(HeaderTransform { headers }),
                }],
            )])),
            ..Default::default()
        };
        assert!(matches!(
            NetworkPolicy::from_e2b_create(None, Some(&many)).unwrap_err(),
            PolicyError::TooManyHeaders { value: 21, .. }
        ));
        let bad_name =
            config(r#"{"rules":{"a.com":[{"transform":{"headers":{"Bad Name":"v"}}}]}}"#);
        assert!(matches!(
            NetworkPolicy::from_e2b_create(None, Some(&bad_name)).unwrap_err(),
            PolicyError::InvalidHeaderName { .. }
        ));
        let crlf = config(r#"{"rules":{"a.com":[{"transform":{"headers":{"X":"a\r\nB: c"}}}]}}"#);
        assert!(matches!(
            NetworkPolicy::from_e2b_create(None, Some(&crlf)).unwrap_err(),
            PolicyError::InvalidHeaderValue { .. }
        ));
        let bad_domain = config(r#"{"rules":{"not a domain":[]}}"#);
        assert!(matches!(
            NetworkPolicy::from_e2b_create(None, Some(&bad_domain)).unwrap_err(),
            PolicyError::InvalidRuleDomain { .. }
        ));
    }

    #[test]
    fn egress_proxy_is_refused_not_ignored() {
        let err = NetworkPolicy::from_e2b_create(
            None,
            Some(&config(r#"{"egressProxy":{"address":"socks5://x:1080"}}"#)),
        )
        .unwrap_err();
        assert_eq!(err.field(), "network.egressProxy");
        NetworkPolicy::from_e2b_create(None, Some(&config(r#"{"egressProxy":null}"#))).unwrap();
    }

    #[test]
    fn update_replaces_egress_and_keeps_ingress_fields() {
        let created = NetworkPolicy::from_e2b_create(
            None,
            Some(&config(
                r#"{"allowPublicTraffic":false,"maskRequestHost":"localhost:${PORT}","denyOut":["198.18.0.1"]}"#,
            )),
        )
        .unwrap();
        let updated = created
            .from_e2b_update(&config(r#"{"allow_internet_access":false}"#))
            .unwrap();
        assert!(updated.deny_out.is_empty(), "omitted denyOut is cleared");
        assert!(!updated.allow_internet_access);
        assert!(!updated.allow_public_traffic);
        assert_eq!(
            updated.mask_request_host.as_deref(),
            Some("localhost:${PORT}")
        );
        let cleared = updated.from_e2b_update(&config("{}")).unwrap();
        assert!(cleared.allow_internet_access);
    }

    #[test]
    fn stored_form_round_trips() {
        let policy = NetworkPolicy::from_e2b_create(
            Some(false),
            Some(&config(
                r#"{"allowOut":["*.example.com","198.18.0.0/15"],"denyOut":["198.18.0.9"],
                    "rules":{"example.com":[{"transform":{"headers":{"X":"${e2b.secrets.K}"}}}]}}"#,
            )),
        )
        .unwrap();
        let json = serde_json::to_string(&policy).unwrap();
        assert!(
            json.contains(r#""allowOut":["*.example.com","198.18.0.0/15"]"#),
            "{json}"
        );
        let back: NetworkPolicy = serde_json::from_str(&json).unwrap();
        assert_eq!(back, policy);
        let (internet, wire) = policy.to_e2b();
        assert!(!internet);
        let again = NetworkPolicy::from_e2b_create(Some(internet), Some(&wire)).unwrap();
        assert_eq!(again, policy);
    }
}
