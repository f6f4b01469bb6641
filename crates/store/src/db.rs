//! The backend seam: where the store keeps its state ([`DatabaseConfig`]), the
//! connection of one store call ([`Conn`]: SQLite's one connection under a lock, or a
//! pooled Postgres one), the values bound to statements ([`Value`]), the rows they
//! return ([`Row`]), and transactions with the same guarantees on both backends
//! ([`Store::write`], [`Store::read`]).
//!
//! Statements are written once, in the SQL both dialects share, with numbered
//! placeholders `?N`; the Postgres backend rewrites them to `$N`. The few places where
//! the dialects differ ask [`Conn::dialect`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Result, StoreError};
use crate::postgres::{Pooled, PostgresConfig, PostgresPool};
use crate::{schema, sqlite};

/// File name of the database inside the state directory.
pub const DATABASE_FILE: &str = "berth.db";

/// How long a statement waits for another process's write lock before failing.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the store keeps its state, chosen at start.
#[derive(Clone, Debug)]
pub enum DatabaseConfig {
    /// `berth.db` in the state directory (the default: one machine, nothing to run).
    Sqlite { state_dir: PathBuf },
    /// A Postgres database several berth processes (and machines) can share.
    Postgres(PostgresConfig),
}

impl DatabaseConfig {
    /// The database `url` names (`--database`, `BERTH_DATABASE_URL`): `postgres://…` or
    /// `postgresql://…` is Postgres (a password missing from the URL is taken from
    /// `PGPASSWORD`), `sqlite:DIR` is SQLite in DIR; none is SQLite in `state_dir`.
    pub fn from_url(url: Option<&str>, state_dir: &Path) -> Result<Self> {
        let url = url.map(str::trim).filter(|url| !url.is_empty());
        match url.map(|url| (url, url.strip_prefix("sqlite:"))) {
            None => Ok(DatabaseConfig::Sqlite {
                state_dir: state_dir.to_path_buf(),
            }),
            Some((_, Some(dir))) if !dir.is_empty() => Ok(DatabaseConfig::Sqlite {
                state_dir: PathBuf::from(dir),
            }),
            Some((url, _)) => Ok(DatabaseConfig::Postgres(PostgresConfig::parse(
                url,
                std::env::var("PGPASSWORD").ok().as_deref(),
            )?)),
        }
    }

    /// Where the state is, for logs and messages: the file, or the Postgres server and
    /// database without the password.
    pub fn describe(&self) -> String {
        match self {
            DatabaseConfig::Sqlite { state_dir } => {
                format!("SQLite {}", state_dir.join(DATABASE_FILE).display())
            }
            DatabaseConfig::Postgres(config) => format!("Postgres {config}"),
        }
    }
}

/// Which SQL dialect a connection speaks, for the few statements that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// Told how long each store call waited for the connection and then held it (one
/// statement or one transaction), for the operator's metrics.
pub trait QueryObserver: Send + Sync {
    fn query_finished(&self, waited: Duration, held: Duration);
}

/// The database handle. Cheap calls; each takes a connection briefly.
pub struct Store {
    backend: Backend,
    observer: OnceLock<Arc<dyn QueryObserver>>,
}

enum Backend {
    /// One connection: SQLite serialises writers anyway, and one connection keeps
    /// every call of this process in one order.
    Sqlite(Mutex<rusqlite::Connection>),
    Postgres(Box<PostgresPool>),
}

/// The connection of one store call; tells the observer how long on drop.
pub(crate) struct Conn<'a> {
    link: Link<'a>,
    asked: Instant,
    taken: Instant,
    observer: Option<&'a Arc<dyn QueryObserver>>,
}

enum Link<'a> {
    Sqlite(MutexGuard<'a, rusqlite::Connection>),
    Postgres(Pooled<'a>),
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        // A call that panicked inside a transaction leaves it open: end it here so the
        // next call does not run inside it.
        match &mut self.link {
            Link::Sqlite(conn) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
            }
            Link::Postgres(conn) => conn.discard_if_in_transaction(),
        }
        if let Some(observer) = self.observer {
            observer.query_finished(self.taken - self.asked, self.taken.elapsed());
        }
    }
}

/// How a transaction isolates itself from concurrent ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// Reads that must agree with each other (one snapshot).
    Read,
    /// Reads and writes that must behave as if no other transaction ran meanwhile.
    Write,
}

/// How often a Postgres write transaction is retried after a serialization failure
/// before [`StoreError::Conflict`].
const WRITE_ATTEMPTS: u32 = 10;

impl Store {
    /// Open (creating if needed) the SQLite database in `state_dir` and migrate it.
    pub fn open(state_dir: &Path) -> Result<Self> {
        let store = Self::new(Backend::Sqlite(Mutex::new(sqlite::open(state_dir)?)));
        schema::migrate(&mut store.conn()?)?;
        Ok(store)
    }

    /// Open the database `config` names and migrate it (several processes may do this at
    /// once on one Postgres database: one migrates, the others wait for it).
    pub fn connect(config: &DatabaseConfig) -> Result<Self> {
        match config {
            DatabaseConfig::Sqlite { state_dir } => Self::open(state_dir),
            DatabaseConfig::Postgres(config) => {
                let store = Self::new(Backend::Postgres(Box::new(PostgresPool::new(
                    config.clone(),
                )?)));
                schema::migrate(&mut store.conn()?)?;
                Ok(store)
            }
        }
    }

    /// A store on `config`'s database as it is, not migrated (tests build older
    /// schemas and damage rows with it).
    #[cfg(test)]
    pub(crate) fn unmigrated(config: &DatabaseConfig) -> Result<Self> {
        Ok(Self::new(match config {
            DatabaseConfig::Sqlite { state_dir } => {
                Backend::Sqlite(Mutex::new(sqlite::open(state_dir)?))
            }
            DatabaseConfig::Postgres(config) => {
                Backend::Postgres(Box::new(PostgresPool::new(config.clone())?))
            }
        }))
    }

    fn new(backend: Backend) -> Self {
        Store {
            backend,
            observer: OnceLock::new(),
        }
    }

    /// Reports every later store call's timing to `observer` (once per store: a second
    /// observer is ignored).
    pub fn observe_queries(&self, observer: Arc<dyn QueryObserver>) {
        let _ = self.observer.set(observer);
    }

    /// A connection for one store call.
    pub(crate) fn conn(&self) -> Result<Conn<'_>> {
        let asked = Instant::now();
        let link = match &self.backend {
            // A panic while holding the lock cannot leave SQLite inconsistent (each call
            // is one statement or one transaction), so a poisoned lock is still usable.
            Backend::Sqlite(conn) => {
                Link::Sqlite(conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
            }
            Backend::Postgres(pool) => Link::Postgres(pool.get()?),
        };
        Ok(Conn {
            link,
            asked,
            taken: Instant::now(),
            observer: self.observer.get(),
        })
    }

    /// Runs `work` in one transaction that behaves as if it ran alone: SQLite takes the
    /// write lock up front (`BEGIN IMMEDIATE`); Postgres runs it `SERIALIZABLE` and runs
    /// it again (up to [`WRITE_ATTEMPTS`] times) when it conflicted with a concurrent
    /// one (a serialization failure, a deadlock, or a unique key a concurrent
    /// transaction inserted first), so `work` must have no effects outside the
    /// transaction but its result.
    pub(crate) fn write<T>(&self, work: impl FnMut(&mut Conn<'_>) -> Result<T>) -> Result<T> {
        self.transaction(Isolation::Write, work)
    }

    /// Runs the reads of `work` on one snapshot of the database.
    pub(crate) fn read<T>(&self, work: impl FnMut(&mut Conn<'_>) -> Result<T>) -> Result<T> {
        self.transaction(Isolation::Read, work)
    }

    fn transaction<T>(
        &self,
        isolation: Isolation,
        mut work: impl FnMut(&mut Conn<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut conn = self.conn()?;
        let (begin, attempts) = match (conn.dialect(), isolation) {
            (Dialect::Sqlite, Isolation::Write) => ("BEGIN IMMEDIATE", 1),
            (Dialect::Sqlite, Isolation::Read) => ("BEGIN", 1),
            (Dialect::Postgres, Isolation::Write) => {
                ("BEGIN ISOLATION LEVEL SERIALIZABLE", WRITE_ATTEMPTS)
            }
            (Dialect::Postgres, Isolation::Read) => {
                ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 1)
            }
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            conn.batch(begin)?;
            let outcome = work(&mut conn).and_then(|value| conn.batch("COMMIT").map(|()| value));
            let err = match outcome {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            conn.rollback();
            match err {
                StoreError::Postgres(source) if crate::postgres::is_conflict(&source) => {
                    if attempt >= attempts {
                        return Err(StoreError::Conflict {
                            attempts: attempt,
                            source,
                        });
                    }
                }
                // A key a concurrent transaction inserted and committed after this one
                // began: run again on a snapshot that sees it (as Postgres's docs advise
                // for serializable transactions). A duplicate that stays one is reported
                // as such after the last attempt.
                err @ StoreError::Postgres(_)
                    if isolation == Isolation::Write
                        && err.is_unique_violation()
                        && attempt < attempts => {}
                other => return Err(other),
            }
            crate::postgres::back_off(attempt);
        }
    }
}

impl Conn<'_> {
    pub(crate) fn dialect(&self) -> Dialect {
        match self.link {
            Link::Sqlite(_) => Dialect::Sqlite,
            Link::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Run `sql` and decode every row.
    pub(crate) fn query_all<T>(
        &mut self,
        sql: &str,
        params: &[Value],
        mut decode: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        match &mut self.link {
            Link::Sqlite(conn) => {
                let mut out = Vec::new();
                sqlite::query(conn, sql, params, |row| {
                    out.push(decode(&Row::Sqlite(row))?);
                    Ok(())
                })?;
                Ok(out)
            }
            Link::Postgres(conn) => {
                let rows = conn.query(sql, params)?;
                rows.iter().map(|row| decode(&Row::Postgres(row))).collect()
            }
        }
    }

    /// Run `sql` and decode its first row, if any.
    pub(crate) fn query_opt<T>(
        &mut self,
        sql: &str,
        params: &[Value],
        decode: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        let mut decode = Some(decode);
        let mut rows = self.query_all(sql, params, |row| match decode.take() {
            Some(decode) => decode(row).map(Some),
            None => Ok(None),
        })?;
        Ok(if rows.is_empty() {
            None
        } else {
            rows.swap_remove(0)
        })
    }

    /// One integer an aggregate (`SELECT COUNT(*) AS n …`) computes, in column `n`.
    pub(crate) fn query_count(&mut self, sql: &str, params: &[Value]) -> Result<i64> {
        let found = self.query_opt(sql, params, |row| {
            crate::columns::Columns::new(row, "aggregate", &[])?.get::<i64>("n")
        })?;
        Ok(found.unwrap_or(0))
    }

    /// Run a statement; returns how many rows it changed.
    pub(crate) fn execute(&mut self, sql: &str, params: &[Value]) -> Result<usize> {
        match &mut self.link {
            Link::Sqlite(conn) => sqlite::execute(conn, sql, params),
            Link::Postgres(conn) => conn.execute(sql, params),
        }
    }

    /// Run statements without parameters (DDL, transaction control).
    pub(crate) fn batch(&mut self, sql: &str) -> Result<()> {
        match &mut self.link {
            Link::Sqlite(conn) => Ok(conn.execute_batch(sql)?),
            Link::Postgres(conn) => conn.batch(sql),
        }
    }

    /// Ends a failed transaction. A connection that cannot roll back is not reused.
    pub(crate) fn rollback(&mut self) {
        match &mut self.link {
            // SQLite may have rolled back already (some errors end the transaction).
            Link::Sqlite(conn) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
            }
            Link::Postgres(conn) => conn.rollback(),
        }
    }

    /// The Postgres server this connection talks to, without its password (empty on
    /// SQLite).
    pub(crate) fn postgres_target(&self) -> String {
        match &self.link {
            Link::Sqlite(_) => String::new(),
            Link::Postgres(conn) => conn.target(),
        }
    }

    /// Closes the connection after this call instead of reusing it (SQLite's one
    /// connection is always reused).
    pub(crate) fn discard(&mut self) {
        if let Link::Postgres(conn) = &mut self.link {
            conn.discard();
        }
    }
}

/// One row of a result, from either backend.
pub(crate) enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r tokio_postgres::Row),
}

/// A value bound to a statement parameter. Integers are 64-bit on both backends (and
/// every integer column is `BIGINT` on Postgres), booleans are `BOOLEAN` on Postgres and
/// 0/1 on SQLite, byte strings are `BLOB`/`BYTEA`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
    Bool(bool),
    /// An unsigned integer beyond `i64::MAX`: refused when bound.
    TooLarge(u64),
}

/// Anything bound as a statement parameter; references bind what they point at.
pub(crate) trait ToValue {
    fn to_value(&self) -> Value;
}

macro_rules! integer_values {
    ($($t:ty),*) => {$(
        impl ToValue for $t {
            fn to_value(&self) -> Value {
                Value::Integer(i64::from(*self))
            }
        }
    )*};
}
integer_values!(i64, i32, u32, u16, u8);

impl ToValue for u64 {
    fn to_value(&self) -> Value {
        i64::try_from(*self).map_or(Value::TooLarge(*self), Value::Integer)
    }
}

impl ToValue for usize {
    fn to_value(&self) -> Value {
        (*self as u64).to_value()
    }
}

impl ToValue for bool {
    fn to_value(&self) -> Value {
        Value::Bool(*self)
    }
}

impl ToValue for f64 {
    fn to_value(&self) -> Value {
        Value::Real(*self)
    }
}

impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_string())
    }
}

impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToValue for [u8] {
    fn to_value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl ToValue for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Blob(self.clone())
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

/// The parameters of a statement, in placeholder order: `params![a, b]` binds `?1`, `?2`
/// (by reference: nothing is moved).
macro_rules! params {
    () => { &[] as &[$crate::db::Value] };
    ($($value:expr),+ $(,)?) => {
        &[$($crate::db::ToValue::to_value(&$value)),+] as &[$crate::db::Value]
    };
}
pub(crate) use params;

/// Parameters of a statement assembled from optional filters. `bind` returns the
/// placeholder (`?N`, numbered) to splice into the SQL text.
#[derive(Debug, Default)]
pub(crate) struct Bindings {
    values: Vec<Value>,
}

impl Bindings {
    pub(crate) fn bind(&mut self, value: impl ToValue) -> String {
        self.values.push(value.to_value());
        format!("?{}", self.values.len())
    }

    /// `?a, ?b, …` for an `IN (…)` list.
    pub(crate) fn bind_list<V: ToValue>(&mut self, values: impl IntoIterator<Item = V>) -> String {
        values
            .into_iter()
            .map(|value| self.bind(value))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(crate) fn params(&self) -> &[Value] {
        &self.values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_url_chooses_the_backend() {
        let state = Path::new("/var/lib/berth");
        let sqlite_in = |config: DatabaseConfig| match config {
            DatabaseConfig::Sqlite { state_dir } => state_dir,
            DatabaseConfig::Postgres(config) => panic!("Postgres: {config}"),
        };
        for none in [None, Some(""), Some("  ")] {
            assert_eq!(
                sqlite_in(DatabaseConfig::from_url(none, state).unwrap()),
                state
            );
        }
        let shared = DatabaseConfig::from_url(Some("sqlite:/srv/shared"), state).unwrap();
        assert_eq!(sqlite_in(shared), Path::new("/srv/shared"));
        let postgres = DatabaseConfig::from_url(Some("postgres://b@db/berth"), state).unwrap();
        assert_eq!(postgres.describe(), "Postgres postgres://b@db:5432/berth");
        for bad in ["sqlite:", "berth.db", "mysql://b@db/berth"] {
            assert!(
                matches!(
                    DatabaseConfig::from_url(Some(bad), state),
                    Err(StoreError::DatabaseUrl { .. })
                ),
                "{bad}"
            );
        }
    }
}
