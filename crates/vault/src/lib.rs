//! berth-vault: envelope encryption for everything secret berth keeps (MCP connection
//! keys, the control plane's secrets).
//!
//! Owns: key-encryption keys (KEKs), their versions and rotation, and sealing/opening
//! records. Does not own: where records are stored (callers keep [`SealedRecord`]s in
//! their own tables), nor what is in them.
//!
//! Design. Each record gets a random 256-bit data key (AES-256-GCM); the data key is
//! itself encrypted ("wrapped") with a versioned KEK. The record's context (e.g.
//! `secret/<id>/<version>`) is bound as associated data to both layers, so a record
//! copied to another row does not open.
//!
//! KEKs come from `BERTH_KEK` (`<version>:<base64 32 bytes>` entries separated by commas;
//! a bare base64 value is version 1) or else from a key file (one `<version>:<base64>`
//! per line, created with a fresh version 1 on first use, mode 0600, written with fsync +
//! rename). The highest version seals; older versions only open. Rotation is
//! [`Vault::add_version`] followed by [`Vault::reseal`] of every record under the newest
//! version by the record's owner; a process that finds a record sealed under a version
//! it has not loaded (another process rotated) calls [`Vault::reload`] and retries.
//!
//! No error, `Debug` output or log line carries key material or plaintext.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
use base64::Engine;
use rand::RngCore;

pub const KEK_ENV: &str = "BERTH_KEK";
const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 12;

/// Why keys could not be loaded or a record not sealed or opened. No variant carries key
/// material or plaintext.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("{action} the key-encryption key file {path}: {source}")]
    KeyFile {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no key-encryption key found: set {KEK_ENV} or let berth create the key file")]
    NoKey,
    #[error("bad key-encryption key version {0:?}: expected `<number>:<base64 key>`")]
    BadVersion(String),
    #[error("key-encryption key version {0} is not base64")]
    NotBase64(u32),
    #[error("key-encryption key version {0} must be 32 bytes")]
    WrongKeyLength(u32),
    #[error("keys come from {KEK_ENV}: add a new `<version>:<key>` entry there and rotate again")]
    KeysFromEnvironment,
    #[error("key-encryption key version {0} is not loaded: add it to {KEK_ENV} or the key file")]
    VersionNotLoaded(u32),
    #[error("encryption failed")]
    EncryptionFailed,
    #[error("decryption failed (wrong key or tampered record)")]
    DecryptionFailed,
    #[error("sealed value too short")]
    Truncated,
    #[error("wrapped data key has the wrong length")]
    WrappedKeyLength,
}

/// One encrypted record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedRecord {
    pub kek_version: u32,
    /// nonce || AES-GCM(KEK, data key)
    pub wrapped_key: Vec<u8>,
    /// nonce || AES-GCM(data key, plaintext)
    pub ciphertext: Vec<u8>,
}

/// Where the KEKs came from; only a key file can grow a new version by itself.
#[derive(Debug, Clone)]
enum KekSource {
    Env,
    /// Keys handed to [`Vault::from_keys`], kept in memory only.
    Given,
    File(PathBuf),
}

pub struct Vault {
    keks: BTreeMap<u32, [u8; KEY_LEN]>,
    source: KekSource,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault")
            .field("versions", &self.keks.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Vault {
    /// Loads KEKs from `BERTH_KEK` if set, else from (or creating) `key_file`.
    pub fn load(key_file: &Path) -> Result<Self, VaultError> {
        match std::env::var(KEK_ENV) {
            Ok(value) if !value.trim().is_empty() => Ok(Self {
                keks: parse_keks(&value, ',')?,
                source: KekSource::Env,
            }),
            _ => Self::load_file(key_file),
        }
    }

    /// Loads KEKs from `key_file` only, creating it with a random version 1 if missing.
    pub fn load_file(key_file: &Path) -> Result<Self, VaultError> {
        if !key_file.exists() {
            write_key_file(key_file, &BTreeMap::from([(1, random_key())]))?;
        }
        let text = std::fs::read_to_string(key_file).map_err(|source| VaultError::KeyFile {
            action: "reading",
            path: key_file.to_owned(),
            source,
        })?;
        Ok(Self {
            keks: parse_keks(&text, '\n')?,
            source: KekSource::File(key_file.to_owned()),
        })
    }

    /// From explicit keys (tests, embedding).
    pub fn from_keys(keks: BTreeMap<u32, [u8; KEY_LEN]>) -> Result<Self, VaultError> {
        if keks.is_empty() {
            return Err(VaultError::NoKey);
        }
        Ok(Self {
            keks,
            source: KekSource::Given,
        })
    }

    pub fn current_version(&self) -> u32 {
        *self
            .keks
            .keys()
            .next_back()
            .expect("a vault always holds a key")
    }

    /// Adds a new random KEK version to the key file (or, for [`Vault::from_keys`], in
    /// memory) and makes it current. With keys from `BERTH_KEK` the operator adds the
    /// version to the variable instead.
    pub fn add_version(&mut self) -> Result<u32, VaultError> {
        let version = self.current_version() + 1;
        let mut keks = self.keks.clone();
        keks.insert(version, random_key());
        match &self.source {
            KekSource::File(path) => write_key_file(path, &keks)?,
            KekSource::Given => {}
            KekSource::Env => return Err(VaultError::KeysFromEnvironment),
        }
        self.keks = keks;
        Ok(version)
    }

    /// Loads the keys again from where they came from (the key file another process
    /// may have rotated, or `BERTH_KEK`). Keys from [`Vault::from_keys`] stay as they are.
    pub fn reload(&mut self) -> Result<(), VaultError> {
        match &self.source {
            KekSource::File(path) => *self = Self::load_file(&path.clone())?,
            KekSource::Env => {
                if let Ok(value) = std::env::var(KEK_ENV) {
                    self.keks = parse_keks(&value, ',')?;
                }
            }
            KekSource::Given => {}
        }
        Ok(())
    }

    /// True when `record` is sealed under an older KEK version than the current one.
    pub fn is_stale(&self, record: &SealedRecord) -> bool {
        record.kek_version < self.current_version()
    }

    /// `record` opened and sealed again under the current KEK version with a fresh data
    /// key (rotation).
    pub fn reseal(&self, context: &str, record: &SealedRecord) -> Result<SealedRecord, VaultError> {
        let plaintext = self.open(context, record)?;
        self.seal(context, &plaintext)
    }

    /// Encrypts `plaintext` under a fresh data key; `context` (e.g. the record's table and
    /// id) is bound as associated data so a record cannot be moved to another row.
    pub fn seal(&self, context: &str, plaintext: &[u8]) -> Result<SealedRecord, VaultError> {
        let version = self.current_version();
        let data_key = random_key();
        let wrapped_key = encrypt(&self.keks[&version], &data_key, context.as_bytes())?;
        let ciphertext = encrypt(&data_key, plaintext, context.as_bytes())?;
        Ok(SealedRecord {
            kek_version: version,
            wrapped_key,
            ciphertext,
        })
    }

    /// Decrypts a record sealed under the same `context`.
    pub fn open(&self, context: &str, record: &SealedRecord) -> Result<Vec<u8>, VaultError> {
        let kek = self
            .keks
            .get(&record.kek_version)
            .ok_or(VaultError::VersionNotLoaded(record.kek_version))?;
        let data_key = decrypt(kek, &record.wrapped_key, context.as_bytes())?;
        let data_key: [u8; KEY_LEN] = data_key
            .try_into()
            .map_err(|_| VaultError::WrappedKeyLength)?;
        decrypt(&data_key, &record.ciphertext, context.as_bytes())
    }
}

fn random_key() -> [u8; KEY_LEN] {
    let mut key = [0u8; KEY_LEN];
    rand::rng().fill_bytes(&mut key);
    key
}

fn encrypt(key: &[u8; KEY_LEN], plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>, VaultError> {
    let cipher = Aes256Gcm::new(key.into());
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut nonce);
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .map_err(|_| VaultError::EncryptionFailed)?;
    let mut output = nonce.to_vec();
    output.extend(sealed);
    Ok(output)
}

fn decrypt(key: &[u8; KEY_LEN], sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, VaultError> {
    if sealed.len() < NONCE_LEN {
        return Err(VaultError::Truncated);
    }
    let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
    Aes256Gcm::new(key.into())
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad,
            },
        )
        .map_err(|_| VaultError::DecryptionFailed)
}

fn parse_keks(text: &str, separator: char) -> Result<BTreeMap<u32, [u8; KEY_LEN]>, VaultError> {
    let mut keks = BTreeMap::new();
    for entry in text
        .split(separator)
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (version, encoded) = match entry.split_once(':') {
            Some((version, encoded)) => (
                version
                    .trim()
                    .trim_start_matches('v')
                    .parse::<u32>()
                    .map_err(|_| VaultError::BadVersion(version.trim().to_owned()))?,
                encoded.trim(),
            ),
            None => (1, entry),
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| VaultError::NotBase64(version))?;
        let key: [u8; KEY_LEN] = bytes
            .try_into()
            .map_err(|_| VaultError::WrongKeyLength(version))?;
        keks.insert(version, key);
    }
    if keks.is_empty() {
        return Err(VaultError::NoKey);
    }
    Ok(keks)
}

fn write_key_file(path: &Path, keks: &BTreeMap<u32, [u8; KEY_LEN]>) -> Result<(), VaultError> {
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |action| {
        move |source| VaultError::KeyFile {
            action,
            path: path.to_owned(),
            source,
        }
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(failed("creating the directory of"))?;
    }
    let text: String = keks
        .iter()
        .map(|(version, key)| {
            format!(
                "{version}:{}\n",
                base64::engine::general_purpose::STANDARD.encode(key)
            )
        })
        .collect();
    // Write a sibling file and rename, so a crash never leaves a half-written key file.
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(failed("writing"))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(failed("writing"))?;
    std::fs::rename(&temporary, path).map_err(failed("writing"))?;
    // The rename itself must survive a power cut: a lost key file loses every record.
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => std::fs::File::open(parent)
            .and_then(|directory| directory.sync_all())
            .map_err(failed("syncing the directory of")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_fresh_data_keys() {
        let dir = tempfile::tempdir().unwrap();
        let vault = Vault::load_file(&dir.path().join("kek")).unwrap();
        let first = vault.seal("connection/alice", b"e2b_0123").unwrap();
        let second = vault.seal("connection/alice", b"e2b_0123").unwrap();
        assert_ne!(first.wrapped_key, second.wrapped_key);
        assert_ne!(first.ciphertext, second.ciphertext);
        assert!(!first
            .ciphertext
            .windows(8)
            .any(|window| window == b"e2b_0123"));
        assert_eq!(vault.open("connection/alice", &first).unwrap(), b"e2b_0123");
    }

    #[test]
    fn context_binds_record_to_its_row() {
        let vault = Vault::from_keys(BTreeMap::from([(1, [7u8; 32])])).unwrap();
        let sealed = vault.seal("connection/alice", b"secret").unwrap();
        assert!(vault.open("connection/bob", &sealed).is_err());
    }

    #[test]
    fn tampering_is_detected() {
        let vault = Vault::from_keys(BTreeMap::from([(1, [7u8; 32])])).unwrap();
        let mut sealed = vault.seal("x", b"secret").unwrap();
        let last = sealed.ciphertext.len() - 1;
        sealed.ciphertext[last] ^= 1;
        assert!(vault.open("x", &sealed).is_err());
    }

    #[test]
    fn new_version_encrypts_and_old_records_still_open() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("kek");
        let mut vault = Vault::load_file(&key_file).unwrap();
        let old = vault.seal("r", b"value").unwrap();
        assert_eq!(old.kek_version, 1);
        assert_eq!(vault.add_version().unwrap(), 2);
        let new = vault.seal("r", b"value").unwrap();
        assert_eq!(new.kek_version, 2);
        let reloaded = Vault::load_file(&key_file).unwrap();
        assert_eq!(reloaded.current_version(), 2);
        assert_eq!(reloaded.open("r", &old).unwrap(), b"value");
        assert_eq!(reloaded.open("r", &new).unwrap(), b"value");
    }

    #[test]
    fn reseal_moves_a_record_to_the_newest_version_and_reload_sees_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("kek");
        let reader = Vault::load_file(&key_file).unwrap();
        let mut rotator = Vault::load_file(&key_file).unwrap();
        let old = reader.seal("secret/s1/1", b"value").unwrap();
        rotator.add_version().unwrap();
        assert!(rotator.is_stale(&old));
        let new = rotator.reseal("secret/s1/1", &old).unwrap();
        assert_eq!(new.kek_version, 2);
        assert!(!rotator.is_stale(&new));
        // The other process has not seen version 2 yet, until it reloads.
        let mut reader = reader;
        assert!(matches!(
            reader.open("secret/s1/1", &new),
            Err(VaultError::VersionNotLoaded(2))
        ));
        reader.reload().unwrap();
        assert_eq!(reader.open("secret/s1/1", &new).unwrap(), b"value");
    }

    #[test]
    fn env_style_key_list_parses_versions() {
        let key = base64::engine::general_purpose::STANDARD.encode([1u8; 32]);
        let keks = parse_keks(&format!("1:{key}, v3:{key}"), ',').unwrap();
        assert_eq!(keks.keys().copied().collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(parse_keks(&key, ',').unwrap().keys().next(), Some(&1));
        assert!(parse_keks("1:c2hvcnQ=", ',').is_err());
    }
}
