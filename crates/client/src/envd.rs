use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use base64::Engine;
use bytes::{Buf, BytesMut};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::error::{body_json, ClientError};

/// envd's port inside every sandbox.
const ENVD_PORT: u16 = 49983;

/// How envd of a sandbox is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvdEndpoint {
    /// Every request goes to this one URL, the sandbox named by `E2b-Sandbox-Id` and
    /// `E2b-Sandbox-Port` headers (the SDKs' `E2B_SANDBOX_URL` mode).
    SandboxUrl(String),
    /// `https://49983-<sandbox id>.<domain>` (E2B's cloud, wildcard DNS + TLS).
    Domain(String),
}

/// A client for the envd of one sandbox.
#[derive(Clone)]
pub struct EnvdClient {
    http: reqwest::Client,
    base_url: String,
    sandbox_id: String,
    header_routing: bool,
    access_token: Option<String>,
}

impl fmt::Debug for EnvdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvdClient")
            .field("base_url", &self.base_url)
            .field("sandbox_id", &self.sandbox_id)
            .finish_non_exhaustive()
    }
}

/// One command to run through `process.Process/Start`.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    /// Run as `/bin/bash -l -c <command>`, as the SDKs do.
    pub command: String,
    pub cwd: Option<String>,
    pub envs: HashMap<String, String>,
    /// Bounds the process lifetime (`Connect-Timeout-Ms`); `None` = no limit.
    pub timeout_ms: Option<u64>,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The exit code from the end event; `None` when the stream ended without one.
    pub exit_code: Option<i32>,
    /// envd's error text: the end event's `error`, or the stream's end-of-stream error
    /// (e.g. `deadline_exceeded` when `timeout_ms` ran out).
    pub error: Option<String>,
}

/// Receives a command's output as it arrives.
pub trait OutputSink: Send {
    fn stdout(&mut self, chunk: &[u8]);
    fn stderr(&mut self, chunk: &[u8]);
}

impl EnvdClient {
    pub fn new(
        http: reqwest::Client,
        endpoint: &EnvdEndpoint,
        sandbox_id: &str,
        access_token: Option<String>,
    ) -> Self {
        let (base_url, header_routing) = match endpoint {
            EnvdEndpoint::SandboxUrl(url) => (url.trim_end_matches('/').to_owned(), true),
            EnvdEndpoint::Domain(domain) => {
                (format!("https://{ENVD_PORT}-{sandbox_id}.{domain}"), false)
            }
        };
        Self {
            http,
            base_url,
            sandbox_id: sandbox_id.to_owned(),
            header_routing,
            access_token,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base_url));
        if self.header_routing {
            request = request
                .header("E2b-Sandbox-Id", &self.sandbox_id)
                .header("E2b-Sandbox-Port", ENVD_PORT.to_string());
        }
        if let Some(token) = &self.access_token {
            request = request.header("X-Access-Token", token);
        }
        request
    }

    /// Runs a command and streams its output into `sink`.
    pub async fn exec(
        &self,
        exec: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecOutput, ClientError> {
        let mut process = json!({
            "cmd": "/bin/bash",
            "args": ["-l", "-c", exec.command],
            "envs": exec.envs,
        });
        if let Some(cwd) = &exec.cwd {
            process["cwd"] = json!(cwd);
        }
        let message = serde_json::to_vec(&json!({ "process": process, "stdin": false }))
            .map_err(|error| ClientError::Protocol(error.to_string()))?;
        let mut request = self
            .request(reqwest::Method::POST, "/process.Process/Start")
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .body(envelope(0, &message));
        if let Some(timeout_ms) = exec.timeout_ms {
            request = request
                .header("Connect-Timeout-Ms", timeout_ms.to_string())
                .timeout(Duration::from_millis(timeout_ms) + Duration::from_secs(30));
        }
        let response = request.send().await.map_err(ClientError::transport)?;
        if !response.status().is_success() {
            return Err(ClientError::from_response(response).await);
        }
        let mut decoder = FrameDecoder::default();
        let mut output = ExecOutput {
            exit_code: None,
            error: None,
        };
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            decoder.push(&chunk.map_err(ClientError::transport)?);
            while let Some((flags, payload)) = decoder.next_frame() {
                if flags & END_STREAM_FLAG != 0 {
                    if let Some(error) = end_stream_error(&payload) {
                        output.error.get_or_insert(error);
                    }
                    // Read the body to its end so the connection is released cleanly
                    // (and can be reused) instead of being cut mid-response.
                    while let Some(rest) = body.next().await {
                        rest.map_err(ClientError::transport)?;
                    }
                    return Ok(output);
                }
                apply_event(&payload, sink, &mut output)?;
            }
        }
        Err(ClientError::Protocol(
            "process stream ended without an end-of-stream frame".into(),
        ))
    }

    /// Downloads a file (`GET /files?path=`).
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let response = self
            .request(reqwest::Method::GET, "/files")
            .query(&[("path", path)])
            .send()
            .await
            .map_err(ClientError::transport)?;
        if !response.status().is_success() {
            return Err(ClientError::from_response(response).await);
        }
        Ok(response
            .bytes()
            .await
            .map_err(ClientError::transport)?
            .to_vec())
    }

    /// Uploads a file (`POST /files?path=`, multipart field `file`), creating parents.
    pub async fn write_file(&self, path: &str, content: Vec<u8>) -> Result<(), ClientError> {
        let part = reqwest::multipart::Part::bytes(content).file_name(path.to_owned());
        let form = reqwest::multipart::Form::new().part("file", part);
        let response = self
            .request(reqwest::Method::POST, "/files")
            .query(&[("path", path)])
            .multipart(form)
            .send()
            .await
            .map_err(ClientError::transport)?;
        if !response.status().is_success() {
            return Err(ClientError::from_response(response).await);
        }
        Ok(())
    }
}

const END_STREAM_FLAG: u8 = 0x02;

/// One Connect envelope: flag byte, 4-byte big-endian length, payload.
fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(5 + payload.len());
    frame.push(flags);
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Splits a byte stream into Connect envelopes.
#[derive(Default)]
struct FrameDecoder {
    buffer: BytesMut,
}

impl FrameDecoder {
    fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    fn next_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        if self.buffer.len() < 5 {
            return None;
        }
        let length = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if self.buffer.len() < 5 + length {
            return None;
        }
        let flags = self.buffer[0];
        self.buffer.advance(5);
        let payload = self.buffer.split_to(length).to_vec();
        Some((flags, payload))
    }
}

fn end_stream_error(payload: &[u8]) -> Option<String> {
    let error = body_json(payload).get("error")?.clone();
    let code = error
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let message = error.get("message").and_then(Value::as_str).unwrap_or("");
    Some(format!("{code}: {message}"))
}

fn apply_event(
    payload: &[u8],
    sink: &mut dyn OutputSink,
    output: &mut ExecOutput,
) -> Result<(), ClientError> {
    let message: Value = serde_json::from_slice(payload)
        .map_err(|error| ClientError::Protocol(format!("bad process event: {error}")))?;
    let Some(event) = message.get("event") else {
        return Ok(());
    };
    if let Some(data) = event.get("data") {
        if let Some(stdout) = data.get("stdout").and_then(Value::as_str) {
            sink.stdout(&decode_base64(stdout)?);
        }
        if let Some(stderr) = data.get("stderr").and_then(Value::as_str) {
            sink.stderr(&decode_base64(stderr)?);
        }
    }
    if let Some(end) = event.get("end") {
        // proto3 JSON omits a zero exit code.
        let exit_code = end.get("exitCode").and_then(Value::as_i64).unwrap_or(0);
        output.exit_code = Some(exit_code as i32);
        if let Some(error) = end.get("error").and_then(Value::as_str) {
            output.error = Some(error.to_owned());
        }
    }
    Ok(())
}

fn decode_base64(text: &str) -> Result<Vec<u8>, ClientError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|error| ClientError::Protocol(format!("bad base64 in process output: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collected {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    }

    impl OutputSink for Collected {
        fn stdout(&mut self, chunk: &[u8]) {
            self.stdout.extend_from_slice(chunk);
        }
        fn stderr(&mut self, chunk: &[u8]) {
            self.stderr.extend_from_slice(chunk);
        }
    }

    #[test]
    fn decoder_reassembles_frames_split_across_chunks() {
        let mut stream = envelope(0, br#"{"event":{"start":{"pid":7}}}"#);
        stream.extend(envelope(END_STREAM_FLAG, b"{}"));
        let mut decoder = FrameDecoder::default();
        let mut frames = Vec::new();
        for byte in stream {
            decoder.push(&[byte]);
            while let Some(frame) = decoder.next_frame() {
                frames.push(frame);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].0, 0);
        assert_eq!(frames[1], (END_STREAM_FLAG, b"{}".to_vec()));
    }

    #[test]
    fn events_fill_sink_and_exit_code() {
        let mut sink = Collected::default();
        let mut output = ExecOutput {
            exit_code: None,
            error: None,
        };
        apply_event(
            br#"{"event":{"data":{"stdout":"aGk="}}}"#,
            &mut sink,
            &mut output,
        )
        .unwrap();
        apply_event(
            br#"{"event":{"data":{"stderr":"b29wcw=="}}}"#,
            &mut sink,
            &mut output,
        )
        .unwrap();
        apply_event(
            br#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
            &mut sink,
            &mut output,
        )
        .unwrap();
        assert_eq!(sink.stdout, b"hi");
        assert_eq!(sink.stderr, b"oops");
        assert_eq!(output.exit_code, Some(0));
    }

    #[test]
    fn end_stream_error_is_reported() {
        let error =
            end_stream_error(br#"{"error":{"code":"deadline_exceeded","message":"too slow"}}"#);
        assert_eq!(error.as_deref(), Some("deadline_exceeded: too slow"));
        assert_eq!(end_stream_error(b"{}"), None);
    }
}
