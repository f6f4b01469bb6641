//! `google.protobuf.Timestamp` with its proto3 JSON form: RFC 3339 in UTC, `Z`
//! suffix, and 0, 3, 6 or 9 fractional digits (what E2B's envd sends).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl From<std::time::SystemTime> for Timestamp {
    fn from(time: std::time::SystemTime) -> Self {
        let (seconds, nanos) = match time.duration_since(std::time::UNIX_EPOCH) {
            Ok(after) => (after.as_secs() as i64, after.subsec_nanos() as i32),
            Err(before) => {
                let before = before.duration();
                let mut seconds = -(before.as_secs() as i64);
                let mut nanos = -(before.subsec_nanos() as i32);
                if nanos < 0 {
                    seconds -= 1;
                    nanos += 1_000_000_000;
                }
                (seconds, nanos)
            }
        };
        Self { seconds, nanos }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let nanos = i128::from(self.seconds) * 1_000_000_000 + i128::from(self.nanos);
        let time = OffsetDateTime::from_unix_timestamp_nanos(nanos)
            .map_err(|err| serde::ser::Error::custom(format!("timestamp out of range: {err}")))?;
        let fraction = match time.nanosecond() {
            0 => String::new(),
            n if n % 1_000_000 == 0 => format!(".{:03}", n / 1_000_000),
            n if n % 1_000 == 0 => format!(".{:06}", n / 1_000),
            n => format!(".{n:09}"),
        };
        serializer.serialize_str(&format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{fraction}Z",
            time.year(),
            u8::from(time.month()),
            time.day(),
            time.hour(),
            time.minute(),
            time.second(),
        ))
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let time = OffsetDateTime::parse(&text, &Rfc3339).map_err(|err| {
            D::Error::custom(format!("invalid RFC 3339 timestamp {text:?}: {err}"))
        })?;
        Ok(Self {
            seconds: time.unix_timestamp(),
            nanos: time.nanosecond() as i32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_rfc3339_utc_with_z() {
        let cases = [
            (0, 0, "\"1970-01-01T00:00:00Z\""),
            (1_700_000_000, 500_000_000, "\"2023-11-14T22:13:20.500Z\""),
            (1_700_000_000, 1_000, "\"2023-11-14T22:13:20.000001Z\""),
            (1_700_000_000, 7, "\"2023-11-14T22:13:20.000000007Z\""),
        ];
        for (seconds, nanos, json) in cases {
            let stamp = Timestamp { seconds, nanos };
            assert_eq!(serde_json::to_string(&stamp).unwrap(), json);
            assert_eq!(serde_json::from_str::<Timestamp>(json).unwrap(), stamp);
        }
        let offset: Timestamp = serde_json::from_str("\"2023-11-14T23:13:20+01:00\"").unwrap();
        assert_eq!(offset.seconds, 1_700_000_000);
        assert!(serde_json::from_str::<Timestamp>("\"yesterday\"").is_err());
    }
}
