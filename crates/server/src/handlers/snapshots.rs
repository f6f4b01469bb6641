//! Fork and snapshot routes: `POST /sandboxes/{id}/fork`, `POST
//! /sandboxes/{id}/snapshots`, `GET /snapshots`, and `DELETE /templates/{id}` for a
//! snapshot (how the SDKs delete one).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_api::{
    ApiError, SandboxForkRequest, SandboxForkResult, SandboxSnapshotRequest, SnapshotInfo,
};
use berth_store::SnapshotRecord;
use serde::Deserialize;
use utoipa::IntoParams;

use super::sandboxes::sandbox_response;
use super::validate_timeout;
use crate::auth::Caller;
use crate::error::HttpError;
use crate::extract::{ApiJson, ApiQuery, OptionalJson};
use crate::{sandboxes, templates, SharedState};

/// Default time to live of a fork, in seconds (the SDKs' default timeout).
const DEFAULT_FORK_TIMEOUT: i64 = 300;
const MAX_FORKS: i64 = 100;
const MAX_NAME_LEN: usize = 128;

/// E2B's answer for a snapshot: its full name, namespaced by the caller's team.
fn snapshot_info(caller: &Caller, record: &SnapshotRecord) -> SnapshotInfo {
    let full_name =
        templates::snapshot_full_name(&templates::team_slug(&caller.team.name), &record.name);
    SnapshotInfo {
        snapshot_id: full_name.clone(),
        names: vec![full_name],
    }
}

/// The caller's own snapshot name in `reference` (see `templates::snapshot_name`).
fn own_snapshot_name<'a>(caller: &Caller, reference: &'a str) -> Option<&'a str> {
    templates::snapshot_name(reference, &templates::team_slug(&caller.team.name))
}

/// The caller's live sandbox `id` (404 otherwise), before any work is done.
fn check_owner(state: &SharedState, caller: &Caller, id: &str) -> Result<(), HttpError> {
    state
        .store
        .live_sandbox(&caller.team.id, id)?
        .map(drop)
        .ok_or_else(|| ApiError::sandbox_not_found(id).into())
}

/// Fork a running sandbox: one checkpoint, `count` new sandboxes from it.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/fork", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body(content = Option<SandboxForkRequest>),
    responses(
        (status = 201, body = Vec<SandboxForkResult>, description = "One outcome per fork"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
        (status = 409, body = berth_api::Error, description = "The sandbox is paused"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn fork_sandbox(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<SandboxForkRequest>,
) -> Result<Response, HttpError> {
    let count = body.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(ApiError::BadRequest(format!(
            "count must be between 1 and {MAX_FORKS}, got {count}"
        ))
        .into());
    }
    let timeout = validate_timeout(
        state.limits.current().max_lifetime,
        body.timeout.unwrap_or(DEFAULT_FORK_TIMEOUT),
    )?;
    check_owner(&state, &caller, &id)?;
    let results = sandboxes::fork(&state, &id, count as usize, timeout).await?;
    let body: Vec<SandboxForkResult> = results
        .into_iter()
        .map(|result| match result {
            Ok(record) => SandboxForkResult {
                sandbox: Some(sandbox_response(&state, &record)),
                error: None,
            },
            Err(err) => SandboxForkResult {
                sandbox: None,
                error: Some(berth_api::ApiError::from(err).body()),
            },
        })
        .collect();
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// A snapshot name must be usable as a template id.
fn check_name(name: &str) -> Result<(), HttpError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if valid {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "name \"{name}\" must be 1 to {MAX_NAME_LEN} letters, digits, '-', '_' or '.', \
             starting with a letter or digit"
        ))
        .into())
    }
}

/// Snapshot a running sandbox, which keeps running; the name works as `templateID`.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/snapshots", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body = SandboxSnapshotRequest,
    responses(
        (status = 201, body = SnapshotInfo, description = "The snapshot was taken"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
        (status = 409, body = berth_api::Error, description = "The sandbox is paused, or the name is a template's"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn create_snapshot(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SandboxSnapshotRequest>,
) -> Result<Response, HttpError> {
    let name = body.name.filter(|name| !name.is_empty());
    if let Some(name) = &name {
        check_name(name)?;
    }
    check_owner(&state, &caller, &id)?;
    let memory = body.memory.unwrap_or(true);
    let record = sandboxes::snapshot(&state, &id, name, memory).await?;
    Ok((StatusCode::CREATED, Json(snapshot_info(&caller, &record))).into_response())
}

/// Query of `GET /snapshots`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SnapshotsQuery {
    /// Only snapshots of this sandbox.
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    /// Only the snapshot with this name (or id).
    name: Option<String>,
    /// Page size, 1..=100 (default 100).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
    /// Cursor from a previous page's `X-Next-Token`.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// The team's snapshots, newest first.
#[utoipa::path(get, path = "/snapshots", tag = "sandboxes", params(SnapshotsQuery),
    responses(
        (status = 200, body = Vec<SnapshotInfo>, description = "Matching snapshots",
            headers(("X-Next-Token" = String, description = "Cursor of the next page, when there is one"))),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_snapshots(
    State(state): State<SharedState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<SnapshotsQuery>,
) -> Result<Response, HttpError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=100).contains(&limit) {
        return Err(
            ApiError::BadRequest(format!("limit must be between 1 and 100, got {limit}")).into(),
        );
    }
    // A name of another namespace matches none of the caller's snapshots.
    let name = query
        .name
        .as_deref()
        .map(|name| own_snapshot_name(&caller, name).unwrap_or(name));
    let (page, next) = state.store.list_snapshots(
        &caller.team.id,
        query.sandbox_id.as_deref(),
        name,
        limit as usize,
        query.next_token.as_deref(),
    )?;
    let mut headers = HeaderMap::new();
    if let Some(value) = next.and_then(|token| HeaderValue::from_str(&token).ok()) {
        headers.insert("x-next-token", value);
    }
    let body: Vec<SnapshotInfo> = page
        .iter()
        .map(|record| snapshot_info(&caller, record))
        .collect();
    Ok((headers, Json(body)).into_response())
}

/// Delete a snapshot (by name or id), or else one of the caller's templates (by id or
/// name) with its builds, tags and the files nothing else uses. A template that running
/// or paused sandboxes or snapshots use is refused; installed ones are read-only.
#[utoipa::path(delete, path = "/templates/{templateID}", tag = "templates",
    params(("templateID" = String, Path, description = "Snapshot name or id, or template id or name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, body = berth_api::Error, description = "The template is in use"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 403, body = berth_api::Error, description = "Installed on this host"),
        (status = 404, body = berth_api::Error, description = "No such snapshot or template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn delete_template(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    let snapshot = match own_snapshot_name(&caller, &id) {
        Some(name) => state.store.snapshot(&caller.team.id, name)?,
        None => None,
    };
    if let Some(snapshot) = snapshot {
        sandboxes::delete_snapshot(&state, &caller.team.id, &snapshot.name).await?;
    } else {
        crate::templates::delete(&state, &caller.team, &id).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}
