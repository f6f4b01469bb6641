//! Joins sandbox networking's two halves for `berth up`: the host side (berth-net, inside
//! the runtime: namespaces, links, nftables, CIDR policy) and the userland side
//! (berth-egress: the DNS server and the transparent proxy that enforces domain rules),
//! which binds to the network's gateway on the ports nftables redirects to.
//!
//! The policy model is berth-net's; berth-egress judges each connection and query by a
//! policy rebuilt from the sandbox's current one on every lookup (a few strings), so a
//! `PUT /sandboxes/{id}/network` applies to the very next packet the proxy sees.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::{Context, Result};
use berth_egress::{Ceiling, EgressConfig, EgressHandle, EgressPolicy, HeaderRule, IpNet};
use berth_net::NetworkPolicy;
use berth_runtime::LinuxRuntime;

/// The operator's egress flags, as given to `berth up`.
pub struct EgressFlags<'a> {
    pub allow: &'a [String],
    pub deny: &'a [String],
    pub dns_upstreams: &'a [SocketAddr],
}

/// Header injection for `network.rules`: TLS for rule domains terminated with the
/// installation's CA (kept in `ca_dir`, trusted by every sandbox), upstream servers
/// verified against the host's roots plus `extra_roots`, `${e2b.secrets.NAME}` resolved
/// per request by `secrets`.
pub struct Interception {
    pub ca_dir: std::path::PathBuf,
    pub extra_roots: Vec<berth_egress::CertificateDer<'static>>,
    pub secrets: Arc<dyn berth_egress::SecretResolver>,
}

/// The certificates of PEM file `path` (`--egress-extra-root`).
pub fn read_roots(path: &std::path::Path) -> Result<Vec<berth_egress::CertificateDer<'static>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut roots = Vec::new();
    for block in text.split("-----BEGIN CERTIFICATE-----").skip(1) {
        let body = block
            .split("-----END CERTIFICATE-----")
            .next()
            .unwrap_or_default();
        let der = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            body.split_whitespace().collect::<String>(),
        )
        .with_context(|| format!("{}: a certificate is not base64", path.display()))?;
        roots.push(berth_egress::CertificateDer::from(der));
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "{} holds no PEM certificate",
        path.display()
    );
    Ok(roots)
}

/// Sandboxes' policies, looked up by source address in the runtime's network.
struct RuntimePolicies {
    runtime: Arc<LinuxRuntime>,
    ceiling: Arc<Ceiling>,
}

impl berth_egress::PolicySource for RuntimePolicies {
    fn lookup(&self, sandbox_addr: IpAddr) -> Option<Arc<EgressPolicy>> {
        let IpAddr::V4(addr) = sandbox_addr else {
            return None;
        };
        let (sandbox, effective) = self.runtime.network()?.lookup(addr)?;
        match egress_policy(&effective.policy, self.ceiling.clone()) {
            Ok(policy) => Some(Arc::new(policy)),
            Err(err) => {
                // Validated when it was set: refusing is the safe answer if not.
                tracing::error!(%sandbox, %err, "a stored network policy does not translate");
                None
            }
        }
    }
}

/// berth-egress's form of a berth-net policy. `allow_internet_access=false` means
/// `denyOut 0.0.0.0/0` with `allowOut` still winning (as E2B's SDK documents it); with
/// nothing allowed there is no egress at all, DNS included.
fn egress_policy(
    policy: &NetworkPolicy,
    ceiling: Arc<Ceiling>,
) -> Result<EgressPolicy, berth_egress::PolicyError> {
    let (internet, config) = policy.to_e2b();
    let allow = config.allow_out.unwrap_or_default();
    let mut deny = config.deny_out.unwrap_or_default();
    let internet = internet || !allow.is_empty();
    if !policy.allow_internet_access && !allow.is_empty() {
        deny.push("0.0.0.0/0".into());
    }
    let mut header_rules = Vec::new();
    for (domain, rules) in &policy.rules {
        for transform in rules.iter().filter_map(|rule| rule.transform.as_ref()) {
            header_rules.push(HeaderRule::new(
                &domain.to_string(),
                transform
                    .headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_str())),
            )?);
        }
    }
    EgressPolicy::from_e2b(internet, &allow, &deny, header_rules, ceiling)
}

/// The egress ceiling for berth-egress: the same operator flags berth-net enforces, plus
/// what the daemon denies every sandbox (its pool, the host's own addresses).
fn egress_ceiling(flags: &EgressFlags<'_>, always_denied: &[ipnet::Ipv4Net]) -> Result<Ceiling> {
    let mut nets = Vec::new();
    let mut domains = Vec::new();
    for entry in flags.allow {
        match entry.parse::<IpNet>() {
            Ok(net) => nets.push(net),
            Err(_) => match entry.parse::<std::net::IpAddr>() {
                Ok(ip) => nets.push(IpNet::from(ip)),
                Err(_) => domains.push(
                    berth_egress::DomainPattern::parse(entry)
                        .with_context(|| format!("--egress-allow {entry:?}"))?,
                ),
            },
        }
    }
    let mut denied: Vec<IpNet> = always_denied.iter().copied().map(IpNet::V4).collect();
    for entry in flags.deny {
        denied.push(
            entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<std::net::IpAddr>().map(IpNet::from))
                .with_context(|| format!("--egress-deny {entry:?} is not a CIDR or address"))?,
        );
    }
    let mut ceiling = Ceiling::default().deny(denied);
    if !nets.is_empty() {
        ceiling = ceiling.allow_only_nets(nets);
    }
    if !domains.is_empty() {
        ceiling = ceiling.allow_only_domains(domains);
    }
    Ok(ceiling)
}

/// Starts the DNS server and egress proxy on the runtime's gateway, on the ports its
/// rule set redirects to.
pub async fn start(
    runtime: Arc<LinuxRuntime>,
    flags: &EgressFlags<'_>,
    interception: Interception,
) -> Result<EgressHandle> {
    let net = runtime
        .network()
        .context("the runtime has no sandbox networking")?;
    let ports = net.config().ports;
    let ceiling = Arc::new(egress_ceiling(flags, net.always_denied())?);
    let mut config = EgressConfig::new(IpAddr::V4(net.gateway()));
    config.http_port = ports.http;
    config.tls_port = ports.tls;
    config.dns_port = ports.dns;
    config.upstream_dns = flags.dns_upstreams.to_vec();
    config.interception = Some(berth_egress::InterceptionConfig {
        ca_dir: interception.ca_dir,
        host_roots: true,
        extra_upstream_roots: interception.extra_roots,
        secrets: interception.secrets,
    });
    let policies = Arc::new(RuntimePolicies {
        runtime: runtime.clone(),
        ceiling,
    });
    let handle = berth_egress::Egress::start(config, policies)
        .await
        .context("starting the egress proxy and DNS server")?;
    // Sandboxes started from now on trust the CA the proxy terminates rule domains with.
    runtime.set_egress_ca(handle.ca_cert_pem.clone());
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow_internet: Option<bool>, network: serde_json::Value) -> NetworkPolicy {
        let config: berth_net::E2bNetworkConfig = serde_json::from_value(network).unwrap();
        NetworkPolicy::from_e2b_create(allow_internet, Some(&config)).unwrap()
    }

    fn open() -> Arc<Ceiling> {
        Arc::new(Ceiling::default())
    }

    #[test]
    fn no_internet_and_nothing_allowed_is_no_egress_at_all() {
        let egress = egress_policy(&policy(Some(false), serde_json::json!({})), open()).unwrap();
        assert!(!egress.internet);
    }

    #[test]
    fn no_internet_with_allowed_destinations_denies_all_else() {
        let egress = egress_policy(
            &policy(
                Some(false),
                serde_json::json!({"allowOut": ["198.18.0.10"]}),
            ),
            open(),
        )
        .unwrap();
        assert!(egress.internet);
        assert!(egress.addr_allowed("198.18.0.10".parse().unwrap(), 80));
        assert!(!egress.addr_allowed("198.18.0.11".parse().unwrap(), 80));
    }

    #[test]
    fn domains_carry_over_with_their_deny_all() {
        let egress = egress_policy(
            &policy(
                None,
                serde_json::json!({"allowOut": ["*.example.test"], "denyOut": ["0.0.0.0/0"]}),
            ),
            open(),
        )
        .unwrap();
        assert!(egress.name_allowed("api.example.test", 443));
        assert!(!egress.name_allowed("other.test", 443));
    }

    #[test]
    fn the_ceiling_takes_cidrs_addresses_and_domains() {
        let allow = ["198.18.0.0/15".to_string(), "203.0.113.7".into()];
        let deny = ["198.19.0.0/16".to_string()];
        let flags = EgressFlags {
            allow: &allow,
            deny: &deny,
            dns_upstreams: &[],
        };
        let ceiling = egress_ceiling(&flags, &["10.77.0.0/16".parse().unwrap()]).unwrap();
        assert!(ceiling.admits_addr("198.18.1.1".parse().unwrap()));
        assert!(ceiling.admits_addr("203.0.113.7".parse().unwrap()));
        assert!(!ceiling.admits_addr("198.19.1.1".parse().unwrap()));
        assert!(!ceiling.admits_addr("10.77.0.5".parse().unwrap()));
        // Names are admitted: the addresses they resolve to are checked when dialed.
        assert!(ceiling.admits_name("web1.test-internet.example"));
        let names_only = ["pypi.org".to_string()];
        let flags = EgressFlags {
            allow: &names_only,
            deny: &[],
            dns_upstreams: &[],
        };
        let ceiling = egress_ceiling(&flags, &[]).unwrap();
        assert!(ceiling.admits_name("pypi.org"));
        assert!(!ceiling.admits_name("example.org"));
    }
}
