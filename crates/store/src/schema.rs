//! Schema migrations, applied in order and recorded in SQLite's `user_version`.
//!
//! The DDL is SQLite's (`INTEGER PRIMARY KEY AUTOINCREMENT`, `json_each` in the
//! backfill); a Postgres backend keeps the same numbered list in its own dialect.

use rusqlite::Connection;

use crate::error::{Result, StoreError};

/// Each entry moves the schema from version `index` to `index + 1`. Append only.
pub(crate) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE teams (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    is_default INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(id),
    name TEXT NOT NULL,
    key_hash TEXT NOT NULL UNIQUE,
    value_length INTEGER NOT NULL,
    masked_prefix TEXT NOT NULL,
    masked_suffix TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    last_used_ms INTEGER
);
CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(id),
    template_id TEXT NOT NULL,
    alias TEXT,
    build_id TEXT NOT NULL,
    cpu_count INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    disk_size_mb INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    envd_version TEXT NOT NULL,
    envd_access_token TEXT,
    allow_internet_access INTEGER,
    started_at_ms INTEGER NOT NULL,
    end_at_ms INTEGER NOT NULL,
    status TEXT NOT NULL
);
CREATE INDEX sandboxes_team_status ON sandboxes(team_id, status);
CREATE TABLE idempotency_keys (
    team_id TEXT NOT NULL,
    key TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (team_id, key)
);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    team_id TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    template_id TEXT NOT NULL,
    build_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    data TEXT,
    timestamp_ms INTEGER NOT NULL
);
CREATE INDEX events_team ON events(team_id, seq);
CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(id),
    name TEXT NOT NULL,
    url TEXT NOT NULL,
    enabled INTEGER NOT NULL,
    events TEXT NOT NULL,
    secret TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE webhook_deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    body TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    next_attempt_ms INTEGER NOT NULL
);
CREATE TABLE sandbox_logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id TEXT NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    level TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX sandbox_logs_sandbox ON sandbox_logs(sandbox_id, timestamp_ms);
CREATE TABLE sandbox_metrics (
    sandbox_id TEXT NOT NULL,
    timestamp_unix INTEGER NOT NULL,
    cpu_count INTEGER NOT NULL,
    cpu_used_pct REAL NOT NULL,
    mem_used INTEGER NOT NULL,
    mem_total INTEGER NOT NULL,
    mem_cache INTEGER NOT NULL,
    disk_used INTEGER NOT NULL,
    disk_total INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, timestamp_unix)
);
"#,
    r#"
ALTER TABLE sandboxes ADD COLUMN env_vars TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sandboxes ADD COLUMN timeout_secs INTEGER NOT NULL DEFAULT 300;
ALTER TABLE sandboxes ADD COLUMN auto_pause INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN auto_pause_memory INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN paused_memory INTEGER;
CREATE TABLE snapshots (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(id),
    name TEXT NOT NULL,
    source_sandbox_id TEXT NOT NULL,
    template_id TEXT NOT NULL,
    build_id TEXT NOT NULL,
    cpu_count INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    disk_size_mb INTEGER NOT NULL,
    env_vars TEXT NOT NULL,
    envd_access_token TEXT,
    path TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    memory INTEGER NOT NULL,
    UNIQUE (team_id, name)
);
"#,
    // Keyset listings: sandboxes by team, state and start time; snapshots by team and
    // creation time. Metadata pairs one per row, filled from the JSON column (rows whose
    // JSON is corrupt are skipped here and reported when read).
    r#"
DROP INDEX sandboxes_team_status;
CREATE INDEX sandboxes_team_status_started ON sandboxes(team_id, status, started_at_ms, id);
CREATE INDEX snapshots_team_created ON snapshots(team_id, created_at_ms, id);
CREATE TABLE sandbox_metadata (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, key)
);
INSERT INTO sandbox_metadata (sandbox_id, key, value)
    SELECT s.id, j.key, j.value FROM sandboxes s, json_each(s.metadata) j
    WHERE json_valid(s.metadata) AND json_type(s.metadata) = 'object' AND j.type = 'text';
"#,
    // Snapshots name their checkpoint by id (the runtime owns where it lives). Rows
    // written before hold the checkpoint directory, whose last component is that id.
    r#"
ALTER TABLE snapshots RENAME COLUMN path TO checkpoint_id;
"#,
    // Sandbox networking: each sandbox's network policy (berth-net's JSON form; NULL =
    // E2B's default, internet access) and its traffic access token when public traffic
    // is off; snapshots carry the policy to the sandboxes started from them.
    r#"
ALTER TABLE sandboxes ADD COLUMN network TEXT;
ALTER TABLE sandboxes ADD COLUMN traffic_access_token TEXT;
ALTER TABLE snapshots ADD COLUMN network TEXT;
"#,
    // Volumes and the sandboxes (and snapshots) mounting them; secrets and their sealed
    // versions (berth-vault envelopes).
    r#"
CREATE TABLE volumes (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(id),
    name TEXT NOT NULL,
    token TEXT NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL,
    UNIQUE (team_id, name)
);
ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]';
ALTER TABLE snapshots ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]';
CREATE TABLE sandbox_volumes (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
    position INTEGER NOT NULL,
    volume_id TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, position)
);
CREATE INDEX sandbox_volumes_volume ON sandbox_volumes(volume_id);
CREATE TABLE secrets (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(id),
    name TEXT NOT NULL,
    current_version INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    UNIQUE (team_id, name)
);
CREATE INDEX secrets_team_created ON secrets(team_id, created_at_ms, id);
CREATE TABLE secret_versions (
    secret_id TEXT NOT NULL REFERENCES secrets(id) ON DELETE CASCADE,
    version INTEGER NOT NULL,
    kek_version INTEGER NOT NULL,
    wrapped_key BLOB NOT NULL,
    ciphertext BLOB NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (secret_id, version)
);
"#,
    // Templates belong to teams (team_id NULL: installed on the host, e.g. `base`), with
    // their builds (each names the template store manifest it wrote) and tags.
    r#"
CREATE TABLE templates (
    id TEXT PRIMARY KEY,
    team_id TEXT REFERENCES teams(id),
    alias TEXT NOT NULL,
    public INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    last_spawned_at_ms INTEGER,
    spawn_count INTEGER NOT NULL
);
CREATE UNIQUE INDEX templates_team_alias ON templates(coalesce(team_id, ''), alias);
CREATE INDEX templates_team_created ON templates(team_id, created_at_ms, id);
CREATE TABLE template_builds (
    id TEXT PRIMARY KEY,
    template_id TEXT NOT NULL REFERENCES templates(id),
    status TEXT NOT NULL,
    reason TEXT,
    tags TEXT NOT NULL,
    manifest_id TEXT NOT NULL,
    cpu_count INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    disk_size_mb INTEGER NOT NULL,
    envd_version TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    finished_at_ms INTEGER
);
CREATE INDEX template_builds_template_created ON template_builds(template_id, created_at_ms, id);
CREATE TABLE template_tags (
    template_id TEXT NOT NULL REFERENCES templates(id),
    tag TEXT NOT NULL,
    build_id TEXT NOT NULL REFERENCES template_builds(id),
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (template_id, tag)
);
"#,
    // Execution ids: E2B starts a new one each time a sandbox starts or resumes, and
    // every event names the execution it happened in. Rows from before have none
    // (reported as the sandbox id).
    r#"
ALTER TABLE sandboxes ADD COLUMN execution_id TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN execution_id TEXT NOT NULL DEFAULT '';
"#,
    // Retention: when a sandbox was paused (rows paused before: their last `paused`
    // event, else their start) and which snapshot a sandbox was started from (while it
    // lives, that snapshot is in use).
    r#"
ALTER TABLE sandboxes ADD COLUMN paused_at_ms INTEGER;
ALTER TABLE sandboxes ADD COLUMN from_snapshot TEXT;
UPDATE sandboxes SET paused_at_ms = coalesce(
    (SELECT max(e.timestamp_ms) FROM events e
     WHERE e.sandbox_id = sandboxes.id AND e.event_type = 'sandbox.lifecycle.paused'),
    started_at_ms)
WHERE status = 'paused';
CREATE INDEX sandboxes_from_snapshot ON sandboxes(from_snapshot) WHERE from_snapshot IS NOT NULL;
"#,
    // Webhook delivery history: a delivery stays after its last attempt (delivered or
    // failed) with its answer, so a team can see what reached its receivers. Rows from
    // before were all pending.
    r#"
ALTER TABLE webhook_deliveries ADD COLUMN status TEXT NOT NULL DEFAULT 'pending';
ALTER TABLE webhook_deliveries ADD COLUMN response_code INTEGER;
ALTER TABLE webhook_deliveries ADD COLUMN last_error TEXT;
ALTER TABLE webhook_deliveries ADD COLUMN last_attempt_ms INTEGER;
ALTER TABLE webhook_deliveries ADD COLUMN created_at_ms INTEGER NOT NULL DEFAULT 0;
UPDATE webhook_deliveries SET created_at_ms = coalesce(
    (SELECT e.timestamp_ms FROM events e WHERE e.id = webhook_deliveries.event_id),
    next_attempt_ms);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries(webhook_id, id);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries(status, next_attempt_ms);
"#,
];

/// The schema version this berth writes.
pub(crate) const VERSION: usize = MIGRATIONS.len();

/// Bring the database to the newest schema, one transaction per migration. A database
/// from a newer berth is refused rather than used with a schema this code does not know.
pub(crate) fn migrate(conn: &Connection) -> Result<()> {
    let current = user_version(conn)?;
    if current > VERSION as i64 {
        return Err(StoreError::NewerSchema {
            found: current,
            known: VERSION,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let version = index + 1;
        apply(conn, index, sql).map_err(|source| StoreError::Migration { version, source })?;
    }
    Ok(())
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

/// Apply migration `index` unless another process did first.
fn apply(conn: &Connection, index: usize, sql: &str) -> rusqlite::Result<()> {
    // IMMEDIATE takes the write lock up front, so two processes opening a fresh
    // database at once serialize instead of both applying the migration.
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let applied = user_version(conn).and_then(|version| {
        if version as usize > index {
            return Ok(());
        }
        conn.execute_batch(sql)?;
        conn.pragma_update(None, "user_version", (index + 1) as i64)
    });
    match applied {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(err) => {
            conn.execute_batch("ROLLBACK")?;
            Err(err)
        }
    }
}
