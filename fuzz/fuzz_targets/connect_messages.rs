//! Request decoding for every envd RPC in both Connect codecs (`Codec::Json`,
//! `Codec::Proto`), plus the header parsers: arbitrary input must never panic, and
//! whatever decodes must survive an encode/decode round trip unchanged.
#![no_main]

use berth_envd_proto::connect::{parse_timeout_ms, Codec, ContentType};
use berth_envd_proto::{filesystem, process};
use libfuzzer_sys::fuzz_target;

fn round_trip<M>(payload: &[u8])
where
    M: prost::Message + serde::Serialize + serde::de::DeserializeOwned + Default + PartialEq + std::fmt::Debug,
{
    for codec in [Codec::Json, Codec::Proto] {
        if let Ok(message) = codec.decode::<M>(payload) {
            let encoded = codec.encode(&message);
            let again: M = codec
                .decode(&encoded)
                .unwrap_or_else(|err| panic!("{codec:?} re-decoding failed: {err:?}"));
            assert_eq!(message, again, "{codec:?} round trip changed the message");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, payload)) = data.split_first() else {
        return;
    };
    match selector % 18 {
        0 => round_trip::<process::StartRequest>(payload),
        1 => round_trip::<process::ConnectRequest>(payload),
        2 => round_trip::<process::ListRequest>(payload),
        3 => round_trip::<process::SendInputRequest>(payload),
        4 => round_trip::<process::StreamInputRequest>(payload),
        5 => round_trip::<process::SendSignalRequest>(payload),
        6 => round_trip::<process::CloseStdinRequest>(payload),
        7 => round_trip::<process::UpdateRequest>(payload),
        8 => round_trip::<filesystem::StatRequest>(payload),
        9 => round_trip::<filesystem::MakeDirRequest>(payload),
        10 => round_trip::<filesystem::MoveRequest>(payload),
        11 => round_trip::<filesystem::ListDirRequest>(payload),
        12 => round_trip::<filesystem::RemoveRequest>(payload),
        13 => round_trip::<filesystem::WatchDirRequest>(payload),
        14 => round_trip::<filesystem::CreateWatcherRequest>(payload),
        15 => round_trip::<filesystem::GetWatcherEventsRequest>(payload),
        16 => round_trip::<filesystem::RemoveWatcherRequest>(payload),
        _ => {
            if let Ok(text) = std::str::from_utf8(payload) {
                if let Ok(timeout) = parse_timeout_ms(text) {
                    assert!(timeout.as_millis() <= 9_999_999_999);
                }
                if let Some(content_type) = ContentType::parse(text) {
                    assert_eq!(ContentType::parse(content_type.as_str()), Some(content_type));
                }
            }
        }
    }
});
