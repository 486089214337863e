//! How typed state values become bytes: bincode 2 through serde, the one place that uses bincode.
//!
//! The encoding is compact (variable-length integers) and **not self-describing**, so a
//! state type must not rely on `deserialize_any`: no `serde_json::Value`, no
//! `#[serde(flatten)]`, no `#[serde(untagged)]` enums and no `skip_serializing_if`. Any
//! change to the layout of a state type needs a new `state_schema_version` and a
//! [`StateFunction::migrate_state`](crate::StateFunction::migrate_state) that decodes
//! the old layout with [`decode`].

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The most bytes a decoded value may claim, so that a corrupt length prefix gives an
/// error instead of an allocation failure (a trap). The host's `state_bytes_max` keeps
/// real values far below it.
pub const DECODE_BYTES_MAX: usize = 64 * 1024 * 1024;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_BYTES_MAX>()
}

/// Encodes `value` the way the SDK stores state values.
///
/// ```
/// let bytes = groupstate_sdk::codec::encode(&(3u32, -1i64)).unwrap();
/// let back: (u32, i64) = groupstate_sdk::codec::decode(&bytes).unwrap();
/// assert_eq!(back, (3, -1));
/// ```
pub fn encode<S: Serialize + ?Sized>(value: &S) -> Result<Vec<u8>, CodecError> {
    bincode::serde::encode_to_vec(value, config()).map_err(|error| CodecError { message: error.to_string() })
}

/// [`encode`] into `out` (appended), which a caller can reuse from value to value.
pub(crate) fn encode_into<S: Serialize + ?Sized>(value: &S, out: &mut Vec<u8>) -> Result<(), CodecError> {
    bincode::serde::encode_into_std_write(value, out, config())
        .map(|_| ())
        .map_err(|error| CodecError { message: error.to_string() })
}

/// Decodes a value written by [`encode`]. Fails when the bytes do not hold exactly one
/// value of type `S`, trailing bytes included: that usually means the state was written
/// with another layout of the type.
pub fn decode<S: DeserializeOwned>(bytes: &[u8]) -> Result<S, CodecError> {
    let (value, read) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|error| CodecError { message: error.to_string() })?;
    if read != bytes.len() {
        return Err(CodecError { message: format!("{} trailing bytes after the value", bytes.len() - read) });
    }
    Ok(value)
}

/// A value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    message: String,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CodecError {}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        count: u32,
        first_ms: i64,
        name: String,
        tags: Vec<String>,
        kind: Option<Kind>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Kind {
        Plain,
        Weighted(f64),
    }

    fn check_round_trip(value: Sample) {
        let bytes = encode(&value).expect("encode");
        let back: Sample = decode(&bytes).expect("decode");
        assert_eq!(back, value);
    }

    #[test]
    fn round_trips() {
        check_round_trip(Sample { count: 0, first_ms: 0, name: String::new(), tags: vec![], kind: None });
        check_round_trip(Sample {
            count: u32::MAX,
            first_ms: -1_700_000_000_123,
            name: "s-000123".into(),
            tags: vec!["a".into(), "bé".into()],
            kind: Some(Kind::Weighted(71.5)),
        });
        check_round_trip(Sample {
            count: 3,
            first_ms: i64::MIN,
            name: "x".into(),
            tags: vec![],
            kind: Some(Kind::Plain),
        });
    }

    #[test]
    fn small_integers_take_one_byte() {
        assert_eq!(encode(&(1u32, 2i64, 3u64)).expect("encode"), vec![1, 4, 3]);
    }

    #[test]
    fn rejects_trailing_bytes() {
        let mut bytes = encode(&7u32).expect("encode");
        bytes.push(0);
        let error = decode::<u32>(&bytes).expect_err("trailing byte");
        assert_eq!(error.to_string(), "1 trailing bytes after the value");
    }

    #[test]
    fn rejects_truncated_and_oversized_values() {
        let bytes = encode(&("abc".to_string(), 5u64)).expect("encode");
        assert!(decode::<(String, u64)>(&bytes[..bytes.len() - 1]).is_err());
        // A length prefix claiming 2^40 elements must fail cleanly, not try to allocate.
        let bogus = encode(&(1u64 << 40)).expect("encode");
        assert!(decode::<Vec<u64>>(&bogus).is_err());
    }
}
