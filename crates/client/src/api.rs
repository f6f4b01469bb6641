use std::fmt;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use crate::error::{body_json, ClientError};

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

/// A successful answer: status, the `X-Next-Token` paging cursor if any, and the JSON
/// body (`null` for an empty body such as 204).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiResponse {
    pub status: u16,
    pub next_token: Option<String>,
    pub body: Value,
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

    /// Sends one request. `path` starts with `/`; `query` pairs are URL-encoded; `body` is
    /// sent as JSON when present. Non-2xx answers become [`ClientError::Api`].
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<&Value>,
    ) -> Result<ApiResponse, ClientError> {
        let mut request = self
            .http
            .request(method, format!("{}{}", self.base_url, path))
            .header("X-API-Key", &self.api_key)
            .timeout(Duration::from_secs(120));
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
        let status = response.status().as_u16();
        let next_token = response
            .headers()
            .get("x-next-token")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        Ok(ApiResponse {
            status,
            next_token,
            body: body_json(&bytes),
        })
    }

    /// `POST /sandboxes` with a `NewSandbox` body.
    pub async fn create_sandbox(&self, new_sandbox: &Value) -> Result<Value, ClientError> {
        Ok(self
            .request(Method::POST, "/sandboxes", &[], Some(new_sandbox))
            .await?
            .body)
    }

    /// `DELETE /sandboxes/{id}`.
    pub async fn kill_sandbox(&self, sandbox_id: &str) -> Result<(), ClientError> {
        self.request(Method::DELETE, &sandbox_path(sandbox_id, ""), &[], None)
            .await
            .map(drop)
    }

    /// `POST /sandboxes/{id}/pause` (memory kept).
    pub async fn pause_sandbox(&self, sandbox_id: &str) -> Result<(), ClientError> {
        self.request(Method::POST, &sandbox_path(sandbox_id, "/pause"), &[], None)
            .await
            .map(drop)
    }

    /// `POST /sandboxes/{id}/connect {timeout}`: resumes a paused sandbox, extends a
    /// running one; returns the sandbox JSON (with a fresh `envdAccessToken`).
    pub async fn connect_sandbox(
        &self,
        sandbox_id: &str,
        timeout_seconds: u64,
    ) -> Result<Value, ClientError> {
        let body = serde_json::json!({ "timeout": timeout_seconds });
        Ok(self
            .request(
                Method::POST,
                &sandbox_path(sandbox_id, "/connect"),
                &[],
                Some(&body),
            )
            .await?
            .body)
    }

    /// `POST /sandboxes/{id}/timeout {timeout}`: the sandbox expires `timeout_seconds`
    /// from now.
    pub async fn set_sandbox_timeout(
        &self,
        sandbox_id: &str,
        timeout_seconds: u64,
    ) -> Result<(), ClientError> {
        let body = serde_json::json!({ "timeout": timeout_seconds });
        self.request(
            Method::POST,
            &sandbox_path(sandbox_id, "/timeout"),
            &[],
            Some(&body),
        )
        .await
        .map(drop)
    }
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
    fn debug_output_hides_the_key() {
        let client = ApiClient::new("http://127.0.0.1:1", "e2b_secretkey").unwrap();
        assert!(!format!("{client:?}").contains("e2b_secretkey"));
    }
}
