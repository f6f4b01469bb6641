//! The dashboard's errors and their one mapping to HTTP.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("not signed in: sign in at /dashboard/login")]
    SignedOut,
    #[error("missing or wrong CSRF token: reload the page and try again")]
    Csrf,
    #[error("no such sandbox, or it belongs to another team")]
    NotFound,
    #[error("that path cannot be relayed to the API")]
    BadPath,
    #[error("request body too large")]
    TooLarge,
    #[error("the API answered {status}: {message}")]
    Api { status: StatusCode, message: String },
    #[error("envd answered {status}: {message}")]
    Envd { status: StatusCode, message: String },
    #[error("reading the control plane's answer: {0}")]
    UpstreamBody(axum::Error),
    #[error("decoding the control plane's answer: {0}")]
    Decode(serde_json::Error),
    #[error("reading the upload: {0}")]
    Upload(axum::extract::multipart::MultipartError),
    #[error("the upload has no `file` part with a name")]
    NoUploadFile,
}

impl DashboardError {
    pub fn status(&self) -> StatusCode {
        match self {
            DashboardError::SignedOut => StatusCode::UNAUTHORIZED,
            DashboardError::Csrf => StatusCode::FORBIDDEN,
            DashboardError::NotFound => StatusCode::NOT_FOUND,
            DashboardError::BadPath | DashboardError::NoUploadFile => StatusCode::BAD_REQUEST,
            DashboardError::Upload(error) => error.status(),
            DashboardError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            DashboardError::Api { status, .. } | DashboardError::Envd { status, .. } => *status,
            DashboardError::UpstreamBody(_) | DashboardError::Decode(_) => StatusCode::BAD_GATEWAY,
        }
    }
}

impl IntoResponse for DashboardError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "dashboard request failed");
        }
        (
            status,
            axum::Json(serde_json::json!({ "code": status.as_u16(), "message": self.to_string() })),
        )
            .into_response()
    }
}
