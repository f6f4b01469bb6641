//! Why a store operation failed: one variant per cause.

use std::path::PathBuf;

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
        "migrating the database to schema version {version}: {source}; the migration was \
         rolled back and the database is unchanged"
    )]
    Migration {
        version: usize,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the database has schema version {found} but this berth knows only up to {known}: it \
         was written by a newer berth; run that berth, or use another state directory"
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
    #[error("database: {0}")]
    Sqlite(#[source] rusqlite::Error),
    #[error("encoding {what} for the database: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{table}.{column} of row {row} is corrupt ({source}); repair or delete that row in \
         berth.db (e.g. with sqlite3) and retry"
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

/// What is wrong with a stored value.
#[derive(Debug, thiserror::Error)]
pub enum Corruption {
    #[error("not JSON of the expected shape: {0}")]
    Json(#[source] serde_json::Error),
    #[error("wrong SQL type or out of range: {0}")]
    Type(#[source] rusqlite::Error),
    #[error("\"{value}\" is not one of {expected}")]
    UnknownValue {
        value: String,
        expected: &'static str,
    },
    #[error("{ms} ms since the epoch is not a representable time")]
    Time { ms: i64 },
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

pub type Result<T> = std::result::Result<T, StoreError>;
