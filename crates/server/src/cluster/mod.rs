//! The server's part in a split deployment: `berth api` instances in front, one
//! `berth node` per machine behind them, one shared database (see `berth-cluster` for
//! the protocol between them).
//!
//! The same server runs in each role ([`Role`]); what differs is which work it does:
//!
//! | | standalone (`berth up`) | node | API |
//! |---|---|---|---|
//! | runtime | the machine's | the machine's | none: every request that needs one is relayed to the node that holds its object ([`api`]) |
//! | store-only routes (lists, keys, events, secrets, …) | served | served (relayed ones) | served |
//! | listener | the public one | internal: every request carries the node token ([`node::guard`]) | the public one |
//! | sandbox proxy | to its sandboxes | the node end of tunnels ([`node::routes`]) | through tunnels to the owning node |
//! | recovery, reaper, pools, metric sampling | all sandboxes | its own sandboxes only | — |
//! | webhook delivery | yes | — | yes, each delivery claimed by one instance |
//! | node leases | — | registers and renews its own | marks lapsed nodes lost, their sandboxes killed |
//!
//! Where objects live is recorded as placements (`berth_store::PlacedKind`): a node
//! writes one before the row of each sandbox, snapshot checkpoint, template build and
//! volume it makes. A node that needs a template or snapshot another node made fetches
//! it from there (layers and checkpoints verified by tree hash, [`node`]).

pub(crate) mod api;
pub(crate) mod node;

use std::time::Duration;

use berth_cluster::NodeToken;
use berth_store::NodeRegistration;

pub use api::NodesRunSandboxes;

/// What this server is in a deployment.
#[derive(Debug, Clone, Default)]
pub enum Role {
    /// `berth up`: the whole cloud in one process.
    #[default]
    Standalone,
    /// `berth node`: runs sandboxes for the API instances.
    Node(NodeRole),
    /// `berth api`: serves clients, runs no sandbox.
    Api(ApiRole),
}

/// A node's identity and terms.
#[derive(Debug, Clone)]
pub struct NodeRole {
    /// Its name, URL and capacity, as registered.
    pub registration: NodeRegistration,
    /// Admitted on every request to the node.
    pub token: NodeToken,
    /// How long a registration or renewal counts; renewed every third of it.
    pub lease: Duration,
}

/// An API instance's terms.
#[derive(Debug, Clone)]
pub struct ApiRole {
    /// Sent on every request to a node.
    pub token: NodeToken,
    /// How often lapsed node leases are looked for.
    pub lease_check: Duration,
}

impl Role {
    pub(crate) fn node(&self) -> Option<&NodeRole> {
        match self {
            Role::Node(node) => Some(node),
            _ => None,
        }
    }

    /// Whether this process runs sandboxes (and so recovery, the reaper, pools).
    pub(crate) fn runs_sandboxes(&self) -> bool {
        !matches!(self, Role::Api(_))
    }

    /// Whether this process delivers webhooks.
    pub(crate) fn delivers_webhooks(&self) -> bool {
        !matches!(self, Role::Node(_))
    }
}
