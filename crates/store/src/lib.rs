//! berth-store: berth's durable state in an embedded SQLite database.
//!
//! Owns the schema and its migrations, and every query: teams, API keys (only their
//! sha256 hash is stored), sandboxes and their metadata, snapshots, lifecycle events,
//! webhooks and their pending deliveries, sandbox logs and metric samples. The database
//! runs in WAL mode with a busy timeout so `berth keys …` can work on the state directory
//! while `berth up` runs. It knows nothing of HTTP, of the runtime or of where
//! checkpoints live on disk (it stores the paths it is given); callers map records to
//! API models and [`StoreError`]s to responses.
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
//!
//! Shared underneath: `db` (the connection, statement helpers, numbered
//! placeholders for filters), `columns` (time and JSON encodings, and the row reader
//! that turns any undecodable value into [`StoreError::CorruptColumn`] naming table,
//! column and row, never a default), `cursor` (opaque keyset cursors), `schema`
//! (migrations), `error`.
//!
//! # Listings
//!
//! Listings filter, order and page in SQL. Sandboxes and snapshots page by keyset: the
//! order is total (a time in ms, then the id), the cursor is the last row's key, and the
//! next page is `WHERE (time, id) < (cursor)`, so rows created or removed between pages
//! never duplicate or skip others. Cursors are opaque (base64url) and tied to their
//! listing and order; a foreign or malformed one is [`StoreError::InvalidCursor`] (the
//! server answers 400). Events page by offset because E2B's events API does; webhooks
//! and API keys are few per team and not paged.
//!
//! # Portability
//!
//! The queries are written so a Postgres backend could run them unchanged except for:
//! placeholders (`?N` → `$N`, same numbers), `instr` (Postgres: `strpos`) in log search,
//! and the DDL and bookkeeping of `schema` (`AUTOINCREMENT`, `PRAGMA user_version`,
//! `BEGIN IMMEDIATE`, `json_each` in a backfill). Booleans are bound as parameters, never
//! compared with `1`; upserts use `ON CONFLICT … DO UPDATE`; keyset conditions use
//! standard row values. Postgres would need `COLLATE "C"` on the id ordering to match
//! SQLite's byte order (cursors stay correct either way, as order and cursor share a
//! collation). Metadata filters use the `sandbox_metadata` table rather than JSON
//! functions for the same reason.

#![forbid(unsafe_code)]

mod columns;
mod cursor;
mod db;
mod error;
mod events;
mod keys;
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
