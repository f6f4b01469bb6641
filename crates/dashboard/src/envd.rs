//! Files of a sandbox through its envd: directory listings, downloads and uploads.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest as _, Multipart, Path, Query, Request, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use berth_envd_proto::headers::CONNECT_PROTOCOL_VERSION;
use berth_envd_proto::routes;
use http_body_util::BodyExt;
use serde::Deserialize;

use crate::error::DashboardError;
use crate::session::{Session, CSRF_HEADER};
use crate::upstream::{api_message, Upstream};
use crate::Shared;

#[derive(Deserialize)]
pub struct PathQuery {
    path: String,
}

/// The session and the sandbox's envd access token, or why not.
pub async fn open(
    state: &Shared,
    headers: &HeaderMap,
    id: &str,
) -> Result<(std::sync::Arc<Session>, Option<String>), DashboardError> {
    let session = state
        .sessions
        .find(headers)
        .ok_or(DashboardError::SignedOut)?;
    let sandbox = state.upstream.sandbox(&session.api_key, id).await?;
    let token = sandbox
        .get("envdAccessToken")
        .and_then(|token| token.as_str())
        .map(str::to_owned);
    Ok((session, token))
}

fn files_query(path: &str) -> String {
    serde_urlencoded::to_string([("path", path)]).expect("a string pair always encodes")
}

async fn envd_failure(response: Response) -> DashboardError {
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|body| body.to_bytes())
        .unwrap_or_default();
    DashboardError::Envd {
        status,
        message: api_message(&body),
    }
}

/// `GET files/list?path=`: envd's `ListDir` of one level, as envd's JSON.
pub async fn list_dir(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, DashboardError> {
    let (_, token) = open(&state, &headers, &id).await?;
    let body = serde_json::json!({ "path": query.path, "depth": 1 });
    let request = Upstream::envd_request(
        &id,
        token.as_deref(),
        Method::POST,
        routes::FILESYSTEM_LIST_DIR,
    )
    .header(CONTENT_TYPE, "application/json")
    .header(CONNECT_PROTOCOL_VERSION, "1")
    .body(Body::from(body.to_string()))
    .map_err(|_| DashboardError::BadPath)?;
    let response = state.upstream.call(request).await;
    if response.status() != StatusCode::OK {
        return Err(envd_failure(response).await);
    }
    Ok((
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        response.into_body(),
    )
        .into_response())
}

/// `GET files?path=`: the file, streamed, as an attachment.
pub async fn download(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, DashboardError> {
    let (_, token) = open(&state, &headers, &id).await?;
    let request = Upstream::envd_request(
        &id,
        token.as_deref(),
        Method::GET,
        &format!("/files?{}", files_query(&query.path)),
    )
    .body(Body::empty())
    .map_err(|_| DashboardError::BadPath)?;
    let response = state.upstream.call(request).await;
    if response.status() != StatusCode::OK {
        return Err(envd_failure(response).await);
    }
    let name = query.path.rsplit('/').next().unwrap_or("download");
    let disposition = format!(
        "attachment; filename=\"{}\"",
        name.replace(
            |ch: char| !ch.is_ascii_graphic() || ch == '"' || ch == '\\',
            "_"
        )
    );
    let mut out = Response::new(Body::new(response.into_body()));
    let out_headers = out.headers_mut();
    out_headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(value) = HeaderValue::from_str(&disposition) {
        out_headers.insert(CONTENT_DISPOSITION, value);
    }
    Ok(out)
}

/// `POST files?path=` (multipart, field `file`; CSRF header): writes the file at `path`.
pub async fn upload(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
    request: Request,
) -> Result<Response, DashboardError> {
    let (session, token) = open(&state, request.headers(), &id).await?;
    let offered = request
        .headers()
        .get(CSRF_HEADER)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if !session.csrf_matches(offered) {
        return Err(DashboardError::Csrf);
    }
    let mut form = Multipart::from_request(request, &())
        .await
        .map_err(|_| DashboardError::NoUploadFile)?;
    let mut content = None;
    while let Some(field) = form.next_field().await.map_err(DashboardError::Upload)? {
        if field.name() == Some("file") {
            content = Some(field.bytes().await.map_err(DashboardError::Upload)?);
            break;
        }
    }
    let content = content.ok_or(DashboardError::NoUploadFile)?;
    let boundary = crate::session::random_token();
    let body = multipart_file(&boundary, &content);
    let request = Upstream::envd_request(
        &id,
        token.as_deref(),
        Method::POST,
        &format!("/files?{}", files_query(&query.path)),
    )
    .header(
        CONTENT_TYPE,
        format!("multipart/form-data; boundary={boundary}"),
    )
    .header(CONTENT_LENGTH, body.len())
    .body(Body::from(body))
    .map_err(|_| DashboardError::BadPath)?;
    let response = state.upstream.call(request).await;
    if response.status() != StatusCode::OK {
        return Err(envd_failure(response).await);
    }
    Ok((
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        response.into_body(),
    )
        .into_response())
}

/// A multipart body of one `file` part (the file name is envd's business: it writes to
/// the `path` query).
fn multipart_file(boundary: &str, content: &Bytes) -> Bytes {
    let mut body = Vec::with_capacity(content.len() + 256);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"upload\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_query_encoded() {
        assert_eq!(
            files_query("/home/user/a b&c"),
            "path=%2Fhome%2Fuser%2Fa+b%26c"
        );
    }

    #[test]
    fn multipart_body_frames_the_content() {
        let body = multipart_file("xyz", &Bytes::from_static(b"hello"));
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.starts_with("--xyz\r\n"));
        assert!(text.contains("name=\"file\""));
        assert!(text.ends_with("\r\nhello\r\n--xyz--\r\n"));
    }
}
