//! Connect envelope framing (`berth_envd_proto::connect`): arbitrary bytes, delivered in
//! arbitrary chunk sizes, must decode the same way as the whole buffer does, never
//! panic, never yield a payload over the limit, and every envelope must re-encode to
//! exactly the bytes it was read from.
#![no_main]

use berth_envd_proto::connect::{
    decode_envelope, encode_envelope, Envelope, EnvelopeDecoder, EnvelopeError,
    ENVELOPE_HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

const LIMITS: [usize; 5] = [0, 1, 16, 1024, 4 << 20];

/// How a body ended when decoded in one piece.
#[derive(Debug, PartialEq)]
enum Ending {
    Clean,
    Truncated,
    TooLarge,
}

fn decode_whole(body: &[u8], limit: usize) -> (Vec<Envelope>, Ending) {
    let mut envelopes = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        match decode_envelope(rest, limit) {
            Ok((envelope, used)) => {
                assert_eq!(used, ENVELOPE_HEADER_LEN + envelope.payload.len());
                assert!(envelope.payload.len() <= limit);
                assert_eq!(
                    &encode_envelope(envelope.flags, &envelope.payload)[..],
                    &rest[..used]
                );
                rest = &rest[used..];
                envelopes.push(envelope);
            }
            Err(EnvelopeError::Truncated { needed, available }) => {
                assert!(needed > available);
                assert_eq!(available, rest.len());
                return (envelopes, Ending::Truncated);
            }
            Err(EnvelopeError::TooLarge { length, limit: reported }) => {
                assert_eq!(reported, limit);
                assert!(length > limit);
                return (envelopes, Ending::TooLarge);
            }
        }
    }
    (envelopes, Ending::Clean)
}

fn decode_chunked(body: &[u8], limit: usize, chunk: usize) -> (Vec<Envelope>, Ending) {
    let mut decoder = EnvelopeDecoder::new(limit);
    let mut envelopes = Vec::new();
    for piece in body.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_envelope() {
                Ok(Some(envelope)) => envelopes.push(envelope),
                Ok(None) => break,
                Err(EnvelopeError::TooLarge { .. }) => return (envelopes, Ending::TooLarge),
                Err(err @ EnvelopeError::Truncated { .. }) => {
                    panic!("next_envelope reported {err} instead of waiting for more bytes")
                }
            }
        }
    }
    let ending = match decoder.finish() {
        Ok(()) => Ending::Clean,
        Err(EnvelopeError::Truncated { .. }) => Ending::Truncated,
        Err(EnvelopeError::TooLarge { .. }) => Ending::TooLarge,
    };
    (envelopes, ending)
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let limit = LIMITS[usize::from(control) % LIMITS.len()];
    let chunk = usize::from(control) / LIMITS.len() + 1;
    let whole = decode_whole(body, limit);
    let chunked = decode_chunked(body, limit, chunk);
    assert_eq!(whole, chunked, "chunked decoding (chunk {chunk}) differs from whole-buffer decoding");
});
