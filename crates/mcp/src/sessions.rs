//! The sessions component: which identity owns each MCP session, each session's storage
//! area, the sandboxes tracked per session with their sealed state (id, domain, envd
//! access token, workspace, timeout), and their leases. Every use of a tracked sandbox
//! renews its lease and, now and then, the sandbox's own timeout.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_client::ApiClient;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::McpError;
use crate::secrets::Secrets;
use crate::store::{unix_now, SandboxRow, Store};

/// What is kept (sealed) about each tracked sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SandboxState {
    pub(crate) sandbox_id: String,
    pub(crate) domain: Option<String>,
    pub(crate) envd_access_token: Option<String>,
    pub(crate) workspace_path: String,
    pub(crate) timeout_seconds: u64,
}

/// Lifecycle status of a tracked sandbox, as the state database spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SandboxStatus {
    Running,
    Paused,
    Deleted,
}

impl SandboxStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Running => "running",
            SandboxStatus::Paused => "paused",
            SandboxStatus::Deleted => "deleted",
        }
    }

    /// A deleted sandbox needs no release any more.
    fn released(self) -> bool {
        self == SandboxStatus::Deleted
    }
}

fn sandbox_context(identity: &str, sandbox_id: &str) -> String {
    format!("sandbox/{identity}/{sandbox_id}")
}

/// Resolves a session-storage path without letting it leave the storage directory.
pub(crate) fn storage_path(root: &Path, relative: &str) -> Option<PathBuf> {
    let relative = Path::new(relative.trim_start_matches('/'));
    let inside = !relative.as_os_str().is_empty()
        && relative
            .components()
            .all(|component| matches!(component, Component::Normal(_)));
    inside.then(|| root.join(relative))
}

pub(crate) struct Sessions {
    store: Arc<Store>,
    secrets: Arc<Secrets>,
    /// `<state_dir>/mcp`, holding `sessions/<hash>/storage/`.
    mcp_dir: PathBuf,
    lease_ttl: Duration,
    /// (session, identity) pairs already recorded, so calls skip the database write.
    claimed: Mutex<HashSet<(String, String)>>,
    /// When each sandbox's own timeout was last extended (see [`Sessions::touch`]).
    last_extended: Mutex<HashMap<String, Instant>>,
}

impl Sessions {
    pub(crate) fn new(
        store: Arc<Store>,
        secrets: Arc<Secrets>,
        mcp_dir: PathBuf,
        lease_ttl: Duration,
    ) -> Self {
        Self {
            store,
            secrets,
            mcp_dir,
            lease_ttl,
            claimed: Mutex::new(HashSet::new()),
            last_extended: Mutex::new(HashMap::new()),
        }
    }

    /// Records that `session_id` belongs to `identity` (once per process); false if the
    /// session belongs to someone else.
    pub(crate) fn claim(&self, session_id: &str, identity: &str) -> Result<bool, McpError> {
        let key = (session_id.to_owned(), identity.to_owned());
        let mut claimed = self
            .claimed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if claimed.contains(&key) {
            return Ok(true);
        }
        let owned = self.store.claim_session(session_id, identity)?;
        if owned {
            claimed.insert(key);
        }
        Ok(owned)
    }

    /// Ends a session: its sandboxes' leases expire now (the sweeper releases them).
    pub(crate) fn end(&self, session_id: &str) -> Result<(), McpError> {
        self.store.end_session(session_id).map(drop)
    }

    /// The storage area of one session: files here can be copied into sandboxes with
    /// `upload_files` (`session_path` is relative to it).
    pub(crate) fn storage_dir(&self, session_id: &str) -> PathBuf {
        let digest = Sha256::digest(session_id.as_bytes());
        let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        self.mcp_dir.join("sessions").join(name).join("storage")
    }

    fn lease_until(&self) -> i64 {
        unix_now() + self.lease_ttl.as_secs() as i64
    }

    /// Starts tracking a sandbox just created in `session_id`, with a fresh lease.
    pub(crate) fn track(
        &self,
        identity: &str,
        session_id: &str,
        title: Option<String>,
        template: &str,
        state: &SandboxState,
    ) -> Result<(), McpError> {
        self.save_state(identity, state)?;
        self.store.insert_sandbox(&SandboxRow {
            identity: identity.to_owned(),
            sandbox_id: state.sandbox_id.clone(),
            session_id: session_id.to_owned(),
            title,
            template: template.to_owned(),
            status: SandboxStatus::Running.as_str().into(),
            created_at: unix_now(),
            lease_expires_at: self.lease_until(),
            release_attempts: 0,
        })?;
        // The create call just set the timeout.
        self.last_extended
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(state.sandbox_id.clone(), Instant::now());
        Ok(())
    }

    /// Replaces the sealed state of a tracked sandbox (after a resume).
    pub(crate) fn save_state(&self, identity: &str, state: &SandboxState) -> Result<(), McpError> {
        self.secrets
            .seal(&sandbox_context(identity, &state.sandbox_id), state)
    }

    /// A live sandbox `identity` tracks in `session_id` and its sealed state; `None` when
    /// the session has no such sandbox (or its state is gone).
    pub(crate) fn tracked(
        &self,
        identity: &str,
        session_id: &str,
        sandbox_id: &str,
    ) -> Result<Option<SandboxState>, McpError> {
        let live = self
            .store
            .session_sandbox(identity, session_id, sandbox_id)?
            .is_some_and(|row| row.status != SandboxStatus::Deleted.as_str());
        if !live {
            return Ok(None);
        }
        self.secrets.open(&sandbox_context(identity, sandbox_id))
    }

    /// The session's live sandboxes, oldest first.
    pub(crate) fn sandboxes(
        &self,
        identity: &str,
        session_id: &str,
    ) -> Result<Vec<SandboxRow>, McpError> {
        self.store.session_sandboxes(identity, session_id)
    }

    /// Renews the lease of an identity's tracked sandbox (any session).
    pub(crate) fn renew_lease(&self, identity: &str, sandbox_id: &str) -> Result<(), McpError> {
        self.store
            .renew_lease(identity, sandbox_id, self.lease_until())
            .map(drop)
    }

    pub(crate) fn set_status(
        &self,
        identity: &str,
        sandbox_id: &str,
        status: SandboxStatus,
    ) -> Result<(), McpError> {
        self.store
            .set_status(identity, sandbox_id, status.as_str(), status.released())
    }

    /// Renews the lease and, in the background, the sandbox's own timeout. The timeout is
    /// re-sent at most every quarter of its length (and at most every minute), so a burst
    /// of calls does not become a burst of API writes.
    pub(crate) fn touch(&self, identity: &str, api: &ApiClient, state: &SandboxState) {
        if let Err(error) = self.renew_lease(identity, &state.sandbox_id) {
            tracing::warn!(sandbox_id = %state.sandbox_id, %error, "lease renewal failed");
        }
        let interval = Duration::from_secs((state.timeout_seconds / 4).min(60));
        {
            let mut last_extended = self
                .last_extended
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let now = Instant::now();
            match last_extended.get(&state.sandbox_id) {
                Some(last) if now.duration_since(*last) < interval => return,
                _ => {
                    last_extended.insert(state.sandbox_id.clone(), now);
                }
            }
        }
        let api = api.clone();
        let sandbox_id = state.sandbox_id.clone();
        let timeout = state.timeout_seconds;
        tokio::spawn(async move {
            if let Err(error) = api.set_sandbox_timeout(&sandbox_id, timeout).await {
                tracing::debug!(%sandbox_id, %error, "extending the sandbox timeout failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_paths_stay_inside_the_root() {
        let root = Path::new("/state/storage");
        assert_eq!(
            storage_path(root, "data/in.csv").unwrap(),
            Path::new("/state/storage/data/in.csv")
        );
        assert_eq!(
            storage_path(root, "/in.csv").unwrap(),
            Path::new("/state/storage/in.csv")
        );
        assert!(storage_path(root, "../secret").is_none());
        assert!(storage_path(root, "a/../../b").is_none());
        assert!(storage_path(root, "").is_none());
    }

    #[test]
    fn tracked_sandboxes_are_per_identity_and_session_until_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
        let vault = berth_vault::Vault::load_file(&dir.path().join("kek")).unwrap();
        let secrets = Arc::new(Secrets::new(store.clone(), vault));
        let sessions = Sessions::new(
            store,
            secrets,
            dir.path().to_owned(),
            Duration::from_secs(60),
        );
        let state = SandboxState {
            sandbox_id: "ia".into(),
            domain: None,
            envd_access_token: Some("tok".into()),
            workspace_path: "/home/user".into(),
            timeout_seconds: 300,
        };
        sessions.track("alice", "s1", None, "base", &state).unwrap();
        let found = sessions.tracked("alice", "s1", "ia").unwrap().unwrap();
        assert_eq!(found.envd_access_token.as_deref(), Some("tok"));
        assert!(sessions.tracked("alice", "s2", "ia").unwrap().is_none());
        assert!(sessions.tracked("bob", "s1", "ia").unwrap().is_none());
        sessions
            .set_status("alice", "ia", SandboxStatus::Deleted)
            .unwrap();
        assert!(sessions.tracked("alice", "s1", "ia").unwrap().is_none());
        assert!(sessions.sandboxes("alice", "s1").unwrap().is_empty());
    }
}
