//! The DNS server sandboxes use (on the gateway address, UDP and TCP).
//!
//! Per query: the source address picks the policy. No policy (unknown source) or no
//! internet → REFUSED, so nothing leaves the host. A restricted policy (denyOut covers
//! every address) forwards only names an allowed domain pattern matches and answers
//! NXDOMAIN for the rest, so no data leaves by queries for arbitrary names; an
//! unrestricted policy forwards everything. Answers come from the configured upstreams.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::policy::{normalize_hostname, PolicySource};
use crate::upstream::Upstreams;

/// Queries in flight at once across all sandboxes; more wait.
const MAX_IN_FLIGHT: usize = 512;
const MAX_TCP_QUERIES_PER_CONNECTION: usize = 64;

pub(crate) struct DnsServer {
    pub(crate) policies: Arc<dyn PolicySource>,
    pub(crate) upstreams: Arc<Upstreams>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) tcp_idle: std::time::Duration,
}

impl DnsServer {
    /// The answer to send for one query from `source`; `None` drops it silently
    /// (it was not a query at all).
    pub(crate) async fn answer(&self, source: SocketAddr, query: &[u8]) -> Option<Vec<u8>> {
        let Ok(message) = Message::from_vec(query) else {
            self.metrics.dns_refused();
            // Answer FORMERR only when the header at least parses as a query.
            return (query.len() >= 12 && query[2] & 0x80 == 0).then(|| {
                error_reply(
                    u16::from_be_bytes([query[0], query[1]]),
                    None,
                    ResponseCode::FormErr,
                )
            });
        };
        if message.metadata.message_type != MessageType::Query {
            return None;
        }
        let refuse = |code| Some(error_reply(message.metadata.id, Some(&message), code));
        let Some(policy) = self.policies.lookup(source.ip().to_canonical()) else {
            self.metrics.dns_refused();
            return refuse(ResponseCode::Refused);
        };
        if !policy.internet {
            self.metrics.dns_refused();
            return refuse(ResponseCode::Refused);
        }
        if message.metadata.op_code != OpCode::Query || message.queries.len() != 1 {
            self.metrics.dns_refused();
            return refuse(ResponseCode::Refused);
        }
        let qname = message.queries[0].name().to_ascii();
        let allowed = normalize_hostname(&qname).is_some_and(|name| policy.resolvable(&name));
        if !allowed {
            self.metrics.dns_blocked();
            return refuse(ResponseCode::NXDomain);
        }
        match self.upstreams.forward(query).await {
            Some(answer) => {
                self.metrics.dns_forwarded();
                Some(answer)
            }
            None => {
                self.metrics.dns_failed();
                refuse(ResponseCode::ServFail)
            }
        }
    }

    pub(crate) async fn serve_udp(
        self: Arc<Self>,
        socket: UdpSocket,
        stop: CancellationToken,
        tasks: TaskTracker,
    ) {
        let socket = Arc::new(socket);
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let mut buf = vec![0u8; 4096];
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => return,
                r = socket.recv_from(&mut buf) => r,
            };
            let Ok((n, source)) = received else { continue };
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let (server, socket, query) = (self.clone(), socket.clone(), buf[..n].to_vec());
            tasks.spawn(async move {
                let _permit = permit;
                if let Some(mut answer) = server.answer(source, &query).await {
                    truncate_for_udp(&mut answer, &query);
                    let _ = socket.send_to(&answer, source).await;
                }
            });
        }
    }

    pub(crate) async fn serve_tcp(
        self: Arc<Self>,
        listener: TcpListener,
        stop: CancellationToken,
        tasks: TaskTracker,
    ) {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                r = listener.accept() => r,
            };
            let Ok((stream, source)) = accepted else {
                continue;
            };
            let (server, stop) = (self.clone(), stop.clone());
            tasks.spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = server.serve_tcp_connection(stream, source) => {}
                }
            });
        }
    }

    async fn serve_tcp_connection(&self, mut stream: TcpStream, source: SocketAddr) {
        for _ in 0..MAX_TCP_QUERIES_PER_CONNECTION {
            let mut len = [0u8; 2];
            let read = tokio::time::timeout(self.tcp_idle, stream.read_exact(&mut len)).await;
            if !matches!(read, Ok(Ok(_))) {
                return;
            }
            let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
            if !matches!(
                tokio::time::timeout(self.tcp_idle, stream.read_exact(&mut query)).await,
                Ok(Ok(_))
            ) {
                return;
            }
            let Some(answer) = self.answer(source, &query).await else {
                return;
            };
            let Ok(len) = u16::try_from(answer.len()) else {
                return;
            };
            let mut framed = len.to_be_bytes().to_vec();
            framed.extend_from_slice(&answer);
            if stream.write_all(&framed).await.is_err() {
                return;
            }
        }
    }
}

fn error_reply(id: u16, query: Option<&Message>, code: ResponseCode) -> Vec<u8> {
    let mut reply = Message::error_msg(id, OpCode::Query, code);
    if let Some(query) = query {
        reply.metadata.op_code = query.metadata.op_code;
        reply.metadata.recursion_desired = query.metadata.recursion_desired;
        reply.add_queries(query.queries.iter().cloned());
    }
    reply.metadata.recursion_available = true;
    reply
        .to_vec()
        .expect("an error reply with the query's own questions always encodes")
}

/// Classic DNS over UDP allows 512 bytes unless the query advertised more with EDNS;
/// a longer answer is cut to its header with TC set, so the client retries over TCP.
fn truncate_for_udp(answer: &mut Vec<u8>, query: &[u8]) {
    let limit = Message::from_vec(query)
        .ok()
        .and_then(|q| q.edns.map(|e| usize::from(e.max_payload())))
        .unwrap_or(512)
        .max(512);
    if answer.len() > limit {
        if let Ok(mut message) = Message::from_vec(answer) {
            message.answers.clear();
            message.authorities.clear();
            message.additionals.clear();
            message.metadata.truncation = true;
            if let Ok(bytes) = message.to_vec() {
                *answer = bytes;
            }
        }
    }
}
