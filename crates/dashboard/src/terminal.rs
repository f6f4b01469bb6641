//! The browser terminal: a WebSocket bridged, on the server, to a login shell on a PTY
//! started through envd's process API.
//!
//! Browser → server: binary messages are keystrokes (PTY input, `SendInput`); text
//! messages are JSON `{"cols": n, "rows": n}` resizes (`Update`). Server → browser:
//! binary messages are PTY output; one text message `{"exit": code}` when the shell
//! ends, then the socket closes. Closing the socket kills the shell (`SendSignal`).
//!
//! The upgrade needs the session cookie, the session's CSRF token in the query (a
//! WebSocket cannot carry custom headers) and, when the browser sends one, an `Origin`
//! naming this host: a foreign page cannot open a terminal with the user's cookie.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_TYPE, HOST, ORIGIN};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use berth_envd_proto::connect::{encode_envelope, Codec, ContentType, EnvelopeDecoder};
use berth_envd_proto::headers::CONNECT_PROTOCOL_VERSION;
use berth_envd_proto::process::process_event::{data_event, Event};
use berth_envd_proto::process::{
    process_input, process_selector, pty, ProcessConfig, ProcessInput, ProcessSelector, Pty,
    SendInputRequest, SendSignalRequest, Signal, StartRequest, StartResponse, UpdateRequest,
};
use berth_envd_proto::routes;
use futures::StreamExt;
use serde::Deserialize;

use crate::error::DashboardError;
use crate::upstream::Upstream;
use crate::Shared;

/// Largest PTY output message accepted from envd.
const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

#[derive(Deserialize)]
pub struct TerminalQuery {
    csrf: String,
    #[serde(default = "default_cols")]
    cols: u32,
    #[serde(default = "default_rows")]
    rows: u32,
}

fn default_cols() -> u32 {
    80
}

fn default_rows() -> u32 {
    24
}

#[derive(Deserialize)]
struct Resize {
    cols: u32,
    rows: u32,
}

/// Whether `Origin` (when present) is this host, over either scheme.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(ORIGIN).and_then(|value| value.to_str().ok()) else {
        return true;
    };
    let Some(host) = headers.get(HOST).and_then(|value| value.to_str().ok()) else {
        return false;
    };
    origin == format!("http://{host}") || origin == format!("https://{host}")
}

pub async fn upgrade(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(query): Query<TerminalQuery>,
    headers: HeaderMap,
    socket: WebSocketUpgrade,
) -> Result<Response, DashboardError> {
    if !same_origin(&headers) {
        return Err(DashboardError::Csrf);
    }
    let (session, token) = crate::envd::open(&state, &headers, &id).await?;
    if !session.csrf_matches(&query.csrf) {
        return Err(DashboardError::Csrf);
    }
    let size = pty::Size {
        cols: query.cols.clamp(2, 1000),
        rows: query.rows.clamp(2, 1000),
    };
    Ok(socket.on_upgrade(move |socket| async move {
        let bridge = Bridge {
            upstream: state.upstream.clone(),
            id,
            token,
        };
        bridge.run(socket, size).await;
    }))
}

struct Bridge {
    upstream: Upstream,
    id: String,
    token: Option<String>,
}

impl Bridge {
    /// A unary Connect call to envd; returns whether it succeeded.
    async fn unary<M>(&self, route: &str, message: &M) -> bool
    where
        M: prost::Message + serde::Serialize,
    {
        let request = Upstream::envd_request(&self.id, self.token.as_deref(), Method::POST, route)
            .header(CONTENT_TYPE, ContentType::UNARY_JSON.as_str())
            .header(CONNECT_PROTOCOL_VERSION, "1")
            .body(Body::from(Codec::Json.encode(message)));
        match request {
            Ok(request) => self.upstream.call(request).await.status() == StatusCode::OK,
            Err(_) => false,
        }
    }

    async fn run(self, mut socket: WebSocket, size: pty::Size) {
        let start = StartRequest {
            process: Some(ProcessConfig {
                cmd: "/bin/bash".into(),
                args: vec!["-i".into(), "-l".into()],
                envs: HashMap::from([("TERM".to_owned(), "xterm-256color".to_owned())]),
                cwd: None,
            }),
            pty: Some(Pty { size: Some(size) }),
            tag: None,
            stdin: None,
        };
        let request = Upstream::envd_request(
            &self.id,
            self.token.as_deref(),
            Method::POST,
            routes::PROCESS_START,
        )
        .header(CONTENT_TYPE, ContentType::STREAM_JSON.as_str())
        .header(CONNECT_PROTOCOL_VERSION, "1")
        .body(Body::from(encode_envelope(0, &Codec::Json.encode(&start))));
        let Ok(request) = request else { return };
        let response = self.upstream.call(request).await;
        if response.status() != StatusCode::OK {
            let _ = socket
                .send(Message::Text(
                    format!(
                        r#"{{"error":"envd answered {}"}}"#,
                        response.status().as_u16()
                    )
                    .into(),
                ))
                .await;
            return;
        }
        let mut output = response.into_body().into_data_stream();
        let mut decoder = EnvelopeDecoder::new(MAX_MESSAGE_BYTES);
        let mut pid = None;
        // Keystrokes typed before envd said which process it started.
        let mut pending: Vec<u8> = Vec::new();
        loop {
            tokio::select! {
                chunk = output.next() => {
                    let Some(Ok(chunk)) = chunk else { break };
                    decoder.push(&chunk);
                    let mut ended = None;
                    while let Ok(Some(envelope)) = decoder.next_envelope() {
                        if envelope.is_end_stream() {
                            ended.get_or_insert(-1);
                            break;
                        }
                        let Ok(message) = Codec::Json.decode::<StartResponse>(&envelope.payload) else {
                            continue;
                        };
                        match message.event.and_then(|event| event.event) {
                            Some(Event::Start(started)) => {
                                pid = Some(started.pid);
                                if !pending.is_empty() {
                                    let input = std::mem::take(&mut pending);
                                    self.send_input(started.pid, input).await;
                                }
                            }
                            Some(Event::Data(data)) => {
                                if let Some(data_event::Output::Pty(bytes)
                                | data_event::Output::Stdout(bytes)
                                | data_event::Output::Stderr(bytes)) = data.output
                                {
                                    if socket.send(Message::Binary(bytes.into())).await.is_err() {
                                        break;
                                    }
                                }
                            }
                            Some(Event::End(end)) => {
                                ended = Some(end.exit_code);
                            }
                            Some(Event::Keepalive(_)) | None => {}
                        }
                    }
                    if let Some(code) = ended {
                        let _ = socket.send(Message::Text(format!(r#"{{"exit":{code}}}"#).into())).await;
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                }
                message = socket.recv() => {
                    match message {
                        Some(Ok(Message::Binary(bytes))) => match pid {
                            Some(pid) => self.send_input(pid, bytes.to_vec()).await,
                            None => pending.extend_from_slice(&bytes),
                        },
                        Some(Ok(Message::Text(text))) => {
                            if let (Some(pid), Ok(resize)) = (pid, serde_json::from_str::<Resize>(&text)) {
                                let update = UpdateRequest {
                                    process: Some(selector(pid)),
                                    pty: Some(Pty { size: Some(pty::Size {
                                        cols: resize.cols.clamp(2, 1000),
                                        rows: resize.rows.clamp(2, 1000),
                                    }) }),
                                };
                                self.unary(routes::PROCESS_UPDATE, &update).await;
                            }
                        }
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                        Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                    }
                }
            }
        }
        if let Some(pid) = pid {
            let kill = SendSignalRequest {
                process: Some(selector(pid)),
                signal: Signal::Sigkill as i32,
            };
            self.unary(routes::PROCESS_SEND_SIGNAL, &kill).await;
        }
    }

    async fn send_input(&self, pid: u32, input: Vec<u8>) {
        let request = SendInputRequest {
            process: Some(selector(pid)),
            input: Some(ProcessInput {
                input: Some(process_input::Input::Pty(input)),
            }),
        };
        if !self.unary(routes::PROCESS_SEND_INPUT, &request).await {
            tracing::debug!(sandbox = %self.id, "terminal input refused by envd");
        }
    }
}

fn selector(pid: u32) -> ProcessSelector {
    ProcessSelector {
        selector: Some(process_selector::Selector::Pid(pid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn only_this_hosts_origin_may_open_a_terminal() {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1:3000"));
        assert!(same_origin(&headers));
        headers.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:3000"));
        assert!(same_origin(&headers));
        headers.insert(ORIGIN, HeaderValue::from_static("http://evil.example"));
        assert!(!same_origin(&headers));
    }
}
