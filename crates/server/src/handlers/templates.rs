//! Template routes, read side: the templates installed in the template store. Every team
//! sees them all (they are public on this host).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_api::{
    ApiError, Template, TemplateAliasResponse, TemplateBuild, TemplateBuildStatus,
    TemplateWithBuilds,
};
use serde::Deserialize;
use time::OffsetDateTime;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::HttpError;
use crate::extract::ApiQuery;
use crate::sandboxes::{self, build_id};
use crate::ServiceError;
use crate::{SharedState, ENVD_VERSION};

async fn installed(state: &SharedState) -> Result<Vec<berth_template::Template>, HttpError> {
    let store = state.templates.clone();
    let listed = tokio::task::spawn_blocking(move || store.list())
        .await
        .map_err(|source| ServiceError::Task {
            what: "template listing",
            source,
        })?;
    Ok(listed.map_err(ServiceError::TemplateListing)?)
}

async fn one(state: &SharedState, id: &str) -> Result<berth_template::Template, HttpError> {
    match sandboxes::load_template(state, id).await {
        Ok(template) => Ok(template),
        // An invalid name cannot name an installed template: same answer as unknown.
        Err(ServiceError::InvalidTemplate { .. }) => {
            Err(ServiceError::TemplateNotFound(id.to_string()).into())
        }
        Err(err) => Err(err.into()),
    }
}

fn created(template: &berth_template::Template) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(template.created_at as i64)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn to_api(state: &SharedState, template: &berth_template::Template) -> Template {
    let resources = state.config.resources;
    Template {
        template_id: template.id.clone(),
        build_id: build_id(&template.layer_ids),
        cpu_count: resources.cpu_count,
        memory_mb: resources.memory_mb,
        disk_size_mb: resources.disk_size_mb,
        public: true,
        aliases: vec![template.id.clone()],
        names: vec![template.id.clone()],
        created_at: created(template),
        updated_at: created(template),
        created_by: None,
        last_spawned_at: None,
        spawn_count: 0,
        build_count: 1,
        envd_version: ENVD_VERSION.into(),
        build_status: TemplateBuildStatus::Ready,
    }
}

/// Query of the template listings.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TemplatesQuery {
    /// Cursor from a previous page's `X-Next-Token`.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    /// Page size, 1..=100 (default 100).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
}

/// Installed templates, paged.
#[utoipa::path(get, path = "/v2/templates", tag = "templates", params(TemplatesQuery),
    responses(
        (status = 200, body = Vec<Template>, description = "Installed templates",
            headers(("X-Next-Token" = String, description = "Cursor of the next page, when there is one"))),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_templates_v2(
    State(state): State<SharedState>,
    _caller: Caller,
    ApiQuery(query): ApiQuery<TemplatesQuery>,
) -> Result<Response, HttpError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and 100, got {limit}"
        )).into());
    }
    let all = installed(&state).await?;
    // Listed by id; the cursor is the last id of the previous page.
    let start = match &query.next_token {
        Some(token) => all.iter().position(|t| t.id > *token).unwrap_or(all.len()),
        None => 0,
    };
    let page: Vec<_> = all.iter().skip(start).take(limit as usize).collect();
    let mut headers = HeaderMap::new();
    if start + page.len() < all.len() {
        if let Some(last) = page.last() {
            if let Ok(value) = HeaderValue::from_str(&last.id) {
                headers.insert("x-next-token", value);
            }
        }
    }
    let body: Vec<Template> = page.iter().map(|t| to_api(&state, t)).collect();
    Ok((headers, Json(body)).into_response())
}

/// Installed templates (legacy, unpaged).
#[utoipa::path(get, path = "/templates", tag = "templates",
    responses(
        (status = 200, body = Vec<Template>, description = "Installed templates"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_templates_v1(
    State(state): State<SharedState>,
    _caller: Caller,
) -> Result<Json<Vec<Template>>, HttpError> {
    let all = installed(&state).await?;
    Ok(Json(all.iter().map(|t| to_api(&state, t)).collect()))
}

/// Query of `GET /templates/{templateID}`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TemplateBuildsQuery {
    /// Cursor; every template here has exactly one build, so it is never needed.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    /// Page size, 1..=100 (default 100).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
}

/// One template with its builds.
#[utoipa::path(get, path = "/templates/{templateID}", tag = "templates",
    params(("templateID" = String, Path, description = "Template id"), TemplateBuildsQuery),
    responses(
        (status = 200, body = TemplateWithBuilds, description = "The template"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn get_template(
    State(state): State<SharedState>,
    _caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<TemplateBuildsQuery>,
) -> Result<Json<TemplateWithBuilds>, HttpError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and 100, got {limit}"
        )).into());
    }
    let template = one(&state, &id).await?;
    let resources = state.config.resources;
    let at = created(&template);
    let builds = if query.next_token.is_some() {
        Vec::new()
    } else {
        vec![TemplateBuild {
            build_id: build_id(&template.layer_ids),
            status: TemplateBuildStatus::Ready,
            created_at: at,
            updated_at: at,
            cpu_count: resources.cpu_count,
            memory_mb: resources.memory_mb,
            disk_size_mb: resources.disk_size_mb,
            envd_version: ENVD_VERSION.into(),
        }]
    };
    Ok(Json(TemplateWithBuilds {
        template_id: template.id.clone(),
        public: true,
        aliases: vec![template.id.clone()],
        names: vec![template.id.clone()],
        created_at: at,
        updated_at: at,
        last_spawned_at: None,
        spawn_count: 0,
        builds,
    }))
}

/// Look a template up by alias (here, its name).
#[utoipa::path(get, path = "/templates/aliases/{alias}", tag = "templates",
    params(("alias" = String, Path, description = "Template alias")),
    responses(
        (status = 200, body = TemplateAliasResponse, description = "The template"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such template"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn get_template_alias(
    State(state): State<SharedState>,
    _caller: Caller,
    Path(alias): Path<String>,
) -> Result<Json<TemplateAliasResponse>, HttpError> {
    let template = one(&state, &alias).await?;
    Ok(Json(TemplateAliasResponse {
        template_id: template.id,
        public: true,
    }))
}
