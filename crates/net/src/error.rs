use std::io;
use std::path::PathBuf;

use ipnet::Ipv4Net;

use crate::policy::PolicyError;

/// Why a host network operation failed. Each names what it was doing to what.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("sandbox pool {cidr}: {reason} (set --sandbox-cidr)")]
    BadPool { cidr: Ipv4Net, reason: String },
    #[error(
        "sandbox pool {cidr} overlaps {with}: pick a --sandbox-cidr no host route or address \
         uses (each berth daemon on a host needs its own)"
    )]
    PoolOverlaps { cidr: Ipv4Net, with: String },
    #[error("sandbox pool {cidr} is full ({sandboxes} sandboxes); use a larger --sandbox-cidr")]
    PoolExhausted { cidr: Ipv4Net, sandboxes: usize },
    #[error("netlink: {op}: {source}")]
    Netlink {
        op: String,
        #[source]
        source: io::Error,
    },
    #[error("network namespace {path}: {op}: {source}")]
    Namespace {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("nftables: {op}: {message} (is the kernel's nf_tables available and are we root?)")]
    Nftables { op: String, message: String },
    #[error("sysctl {path}: {source}")]
    Sysctl {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("network state {path}: {source}")]
    State {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("network record {path} is unreadable: {source}")]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("this runtime has no sandbox networking: configure a network (--sandbox-cidr) to use network policies")]
    Disabled,
    #[error(
        "the checkpoint {images} was made with sandbox networking (its network namespace is \
         not in the images); restore it with networking configured"
    )]
    CheckpointNeedsNetwork { images: PathBuf },
    #[error("sandbox {0} has no network")]
    UnknownSandbox(String),
    #[error("sandbox {0} already has a network")]
    AlreadyAttached(String),
    #[error("{what} thread panicked")]
    ThreadPanicked { what: &'static str },
}

pub(crate) fn netlink(op: impl Into<String>) -> impl FnOnce(io::Error) -> NetError {
    let op = op.into();
    move |source| NetError::Netlink { op, source }
}

pub(crate) fn state(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> NetError {
    let path = path.into();
    move |source| NetError::State { path, source }
}
