//! Server side of the Connect protocol, as axum method routers.
//!
//! Each RPC is one route `POST /<package>.<Service>/<Method>` built by one of three
//! constructors, all taking an async handler closure that gets an [`RpcContext`] and
//! the decoded request:
//!
//! ```ignore
//! use axum::Router;
//! use crate::connect::{self, RpcContext};
//! let router = Router::new()
//!     .route("/filesystem.Filesystem/Stat", connect::unary(move |ctx: RpcContext, req: StatRequest| {
//!         let state = state.clone();
//!         async move { stat(&state, &ctx, req) }   // -> Result<StatResponse, ConnectError>
//!     }))
//!     .route("/filesystem.Filesystem/WatchDir", connect::server_stream(move |ctx, req: WatchDirRequest| {
//!         async move { Ok(events_stream) }   // -> Result<impl Stream<Item = Result<WatchDirResponse, ConnectError>>, ConnectError>
//!     }));
//! ```
//!
//! - [`unary`]: `application/json` or `application/proto` in and out; errors are JSON
//!   bodies with the code's HTTP status. The handler runs under the
//!   `Connect-Timeout-Ms` deadline (exceeding it answers `deadline_exceeded`).
//! - [`server_stream`]: `application/connect+json` / `+proto`; the request is one
//!   envelope; every item of the handler's stream is sent as an envelope as soon as
//!   it is produced, then the end-of-stream envelope (carrying the error, if any).
//!   When `Keepalive-Ping-Interval: <seconds>` is set, [`KeepAlive::keepalive`]
//!   messages are sent whenever the stream was idle that long. When the
//!   `Connect-Timeout-Ms` deadline passes the stream ends with `deadline_exceeded`.
//!   In every case (end, deadline, client gone) the handler's stream is dropped, so
//!   handlers release resources in `Drop`; [`RpcContext::deadline`] lets them tell a
//!   timeout from a disconnect.
//! - [`client_stream`]: request envelopes decoded as they arrive, handed to the
//!   handler as a [`MessageStream`]; the response is one envelope plus end-of-stream.
//!
//! Shared rules: a content type of the wrong kind answers HTTP 415 with `Accept-Post`;
//! compressed requests answer `unimplemented`; malformed messages and truncated
//! envelopes answer `invalid_argument`, messages over [`MAX_MESSAGE_BYTES`]
//! `resource_exhausted`; unknown JSON fields are ignored.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use berth_envd_proto::connect::{
    decode_envelope, encode_envelope, parse_timeout_ms, Code, Codec, ConnectError, ContentType,
    EndStream, EnvelopeDecoder, Framing,
};
use berth_envd_proto::headers::{CONNECT_TIMEOUT_MS, KEEPALIVE_PING_INTERVAL};
use berth_envd_proto::KeepAlive;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

/// Largest request or response message accepted, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A stream of decoded client-stream request messages.
pub type MessageStream<M> = Pin<Box<dyn Stream<Item = Result<M, ConnectError>> + Send>>;

/// What a handler knows about its call besides the request message.
#[derive(Debug, Clone)]
pub struct RpcContext {
    /// The request headers (auth, user selection, …).
    pub headers: HeaderMap,
    /// When `Connect-Timeout-Ms` runs out, if it was sent.
    pub deadline: Option<Instant>,
    /// The `Connect-Timeout-Ms` value itself.
    pub timeout: Option<Duration>,
    /// The requested idle-stream keepalive interval.
    pub keepalive: Option<Duration>,
    /// The codec of the call.
    pub codec: Codec,
}

impl RpcContext {
    fn from_headers(headers: HeaderMap, codec: Codec) -> Result<Self, ConnectError> {
        let timeout = match headers.get(CONNECT_TIMEOUT_MS) {
            Some(value) => Some(parse_timeout_ms(value.to_str().map_err(|_| {
                ConnectError::invalid_argument("Connect-Timeout-Ms is not ASCII")
            })?)?),
            None => None,
        };
        // A malformed keepalive request only loses keepalives; it is not worth failing.
        let keepalive = headers
            .get(KEEPALIVE_PING_INTERVAL)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .filter(|seconds| *seconds > 0)
            .map(Duration::from_secs);
        Ok(Self {
            deadline: timeout.map(|timeout| Instant::now() + timeout),
            timeout,
            keepalive,
            headers,
            codec,
        })
    }
}

/// A unary RPC route.
pub fn unary<S, Req, Resp, F, Fut>(handler: F) -> MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Req: prost::Message + DeserializeOwned + Default + Send + 'static,
    Resp: prost::Message + Serialize + Send + 'static,
    F: Fn(RpcContext, Req) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, ConnectError>> + Send + 'static,
{
    post(move |request: Request| {
        let handler = handler.clone();
        async move {
            let Some(content_type) = request_content_type(request.headers(), Framing::Unary) else {
                return unsupported_media_type(Framing::Unary);
            };
            match serve_unary(request, content_type.codec, handler).await {
                Ok(body) => (
                    [(header::CONTENT_TYPE, content_type.as_str())],
                    Body::from(body),
                )
                    .into_response(),
                Err(err) => unary_error(&err),
            }
        }
    })
}

async fn serve_unary<Req, Resp, F, Fut>(
    request: Request,
    codec: Codec,
    handler: F,
) -> Result<Vec<u8>, ConnectError>
where
    Req: prost::Message + DeserializeOwned + Default,
    Resp: prost::Message + Serialize,
    F: Fn(RpcContext, Req) -> Fut,
    Fut: Future<Output = Result<Resp, ConnectError>>,
{
    let (parts, body) = request.into_parts();
    refuse_compression(&parts.headers, header::CONTENT_ENCODING.as_str())?;
    let context = RpcContext::from_headers(parts.headers, codec)?;
    let deadline = context.deadline;
    let call = async move {
        let body = read_body(body).await?;
        let message: Req = codec.decode(&body)?;
        let response = handler(context, message).await?;
        Ok(codec.encode(&response))
    };
    with_deadline(deadline, call).await
}

/// A server-streaming RPC route.
pub fn server_stream<S, Req, Resp, F, Fut, St>(handler: F) -> MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Req: prost::Message + DeserializeOwned + Default + Send + 'static,
    Resp: prost::Message + Serialize + KeepAlive + Send + 'static,
    F: Fn(RpcContext, Req) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<St, ConnectError>> + Send + 'static,
    St: Stream<Item = Result<Resp, ConnectError>> + Send + 'static,
{
    post(move |request: Request| {
        let handler = handler.clone();
        async move {
            let Some(content_type) = request_content_type(request.headers(), Framing::Stream)
            else {
                return unsupported_media_type(Framing::Stream);
            };
            let codec = content_type.codec;
            let body = match open_server_stream(request, codec, handler).await {
                Ok((context, stream)) => Body::from_stream(response_frames(context, stream)),
                Err(err) => Body::from(EndStream::envelope(Some(err))),
            };
            ([(header::CONTENT_TYPE, content_type.as_str())], body).into_response()
        }
    })
}

async fn open_server_stream<Req, F, Fut, St>(
    request: Request,
    codec: Codec,
    handler: F,
) -> Result<(RpcContext, St), ConnectError>
where
    Req: prost::Message + DeserializeOwned + Default,
    F: Fn(RpcContext, Req) -> Fut,
    Fut: Future<Output = Result<St, ConnectError>>,
{
    let (parts, body) = request.into_parts();
    refuse_compression(&parts.headers, "connect-content-encoding")?;
    let context = RpcContext::from_headers(parts.headers, codec)?;
    let deadline = context.deadline;
    let handler_context = context.clone();
    let open = async move {
        let body = read_body(body).await?;
        let (envelope, used) = decode_envelope(&body, MAX_MESSAGE_BYTES)?;
        if envelope.is_compressed() {
            return Err(compression_unsupported());
        }
        if used != body.len() {
            return Err(ConnectError::invalid_argument(
                "a server-streaming request must hold exactly one message envelope",
            ));
        }
        let message: Req = codec.decode(&envelope.payload)?;
        handler(handler_context, message).await
    };
    let stream = with_deadline(deadline, open).await?;
    Ok((context, stream))
}

/// Frames a handler's stream: one envelope per message, keepalives while idle, the
/// end-of-stream envelope last. Dropping the returned stream (client gone) drops the
/// handler's stream at once.
fn response_frames<Resp, St>(
    context: RpcContext,
    stream: St,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send
where
    Resp: prost::Message + Serialize + KeepAlive + Send + 'static,
    St: Stream<Item = Result<Resp, ConnectError>> + Send + 'static,
{
    struct Frames<St> {
        stream: Option<Pin<Box<St>>>,
        context: RpcContext,
    }
    let state = Frames {
        stream: Some(Box::pin(stream)),
        context,
    };
    futures::stream::unfold(state, |mut state| async move {
        let stream = state.stream.as_mut()?;
        let codec = state.context.codec;
        let far_future = Instant::now() + Duration::from_secs(86_400 * 365);
        let deadline = state.context.deadline.unwrap_or(far_future);
        let keepalive_at = state
            .context
            .keepalive
            .map_or(far_future, |interval| Instant::now() + interval);
        let frame = tokio::select! {
            item = stream.next() => match item {
                Some(Ok(message)) => encode_envelope(0, &codec.encode(&message)),
                Some(Err(err)) => {
                    state.stream = None;
                    EndStream::envelope(Some(err))
                }
                None => {
                    state.stream = None;
                    EndStream::envelope(None)
                }
            },
            () = tokio::time::sleep_until(deadline) => {
                state.stream = None;
                EndStream::envelope(Some(ConnectError::new(
                    Code::DeadlineExceeded,
                    "the call's Connect-Timeout-Ms deadline passed",
                )))
            }
            () = tokio::time::sleep_until(keepalive_at) => {
                encode_envelope(0, &codec.encode(&Resp::keepalive()))
            }
        };
        Some((Ok(frame), state))
    })
}

/// A client-streaming RPC route.
pub fn client_stream<S, Req, Resp, F, Fut>(handler: F) -> MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Req: prost::Message + DeserializeOwned + Default + Send + 'static,
    Resp: prost::Message + Serialize + Send + 'static,
    F: Fn(RpcContext, MessageStream<Req>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, ConnectError>> + Send + 'static,
{
    post(move |request: Request| {
        let handler = handler.clone();
        async move {
            let Some(content_type) = request_content_type(request.headers(), Framing::Stream)
            else {
                return unsupported_media_type(Framing::Stream);
            };
            let codec = content_type.codec;
            let (parts, body) = request.into_parts();
            let result = async {
                refuse_compression(&parts.headers, "connect-content-encoding")?;
                let context = RpcContext::from_headers(parts.headers, codec)?;
                let deadline = context.deadline;
                let messages = request_messages::<Req>(body, codec);
                with_deadline(deadline, handler(context, messages)).await
            }
            .await;
            let body = match result {
                Ok(response) => {
                    let mut frames = encode_envelope(0, &codec.encode(&response)).to_vec();
                    frames.extend_from_slice(&EndStream::envelope(None));
                    Body::from(frames)
                }
                Err(err) => Body::from(EndStream::envelope(Some(err))),
            };
            ([(header::CONTENT_TYPE, content_type.as_str())], body).into_response()
        }
    })
}

/// Decodes request envelopes as body chunks arrive.
fn request_messages<M>(body: Body, codec: Codec) -> MessageStream<M>
where
    M: prost::Message + DeserializeOwned + Default + Send + 'static,
{
    struct Decoding {
        body: Option<Body>,
        decoder: EnvelopeDecoder,
    }
    let state = Decoding {
        body: Some(body),
        decoder: EnvelopeDecoder::new(MAX_MESSAGE_BYTES),
    };
    Box::pin(futures::stream::unfold(
        state,
        move |mut state| async move {
            loop {
                let body = state.body.as_mut()?;
                match state.decoder.next_envelope() {
                    Ok(Some(envelope)) => {
                        if envelope.is_end_stream() {
                            return None;
                        }
                        if envelope.is_compressed() {
                            state.body = None;
                            return Some((Err(compression_unsupported()), state));
                        }
                        let message = codec.decode::<M>(&envelope.payload);
                        if message.is_err() {
                            state.body = None;
                        }
                        return Some((message, state));
                    }
                    Ok(None) => {}
                    Err(err) => {
                        state.body = None;
                        return Some((Err(err.into()), state));
                    }
                }
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            state.decoder.push(&data);
                        }
                    }
                    Some(Err(err)) => {
                        state.body = None;
                        return Some((
                            Err(ConnectError::new(
                                Code::Canceled,
                                format!("reading the request stream failed: {err}"),
                            )),
                            state,
                        ));
                    }
                    None => {
                        state.body = None;
                        return match state.decoder.finish() {
                            Ok(()) => None,
                            Err(err) => Some((Err(err.into()), state)),
                        };
                    }
                }
            }
        },
    ))
}

fn request_content_type(headers: &HeaderMap, framing: Framing) -> Option<ContentType> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(ContentType::parse)
        .filter(|content_type| content_type.framing == framing)
}

/// HTTP 415, naming what the method accepts (Connect's rule for unknown types).
fn unsupported_media_type(framing: Framing) -> Response {
    let accepted = match framing {
        Framing::Unary => "application/json, application/proto",
        Framing::Stream => "application/connect+json, application/connect+proto",
    };
    (
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        [(
            HeaderName::from_static("accept-post"),
            HeaderValue::from_static(accepted),
        )],
        format!("unsupported content type; this method accepts {accepted}"),
    )
        .into_response()
}

fn refuse_compression(headers: &HeaderMap, name: &str) -> Result<(), ConnectError> {
    match headers.get(name).map(|value| value.as_bytes()) {
        None | Some(b"identity") => Ok(()),
        Some(_) => Err(compression_unsupported()),
    }
}

fn compression_unsupported() -> ConnectError {
    ConnectError::new(
        Code::Unimplemented,
        "compressed messages are not supported; send identity encoding",
    )
}

async fn read_body(body: Body) -> Result<Bytes, ConnectError> {
    // One envelope header of slack so an oversized streaming request is reported by
    // the envelope decoder with its announced size.
    let limited = http_body_util::Limited::new(body, MAX_MESSAGE_BYTES + 5);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("request body exceeds the {MAX_MESSAGE_BYTES}-byte message limit"),
        )),
        Err(err) => Err(ConnectError::new(
            Code::Canceled,
            format!("reading the request body failed: {err}"),
        )),
    }
}

async fn with_deadline<T>(
    deadline: Option<Instant>,
    call: impl Future<Output = Result<T, ConnectError>>,
) -> Result<T, ConnectError> {
    match deadline {
        None => call.await,
        Some(deadline) => tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or_else(|_| {
                Err(ConnectError::new(
                    Code::DeadlineExceeded,
                    "the call's Connect-Timeout-Ms deadline passed",
                ))
            }),
    }
}

/// The response of a failed unary call.
pub fn unary_error(err: &ConnectError) -> Response {
    let status =
        StatusCode::from_u16(err.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        err.to_json(),
    )
        .into_response()
}
