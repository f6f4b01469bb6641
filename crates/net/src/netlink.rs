//! The few rtnetlink and ctnetlink requests berth makes, synchronously.
//!
//! berth's runtime is synchronous and calls these from whatever thread is creating a
//! sandbox (sometimes one that has just entered a new network namespace), so a blocking
//! socket per namespace fits better than `rtnetlink`'s tokio connection task. The messages
//! are the kernel's fixed headers plus attributes, built and parsed here with a small
//! typed builder; each request asks for an ACK and the kernel's errno comes back as an
//! `io::Error`.

use std::collections::BTreeSet;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};

use crate::sys;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_REPLACE: u16 = 0x100;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;

const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTA_TABLE: u16 = 15;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const RT_TABLE_MAIN: u8 = 254;
const RTPROT_STATIC: u8 = 4;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;
const RTNH_F_ONLINK: u32 = 4;
const NUD_PERMANENT: u16 = 0x80;
const IFF_UP: u32 = 1;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_IP: u16 = 1;
const CTA_IP_V4_SRC: u16 = 1;

/// Attributes (type-length-value, 4-byte aligned) after a fixed header.
#[derive(Default)]
struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    fn header(bytes: &[u8]) -> Self {
        Self {
            buf: bytes.to_vec(),
        }
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) -> &mut Self {
        let len = 4 + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
        self
    }

    fn str(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.attr(kind, &bytes)
    }

    fn u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    fn nest(&mut self, kind: u16, fill: impl FnOnce(&mut Msg)) -> &mut Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        fill(self);
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }
}

/// `struct ifinfomsg`.
fn ifinfomsg(index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}

/// The attributes in `bytes`: (type without flags, payload, whole attribute).
fn attrs(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    std::iter::from_fn(move || {
        if bytes.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([bytes[0], bytes[1]]) as usize;
        let kind = u16::from_ne_bytes([bytes[2], bytes[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > bytes.len() {
            return None;
        }
        let item = (kind, &bytes[4..len], &bytes[..len]);
        bytes = bytes.get((len + 3) & !3..).unwrap_or_default();
        Some(item)
    })
}

/// A link as listed by [`Netlink::links`].
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub index: i32,
    pub name: String,
}

/// A route of the main table, as far as the pool's overlap check cares.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub dst: Ipv4Addr,
    pub prefix_len: u8,
    pub oif: Option<i32>,
}

/// A netlink socket bound in the namespace it was opened in.
pub(crate) struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl Netlink {
    /// rtnetlink in the calling thread's network namespace.
    pub(crate) fn route() -> io::Result<Self> {
        Ok(Self {
            fd: sys::netlink_socket(libc::NETLINK_ROUTE)?,
            seq: 0,
        })
    }

    /// ctnetlink (conntrack) in the calling thread's network namespace.
    pub(crate) fn netfilter() -> io::Result<Self> {
        Ok(Self {
            fd: sys::netlink_socket(libc::NETLINK_NETFILTER)?,
            seq: 0,
        })
    }

    /// Sends one request and returns the payloads of its answers (one for a plain
    /// request with ACK, many for a dump).
    fn call(&mut self, kind: u16, flags: u16, msg: &Msg) -> io::Result<Vec<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut packet = Vec::with_capacity(16 + msg.buf.len());
        packet.extend_from_slice(&((16 + msg.buf.len()) as u32).to_ne_bytes());
        packet.extend_from_slice(&kind.to_ne_bytes());
        packet.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        packet.extend_from_slice(&seq.to_ne_bytes());
        packet.extend_from_slice(&0u32.to_ne_bytes());
        packet.extend_from_slice(&msg.buf);
        sys::send(self.fd.as_fd(), &packet)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut answers = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = sys::recv(self.fd.as_fd(), &mut buf)?;
            let mut data = &buf[..n];
            while data.len() >= 16 {
                let len = u32::from_ne_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
                let kind = u16::from_ne_bytes([data[4], data[5]]);
                let msg_flags = u16::from_ne_bytes([data[6], data[7]]);
                let msg_seq = u32::from_ne_bytes(data[8..12].try_into().expect("4 bytes"));
                if len < 16 || len > data.len() {
                    return Err(io::Error::other("truncated netlink message"));
                }
                let payload = &data[16..len];
                data = data.get((len + 3) & !3..).unwrap_or_default();
                if msg_seq != seq {
                    continue;
                }
                match kind {
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(
                            payload
                                .get(0..4)
                                .ok_or_else(|| io::Error::other("short netlink error"))?
                                .try_into()
                                .expect("4 bytes"),
                        );
                        if errno != 0 {
                            return Err(io::Error::from_raw_os_error(-errno));
                        }
                        return Ok(answers);
                    }
                    NLMSG_DONE => return Ok(answers),
                    _ => {
                        answers.push(payload.to_vec());
                        if !dump && msg_flags & NLM_F_MULTI == 0 && flags & NLM_F_ACK == 0 {
                            return Ok(answers);
                        }
                    }
                }
            }
        }
    }

    fn request(&mut self, kind: u16, flags: u16, msg: &Msg) -> io::Result<()> {
        self.call(kind, flags | NLM_F_ACK, msg).map(drop)
    }

    /// Creates a veth pair: `name` here, `peer` in the namespace `peer_ns` (None: here).
    pub(crate) fn add_veth(
        &mut self,
        name: &str,
        mac: [u8; 6],
        peer: &str,
        peer_mac: [u8; 6],
        peer_ns: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let mut msg = Msg::header(&ifinfomsg(0, 0, 0));
        msg.str(IFLA_IFNAME, name).attr(IFLA_ADDRESS, &mac);
        msg.nest(IFLA_LINKINFO, |m| {
            m.str(IFLA_INFO_KIND, "veth");
            m.nest(IFLA_INFO_DATA, |m| {
                m.nest(VETH_INFO_PEER, |m| {
                    m.raw(&ifinfomsg(0, 0, 0));
                    m.str(IFLA_IFNAME, peer).attr(IFLA_ADDRESS, &peer_mac);
                    if let Some(ns) = peer_ns {
                        m.u32(IFLA_NET_NS_FD, ns.as_raw_fd() as u32);
                    }
                });
            });
        });
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &msg)
    }

    /// The index of link `name`, None if there is none.
    pub(crate) fn index(&mut self, name: &str) -> io::Result<Option<i32>> {
        let mut msg = Msg::header(&ifinfomsg(0, 0, 0));
        msg.str(IFLA_IFNAME, name);
        match self.call(RTM_GETLINK, 0, &msg) {
            Ok(answers) => Ok(answers
                .first()
                .and_then(|a| a.get(4..8))
                .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn set_up(&mut self, index: i32) -> io::Result<()> {
        let msg = Msg::header(&ifinfomsg(index, IFF_UP, IFF_UP));
        self.request(RTM_NEWLINK, 0, &msg)
    }

    /// Deletes link `name` (a veth takes its peer along); Ok when there is none.
    pub(crate) fn delete_link(&mut self, name: &str) -> io::Result<()> {
        let mut msg = Msg::header(&ifinfomsg(0, 0, 0));
        msg.str(IFLA_IFNAME, name);
        match self.request(RTM_DELLINK, 0, &msg) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
            other => other,
        }
    }

    pub(crate) fn links(&mut self) -> io::Result<Vec<Link>> {
        let msg = Msg::header(&ifinfomsg(0, 0, 0));
        let mut links = Vec::new();
        for answer in self.call(RTM_GETLINK, NLM_F_DUMP, &msg)? {
            let Some(index) = answer.get(4..8) else {
                continue;
            };
            let index = i32::from_ne_bytes(index.try_into().expect("4 bytes"));
            let name = attrs(answer.get(16..).unwrap_or_default())
                .find(|(kind, _, _)| *kind == IFLA_IFNAME)
                .map(|(_, v, _)| {
                    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default())
                        .into_owned()
                });
            if let Some(name) = name {
                links.push(Link { index, name });
            }
        }
        Ok(links)
    }

    /// Adds `addr/prefix_len` to link `index`.
    pub(crate) fn add_address(
        &mut self,
        index: i32,
        addr: Ipv4Addr,
        prefix_len: u8,
    ) -> io::Result<()> {
        let mut h = [0u8; 8];
        h[0] = libc::AF_INET as u8;
        h[1] = prefix_len;
        h[3] = RT_SCOPE_UNIVERSE;
        h[4..8].copy_from_slice(&(index as u32).to_ne_bytes());
        let mut msg = Msg::header(&h);
        msg.attr(IFA_LOCAL, &addr.octets())
            .attr(IFA_ADDRESS, &addr.octets());
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, &msg)
    }

    /// Every IPv4 address of this namespace, with its link's index.
    pub(crate) fn addresses(&mut self) -> io::Result<Vec<(i32, Ipv4Addr)>> {
        let mut h = [0u8; 8];
        h[0] = libc::AF_INET as u8;
        let msg = Msg::header(&h);
        let mut found = Vec::new();
        for answer in self.call(RTM_GETADDR, NLM_F_DUMP, &msg)? {
            if answer.len() < 8 || answer[0] != libc::AF_INET as u8 {
                continue;
            }
            let index = u32::from_ne_bytes(answer[4..8].try_into().expect("4 bytes")) as i32;
            for (kind, value, _) in attrs(answer.get(8..).unwrap_or_default()) {
                if kind == IFA_LOCAL {
                    if let Ok(octets) = <[u8; 4]>::try_from(value) {
                        found.push((index, Ipv4Addr::from(octets)));
                    }
                }
            }
        }
        Ok(found)
    }

    /// A main-table route to `dst/prefix_len` out of link `oif`: via `gateway` (on-link)
    /// or direct (scope link), with preferred source `src`.
    pub(crate) fn add_route(
        &mut self,
        dst: Ipv4Addr,
        prefix_len: u8,
        oif: i32,
        gateway: Option<Ipv4Addr>,
        src: Option<Ipv4Addr>,
    ) -> io::Result<()> {
        let mut h = [0u8; 12];
        h[0] = libc::AF_INET as u8;
        h[1] = prefix_len;
        h[4] = RT_TABLE_MAIN;
        h[5] = RTPROT_STATIC;
        h[6] = if gateway.is_some() {
            RT_SCOPE_UNIVERSE
        } else {
            RT_SCOPE_LINK
        };
        h[7] = RTN_UNICAST;
        if gateway.is_some() {
            h[8..12].copy_from_slice(&RTNH_F_ONLINK.to_ne_bytes());
        }
        let mut msg = Msg::header(&h);
        if prefix_len > 0 {
            msg.attr(RTA_DST, &dst.octets());
        }
        msg.u32(RTA_OIF, oif as u32);
        if let Some(gateway) = gateway {
            msg.attr(RTA_GATEWAY, &gateway.octets());
        }
        if let Some(src) = src {
            msg.attr(RTA_PREFSRC, &src.octets());
        }
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, &msg)
    }

    /// Every IPv4 route of the main table.
    pub(crate) fn routes(&mut self) -> io::Result<Vec<Route>> {
        let mut h = [0u8; 12];
        h[0] = libc::AF_INET as u8;
        let msg = Msg::header(&h);
        let mut found = Vec::new();
        for answer in self.call(RTM_GETROUTE, NLM_F_DUMP, &msg)? {
            if answer.len() < 12 || answer[0] != libc::AF_INET as u8 {
                continue;
            }
            let mut table = u32::from(answer[4]);
            let mut route = Route {
                dst: Ipv4Addr::UNSPECIFIED,
                prefix_len: answer[1],
                oif: None,
            };
            for (kind, value, _) in attrs(&answer[12..]) {
                match (kind, value.len()) {
                    (RTA_DST, 4) => {
                        route.dst = Ipv4Addr::from(<[u8; 4]>::try_from(value).expect("4 bytes"))
                    }
                    (RTA_OIF, 4) => {
                        route.oif = Some(i32::from_ne_bytes(value.try_into().expect("4 bytes")))
                    }
                    (RTA_TABLE, 4) => {
                        table = u32::from_ne_bytes(value.try_into().expect("4 bytes"))
                    }
                    _ => {}
                }
            }
            if table == u32::from(RT_TABLE_MAIN) {
                found.push(route);
            }
        }
        Ok(found)
    }

    /// A permanent neighbour entry: `addr` is at `mac` on link `index` (no ARP needed).
    pub(crate) fn add_neighbour(
        &mut self,
        index: i32,
        addr: Ipv4Addr,
        mac: [u8; 6],
    ) -> io::Result<()> {
        let mut h = [0u8; 12];
        h[0] = libc::AF_INET as u8;
        h[4..8].copy_from_slice(&index.to_ne_bytes());
        h[8..10].copy_from_slice(&NUD_PERMANENT.to_ne_bytes());
        let mut msg = Msg::header(&h);
        msg.attr(NDA_DST, &addr.octets()).attr(NDA_LLADDR, &mac);
        self.request(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, &msg)
    }

    /// Deletes every conntrack entry whose original source is `addr`; returns how many.
    pub(crate) fn flush_conntrack_from(&mut self, addr: Ipv4Addr) -> io::Result<usize> {
        self.flush_conntrack_from_any(&BTreeSet::from([addr]))
    }

    /// Deletes every conntrack entry whose original source is one of `addrs`; returns
    /// how many. One dump, whatever the number of addresses: the dump walks the kernel's
    /// whole conntrack hash table (every bucket, every namespace's entries), which is
    /// what it costs, not the entries found.
    pub(crate) fn flush_conntrack_from_any(
        &mut self,
        addrs: &BTreeSet<Ipv4Addr>,
    ) -> io::Result<usize> {
        if addrs.is_empty() {
            return Ok(0);
        }
        let nfgen = [libc::AF_INET as u8, 0, 0, 0];
        let get = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
        let delete = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE;
        let entries = self.call(get, NLM_F_DUMP, &Msg::header(&nfgen))?;
        let mut tuples = Vec::new();
        for entry in &entries {
            for (kind, value, whole) in attrs(entry.get(4..).unwrap_or_default()) {
                if kind != CTA_TUPLE_ORIG {
                    continue;
                }
                let src =
                    attrs(value)
                        .find(|(k, _, _)| *k == CTA_TUPLE_IP)
                        .and_then(|(_, ip, _)| {
                            attrs(ip)
                                .find(|(k, _, _)| *k == CTA_IP_V4_SRC)
                                .and_then(|(_, v, _)| <[u8; 4]>::try_from(v).ok())
                        });
                if src.is_some_and(|src| addrs.contains(&Ipv4Addr::from(src))) {
                    tuples.push(whole.to_vec());
                }
            }
        }
        let mut deleted = 0;
        for tuple in tuples {
            let mut msg = Msg::header(&nfgen);
            msg.raw(&tuple);
            match self.request(delete, 0, &msg) {
                Ok(()) => deleted += 1,
                // Gone meanwhile (expired, or its other direction's entry went first).
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    /// Counts conntrack entries whose original source is `addr`.
    pub(crate) fn conntrack_count_from(&mut self, addr: Ipv4Addr) -> io::Result<usize> {
        let nfgen = [libc::AF_INET as u8, 0, 0, 0];
        let get = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
        let entries = self.call(get, NLM_F_DUMP, &Msg::header(&nfgen))?;
        Ok(entries
            .iter()
            .filter(|entry| {
                attrs(entry.get(4..).unwrap_or_default()).any(|(kind, value, _)| {
                    kind == CTA_TUPLE_ORIG
                        && attrs(value).any(|(k, ip, _)| {
                            k == CTA_TUPLE_IP
                                && attrs(ip)
                                    .any(|(k, v, _)| k == CTA_IP_V4_SRC && v == addr.octets())
                        })
                })
            })
            .count())
    }
}
