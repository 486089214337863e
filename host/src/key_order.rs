//! Sorting many keys by their bytes, as the store orders them, and merging layers of
//! keys in that order.
//!
//! A fold sorts every key of the overlay and a batch sorts the keys it reads from sled,
//! hundreds of thousands at a million keys. Compared whole, each comparison follows two
//! pointers and calls `memcmp` over a prefix that real keys share (`"s-00…"`,
//! `"user:…"`): 4.5% of a batch loop's time and 15% of a fold's at a million keys. So
//! the keys are sorted by the eight bytes after the prefix all of them share, as one
//! integer held next to the item, and compared whole only where those bytes tie.

/// Sorts `items` by `key(item)`'s bytes (ties in any order), in place: a fold sorts
/// an overlay's entries (300 000 at a million keys), and a sorted copy beside them
/// raised the peak memory of a run over 10M events and 1M keys by 4–12 MiB
/// (BENCHMARKS.md). What it holds besides is the order it sorts (16 bytes an item,
/// twice over for the radix sort's passes).
pub(crate) fn sort_by_key<'k, T>(items: &mut [T], key: impl Fn(&T) -> &'k [u8]) {
    let Some(first) = items.first().map(&key) else {
        return;
    };
    let shared = items.iter().fold(first.len(), |n, item| common_prefix_len(&first[..n], key(item)));
    let mut order: Vec<(u64, usize)> =
        items.iter().enumerate().map(|(i, item)| (leading_u64(&key(item)[shared..]), i)).collect();
    // Big-endian, zero-padded: a smaller integer is a smaller key (a key that ends
    // inside the eight bytes pads with zeros, and is a prefix of any key it ties).
    if order.len() < RADIX_ITEMS_MIN {
        order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| key(&items[a.1]).cmp(key(&items[b.1]))));
    } else {
        radix_sort(&mut order);
        // Keys that tie in their eight bytes: ordered whole, run by run.
        let mut start = 0;
        while start < order.len() {
            let end = start + order[start..].iter().take_while(|o| o.0 == order[start].0).count();
            if end - start > 1 {
                order[start..end].sort_unstable_by(|a, b| key(&items[a.1]).cmp(key(&items[b.1])));
            }
            start = end;
        }
    }
    // `order[p].1` is the item that goes to place `p`: each cycle of that permutation
    // is followed by swaps, its places marked done.
    const DONE: usize = usize::MAX;
    for start in 0..order.len() {
        let mut p = start;
        loop {
            let from = std::mem::replace(&mut order[p].1, DONE);
            if from == start || from == DONE {
                break;
            }
            items.swap(p, from);
            p = from;
        }
    }
}

/// The fewest items [`sort_by_key`] sorts by radix: below it, a comparison sort is as
/// fast and needs no second vector.
const RADIX_ITEMS_MIN: usize = 1024;

/// Sorts `order` by its integers, stably: one counting pass per byte that is not the
/// same in all of them (the bytes after a shared prefix are often few distinct ones,
/// digits say), low bytes first. Over the 300 000 keys of a fold at a million keys, a
/// comparison sort was a sixth of the fold's time.
fn radix_sort(order: &mut Vec<(u64, usize)>) {
    let mut counts = [[0usize; 256]; 8];
    for &(v, _) in order.iter() {
        for (byte, count) in counts.iter_mut().enumerate() {
            count[(v >> (8 * byte)) as usize & 0xFF] += 1;
        }
    }
    let mut other: Vec<(u64, usize)> = vec![(0, 0); order.len()];
    for (byte, count) in counts.iter().enumerate() {
        if count.contains(&order.len()) {
            continue;
        }
        let mut starts = [0usize; 256];
        let mut at = 0;
        for (start, &n) in starts.iter_mut().zip(count) {
            *start = at;
            at += n;
        }
        for &item in order.iter() {
            let digit = (item.0 >> (8 * byte)) as usize & 0xFF;
            other[starts[digit]] = item;
            starts[digit] += 1;
        }
        std::mem::swap(order, &mut other);
    }
}

/// Compares two keys as their bytes, the first eight as one integer: keys of eight
/// bytes or more are ordered without a call to `memcmp` unless those tie (the page
/// searches and merges compare keys millions of times a second at a million keys).
#[inline]
pub(crate) fn cmp_keys(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    match (a.first_chunk::<8>(), b.first_chunk::<8>()) {
        (Some(x), Some(y)) => u64::from_be_bytes(*x).cmp(&u64::from_be_bytes(*y)).then_with(|| a[8..].cmp(&b[8..])),
        _ => a.cmp(b),
    }
}

/// The keys of `layers`, each layer in key order with each key once and whether it
/// holds the key (`false`: it deletes it), merged in key order, each key once with
/// what the first layer that has it says: layers of changes over the state below
/// them, the latest first.
pub(crate) fn latest<'a>(
    layers: Vec<Box<dyn Iterator<Item = (&'a str, bool)> + 'a>>,
) -> impl Iterator<Item = (&'a str, bool)> + 'a {
    let mut layers: Vec<_> = layers.into_iter().map(Iterator::peekable).collect();
    std::iter::from_fn(move || {
        let key = layers.iter_mut().filter_map(|l| l.peek().map(|&(k, _)| k)).min()?;
        let mut held = None;
        for layer in &mut layers {
            if let Some(&(k, h)) = layer.peek()
                && k == key
            {
                held.get_or_insert(h);
                layer.next();
            }
        }
        held.map(|h| (key, h))
    })
}

fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The first eight bytes of `bytes` as a big-endian integer, zero-padded.
fn leading_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    let n = bytes.len().min(8);
    buf[..n].copy_from_slice(&bytes[..n]);
    u64::from_be_bytes(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Rng;

    #[test]
    fn sorts_as_the_bytes_do() {
        let mut rng = Rng::new(11);
        // Short alphabets and shared prefixes make ties in the leading bytes, keys that
        // are prefixes of others, and zero bytes (which the padding also uses).
        let alphabet: &[&str] = &["\0", "a", "b", "é", "\u{7f}", "z"];
        for round in 0..400 {
            let prefix = ["", "s-", "sensor-0000", "x"][round % 4];
            // Some rounds large enough for the radix sort, some of them of keys as a
            // workload names them: a prefix and a number of fixed width, whose leading
            // digits are the same in every key.
            let count = if round % 7 == 0 { rng.range(RADIX_ITEMS_MIN as i64, 3000) } else { rng.range(0, 60) };
            let keys: Vec<String> = (0..count)
                .map(|_| {
                    if round % 21 == 0 {
                        return format!("{prefix}{:09}", rng.range(0, 5000));
                    }
                    let tail: String =
                        (0..rng.range(0, 12)).map(|_| alphabet[rng.range(0, alphabet.len() as i64) as usize]).collect();
                    format!("{prefix}{tail}")
                })
                .collect();
            let mut got: Vec<&str> = keys.iter().map(String::as_str).collect();
            sort_by_key(&mut got, |k| k.as_bytes());
            let mut want: Vec<&str> = keys.iter().map(String::as_str).collect();
            want.sort_unstable();
            assert_eq!(got, want, "round {round}");
            for pair in keys.windows(2) {
                let (a, b) = (pair[0].as_bytes(), pair[1].as_bytes());
                assert_eq!(cmp_keys(a, b), a.cmp(b), "{:?} against {:?}", pair[0], pair[1]);
            }
        }
    }
}
