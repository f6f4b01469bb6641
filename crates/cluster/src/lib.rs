//! berth-cluster: what lets several berth processes act as one cloud.
//!
//! `berth up` is one process that does everything. Split, the same work is done by
//! `berth api` instances (stateless, any number, behind a load balancer: REST, auth, the
//! sandbox proxy's front, agent tools, dashboard) and one `berth node` per machine (the
//! runtime, its sandboxes, checkpoints and template layers), all sharing one database.
//! Every sandbox, snapshot, build and volume lives on one node, recorded in the database
//! (`placements`); whatever needs the runtime for it is done on that node.
//!
//! This crate owns the protocol between the two roles and nothing else:
//! - [`token`]: the shared secret every API → node request carries (nodes refuse
//!   anything without it, so a node's port is useless to whoever reaches it by accident);
//! - [`tunnel`]: a byte stream from an API instance to a port inside a sandbox on a node
//!   (an HTTP/1.1 upgrade on the node's listener, spliced by the node to
//!   `Runtime::connect`), which the API's sandbox proxy uses exactly like a local
//!   connection;
//! - [`forward`]: relaying a whole API request to a node and its answer back, streamed
//!   both ways;
//! - [`placement`]: choosing the node for a new sandbox from facts (a pure function).
//!
//! It must not touch the database, the runtime or the E2B API's rules: the server gathers
//! facts and calls in; this crate moves bytes and decides placement.

#![forbid(unsafe_code)]

pub mod forward;
pub mod placement;
pub mod token;
pub mod tunnel;

pub use forward::{ForwardError, Forwarder};
pub use placement::{place, NodeFacts, PlacementError, Request as PlacementRequest};
pub use token::{NodeToken, TokenError, NODE_TOKEN_HEADER};
pub use tunnel::{NodeAddr, NodeAddrError, TunnelError};
