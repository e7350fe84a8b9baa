//! Unique self-checking payloads for durability runs.
//!
//! A payload is the JSON object `{"id":"p<producer>-<seq>","crc":<u32>,"filler":"<text>"}`,
//! with the filler (length and content) derived deterministically from the id and
//! `crc = CRC32C(id ++ filler)`. [`verify`] re-derives the exact bytes from the id and
//! compares byte for byte, so any corruption, truncation, re-encoding or foreign record is
//! caught, and also checks the CRC on its own (catching an id that mutated into another).
//!
//! Because the payload is valid JSON, the broker renders it verbatim on consume (SPEC §2.9):
//! the raw `payload` of the consume response must equal these bytes.

use serde::Deserialize;

/// Filler length range (bytes).
const FILLER_MIN: usize = 16;
const FILLER_SPAN: u64 = 600;

pub fn id(producer: u32, seq: u64) -> String {
    format!("p{producer}-{seq}")
}

/// The exact bytes for `(producer, seq)`.
pub fn make(producer: u32, seq: u64) -> Vec<u8> {
    let id = id(producer, seq);
    let filler = filler(producer, seq);
    let mut crc_input = id.clone().into_bytes();
    crc_input.extend_from_slice(filler.as_bytes());
    let crc = crc32c::crc32c(&crc_input);
    format!(r#"{{"id":"{id}","crc":{crc},"filler":"{filler}"}}"#).into_bytes()
}

fn filler(producer: u32, seq: u64) -> String {
    const ALPHABET: &[u8] =
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;-_";
    let mut state = (u64::from(producer) << 40) ^ seq ^ 0x9e37_79b9_7f4a_7c15;
    let len = FILLER_MIN + (splitmix(&mut state) % FILLER_SPAN) as usize;
    (0..len)
        .map(|_| ALPHABET[(splitmix(&mut state) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Parsed {
    id: String,
    crc: u32,
    filler: String,
}

/// Verifies a payload; returns its id, or why it is corrupt.
pub fn verify(raw: &[u8]) -> Result<String, String> {
    let show = || String::from_utf8_lossy(&raw[..raw.len().min(120)]).into_owned();
    let p: Parsed = serde_json::from_slice(raw)
        .map_err(|e| format!("not a tagged payload ({e}): {:?}", show()))?;
    let mut crc_input = p.id.clone().into_bytes();
    crc_input.extend_from_slice(p.filler.as_bytes());
    if crc32c::crc32c(&crc_input) != p.crc {
        return Err(format!("CRC mismatch for id {:?}", p.id));
    }
    let (producer, seq) = parse_id(&p.id).ok_or_else(|| format!("malformed id {:?}", p.id))?;
    if make(producer, seq) != raw {
        return Err(format!(
            "bytes differ from what was produced for id {:?}: {:?}",
            p.id,
            show()
        ));
    }
    Ok(p.id)
}

fn parse_id(id: &str) -> Option<(u32, u64)> {
    let (p, s) = id.strip_prefix('p')?.split_once('-')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// `len` bytes that are not UTF-8 text (rendered as base64 on consume, SPEC §2.9), different
/// for each `seed`: payloads whose consume answer is a third larger than the message.
pub fn binary(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    out.push(0xFF); // never valid UTF-8
    while out.len() < len {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_detection() {
        let b = make(7, 42);
        assert_eq!(verify(&b).unwrap(), "p7-42");
        let mut flipped = b.clone();
        let i = flipped.len() - 5;
        flipped[i] ^= 0x01;
        assert!(verify(&flipped).is_err());
        assert!(verify(&b[..b.len() - 1]).is_err());
        assert_ne!(make(7, 42), make(7, 43));
    }
}
