//! Nodes and placements: which `berth node` processes exist, their capacity and lease,
//! and which node each sandbox, checkpoint, template build and volume lives on.
//!
//! Only a split deployment (`berth api` + `berth node`) writes these tables; `berth up`
//! leaves them empty. A node registers under its name (stable across its restarts) and
//! renews a lease; an API instance that finds a lease lapsed marks the node lost, once
//! (the update that flips `lost` returns the node to exactly one caller), and reports its
//! running sandboxes lost. A placement is written before its object's row, so an object
//! never exists without its node (a placement whose object never came to be is
//! harmless: nothing looks it up).

use std::time::Duration;

use time::OffsetDateTime;

use crate::columns::{now, to_ms, Columns};
use crate::db::{params, Row, Store};
use crate::error::Result;

/// What lives on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacedKind {
    Sandbox,
    /// A runtime checkpoint: a snapshot's, a template's start-command checkpoint.
    Checkpoint,
    /// A template build, and so the template store manifest and layers it wrote.
    Build,
    Volume,
}

impl PlacedKind {
    fn as_str(self) -> &'static str {
        match self {
            PlacedKind::Sandbox => "sandbox",
            PlacedKind::Checkpoint => "checkpoint",
            PlacedKind::Build => "build",
            PlacedKind::Volume => "volume",
        }
    }
}

/// What a node says of itself when it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRegistration {
    /// The node's name, its id (unique in the cluster, the same across restarts).
    pub id: String,
    /// Where API instances reach it (`http://host:port`).
    pub url: String,
    pub cpu_capacity: u32,
    pub memory_capacity_mb: u64,
    pub slots: u32,
}

/// A registered node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub id: String,
    pub url: String,
    pub cpu_capacity: u32,
    pub memory_capacity_mb: u64,
    pub slots: u32,
    /// Takes no new sandboxes (`berth node drain`).
    pub draining: bool,
    /// Its lease lapsed and its running sandboxes were reported lost; it becomes a
    /// member again when it registers anew.
    pub lost: bool,
    /// It is shutting down cleanly: no new sandboxes, but its lease runs on (a restart
    /// within it keeps its sandboxes).
    pub stopping: bool,
    /// When this incarnation of the node registered.
    pub started_at: OffsetDateTime,
    pub lease_until: OffsetDateTime,
}

impl NodeRecord {
    /// Whether new sandboxes may be placed on it at `at`.
    pub fn accepting(&self, at: OffsetDateTime) -> bool {
        !self.draining && !self.lost && !self.stopping && self.lease_until > at
    }
}

/// What a node's sandboxes hold, summed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeUsage {
    /// CPUs and memory of its running sandboxes.
    pub cpu_reserved: u32,
    pub memory_reserved_mb: u64,
    /// Its sandboxes, running or paused.
    pub sandboxes: u32,
}

const NODE_COLUMNS: &str = "id, url, cpu_capacity, memory_capacity_mb, slots, draining, lost, \
                            stopping, started_at_ms, lease_until_ms";

fn node_from_row(row: &Row<'_>) -> Result<NodeRecord> {
    let c = Columns::new(row, "nodes", &["id"])?;
    Ok(NodeRecord {
        id: c.get("id")?,
        url: c.get("url")?,
        cpu_capacity: c.get("cpu_capacity")?,
        memory_capacity_mb: c.get("memory_capacity_mb")?,
        slots: c.get("slots")?,
        draining: c.get("draining")?,
        lost: c.get("lost")?,
        stopping: c.get("stopping")?,
        started_at: c.time("started_at_ms")?,
        lease_until: c.time("lease_until_ms")?,
    })
}

fn lease_end(lease: Duration) -> i64 {
    to_ms(now()) + i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2)
}

impl Store {
    /// Registers node `node` (or a new incarnation of it: a restart), leased for
    /// `lease`. A node that was lost is a member again; one draining stays draining.
    pub fn register_node(&self, node: &NodeRegistration, lease: Duration) -> Result<NodeRecord> {
        let mut conn = self.conn()?;
        conn.execute(
            "INSERT INTO nodes (id, url, cpu_capacity, memory_capacity_mb, slots, draining, lost, \
                                stopping, started_at_ms, lease_until_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?6, ?7, ?8) \
             ON CONFLICT (id) DO UPDATE SET url = excluded.url, \
                 cpu_capacity = excluded.cpu_capacity, \
                 memory_capacity_mb = excluded.memory_capacity_mb, slots = excluded.slots, \
                 lost = excluded.lost, stopping = excluded.stopping, \
                 started_at_ms = excluded.started_at_ms, lease_until_ms = excluded.lease_until_ms",
            params![
                node.id,
                node.url,
                node.cpu_capacity,
                node.memory_capacity_mb,
                node.slots,
                false,
                to_ms(now()),
                lease_end(lease),
            ],
        )?;
        conn.query_opt(
            &format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = ?1"),
            params![node.id],
            node_from_row,
        )?
        .ok_or_else(|| crate::StoreError::NotFound {
            what: "node",
            id: node.id.clone(),
        })
    }

    /// Extends node `id`'s lease. False when it is no longer a member (never
    /// registered, or found lost meanwhile): it must register anew, and reconcile.
    pub fn renew_node_lease(&self, id: &str, lease: Duration) -> Result<bool> {
        let changed = self.conn()?.execute(
            "UPDATE nodes SET lease_until_ms = ?2 WHERE id = ?1 AND lost = ?3",
            params![id, lease_end(lease), false],
        )?;
        Ok(changed == 1)
    }

    /// Every registered node, by id.
    pub fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.conn()?.query_all(
            &format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY id"),
            params![],
            node_from_row,
        )
    }

    /// Node `id`, if registered.
    pub fn node(&self, id: &str) -> Result<Option<NodeRecord>> {
        self.conn()?.query_opt(
            &format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = ?1"),
            params![id],
            node_from_row,
        )
    }

    /// Node `id` is shutting down cleanly: it takes no new sandboxes until it registers
    /// again; its lease is left as it is.
    pub fn mark_node_stopping(&self, id: &str) -> Result<()> {
        self.conn()?.execute(
            "UPDATE nodes SET stopping = ?2 WHERE id = ?1",
            params![id, true],
        )?;
        Ok(())
    }

    /// Starts or stops draining node `id`; false when no such node is registered.
    pub fn set_node_draining(&self, id: &str, draining: bool) -> Result<bool> {
        let changed = self.conn()?.execute(
            "UPDATE nodes SET draining = ?2 WHERE id = ?1",
            params![id, draining],
        )?;
        Ok(changed == 1)
    }

    /// Marks lost every member whose lease ended before `at`, and returns them. Each
    /// node is returned to one caller only, however many API instances ask at once.
    pub fn mark_lapsed_nodes_lost(&self, at: OffsetDateTime) -> Result<Vec<String>> {
        self.conn()?.query_all(
            "UPDATE nodes SET lost = ?1 WHERE lost = ?2 AND lease_until_ms < ?3 RETURNING id",
            params![true, false, to_ms(at)],
            |row| Columns::new(row, "nodes", &["id"])?.get("id"),
        )
    }

    /// Records that `object_id` (of `kind`) lives on `node_id`, replacing any earlier
    /// placement (an object that moved).
    pub fn place(&self, kind: PlacedKind, object_id: &str, node_id: &str) -> Result<()> {
        self.conn()?.execute(
            "INSERT INTO placements (kind, object_id, node_id) VALUES (?1, ?2, ?3) \
             ON CONFLICT (kind, object_id) DO UPDATE SET node_id = excluded.node_id",
            params![kind.as_str(), object_id, node_id],
        )?;
        Ok(())
    }

    /// The node `object_id` lives on, if it was placed.
    pub fn placement(&self, kind: PlacedKind, object_id: &str) -> Result<Option<String>> {
        self.conn()?.query_opt(
            "SELECT node_id FROM placements WHERE kind = ?1 AND object_id = ?2",
            params![kind.as_str(), object_id],
            |row| Columns::new(row, "placements", &["node_id"])?.get("node_id"),
        )
    }

    /// Forgets where `object_id` lived (it is gone).
    pub fn remove_placement(&self, kind: PlacedKind, object_id: &str) -> Result<()> {
        self.conn()?.execute(
            "DELETE FROM placements WHERE kind = ?1 AND object_id = ?2",
            params![kind.as_str(), object_id],
        )?;
        Ok(())
    }

    /// Ids of the objects of `kind` placed on `node_id`.
    pub fn placed_on(&self, kind: PlacedKind, node_id: &str) -> Result<Vec<String>> {
        self.conn()?.query_all(
            "SELECT object_id FROM placements WHERE kind = ?1 AND node_id = ?2 ORDER BY object_id",
            params![kind.as_str(), node_id],
            |row| Columns::new(row, "placements", &["object_id"])?.get("object_id"),
        )
    }

    /// Per node: what its running sandboxes hold, and how many sandboxes (running or
    /// paused) it has. Nodes with none are absent.
    pub fn node_usage(&self) -> Result<Vec<(String, NodeUsage)>> {
        self.conn()?.query_all(
            // SUM of BIGINT is NUMERIC on Postgres: cast back to the one integer type.
            "SELECT p.node_id AS node_id, \
                    CAST(COALESCE(SUM(CASE WHEN s.status = 'running' THEN s.cpu_count ELSE 0 END), 0) \
                         AS BIGINT) AS cpu, \
                    CAST(COALESCE(SUM(CASE WHEN s.status = 'running' THEN s.memory_mb ELSE 0 END), 0) \
                         AS BIGINT) AS memory, \
                    COUNT(*) AS sandboxes \
             FROM placements p JOIN sandboxes s ON s.id = p.object_id \
             WHERE p.kind = 'sandbox' AND s.status IN ('running', 'paused') \
             GROUP BY p.node_id ORDER BY p.node_id",
            params![],
            |row| {
                let c = Columns::new(row, "placements", &["node_id"])?;
                Ok((
                    c.get("node_id")?,
                    NodeUsage {
                        cpu_reserved: c.get("cpu")?,
                        memory_reserved_mb: c.get("memory")?,
                        sandboxes: c.get("sandboxes")?,
                    },
                ))
            },
        )
    }
}
