//! Sealed records: typed values kept encrypted by the [`Vault`] in the state database's
//! `sealed` table, each bound to its context (`connection/<identity>`, …) so a record
//! cannot be moved to another row. Everything secret the MCP server keeps goes through
//! here; nothing else reads or writes the `sealed` table.

use std::sync::{Arc, RwLock};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::McpError;
use crate::store::Store;
use berth_vault::{Vault, KEK_ENV};

/// What `rotate_kek` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationReport {
    pub kek_version: u32,
    pub records_reencrypted: usize,
}

/// The vault over the store's sealed records.
pub(crate) struct Secrets {
    store: Arc<Store>,
    vault: RwLock<Vault>,
}

impl Secrets {
    pub(crate) fn new(store: Arc<Store>, vault: Vault) -> Self {
        Self {
            store,
            vault: RwLock::new(vault),
        }
    }

    fn vault(&self) -> std::sync::RwLockReadGuard<'_, Vault> {
        self.vault
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Encrypts `value` (as JSON) under `context`, replacing what was there.
    pub(crate) fn seal<T: Serialize>(&self, context: &str, value: &T) -> Result<(), McpError> {
        let plaintext = serde_json::to_vec(value).map_err(|source| McpError::Record {
            context: context.to_owned(),
            source,
        })?;
        let record = self.vault().seal(context, &plaintext)?;
        self.store.put_sealed(context, &record)
    }

    /// The value sealed under `context`, if any.
    pub(crate) fn open<T: DeserializeOwned>(&self, context: &str) -> Result<Option<T>, McpError> {
        let Some(record) = self.store.get_sealed(context)? else {
            return Ok(None);
        };
        let plaintext = self.vault().open(context, &record)?;
        serde_json::from_slice(&plaintext)
            .map(Some)
            .map_err(|source| McpError::Record {
                context: context.to_owned(),
                source,
            })
    }

    /// Adds a new key-encryption key version (key file; with `BERTH_KEK` the operator adds
    /// it there first) and re-encrypts every sealed record under the newest version with
    /// a fresh data key.
    pub(crate) fn rotate(&self) -> Result<RotationReport, McpError> {
        let mut vault = self
            .vault
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if std::env::var(KEK_ENV).is_err() {
            vault.add_version()?;
        }
        let mut records_reencrypted = 0;
        for context in self.store.sealed_contexts()? {
            let Some(record) = self.store.get_sealed(&context)? else {
                continue;
            };
            self.store
                .put_sealed(&context, &vault.reseal(&context, &record)?)?;
            records_reencrypted += 1;
        }
        Ok(RotationReport {
            kek_version: vault.current_version(),
            records_reencrypted,
        })
    }
}
