//! Output helpers: aligned tables, human units, message printing.
//!
//! Payloads print as themselves (SPEC §7.2): JSON verbatim, text unquoted, binary as hex with
//! a byte count; `--raw` prints the decoded payload bytes only (one per line).

use std::io::{self, Write};

use narad_api::render::{decode_key, decode_payload};
use narad_api::Message;

/// A simple left-aligned text table.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<const N: usize>(headers: [&str; N]) -> Table {
        Table {
            headers: headers.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row<const N: usize>(&mut self, cells: [String; N]) {
        self.rows.push(cells.into());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |out: &mut dyn Write, cells: &[String]| -> io::Result<()> {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate().take(n) {
                if i + 1 == n {
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    let pad = widths[i] - c.chars().count() + 2;
                    s.extend(std::iter::repeat_n(' ', pad));
                }
            }
            writeln!(out, "{}", s.trim_end())
        };
        line(out, &self.headers)?;
        for r in &self.rows {
            line(out, r)?;
        }
        Ok(())
    }
}

/// Bytes in binary units: `512 B`, `1.5 KiB`, `64.0 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

/// A retention in ms: `forever` for 0, else human units (`7d`, `12h`).
pub fn human_retention(ms: u64) -> String {
    if ms == 0 {
        "forever".into()
    } else {
        narad_api::duration::format_human_ms(ms)
    }
}

/// Human milliseconds (`30s`).
pub fn human_ms(ms: u64) -> String {
    narad_api::duration::format_human_ms(ms)
}

/// Unix seconds as UTC `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_secs(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Unix milliseconds as UTC time (seconds precision).
pub fn utc_ms(ms: u64) -> String {
    utc_secs(ms / 1000)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = (z - era * 146_097) as u64;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe as i64 + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(H[(x >> 4) as usize] as char);
        s.push(H[(x & 0xf) as usize] as char);
    }
    s
}

/// How a payload displays: JSON verbatim, text unquoted, binary as `<N bytes> hex`.
pub fn display_payload(m: &Message) -> String {
    let enc = m.payload_encoding.as_deref();
    match enc {
        Some(e) if !e.is_empty() => match decode_payload(&m.payload, enc) {
            Ok(bytes) => format!("<{} bytes> {}", bytes.len(), hex(&bytes)),
            Err(_) => m.payload.get().to_string(),
        },
        _ => {
            let raw = m.payload.get();
            if raw.starts_with('"') {
                // A JSON string: show the text itself.
                match serde_json::from_str::<String>(raw) {
                    Ok(s) => s,
                    Err(_) => raw.to_string(),
                }
            } else {
                raw.to_string()
            }
        }
    }
}

/// How a key displays: text as is, binary as `hex:…`.
pub fn display_key(m: &Message) -> Option<String> {
    let key = m.key.as_deref()?;
    match m.key_encoding.as_deref() {
        None | Some("") => Some(key.to_string()),
        enc => Some(match decode_key(key, enc) {
            Ok(b) => format!("hex:{}", hex(&b)),
            Err(_) => key.to_string(),
        }),
    }
}

/// One human line (or more, for multi-line text): `orders/1@42 2026-01-01T00:00:01Z key=k
/// traceparent="00-…" <payload>` (attributes as `name="value"`).
pub fn format_message(m: &Message) -> String {
    let mut s = format!("{}/{}@{}", m.topic, m.partition, m.offset);
    if m.timestamp > 0 {
        s.push(' ');
        s.push_str(&utc_secs(m.timestamp));
    }
    if let Some(k) = display_key(m) {
        s.push_str(" key=");
        s.push_str(&k);
    }
    for (n, v) in m.attributes.iter().flatten() {
        s.push_str(&format!(" {n}={v:?}"));
    }
    s.push(' ');
    s.push_str(&display_payload(m));
    s
}

/// Writes a message: the human line, or with `raw` the decoded payload bytes and a newline.
pub fn write_message(out: &mut dyn Write, m: &Message, raw: bool) -> io::Result<()> {
    if raw {
        let bytes = decode_payload(&m.payload, m.payload_encoding.as_deref())
            .unwrap_or_else(|_| m.payload.get().as_bytes().to_vec());
        out.write_all(&bytes)?;
        out.write_all(b"\n")?;
    } else {
        writeln!(out, "{}", format_message(m))?;
    }
    out.flush()
}

/// Whether an I/O error means the reader went away (`| head`).
pub fn is_broken_pipe(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(payload: &str, enc: Option<&str>, key: Option<(&str, Option<&str>)>) -> Message {
        serde_json::from_value(serde_json::json!({
            "topic": "orders", "partition": 1, "offset": 42, "timestamp": 1767225601u64,
            "payload": serde_json::from_str::<serde_json::Value>(payload).unwrap(),
            "payload_encoding": enc,
            "key": key.map(|k| k.0), "key_encoding": key.and_then(|k| k.1),
        }))
        .unwrap()
    }

    fn raw_msg(payload_json: &str) -> Message {
        serde_json::from_str(&format!(
            r#"{{"topic":"t","partition":0,"offset":1,"timestamp":0,"payload":{payload_json}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn payloads_print_as_themselves() {
        let m = raw_msg(r#"{"order_id":"ord_123", "amount":4999}"#);
        assert_eq!(
            display_payload(&m),
            r#"{"order_id":"ord_123", "amount":4999}"#
        );
        let m = msg(r#""hello world""#, None, None);
        assert_eq!(display_payload(&m), "hello world");
        let m = msg(r#""AAEC/w==""#, Some("base64"), None);
        assert_eq!(display_payload(&m), "<4 bytes> 000102ff");
        let m = msg("42", None, None);
        assert_eq!(display_payload(&m), "42");
    }

    #[test]
    fn message_lines() {
        let m = msg(r#""hi""#, None, Some(("customer-42", None)));
        assert_eq!(
            format_message(&m),
            "orders/1@42 2026-01-01T00:00:01Z key=customer-42 hi"
        );
        let m = msg(r#"{"a":1}"#, None, Some(("/w==", Some("base64"))));
        assert_eq!(
            format_message(&m),
            r#"orders/1@42 2026-01-01T00:00:01Z key=hex:ff {"a":1}"#
        );
        let m = raw_msg("[1]");
        assert_eq!(format_message(&m), "t/0@1 [1]");
        let mut m = raw_msg("[1]");
        m.attributes = Some(
            [("traceparent", "00-1"), ("note", "a b")]
                .into_iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        );
        assert_eq!(
            format_message(&m),
            r#"t/0@1 note="a b" traceparent="00-1" [1]"#
        );
    }

    #[test]
    fn raw_output() {
        let mut out = Vec::new();
        write_message(&mut out, &msg(r#""AAEC/w==""#, Some("base64"), None), true).unwrap();
        write_message(&mut out, &msg(r#""line""#, None, None), true).unwrap();
        write_message(&mut out, &raw_msg(r#"{"a": 1}"#), true).unwrap();
        assert_eq!(out, b"\x00\x01\x02\xff\nline\n{\"a\": 1}\n");
    }

    #[test]
    fn units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(human_retention(0), "forever");
        assert_eq!(human_retention(604_800_000), "7d");
        assert_eq!(human_retention(43_200_000), "12h");
        assert_eq!(human_ms(30_000), "30s");
        assert_eq!(utc_secs(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_secs(1_767_225_600), "2026-01-01T00:00:00Z");
        assert_eq!(utc_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(hex(&[0, 0xab]), "00ab");
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(["NAME", "N"]);
        t.row(["orders".to_string(), "3".to_string()]);
        t.row(["a".to_string(), "108".to_string()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NAME    N\norders  3\na       108\n"
        );
    }
}
