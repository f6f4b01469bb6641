//! Snapshots: a sandbox's processes and files checkpointed under a per-team name.

use time::OffsetDateTime;

use crate::columns::{string_map_json, to_ms, Columns};
use crate::cursor::{self, Listing, Position};
use crate::db::{params, Bindings, Conn, Row, Store};
use crate::error::{Result, StoreError};

/// A snapshot: a sandbox's processes and files checkpointed under a name, usable as a
/// template id.
#[derive(Debug, Clone)]
pub struct SnapshotRecord {
    pub id: String,
    pub team_id: String,
    /// Unique per team; the name `templateID` refers to.
    pub name: String,
    pub source_sandbox_id: String,
    /// Template the source was created from.
    pub template_id: String,
    pub build_id: String,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    /// The source's env vars (its envd holds them; new sandboxes start with them).
    pub env_vars: berth_api::StringMap,
    /// The token the checkpointed envd accepts (needed to re-initialise it).
    pub envd_access_token: Option<String>,
    /// The runtime's id of the snapshot's checkpoint (rows from before schema 4 hold
    /// its directory, whose last component is the id).
    pub checkpoint_id: String,
    pub size_bytes: u64,
    pub created_at: OffsetDateTime,
    /// Processes continue from the snapshot's memory; false: only its files are used
    /// (new sandboxes boot afresh on them).
    pub memory: bool,
    /// The source's network policy (see `SandboxRecord::network`), inherited by
    /// sandboxes started from the snapshot.
    pub network: Option<serde_json::Value>,
    /// The source's volume mounts, which sandboxes started from the snapshot mount too.
    pub volume_mounts: Vec<crate::VolumeMountRecord>,
}

const SNAPSHOT_COLUMNS: &str = "id, team_id, name, source_sandbox_id, template_id, build_id, \
     cpu_count, memory_mb, disk_size_mb, env_vars, envd_access_token, checkpoint_id, size_bytes, \
     created_at_ms, memory, network, volume_mounts";

fn snapshot_from_row(row: &Row<'_>) -> Result<SnapshotRecord> {
    let c = Columns::new(row, "snapshots", &["id"])?;
    Ok(SnapshotRecord {
        id: c.get("id")?,
        team_id: c.get("team_id")?,
        name: c.get("name")?,
        source_sandbox_id: c.get("source_sandbox_id")?,
        template_id: c.get("template_id")?,
        build_id: c.get("build_id")?,
        cpu_count: c.get("cpu_count")?,
        memory_mb: c.get("memory_mb")?,
        disk_size_mb: c.get("disk_size_mb")?,
        env_vars: c.json("env_vars")?,
        envd_access_token: c.get("envd_access_token")?,
        checkpoint_id: c.get("checkpoint_id")?,
        size_bytes: c.get::<i64>("size_bytes")? as u64,
        created_at: c.time("created_at_ms")?,
        memory: c.get("memory")?,
        network: c.json_opt("network")?,
        volume_mounts: c.json("volume_mounts")?,
    })
}

fn snapshot_by_name_or_id(
    conn: &mut Conn<'_>,
    team_id: &str,
    name_or_id: &str,
) -> Result<Option<SnapshotRecord>> {
    conn.query_opt(
        &format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM snapshots \
             WHERE team_id = ?1 AND (name = ?2 OR id = ?2)"
        ),
        params![team_id, name_or_id],
        snapshot_from_row,
    )
}

impl Store {
    /// Record `snapshot`; a snapshot of the same team and name is replaced, and its
    /// checkpoint id returned so the caller can delete it.
    pub fn put_snapshot(&self, snapshot: &SnapshotRecord) -> Result<Option<String>> {
        self.write(|tx| {
            let old: Option<String> = tx.query_opt(
                "SELECT id, checkpoint_id FROM snapshots WHERE team_id = ?1 AND name = ?2",
                params![snapshot.team_id, snapshot.name],
                |row| Columns::new(row, "snapshots", &["id"])?.get("checkpoint_id"),
            )?;
            tx.execute(
                "DELETE FROM snapshots WHERE team_id = ?1 AND name = ?2",
                params![snapshot.team_id, snapshot.name],
            )?;
            tx.execute(
                &format!(
                    "INSERT INTO snapshots ({SNAPSHOT_COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
                ),
                params![
                    snapshot.id,
                    snapshot.team_id,
                    snapshot.name,
                    snapshot.source_sandbox_id,
                    snapshot.template_id,
                    snapshot.build_id,
                    snapshot.cpu_count,
                    snapshot.memory_mb,
                    snapshot.disk_size_mb,
                    string_map_json(&snapshot.env_vars),
                    snapshot.envd_access_token,
                    snapshot.checkpoint_id,
                    snapshot.size_bytes as i64,
                    to_ms(snapshot.created_at),
                    snapshot.memory,
                    snapshot.network.as_ref().map(|v| v.to_string()),
                    serde_json::to_string(&snapshot.volume_mounts).map_err(|err| {
                        StoreError::Encode {
                            what: "volume mounts",
                            source: err,
                        }
                    })?,
                ],
            )?;
            Ok(old)
        })
    }

    /// A snapshot of `team_id` by name or id.
    pub fn snapshot(&self, team_id: &str, name_or_id: &str) -> Result<Option<SnapshotRecord>> {
        snapshot_by_name_or_id(&mut self.conn()?, team_id, name_or_id)
    }

    /// Snapshots of `team_id`, newest first (then by id), optionally of one source
    /// sandbox or with one name or id; at most `limit` after the cursor `next_token` of a
    /// previous page. Returns the page and the next page's cursor.
    pub fn list_snapshots(
        &self,
        team_id: &str,
        source_sandbox_id: Option<&str>,
        name_or_id: Option<&str>,
        limit: usize,
        next_token: Option<&str>,
    ) -> Result<(Vec<SnapshotRecord>, Option<String>)> {
        let listing = Listing::Snapshots;
        let mut bindings = Bindings::default();
        let mut conditions = vec![format!("team_id = {}", bindings.bind(team_id.to_string()))];
        if let Some(source) = source_sandbox_id {
            conditions.push(format!(
                "source_sandbox_id = {}",
                bindings.bind(source.to_string())
            ));
        }
        if let Some(name_or_id) = name_or_id {
            let param = bindings.bind(name_or_id.to_string());
            conditions.push(format!("(name = {param} OR id = {param})"));
        }
        if let Some(token) = next_token {
            let after = cursor::decode(listing, token)?;
            let ms = bindings.bind(after.ms);
            let id = bindings.bind(after.id);
            conditions.push(cursor::after(listing, "created_at_ms", "id", &ms, &id));
        }
        let sql = format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE {} {} LIMIT {}",
            conditions.join(" AND "),
            cursor::order_by(listing, "created_at_ms", "id"),
            bindings.bind(cursor::fetch_limit(limit)),
        );
        let rows = self
            .conn()?
            .query_all(&sql, bindings.params(), snapshot_from_row)?;
        Ok(cursor::paginate(listing, rows, limit, |s| Position {
            ms: to_ms(s.created_at),
            id: s.id.clone(),
        }))
    }

    /// Delete a snapshot of `team_id` by name or id; returns it (its checkpoint is the
    /// caller's to delete).
    pub fn delete_snapshot(&self, team_id: &str, name_or_id: &str) -> Result<SnapshotRecord> {
        self.write(|tx| {
            let snapshot = snapshot_by_name_or_id(tx, team_id, name_or_id)?.ok_or_else(|| {
                StoreError::NotFound {
                    what: "snapshot",
                    id: name_or_id.to_string(),
                }
            })?;
            tx.execute("DELETE FROM snapshots WHERE id = ?1", params![&snapshot.id])?;
            Ok(snapshot)
        })
    }

    /// Every snapshot of every team, oldest first (for retention).
    pub fn all_snapshots(&self) -> Result<Vec<SnapshotRecord>> {
        self.conn()?.query_all(
            &format!("SELECT {SNAPSHOT_COLUMNS} FROM snapshots ORDER BY created_at_ms, id"),
            params![],
            snapshot_from_row,
        )
    }

    /// Bytes of `team_id`'s snapshots, leaving out the one named `except` (the one a new
    /// snapshot of that name replaces).
    pub fn snapshot_storage(&self, team_id: &str, except: Option<&str>) -> Result<u64> {
        let bytes = self.conn()?.query_count(
            "SELECT CAST(coalesce(SUM(size_bytes), 0) AS BIGINT) AS n FROM snapshots \
             WHERE team_id = ?1 AND (CAST(?2 AS TEXT) IS NULL OR name <> ?2)",
            params![team_id, except],
        )?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    /// Every snapshot's checkpoint id (recovery keeps these, deletes the rest).
    pub fn snapshot_checkpoints(&self) -> Result<Vec<String>> {
        self.conn()?.query_all(
            "SELECT id, checkpoint_id FROM snapshots",
            params![],
            |row| Columns::new(row, "snapshots", &["id"])?.get("checkpoint_id"),
        )
    }
}
