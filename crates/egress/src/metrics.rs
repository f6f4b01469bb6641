//! Counters, kept as atomics and read as a plain snapshot for later Prometheus export.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::policy::RefuseReason;

/// Which listener a connection arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Tls,
}

#[derive(Debug, Default)]
pub(crate) struct Metrics {
    http_allowed: AtomicU64,
    tls_allowed: AtomicU64,
    refused: [AtomicU64; RefuseReason::ALL.len()],
    bytes_to_upstream: AtomicU64,
    bytes_to_sandbox: AtomicU64,
    dns_forwarded: AtomicU64,
    dns_refused: AtomicU64,
    dns_blocked: AtomicU64,
    dns_failed: AtomicU64,
    requests_injected: AtomicU64,
    tls_terminated: AtomicU64,
}

/// A point-in-time copy of the counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressCounters {
    /// Connections let through on the HTTP (port 80) listener.
    pub http_allowed: u64,
    /// Connections let through on the TLS (port 443) listener.
    pub tls_allowed: u64,
    /// Refused connections (and connections cut later), per reason.
    pub refused: Vec<(RefuseReason, u64)>,
    pub bytes_to_upstream: u64,
    pub bytes_to_sandbox: u64,
    /// DNS queries forwarded upstream.
    pub dns_forwarded: u64,
    /// DNS queries answered REFUSED (unknown source, no internet, malformed).
    pub dns_refused: u64,
    /// DNS queries answered NXDOMAIN because the policy allows no such name.
    pub dns_blocked: u64,
    /// DNS queries answered SERVFAIL because no upstream answered.
    pub dns_failed: u64,
    /// HTTP requests whose headers were set by a header rule.
    pub requests_injected: u64,
    /// TLS connections terminated for a header rule.
    pub tls_terminated: u64,
}

impl EgressCounters {
    pub fn refused(&self, reason: RefuseReason) -> u64 {
        self.refused
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn index(reason: RefuseReason) -> usize {
    RefuseReason::ALL
        .iter()
        .position(|r| *r == reason)
        .expect("every reason is in RefuseReason::ALL")
}

impl Metrics {
    pub(crate) fn allowed(&self, protocol: Protocol) {
        bump(match protocol {
            Protocol::Http => &self.http_allowed,
            Protocol::Tls => &self.tls_allowed,
        });
    }
    pub(crate) fn refused(&self, reason: RefuseReason) {
        bump(&self.refused[index(reason)]);
    }
    pub(crate) fn to_upstream(&self, n: usize) {
        self.bytes_to_upstream
            .fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn to_sandbox(&self, n: usize) {
        self.bytes_to_sandbox.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn dns_forwarded(&self) {
        bump(&self.dns_forwarded);
    }
    pub(crate) fn dns_refused(&self) {
        bump(&self.dns_refused);
    }
    pub(crate) fn dns_blocked(&self) {
        bump(&self.dns_blocked);
    }
    pub(crate) fn dns_failed(&self) {
        bump(&self.dns_failed);
    }
    pub(crate) fn injected(&self) {
        bump(&self.requests_injected);
    }
    pub(crate) fn terminated(&self) {
        bump(&self.tls_terminated);
    }

    pub(crate) fn snapshot(&self) -> EgressCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EgressCounters {
            http_allowed: get(&self.http_allowed),
            tls_allowed: get(&self.tls_allowed),
            refused: RefuseReason::ALL
                .iter()
                .map(|r| (*r, get(&self.refused[index(*r)])))
                .collect(),
            bytes_to_upstream: get(&self.bytes_to_upstream),
            bytes_to_sandbox: get(&self.bytes_to_sandbox),
            dns_forwarded: get(&self.dns_forwarded),
            dns_refused: get(&self.dns_refused),
            dns_blocked: get(&self.dns_blocked),
            dns_failed: get(&self.dns_failed),
            requests_injected: get(&self.requests_injected),
            tls_terminated: get(&self.tls_terminated),
        }
    }
}
