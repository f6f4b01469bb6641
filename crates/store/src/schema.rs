//! Schema migrations, applied in order and recorded in SQLite's `user_version`.

use rusqlite::Connection;

/// Each entry moves the schema from version `index` to `index + 1`. Append only.
const MIGRATIONS: &[&str] = &[
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
];

/// Bring the database to the newest schema, one transaction per migration.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let current: usize =
        conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        // IMMEDIATE takes the write lock up front, so two processes opening a fresh
        // database at once serialize instead of both applying the migration.
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version as usize > index {
            conn.execute_batch("COMMIT")?;
            continue;
        }
        let applied = conn
            .execute_batch(sql)
            .and_then(|()| conn.pragma_update(None, "user_version", (index + 1) as i64));
        match applied {
            Ok(()) => conn.execute_batch("COMMIT")?,
            Err(err) => {
                conn.execute_batch("ROLLBACK")?;
                return Err(err);
            }
        }
    }
    Ok(())
}
