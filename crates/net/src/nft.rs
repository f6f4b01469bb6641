//! The daemon's nftables table, generated as data ([`Table`]) and rendered to nft syntax
//! for libnftables. Pure: nothing here touches the kernel.
//!
//! One `inet` table per daemon holds every rule; sandboxes differ only in set and map
//! elements ([`SandboxElements`]), so creating, updating or removing one is a single
//! transaction of element changes. The upload and download rates are per-element `limit`
//! expressions in two dynamic sets, not named limit objects: libnftables fetches every
//! named object of the table before each transaction, which made every create and kill
//! cost in proportion to the sandboxes running (two objects each). The chains, in packet
//! order:
//!
//! - `sb_dnat` (nat prerouting, from berth's veths): sandboxes with no egress at all skip
//!   it (their DNS is then dropped in `sb_input`); DNS (udp/tcp 53, any destination) goes
//!   to the DNS server on the gateway; for sandboxes whose policy (or the ceiling) has
//!   domains, TCP 80/443 not allowed by CIDR goes to the egress proxy's HTTP/TLS ports.
//! - `sb_input` (filter input, from berth's veths): only DNAT'ed connections to the
//!   gateway's DNS/HTTP/TLS ports reach the host; every other host address and port
//!   (berth's API included) is refused.
//! - `sb_output` (filter output, to berth's veths): only replies; nothing on the host can
//!   open a connection into a sandbox (envd is reached through the sandbox's loopback).
//! - `sb_forward` (filter forward): from berth's veths, `sb_egress`: IPv6 dropped, a
//!   source not the veth's sandbox dropped, always-denied ranges (built-ins, pool, host
//!   addresses) and everything outside the ceiling refused, the connection cap and
//!   upload rate, then the sandbox's allow (wins) and deny pairs. Every packet runs the
//!   whole chain (no early accept of established traffic), so a policy change applies
//!   to existing connections at their next packet. To berth's veths, `sb_ingress`:
//!   replies only (this also drops sandbox ↔ sandbox traffic), with the download rate.
//! - `sb_masquerade` (nat postrouting): sandbox sources leaving through any non-berth
//!   link are masqueraded.
//!
//! Refusals are `reject` (TCP reset / ICMP admin-prohibited) rather than silent drops,
//! so a sandbox's client fails at once instead of timing out.

use std::fmt::{self, Write as _};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::{EgressPorts, Limits};

/// What the table is made of, apart from sandboxes.
#[derive(Debug, Clone)]
pub(crate) struct TableSpec {
    pub name: String,
    /// Prefix of every sandbox's host-side veth (`iifname "<prefix>*"`).
    pub veth_prefix: String,
    pub pool: Ipv4Net,
    pub gateway: Ipv4Addr,
    pub ports: EgressPorts,
    pub limits: Limits,
    /// Built-in denies, the pool, the host's addresses.
    pub always_denied: Vec<Ipv4Net>,
    /// The ceiling's direct (CIDR) allow list; `0.0.0.0/0` when unrestricted.
    pub ceiling_direct: Vec<Ipv4Net>,
    pub ceiling_denied: Vec<Ipv4Net>,
}

/// A sandbox's share of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxElements {
    pub veth: String,
    pub addr: Ipv4Addr,
    /// Destinations allowed whatever `denied` says (merged, no overlaps).
    pub allowed: Vec<Ipv4Net>,
    pub denied: Vec<Ipv4Net>,
    pub proxied: bool,
    pub no_egress: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddrSet {
    AlwaysDenied,
    CeilingDirect,
    CeilingDenied,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SandboxSet {
    Proxied,
    NoEgress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PairSet {
    Allowed,
    Denied,
}

/// A rule's match conditions (all must hold).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cond {
    FromVeth,
    ToVeth,
    NotToVeth,
    Ipv6,
    /// The source is not the address of the sandbox behind the input veth.
    Spoofed,
    SrcInPool,
    DaddrIn(AddrSet),
    DaddrNotIn(AddrSet),
    SaddrIn(SandboxSet),
    PairIn(PairSet),
    PairNotIn(PairSet),
    TcpDport(u16),
    /// udp or tcp to this port.
    AnyDport(u16),
    /// To the gateway, DNAT'ed, on one of the egress ports.
    DnatToEgress,
    CtNew,
    CtReply,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stmt {
    Accept,
    Drop,
    Reject,
    Return,
    Jump(&'static str),
    /// DNAT to the gateway on this port.
    Dnat(u16),
    Masquerade,
    /// Refuse new connections past the per-sandbox cap.
    ConnLimit(u32),
    /// Drop traffic over the sandbox's rate (`up`: by source, else by destination).
    RateLimit {
        up: bool,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub conds: Vec<Cond>,
    pub stmt: Stmt,
}

#[derive(Debug, Clone)]
pub(crate) struct Chain {
    pub name: &'static str,
    /// (type, hook, priority) of a base chain.
    pub hook: Option<(&'static str, &'static str, &'static str)>,
    pub rules: Vec<Rule>,
}

/// The generated table: base chains first.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    pub spec: TableSpec,
    pub chains: Vec<Chain>,
}

fn rule(conds: impl Into<Vec<Cond>>, stmt: Stmt) -> Rule {
    Rule {
        conds: conds.into(),
        stmt,
    }
}

/// The table's chains for `spec`.
pub(crate) fn table(spec: &TableSpec) -> Table {
    use Cond::*;
    let p = spec.ports;
    let chains = vec![
        Chain {
            name: "sb_prerouting",
            hook: Some(("nat", "prerouting", "dstnat")),
            rules: vec![rule([FromVeth], Stmt::Jump("sb_dnat"))],
        },
        Chain {
            name: "sb_hook_input",
            hook: Some(("filter", "input", "filter - 10")),
            rules: vec![rule([FromVeth], Stmt::Jump("sb_input"))],
        },
        Chain {
            name: "sb_hook_output",
            hook: Some(("filter", "output", "filter - 10")),
            rules: vec![
                rule([ToVeth, CtReply], Stmt::Accept),
                rule([ToVeth], Stmt::Drop),
            ],
        },
        Chain {
            name: "sb_forward",
            hook: Some(("filter", "forward", "filter - 10")),
            rules: vec![
                rule([FromVeth], Stmt::Jump("sb_egress")),
                rule([ToVeth], Stmt::Jump("sb_ingress")),
            ],
        },
        Chain {
            name: "sb_masquerade",
            hook: Some(("nat", "postrouting", "srcnat")),
            rules: vec![rule([SrcInPool, NotToVeth], Stmt::Masquerade)],
        },
        Chain {
            name: "sb_dnat",
            hook: None,
            rules: vec![
                rule([SaddrIn(SandboxSet::NoEgress)], Stmt::Return),
                rule([AnyDport(53)], Stmt::Dnat(p.dns)),
                rule(
                    [
                        TcpDport(80),
                        SaddrIn(SandboxSet::Proxied),
                        PairNotIn(PairSet::Allowed),
                    ],
                    Stmt::Dnat(p.http),
                ),
                rule(
                    [
                        TcpDport(443),
                        SaddrIn(SandboxSet::Proxied),
                        PairNotIn(PairSet::Allowed),
                    ],
                    Stmt::Dnat(p.tls),
                ),
            ],
        },
        Chain {
            name: "sb_input",
            hook: None,
            rules: vec![
                rule([Spoofed], Stmt::Drop),
                rule([DnatToEgress], Stmt::Accept),
                rule([], Stmt::Reject),
            ],
        },
        Chain {
            name: "sb_egress",
            hook: None,
            rules: vec![
                rule([Ipv6], Stmt::Drop),
                rule([Spoofed], Stmt::Drop),
                rule([DaddrIn(AddrSet::AlwaysDenied)], Stmt::Reject),
                rule([DaddrNotIn(AddrSet::CeilingDirect)], Stmt::Reject),
                rule([DaddrIn(AddrSet::CeilingDenied)], Stmt::Reject),
                rule([CtNew], Stmt::ConnLimit(spec.limits.max_connections)),
                rule([], Stmt::RateLimit { up: true }),
                rule([PairIn(PairSet::Allowed)], Stmt::Accept),
                rule([PairIn(PairSet::Denied)], Stmt::Reject),
                rule([], Stmt::Accept),
            ],
        },
        Chain {
            name: "sb_ingress",
            hook: None,
            rules: vec![
                rule([Ipv6], Stmt::Drop),
                rule([], Stmt::RateLimit { up: false }),
                rule([CtReply], Stmt::Accept),
                rule([], Stmt::Drop),
            ],
        },
    ];
    Table {
        spec: spec.clone(),
        chains,
    }
}

fn set_name(set: AddrSet) -> &'static str {
    match set {
        AddrSet::AlwaysDenied => "always_denied",
        AddrSet::CeilingDirect => "ceiling_direct",
        AddrSet::CeilingDenied => "ceiling_denied",
    }
}

fn sandbox_set_name(set: SandboxSet) -> &'static str {
    match set {
        SandboxSet::Proxied => "proxied",
        SandboxSet::NoEgress => "no_egress",
    }
}

fn pair_set_name(set: PairSet) -> &'static str {
    match set {
        PairSet::Allowed => "allowed",
        PairSet::Denied => "denied",
    }
}

fn nets(list: &[Ipv4Net]) -> String {
    list.iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Bytes per second in nft's unit syntax (whole kbytes, at least 1).
fn rate(bytes_per_sec: u64) -> String {
    format!("{} kbytes/second", (bytes_per_sec / 1024).max(1))
}

impl Table {
    fn render_cond(&self, cond: &Cond, out: &mut String) {
        let s = &self.spec;
        let text = match cond {
            Cond::FromVeth => format!("iifname \"{}*\"", s.veth_prefix),
            Cond::ToVeth => format!("oifname \"{}*\"", s.veth_prefix),
            Cond::NotToVeth => format!("oifname != \"{}*\"", s.veth_prefix),
            Cond::Ipv6 => "meta nfproto ipv6".into(),
            Cond::Spoofed => "iifname . ip saddr != @sources".into(),
            Cond::SrcInPool => format!("ip saddr {}", s.pool),
            Cond::DaddrIn(set) => format!("ip daddr @{}", set_name(*set)),
            Cond::DaddrNotIn(set) => format!("ip daddr != @{}", set_name(*set)),
            Cond::SaddrIn(set) => format!("ip saddr @{}", sandbox_set_name(*set)),
            Cond::PairIn(set) => format!("ip saddr . ip daddr @{}", pair_set_name(*set)),
            Cond::PairNotIn(set) => format!("ip saddr . ip daddr != @{}", pair_set_name(*set)),
            Cond::TcpDport(port) => format!("tcp dport {port}"),
            Cond::AnyDport(port) => format!("meta l4proto {{ tcp, udp }} th dport {port}"),
            Cond::DnatToEgress => format!(
                "ct status dnat ip daddr {} meta l4proto . th dport {{ udp . {dns}, tcp . {dns}, \
                 tcp . {http}, tcp . {tls} }}",
                s.gateway,
                dns = s.ports.dns,
                http = s.ports.http,
                tls = s.ports.tls
            ),
            Cond::CtNew => "ct state new".into(),
            Cond::CtReply => "ct state established,related".into(),
        };
        out.push_str(&text);
        out.push(' ');
    }

    fn render_stmt(&self, stmt: &Stmt, out: &mut String) {
        let text = match stmt {
            Stmt::Accept => "accept".into(),
            Stmt::Drop => "drop".into(),
            Stmt::Reject => "reject with icmpx admin-prohibited".into(),
            Stmt::Return => "return".into(),
            Stmt::Jump(chain) => format!("jump {chain}"),
            Stmt::Dnat(port) => format!("dnat ip to {}:{port}", self.spec.gateway),
            Stmt::Masquerade => "masquerade".into(),
            Stmt::ConnLimit(max) => {
                format!("add @conns {{ ip saddr ct count over {max} }} reject with icmpx admin-prohibited")
            }
            // Only addresses with an element (attached sandboxes) are limited: without the
            // lookup, a packet for a detached sandbox's address would make one.
            Stmt::RateLimit { up: true } => format!(
                "ip saddr @rate_up add @rate_up {{ ip saddr {} }} drop",
                self.rate_limit(true)
            ),
            Stmt::RateLimit { up: false } => format!(
                "ip daddr @rate_down add @rate_down {{ ip daddr {} }} drop",
                self.rate_limit(false)
            ),
        };
        out.push_str(&text);
    }

    /// The whole table as one nft script; prefixed by a delete of any earlier table of
    /// the same name, so loading it is one atomic replacement.
    pub(crate) fn render(&self, sandboxes: &[SandboxElements]) -> String {
        let s = &self.spec;
        let mut out = String::new();
        let _ = writeln!(out, "add table inet {0}\ndelete table inet {0}", s.name);
        let _ = writeln!(out, "table inet {} {{", s.name);
        let _ = writeln!(out, "  set sources {{ type ifname . ipv4_addr; }}");
        for (name, list) in [
            ("always_denied", &s.always_denied),
            ("ceiling_direct", &s.ceiling_direct),
            ("ceiling_denied", &s.ceiling_denied),
        ] {
            let _ = write!(
                out,
                "  set {name} {{ type ipv4_addr; flags interval; auto-merge;"
            );
            if !list.is_empty() {
                let _ = write!(out, " elements = {{ {} }};", nets(list));
            }
            let _ = writeln!(out, " }}");
        }
        for name in ["allowed", "denied"] {
            let _ = writeln!(
                out,
                "  set {name} {{ type ipv4_addr . ipv4_addr; flags interval; }}"
            );
        }
        for name in ["proxied", "no_egress"] {
            let _ = writeln!(out, "  set {name} {{ type ipv4_addr; }}");
        }
        let _ = writeln!(
            out,
            "  set conns {{ type ipv4_addr; size 65535; flags dynamic; }}"
        );
        for name in ["rate_up", "rate_down"] {
            let _ = writeln!(
                out,
                "  set {name} {{ type ipv4_addr; size 65535; flags dynamic; }}"
            );
        }
        for chain in &self.chains {
            let _ = writeln!(out, "  chain {} {{", chain.name);
            if let Some((kind, hook, priority)) = chain.hook {
                let _ = writeln!(
                    out,
                    "    type {kind} hook {hook} priority {priority}; policy accept;"
                );
            }
            for r in &chain.rules {
                out.push_str("    ");
                for cond in &r.conds {
                    self.render_cond(cond, &mut out);
                }
                self.render_stmt(&r.stmt, &mut out);
                out.push('\n');
            }
            let _ = writeln!(out, "  }}");
        }
        let _ = writeln!(out, "}}");
        for sandbox in sandboxes {
            out.push_str(&self.add_sandbox(sandbox));
        }
        out
    }

    /// The `limit` expression of a sandbox's upload (`up`) or download rate, the same in
    /// the rule and in each sandbox's element.
    fn rate_limit(&self, up: bool) -> String {
        let l = &self.spec.limits;
        let bytes_per_sec = if up {
            l.egress_bytes_per_sec
        } else {
            l.ingress_bytes_per_sec
        };
        format!(
            "limit rate over {} burst {}",
            rate(bytes_per_sec),
            rate(bytes_per_sec / 4)
        )
    }

    /// Commands adding sandbox `e`'s elements.
    pub(crate) fn add_sandbox(&self, e: &SandboxElements) -> String {
        self.elements("add", e)
    }

    /// Commands removing what [`Table::add_sandbox`] added but the connection-count entry.
    pub(crate) fn remove_sandbox(&self, e: &SandboxElements) -> String {
        self.elements("delete", e)
    }

    /// Removes sandbox `addr`'s connection-count entry, if the kernel has not already
    /// (run on its own; nft 1.0.6 has no `destroy` for maybe-absent elements).
    pub(crate) fn remove_conn_entry(&self, addr: Ipv4Addr) -> String {
        format!(
            "delete element inet {} conns {{ {addr} }}\n",
            self.spec.name
        )
    }

    /// Replaces sandbox `old`'s policy elements by `new`'s (same sandbox, same link).
    pub(crate) fn update_sandbox(&self, old: &SandboxElements, new: &SandboxElements) -> String {
        let mut out = self.policy_elements("delete", old);
        out.push_str(&self.policy_elements("add", new));
        out
    }

    fn elements(&self, verb: &str, e: &SandboxElements) -> String {
        let t = &self.spec.name;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{verb} element inet {t} sources {{ \"{}\" . {} }}",
            e.veth, e.addr
        );
        // The rate elements are made here with their limits, not by the rules' first
        // packets, so they exist from attach to detach and go in the same batches.
        for up in [true, false] {
            let set = if up { "rate_up" } else { "rate_down" };
            let limit = if verb == "add" {
                format!(" {}", self.rate_limit(up))
            } else {
                String::new()
            };
            let _ = writeln!(out, "{verb} element inet {t} {set} {{ {}{limit} }}", e.addr);
        }
        // The connection-count entry is made here rather than by the rule's first packet;
        // the kernel drops it whenever its count is zero, so it is removed on its own
        // ([`Table::remove_conn_entry`]): a batch deleting an absent element fails whole.
        if verb == "add" {
            let _ = writeln!(
                out,
                "add element inet {t} conns {{ {} ct count over {} }}",
                e.addr, self.spec.limits.max_connections
            );
        }
        out.push_str(&self.policy_elements(verb, e));
        out
    }

    fn policy_elements(&self, verb: &str, e: &SandboxElements) -> String {
        let t = &self.spec.name;
        let mut out = String::new();
        for (set, list) in [("allowed", &e.allowed), ("denied", &e.denied)] {
            if list.is_empty() {
                continue;
            }
            let pairs: Vec<String> = list.iter().map(|n| format!("{} . {n}", e.addr)).collect();
            let _ = writeln!(
                out,
                "{verb} element inet {t} {set} {{ {} }}",
                pairs.join(", ")
            );
        }
        for (set, on) in [("proxied", e.proxied), ("no_egress", e.no_egress)] {
            if on {
                let _ = writeln!(out, "{verb} element inet {t} {set} {{ {} }}", e.addr);
            }
        }
        out
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(&[]))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! An interpreter of the generated [`Table`]: walks the same rules that are rendered
    //! for the kernel, for one packet, so the built-in denies are proved on the rule set
    //! rather than by sending packets to them.
    use super::*;
    use crate::policy::{Ceiling, NetworkPolicy};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Proto {
        Tcp,
        Udp,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Verdict {
        Accept,
        Drop,
        Reject,
        /// Redirected to the gateway on this port, then accepted by the input chain.
        Redirected(u16),
    }

    #[derive(Debug, Clone)]
    pub(crate) struct Packet {
        pub iif: String,
        pub saddr: Ipv4Addr,
        pub daddr: Ipv4Addr,
        pub proto: Proto,
        pub dport: u16,
        pub new: bool,
        pub ipv6: bool,
    }

    pub(crate) struct World<'a> {
        pub table: &'a Table,
        pub sandboxes: &'a [SandboxElements],
        /// Addresses local to the host (routed to the input hook).
        pub local: Vec<Ipv4Addr>,
    }

    enum Flow {
        Continue,
        Return,
        Final(Verdict),
        Dnat(u16),
    }

    struct State {
        daddr: Ipv4Addr,
        dport: u16,
        dnat: bool,
        oif: Option<String>,
    }

    impl World<'_> {
        fn sandbox(&self, addr: Ipv4Addr) -> Option<&SandboxElements> {
            self.sandboxes.iter().find(|s| s.addr == addr)
        }

        fn matches(&self, cond: &Cond, p: &Packet, st: &State) -> bool {
            let spec = &self.table.spec;
            let from_veth = p.iif.starts_with(&spec.veth_prefix);
            let to_veth = st
                .oif
                .as_ref()
                .is_some_and(|o| o.starts_with(&spec.veth_prefix));
            let in_set = |set: AddrSet, ip: Ipv4Addr| {
                let list = match set {
                    AddrSet::AlwaysDenied => &spec.always_denied,
                    AddrSet::CeilingDirect => &spec.ceiling_direct,
                    AddrSet::CeilingDenied => &spec.ceiling_denied,
                };
                list.iter().any(|n| n.contains(&ip))
            };
            let pair = |set: PairSet| {
                self.sandbox(p.saddr).is_some_and(|s| {
                    let list = match set {
                        PairSet::Allowed => &s.allowed,
                        PairSet::Denied => &s.denied,
                    };
                    list.iter().any(|n| n.contains(&st.daddr))
                })
            };
            match cond {
                Cond::FromVeth => from_veth,
                Cond::ToVeth => to_veth,
                Cond::NotToVeth => !to_veth,
                Cond::Ipv6 => p.ipv6,
                Cond::Spoofed => !self
                    .sandboxes
                    .iter()
                    .any(|s| s.veth == p.iif && s.addr == p.saddr),
                Cond::SrcInPool => spec.pool.contains(&p.saddr),
                Cond::DaddrIn(set) => in_set(*set, st.daddr),
                Cond::DaddrNotIn(set) => !in_set(*set, st.daddr),
                Cond::SaddrIn(set) => self.sandbox(p.saddr).is_some_and(|s| match set {
                    SandboxSet::Proxied => s.proxied,
                    SandboxSet::NoEgress => s.no_egress,
                }),
                Cond::PairIn(set) => pair(*set),
                Cond::PairNotIn(set) => !pair(*set),
                Cond::TcpDport(port) => p.proto == Proto::Tcp && st.dport == *port,
                Cond::AnyDport(port) => st.dport == *port,
                Cond::DnatToEgress => {
                    let ports = spec.ports;
                    st.dnat
                        && st.daddr == spec.gateway
                        && (st.dport == ports.dns
                            || (p.proto == Proto::Tcp
                                && (st.dport == ports.http || st.dport == ports.tls)))
                }
                Cond::CtNew => p.new,
                Cond::CtReply => !p.new,
            }
        }

        fn run(&self, name: &str, p: &Packet, st: &State) -> Flow {
            let chain = self
                .table
                .chains
                .iter()
                .find(|c| c.name == name)
                .expect("chain exists");
            for r in &chain.rules {
                if !r.conds.iter().all(|c| self.matches(c, p, st)) {
                    continue;
                }
                match &r.stmt {
                    Stmt::Accept => return Flow::Final(Verdict::Accept),
                    Stmt::Drop => return Flow::Final(Verdict::Drop),
                    Stmt::Reject => return Flow::Final(Verdict::Reject),
                    Stmt::Return => return Flow::Return,
                    Stmt::Dnat(port) => return Flow::Dnat(*port),
                    Stmt::Jump(target) => match self.run(target, p, st) {
                        Flow::Continue | Flow::Return => {}
                        other => return other,
                    },
                    // Not over any limit in these tests; masquerade does not filter.
                    Stmt::Masquerade | Stmt::ConnLimit(_) | Stmt::RateLimit { .. } => {}
                }
            }
            Flow::Continue
        }

        fn hook(&self, hook: &str, p: &Packet, st: &State) -> Flow {
            for chain in self
                .table
                .chains
                .iter()
                .filter(|c| c.hook.is_some_and(|h| h.1 == hook))
            {
                match self.run(chain.name, p, st) {
                    Flow::Continue | Flow::Return => {}
                    other => return other,
                }
            }
            Flow::Continue
        }

        /// What happens to packet `p` arriving from link `p.iif`.
        pub(crate) fn verdict(&self, p: &Packet) -> Verdict {
            let mut st = State {
                daddr: p.daddr,
                dport: p.dport,
                dnat: false,
                oif: None,
            };
            if p.new {
                if let Flow::Dnat(port) = self.hook("prerouting", p, &st) {
                    st.daddr = self.table.spec.gateway;
                    st.dport = port;
                    st.dnat = true;
                }
            }
            let local = self.local.contains(&st.daddr) || st.daddr == self.table.spec.gateway;
            let hook = if local { "input" } else { "forward" };
            if !local {
                st.oif = self
                    .sandboxes
                    .iter()
                    .find(|s| s.addr == st.daddr)
                    .map(|s| s.veth.clone());
                st.oif.get_or_insert_with(|| "eth0".into());
            }
            match self.hook(hook, p, &st) {
                Flow::Final(Verdict::Accept) | Flow::Continue | Flow::Return if st.dnat => {
                    Verdict::Redirected(st.dport)
                }
                Flow::Final(v) => v,
                _ => Verdict::Accept,
            }
        }
    }

    pub(crate) fn spec() -> TableSpec {
        TableSpec {
            name: "berth_test".into(),
            veth_prefix: "btestv".into(),
            pool: "10.77.0.0/16".parse().unwrap(),
            gateway: "10.77.0.1".parse().unwrap(),
            ports: EgressPorts {
                dns: 5353,
                http: 8080,
                tls: 8443,
            },
            limits: Limits::default(),
            always_denied: Vec::new(),
            ceiling_direct: Vec::new(),
            ceiling_denied: Vec::new(),
        }
    }

    /// A table for `ceiling` with host address 192.0.2.2 and one sandbox (10.77.0.2 on
    /// btestv2) under `policy`; returns the verdict function's world.
    fn world(
        ceiling: &Ceiling,
        policy: &NetworkPolicy,
    ) -> (Table, Vec<SandboxElements>, Vec<Ipv4Addr>) {
        let host: Ipv4Addr = "192.0.2.2".parse().unwrap();
        let pool: Ipv4Net = "10.77.0.0/16".parse().unwrap();
        let mut spec = spec();
        spec.always_denied = crate::policy::builtin_denied();
        spec.always_denied.push(pool);
        spec.always_denied.push(Ipv4Net::from(host));
        spec.ceiling_direct = ceiling.direct_nets();
        spec.ceiling_denied = ceiling.deny_nets.clone();
        let table = table(&spec);
        let effective = ceiling.apply(policy, &[]);
        let one =
            crate::host::sandbox_elements("btestv2", "10.77.0.2".parse().unwrap(), &effective);
        let other = crate::host::sandbox_elements(
            "btestv3",
            "10.77.0.3".parse().unwrap(),
            &ceiling.apply(&NetworkPolicy::default(), &[]),
        );
        (table, vec![one, other], vec![host])
    }

    fn out(daddr: &str, proto: Proto, dport: u16) -> Packet {
        Packet {
            iif: "btestv2".into(),
            saddr: "10.77.0.2".parse().unwrap(),
            daddr: daddr.parse().unwrap(),
            proto,
            dport,
            new: true,
            ipv6: false,
        }
    }

    fn verdicts(ceiling: &Ceiling, policy: &NetworkPolicy, packets: &[Packet]) -> Vec<Verdict> {
        let (table, sandboxes, local) = world(ceiling, policy);
        let w = World {
            table: &table,
            sandboxes: &sandboxes,
            local,
        };
        packets.iter().map(|p| w.verdict(p)).collect()
    }

    fn e2b(allow_internet: Option<bool>, json: &str) -> NetworkPolicy {
        NetworkPolicy::from_e2b_create(allow_internet, Some(&serde_json::from_str(json).unwrap()))
            .unwrap()
    }

    #[test]
    fn builtin_denies_hold_on_the_generated_rules_for_every_policy() {
        let open_all = e2b(
            None,
            r#"{"allowOut":["0.0.0.0/0","169.254.169.254","10.0.0.0/8","192.0.2.2"]}"#,
        );
        for ceiling in [
            Ceiling::default(),
            Ceiling::parse(&["0.0.0.0/0"], &[] as &[&str]).unwrap(),
        ] {
            for policy in [NetworkPolicy::default(), open_all.clone()] {
                for daddr in [
                    "169.254.169.254",
                    "169.254.0.1",
                    "10.0.0.1",
                    "10.77.0.3",
                    "172.16.5.4",
                    "192.168.0.1",
                    "100.64.0.1",
                    "127.0.0.1",
                    "224.0.0.251",
                    "255.255.255.255",
                    "0.0.0.0",
                ] {
                    for (proto, port) in [(Proto::Tcp, 80), (Proto::Tcp, 22), (Proto::Udp, 123)] {
                        let v = verdicts(&ceiling, &policy, &[out(daddr, proto, port)]);
                        assert!(
                            matches!(v[0], Verdict::Reject | Verdict::Drop),
                            "{daddr}:{port} under {policy:?}: {v:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn host_and_gateway_are_unreachable_except_the_egress_ports() {
        let policy = NetworkPolicy::default();
        let ceiling = Ceiling::default();
        for (daddr, proto, port) in [
            ("192.0.2.2", Proto::Tcp, 3000),
            ("192.0.2.2", Proto::Tcp, 22),
            ("10.77.0.1", Proto::Tcp, 3000),
            ("10.77.0.1", Proto::Tcp, 8080),
            ("10.77.0.1", Proto::Udp, 5353),
        ] {
            let v = verdicts(&ceiling, &policy, &[out(daddr, proto, port)]);
            assert_eq!(v[0], Verdict::Reject, "{daddr}:{port}");
        }
        // DNS to anywhere goes to berth's DNS server.
        for daddr in ["10.77.0.1", "198.18.0.1", "192.0.2.2"] {
            let v = verdicts(&ceiling, &policy, &[out(daddr, Proto::Udp, 53)]);
            assert_eq!(v[0], Verdict::Redirected(5353), "{daddr}");
        }
    }

    #[test]
    fn public_ranges_outside_the_ceiling_are_refused() {
        let ceiling = Ceiling::parse(&["198.18.0.0/24"], &["198.18.0.9"]).unwrap();
        let v = verdicts(
            &ceiling,
            &NetworkPolicy::default(),
            &[
                out("198.18.0.2", Proto::Tcp, 80),
                out("198.18.0.9", Proto::Tcp, 80),
                out("198.18.1.1", Proto::Tcp, 80),
                out("93.184.215.14", Proto::Tcp, 443),
                out("8.8.8.8", Proto::Udp, 443),
            ],
        );
        assert_eq!(
            v,
            [
                Verdict::Accept,
                Verdict::Reject,
                Verdict::Reject,
                Verdict::Reject,
                Verdict::Reject
            ]
        );
    }

    #[test]
    fn sandbox_policy_on_the_rules() {
        let ceiling = Ceiling::default();
        let deny_all_allow_one = e2b(
            None,
            r#"{"allowOut":["198.18.0.2"],"denyOut":["0.0.0.0/0"]}"#,
        );
        let v = verdicts(
            &ceiling,
            &deny_all_allow_one,
            &[
                out("198.18.0.2", Proto::Tcp, 80),
                out("198.18.0.3", Proto::Tcp, 80),
            ],
        );
        assert_eq!(v, [Verdict::Accept, Verdict::Reject]);
        let deny_one = e2b(None, r#"{"denyOut":["198.18.0.3"]}"#);
        let v = verdicts(
            &ceiling,
            &deny_one,
            &[
                out("198.18.0.2", Proto::Tcp, 80),
                out("198.18.0.3", Proto::Tcp, 80),
            ],
        );
        assert_eq!(v, [Verdict::Accept, Verdict::Reject]);
        let none = e2b(Some(false), "{}");
        let v = verdicts(
            &ceiling,
            &none,
            &[
                out("198.18.0.2", Proto::Tcp, 80),
                out("198.18.0.2", Proto::Udp, 53),
            ],
        );
        assert_eq!(v, [Verdict::Reject, Verdict::Reject], "no egress, no DNS");
        let domains = e2b(
            None,
            r#"{"allowOut":["*.example.com","198.18.0.2"],"denyOut":["0.0.0.0/0"]}"#,
        );
        let v = verdicts(
            &ceiling,
            &domains,
            &[
                out("198.18.0.5", Proto::Tcp, 443),
                out("198.18.0.5", Proto::Tcp, 80),
                out("198.18.0.2", Proto::Tcp, 443),
                out("198.18.0.5", Proto::Tcp, 22),
            ],
        );
        assert_eq!(
            v,
            [
                Verdict::Redirected(8443),
                Verdict::Redirected(8080),
                Verdict::Accept,
                Verdict::Reject
            ]
        );
    }

    #[test]
    fn spoofing_ipv6_and_sandbox_to_sandbox_are_dropped() {
        let ceiling = Ceiling::default();
        let policy = NetworkPolicy::default();
        let mut spoofed = out("198.18.0.2", Proto::Tcp, 80);
        spoofed.saddr = "10.77.0.3".parse().unwrap();
        let mut v6 = out("198.18.0.2", Proto::Tcp, 80);
        v6.ipv6 = true;
        // A reply-direction packet to another sandbox's address is still refused: it is
        // in the always-denied pool.
        let mut to_other = out("10.77.0.3", Proto::Tcp, 80);
        to_other.new = false;
        let v = verdicts(&ceiling, &policy, &[spoofed, v6, to_other]);
        assert_eq!(v, [Verdict::Drop, Verdict::Drop, Verdict::Reject]);
    }

    #[test]
    fn established_traffic_is_rechecked_against_the_policy() {
        let ceiling = Ceiling::default();
        let deny = e2b(None, r#"{"denyOut":["198.18.0.2"]}"#);
        let mut established = out("198.18.0.2", Proto::Tcp, 80);
        established.new = false;
        let v = verdicts(&ceiling, &deny, &[established]);
        assert_eq!(v, [Verdict::Reject]);
    }

    #[test]
    fn renders_sets_chains_and_element_batches() {
        let (table, sandboxes, _) = world(
            &Ceiling::default(),
            &e2b(None, r#"{"denyOut":["198.18.0.3"]}"#),
        );
        let text = table.render(&sandboxes);
        assert!(text.starts_with("add table inet berth_test\ndelete table inet berth_test\n"));
        assert!(text.contains("169.254.0.0/16"));
        assert!(text.contains("type nat hook prerouting priority dstnat; policy accept;"));
        assert!(text.contains("iifname \"btestv*\" jump sb_egress"));
        assert!(text.contains("add element inet berth_test denied { 10.77.0.2 . 198.18.0.3/32 }"));
        let add = table.add_sandbox(&sandboxes[0]);
        let remove = table.remove_sandbox(&sandboxes[0]);
        for line in add.lines().filter(|l| l.contains(" element ")) {
            let line = line.replacen("add", "delete", 1);
            if line.contains(" conns ") {
                assert!(!remove.contains(" conns "));
                let own = table.remove_conn_entry(sandboxes[0].addr);
                assert_eq!(line.replace(" ct count over 4096", "") + "\n", own);
            } else if line.contains(" rate_") {
                let key = line.split(" limit rate over ").next().unwrap().to_owned() + " }";
                assert!(remove.contains(&key), "{key}");
            } else {
                assert!(remove.contains(&line), "{line}");
            }
        }
        assert!(add.contains("add element inet berth_test rate_up { 10.77.0.2 limit rate over "));
        assert!(!text.contains(" limit inet "), "no named limit objects");
    }
}
