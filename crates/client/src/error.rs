use serde_json::Value;

/// Everything a call can fail with. No variant ever carries the API key.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a non-success status; `body` is its JSON body unchanged
    /// (E2B's `{code, message}`), or a JSON string holding the raw text when it was not
    /// JSON.
    #[error("API returned HTTP {status}: {body}")]
    Api { status: u16, body: Value },
    /// The request never got an HTTP answer (connection refused, TLS, timeout).
    #[error("transport error: {0}")]
    Transport(String),
    /// The server answered 2xx but the body was not what the protocol promises.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The HTTP status for [`ClientError::Api`], `None` otherwise.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub(crate) fn transport(error: reqwest::Error) -> Self {
        // reqwest's message can include the URL but never headers, so the key stays out.
        ClientError::Transport(error.without_url().to_string())
    }

    /// Builds an [`ClientError::Api`] from a failed response, keeping its body as JSON.
    pub(crate) async fn from_response(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let body = match response.bytes().await {
            Ok(bytes) => body_json(&bytes),
            Err(error) => return ClientError::transport(error),
        };
        ClientError::Api { status, body }
    }
}

/// Parses a response body as JSON; non-JSON text becomes a JSON string, empty becomes null.
pub(crate) fn body_json(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}
