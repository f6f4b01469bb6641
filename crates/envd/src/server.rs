//! The envd HTTP server: one axum router for every route and RPC, served as HTTP/1.1
//! and h2c (prior knowledge) on the same port.

use std::future::Future;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::filesystem::FilesystemService;
use crate::process::ProcessService;
use crate::state::EnvdState;

/// Every route envd serves, behind the access-token check.
pub fn router(state: Arc<EnvdState>, processes: &Arc<ProcessService>) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .merge(crate::files::router())
        .merge(processes.router().with_state(()))
        .merge(
            FilesystemService::new(Arc::clone(&state))
                .router()
                .with_state(()),
        )
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            crate::auth::require_access_token,
        ))
        // Outermost: a 401 from the token check leaves a body too.
        .layer(axum::middleware::from_fn(
            berth_leftover_body::read_what_the_answer_left,
        ))
        .with_state(state)
}

/// Accepts connections until `shutdown` completes. Each connection is served on its
/// own task, speaking whichever of HTTP/1.1 or HTTP/2 the client opens with.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Per-connection failures (e.g. the peer reset during accept) or fd
                // exhaustion must not stop the server.
                Err(err) => {
                    tracing::warn!("accept failed: {err}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        // Stream frames are small and latency-bound.
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            if let Err(err) = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("connection ended with an error: {err}");
            }
        });
    }
}
