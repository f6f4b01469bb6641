//! The HTTP API the code-interpreter SDKs call, and the one mapping of errors to HTTP.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::context::Registry;
use crate::envd::EnvdClient;
use crate::error::{InterpreterError, KernelError, RequestError};
use crate::language::{check_env_name, check_env_value, Language};

/// Lines buffered between a kernel and a slow client before the execution waits.
const STREAM_BUFFER: usize = 256;
/// Code and env vars of one request; notebooks cells are far smaller.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

pub struct AppState {
    pub registry: Registry,
    pub envd: Option<EnvdClient>,
    /// False until the warm-up contexts are running; `/health` says 503 until then.
    pub ready: AtomicBool,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}", delete(remove_context))
        .route("/contexts/{id}/restart", post(restart_context))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // E2B's server allows any origin: the JS SDK runs in browsers too.
        .layer(tower_http::cors::CorsLayer::very_permissive())
        .with_state(state)
}

/// The single place an error becomes a status code and a plain-text message.
pub struct ApiError(InterpreterError);

impl<E: Into<InterpreterError>> From<E> for ApiError {
    fn from(error: E) -> ApiError {
        ApiError(error.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            InterpreterError::Request(RequestError::UnknownContext { .. }) => StatusCode::NOT_FOUND,
            InterpreterError::Request(_) => StatusCode::BAD_REQUEST,
            InterpreterError::Kernel(KernelError::NotInstalled { .. }) => StatusCode::BAD_REQUEST,
            InterpreterError::Kernel(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            tracing::error!(error = %self.0, "request failed");
        } else {
            tracing::info!(error = %self.0, %status, "request refused");
        }
        (status, self.0.to_string()).into_response()
    }
}

fn parse_body<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, RequestError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|error| RequestError::InvalidJson {
        detail: error.to_string(),
    })
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.ready.load(Ordering::Acquire) {
        Json("OK").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting kernels").into_response()
    }
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "no such route: the interpreter serves /health, /execute and /contexts",
    )
        .into_response()
}

#[derive(Debug, Default, Deserialize)]
struct ExecuteBody {
    code: Option<String>,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

async fn execute(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ExecuteBody = parse_body(&body)?;
    let code = request.code.ok_or_else(|| RequestError::InvalidJson {
        detail: "missing field `code`".into(),
    })?;
    let env = request.env_vars.unwrap_or_default();
    for (name, value) in &env {
        check_env_name(name)?;
        check_env_value(name, value)?;
    }
    let context = match (request.context_id, request.language) {
        (Some(_), Some(_)) => return Err(RequestError::ContextAndLanguage.into()),
        (Some(id), None) => state.registry.get(&id)?,
        (None, Some(language)) => {
            state
                .registry
                .default_for(Language::parse(&language)?)
                .await?
        }
        (None, None) => state.registry.default_for(Language::Python).await?,
    };
    let access_token = headers
        .get("x-access-token")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let (sink, lines) = tokio::sync::mpsc::channel::<Bytes>(STREAM_BUFFER);
    let state_for_task = state.clone();
    tokio::spawn(async move {
        let sandbox_env = match &state_for_task.envd {
            Some(envd) => envd.sandbox_env(access_token.as_deref()).await,
            None => None,
        };
        context
            .execute(
                state_for_task.registry.settings(),
                &code,
                &env,
                sandbox_env,
                &sink,
            )
            .await;
    });
    let body = Body::from_stream(ReceiverStream::new(lines).map(Ok::<_, Infallible>));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

#[derive(Debug, Default, Deserialize)]
struct CreateContextBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

async fn create_context(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CreateContextBody = parse_body(&body)?;
    let language = match request.language.as_deref() {
        Some(language) if !language.trim().is_empty() => Language::parse(language)?,
        _ => Language::Python,
    };
    let context = state.registry.create(language, request.cwd).await?;
    Ok(Json(context.info()).into_response())
}

async fn list_contexts(State(state): State<Arc<AppState>>) -> Response {
    Json(state.registry.list()).into_response()
}

async fn remove_context(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.registry.remove(&id).await?;
    Ok(Json(serde_json::Value::Null).into_response())
}

async fn restart_context(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.registry.restart(&id).await?;
    Ok(Json(serde_json::Value::Null).into_response())
}
