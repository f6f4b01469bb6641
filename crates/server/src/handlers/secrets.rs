//! Secret routes: `POST /secrets`, `GET /secrets` (paged), `GET /secrets/{id or name}`,
//! `POST /secrets/{id or name}` (a new version), `DELETE /secrets/{id or name}`. Values
//! are write-only: requests carry them, no response does, and nothing here logs a body.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_api::{ApiError, NewSecret, Secret, SecretUpdate};
use berth_store::SecretRecord;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::HttpError;
use crate::extract::{ApiJson, ApiQuery};
use crate::secrets::{self, canonical_name, lookup_key, validate_metadata, validate_value};
use crate::SharedState;

fn secret_response(record: &SecretRecord) -> Secret {
    Secret {
        secret_id: record.id.clone(),
        name: record.name.clone(),
        current_version: record.current_version,
        metadata: record.metadata.clone(),
        created_at: record.created_at,
        updated_at: record.updated_at,
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "secret \"{id}\" doesn't exist or you don't have access to it"
    ))
}

/// Create a secret; its value is stored sealed as version 1.
#[utoipa::path(post, path = "/secrets", tag = "secrets", request_body = NewSecret,
    responses(
        (status = 201, body = Secret, description = "The secret was created (metadata only)"),
        (status = 400, body = berth_api::Error, description = "Bad name, value or metadata"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 409, body = berth_api::Error, description = "The team has a secret of that name"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn create_secret(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(body): ApiJson<NewSecret>,
) -> Result<(StatusCode, Json<Secret>), HttpError> {
    let name = canonical_name(&body.name)?;
    validate_value(&body.value)?;
    let metadata = body.metadata.unwrap_or_default();
    validate_metadata(&metadata)?;
    let record = secrets::create(
        &state.store,
        &state.secrets,
        &caller.team.id,
        &name,
        &body.value,
        &metadata,
    )?;
    Ok((StatusCode::CREATED, Json(secret_response(&record))))
}

/// Query of `GET /secrets`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SecretsQuery {
    /// Page size, 1..=100 (default 100).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
    /// Cursor from a previous page's `X-Next-Token`.
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// The team's secrets (metadata only), newest first.
#[utoipa::path(get, path = "/secrets", tag = "secrets", params(SecretsQuery),
    responses(
        (status = 200, body = Vec<Secret>, description = "The team's secrets",
            headers(("X-Next-Token" = String, description = "Cursor of the next page, when there is one"))),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_secrets(
    State(state): State<SharedState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<SecretsQuery>,
) -> Result<Response, HttpError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=100).contains(&limit) {
        return Err(
            ApiError::BadRequest(format!("limit must be between 1 and 100, got {limit}")).into(),
        );
    }
    let page =
        state
            .store
            .list_secrets(&caller.team.id, limit as usize, query.next_token.as_deref())?;
    let mut headers = HeaderMap::new();
    if let Some(value) = page
        .next_token
        .and_then(|token| HeaderValue::from_str(&token).ok())
    {
        headers.insert("x-next-token", value);
    }
    let body: Vec<Secret> = page.secrets.iter().map(secret_response).collect();
    Ok((headers, Json(body)).into_response())
}

/// One secret's metadata, by id or name.
#[utoipa::path(get, path = "/secrets/{secretID}", tag = "secrets",
    params(("secretID" = String, Path, description = "Secret id (sec_…) or name")),
    responses(
        (status = 200, body = Secret, description = "The secret (metadata only)"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such secret"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn get_secret(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Secret>, HttpError> {
    let record = state
        .store
        .secret(&caller.team.id, &lookup_key(&id))?
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(secret_response(&record)))
}

/// Store a new version of a secret's value (and, if given, replace its metadata).
#[utoipa::path(post, path = "/secrets/{secretID}", tag = "secrets", request_body = SecretUpdate,
    params(("secretID" = String, Path, description = "Secret id (sec_…) or name")),
    responses(
        (status = 200, body = Secret, description = "The updated secret (metadata only)"),
        (status = 400, body = berth_api::Error, description = "Bad value or metadata"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such secret"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn update_secret(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SecretUpdate>,
) -> Result<Json<Secret>, HttpError> {
    validate_value(&body.value)?;
    if let Some(metadata) = &body.metadata {
        validate_metadata(metadata)?;
    }
    let key = lookup_key(&id);
    if state.store.secret(&caller.team.id, &key)?.is_none() {
        return Err(not_found(&id).into());
    }
    let record = secrets::update(
        &state.store,
        &state.secrets,
        &caller.team.id,
        &key,
        &body.value,
        body.metadata.as_ref(),
    )?;
    Ok(Json(secret_response(&record)))
}

/// Delete a secret and all its versions.
#[utoipa::path(delete, path = "/secrets/{secretID}", tag = "secrets",
    params(("secretID" = String, Path, description = "Secret id (sec_…) or name")),
    responses(
        (status = 204, description = "The secret was deleted"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such secret"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn delete_secret(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    match state.store.delete_secret(&caller.team.id, &lookup_key(&id)) {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(berth_store::StoreError::NotFound { .. }) => Err(not_found(&id).into()),
        Err(err) => Err(err.into()),
    }
}
