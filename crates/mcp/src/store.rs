//! The MCP state database, `<state_dir>/mcp/mcp.sqlite3` (SQLite, WAL): connections
//! (API URL in clear, API key sealed), one-time connect tokens (stored as SHA-256 hashes),
//! tracked sandboxes with their leases, and sealed per-sandbox state. Secrets only ever
//! live in the `sealed` table, encrypted by [`berth_vault::Vault`].

use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::McpError;
use berth_vault::SealedRecord;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sealed (
    context TEXT PRIMARY KEY,
    kek_version INTEGER NOT NULL,
    wrapped_key BLOB NOT NULL,
    ciphertext BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS connections (
    identity TEXT PRIMARY KEY,
    api_url TEXT NOT NULL,
    sandbox_url TEXT,
    connected_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS connect_tokens (
    token_hash TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    ended_at INTEGER
);
CREATE TABLE IF NOT EXISTS sandboxes (
    identity TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    title TEXT,
    template TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    released INTEGER NOT NULL DEFAULT 0,
    release_attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (identity, sandbox_id)
);
CREATE INDEX IF NOT EXISTS sandboxes_by_lease ON sandboxes (released, lease_expires_at);
";

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs() as i64)
        .unwrap_or(0)
}

/// A stored connection's public part; the key is sealed separately.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRow {
    pub api_url: String,
    pub sandbox_url: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRow {
    pub identity: String,
    pub sandbox_id: String,
    pub session_id: String,
    pub title: Option<String>,
    pub template: String,
    pub status: String,
    pub created_at: i64,
    pub lease_expires_at: i64,
    pub release_attempts: i64,
}

pub struct Store {
    connection: Mutex<Connection>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, McpError> {
        if let Some(parent) = path.parent() {
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o700,
            )
            .create(parent)
            .map_err(|error| McpError::io("creating the MCP state directory", error))?;
        }
        // Connections' sealed keys and session state: owner-only (SQLite gives its WAL
        // and SHM files the database's mode).
        match std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new().write(true).create_new(true),
            0o600,
        )
        .open(path)
        {
            Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(McpError::io("creating the MCP database", error))
            }
            _ => {}
        }
        let connection = Connection::open(path)?;
        connection.busy_timeout(std::time::Duration::from_secs(5))?;
        connection.pragma_update(None, "journal_mode", "WAL")?;
        // WAL with NORMAL sync cannot corrupt the database; a power cut may lose the last
        // lease renewals, which only makes a lease end a little earlier.
        connection.pragma_update(None, "synchronous", "NORMAL")?;
        connection.execute_batch(SCHEMA)?;
        Ok(Self {
            connection: Mutex::new(connection),
        })
    }

    fn with<T>(
        &self,
        work: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, McpError> {
        let connection = self
            .connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(work(&connection)?)
    }

    pub fn put_sealed(&self, context: &str, record: &SealedRecord) -> Result<(), McpError> {
        self.with(|db| {
            db.execute(
                "INSERT INTO sealed (context, kek_version, wrapped_key, ciphertext)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (context) DO UPDATE SET kek_version = ?2, wrapped_key = ?3,
                 ciphertext = ?4",
                params![
                    context,
                    record.kek_version,
                    record.wrapped_key,
                    record.ciphertext
                ],
            )
            .map(drop)
        })
    }

    pub fn get_sealed(&self, context: &str) -> Result<Option<SealedRecord>, McpError> {
        self.with(|db| {
            db.query_row(
                "SELECT kek_version, wrapped_key, ciphertext FROM sealed WHERE context = ?1",
                [context],
                |row| {
                    Ok(SealedRecord {
                        kek_version: row.get(0)?,
                        wrapped_key: row.get(1)?,
                        ciphertext: row.get(2)?,
                    })
                },
            )
            .optional()
        })
    }

    pub fn sealed_contexts(&self) -> Result<Vec<String>, McpError> {
        self.with(|db| {
            let mut statement = db.prepare("SELECT context FROM sealed ORDER BY context")?;
            let rows = statement.query_map([], |row| row.get(0))?;
            rows.collect()
        })
    }

    pub fn put_connection(&self, identity: &str, row: &ConnectionRow) -> Result<(), McpError> {
        self.with(|db| {
            db.execute(
                "INSERT INTO connections (identity, api_url, sandbox_url, connected_at)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (identity) DO UPDATE SET api_url = ?2, sandbox_url = ?3,
                 connected_at = ?4",
                params![identity, row.api_url, row.sandbox_url, unix_now()],
            )
            .map(drop)
        })
    }

    pub fn get_connection(&self, identity: &str) -> Result<Option<ConnectionRow>, McpError> {
        self.with(|db| {
            db.query_row(
                "SELECT api_url, sandbox_url FROM connections WHERE identity = ?1",
                [identity],
                |row| {
                    Ok(ConnectionRow {
                        api_url: row.get(0)?,
                        sandbox_url: row.get(1)?,
                    })
                },
            )
            .optional()
        })
    }

    pub fn put_connect_token(
        &self,
        token_hash: &str,
        identity: &str,
        expires_at: i64,
    ) -> Result<(), McpError> {
        self.with(|db| {
            db.execute(
                "DELETE FROM connect_tokens WHERE expires_at < ?1",
                [unix_now()],
            )?;
            db.execute(
                "INSERT INTO connect_tokens (token_hash, identity, expires_at) VALUES (?1, ?2, ?3)",
                params![token_hash, identity, expires_at],
            )
            .map(drop)
        })
    }

    /// The identity a live token belongs to.
    pub fn connect_token_identity(&self, token_hash: &str) -> Result<Option<String>, McpError> {
        self.with(|db| {
            db.query_row(
                "SELECT identity FROM connect_tokens WHERE token_hash = ?1 AND expires_at >= ?2",
                params![token_hash, unix_now()],
                |row| row.get(0),
            )
            .optional()
        })
    }

    pub fn delete_connect_token(&self, token_hash: &str) -> Result<(), McpError> {
        self.with(|db| {
            db.execute(
                "DELETE FROM connect_tokens WHERE token_hash = ?1",
                [token_hash],
            )
            .map(drop)
        })
    }

    /// Records that `session_id` belongs to `identity`; false if another identity owns it.
    pub fn claim_session(&self, session_id: &str, identity: &str) -> Result<bool, McpError> {
        self.with(|db| {
            db.execute(
                "INSERT OR IGNORE INTO sessions (session_id, identity, started_at) VALUES (?1, ?2, ?3)",
                params![session_id, identity, unix_now()],
            )?;
            let owner: String = db.query_row(
                "SELECT identity FROM sessions WHERE session_id = ?1",
                [session_id],
                |row| row.get(0),
            )?;
            Ok(owner == identity)
        })
    }

    /// Marks a session ended and lets its unreleased leases expire now.
    pub fn end_session(&self, session_id: &str) -> Result<usize, McpError> {
        let now = unix_now();
        self.with(|db| {
            db.execute(
                "UPDATE sessions SET ended_at = ?2 WHERE session_id = ?1",
                params![session_id, now],
            )?;
            db.execute(
                "UPDATE sandboxes SET lease_expires_at = MIN(lease_expires_at, ?2)
                 WHERE session_id = ?1 AND released = 0",
                params![session_id, now],
            )
        })
    }

    pub fn insert_sandbox(&self, row: &SandboxRow) -> Result<(), McpError> {
        self.with(|db| {
            db.execute(
                "INSERT INTO sandboxes (identity, sandbox_id, session_id, title, template, status,
                 created_at, lease_expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (identity, sandbox_id) DO UPDATE SET session_id = ?3, title = ?4,
                 template = ?5, status = ?6, lease_expires_at = ?8, released = 0,
                 release_attempts = 0, next_attempt_at = 0",
                params![
                    row.identity,
                    row.sandbox_id,
                    row.session_id,
                    row.title,
                    row.template,
                    row.status,
                    row.created_at,
                    row.lease_expires_at
                ],
            )
            .map(drop)
        })
    }

    /// A sandbox of `identity` tracked in `session_id`.
    pub fn session_sandbox(
        &self,
        identity: &str,
        session_id: &str,
        sandbox_id: &str,
    ) -> Result<Option<SandboxRow>, McpError> {
        self.with(|db| {
            db.query_row(
                &format!(
                    "{SELECT_SANDBOX} WHERE identity = ?1 AND session_id = ?2 AND sandbox_id = ?3"
                ),
                params![identity, session_id, sandbox_id],
                sandbox_row,
            )
            .optional()
        })
    }

    pub fn session_sandboxes(
        &self,
        identity: &str,
        session_id: &str,
    ) -> Result<Vec<SandboxRow>, McpError> {
        self.with(|db| {
            let mut statement = db.prepare(&format!(
                "{SELECT_SANDBOX} WHERE identity = ?1 AND session_id = ?2 AND status != 'deleted'
                 ORDER BY created_at, sandbox_id"
            ))?;
            let rows = statement.query_map(params![identity, session_id], sandbox_row)?;
            rows.collect()
        })
    }

    /// Renews the lease of an identity's tracked sandbox (any session); returns whether a
    /// live lease was found.
    pub fn renew_lease(
        &self,
        identity: &str,
        sandbox_id: &str,
        expires_at: i64,
    ) -> Result<bool, McpError> {
        self.with(|db| {
            db.execute(
                "UPDATE sandboxes SET lease_expires_at = MAX(lease_expires_at, ?3)
                 WHERE identity = ?1 AND sandbox_id = ?2 AND released = 0",
                params![identity, sandbox_id, expires_at],
            )
            .map(|changed| changed > 0)
        })
    }

    pub fn set_status(
        &self,
        identity: &str,
        sandbox_id: &str,
        status: &str,
        released: bool,
    ) -> Result<(), McpError> {
        self.with(|db| {
            db.execute(
                "UPDATE sandboxes SET status = ?3, released = ?4 WHERE identity = ?1 AND sandbox_id = ?2",
                params![identity, sandbox_id, status, released],
            )
            .map(drop)
        })
    }

    /// Unreleased sandboxes whose lease ran out and whose retry time has come.
    pub fn expired_leases(&self, now: i64) -> Result<Vec<SandboxRow>, McpError> {
        self.with(|db| {
            let mut statement = db.prepare(&format!(
                "{SELECT_SANDBOX} WHERE released = 0 AND lease_expires_at <= ?1
                 AND next_attempt_at <= ?1 ORDER BY lease_expires_at"
            ))?;
            let rows = statement.query_map([now], sandbox_row)?;
            rows.collect()
        })
    }

    pub fn release_failed(
        &self,
        identity: &str,
        sandbox_id: &str,
        next_attempt_at: i64,
    ) -> Result<(), McpError> {
        self.with(|db| {
            db.execute(
                "UPDATE sandboxes SET release_attempts = release_attempts + 1, next_attempt_at = ?3
                 WHERE identity = ?1 AND sandbox_id = ?2",
                params![identity, sandbox_id, next_attempt_at],
            )
            .map(drop)
        })
    }
}

const SELECT_SANDBOX: &str = "SELECT identity, sandbox_id, session_id, title, template, status,
    created_at, lease_expires_at, release_attempts FROM sandboxes";

fn sandbox_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SandboxRow> {
    Ok(SandboxRow {
        identity: row.get(0)?,
        sandbox_id: row.get(1)?,
        session_id: row.get(2)?,
        title: row.get(3)?,
        template: row.get(4)?,
        status: row.get(5)?,
        created_at: row.get(6)?,
        lease_expires_at: row.get(7)?,
        release_attempts: row.get(8)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(identity: &str, id: &str, session: &str, lease: i64) -> SandboxRow {
        SandboxRow {
            identity: identity.into(),
            sandbox_id: id.into(),
            session_id: session.into(),
            title: None,
            template: "base".into(),
            status: "running".into(),
            created_at: 1,
            lease_expires_at: lease,
            release_attempts: 0,
        }
    }

    #[test]
    fn leases_expire_on_session_end_and_back_off_after_failure() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let far = unix_now() + 3600;
        store
            .insert_sandbox(&sandbox("alice", "ia", "s1", far))
            .unwrap();
        store
            .insert_sandbox(&sandbox("alice", "ib", "s2", far))
            .unwrap();
        assert!(store.expired_leases(unix_now()).unwrap().is_empty());
        assert_eq!(store.end_session("s1").unwrap(), 1);
        let expired = store.expired_leases(unix_now()).unwrap();
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].sandbox_id, "ia");
        store.release_failed("alice", "ia", far).unwrap();
        assert!(store.expired_leases(unix_now()).unwrap().is_empty());
        assert_eq!(store.expired_leases(far).unwrap()[0].release_attempts, 1);
        store.set_status("alice", "ia", "deleted", true).unwrap();
        assert!(store
            .expired_leases(far + 1)
            .unwrap()
            .iter()
            .all(|r| r.sandbox_id == "ib"));
    }

    #[test]
    fn sessions_and_sandboxes_are_scoped_by_identity() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        assert!(store.claim_session("s1", "alice").unwrap());
        assert!(!store.claim_session("s1", "bob").unwrap());
        store
            .insert_sandbox(&sandbox("alice", "ia", "s1", 10))
            .unwrap();
        assert!(store.session_sandbox("bob", "s1", "ia").unwrap().is_none());
        assert!(store
            .session_sandbox("alice", "s1", "ia")
            .unwrap()
            .is_some());
        assert!(!store.renew_lease("bob", "ia", 99).unwrap());
        assert!(store.renew_lease("alice", "ia", 99).unwrap());
    }
}
