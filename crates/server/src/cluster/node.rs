//! The node's side: its guard, the routes only nodes serve (tunnel ends, traffic
//! resumes, artifacts for other nodes), its lease, which objects are its own, and
//! fetching what another node made.
//!
//! Artifacts move node to node over the same authenticated HTTP as everything else:
//! `GET /internal/v1/manifests/{reference}` (a template build's layer ids and config),
//! `GET /internal/v1/layers/{id}` and `GET /internal/v1/checkpoints/{id}` (tar streams
//! with the sender's tree hash in `x-berth-tree-sha256`; the receiver refuses a tree
//! that arrives different). A node that is asked for a template build or a snapshot it
//! lacks fetches it from the node the placement names, layers first, once: concurrent
//! askers wait for the one fetch (the template store's per-layer lock, the runtime's
//! checkpoint rename).

use std::collections::HashSet;
use std::io;
use std::path::PathBuf;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use berth_cluster::{NodeAddr, NodeToken};
use berth_runtime::RuntimeError;
use berth_store::{PlacedKind, SandboxStatus};
use berth_template::{LayerId, TemplateConfig};
use bytes::Bytes;
use futures::TryStreamExt;
use http::StatusCode;
use http_body_util::BodyExt;

use super::NodeRole;
use crate::error::ServiceError;
use crate::sandboxes;
use crate::{AppState, SharedState};

/// Header carrying the sender's tree hash of a layer or checkpoint.
const TREE_HASH_HEADER: &str = "x-berth-tree-sha256";
/// Header carrying a checkpoint's layer ids (lowest first, comma-separated).
const LAYERS_HEADER: &str = "x-berth-layers";
/// Bytes read from a tar stream per body chunk.
const CHUNK_BYTES: usize = 256 * 1024;

/// Records that `object_id` lives on this node; nothing outside a split deployment.
pub(crate) fn place_here(
    state: &AppState,
    kind: PlacedKind,
    object_id: &str,
) -> Result<(), ServiceError> {
    if let Some(node) = state.config.role.node() {
        state.store.place(kind, object_id, &node.registration.id)?;
    }
    Ok(())
}

/// Forgets where `object_id` lived once it is gone; nothing outside a split deployment.
pub(crate) fn forget_placement(
    state: &AppState,
    kind: PlacedKind,
    object_id: &str,
) -> Result<(), ServiceError> {
    if state.config.role.node().is_some() {
        state.store.remove_placement(kind, object_id)?;
    }
    Ok(())
}

/// The items this process looks after: all of them standalone, on a node those placed
/// on it (recovery, the reaper and build recovery must never act on another node's).
pub(crate) fn only_mine<T>(
    state: &AppState,
    kind: PlacedKind,
    items: Vec<T>,
    id: impl Fn(&T) -> &str,
) -> Result<Vec<T>, ServiceError> {
    let Some(node) = state.config.role.node() else {
        return Ok(items);
    };
    let mine: HashSet<String> = state
        .store
        .placed_on(kind, &node.registration.id)?
        .into_iter()
        .collect();
    Ok(items
        .into_iter()
        .filter(|item| mine.contains(id(item)))
        .collect())
}

/// Every request to a node but `GET /health` must carry the node token: the node's
/// listener is for API instances (and other nodes) alone.
pub(crate) async fn guard(
    State(token): State<NodeToken>,
    request: Request,
    next: Next,
) -> Response {
    if request.uri().path() == "/health" || token.admits(request.headers()) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(berth_api::Error {
            code: 401,
            message: "this is a berth node: requests come from berth api with the node token"
                .into(),
        }),
    )
        .into_response()
}

/// The routes only nodes serve (behind [`guard`]).
pub(crate) fn routes(state: SharedState) -> Router {
    Router::new()
        .route(berth_cluster::tunnel::ROUTE, post(tunnel))
        .route("/internal/v1/sandboxes/{id}/resume", post(resume))
        .route("/internal/v1/sandboxes/{id}/adopt", post(adopt))
        .route("/internal/v1/manifests/{reference}", get(manifest))
        .route("/internal/v1/layers/{id}", get(layer))
        .route("/internal/v1/checkpoints/{id}", get(checkpoint))
        .with_state(state)
}

async fn tunnel(
    State(state): State<SharedState>,
    Path((sandbox, port)): Path<(String, u16)>,
    request: Request,
) -> Response {
    let runtime = state.runtime.clone();
    let sandbox_id = sandbox.clone();
    let connect = async move {
        let stream = tokio::task::spawn_blocking(move || runtime.connect(&sandbox, port))
            .await
            .map_err(io::Error::other)?
            .map_err(|err| match err {
                RuntimeError::NotFound(_) => io::Error::new(io::ErrorKind::NotFound, err),
                RuntimeError::Io { source, .. } => source,
                other => io::Error::other(other),
            })?;
        stream.set_nonblocking(true)?;
        tokio::net::TcpStream::from_std(stream)
    };
    // Pause and kill close the sandbox's connections: its tunnels end with them.
    let closing = state.connections.closing(&sandbox_id);
    let closed = async move {
        match closing {
            Some(token) => token.cancelled_owned().await,
            None => futures::future::pending().await,
        }
    };
    berth_cluster::tunnel::serve(request, connect, closed)
        .await
        .map(Body::new)
}

/// A paused sandbox woken by traffic on an API instance (`autoResume`).
async fn resume(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    match sandboxes::resume(&state, &id, None, true).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => crate::error::to_api(&err).into_response(),
    }
}

/// What a draining node asks of the node it moves a paused sandbox to.
#[derive(serde::Serialize, serde::Deserialize)]
struct Adoption {
    /// The draining node, which holds the checkpoint.
    from: String,
    /// The paused sandbox exported as a checkpoint (`Runtime::export_paused`).
    checkpoint: String,
    /// Whether it was paused with its memory.
    memory: bool,
}

/// Takes over paused sandbox `id` from a draining node: fetches its checkpoint,
/// restores it under the same id, pauses it again here and records it placed here. On
/// failure nothing of it stays here and it stays where it was.
async fn adopt(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    axum::Json(adoption): axum::Json<Adoption>,
) -> Response {
    let _guard = state.sandbox_locks.lock(id.clone()).await;
    let adopted = async {
        ensure_checkpoint_from(&state, &adoption.from, &adoption.checkpoint).await?;
        let runtime = state.runtime.clone();
        let (sandbox, checkpoint, memory) =
            (id.clone(), adoption.checkpoint.clone(), adoption.memory);
        let moved = sandboxes::blocking(&id, crate::error::Stage::Restore, move || {
            runtime.restore(&checkpoint, &sandbox, memory)?;
            let paused = runtime.pause(&sandbox, memory);
            if paused.is_err() {
                let _ = runtime.kill(&sandbox);
            }
            paused
        })
        .await;
        let runtime = state.runtime.clone();
        let checkpoint = adoption.checkpoint.clone();
        let _ = tokio::task::spawn_blocking(move || runtime.delete_checkpoint(&checkpoint)).await;
        moved?;
        place_here(&state, PlacedKind::Sandbox, &id)
    };
    match adopted.await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => crate::error::to_api(&err).into_response(),
    }
}

/// While this node drains, moves its paused sandboxes to nodes that take sandboxes, one
/// at a time: each is exported as a checkpoint, adopted by the other node (restored and
/// paused again there, its placement moved), then removed here. One that cannot move
/// (no node with room, volumes of this node, a failure) stays paused here and is tried
/// again at the next renewal.
async fn move_paused_away(state: &SharedState, me: &str) {
    let paused = match state.store.placed_on(PlacedKind::Sandbox, me) {
        Ok(ids) => ids,
        Err(err) => {
            tracing::error!(%err, "listing this node's sandboxes to move");
            return;
        }
    };
    for id in paused {
        if let Err(err) = move_one(state, me, &id).await {
            tracing::warn!(sandbox = %id, %err, "moving a paused sandbox off this draining node; it stays here for now");
        }
    }
}

async fn move_one(state: &SharedState, me: &str, id: &str) -> Result<(), ServiceError> {
    let _guard = state.sandbox_locks.lock(id.to_string()).await;
    let Some(row) = state.store.live_sandbox_any_team(id)? else {
        return Ok(());
    };
    let SandboxStatus::Paused { memory } = row.status else {
        return Ok(());
    };
    if !row.volume_mounts.is_empty()
        || state.store.placement(PlacedKind::Sandbox, id)?.as_deref() != Some(me)
    {
        return Ok(());
    }
    let request = berth_cluster::PlacementRequest {
        cpu_count: row.cpu_count,
        memory_mb: row.memory_mb,
    };
    let target = super::api::choose(state, request, |_| false)?;
    let checkpoint = format!("move-{id}");
    let runtime = state.runtime.clone();
    let (sandbox, export) = (id.to_string(), checkpoint.clone());
    sandboxes::blocking(id, crate::error::Stage::Checkpoint, move || {
        runtime.export_paused(&sandbox, &export)
    })
    .await?;
    let adoption = Adoption {
        from: me.to_string(),
        checkpoint: checkpoint.clone(),
        memory,
    };
    let asked = post_json(
        state,
        &target,
        &format!("/internal/v1/sandboxes/{id}/adopt"),
        &adoption,
    )
    .await;
    let runtime = state.runtime.clone();
    let export = checkpoint.clone();
    let _ = tokio::task::spawn_blocking(move || runtime.delete_checkpoint(&export)).await;
    asked?;
    // It is the other node's now: what is left of it here goes.
    sandboxes::kill_in_runtime(state, id)
        .await
        .map_err(|source| ServiceError::Runtime {
            sandbox: id.to_string(),
            stage: crate::error::Stage::Kill,
            source,
        })?;
    sandboxes::log(
        state,
        id,
        berth_api::LogLevel::Info,
        &format!("paused sandbox moved from node {me} (draining) to node {target}"),
    );
    tracing::info!(sandbox = %id, from = %me, to = %target, "moved a paused sandbox off this draining node");
    Ok(())
}

/// POSTs `body` as JSON to `path` on node `node_id`; a non-2xx answer is an error
/// naming it.
async fn post_json(
    state: &AppState,
    node_id: &str,
    path: &str,
    body: &impl serde::Serialize,
) -> Result<(), ServiceError> {
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(Bytes::from(
            serde_json::to_vec(body).expect("serializable"),
        )))
        .expect("a POST with a valid path");
    send(state, node_id, path, request).await.map(drop)
}

/// What another node needs to use a template build: its layer ids and config.
#[derive(serde::Serialize, serde::Deserialize)]
struct ManifestAnswer {
    layers: Vec<LayerId>,
    config: TemplateConfig,
}

async fn manifest(State(state): State<SharedState>, Path(reference): Path<String>) -> Response {
    match sandboxes::load_template(&state, &reference).await {
        Ok(template) => axum::Json(ManifestAnswer {
            config: template.config(),
            layers: template.layer_ids,
        })
        .into_response(),
        Err(err) => crate::error::to_api(&err).into_response(),
    }
}

async fn layer(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    let Ok(id) = LayerId::try_from(id.clone()) else {
        return berth_api::ApiError::BadRequest(format!("{id:?} is not a layer id"))
            .into_response();
    };
    let templates = state.templates.clone();
    let packed = tokio::task::spawn_blocking(move || templates.pack_layer(&id)).await;
    match packed {
        Ok(Ok((hash, stream))) => stream_response(stream, vec![(TREE_HASH_HEADER, hash)]),
        Ok(Err(err)) => berth_api::ApiError::NotFound(err.to_string()).into_response(),
        Err(err) => berth_api::ApiError::Internal(err.to_string()).into_response(),
    }
}

async fn checkpoint(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    let runtime = state.runtime.clone();
    let templates = state.templates.clone();
    let packed = tokio::task::spawn_blocking(move || runtime.pack_checkpoint(&id)).await;
    match packed {
        Ok(Ok(packed)) => {
            let layers: Option<Vec<String>> = packed
                .info
                .layers
                .iter()
                .map(|path| templates.layer_id_of(path).map(|id| id.to_string()))
                .collect();
            let Some(layers) = layers else {
                return berth_api::ApiError::Internal(
                    "the checkpoint stands on layers outside the template store".into(),
                )
                .into_response();
            };
            stream_response(
                packed.stream,
                vec![
                    (TREE_HASH_HEADER, packed.tree_hash),
                    (LAYERS_HEADER, layers.join(",")),
                ],
            )
        }
        Ok(Err(RuntimeError::CheckpointNotFound(id))) => {
            berth_api::ApiError::NotFound(format!("checkpoint {id} is not on this node"))
                .into_response()
        }
        Ok(Err(err)) => berth_api::ApiError::Internal(err.to_string()).into_response(),
        Err(err) => berth_api::ApiError::Internal(err.to_string()).into_response(),
    }
}

/// A response streaming `reader` (read on a blocking thread), with `headers`.
fn stream_response(
    mut reader: impl io::Read + Send + 'static,
    headers: Vec<(&'static str, String)>,
) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(4);
    tokio::task::spawn_blocking(move || loop {
        let mut chunk = vec![0u8; CHUNK_BYTES];
        match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                chunk.truncate(n);
                if sender.blocking_send(Ok(Bytes::from(chunk))).is_err() {
                    break;
                }
            }
            Err(err) => {
                // The receiver's stream ends in an error: it never takes a short tree.
                let _ = sender.blocking_send(Err(err));
                break;
            }
        }
    });
    let body = Body::from_stream(tokio_stream_from(receiver));
    let mut response = Response::new(body);
    for (name, value) in headers {
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn tokio_stream_from(
    mut receiver: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
) -> impl futures::Stream<Item = io::Result<Bytes>> {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// Renews this node's lease every third of it (while draining, its paused sandboxes are
/// moved away by a task of their own, one move at a time). A renewal refused
/// because the node was found lost (its lease lapsed: a pause, a partition) means the
/// API instances reported its running sandboxes lost: those are killed here too
/// before the node registers again, so nothing runs that the database says is gone.
pub(crate) async fn keep_lease(state: SharedState, node: NodeRole) {
    let every = node.lease / 3;
    let moving = std::sync::Arc::new(tokio::sync::Mutex::new(()));
    loop {
        tokio::time::sleep(every).await;
        let store = state.store.clone();
        let (id, lease) = (node.registration.id.clone(), node.lease);
        let renewed = tokio::task::spawn_blocking(move || store.renew_node_lease(&id, lease)).await;
        match renewed {
            Ok(Ok(true)) => {
                let draining = state
                    .store
                    .node(&node.registration.id)
                    .map(|record| record.is_some_and(|r| r.draining));
                // Moving takes seconds per sandbox: never in the way of the next renewal.
                if matches!(draining, Ok(true)) && moving.try_lock().is_ok() {
                    let (state, moving, me) =
                        (state.clone(), moving.clone(), node.registration.id.clone());
                    tokio::spawn(async move {
                        let _one_at_a_time = moving.lock().await;
                        move_paused_away(&state, &me).await;
                    });
                }
            }
            Ok(Ok(false)) => {
                tracing::warn!(node = %node.registration.id, "this node's lease lapsed and it was reported lost; reconciling");
                reconcile_after_loss(&state).await;
                if let Err(err) = state.store.register_node(&node.registration, node.lease) {
                    tracing::error!(%err, "registering the node again");
                }
            }
            Ok(Err(err)) => tracing::error!(%err, "renewing the node's lease"),
            Err(err) => tracing::error!(%err, "renewing the node's lease"),
        }
    }
}

/// Kills every sandbox this node runs whose row no longer says it runs here.
async fn reconcile_after_loss(state: &AppState) {
    let runtime = state.runtime.clone();
    let running = tokio::task::spawn_blocking(move || runtime.list())
        .await
        .unwrap_or_default();
    for info in running {
        let keep = match state.store.live_sandbox_any_team(&info.id) {
            Ok(Some(row)) => row.status == SandboxStatus::Running,
            Ok(None) => false,
            Err(err) => {
                tracing::error!(sandbox = %info.id, %err, "reading a sandbox while reconciling");
                true
            }
        };
        if !keep {
            tracing::warn!(sandbox = %info.id, "killing a sandbox reported lost while this node was away");
            if let Err(err) = sandboxes::kill_in_runtime(state, &info.id).await {
                tracing::error!(sandbox = %info.id, %err, "killing a lost sandbox");
            }
        }
    }
}

/// Where another node listens, by id.
fn node_addr(state: &AppState, node_id: &str) -> Result<NodeAddr, ServiceError> {
    let record = state
        .store
        .node(node_id)?
        .ok_or_else(|| ServiceError::NodeUnknown(node_id.to_string()))?;
    record.url.parse().map_err(|source| ServiceError::NodeUrl {
        node: node_id.to_string(),
        source,
    })
}

/// GETs `path` from node `node_id`; a non-2xx answer is an error naming it.
async fn fetch(
    state: &AppState,
    node_id: &str,
    path: &str,
) -> Result<http::Response<hyper::body::Incoming>, ServiceError> {
    let request = http::Request::get(path)
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("a GET with a valid path");
    send(state, node_id, path, request).await
}

/// Sends `request` (for `path`) to node `node_id` with the node token; a non-2xx
/// answer is an error naming the node, the path and the answer.
async fn send<B>(
    state: &AppState,
    node_id: &str,
    path: &str,
    mut request: http::Request<B>,
) -> Result<http::Response<hyper::body::Incoming>, ServiceError>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let node = state.config.role.node().expect("only nodes talk to nodes");
    let addr = node_addr(state, node_id)?;
    if let Ok(host) = http::HeaderValue::from_str(&addr.host) {
        request.headers_mut().insert(http::header::HOST, host);
    }
    let response = berth_cluster::Forwarder::new(node.token.clone())
        .forward(&addr, request)
        .await
        .map_err(|source| ServiceError::NodeUnreachable {
            node: node_id.to_string(),
            source,
        })?;
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    Err(ServiceError::NodeFetch {
        node: node_id.to_string(),
        what: path.to_string(),
        detail: format!("{status}: {body}"),
    })
}

fn header(response: &http::Response<hyper::body::Incoming>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Reads `response`'s body as a blocking reader on a blocking thread, with `work`.
async fn with_body_reader<T: Send + 'static>(
    response: http::Response<hyper::body::Incoming>,
    work: impl FnOnce(&mut dyn io::Read) -> T + Send + 'static,
) -> Result<T, ServiceError> {
    let stream = response
        .into_body()
        .into_data_stream()
        .map_err(io::Error::other);
    let reader = tokio_util::io::StreamReader::new(stream);
    tokio::task::spawn_blocking(move || {
        let mut reader = tokio_util::io::SyncIoBridge::new(reader);
        work(&mut reader)
    })
    .await
    .map_err(|source| ServiceError::Task {
        what: "receiving from another node",
        source,
    })
}

/// Makes layer `id` present here, fetched from node `from` if missing.
async fn ensure_layer(state: &AppState, from: &str, id: &LayerId) -> Result<PathBuf, ServiceError> {
    if state.templates.has_layer(id) {
        return Ok(state.templates.layer_rootfs(id));
    }
    let response = fetch(state, from, &format!("/internal/v1/layers/{id}")).await?;
    let hash = header(&response, TREE_HASH_HEADER).ok_or_else(|| ServiceError::NodeFetch {
        node: from.to_string(),
        what: format!("layer {id}"),
        detail: "no tree hash was sent".into(),
    })?;
    let templates = state.templates.clone();
    let layer = id.clone();
    tracing::info!(layer = %id, node = %from, "fetching a layer from another node");
    with_body_reader(response, move |reader| {
        templates.import_layer(&layer, &hash, reader)
    })
    .await?
    .map_err(|source| ServiceError::Template {
        name: format!("layer {id}"),
        source,
    })
}

/// Makes template build manifest `reference` (of team template `template_id`) present
/// here, with its layers and start-command checkpoint, fetched from the node its
/// builds live on. Standalone, or when the build is here: nothing to do.
pub(crate) async fn ensure_build(
    state: &AppState,
    template_id: &str,
    reference: &str,
) -> Result<(), ServiceError> {
    if state.config.role.node().is_none() || state.templates.get(reference).is_ok() {
        return Ok(());
    }
    let Some(from) = state.store.placement(PlacedKind::Build, template_id)? else {
        return Ok(());
    };
    let response = fetch(state, &from, &format!("/internal/v1/manifests/{reference}")).await?;
    let answer: ManifestAnswer = serde_json::from_slice(
        &response
            .into_body()
            .collect()
            .await
            .map_err(|err| ServiceError::NodeFetch {
                node: from.clone(),
                what: format!("manifest {reference}"),
                detail: err.to_string(),
            })?
            .to_bytes(),
    )
    .map_err(|err| ServiceError::NodeFetch {
        node: from.clone(),
        what: format!("manifest {reference}"),
        detail: err.to_string(),
    })?;
    for layer in &answer.layers {
        ensure_layer(state, &from, layer).await?;
    }
    if let Some(checkpoint) = &answer.config.checkpoint {
        ensure_checkpoint_from(state, &from, checkpoint).await?;
    }
    let templates = state.templates.clone();
    let name = reference.to_string();
    tokio::task::spawn_blocking(move || templates.put(&name, answer.layers, answer.config))
        .await
        .map_err(|source| ServiceError::Task {
            what: "recording a fetched template",
            source,
        })?
        .map_err(|source| ServiceError::Template {
            name: reference.to_string(),
            source,
        })?;
    tracing::info!(template = %reference, node = %from, "fetched a template build from another node");
    Ok(())
}

/// Makes checkpoint `id` (a snapshot's) present here, fetched from the node it was
/// placed on. Standalone, or when it is here: nothing to do.
pub(crate) async fn ensure_checkpoint(state: &AppState, id: &str) -> Result<(), ServiceError> {
    if state.config.role.node().is_none() {
        return Ok(());
    }
    let Some(from) = state.store.placement(PlacedKind::Checkpoint, id)? else {
        return Ok(());
    };
    ensure_checkpoint_from(state, &from, id).await?;
    place_here(state, PlacedKind::Checkpoint, id)
}

async fn ensure_checkpoint_from(
    state: &AppState,
    from: &str,
    id: &str,
) -> Result<(), ServiceError> {
    let runtime = state.runtime.clone();
    let listed = tokio::task::spawn_blocking(move || runtime.checkpoints())
        .await
        .map_err(|source| ServiceError::Task {
            what: "listing checkpoints",
            source,
        })?
        .map_err(|source| ServiceError::Runtime {
            sandbox: String::new(),
            stage: crate::error::Stage::Restore,
            source,
        })?;
    if listed.iter().any(|have| have == id) {
        return Ok(());
    }
    let response = fetch(state, from, &format!("/internal/v1/checkpoints/{id}")).await?;
    let missing = |what: &str| ServiceError::NodeFetch {
        node: from.to_string(),
        what: format!("checkpoint {id}"),
        detail: format!("no {what} was sent"),
    };
    let hash = header(&response, TREE_HASH_HEADER).ok_or_else(|| missing("tree hash"))?;
    let layer_ids: Vec<LayerId> = header(&response, LAYERS_HEADER)
        .ok_or_else(|| missing("layer list"))?
        .split(',')
        .filter(|id| !id.is_empty())
        .map(|id| LayerId::try_from(id.to_string()))
        .collect::<Result<_, _>>()
        .map_err(|detail| ServiceError::NodeFetch {
            node: from.to_string(),
            what: format!("checkpoint {id}"),
            detail,
        })?;
    // The layers first: the checkpoint must never be here without what it stands on.
    let mut layers = Vec::with_capacity(layer_ids.len());
    for layer in &layer_ids {
        layers.push(ensure_layer(state, from, layer).await?);
    }
    tracing::info!(checkpoint = %id, node = %from, "fetching a checkpoint from another node");
    let runtime = state.runtime.clone();
    let checkpoint = id.to_string();
    with_body_reader(response, move |reader| {
        runtime.import_checkpoint(&checkpoint, &hash, layers, reader)
    })
    .await?
    .map(drop)
    .or_else(|err| match err {
        // Another request fetched it meanwhile.
        RuntimeError::CheckpointExists(_) => Ok(()),
        source => Err(ServiceError::Runtime {
            sandbox: String::new(),
            stage: crate::error::Stage::Restore,
            source,
        }),
    })
}
