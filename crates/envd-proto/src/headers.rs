//! Header names of envd's wire, lower case (HTTP/2 requires it; HTTP/1.1 matches
//! case-insensitively), as `http::HeaderName::from_static` accepts them.

/// The access token set at `/init`; every envd route but `/health` and `/files` (which
/// also accept a URL signature) needs it once set. The public proxy checks it too.
pub const ACCESS_TOKEN: &str = "x-access-token";

/// Names the sandbox when every sandbox shares one URL (the SDKs' `E2B_SANDBOX_URL`).
pub const SANDBOX_ID: &str = "e2b-sandbox-id";

/// Names the port inside the sandbox beside [`SANDBOX_ID`] ([`crate::ENVD_PORT`] for envd).
pub const SANDBOX_PORT: &str = "e2b-sandbox-port";

/// Bounds a Connect call, in milliseconds; on `Process/Start` it bounds the process
/// while its stream is attached (see [`crate::connect::parse_timeout_ms`]).
pub const CONNECT_TIMEOUT_MS: &str = "connect-timeout-ms";

/// The Connect protocol version a client speaks (`1`).
pub const CONNECT_PROTOCOL_VERSION: &str = "connect-protocol-version";

/// Asks a server stream for keepalive messages after this many idle seconds (the SDKs
/// send 50).
pub const KEEPALIVE_PING_INTERVAL: &str = "keepalive-ping-interval";
