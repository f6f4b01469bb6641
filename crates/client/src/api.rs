use std::fmt;
use std::time::Duration;

use berth_api::{
    ConnectSandbox, ListedSandbox, NewSandbox, NewSecret, NewVolume, ResumedSandbox, Sandbox,
    SandboxDetail, SandboxEvent, SandboxForkRequest, SandboxForkResult, SandboxLogsV2Response,
    SandboxMetric, SandboxPauseRequest, SandboxSnapshotRequest, SandboxTimeoutRequest, Secret,
    SecretUpdate, SnapshotInfo, Volume, VolumeAndToken,
};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::{body_json, ClientError};

/// Longest wait for one REST answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A client for one E2B-compatible REST API with one API key.
#[derive(Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base_url: String,
    api_key: String,
}

impl fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiClient")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// The answer of [`ApiClient::request`]: status, the `X-Next-Token` paging cursor if
/// any, and the JSON body (`null` for an empty body such as 204), untouched.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiResponse {
    pub status: u16,
    pub next_token: Option<String>,
    pub body: Value,
}

/// One page of a listing, with the cursor for the next (`X-Next-Token`) if there is one.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_token: Option<String>,
}

impl ApiClient {
    /// `base_url` is the API root, e.g. `https://api.e2b.app` or `http://127.0.0.1:3000`.
    pub fn new(base_url: &str, api_key: &str) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(ClientError::transport)?;
        Ok(Self::with_http(http, base_url, api_key))
    }

    /// Shares an existing connection pool.
    pub fn with_http(http: reqwest::Client, base_url: &str, api_key: &str) -> Self {
        Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key: api_key.to_owned(),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Sends `body` (as JSON when present) and returns the successful response;
    /// non-2xx answers become [`ClientError::Api`].
    pub(crate) async fn send<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<&B>,
    ) -> Result<reqwest::Response, ClientError> {
        let mut request = self
            .http
            .request(method, format!("{}{}", self.base_url, path))
            .header("X-API-Key", &self.api_key)
            .timeout(REQUEST_TIMEOUT);
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(ClientError::transport)?;
        if !response.status().is_success() {
            return Err(ClientError::from_response(response).await);
        }
        Ok(response)
    }

    /// A call answered with the model `T`; `what` names the call in decode errors.
    pub(crate) async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        what: &'static str,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let response = self.send(method, path, &[], body).await?;
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode { what, source })
    }

    /// A call whose answer has no body worth reading (204, or an ignored echo).
    pub(crate) async fn call_without_answer<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(), ClientError> {
        let response = self.send(method, path, &[], body).await?;
        // Read the body to its end so the pooled connection can be reused.
        response.bytes().await.map_err(ClientError::transport)?;
        Ok(())
    }

    /// Any REST call, its answer relayed untouched: for callers that hand the API's JSON
    /// on as it came (the MCP connector tools). `path` starts with `/`; `query` pairs
    /// are URL-encoded; `body` is sent as JSON when present.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<&Value>,
    ) -> Result<ApiResponse, ClientError> {
        let response = self.send(method, path, query, body).await?;
        let status = response.status().as_u16();
        let next_token = next_token_of(&response);
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        Ok(ApiResponse {
            status,
            next_token,
            body: body_json(&bytes),
        })
    }

    /// `POST /sandboxes`.
    pub async fn create_sandbox(&self, new_sandbox: &NewSandbox) -> Result<Sandbox, ClientError> {
        self.call(
            "POST /sandboxes",
            Method::POST,
            "/sandboxes",
            Some(new_sandbox),
        )
        .await
    }

    /// `GET /v2/sandboxes`: one page of the key's running and paused sandboxes.
    pub async fn list_sandboxes(
        &self,
        limit: Option<u32>,
        next_token: Option<&str>,
    ) -> Result<Page<ListedSandbox>, ClientError> {
        self.query_sandboxes(&SandboxQuery {
            limit,
            next_token: next_token.map(str::to_owned),
            ..SandboxQuery::default()
        })
        .await
    }

    /// `DELETE /sandboxes/{id}`.
    pub async fn kill_sandbox(&self, sandbox_id: &str) -> Result<(), ClientError> {
        self.call_without_answer::<()>(Method::DELETE, &sandbox_path(sandbox_id, ""), None)
            .await
    }

    /// `POST /sandboxes/{id}/pause` (the server's default: memory kept).
    pub async fn pause_sandbox(&self, sandbox_id: &str) -> Result<(), ClientError> {
        self.call_without_answer::<()>(Method::POST, &sandbox_path(sandbox_id, "/pause"), None)
            .await
    }

    /// `POST /sandboxes/{id}/connect {timeout}`: resumes a paused sandbox, extends a
    /// running one; the answer carries a fresh `envdAccessToken`.
    pub async fn connect_sandbox(
        &self,
        sandbox_id: &str,
        timeout_seconds: u64,
    ) -> Result<Sandbox, ClientError> {
        let body = ConnectSandbox {
            timeout: seconds(timeout_seconds),
        };
        self.call(
            "POST /sandboxes/{id}/connect",
            Method::POST,
            &sandbox_path(sandbox_id, "/connect"),
            Some(&body),
        )
        .await
    }

    /// `POST /sandboxes/{id}/timeout {timeout}`: the sandbox expires `timeout_seconds`
    /// from now.
    pub async fn set_sandbox_timeout(
        &self,
        sandbox_id: &str,
        timeout_seconds: u64,
    ) -> Result<(), ClientError> {
        let body = SandboxTimeoutRequest {
            timeout: seconds(timeout_seconds),
        };
        self.call_without_answer(
            Method::POST,
            &sandbox_path(sandbox_id, "/timeout"),
            Some(&body),
        )
        .await
    }
}

/// Filters of a sandbox listing (`GET /v2/sandboxes`); every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxQuery {
    /// Metadata pairs every listed sandbox must carry.
    pub metadata: Vec<(String, String)>,
    /// Template id or alias.
    pub template: Option<String>,
    /// Only running (`Some(Running)`) or only paused sandboxes; `None`: both.
    pub state: Option<berth_api::SandboxState>,
    pub limit: Option<u32>,
    pub next_token: Option<String>,
}

impl SandboxQuery {
    fn pairs(&self) -> Vec<(String, String)> {
        let mut query = Vec::new();
        if !self.metadata.is_empty() {
            let encoded: Vec<String> = self
                .metadata
                .iter()
                .map(|(key, value)| format!("{}={}", encode_segment(key), encode_segment(value)))
                .collect();
            query.push(("metadata".to_owned(), encoded.join("&")));
        }
        if let Some(template) = &self.template {
            query.push(("template".to_owned(), template.clone()));
        }
        if let Some(state) = self.state {
            let state = match state {
                berth_api::SandboxState::Running => "running",
                berth_api::SandboxState::Paused => "paused",
            };
            query.push(("state".to_owned(), state.to_owned()));
        }
        if let Some(limit) = self.limit {
            query.push(("limit".to_owned(), limit.to_string()));
        }
        if let Some(token) = &self.next_token {
            query.push(("nextToken".to_owned(), token.clone()));
        }
        query
    }
}

/// Which log lines `GET /v2/sandboxes/{id}/logs` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Lines at or after (forward) this time, in milliseconds since the epoch.
    pub cursor_ms: Option<i64>,
    pub limit: Option<u32>,
    /// Lowest level returned.
    pub level: Option<berth_api::LogLevel>,
    /// Substring every message contains.
    pub search: Option<String>,
    /// Newest first instead of oldest first.
    pub backward: bool,
}

impl LogQuery {
    fn pairs(&self) -> Vec<(String, String)> {
        let mut query = Vec::new();
        if let Some(cursor) = self.cursor_ms {
            query.push(("cursor".to_owned(), cursor.to_string()));
        }
        if let Some(limit) = self.limit {
            query.push(("limit".to_owned(), limit.to_string()));
        }
        if let Some(level) = self.level {
            query.push(("level".to_owned(), level.as_str().to_owned()));
        }
        if let Some(search) = &self.search {
            query.push(("search".to_owned(), search.clone()));
        }
        if self.backward {
            query.push(("direction".to_owned(), "backward".to_owned()));
        }
        query
    }
}

impl ApiClient {
    /// A GET with query pairs answered with the model `T`, with the page cursor.
    async fn get_page<T: DeserializeOwned>(
        &self,
        what: &'static str,
        path: &str,
        query: &[(String, String)],
    ) -> Result<Page<T>, ClientError> {
        let response = self.send::<()>(Method::GET, path, query, None).await?;
        let next_token = next_token_of(&response);
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        let items = serde_json::from_slice(&bytes)
            .map_err(|source| ClientError::Decode { what, source })?;
        Ok(Page { items, next_token })
    }

    /// `GET /v2/sandboxes` with filters: one page.
    pub async fn query_sandboxes(
        &self,
        query: &SandboxQuery,
    ) -> Result<Page<ListedSandbox>, ClientError> {
        self.get_page("GET /v2/sandboxes", "/v2/sandboxes", &query.pairs())
            .await
    }

    /// `GET /sandboxes/{id}`: a running or paused sandbox of the key's team.
    pub async fn get_sandbox(&self, sandbox_id: &str) -> Result<SandboxDetail, ClientError> {
        self.call::<(), _>(
            "GET /sandboxes/{id}",
            Method::GET,
            &sandbox_path(sandbox_id, ""),
            None,
        )
        .await
    }

    /// `POST /sandboxes/{id}/pause {memory}`: `memory` false keeps only the files.
    pub async fn pause_sandbox_with(
        &self,
        sandbox_id: &str,
        memory: bool,
    ) -> Result<(), ClientError> {
        let body = SandboxPauseRequest {
            memory: Some(memory),
            require_healthy_guest: None,
        };
        self.call_without_answer(
            Method::POST,
            &sandbox_path(sandbox_id, "/pause"),
            Some(&body),
        )
        .await
    }

    /// `POST /sandboxes/{id}/resume {timeout}`: a paused sandbox runs again (409 when it
    /// already runs).
    pub async fn resume_sandbox(
        &self,
        sandbox_id: &str,
        timeout_seconds: u64,
    ) -> Result<Sandbox, ClientError> {
        let body = ResumedSandbox {
            timeout: Some(seconds(timeout_seconds)),
            auto_pause: None,
        };
        self.call(
            "POST /sandboxes/{id}/resume",
            Method::POST,
            &sandbox_path(sandbox_id, "/resume"),
            Some(&body),
        )
        .await
    }

    /// `POST /sandboxes/{id}/fork`: one result per requested copy.
    pub async fn fork_sandbox(
        &self,
        sandbox_id: &str,
        request: &SandboxForkRequest,
    ) -> Result<Vec<SandboxForkResult>, ClientError> {
        self.call(
            "POST /sandboxes/{id}/fork",
            Method::POST,
            &sandbox_path(sandbox_id, "/fork"),
            Some(request),
        )
        .await
    }

    /// `POST /sandboxes/{id}/snapshots`.
    pub async fn snapshot_sandbox(
        &self,
        sandbox_id: &str,
        request: &SandboxSnapshotRequest,
    ) -> Result<SnapshotInfo, ClientError> {
        self.call(
            "POST /sandboxes/{id}/snapshots",
            Method::POST,
            &sandbox_path(sandbox_id, "/snapshots"),
            Some(request),
        )
        .await
    }

    /// `GET /snapshots`: one page.
    pub async fn list_snapshots(
        &self,
        next_token: Option<&str>,
    ) -> Result<Page<SnapshotInfo>, ClientError> {
        let query: Vec<(String, String)> = next_token
            .map(|token| ("nextToken".to_owned(), token.to_owned()))
            .into_iter()
            .collect();
        self.get_page("GET /snapshots", "/snapshots", &query).await
    }

    /// `GET /v2/sandboxes/{id}/logs`.
    pub async fn sandbox_logs(
        &self,
        sandbox_id: &str,
        query: &LogQuery,
    ) -> Result<SandboxLogsV2Response, ClientError> {
        let path = format!("/v2/sandboxes/{}/logs", encode_segment(sandbox_id));
        let response = self
            .send::<()>(Method::GET, &path, &query.pairs(), None)
            .await?;
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            what: "GET /v2/sandboxes/{id}/logs",
            source,
        })
    }

    /// `GET /sandboxes/{id}/metrics`: samples between `start` and `end` (unix seconds).
    pub async fn sandbox_metrics(
        &self,
        sandbox_id: &str,
        start: Option<i64>,
        end: Option<i64>,
    ) -> Result<Vec<SandboxMetric>, ClientError> {
        let mut query = Vec::new();
        if let Some(start) = start {
            query.push(("start".to_owned(), start.to_string()));
        }
        if let Some(end) = end {
            query.push(("end".to_owned(), end.to_string()));
        }
        let page = self
            .get_page(
                "GET /sandboxes/{id}/metrics",
                &sandbox_path(sandbox_id, "/metrics"),
                &query,
            )
            .await?;
        Ok(page.items)
    }

    /// `GET /events/sandboxes/{id}`: the sandbox's lifecycle events.
    pub async fn sandbox_events(&self, sandbox_id: &str) -> Result<Vec<SandboxEvent>, ClientError> {
        let path = format!("/events/sandboxes/{}", encode_segment(sandbox_id));
        Ok(self
            .get_page("GET /events/sandboxes/{id}", &path, &[])
            .await?
            .items)
    }

    /// `GET /volumes`.
    pub async fn list_volumes(&self) -> Result<Vec<Volume>, ClientError> {
        self.call::<(), _>("GET /volumes", Method::GET, "/volumes", None)
            .await
    }

    /// `POST /volumes {name}`.
    pub async fn create_volume(&self, name: &str) -> Result<VolumeAndToken, ClientError> {
        let body = NewVolume {
            name: name.to_owned(),
        };
        self.call("POST /volumes", Method::POST, "/volumes", Some(&body))
            .await
    }

    /// `GET /volumes/{id}`.
    pub async fn get_volume(&self, volume_id: &str) -> Result<VolumeAndToken, ClientError> {
        self.call::<(), _>(
            "GET /volumes/{id}",
            Method::GET,
            &format!("/volumes/{}", encode_segment(volume_id)),
            None,
        )
        .await
    }

    /// `DELETE /volumes/{id}`.
    pub async fn delete_volume(&self, volume_id: &str) -> Result<(), ClientError> {
        self.call_without_answer::<()>(
            Method::DELETE,
            &format!("/volumes/{}", encode_segment(volume_id)),
            None,
        )
        .await
    }

    /// `GET /secrets`: one page of the team's secrets (metadata only, never values).
    pub async fn list_secrets(
        &self,
        next_token: Option<&str>,
    ) -> Result<Page<Secret>, ClientError> {
        let query: Vec<(String, String)> = next_token
            .map(|token| ("nextToken".to_owned(), token.to_owned()))
            .into_iter()
            .collect();
        self.get_page("GET /secrets", "/secrets", &query).await
    }

    /// `POST /secrets`.
    pub async fn create_secret(&self, secret: &NewSecret) -> Result<Secret, ClientError> {
        self.call("POST /secrets", Method::POST, "/secrets", Some(secret))
            .await
    }

    /// `POST /secrets/{id}`: a new version of the value.
    pub async fn update_secret(
        &self,
        id_or_name: &str,
        update: &SecretUpdate,
    ) -> Result<Secret, ClientError> {
        self.call(
            "POST /secrets/{id}",
            Method::POST,
            &format!("/secrets/{}", encode_segment(id_or_name)),
            Some(update),
        )
        .await
    }

    /// `DELETE /secrets/{id}`.
    pub async fn delete_secret(&self, id_or_name: &str) -> Result<(), ClientError> {
        self.call_without_answer::<()>(
            Method::DELETE,
            &format!("/secrets/{}", encode_segment(id_or_name)),
            None,
        )
        .await
    }
}

/// The API's timeouts are int32 seconds; larger values mean "as long as allowed".
fn seconds(timeout: u64) -> i64 {
    timeout.min(i32::MAX as u64) as i64
}

pub(crate) fn next_token_of(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get("x-next-token")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

fn sandbox_path(sandbox_id: &str, suffix: &str) -> String {
    format!("/sandboxes/{}{suffix}", encode_segment(sandbox_id))
}

/// Percent-encodes one URL path segment so an id can never add path components.
pub fn encode_segment(segment: &str) -> String {
    let mut encoded = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_encoding_keeps_ids_and_escapes_separators() {
        assert_eq!(encode_segment("iabc123"), "iabc123");
        assert_eq!(encode_segment("../x"), "..%2Fx");
        assert_eq!(encode_segment("a b?"), "a%20b%3F");
    }

    #[test]
    fn listing_filters_become_the_apis_query() {
        let query = SandboxQuery {
            metadata: vec![("user".into(), "a b".into()), ("app".into(), "x".into())],
            template: Some("base".into()),
            state: Some(berth_api::SandboxState::Paused),
            limit: Some(5),
            next_token: None,
        };
        assert_eq!(
            query.pairs(),
            vec![
                ("metadata".to_owned(), "user=a%20b&app=x".to_owned()),
                ("template".to_owned(), "base".to_owned()),
                ("state".to_owned(), "paused".to_owned()),
                ("limit".to_owned(), "5".to_owned()),
            ]
        );
        assert!(SandboxQuery::default().pairs().is_empty());
        let logs = LogQuery {
            level: Some(berth_api::LogLevel::Warn),
            backward: true,
            ..Default::default()
        };
        assert_eq!(
            logs.pairs(),
            vec![
                ("level".to_owned(), "warn".to_owned()),
                ("direction".to_owned(), "backward".to_owned()),
            ]
        );
    }

    #[test]
    fn debug_output_hides_the_key() {
        let client = ApiClient::new("http://127.0.0.1:1", "e2b_secretkey").unwrap();
        assert!(!format!("{client:?}").contains("e2b_secretkey"));
    }

    #[test]
    fn timeouts_saturate_at_the_apis_int32() {
        assert_eq!(seconds(300), 300);
        assert_eq!(seconds(u64::MAX), i32::MAX as i64);
    }
}
