//! Build and tag routes: `POST /v3/templates`, COPY upload links, starting a build, its
//! status and logs, cancelling it (a berth addition), and template tags.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::Json;
use berth_api::{
    ApiError, AssignTemplateTagsRequest, AssignedTemplateTags, BuildLogEntry, BuildStatusReason,
    DeleteTemplateTagsRequest, LogLevel, LogsDirection, LogsSource, TemplateBuildFileUpload,
    TemplateBuildInfo, TemplateBuildLogsResponse, TemplateBuildRequestV3, TemplateBuildStartV2,
    TemplateBuildStatus, TemplateRequestResponseV3, TemplateTag,
};
use berth_store::DEFAULT_TAG;
use serde::Deserialize;
use time::OffsetDateTime;
use utoipa::IntoParams;

use super::templates::build_status;
use crate::auth::Caller;
use crate::error::{HttpError, ServiceError};
use crate::extract::{ApiJson, ApiQuery};
use crate::templates::{self, BuildRequestInput};
use crate::SharedState;

/// Most log entries one status or logs call returns (E2B's).
const MAX_LOG_ENTRIES: usize = 100;

/// Ask for a build of the team's template `name` (made when new): answers the ids to
/// upload files for and to start.
#[utoipa::path(post, path = "/v3/templates", tag = "templates",
    request_body = TemplateBuildRequestV3,
    responses(
        (status = 202, body = TemplateRequestResponseV3, description = "The build is registered, waiting to be started"),
        (status = 400, body = berth_api::Error, description = "Invalid name, tag or resources"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 501, body = berth_api::Error, description = "This runtime cannot build templates"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn request_build_v3(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(body): ApiJson<TemplateBuildRequestV3>,
) -> Result<(StatusCode, Json<TemplateRequestResponseV3>), HttpError> {
    let name = body
        .name
        .or(body.alias)
        .ok_or_else(|| ApiError::BadRequest("name is required".into()))?;
    let (record, build) = templates::request_build(
        &state,
        &caller.team,
        BuildRequestInput {
            name,
            tags: body.tags.unwrap_or_default(),
            cpu_count: body.cpu_count,
            memory_mb: body.memory_mb,
            min_free_disk_mb: body.min_free_disk_mb,
        },
    )
    .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(TemplateRequestResponseV3 {
            template_id: record.id.clone(),
            build_id: build.id,
            public: record.public,
            names: templates::names_of(&caller.team, &record),
            tags: build.requested_tags,
            aliases: vec![record.alias],
        }),
    ))
}

fn base_url(state: &SharedState, headers: &HeaderMap) -> String {
    if let Some(url) = &state.config.public_url {
        return url.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    format!("http://{host}")
}

/// Is the tar for `hash` uploaded already? Answers where to `PUT` it (a URL berth
/// serves, signed; valid for an hour).
#[utoipa::path(get, path = "/templates/{templateID}/files/{hash}", tag = "templates",
    params(
        ("templateID" = String, Path, description = "Template id or name"),
        ("hash" = String, Path, description = "The COPY step's filesHash (64 hex digits)"),
    ),
    responses(
        (status = 201, body = TemplateBuildFileUpload, description = "Presence and upload URL"),
        (status = 400, body = berth_api::Error, description = "Invalid hash"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn file_upload_link(
    State(state): State<SharedState>,
    caller: Caller,
    headers: HeaderMap,
    Path((template, hash)): Path<(String, String)>,
) -> Result<(StatusCode, Json<TemplateBuildFileUpload>), HttpError> {
    let valid = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !valid {
        return Err(ApiError::BadRequest(format!(
            "invalid files hash \"{hash}\": expected 64 lowercase hex digits"
        ))
        .into());
    }
    let record = templates::find_owned(&state, &caller.team, &template)?;
    let builds = state
        .builds
        .as_ref()
        .ok_or(ServiceError::BuildsUnavailable)?;
    let present = builds.engine.files().has(&caller.team.id, &hash);
    let url = templates::upload_url(
        builds,
        &base_url(&state, &headers),
        &caller.team.id,
        &record.id,
        &hash,
    );
    Ok((
        StatusCode::CREATED,
        Json(TemplateBuildFileUpload {
            present,
            url: Some(url),
        }),
    ))
}

/// Start a waiting build: base (`fromImage` | `fromTemplate`), steps, start and ready
/// commands. It runs in the background; poll its status.
#[utoipa::path(post, path = "/v2/templates/{templateID}/builds/{buildID}", tag = "templates",
    params(
        ("templateID" = String, Path, description = "Template id"),
        ("buildID" = String, Path, description = "Build id from POST /v3/templates"),
    ),
    request_body = TemplateBuildStartV2,
    responses(
        (status = 202, description = "The build has started"),
        (status = 400, body = berth_api::Error, description = "Bad request, or the build is not waiting"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such template, build or base"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn start_build_v2(
    State(state): State<SharedState>,
    caller: Caller,
    Path((template, build)): Path<(String, String)>,
    ApiJson(body): ApiJson<TemplateBuildStartV2>,
) -> Result<StatusCode, HttpError> {
    templates::start_build(&state, &caller.team, &template, &build, body).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Cancel a running build (a berth addition; E2B has no route for it). It ends in
/// `error` with reason "build cancelled".
#[utoipa::path(delete, path = "/templates/{templateID}/builds/{buildID}", tag = "templates",
    params(
        ("templateID" = String, Path, description = "Template id or name"),
        ("buildID" = String, Path, description = "Build id"),
    ),
    responses(
        (status = 204, description = "Cancelled (it stops within moments)"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such build, or it is not running"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn cancel_build(
    State(state): State<SharedState>,
    caller: Caller,
    Path((template, build)): Path<(String, String)>,
) -> Result<StatusCode, HttpError> {
    templates::cancel_build(&state, &caller.team, &template, &build)?;
    Ok(StatusCode::NO_CONTENT)
}

fn parse_level(level: Option<&str>) -> Result<LogLevel, HttpError> {
    match level {
        None => Ok(LogLevel::Debug),
        Some(text) => LogLevel::parse(text).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "level must be debug, info, warn or error, got \"{text}\""
            ))
            .into()
        }),
    }
}

fn check_limit(limit: Option<i64>) -> Result<usize, HttpError> {
    let limit = limit.unwrap_or(MAX_LOG_ENTRIES as i64);
    if !(0..=MAX_LOG_ENTRIES as i64).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 0 and {MAX_LOG_ENTRIES}, got {limit}"
        ))
        .into());
    }
    Ok(limit as usize)
}

fn log_level(level: berth_build::LogLevel) -> LogLevel {
    match level {
        berth_build::LogLevel::Debug => LogLevel::Debug,
        berth_build::LogLevel::Info => LogLevel::Info,
        berth_build::LogLevel::Warn => LogLevel::Warn,
        berth_build::LogLevel::Error => LogLevel::Error,
    }
}

fn to_entry(entry: &berth_build::LogEntry) -> BuildLogEntry {
    BuildLogEntry {
        timestamp: OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(entry.timestamp_ms) * 1_000_000,
        )
        .unwrap_or(OffsetDateTime::UNIX_EPOCH),
        message: entry.message.clone(),
        level: log_level(entry.level),
        step: entry.step.clone(),
    }
}

/// Query of the build status route.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BuildStatusQuery {
    /// Index of the first log entry to return (of those at `level` or above).
    #[serde(rename = "logsOffset")]
    #[param(minimum = 0)]
    logs_offset: Option<i64>,
    /// Most log entries to return, 0..=100 (default 100).
    #[param(minimum = 0, maximum = 100)]
    limit: Option<i64>,
    /// Lowest level of the entries returned.
    level: Option<String>,
}

/// A build's status, its log entries from `logsOffset`, and for a failure the step
/// and its warnings and errors.
#[utoipa::path(get, path = "/templates/{templateID}/builds/{buildID}/status", tag = "templates",
    params(
        ("templateID" = String, Path, description = "Template id or name"),
        ("buildID" = String, Path, description = "Build id"),
        BuildStatusQuery,
    ),
    responses(
        (status = 200, body = TemplateBuildInfo, description = "The build's status"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such build"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn build_status_route(
    State(state): State<SharedState>,
    caller: Caller,
    Path((template, build_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<BuildStatusQuery>,
) -> Result<Json<TemplateBuildInfo>, HttpError> {
    let limit = check_limit(query.limit)?;
    let level = parse_level(query.level.as_deref())?;
    let offset = query.logs_offset.unwrap_or(0);
    if offset < 0 {
        return Err(ApiError::BadRequest("logsOffset must not be negative".into()).into());
    }
    let (record, build) = templates::owned_build(&state, &caller.team, &template, &build_id)?;
    let mut status = build_status(build.status);
    if status == TemplateBuildStatus::Building {
        // Queued behind other builds: still waiting for a slot.
        if let Some(engine) = templates::engine_status(&state, &build.id) {
            if engine.state == berth_build::BuildState::Waiting {
                status = TemplateBuildStatus::Waiting;
            }
        }
    }
    let all = if build.status == berth_store::TemplateBuildStatus::Waiting {
        Vec::new()
    } else {
        templates::build_logs(&state, &build.id)
    };
    let entries: Vec<BuildLogEntry> = all
        .iter()
        .filter(|e| log_level(e.level) >= level)
        .skip(offset as usize)
        .take(limit)
        .map(to_entry)
        .collect();
    let reason = build.reason.as_ref().map(|reason| BuildStatusReason {
        message: reason.message.clone(),
        step: reason.step.clone(),
        log_entries: all
            .iter()
            .filter(|e| {
                log_level(e.level) >= LogLevel::Warn
                    && reason.step.is_some()
                    && e.step == reason.step
            })
            .map(to_entry)
            .collect(),
    });
    Ok(Json(TemplateBuildInfo {
        logs: Vec::new(),
        log_entries: entries,
        template_id: record.id,
        build_id: build.id,
        status,
        reason,
    }))
}

/// Query of the build logs route.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BuildLogsQuery {
    /// Timestamp (ms since the epoch) to start from: forward, entries at or after it;
    /// backward, entries at or before it (default: now).
    #[param(minimum = 0)]
    cursor: Option<i64>,
    /// Most entries, 0..=100 (default 100).
    #[param(minimum = 0, maximum = 100)]
    limit: Option<i64>,
    direction: Option<LogsDirection>,
    /// Lowest level of the entries returned.
    level: Option<String>,
    /// Accepted for E2B compatibility: berth keeps one log per build.
    #[allow(dead_code)]
    source: Option<LogsSource>,
}

/// A build's log entries by time: forward from `cursor` (oldest first), or backward
/// from it (newest first).
#[utoipa::path(get, path = "/templates/{templateID}/builds/{buildID}/logs", tag = "templates",
    params(
        ("templateID" = String, Path, description = "Template id or name"),
        ("buildID" = String, Path, description = "Build id"),
        BuildLogsQuery,
    ),
    responses(
        (status = 200, body = TemplateBuildLogsResponse, description = "Log entries"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such build"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn build_logs_route(
    State(state): State<SharedState>,
    caller: Caller,
    Path((template, build_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<BuildLogsQuery>,
) -> Result<Json<TemplateBuildLogsResponse>, HttpError> {
    let limit = check_limit(query.limit)?;
    let level = parse_level(query.level.as_deref())?;
    if query.cursor.is_some_and(|c| c < 0) {
        return Err(ApiError::BadRequest("cursor must not be negative".into()).into());
    }
    let (_, build) = templates::owned_build(&state, &caller.team, &template, &build_id)?;
    let all = templates::build_logs(&state, &build.id);
    let at_level = all.iter().filter(|e| log_level(e.level) >= level);
    let logs: Vec<BuildLogEntry> = match query.direction.unwrap_or(LogsDirection::Forward) {
        LogsDirection::Forward => {
            let from = query.cursor.unwrap_or(0) as u64;
            at_level
                .filter(|e| e.timestamp_ms >= from)
                .take(limit)
                .map(to_entry)
                .collect()
        }
        LogsDirection::Backward => {
            let until = query.cursor.map_or(u64::MAX, |c| c as u64);
            let mut before: Vec<_> = at_level.filter(|e| e.timestamp_ms <= until).collect();
            before.reverse();
            before.into_iter().take(limit).map(to_entry).collect()
        }
    };
    Ok(Json(TemplateBuildLogsResponse { logs }))
}

/// Point more tags at the build `target` (`name:tag`, `name` = its `default` tag)
/// names.
#[utoipa::path(post, path = "/templates/tags", tag = "tags",
    request_body = AssignTemplateTagsRequest,
    responses(
        (status = 201, body = AssignedTemplateTags, description = "Assigned"),
        (status = 400, body = berth_api::Error, description = "Invalid name or tags"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 403, body = berth_api::Error, description = "Not the caller's template"),
        (status = 404, body = berth_api::Error, description = "No such template or tag"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn assign_tags(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(body): ApiJson<AssignTemplateTagsRequest>,
) -> Result<(StatusCode, Json<AssignedTemplateTags>), HttpError> {
    if body.tags.is_empty() {
        return Err(ApiError::BadRequest("at least one tag is required".into()).into());
    }
    let target = templates::parse_name(&body.target).map_err(ServiceError::InvalidName)?;
    target
        .require_namespace(&templates::team_slug(&caller.team.name))
        .map_err(ServiceError::InvalidName)?;
    let tags = templates::validate_tags(body.tags.iter().map(String::as_str))
        .map_err(ServiceError::InvalidName)?;
    let record = templates::find_owned(&state, &caller.team, &body.target)?;
    let tag = target.tag_or_default();
    let build = state
        .store
        .template_build_by_tag(&record.id, tag)?
        .ok_or_else(|| ServiceError::TagNotFound {
            template: body.target.clone(),
            tag: tag.to_string(),
        })?;
    state
        .store
        .assign_template_tags(&record.id, &build.id, &tags)?;
    Ok((
        StatusCode::CREATED,
        Json(AssignedTemplateTags {
            tags,
            build_id: build.id,
        }),
    ))
}

/// Remove tags from the caller's template (`default` cannot be removed).
#[utoipa::path(delete, path = "/templates/tags", tag = "tags",
    request_body = DeleteTemplateTagsRequest,
    responses(
        (status = 204, description = "Removed"),
        (status = 400, body = berth_api::Error, description = "Invalid name or tags"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 403, body = berth_api::Error, description = "Not the caller's template"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn delete_tags(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(body): ApiJson<DeleteTemplateTagsRequest>,
) -> Result<StatusCode, HttpError> {
    let tags = templates::validate_tags(body.tags.iter().map(String::as_str))
        .map_err(ServiceError::InvalidName)?;
    if tags.is_empty() {
        return Err(ApiError::BadRequest("at least one tag is required".into()).into());
    }
    if tags.iter().any(|t| t == DEFAULT_TAG) {
        return Err(
            ApiError::BadRequest(format!("the \"{DEFAULT_TAG}\" tag cannot be deleted")).into(),
        );
    }
    let name = templates::parse_name(&body.name).map_err(ServiceError::InvalidName)?;
    name.require_namespace(&templates::team_slug(&caller.team.name))
        .map_err(ServiceError::InvalidName)?;
    if body.name.contains(':') {
        return Err(ApiError::BadRequest(
            "the template name must not contain a tag; list the tags in \"tags\"".into(),
        )
        .into());
    }
    let record = templates::find_owned(&state, &caller.team, &body.name)?;
    state.store.delete_template_tags(&record.id, &tags)?;
    Ok(StatusCode::NO_CONTENT)
}

/// The tags of the caller's template.
#[utoipa::path(get, path = "/templates/{templateID}/tags", tag = "tags",
    params(("templateID" = String, Path, description = "Template id or name")),
    responses(
        (status = 200, body = Vec<TemplateTag>, description = "Its tags"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_tags(
    State(state): State<SharedState>,
    caller: Caller,
    Path(template): Path<String>,
) -> Result<Json<Vec<TemplateTag>>, HttpError> {
    let record = templates::find_manageable(&state, &caller.team, &template)?.record;
    let tags = state.store.template_tags(&record.id)?;
    Ok(Json(
        tags.into_iter()
            .map(|t| TemplateTag {
                tag: t.tag,
                build_id: t.build_id,
                created_at: t.created_at,
            })
            .collect(),
    ))
}
