//! The store keys of 0.2 state (`groupstate:plugin@0.2.0`): every value variable, list
//! element, map entry and timer of a group key is one store entry of its own, under a
//! composite key, so that it travels through `Store::commit` as a `KeyChange` like a
//! 0.1 key's record and an append or a put touches one entry.
//!
//! A composite key is `G \0 tag name \0 suffix`, where `G` is the group key with `\u{1}`
//! written as `\u{1}\u{2}` and `\0` as `\u{1}\u{1}` (so `G \0` starts the entries of
//! one group key and of no other), `name` a declared variable's name (letters, digits,
//! `_`, `-`, `.`: no `\0`) and the suffix hex, so that a key stays UTF-8 and a
//! variable's entries sort by their user key bytes:
//!
//! | tag | entry | suffix | record |
//! | --- | --- | --- | --- |
//! | `v` | a value variable | none | the value |
//! | `n` | a list's next index | none | 8 bytes, little endian |
//! | `l` | a list element | its index, 16 hex digits | the element |
//! | `m` | a map entry | the map key, hex | the value |
//! | `t` | a timer (no name after the tag) | the expiry, 16 hex digits of its order-preserving form, then `-` (no name) or `~` and the name in hex (so an unnamed timer sorts first) | no value, the expiry as the record's deadline |
//!
//! A timer is a record with a deadline, so the store's deadline index finds expired
//! timers without a scan of all keys, as it finds 0.1 timeouts.
//!
//! An entry of a variable with a time-to-live has an entry in the **expiry index**
//! beside it: `\u{1} e clock expiry entry-key`, where `clock` is `p` (processing time)
//! or `e` (event time), `expiry` 16 hex digits of its order-preserving form and
//! `entry-key` the entry's own store key; its record holds an empty value. No group
//! prefix starts with `\u{1}` followed by `e` (the escape writes `\u{1}` as
//! `\u{1}\u{1}` or `\u{1}\u{2}`), so the index is a range of its own, ordered by
//! (clock, expiry), and the entries expired at a threshold are a range from its start.

use crate::codec::hex;

/// The longest a variable's name may be.
pub const VARIABLE_NAME_BYTES_MAX: usize = 64;

/// The longest a timer's name may be.
pub const TIMER_NAME_BYTES_MAX: usize = 256;

/// Separates the group key from the rest, and a variable's name from its suffix.
const SEP: char = '\0';

/// One entry of a group key's 0.2 state, as its store key names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A value variable.
    Value(String),
    /// The next index of a list variable.
    ListNext(String),
    /// A list element.
    ListElement(String, u64),
    /// A map entry and its map key.
    MapEntry(String, Vec<u8>),
    /// A timer: its expiry and name.
    Timer(i64, Option<String>),
}

/// Whether `name` may name a variable (see [`VARIABLE_NAME_BYTES_MAX`]).
pub fn valid_variable_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= VARIABLE_NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// The prefix of every entry of `group`.
pub fn group_prefix(group: &str) -> String {
    group_prefix_with_room(group, 0)
}

/// [`group_prefix`], with room for `room` more bytes (the rest of a store key).
fn group_prefix_with_room(group: &str, room: usize) -> String {
    let mut out = String::with_capacity(group.len() + 1 + room);
    if group.bytes().any(|b| b <= 1) {
        for c in group.chars() {
            match c {
                '\u{1}' => out.push_str("\u{1}\u{2}"),
                '\0' => out.push_str("\u{1}\u{1}"),
                c => out.push(c),
            }
        }
    } else {
        // Most group keys: nothing to escape.
        out.push_str(group);
    }
    out.push(SEP);
    out
}

/// The prefix of the entries of variable `name` with `tag`, within `group`.
fn variable_prefix(group: &str, tag: char, name: &str) -> String {
    let mut out = group_prefix(group);
    out.push(tag);
    out.push_str(name);
    out.push(SEP);
    out
}

/// The store key of value variable `name`.
pub fn value_key(group: &str, name: &str) -> String {
    let mut out = group_prefix_with_room(group, 1 + name.len());
    out.push('v');
    out.push_str(name);
    out
}

/// The store key of list variable `name`'s next index.
pub fn list_next_key(group: &str, name: &str) -> String {
    let mut out = group_prefix(group);
    out.push('n');
    out.push_str(name);
    out
}

/// The prefix of list variable `name`'s elements.
pub fn list_prefix(group: &str, name: &str) -> String {
    variable_prefix(group, 'l', name)
}

/// The store key of element `index` of list variable `name`.
pub fn list_element_key(group: &str, name: &str, index: u64) -> String {
    format!("{}{index:016x}", list_prefix(group, name))
}

/// The prefix of map variable `name`'s entries.
pub fn map_prefix(group: &str, name: &str) -> String {
    variable_prefix(group, 'm', name)
}

/// The store key of the entry under `key` in map variable `name`.
pub fn map_entry_key(group: &str, name: &str, key: &[u8]) -> String {
    let mut out = map_prefix(group, name);
    out.push_str(&hex(key));
    out
}

/// The prefix of `group`'s timers.
pub fn timer_prefix(group: &str) -> String {
    let mut out = group_prefix(group);
    out.push('t');
    out
}

/// The store key of `group`'s timer (expiry, name).
pub fn timer_key(group: &str, expiry_ms: i64, name: Option<&str>) -> String {
    let mut out = group_prefix_with_room(group, 2 + 16 + name.map_or(0, |n| 2 * n.len()));
    out.push('t');
    push_ordered_hex(&mut out, expiry_ms);
    match name {
        None => out.push('-'),
        Some(name) => {
            out.push('~');
            out.push_str(&hex(name.as_bytes()));
        }
    }
    out
}

/// The start of the expiry index (see the module doc).
const EXPIRY_INDEX: &str = "\u{1}e";

/// What an expiry index key adds to its entry's store key.
pub const EXPIRY_INDEX_OVERHEAD_BYTES: usize = EXPIRY_INDEX.len() + 1 + 16;

fn ordered_hex(ms: i64) -> String {
    let mut out = String::with_capacity(16);
    push_ordered_hex(&mut out, ms);
    out
}

/// Appends `ms` as 16 lowercase hex digits whose order is the numbers' (a timer key
/// is made on every `register-timer` and `delete-timer`: `format!` showed in profiles).
fn push_ordered_hex(out: &mut String, ms: i64) {
    let bits = (ms as u64) ^ (1 << 63);
    for shift in (0..16).rev() {
        out.push(char::from(b"0123456789abcdef"[((bits >> (4 * shift)) & 0xf) as usize]));
    }
}

fn clock_tag(event_time: bool) -> char {
    if event_time { 'e' } else { 'p' }
}

/// What every key a 0.2 range can reach from `key` starts with: the expiry index's
/// start for a key in it, else the group prefix (through the first `\0`); `None` for a
/// key with neither. The ranges 0.2 state reads (a group's variables and timers, the
/// expired part of the expiry index) never leave it, so the overlay orders its
/// composite keys within each such part only (`Overlay::range_from`).
pub fn scan_group(key: &str) -> Option<&str> {
    // It ends at an ASCII byte: a char boundary.
    scan_group_bytes(key.as_bytes()).map(|group| &key[..group.len()])
}

/// [`scan_group`] of a key's bytes.
pub fn scan_group_bytes(key: &[u8]) -> Option<&[u8]> {
    if key.starts_with(EXPIRY_INDEX.as_bytes()) {
        return Some(&key[..EXPIRY_INDEX.len()]);
    }
    // A byte search: `str::find` of a char cost a tenth of an overlay append.
    memchr::memchr(SEP as u8, key).map(|sep| &key[..=sep])
}

/// The expiry index key of `entry_key` expiring at `expiry_ms` on its clock.
pub fn expiry_index_key(event_time: bool, expiry_ms: i64, entry_key: &str) -> String {
    format!("{EXPIRY_INDEX}{}{}{entry_key}", clock_tag(event_time), ordered_hex(expiry_ms))
}

/// The range `[start, end)` of the expiry index keys on a clock with
/// `expiry <= threshold_ms`.
pub fn expired_range(event_time: bool, threshold_ms: i64) -> (String, String) {
    let start = format!("{EXPIRY_INDEX}{}", clock_tag(event_time));
    let end = match threshold_ms.checked_add(1) {
        Some(above) => format!("{start}{}", ordered_hex(above)),
        // Every expiry is at or below i64::MAX: the range ends with the clock's keys.
        None => format!("{EXPIRY_INDEX}{}", char::from(clock_tag(event_time) as u8 + 1)),
    };
    (start, end)
}

/// The clock (event time or not), expiry and entry key of an expiry index key; `None`
/// for any other key.
pub fn parse_expiry_index(store_key: &str) -> Option<(bool, i64, &str)> {
    let rest = store_key.strip_prefix(EXPIRY_INDEX)?;
    let event_time = match rest.get(..1)? {
        "e" => true,
        "p" => false,
        _ => return None,
    };
    let ordered = u64::from_str_radix(rest.get(1..17)?, 16).ok()?;
    Some((event_time, (ordered ^ (1 << 63)) as i64, rest.get(17..)?))
}

/// The group key and the entry a composite store key names; `None` for a key that is
/// not one (a 0.1 key, or damage).
pub fn parse(store_key: &str) -> Option<(String, Entry)> {
    let (group, rest) = unescape_group(store_key)?;
    let mut chars = rest.chars();
    let tag = chars.next()?;
    let rest = chars.as_str();
    let entry = match tag {
        'v' => Entry::Value(rest.to_owned()),
        'n' => Entry::ListNext(rest.to_owned()),
        'l' => {
            let (name, suffix) = rest.split_once(SEP)?;
            Entry::ListElement(name.to_owned(), u64::from_str_radix(suffix, 16).ok()?)
        }
        'm' => {
            let (name, suffix) = rest.split_once(SEP)?;
            Entry::MapEntry(name.to_owned(), unhex(suffix)?)
        }
        't' => {
            let ordered = u64::from_str_radix(rest.get(..16)?, 16).ok()?;
            let expiry = (ordered ^ (1 << 63)) as i64;
            let name = match rest.get(16..17)? {
                "-" if rest.len() == 17 => None,
                "~" => Some(String::from_utf8(unhex(&rest[17..])?).ok()?),
                _ => return None,
            };
            Entry::Timer(expiry, name)
        }
        _ => return None,
    };
    Some((group, entry))
}

/// The map key of a store key under `prefix` (see [`map_prefix`]).
pub fn map_key_of(store_key: &str, prefix: &str) -> Option<Vec<u8>> {
    unhex(store_key.strip_prefix(prefix)?)
}

fn unescape_group(store_key: &str) -> Option<(String, &str)> {
    let (escaped, rest) = store_key.split_once(SEP)?;
    let mut group = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        match c {
            '\u{1}' => match chars.next()? {
                '\u{1}' => group.push('\0'),
                '\u{2}' => group.push('\u{1}'),
                _ => return None,
            },
            c => group.push(c),
        }
    }
    Some((group, rest))
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_back_to_their_entries() {
        for group in ["u1", "", "a\0b", "a\u{1}\0\u{1}", "ü\u{2}"] {
            let cases = [
                (value_key(group, "count"), Entry::Value("count".into())),
                (list_next_key(group, "seen"), Entry::ListNext("seen".into())),
                (list_element_key(group, "seen", 42), Entry::ListElement("seen".into(), 42)),
                (map_entry_key(group, "s", b"\0\xffk"), Entry::MapEntry("s".into(), b"\0\xffk".to_vec())),
                (timer_key(group, -5, None), Entry::Timer(-5, None)),
                (
                    timer_key(group, 1_700_000_000_000, Some("a\0b")),
                    Entry::Timer(1_700_000_000_000, Some("a\0b".into())),
                ),
            ];
            for (key, entry) in cases {
                assert!(key.starts_with(&group_prefix(group)), "{key:?}");
                assert_eq!(parse(&key), Some((group.to_owned(), entry)), "{key:?}");
            }
        }
        assert_eq!(parse("plain 0.1 key"), None);
        assert_eq!(parse("g\0x"), None);
        assert_eq!(parse("g\0t0123"), None);
    }

    #[test]
    fn one_group_prefix_is_no_prefix_of_another() {
        // "a" and "a\0b" would collide without the escape.
        let a = group_prefix("a");
        assert!(!value_key("a\0b", "v").starts_with(&a));
        assert!(!map_entry_key("a\u{1}", "m", b"x").starts_with(&a));
    }

    #[test]
    fn timer_keys_keep_the_layout_stores_hold() {
        for expiry in [i64::MIN, -1, 0, 1, 0x0123_4567_89ab_cdef, i64::MAX] {
            let hex = format!("{:016x}", (expiry as u64) ^ (1 << 63));
            assert_eq!(timer_key("g", expiry, None), format!("g\0t{hex}-"));
            assert_eq!(timer_key("a\0", expiry, Some("n")), format!("a\u{1}\u{1}\0t{hex}~6e"));
        }
    }

    #[test]
    fn entries_sort_by_index_expiry_and_map_key() {
        assert!(list_element_key("g", "l", 9) < list_element_key("g", "l", 10));
        assert!(timer_key("g", -1, None) < timer_key("g", 0, None));
        assert!(timer_key("g", 5, None) < timer_key("g", 5, Some("")));
        assert!(timer_key("g", 5, Some("z")) < timer_key("g", 6, None));
        assert!(map_entry_key("g", "m", b"\x01") < map_entry_key("g", "m", b"\x01\x00"));
        assert!(map_entry_key("g", "m", b"\x01\xff") < map_entry_key("g", "m", b"\x02"));
        let prefix = map_prefix("g", "m");
        assert_eq!(map_key_of(&map_entry_key("g", "m", b"key"), &prefix), Some(b"key".to_vec()));
    }

    #[test]
    fn expiry_index_keys_parse_back_and_range_by_clock_and_expiry() {
        let entry = map_entry_key("a\u{1}b", "m", b"k");
        for (event_time, expiry) in [(true, 5), (false, -3), (true, i64::MAX), (false, i64::MIN)] {
            let key = expiry_index_key(event_time, expiry, &entry);
            assert_eq!(parse_expiry_index(&key), Some((event_time, expiry, entry.as_str())));
            assert_eq!(parse(&key), None, "no group key's entry");
            let (start, end) = expired_range(event_time, expiry);
            assert!(start.as_str() <= key.as_str() && key < end, "{key:?} in its own range");
            let (_, below) = expired_range(event_time, expiry.saturating_sub(1));
            assert!(expiry == i64::MIN || key >= below, "{key:?} not expired below its expiry");
            let (other_start, other_end) = expired_range(!event_time, i64::MAX);
            assert!(key < other_start || key >= other_end, "{key:?} not on the other clock");
        }
        assert!(!group_prefix("\u{1}e").starts_with(EXPIRY_INDEX));
        assert_eq!(parse_expiry_index(&value_key("g", "v")), None);
    }

    #[test]
    fn the_ranges_of_0_2_state_stay_in_their_scan_group() {
        for group in ["g", "", "a\u{1}b", "a\0b", "\u{1}e"] {
            let prefix = group_prefix(group);
            assert_eq!(scan_group(&prefix), Some(prefix.as_str()));
            for key in [
                value_key(group, "v"),
                list_element_key(group, "l", 3),
                map_entry_key(group, "m", b"k\0"),
                timer_key(group, 7, Some("t")),
                timer_prefix(group),
            ] {
                assert_eq!(scan_group(&key), Some(prefix.as_str()), "{key:?}");
            }
        }
        let entry = value_key("g", "v");
        for event_time in [false, true] {
            let (start, end) = expired_range(event_time, 5);
            assert_eq!(scan_group(&start), Some(EXPIRY_INDEX));
            assert_eq!(scan_group(&end), Some(EXPIRY_INDEX));
            assert_eq!(scan_group(&expiry_index_key(event_time, 5, &entry)), Some(EXPIRY_INDEX));
        }
        assert_eq!(scan_group("plain 0.1 key"), None);
    }

    #[test]
    fn variable_names() {
        assert!(valid_variable_name("sessions"));
        assert!(valid_variable_name("a.b-c_9"));
        assert!(!valid_variable_name(""));
        assert!(!valid_variable_name("a b"));
        assert!(!valid_variable_name("a\0"));
        assert!(!valid_variable_name(&"x".repeat(65)));
    }
}
