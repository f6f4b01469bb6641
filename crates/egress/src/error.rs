//! Typed errors of the crate's public API.

use std::net::SocketAddr;
use std::path::PathBuf;

pub use berth_ca::CaError;

/// A policy entry that cannot be enforced as written.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{0:?} is not a valid domain pattern: use a DNS name, `*.` followed by one, or `*`")]
    InvalidDomain(String),
    #[error("{0:?} is not a valid rule: use an IP, a CIDR or a domain, optionally followed by `:port` or `:first-last`")]
    InvalidRule(String),
    #[error("{0:?} has an invalid port or port range: ports are 1..=65535 and a range's first port is not above its last")]
    InvalidPorts(String),
    #[error("denyOut entry {0:?} is a domain: denyOut takes IPs and CIDRs only")]
    DomainInDenyOut(String),
    #[error("allowOut holds domains, which require denyOut to contain 0.0.0.0/0")]
    DomainsNeedDenyAll,
    #[error("header name {0:?} is not a valid HTTP header name")]
    InvalidHeaderName(String),
    #[error(
        "header {name:?}: the value has an unterminated `${{` placeholder or a control character"
    )]
    InvalidHeaderValue { name: String },
    #[error("header {name:?}: placeholder `${{{placeholder}}}` is not of the form `${{e2b.secrets.NAME}}`")]
    UnknownPlaceholder { name: String, placeholder: String },
}

/// Why [`crate::Egress::start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot bind the egress {what} listener on {addr}: {source}; is the gateway address configured on this host and the port free?")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot read upstream resolvers from {path}: {source}; pass them explicitly in EgressConfig::upstream_dns")]
    ResolvConf {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no upstream DNS resolver is configured: {path} names no nameserver; pass them in EgressConfig::upstream_dns")]
    NoUpstreamDns { path: PathBuf },
    #[error(transparent)]
    Ca(#[from] CaError),
    #[error("no trusted root certificates for upstream TLS: the host's trust store is empty or unreadable and no extra roots were given")]
    NoUpstreamRoots,
}
