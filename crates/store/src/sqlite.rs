//! The SQLite backend: `berth.db` in the state directory, in WAL mode with a busy
//! timeout so `berth keys …` can work on it while `berth up` runs.

use std::path::Path;

use rusqlite::types::{ToSqlOutput, Value as SqliteValue};
use rusqlite::{Connection, ToSql};

use crate::db::{Value, BUSY_TIMEOUT, DATABASE_FILE};
use crate::error::{Result, StoreError};

/// Prepared statements kept on the connection. The store has well over a hundred
/// distinct statements; with rusqlite's default of 16 a create's dozen of them evicted
/// each other and every store call parsed and planned its SQL again.
const STATEMENT_CACHE: usize = 512;

/// Open (creating if needed) the database in `state_dir`.
pub(crate) fn open(state_dir: &Path) -> Result<Connection> {
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
            conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            Ok(conn)
        })
        .map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
    Ok(conn)
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

pub(crate) fn query(
    conn: &Connection,
    sql: &str,
    params: &[Value],
    mut each: impl FnMut(&rusqlite::Row<'_>) -> Result<()>,
) -> Result<()> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
    while let Some(row) = rows.next()? {
        each(row)?;
    }
    Ok(())
}

pub(crate) fn execute(conn: &Connection, sql: &str, params: &[Value]) -> Result<usize> {
    Ok(conn
        .prepare_cached(sql)?
        .execute(rusqlite::params_from_iter(params))?)
}

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(SqliteValue::Null),
            Value::Integer(value) => ToSqlOutput::Owned(SqliteValue::Integer(*value)),
            Value::Real(value) => ToSqlOutput::Owned(SqliteValue::Real(*value)),
            Value::Text(text) => ToSqlOutput::Borrowed(text.as_str().into()),
            Value::Blob(bytes) => ToSqlOutput::Borrowed(bytes.as_slice().into()),
            Value::Bool(value) => ToSqlOutput::Owned(SqliteValue::Integer(i64::from(*value))),
            // As rusqlite refuses a u64 beyond i64::MAX.
            Value::TooLarge(value) => return (*value).to_sql(),
        })
    }
}

/// The key of a row as text, for error messages.
pub(crate) fn key_text(row: &rusqlite::Row<'_>, column: &str) -> Result<String> {
    Ok(match row.get::<_, SqliteValue>(column)? {
        SqliteValue::Text(text) => text,
        SqliteValue::Integer(number) => number.to_string(),
        SqliteValue::Real(number) => number.to_string(),
        SqliteValue::Null => "NULL".to_string(),
        SqliteValue::Blob(bytes) => format!("<{} bytes>", bytes.len()),
    })
}
