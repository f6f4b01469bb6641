//! Schema migrations: one numbered list for both backends, applied in order, each step
//! in one transaction.
//!
//! Each step carries its SQLite and its Postgres DDL ([`Migration`]); they differ in
//! types only where the dialects do: `INTEGER` (64-bit in SQLite) is `BIGINT`, 0/1
//! flags are `BOOLEAN`, `REAL` is `DOUBLE PRECISION`, `BLOB` is `BYTEA`, `INTEGER
//! PRIMARY KEY AUTOINCREMENT` is an identity column, and every `TEXT` column is
//! `COLLATE "C"` so text orders by bytes as in SQLite (ids in keyset cursors, names in
//! listings; a test holds every Postgres text column to it).
//!
//! Where the version lives: SQLite's `PRAGMA user_version`, taken under `BEGIN
//! IMMEDIATE` so two processes opening a fresh file serialise; Postgres's
//! `berth_schema_migrations` table (one row per applied step), under a session advisory
//! lock named after the schema, so several `berth` processes starting at once against
//! one database migrate it once: the first takes the lock and migrates, the others wait
//! for it and find nothing left to do.

use crate::db::{params, Conn, Dialect};
use crate::error::{Result, StoreError};

/// One step of the schema, in each dialect.
pub(crate) struct Migration {
    pub(crate) sqlite: &'static str,
    pub(crate) postgres: &'static str,
}

impl Migration {
    /// A step both dialects write the same way.
    const fn same(sql: &'static str) -> Self {
        Migration {
            sqlite: sql,
            postgres: sql,
        }
    }

    fn sql(&self, dialect: Dialect) -> &'static str {
        match dialect {
            Dialect::Sqlite => self.sqlite,
            Dialect::Postgres => self.postgres,
        }
    }
}

/// Each entry moves the schema from version `index` to `index + 1`. Append only.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        sqlite: r#"
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
        postgres: r#"
CREATE TABLE teams (
    id TEXT COLLATE "C" PRIMARY KEY,
    name TEXT COLLATE "C" NOT NULL UNIQUE,
    is_default BOOLEAN NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE TABLE api_keys (
    id TEXT COLLATE "C" PRIMARY KEY,
    team_id TEXT COLLATE "C" NOT NULL REFERENCES teams(id),
    name TEXT COLLATE "C" NOT NULL,
    key_hash TEXT COLLATE "C" NOT NULL UNIQUE,
    value_length BIGINT NOT NULL,
    masked_prefix TEXT COLLATE "C" NOT NULL,
    masked_suffix TEXT COLLATE "C" NOT NULL,
    created_at_ms BIGINT NOT NULL,
    last_used_ms BIGINT
);
CREATE TABLE sandboxes (
    id TEXT COLLATE "C" PRIMARY KEY,
    team_id TEXT COLLATE "C" NOT NULL REFERENCES teams(id),
    template_id TEXT COLLATE "C" NOT NULL,
    alias TEXT COLLATE "C",
    build_id TEXT COLLATE "C" NOT NULL,
    cpu_count BIGINT NOT NULL,
    memory_mb BIGINT NOT NULL,
    disk_size_mb BIGINT NOT NULL,
    metadata TEXT COLLATE "C" NOT NULL,
    envd_version TEXT COLLATE "C" NOT NULL,
    envd_access_token TEXT COLLATE "C",
    allow_internet_access BOOLEAN,
    started_at_ms BIGINT NOT NULL,
    end_at_ms BIGINT NOT NULL,
    status TEXT COLLATE "C" NOT NULL
);
CREATE INDEX sandboxes_team_status ON sandboxes(team_id, status);
CREATE TABLE idempotency_keys (
    team_id TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    sandbox_id TEXT COLLATE "C" NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (team_id, key)
);
CREATE TABLE events (
    seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    id TEXT COLLATE "C" NOT NULL UNIQUE,
    team_id TEXT COLLATE "C" NOT NULL,
    sandbox_id TEXT COLLATE "C" NOT NULL,
    template_id TEXT COLLATE "C" NOT NULL,
    build_id TEXT COLLATE "C" NOT NULL,
    event_type TEXT COLLATE "C" NOT NULL,
    data TEXT COLLATE "C",
    timestamp_ms BIGINT NOT NULL
);
CREATE INDEX events_team ON events(team_id, seq);
CREATE TABLE webhooks (
    id TEXT COLLATE "C" PRIMARY KEY,
    team_id TEXT COLLATE "C" NOT NULL REFERENCES teams(id),
    name TEXT COLLATE "C" NOT NULL,
    url TEXT COLLATE "C" NOT NULL,
    enabled BOOLEAN NOT NULL,
    events TEXT COLLATE "C" NOT NULL,
    secret TEXT COLLATE "C" NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE TABLE webhook_deliveries (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    webhook_id TEXT COLLATE "C" NOT NULL,
    event_id TEXT COLLATE "C" NOT NULL,
    body TEXT COLLATE "C" NOT NULL,
    attempts BIGINT NOT NULL,
    next_attempt_ms BIGINT NOT NULL
);
CREATE TABLE sandbox_logs (
    seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    sandbox_id TEXT COLLATE "C" NOT NULL,
    timestamp_ms BIGINT NOT NULL,
    level TEXT COLLATE "C" NOT NULL,
    message TEXT COLLATE "C" NOT NULL
);
CREATE INDEX sandbox_logs_sandbox ON sandbox_logs(sandbox_id, timestamp_ms);
CREATE TABLE sandbox_metrics (
    sandbox_id TEXT COLLATE "C" NOT NULL,
    timestamp_unix BIGINT NOT NULL,
    cpu_count BIGINT NOT NULL,
    cpu_used_pct DOUBLE PRECISION NOT NULL,
    mem_used BIGINT NOT NULL,
    mem_total BIGINT NOT NULL,
    mem_cache BIGINT NOT NULL,
    disk_used BIGINT NOT NULL,
    disk_total BIGINT NOT NULL,
    PRIMARY KEY (sandbox_id, timestamp_unix)
);
"#,
    },
    Migration {
        sqlite: r#"
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
        postgres: r#"
ALTER TABLE sandboxes ADD COLUMN env_vars TEXT COLLATE "C" NOT NULL DEFAULT '{}';
ALTER TABLE sandboxes ADD COLUMN timeout_secs BIGINT NOT NULL DEFAULT 300;
ALTER TABLE sandboxes ADD COLUMN auto_pause BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE sandboxes ADD COLUMN auto_pause_memory BOOLEAN NOT NULL DEFAULT true;
ALTER TABLE sandboxes ADD COLUMN auto_resume BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE sandboxes ADD COLUMN paused_memory BOOLEAN;
CREATE TABLE snapshots (
    id TEXT COLLATE "C" PRIMARY KEY,
    team_id TEXT COLLATE "C" NOT NULL REFERENCES teams(id),
    name TEXT COLLATE "C" NOT NULL,
    source_sandbox_id TEXT COLLATE "C" NOT NULL,
    template_id TEXT COLLATE "C" NOT NULL,
    build_id TEXT COLLATE "C" NOT NULL,
    cpu_count BIGINT NOT NULL,
    memory_mb BIGINT NOT NULL,
    disk_size_mb BIGINT NOT NULL,
    env_vars TEXT COLLATE "C" NOT NULL,
    envd_access_token TEXT COLLATE "C",
    path TEXT COLLATE "C" NOT NULL,
    size_bytes BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    memory BOOLEAN NOT NULL,
    UNIQUE (team_id, name)
);
"#,
    },
    // Keyset listings: sandboxes by team, state and start time; snapshots by team and
    // creation time. Metadata pairs one per row, filled from the JSON column (rows whose
    // JSON is corrupt are skipped here and reported when read).
    // Postgres: no backfill, as no Postgres database holds rows from before this step
    // (berth's Postgres support started at schema 11).
    Migration {
        sqlite: r#"
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
        postgres: r#"
DROP INDEX sandboxes_team_status;
CREATE INDEX sandboxes_team_status_started ON sandboxes(team_id, status, started_at_ms, id);
CREATE INDEX snapshots_team_created ON snapshots(team_id, created_at_ms, id);
CREATE TABLE sandbox_metadata (
    sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes(id),
    key TEXT COLLATE "C" NOT NULL,
    value TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (sandbox_id, key)
);
"#,
    },
    // Snapshots name their checkpoint by id (the runtime owns where it lives). Rows
    // written before hold the checkpoint directory, whose last component is that id.
    Migration::same(
        r#"
ALTER TABLE snapshots RENAME COLUMN path TO checkpoint_id;
"#,
    ),
    // Sandbox networking: each sandbox's network policy (berth-net's JSON form; NULL =
    // E2B's default, internet access) and its traffic access token when public traffic
    // is off; snapshots carry the policy to the sandboxes started from them.
    Migration {
        sqlite: r#"
ALTER TABLE sandboxes ADD COLUMN network TEXT;
ALTER TABLE sandboxes ADD COLUMN traffic_access_token TEXT;
ALTER TABLE snapshots ADD COLUMN network TEXT;
"#,
        postgres: r#"
ALTER TABLE sandboxes ADD COLUMN network TEXT COLLATE "C";
ALTER TABLE sandboxes ADD COLUMN traffic_access_token TEXT COLLATE "C";
ALTER TABLE snapshots ADD COLUMN network TEXT COLLATE "C";
"#,
    },
    // Volumes and the sandboxes (and snapshots) mounting them; secrets and their sealed
    // versions (berth-vault envelopes).
    Migration {
        sqlite: r#"
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
        postgres: r#"
CREATE TABLE volumes (
    id TEXT COLLATE "C" PRIMARY KEY,
    team_id TEXT COLLATE "C" NOT NULL REFERENCES teams(id),
    name TEXT COLLATE "C" NOT NULL,
    token TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at_ms BIGINT NOT NULL,
    UNIQUE (team_id, name)
);
ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT COLLATE "C" NOT NULL DEFAULT '[]';
ALTER TABLE snapshots ADD COLUMN volume_mounts TEXT COLLATE "C" NOT NULL DEFAULT '[]';
CREATE TABLE sandbox_volumes (
    sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes(id),
    position BIGINT NOT NULL,
    volume_id TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (sandbox_id, position)
);
CREATE INDEX sandbox_volumes_volume ON sandbox_volumes(volume_id);
CREATE TABLE secrets (
    id TEXT COLLATE "C" PRIMARY KEY,
    team_id TEXT COLLATE "C" NOT NULL REFERENCES teams(id),
    name TEXT COLLATE "C" NOT NULL,
    current_version BIGINT NOT NULL,
    metadata TEXT COLLATE "C" NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    UNIQUE (team_id, name)
);
CREATE INDEX secrets_team_created ON secrets(team_id, created_at_ms, id);
CREATE TABLE secret_versions (
    secret_id TEXT COLLATE "C" NOT NULL REFERENCES secrets(id) ON DELETE CASCADE,
    version BIGINT NOT NULL,
    kek_version BIGINT NOT NULL,
    wrapped_key BYTEA NOT NULL,
    ciphertext BYTEA NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (secret_id, version)
);
"#,
    },
    // Templates belong to teams (team_id NULL: installed on the host, e.g. `base`), with
    // their builds (each names the template store manifest it wrote) and tags.
    Migration {
        sqlite: r#"
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
        postgres: r#"
CREATE TABLE templates (
    id TEXT COLLATE "C" PRIMARY KEY,
    team_id TEXT COLLATE "C" REFERENCES teams(id),
    alias TEXT COLLATE "C" NOT NULL,
    public BOOLEAN NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    last_spawned_at_ms BIGINT,
    spawn_count BIGINT NOT NULL
);
CREATE UNIQUE INDEX templates_team_alias ON templates((coalesce(team_id, '')), alias);
CREATE INDEX templates_team_created ON templates(team_id, created_at_ms, id);
CREATE TABLE template_builds (
    id TEXT COLLATE "C" PRIMARY KEY,
    template_id TEXT COLLATE "C" NOT NULL REFERENCES templates(id),
    status TEXT COLLATE "C" NOT NULL,
    reason TEXT COLLATE "C",
    tags TEXT COLLATE "C" NOT NULL,
    manifest_id TEXT COLLATE "C" NOT NULL,
    cpu_count BIGINT NOT NULL,
    memory_mb BIGINT NOT NULL,
    disk_size_mb BIGINT NOT NULL,
    envd_version TEXT COLLATE "C" NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    finished_at_ms BIGINT
);
CREATE INDEX template_builds_template_created ON template_builds(template_id, created_at_ms, id);
CREATE TABLE template_tags (
    template_id TEXT COLLATE "C" NOT NULL REFERENCES templates(id),
    tag TEXT COLLATE "C" NOT NULL,
    build_id TEXT COLLATE "C" NOT NULL REFERENCES template_builds(id),
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (template_id, tag)
);
"#,
    },
    // Execution ids: E2B starts a new one each time a sandbox starts or resumes, and
    // every event names the execution it happened in. Rows from before have none
    // (reported as the sandbox id).
    Migration {
        sqlite: r#"
ALTER TABLE sandboxes ADD COLUMN execution_id TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN execution_id TEXT NOT NULL DEFAULT '';
"#,
        postgres: r#"
ALTER TABLE sandboxes ADD COLUMN execution_id TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN execution_id TEXT COLLATE "C" NOT NULL DEFAULT '';
"#,
    },
    // A split deployment's nodes (leases, capacity) and where each sandbox, checkpoint,
    // build and volume lives. `berth up` leaves both empty.
    Migration {
        sqlite: r#"
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    cpu_capacity INTEGER NOT NULL,
    memory_capacity_mb INTEGER NOT NULL,
    slots INTEGER NOT NULL,
    draining INTEGER NOT NULL,
    lost INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    lease_until_ms INTEGER NOT NULL
);
CREATE TABLE placements (
    kind TEXT NOT NULL,
    object_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    PRIMARY KEY (kind, object_id)
);
CREATE INDEX placements_node ON placements(node_id, kind);
"#,
        postgres: r#"
CREATE TABLE nodes (
    id TEXT COLLATE "C" PRIMARY KEY,
    url TEXT COLLATE "C" NOT NULL,
    cpu_capacity BIGINT NOT NULL,
    memory_capacity_mb BIGINT NOT NULL,
    slots BIGINT NOT NULL,
    draining BOOLEAN NOT NULL,
    lost BOOLEAN NOT NULL,
    started_at_ms BIGINT NOT NULL,
    lease_until_ms BIGINT NOT NULL
);
CREATE TABLE placements (
    kind TEXT COLLATE "C" NOT NULL,
    object_id TEXT COLLATE "C" NOT NULL,
    node_id TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (kind, object_id)
);
CREATE INDEX placements_node ON placements(node_id, kind);
"#,
    },
    // Retention: when a sandbox was paused (rows paused before: their last `paused`
    // event, else their start) and which snapshot a sandbox was started from (while it
    // lives, that snapshot is in use).
    Migration {
        sqlite: r#"
ALTER TABLE sandboxes ADD COLUMN paused_at_ms INTEGER;
ALTER TABLE sandboxes ADD COLUMN from_snapshot TEXT;
UPDATE sandboxes SET paused_at_ms = coalesce(
    (SELECT max(e.timestamp_ms) FROM events e
     WHERE e.sandbox_id = sandboxes.id AND e.event_type = 'sandbox.lifecycle.paused'),
    started_at_ms)
WHERE status = 'paused';
CREATE INDEX sandboxes_from_snapshot ON sandboxes(from_snapshot) WHERE from_snapshot IS NOT NULL;
"#,
        postgres: r#"
ALTER TABLE sandboxes ADD COLUMN paused_at_ms BIGINT;
ALTER TABLE sandboxes ADD COLUMN from_snapshot TEXT COLLATE "C";
UPDATE sandboxes SET paused_at_ms = coalesce(
    (SELECT max(e.timestamp_ms) FROM events e
     WHERE e.sandbox_id = sandboxes.id AND e.event_type = 'sandbox.lifecycle.paused'),
    started_at_ms)
WHERE status = 'paused';
CREATE INDEX sandboxes_from_snapshot ON sandboxes(from_snapshot) WHERE from_snapshot IS NOT NULL;
"#,
    },
    // Webhook delivery history: a delivery stays after its last attempt (delivered or
    // failed) with its answer, so a team can see what reached its receivers. Rows from
    // before were all pending.
    Migration {
        sqlite: r#"
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
        postgres: r#"
ALTER TABLE webhook_deliveries ADD COLUMN status TEXT COLLATE "C" NOT NULL DEFAULT 'pending';
ALTER TABLE webhook_deliveries ADD COLUMN response_code BIGINT;
ALTER TABLE webhook_deliveries ADD COLUMN last_error TEXT COLLATE "C";
ALTER TABLE webhook_deliveries ADD COLUMN last_attempt_ms BIGINT;
ALTER TABLE webhook_deliveries ADD COLUMN created_at_ms BIGINT NOT NULL DEFAULT 0;
UPDATE webhook_deliveries SET created_at_ms = coalesce(
    (SELECT e.timestamp_ms FROM events e WHERE e.id = webhook_deliveries.event_id),
    next_attempt_ms);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries(webhook_id, id);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries(status, next_attempt_ms);
"#,
    },
    // A node that is stopping (a clean shutdown) takes no new sandboxes at once, while
    // its lease still runs: back within it, it keeps its running sandboxes.
    Migration {
        sqlite: r#"
ALTER TABLE nodes ADD COLUMN stopping INTEGER NOT NULL DEFAULT 0;
"#,
        postgres: r#"
ALTER TABLE nodes ADD COLUMN stopping BOOLEAN NOT NULL DEFAULT FALSE;
"#,
    },
];

/// The schema version this berth writes.
pub(crate) const VERSION: usize = MIGRATIONS.len();

/// Bring the database to the newest schema. A database from a newer berth is refused
/// rather than used with a schema this code does not know.
pub(crate) fn migrate(conn: &mut Conn<'_>) -> Result<()> {
    migrate_to(conn, VERSION)
}

/// Bring the database to schema `target` (tests build older databases with it).
pub(crate) fn migrate_to(conn: &mut Conn<'_>, target: usize) -> Result<()> {
    match conn.dialect() {
        Dialect::Sqlite => migrate_sqlite(conn, target),
        Dialect::Postgres => migrate_postgres(conn, target),
    }
}

fn refuse_newer(found: i64) -> Result<()> {
    if found > VERSION as i64 {
        return Err(StoreError::NewerSchema {
            found,
            known: VERSION,
        });
    }
    Ok(())
}

fn migrate_sqlite(conn: &mut Conn<'_>, target: usize) -> Result<()> {
    let current = user_version(conn)?;
    refuse_newer(current)?;
    let pending = MIGRATIONS.iter().enumerate().take(target);
    for (index, migration) in pending.skip(current.max(0) as usize) {
        // IMMEDIATE takes the write lock up front, so two processes opening a fresh
        // database at once serialize instead of both applying the migration.
        conn.batch("BEGIN IMMEDIATE")?;
        let applied = user_version(conn).and_then(|version| {
            if version as usize > index {
                return Ok(());
            }
            conn.batch(migration.sql(Dialect::Sqlite))?;
            conn.batch(&format!("PRAGMA user_version = {}", index + 1))
        });
        match applied.and_then(|()| conn.batch("COMMIT")) {
            Ok(()) => {}
            Err(err) => {
                conn.rollback();
                return Err(StoreError::Migration {
                    version: index + 1,
                    source: Box::new(err),
                });
            }
        }
    }
    Ok(())
}

pub(crate) fn user_version(conn: &mut Conn<'_>) -> Result<i64> {
    conn.query_count(
        "SELECT user_version AS n FROM pragma_user_version",
        params![],
    )
}

/// The session advisory lock migrations take, one per schema of the database.
const MIGRATION_LOCK: &str = "hashtext('berth-store migrations ' || current_schema())";

fn migrate_postgres(conn: &mut Conn<'_>, target: usize) -> Result<()> {
    let schema: Option<Option<String>> =
        conn.query_opt("SELECT current_schema() AS schema", params![], |row| {
            crate::columns::Columns::new(row, "current_schema", &[])?.get("schema")
        })?;
    if schema.flatten().is_none() {
        return Err(StoreError::NoSchema {
            target: conn.postgres_target(),
        });
    }
    conn.batch(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"))?;
    let migrated = migrate_postgres_locked(conn, target);
    if conn
        .batch(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"))
        .is_err()
    {
        // Closing the connection releases the lock.
        conn.discard();
    }
    migrated
}

fn migrate_postgres_locked(conn: &mut Conn<'_>, target: usize) -> Result<()> {
    conn.batch(
        "CREATE TABLE IF NOT EXISTS berth_schema_migrations (\
         version BIGINT PRIMARY KEY, applied_at_ms BIGINT NOT NULL)",
    )?;
    let current = postgres_version(conn)?;
    refuse_newer(current)?;
    let pending = MIGRATIONS.iter().enumerate().take(target);
    for (index, migration) in pending.skip(current.max(0) as usize) {
        conn.batch("BEGIN")?;
        let applied = conn.batch(migration.sql(Dialect::Postgres)).and_then(|()| {
            conn.execute(
                "INSERT INTO berth_schema_migrations (version, applied_at_ms) \
                     VALUES (?1, ?2)",
                params![
                    index as u64 + 1,
                    crate::columns::to_ms(crate::columns::now())
                ],
            )
        });
        match applied.and_then(|_| conn.batch("COMMIT")) {
            Ok(()) => {}
            Err(err) => {
                conn.rollback();
                return Err(StoreError::Migration {
                    version: index + 1,
                    source: Box::new(err),
                });
            }
        }
    }
    Ok(())
}

pub(crate) fn postgres_version(conn: &mut Conn<'_>) -> Result<i64> {
    conn.query_count(
        "SELECT coalesce(max(version), 0) AS n FROM berth_schema_migrations",
        params![],
    )
}
