//! Which E2B-compatible backend each identity's tool calls go to, and with which key.
//!
//! Two sources, in this order: a connection the user made explicitly (the connect page or
//! `berth connect`: API URL in the `connections` table, key sealed at
//! `connection/<identity>`), then the [`TrustedConnection`] the request's identity carries
//! (berth's own key on `berth up`'s `/mcp`). Without either, a tool answers with a
//! one-time connect link. The sweeper has no request to take a trusted key from, so a
//! trusted connection that tracked a sandbox is remembered sealed at
//! `trusted-connection/<identity>` (re-sealed only when the presented key changes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use berth_client::{ApiClient, ClientError, EnvdClient, EnvdEndpoint};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::McpError;
use crate::identity::TrustedConnection;
use crate::secrets::Secrets;
use crate::store::{unix_now, ConnectionRow, Store};

/// How long a connect link stays usable.
const CONNECT_LINK_SECONDS: i64 = 30 * 60;

/// The sealed part of an explicit connection.
#[derive(Serialize, Deserialize)]
struct ConnectionSecret {
    api_key: String,
}

/// A remembered trusted connection, for the sweeper.
#[derive(Serialize, Deserialize)]
struct TrustedSecret {
    api_url: String,
    api_key: String,
}

fn connection_context(identity: &str) -> String {
    format!("connection/{identity}")
}

fn trusted_context(identity: &str) -> String {
    format!("trusted-connection/{identity}")
}

pub(crate) fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A live connection of one identity, resolved fresh for every tool call.
pub(crate) struct Connected {
    pub(crate) api: ApiClient,
    pub(crate) api_url: String,
    pub(crate) sandbox_url: Option<String>,
    /// Set when this is the request's trusted connection rather than a stored one.
    trusted: Option<TrustedConnection>,
}

impl Connected {
    /// How to reach envd: an explicit sandbox URL; a plain-http API (self-hosted, header
    /// routing on the API's URL as with `E2B_SANDBOX_URL`); else the sandbox's domain.
    pub(crate) fn envd(
        &self,
        http: &reqwest::Client,
        sandbox_id: &str,
        domain: Option<&str>,
        access_token: Option<String>,
    ) -> EnvdClient {
        let endpoint = match (&self.sandbox_url, domain) {
            (Some(url), _) => EnvdEndpoint::SandboxUrl(url.clone()),
            (None, _) if self.api_url.starts_with("http://") => {
                EnvdEndpoint::SandboxUrl(self.api_url.clone())
            }
            (None, Some(domain)) if !domain.is_empty() => EnvdEndpoint::Domain(domain.to_owned()),
            (None, _) => EnvdEndpoint::SandboxUrl(self.api_url.clone()),
        };
        EnvdClient::new(http.clone(), &endpoint, sandbox_id, access_token)
    }
}

/// The connections component: explicit connections (vault-backed), trusted ones, and
/// connect links.
pub(crate) struct Connections {
    store: Arc<Store>,
    secrets: Arc<Secrets>,
    http: reqwest::Client,
    /// Base of connect links (`<public_url>/mcp/connect/<token>`).
    public_url: String,
    /// The trusted connection last sealed per identity, so a repeat is not re-sealed.
    remembered: Mutex<HashMap<String, TrustedConnection>>,
}

impl Connections {
    pub(crate) fn new(
        store: Arc<Store>,
        secrets: Arc<Secrets>,
        http: reqwest::Client,
        public_url: &str,
    ) -> Self {
        Self {
            store,
            secrets,
            http,
            public_url: public_url.to_owned(),
            remembered: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Connects `identity` to an E2B-compatible API: validates the key with a cheap
    /// authenticated GET, then stores it sealed. `sandbox_url` optionally fixes where envd
    /// is reached (header routing); see [`Connected::envd`] for the default.
    pub(crate) async fn connect(
        &self,
        identity: &str,
        api_url: &str,
        api_key: &str,
        sandbox_url: Option<&str>,
    ) -> Result<(), McpError> {
        let api_url = api_url.trim().trim_end_matches('/');
        if !(api_url.starts_with("http://") || api_url.starts_with("https://")) {
            return Err(McpError::Invalid(
                "the API URL must start with http:// or https://".into(),
            ));
        }
        let api_key = api_key.trim();
        let api = ApiClient::with_http(self.http.clone(), api_url, api_key);
        match api.list_sandboxes(Some(1), None).await {
            Ok(_) => {}
            Err(ClientError::Api { status, .. }) => {
                return Err(McpError::KeyRejected {
                    api_url: api_url.to_owned(),
                    status,
                })
            }
            Err(other) => return Err(other.into()),
        }
        self.secrets.seal(
            &connection_context(identity),
            &ConnectionSecret {
                api_key: api_key.to_owned(),
            },
        )?;
        self.store.put_connection(
            identity,
            &ConnectionRow {
                api_url: api_url.to_owned(),
                sandbox_url: sandbox_url
                    .map(|url| url.trim().trim_end_matches('/').to_owned())
                    .filter(|url| !url.is_empty()),
            },
        )?;
        tracing::info!(identity, api_url, "MCP connection stored");
        Ok(())
    }

    /// The identity's explicit connection, if it made one.
    fn stored(&self, identity: &str) -> Result<Option<Connected>, McpError> {
        let Some(row) = self.store.get_connection(identity)? else {
            return Ok(None);
        };
        let Some(secret) = self
            .secrets
            .open::<ConnectionSecret>(&connection_context(identity))?
        else {
            return Ok(None);
        };
        Ok(Some(Connected {
            api: ApiClient::with_http(self.http.clone(), &row.api_url, &secret.api_key),
            api_url: row.api_url,
            sandbox_url: row.sandbox_url,
            trusted: None,
        }))
    }

    fn trusted_connected(&self, trusted: &TrustedConnection) -> Connected {
        Connected {
            api: ApiClient::with_http(self.http.clone(), trusted.api_url(), trusted.api_key()),
            api_url: trusted.api_url().to_owned(),
            sandbox_url: None,
            trusted: Some(trusted.clone()),
        }
    }

    /// The connection a tool call of `identity` uses: the explicit one, else `trusted`
    /// (what the request's identity carries); `None` when it has neither.
    pub(crate) fn for_call(
        &self,
        identity: &str,
        trusted: Option<&TrustedConnection>,
    ) -> Result<Option<Connected>, McpError> {
        if let Some(stored) = self.stored(identity)? {
            return Ok(Some(stored));
        }
        Ok(trusted.map(|trusted| self.trusted_connected(trusted)))
    }

    /// The connection that releases `identity`'s sandboxes when no request is at hand:
    /// the explicit one, else the remembered trusted one.
    pub(crate) fn for_release(&self, identity: &str) -> Result<Option<Connected>, McpError> {
        if let Some(stored) = self.stored(identity)? {
            return Ok(Some(stored));
        }
        Ok(self
            .secrets
            .open::<TrustedSecret>(&trusted_context(identity))?
            .map(|secret| {
                self.trusted_connected(&TrustedConnection::new(&secret.api_url, &secret.api_key))
            }))
    }

    /// Called when `connected` tracks a sandbox of `identity`: a trusted connection is
    /// sealed for [`Connections::for_release`] unless that exact one already is.
    pub(crate) fn remember(&self, identity: &str, connected: &Connected) -> Result<(), McpError> {
        let Some(trusted) = &connected.trusted else {
            return Ok(());
        };
        let mut remembered = self
            .remembered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if remembered.get(identity) == Some(trusted) {
            return Ok(());
        }
        self.secrets.seal(
            &trusted_context(identity),
            &TrustedSecret {
                api_url: trusted.api_url().to_owned(),
                api_key: trusted.api_key().to_owned(),
            },
        )?;
        remembered.insert(identity.to_owned(), trusted.clone());
        Ok(())
    }

    /// Issues a one-time connect link for `identity`.
    pub(crate) fn new_connect_link(&self, identity: &str) -> Result<String, McpError> {
        let mut token_bytes = [0u8; 24];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut token_bytes);
        let token: String = token_bytes.iter().map(|b| format!("{b:02x}")).collect();
        self.store.put_connect_token(
            &token_hash(&token),
            identity,
            unix_now() + CONNECT_LINK_SECONDS,
        )?;
        Ok(format!("{}/mcp/connect/{token}", self.public_url))
    }

    /// The identity a live connect link was issued for.
    pub(crate) fn link_identity(&self, token: &str) -> Result<Option<String>, McpError> {
        self.store.connect_token_identity(&token_hash(token))
    }

    /// Retires a used connect link.
    pub(crate) fn retire_link(&self, token: &str) -> Result<(), McpError> {
        self.store.delete_connect_token(&token_hash(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_vault::Vault;

    fn connections(dir: &std::path::Path) -> Connections {
        let store = Arc::new(Store::open(&dir.join("mcp.sqlite3")).unwrap());
        let vault = Vault::load_file(&dir.join("kek")).unwrap();
        let secrets = Arc::new(Secrets::new(store.clone(), vault));
        Connections::new(store, secrets, reqwest::Client::new(), "http://127.0.0.1:1")
    }

    fn no_file_holds(dir: &std::path::Path, needle: &[u8]) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap_or_default();
            assert!(
                !bytes.windows(needle.len()).any(|window| window == needle),
                "a state file holds {:?} in clear",
                String::from_utf8_lossy(needle)
            );
        }
    }

    #[test]
    fn a_trusted_connection_serves_calls_without_a_connect_step() {
        let dir = tempfile::tempdir().unwrap();
        let connections = connections(dir.path());
        assert!(connections.for_call("team:a", None).unwrap().is_none());
        let trusted = TrustedConnection::new("http://127.0.0.1:3000", "e2b_trustedcanary");
        let connected = connections
            .for_call("team:a", Some(&trusted))
            .unwrap()
            .unwrap();
        assert_eq!(connected.api_url, "http://127.0.0.1:3000");
        assert_eq!(connected.api.base_url(), "http://127.0.0.1:3000");
        // Nothing is kept for a call alone: the sweeper has nothing to release yet.
        assert!(connections.for_release("team:a").unwrap().is_none());
        no_file_holds(dir.path(), b"trustedcanary");
    }

    #[test]
    fn a_tracking_trusted_connection_is_remembered_sealed_for_the_sweeper() {
        let dir = tempfile::tempdir().unwrap();
        let connections = connections(dir.path());
        let trusted = TrustedConnection::new("http://127.0.0.1:3000", "e2b_trustedcanary");
        let connected = connections
            .for_call("team:a", Some(&trusted))
            .unwrap()
            .unwrap();
        connections.remember("team:a", &connected).unwrap();
        let release = connections.for_release("team:a").unwrap().unwrap();
        assert_eq!(release.api_url, "http://127.0.0.1:3000");
        assert!(connections.for_release("team:b").unwrap().is_none());
        drop(connections);
        no_file_holds(dir.path(), b"trustedcanary");
        // A restarted server still knows how to release team:a's sandboxes.
        assert!(self::connections(dir.path())
            .for_release("team:a")
            .unwrap()
            .is_some());
    }

    #[test]
    fn an_explicit_connection_wins_over_a_trusted_one() {
        let dir = tempfile::tempdir().unwrap();
        let connections = connections(dir.path());
        connections
            .secrets
            .seal(
                &connection_context("team:a"),
                &ConnectionSecret {
                    api_key: "e2b_cloud".into(),
                },
            )
            .unwrap();
        connections
            .store
            .put_connection(
                "team:a",
                &ConnectionRow {
                    api_url: "https://api.e2b.test".into(),
                    sandbox_url: None,
                },
            )
            .unwrap();
        let trusted = TrustedConnection::new("http://127.0.0.1:3000", "e2b_local");
        let connected = connections
            .for_call("team:a", Some(&trusted))
            .unwrap()
            .unwrap();
        assert_eq!(connected.api_url, "https://api.e2b.test");
        connections.remember("team:a", &connected).unwrap();
        assert!(connections
            .secrets
            .open::<TrustedSecret>(&trusted_context("team:a"))
            .unwrap()
            .is_none());
    }

    #[test]
    fn connect_links_name_their_identity_once() {
        let dir = tempfile::tempdir().unwrap();
        let connections = connections(dir.path());
        let link = connections.new_connect_link("bob").unwrap();
        let token = link
            .strip_prefix("http://127.0.0.1:1/mcp/connect/")
            .unwrap();
        assert_eq!(
            connections.link_identity(token).unwrap().as_deref(),
            Some("bob")
        );
        connections.retire_link(token).unwrap();
        assert_eq!(connections.link_identity(token).unwrap(), None);
        assert_eq!(connections.link_identity("forged").unwrap(), None);
    }
}
