//! The Connect protocol's wire pieces: content types and codecs, error codes with
//! their HTTP statuses, error and end-of-stream bodies, 5-byte envelopes, and the
//! `Connect-Timeout-Ms` header.
//!
//! Unary calls carry one bare message per body (`application/json` or
//! `application/proto`); errors are a JSON body `{"code","message"}` with the code's
//! HTTP status. Streams (`application/connect+json` / `+proto`) carry envelopes: a
//! flag byte, a 4-byte big-endian length, then the payload. The last response
//! envelope has flag [`FLAG_END_STREAM`] and a JSON [`EndStream`] payload, which holds
//! the error, if any; stream responses are always HTTP 200.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Envelope flag: the payload is compressed (envd never negotiates compression).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the final envelope of a response stream, holding [`EndStream`].
pub const FLAG_END_STREAM: u8 = 0x02;
/// Bytes before an envelope's payload: flag byte + 4-byte big-endian length.
pub const ENVELOPE_HEADER_LEN: usize = 5;
/// The protocol version clients send in `Connect-Protocol-Version`.
pub const PROTOCOL_VERSION: &str = "1";

/// Connect error codes, spelled on the wire in snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// Every code, in the order of their gRPC numbers.
    pub const ALL: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The wire name, e.g. `not_found`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// Parses a wire name; `None` for anything not in the Connect spec.
    pub fn from_wire(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|code| code.as_str() == name)
    }

    /// The HTTP status a unary error response with this code carries.
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }

    /// The code a client infers from an HTTP status when the body is not a Connect
    /// error (the Connect spec's fallback table).
    pub fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Connect error: a code and a human-readable message. This is also the JSON body
/// of a unary error response and the `error` of an [`EndStream`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ConnectError {
    pub code: Code,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// The JSON body of a unary error response.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a code and a string always serialize")
    }
}

/// The payload of the final envelope of a stream response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndStream {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ConnectError>,
    /// Trailing metadata; envd sends none but always includes the (empty) object.
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

impl EndStream {
    /// The end-of-stream envelope (flag [`FLAG_END_STREAM`]) ending a stream with
    /// `error`, or successfully when `None`.
    pub fn envelope(error: Option<ConnectError>) -> Bytes {
        let end = EndStream {
            error,
            metadata: serde_json::Map::new(),
        };
        let payload = serde_json::to_vec(&end).expect("end-of-stream always serializes");
        encode_envelope(FLAG_END_STREAM, &payload)
    }
}

/// Message encoding of a call, from its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// proto3 JSON mapping.
    Json,
    /// Binary protobuf.
    Proto,
}

/// How a call is framed, from its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One bare message per body: `application/json`, `application/proto`.
    Unary,
    /// Enveloped messages: `application/connect+json`, `application/connect+proto`.
    Stream,
}

/// A parsed Connect content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentType {
    pub framing: Framing,
    pub codec: Codec,
}

impl ContentType {
    pub const UNARY_JSON: ContentType = ContentType {
        framing: Framing::Unary,
        codec: Codec::Json,
    };
    pub const UNARY_PROTO: ContentType = ContentType {
        framing: Framing::Unary,
        codec: Codec::Proto,
    };
    pub const STREAM_JSON: ContentType = ContentType {
        framing: Framing::Stream,
        codec: Codec::Json,
    };
    pub const STREAM_PROTO: ContentType = ContentType {
        framing: Framing::Stream,
        codec: Codec::Proto,
    };

    /// Parses a `Content-Type` header value; parameters (`; charset=utf-8`) and case
    /// are ignored. `None` for types Connect does not define.
    pub fn parse(header: &str) -> Option<ContentType> {
        let media = header.split(';').next()?.trim().to_ascii_lowercase();
        match media.as_str() {
            "application/json" => Some(Self::UNARY_JSON),
            "application/proto" => Some(Self::UNARY_PROTO),
            "application/connect+json" => Some(Self::STREAM_JSON),
            "application/connect+proto" => Some(Self::STREAM_PROTO),
            _ => None,
        }
    }

    /// The header value for responses of this type.
    pub fn as_str(self) -> &'static str {
        match (self.framing, self.codec) {
            (Framing::Unary, Codec::Json) => "application/json",
            (Framing::Unary, Codec::Proto) => "application/proto",
            (Framing::Stream, Codec::Json) => "application/connect+json",
            (Framing::Stream, Codec::Proto) => "application/connect+proto",
        }
    }
}

impl Codec {
    /// Decodes one message. Errors are `invalid_argument` with the decoder's reason.
    pub fn decode<M>(self, payload: &[u8]) -> Result<M, ConnectError>
    where
        M: prost::Message + DeserializeOwned + Default,
    {
        match self {
            Codec::Proto => M::decode(payload).map_err(|err| {
                ConnectError::invalid_argument(format!("malformed protobuf message: {err}"))
            }),
            Codec::Json => {
                // proto3 JSON: an empty body is not valid JSON, but clients send `{}`.
                serde_json::from_slice(payload).map_err(|err| {
                    ConnectError::invalid_argument(format!("malformed JSON message: {err}"))
                })
            }
        }
    }

    /// Encodes one message.
    pub fn encode<M>(self, message: &M) -> Vec<u8>
    where
        M: prost::Message + Serialize,
    {
        match self {
            Codec::Proto => message.encode_to_vec(),
            Codec::Json => {
                serde_json::to_vec(message).expect("generated messages always serialize")
            }
        }
    }
}

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub payload: Bytes,
}

impl Envelope {
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }

    pub fn is_compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSED != 0
    }
}

/// Why bytes are not a valid envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The input ends inside an envelope's header or payload.
    #[error("truncated envelope: {needed} bytes needed, {available} available")]
    Truncated { needed: usize, available: usize },
    /// The length prefix exceeds the largest message accepted.
    #[error("envelope of {length} bytes exceeds the {limit}-byte message limit")]
    TooLarge { length: usize, limit: usize },
}

impl From<EnvelopeError> for ConnectError {
    fn from(err: EnvelopeError) -> Self {
        let code = match err {
            EnvelopeError::Truncated { .. } => Code::InvalidArgument,
            EnvelopeError::TooLarge { .. } => Code::ResourceExhausted,
        };
        ConnectError::new(code, err.to_string())
    }
}

/// Frames one payload.
pub fn encode_envelope(flags: u8, payload: &[u8]) -> Bytes {
    let length = u32::try_from(payload.len()).expect("envelope payloads are below 4 GiB");
    let mut frame = BytesMut::with_capacity(ENVELOPE_HEADER_LEN + payload.len());
    frame.put_u8(flags);
    frame.put_u32(length);
    frame.put_slice(payload);
    frame.freeze()
}

/// Decodes the envelope at the start of `input`, returning it and the number of
/// bytes it used. A payload longer than `limit` is refused from its header alone,
/// before any of it is buffered.
pub fn decode_envelope(input: &[u8], limit: usize) -> Result<(Envelope, usize), EnvelopeError> {
    if input.len() < ENVELOPE_HEADER_LEN {
        return Err(EnvelopeError::Truncated {
            needed: ENVELOPE_HEADER_LEN,
            available: input.len(),
        });
    }
    let flags = input[0];
    let length = u32::from_be_bytes([input[1], input[2], input[3], input[4]]) as usize;
    if length > limit {
        return Err(EnvelopeError::TooLarge { length, limit });
    }
    let total = ENVELOPE_HEADER_LEN + length;
    if input.len() < total {
        return Err(EnvelopeError::Truncated {
            needed: total,
            available: input.len(),
        });
    }
    let payload = Bytes::copy_from_slice(&input[ENVELOPE_HEADER_LEN..total]);
    Ok((Envelope { flags, payload }, total))
}

/// Splits a body arriving in chunks into envelopes.
#[derive(Debug)]
pub struct EnvelopeDecoder {
    buffer: BytesMut,
    limit: usize,
}

impl EnvelopeDecoder {
    /// A decoder refusing payloads longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            limit,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete envelope, `Ok(None)` when more bytes are needed, or an error
    /// as soon as a header announces an oversized payload.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, EnvelopeError> {
        match decode_envelope(&self.buffer, self.limit) {
            Ok((envelope, used)) => {
                self.buffer.advance(used);
                Ok(Some(envelope))
            }
            Err(EnvelopeError::Truncated { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Called at the end of the body: leftover bytes are a truncated envelope.
    pub fn finish(&self) -> Result<(), EnvelopeError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        match decode_envelope(&self.buffer, self.limit) {
            Err(err) => Err(err),
            // A complete envelope is never left behind by `next_envelope`.
            Ok((_, used)) => Err(EnvelopeError::Truncated {
                needed: used,
                available: self.buffer.len(),
            }),
        }
    }
}

/// Parses `Connect-Timeout-Ms`: a positive integer of at most 10 digits.
pub fn parse_timeout_ms(value: &str) -> Result<Duration, ConnectError> {
    let digits = value.trim();
    if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConnectError::invalid_argument(format!(
            "invalid Connect-Timeout-Ms {value:?}: expected a positive integer of at most 10 digits"
        )));
    }
    let millis: u64 = digits
        .parse()
        .expect("ten ASCII digits always fit in a u64");
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filesystem::{EntryInfo, FileType};
    use crate::process::{
        process_event, process_selector, ProcessEvent, ProcessSelector, SendSignalRequest, Signal,
        StartResponse,
    };

    #[test]
    fn code_names_round_trip_and_map_to_statuses() {
        for code in Code::ALL {
            assert_eq!(Code::from_wire(code.as_str()), Some(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
        assert_eq!(Code::NotFound.http_status(), 404);
        assert_eq!(Code::InvalidArgument.http_status(), 400);
        assert_eq!(Code::DeadlineExceeded.http_status(), 504);
        assert_eq!(Code::Unauthenticated.http_status(), 401);
        assert_eq!(Code::ResourceExhausted.http_status(), 429);
        assert_eq!(Code::Canceled.http_status(), 499);
        assert_eq!(Code::from_wire("NOT_FOUND"), None);
    }

    #[test]
    fn error_body_is_code_and_message() {
        let err = ConnectError::not_found("process with pid 7 not found");
        let body: serde_json::Value = serde_json::from_slice(&err.to_json()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"code": "not_found", "message": "process with pid 7 not found"})
        );
    }

    #[test]
    fn end_stream_envelope_has_flag_error_and_metadata() {
        let frame = EndStream::envelope(Some(ConnectError::new(Code::DeadlineExceeded, "late")));
        let (envelope, used) = decode_envelope(&frame, 1024).unwrap();
        assert_eq!(used, frame.len());
        assert!(envelope.is_end_stream());
        let body: serde_json::Value = serde_json::from_slice(&envelope.payload).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": "deadline_exceeded", "message": "late"}, "metadata": {}})
        );
        let ok = EndStream::envelope(None);
        let (envelope, _) = decode_envelope(&ok, 1024).unwrap();
        assert_eq!(&envelope.payload[..], b"{\"metadata\":{}}");
    }

    #[test]
    fn envelope_round_trips() {
        let frame = encode_envelope(0, b"{\"a\":1}");
        assert_eq!(&frame[..5], &[0, 0, 0, 0, 7]);
        let (envelope, used) = decode_envelope(&frame, 7).unwrap();
        assert_eq!(used, 12);
        assert_eq!(envelope.flags, 0);
        assert_eq!(&envelope.payload[..], b"{\"a\":1}");
    }

    #[test]
    fn truncated_and_oversized_envelopes_are_typed_errors() {
        let frame = encode_envelope(0, b"hello");
        assert_eq!(
            decode_envelope(&frame[..3], 100),
            Err(EnvelopeError::Truncated {
                needed: 5,
                available: 3
            })
        );
        assert_eq!(
            decode_envelope(&frame[..7], 100),
            Err(EnvelopeError::Truncated {
                needed: 10,
                available: 7
            })
        );
        assert_eq!(
            decode_envelope(&[0, 0xff, 0xff, 0xff, 0xff], 100),
            Err(EnvelopeError::TooLarge {
                length: u32::MAX as usize,
                limit: 100
            })
        );
        assert_eq!(
            ConnectError::from(EnvelopeError::TooLarge {
                length: 5,
                limit: 1
            })
            .code,
            Code::ResourceExhausted
        );
    }

    #[test]
    fn decoder_reassembles_envelopes_split_across_chunks() {
        let mut body = Vec::new();
        body.extend_from_slice(&encode_envelope(0, b"one"));
        body.extend_from_slice(&encode_envelope(0, b"second"));
        let mut decoder = EnvelopeDecoder::new(64);
        let mut payloads = Vec::new();
        for byte in &body {
            decoder.push(std::slice::from_ref(byte));
            while let Some(envelope) = decoder.next_envelope().unwrap() {
                payloads.push(envelope.payload);
            }
        }
        assert_eq!(payloads, vec![Bytes::from("one"), Bytes::from("second")]);
        decoder.finish().unwrap();

        let mut truncated = EnvelopeDecoder::new(64);
        truncated.push(&body[..body.len() - 1]);
        assert!(truncated.next_envelope().unwrap().is_some());
        assert!(truncated.next_envelope().unwrap().is_none());
        assert!(matches!(
            truncated.finish(),
            Err(EnvelopeError::Truncated { .. })
        ));
    }

    #[test]
    fn content_types_parse_with_parameters() {
        assert_eq!(
            ContentType::parse("application/json; charset=utf-8"),
            Some(ContentType::UNARY_JSON)
        );
        assert_eq!(
            ContentType::parse("Application/Connect+Proto"),
            Some(ContentType::STREAM_PROTO)
        );
        assert_eq!(ContentType::parse("text/plain"), None);
        assert_eq!(ContentType::parse("application/grpc"), None);
    }

    #[test]
    fn timeout_header_parses_positive_integers_only() {
        assert_eq!(
            parse_timeout_ms("1500").unwrap(),
            Duration::from_millis(1500)
        );
        for bad in ["", "-1", "1.5", "12345678901", "abc"] {
            assert_eq!(
                parse_timeout_ms(bad).unwrap_err().code,
                Code::InvalidArgument
            );
        }
    }

    #[test]
    fn json_uses_proto3_mapping() {
        let event = StartResponse {
            event: Some(ProcessEvent {
                event: Some(process_event::Event::Data(process_event::DataEvent {
                    output: Some(process_event::data_event::Output::Stdout(b"hi\n".to_vec())),
                })),
            }),
        };
        let json: serde_json::Value = serde_json::from_slice(&Codec::Json.encode(&event)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"event": {"data": {"stdout": "aGkK"}}})
        );

        let entry = EntryInfo {
            name: "a".into(),
            r#type: FileType::Directory as i32,
            size: 4096,
            symlink_target: Some("/x".into()),
            modified_time: Some(crate::timestamp::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            ..Default::default()
        };
        let json: serde_json::Value = serde_json::from_slice(&Codec::Json.encode(&entry)).unwrap();
        assert_eq!(json["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(json["size"], "4096");
        assert_eq!(json["symlinkTarget"], "/x");
        assert_eq!(json["modifiedTime"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn json_decoding_tolerates_unknown_fields_and_reports_malformed_input() {
        let request: SendSignalRequest = Codec::Json
            .decode(br#"{"process":{"pid":42},"signal":"SIGNAL_SIGKILL","someNewField":true}"#)
            .unwrap();
        assert_eq!(
            request.process,
            Some(ProcessSelector {
                selector: Some(process_selector::Selector::Pid(42))
            })
        );
        assert_eq!(request.signal, Signal::Sigkill as i32);

        let err = Codec::Json
            .decode::<SendSignalRequest>(br#"{"process": "#)
            .unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert!(
            err.message.starts_with("malformed JSON message"),
            "{}",
            err.message
        );
    }

    #[test]
    fn proto_codec_round_trips() {
        let request = SendSignalRequest {
            process: Some(ProcessSelector {
                selector: Some(process_selector::Selector::Tag("web".into())),
            }),
            signal: Signal::Sigterm as i32,
        };
        let bytes = Codec::Proto.encode(&request);
        assert_eq!(
            Codec::Proto.decode::<SendSignalRequest>(&bytes).unwrap(),
            request
        );
        assert_eq!(
            Codec::Proto
                .decode::<SendSignalRequest>(&[0xff, 0xff])
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
    }
}
