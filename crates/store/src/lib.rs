//! berth-store: berth's durable state, in an embedded SQLite database by default or in
//! Postgres when several berth processes share it.
//!
//! Owns the schema and its migrations, and every query: teams, API keys (only their
//! sha256 hash is stored), sandboxes and their metadata, snapshots, lifecycle events,
//! webhooks and their deliveries, sandbox logs and metric samples. It knows nothing of
//! HTTP, of the runtime or of where checkpoints live on disk (it stores the paths it is
//! given); callers map records to API models and [`StoreError`]s to responses.
//!
//! # Backends
//!
//! Chosen at start by [`DatabaseConfig`] (`berth --database`, `BERTH_DATABASE_URL`):
//! - **SQLite** (the default, [`Store::open`]; `sqlite:DIR` names another directory,
//!   for several processes on one machine): `berth.db` in the state directory, in WAL
//!   mode with a busy timeout so `berth keys …` can work on it while `berth up` runs; one
//!   connection per process.
//! - **Postgres** (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, [`Store::connect`];
//!   a password not in the URL comes from `PGPASSWORD`): a pool of up to 8 connections
//!   per process, any number of processes on one database. The tables go to the first
//!   schema of the connection's search path (`?options=-c%20search_path%3Dberth` picks
//!   one). No TLS yet: reach the server over a unix socket, loopback or a private network.
//!
//! The API is the same on both and synchronous: a call blocks its thread for a statement
//! or a transaction (SQLite's lock, or a Postgres round trip), from async tasks too (the
//! Postgres connections' I/O runs on the pool's own thread; see `postgres`).
//!
//! Every statement is written once, in SQL both dialects run, with numbered
//! placeholders `?N` (`$N` on Postgres); where they differ the code asks the connection
//! its dialect (`instr`/`strpos` in log search). The schema is one numbered list of
//! migrations, each with its SQLite and its Postgres DDL (`schema`). Encodings are the
//! same on both: times as `BIGINT` milliseconds since the epoch, every integer 64-bit,
//! flags `BOOLEAN` (0/1 in SQLite), maps and lists as JSON text, sealed secrets as
//! `BYTEA`/`BLOB`, and text ordered by bytes (`COLLATE "C"` on every Postgres text
//! column), so listings and cursors come out identical.
//!
//! # Guarantees
//!
//! A single statement is atomic on both backends; the state transitions
//! (`mark_paused`, `mark_resumed`, `mark_killed`, `start_template_build`, …) are one
//! conditional `UPDATE` each, so of several callers racing, from any number of
//! processes, exactly one sees `true`. Every call of several statements runs in one
//! transaction (`Store::write`) that behaves as if it ran alone: SQLite takes the write
//! lock up front (`BEGIN IMMEDIATE`); Postgres runs it `SERIALIZABLE` and runs it again
//! when it loses a conflict (a serialization failure, a deadlock, or a unique key a
//! concurrent transaction inserted first), [`StoreError::Conflict`] after 10 attempts.
//! So, across processes:
//! - [`Store::create_team`]: exactly one first team is the default; a name taken
//!   meanwhile is [`StoreError::TeamExists`].
//! - [`Store::insert_sandbox`]: the row, its metadata and volume rows appear together.
//! - [`Store::put_snapshot`]: one snapshot per team and name; each replaced checkpoint is
//!   handed back to exactly one caller (to delete).
//! - [`Store::add_secret_version`]: concurrent updates get consecutive versions (on
//!   Postgres a retried attempt calls its `seal` again, for the version it then writes).
//! - [`Store::delete_volume`]: the in-use check and the delete see one state.
//! - [`Store::record_event`]: the event and its queued deliveries, together.
//! - template builds, tags and the installed-template sync; webhook updates; delivery
//!   attempts with their history pruning.
//! - [`Store::mark_lapsed_nodes_lost`] and [`Store::claim_due_deliveries`] (one
//!   `UPDATE … RETURNING` each): each lapsed node, each due delivery, is returned to
//!   exactly one of the API instances asking.
//!
//! Listings that read twice ([`Store::list_sandboxes`]: page and total) read one
//! snapshot. What the store does not make atomic are the server's check-then-act
//! sequences of separate calls: an idempotency key's lookup and record (serialised per
//! key inside one process only), quota checks before a create, and a create's volume
//! lookup before its insert. They need store primitives of their own where several API
//! processes share a database.
//!
//! # Modules
//!
//! One module per aggregate holds its records and all of its SQL:
//! - `teams`: [`Team`], [`ApiKeyRecord`]; `keys`: the raw key format, hash and mask.
//! - `sandboxes`: [`SandboxRecord`] and its status and lifecycle, listings
//!   ([`SandboxFilter`] → [`SandboxPage`]), idempotency keys, team metric spans.
//! - `snapshots`: [`SnapshotRecord`].
//! - `templates`: [`TemplateRecord`] (a team's, or installed on the host),
//!   [`TemplateBuildRecord`], [`TemplateTagRecord`].
//! - `volumes`: [`VolumeRecord`], which sandboxes mount them ([`VolumeMountRecord`]).
//! - `secrets`: [`SecretRecord`] and its versions, sealed by the caller's vault
//!   ([`SealedVersion`]: the store never sees a secret's value).
//! - `events`: [`EventRecord`], [`WebhookRecord`], [`PendingDelivery`], and each
//!   webhook's delivery history ([`DeliveryRecord`]).
//! - `telemetry`: [`LogRecord`], [`MetricSample`].
//! - `nodes`: a split deployment's [`NodeRecord`]s (leases, draining, loss) and
//!   placements: which node each sandbox, checkpoint, build and volume lives on
//!   ([`PlacedKind`]).
//!
//! Shared underneath: `db` (the backend seam: the connection of one call, values,
//! rows, transactions, numbered placeholders for filters), `sqlite` and `postgres` (the
//! two backends), `columns` (time and JSON encodings, and the row reader that turns any
//! undecodable value into [`StoreError::CorruptColumn`] naming table, column and row,
//! never a default), `cursor` (opaque keyset cursors), `schema` (migrations), `error`.
//!
//! # Listings
//!
//! Listings filter, order and page in SQL. Sandboxes and snapshots page by keyset: the
//! order is total (a time in ms, then the id), the cursor is the last row's key, and the
//! next page is `WHERE (time, id) < (cursor)`, so rows created or removed between pages
//! never duplicate or skip others. Cursors are opaque (base64url) and tied to their
//! listing and order; a foreign or malformed one is [`StoreError::InvalidCursor`] (the
//! server answers 400). Events page by offset because E2B's events API does; webhooks
//! and API keys are few per team and not paged. Metadata filters use the
//! `sandbox_metadata` table rather than JSON functions, which the dialects spell
//! differently.
//!
//! # Errors and secrets
//!
//! Each cause is its own [`StoreError`] variant: an unusable URL, a server that cannot
//! be reached or that refuses the login, a pool with no free connection, a transaction
//! that kept conflicting (the last four are [`StoreError::is_unavailable`]: the server
//! answers 503). No error, log line or `Debug` output carries the database password:
//! servers are named by [`PostgresConfig`]'s display form, `postgres://USER@HOST:PORT/DB`.

#![forbid(unsafe_code)]

mod columns;
mod cursor;
mod db;
mod error;
mod events;
mod keys;
mod nodes;
mod postgres;
mod sandboxes;
mod schema;
mod secrets;
mod snapshots;
mod sqlite;
mod teams;
mod telemetry;
mod templates;
mod volumes;

pub use db::{DatabaseConfig, QueryObserver, Store, DATABASE_FILE};
pub use error::{ColumnTypeError, Corruption, Result, StoreError};
pub use events::{
    DeliveryAttempt, DeliveryRecord, DeliveryStatus, EventRecord, PendingDelivery, WebhookChanges,
    WebhookRecord, DELIVERY_HISTORY,
};
pub use keys::{generate_api_key, hash_api_key, KeyMask, API_KEY_PREFIX};
pub use nodes::{NodeRecord, NodeRegistration, NodeUsage, PlacedKind};
pub use postgres::PostgresConfig;
pub use sandboxes::{
    Lifecycle, PausedSandbox, SandboxFilter, SandboxPage, SandboxRecord, SandboxStatus,
    StateFilter, TeamUsage,
};
pub use secrets::{SealedVersion, SecretPage, SecretRecord, SECRET_ID_PREFIX};
pub use snapshots::SnapshotRecord;
pub use teams::{ApiKeyRecord, Team};
pub use telemetry::{LogRecord, MetricSample};
pub use templates::{
    BuildReason, InstalledTemplate, NewTemplateBuild, TemplateBuildRecord, TemplateBuildStatus,
    TemplateRecord, TemplateTagRecord, DEFAULT_TAG,
};
pub use volumes::{VolumeMountRecord, VolumeRecord};

#[cfg(test)]
mod tests;
