use berth_envd_proto::connect::{ConnectError, EnvelopeError};
use serde_json::Value;

/// Everything a call can fail with. No variant ever carries the API key.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a non-success status; `body` is its JSON body unchanged
    /// (E2B's `{code, message}`), or a JSON string holding the raw text when it was not
    /// JSON. Callers that relay errors (the MCP tools) pass it on as it came.
    #[error("API returned HTTP {status}: {body}")]
    Api { status: u16, body: Value },
    /// The request never got an HTTP answer (connection refused, TLS, timeout). The
    /// error's URL is removed, so a signed URL cannot leak through it.
    #[error("transport error: {0}")]
    Transport(#[source] reqwest::Error),
    /// A 2xx answer whose JSON body is not the model the API promises for `what`.
    #[error("the answer to {what} is not the expected JSON: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A unary envd call (input, resize, signal, listing) answered 2xx with a body that
    /// is not the message `what` promises.
    #[error("the answer to {what} is not the expected message: {source}")]
    Unary {
        what: &'static str,
        #[source]
        source: ConnectError,
    },
    /// envd's stream of `Process/Start` broke the Connect framing.
    #[error("malformed envelope in the process stream: {0}")]
    Envelope(#[from] EnvelopeError),
    /// An envelope of envd's process stream held no valid message.
    #[error("malformed message in the process stream: {0}")]
    Message(#[source] ConnectError),
    /// envd's process stream ended without its end-of-stream envelope (the connection
    /// was cut).
    #[error("process stream ended without an end-of-stream frame")]
    Unterminated,
    /// A local file to upload could not be read.
    #[error("reading {}: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
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
        ClientError::Transport(error.without_url())
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
