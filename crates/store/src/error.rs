//! Why a store operation failed: one variant per cause.
//!
//! No message here contains a database password: Postgres targets are named by
//! [`crate::DatabaseConfig`]'s redacted form, and the driver's own errors never carry
//! the connection string.

use std::path::PathBuf;
use std::time::Duration;

use crate::db::BUSY_TIMEOUT;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("creating state directory {}: {source}; check that berth may write there", path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening database {}: {source}; check that the file is a berth database and writable", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the database URL is not usable: {reason}; give `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE` \
         (or leave it unset for SQLite in the state directory)"
    )]
    DatabaseUrl { reason: String },
    #[error(
        "cannot reach Postgres at {target}: {source}; check that the server runs and that \
         the host, port or socket directory is right"
    )]
    DatabaseUnreachable {
        /// The server, without its password.
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error(
        "Postgres at {target} refused the connection: {source}; check the user, the \
         password (URL or PGPASSWORD), the database name and pg_hba.conf"
    )]
    DatabaseRejected {
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error(
        "Postgres at {target}: the schema in the search path does not exist; create it or \
         remove `search_path` from the URL's options"
    )]
    NoSchema { target: String },
    #[error(
        "migrating the database to schema version {version}: {source}; the migration was \
         rolled back and the database is unchanged"
    )]
    Migration {
        version: usize,
        #[source]
        source: Box<StoreError>,
    },
    #[error(
        "the database has schema version {found} but this berth knows only up to {known}: it \
         was written by a newer berth; run that berth, or use another database"
    )]
    NewerSchema { found: i64, known: usize },
    #[error(
        "the database stayed locked by another process for {} s: {source}; retry, or stop \
         the other berth process using this state directory",
        BUSY_TIMEOUT.as_secs()
    )]
    Busy {
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "no Postgres connection became free within {} s (all {size} in use); retry, or \
         look for slow queries",
        waited.as_secs()
    )]
    PoolExhausted { size: usize, waited: Duration },
    #[error(
        "the transaction conflicted with concurrent ones {attempts} times in a row: {source}; \
         retry"
    )]
    Conflict {
        attempts: u32,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("the store's Postgres connections were shut down")]
    Closed,
    #[error("starting the thread of the Postgres connections: {source}")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
    #[error("database: {0}")]
    Sqlite(#[source] rusqlite::Error),
    #[error("database: {0}")]
    Postgres(#[source] tokio_postgres::Error),
    #[error("encoding {what} for the database: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{what} {value} does not fit the database's 64-bit integers")]
    OutOfRange { what: &'static str, value: u64 },
    #[error(
        "{table}.{column} of row {row} is corrupt ({source}); repair or delete that row in \
         the database (e.g. with sqlite3 or psql) and retry"
    )]
    CorruptColumn {
        table: &'static str,
        column: &'static str,
        /// The row's key, as text.
        row: String,
        #[source]
        source: Corruption,
    },
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    #[error("team \"{name}\" already exists; choose another name")]
    TeamExists { name: String },
    #[error("a {what} named \"{name}\" already exists; choose another name")]
    NameTaken { what: &'static str, name: String },
    #[error("{what} {id} is in use by {}", users.join(", "))]
    InUse {
        what: &'static str,
        id: String,
        users: Vec<String>,
    },
    #[error(
        "invalid page cursor: {reason}; pass the cursor of the previous page back unchanged, \
         or none for the first page"
    )]
    InvalidCursor { reason: &'static str },
}

impl StoreError {
    /// A uniqueness constraint refused the write (the callers turn it into
    /// [`StoreError::NameTaken`] and the like).
    pub(crate) fn is_unique_violation(&self) -> bool {
        match self {
            StoreError::Sqlite(err) => {
                err.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation)
            }
            StoreError::Postgres(err) => {
                err.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
            }
            _ => false,
        }
    }

    /// The error means "try again later" rather than "this request is wrong": the
    /// database is locked, unreachable or out of connections, or the transaction kept
    /// conflicting (the server answers 503).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Busy { .. }
                | StoreError::DatabaseUnreachable { .. }
                | StoreError::PoolExhausted { .. }
                | StoreError::Conflict { .. }
                | StoreError::Closed
        ) || matches!(self, StoreError::Postgres(err) if err.is_closed())
    }
}

/// What is wrong with a stored value.
#[derive(Debug, thiserror::Error)]
pub enum Corruption {
    #[error("not JSON of the expected shape: {0}")]
    Json(#[source] serde_json::Error),
    #[error("wrong SQL type or out of range: {0}")]
    Type(#[source] ColumnTypeError),
    #[error("\"{value}\" is not one of {expected}")]
    UnknownValue {
        value: String,
        expected: &'static str,
    },
    #[error("{ms} ms since the epoch is not a representable time")]
    Time { ms: i64 },
}

/// A stored value that does not decode as its field's type.
#[derive(Debug, thiserror::Error)]
pub enum ColumnTypeError {
    /// SQLite's own conversion refused it (wrong storage class, out of range, NULL).
    #[error("{0}")]
    Sqlite(#[source] rusqlite::Error),
    /// The Postgres driver refused it (wrong column type).
    #[error("{0}")]
    Postgres(#[source] tokio_postgres::Error),
    #[error("NULL where a value is required")]
    Null,
    #[error("{value} is out of range for {target}")]
    OutOfRange { value: i64, target: &'static str },
}

impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> Self {
        let busy = matches!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        );
        if busy {
            StoreError::Busy { source: err }
        } else {
            StoreError::Sqlite(err)
        }
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(err: tokio_postgres::Error) -> Self {
        StoreError::Postgres(err)
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;
