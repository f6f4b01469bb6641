//! The one error type every API handler returns, and its single mapping to an HTTP status
//! and the `{code, message}` body E2B clients parse.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Error body of every non-2xx API response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Error {
    /// HTTP status code, repeated in the body.
    pub code: u16,
    /// What went wrong, for humans.
    pub message: String,
}

/// Everything an API call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// A feature of E2B's API that berth does not provide yet; the message names it.
    #[error("{0} is not implemented by berth yet")]
    NotImplemented(String),
    /// A team quota (e.g. concurrent sandboxes) is used up; E2B answers 429.
    #[error("{0}")]
    TooManyRequests(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized(_) => 401,
            ApiError::Forbidden(_) => 403,
            ApiError::NotFound(_) => 404,
            ApiError::Conflict(_) => 409,
            ApiError::PayloadTooLarge { .. } => 413,
            ApiError::TooManyRequests(_) => 429,
            ApiError::Internal(_) => 500,
            ApiError::NotImplemented(_) => 501,
            ApiError::Unavailable(_) => 503,
        }
    }

    /// The wire body for this error.
    pub fn body(&self) -> Error {
        Error {
            code: self.status(),
            message: self.to_string(),
        }
    }

    /// The 404 for a sandbox that does not exist or belongs to another team (the two are
    /// indistinguishable on purpose).
    pub fn sandbox_not_found(id: &str) -> Self {
        ApiError::NotFound(format!(
            "sandbox \"{id}\" doesn't exist or you don't have access to it"
        ))
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        let status = axum::http::StatusCode::from_u16(self.status())
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_repeats_status_and_names_the_missing_feature() {
        let err = ApiError::NotImplemented("pausing sandboxes".into());
        assert_eq!(err.status(), 501);
        let body = serde_json::to_value(err.body()).unwrap();
        assert_eq!(body["code"], 501);
        assert_eq!(
            body["message"],
            "pausing sandboxes is not implemented by berth yet"
        );
    }

    #[test]
    fn every_variant_maps_to_an_error_status() {
        let all = [
            ApiError::BadRequest(String::new()),
            ApiError::Unauthorized(String::new()),
            ApiError::Forbidden(String::new()),
            ApiError::NotFound(String::new()),
            ApiError::Conflict(String::new()),
            ApiError::PayloadTooLarge { limit: 1 },
            ApiError::NotImplemented(String::new()),
            ApiError::Unavailable(String::new()),
            ApiError::TooManyRequests(String::new()),
            ApiError::Internal(String::new()),
        ];
        for err in all {
            assert!((400..600).contains(&err.status()), "{err:?}");
        }
    }
}
