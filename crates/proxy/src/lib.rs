//! berth's sandbox proxy.
//!
//! Owns: recognising requests meant for a sandbox (by `E2b-Sandbox-Id` /
//! `E2b-Sandbox-Port` headers, by a `<port>-<sandboxId>.<domain>` host, or by the
//! path prefix `/proxy/<sandboxId>/<port>/…`, or — for envd's signed file URLs, which
//! name no sandbox — by the signature itself), enforcing the per-sandbox access
//! tokens and the ban on envd's internal routes, and streaming requests, responses and
//! upgraded (WebSocket) connections between the client and a port in the sandbox.
//!
//! Does not own: sandbox state, tenancy or the runtime. The control plane implements
//! [`SandboxResolver`] to say which sandboxes exist and how to open connections into
//! them; this crate never touches the store or namespaces itself.
//!
//! Mounting: the server keeps one listener and asks [`Proxy::classify`] per request;
//! `Some(_)` goes to [`Proxy::handle`] (or `forward`); otherwise
//! [`SignedFileUrl::from_request`] claims signed `/files` URLs for
//! [`Proxy::forward_signed`]; everything else is the API's.
//!
//! envd's port, the routing and token header names and envd's internal routes come from
//! `berth-envd-proto`, the one place both ends of envd's wire take them from.

#![forbid(unsafe_code)]

mod forward;
mod pool;
mod resolver;
mod signed;
mod stats;
mod target;

pub use forward::{
    BoxError, DirectRequestError, Proxy, ProxyBody, ProxyError, SandboxConnections,
    TRAFFIC_ACCESS_TOKEN_HEADER,
};
pub use resolver::{
    connect_blocking, BoxFuture, PortConnector, ResolveError, Route, SandboxResolver,
};
pub use signed::{SignatureError, SignedFileUrl};
pub use stats::ProxyStats;
pub use target::{
    is_internal_envd_route, Addressing, RoutingConfig, SandboxId, Target, TargetError,
    PATH_PREFIX_SEGMENT,
};
