//! The `/files` upload body path (`berth_envd::files::upload`): multipart parsing and
//! gzip decoding of request bodies, plus `X-Metadata-*` header validation.
//!
//! - arbitrary bytes as a multipart body: never a panic, every failure is a 400;
//! - a well-formed multipart body built from arbitrary parts, delivered in arbitrary
//!   chunk sizes: the sink receives exactly the `file` parts, in order, byte for byte;
//! - arbitrary bytes as a gzip body: never a panic, failures are 400s;
//! - arbitrary header names/values: metadata is accepted or refused with a 400.
#![no_main]

use std::future::Future;

use arbitrary::{Arbitrary, Unstructured};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use berth_envd::files::metadata;
use berth_envd::files::upload::{gunzip, read_multipart, ByteStream, PartSink};
use berth_envd::files::HttpError;
use bytes::Bytes;
use futures::{stream, StreamExt};
use libfuzzer_sys::fuzz_target;

const BOUNDARY: &str = "berthFuzzBoundary7MA4YWxkTrZu0gW";
/// Stop collecting a decoded body after this much (gzip bombs are fine, slow is not).
const MAX_DECODED: usize = 8 << 20;

#[derive(Default)]
struct CollectSink {
    parts: Vec<(Option<String>, Vec<u8>)>,
}

impl PartSink for CollectSink {
    fn accept<'a>(
        &'a mut self,
        file_name: Option<String>,
        mut content: ByteStream,
    ) -> impl Future<Output = Result<(), HttpError>> + Send + 'a {
        async move {
            let mut data = Vec::new();
            while let Some(chunk) = content.next().await {
                data.extend_from_slice(&chunk?);
            }
            self.parts.push((file_name, data));
            Ok(())
        }
    }
}

fn chunked(body: Vec<u8>, chunk: usize) -> impl futures::Stream<Item = Result<Bytes, HttpError>> + Send + 'static {
    let pieces: Vec<Result<Bytes, HttpError>> = body
        .chunks(chunk.max(1))
        .map(|piece| Ok(Bytes::copy_from_slice(piece)))
        .collect();
    stream::iter(pieces)
}

fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime always builds")
        .block_on(future)
}

fn assert_bad_request(result: &Result<(), HttpError>) {
    if let Err(err) = result {
        assert_eq!(err.status, StatusCode::BAD_REQUEST, "unexpected error: {err:?}");
        assert!(!err.message.is_empty());
    }
}

#[derive(Arbitrary, Debug)]
struct Part {
    is_file: bool,
    file_name: Option<u16>,
    content: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum Case {
    RawMultipart { chunk: u8, body: Vec<u8> },
    WellFormed { chunk: u8, parts: Vec<Part> },
    Gzip { chunk: u8, body: Vec<u8> },
    Metadata { headers: Vec<(String, Vec<u8>)> },
}

fn well_formed(parts: &[Part]) -> Option<(Vec<u8>, Vec<(Option<String>, Vec<u8>)>)> {
    let delimiter = format!("\r\n--{BOUNDARY}");
    let mut body = Vec::new();
    let mut expected = Vec::new();
    for (index, part) in parts.iter().enumerate() {
        if part.content.windows(delimiter.len()).any(|w| w == delimiter.as_bytes()) {
            return None;
        }
        let name = if part.is_file { "file".to_owned() } else { format!("field{index}") };
        let file_name = part.file_name.map(|n| format!("name-{n}.bin"));
        body.extend_from_slice(format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"").as_bytes());
        if let Some(file_name) = &file_name {
            body.extend_from_slice(format!("; filename=\"{file_name}\"").as_bytes());
        }
        body.extend_from_slice(b"\r\nContent-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(&part.content);
        body.extend_from_slice(b"\r\n");
        if part.is_file {
            expected.push((file_name, part.content.clone()));
        }
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    Some((body, expected))
}

fuzz_target!(|data: &[u8]| {
    let Ok(case) = Case::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    match case {
        Case::RawMultipart { chunk, body } => {
            let mut sink = CollectSink::default();
            let result = block_on(read_multipart(chunked(body, usize::from(chunk)), BOUNDARY, &mut sink));
            assert_bad_request(&result);
        }
        Case::WellFormed { chunk, parts } => {
            let Some((body, expected)) = well_formed(&parts) else {
                return;
            };
            let mut sink = CollectSink::default();
            let result = block_on(read_multipart(chunked(body, usize::from(chunk)), BOUNDARY, &mut sink));
            assert!(result.is_ok(), "well-formed multipart refused: {result:?}");
            assert_eq!(sink.parts, expected);
        }
        Case::Gzip { chunk, body } => {
            let mut decoded = gunzip(chunked(body, usize::from(chunk)));
            block_on(async {
                let mut total = 0;
                while let Some(piece) = decoded.next().await {
                    match piece {
                        Ok(bytes) => {
                            total += bytes.len();
                            if total > MAX_DECODED {
                                break;
                            }
                        }
                        Err(err) => {
                            assert_eq!(err.status, StatusCode::BAD_REQUEST, "unexpected error: {err:?}");
                            break;
                        }
                    }
                }
            });
        }
        Case::Metadata { headers } => {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                let (Ok(name), Ok(value)) = (
                    HeaderName::try_from(format!("x-metadata-{name}")),
                    HeaderValue::from_bytes(&value),
                ) else {
                    continue;
                };
                map.append(name, value);
            }
            match metadata::from_headers(&map) {
                Ok(accepted) => {
                    for (key, value) in accepted {
                        assert!(!key.is_empty());
                        assert!(value.bytes().all(|b| (0x20..=0x7e).contains(&b)));
                    }
                }
                Err(err) => assert_eq!(err.status, StatusCode::BAD_REQUEST),
            }
        }
    }
});
