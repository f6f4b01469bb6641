//! berth-store: berth's durable state in an embedded SQLite database.
//!
//! Owns the schema and its migrations, and every query: teams, API keys (only their
//! sha256 hash is stored), sandboxes, lifecycle events, webhooks and their pending
//! deliveries, sandbox logs and metric samples. The database runs in WAL mode with a busy
//! timeout so `berth keys …` can work on the state directory while `berth up` runs.
//! It knows nothing of HTTP or of the runtime; callers map rows to API models.

mod keys;
mod schema;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use time::OffsetDateTime;

pub use keys::{generate_api_key, hash_api_key, KeyMask, API_KEY_PREFIX};

/// File name of the database inside the state directory.
pub const DATABASE_FILE: &str = "berth.db";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("creating state directory {path}: {source}")]
    StateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("stored JSON is invalid: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

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

/// Whether a sandbox row describes a live sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxStatus {
    Running,
    /// Stopped with its disk and, with `memory`, its processes' memory kept.
    Paused {
        memory: bool,
    },
    Killed,
}

impl SandboxStatus {
    fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Running => "running",
            SandboxStatus::Paused { .. } => "paused",
            SandboxStatus::Killed => "killed",
        }
    }

    fn parse(text: &str, paused_memory: Option<bool>) -> Self {
        match text {
            "running" => SandboxStatus::Running,
            "paused" => SandboxStatus::Paused {
                memory: paused_memory.unwrap_or(true),
            },
            _ => SandboxStatus::Killed,
        }
    }

    fn paused_memory(self) -> Option<bool> {
        match self {
            SandboxStatus::Paused { memory } => Some(memory),
            _ => None,
        }
    }
}

/// What happens at a sandbox's end time and on traffic while it is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// Pause instead of kill at the end time.
    pub auto_pause: bool,
    /// An automatic pause keeps memory (else only the disk).
    pub auto_pause_memory: bool,
    /// Traffic through the proxy resumes the sandbox when it is paused (with memory).
    pub auto_resume: bool,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            auto_pause: false,
            auto_pause_memory: true,
            auto_resume: false,
        }
    }
}

/// A sandbox as the control plane records it.
#[derive(Debug, Clone)]
pub struct SandboxRecord {
    pub id: String,
    pub team_id: String,
    pub template_id: String,
    pub alias: Option<String>,
    pub build_id: String,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub metadata: berth_api::StringMap,
    pub envd_version: String,
    pub envd_access_token: Option<String>,
    pub allow_internet_access: Option<bool>,
    pub started_at: OffsetDateTime,
    pub end_at: OffsetDateTime,
    pub status: SandboxStatus,
    /// Env vars given at create (envd gets them again when it boots afresh).
    pub env_vars: berth_api::StringMap,
    /// Time to live given at create, in seconds (used again on automatic resume).
    pub timeout_secs: i64,
    pub lifecycle: Lifecycle,
}

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
    /// Checkpoint directory.
    pub path: String,
    pub size_bytes: u64,
    pub created_at: OffsetDateTime,
    /// Processes continue from the snapshot's memory; false: only its files are used
    /// (new sandboxes boot afresh on them).
    pub memory: bool,
}

/// Filters of a sandbox listing.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    /// Every pair must be present in the sandbox's metadata.
    pub metadata: Vec<(String, String)>,
    /// Template id or alias.
    pub template: Option<String>,
    pub started_after: Option<OffsetDateTime>,
    pub ascending: bool,
    pub states: StateFilter,
}

/// Which live states a listing includes (default: running only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateFilter {
    pub running: bool,
    pub paused: bool,
}

impl Default for StateFilter {
    fn default() -> Self {
        StateFilter {
            running: true,
            paused: false,
        }
    }
}

/// One page of a sandbox listing.
#[derive(Debug, Clone)]
pub struct SandboxPage {
    pub sandboxes: Vec<SandboxRecord>,
    /// Opaque cursor for the next page, when more rows match.
    pub next_token: Option<String>,
    /// Running sandboxes matching the filters, before paging.
    pub total: u64,
}

/// A lifecycle event row.
#[derive(Debug, Clone)]
pub struct EventRecord {
    pub id: String,
    pub team_id: String,
    pub sandbox_id: String,
    pub template_id: String,
    pub build_id: String,
    pub event_type: String,
    pub data: Option<serde_json::Value>,
    pub timestamp: OffsetDateTime,
}

/// A webhook registration, secret included (for signing; never sent to clients).
#[derive(Debug, Clone)]
pub struct WebhookRecord {
    pub id: String,
    pub team_id: String,
    pub name: String,
    pub url: String,
    pub enabled: bool,
    pub events: Vec<String>,
    pub secret: String,
    pub created_at: OffsetDateTime,
}

/// Changes to a webhook; `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub struct WebhookChanges {
    pub name: Option<String>,
    pub url: Option<String>,
    pub enabled: Option<bool>,
    pub events: Option<Vec<String>>,
    pub secret: Option<String>,
}

/// A delivery waiting to be (re)tried.
#[derive(Debug, Clone)]
pub struct PendingDelivery {
    pub id: i64,
    pub webhook_id: String,
    pub url: String,
    pub secret: String,
    pub body: String,
    pub attempts: u32,
}

/// One stored log line of a sandbox.
#[derive(Debug, Clone)]
pub struct LogRecord {
    pub timestamp_ms: i64,
    pub level: berth_api::LogLevel,
    pub message: String,
}

/// One stored metric sample of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricSample {
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// The database handle. Cheap calls; each takes the connection lock briefly.
pub struct Store {
    conn: Mutex<Connection>,
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn to_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn from_ms(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

const SANDBOX_COLUMNS: &str = "id, team_id, template_id, alias, build_id, cpu_count, memory_mb, \
     disk_size_mb, metadata, envd_version, envd_access_token, allow_internet_access, \
     started_at_ms, end_at_ms, status, paused_memory, env_vars, timeout_secs, auto_pause, \
     auto_pause_memory, auto_resume";

fn sandbox_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SandboxRecord> {
    let metadata: String = row.get(8)?;
    let status: String = row.get(14)?;
    let env_vars: String = row.get(16)?;
    Ok(SandboxRecord {
        id: row.get(0)?,
        team_id: row.get(1)?,
        template_id: row.get(2)?,
        alias: row.get(3)?,
        build_id: row.get(4)?,
        cpu_count: row.get(5)?,
        memory_mb: row.get(6)?,
        disk_size_mb: row.get(7)?,
        metadata: serde_json::from_str(&metadata).unwrap_or_default(),
        envd_version: row.get(9)?,
        envd_access_token: row.get(10)?,
        allow_internet_access: row.get(11)?,
        started_at: from_ms(row.get(12)?),
        end_at: from_ms(row.get(13)?),
        status: SandboxStatus::parse(&status, row.get(15)?),
        env_vars: serde_json::from_str(&env_vars).unwrap_or_default(),
        timeout_secs: row.get(17)?,
        lifecycle: Lifecycle {
            auto_pause: row.get(18)?,
            auto_pause_memory: row.get(19)?,
            auto_resume: row.get(20)?,
        },
    })
}

fn event_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<EventRecord> {
    let data: Option<String> = row.get(6)?;
    Ok(EventRecord {
        id: row.get(0)?,
        team_id: row.get(1)?,
        sandbox_id: row.get(2)?,
        template_id: row.get(3)?,
        build_id: row.get(4)?,
        event_type: row.get(5)?,
        data: data.and_then(|text| serde_json::from_str(&text).ok()),
        timestamp: from_ms(row.get(7)?),
    })
}

fn webhook_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<WebhookRecord> {
    let events: String = row.get(5)?;
    Ok(WebhookRecord {
        id: row.get(0)?,
        team_id: row.get(1)?,
        name: row.get(2)?,
        url: row.get(3)?,
        enabled: row.get(4)?,
        events: serde_json::from_str(&events).unwrap_or_default(),
        secret: row.get(6)?,
        created_at: from_ms(row.get(7)?),
    })
}

fn key_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: row.get(0)?,
        team_id: row.get(1)?,
        name: row.get(2)?,
        mask: KeyMask {
            value_length: row.get(3)?,
            masked_prefix: row.get(4)?,
            masked_suffix: row.get(5)?,
        },
        created_at: from_ms(row.get(6)?),
        last_used: row.get::<_, Option<i64>>(7)?.map(from_ms),
    })
}

const KEY_COLUMNS: &str =
    "id, team_id, name, value_length, masked_prefix, masked_suffix, created_at_ms, last_used_ms";

impl Store {
    /// Open (creating if needed) the database in `state_dir` and migrate it.
    pub fn open(state_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(state_dir).map_err(|source| StoreError::StateDir {
            path: state_dir.display().to_string(),
            source,
        })?;
        let conn = Connection::open(state_dir.join(DATABASE_FILE))?;
        // Another berth process (e.g. `berth keys create` during `berth up`) may hold the
        // write lock briefly; wait for it rather than failing.
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        schema::migrate(&conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent (each call is
        // one statement or one transaction), so a poisoned lock is still usable.
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    // ---- teams ----

    /// Create a team. The first team ever created becomes the default one.
    pub fn create_team(&self, name: &str) -> Result<Team> {
        let conn = self.conn();
        let exists: Option<String> = conn
            .query_row("SELECT id FROM teams WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        if exists.is_some() {
            return Err(StoreError::Conflict(format!(
                "team \"{name}\" already exists"
            )));
        }
        let count: i64 = conn.query_row("SELECT COUNT(*) FROM teams", [], |r| r.get(0))?;
        let team = Team {
            id: new_id(),
            name: name.to_string(),
            is_default: count == 0,
        };
        conn.execute(
            "INSERT INTO teams (id, name, is_default, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
            params![team.id, team.name, team.is_default, to_ms(now())],
        )?;
        Ok(team)
    }

    pub fn team_by_name(&self, name: &str) -> Result<Option<Team>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT id, name, is_default FROM teams WHERE name = ?1",
                [name],
                |r| {
                    Ok(Team {
                        id: r.get(0)?,
                        name: r.get(1)?,
                        is_default: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    pub fn default_team(&self) -> Result<Option<Team>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT id, name, is_default FROM teams WHERE is_default = 1",
                [],
                |r| {
                    Ok(Team {
                        id: r.get(0)?,
                        name: r.get(1)?,
                        is_default: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    // ---- API keys ----

    /// Create a key for `team_id`; returns its record and the raw key (shown once).
    pub fn create_api_key(&self, team_id: &str, name: &str) -> Result<(ApiKeyRecord, String)> {
        let raw = generate_api_key();
        let mask = KeyMask::of(&raw);
        let record = ApiKeyRecord {
            id: new_id(),
            team_id: team_id.to_string(),
            name: name.to_string(),
            mask,
            created_at: now(),
            last_used: None,
        };
        self.conn().execute(
            "INSERT INTO api_keys (id, team_id, name, key_hash, value_length, masked_prefix, \
             masked_suffix, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                record.id,
                record.team_id,
                record.name,
                hash_api_key(&raw),
                record.mask.value_length,
                record.mask.masked_prefix,
                record.mask.masked_suffix,
                to_ms(record.created_at)
            ],
        )?;
        Ok((record, raw))
    }

    /// The team and key a raw API key authenticates, updating its last-used time.
    pub fn authenticate(&self, raw_key: &str) -> Result<Option<(Team, ApiKeyRecord)>> {
        let conn = self.conn();
        let key = conn
            .query_row(
                &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE key_hash = ?1"),
                [hash_api_key(raw_key)],
                key_from_row,
            )
            .optional()?;
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
                params![to_ms(used), key.id],
            )?;
            key.last_used = Some(used);
        }
        let team = conn.query_row(
            "SELECT id, name, is_default FROM teams WHERE id = ?1",
            [&key.team_id],
            |r| {
                Ok(Team {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    is_default: r.get(2)?,
                })
            },
        )?;
        Ok(Some((team, key)))
    }

    /// Keys of one team, oldest first.
    pub fn list_api_keys(&self, team_id: &str) -> Result<Vec<ApiKeyRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE team_id = ?1 ORDER BY created_at_ms, id"
        ))?;
        let rows = stmt.query_map([team_id], key_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Keys of every team with their team names (for the CLI).
    pub fn list_all_api_keys(&self) -> Result<Vec<(String, ApiKeyRecord)>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT k.id, k.team_id, k.name, k.value_length, k.masked_prefix, k.masked_suffix, \
             k.created_at_ms, k.last_used_ms, t.name FROM api_keys k JOIN teams t ON t.id = k.team_id \
             ORDER BY t.name, k.created_at_ms, k.id",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(8)?, key_from_row(r)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn rename_api_key(&self, team_id: &str, key_id: &str, name: &str) -> Result<()> {
        let changed = self.conn().execute(
            "UPDATE api_keys SET name = ?1 WHERE id = ?2 AND team_id = ?3",
            params![name, key_id, team_id],
        )?;
        if changed == 0 {
            return Err(StoreError::NotFound(format!("API key {key_id}")));
        }
        Ok(())
    }

    /// Delete a key of `team_id`.
    pub fn delete_api_key(&self, team_id: &str, key_id: &str) -> Result<()> {
        let changed = self.conn().execute(
            "DELETE FROM api_keys WHERE id = ?1 AND team_id = ?2",
            params![key_id, team_id],
        )?;
        if changed == 0 {
            return Err(StoreError::NotFound(format!("API key {key_id}")));
        }
        Ok(())
    }

    /// Delete a key by id whatever its team (the local CLI is trusted with every team).
    pub fn revoke_api_key(&self, key_id: &str) -> Result<()> {
        let changed = self
            .conn()
            .execute("DELETE FROM api_keys WHERE id = ?1", [key_id])?;
        if changed == 0 {
            return Err(StoreError::NotFound(format!("API key {key_id}")));
        }
        Ok(())
    }

    // ---- sandboxes ----

    pub fn insert_sandbox(&self, sandbox: &SandboxRecord) -> Result<()> {
        self.conn().execute(
            &format!(
                "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
                 ?18, ?19, ?20, ?21)"
            ),
            params![
                sandbox.id,
                sandbox.team_id,
                sandbox.template_id,
                sandbox.alias,
                sandbox.build_id,
                sandbox.cpu_count,
                sandbox.memory_mb,
                sandbox.disk_size_mb,
                serde_json::to_string(&sandbox.metadata)?,
                sandbox.envd_version,
                sandbox.envd_access_token,
                sandbox.allow_internet_access,
                to_ms(sandbox.started_at),
                to_ms(sandbox.end_at),
                sandbox.status.as_str(),
                sandbox.status.paused_memory(),
                serde_json::to_string(&sandbox.env_vars)?,
                sandbox.timeout_secs,
                sandbox.lifecycle.auto_pause,
                sandbox.lifecycle.auto_pause_memory,
                sandbox.lifecycle.auto_resume,
            ],
        )?;
        Ok(())
    }

    /// A running sandbox of `team_id`.
    pub fn running_sandbox(&self, team_id: &str, id: &str) -> Result<Option<SandboxRecord>> {
        Ok(self
            .conn()
            .query_row(
                &format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                     WHERE id = ?1 AND team_id = ?2 AND status = 'running'"
                ),
                params![id, team_id],
                sandbox_from_row,
            )
            .optional()?)
    }

    /// A running or paused sandbox of `team_id`.
    pub fn live_sandbox(&self, team_id: &str, id: &str) -> Result<Option<SandboxRecord>> {
        Ok(self
            .conn()
            .query_row(
                &format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                     WHERE id = ?1 AND team_id = ?2 AND status IN ('running', 'paused')"
                ),
                params![id, team_id],
                sandbox_from_row,
            )
            .optional()?)
    }

    /// A running or paused sandbox by id, whatever its team (for the proxy).
    pub fn live_sandbox_any_team(&self, id: &str) -> Result<Option<SandboxRecord>> {
        Ok(self
            .conn()
            .query_row(
                &format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                     WHERE id = ?1 AND status IN ('running', 'paused')"
                ),
                [id],
                sandbox_from_row,
            )
            .optional()?)
    }

    /// Every paused sandbox of every team.
    pub fn all_paused_sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE status = 'paused' ORDER BY started_at_ms"
        ))?;
        let rows = stmt.query_map([], sandbox_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Turn pausing at the end time on or off for a live sandbox.
    pub fn set_auto_pause(&self, id: &str, auto_pause: bool) -> Result<()> {
        self.conn().execute(
            "UPDATE sandboxes SET auto_pause = ?1 WHERE id = ?2 AND status IN ('running', 'paused')",
            params![auto_pause, id],
        )?;
        Ok(())
    }

    /// Mark a running sandbox paused. False when it was not running.
    pub fn mark_paused(&self, id: &str, memory: bool) -> Result<bool> {
        let changed = self.conn().execute(
            "UPDATE sandboxes SET status = 'paused', paused_memory = ?1 \
             WHERE id = ?2 AND status = 'running'",
            params![memory, id],
        )?;
        Ok(changed == 1)
    }

    /// Mark a paused sandbox running again until `end_at`. False when it was not paused.
    pub fn mark_resumed(&self, id: &str, end_at: OffsetDateTime) -> Result<bool> {
        let changed = self.conn().execute(
            "UPDATE sandboxes SET status = 'running', paused_memory = NULL, end_at_ms = ?1 \
             WHERE id = ?2 AND status = 'paused'",
            params![to_ms(end_at), id],
        )?;
        Ok(changed == 1)
    }

    // ---- snapshots ----

    /// Record `snapshot`; a snapshot of the same team and name is replaced, and its
    /// checkpoint path returned so the caller can delete it.
    pub fn put_snapshot(&self, snapshot: &SnapshotRecord) -> Result<Option<String>> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let old: Option<String> = tx
            .query_row(
                "SELECT path FROM snapshots WHERE team_id = ?1 AND name = ?2",
                params![snapshot.team_id, snapshot.name],
                |r| r.get(0),
            )
            .optional()?;
        tx.execute(
            "DELETE FROM snapshots WHERE team_id = ?1 AND name = ?2",
            params![snapshot.team_id, snapshot.name],
        )?;
        tx.execute(
            &format!(
                "INSERT INTO snapshots ({SNAPSHOT_COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
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
                serde_json::to_string(&snapshot.env_vars)?,
                snapshot.envd_access_token,
                snapshot.path,
                snapshot.size_bytes as i64,
                to_ms(snapshot.created_at),
                snapshot.memory,
            ],
        )?;
        tx.commit()?;
        Ok(old)
    }

    /// A snapshot of `team_id` by name or id.
    pub fn snapshot(&self, team_id: &str, name_or_id: &str) -> Result<Option<SnapshotRecord>> {
        Ok(self
            .conn()
            .query_row(
                &format!(
                    "SELECT {SNAPSHOT_COLUMNS} FROM snapshots \
                     WHERE team_id = ?1 AND (name = ?2 OR id = ?2)"
                ),
                params![team_id, name_or_id],
                snapshot_from_row,
            )
            .optional()?)
    }

    /// Snapshots of `team_id`, newest first, optionally of one source sandbox or with
    /// one name or id, paged by `limit` after `next_token` (an id).
    pub fn list_snapshots(
        &self,
        team_id: &str,
        source_sandbox_id: Option<&str>,
        name_or_id: Option<&str>,
        limit: usize,
        next_token: Option<&str>,
    ) -> Result<(Vec<SnapshotRecord>, Option<String>)> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE team_id = ?1 \
             AND (?2 IS NULL OR source_sandbox_id = ?2) AND (?3 IS NULL OR name = ?3 OR id = ?3) \
             ORDER BY created_at_ms DESC, id DESC"
        ))?;
        let all: Vec<SnapshotRecord> = stmt
            .query_map(
                params![team_id, source_sandbox_id, name_or_id],
                snapshot_from_row,
            )?
            .collect::<rusqlite::Result<_>>()?;
        let start = match next_token {
            Some(token) => all
                .iter()
                .position(|s| s.id == token)
                .map_or(all.len(), |i| i + 1),
            None => 0,
        };
        let page: Vec<SnapshotRecord> = all.iter().skip(start).take(limit).cloned().collect();
        let next = (start + page.len() < all.len())
            .then(|| page.last().map(|s| s.id.clone()))
            .flatten();
        Ok((page, next))
    }

    /// Delete a snapshot of `team_id` by name or id; returns it (its checkpoint is the
    /// caller's to delete).
    pub fn delete_snapshot(&self, team_id: &str, name_or_id: &str) -> Result<SnapshotRecord> {
        let snapshot = self
            .snapshot(team_id, name_or_id)?
            .ok_or_else(|| StoreError::NotFound(format!("snapshot {name_or_id}")))?;
        self.conn()
            .execute("DELETE FROM snapshots WHERE id = ?1", params![snapshot.id])?;
        Ok(snapshot)
    }

    /// Every snapshot's checkpoint path (recovery keeps these, deletes the rest).
    pub fn snapshot_paths(&self) -> Result<Vec<String>> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT path FROM snapshots")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// A sandbox of `team_id` in any state (killed ones keep their logs and metrics).
    pub fn sandbox(&self, team_id: &str, id: &str) -> Result<Option<SandboxRecord>> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1 AND team_id = ?2"),
                params![id, team_id],
                sandbox_from_row,
            )
            .optional()?)
    }

    /// Every running sandbox of every team.
    pub fn all_running_sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE status = 'running' ORDER BY started_at_ms"
        ))?;
        let rows = stmt.query_map([], sandbox_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Running sandboxes whose end time has passed.
    pub fn expired_sandboxes(&self, at: OffsetDateTime) -> Result<Vec<SandboxRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE status = 'running' AND end_at_ms <= ?1"
        ))?;
        let rows = stmt.query_map([to_ms(at)], sandbox_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Earliest end time among running sandboxes (the reaper sleeps until then).
    pub fn next_end_at(&self) -> Result<Option<OffsetDateTime>> {
        let ms: Option<i64> = self.conn().query_row(
            "SELECT MIN(end_at_ms) FROM sandboxes WHERE status = 'running'",
            [],
            |r| r.get(0),
        )?;
        Ok(ms.map(from_ms))
    }

    /// Live sandboxes of a team matching `filter`, paged by `limit` after `next_token`.
    pub fn list_sandboxes(
        &self,
        team_id: &str,
        filter: &SandboxFilter,
        limit: usize,
        next_token: Option<&str>,
    ) -> Result<SandboxPage> {
        let conn = self.conn();
        let order = if filter.ascending { "ASC" } else { "DESC" };
        let mut stmt = conn.prepare(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
             WHERE team_id = ?1 AND status IN ('running', 'paused') \
             ORDER BY started_at_ms {order}, id {order}"
        ))?;
        let rows = stmt.query_map([team_id], sandbox_from_row)?;
        let mut matching = Vec::new();
        for row in rows {
            let sandbox = row?;
            if sandbox_matches(&sandbox, filter) {
                matching.push(sandbox);
            }
        }
        let total = matching
            .iter()
            .filter(|s| s.status == SandboxStatus::Running)
            .count() as u64;
        // The cursor is the id of the last row of the previous page; ordering is total
        // (start time, then id), so the position after it is well defined.
        let start = match next_token {
            Some(token) => match matching.iter().position(|s| s.id == token) {
                Some(index) => index + 1,
                None => matching.len(),
            },
            None => 0,
        };
        let page: Vec<SandboxRecord> = matching.iter().skip(start).take(limit).cloned().collect();
        let next_token = if start + page.len() < matching.len() {
            page.last().map(|s| s.id.clone())
        } else {
            None
        };
        Ok(SandboxPage {
            sandboxes: page,
            next_token,
            total,
        })
    }

    /// Set the end time of a running sandbox.
    pub fn set_end_at(&self, team_id: &str, id: &str, end_at: OffsetDateTime) -> Result<()> {
        let changed = self.conn().execute(
            "UPDATE sandboxes SET end_at_ms = ?1 WHERE id = ?2 AND team_id = ?3 AND status = 'running'",
            params![to_ms(end_at), id, team_id],
        )?;
        if changed == 0 {
            return Err(StoreError::NotFound(format!("sandbox {id}")));
        }
        Ok(())
    }

    /// Mark a running or paused sandbox killed. Returns false when it was neither
    /// (someone else killed it first), so exactly one caller records the `killed` event.
    pub fn mark_killed(&self, id: &str) -> Result<bool> {
        let changed = self.conn().execute(
            "UPDATE sandboxes SET status = 'killed', paused_memory = NULL, \
             end_at_ms = MIN(end_at_ms, ?1) WHERE id = ?2 AND status IN ('running', 'paused')",
            params![to_ms(now()), id],
        )?;
        Ok(changed == 1)
    }

    /// Remember which sandbox an idempotency key created.
    pub fn remember_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
        sandbox_id: &str,
    ) -> Result<()> {
        self.conn().execute(
            "INSERT OR REPLACE INTO idempotency_keys (team_id, key, sandbox_id, created_at_ms) \
             VALUES (?1, ?2, ?3, ?4)",
            params![team_id, key, sandbox_id, to_ms(now())],
        )?;
        Ok(())
    }

    /// Forget idempotency keys recorded before `before`; returns how many.
    pub fn forget_idempotency_keys(&self, before: OffsetDateTime) -> Result<usize> {
        Ok(self.conn().execute(
            "DELETE FROM idempotency_keys WHERE created_at_ms < ?1",
            [to_ms(before)],
        )?)
    }

    /// Sandbox an idempotency key created, if any.
    pub fn idempotent_sandbox(&self, team_id: &str, key: &str) -> Result<Option<String>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT sandbox_id FROM idempotency_keys WHERE team_id = ?1 AND key = ?2",
                params![team_id, key],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Sandboxes of a team started in `[from, to]` (ms), with their start and kill times,
    /// for team metrics.
    pub fn team_sandbox_spans(
        &self,
        team_id: &str,
        from: OffsetDateTime,
        to: OffsetDateTime,
    ) -> Result<Vec<(OffsetDateTime, Option<OffsetDateTime>)>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT started_at_ms, CASE WHEN status = 'running' THEN NULL ELSE end_at_ms END \
             FROM sandboxes WHERE team_id = ?1 AND started_at_ms <= ?3 \
             AND (status = 'running' OR end_at_ms >= ?2)",
        )?;
        let rows = stmt.query_map(params![team_id, to_ms(from), to_ms(to)], |r| {
            Ok((from_ms(r.get(0)?), r.get::<_, Option<i64>>(1)?.map(from_ms)))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    // ---- logs ----

    pub fn append_log(
        &self,
        sandbox_id: &str,
        level: berth_api::LogLevel,
        message: &str,
    ) -> Result<()> {
        self.conn().execute(
            "INSERT INTO sandbox_logs (sandbox_id, timestamp_ms, level, message) VALUES (?1, ?2, ?3, ?4)",
            params![sandbox_id, to_ms(now()), level.as_str(), message],
        )?;
        Ok(())
    }

    /// Log lines of a sandbox at or after `cursor_ms` (forward) or at or before it
    /// (backward), at least `min_level`, containing `search`.
    pub fn logs(
        &self,
        sandbox_id: &str,
        cursor_ms: Option<i64>,
        forward: bool,
        min_level: berth_api::LogLevel,
        search: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LogRecord>> {
        let conn = self.conn();
        let (cmp, order, default_cursor) = if forward {
            (">=", "ASC", i64::MIN)
        } else {
            ("<=", "DESC", i64::MAX)
        };
        let mut stmt = conn.prepare(&format!(
            "SELECT timestamp_ms, level, message FROM sandbox_logs WHERE sandbox_id = ?1 \
             AND timestamp_ms {cmp} ?2 ORDER BY timestamp_ms {order}, seq {order}"
        ))?;
        let rows = stmt.query_map(
            params![sandbox_id, cursor_ms.unwrap_or(default_cursor)],
            |r| {
                let level: String = r.get(1)?;
                Ok(LogRecord {
                    timestamp_ms: r.get(0)?,
                    level: berth_api::LogLevel::parse(&level).unwrap_or(berth_api::LogLevel::Info),
                    message: r.get(2)?,
                })
            },
        )?;
        let mut out = Vec::new();
        for row in rows {
            let record = row?;
            if record.level < min_level {
                continue;
            }
            if let Some(needle) = search {
                if !record.message.contains(needle) {
                    continue;
                }
            }
            out.push(record);
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    // ---- metrics ----

    pub fn insert_metric(&self, sandbox_id: &str, sample: &MetricSample) -> Result<()> {
        self.conn().execute(
            "INSERT OR REPLACE INTO sandbox_metrics (sandbox_id, timestamp_unix, cpu_count, cpu_used_pct, \
             mem_used, mem_total, mem_cache, disk_used, disk_total) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                sandbox_id,
                sample.timestamp_unix,
                sample.cpu_count,
                sample.cpu_used_pct,
                sample.mem_used as i64,
                sample.mem_total as i64,
                sample.mem_cache as i64,
                sample.disk_used as i64,
                sample.disk_total as i64
            ],
        )?;
        Ok(())
    }

    /// Samples of a sandbox in `[start, end]` (unix seconds), oldest first.
    pub fn metrics(&self, sandbox_id: &str, start: i64, end: i64) -> Result<Vec<MetricSample>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT timestamp_unix, cpu_count, cpu_used_pct, mem_used, mem_total, mem_cache, \
             disk_used, disk_total FROM sandbox_metrics WHERE sandbox_id = ?1 \
             AND timestamp_unix BETWEEN ?2 AND ?3 ORDER BY timestamp_unix",
        )?;
        let rows = stmt.query_map(params![sandbox_id, start, end], metric_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The newest sample of a sandbox.
    pub fn latest_metric(&self, sandbox_id: &str) -> Result<Option<MetricSample>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT timestamp_unix, cpu_count, cpu_used_pct, mem_used, mem_total, mem_cache, \
                 disk_used, disk_total FROM sandbox_metrics WHERE sandbox_id = ?1 \
                 ORDER BY timestamp_unix DESC LIMIT 1",
                [sandbox_id],
                metric_from_row,
            )
            .optional()?)
    }

    // ---- events ----

    /// Record an event and queue a delivery for every enabled webhook of its team that
    /// wants it. `body` renders the event as the JSON delivered to webhooks.
    pub fn record_event(
        &self,
        event: &EventRecord,
        body: impl Fn(&EventRecord) -> String,
    ) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO events (id, team_id, sandbox_id, template_id, build_id, event_type, data, timestamp_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                event.id,
                event.team_id,
                event.sandbox_id,
                event.template_id,
                event.build_id,
                event.event_type,
                event.data.as_ref().map(|d| d.to_string()),
                to_ms(event.timestamp)
            ],
        )?;
        let hooks: Vec<WebhookRecord> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE team_id = ?1 AND enabled = 1"
            ))?;
            let rows = stmt.query_map([&event.team_id], webhook_from_row)?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let rendered = body(event);
        for hook in hooks {
            if !hook.events.is_empty() && !hook.events.contains(&event.event_type) {
                continue;
            }
            tx.execute(
                "INSERT INTO webhook_deliveries (webhook_id, event_id, body, attempts, next_attempt_ms) \
                 VALUES (?1, ?2, ?3, 0, ?4)",
                params![hook.id, event.id, rendered, to_ms(now())],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Events of a team (optionally of one sandbox), filtered by type, paged by offset.
    pub fn events(
        &self,
        team_id: &str,
        sandbox_id: Option<&str>,
        types: &[String],
        ascending: bool,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<EventRecord>> {
        let conn = self.conn();
        let order = if ascending { "ASC" } else { "DESC" };
        // An empty type list (`[]`) keeps every type.
        let sql = format!(
            "SELECT id, team_id, sandbox_id, template_id, build_id, event_type, data, timestamp_ms \
             FROM events WHERE team_id = ?1 AND (?2 IS NULL OR sandbox_id = ?2) \
             AND (?3 = '[]' OR event_type IN (SELECT value FROM json_each(?3))) \
             ORDER BY seq {order} LIMIT ?4 OFFSET ?5"
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(
            params![
                team_id,
                sandbox_id,
                serde_json::to_string(types)?,
                limit as i64,
                offset as i64
            ],
            event_from_row,
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    // ---- webhooks ----

    pub fn create_webhook(&self, hook: &WebhookRecord) -> Result<()> {
        self.conn().execute(
            &format!(
                "INSERT INTO webhooks ({WEBHOOK_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ),
            params![
                hook.id,
                hook.team_id,
                hook.name,
                hook.url,
                hook.enabled,
                serde_json::to_string(&hook.events)?,
                hook.secret,
                to_ms(hook.created_at)
            ],
        )?;
        Ok(())
    }

    pub fn webhooks(&self, team_id: &str) -> Result<Vec<WebhookRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE team_id = ?1 ORDER BY created_at_ms, id"
        ))?;
        let rows = stmt.query_map([team_id], webhook_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn webhook(&self, team_id: &str, id: &str) -> Result<Option<WebhookRecord>> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE team_id = ?1 AND id = ?2"),
                params![team_id, id],
                webhook_from_row,
            )
            .optional()?)
    }

    pub fn update_webhook(
        &self,
        team_id: &str,
        id: &str,
        changes: &WebhookChanges,
    ) -> Result<WebhookRecord> {
        let mut hook = self
            .webhook(team_id, id)?
            .ok_or_else(|| StoreError::NotFound(format!("webhook {id}")))?;
        if let Some(name) = &changes.name {
            hook.name = name.clone();
        }
        if let Some(url) = &changes.url {
            hook.url = url.clone();
        }
        if let Some(enabled) = changes.enabled {
            hook.enabled = enabled;
        }
        if let Some(events) = &changes.events {
            hook.events = events.clone();
        }
        if let Some(secret) = &changes.secret {
            hook.secret = secret.clone();
        }
        self.conn().execute(
            "UPDATE webhooks SET name = ?1, url = ?2, enabled = ?3, events = ?4, secret = ?5 \
             WHERE id = ?6 AND team_id = ?7",
            params![
                hook.name,
                hook.url,
                hook.enabled,
                serde_json::to_string(&hook.events)?,
                hook.secret,
                id,
                team_id
            ],
        )?;
        Ok(hook)
    }

    pub fn delete_webhook(&self, team_id: &str, id: &str) -> Result<()> {
        let conn = self.conn();
        let changed = conn.execute(
            "DELETE FROM webhooks WHERE id = ?1 AND team_id = ?2",
            params![id, team_id],
        )?;
        if changed == 0 {
            return Err(StoreError::NotFound(format!("webhook {id}")));
        }
        conn.execute("DELETE FROM webhook_deliveries WHERE webhook_id = ?1", [id])?;
        Ok(())
    }

    /// Deliveries due at `at`, oldest first.
    pub fn due_deliveries(&self, at: OffsetDateTime, limit: usize) -> Result<Vec<PendingDelivery>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT d.id, d.webhook_id, w.url, w.secret, d.body, d.attempts \
             FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id \
             WHERE d.next_attempt_ms <= ?1 ORDER BY d.next_attempt_ms, d.id LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![to_ms(at), limit as i64], |r| {
            Ok(PendingDelivery {
                id: r.get(0)?,
                webhook_id: r.get(1)?,
                url: r.get(2)?,
                secret: r.get(3)?,
                body: r.get(4)?,
                attempts: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Earliest time any delivery is due.
    pub fn next_delivery_at(&self) -> Result<Option<OffsetDateTime>> {
        let ms: Option<i64> = self.conn().query_row(
            "SELECT MIN(next_attempt_ms) FROM webhook_deliveries",
            [],
            |r| r.get(0),
        )?;
        Ok(ms.map(from_ms))
    }

    /// A delivery succeeded (or is abandoned): forget it.
    pub fn finish_delivery(&self, id: i64) -> Result<()> {
        self.conn()
            .execute("DELETE FROM webhook_deliveries WHERE id = ?1", [id])?;
        Ok(())
    }

    /// A delivery failed: try again at `next`.
    pub fn retry_delivery(&self, id: i64, next: OffsetDateTime) -> Result<()> {
        self.conn().execute(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, next_attempt_ms = ?1 WHERE id = ?2",
            params![to_ms(next), id],
        )?;
        Ok(())
    }
}

const WEBHOOK_COLUMNS: &str = "id, team_id, name, url, enabled, events, secret, created_at_ms";

fn metric_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MetricSample> {
    Ok(MetricSample {
        timestamp_unix: r.get(0)?,
        cpu_count: r.get(1)?,
        cpu_used_pct: r.get(2)?,
        mem_used: r.get::<_, i64>(3)? as u64,
        mem_total: r.get::<_, i64>(4)? as u64,
        mem_cache: r.get::<_, i64>(5)? as u64,
        disk_used: r.get::<_, i64>(6)? as u64,
        disk_total: r.get::<_, i64>(7)? as u64,
    })
}

const SNAPSHOT_COLUMNS: &str = "id, team_id, name, source_sandbox_id, template_id, build_id, \
     cpu_count, memory_mb, disk_size_mb, env_vars, envd_access_token, path, size_bytes, \
     created_at_ms, memory";

fn snapshot_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotRecord> {
    let env_vars: String = row.get(9)?;
    Ok(SnapshotRecord {
        id: row.get(0)?,
        team_id: row.get(1)?,
        name: row.get(2)?,
        source_sandbox_id: row.get(3)?,
        template_id: row.get(4)?,
        build_id: row.get(5)?,
        cpu_count: row.get(6)?,
        memory_mb: row.get(7)?,
        disk_size_mb: row.get(8)?,
        env_vars: serde_json::from_str(&env_vars).unwrap_or_default(),
        envd_access_token: row.get(10)?,
        path: row.get(11)?,
        size_bytes: row.get::<_, i64>(12)? as u64,
        created_at: from_ms(row.get(13)?),
        memory: row.get(14)?,
    })
}

fn sandbox_matches(sandbox: &SandboxRecord, filter: &SandboxFilter) -> bool {
    let wanted = match sandbox.status {
        SandboxStatus::Running => filter.states.running,
        SandboxStatus::Paused { .. } => filter.states.paused,
        SandboxStatus::Killed => false,
    };
    if !wanted {
        return false;
    }
    if let Some(template) = &filter.template {
        if sandbox.template_id != *template && sandbox.alias.as_deref() != Some(template.as_str()) {
            return false;
        }
    }
    if let Some(after) = filter.started_after {
        if sandbox.started_at < after {
            return false;
        }
    }
    filter
        .metadata
        .iter()
        .all(|(k, v)| sandbox.metadata.get(k) == Some(v))
}

#[cfg(test)]
mod tests;
