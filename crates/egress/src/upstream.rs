//! The upstream resolvers: forwarding sandbox queries, and resolving the names the
//! proxy dials. One fresh socket per query (random source port) and a random query id,
//! so an off-path attacker cannot easily forge answers; TCP when UDP is truncated.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::error::StartError;

/// Largest UDP answer accepted from upstream (EDNS payloads stay below it).
const MAX_UDP: usize = 4096;

#[derive(Debug)]
pub(crate) struct Upstreams {
    servers: Vec<SocketAddr>,
    timeout: Duration,
}

/// The nameservers of a resolv.conf, on port 53.
pub fn nameservers_from_resolv_conf(path: &Path) -> Result<Vec<SocketAddr>, StartError> {
    let text = std::fs::read_to_string(path).map_err(|source| StartError::ResolvConf {
        path: path.to_path_buf(),
        source,
    })?;
    let servers: Vec<SocketAddr> = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect();
    if servers.is_empty() {
        return Err(StartError::NoUpstreamDns {
            path: path.to_path_buf(),
        });
    }
    Ok(servers)
}

impl Upstreams {
    pub(crate) fn new(servers: Vec<SocketAddr>, timeout: Duration) -> Self {
        Upstreams { servers, timeout }
    }

    /// Sends a wire-format query to each upstream in turn; the first answer wins.
    /// `None` when none answered in time.
    pub(crate) async fn forward(&self, query: &[u8]) -> Option<Vec<u8>> {
        if query.len() < 12 {
            return None;
        }
        let client_id = [query[0], query[1]];
        let our_id: [u8; 2] = rand::random();
        let mut query = query.to_vec();
        query[..2].copy_from_slice(&our_id);
        for server in &self.servers {
            let answer =
                tokio::time::timeout(self.timeout, exchange(*server, &query, our_id)).await;
            if let Ok(Ok(mut answer)) = answer {
                answer[..2].copy_from_slice(&client_id);
                return Some(answer);
            }
        }
        None
    }

    /// The A and AAAA addresses of `name` (IPv4 first).
    pub(crate) async fn resolve(&self, name: &str) -> Vec<IpAddr> {
        let (v4, v6) = tokio::join!(
            self.lookup(name, RecordType::A),
            self.lookup(name, RecordType::AAAA)
        );
        v4.into_iter().chain(v6).collect()
    }

    async fn lookup(&self, name: &str, record_type: RecordType) -> Vec<IpAddr> {
        let Ok(mut fqdn) = Name::from_ascii(name) else {
            return Vec::new();
        };
        fqdn.set_fqdn(true);
        let mut message = Message::query();
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(fqdn, record_type));
        let Ok(bytes) = message.to_vec() else {
            return Vec::new();
        };
        let Some(answer) = self.forward(&bytes).await else {
            return Vec::new();
        };
        let Ok(answer) = Message::from_vec(&answer) else {
            return Vec::new();
        };
        answer
            .answers
            .iter()
            .filter_map(|record| match &record.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(aaaa) => Some(IpAddr::V6(aaaa.0)),
                _ => None,
            })
            .collect()
    }
}

async fn exchange(server: SocketAddr, query: &[u8], id: [u8; 2]) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(server).await?;
    socket.send(query).await?;
    let mut buf = vec![0u8; MAX_UDP];
    loop {
        let n = socket.recv(&mut buf).await?;
        let answer = &buf[..n];
        // A reply must carry our id and the QR bit; anything else is ignored.
        if n >= 12 && answer[..2] == id && answer[2] & 0x80 != 0 {
            let truncated = answer[2] & 0x02 != 0;
            if truncated {
                return exchange_tcp(server, query, id).await;
            }
            return Ok(answer.to_vec());
        }
    }
}

async fn exchange_tcp(server: SocketAddr, query: &[u8], id: [u8; 2]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(server).await?;
    let len = u16::try_from(query.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(query);
    stream.write_all(&framed).await?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut answer).await?;
    if answer.len() < 12 || answer[..2] != id {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_nameservers() {
        let dir = std::env::temp_dir().join(format!("berth-egress-resolv-{}", std::process::id()));
        std::fs::write(
            &dir,
            "# c\nsearch x\nnameserver 198.18.0.53\nnameserver fe80::1%eth0\noptions ndots:1\n",
        )
        .unwrap();
        let servers = nameservers_from_resolv_conf(&dir).unwrap();
        std::fs::write(&dir, "search x\n").unwrap();
        let empty = nameservers_from_resolv_conf(&dir);
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(
            servers,
            [
                "198.18.0.53:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
        assert!(matches!(empty, Err(StartError::NoUpstreamDns { .. })));
    }
}
