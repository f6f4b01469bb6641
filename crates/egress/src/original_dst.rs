//! The address a redirected connection was originally sent to (netfilter's
//! SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST, set by nft `redirect` / `dnat`).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use nix::sys::socket::{getsockopt, sockopt};
use tokio::net::TcpStream;

/// The original destination of an accepted connection. For a connection that was not
/// redirected this is the local address itself (or an error without conntrack).
pub(crate) fn original_dst(stream: &TcpStream) -> std::io::Result<SocketAddr> {
    match stream.local_addr()? {
        SocketAddr::V4(_) => {
            let raw = getsockopt(stream, sockopt::OriginalDst)?;
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(raw.sin_addr.s_addr)),
                u16::from_be(raw.sin_port),
            )))
        }
        SocketAddr::V6(_) => {
            let raw = getsockopt(stream, sockopt::Ip6tOriginalDst)?;
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(raw.sin6_addr.s6_addr),
                u16::from_be(raw.sin6_port),
                raw.sin6_flowinfo,
                raw.sin6_scope_id,
            )))
        }
    }
}
