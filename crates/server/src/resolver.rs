//! The control plane's side of the proxy seam: which sandboxes exist and how to open a
//! connection into one.

use std::io;
use std::sync::Arc;

use berth_proxy::{
    connect_blocking, BoxFuture, PortConnector, ResolveError, Route, SandboxId, SandboxResolver,
};
use berth_runtime::{Runtime, RuntimeError};
use berth_store::Store;
use tokio::net::TcpStream;

/// Resolves running sandboxes from the store and connects through the runtime.
pub struct StoreResolver {
    store: Arc<Store>,
    runtime: Arc<dyn Runtime>,
}

impl StoreResolver {
    pub fn new(store: Arc<Store>, runtime: Arc<dyn Runtime>) -> Self {
        StoreResolver { store, runtime }
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
                RuntimeError::Other(message) => io::Error::other(message),
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
            let sandbox = self
                .store
                .running_sandbox_any_team(sandbox_id.as_str())
                .map_err(|err| ResolveError::Lookup(err.to_string()))?
                .ok_or(ResolveError::NotFound)?;
            Ok(Route {
                connector: Arc::new(RuntimeConnector {
                    runtime: self.runtime.clone(),
                    sandbox_id: sandbox.id,
                }),
                envd_access_token: sandbox.envd_access_token,
                traffic_access_token: None,
                allow_public_traffic: true,
            })
        })
    }
}
