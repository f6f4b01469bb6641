//! Sandbox routes: create, list, get, kill, timeout, refresh, connect, logs, metrics.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_api::{
    ApiError, ConnectSandbox, ConnectSandboxV2, ListedSandbox, LogLevel, NewSandbox,
    ResumedSandbox, Sandbox, SandboxDetail, SandboxLog, SandboxLogEntry, SandboxLogs,
    SandboxLogsV2Response, SandboxMetric, SandboxPauseRequest, SandboxRefreshRequest, SandboxState,
    SandboxTimeoutRequest, SandboxesWithMetrics, CLIENT_ID,
};
use berth_store::{
    Lifecycle, MetricSample, SandboxFilter, SandboxRecord, SandboxStatus, StateFilter,
};
use serde::Deserialize;
use time::OffsetDateTime;
use utoipa::IntoParams;

use super::validate_timeout;
use crate::auth::Caller;
use crate::error::HttpError;
use crate::extract::{ApiJson, ApiQuery, OptionalJson};
use berth_net::{E2bNetworkConfig, NetworkPolicy};

use crate::sandboxes::{self, CreateRequest, Resumed};
use crate::{events, SharedState};

/// Default time to live of `POST /sandboxes` (E2B's server default).
const DEFAULT_TIMEOUT_V1: i64 = 15;
/// Default time to live of `POST /v2/sandboxes` (what SDK 2.63 documents).
const DEFAULT_TIMEOUT_V2: i64 = 300;
/// Default of `POST /sandboxes/{id}/refreshes` without a duration.
const DEFAULT_REFRESH_SECS: i64 = 15;
const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// The create's `Idempotency-Key`, when it has a usable one.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

pub(super) fn sandbox_response(state: &SharedState, record: &SandboxRecord) -> Sandbox {
    Sandbox {
        template_id: record.template_id.clone(),
        sandbox_id: record.id.clone(),
        alias: record.alias.clone(),
        client_id: CLIENT_ID.into(),
        envd_version: record.envd_version.clone(),
        envd_access_token: record.envd_access_token.clone(),
        traffic_access_token: record.traffic_access_token.clone(),
        domain: state.config.domain.clone(),
    }
}

fn listed(record: &SandboxRecord) -> ListedSandbox {
    ListedSandbox {
        template_id: record.template_id.clone(),
        alias: record.alias.clone(),
        sandbox_id: record.id.clone(),
        client_id: CLIENT_ID.into(),
        started_at: record.started_at,
        end_at: record.end_at,
        cpu_count: record.cpu_count,
        memory_mb: record.memory_mb,
        disk_size_mb: record.disk_size_mb,
        metadata: record.metadata.clone(),
        state: api_state(record),
        envd_version: record.envd_version.clone(),
        volume_mounts: crate::volumes::api_mounts(record),
    }
}

fn api_state(record: &SandboxRecord) -> SandboxState {
    match record.status {
        SandboxStatus::Paused { .. } => SandboxState::Paused,
        SandboxStatus::Running | SandboxStatus::Killed => SandboxState::Running,
    }
}

/// A running or paused sandbox of the caller's team.
fn live(state: &SharedState, caller: &Caller, id: &str) -> Result<SandboxRecord, HttpError> {
    state
        .store
        .live_sandbox(&caller.team.id, id)?
        .ok_or_else(|| ApiError::sandbox_not_found(id).into())
}

/// A running sandbox of the caller's team; 409 when it is paused.
fn running_not_paused(
    state: &SharedState,
    caller: &Caller,
    id: &str,
) -> Result<SandboxRecord, HttpError> {
    let record = live(state, caller, id)?;
    if let SandboxStatus::Paused { .. } = record.status {
        return Err(ApiError::Conflict(format!("sandbox {id} is paused; resume it first")).into());
    }
    Ok(record)
}

fn any_state(state: &SharedState, caller: &Caller, id: &str) -> Result<SandboxRecord, HttpError> {
    state
        .store
        .sandbox(&caller.team.id, id)?
        .ok_or_else(|| ApiError::sandbox_not_found(id).into())
}

/// The lifecycle a create asks for: `autoPause`, `autoPauseMemory`, `autoResume`.
fn requested_lifecycle(body: &NewSandbox) -> Result<Lifecycle, HttpError> {
    let auto_resume = match &body.auto_resume {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Object(config)) => match config.get("enabled") {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Bool(enabled)) => *enabled,
            Some(other) => {
                return Err(ApiError::BadRequest(format!(
                    "autoResume.enabled must be a boolean, got {other}"
                ))
                .into())
            }
        },
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "autoResume must be an object like {{\"enabled\": true}}, got {other}"
            ))
            .into())
        }
    };
    let lifecycle = Lifecycle {
        auto_pause: body.auto_pause.unwrap_or(false),
        auto_pause_memory: body.auto_pause_memory.unwrap_or(true),
        auto_resume,
    };
    if lifecycle.auto_resume && !lifecycle.auto_pause {
        return Err(ApiError::BadRequest(
            "autoResume needs autoPause: only a paused sandbox can be resumed by traffic".into(),
        )
        .into());
    }
    if lifecycle.auto_resume && !lifecycle.auto_pause_memory {
        return Err(ApiError::BadRequest(
            "autoResume cannot be combined with autoPauseMemory=false: a sandbox paused \
             without memory must be resumed explicitly (connect or resume)"
                .into(),
        )
        .into());
    }
    Ok(lifecycle)
}

/// Refuse request fields for features berth does not have yet, naming them.
fn refuse_unsupported(body: &NewSandbox) -> Result<(), HttpError> {
    if body.iam.as_ref().is_some_and(|v| !is_empty_json(v)) {
        return Err(ApiError::NotImplemented("iam (workload tokens)".into()).into());
    }
    Ok(())
}

/// Checks the create's `mcp` object: the servers the SDK then starts in the sandbox with
/// `mcp-gateway` (the `mcp-gateway` template's binary reads, validates and runs them; the
/// API only sees them pass, as E2B's does, and keeps nothing).
fn check_mcp(body: &NewSandbox) -> Result<(), HttpError> {
    match &body.mcp {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Object(_)) => Ok(()),
        Some(other) => Err(ApiError::BadRequest(format!(
            "mcp must be an object of MCP servers like {{\"github/<owner>/<repo>\": \
             {{\"run_cmd\": \"...\"}}}}, got {}",
            json_kind(other)
        ))
        .into()),
    }
}

/// What kind of JSON value `value` is, for messages.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The network policy a create asks for: `None` when it names none (E2B's default:
/// internet access, public traffic).
fn requested_network(body: &NewSandbox) -> Result<Option<NetworkPolicy>, ApiError> {
    let network = match &body.network {
        Some(value) if !is_empty_json(value) => Some(network_config("network", value)?),
        _ => None,
    };
    if network.is_none() && body.allow_internet_access.is_none() {
        return Ok(None);
    }
    let policy = NetworkPolicy::from_e2b_create(body.allow_internet_access, network.as_ref())
        .map_err(|err| ApiError::BadRequest(err.to_string()))?;
    Ok(Some(policy))
}

/// E2B's network config object in field `field` of a request.
fn network_config(field: &str, value: &serde_json::Value) -> Result<E2bNetworkConfig, ApiError> {
    serde_json::from_value(value.clone())
        .map_err(|err| ApiError::BadRequest(format!("{field}: {err}")))
}

fn is_empty_json(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null => true,
        serde_json::Value::Object(map) => map.is_empty(),
        serde_json::Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

async fn create(
    state: SharedState,
    caller: Caller,
    headers: HeaderMap,
    body: NewSandbox,
    default_timeout: i64,
    always_secure: bool,
) -> Result<Response, HttpError> {
    if body.template_id.trim().is_empty() {
        return Err(ApiError::BadRequest("templateID is required".into()).into());
    }
    refuse_unsupported(&body)?;
    check_mcp(&body)?;
    let network = requested_network(&body)?;
    let lifecycle = requested_lifecycle(&body)?;
    let timeout_secs = validate_timeout(
        state.limits.current().max_lifetime,
        body.timeout.unwrap_or(default_timeout),
    )?;
    let idempotency_key = idempotency_key(&headers);
    // Requests sharing a key run one at a time, so a retry sees the first one's sandbox.
    let _key_guard = match &idempotency_key {
        Some(key) => Some(
            state
                .idempotency_locks
                .lock((caller.team.id.clone(), key.clone()))
                .await,
        ),
        None => None,
    };
    if let Some(key) = &idempotency_key {
        if let Some(existing) = state.store.idempotent_sandbox(&caller.team.id, key)? {
            if let Some(record) = state.store.live_sandbox(&caller.team.id, &existing)? {
                return Ok(
                    (StatusCode::CREATED, Json(sandbox_response(&state, &record))).into_response(),
                );
            }
        }
    }
    let request = CreateRequest {
        team_id: caller.team.id.clone(),
        template: body.template_id.clone(),
        timeout_secs,
        secure: always_secure || body.secure == Some(true),
        metadata: body.metadata.unwrap_or_default(),
        env_vars: body.env_vars.unwrap_or_default(),
        allow_internet_access: body.allow_internet_access,
        network,
        lifecycle,
        volume_mounts: crate::volumes::resolve_mounts(
            &state,
            &caller.team.id,
            body.volume_mounts.as_deref().unwrap_or_default(),
        )?,
    };
    let record = sandboxes::create(&state, request).await?;
    if let Some(key) = &idempotency_key {
        state
            .store
            .remember_idempotency_key(&caller.team.id, key, &record.id)?;
    }
    Ok((StatusCode::CREATED, Json(sandbox_response(&state, &record))).into_response())
}

/// Create a sandbox (legacy; honours `secure`).
#[utoipa::path(post, path = "/sandboxes", tag = "sandboxes", request_body = NewSandbox,
    params(("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key return the same sandbox")),
    responses(
        (status = 201, body = Sandbox, description = "The sandbox was created"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "Unknown template"),
        (status = 413, body = berth_api::Error, description = "Body too large"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn create_sandbox_v1(
    State(state): State<SharedState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(body): ApiJson<NewSandbox>,
) -> Result<Response, HttpError> {
    create(state, caller, headers, body, DEFAULT_TIMEOUT_V1, false).await
}

/// Create a sandbox (what SDK 2.63 calls; envd access is always secured).
#[utoipa::path(post, path = "/v2/sandboxes", tag = "sandboxes", request_body = NewSandbox,
    params(("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key return the same sandbox")),
    responses(
        (status = 201, body = Sandbox, description = "The sandbox was created"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "Unknown template"),
        (status = 413, body = berth_api::Error, description = "Body too large"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn create_sandbox_v2(
    State(state): State<SharedState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(body): ApiJson<NewSandbox>,
) -> Result<Response, HttpError> {
    create(state, caller, headers, body, DEFAULT_TIMEOUT_V2, true).await
}

/// Parse E2B's metadata filter: `k1=v1&k2=v2`, keys and values URL-encoded (once more
/// than the query string itself).
fn parse_metadata_filter(raw: &str) -> Result<Vec<(String, String)>, HttpError> {
    let mut pairs = Vec::new();
    for part in raw.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once('=').ok_or_else(|| {
            ApiError::BadRequest(format!("metadata filter \"{part}\" is not key=value"))
        })?;
        pairs.push((percent_decode(key)?, percent_decode(value)?));
    }
    Ok(pairs)
}

fn percent_decode(text: &str) -> Result<String, HttpError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        ApiError::BadRequest(format!("bad percent-encoding in \"{text}\""))
                    })?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| ApiError::BadRequest(format!("\"{text}\" is not UTF-8")).into())
}

/// Query of `GET /sandboxes`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListV1Query {
    /// Metadata filter, e.g. `user=abc&app=prod` (keys and values URL-encoded).
    metadata: Option<String>,
}

/// List running sandboxes (legacy).
#[utoipa::path(get, path = "/sandboxes", tag = "sandboxes", params(ListV1Query),
    responses(
        (status = 200, body = Vec<ListedSandbox>, description = "Running sandboxes"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_sandboxes_v1(
    State(state): State<SharedState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ListV1Query>,
) -> Result<Json<Vec<ListedSandbox>>, HttpError> {
    let filter = SandboxFilter {
        metadata: parse_metadata_filter(query.metadata.as_deref().unwrap_or(""))?,
        ..Default::default()
    };
    let page = state
        .store
        .list_sandboxes(&caller.team.id, &filter, usize::MAX, None)?;
    Ok(Json(page.sandboxes.iter().map(listed).collect()))
}

/// Query of `GET /v2/sandboxes`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListV2Query {
    /// Metadata filter, e.g. `user=abc&app=prod` (keys and values URL-encoded).
    metadata: Option<String>,
    /// Comma-separated states: `running`, `paused`.
    state: Option<String>,
    /// `asc` or `desc` by start time (default `desc`).
    order: Option<String>,
    /// RFC 3339 time; only sandboxes started at or after it.
    #[serde(rename = "startedAfter")]
    started_after: Option<String>,
    /// Template id or alias.
    template: Option<String>,
    /// Cursor from a previous page's `X-Next-Token`.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    /// Page size, 1..=100 (default 100).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
}

/// List sandboxes, filtered and paged.
#[utoipa::path(get, path = "/v2/sandboxes", tag = "sandboxes", params(ListV2Query),
    responses(
        (status = 200, body = Vec<ListedSandbox>, description = "Matching sandboxes",
            headers(("X-Next-Token" = String, description = "Cursor of the next page, when there is one"),
                    ("X-Total-Running" = i32, description = "Running sandboxes matching the filters"))),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_sandboxes_v2(
    State(state): State<SharedState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ListV2Query>,
) -> Result<Response, HttpError> {
    let mut states = StateFilter {
        running: true,
        paused: true,
    };
    if let Some(wanted) = &query.state {
        states = StateFilter {
            running: false,
            paused: false,
        };
        for item in wanted.split(',').filter(|s| !s.is_empty()) {
            match item {
                "running" => states.running = true,
                "paused" => states.paused = true,
                other => {
                    return Err(ApiError::BadRequest(format!(
                        "unknown sandbox state \"{other}\" (running, paused)"
                    ))
                    .into())
                }
            }
        }
    }
    let ascending = match query.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(
                ApiError::BadRequest(format!("order must be asc or desc, got \"{other}\"")).into(),
            )
        }
    };
    let started_after = query
        .started_after
        .as_deref()
        .map(|text| {
            OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).map_err(
                |_| ApiError::BadRequest(format!("startedAfter \"{text}\" is not RFC 3339")),
            )
        })
        .transpose()?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=100).contains(&limit) {
        return Err(
            ApiError::BadRequest(format!("limit must be between 1 and 100, got {limit}")).into(),
        );
    }
    let filter = SandboxFilter {
        metadata: parse_metadata_filter(query.metadata.as_deref().unwrap_or(""))?,
        template: query.template.clone(),
        started_after,
        ascending,
        states,
    };
    let mut headers = HeaderMap::new();
    let page = state.store.list_sandboxes(
        &caller.team.id,
        &filter,
        limit as usize,
        query.next_token.as_deref(),
    )?;
    headers.insert("x-total-running", HeaderValue::from(page.total));
    if let Some(token) = page.next_token {
        if let Ok(value) = HeaderValue::from_str(&token) {
            headers.insert("x-next-token", value);
        }
    }
    let body: Vec<ListedSandbox> = page.sandboxes.iter().map(listed).collect();
    Ok((headers, Json(body)).into_response())
}

/// Get one sandbox.
#[utoipa::path(get, path = "/sandboxes/{sandboxID}", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = SandboxDetail, description = "The sandbox"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn get_sandbox(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SandboxDetail>, HttpError> {
    let record = live(&state, &caller, &id)?;
    let network = sandboxes::network_policy(&record).to_e2b();
    let network = (
        network.0,
        serde_json::to_value(network.1).unwrap_or_default(),
    );
    Ok(Json(SandboxDetail {
        template_id: record.template_id.clone(),
        alias: record.alias.clone(),
        sandbox_id: record.id.clone(),
        client_id: CLIENT_ID.into(),
        started_at: record.started_at,
        end_at: record.end_at,
        envd_version: record.envd_version.clone(),
        envd_access_token: record.envd_access_token.clone(),
        allow_internet_access: Some(network.0),
        network: Some(network.1),
        domain: state.config.domain.clone(),
        cpu_count: record.cpu_count,
        memory_mb: record.memory_mb,
        disk_size_mb: record.disk_size_mb,
        metadata: record.metadata.clone(),
        state: api_state(&record),
        volume_mounts: crate::volumes::api_mounts(&record),
    }))
}

/// Kill a sandbox.
#[utoipa::path(delete, path = "/sandboxes/{sandboxID}", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    responses(
        (status = 204, description = "The sandbox was killed"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn kill_sandbox(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    let record = live(&state, &caller, &id)?;
    if sandboxes::kill(&state, &record, "killed by request").await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::sandbox_not_found(&id).into())
    }
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn set_end(
    state: &SharedState,
    record: &SandboxRecord,
    end_at: OffsetDateTime,
) -> Result<(), HttpError> {
    state
        .store
        .set_end_at(&record.team_id, &record.id, end_at)?;
    state.reaper_wakeup.notify_one();
    events::record(
        state,
        record,
        events::UPDATED,
        Some(serde_json::json!({ "set_timeout": rfc3339(end_at) })),
    );
    Ok(())
}

/// Set the time to live: the sandbox expires `timeout` seconds from now.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/timeout", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body = SandboxTimeoutRequest,
    responses(
        (status = 204, description = "The end time was set"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn set_timeout(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SandboxTimeoutRequest>,
) -> Result<StatusCode, HttpError> {
    let seconds = validate_timeout(state.limits.current().max_lifetime, body.timeout)?;
    let record = running_not_paused(&state, &caller, &id)?;
    set_end(
        &state,
        &record,
        OffsetDateTime::now_utc() + time::Duration::seconds(seconds),
    )?;
    Ok(StatusCode::NO_CONTENT)
}

/// Keep the sandbox alive for at least `duration` more seconds.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/refreshes", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body(content = Option<SandboxRefreshRequest>),
    responses(
        (status = 204, description = "The sandbox was refreshed"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn refresh(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<SandboxRefreshRequest>,
) -> Result<StatusCode, HttpError> {
    let seconds = body.duration.unwrap_or(DEFAULT_REFRESH_SECS);
    if !(0..=3600).contains(&seconds) {
        return Err(ApiError::BadRequest(format!(
            "duration must be between 0 and 3600 seconds, got {seconds}"
        ))
        .into());
    }
    let record = running_not_paused(&state, &caller, &id)?;
    let wanted = OffsetDateTime::now_utc() + time::Duration::seconds(seconds);
    if wanted > record.end_at {
        set_end(&state, &record, wanted)?;
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn connect(
    state: SharedState,
    caller: Caller,
    id: String,
    timeout: i64,
    keep_memory: bool,
) -> Result<Response, HttpError> {
    let seconds = validate_timeout(state.limits.current().max_lifetime, timeout)?;
    live(&state, &caller, &id)?;
    let mut record = match sandboxes::resume(&state, &id, Some(seconds), keep_memory).await? {
        Resumed::Resumed(record) => {
            return Ok(
                (StatusCode::CREATED, Json(sandbox_response(&state, &record))).into_response(),
            )
        }
        Resumed::WasRunning(record) => record,
    };
    // Connect only ever extends the end time.
    let wanted = OffsetDateTime::now_utc() + time::Duration::seconds(seconds);
    if wanted > record.end_at {
        set_end(&state, &record, wanted)?;
        record.end_at = wanted;
    }
    Ok((StatusCode::OK, Json(sandbox_response(&state, &record))).into_response())
}

/// Connect to a running sandbox, extending (never shortening) its end time.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/connect", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body = ConnectSandbox,
    responses(
        (status = 200, body = Sandbox, description = "The sandbox was already running"),
        (status = 201, body = Sandbox, description = "The sandbox was paused and is resumed"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn connect_v1(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ConnectSandbox>,
) -> Result<Response, HttpError> {
    connect(state, caller, id, body.timeout, true).await
}

/// Connect to a running sandbox (SDK 2.63), extending (never shortening) its end time.
#[utoipa::path(post, path = "/v2/sandboxes/{sandboxID}/connect", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body = ConnectSandboxV2,
    responses(
        (status = 200, body = Sandbox, description = "The sandbox was already running"),
        (status = 201, body = Sandbox, description = "The sandbox was paused and is resumed"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn connect_v2(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ConnectSandboxV2>,
) -> Result<Response, HttpError> {
    connect(
        state,
        caller,
        id,
        body.timeout.unwrap_or(DEFAULT_TIMEOUT_V2),
        body.memory != Some(false),
    )
    .await
}

/// Pause a running sandbox, with its memory (default) or only its files.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/pause", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body(content = Option<SandboxPauseRequest>),
    responses(
        (status = 204, description = "The sandbox is paused and can be resumed"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
        (status = 409, body = berth_api::Error, description = "The sandbox is already paused"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn pause_sandbox(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<SandboxPauseRequest>,
) -> Result<StatusCode, HttpError> {
    live(&state, &caller, &id)?;
    let memory = body.memory.unwrap_or(true);
    sandboxes::pause(&state, &id, memory, "paused by request").await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resume a paused sandbox under the same id.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/resume", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body = ResumedSandbox,
    responses(
        (status = 201, body = Sandbox, description = "The sandbox was resumed"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
        (status = 409, body = berth_api::Error, description = "The sandbox is already running"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn resume_sandbox(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ResumedSandbox>,
) -> Result<Response, HttpError> {
    let seconds = validate_timeout(
        state.limits.current().max_lifetime,
        body.timeout.unwrap_or(DEFAULT_TIMEOUT_V1),
    )?;
    live(&state, &caller, &id)?;
    if body.auto_pause == Some(true) {
        state.store.set_auto_pause(&id, true)?;
    }
    match sandboxes::resume(&state, &id, Some(seconds), true).await? {
        Resumed::Resumed(record) => {
            Ok((StatusCode::CREATED, Json(sandbox_response(&state, &record))).into_response())
        }
        Resumed::WasRunning(_) => {
            Err(ApiError::Conflict(format!("sandbox {id} is already running")).into())
        }
    }
}

/// Replace a running sandbox's egress rules (an omitted field is cleared); existing
/// connections to destinations now denied are cut.
#[utoipa::path(put, path = "/sandboxes/{sandboxID}/network", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id")),
    request_body(content = Object, description = "E2B's SandboxNetworkUpdateConfig"),
    responses(
        (status = 204, description = "The new rules are in force"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
        (status = 409, body = berth_api::Error, description = "The sandbox is paused"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn update_network(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> Result<StatusCode, HttpError> {
    if !body.is_object() {
        return Err(ApiError::BadRequest("the body must be a JSON object".into()).into());
    }
    let update = network_config("body", &body)?;
    live(&state, &caller, &id)?;
    sandboxes::update_network(&state, &id, &update).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Query of `GET /sandboxes/{id}/logs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogsV1Query {
    /// Start of the logs, in milliseconds since the epoch.
    #[param(minimum = 0)]
    start: Option<i64>,
    /// Most lines to return (default 1000).
    #[param(minimum = 0, maximum = 10000)]
    limit: Option<i64>,
}

fn check_limit(limit: Option<i64>, max: i64) -> Result<usize, HttpError> {
    let limit = limit.unwrap_or(1000);
    if !(0..=max).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 0 and {max}, got {limit}"
        ))
        .into());
    }
    Ok(limit as usize)
}

fn ms_to_time(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Sandbox logs (legacy shape).
#[utoipa::path(get, path = "/sandboxes/{sandboxID}/logs", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id"), LogsV1Query),
    responses(
        (status = 200, body = SandboxLogs, description = "The logs"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn logs_v1(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<LogsV1Query>,
) -> Result<Json<SandboxLogs>, HttpError> {
    let limit = check_limit(query.limit, 10_000)?;
    if query.start.is_some_and(|s| s < 0) {
        return Err(ApiError::BadRequest("start must not be negative".into()).into());
    }
    let record = any_state(&state, &caller, &id)?;
    let lines = state
        .store
        .logs(&record.id, query.start, true, LogLevel::Debug, None, limit)?;
    Ok(Json(SandboxLogs {
        logs: lines
            .iter()
            .map(|l| SandboxLog {
                timestamp: ms_to_time(l.timestamp_ms),
                line: structured_line(l),
            })
            .collect(),
        log_entries: lines.iter().map(entry).collect(),
    }))
}

/// Who writes berth's sandbox log lines (E2B's loggers are envd's services, e.g.
/// `processSvc`; these lines are the control plane's).
const LOGGER: &str = "berth";

/// A log line as E2B emits it in the legacy `logs[].line`: a JSON object with `level`,
/// `logger` and `msg`, which the E2B CLI's `sandbox logs` parses.
fn structured_line(line: &berth_store::LogRecord) -> String {
    serde_json::json!({
        "level": line.level.as_str(),
        "logger": LOGGER,
        "msg": line.message,
    })
    .to_string()
}

fn entry(line: &berth_store::LogRecord) -> SandboxLogEntry {
    SandboxLogEntry {
        timestamp: ms_to_time(line.timestamp_ms),
        message: line.message.clone(),
        level: line.level,
        fields: [("logger".to_owned(), LOGGER.to_owned())].into(),
    }
}

/// Query of `GET /v2/sandboxes/{id}/logs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogsV2Query {
    /// Start (forward) or end (backward) of the logs, in milliseconds since the epoch.
    #[param(minimum = 0)]
    cursor: Option<i64>,
    /// Most entries to return, 0..=1000 (default 1000).
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<i64>,
    /// `forward` or `backward` (default `forward`).
    direction: Option<String>,
    /// Lowest level to return: debug, info, warn, error.
    level: Option<String>,
    /// Case-sensitive substring the message must contain.
    #[param(max_length = 256)]
    search: Option<String>,
}

/// Sandbox logs, structured.
#[utoipa::path(get, path = "/v2/sandboxes/{sandboxID}/logs", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id"), LogsV2Query),
    responses(
        (status = 200, body = SandboxLogsV2Response, description = "The logs"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn logs_v2(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<LogsV2Query>,
) -> Result<Json<SandboxLogsV2Response>, HttpError> {
    let limit = check_limit(query.limit, 1000)?;
    if query.cursor.is_some_and(|c| c < 0) {
        return Err(ApiError::BadRequest("cursor must not be negative".into()).into());
    }
    let forward = match query.direction.as_deref() {
        None | Some("forward") => true,
        Some("backward") => false,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "direction must be forward or backward, got \"{other}\""
            ))
            .into())
        }
    };
    let level = match query.level.as_deref() {
        None => LogLevel::Debug,
        Some(text) => LogLevel::parse(text).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "level must be debug, info, warn or error, got \"{text}\""
            ))
        })?,
    };
    if query
        .search
        .as_ref()
        .is_some_and(|s| s.chars().count() > 256)
    {
        return Err(ApiError::BadRequest("search is longer than 256 characters".into()).into());
    }
    let record = any_state(&state, &caller, &id)?;
    let lines = state.store.logs(
        &record.id,
        query.cursor,
        forward,
        level,
        query.search.as_deref(),
        limit,
    )?;
    Ok(Json(SandboxLogsV2Response {
        logs: lines.iter().map(entry).collect(),
    }))
}

/// Query of the metrics routes.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// Start of the interval, unix seconds.
    #[param(minimum = 0)]
    start: Option<i64>,
    /// End of the interval, unix seconds.
    #[param(minimum = 0)]
    end: Option<i64>,
}

pub(crate) fn metric(sample: &MetricSample) -> SandboxMetric {
    SandboxMetric {
        timestamp: OffsetDateTime::from_unix_timestamp(sample.timestamp_unix)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH),
        timestamp_unix: sample.timestamp_unix,
        cpu_count: sample.cpu_count,
        cpu_used_pct: sample.cpu_used_pct,
        mem_used: sample.mem_used,
        mem_total: sample.mem_total,
        mem_cache: sample.mem_cache,
        disk_used: sample.disk_used,
        disk_total: sample.disk_total,
    }
}

/// Resource usage of a sandbox over time (sampled every 5 s).
#[utoipa::path(get, path = "/sandboxes/{sandboxID}/metrics", tag = "sandboxes",
    params(("sandboxID" = String, Path, description = "Sandbox id"), MetricsQuery),
    responses(
        (status = 200, body = Vec<SandboxMetric>, description = "The samples, oldest first"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such sandbox"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn sandbox_metrics(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<MetricsQuery>,
) -> Result<Json<Vec<SandboxMetric>>, HttpError> {
    if query.start.is_some_and(|s| s < 0) || query.end.is_some_and(|e| e < 0) {
        return Err(ApiError::BadRequest("start and end must not be negative".into()).into());
    }
    let record = any_state(&state, &caller, &id)?;
    let start = query
        .start
        .unwrap_or(record.started_at.unix_timestamp() - 1);
    let end = query.end.unwrap_or(i64::MAX);
    let samples = state.store.metrics(&record.id, start, end)?;
    Ok(Json(samples.iter().map(metric).collect()))
}

/// Query of `GET /sandboxes/metrics`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ManyMetricsQuery {
    /// Comma-separated sandbox ids (at most 100).
    sandbox_ids: String,
}

/// Latest sample of each of several running sandboxes.
#[utoipa::path(get, path = "/sandboxes/metrics", tag = "sandboxes", params(ManyMetricsQuery),
    responses(
        (status = 200, body = SandboxesWithMetrics, description = "Latest sample per sandbox"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn sandboxes_metrics(
    State(state): State<SharedState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ManyMetricsQuery>,
) -> Result<Json<SandboxesWithMetrics>, HttpError> {
    let ids: Vec<&str> = query
        .sandbox_ids
        .split(',')
        .filter(|s| !s.is_empty())
        .collect();
    if ids.len() > 100 {
        return Err(ApiError::BadRequest("at most 100 sandbox_ids".into()).into());
    }
    let mut sandboxes = BTreeMap::new();
    for id in ids {
        let Some(record) = state.store.running_sandbox(&caller.team.id, id)? else {
            continue;
        };
        if let Some(sample) = state.store.latest_metric(&record.id)? {
            sandboxes.insert(record.id.clone(), metric(&sample));
        }
    }
    Ok(Json(SandboxesWithMetrics { sandboxes }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_decodes_keys_and_values() {
        let pairs = parse_metadata_filter("user%20name=al%3Dice&app=prod").unwrap();
        assert_eq!(
            pairs,
            [
                ("user name".to_string(), "al=ice".to_string()),
                ("app".to_string(), "prod".to_string())
            ]
        );
        assert!(parse_metadata_filter("novalue").is_err());
        assert!(parse_metadata_filter("a=%zz").is_err());
        assert!(parse_metadata_filter("").unwrap().is_empty());
    }

    #[test]
    fn unsupported_features_are_named() {
        let body = NewSandbox {
            template_id: "base".into(),
            iam: Some(serde_json::json!({"tokens": {"aws": {}}})),
            ..Default::default()
        };
        let err = refuse_unsupported(&body).unwrap_err();
        assert_eq!(err.0.status(), 501);
        assert!(err.to_string().contains("iam"));
        let defaults = NewSandbox {
            template_id: "base".into(),
            auto_pause: Some(false),
            auto_pause_memory: Some(true),
            allow_internet_access: Some(true),
            ..Default::default()
        };
        assert!(refuse_unsupported(&defaults).is_ok());
    }

    #[test]
    fn mcp_is_an_object_or_nothing() {
        let with = |mcp: Option<serde_json::Value>| NewSandbox {
            template_id: "mcp-gateway".into(),
            mcp,
            ..Default::default()
        };
        for fine in [
            None,
            Some(serde_json::Value::Null),
            Some(serde_json::json!({})),
            Some(serde_json::json!({"github/acme/echo": {"run_cmd": "x"}})),
        ] {
            assert!(check_mcp(&with(fine)).is_ok());
        }
        for (garbage, kind) in [
            (serde_json::json!("github/acme/echo"), "a string"),
            (serde_json::json!([{"run_cmd": "x"}]), "an array"),
            (serde_json::json!(3), "a number"),
        ] {
            let err = check_mcp(&with(Some(garbage))).unwrap_err();
            assert_eq!(err.0.status(), 400);
            let text = err.to_string();
            assert!(
                text.starts_with("mcp must be an object") && text.contains(kind),
                "{text}"
            );
        }
    }

    #[test]
    fn network_requests_become_policies_or_name_the_bad_field() {
        let none = NewSandbox {
            template_id: "base".into(),
            ..Default::default()
        };
        assert!(requested_network(&none).unwrap().is_none());
        let closed = NewSandbox {
            allow_internet_access: Some(false),
            ..none.clone()
        };
        let policy = requested_network(&closed).unwrap().unwrap();
        assert!(!policy.allow_internet_access);
        let domains_without_deny_all = NewSandbox {
            network: Some(serde_json::json!({"allowOut": ["example.test"]})),
            ..none.clone()
        };
        let err = requested_network(&domains_without_deny_all).unwrap_err();
        assert_eq!(err.status(), 400);
        let wrong_type = NewSandbox {
            network: Some(serde_json::json!({"denyOut": "0.0.0.0/0"})),
            ..none
        };
        let err = requested_network(&wrong_type).unwrap_err();
        assert!(err.to_string().starts_with("network:"), "{err}");
    }

    #[test]
    fn lifecycle_combinations_are_checked() {
        let body =
            |pause: Option<bool>, memory: Option<bool>, resume: serde_json::Value| NewSandbox {
                template_id: "base".into(),
                auto_pause: pause,
                auto_pause_memory: memory,
                auto_resume: Some(resume),
                ..Default::default()
            };
        let on = serde_json::json!({"enabled": true});
        let lifecycle = requested_lifecycle(&body(Some(true), None, on.clone())).unwrap();
        assert!(lifecycle.auto_pause && lifecycle.auto_pause_memory && lifecycle.auto_resume);
        for bad in [
            body(None, None, on.clone()),
            body(Some(true), Some(false), on.clone()),
            body(Some(true), None, serde_json::json!(true)),
            body(Some(true), None, serde_json::json!({"enabled": "yes"})),
        ] {
            let err = requested_lifecycle(&bad).unwrap_err();
            assert_eq!(err.0.status(), 400, "{err}");
            assert!(err.to_string().contains("autoResume"), "{err}");
        }
        let off = requested_lifecycle(&body(None, None, serde_json::Value::Null)).unwrap();
        assert_eq!(off, Lifecycle::default());
    }
}
