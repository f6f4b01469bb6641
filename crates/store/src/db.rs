//! The connection: opening, locking, and running statements whose rows decode into
//! records through [`crate::columns::Columns`].

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rusqlite::types::Value;
use rusqlite::{Connection, Params, Row};

use crate::error::{Result, StoreError};
use crate::schema;

/// File name of the database inside the state directory.
pub const DATABASE_FILE: &str = "berth.db";

/// How long a statement waits for another process's write lock before failing.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Told how long each store call waited for the connection and then held it (one
/// statement or one transaction), for the operator's metrics.
pub trait QueryObserver: Send + Sync {
    fn query_finished(&self, waited: Duration, held: Duration);
}

/// The database handle. Cheap calls; each takes the connection lock briefly.
pub struct Store {
    conn: Mutex<Connection>,
    observer: OnceLock<Arc<dyn QueryObserver>>,
}

/// The connection, held for one store call; tells the observer how long on drop.
pub(crate) struct Conn<'a> {
    guard: MutexGuard<'a, Connection>,
    asked: Instant,
    taken: Instant,
    observer: Option<&'a Arc<dyn QueryObserver>>,
}

impl Deref for Conn<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.guard
    }
}

impl DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.guard
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        if let Some(observer) = self.observer {
            observer.query_finished(self.taken - self.asked, self.taken.elapsed());
        }
    }
}

impl Store {
    /// Open (creating if needed) the database in `state_dir` and migrate it.
    pub fn open(state_dir: &Path) -> Result<Self> {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(state_dir)
            .map_err(|source| StoreError::StateDir {
                path: state_dir.to_path_buf(),
                source,
            })?;
        let path = state_dir.join(DATABASE_FILE);
        create_private(&path).map_err(|source| StoreError::StateDir {
            path: path.clone(),
            source,
        })?;
        let conn = Connection::open(&path)
            .and_then(|conn| {
                // Another berth process (e.g. `berth keys create` during `berth up`) may
                // hold the write lock briefly; wait for it rather than failing.
                conn.busy_timeout(BUSY_TIMEOUT)?;
                conn.pragma_update(None, "journal_mode", "WAL")?;
                conn.pragma_update(None, "synchronous", "NORMAL")?;
                conn.pragma_update(None, "foreign_keys", "ON")?;
                Ok(conn)
            })
            .map_err(|source| StoreError::Open {
                path: path.clone(),
                source,
            })?;
        schema::migrate(&conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
            observer: OnceLock::new(),
        })
    }

    /// Reports every later store call's timing to `observer` (once per store: a second
    /// observer is ignored).
    pub fn observe_queries(&self, observer: Arc<dyn QueryObserver>) {
        let _ = self.observer.set(observer);
    }

    pub(crate) fn conn(&self) -> Conn<'_> {
        let asked = Instant::now();
        // A panic while holding the lock cannot leave SQLite inconsistent (each call is
        // one statement or one transaction), so a poisoned lock is still usable.
        let guard = self
            .conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Conn {
            guard,
            asked,
            taken: Instant::now(),
            observer: self.observer.get(),
        }
    }
}

/// Creates the database file owner-only before SQLite opens it: it holds key hashes,
/// envd access tokens and webhook secrets, and SQLite gives its `-wal` and `-shm` files
/// the database file's mode.
fn create_private(path: &Path) -> std::io::Result<()> {
    match std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().write(true).create_new(true),
        0o600,
    )
    .open(path)
    {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Run `sql` and decode every row.
pub(crate) fn query_all<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    mut decode: impl FnMut(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode(row)?);
    }
    Ok(out)
}

/// Run `sql` and decode its first row, if any.
pub(crate) fn query_opt<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    decode: impl FnOnce(&Row<'_>) -> Result<T>,
) -> Result<Option<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    match rows.next()? {
        Some(row) => Ok(Some(decode(row)?)),
        None => Ok(None),
    }
}

/// Run a statement; returns how many rows it changed.
pub(crate) fn execute(conn: &Connection, sql: &str, params: impl Params) -> Result<usize> {
    Ok(conn.prepare_cached(sql)?.execute(params)?)
}

/// Parameters of a statement assembled from optional filters. `bind` returns the
/// placeholder (`?N`, numbered) to splice into the SQL text.
#[derive(Debug, Default)]
pub(crate) struct Bindings {
    values: Vec<Value>,
}

impl Bindings {
    pub(crate) fn bind(&mut self, value: impl Into<Value>) -> String {
        self.values.push(value.into());
        format!("?{}", self.values.len())
    }

    /// `?a, ?b, …` for an `IN (…)` list.
    pub(crate) fn bind_list<V: Into<Value>>(
        &mut self,
        values: impl IntoIterator<Item = V>,
    ) -> String {
        values
            .into_iter()
            .map(|value| self.bind(value))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(crate) fn params(&self) -> rusqlite::ParamsFromIter<std::slice::Iter<'_, Value>> {
        rusqlite::params_from_iter(self.values.iter())
    }
}
