//! Duration strings.
//!
//! - Go's `time.ParseDuration` syntax, used by query parameters such as `wait=1m30s` (SPEC §3.1),
//!   and Go's `Duration.String()` formatting (what the Go SDK sends: `10s`, `1m0s`, `1.5s`).
//! - The CLI's and the operator's human durations, which add `d` (days): `7d`, `12h`, `1d12h`
//!   (SPEC §7.2, §10.3), and a compact human formatter (`604800000` ms → `7d`).

use std::fmt;
use std::time::Duration;

/// Why a duration string was refused. The `Display` texts follow Go's
/// (`time: invalid duration "x"`), so they can be used as-is in a `400` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// Empty, garbage, a number without digits, …
    Invalid(String),
    /// A number not followed by a unit (other than a bare `0`).
    MissingUnit(String),
    /// A unit that is not one of the accepted ones.
    UnknownUnit { unit: String, input: String },
    /// Out of the range of a signed 64-bit count of nanoseconds.
    Overflow(String),
    /// Syntactically fine but negative, where only non-negative durations make sense.
    Negative(String),
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Invalid(s) => write!(f, "time: invalid duration {}", go_quote(s)),
            DurationError::MissingUnit(s) => {
                write!(f, "time: missing unit in duration {}", go_quote(s))
            }
            DurationError::UnknownUnit { unit, input } => write!(
                f,
                "time: unknown unit {} in duration {}",
                go_quote(unit),
                go_quote(input)
            ),
            DurationError::Overflow(s) => write!(f, "time: invalid duration {}", go_quote(s)),
            DurationError::Negative(s) => write!(f, "negative duration {}", go_quote(s)),
        }
    }
}

impl std::error::Error for DurationError {}

fn go_quote(s: &str) -> String {
    // Good enough for error texts: JSON string quoting is close to Go's %q.
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

const NS: u64 = 1;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;
const DAY: u64 = 24 * HOUR;

fn go_unit(u: &str) -> Option<u64> {
    Some(match u {
        "ns" => NS,
        "us" | "µs" | "μs" => US,
        "ms" => MS,
        "s" => SEC,
        "m" => MIN,
        "h" => HOUR,
        _ => return None,
    })
}

fn human_unit(u: &str) -> Option<u64> {
    match u {
        "d" => Some(DAY),
        _ => go_unit(u),
    }
}

/// Parses a Go duration (`time.ParseDuration`) into signed nanoseconds, exactly like Go:
/// `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, units `ns us µs ms s m h`, decimal fractions, a bare
/// `0` (also `-0`, `+0`), range of an `i64`.
pub fn parse_go_duration_signed(s: &str) -> Result<i64, DurationError> {
    parse_with_units(s, go_unit)
}

/// Parses a Go duration that must not be negative.
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let n = parse_go_duration_signed(s)?;
    if n < 0 {
        return Err(DurationError::Negative(s.to_string()));
    }
    Ok(Duration::from_nanos(n as u64))
}

/// Parses a Go duration, mapping a negative one to zero (what `consume?wait=` does).
pub fn parse_go_duration_nonnegative(s: &str) -> Result<Duration, DurationError> {
    let n = parse_go_duration_signed(s)?;
    Ok(Duration::from_nanos(n.max(0) as u64))
}

/// Parses a human duration: Go syntax plus `d` (24 h), e.g. `30s`, `12h`, `7d`, `1d12h`,
/// `1.5h`. Negative values are refused. `forever` is not handled here (callers map it).
pub fn parse_human_duration(s: &str) -> Result<Duration, DurationError> {
    let n = parse_with_units(s, human_unit)?;
    if n < 0 {
        return Err(DurationError::Negative(s.to_string()));
    }
    Ok(Duration::from_nanos(n as u64))
}

/// A port of Go's `time.ParseDuration`, with a pluggable unit table.
fn parse_with_units(orig: &str, unit_of: fn(&str) -> Option<u64>) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(orig.to_string());
    let mut s = orig.as_bytes();
    let mut d: u64 = 0;
    let mut neg = false;

    if let Some(&c) = s.first() {
        if c == b'-' || c == b'+' {
            neg = c == b'-';
            s = &s[1..];
        }
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    while !s.is_empty() {
        // The next character must be [0-9.].
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return Err(invalid());
        }
        // Integer part.
        let pl = s.len();
        let (mut v, rest) = leading_int(s).ok_or_else(|| DurationError::Overflow(orig.into()))?;
        s = rest;
        let pre = pl != s.len();

        // Fraction.
        let mut post = false;
        let mut f: u64 = 0;
        let mut scale: f64 = 1.0;
        if s.first() == Some(&b'.') {
            s = &s[1..];
            let pl = s.len();
            let (ff, sc, rest) = leading_fraction(s);
            f = ff;
            scale = sc;
            s = rest;
            post = pl != s.len();
        }
        if !pre && !post {
            // No digits (e.g. ".s" or "-.s").
            return Err(invalid());
        }

        // Unit: everything up to the next '.' or digit.
        let i = s
            .iter()
            .position(|&c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if i == 0 {
            return Err(DurationError::MissingUnit(orig.to_string()));
        }
        let u = &s[..i];
        s = &s[i..];
        // The input is a &str and '.'/digits are ASCII, so this split is on a char boundary.
        let u = std::str::from_utf8(u).map_err(|_| invalid())?;
        let unit = unit_of(u).ok_or_else(|| DurationError::UnknownUnit {
            unit: u.to_string(),
            input: orig.to_string(),
        })?;
        if v > (1u64 << 63) / unit {
            return Err(DurationError::Overflow(orig.to_string()));
        }
        v *= unit;
        if f > 0 {
            // float64 is needed to be nanosecond accurate for fractions of hours;
            // v >= 0 && (f*unit/scale) <= 3.6e+12 (ns/h, h is the largest unit).
            v = v.wrapping_add((f as f64 * (unit as f64 / scale)) as u64);
            if v > 1u64 << 63 {
                return Err(DurationError::Overflow(orig.to_string()));
            }
        }
        // Both are at most 2^63, so the sum can reach 2^64: checked, where Go's wraps (Go
        // reads "9223372036854775808ns9223372036854775808ns" as 0).
        d = match d.checked_add(v) {
            Some(d) if d <= 1u64 << 63 => d,
            _ => return Err(DurationError::Overflow(orig.to_string())),
        };
    }
    if neg {
        return Ok((d as i64).wrapping_neg());
    }
    if d > (1u64 << 63) - 1 {
        return Err(DurationError::Overflow(orig.to_string()));
    }
    Ok(d as i64)
}

/// Consumes leading decimal digits; `None` on overflow (Go: "bad [0-9]*").
fn leading_int(s: &[u8]) -> Option<(u64, &[u8])> {
    let mut x: u64 = 0;
    let mut i = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        if x > (1u64 << 63) / 10 {
            return None;
        }
        x = x * 10 + (s[i] - b'0') as u64;
        if x > 1u64 << 63 {
            return None;
        }
        i += 1;
    }
    Some((x, &s[i..]))
}

/// Consumes leading fraction digits: (value, scale, rest); digits past what fits are ignored.
fn leading_fraction(s: &[u8]) -> (u64, f64, &[u8]) {
    let mut i = 0;
    let mut x: u64 = 0;
    let mut scale: f64 = 1.0;
    let mut overflow = false;
    while i < s.len() && s[i].is_ascii_digit() {
        if !overflow {
            if x > ((1u64 << 63) - 1) / 10 {
                overflow = true;
            } else {
                let y = x * 10 + (s[i] - b'0') as u64;
                if y > 1u64 << 63 {
                    overflow = true;
                } else {
                    x = y;
                    scale *= 10.0;
                }
            }
        }
        i += 1;
    }
    (x, scale, &s[i..])
}

/// Formats like Go's `Duration.String()`: `0s`, `1.5µs`, `500ms`, `10s`, `1m0s`, `1h30m0s`.
pub fn format_go_duration(d: Duration) -> String {
    format_nanos(false, d.as_nanos())
}

/// Formats signed nanoseconds like Go's `Duration.String()` (`-1.5s`).
pub fn format_go_duration_signed(nanos: i64) -> String {
    format_nanos(nanos < 0, nanos.unsigned_abs() as u128)
}

fn format_nanos(neg: bool, u: u128) -> String {
    // Built right to left, as Go does.
    let mut buf: Vec<u8> = Vec::with_capacity(32);
    let push_rev = |buf: &mut Vec<u8>, s: &[u8]| {
        for &b in s.iter().rev() {
            buf.push(b);
        }
    };
    let mut u = u;
    if u < SEC as u128 {
        buf.push(b's');
        let prec;
        if u == 0 {
            return "0s".to_string();
        } else if u < US as u128 {
            prec = 0;
            buf.push(b'n');
        } else if u < MS as u128 {
            prec = 3;
            push_rev(&mut buf, "µ".as_bytes());
        } else {
            prec = 6;
            buf.push(b'm');
        }
        u = fmt_frac(&mut buf, u, prec);
        fmt_int(&mut buf, u);
    } else {
        buf.push(b's');
        u = fmt_frac(&mut buf, u, 9);
        fmt_int(&mut buf, u % 60);
        u /= 60;
        if u > 0 {
            buf.push(b'm');
            fmt_int(&mut buf, u % 60);
            u /= 60;
            if u > 0 {
                buf.push(b'h');
                fmt_int(&mut buf, u);
            }
        }
    }
    if neg {
        buf.push(b'-');
    }
    buf.reverse();
    String::from_utf8(buf).expect("ascii and µ only")
}

/// Pushes (reversed) the fraction of v/10^prec without trailing zeros; returns the integer part.
fn fmt_frac(buf: &mut Vec<u8>, mut v: u128, prec: u32) -> u128 {
    let mut print = false;
    for _ in 0..prec {
        let digit = (v % 10) as u8;
        print = print || digit != 0;
        if print {
            buf.push(b'0' + digit);
        }
        v /= 10;
    }
    if print {
        buf.push(b'.');
    }
    v
}

/// Pushes (reversed) the decimal digits of v.
fn fmt_int(buf: &mut Vec<u8>, mut v: u128) {
    if v == 0 {
        buf.push(b'0');
        return;
    }
    while v > 0 {
        buf.push(b'0' + (v % 10) as u8);
        v /= 10;
    }
}

/// Formats milliseconds compactly with the human units `d h m s ms`, omitting zero parts:
/// `604800000` → `7d`, `43200000` → `12h`, `90000` → `1m30s`, `1500` → `1s500ms`, `0` → `0s`.
pub fn format_human_ms(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut rest = ms;
    for (unit, name) in [
        (86_400_000u64, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ] {
        let n = rest / unit;
        if n > 0 {
            out.push_str(&n.to_string());
            out.push_str(name);
            rest -= n * unit;
        }
    }
    out
}

/// [`format_human_ms`] for a [`Duration`] (sub-millisecond parts are dropped, except that a
/// non-zero duration below 1 ms is shown in Go format, e.g. `500µs`).
pub fn format_human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return format_go_duration(d);
    }
    format_human_ms(ms.min(u64::MAX as u128) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> i64 {
        parse_go_duration_signed(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn go_parse_examples() {
        // From Go's time_test.go parseDurationTests.
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("5s", 5 * SEC as i64),
            ("30s", 30 * SEC as i64),
            ("1478s", 1478 * SEC as i64),
            ("-5s", -5 * SEC as i64),
            ("+5s", 5 * SEC as i64),
            ("-0", 0),
            ("+0", 0),
            ("5.0s", 5 * SEC as i64),
            ("5.6s", 5 * SEC as i64 + 600 * MS as i64),
            ("5.s", 5 * SEC as i64),
            (".5s", 500 * MS as i64),
            ("1.0s", SEC as i64),
            ("1.00s", SEC as i64),
            ("1.004s", SEC as i64 + 4 * MS as i64),
            ("1.0040s", SEC as i64 + 4 * MS as i64),
            ("100.00100s", 100 * SEC as i64 + MS as i64),
            ("10ns", 10),
            ("11us", 11 * US as i64),
            ("12µs", 12 * US as i64),
            ("12μs", 12 * US as i64),
            ("13ms", 13 * MS as i64),
            ("14s", 14 * SEC as i64),
            ("15m", 15 * MIN as i64),
            ("16h", 16 * HOUR as i64),
            ("3h30m", 3 * HOUR as i64 + 30 * MIN as i64),
            (
                "10.5s4m",
                4 * MIN as i64 + 10 * SEC as i64 + 500 * MS as i64,
            ),
            (
                "-2m3.4s",
                -(2 * MIN as i64 + 3 * SEC as i64 + 400 * MS as i64),
            ),
            (
                "1h2m3s4ms5us6ns",
                (HOUR + 2 * MIN + 3 * SEC + 4 * MS + 5 * US + 6) as i64,
            ),
            (
                "39h9m14.425s",
                (39 * HOUR + 9 * MIN + 14 * SEC + 425 * MS) as i64,
            ),
            ("52763797000ns", 52763797000),
            ("0.3333333333333333333h", 20 * MIN as i64),
            ("9007199254740993ns", (1i64 << 53) + 1),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036854775.807us", i64::MAX),
            ("9223372036s854ms775us807ns", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("-9223372036854775.808us", i64::MIN),
            ("-9223372036s854ms775us808ns", i64::MIN),
            ("-9223372036854775808ns", i64::MIN),
            ("-2562047h47m16.854775808s", i64::MIN),
            ("0.100000000000000000000h", 6 * MIN as i64),
            (
                "0.830103483285477580700h",
                49 * MIN as i64 + 48 * SEC as i64 + 372539827,
            ),
            ("1m30s", 90 * SEC as i64),
            ("1h0m0s", HOUR as i64),
            ("1.5s", 1500 * MS as i64),
        ];
        for &(s, want) in cases {
            assert_eq!(ok(s), want, "{s}");
        }
    }

    #[test]
    fn go_parse_errors() {
        for s in [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "\u{85}\u{85}",
            "\u{FFFD}",
            "9223372036854775808ns",
            "9223372036854775.808us",
            "-9223372036854775809ns",
            "3000000h",
            "9223372036854775808s",
            "1s 2s",
            " 1s",
            "1s ",
            "1.2.3s",
            "abc",
            "10x",
            "1e3s",
            "1m-30s",
        ] {
            assert!(parse_go_duration_signed(s).is_err(), "{s:?} should fail");
        }
        assert!(matches!(
            parse_go_duration_signed("3"),
            Err(DurationError::MissingUnit(_))
        ));
        assert!(matches!(
            parse_go_duration_signed("1d"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert_eq!(
            parse_go_duration_signed("x").unwrap_err().to_string(),
            "time: invalid duration \"x\""
        );
    }

    #[test]
    fn unsigned_forms() {
        assert_eq!(parse_go_duration("10s").unwrap(), Duration::from_secs(10));
        assert!(matches!(
            parse_go_duration("-1s"),
            Err(DurationError::Negative(_))
        ));
        assert_eq!(parse_go_duration("-0").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_go_duration_nonnegative("-5s").unwrap(),
            Duration::ZERO
        );
        assert_eq!(
            parse_go_duration_nonnegative("2ms").unwrap(),
            Duration::from_millis(2)
        );
        assert!(parse_go_duration_nonnegative("bad").is_err());
    }

    #[test]
    fn go_format_examples() {
        // From Go's durationTests.
        let cases: &[(i64, &str)] = &[
            (0, "0s"),
            (1, "1ns"),
            (1100, "1.1µs"),
            (2200 * US as i64, "2.2ms"),
            (3300 * MS as i64, "3.3s"),
            ((4 * MIN + 5 * SEC) as i64, "4m5s"),
            ((4 * MIN + 5001 * MS) as i64, "4m5.001s"),
            ((5 * HOUR + 6 * MIN + 7001 * MS) as i64, "5h6m7.001s"),
            ((8 * MIN + 1) as i64, "8m0.000000001s"),
            (i64::MAX, "2562047h47m16.854775807s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
            (-1, "-1ns"),
            (10 * SEC as i64, "10s"),
            (500 * MS as i64, "500ms"),
            (MIN as i64, "1m0s"),
            (90 * SEC as i64, "1m30s"),
            (1500 * MS as i64, "1.5s"),
            (HOUR as i64, "1h0m0s"),
        ];
        for &(n, want) in cases {
            assert_eq!(format_go_duration_signed(n), want, "{n}");
            if n >= 0 {
                assert_eq!(format_go_duration(Duration::from_nanos(n as u64)), want);
            }
        }
    }

    #[test]
    fn format_parse_round_trip() {
        for n in [
            0i64,
            1,
            999,
            1_000,
            1_500_000,
            10_000_000_000,
            3_723_000_000_001,
            i64::MAX,
            i64::MIN,
        ] {
            assert_eq!(ok(&format_go_duration_signed(n)), n);
        }
    }

    #[test]
    fn human() {
        assert_eq!(
            parse_human_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(
            parse_human_duration("12h").unwrap(),
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(
            parse_human_duration("30s").unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            parse_human_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_human_duration("1d12h").unwrap(),
            Duration::from_secs(36 * 3600)
        );
        assert_eq!(
            parse_human_duration("1.5d").unwrap(),
            Duration::from_secs(36 * 3600)
        );
        assert_eq!(parse_human_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "7", "7x", "-1d", "forever", "d"] {
            assert!(parse_human_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_human_ms(604_800_000), "7d");
        assert_eq!(format_human_ms(43_200_000), "12h");
        assert_eq!(format_human_ms(30_000), "30s");
        assert_eq!(format_human_ms(90_000), "1m30s");
        assert_eq!(format_human_ms(1_500), "1s500ms");
        assert_eq!(format_human_ms(0), "0s");
        assert_eq!(format_human_ms(90_000_000), "1d1h");
        assert_eq!(format_human_duration(Duration::from_micros(500)), "500µs");
        assert_eq!(format_human_duration(Duration::from_secs(3600)), "1h");
        // Every human format parses back to itself.
        for ms in [
            1u64,
            999,
            1_000,
            61_001,
            3_600_000,
            604_800_000,
            31_536_000_000,
        ] {
            let s = format_human_ms(ms);
            assert_eq!(
                parse_human_duration(&s).unwrap(),
                Duration::from_millis(ms),
                "{s}"
            );
        }
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    const GO_UNITS: [(&str, u64); 8] = [
        ("ns", NS),
        ("us", US),
        ("µs", US),
        ("μs", US),
        ("ms", MS),
        ("s", SEC),
        ("m", MIN),
        ("h", HOUR),
    ];

    /// Strings shaped like durations (digits, dots, signs, unit letters), and anything.
    fn duration_like() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[-+]?([0-9]{0,21}\\.?[0-9]{0,21}(ns|us|µs|ms|s|m|h|d|x|)){1,4}",
            "[-+.0-9a-zµμ]{0,12}",
        ]
    }

    /// An integer count for `unit`, biased to the edges of the `i64` nanosecond range.
    fn count_for(unit: u64) -> impl Strategy<Value = u64> {
        let edge = (1u64 << 63) / unit;
        prop_oneof![
            4 => 0..1_000u64,
            2 => any::<u64>(),
            1 => Just(edge),
            1 => Just(edge.saturating_sub(1)),
            1 => Just(edge + 1),
            1 => Just(u64::MAX),
        ]
    }

    fn components() -> impl Strategy<Value = Vec<(u64, usize)>> {
        vec(
            (0..GO_UNITS.len()).prop_flat_map(|u| (count_for(GO_UNITS[u].1), Just(u))),
            1..4,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn prop_duration_parsers_never_panic(s in duration_like()) {
            let signed = parse_go_duration_signed(&s);
            let human = parse_human_duration(&s);
            match &signed {
                Ok(n) => {
                    prop_assert_eq!(parse_go_duration(&s).ok(), (*n >= 0).then(|| Duration::from_nanos(*n as u64)));
                    prop_assert_eq!(parse_go_duration_nonnegative(&s).unwrap(), Duration::from_nanos((*n).max(0) as u64));
                    // Go's units are human units too.
                    prop_assert_eq!(human.clone().ok(), parse_go_duration(&s).ok());
                    // Normalising through the formatter keeps the value.
                    prop_assert_eq!(parse_go_duration_signed(&format_go_duration_signed(*n)).unwrap(), *n);
                }
                Err(e) => {
                    prop_assert!(parse_go_duration(&s).is_err());
                    prop_assert!(parse_go_duration_nonnegative(&s).is_err());
                    let _ = e.to_string();
                }
            }
            if let Ok(d) = human {
                prop_assert!(d.as_nanos() <= i64::MAX as u128);
            }
        }

        /// Integer components against exact arithmetic: the sum, or an overflow error when
        /// it leaves the `i64` nanosecond range.
        #[test]
        fn prop_go_duration_integer_components_match_exact_sum(
            sign in prop_oneof![Just(""), Just("+"), Just("-")],
            parts in components(),
        ) {
            let mut s = sign.to_string();
            let mut total: u128 = 0;
            for &(v, u) in &parts {
                s.push_str(&format!("{v}{}", GO_UNITS[u].0));
                total += v as u128 * GO_UNITS[u].1 as u128;
            }
            let limit = if sign == "-" { 1u128 << 63 } else { (1u128 << 63) - 1 };
            let got = parse_go_duration_signed(&s);
            if total > limit {
                prop_assert!(matches!(got, Err(DurationError::Overflow(_))), "{}: {:?}", s, got);
            } else {
                let want = if sign == "-" { (total as i128).wrapping_neg() as i64 } else { total as i64 };
                prop_assert_eq!(got, Ok(want), "{}", s);
            }
        }

        /// Fractions that are exact in the unit (milliseconds of a second, seconds of a
        /// minute in tenths) parse exactly.
        #[test]
        fn prop_go_duration_exact_fractions(secs in 0..9_000_000_000u64, ms in 0..1000u64, trailing in 0..4usize) {
            let s = format!("{secs}.{ms:03}{}s", "0".repeat(trailing));
            prop_assert_eq!(parse_go_duration_signed(&s), Ok((secs * SEC + ms * MS) as i64), "{}", s);
        }

        #[test]
        fn prop_go_format_parse_roundtrip(n in any::<i64>()) {
            let s = format_go_duration_signed(n);
            prop_assert_eq!(parse_go_duration_signed(&s), Ok(n), "{}", s);
            if n >= 0 {
                prop_assert_eq!(format_go_duration(Duration::from_nanos(n as u64)), s);
            }
        }

        #[test]
        fn prop_human_format_parse_roundtrip(ms in prop_oneof![0..100_000_000u64, 0..=i64::MAX as u64 / 1_000_000]) {
            let s = format_human_ms(ms);
            prop_assert_eq!(parse_human_duration(&s), Ok(Duration::from_millis(ms)), "{}", s);
            prop_assert_eq!(format_human_duration(Duration::from_millis(ms)), s);
        }

        #[test]
        fn prop_human_days(days in prop_oneof![0..100_000u64, any::<u64>()]) {
            let got = parse_human_duration(&format!("{days}d"));
            if days as u128 * DAY as u128 > i64::MAX as u128 {
                prop_assert!(matches!(got, Err(DurationError::Overflow(_))));
            } else {
                prop_assert_eq!(got, Ok(Duration::from_nanos(days * DAY)));
            }
        }
    }

    /// Found by the exact-sum property's reasoning: two components of exactly 2^63 ns each
    /// used to wrap the running total to 0 (Go's `time.ParseDuration` has the same wrap) and
    /// parse as `0s`.
    #[test]
    fn prop_regression_total_of_two_maximal_components_overflows() {
        for s in [
            "9223372036854775808ns9223372036854775808ns",
            "-9223372036854775808ns9223372036854775808ns",
            "-4611686018427387904ns4611686018427387904ns9223372036854775808ns",
        ] {
            assert!(
                matches!(parse_go_duration_signed(s), Err(DurationError::Overflow(_))),
                "{s}: {:?}",
                parse_go_duration_signed(s)
            );
            assert!(parse_human_duration(s).is_err());
        }
    }
}
