//! API key routes: a team manages its own keys; raw keys are shown only on creation.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use berth_api::{
    ApiError, CreatedTeamApiKey, IdentifierMaskingDetails, NewTeamApiKey, TeamApiKey,
    UpdateTeamApiKey,
};
use berth_store::{ApiKeyRecord, KeyMask, API_KEY_PREFIX};

use crate::auth::Caller;
use crate::error::HttpError;
use crate::extract::ApiJson;
use crate::SharedState;

fn mask(mask: &KeyMask) -> IdentifierMaskingDetails {
    IdentifierMaskingDetails {
        prefix: API_KEY_PREFIX.into(),
        value_length: mask.value_length,
        masked_value_prefix: mask.masked_prefix.clone(),
        masked_value_suffix: mask.masked_suffix.clone(),
    }
}

fn to_api(record: &ApiKeyRecord) -> TeamApiKey {
    TeamApiKey {
        id: record.id.clone(),
        name: record.name.clone(),
        mask: mask(&record.mask),
        created_at: record.created_at,
        created_by: None,
        last_used: record.last_used,
    }
}

fn check_name(name: &str) -> Result<(), HttpError> {
    if name.trim().is_empty() || name.len() > 256 {
        return Err(ApiError::BadRequest(
            "name must be 1 to 256 characters and not blank".into(),
        ).into());
    }
    Ok(())
}

/// Keys of the caller's team.
#[utoipa::path(get, path = "/api-keys", tag = "api-keys",
    responses(
        (status = 200, body = Vec<TeamApiKey>, description = "The team's keys"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_keys(
    State(state): State<SharedState>,
    caller: Caller,
) -> Result<Json<Vec<TeamApiKey>>, HttpError> {
    let keys = state
        .store
        .list_api_keys(&caller.team.id)?;
    Ok(Json(keys.iter().map(to_api).collect()))
}

/// Create a key for the caller's team; the response is the only place its value appears.
#[utoipa::path(post, path = "/api-keys", tag = "api-keys", request_body = NewTeamApiKey,
    responses(
        (status = 201, body = CreatedTeamApiKey, description = "The new key"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn create_key(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(body): ApiJson<NewTeamApiKey>,
) -> Result<(StatusCode, Json<CreatedTeamApiKey>), HttpError> {
    check_name(&body.name)?;
    let (record, raw) = state
        .store
        .create_api_key(&caller.team.id, &body.name)?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedTeamApiKey {
            id: record.id.clone(),
            key: raw,
            mask: mask(&record.mask),
            name: record.name.clone(),
            created_at: record.created_at,
            created_by: None,
            last_used: None,
        }),
    ))
}

/// Rename a key of the caller's team.
#[utoipa::path(patch, path = "/api-keys/{apiKeyID}", tag = "api-keys",
    params(("apiKeyID" = String, Path, description = "Key id")),
    request_body = UpdateTeamApiKey,
    responses(
        (status = 200, description = "The key was renamed"),
        (status = 400, body = berth_api::Error, description = "Bad request"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn update_key(
    State(state): State<SharedState>,
    caller: Caller,
    Path(key_id): Path<String>,
    ApiJson(body): ApiJson<UpdateTeamApiKey>,
) -> Result<StatusCode, HttpError> {
    check_name(&body.name)?;
    state
        .store
        .rename_api_key(&caller.team.id, &key_id, &body.name)?;
    Ok(StatusCode::OK)
}

/// Delete a key of the caller's team.
#[utoipa::path(delete, path = "/api-keys/{apiKeyID}", tag = "api-keys",
    params(("apiKeyID" = String, Path, description = "Key id")),
    responses(
        (status = 204, description = "The key was deleted"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn delete_key(
    State(state): State<SharedState>,
    caller: Caller,
    Path(key_id): Path<String>,
) -> Result<StatusCode, HttpError> {
    state
        .store
        .delete_api_key(&caller.team.id, &key_id)?;
    Ok(StatusCode::NO_CONTENT)
}
