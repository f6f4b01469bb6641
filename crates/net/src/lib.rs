//! berth-net: the host side of sandbox networking.
//!
//! Owns, per berth daemon: the sandbox address pool, one network namespace per sandbox
//! (created and owned by the host, so root inside a sandbox has no `CAP_NET_ADMIN` over
//! it), the veth links, host routes and neighbour entries, one nftables table, and E2B's
//! network policy model with the operator's ceiling. It must not touch anything of
//! another daemon (every object carries the daemon's tag, derived from its state dir),
//! the host's other tables, routes or links, nor the sandbox's processes (the runtime
//! clones them into the namespace this crate pins). It does not serve DNS or proxy
//! HTTP/TLS: the egress proxy and DNS server (`berth-egress`) bind to
//! [`HostNetwork::gateway`] on the [`EgressPorts`] given here, and find a connection's
//! sandbox and policy with [`HostNetwork::lookup`].
//!
//! # Design
//!
//! **Routed /32s.** Every sandbox has one address from `--sandbox-cidr` (default
//! `10.77.0.0/16`) on `eth0` inside its namespace, with `default via <gateway> onlink`;
//! the gateway (the pool's first address) lives on the daemon's gateway link `<tag>gw`
//! (one end of a veth pair kept in the host: the dummy driver is often missing).
//! The host has a /32 route per sandbox out of its veth (`<tag>v<offset>`), and both ends
//! have permanent neighbour entries, so no ARP crosses a veth and no address is shared
//! between links. The DNS server and the egress proxy bind to the one gateway address.
//!
//! **Namespaces.** The daemon creates each namespace from a throwaway thread
//! (`unshare(CLONE_NEWNET)`), bind-mounts it at `<state>/net/netns/<id>` (it survives a
//! pause, when no process is in it, and daemon restarts) and configures it from inside:
//! lo and eth0 up, the address and default route, IPv6 disabled (sandboxes have no IPv6;
//! every IPv6 packet from a veth is also dropped on the host), and
//! `ip_unprivileged_port_start=0` / `ping_group_range` so unprivileged sandbox processes
//! can bind low ports and ping. The namespace belongs to the host's user namespace: the
//! sandbox's root (in its own user namespace) cannot change addresses, routes or rules,
//! nor open raw or packet sockets.
//!
//! **nftables, in process.** libnftables through FFI (`sys::Nft`), fed nft syntax: one
//! `nft_run_cmd_from_buffer` is one kernel transaction, the syntax is what operators read
//! in `nft list table`, and the generated rule set is plain data ([`nft`](crate)'s
//! `Table`) that unit tests walk packet by packet. Hand-built nf_tables netlink would
//! save the parse but make every rule opaque bytes. Rules never change after start;
//! a sandbox is set elements only (its rate limits are expressions on its elements of
//! two dynamic sets), so create, policy update and removal are each one small
//! transaction, and none costs more with more sandboxes running: libnftables fetches
//! the table's named objects before every transaction, and there are none. See `nft.rs`
//! for the chains.
//!
//! **Netlink** for links, addresses, routes, neighbours and conntrack is a small
//! synchronous client (`netlink.rs`): the runtime is synchronous and does this from
//! threads that have just entered a namespace.
//!
//! **Policy.** [`policy`] holds E2B's model, validation and the ceiling; the host enforces
//! CIDR rules in nftables, the egress proxy enforces domains (HTTP Host / TLS SNI on ports
//! 80/443, redirected there when the policy or ceiling has domains), the DNS server
//! answers only names [`EffectivePolicy::resolves`]. Built-in denies (private, loopback,
//! link-local/metadata, CGNAT, multicast, reserved ranges, the pool, the host's
//! addresses) come before any allow.
//!
//! **Crash safety and recovery.** A sandbox's record (address + policy) is written (temp
//! file, rename; fsynced on policy changes, see `host::NetRecord` for why not at attach)
//! before anything is created in the kernel. Detach removes the sandbox's elements and
//! record at once and leaves its link and namespace pin to a background thread (each
//! waits for an RCU grace period), which also removes its conntrack entries in a sweep
//! shared with the sandboxes detached within five seconds of it (a sweep walks the
//! kernel's whole conntrack table, ~8 ms of CPU here, whatever it is for, so it runs at
//! `SCHED_IDLE`, behind everything else that wants a CPU); the address
//! returns to the pool after its sweep ([`HostNetwork::settle`] asks for the sweep at
//! once and waits for it, as an attach does when the pool is out of addresses). At
//! start the table is rebuilt from the records in one transaction; `reconcile` removes
//! the networks of sandboxes the runtime does not know and any link or pin of this
//! daemon without a record.
//!
//! **Host settings.** IPv4 forwarding is switched on at start (needed for NAT); nothing
//! needs `route_localnet`, because DNS and proxied traffic is DNAT'ed to the gateway
//! address, not to loopback. Sandbox traffic leaving through any non-berth link is
//! masqueraded.

mod error;
mod host;
mod netlink;
mod nft;
pub mod policy;
pub mod pool;
mod sys;
#[cfg(feature = "test-support")]
pub mod testing;

pub use error::NetError;
pub use host::{daemon_tag, HostNetwork, ReconcileReport, SandboxNet};
pub use policy::{
    Ceiling, E2bNetworkConfig, EffectivePolicy, NetworkPolicy, PolicyError, BUILTIN_DENIED,
};

/// Every address of the caller's network namespace (IPv4 from rtnetlink, IPv6 from
/// `/proc/net/if_inet6`): what "the host's own addresses" means for destinations berth
/// must not connect to on a client's behalf (webhook receivers, sandbox egress).
pub fn host_addresses() -> Result<Vec<std::net::IpAddr>, NetError> {
    let mut nl = netlink::Netlink::route().map_err(error::netlink("open rtnetlink"))?;
    let mut found: Vec<std::net::IpAddr> = nl
        .addresses()
        .map_err(error::netlink("list addresses"))?
        .into_iter()
        .map(|(_, addr)| addr.into())
        .collect();
    let path = "/proc/net/if_inet6";
    match std::fs::read_to_string(path) {
        Ok(text) => found.extend(policy::parse_if_inet6(&text).map(std::net::IpAddr::from)),
        // A kernel without IPv6 has no such file and no IPv6 addresses.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(error::state(path)(e)),
    }
    Ok(found)
}

use std::path::PathBuf;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// Default `--sandbox-cidr`.
pub const DEFAULT_SANDBOX_CIDR: &str = "10.77.0.0/16";

/// Ports on the gateway address where the DNS server and the egress proxy listen; sandbox
/// traffic is DNAT'ed to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressPorts {
    /// DNS (UDP and TCP): every sandbox query to port 53, whatever its destination.
    pub dns: u16,
    /// Transparent HTTP proxy (TCP 80 of sandboxes with domain rules).
    pub http: u16,
    /// Transparent TLS (SNI) proxy (TCP 443 of sandboxes with domain rules).
    pub tls: u16,
}

impl Default for EgressPorts {
    /// High ports, so a host resolver or web server bound to 0.0.0.0 never clashes.
    fn default() -> Self {
        Self {
            dns: 15353,
            http: 15080,
            tls: 15443,
        }
    }
}

/// Per-sandbox limits (the same for every sandbox of a daemon).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Most connections (conntrack entries) a sandbox may open through the host.
    pub max_connections: u32,
    /// Upload cap, bytes per second (excess dropped).
    pub egress_bytes_per_sec: u64,
    /// Download cap, bytes per second (excess dropped).
    pub ingress_bytes_per_sec: u64,
}

impl Default for Limits {
    /// 4096 connections, 1 Gbit/s each way.
    fn default() -> Self {
        Self {
            max_connections: 4096,
            egress_bytes_per_sec: 125_000_000,
            ingress_bytes_per_sec: 125_000_000,
        }
    }
}

/// How a daemon's sandbox networking is set up.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// The daemon's state dir; this crate keeps `net/` in it, and derives the daemon's
    /// tag (link prefix, table name) from its path.
    pub state_dir: PathBuf,
    /// `--sandbox-cidr`.
    pub sandbox_cidr: Ipv4Net,
    /// `--egress-allow` / `--egress-deny`.
    pub ceiling: Ceiling,
    pub ports: EgressPorts,
    pub limits: Limits,
}

impl NetConfig {
    /// Defaults: pool 10.77.0.0/16, no ceiling (the public internet), default ports and
    /// limits.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            sandbox_cidr: DEFAULT_SANDBOX_CIDR.parse().expect("default CIDR"),
            ceiling: Ceiling::default(),
            ports: EgressPorts::default(),
            limits: Limits::default(),
        }
    }
}
