//! The secrets service: team secrets whose values are write-only, sealed by the shared
//! vault (`berth-vault`) before they reach the store, and resolved only for the egress
//! proxy ([`SecretsResolver`]), per request, so an update applies to the next request.
//!
//! A value never leaves this module except as the egress proxy's `SecretValue`: no
//! response, log line, event or error message carries it (errors name lengths and
//! fields, never contents). Each version is sealed under the context
//! `secret/<id>/<version>`, so a sealed value moved to another row or version does not
//! open. Rotation ([`rotate`]) adds a KEK version and reseals every version; a daemon
//! that meets a version sealed under a KEK it has not loaded (rotated by `berth
//! rotate-kek` while it ran) reloads its keys and retries.

use std::net::IpAddr;
use std::sync::Arc;

use berth_api::{ApiError, StringMap};
use berth_store::{SealedVersion, SecretRecord, Store, StoreError};
use berth_vault::{SealedRecord, Vault, VaultError};
use parking_lot::RwLock;

/// Longest secret name (after lower-casing it is stored as is).
pub const MAX_NAME_LEN: usize = 128;
/// Largest secret value, in bytes (values go into HTTP headers).
pub const MAX_VALUE_BYTES: usize = 8192;
/// Most metadata entries, longest key and value, largest total (keys plus values).
pub const MAX_METADATA_ENTRIES: usize = 32;
pub const MAX_METADATA_KEY_BYTES: usize = 128;
pub const MAX_METADATA_VALUE_BYTES: usize = 1024;
pub const MAX_METADATA_BYTES: usize = 8192;

/// Why a secret operation failed. No variant carries a value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("sealing or opening a secret: {0}")]
    Vault(#[from] VaultError),
    #[error("secret {0} has no stored value")]
    MissingValue(String),
}

impl SecretError {
    pub(crate) fn to_api(&self) -> ApiError {
        ApiError::Internal(self.to_string())
    }
}

/// The vault the secrets are sealed with, reloading its keys when another process
/// rotated them.
pub struct SecretVault {
    vault: RwLock<Vault>,
}

fn context(secret_id: &str, version: i64) -> String {
    format!("secret/{secret_id}/{version}")
}

fn to_store(record: SealedRecord) -> SealedVersion {
    SealedVersion {
        kek_version: record.kek_version,
        wrapped_key: record.wrapped_key,
        ciphertext: record.ciphertext,
    }
}

fn from_store(sealed: &SealedVersion) -> SealedRecord {
    SealedRecord {
        kek_version: sealed.kek_version,
        wrapped_key: sealed.wrapped_key.clone(),
        ciphertext: sealed.ciphertext.clone(),
    }
}

impl SecretVault {
    pub fn new(vault: Vault) -> Self {
        SecretVault {
            vault: RwLock::new(vault),
        }
    }

    fn seal(
        &self,
        secret_id: &str,
        version: i64,
        value: &str,
    ) -> Result<SealedVersion, VaultError> {
        self.vault
            .read()
            .seal(&context(secret_id, version), value.as_bytes())
            .map(to_store)
    }

    fn open(
        &self,
        secret_id: &str,
        version: i64,
        sealed: &SealedVersion,
    ) -> Result<String, SecretError> {
        let record = from_store(sealed);
        let context = context(secret_id, version);
        let opened = self.vault.read().open(&context, &record);
        let plaintext = match opened {
            Err(VaultError::VersionNotLoaded(_)) => {
                let mut vault = self.vault.write();
                vault.reload()?;
                vault.open(&context, &record)?
            }
            other => other?,
        };
        String::from_utf8(plaintext).map_err(|_| SecretError::MissingValue(secret_id.to_string()))
    }
}

/// Checks a name and returns its canonical (lower-case) form.
pub fn canonical_name(name: &str) -> Result<String, ApiError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(ApiError::BadRequest(format!(
            "secret name {name:?} is invalid: use 1-{MAX_NAME_LEN} letters, digits, '_' or '-'"
        )));
    }
    let canonical = name.to_ascii_lowercase();
    if canonical.starts_with(berth_store::SECRET_ID_PREFIX) {
        return Err(ApiError::BadRequest(format!(
            "secret name {name:?} is invalid: the {} prefix is reserved for secret ids",
            berth_store::SECRET_ID_PREFIX
        )));
    }
    Ok(canonical)
}

/// A path's `{secretID}`: an id as is, a name in canonical form.
pub fn lookup_key(id_or_name: &str) -> String {
    if id_or_name.starts_with(berth_store::SECRET_ID_PREFIX) {
        id_or_name.to_string()
    } else {
        id_or_name.to_ascii_lowercase()
    }
}

/// Checks a value without ever echoing it.
pub fn validate_value(value: &str) -> Result<(), ApiError> {
    if value.is_empty() {
        return Err(ApiError::BadRequest("value: must not be empty".into()));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(ApiError::BadRequest(format!(
            "value: {} bytes, at most {MAX_VALUE_BYTES} are allowed",
            value.len()
        )));
    }
    if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        return Err(ApiError::BadRequest(
            "value: holds a control character (it is sent in HTTP headers)".into(),
        ));
    }
    Ok(())
}

/// Checks metadata against the spec's limits.
pub fn validate_metadata(metadata: &StringMap) -> Result<(), ApiError> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(ApiError::BadRequest(format!(
            "metadata: {} entries, at most {MAX_METADATA_ENTRIES} are allowed",
            metadata.len()
        )));
    }
    let mut total = 0;
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES {
            return Err(ApiError::BadRequest(format!(
                "metadata: key {key:?} must be 1-{MAX_METADATA_KEY_BYTES} bytes"
            )));
        }
        if value.len() > MAX_METADATA_VALUE_BYTES {
            return Err(ApiError::BadRequest(format!(
                "metadata[{key:?}]: {} bytes, at most {MAX_METADATA_VALUE_BYTES} are allowed",
                value.len()
            )));
        }
        total += key.len() + value.len();
    }
    if total > MAX_METADATA_BYTES {
        return Err(ApiError::BadRequest(format!(
            "metadata: {total} bytes in total, at most {MAX_METADATA_BYTES} are allowed"
        )));
    }
    Ok(())
}

/// Creates secret `name` (canonical) with `value` as version 1.
pub fn create(
    store: &Store,
    vault: &SecretVault,
    team_id: &str,
    name: &str,
    value: &str,
    metadata: &StringMap,
) -> Result<SecretRecord, crate::error::ServiceError> {
    let id = Store::new_secret_id();
    let sealed = vault.seal(&id, 1, value).map_err(SecretError::from)?;
    Ok(store.insert_secret(&id, team_id, name, metadata, &sealed)?)
}

/// Appends `value` as the next version of secret `id_or_name`.
pub fn update(
    store: &Store,
    vault: &SecretVault,
    team_id: &str,
    id_or_name: &str,
    value: &str,
    metadata: Option<&StringMap>,
) -> Result<SecretRecord, crate::error::ServiceError> {
    let mut sealing_error = None;
    let updated = store.add_secret_version(team_id, id_or_name, metadata, |id, version| {
        vault.seal(id, version, value).map_err(|err| {
            sealing_error = Some(err);
            // Aborts the transaction; the vault's error is returned below.
            StoreError::NotFound {
                what: "sealed value",
                id: id.to_string(),
            }
        })
    });
    match (updated, sealing_error) {
        (_, Some(err)) => Err(SecretError::from(err).into()),
        (result, None) => Ok(result?),
    }
}

/// What [`rotate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationReport {
    pub kek_version: u32,
    pub versions_resealed: usize,
}

/// Adds a KEK version (key file; with `BERTH_KEK` the operator adds it there first and
/// only resealing happens) and reseals every stored version under the newest KEK.
pub fn rotate(
    store: &Store,
    vault: &mut Vault,
) -> Result<RotationReport, crate::error::ServiceError> {
    if std::env::var(berth_vault::KEK_ENV).is_err() {
        vault.add_version().map_err(SecretError::from)?;
    } else {
        vault.reload().map_err(SecretError::from)?;
    }
    let mut versions_resealed = 0;
    for (secret_id, version, sealed) in store.all_secret_versions()? {
        let record = from_store(&sealed);
        if !vault.is_stale(&record) {
            continue;
        }
        let resealed = vault
            .reseal(&context(&secret_id, version), &record)
            .map_err(SecretError::from)?;
        store.replace_secret_version(&secret_id, version, &to_store(resealed))?;
        versions_resealed += 1;
    }
    Ok(RotationReport {
        kek_version: vault.current_version(),
        versions_resealed,
    })
}

/// Resolves `${e2b.secrets.NAME}` for the egress proxy: the sandbox at an address (found
/// by the daemon's network lookup), its team, that team's secret of that name (names
/// compare case-insensitively, as they are stored lower-cased), its current version
/// opened. One store read per call, so an updated secret applies to the next request.
pub struct SecretsResolver {
    store: Arc<Store>,
    vault: Arc<SecretVault>,
    sandbox_at: Box<dyn Fn(IpAddr) -> Option<String> + Send + Sync>,
}

impl SecretsResolver {
    /// `sandbox_at` maps a sandbox's address to its id (berth-net's lookup).
    pub fn new(
        store: Arc<Store>,
        vault: Arc<SecretVault>,
        sandbox_at: impl Fn(IpAddr) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        SecretsResolver {
            store,
            vault,
            sandbox_at: Box::new(sandbox_at),
        }
    }

    /// [`SecretsResolver::new`] with its own vault over `key_file` (`BERTH_KEK` wins),
    /// for an egress proxy started before the server: it reloads keys like the server's.
    pub fn open(
        store: Arc<Store>,
        key_file: &std::path::Path,
        sandbox_at: impl Fn(IpAddr) -> Option<String> + Send + Sync + 'static,
    ) -> Result<Self, VaultError> {
        let vault = Arc::new(SecretVault::new(Vault::load(key_file)?));
        Ok(Self::new(store, vault, sandbox_at))
    }

    fn value(&self, sandbox_addr: IpAddr, name: &str) -> Result<Option<String>, String> {
        let Some(sandbox_id) = (self.sandbox_at)(sandbox_addr) else {
            return Ok(None);
        };
        let Some(sandbox) = self
            .store
            .live_sandbox_any_team(&sandbox_id)
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let Some((secret_id, version, sealed)) = self
            .store
            .current_secret_value(&sandbox.team_id, &name.to_ascii_lowercase())
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        self.vault
            .open(&secret_id, version, &sealed)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

impl berth_egress::SecretResolver for SecretsResolver {
    fn resolve(&self, sandbox_addr: IpAddr, name: &str) -> Option<berth_egress::SecretValue> {
        match self.value(sandbox_addr, name) {
            Ok(value) => value.map(berth_egress::SecretValue::new),
            Err(error) => {
                // The error names the secret and the cause, never the value.
                tracing::error!(%sandbox_addr, secret = %name, %error, "resolving a secret for egress");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_lower_cased_and_sec_is_reserved() {
        assert_eq!(canonical_name("Stripe_Key-1").unwrap(), "stripe_key-1");
        assert!(canonical_name("").is_err());
        assert!(canonical_name("a.b").is_err());
        assert!(canonical_name("{x}").is_err());
        assert!(canonical_name(&"a".repeat(129)).is_err());
        assert!(canonical_name("SEC_abc").is_err());
        assert_eq!(lookup_key("Stripe_Key"), "stripe_key");
        assert_eq!(lookup_key("sec_ABC"), "sec_ABC");
    }

    #[test]
    fn values_and_metadata_are_bounded_without_echoing_values() {
        let err = validate_value("line\nbreak-s3cr3t").unwrap_err();
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
        assert!(validate_value("").is_err());
        assert!(validate_value(&"x".repeat(MAX_VALUE_BYTES + 1)).is_err());
        assert!(validate_value("sk_live_abc").is_ok());
        let many: StringMap = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(validate_metadata(&many).is_err());
        let long: StringMap = [("k".to_string(), "v".repeat(1025))].into();
        assert!(validate_metadata(&long).is_err());
        let total: StringMap = (0..9)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect();
        assert!(validate_metadata(&total).is_err());
    }

    #[test]
    fn rotation_reseals_every_version_and_values_still_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let team = store.create_team("t").unwrap();
        let mut keys = Vault::from_keys([(1, [3u8; 32])].into()).unwrap();
        let vault = SecretVault::new(Vault::from_keys([(1, [3u8; 32])].into()).unwrap());
        let created = create(&store, &vault, &team.id, "k", "v1", &StringMap::new()).unwrap();
        update(&store, &vault, &team.id, "k", "v2", None).unwrap();
        let report = rotate(&store, &mut keys).unwrap();
        assert_eq!(
            report,
            RotationReport {
                kek_version: 2,
                versions_resealed: 2
            }
        );
        let (id, version, sealed) = store.current_secret_value(&team.id, "k").unwrap().unwrap();
        assert_eq!(
            (id.as_str(), version, sealed.kek_version),
            (created.id.as_str(), 2, 2)
        );
        let rotated = SecretVault::new(keys);
        assert_eq!(rotated.open(&id, version, &sealed).unwrap(), "v2");
        // A sealed value moved to another version does not open.
        assert!(rotated.open(&id, 1, &sealed).is_err());
    }
}
