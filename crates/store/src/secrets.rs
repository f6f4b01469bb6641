//! Secrets: a team's named values, each a list of versions sealed by the caller's vault.
//!
//! The store never sees a value: the caller seals it (envelope encryption, the context
//! `secret/<id>/<version>` bound as associated data) and hands over a [`SealedVersion`].
//! A new version is appended in one transaction that also moves `current_version`, so
//! readers see the old value or the new one, never neither. Names are stored
//! lower-cased (the caller canonicalises) and unique per team; ids are `sec_…`.

use time::OffsetDateTime;

use crate::columns::{from_ms, now, string_map_json, to_ms, Columns};
use crate::cursor::{self, Listing, Position};
use crate::db::{params, Bindings, Conn, Row, Store};
use crate::error::{Result, StoreError};

/// A secret's metadata: never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRecord {
    pub id: String,
    pub team_id: String,
    /// Canonical (lower-case) name, unique per team.
    pub name: String,
    pub current_version: i64,
    pub metadata: berth_api::StringMap,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

/// One sealed version of a secret's value, as the vault produced it.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedVersion {
    pub kek_version: u32,
    pub wrapped_key: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl std::fmt::Debug for SealedVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedVersion")
            .field("kek_version", &self.kek_version)
            .finish_non_exhaustive()
    }
}

/// One page of a secret listing.
#[derive(Debug, Clone)]
pub struct SecretPage {
    pub secrets: Vec<SecretRecord>,
    pub next_token: Option<String>,
}

const SECRET_COLUMNS: &str =
    "id, team_id, name, current_version, metadata, created_at_ms, updated_at_ms";

/// Prefix of every secret id; names may not start with it.
pub const SECRET_ID_PREFIX: &str = "sec_";

fn secret_from_row(row: &Row<'_>) -> Result<SecretRecord> {
    let c = Columns::new(row, "secrets", &["id"])?;
    Ok(SecretRecord {
        id: c.get("id")?,
        team_id: c.get("team_id")?,
        name: c.get("name")?,
        current_version: c.get("current_version")?,
        metadata: c.json("metadata")?,
        created_at: c.time("created_at_ms")?,
        updated_at: c.time("updated_at_ms")?,
    })
}

fn sealed_from_row(row: &Row<'_>) -> Result<SealedVersion> {
    let c = Columns::new(row, "secret_versions", &["secret_id", "version"])?;
    Ok(SealedVersion {
        kek_version: c.get("kek_version")?,
        wrapped_key: c.get("wrapped_key")?,
        ciphertext: c.get("ciphertext")?,
    })
}

/// Secret `id_or_name` of `team_id`: an id when it has the `sec_` prefix, else a name.
fn find(conn: &mut Conn<'_>, team_id: &str, id_or_name: &str) -> Result<Option<SecretRecord>> {
    let column = if id_or_name.starts_with(SECRET_ID_PREFIX) {
        "id"
    } else {
        "name"
    };
    conn.query_opt(
        &format!("SELECT {SECRET_COLUMNS} FROM secrets WHERE team_id = ?1 AND {column} = ?2"),
        params![team_id, id_or_name],
        secret_from_row,
    )
}

fn insert_version(
    conn: &mut Conn<'_>,
    secret_id: &str,
    version: i64,
    sealed: &SealedVersion,
    at: OffsetDateTime,
) -> Result<()> {
    conn.execute(
        "INSERT INTO secret_versions \
         (secret_id, version, kek_version, wrapped_key, ciphertext, created_at_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            secret_id,
            version,
            sealed.kek_version,
            sealed.wrapped_key,
            sealed.ciphertext,
            to_ms(at)
        ],
    )?;
    Ok(())
}

impl Store {
    /// A fresh secret id (`sec_` + 32 hex characters), to seal the first version under
    /// before [`Store::insert_secret`].
    pub fn new_secret_id() -> String {
        format!("{SECRET_ID_PREFIX}{}", uuid::Uuid::new_v4().simple())
    }

    /// Records secret `id` (from [`Store::new_secret_id`]) with `sealed` as version 1.
    pub fn insert_secret(
        &self,
        id: &str,
        team_id: &str,
        name: &str,
        metadata: &berth_api::StringMap,
        sealed: &SealedVersion,
    ) -> Result<SecretRecord> {
        let at = stored_now();
        let record = SecretRecord {
            id: id.to_string(),
            team_id: team_id.to_string(),
            name: name.to_string(),
            current_version: 1,
            metadata: metadata.clone(),
            created_at: at,
            updated_at: at,
        };
        self.write(|tx| {
            let inserted = tx.execute(
                &format!(
                    "INSERT INTO secrets ({SECRET_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
                ),
                params![
                    record.id,
                    record.team_id,
                    record.name,
                    record.current_version,
                    string_map_json(&record.metadata),
                    to_ms(at),
                    to_ms(at)
                ],
            );
            match inserted {
                Ok(_) => {}
                Err(err) if err.is_unique_violation() => {
                    return Err(StoreError::NameTaken {
                        what: "secret",
                        name: name.to_string(),
                    })
                }
                Err(err) => return Err(err),
            }
            insert_version(tx, id, 1, sealed, at)?;
            Ok(record.clone())
        })
    }

    /// Secret `id_or_name` (an `sec_…` id or a canonical name) of `team_id`.
    pub fn secret(&self, team_id: &str, id_or_name: &str) -> Result<Option<SecretRecord>> {
        find(&mut self.conn()?, team_id, id_or_name)
    }

    /// Secrets of `team_id`, newest first, at most `limit` after cursor `next_token`.
    pub fn list_secrets(
        &self,
        team_id: &str,
        limit: usize,
        next_token: Option<&str>,
    ) -> Result<SecretPage> {
        let listing = Listing::Secrets;
        let mut bindings = Bindings::default();
        let mut conditions = vec![format!("team_id = {}", bindings.bind(team_id.to_string()))];
        if let Some(token) = next_token {
            let after = cursor::decode(listing, token)?;
            let ms = bindings.bind(after.ms);
            let id = bindings.bind(after.id);
            conditions.push(cursor::after(listing, "created_at_ms", "id", &ms, &id));
        }
        let sql = format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE {} {} LIMIT {}",
            conditions.join(" AND "),
            cursor::order_by(listing, "created_at_ms", "id"),
            bindings.bind(cursor::fetch_limit(limit)),
        );
        let rows = self
            .conn()?
            .query_all(&sql, bindings.params(), secret_from_row)?;
        let (secrets, next_token) = cursor::paginate(listing, rows, limit, |s| Position {
            ms: to_ms(s.created_at),
            id: s.id.clone(),
        });
        Ok(SecretPage {
            secrets,
            next_token,
        })
    }

    /// Appends a version to secret `id_or_name` of `team_id`: `seal(secret id, new
    /// version)` seals the value under that context; `metadata`, when given, replaces the
    /// stored metadata. Returns the updated record.
    ///
    /// One write transaction: two concurrent updates get consecutive versions. On
    /// Postgres a conflicting attempt runs again, calling `seal` again for the version it
    /// then appends.
    pub fn add_secret_version(
        &self,
        team_id: &str,
        id_or_name: &str,
        metadata: Option<&berth_api::StringMap>,
        mut seal: impl FnMut(&str, i64) -> Result<SealedVersion>,
    ) -> Result<SecretRecord> {
        self.write(|tx| {
            let mut record =
                find(tx, team_id, id_or_name)?.ok_or_else(|| StoreError::NotFound {
                    what: "secret",
                    id: id_or_name.to_string(),
                })?;
            let version = record.current_version + 1;
            let sealed = seal(&record.id, version)?;
            let at = stored_now();
            insert_version(tx, &record.id, version, &sealed, at)?;
            if let Some(metadata) = metadata {
                record.metadata = metadata.clone();
            }
            tx.execute(
                "UPDATE secrets SET current_version = ?2, metadata = ?3, updated_at_ms = ?4 \
             WHERE id = ?1",
                params![
                    record.id,
                    version,
                    string_map_json(&record.metadata),
                    to_ms(at)
                ],
            )?;
            record.current_version = version;
            record.updated_at = at;
            Ok(record)
        })
    }

    /// Deletes secret `id_or_name` of `team_id` with all its versions.
    pub fn delete_secret(&self, team_id: &str, id_or_name: &str) -> Result<SecretRecord> {
        self.write(|tx| {
            let record = find(tx, team_id, id_or_name)?.ok_or_else(|| StoreError::NotFound {
                what: "secret",
                id: id_or_name.to_string(),
            })?;
            tx.execute(
                "DELETE FROM secret_versions WHERE secret_id = ?1",
                params![&record.id],
            )?;
            tx.execute("DELETE FROM secrets WHERE id = ?1", params![&record.id])?;
            Ok(record)
        })
    }

    /// The current version of secret `name` (canonical) of `team_id`, sealed:
    /// (secret id, version, sealed value).
    pub fn current_secret_value(
        &self,
        team_id: &str,
        name: &str,
    ) -> Result<Option<(String, i64, SealedVersion)>> {
        self.conn()?.query_opt(
            "SELECT v.secret_id, v.version, v.kek_version, v.wrapped_key, v.ciphertext \
             FROM secrets s JOIN secret_versions v \
               ON v.secret_id = s.id AND v.version = s.current_version \
             WHERE s.team_id = ?1 AND s.name = ?2",
            params![team_id, name],
            |row| {
                let c = Columns::new(row, "secret_versions", &["secret_id", "version"])?;
                Ok((
                    c.get("secret_id")?,
                    c.get("version")?,
                    sealed_from_row(row)?,
                ))
            },
        )
    }

    /// Every sealed version of every secret: (secret id, version, sealed value), for
    /// rotating the vault's key.
    pub fn all_secret_versions(&self) -> Result<Vec<(String, i64, SealedVersion)>> {
        self.conn()?.query_all(
            "SELECT secret_id, version, kek_version, wrapped_key, ciphertext \
             FROM secret_versions ORDER BY secret_id, version",
            params![],
            |row| {
                let c = Columns::new(row, "secret_versions", &["secret_id", "version"])?;
                Ok((
                    c.get("secret_id")?,
                    c.get("version")?,
                    sealed_from_row(row)?,
                ))
            },
        )
    }

    /// Replaces the sealed value of one version (rotation reseals it, same value).
    pub fn replace_secret_version(
        &self,
        secret_id: &str,
        version: i64,
        sealed: &SealedVersion,
    ) -> Result<()> {
        self.conn()?.execute(
            "UPDATE secret_versions SET kek_version = ?3, wrapped_key = ?4, ciphertext = ?5 \
             WHERE secret_id = ?1 AND version = ?2",
            params![
                secret_id,
                version,
                sealed.kek_version,
                sealed.wrapped_key,
                sealed.ciphertext
            ],
        )?;
        Ok(())
    }
}

/// Now, at the millisecond precision rows keep (records returned equal those read back).
fn stored_now() -> OffsetDateTime {
    let now = now();
    from_ms(to_ms(now)).unwrap_or(now)
}
