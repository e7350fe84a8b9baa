//! Query strings as Go's `url.Values` writes them: `&`-separated `k=v`, percent-encoded,
//! `+` for a space. Values are raw bytes (a key may be any bytes). Unknown parameters are
//! ignored; a known one given twice is refused by the handler that reads it.

use std::borrow::Cow;

use percent_encoding::percent_decode;

use crate::error::{ApiError, ApiResult};

/// Parsed query parameters, in order: borrowed from the query string where nothing was
/// escaped.
#[derive(Debug, Default)]
pub struct Query<'a> {
    pairs: Vec<Pair<'a>>,
}

/// A decoded name and value.
type Pair<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// `s` with `+` read as a space and percent escapes decoded (a `+` is never part of an
/// escape, so the pieces between them decode on their own).
fn decode(s: &str) -> Cow<'_, [u8]> {
    let b = s.as_bytes();
    if memchr::memchr2(b'+', b'%', b).is_none() {
        return Cow::Borrowed(b);
    }
    // Straight into one buffer: `Cow::from(percent_decode(..))` would scan each piece twice
    // and allocate for each. (An ack's receipt handle comes with its `:` escaped.)
    let mut out = Vec::with_capacity(b.len());
    for (i, piece) in b.split(|&c| c == b'+').enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.extend(percent_decode(piece));
    }
    Cow::Owned(out)
}

impl<'a> Query<'a> {
    pub fn parse(raw: Option<&'a str>) -> Self {
        let mut pairs = Vec::new();
        if let Some(raw) = raw {
            for part in raw.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = part.split_once('=').unwrap_or((part, ""));
                pairs.push((decode(k), decode(v)));
            }
        }
        Query { pairs }
    }

    /// The single value of `name` (`None` if absent; `400` if repeated).
    pub fn one(&self, name: &str) -> ApiResult<Option<&[u8]>> {
        let mut it = self
            .pairs
            .iter()
            .filter(|(k, _)| k.as_ref() == name.as_bytes());
        let first = it.next();
        if it.next().is_some() {
            return Err(ApiError::bad_request(format!(
                "{name} given more than once"
            )));
        }
        Ok(first.map(|(_, v)| v.as_ref()))
    }

    /// The single value of `name` as UTF-8 text.
    pub fn text(&self, name: &str) -> ApiResult<Option<&str>> {
        match self.one(name)? {
            None => Ok(None),
            Some(v) => std::str::from_utf8(v)
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("{name} is not valid UTF-8"))),
        }
    }

    /// The single value of `name` as a non-negative integer (`400` otherwise).
    pub fn uint(&self, name: &str) -> ApiResult<Option<u64>> {
        match self.text(name)? {
            None => Ok(None),
            Some(s) => s.parse::<u64>().map(Some).map_err(|_| {
                ApiError::bad_request(format!("{name} must be a non-negative integer, got {s:?}"))
            }),
        }
    }

    /// A partition index below `count`.
    pub fn partition(&self, count: u32) -> ApiResult<Option<u32>> {
        match self.uint("partition")? {
            None => Ok(None),
            Some(p) if p < count as u64 => Ok(Some(p as u32)),
            Some(p) => Err(ApiError::bad_request(format!(
                "partition {p} out of range: the topic has {count} partitions"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_go_url_values() {
        let q = Query::parse(Some("extend=true&key=a%2Fb+c%FF&receipt_handle=1%3A2%3A3"));
        assert_eq!(q.one("key").unwrap().unwrap(), b"a/b c\xff");
        assert_eq!(q.text("receipt_handle").unwrap().unwrap(), "1:2:3");
        assert_eq!(q.text("extend").unwrap().unwrap(), "true");
        assert!(q.one("missing").unwrap().is_none());
    }

    #[test]
    fn repeated_and_bad_values_are_refused() {
        let q = Query::parse(Some("partition=1&partition=2&n=-1&m=x"));
        assert!(q.one("partition").is_err());
        assert!(q.uint("n").is_err());
        assert!(q.uint("m").is_err());
        let q = Query::parse(Some("partition=3"));
        assert!(q.partition(3).is_err());
        assert_eq!(q.partition(4).unwrap(), Some(3));
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use percent_encoding::{percent_encode, AsciiSet, NON_ALPHANUMERIC};
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;

    /// What Go's `url.QueryEscape` leaves alone: letters, digits, `-_.~`; space becomes `+`.
    const QUERY: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');

    fn escape(b: &[u8]) -> String {
        // Spaces first become '+' (and a literal '+' is escaped), as Go writes them.
        percent_encode(b, QUERY).to_string().replace("%20", "+")
    }

    proptest! {
        #[test]
        fn prop_query_parse_never_panics(raw in prop_oneof![
            any::<String>(),
            "[a-z=&%+0-9A-F]{0,40}",
            "(%[0-9a-fA-F]?[0-9a-fA-F]?|[=&+]|\\PC){0,20}",
        ]) {
            let q = Query::parse(Some(&raw));
            let pairs = raw.split('&').filter(|p| !p.is_empty()).count();
            prop_assert_eq!(q.pairs.len(), pairs);
            for name in ["partition", "offset", "max", "wait", "extend", "key", "receipt_handle"] {
                let _ = q.text(name);
                let _ = q.uint(name);
            }
            let _ = q.partition(u32::MAX);
        }

        /// Values escaped the way Go's `url.Values.Encode` does come back byte for byte.
        #[test]
        fn prop_query_roundtrip(pairs in btree_map(any::<String>(), vec(any::<u8>(), 0..24), 0..6)) {
            let raw = pairs
                .iter()
                .map(|(k, v)| format!("{}={}", escape(k.as_bytes()), escape(v)))
                .collect::<Vec<_>>()
                .join("&");
            let q = Query::parse(Some(&raw));
            for (k, v) in &pairs {
                prop_assert_eq!(q.one(k).unwrap(), Some(&v[..]), "{} in {}", k, raw);
                match std::str::from_utf8(v) {
                    Ok(s) => prop_assert_eq!(q.text(k).unwrap(), Some(s)),
                    Err(_) => prop_assert!(q.text(k).is_err()),
                }
            }
        }

        /// Decoding piece by piece between the `+`s reads what replacing every `+` first and
        /// then percent-decoding the whole reads; unescaped text is borrowed.
        #[test]
        fn prop_decode_matches_the_two_step_reading(raw in prop_oneof![
            any::<String>(),
            "(%[0-9a-fA-F+]{0,2}|[+a-z])*",
        ]) {
            let plus: Vec<u8> = raw.bytes().map(|b| if b == b'+' { b' ' } else { b }).collect();
            let want: Vec<u8> = percent_decode(&plus).collect();
            let got = decode(&raw);
            prop_assert_eq!(got.as_ref(), &want[..]);
            prop_assert_eq!(matches!(got, Cow::Borrowed(_)), !raw.contains(['+', '%']));
        }

        #[test]
        fn prop_query_repeated_name_is_refused(name in "[a-z_]{1,12}", a in any::<u64>(), b in any::<u64>()) {
            let raw = format!("{name}={a}&x=1&{name}={b}");
            let q = Query::parse(Some(&raw));
            prop_assert!(q.one(&name).is_err());
            prop_assert!(q.uint(&name).is_err());
        }

        /// `uint` takes exactly the decimal forms Rust's `u64` parser takes, and
        /// `partition` only indexes below the count.
        #[test]
        fn prop_query_uint_and_partition(
            v in prop_oneof![
                any::<u64>().prop_map(|n| n.to_string()),
                "[+-]?[0-9]{0,21}",
                any::<String>(),
            ],
            count in prop_oneof![1..16u32, any::<u32>()],
        ) {
            let raw = format!("partition={}", escape(v.as_bytes()));
            let q = Query::parse(Some(&raw));
            let want = v.parse::<u64>().ok();
            prop_assert_eq!(q.uint("partition").ok().flatten(), want);
            match q.partition(count) {
                Ok(Some(p)) => prop_assert!(want == Some(p as u64) && p < count),
                Ok(None) => prop_assert!(false, "partition given"),
                Err(_) => prop_assert!(want.is_none_or(|p| p >= count as u64)),
            }
        }
    }
}
