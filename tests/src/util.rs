//! Small pure helpers: partition hashing (SPEC §2.3), percent-encoding, clocks, RNGs.

use std::time::{SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::SeedableRng;

/// FNV-1a-32 as SPEC §2.3 defines it (offset basis 2166136261, prime 16777619).
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 2_166_136_261;
    for &b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(16_777_619);
    }
    h
}

/// The partition a keyed, unpinned produce must land on (single node, all owners alive).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    fnv1a32(key) % partitions
}

/// Percent-encodes every byte outside RFC 3986's unreserved set, for query values.
pub fn pct(bytes: impl AsRef<[u8]>) -> String {
    let mut out = String::new();
    for &b in bytes.as_ref() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

pub fn now_s() -> u64 {
    now_ms() / 1000
}

/// A seeded RNG for a randomized test. The seed comes from `NARAD_TESTS_SEED` when set,
/// else from the clock, and is printed so a failing run can be replayed. (The harness's own
/// variables are `NARAD_TESTS_*`: `NARAD_TEST_*` is the server's knob section, where a
/// name it does not know stops it.)
pub fn test_rng(test: &str) -> StdRng {
    let seed = std::env::var("NARAD_TESTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ms() ^ u64::from(std::process::id()) << 32);
    eprintln!("[{test}] NARAD_TESTS_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// Resident memory of process `pid` in bytes (`VmRSS`).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_vectors_from_spec() {
        assert_eq!(fnv1a32(b"a"), 0xe40c292c);
        assert_eq!(fnv1a32(b"customer-42"), 0xfe68adbe);
        assert_eq!(partition_for_key(b"customer-42", 3), 1);
    }

    #[test]
    fn pct_encodes_reserved_and_non_ascii() {
        assert_eq!(pct("a b/c"), "a%20b%2Fc");
        assert_eq!(pct([0xff, b'x']), "%FFx");
    }
}
