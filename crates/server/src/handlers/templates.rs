//! Template routes: listings (installed templates and the team's own), one template with
//! its builds, alias lookup and `PATCH` (public). Deletion lives with the snapshot
//! routes (`DELETE /templates/{id}` deletes a snapshot of that name first); builds and
//! tags in `template_builds`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_api::{
    ApiError, Template, TemplateAliasResponse, TemplateBuild, TemplateBuildStatus,
    TemplateUpdateRequest, TemplateUpdateResponse, TemplateWithBuilds,
};
use berth_store::{Team, TemplateBuildRecord, TemplateRecord};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::{HttpError, ServiceError};
use crate::extract::{ApiJson, ApiQuery};
use crate::templates::{self, Access};
use crate::{SharedState, ENVD_VERSION};

pub(crate) fn build_status(status: berth_store::TemplateBuildStatus) -> TemplateBuildStatus {
    match status {
        berth_store::TemplateBuildStatus::Waiting => TemplateBuildStatus::Waiting,
        berth_store::TemplateBuildStatus::Building => TemplateBuildStatus::Building,
        berth_store::TemplateBuildStatus::Ready => TemplateBuildStatus::Ready,
        berth_store::TemplateBuildStatus::Error => TemplateBuildStatus::Error,
    }
}

/// The build a template's resources and `buildID` are reported from: the one its
/// `default` tag names, else its newest.
fn reported_build(
    state: &SharedState,
    record: &TemplateRecord,
) -> Result<Option<TemplateBuildRecord>, HttpError> {
    if let Some(build) = state
        .store
        .template_build_by_tag(&record.id, berth_store::DEFAULT_TAG)?
    {
        return Ok(Some(build));
    }
    Ok(state
        .store
        .list_template_builds(&record.id, 1, None)?
        .0
        .into_iter()
        .next())
}

/// A build's resources as reported (installed templates: the server's defaults).
fn resources(
    state: &SharedState,
    record: &TemplateRecord,
    build: &TemplateBuildRecord,
) -> (u32, u64, u64) {
    if record.team_id.is_none() {
        let r = state.config.resources;
        (r.cpu_count, r.memory_mb, r.disk_size_mb)
    } else {
        (build.cpu_count, build.memory_mb, build.disk_size_mb)
    }
}

fn to_api(
    state: &SharedState,
    team: &Team,
    record: &TemplateRecord,
) -> Result<Template, HttpError> {
    let build = reported_build(state, record)?;
    let latest = state
        .store
        .list_template_builds(&record.id, 1, None)?
        .0
        .into_iter()
        .next();
    let (cpu_count, memory_mb, disk_size_mb) = match &build {
        Some(build) => resources(state, record, build),
        None => {
            let r = state.config.resources;
            (r.cpu_count, r.memory_mb, r.disk_size_mb)
        }
    };
    Ok(Template {
        template_id: record.id.clone(),
        build_id: build.as_ref().map(|b| b.id.clone()).unwrap_or_default(),
        cpu_count,
        memory_mb,
        disk_size_mb,
        public: record.public,
        aliases: vec![record.alias.clone()],
        names: templates::names_of(team, record),
        created_at: record.created_at,
        updated_at: record.updated_at,
        created_by: None,
        last_spawned_at: record.last_spawned_at,
        spawn_count: record.spawn_count,
        build_count: record.build_count,
        envd_version: ENVD_VERSION.into(),
        build_status: latest
            .map(|b| build_status(b.status))
            .unwrap_or(TemplateBuildStatus::Waiting),
    })
}

/// Query of the template listings.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TemplatesQuery {
    /// Ignored: the API key's team is listed.
    #[serde(rename = "teamID")]
    #[allow(dead_code)]
    team_id: Option<String>,
    /// Cursor from a previous page's `X-Next-Token`.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    /// Page size, 1..=100 (default 100).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
}

fn check_limit(limit: Option<i64>) -> Result<usize, HttpError> {
    let limit = limit.unwrap_or(100);
    if !(1..=100).contains(&limit) {
        return Err(
            ApiError::BadRequest(format!("limit must be between 1 and 100, got {limit}")).into(),
        );
    }
    Ok(limit as usize)
}

fn next_token_header(next: Option<String>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(value) = next.and_then(|token| HeaderValue::from_str(&token).ok()) {
        headers.insert("x-next-token", value);
    }
    headers
}

/// Templates installed on this host and the team's own (newest first), paged.
#[utoipa::path(get, path = "/v2/templates", tag = "templates", params(TemplatesQuery),
    responses(
        (status = 200, body = Vec<Template>, description = "Installed and the team's templates",
            headers(("X-Next-Token" = String, description = "Cursor of the next page, when there is one"))),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_templates_v2(
    State(state): State<SharedState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<TemplatesQuery>,
) -> Result<Response, HttpError> {
    let limit = check_limit(query.limit)?;
    let (page, next) =
        state
            .store
            .list_templates(&caller.team.id, limit, query.next_token.as_deref())?;
    let body = page
        .iter()
        .map(|t| to_api(&state, &caller.team, t))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((next_token_header(next), Json(body)).into_response())
}

/// Templates installed on this host and the team's own (legacy, unpaged).
#[utoipa::path(get, path = "/templates", tag = "templates",
    params(("teamID" = Option<String>, Query, description = "Ignored: the API key's team is listed")),
    responses(
        (status = 200, body = Vec<Template>, description = "Installed and the team's templates"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_templates_v1(
    State(state): State<SharedState>,
    caller: Caller,
) -> Result<Json<Vec<Template>>, HttpError> {
    let mut all = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let (page, next) = state
            .store
            .list_templates(&caller.team.id, 100, token.as_deref())?;
        for template in &page {
            all.push(to_api(&state, &caller.team, template)?);
        }
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    Ok(Json(all))
}

/// Query of `GET /templates/{templateID}`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TemplateBuildsQuery {
    /// Cursor from a previous page's `X-Next-Token`.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    /// Page size of the builds, 1..=100 (default 100).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
}

/// One template (by id or name) with its builds, newest first, paged.
#[utoipa::path(get, path = "/templates/{templateID}", tag = "templates",
    params(("templateID" = String, Path, description = "Template id or name"), TemplateBuildsQuery),
    responses(
        (status = 200, body = TemplateWithBuilds, description = "The template",
            headers(("X-Next-Token" = String, description = "Cursor of the next page of builds"))),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn get_template(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<TemplateBuildsQuery>,
) -> Result<Response, HttpError> {
    let limit = check_limit(query.limit)?;
    let record = templates::find_manageable(&state, &caller.team, &id)?.record;
    let (builds, next) =
        state
            .store
            .list_template_builds(&record.id, limit, query.next_token.as_deref())?;
    let builds = builds
        .iter()
        .map(|build| {
            let (cpu_count, memory_mb, disk_size_mb) = resources(&state, &record, build);
            TemplateBuild {
                build_id: build.id.clone(),
                status: build_status(build.status),
                created_at: build.created_at,
                updated_at: build.updated_at,
                finished_at: build.finished_at,
                cpu_count,
                memory_mb,
                disk_size_mb,
                envd_version: build.envd_version.clone(),
            }
        })
        .collect();
    let body = TemplateWithBuilds {
        template_id: record.id.clone(),
        public: record.public,
        aliases: vec![record.alias.clone()],
        names: templates::names_of(&caller.team, &record),
        created_at: record.created_at,
        updated_at: record.updated_at,
        last_spawned_at: record.last_spawned_at,
        spawn_count: record.spawn_count,
        builds,
    };
    Ok((next_token_header(next), Json(body)).into_response())
}

/// Does a template of this name (`name[:tag]`) exist for the caller? 403 when it is
/// another team's public template, 404 when there is none (or the tag is missing).
#[utoipa::path(get, path = "/templates/aliases/{alias}", tag = "templates",
    params(("alias" = String, Path, description = "Template name, optionally with :tag")),
    responses(
        (status = 200, body = TemplateAliasResponse, description = "The template"),
        (status = 400, body = berth_api::Error, description = "Invalid name"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 403, body = berth_api::Error, description = "Another team's template"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn get_template_alias(
    State(state): State<SharedState>,
    caller: Caller,
    Path(alias): Path<String>,
) -> Result<Json<TemplateAliasResponse>, HttpError> {
    let name = templates::parse_name(&alias).map_err(ServiceError::InvalidName)?;
    name.require_namespace(&templates::team_slug(&caller.team.name))
        .map_err(ServiceError::InvalidName)?;
    let visible = templates::find(&state, &caller.team, &name)?
        .ok_or_else(|| ServiceError::TemplateNotFound(alias.clone()))?;
    if visible.access == Access::Public {
        return Err(
            ApiError::Forbidden(format!("template \"{alias}\" belongs to another team")).into(),
        );
    }
    if alias.contains(':') {
        let tag = name.tag_or_default();
        if state
            .store
            .template_build_by_tag(&visible.record.id, tag)?
            .is_none()
        {
            return Err(ServiceError::TagNotFound {
                template: alias.clone(),
                tag: tag.to_string(),
            }
            .into());
        }
    }
    Ok(Json(TemplateAliasResponse {
        template_id: visible.record.id,
        public: visible.record.public,
    }))
}

async fn update(
    state: &SharedState,
    caller: &Caller,
    id: &str,
    body: TemplateUpdateRequest,
) -> Result<TemplateRecord, HttpError> {
    let record = templates::find_owned(state, &caller.team, id)?;
    if let Some(public) = body.public {
        state.store.set_template_public(&record.id, public)?;
    }
    Ok(record)
}

/// Make the caller's template public (usable by every team) or private.
#[utoipa::path(patch, path = "/templates/{templateID}", tag = "templates",
    params(("templateID" = String, Path, description = "Template id or name")),
    request_body = TemplateUpdateRequest,
    responses(
        (status = 200, description = "Updated"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 403, body = berth_api::Error, description = "Installed on this host"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn update_template_v1(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<TemplateUpdateRequest>,
) -> Result<(), HttpError> {
    update(&state, &caller, &id, body).await.map(drop)
}

/// Make the caller's template public or private; answers its names.
#[utoipa::path(patch, path = "/v2/templates/{templateID}", tag = "templates",
    params(("templateID" = String, Path, description = "Template id or name")),
    request_body = TemplateUpdateRequest,
    responses(
        (status = 200, body = TemplateUpdateResponse, description = "Updated"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 403, body = berth_api::Error, description = "Installed on this host"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn update_template_v2(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<TemplateUpdateRequest>,
) -> Result<Json<TemplateUpdateResponse>, HttpError> {
    let record = update(&state, &caller, &id, body).await?;
    Ok(Json(TemplateUpdateResponse {
        names: templates::names_of(&caller.team, &record),
    }))
}
