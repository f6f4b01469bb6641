//! berth-envd-proto: the wire envd speaks, shared by envd (server) and berth's clients.
//!
//! It owns the project's own schema of envd's `process` and `filesystem` packages
//! (`proto/*.proto`, wire-identical to E2B's envd: same packages, services, messages,
//! field names, numbers and types), the Rust types generated from it (prost, plus
//! proto3-JSON serde via pbjson: camelCase names, int64 as strings, bytes as base64,
//! enums by name, `google.protobuf.Timestamp` as RFC 3339 ([`timestamp`]); unknown JSON fields are
//! ignored), the Connect protocol's wire pieces in [`connect`], and every other fact
//! both ends of envd's wire must agree on: its port ([`ENVD_PORT`]) and the version berth
//! reports ([`ENVD_VERSION`]), header names ([`headers`]), RPC paths ([`routes`]) and the
//! JSON bodies of its plain HTTP routes ([`http`]: the `/init` request, the `/files`
//! upload answer, the internal routes the public proxy refuses) and the signature of signed file URLs
//! ([`signature`]). envd, the proxy, the
//! server and `berth-client` take them from here, so none spells them itself. It must not
//! hold any server or client logic: no HTTP stack, no I/O.
//!
//! Why the Connect protocol is written here instead of using the `connectrpc` crate:
//! `connectrpc` (0.4–0.6) generates its own `buffa` message types rather than prost
//! types, its build step shells out to `protoc` or `buf` (neither is on our machines),
//! and envd needs control the generic runtimes do not give: application-level
//! keepalive messages on idle streams, a `Connect-Timeout-Ms` that bounds a process
//! rather than only a stream, and a process that outlives the stream that started it.
//! The protocol subset envd uses (unary, server streaming, client streaming, over
//! HTTP/1.1 and h2c, JSON and binary codecs, no compression) is small: envelopes,
//! error codes and two body shapes.

#![forbid(unsafe_code)]

pub mod connect;
pub mod headers;
pub mod http;
pub mod routes;
pub mod signature;
pub mod timestamp;

/// The port envd listens on inside every sandbox.
pub const ENVD_PORT: u16 = 49983;

/// The envd version berth reports (`envdVersion`) to the SDKs, which gate features on
/// it: stdin control ≥0.3.0, default user ≥0.4.0, close stdin ≥0.5.2, octet-stream
/// uploads ≥0.5.7, file metadata ≥0.6.2, entry info in watch events ≥0.6.3, watching
/// network mounts ≥0.6.4. berth-envd implements all of them.
pub const ENVD_VERSION: &str = "0.6.4";

/// envd's Process service messages (`process` package).
#[allow(clippy::all, missing_docs)]
pub mod process {
    include!(concat!(env!("OUT_DIR"), "/process.rs"));
    include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));
}

/// envd's Filesystem service messages (`filesystem` package).
#[allow(clippy::all, missing_docs)]
pub mod filesystem {
    include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
    include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));
}

/// A stream response message that can carry an idle-stream keepalive event.
///
/// Streams answer `Keepalive-Ping-Interval` with these messages when nothing else was
/// sent for that long, so proxies and clients do not time the stream out.
pub trait KeepAlive {
    /// The message holding only a keepalive event.
    fn keepalive() -> Self;
}

impl KeepAlive for process::StartResponse {
    fn keepalive() -> Self {
        Self {
            event: Some(process::ProcessEvent {
                event: Some(process::process_event::Event::Keepalive(
                    process::process_event::KeepAlive {},
                )),
            }),
        }
    }
}

impl KeepAlive for process::ConnectResponse {
    fn keepalive() -> Self {
        Self {
            event: Some(process::ProcessEvent {
                event: Some(process::process_event::Event::Keepalive(
                    process::process_event::KeepAlive {},
                )),
            }),
        }
    }
}

impl KeepAlive for filesystem::WatchDirResponse {
    fn keepalive() -> Self {
        Self {
            event: Some(filesystem::watch_dir_response::Event::Keepalive(
                filesystem::watch_dir_response::KeepAlive {},
            )),
        }
    }
}
