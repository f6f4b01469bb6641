//! Teams and their API keys (stored as sha256 hashes with a display mask).

use time::OffsetDateTime;

use crate::columns::{new_id, now, to_ms, Columns};
use crate::db::{params, Conn, Row, Store, ToValue, Value};
use crate::error::{Result, StoreError};
use crate::keys::{generate_api_key, hash_api_key, KeyMask};

/// A team: the unit every object belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Team {
    pub id: String,
    pub name: String,
    pub is_default: bool,
}

/// A stored API key (never its raw value).
#[derive(Debug, Clone)]
pub struct ApiKeyRecord {
    pub id: String,
    pub team_id: String,
    pub name: String,
    pub mask: KeyMask,
    pub created_at: OffsetDateTime,
    pub last_used: Option<OffsetDateTime>,
}

const TEAM_COLUMNS: &str = "id, name, is_default";

const KEY_COLUMNS: &str =
    "id, team_id, name, value_length, masked_prefix, masked_suffix, created_at_ms, last_used_ms";

fn team_from_row(row: &Row<'_>) -> Result<Team> {
    let c = Columns::new(row, "teams", &["id"])?;
    Ok(Team {
        id: c.get("id")?,
        name: c.get("name")?,
        is_default: c.get("is_default")?,
    })
}

fn key_from_row(row: &Row<'_>) -> Result<ApiKeyRecord> {
    let c = Columns::new(row, "api_keys", &["id"])?;
    Ok(ApiKeyRecord {
        id: c.get("id")?,
        team_id: c.get("team_id")?,
        name: c.get("name")?,
        mask: KeyMask {
            value_length: c.get("value_length")?,
            masked_prefix: c.get("masked_prefix")?,
            masked_suffix: c.get("masked_suffix")?,
        },
        created_at: c.time("created_at_ms")?,
        last_used: c.time_opt("last_used_ms")?,
    })
}

fn team_where(conn: &mut Conn<'_>, condition: &str, param: Value) -> Result<Option<Team>> {
    conn.query_opt(
        &format!("SELECT {TEAM_COLUMNS} FROM teams WHERE {condition}"),
        &[param],
        team_from_row,
    )
}

impl Store {
    /// Create a team. The first team ever created becomes the default one.
    ///
    /// One write transaction: "first team" is exact when two processes race, and a name
    /// taken meanwhile is [`StoreError::TeamExists`].
    pub fn create_team(&self, name: &str) -> Result<Team> {
        let created = self.write(|tx| {
            if team_where(tx, "name = ?1", name.to_value())?.is_some() {
                return Err(StoreError::TeamExists { name: name.into() });
            }
            let count = tx.query_count("SELECT COUNT(*) AS n FROM teams", params![])?;
            let team = Team {
                id: new_id(),
                name: name.to_string(),
                is_default: count == 0,
            };
            tx.execute(
                "INSERT INTO teams (id, name, is_default, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
                params![&team.id, &team.name, team.is_default, to_ms(now())],
            )?;
            Ok(team)
        });
        match created {
            Err(err) if err.is_unique_violation() => {
                Err(StoreError::TeamExists { name: name.into() })
            }
            other => other,
        }
    }

    /// Every team, by name.
    pub fn teams(&self) -> Result<Vec<Team>> {
        self.conn()?.query_all(
            &format!("SELECT {TEAM_COLUMNS} FROM teams ORDER BY name"),
            params![],
            team_from_row,
        )
    }

    pub fn team_by_name(&self, name: &str) -> Result<Option<Team>> {
        team_where(&mut self.conn()?, "name = ?1", name.to_value())
    }

    pub fn default_team(&self) -> Result<Option<Team>> {
        team_where(&mut self.conn()?, "is_default = ?1", true.to_value())
    }

    /// Create a key for `team_id`; returns its record and the raw key (shown once).
    pub fn create_api_key(&self, team_id: &str, name: &str) -> Result<(ApiKeyRecord, String)> {
        let raw = generate_api_key();
        let record = ApiKeyRecord {
            id: new_id(),
            team_id: team_id.to_string(),
            name: name.to_string(),
            mask: KeyMask::of(&raw),
            created_at: now(),
            last_used: None,
        };
        self.conn()?.execute(
            "INSERT INTO api_keys (id, team_id, name, key_hash, value_length, masked_prefix, \
             masked_suffix, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                &record.id,
                &record.team_id,
                &record.name,
                hash_api_key(&raw),
                record.mask.value_length,
                &record.mask.masked_prefix,
                &record.mask.masked_suffix,
                to_ms(record.created_at)
            ],
        )?;
        Ok((record, raw))
    }

    /// The team and key a raw API key authenticates, updating its last-used time.
    pub fn authenticate(&self, raw_key: &str) -> Result<Option<(Team, ApiKeyRecord)>> {
        let mut conn = self.conn()?;
        let key = conn.query_opt(
            &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE key_hash = ?1"),
            params![hash_api_key(raw_key)],
            key_from_row,
        )?;
        let Some(mut key) = key else {
            return Ok(None);
        };
        let used = now();
        // Every API call authenticates: write the last-used time at most once a minute
        // per key, so reads stay reads.
        let stale = key
            .last_used
            .is_none_or(|last| used - last > time::Duration::minutes(1));
        if stale {
            conn.execute(
                "UPDATE api_keys SET last_used_ms = ?1 WHERE id = ?2",
                params![to_ms(used), &key.id],
            )?;
            key.last_used = Some(used);
        }
        let team = team_where(&mut conn, "id = ?1", key.team_id.to_value())?.ok_or_else(|| {
            StoreError::NotFound {
                what: "team",
                id: key.team_id.clone(),
            }
        })?;
        Ok(Some((team, key)))
    }

    /// Keys of one team, oldest first.
    pub fn list_api_keys(&self, team_id: &str) -> Result<Vec<ApiKeyRecord>> {
        self.conn()?.query_all(
            &format!(
                "SELECT {KEY_COLUMNS} FROM api_keys WHERE team_id = ?1 ORDER BY created_at_ms, id"
            ),
            params![team_id],
            key_from_row,
        )
    }

    /// Keys of every team with their team names (for the CLI).
    pub fn list_all_api_keys(&self) -> Result<Vec<(String, ApiKeyRecord)>> {
        self.conn()?.query_all(
            "SELECT k.id, k.team_id, k.name, k.value_length, k.masked_prefix, k.masked_suffix, \
             k.created_at_ms, k.last_used_ms, t.name AS team_name \
             FROM api_keys k JOIN teams t ON t.id = k.team_id \
             ORDER BY t.name, k.created_at_ms, k.id",
            params![],
            |row| {
                let team_name = Columns::new(row, "teams", &["team_id"])?.get("team_name")?;
                Ok((team_name, key_from_row(row)?))
            },
        )
    }

    pub fn rename_api_key(&self, team_id: &str, key_id: &str, name: &str) -> Result<()> {
        let changed = self.conn()?.execute(
            "UPDATE api_keys SET name = ?1 WHERE id = ?2 AND team_id = ?3",
            params![name, key_id, team_id],
        )?;
        key_changed(changed, key_id)
    }

    /// Delete a key of `team_id`.
    pub fn delete_api_key(&self, team_id: &str, key_id: &str) -> Result<()> {
        let changed = self.conn()?.execute(
            "DELETE FROM api_keys WHERE id = ?1 AND team_id = ?2",
            params![key_id, team_id],
        )?;
        key_changed(changed, key_id)
    }

    /// Delete a key by id whatever its team (the local CLI is trusted with every team).
    pub fn revoke_api_key(&self, key_id: &str) -> Result<()> {
        let changed = self
            .conn()?
            .execute("DELETE FROM api_keys WHERE id = ?1", params![key_id])?;
        key_changed(changed, key_id)
    }
}

fn key_changed(changed: usize, key_id: &str) -> Result<()> {
    if changed == 0 {
        return Err(StoreError::NotFound {
            what: "API key",
            id: key_id.to_string(),
        });
    }
    Ok(())
}
