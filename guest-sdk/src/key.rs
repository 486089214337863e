//! Typed keys: how the host's key string becomes the plugin's [`StateFunction::Key`](crate::StateFunction::Key).

use std::fmt;

/// A type a key can be built from. The host hands every key over as a string; a key
/// that does not convert makes `process` return an error for that key (and the
/// pipeline's error policy decides what happens).
///
/// Implemented for `String` (no copy) and for the integer types (decimal text). Implement
/// it for your own key type to parse composite keys.
///
/// ```
/// use groupstate_sdk::{FromKey, KeyError};
///
/// assert_eq!(u64::from_key("42".to_string()), Ok(42));
/// assert!(u8::from_key("300".to_string()).is_err());
///
/// struct Region(String);
/// impl FromKey for Region {
///     fn from_key(key: String) -> Result<Self, KeyError> {
///         match key.strip_prefix("region-") {
///             Some(name) => Ok(Region(name.to_string())),
///             None => Err(KeyError::new(&key, "a region key starting with `region-`")),
///         }
///     }
/// }
/// assert!(Region::from_key("eu".to_string()).is_err());
/// ```
pub trait FromKey: Sized {
    /// Builds the key, or says why `key` is not one.
    fn from_key(key: String) -> Result<Self, KeyError>;

    /// The key `key`, in `slot`, reusing what it holds where the type can (a
    /// `String`'s buffer): `process-batch` keeps one slot for all its calls. By default
    /// a new key from [`from_key`](Self::from_key).
    #[doc(hidden)]
    fn refill<'s>(slot: &'s mut Option<Self>, key: &str) -> Result<&'s Self, KeyError> {
        Ok(slot.insert(Self::from_key(key.to_owned())?))
    }
}

impl FromKey for String {
    fn from_key(key: String) -> Result<Self, KeyError> {
        Ok(key)
    }

    fn refill<'s>(slot: &'s mut Option<Self>, key: &str) -> Result<&'s Self, KeyError> {
        let buffer = slot.get_or_insert_default();
        buffer.clear();
        buffer.push_str(key);
        Ok(buffer)
    }
}

macro_rules! from_key_by_parsing {
    ($($ty:ty),*) => {$(
        impl FromKey for $ty {
            fn from_key(key: String) -> Result<Self, KeyError> {
                parse_decimal(&key, stringify!($ty))
            }

            fn refill<'s>(slot: &'s mut Option<Self>, key: &str) -> Result<&'s Self, KeyError> {
                Ok(slot.insert(parse_decimal(key, stringify!($ty))?))
            }
        }
    )*};
}

from_key_by_parsing!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

/// `key` as a decimal integer of the type named `name`.
fn parse_decimal<T: std::str::FromStr<Err: fmt::Display>>(key: &str, name: &str) -> Result<T, KeyError> {
    key.parse().map_err(|error| KeyError::new(key, format!("a decimal {name} ({error})")))
}

/// A key string that is not a valid key for the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    key: String,
    expected: String,
}

impl KeyError {
    /// `key` is not a valid key; `expected` describes what a key should look like.
    pub fn new(key: &str, expected: impl Into<String>) -> Self {
        KeyError { key: key.to_string(), expected: expected.into() }
    }

    /// The error message of a call given this key, as of any error its `process`
    /// returns.
    pub(crate) fn call_message(self) -> String {
        String::from(crate::Error::from(self))
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key `{}` is not {}: check the pipeline's key field", self.key, self.expected)
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_pass_through() {
        assert_eq!(String::from_key("s-000123".into()), Ok("s-000123".into()));
        assert_eq!(String::from_key(String::new()), Ok(String::new()));
    }

    #[test]
    fn a_refilled_slot_holds_the_new_key() {
        let mut slot = None;
        String::refill(&mut slot, "a-long-first-key").unwrap();
        assert_eq!(String::refill(&mut slot, "b").unwrap(), "b");
        assert_eq!(slot.as_deref(), Some("b"));
        let mut number = Some(7u16);
        assert_eq!(u16::refill(&mut number, "12").unwrap(), &12);
        assert_eq!(number, Some(12));
        assert!(u16::refill(&mut number, "x").is_err());
    }

    #[test]
    fn integers_parse() {
        assert_eq!(u64::from_key("18446744073709551615".into()), Ok(u64::MAX));
        assert_eq!(i32::from_key("-17".into()), Ok(-17));
        assert_eq!(u128::from_key("0".into()), Ok(0));
    }

    #[test]
    fn bad_integers_explain() {
        assert_eq!(
            u8::from_key("256".into()).expect_err("too big").to_string(),
            "key `256` is not a decimal u8 (number too large to fit in target type): \
             check the pipeline's key field"
        );
        assert!(u32::from_key("-1".into()).is_err());
        assert!(i64::from_key(" 1".into()).is_err());
        assert!(i64::from_key(String::new()).is_err());
    }
}
