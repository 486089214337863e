//! Decoding an input line into (key, event time): one pass of a JSON parser that looks
//! only at the two configured top-level fields and skips the rest without building it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use crate::store::KEY_BYTES_MAX;

/// A decoded record: the group key and the event time; the payload is the line itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The group key: borrowed from the line unless it holds escapes.
    pub key: Cow<'a, str>,
    /// Event time in epoch milliseconds, when the pipeline has a time field.
    pub event_time_ms: Option<i64>,
}

/// Why a record was refused; written to the dead-letter output with its offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not one JSON object.
    #[error("not a JSON object: {0}")]
    Json(String),
    /// The key field is absent.
    #[error("missing key field {0:?}")]
    MissingKey(String),
    /// The key field is not a string.
    #[error("key field {0:?} is not a string")]
    KeyNotString(String),
    /// The key is empty or too long.
    #[error("key field {field:?} has {len} bytes; keys must have 1 to {max} bytes")]
    KeyLength {
        /// The key field.
        field: String,
        /// The key's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The time field is absent.
    #[error("missing time field {0:?}")]
    MissingTime(String),
    /// The time field is not an integer of epoch milliseconds.
    #[error("time field {0:?} is not an integer of epoch milliseconds")]
    BadTime(String),
    /// A field appears twice.
    #[error("field {0:?} appears more than once")]
    Duplicate(String),
}

/// Decodes records of one pipeline.
#[derive(Debug, Clone)]
pub struct Decoder {
    /// `None` for a Kafka input keyed by its records' Kafka keys (an empty key field).
    key_field: Option<String>,
    time_field: Option<String>,
    /// Event time is the Kafka record's timestamp, not a field.
    kafka_timestamp: bool,
}

impl Decoder {
    /// A decoder for the given key and time fields; an empty key field reads no key
    /// (the key is the Kafka record's, and `decode` gives an empty one).
    pub fn new(key_field: &str, time_field: Option<&str>) -> Self {
        let key_field = (!key_field.is_empty()).then(|| key_field.to_owned());
        Self { key_field, time_field: time_field.map(str::to_owned), kafka_timestamp: false }
    }

    /// The decoder of records whose event time is their Kafka timestamp.
    pub fn with_kafka_timestamp(mut self) -> Self {
        self.kafka_timestamp = true;
        self
    }

    /// Whether event time is the Kafka record's timestamp.
    pub fn uses_kafka_timestamp(&self) -> bool {
        self.kafka_timestamp
    }

    /// The key field, if records carry their key in one.
    pub fn key_field(&self) -> Option<&str> {
        self.key_field.as_deref()
    }

    /// Decodes one line.
    pub fn decode<'a>(&self, line: &'a str) -> Result<Decoded<'a>, DecodeError> {
        let mut de = serde_json::Deserializer::from_str(line);
        let found = FieldsSeed { decoder: self }.deserialize(&mut de).map_err(classify)?;
        de.end().map_err(|e| DecodeError::Json(e.to_string()))?;
        let key = match (&self.key_field, found.key) {
            (None, _) => Cow::Borrowed(""),
            (Some(_), Some(Field::Str(k))) => k,
            (Some(field), Some(Field::Other)) => return Err(DecodeError::KeyNotString(field.clone())),
            (Some(field), None) => return Err(DecodeError::MissingKey(field.clone())),
        };
        if let Some(field) = &self.key_field
            && (key.is_empty() || key.len() > KEY_BYTES_MAX)
        {
            return Err(DecodeError::KeyLength { field: field.clone(), len: key.len(), max: KEY_BYTES_MAX });
        }
        let event_time_ms = match &self.time_field {
            None => None,
            Some(field) => match found.time {
                Some(TimeField::Ms(t)) => Some(t),
                Some(TimeField::Bad) => return Err(DecodeError::BadTime(field.clone())),
                None => return Err(DecodeError::MissingTime(field.clone())),
            },
        };
        Ok(Decoded { key, event_time_ms })
    }
}

/// Our own errors travel through serde_json as custom messages with this marker.
const DUPLICATE_MARK: &str = "\u{1}duplicate:";

fn classify(e: serde_json::Error) -> DecodeError {
    let msg = e.to_string();
    match msg.strip_prefix(DUPLICATE_MARK) {
        Some(rest) => {
            let field = rest.split(" at line").next().unwrap_or(rest);
            DecodeError::Duplicate(field.to_owned())
        }
        None => DecodeError::Json(msg),
    }
}

enum Field<'de> {
    Str(Cow<'de, str>),
    Other,
}

enum TimeField {
    Ms(i64),
    Bad,
}

#[derive(Default)]
struct Found<'de> {
    key: Option<Field<'de>>,
    time: Option<TimeField>,
}

struct FieldsSeed<'a> {
    decoder: &'a Decoder,
}

impl<'de> DeserializeSeed<'de> for FieldsSeed<'_> {
    type Value = Found<'de>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Found<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FieldsSeed<'_> {
    type Value = Found<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found<'de>, A::Error> {
        let mut found = Found::default();
        let duplicate = |name: &Option<String>| {
            de::Error::custom(format_args!("{DUPLICATE_MARK}{}", name.as_deref().unwrap_or_default()))
        };
        while let Some(name) = map.next_key_seed(NameSeed { decoder: self.decoder })? {
            match name {
                Name::Key if found.key.is_some() => return Err(duplicate(&self.decoder.key_field)),
                Name::Key => found.key = Some(map.next_value_seed(KeySeed)?),
                Name::Time if found.time.is_some() => return Err(duplicate(&self.decoder.time_field)),
                Name::Time => found.time = Some(map.next_value_seed(TimeSeed)?),
                Name::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// Which of the decoder's fields a member name is.
enum Name {
    Key,
    Time,
    Other,
}

/// Reads a member name and compares it where it lies, without making a string of it
/// (one allocation per member of every line, a tenth of the input thread's time).
struct NameSeed<'a> {
    decoder: &'a Decoder,
}

impl<'de> DeserializeSeed<'de> for NameSeed<'_> {
    type Value = Name;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Name, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed<'_> {
    type Value = Name;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Name, E> {
        Ok(if self.decoder.key_field.as_deref() == Some(v) {
            Name::Key
        } else if self.decoder.time_field.as_deref() == Some(v) {
            Name::Time
        } else {
            Name::Other
        })
    }
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Field<'de>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Field<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Field<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Field<'de>, E> {
        Ok(Field::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Field<'de>, E> {
        Ok(Field::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Field<'de>, E> {
        Ok(Field::Str(Cow::Owned(v)))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Field<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Field<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::Other)
    }
}

struct TimeSeed;

impl<'de> DeserializeSeed<'de> for TimeSeed {
    type Value = TimeField;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<TimeField, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TimeSeed {
    type Value = TimeField;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer of epoch milliseconds")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<TimeField, E> {
        Ok(TimeField::Ms(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<TimeField, E> {
        Ok(i64::try_from(v).map_or(TimeField::Bad, TimeField::Ms))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<TimeField, E> {
        Ok(TimeField::Bad)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<TimeField, E> {
        Ok(TimeField::Bad)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<TimeField, E> {
        Ok(TimeField::Bad)
    }
    fn visit_unit<E: de::Error>(self) -> Result<TimeField, E> {
        Ok(TimeField::Bad)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<TimeField, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(TimeField::Bad)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TimeField, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(TimeField::Bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expect: Result<(&str, Option<i64>), &str>) {
        let d = Decoder::new("sensor_id", Some("ts"));
        match (d.decode(line), expect) {
            (Ok(got), Ok((key, ts))) => assert_eq!((got.key.as_ref(), got.event_time_ms), (key, ts), "{line}"),
            (Err(got), Err(needle)) => assert!(got.to_string().contains(needle), "{line}: {got}"),
            (got, expect) => panic!("{line}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn decodes_and_refuses() {
        check(r#"{"sensor_id":"s-1","ts":17,"status":"ok","x":{"ts":1}}"#, Ok(("s-1", Some(17))));
        check(r#"{"ts":-5,"sensor_id":"a\"b"}"#, Ok(("a\"b", Some(-5))));
        check(r#"{"sensor_id":"s","ts":1} "#, Ok(("s", Some(1))));
        check(r#"{"sensor_id":"s","ts":1}{}"#, Err("not a JSON object"));
        check(r#"{"sensor_id":"s","ts":1"#, Err("not a JSON object"));
        check(r#"[1,2]"#, Err("not a JSON object"));
        check(r#"{"ts":1}"#, Err("missing key field \"sensor_id\""));
        check(r#"{"sensor_id":7,"ts":1}"#, Err("is not a string"));
        check(r#"{"sensor_id":"","ts":1}"#, Err("keys must have 1 to"));
        check(r#"{"sensor_id":"s"}"#, Err("missing time field"));
        check(r#"{"sensor_id":"s","ts":"2024-01-01"}"#, Err("not an integer"));
        check(r#"{"sensor_id":"s","ts":1.5}"#, Err("not an integer"));
        check(r#"{"sensor_id":"s","sensor_id":"t","ts":1}"#, Err("appears more than once"));
        check(r#"{"ts":1,"ts":2,"sensor_id":"s"}"#, Err("field \"ts\" appears more than once"));
        // A member name with an escape is the name it spells.
        check(r#"{"sensor\u005fid":"s","t\u0073":3}"#, Ok(("s", Some(3))));
        check(r#"{"sensor_id":"s","ts":1,"sensor\u005fid":"t"}"#, Err("appears more than once"));
    }

    #[test]
    fn no_time_field() {
        let d = Decoder::new("k", None);
        assert_eq!(d.decode(r#"{"k":"x","ts":"whatever"}"#).unwrap().event_time_ms, None);
    }
}
