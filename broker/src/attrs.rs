//! (ext) Message attributes: small string name/value pairs a producer sends beside the key
//! (request headers `Narad-Attr-<name>: <value>`, or `"attributes": {…}` per message of a
//! batch), stored with the record and returned as `"attributes": {…}` on consume and replay.
//!
//! # Rules (checked once, where a produce enters the node)
//! - at most [`MAX_ATTRIBUTES`] per message;
//! - names `[A-Za-z0-9-_.]{1,64}`, case-insensitive (HTTP header names are), stored
//!   lowercased; a name given twice (in any case) is refused;
//! - values are UTF-8 text (empty allowed);
//! - names and values together at most [`MAX_TOTAL_BYTES`];
//! - names starting with [`RESERVED_PREFIX`] (`narad-`) are the broker's own (a dead-lettered
//!   copy's source, say): a producer cannot send them, and they are counted apart, at most
//!   [`MAX_RESERVED`] of at most [`MAX_RESERVED_BYTES`] together.
//!
//! # Block
//! The attributes of one record travel and are stored as one opaque block (the partition
//! log, the WAL and the node RPC never look inside): `count` times `name length u8 | name |
//! value length u16 (little-endian) | value`, in the order given. A record without
//! attributes has no block (`None`), so nothing changes for records that do not use them.

use bytes::Bytes;

/// Most attributes of one message.
pub const MAX_ATTRIBUTES: usize = 16;
/// Longest attribute name.
pub const MAX_NAME_LEN: usize = 64;
/// Most bytes of names and values of one message together.
pub const MAX_TOTAL_BYTES: usize = 8 * 1024;
/// The request-header prefix of an attribute (matched case-insensitively).
pub const HEADER_PREFIX: &str = "narad-attr-";
/// The prefix of the attribute names the broker sets (case-insensitive).
pub const RESERVED_PREFIX: &str = "narad-";
/// Most broker attributes of one message.
pub const MAX_RESERVED: usize = 8;
/// Most bytes of the broker attributes' names and values of one message.
pub const MAX_RESERVED_BYTES: usize = 1024;
/// Largest valid block: every byte of names and values plus 3 bytes of lengths each.
pub const MAX_BLOCK_BYTES: usize =
    MAX_TOTAL_BYTES + 3 * MAX_ATTRIBUTES + MAX_RESERVED_BYTES + 3 * MAX_RESERVED;

const _: () = assert!(MAX_BLOCK_BYTES <= narad_storage::MAX_ATTRS_BYTES);

fn valid_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// Whether `name` is one of the broker's attribute names.
pub fn is_reserved(name: &str) -> bool {
    name.len() >= RESERVED_PREFIX.len()
        && name.as_bytes()[..RESERVED_PREFIX.len()].eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes())
}

/// Builds one record's block, checking every rule as pairs are added.
#[derive(Debug, Default)]
pub struct Builder {
    buf: Vec<u8>,
    /// The producer's attributes.
    producer: Tally,
    /// The broker's.
    reserved: Tally,
}

/// How many attributes of one kind a block holds, and their bytes.
#[derive(Debug, Default)]
struct Tally {
    count: usize,
    bytes: usize,
}

impl Tally {
    /// Counts `name: value` against at most `max` attributes of at most `max_bytes` together;
    /// `what` names them in the error.
    fn add(
        &mut self,
        name: &str,
        value: &str,
        max: usize,
        max_bytes: usize,
        what: &str,
    ) -> Result<(), String> {
        if self.count == max {
            return Err(format!("a message carries at most {max} {what}"));
        }
        self.bytes += name.len() + value.len();
        if self.bytes > max_bytes {
            return Err(format!(
                "the {what}' names and values exceed {max_bytes} bytes"
            ));
        }
        self.count += 1;
        Ok(())
    }
}

impl Builder {
    /// Adds a producer's `name: value`; the error says which rule it breaks.
    pub fn push(&mut self, name: &str, value: &str) -> Result<(), String> {
        check_name(name)?;
        if is_reserved(name) {
            return Err(format!(
                "attribute name {:?}: names starting with {RESERVED_PREFIX} are the broker's",
                truncate(name)
            ));
        }
        self.producer
            .add(name, value, MAX_ATTRIBUTES, MAX_TOTAL_BYTES, "attributes")?;
        self.append(name, value)
    }

    /// Adds one of the broker's attributes (its name starts with [`RESERVED_PREFIX`]).
    pub fn push_reserved(&mut self, name: &str, value: &str) -> Result<(), String> {
        check_name(name)?;
        if !is_reserved(name) {
            return Err(format!(
                "attribute name {:?} does not start with {RESERVED_PREFIX}",
                truncate(name)
            ));
        }
        self.reserved.add(
            name,
            value,
            MAX_RESERVED,
            MAX_RESERVED_BYTES,
            "broker attributes",
        )?;
        self.append(name, value)
    }

    fn append(&mut self, name: &str, value: &str) -> Result<(), String> {
        let lower = name.to_ascii_lowercase();
        if Iter(&self.buf).any(|(n, _)| n == lower) {
            return Err(format!("attribute {lower:?} given twice"));
        }
        self.buf.push(lower.len() as u8);
        self.buf.extend_from_slice(lower.as_bytes());
        self.buf
            .extend_from_slice(&(value.len() as u16).to_le_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        Ok(())
    }

    /// The block, or `None` when no attribute was added.
    pub fn finish(self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| Bytes::from(self.buf))
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.bytes().all(valid_name_byte) {
        return Err(format!(
            "attribute name {:?} must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 - _ .",
            truncate(name)
        ));
    }
    Ok(())
}

/// A block with the producer's attributes of `block` (those not [`is_reserved`]) followed by
/// the broker attributes `reserved`; `None` when there are none at all.
pub fn with_reserved(block: Option<&[u8]>, reserved: &[(&str, &str)]) -> Option<Bytes> {
    let mut b = block.map_or_else(Builder::default, |b| kept(b, |n| !is_reserved(n)));
    for (n, v) in reserved {
        if let Err(e) = b.push_reserved(n, v) {
            debug_assert!(false, "broker attribute {n}: {e}");
        }
    }
    b.finish()
}

/// The producer's attributes of `block`, without the broker's (a copy that leaves the
/// broker's reach, or goes back to be delivered again).
pub fn without_reserved(block: Option<&Bytes>) -> Option<Bytes> {
    without(block, is_reserved)
}

/// `block` without the attributes whose names `drop` picks (the same block when it has
/// none of them); `None` when none are left.
pub fn without(block: Option<&Bytes>, drop: impl Fn(&str) -> bool) -> Option<Bytes> {
    match block {
        Some(b) if Iter(b).any(|(n, _)| drop(n)) => kept(b, |n| !drop(n)).finish(),
        Some(b) => Some(b.clone()),
        None => None,
    }
}

/// A builder holding the attributes of a stored `block` whose names `keep` accepts, each
/// the producer's or the broker's as before (checked when stored: within every rule).
fn kept(block: &[u8], keep: impl Fn(&str) -> bool) -> Builder {
    let mut b = Builder::default();
    for (n, v) in Iter(block).filter(|(n, _)| keep(n)) {
        let _ = if is_reserved(n) {
            b.push_reserved(n, v)
        } else {
            b.push(n, v)
        };
    }
    b
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(MAX_NAME_LEN + 1) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The attributes among request headers (`Narad-Attr-<name>: <value>`). A header given twice
/// is refused, as is a value that is not UTF-8.
pub fn from_headers(headers: &http::HeaderMap) -> Result<Option<Bytes>, String> {
    let mut b = Builder::default();
    for (name, value) in headers {
        // Header names arrive lowercased.
        let Some(attr) = name.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        let value = std::str::from_utf8(value.as_bytes())
            .map_err(|_| format!("attribute {attr:?}: the value is not UTF-8"))?;
        b.push(attr, value)?;
    }
    Ok(b.finish())
}

/// The block of a batch message's `"attributes"` object.
pub fn from_map<'a>(
    pairs: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<Option<Bytes>, String> {
    let mut b = Builder::default();
    for (n, v) in pairs {
        b.push(n, v)?;
    }
    Ok(b.finish())
}

/// The pairs of a block, in order. A block is checked ([`check`]) before it is stored, so
/// iteration simply stops at anything malformed.
#[derive(Clone)]
pub struct Iter<'a>(pub &'a [u8]);

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.0;
        let nlen = *b.first()? as usize;
        let name = b.get(1..1 + nlen)?;
        let vl = b.get(1 + nlen..3 + nlen)?;
        let vlen = u16::from_le_bytes([vl[0], vl[1]]) as usize;
        let value = b.get(3 + nlen..3 + nlen + vlen)?;
        let (Ok(name), Ok(value)) = (std::str::from_utf8(name), std::str::from_utf8(value)) else {
            self.0 = &[];
            return None;
        };
        self.0 = &b[3 + nlen + vlen..];
        Some((name, value))
    }
}

/// Checks a block received from elsewhere (a peer's RPC): well-formed to its end and within
/// every rule [`Builder`] enforces.
pub fn check(block: &[u8]) -> Result<(), String> {
    if block.len() > MAX_BLOCK_BYTES {
        return Err(format!("attribute block of {} bytes", block.len()));
    }
    let mut b = Builder::default();
    let mut it = Iter(block);
    for (n, v) in it.by_ref() {
        if n.bytes().any(|c| c.is_ascii_uppercase()) {
            return Err("attribute name not lowercased".into());
        }
        if is_reserved(n) {
            b.push_reserved(n, v)?;
        } else {
            b.push(n, v)?;
        }
    }
    if !it.0.is_empty() || b.buf.is_empty() {
        return Err("malformed attribute block".into());
    }
    Ok(())
}

/// The value of attribute `name` (lowercase).
pub fn get<'a>(block: &'a [u8], name: &str) -> Option<&'a str> {
    Iter(block).find(|(n, _)| *n == name).map(|(_, v)| v)
}

/// Writes `"attributes":{…}` (after a comma) for a record's block.
pub fn write_json(out: &mut Vec<u8>, block: &[u8]) {
    out.extend_from_slice(b",\"attributes\":{");
    for (i, (n, v)) in Iter(block).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        narad_api::render::write_json_str(out, n);
        out.push(b':');
        narad_api::render::write_json_str(out, v);
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block(pairs: &[(&str, &str)]) -> Result<Option<Bytes>, String> {
        let mut b = Builder::default();
        for (n, v) in pairs {
            b.push(n, v)?;
        }
        Ok(b.finish())
    }

    #[test]
    fn names_are_lowercased_and_pairs_come_back_in_order() {
        let b = block(&[("TraceParent", "00-ab-cd-01"), ("x.y_z-1", "")])
            .unwrap()
            .unwrap();
        let pairs: Vec<_> = Iter(&b).collect();
        assert_eq!(pairs, [("traceparent", "00-ab-cd-01"), ("x.y_z-1", "")]);
        assert_eq!(get(&b, "traceparent"), Some("00-ab-cd-01"));
        assert_eq!(get(&b, "missing"), None);
        check(&b).unwrap();
        let mut out = Vec::new();
        write_json(&mut out, &b);
        assert_eq!(
            out,
            br#","attributes":{"traceparent":"00-ab-cd-01","x.y_z-1":""}"#
        );
    }

    #[test]
    fn no_attribute_is_no_block() {
        assert_eq!(block(&[]).unwrap(), None);
        assert!(check(&[]).is_err());
    }

    #[test]
    fn every_rule_is_enforced() {
        let long = "n".repeat(65);
        for (pairs, want) in [
            (vec![("", "v")], "must be 1 to 64"),
            (vec![(long.as_str(), "v")], "must be 1 to 64"),
            (vec![("a b", "v")], "must be 1 to 64"),
            (vec![("é", "v")], "must be 1 to 64"),
            (vec![("a", "1"), ("A", "2")], "given twice"),
        ] {
            let e = block(&pairs).unwrap_err();
            assert!(e.contains(want), "{pairs:?}: {e}");
        }
        let names: Vec<String> = (0..17).map(|i| format!("a{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        assert!(block(&many[..16]).is_ok());
        assert!(block(&many).unwrap_err().contains("at most 16"));
        let big = "v".repeat(MAX_TOTAL_BYTES - 1);
        assert!(block(&[("a", &big)]).is_ok());
        let over = "v".repeat(MAX_TOTAL_BYTES);
        assert!(block(&[("a", &over)]).unwrap_err().contains("8192"));
    }

    #[test]
    fn broker_attributes_are_reserved_counted_apart_and_strippable() {
        let e = block(&[("Narad-Dead-Letter-Source-Topic", "x")]).unwrap_err();
        assert!(e.contains("are the broker's"), "{e}");
        // A full producer block still takes the broker's own.
        let names: Vec<String> = (0..16).map(|i| format!("a{i}")).collect();
        let full: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        let user = block(&full).unwrap().unwrap();
        let dead = with_reserved(
            Some(&user),
            &[
                ("narad-dead-letter-source-topic", "orders"),
                ("narad-x", "1"),
            ],
        )
        .unwrap();
        check(&dead).unwrap();
        assert_eq!(Iter(&dead).count(), 18);
        assert_eq!(get(&dead, "narad-dead-letter-source-topic"), Some("orders"));
        // Replaced, not added up, when set again.
        let again = with_reserved(Some(&dead), &[("narad-x", "2")]).unwrap();
        assert_eq!(Iter(&again).count(), 17);
        assert_eq!(get(&again, "narad-x"), Some("2"));
        assert_eq!(without_reserved(Some(&again)).unwrap(), user);
        assert_eq!(without_reserved(Some(&user)).unwrap(), user);
        assert_eq!(with_reserved(None, &[]), None);
        let only = with_reserved(None, &[("narad-x", "1")]).unwrap();
        assert_eq!(without_reserved(Some(&only)), None);
        // Their own limits.
        let mut b = Builder::default();
        for i in 0..MAX_RESERVED {
            b.push_reserved(&format!("narad-{i}"), "v").unwrap();
        }
        assert!(b
            .push_reserved("narad-9", "v")
            .unwrap_err()
            .contains("at most 8"));
        let mut b = Builder::default();
        let big = "v".repeat(MAX_RESERVED_BYTES);
        assert!(b
            .push_reserved("narad-big", &big)
            .unwrap_err()
            .contains("1024"));
        assert!(Builder::default().push_reserved("plain", "v").is_err());
    }

    #[test]
    fn headers_with_the_prefix_are_attributes() {
        let mut h = http::HeaderMap::new();
        h.insert("narad-attr-traceparent", "00-1-2-01".parse().unwrap());
        h.insert("content-type", "text/plain".parse().unwrap());
        h.insert(
            "narad-attr-note",
            http::HeaderValue::from_bytes("größe".as_bytes()).unwrap(),
        );
        let b = from_headers(&h).unwrap().unwrap();
        let mut pairs: Vec<_> = Iter(&b).collect();
        pairs.sort();
        assert_eq!(pairs, [("note", "größe"), ("traceparent", "00-1-2-01")]);
        h.append("narad-attr-note", "again".parse().unwrap());
        assert!(from_headers(&h).unwrap_err().contains("twice"));
        let mut h = http::HeaderMap::new();
        h.insert(
            "narad-attr-bin",
            http::HeaderValue::from_bytes(&[0xff, 0xfe]).unwrap(),
        );
        assert!(from_headers(&h).unwrap_err().contains("not UTF-8"));
        assert_eq!(from_headers(&http::HeaderMap::new()).unwrap(), None);
    }

    #[test]
    fn check_refuses_what_the_builder_would_not_make() {
        let good = block(&[("a", "b")]).unwrap().unwrap();
        for bad in [
            &good[..good.len() - 1],      // truncated value
            &[1u8, b'A', 0, 0][..],       // uppercase name
            &[2u8, b'a', b'b', 9][..],    // truncated length
            &[1u8, 0xff, 0, 0][..],       // name not UTF-8
            &[1u8, b'a', 1, 0, 0xff][..], // value not UTF-8
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        let mut twice = good.to_vec();
        twice.extend_from_slice(&good);
        assert!(check(&twice).is_err());
    }

    proptest! {
        #[test]
        fn prop_iteration_and_check_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let n = Iter(&bytes).count();
            prop_assert!(n <= bytes.len());
            let _ = check(&bytes);
            let mut out = Vec::new();
            write_json(&mut out, &bytes);
            let ok = out.starts_with(b",\"attributes\":{") && out.ends_with(b"}");
            prop_assert!(ok);
        }

        #[test]
        fn prop_built_blocks_check_and_round_trip(
            pairs in proptest::collection::btree_map("[a-z0-9._-]{1,64}", "\\PC{0,40}", 0..16)
        ) {
            let b = from_map(pairs.iter()).unwrap();
            match b {
                None => prop_assert!(pairs.is_empty()),
                Some(b) => {
                    check(&b).unwrap();
                    let back: Vec<(String, String)> =
                        Iter(&b).map(|(n, v)| (n.to_string(), v.to_string())).collect();
                    let want: Vec<(String, String)> =
                        pairs.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
                    prop_assert_eq!(back, want);
                    let mut out = b"{\"x\":1".to_vec();
                    write_json(&mut out, &b);
                    out.push(b'}');
                    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
                    prop_assert_eq!(v["attributes"].as_object().unwrap().len(), pairs.len());
                }
            }
        }
    }
}
