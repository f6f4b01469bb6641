//! Volumes: named per team, with the access token of their content API, and which
//! sandboxes mount them.
//!
//! A sandbox's mounts are written with the sandbox ([`crate::Store::insert_sandbox`]):
//! its `volume_mounts` JSON column is what records are read from, and `sandbox_volumes`
//! holds one row per mount so "who mounts this volume" is an indexed query. The token is
//! stored as is because `GET /volumes/{id}` must return it (as E2B does), like envd
//! access tokens.

use time::OffsetDateTime;

use crate::columns::{from_ms, new_id, now, to_ms, Columns};
use crate::db::{params, Row, Store};
use crate::error::{Result, StoreError};

/// A team's volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: String,
    pub team_id: String,
    /// Unique per team; what `volumeMounts` name.
    pub name: String,
    /// Bearer token of the volume content API.
    pub token: String,
    pub created_at: OffsetDateTime,
}

/// One volume mounted by a sandbox (or recorded in a snapshot), in mount order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeMountRecord {
    pub volume_id: String,
    /// The volume's name when mounted (names never change).
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
}

const VOLUME_COLUMNS: &str = "id, team_id, name, token, created_at_ms";

fn volume_from_row(row: &Row<'_>) -> Result<VolumeRecord> {
    let c = Columns::new(row, "volumes", &["id"])?;
    Ok(VolumeRecord {
        id: c.get("id")?,
        team_id: c.get("team_id")?,
        name: c.get("name")?,
        token: c.get("token")?,
        created_at: c.time("created_at_ms")?,
    })
}

/// A new volume content token: `vol_` and 64 hex characters.
fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("vol_{hex}")
}

impl Store {
    /// Records a new volume `name` of `team_id` (id and token are made here).
    pub fn insert_volume(&self, team_id: &str, name: &str) -> Result<VolumeRecord> {
        let record = VolumeRecord {
            id: new_id(),
            team_id: team_id.to_string(),
            name: name.to_string(),
            token: new_token(),
            created_at: stored_now(),
        };
        let inserted = self.conn()?.execute(
            &format!("INSERT INTO volumes ({VOLUME_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)"),
            params![
                record.id,
                record.team_id,
                record.name,
                record.token,
                to_ms(record.created_at)
            ],
        );
        match inserted {
            Ok(_) => Ok(record),
            Err(err) if err.is_unique_violation() => Err(StoreError::NameTaken {
                what: "volume",
                name: name.to_string(),
            }),
            Err(err) => Err(err),
        }
    }

    /// Volume `id` of `team_id`.
    pub fn volume(&self, team_id: &str, id: &str) -> Result<Option<VolumeRecord>> {
        self.conn()?.query_opt(
            &format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE team_id = ?1 AND id = ?2"),
            params![team_id, id],
            volume_from_row,
        )
    }

    /// Volume `name` of `team_id`.
    pub fn volume_by_name(&self, team_id: &str, name: &str) -> Result<Option<VolumeRecord>> {
        self.conn()?.query_opt(
            &format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE team_id = ?1 AND name = ?2"),
            params![team_id, name],
            volume_from_row,
        )
    }

    /// Volume `id` of any team (the content API authorises by the volume's token).
    pub fn volume_any_team(&self, id: &str) -> Result<Option<VolumeRecord>> {
        self.conn()?.query_opt(
            &format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE id = ?1"),
            params![id],
            volume_from_row,
        )
    }

    /// Volumes of `team_id`, oldest first (a team has few; not paged, as in E2B).
    pub fn list_volumes(&self, team_id: &str) -> Result<Vec<VolumeRecord>> {
        self.conn()?.query_all(
            &format!(
                "SELECT {VOLUME_COLUMNS} FROM volumes WHERE team_id = ?1 \
                 ORDER BY created_at_ms, id"
            ),
            params![team_id],
            volume_from_row,
        )
    }

    /// Live (running or paused) sandboxes that mount volume `id`.
    pub fn sandboxes_mounting(&self, volume_id: &str) -> Result<Vec<String>> {
        self.conn()?.query_all(
            "SELECT DISTINCT s.id FROM sandbox_volumes v JOIN sandboxes s ON s.id = v.sandbox_id \
             WHERE v.volume_id = ?1 AND s.status IN ('running', 'paused') ORDER BY s.id",
            params![volume_id],
            |row| Columns::new(row, "sandboxes", &["id"])?.get("id"),
        )
    }

    /// Deletes volume `id` of `team_id` unless a live sandbox mounts it
    /// ([`StoreError::InUse`] names them). Returns the deleted record.
    pub fn delete_volume(&self, team_id: &str, id: &str) -> Result<VolumeRecord> {
        self.write(|tx| {
            let volume = tx
                .query_opt(
                    &format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE team_id = ?1 AND id = ?2"),
                    params![team_id, id],
                    volume_from_row,
                )?
                .ok_or_else(|| StoreError::NotFound {
                    what: "volume",
                    id: id.to_string(),
                })?;
            let users: Vec<String> = tx.query_all(
            "SELECT DISTINCT s.id FROM sandbox_volumes v JOIN sandboxes s ON s.id = v.sandbox_id \
             WHERE v.volume_id = ?1 AND s.status IN ('running', 'paused') ORDER BY s.id",
            params![id],
            |row| Columns::new(row, "sandboxes", &["id"])?.get("id"),
        )?;
            if !users.is_empty() {
                return Err(StoreError::InUse {
                    what: "volume",
                    id: id.to_string(),
                    users,
                });
            }
            tx.execute(
                "DELETE FROM sandbox_volumes WHERE volume_id = ?1",
                params![id],
            )?;
            tx.execute("DELETE FROM volumes WHERE id = ?1", params![id])?;
            Ok(volume)
        })
    }
}

/// Now, at the millisecond precision rows keep (records returned equal those read back).
fn stored_now() -> OffsetDateTime {
    let now = now();
    from_ms(to_ms(now)).unwrap_or(now)
}
