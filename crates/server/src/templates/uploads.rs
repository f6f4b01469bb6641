//! COPY uploads. `GET /templates/{id}/files/{hash}` answers whether the team already
//! uploaded the tar for that files hash and hands out a URL berth serves itself:
//! `PUT /template-uploads/{templateID}/{hash}?team=…&expires=…&signature=…`, signed
//! with HMAC-SHA256 under a key made at start (links die with the daemon, like E2B's
//! presigned URLs after an hour). The SDKs send no API key with the PUT: the signature
//! is the authorisation, bound to team, template, hash and expiry. The body streams to
//! the build engine's content-addressed upload store (temp file, fsync, rename), so a
//! retried or concurrent upload of one hash is harmless and a cut-off one leaves
//! nothing.

use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use futures::TryStreamExt;
use serde::Deserialize;

use super::{builds, Builds};
use crate::error::{HttpError, ServiceError};
use crate::SharedState;

/// Where uploads are `PUT`.
pub(crate) const UPLOAD_ROUTE: &str = "/template-uploads/{templateID}/{hash}";

/// How long an upload URL stays valid.
const URL_LIFETIME: Duration = Duration::from_secs(3600);

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn message(team: &str, template: &str, hash: &str, expires: u64) -> String {
    format!("berth-upload\n{team}\n{template}\n{hash}\n{expires}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The upload URL for `hash` of template `template` of team `team`, under `base` (the
/// API's public URL).
pub(crate) fn upload_url(
    builds: &Builds,
    base: &str,
    team: &str,
    template: &str,
    hash: &str,
) -> String {
    let expires = now_secs() + URL_LIFETIME.as_secs();
    let tag = ring::hmac::sign(
        &builds.upload_key,
        message(team, template, hash, expires).as_bytes(),
    );
    format!(
        "{}/template-uploads/{template}/{hash}?team={team}&expires={expires}&signature={}",
        base.trim_end_matches('/'),
        hex(tag.as_ref())
    )
}

/// Query of an upload URL.
#[derive(Debug, Deserialize)]
pub(crate) struct UploadQuery {
    team: String,
    expires: u64,
    signature: String,
}

/// Most bytes one upload may have.
pub(crate) const MAX_UPLOAD_BYTES: u64 = 16 * 1024 * 1024 * 1024;

/// `PUT` of a COPY upload to a signed URL.
pub(crate) async fn upload_handler(
    State(state): State<SharedState>,
    Path((template, hash)): Path<(String, String)>,
    Query(query): Query<UploadQuery>,
    body: Body,
) -> Result<StatusCode, HttpError> {
    let builds = builds(&state)?;
    let valid = unhex(&query.signature).is_some_and(|signature| {
        ring::hmac::verify(
            &builds.upload_key,
            message(&query.team, &template, &hash, query.expires).as_bytes(),
            &signature,
        )
        .is_ok()
    });
    if !valid {
        return Err(ServiceError::UploadDenied("the upload URL's signature is not valid").into());
    }
    if query.expires < now_secs() {
        return Err(ServiceError::UploadDenied(
            "the upload URL has expired; ask GET /templates/{id}/files/{hash} for a new one",
        )
        .into());
    }
    let owner = state.store.template(&template)?.and_then(|t| t.team_id);
    if owner.as_deref() != Some(query.team.as_str()) {
        return Err(ServiceError::TemplateNotFound(template).into());
    }
    let files = builds.engine.files().clone();
    let stream = body
        .into_data_stream()
        .map_err(|err| std::io::Error::other(err.to_string()));
    let reader = tokio_util::io::StreamReader::new(stream);
    let scope = query.team.clone();
    let stored = tokio::task::spawn_blocking(move || {
        let mut limited = tokio_util::io::SyncIoBridge::new(reader).take(MAX_UPLOAD_BYTES + 1);
        let mut counted = CountingReader {
            inner: &mut limited,
            count: 0,
        };
        let result = files.put(&scope, &hash, &mut counted);
        if counted.count > MAX_UPLOAD_BYTES {
            // Cut off at the limit: whatever was stored is not the whole upload.
            let _ = files.remove(&scope, &hash);
        }
        (result, counted.count)
    })
    .await
    .map_err(|source| ServiceError::Task {
        what: "storing an upload",
        source,
    })?;
    match stored {
        (_, count) if count > MAX_UPLOAD_BYTES => Err(ServiceError::UploadTooLarge {
            limit: MAX_UPLOAD_BYTES,
        }
        .into()),
        (Ok(_), _) => Ok(StatusCode::OK),
        (Err(err), _) => Err(ServiceError::Build(err).into()),
    }
}

/// Counts the bytes read through it.
struct CountingReader<R> {
    inner: R,
    count: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let bytes = [0u8, 1, 254, 255];
        assert_eq!(unhex(&hex(&bytes)).unwrap(), bytes);
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
    }
}
