//! The Postgres backend: a small pool of connections to one database, shared by every
//! berth process that uses it.
//!
//! The store's API is synchronous and the server calls it from async tasks, directly.
//! The synchronous `postgres` crate cannot serve that: it drives each connection with
//! `Runtime::block_on`, which panics inside a Tokio runtime. So the connections are
//! `tokio_postgres` ones whose I/O runs on a private one-thread runtime owned by the
//! pool, and a store call waits for its statement's answer with a plain
//! `futures::executor::block_on` on the client side (a channel to that connection):
//! like the SQLite backend, a call blocks its thread for one statement and never
//! depends on the caller's runtime. The pool is this module's own (a mutex and a
//! condition variable) so that a failed connection attempt reaches the caller as its
//! typed error ([`StoreError::DatabaseUnreachable`], [`StoreError::DatabaseRejected`]).
//!
//! Statements are prepared once per connection (keyed by their SQL) with the store's
//! `?N` placeholders rewritten to Postgres's `$N`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::{Client, NoTls, Statement};

use crate::db::{Value, BUSY_TIMEOUT};
use crate::error::{ColumnTypeError, Result, StoreError};

/// Connections one store opens at most.
const POOL_SIZE: usize = 8;

/// How long a store call waits for a free connection before [`StoreError::PoolExhausted`].
const POOL_WAIT: Duration = BUSY_TIMEOUT;

/// How long opening a connection may take when the URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Debian's socket directory, used when the URL names no host (as libpq does there).
const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// Prepared statements kept per connection; the cache is emptied when it fills.
const STATEMENT_CACHE: usize = 512;

/// A parsed Postgres URL. Neither its `Debug` nor its `Display` shows the password.
#[derive(Clone)]
pub struct PostgresConfig {
    config: Box<tokio_postgres::Config>,
}

impl PostgresConfig {
    /// Parses `postgres://…`/`postgresql://…`; `password` (from `PGPASSWORD`) is used
    /// when the URL carries none.
    pub(crate) fn parse(url: &str, password: Option<&str>) -> Result<Self> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(StoreError::DatabaseUrl {
                reason: "only postgres:// (or postgresql://) URLs name a database".into(),
            });
        }
        let mut config: tokio_postgres::Config =
            url.parse()
                .map_err(|err: tokio_postgres::Error| StoreError::DatabaseUrl {
                    reason: err.to_string(),
                })?;
        // `prefer` (the default) falls back to plain connections; `require` cannot.
        if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(StoreError::DatabaseUrl {
                reason: "sslmode=require: berth does not speak TLS to Postgres yet; reach the \
                         server over a unix socket, loopback or a private network"
                    .into(),
            });
        }
        if config.get_password().is_none() {
            if let Some(password) = password {
                config.password(password);
            }
        }
        if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
            config.host_path(DEFAULT_SOCKET_DIR);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("berth");
        }
        Ok(PostgresConfig {
            config: Box::new(config),
        })
    }
}

/// `postgres://USER@HOST:PORT/DATABASE`, never the password.
impl fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        write!(f, "postgres://")?;
        if let Some(user) = config.get_user() {
            write!(f, "{user}@")?;
        }
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|host| match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .chain(config.get_hostaddrs().iter().map(|addr| addr.to_string()))
            .collect();
        write!(f, "{}", hosts.join(","))?;
        if let Some(port) = config.get_ports().first() {
            write!(f, ":{port}")?;
        }
        write!(f, "/{}", config.get_dbname().unwrap_or(""))
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // tokio_postgres redacts the password in its own Debug; this is shorter.
        write!(f, "PostgresConfig({self})")
    }
}

/// Connections to one database, opened on demand up to [`POOL_SIZE`].
pub(crate) struct PostgresPool {
    config: PostgresConfig,
    /// Runs every connection's I/O; shut down (without blocking) on drop.
    runtime: Option<tokio::runtime::Runtime>,
    state: Mutex<PoolState>,
    freed: Condvar,
}

struct PoolState {
    // Boxed once when opened, so taking and returning one moves a pointer (and a
    // store call's connection stays small).
    #[allow(clippy::vec_box)]
    idle: Vec<Box<PgConnection>>,
    /// Connections open or being opened, idle ones included.
    open: usize,
}

impl PostgresPool {
    pub(crate) fn new(config: PostgresConfig) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("berth-store-pg")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|source| StoreError::Runtime { source })?;
        Ok(PostgresPool {
            config,
            runtime: Some(runtime),
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // The state is a list and a count, consistent between statements.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A connection: an idle one, a new one while fewer than [`POOL_SIZE`] are open, or
    /// the next one freed within [`POOL_WAIT`].
    pub(crate) fn get(&self) -> Result<Pooled<'_>> {
        let deadline = Instant::now() + POOL_WAIT;
        let mut state = self.lock();
        loop {
            while let Some(conn) = state.idle.pop() {
                if !conn.client.is_closed() {
                    return Ok(Pooled {
                        conn: Some(conn),
                        pool: self,
                    });
                }
                state.open -= 1;
            }
            if state.open < POOL_SIZE {
                state.open += 1;
                drop(state);
                return match self.open_connection() {
                    Ok(conn) => Ok(Pooled {
                        conn: Some(conn),
                        pool: self,
                    }),
                    Err(err) => {
                        self.lock().open -= 1;
                        self.freed.notify_one();
                        Err(err)
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::PoolExhausted {
                    size: POOL_SIZE,
                    waited: POOL_WAIT,
                });
            }
            state = self
                .freed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    fn open_connection(&self) -> Result<Box<PgConnection>> {
        let runtime = self.runtime.as_ref().ok_or(StoreError::Closed)?;
        let config = (*self.config.config).clone();
        let connecting = runtime.spawn(async move {
            let (client, connection) = config.connect(NoTls).await?;
            // The connection's I/O; it ends when the client is dropped or the server
            // goes away (the client then reports itself closed).
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = futures::executor::block_on(connecting)
            .map_err(|_| StoreError::Closed)?
            .map_err(|source| {
                let target = self.config.to_string();
                if source.as_db_error().is_some() {
                    StoreError::DatabaseRejected { target, source }
                } else {
                    StoreError::DatabaseUnreachable { target, source }
                }
            })?;
        Ok(Box::new(PgConnection {
            client,
            statements: HashMap::new(),
            in_transaction: false,
            broken: false,
        }))
    }

    fn put_back(&self, conn: Box<PgConnection>) {
        let mut state = self.lock();
        if conn.broken || conn.in_transaction || conn.client.is_closed() {
            state.open -= 1;
        } else {
            state.idle.push(conn);
        }
        drop(state);
        self.freed.notify_one();
    }

    pub(crate) fn target(&self) -> String {
        self.config.to_string()
    }
}

impl Drop for PostgresPool {
    fn drop(&mut self) {
        self.lock().idle.clear();
        // Not a blocking shutdown: the store may be dropped inside an async task.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A connection taken from the pool for one store call; returned on drop.
pub(crate) struct Pooled<'a> {
    conn: Option<Box<PgConnection>>,
    pool: &'a PostgresPool,
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put_back(conn);
        }
    }
}

impl std::ops::Deref for Pooled<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn
            .as_ref()
            .expect("a pooled connection until dropped")
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a pooled connection until dropped")
    }
}

impl Pooled<'_> {
    pub(crate) fn target(&self) -> String {
        self.pool.target()
    }
}

/// One connection with its prepared statements.
pub(crate) struct PgConnection {
    client: Client,
    statements: HashMap<String, Statement>,
    /// Between `BEGIN` and its `COMMIT`/`ROLLBACK`: not reusable as is.
    in_transaction: bool,
    /// Its state is unknown (a rollback failed): closed instead of reused.
    broken: bool,
}

impl PgConnection {
    fn statement(&mut self, sql: &str) -> Result<Statement> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = futures::executor::block_on(self.client.prepare(&numbered(sql)))?;
        if self.statements.len() >= STATEMENT_CACHE {
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    pub(crate) fn query(
        &mut self,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let statement = self.statement(sql)?;
        let params = as_params(params);
        Ok(futures::executor::block_on(
            self.client.query(&statement, &params),
        )?)
    }

    pub(crate) fn execute(&mut self, sql: &str, params: &[Value]) -> Result<usize> {
        let statement = self.statement(sql)?;
        let params = as_params(params);
        let changed = futures::executor::block_on(self.client.execute(&statement, &params))?;
        Ok(usize::try_from(changed).unwrap_or(usize::MAX))
    }

    /// Statements without parameters, in the simple protocol (DDL, transaction control).
    pub(crate) fn batch(&mut self, sql: &str) -> Result<()> {
        futures::executor::block_on(self.client.batch_execute(sql))?;
        if sql.starts_with("BEGIN") {
            self.in_transaction = true;
        } else if sql == "COMMIT" || sql == "ROLLBACK" {
            self.in_transaction = false;
        }
        Ok(())
    }

    pub(crate) fn rollback(&mut self) {
        if self.batch("ROLLBACK").is_err() {
            self.broken = true;
        }
    }

    /// Called when a store call ends: a transaction left open (the call panicked)
    /// makes the connection unusable for the next one.
    pub(crate) fn discard_if_in_transaction(&mut self) {
        if self.in_transaction {
            self.broken = true;
        }
    }

    /// Marks the connection as not to be reused (it holds a session lock, say).
    pub(crate) fn discard(&mut self) {
        self.broken = true;
    }
}

fn as_params(params: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|value| value as &(dyn ToSql + Sync))
        .collect()
}

/// `sql` with the store's `?N` placeholders as Postgres's `$N` (outside quotes).
pub(crate) fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(open) => {
                if c == open {
                    quote = None;
                }
                out.push(c);
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                out.push(c);
            }
            None if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) => out.push('$'),
            None => out.push(c),
        }
    }
    out
}

/// The transaction lost a conflict with a concurrent one and may simply run again.
pub(crate) fn is_conflict(err: &tokio_postgres::Error) -> bool {
    matches!(
        err.code(),
        Some(&SqlState::T_R_SERIALIZATION_FAILURE) | Some(&SqlState::T_R_DEADLOCK_DETECTED)
    )
}

/// Sleeps before attempt `attempt + 1` of a conflicting transaction: a few ms, growing,
/// jittered so that the transactions that conflicted do not meet again.
pub(crate) fn back_off(attempt: u32) {
    let ceiling_ms = 2u64.saturating_pow(attempt.min(6));
    std::thread::sleep(Duration::from_micros(rand::random_range(
        0..=ceiling_ms * 1000,
    )));
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        fn typed<T: ToSql>(
            value: T,
            ty: &Type,
            out: &mut bytes::BytesMut,
        ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
            if T::accepts(ty) {
                value.to_sql(ty, out)
            } else {
                Err(format!(
                    "cannot bind a {} to a parameter of type {ty}",
                    std::any::type_name::<T>()
                )
                .into())
            }
        }
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(value) => match *ty {
                Type::INT4 => typed(i32::try_from(*value)?, ty, out),
                Type::INT2 => typed(i16::try_from(*value)?, ty, out),
                _ => typed(*value, ty, out),
            },
            Value::Real(value) => typed(*value, ty, out),
            Value::Text(text) => typed(text.as_str(), ty, out),
            Value::Blob(bytes) => typed(bytes.as_slice(), ty, out),
            Value::Bool(value) => typed(*value, ty, out),
            Value::TooLarge(value) => {
                Err(format!("{value} is out of range for a 64-bit integer").into())
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value in to_sql: a Value may hold any type.
        true
    }

    to_sql_checked!();
}

/// The index of `column` in `row`, or the driver's error for a missing column.
pub(crate) fn column_index(
    row: &tokio_postgres::Row,
    column: &str,
) -> std::result::Result<usize, tokio_postgres::Error> {
    match row.columns().iter().position(|c| c.name() == column) {
        Some(index) => Ok(index),
        // Let the driver say it (an error of ours: the query lacks the column).
        None => row.try_get::<_, Option<String>>(column).map(|_| 0),
    }
}

/// Reads column `index` as `T`, NULL as None.
pub(crate) fn get<'r, T: tokio_postgres::types::FromSql<'r>>(
    row: &'r tokio_postgres::Row,
    index: usize,
) -> std::result::Result<Option<T>, ColumnTypeError> {
    row.try_get::<_, Option<T>>(index)
        .map_err(ColumnTypeError::Postgres)
}

/// The key of a row as text, for error messages.
pub(crate) fn key_text(row: &tokio_postgres::Row, column: &str) -> Result<String> {
    let index = column_index(row, column)?;
    let ty = row.columns()[index].type_().clone();
    let text = match ty {
        Type::INT8 => get::<i64>(row, index).map(|v| v.map(|v| v.to_string())),
        Type::INT4 => get::<i32>(row, index).map(|v| v.map(|v| v.to_string())),
        Type::BOOL => get::<bool>(row, index).map(|v| v.map(|v| v.to_string())),
        Type::FLOAT8 => get::<f64>(row, index).map(|v| v.map(|v| v.to_string())),
        Type::BYTEA => {
            get::<Vec<u8>>(row, index).map(|v| v.map(|v| format!("<{} bytes>", v.len())))
        }
        _ => get::<String>(row, index),
    };
    Ok(text.ok().flatten().unwrap_or_else(|| "NULL".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_for_postgres_outside_quotes() {
        assert_eq!(
            numbered("SELECT a FROM t WHERE b = ?1 AND c IN (?2, ?10) AND d = '?3' AND \"?4\" = ?"),
            "SELECT a FROM t WHERE b = $1 AND c IN ($2, $10) AND d = '?3' AND \"?4\" = ?"
        );
        assert_eq!(
            numbered("x = 'it''s ?1' OR y = ?2"),
            "x = 'it''s ?1' OR y = $2"
        );
    }

    #[test]
    fn urls_name_postgres_and_keep_their_password_out_of_sight() {
        let config =
            PostgresConfig::parse("postgres://berth:hunter2@db.internal:5433/state", None).unwrap();
        assert_eq!(
            config.to_string(),
            "postgres://berth@db.internal:5433/state"
        );
        assert!(!format!("{config:?}").contains("hunter2"));
        assert_eq!(config.config.get_password(), Some(&b"hunter2"[..]));
        // A password from PGPASSWORD fills in for a URL without one, never over one.
        let from_env = PostgresConfig::parse("postgresql://berth@db/state", Some("env")).unwrap();
        assert_eq!(from_env.config.get_password(), Some(&b"env"[..]));
        let from_url = PostgresConfig::parse("postgres://berth:url@db/state", Some("env")).unwrap();
        assert_eq!(from_url.config.get_password(), Some(&b"url"[..]));
        // No host: Debian's socket directory, as libpq there.
        let local = PostgresConfig::parse("postgres://berth@/state", None);
        let local = local.map(|config| config.to_string());
        assert_eq!(local.unwrap(), "postgres://berth@/var/run/postgresql/state");
        for bad in [
            "mysql://x@y/z",
            "/var/lib/berth",
            "postgres://u@h:notaport/d",
            "postgres://u@h/d?sslmode=require",
        ] {
            let err = PostgresConfig::parse(bad, None).unwrap_err();
            assert!(
                matches!(err, StoreError::DatabaseUrl { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn an_unreachable_server_is_a_typed_error_without_the_password() {
        // Nothing listens on loopback port 1.
        let config =
            PostgresConfig::parse("postgres://berth:hunter2@127.0.0.1:1/state", None).unwrap();
        let err = crate::Store::connect(&crate::DatabaseConfig::Postgres(config))
            .err()
            .expect("connected to port 1");
        let message = err.to_string();
        assert!(
            matches!(err, StoreError::DatabaseUnreachable { .. }),
            "{message}"
        );
        assert!(err.is_unavailable());
        assert!(
            message.contains("postgres://berth@127.0.0.1:1/state"),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
        assert!(!format!("{err:?}").contains("hunter2"));
    }
}
