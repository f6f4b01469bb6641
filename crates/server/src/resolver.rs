//! The control plane's side of the proxy seam: which sandboxes exist and how to open a
//! connection into one.

use std::io;
use std::sync::Arc;

use berth_proxy::{
    connect_blocking, BoxFuture, PortConnector, ResolveError, Route, SandboxId, SandboxResolver,
};
use berth_runtime::{Runtime, RuntimeError};
use berth_store::SandboxStatus;
use tokio::net::TcpStream;

use crate::sandboxes::{self, Resumed};
use crate::SharedState;

/// Resolves running sandboxes from the store and connects through the runtime; a
/// paused sandbox with `autoResume` is resumed first.
pub struct StoreResolver {
    state: SharedState,
}

impl StoreResolver {
    pub(crate) fn new(state: SharedState) -> Self {
        StoreResolver { state }
    }
}

struct RuntimeConnector {
    runtime: Arc<dyn Runtime>,
    sandbox_id: String,
}

impl PortConnector for RuntimeConnector {
    fn connect(&self, port: u16) -> BoxFuture<'_, io::Result<TcpStream>> {
        let runtime = self.runtime.clone();
        let id = self.sandbox_id.clone();
        Box::pin(connect_blocking(move || {
            runtime.connect(&id, port).map_err(|err| match err {
                RuntimeError::NotFound(_) => {
                    io::Error::new(io::ErrorKind::NotFound, err.to_string())
                }
                RuntimeError::Io { source, .. } => source,
                other => io::Error::other(other.to_string()),
            })
        }))
    }
}

impl SandboxResolver for StoreResolver {
    fn resolve<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> BoxFuture<'a, Result<Route, ResolveError>> {
        Box::pin(async move {
            let mut sandbox = self
                .state
                .store
                .live_sandbox_any_team(sandbox_id.as_str())
                .map_err(|err| ResolveError::Lookup(err.to_string()))?
                .ok_or(ResolveError::NotFound)?;
            if self.state.ending.contains(&sandbox.id) {
                return Err(ResolveError::NotFound);
            }
            if let SandboxStatus::Paused { memory } = sandbox.status {
                // Only a pause with memory may be undone by traffic: a cold boot would
                // surprise whoever paused it on purpose.
                if !(sandbox.lifecycle.auto_resume && memory) {
                    return Err(ResolveError::NotFound);
                }
                let resumed = match &self.state.config.role {
                    crate::cluster::Role::Api(_) => {
                        crate::cluster::api::resume_on_node(&self.state, &sandbox.id)
                            .await
                            .and_then(|()| sandboxes::live(&self.state, &sandbox.id))
                    }
                    _ => sandboxes::resume(&self.state, &sandbox.id, None, true)
                        .await
                        .map(|resumed| match resumed {
                            Resumed::Resumed(record) | Resumed::WasRunning(record) => record,
                        }),
                };
                sandbox = match resumed {
                    Ok(record) => record,
                    Err(err) => {
                        // Logged here: the proxy answers with its own shape.
                        let api = berth_api::ApiError::from(err);
                        return Err(ResolveError::Lookup(api.to_string()));
                    }
                };
            }
            let network = sandboxes::network_policy(&sandbox);
            let connector: Arc<dyn PortConnector> = match &self.state.config.role {
                crate::cluster::Role::Api(_) => {
                    crate::cluster::api::connector(&self.state, &sandbox.id).map_err(|err| {
                        ResolveError::Lookup(berth_api::ApiError::from(err).to_string())
                    })?
                }
                _ => Arc::new(RuntimeConnector {
                    runtime: self.state.runtime.clone(),
                    sandbox_id: sandbox.id.clone(),
                }),
            };
            Ok(Route {
                connector,
                envd_access_token: sandbox.envd_access_token,
                traffic_access_token: sandbox.traffic_access_token,
                allow_public_traffic: network.allow_public_traffic,
                mask_request_host: network.mask_request_host,
            })
        })
    }

    fn is_gone<'a>(&'a self, sandbox_id: &'a SandboxId) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let id = sandbox_id.as_str();
            // A lookup that fails leaves the question open: not gone.
            self.state.ending.contains(id)
                || matches!(self.state.store.live_sandbox_any_team(id), Ok(None))
        })
    }

    fn file_signers(&self) -> BoxFuture<'_, Result<Vec<(SandboxId, String)>, ResolveError>> {
        Box::pin(async move {
            let store = &self.state.store;
            let lookup = |err: berth_store::StoreError| ResolveError::Lookup(err.to_string());
            let running = store.all_running_sandboxes().map_err(lookup)?;
            // Paused sandboxes traffic may wake (see `resolve`) keep their links working.
            let resumable = store
                .all_paused_sandboxes()
                .map_err(lookup)?
                .into_iter()
                .filter(|sandbox| {
                    sandbox.lifecycle.auto_resume
                        && matches!(sandbox.status, SandboxStatus::Paused { memory: true })
                });
            Ok(running
                .into_iter()
                .chain(resumable)
                .filter_map(|sandbox| {
                    let token = sandbox.envd_access_token?;
                    Some((SandboxId::parse(&sandbox.id).ok()?, token))
                })
                .collect())
        })
    }
}
