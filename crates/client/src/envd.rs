use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use berth_envd_proto::connect::{
    encode_envelope, Codec, ConnectError, ContentType, EndStream, EnvelopeDecoder, PROTOCOL_VERSION,
};
use berth_envd_proto::filesystem::{EntryInfo as FsEntry, ListDirRequest, ListDirResponse};
use berth_envd_proto::headers::{
    ACCESS_TOKEN, CONNECT_PROTOCOL_VERSION, CONNECT_TIMEOUT_MS, SANDBOX_ID, SANDBOX_PORT,
};
use berth_envd_proto::http::EntryInfo;
use berth_envd_proto::process::process_event::{data_event, Event};
use berth_envd_proto::process::{
    process_input, process_selector, pty, ProcessConfig, ProcessInput, ProcessSelector,
    Pty as PtyConfig, SendInputRequest, SendInputResponse, SendSignalRequest, SendSignalResponse,
    Signal, StartRequest, StartResponse, UpdateRequest, UpdateResponse,
};
use berth_envd_proto::{routes, ENVD_PORT};
use futures::StreamExt;

use crate::error::ClientError;

/// Largest process-stream message accepted (envd sends output in small chunks).
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Longest wait for one unary envd call (input, resize, signal, listing).
const UNARY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long past a command's own time limit the HTTP call may take before it is cut
/// (envd ends the stream itself when the limit passes).
const STREAM_GRACE: Duration = Duration::from_secs(30);

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

impl ExecRequest {
    /// The `Start` message: a login bash running the command, no stdin.
    fn start_request(&self) -> StartRequest {
        StartRequest {
            process: Some(ProcessConfig {
                cmd: "/bin/bash".into(),
                args: vec!["-l".into(), "-c".into(), self.command.clone()],
                envs: self.envs.clone(),
                cwd: self.cwd.clone(),
            }),
            pty: None,
            tag: None,
            stdin: Some(false),
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The exit code from the end event; `None` when the stream ended without one.
    pub exit_code: Option<i32>,
    /// Why the command did not simply exit, if envd said so.
    pub error: Option<ExecError>,
}

/// What envd reported besides an exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecError {
    /// The end event's `error` (the process could not run, or was killed).
    Process(String),
    /// The stream's end-of-stream error, e.g. `deadline_exceeded` when
    /// [`ExecRequest::timeout_ms`] ran out.
    Stream(ConnectError),
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::Process(text) => f.write_str(text),
            ExecError::Stream(error) => write!(f, "{error}"),
        }
    }
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
                .header(SANDBOX_ID, &self.sandbox_id)
                .header(SANDBOX_PORT, ENVD_PORT.to_string());
        }
        if let Some(token) = &self.access_token {
            request = request.header(ACCESS_TOKEN, token);
        }
        request
    }

    /// Runs a command and streams its output into `sink`.
    pub async fn exec(
        &self,
        exec: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecOutput, ClientError> {
        let message = Codec::Json.encode(&exec.start_request());
        let mut request = self
            .request(reqwest::Method::POST, routes::PROCESS_START)
            .header(
                reqwest::header::CONTENT_TYPE,
                ContentType::STREAM_JSON.as_str(),
            )
            .header(CONNECT_PROTOCOL_VERSION, PROTOCOL_VERSION)
            .body(encode_envelope(0, &message));
        if let Some(timeout_ms) = exec.timeout_ms {
            request = request
                .header(CONNECT_TIMEOUT_MS, timeout_ms.to_string())
                .timeout(Duration::from_millis(timeout_ms) + STREAM_GRACE);
        }
        let response = request.send().await.map_err(ClientError::transport)?;
        if !response.status().is_success() {
            return Err(ClientError::from_response(response).await);
        }
        let mut decoder = EnvelopeDecoder::new(MAX_MESSAGE_BYTES);
        let mut output = ExecOutput {
            exit_code: None,
            error: None,
        };
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            decoder.push(&chunk.map_err(ClientError::transport)?);
            while let Some(envelope) = decoder.next_envelope()? {
                if envelope.is_end_stream() {
                    let end: EndStream =
                        serde_json::from_slice(&envelope.payload).map_err(|source| {
                            ClientError::Decode {
                                what: "the end of the process stream",
                                source,
                            }
                        })?;
                    if let Some(error) = end.error {
                        output.error.get_or_insert(ExecError::Stream(error));
                    }
                    // Read the body to its end so the connection is released cleanly
                    // (and can be reused) instead of being cut mid-response.
                    while let Some(rest) = body.next().await {
                        rest.map_err(ClientError::transport)?;
                    }
                    return Ok(output);
                }
                let message: StartResponse = Codec::Json
                    .decode(&envelope.payload)
                    .map_err(ClientError::Message)?;
                apply_event(message, sink, &mut output);
            }
        }
        decoder.finish()?;
        Err(ClientError::Unterminated)
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

    /// Uploads a file (`POST /files?path=`, multipart field `file`), creating parents;
    /// returns what envd wrote.
    pub async fn write_file(
        &self,
        path: &str,
        content: Vec<u8>,
    ) -> Result<Vec<EntryInfo>, ClientError> {
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
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            what: "POST /files",
            source,
        })
    }
}

/// A terminal program to start through `process.Process/Start` with a PTY.
#[derive(Debug, Clone)]
pub struct PtyRequest {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: HashMap<String, String>,
    pub cwd: Option<String>,
    pub cols: u32,
    pub rows: u32,
}

impl PtyRequest {
    /// A login shell (`/bin/bash -i -l`) with `TERM=xterm-256color`, as the SDKs'
    /// `pty.create` starts.
    pub fn login_shell(cols: u32, rows: u32) -> Self {
        PtyRequest {
            cmd: "/bin/bash".into(),
            args: vec!["-i".into(), "-l".into()],
            envs: HashMap::from([("TERM".to_owned(), "xterm-256color".to_owned())]),
            cwd: None,
            cols,
            rows,
        }
    }
}

/// What a PTY's stream delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyEvent {
    /// Bytes the terminal printed.
    Output(Vec<u8>),
    /// The program ended (the last event).
    Exited {
        exit_code: Option<i32>,
        error: Option<String>,
    },
}

/// A running PTY program: its pid (for input, resize and signals through
/// [`EnvdClient`]) and its output stream.
pub struct PtyStream {
    pid: u32,
    body: futures::stream::BoxStream<'static, Result<bytes::Bytes, reqwest::Error>>,
    decoder: EnvelopeDecoder,
    pending: std::collections::VecDeque<PtyEvent>,
    done: bool,
}

impl fmt::Debug for PtyStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PtyStream").field("pid", &self.pid).finish()
    }
}

impl PtyStream {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Decodes every envelope already received: output and the exit become pending
    /// events, the start event sets the pid, the end-of-stream marks the stream done.
    fn decode_buffered(&mut self) -> Result<(), ClientError> {
        while let Some(envelope) = self.decoder.next_envelope()? {
            if envelope.is_end_stream() {
                self.done = true;
                let end: EndStream =
                    serde_json::from_slice(&envelope.payload).map_err(|source| {
                        ClientError::Decode {
                            what: "the end of the PTY stream",
                            source,
                        }
                    })?;
                if let Some(error) = end.error {
                    self.pending.push_back(PtyEvent::Exited {
                        exit_code: None,
                        error: Some(error.to_string()),
                    });
                }
                return Ok(());
            }
            let message: StartResponse = Codec::Json
                .decode(&envelope.payload)
                .map_err(ClientError::Message)?;
            match message.event.and_then(|event| event.event) {
                Some(Event::Data(data)) => match data.output {
                    Some(
                        data_event::Output::Pty(bytes)
                        | data_event::Output::Stdout(bytes)
                        | data_event::Output::Stderr(bytes),
                    ) => self.pending.push_back(PtyEvent::Output(bytes.to_vec())),
                    None => {}
                },
                Some(Event::End(end)) => self.pending.push_back(PtyEvent::Exited {
                    exit_code: Some(end.exit_code),
                    error: end.error,
                }),
                Some(Event::Start(start)) => self.pid = start.pid,
                Some(Event::Keepalive(_)) | None => {}
            }
        }
        Ok(())
    }

    /// Reads the stream until `ready` holds for what was decoded, or the stream is done.
    async fn read_until(&mut self, ready: fn(&PtyStream) -> bool) -> Result<(), ClientError> {
        loop {
            self.decode_buffered()?;
            if self.done || ready(self) {
                return Ok(());
            }
            match self.body.next().await {
                Some(chunk) => self.decoder.push(&chunk.map_err(ClientError::transport)?),
                None => {
                    self.decoder.finish()?;
                    return Err(ClientError::Unterminated);
                }
            }
        }
    }

    /// The next event; `None` once the stream ended.
    pub async fn next_event(&mut self) -> Result<Option<PtyEvent>, ClientError> {
        if self.pending.is_empty() {
            self.read_until(|stream| !stream.pending.is_empty()).await?;
        }
        Ok(self.pending.pop_front())
    }
}

fn by_pid(pid: u32) -> Option<ProcessSelector> {
    Some(ProcessSelector {
        selector: Some(process_selector::Selector::Pid(pid)),
    })
}

impl EnvdClient {
    /// One unary Connect call with JSON messages.
    async fn unary<Req, Resp>(
        &self,
        what: &'static str,
        route: &str,
        message: &Req,
    ) -> Result<Resp, ClientError>
    where
        Req: prost::Message + serde::Serialize,
        Resp: prost::Message + serde::de::DeserializeOwned + Default,
    {
        let response = self
            .request(reqwest::Method::POST, route)
            .header(
                reqwest::header::CONTENT_TYPE,
                ContentType::UNARY_JSON.as_str(),
            )
            .header(CONNECT_PROTOCOL_VERSION, PROTOCOL_VERSION)
            .body(Codec::Json.encode(message))
            .timeout(UNARY_TIMEOUT)
            .send()
            .await
            .map_err(ClientError::transport)?;
        if !response.status().is_success() {
            return Err(ClientError::from_response(response).await);
        }
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        Codec::Json
            .decode(&bytes)
            .map_err(|source| ClientError::Unary { what, source })
    }

    /// Starts a program on a new PTY and waits for its start event (its pid).
    pub async fn start_pty(&self, pty: &PtyRequest) -> Result<PtyStream, ClientError> {
        let start = StartRequest {
            process: Some(ProcessConfig {
                cmd: pty.cmd.clone(),
                args: pty.args.clone(),
                envs: pty.envs.clone(),
                cwd: pty.cwd.clone(),
            }),
            pty: Some(PtyConfig {
                size: Some(pty::Size {
                    cols: pty.cols,
                    rows: pty.rows,
                }),
            }),
            tag: None,
            stdin: Some(true),
        };
        let response = self
            .request(reqwest::Method::POST, routes::PROCESS_START)
            .header(
                reqwest::header::CONTENT_TYPE,
                ContentType::STREAM_JSON.as_str(),
            )
            .header(CONNECT_PROTOCOL_VERSION, PROTOCOL_VERSION)
            .body(encode_envelope(0, &Codec::Json.encode(&start)))
            .send()
            .await
            .map_err(ClientError::transport)?;
        if !response.status().is_success() {
            return Err(ClientError::from_response(response).await);
        }
        let mut stream = PtyStream {
            pid: 0,
            body: response.bytes_stream().boxed(),
            decoder: EnvelopeDecoder::new(MAX_MESSAGE_BYTES),
            pending: Default::default(),
            done: false,
        };
        // The start event comes first (it carries the pid input and resizes need).
        stream.read_until(|stream| stream.pid != 0).await?;
        Ok(stream)
    }

    /// Types `input` into PTY program `pid`.
    pub async fn send_pty_input(&self, pid: u32, input: &[u8]) -> Result<(), ClientError> {
        let request = SendInputRequest {
            process: by_pid(pid),
            input: Some(ProcessInput {
                input: Some(process_input::Input::Pty(input.to_vec())),
            }),
        };
        let _: SendInputResponse = self
            .unary(
                "process.Process/SendInput",
                routes::PROCESS_SEND_INPUT,
                &request,
            )
            .await?;
        Ok(())
    }

    /// Resizes the PTY of program `pid`.
    pub async fn resize_pty(&self, pid: u32, cols: u32, rows: u32) -> Result<(), ClientError> {
        let request = UpdateRequest {
            process: by_pid(pid),
            pty: Some(PtyConfig {
                size: Some(pty::Size { cols, rows }),
            }),
        };
        let _: UpdateResponse = self
            .unary("process.Process/Update", routes::PROCESS_UPDATE, &request)
            .await?;
        Ok(())
    }

    /// SIGKILLs process `pid`.
    pub async fn kill_process(&self, pid: u32) -> Result<(), ClientError> {
        let request = SendSignalRequest {
            process: by_pid(pid),
            signal: Signal::Sigkill as i32,
        };
        let _: SendSignalResponse = self
            .unary(
                "process.Process/SendSignal",
                routes::PROCESS_SEND_SIGNAL,
                &request,
            )
            .await?;
        Ok(())
    }

    /// The entries of directory `path` (`depth` 1: its direct children).
    pub async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<FsEntry>, ClientError> {
        let request = ListDirRequest {
            path: path.to_owned(),
            depth,
        };
        let response: ListDirResponse = self
            .unary(
                "filesystem.Filesystem/ListDir",
                routes::FILESYSTEM_LIST_DIR,
                &request,
            )
            .await?;
        Ok(response.entries)
    }
}

/// Hands one process event's output to `sink` and records how the process ended.
fn apply_event(message: StartResponse, sink: &mut dyn OutputSink, output: &mut ExecOutput) {
    match message.event.and_then(|event| event.event) {
        Some(Event::Data(data)) => match data.output {
            Some(data_event::Output::Stdout(bytes)) => sink.stdout(&bytes),
            Some(data_event::Output::Stderr(bytes)) => sink.stderr(&bytes),
            // A PTY's output; `exec` never asks for a PTY.
            Some(data_event::Output::Pty(bytes)) => sink.stdout(&bytes),
            None => {}
        },
        Some(Event::End(end)) => {
            output.exit_code = Some(end.exit_code);
            if let Some(error) = end.error {
                output.error = Some(ExecError::Process(error));
            }
        }
        Some(Event::Start(_) | Event::Keepalive(_)) | None => {}
    }
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

    fn event(json: &str) -> StartResponse {
        Codec::Json.decode(json.as_bytes()).unwrap()
    }

    #[test]
    fn start_request_is_what_the_sdks_send() {
        let request = ExecRequest {
            command: "echo hi".into(),
            cwd: Some("/tmp".into()),
            envs: HashMap::from([("A".into(), "1".into())]),
            timeout_ms: None,
        };
        let json: serde_json::Value =
            serde_json::from_slice(&Codec::Json.encode(&request.start_request())).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                            "envs": {"A": "1"}, "cwd": "/tmp"},
                "stdin": false,
            })
        );
    }

    #[test]
    fn events_fill_sink_and_exit_code() {
        let mut sink = Collected::default();
        let mut output = ExecOutput {
            exit_code: None,
            error: None,
        };
        for json in [
            r#"{"event":{"start":{"pid":7}}}"#,
            r#"{"event":{"data":{"stdout":"aGk="}}}"#,
            r#"{"event":{"keepalive":{}}}"#,
            r#"{"event":{"data":{"stderr":"b29wcw=="}}}"#,
            // proto3 JSON omits a zero exit code.
            r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
        ] {
            apply_event(event(json), &mut sink, &mut output);
        }
        assert_eq!(sink.stdout, b"hi");
        assert_eq!(sink.stderr, b"oops");
        assert_eq!(output.exit_code, Some(0));
        assert_eq!(output.error, None);

        apply_event(
            event(r#"{"event":{"end":{"exitCode":-1,"error":"signal: killed"}}}"#),
            &mut sink,
            &mut output,
        );
        assert_eq!(output.exit_code, Some(-1));
        assert_eq!(
            output.error.unwrap().to_string(),
            "signal: killed",
            "the end event's error is shown as envd wrote it"
        );
    }

    #[test]
    fn stream_errors_read_as_code_and_message() {
        let error = ExecError::Stream(ConnectError::new(
            berth_envd_proto::connect::Code::DeadlineExceeded,
            "too slow",
        ));
        assert_eq!(error.to_string(), "deadline_exceeded: too slow");
    }
}
