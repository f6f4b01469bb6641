//! The API instance's side: which requests go to which node ([`route`], a pure
//! function), relaying them ([`relay`]), placing new sandboxes, builds and volumes,
//! reaching sandbox ports through tunnels, and reporting nodes whose lease lapsed.
//!
//! A request is relayed whole (the node authenticates its API key again against the
//! shared database, so a node trusts an API instance with nothing but the token).
//! What needs a node:
//! - creating a sandbox: placed by [`berth_cluster::place`] (a volume's node when it
//!   mounts volumes; the snapshot's or template build's node preferred);
//! - anything done to a sandbox (kill, pause, resume, connect, timeout, network, fork,
//!   snapshot): its node;
//! - template builds and their files, status, logs and cancel: the node the template's
//!   builds live on (chosen at its first build request);
//! - deleting a snapshot or a template: the node its checkpoint or builds live on;
//! - volumes (create, delete, content): the volume's node.
//!
//! Everything else reads or writes the database only and is served here.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_cluster::{NodeAddr, NodeFacts, PlacementRequest};
use berth_runtime::{
    CheckpointInfo, RecoveryReport, ResumedSandbox, Runtime, RuntimeError, SandboxInfo,
    SandboxSpec, SandboxStats,
};
use berth_store::{NodeRecord, PlacedKind, SandboxStatus};
use time::OffsetDateTime;

use crate::error::ServiceError;
use crate::{events, sandboxes, AppState, SharedState};

/// Where a request is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Destination {
    /// Here: it reads or writes the database only.
    Here,
    /// A new sandbox: placed on a node.
    NewSandbox,
    /// The node sandbox `id` lives on.
    Sandbox(String),
    /// A build request (`POST /v3/templates`): the template's node, or a new one.
    NewBuild,
    /// The node team template `id`'s builds live on.
    Template(String),
    /// `DELETE /templates/{reference}`: a snapshot's or a template's node.
    TemplateOrSnapshot(String),
    /// A new volume: placed on a node.
    NewVolume,
    /// The node volume `id` lives on.
    Volume(String),
}

/// Which of the API's routes need which node (the routes themselves are in
/// `handlers::router`; this must name every one that reaches the runtime, the build
/// engine or a volume).
pub(crate) fn route(method: &Method, path: &str) -> Destination {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let owned = |s: &str| s.to_string();
    match (method.as_str(), parts.as_slice()) {
        ("POST", ["sandboxes"] | ["v2", "sandboxes"]) => Destination::NewSandbox,
        ("DELETE", ["sandboxes", id]) => Destination::Sandbox(owned(id)),
        (
            "POST",
            ["sandboxes", id, "timeout" | "refreshes" | "pause" | "resume" | "connect" | "fork" | "snapshots"],
        )
        | ("POST", ["v2", "sandboxes", id, "connect"])
        | ("PUT", ["sandboxes", id, "network"]) => Destination::Sandbox(owned(id)),
        ("POST", ["v3", "templates"]) => Destination::NewBuild,
        ("POST", ["v2", "templates", id, "builds", _])
        | ("DELETE", ["templates", id, "builds", _])
        | ("GET", ["templates", id, "builds", _, "status" | "logs"])
        | ("GET", ["templates", id, "files", _])
        | ("PUT", ["template-uploads", id, _]) => Destination::Template(owned(id)),
        ("DELETE", ["templates", reference]) => Destination::TemplateOrSnapshot(owned(reference)),
        ("POST", ["volumes"]) => Destination::NewVolume,
        ("DELETE", ["volumes", id]) | (_, ["volumecontent", id, ..]) => {
            Destination::Volume(owned(id))
        }
        _ => Destination::Here,
    }
}

/// The API's outermost route layer: relays what needs a node, serves the rest here.
pub(crate) async fn relay(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    let destination = route(request.method(), request.uri().path());
    if destination == Destination::Here {
        return next.run(request).await;
    }
    match decide(&state, destination, request).await {
        Ok(Decision::Relay(node, request)) => forward(&state, &node, request).await,
        Ok(Decision::Here(request)) => next.run(request).await,
        Ok(Decision::Answer(response)) => response,
        Err(err) => crate::error::to_api(&err).into_response(),
    }
}

enum Decision {
    Relay(String, Request),
    /// Answered here without a node (a body over the API's limit).
    Answer(Response),
    /// No node is involved (a missing object, a caller to refuse): the local handler
    /// answers as it would anywhere.
    Here(Request),
}

async fn decide(
    state: &SharedState,
    destination: Destination,
    request: Request,
) -> Result<Decision, ServiceError> {
    let placed = |kind, id: &str| state.store.placement(kind, id);
    let node = match destination {
        Destination::Here => None,
        Destination::Sandbox(id) => placed(PlacedKind::Sandbox, &id)?,
        Destination::Template(id) => placed(PlacedKind::Build, &id)?,
        Destination::Volume(id) => placed(PlacedKind::Volume, &id)?,
        Destination::NewVolume => Some(choose(state, small_request(), |_| false)?),
        Destination::NewSandbox | Destination::NewBuild | Destination::TemplateOrSnapshot(_) => {
            let Ok(caller) = crate::auth::authenticate(state, request.headers()) else {
                return Ok(Decision::Here(request));
            };
            let (parts, body) = request.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, crate::MAX_API_BODY_BYTES).await else {
                let mut refused = berth_api::ApiError::PayloadTooLarge {
                    limit: crate::MAX_API_BODY_BYTES,
                }
                .into_response();
                // The rest of the body is still in flight: this connection cannot be reused.
                refused.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
                return Ok(Decision::Answer(refused));
            };
            let node = match &destination {
                Destination::NewSandbox => {
                    match retried_create(state, &caller.team, &parts.headers)? {
                        // A retry goes where its first try made the sandbox: that node answers
                        // with it.
                        Some(node) => Some(node),
                        None => Some(place_sandbox(state, &caller.team, &bytes)?),
                    }
                }
                Destination::NewBuild => Some(place_build(state, &caller.team, &bytes)?),
                Destination::TemplateOrSnapshot(reference) => {
                    owner_of(state, &caller.team, reference)?
                }
                _ => unreachable!("matched above"),
            };
            let request = Request::from_parts(parts, Body::from(bytes));
            return Ok(match node {
                Some(node) => Decision::Relay(node, request),
                None => Decision::Here(request),
            });
        }
    };
    Ok(match node {
        Some(node) => Decision::Relay(node, request),
        None => Decision::Here(request),
    })
}

async fn forward(state: &AppState, node_id: &str, request: Request) -> Response {
    let relayed = async {
        let addr = node_addr(state, node_id)?;
        let forwarder = forwarder(state);
        forwarder
            .forward(&addr, request)
            .await
            .map_err(|source| ServiceError::NodeUnreachable {
                node: node_id.to_string(),
                source,
            })
    };
    match relayed.await {
        Ok(response) => response.map(Body::new),
        Err(err) => crate::error::to_api(&err).into_response(),
    }
}

fn forwarder(state: &AppState) -> &berth_cluster::Forwarder {
    state
        .forwarder
        .as_ref()
        .expect("API instances are started with a forwarder")
}

/// Where node `node_id` listens.
pub(crate) fn node_addr(state: &AppState, node_id: &str) -> Result<NodeAddr, ServiceError> {
    let record = state
        .store
        .node(node_id)?
        .ok_or_else(|| ServiceError::NodeUnknown(node_id.to_string()))?;
    record.url.parse().map_err(|source| ServiceError::NodeUrl {
        node: node_id.to_string(),
        source,
    })
}

fn small_request() -> PlacementRequest {
    PlacementRequest {
        cpu_count: 0,
        memory_mb: 0,
    }
}

/// The node for `request`, preferring those for which `has` holds.
pub(crate) fn choose(
    state: &AppState,
    request: PlacementRequest,
    has: impl Fn(&NodeRecord) -> bool,
) -> Result<String, ServiceError> {
    let now = OffsetDateTime::now_utc();
    let usage = state.store.node_usage()?;
    let facts: Vec<NodeFacts> = state
        .store
        .nodes()?
        .iter()
        .map(|node| {
            let used = usage
                .iter()
                .find(|(id, _)| *id == node.id)
                .map(|(_, used)| used.clone())
                .unwrap_or_default();
            NodeFacts {
                id: node.id.clone(),
                accepting: node.accepting(now),
                cpu_capacity: node.cpu_capacity,
                memory_capacity_mb: node.memory_capacity_mb,
                slots: node.slots,
                cpu_reserved: used.cpu_reserved,
                memory_reserved_mb: used.memory_reserved_mb,
                sandboxes: used.sandboxes,
                has_template: has(node),
            }
        })
        .collect();
    berth_cluster::place(&facts, &request)
        .map(|node| node.id.clone())
        .map_err(ServiceError::NoNodeFits)
}

/// The node of the sandbox an earlier create with the same `Idempotency-Key` made.
fn retried_create(
    state: &AppState,
    team: &berth_store::Team,
    headers: &http::HeaderMap,
) -> Result<Option<String>, ServiceError> {
    let Some(key) = crate::handlers::sandboxes::idempotency_key(headers) else {
        return Ok(None);
    };
    match state.store.idempotent_sandbox(&team.id, &key)? {
        Some(sandbox) => Ok(state.store.placement(PlacedKind::Sandbox, &sandbox)?),
        None => Ok(None),
    }
}

/// What a create names that placement cares about.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    #[serde(default)]
    volume_mounts: Option<Vec<MountBody>>,
}

#[derive(serde::Deserialize)]
struct MountBody {
    name: Option<String>,
}

/// The node a create goes to. A body this cannot read goes to any node, whose handler
/// answers it as it answers bad input anywhere.
fn place_sandbox(
    state: &AppState,
    team: &berth_store::Team,
    body: &[u8],
) -> Result<String, ServiceError> {
    let create: CreateBody = serde_json::from_slice(body).unwrap_or_default();
    let mounts: Vec<String> = create
        .volume_mounts
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.name)
        .collect();
    if !mounts.is_empty() {
        let mut nodes = std::collections::BTreeSet::new();
        for name in &mounts {
            if let Some(volume) = state.store.volume_by_name(&team.id, name)? {
                if let Some(node) = state.store.placement(PlacedKind::Volume, &volume.id)? {
                    nodes.insert(node);
                }
            }
        }
        if nodes.len() > 1 {
            return Err(ServiceError::VolumesOnSeveralNodes(mounts.join(", ")));
        }
        if let Some(node) = nodes.into_iter().next() {
            return Ok(node);
        }
    }
    let reference = create.template_id.unwrap_or_else(|| "base".into());
    let slug = crate::templates::team_slug(&team.name);
    if let Some(name) = crate::templates::snapshot_name(&reference, &slug) {
        if let Some(snapshot) = state.store.snapshot(&team.id, name)? {
            let home = state
                .store
                .placement(PlacedKind::Checkpoint, &snapshot.checkpoint_id)?;
            let request = PlacementRequest {
                cpu_count: snapshot.cpu_count,
                memory_mb: snapshot.memory_mb,
            };
            return choose(state, request, |node| Some(&node.id) == home.as_ref());
        }
    }
    let Ok(name) = crate::templates::parse_name(&reference) else {
        return choose(state, small_request(), |_| false);
    };
    let Some(visible) = crate::templates::find(state, team, &name)? else {
        return choose(state, small_request(), |_| false);
    };
    let build = state
        .store
        .template_build_by_tag(&visible.record.id, name.tag_or_default())?;
    let request = build
        .as_ref()
        .map_or(small_request(), |build| PlacementRequest {
            cpu_count: build.cpu_count,
            memory_mb: build.memory_mb,
        });
    if visible.record.team_id.is_none() {
        // Installed templates are on every node.
        return choose(state, request, |_| true);
    }
    let home = state
        .store
        .placement(PlacedKind::Build, &visible.record.id)?;
    choose(state, request, |node| Some(&node.id) == home.as_ref())
}

#[derive(serde::Deserialize, Default)]
struct BuildBody {
    name: Option<String>,
    alias: Option<String>,
}

/// The node a build request goes to: where the template's builds already are, else a
/// new one (a template's builds stay on one node: its layers and step cache are there).
fn place_build(
    state: &AppState,
    team: &berth_store::Team,
    body: &[u8],
) -> Result<String, ServiceError> {
    let build: BuildBody = serde_json::from_slice(body).unwrap_or_default();
    if let Some(reference) = build.name.or(build.alias) {
        if let Ok(name) = crate::templates::parse_name(&reference) {
            if let Some(visible) = crate::templates::find(state, team, &name)? {
                if let Some(node) = state
                    .store
                    .placement(PlacedKind::Build, &visible.record.id)?
                {
                    return Ok(node);
                }
            }
        }
    }
    choose(state, small_request(), |_| false)
}

/// The node holding what `DELETE /templates/{reference}` removes: a snapshot's
/// checkpoint, or a team template's builds.
fn owner_of(
    state: &AppState,
    team: &berth_store::Team,
    reference: &str,
) -> Result<Option<String>, ServiceError> {
    let slug = crate::templates::team_slug(&team.name);
    let snapshot_name = crate::templates::snapshot_name(reference, &slug).unwrap_or(reference);
    if let Some(snapshot) = state.store.snapshot(&team.id, snapshot_name)? {
        return Ok(state
            .store
            .placement(PlacedKind::Checkpoint, &snapshot.checkpoint_id)?);
    }
    let Ok(name) = crate::templates::parse_name(reference) else {
        return Ok(None);
    };
    match crate::templates::find(state, team, &name)? {
        Some(visible) => Ok(state
            .store
            .placement(PlacedKind::Build, &visible.record.id)?),
        None => Ok(None),
    }
}

/// A sandbox port reached through a tunnel to its node.
pub(crate) struct TunnelConnector {
    pub node: NodeAddr,
    pub token: berth_cluster::NodeToken,
    pub sandbox_id: String,
}

impl berth_proxy::PortConnector for TunnelConnector {
    fn connect(
        &self,
        port: u16,
    ) -> berth_proxy::BoxFuture<'_, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(async move {
            berth_cluster::tunnel::open(&self.node, &self.token, &self.sandbox_id, port)
                .await
                .map_err(berth_cluster::TunnelError::into_io)
        })
    }
}

/// The connector to sandbox `id`'s ports from an API instance.
pub(crate) fn connector(
    state: &AppState,
    id: &str,
) -> Result<Arc<dyn berth_proxy::PortConnector>, ServiceError> {
    let crate::cluster::Role::Api(api) = &state.config.role else {
        unreachable!("only API instances tunnel");
    };
    let node = state
        .store
        .placement(PlacedKind::Sandbox, id)?
        .ok_or_else(|| ServiceError::SandboxNotFound(id.to_string()))?;
    Ok(Arc::new(TunnelConnector {
        node: node_addr(state, &node)?,
        token: api.token.clone(),
        sandbox_id: id.to_string(),
    }))
}

/// Asks sandbox `id`'s node to resume it (traffic reached a paused sandbox with
/// `autoResume`).
pub(crate) async fn resume_on_node(state: &AppState, id: &str) -> Result<(), ServiceError> {
    let node = state
        .store
        .placement(PlacedKind::Sandbox, id)?
        .ok_or_else(|| ServiceError::SandboxNotFound(id.to_string()))?;
    let request = http::Request::post(format!("/internal/v1/sandboxes/{id}/resume"))
        .body(Body::empty())
        .expect("a valid request");
    let response = forwarder(state)
        .forward(&node_addr(state, &node)?, request)
        .await
        .map_err(|source| ServiceError::NodeUnreachable {
            node: node.clone(),
            source,
        })?;
    if response.status().is_success() {
        return Ok(());
    }
    Err(ServiceError::NodeFetch {
        node,
        what: format!("resuming sandbox {id}"),
        detail: format!("answered {}", response.status()),
    })
}

/// Marks lost the nodes whose lease lapsed, every `every`, and their running sandboxes
/// killed (an event and a log line each). Any number of API instances may run this:
/// each lapsed node is handed to one of them.
pub(crate) async fn watch_leases(state: SharedState, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        let lost = match state
            .store
            .mark_lapsed_nodes_lost(OffsetDateTime::now_utc())
        {
            Ok(lost) => lost,
            Err(err) => {
                tracing::error!(%err, "looking for nodes whose lease lapsed");
                continue;
            }
        };
        for node in lost {
            tracing::warn!(%node, "a node's lease lapsed: its running sandboxes are reported lost");
            if let Err(err) = report_lost(&state, &node) {
                tracing::error!(%node, %err, "reporting a lost node's sandboxes");
            }
        }
    }
}

fn report_lost(state: &AppState, node: &str) -> Result<(), ServiceError> {
    for id in state.store.placed_on(PlacedKind::Sandbox, node)? {
        let Some(row) = state.store.live_sandbox_any_team(&id)? else {
            continue;
        };
        if row.status != SandboxStatus::Running || !state.store.mark_killed(&id)? {
            continue;
        }
        state.store.remove_placement(PlacedKind::Sandbox, &id)?;
        sandboxes::log(
            state,
            &id,
            berth_api::LogLevel::Error,
            &format!("sandbox lost: its node {node} stopped answering (lease lapsed)"),
        );
        events::record(
            state,
            &row,
            events::KILLED,
            Some(serde_json::json!({"reason": "node lost", "node": node})),
        );
    }
    Ok(())
}

/// The runtime of an API instance: it runs no sandbox. Every request that needs a
/// runtime is relayed to a node before a handler could call this, so a call here is a
/// route `route` does not name (answered 501, naming it), never a silent success.
pub struct NodesRunSandboxes;

fn on_nodes(what: &'static str) -> RuntimeError {
    RuntimeError::Unsupported {
        backend: "API instance's (sandboxes run on nodes)",
        what,
    }
}

impl Runtime for NodesRunSandboxes {
    fn create(&self, _: &SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        Err(on_nodes("creating sandboxes"))
    }
    fn kill(&self, _: &str) -> Result<(), RuntimeError> {
        Err(on_nodes("killing sandboxes"))
    }
    fn freeze(&self, _: &str) -> Result<(), RuntimeError> {
        Err(on_nodes("freezing sandboxes"))
    }
    fn thaw(&self, _: &str) -> Result<(), RuntimeError> {
        Err(on_nodes("thawing sandboxes"))
    }
    fn stats(&self, id: &str) -> Result<SandboxStats, RuntimeError> {
        Err(RuntimeError::NotFound(id.to_string()))
    }
    fn list(&self) -> Vec<SandboxInfo> {
        Vec::new()
    }
    fn recover(&self) -> Result<RecoveryReport, RuntimeError> {
        Ok(RecoveryReport::default())
    }
    fn connect(&self, _: &str, _: u16) -> Result<std::net::TcpStream, RuntimeError> {
        Err(on_nodes("connecting to sandboxes"))
    }
    fn pause(&self, _: &str, _: bool) -> Result<(), RuntimeError> {
        Err(on_nodes("pausing sandboxes"))
    }
    fn resume(&self, _: &str, _: bool) -> Result<ResumedSandbox, RuntimeError> {
        Err(on_nodes("resuming sandboxes"))
    }
    fn checkpoint(
        &self,
        _: &str,
        _: &str,
        _: berth_runtime::Durability,
    ) -> Result<CheckpointInfo, RuntimeError> {
        Err(on_nodes("checkpoints"))
    }
    fn restore(&self, _: &str, _: &str, _: bool) -> Result<SandboxInfo, RuntimeError> {
        Err(on_nodes("restoring checkpoints"))
    }
    fn delete_checkpoint(&self, _: &str) -> Result<(), RuntimeError> {
        Err(on_nodes("deleting checkpoints"))
    }
    fn checkpoints(&self) -> Result<Vec<String>, RuntimeError> {
        Ok(Vec::new())
    }
    fn create_volume(&self, _: &str) -> Result<(), RuntimeError> {
        Err(on_nodes("volumes"))
    }
    fn delete_volume(&self, _: &str) -> Result<(), RuntimeError> {
        Err(on_nodes("volumes"))
    }
    fn open_volume(&self, _: &str) -> Result<std::os::fd::OwnedFd, RuntimeError> {
        Err(on_nodes("volumes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(method: Method, path: &str) -> Destination {
        route(&method, path)
    }

    #[test]
    fn every_route_that_needs_a_runtime_goes_to_a_node() {
        use Destination::*;
        let s = |id: &str| Sandbox(id.to_string());
        assert_eq!(at(Method::POST, "/sandboxes"), NewSandbox);
        assert_eq!(at(Method::POST, "/v2/sandboxes"), NewSandbox);
        assert_eq!(at(Method::DELETE, "/sandboxes/i1"), s("i1"));
        for action in [
            "timeout",
            "refreshes",
            "pause",
            "resume",
            "connect",
            "fork",
            "snapshots",
        ] {
            assert_eq!(
                at(Method::POST, &format!("/sandboxes/i1/{action}")),
                s("i1"),
                "{action}"
            );
        }
        assert_eq!(at(Method::POST, "/v2/sandboxes/i1/connect"), s("i1"));
        assert_eq!(at(Method::PUT, "/sandboxes/i1/network"), s("i1"));
        assert_eq!(at(Method::POST, "/v3/templates"), NewBuild);
        let t = || Template("t1".into());
        assert_eq!(at(Method::POST, "/v2/templates/t1/builds/b1"), t());
        assert_eq!(at(Method::DELETE, "/templates/t1/builds/b1"), t());
        assert_eq!(at(Method::GET, "/templates/t1/builds/b1/status"), t());
        assert_eq!(at(Method::GET, "/templates/t1/builds/b1/logs"), t());
        assert_eq!(at(Method::GET, "/templates/t1/files/abc"), t());
        assert_eq!(at(Method::PUT, "/template-uploads/t1/abc"), t());
        assert_eq!(
            at(Method::DELETE, "/templates/snap"),
            TemplateOrSnapshot("snap".into())
        );
        assert_eq!(at(Method::POST, "/volumes"), NewVolume);
        assert_eq!(at(Method::DELETE, "/volumes/v1"), Volume("v1".into()));
        assert_eq!(
            at(Method::GET, "/volumecontent/v1/file"),
            Volume("v1".into())
        );
        assert_eq!(
            at(Method::PATCH, "/volumecontent/v1/path"),
            Volume("v1".into())
        );
    }

    #[test]
    fn reads_and_database_writes_are_served_here() {
        for (method, path) in [
            (Method::GET, "/sandboxes"),
            (Method::GET, "/v2/sandboxes"),
            (Method::GET, "/sandboxes/i1"),
            (Method::GET, "/sandboxes/i1/logs"),
            (Method::GET, "/v2/sandboxes/i1/logs"),
            (Method::GET, "/sandboxes/i1/metrics"),
            (Method::GET, "/snapshots"),
            (Method::GET, "/templates/t1"),
            (Method::PATCH, "/templates/t1"),
            (Method::GET, "/v2/templates"),
            (Method::POST, "/api-keys"),
            (Method::GET, "/events/sandboxes"),
            (Method::POST, "/secrets"),
            (Method::GET, "/volumes"),
            (Method::GET, "/volumes/v1"),
            (Method::GET, "/health"),
        ] {
            assert_eq!(route(&method, path), Destination::Here, "{method} {path}");
        }
    }
}
