//! Volume routes: `POST /volumes`, `GET /volumes`, `GET /volumes/{id}` (with the content
//! API token) and `DELETE /volumes/{id}` (409 while a live sandbox mounts it).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use berth_api::{ApiError, NewVolume, Volume, VolumeAndToken};
use berth_store::VolumeRecord;

use crate::auth::Caller;
use crate::error::HttpError;
use crate::extract::ApiJson;
use crate::{volumes, SharedState};

fn with_token(record: &VolumeRecord) -> VolumeAndToken {
    VolumeAndToken {
        volume_id: record.id.clone(),
        name: record.name.clone(),
        token: record.token.clone(),
        domain: None,
    }
}

/// Create a team volume.
#[utoipa::path(post, path = "/volumes", tag = "volumes", request_body = NewVolume,
    responses(
        (status = 201, body = VolumeAndToken, description = "The volume was created"),
        (status = 400, body = berth_api::Error, description = "Bad name"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 409, body = berth_api::Error, description = "The team has a volume of that name"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn create_volume(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(body): ApiJson<NewVolume>,
) -> Result<(StatusCode, Json<VolumeAndToken>), HttpError> {
    volumes::validate_name(&body.name)?;
    let record = volumes::create(&state, &caller.team.id, &body.name).await?;
    Ok((StatusCode::CREATED, Json(with_token(&record))))
}

/// The team's volumes, oldest first.
#[utoipa::path(get, path = "/volumes", tag = "volumes",
    responses(
        (status = 200, body = Vec<Volume>, description = "The team's volumes"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn list_volumes(
    State(state): State<SharedState>,
    caller: Caller,
) -> Result<Json<Vec<Volume>>, HttpError> {
    let volumes = state.store.list_volumes(&caller.team.id)?;
    Ok(Json(
        volumes
            .into_iter()
            .map(|v| Volume {
                volume_id: v.id,
                name: v.name,
            })
            .collect(),
    ))
}

/// One team volume with its content API token.
#[utoipa::path(get, path = "/volumes/{volumeID}", tag = "volumes",
    params(("volumeID" = String, Path, description = "Volume id")),
    responses(
        (status = 200, body = VolumeAndToken, description = "The volume"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such volume"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn get_volume(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<VolumeAndToken>, HttpError> {
    let record = state
        .store
        .volume(&caller.team.id, &id)?
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(with_token(&record)))
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "volume \"{id}\" doesn't exist or you don't have access to it"
    ))
}

/// Delete a team volume and its data.
#[utoipa::path(delete, path = "/volumes/{volumeID}", tag = "volumes",
    params(("volumeID" = String, Path, description = "Volume id")),
    responses(
        (status = 204, description = "The volume was deleted"),
        (status = 401, body = berth_api::Error, description = "Bad API key"),
        (status = 404, body = berth_api::Error, description = "No such volume"),
        (status = 409, body = berth_api::Error, description = "A running or paused sandbox mounts it"),
    ), security(("ApiKeyAuth" = [])))]
pub async fn delete_volume(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    if state.store.volume(&caller.team.id, &id)?.is_none() {
        return Err(not_found(&id).into());
    }
    volumes::delete(&state, &caller.team.id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
