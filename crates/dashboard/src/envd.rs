//! Files of a sandbox through its envd: directory listings, downloads and uploads.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest as _, Multipart, Path, Query, Request, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use berth_envd_proto::headers::CONNECT_PROTOCOL_VERSION;
use berth_envd_proto::routes;
use futures::SinkExt;
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

/// `POST files?path=` (multipart, field `file`; CSRF header): writes the file at `path`,
/// streaming it through.
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
    let form = Multipart::from_request(request, &())
        .await
        .map_err(|_| DashboardError::NoUploadFile)?;
    let boundary = crate::session::random_token();
    let body = stream_file_part(form, &boundary).await?;
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
    .body(body)
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

/// The browser's `file` part re-framed as a one-part multipart body for envd, streamed
/// as it arrives (an upload is never held whole in memory). Fails before anything is
/// sent when the form has no `file` part.
async fn stream_file_part(mut form: Multipart, boundary: &str) -> Result<Body, DashboardError> {
    let (mut chunks, body) = futures::channel::mpsc::channel::<Result<Bytes, axum::Error>>(4);
    let (found_tx, found) = tokio::sync::oneshot::channel();
    let (head, tail) = part_frame(boundary);
    tokio::spawn(async move {
        let mut found_tx = Some(found_tx);
        let mut report = |outcome: Result<(), DashboardError>| {
            if let Some(found_tx) = found_tx.take() {
                let _ = found_tx.send(outcome);
            }
        };
        loop {
            match form.next_field().await {
                Ok(Some(mut field)) if field.name() == Some("file") => {
                    report(Ok(()));
                    if chunks.send(Ok(head)).await.is_err() {
                        return;
                    }
                    loop {
                        match field.chunk().await {
                            Ok(Some(chunk)) => {
                                if chunks.send(Ok(chunk)).await.is_err() {
                                    return;
                                }
                            }
                            Ok(None) => break,
                            // envd sees a cut body and writes nothing.
                            Err(error) => {
                                let _ = chunks.send(Err(axum::Error::new(error))).await;
                                return;
                            }
                        }
                    }
                    let _ = chunks.send(Ok(tail)).await;
                    return;
                }
                Ok(Some(_)) => continue,
                Ok(None) => return report(Err(DashboardError::NoUploadFile)),
                Err(error) => return report(Err(DashboardError::Upload(error))),
            }
        }
    });
    found.await.map_err(|_| DashboardError::NoUploadFile)??;
    Ok(Body::from_stream(body))
}

/// What goes before and after the content of a one-part multipart body (the file name
/// is envd's business: it writes to the `path` query).
fn part_frame(boundary: &str) -> (Bytes, Bytes) {
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"upload\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    (head.into(), tail.into())
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
    fn part_frame_wraps_the_content() {
        let (head, tail) = part_frame("xyz");
        let text = format!(
            "{}hello{}",
            std::str::from_utf8(&head).unwrap(),
            std::str::from_utf8(&tail).unwrap()
        );
        assert!(text.starts_with("--xyz\r\n"));
        assert!(text.contains("name=\"file\""));
        assert!(text.ends_with("\r\n\r\nhello\r\n--xyz--\r\n"));
    }
}
