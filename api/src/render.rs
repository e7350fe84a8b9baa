//! Payload and key rendering (SPEC §2.9) and the inverse decoders.
//!
//! On consume, `payload` is the stored bytes verbatim when they are one valid JSON value (the
//! exact bytes, surrounding JSON whitespace included, which keeps `"payload":<bytes>` valid
//! JSON); else a JSON string when they are valid UTF-8; else standard padded base64 in a JSON
//! string plus `"payload_encoding":"base64"`. Keys: UTF-8 → string; other bytes → base64 plus
//! `"key_encoding":"base64"`.
//!
//! The renderers are on the server's hot path: classification is one pass of serde_json's
//! value skipper (no tree is built, no depth limit) plus a UTF-8 check, and nothing is
//! allocated for JSON or text payloads until the caller writes them out.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use serde_json::value::RawValue;

/// The one encoding name used on the wire.
pub const BASE64: &str = "base64";

/// How a stored payload is rendered in a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderedPayload<'a> {
    /// The bytes are one valid JSON value: embed them verbatim (exact bytes).
    Json(&'a str),
    /// Valid UTF-8 that is not JSON: embed as a JSON string.
    Text(&'a str),
    /// Anything else: standard padded base64 in a JSON string, `payload_encoding:"base64"`.
    Base64(String),
}

impl RenderedPayload<'_> {
    /// `Some("base64")` for binary payloads, else `None` (no `payload_encoding` field).
    pub fn encoding(&self) -> Option<&'static str> {
        match self {
            RenderedPayload::Base64(_) => Some(BASE64),
            _ => None,
        }
    }

    /// Appends the JSON value (what follows `"payload":`) to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            RenderedPayload::Json(s) => out.extend_from_slice(s.as_bytes()),
            RenderedPayload::Text(s) => write_json_str(out, s),
            RenderedPayload::Base64(s) => {
                // Base64 needs no escaping.
                out.reserve(s.len() + 2);
                out.push(b'"');
                out.extend_from_slice(s.as_bytes());
                out.push(b'"');
            }
        }
    }

    /// The JSON value as a string.
    pub fn to_json_string(&self) -> String {
        let mut out = Vec::with_capacity(self.json_len_hint());
        self.write_json(&mut out);
        // write_json only writes valid UTF-8 (JSON/text are &str, base64 is ASCII).
        String::from_utf8(out).expect("rendered payload is UTF-8")
    }

    /// The JSON value as a `Box<RawValue>` (for `Message::payload`).
    ///
    /// A `RawValue` cannot hold leading or trailing whitespace: a JSON payload surrounded by
    /// whitespace (`{"a":1}\n`) is trimmed here. Writers that must be byte-exact use
    /// [`write_json`](Self::write_json) instead.
    pub fn into_raw_value(self) -> Box<RawValue> {
        let json = match self {
            RenderedPayload::Json(s) => {
                // Already validated: the trimmed text is the value itself.
                let t = s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
                return RawValue::from_string(t.to_owned())
                    .expect("validated JSON payload is a RawValue");
            }
            other => other.to_json_string(),
        };
        RawValue::from_string(json).expect("a JSON string is a RawValue")
    }

    fn json_len_hint(&self) -> usize {
        match self {
            RenderedPayload::Json(s) => s.len(),
            RenderedPayload::Text(s) => s.len() + 2,
            RenderedPayload::Base64(s) => s.len() + 2,
        }
    }
}

/// Whether `bytes` are exactly one valid JSON value (RFC 8259, UTF-8), surrounding JSON
/// whitespace allowed. No nesting limit.
pub fn is_json(bytes: &[u8]) -> bool {
    json_str(bytes).is_some()
}

/// `Some(the whole input as &str)` if it is one valid JSON value.
fn json_str(bytes: &[u8]) -> Option<&str> {
    // Quick reject: a JSON text starts (after whitespace) with one of these.
    let first = bytes
        .iter()
        .find(|&&b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))?;
    if !matches!(
        first,
        b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
    ) {
        return None;
    }
    // Skipping into a borrowed RawValue validates the syntax (iteratively: no depth limit)
    // and the UTF-8 of the value; `from_slice` refuses trailing non-whitespace.
    let raw: &RawValue = serde_json::from_slice(bytes).ok()?;
    let v = raw.get();
    if v.len() == bytes.len() {
        return Some(v);
    }
    // The rest is ASCII JSON whitespace around a UTF-8 value: the whole input is UTF-8.
    std::str::from_utf8(bytes).ok()
}

/// The deepest nesting of arrays and objects a JSON payload is rendered verbatim with. A
/// deeper one is rendered as base64 (`payload_encoding: "base64"`, the exact bytes), since
/// common JSON parsers refuse deep documents (serde_json beyond 128 levels, Go's
/// `encoding/json` beyond 10000) and the answer wraps the payload in up to three more levels
/// (`{"messages":[{"payload":…}]}`): every client must be able to parse every answer, or a
/// message could never be acked.
pub const MAX_RENDER_DEPTH: usize = 64;

/// Whether the arrays and objects of a valid JSON text nest deeper than `limit` (brackets
/// inside strings do not count). Stops at the first level past the limit.
fn nests_deeper_than(json: &[u8], limit: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Classifies a stored payload for rendering (SPEC §2.9). JSON nested deeper than
/// [`MAX_RENDER_DEPTH`] renders as base64.
pub fn render_payload(bytes: &[u8]) -> RenderedPayload<'_> {
    if let Some(s) = json_str(bytes) {
        if !nests_deeper_than(s.as_bytes(), MAX_RENDER_DEPTH) {
            return RenderedPayload::Json(s);
        }
        return RenderedPayload::Base64(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => RenderedPayload::Text(s),
        Err(_) => RenderedPayload::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
    }
}

/// Renders a stored key: `(text, None)` for UTF-8, `(base64, Some("base64"))` otherwise.
pub fn render_key(bytes: &[u8]) -> (Cow<'_, str>, Option<&'static str>) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (Cow::Borrowed(s), None),
        Err(_) => (
            Cow::Owned(base64::engine::general_purpose::STANDARD.encode(bytes)),
            Some(BASE64),
        ),
    }
}

/// Appends `s` as a JSON string literal: `"`, `\\` and the control characters escaped, as
/// serde_json writes them. The runs between escapes are found eight bytes at a time and
/// copied whole.
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    while let Some(i) = next_to_escape(bytes, start) {
        out.extend_from_slice(&bytes[start..i]);
        let b = bytes[i];
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            _ => b"",
        };
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// The first byte at or after `from` that a JSON string must escape: `"`, `\\` or one below
/// 0x20.
fn next_to_escape(b: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte of `x` below `n` (n <= 0x80). A borrow out of a flagged
    // byte can flag bytes above it as well, never below: the lowest flag is exact.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * n as u64) & !x & HIGH;
    let mut i = from;
    while let Some(chunk) = b.get(i..i + 8) {
        let x = u64::from_le_bytes(chunk.try_into().expect("invariant: 8 bytes"));
        let hits = below(x, 0x20)
            | below(x ^ (ONES * b'"' as u64), 1)
            | below(x ^ (ONES * b'\\' as u64), 1);
        if hits != 0 {
            return Some(i + (hits.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    b[i.min(b.len())..]
        .iter()
        .position(|&c| c < 0x20 || c == b'"' || c == b'\\')
        .map(|p| i + p)
}

/// A payload or key that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

fn check_encoding(encoding: Option<&str>) -> Result<bool, DecodeError> {
    match encoding {
        None | Some("") => Ok(false),
        Some(BASE64) => Ok(true),
        Some(other) => Err(DecodeError(format!("unknown encoding {other:?}"))),
    }
}

/// Decodes a rendered payload into its *display bytes*:
///
/// - `payload_encoding:"base64"` → the decoded bytes (byte-exact);
/// - a JSON string → its unquoted text. Text rendered as a JSON string and a produced JSON
///   string value (stored with its quotes) are indistinguishable on the wire; both come back
///   unquoted, as the Go SDK does when asked for bytes;
/// - any other JSON value → its JSON text as received (after a parse by serde, surrounding
///   whitespace is gone; the value itself is verbatim).
pub fn decode_payload(raw: &RawValue, encoding: Option<&str>) -> Result<Vec<u8>, DecodeError> {
    let b64 = check_encoding(encoding)?;
    let text = raw
        .get()
        .trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
    if b64 {
        let s: Cow<'_, str> = serde_json::from_str(text)
            .map_err(|_| DecodeError("base64 payload is not a JSON string".into()))?;
        return base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map_err(|e| DecodeError(format!("bad base64 payload: {e}")));
    }
    if text.starts_with('"') {
        let s: Cow<'_, str> = serde_json::from_str(text)
            .map_err(|e| DecodeError(format!("bad JSON string payload: {e}")))?;
        return Ok(s.into_owned().into_bytes());
    }
    Ok(text.as_bytes().to_vec())
}

/// Decodes a rendered key (`key` + `key_encoding`) into its bytes.
pub fn decode_key(key: &str, encoding: Option<&str>) -> Result<Vec<u8>, DecodeError> {
    if check_encoding(encoding)? {
        base64::engine::general_purpose::STANDARD
            .decode(key.as_bytes())
            .map_err(|e| DecodeError(format!("bad base64 key: {e}")))
    } else {
        Ok(key.as_bytes().to_vec())
    }
}

/// Encodes bytes for a batch-produce element so that the server stores them byte-exact:
/// raw JSON when they are one JSON value with no surrounding whitespace, else base64
/// (a JSON string would be stored with its quotes). Returns `(payload, payload_encoding)`.
pub fn encode_batch_payload(bytes: &[u8]) -> (Box<RawValue>, Option<&'static str>) {
    if let Some(s) = json_str(bytes) {
        let trimmed = s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
        if trimmed.len() == s.len() {
            if let Ok(raw) = RawValue::from_string(s.to_owned()) {
                return (raw, None);
            }
        }
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    let raw = RawValue::from_string(format!("\"{b64}\"")).expect("base64 string is JSON");
    (raw, Some(BASE64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_of(bytes: &[u8]) -> (String, Option<&'static str>) {
        let r = render_payload(bytes);
        let enc = r.encoding();
        (r.to_json_string(), enc)
    }

    #[test]
    fn json_payloads_are_verbatim() {
        for p in [
            &br#"{"order_id":"ord_123","amount":4999}"#[..],
            b"42",
            b"-1.5e10",
            b"true",
            b"false",
            b"null",
            b"\"abc\"",
            b"[1, 2 ,3]",
            b"{ \"a\" : [ ] }",
            b" {\"a\":1}\n",
            b"\t\"x\"\r\n",
            "\"h\u{e9}llo\"".as_bytes(),
            br#""\ud800""#,
        ] {
            let (j, enc) = json_of(p);
            assert_eq!(j.as_bytes(), p, "{:?}", String::from_utf8_lossy(p));
            assert_eq!(enc, None);
            // Still valid when embedded.
            let doc = format!("{{\"payload\":{j},\"x\":1}}");
            assert!(
                serde_json::from_str::<serde::de::IgnoredAny>(&doc).is_ok(),
                "{doc}"
            );
        }
    }

    #[test]
    fn deep_nesting_is_json_but_renders_as_base64() {
        let nested = |n: usize, open: u8, close: u8| {
            let mut p = Vec::new();
            p.extend(std::iter::repeat_n(open, n));
            p.extend(std::iter::repeat_n(close, n));
            p
        };
        let p = nested(5000, b'[', b']');
        assert!(is_json(&p));
        match render_payload(&p) {
            RenderedPayload::Base64(b) => assert_eq!(
                base64::engine::general_purpose::STANDARD.decode(b).unwrap(),
                p
            ),
            other => panic!("{:?}", other.to_json_string().len()),
        }
        // The limit itself renders verbatim, one more level does not.
        assert!(matches!(
            render_payload(&nested(MAX_RENDER_DEPTH, b'[', b']')),
            RenderedPayload::Json(_)
        ));
        assert!(matches!(
            render_payload(&nested(MAX_RENDER_DEPTH + 1, b'[', b']')),
            RenderedPayload::Base64(_)
        ));
        // Brackets inside strings are text, not nesting; escaped quotes stay inside.
        let s = format!("[\"{}\\\"{}\"]", "[".repeat(500), "{".repeat(500));
        assert!(is_json(s.as_bytes()), "{s}");
        assert!(matches!(
            render_payload(s.as_bytes()),
            RenderedPayload::Json(_)
        ));
        // Every rendered answer, inside a batch envelope, parses with serde_json's limit.
        for n in [1, 64, 127, 128, 129, 1000] {
            let p = format!("{}{{}}{}", "{\"k\":".repeat(n - 1), "}".repeat(n - 1));
            assert!(is_json(p.as_bytes()), "{p}");
            let doc = format!(
                "{{\"messages\":[{{\"payload\":{}}}]}}",
                render_payload(p.as_bytes()).to_json_string()
            );
            assert!(
                serde_json::from_str::<serde_json::Value>(&doc).is_ok(),
                "depth {n} does not parse"
            );
        }
    }

    #[test]
    fn text_payloads_are_strings() {
        let cases: &[(&[u8], &str)] = &[
            (b"hello world", r#""hello world""#),
            (b"hello\n", r#""hello\n""#),
            (b"{\"a\":1", r#""{\"a\":1""#),
            (b"{\"a\":1} {}", r#""{\"a\":1} {}""#),
            (b"01", r#""01""#),
            (b"tru", r#""tru""#),
            (b"NaN", r#""NaN""#),
            (b" ", r#"" ""#),
            (b"\x00\x1f\x7f\\", r#""\u0000\u001f\x7f\\""#),
            (b"a\tb\x08\x0c\r", r#""a\tb\b\f\r""#),
            ("caf\u{e9} \u{1F600}".as_bytes(), "\"caf\u{e9} \u{1F600}\""),
        ];
        for &(p, want) in cases {
            let want = want.replace("\\x7f", "\x7f");
            let (j, enc) = json_of(p);
            assert_eq!(j, want);
            assert_eq!(enc, None);
            let back: String = serde_json::from_str(&j).unwrap();
            assert_eq!(back.as_bytes(), p);
        }
    }

    #[test]
    fn binary_payloads_are_base64() {
        let (j, enc) = json_of(&[0, 1, 2, 0xff]);
        assert_eq!(j, r#""AAEC/w==""#);
        assert_eq!(enc, Some("base64"));
        // Invalid UTF-8 inside a JSON string is not JSON.
        let (j, enc) = json_of(b"\"\xff\"");
        assert_eq!(j, r#""Iv8i""#);
        assert_eq!(enc, Some("base64"));
        let (j, _) = json_of(b"\xc3");
        assert_eq!(j, r#""ww==""#);
    }

    #[test]
    fn write_json_appends() {
        let mut out = b"{\"payload\":".to_vec();
        render_payload(b"a\"b").write_json(&mut out);
        out.push(b'}');
        assert_eq!(out, br#"{"payload":"a\"b"}"#);
    }

    #[test]
    fn raw_values() {
        assert_eq!(
            render_payload(b" {\"a\":1}\n").into_raw_value().get(),
            "{\"a\":1}"
        );
        assert_eq!(render_payload(b"x").into_raw_value().get(), "\"x\"");
        assert_eq!(render_payload(b"\xff").into_raw_value().get(), "\"/w==\"");
    }

    #[test]
    fn keys() {
        assert_eq!(
            render_key(b"customer-42"),
            (Cow::Borrowed("customer-42"), None)
        );
        let (k, enc) = render_key(&[0xff]);
        assert_eq!(k, "/w==");
        assert_eq!(enc, Some("base64"));
        assert_eq!(decode_key("/w==", Some("base64")).unwrap(), vec![0xff]);
        assert_eq!(decode_key("abc", None).unwrap(), b"abc");
        assert!(decode_key("abc", Some("hex")).is_err());
    }

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn decoding() {
        assert_eq!(
            decode_payload(&raw(r#"{"a":1}"#), None).unwrap(),
            br#"{"a":1}"#
        );
        assert_eq!(
            decode_payload(&raw(r#""hello\n""#), None).unwrap(),
            b"hello\n"
        );
        assert_eq!(decode_payload(&raw("42"), None).unwrap(), b"42");
        assert_eq!(decode_payload(&raw("null"), Some("")).unwrap(), b"null");
        assert_eq!(
            decode_payload(&raw(r#""AAEC/w==""#), Some("base64")).unwrap(),
            vec![0, 1, 2, 255]
        );
        assert!(decode_payload(&raw("1"), Some("base64")).is_err());
        assert!(decode_payload(&raw(r#""!!""#), Some("base64")).is_err());
        assert!(decode_payload(&raw(r#""x""#), Some("gzip")).is_err());
        // Round trips through rendering.
        for p in [
            &b"plain text"[..],
            b"{\"k\":[1,2]}",
            &[0u8, 159, 146, 150],
            "\u{1F600}".as_bytes(),
        ] {
            let r = render_payload(p);
            let enc = r.encoding();
            assert_eq!(decode_payload(&r.into_raw_value(), enc).unwrap(), p);
        }
    }

    #[test]
    fn batch_encoding() {
        let (p, e) = encode_batch_payload(br#"{"a":1}"#);
        assert_eq!((p.get(), e), (r#"{"a":1}"#, None));
        let (p, e) = encode_batch_payload(b"{\"a\":1}\n");
        assert_eq!((p.get(), e), ("\"eyJhIjoxfQo=\"", Some("base64")));
        let (p, e) = encode_batch_payload(b"text");
        assert_eq!((p.get(), e), ("\"dGV4dA==\"", Some("base64")));
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 48, 6, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..6).prop_map(Value::Array),
                vec((any::<String>(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Payload bytes: binary, text, JSON (compact or padded), and JSON nested around the
    /// render depth limit.
    fn payload() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            vec(any::<u8>(), 0..64),
            any::<String>().prop_map(String::into_bytes),
            json_value().prop_map(|v| v.to_string().into_bytes()),
            (json_value(), "[ \t\r\n]{0,3}", "[ \t\r\n]{0,3}")
                .prop_map(|(v, a, b)| format!("{a}{v:#}{b}").into_bytes()),
            (
                MAX_RENDER_DEPTH - 2..MAX_RENDER_DEPTH + 200,
                any::<bool>(),
                "[0-9a-z\",:\\[\\]{}]{0,4}"
            )
                .prop_map(|(n, obj, mid)| {
                    let (open, close) = if obj { ("{\"k\":", "}") } else { ("[", "]") };
                    format!("{}{mid}{}", open.repeat(n), close.repeat(n)).into_bytes()
                }),
        ]
    }

    fn encoding() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            Just(None),
            Just(Some(String::new())),
            Just(Some(BASE64.to_string())),
            any::<String>().prop_map(Some),
        ]
    }

    proptest! {
        /// Every answer embeds its payload so that serde_json (128-level limit) parses the
        /// whole batch envelope.
        #[test]
        fn prop_rendered_payload_is_valid_json_in_an_envelope(p in payload()) {
            let r = render_payload(&p);
            prop_assert_eq!(r.encoding().is_some(), matches!(r, RenderedPayload::Base64(_)));
            if let RenderedPayload::Json(s) = &r {
                prop_assert_eq!(s.as_bytes(), &p[..]);
                prop_assert!(is_json(&p));
            }
            let doc = format!("{{\"messages\":[{{\"payload\":{}}}]}}", r.to_json_string());
            prop_assert!(serde_json::from_str::<serde_json::Value>(&doc).is_ok(), "{}", doc);
            // The RawValue form is one valid JSON value too.
            let raw = r.into_raw_value();
            prop_assert!(serde_json::from_str::<serde::de::IgnoredAny>(raw.get()).is_ok());
        }

        /// Rendering then decoding gives back the bytes (JSON strings come back unquoted;
        /// other JSON values as their text without surrounding whitespace).
        #[test]
        fn prop_render_decode_roundtrip(p in payload()) {
            let r = render_payload(&p);
            let enc = r.encoding();
            let json = match &r {
                RenderedPayload::Json(s) => Some(s.trim_matches([' ', '\t', '\n', '\r']).to_string()),
                _ => None,
            };
            let back = decode_payload(&r.into_raw_value(), enc).unwrap();
            match json {
                None => prop_assert_eq!(back, p),
                Some(t) if t.starts_with('"') => {
                    let s: String = serde_json::from_str(&t).unwrap();
                    prop_assert_eq!(back, s.into_bytes());
                }
                Some(t) => prop_assert_eq!(back, t.into_bytes()),
            }
        }

        #[test]
        fn prop_key_roundtrip(k in prop_oneof![vec(any::<u8>(), 0..48), any::<String>().prop_map(String::into_bytes)]) {
            let (text, enc) = render_key(&k);
            prop_assert_eq!(enc.is_some(), std::str::from_utf8(&k).is_err());
            prop_assert_eq!(decode_key(&text, enc).unwrap(), k);
        }

        /// What the server stores for a batch element (`payload` verbatim, or the base64
        /// string decoded) is exactly the bytes that were encoded.
        #[test]
        fn prop_batch_payload_is_stored_byte_exact(p in payload()) {
            let (raw, enc) = encode_batch_payload(&p);
            // Through a batch body as the server parses it.
            let body = format!("{{\"payload\":{},\"x\":1}}", raw.get());
            #[derive(serde::Deserialize)]
            struct Elem {
                payload: Box<RawValue>,
            }
            let e: Elem = serde_json::from_str(&body).unwrap();
            let stored = match enc {
                None => e.payload.get().as_bytes().to_vec(),
                Some(_) => {
                    let s: String = serde_json::from_str(e.payload.get()).unwrap();
                    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
                }
            };
            prop_assert_eq!(stored, p);
        }

        /// The bytes serde_json writes for the same string, escapes included.
        #[test]
        fn prop_write_json_str_is_serde_jsons(s in prop_oneof![
            any::<String>(),
            "[\\x00-\\x21\"\\\\a-z\\x7f\u{e9}\u{1f600}]{0,40}",
        ]) {
            let mut out = Vec::new();
            write_json_str(&mut out, &s);
            prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&s).unwrap());
        }

        #[test]
        fn prop_write_json_str_roundtrip(s in any::<String>(), prefix in vec(any::<u8>(), 0..4)) {
            let mut out = prefix.clone();
            write_json_str(&mut out, &s);
            prop_assert_eq!(&out[..prefix.len()], &prefix[..]);
            let back: String = serde_json::from_slice(&out[prefix.len()..]).unwrap();
            prop_assert_eq!(back, s);
        }

        /// Decoding never panics; a base64 payload or key decodes only from its canonical
        /// (padded, zero trailing bits) text.
        #[test]
        fn prop_decode_payload_and_key_never_panic(
            text in prop_oneof![
                any::<String>(),
                "[A-Za-z0-9+/]{0,12}={0,3}",
                json_value().prop_map(|v| v.to_string()),
            ],
            enc in encoding(),
        ) {
            let quoted = serde_json::to_string(&text).unwrap();
            for raw_text in [quoted.as_str(), text.as_str()] {
                let Ok(raw) = RawValue::from_string(raw_text.to_string()) else { continue };
                if let Ok(bytes) = decode_payload(&raw, enc.as_deref()) {
                    if enc.as_deref() == Some(BASE64) {
                        let s: String = serde_json::from_str(raw.get()).unwrap();
                        prop_assert_eq!(base64::engine::general_purpose::STANDARD.encode(&bytes), s);
                    }
                }
            }
            match decode_key(&text, enc.as_deref()) {
                Ok(bytes) if enc.as_deref() == Some(BASE64) => {
                    prop_assert_eq!(base64::engine::general_purpose::STANDARD.encode(&bytes), text);
                }
                Ok(bytes) => prop_assert_eq!(bytes, text.into_bytes()),
                Err(_) => prop_assert!(matches!(enc.as_deref(), Some(e) if !e.is_empty())),
            }
        }

        #[test]
        fn prop_is_json_agrees_with_serde(p in payload()) {
            let strict = std::str::from_utf8(&p).is_ok()
                && serde_json::from_slice::<serde::de::IgnoredAny>(&p).is_ok();
            // serde_json's own depth limit makes deep documents fail the strict parse.
            if !nests_deeper_than(&p, 100) {
                prop_assert_eq!(is_json(&p), strict);
            }
        }
    }
}
