//! Encoding of the host's own records (checkpoints, batch plans, per-key records) with
//! bincode 2, and of opaque bytes as hex text. bincode is pinned (`=2.0.1`: its 3.0
//! release is an empty tombstone) and used nowhere else, so replacing it touches this
//! module only.

use bincode::config::{Configuration, Fixint, LittleEndian};
use bincode::{BorrowDecode, Decode, Encode};

/// Fixed-width integers keep a record's size independent of its values, which makes
/// the size assertions at the storage boundary simple.
const CONFIG: Configuration<LittleEndian, Fixint> =
    bincode::config::standard().with_little_endian().with_fixed_int_encoding();

/// Records larger than this are refused on decode: no host record comes near it, so a
/// larger length prefix means corruption, not data.
pub(crate) const RECORD_BYTES_MAX: usize = 256 << 20;

/// A record could not be decoded: the bytes are corrupt or were written by an
/// incompatible version of groupstate.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what}: cannot decode stored record ({source}); the state dir is corrupt or from an incompatible groupstate version"
)]
pub struct DecodeError {
    what: &'static str,
    #[source]
    source: bincode::error::DecodeError,
}

/// Encodes `value`; encoding plain host records into a `Vec` cannot fail.
pub(crate) fn encode<T: Encode>(value: &T) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_into(&mut bytes, value);
    bytes
}

/// Appends the encoding of `value` to `bytes`.
pub(crate) fn encode_into<T: Encode>(bytes: &mut Vec<u8>, value: &T) {
    if let Err(e) = bincode::encode_into_std_write(value, bytes, CONFIG) {
        // Our record types contain only integers, byte vectors and strings: bincode
        // fails only on writer errors, and a Vec writer has none.
        unreachable!("encoding a host record into a Vec failed: {e}")
    }
}

/// Decodes a `what` record, refusing trailing bytes.
impl DecodeError {
    /// A record that decoded but breaks a rule of its kind.
    pub(crate) fn invalid(what: &'static str, why: &str) -> Self {
        Self { what, source: bincode::error::DecodeError::OtherString(why.to_owned()) }
    }
}

pub(crate) fn decode<T: Decode<()>>(what: &'static str, bytes: &[u8]) -> Result<T, DecodeError> {
    let config = CONFIG.with_limit::<RECORD_BYTES_MAX>();
    let (value, read) = bincode::decode_from_slice(bytes, config).map_err(|source| DecodeError { what, source })?;
    if read != bytes.len() {
        return Err(DecodeError {
            what,
            source: bincode::error::DecodeError::OtherString(format!("{} trailing bytes", bytes.len() - read)),
        });
    }
    Ok(value)
}

/// Decodes a `what` record that borrows from `bytes` (no allocation), refusing
/// trailing bytes.
pub(crate) fn borrow_decode<'a, T: BorrowDecode<'a, ()>>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<T, DecodeError> {
    let config = CONFIG.with_limit::<RECORD_BYTES_MAX>();
    let (value, read) =
        bincode::borrow_decode_from_slice(bytes, config).map_err(|source| DecodeError { what, source })?;
    if read != bytes.len() {
        return Err(DecodeError {
            what,
            source: bincode::error::DecodeError::OtherString(format!("{} trailing bytes", bytes.len() - read)),
        });
    }
    Ok(value)
}

/// Lowercase hex of `bytes`: how opaque bytes (state values, digests) are shown as text.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Encode, Decode)]
    struct Rec {
        a: u64,
        b: Option<i64>,
        c: Vec<u8>,
    }

    #[test]
    fn round_trip_and_trailing_bytes() {
        let rec = Rec { a: 7, b: Some(-3), c: vec![1, 2, 3] };
        let bytes = encode(&rec);
        assert_eq!(decode::<Rec>("rec", &bytes).unwrap(), rec);
        let mut longer = bytes.clone();
        longer.push(0);
        let err = decode::<Rec>("rec", &longer).unwrap_err().to_string();
        assert!(err.contains("trailing"), "{err}");
        assert!(decode::<Rec>("rec", &bytes[..bytes.len() - 1]).is_err());
    }
}
