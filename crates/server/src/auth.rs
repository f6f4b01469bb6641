//! API-key authentication: every route but `/health` and `/openapi.json` needs a valid
//! `X-API-Key`, and the key's team scopes everything the request can see.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use berth_api::ApiError;
use berth_store::{ApiKeyRecord, Team};

use crate::SharedState;

pub const API_KEY_HEADER: &str = "x-api-key";

/// The authenticated caller.
pub struct Caller {
    pub team: Team,
    pub key: ApiKeyRecord,
}

impl FromRequestParts<SharedState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<Self, Self::Rejection> {
        authenticate(state, &parts.headers)
    }
}

/// The caller `headers` identify by their `X-API-Key`.
pub(crate) fn authenticate(
    state: &crate::AppState,
    headers: &axum::http::HeaderMap,
) -> Result<Caller, ApiError> {
    let raw = headers
        .get(API_KEY_HEADER)
        .ok_or_else(|| ApiError::Unauthorized("missing X-API-Key header".into()))?
        .to_str()
        .map_err(|_| ApiError::Unauthorized("invalid API key".into()))?;
    match state.store.authenticate(raw.trim()) {
        Ok(Some((team, key))) => Ok(Caller { team, key }),
        Ok(None) => Err(ApiError::Unauthorized("invalid API key".into())),
        Err(err) => Err(ApiError::Internal(format!("checking the API key: {err}"))),
    }
}
