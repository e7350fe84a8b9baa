//! The sparse offset index of one segment (`<base>.index`), little-endian.
//!
//! ```text
//! header, 56 bytes:
//!  0  4  magic "NRDX"
//!  4  1  version (1)
//!  5  1  flags: bit 0 = sealed (the header describes the complete segment)
//!  6  2  reserved
//!  8  8  base offset of the segment
//! 16  8  end offset: next offset after the last committed record of the segment
//! 24  8  data size: committed bytes of the segment file
//! 32  8  first record timestamp (ms, 0 = none)
//! 40  8  max record timestamp (ms, 0 = none)
//! 48  4  CRC32C of bytes [0, 48)
//! 52  4  reserved
//! entries, 12 bytes each, strictly increasing in both fields:
//!  0  4  relative offset (frame base offset - segment base offset)
//!  4  4  byte position of that frame in the segment file
//!  8  4  CRC32C of the 8 bytes above, seeded with the segment base offset
//! ```
//!
//! The position 0 / relative offset 0 entry is implicit. The index is only an accelerator:
//! it is written lazily (no fsync) for the active segment (header rewritten at each commit,
//! entries appended) and fully (with fsync) when a segment is sealed. Anything missing or
//! failing its checks is rebuilt from the log.

pub const INDEX_MAGIC: [u8; 4] = *b"NRDX";
pub const INDEX_VERSION: u8 = 1;
pub const INDEX_HEADER_LEN: usize = 56;
pub const INDEX_ENTRY_LEN: usize = 12;
const FLAG_SEALED: u8 = 1;

/// One sparse index entry: the frame starting at `pos` has base offset `segment base + rel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub rel: u32,
    pub pos: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexHeader {
    pub sealed: bool,
    pub base_offset: u64,
    pub end_offset: u64,
    pub data_size: u64,
    pub first_ts: u64,
    pub max_ts: u64,
}

pub fn encode_header(h: &IndexHeader) -> [u8; INDEX_HEADER_LEN] {
    let mut b = [0u8; INDEX_HEADER_LEN];
    b[0..4].copy_from_slice(&INDEX_MAGIC);
    b[4] = INDEX_VERSION;
    b[5] = if h.sealed { FLAG_SEALED } else { 0 };
    b[8..16].copy_from_slice(&h.base_offset.to_le_bytes());
    b[16..24].copy_from_slice(&h.end_offset.to_le_bytes());
    b[24..32].copy_from_slice(&h.data_size.to_le_bytes());
    b[32..40].copy_from_slice(&h.first_ts.to_le_bytes());
    b[40..48].copy_from_slice(&h.max_ts.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..48]);
    b[48..52].copy_from_slice(&crc.to_le_bytes());
    b
}

fn entry_crc(base_offset: u64, e8: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&base_offset.to_le_bytes()), e8)
}

pub fn encode_entries(base_offset: u64, entries: &[IndexEntry], out: &mut Vec<u8>) {
    for e in entries {
        let mut b = [0u8; 8];
        b[0..4].copy_from_slice(&e.rel.to_le_bytes());
        b[4..8].copy_from_slice(&e.pos.to_le_bytes());
        out.extend_from_slice(&b);
        out.extend_from_slice(&entry_crc(base_offset, &b).to_le_bytes());
    }
}

/// A whole index file image.
pub fn encode_file(h: &IndexHeader, entries: &[IndexEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(INDEX_HEADER_LEN + entries.len() * INDEX_ENTRY_LEN);
    out.extend_from_slice(&encode_header(h));
    encode_entries(h.base_offset, entries, &mut out);
    out
}

/// The result of parsing an index file.
#[derive(Debug)]
pub struct ParsedIndex {
    pub header: IndexHeader,
    /// The longest valid prefix of entries.
    pub entries: Vec<IndexEntry>,
    /// True when every byte after the header parsed as a valid entry.
    pub clean: bool,
}

/// Parses an index file of the segment `base_offset`. Errors when the header is unusable;
/// bad entries only end the valid prefix (`clean = false`).
pub fn parse_file(b: &[u8], base_offset: u64) -> Result<ParsedIndex, String> {
    if b.len() < INDEX_HEADER_LEN {
        return Err("index shorter than its header".into());
    }
    if b[0..4] != INDEX_MAGIC {
        return Err("bad index magic".into());
    }
    if b[4] != INDEX_VERSION {
        return Err(format!("unknown index version {}", b[4]));
    }
    let crc = u32::from_le_bytes(b[48..52].try_into().unwrap());
    if crc != crc32c::crc32c(&b[0..48]) {
        return Err("index header CRC mismatch".into());
    }
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let header = IndexHeader {
        sealed: b[5] & FLAG_SEALED != 0,
        base_offset: u64_at(8),
        end_offset: u64_at(16),
        data_size: u64_at(24),
        first_ts: u64_at(32),
        max_ts: u64_at(40),
    };
    if header.base_offset != base_offset {
        return Err(format!(
            "index is for base offset {}, not {base_offset}",
            header.base_offset
        ));
    }
    if header.end_offset < base_offset {
        return Err("index end offset below its base".into());
    }
    let body = &b[INDEX_HEADER_LEN..];
    let mut entries: Vec<IndexEntry> = Vec::with_capacity(body.len() / INDEX_ENTRY_LEN);
    #[allow(clippy::manual_is_multiple_of)] // rust-version 1.85
    let mut clean = body.len() % INDEX_ENTRY_LEN == 0;
    for chunk in body.chunks_exact(INDEX_ENTRY_LEN) {
        let e = IndexEntry {
            rel: u32::from_le_bytes(chunk[0..4].try_into().unwrap()),
            pos: u32::from_le_bytes(chunk[4..8].try_into().unwrap()),
        };
        let crc = u32::from_le_bytes(chunk[8..12].try_into().unwrap());
        let monotonic = match entries.last() {
            Some(p) => e.rel > p.rel && e.pos > p.pos,
            None => e.rel > 0 && e.pos > 0,
        };
        if crc != entry_crc(base_offset, &chunk[0..8]) || !monotonic {
            clean = false;
            break;
        }
        entries.push(e);
    }
    Ok(ParsedIndex {
        header,
        entries,
        clean,
    })
}

/// Position and base offset of the frame to start scanning from to find `offset`
/// (the last entry at or below it; the segment start if none).
pub fn lookup(entries: &[IndexEntry], base_offset: u64, offset: u64) -> (u64, u64) {
    let i = entries.partition_point(|e| base_offset + e.rel as u64 <= offset);
    if i == 0 {
        (0, base_offset)
    } else {
        let e = entries[i - 1];
        (e.pos as u64, base_offset + e.rel as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let h = IndexHeader {
            sealed: true,
            base_offset: 100,
            end_offset: 200,
            data_size: 9000,
            first_ts: 1,
            max_ts: 2,
        };
        let entries = vec![
            IndexEntry { rel: 10, pos: 4100 },
            IndexEntry { rel: 50, pos: 8200 },
        ];
        let img = encode_file(&h, &entries);
        let p = parse_file(&img, 100).unwrap();
        assert_eq!(p.header, h);
        assert_eq!(p.entries, entries);
        assert!(p.clean);
        assert!(parse_file(&img, 101).is_err());
        // a torn trailing entry keeps the valid prefix
        let p = parse_file(&img[..img.len() - 3], 100).unwrap();
        assert_eq!(p.entries.len(), 1);
        assert!(!p.clean);
        // a flipped entry byte ends the prefix
        let mut bad = img.clone();
        bad[INDEX_HEADER_LEN + INDEX_ENTRY_LEN + 2] ^= 1;
        let p = parse_file(&bad, 100).unwrap();
        assert_eq!(p.entries.len(), 1);
        assert!(!p.clean);
        // a flipped header byte is fatal
        let mut bad = img.clone();
        bad[20] ^= 1;
        assert!(parse_file(&bad, 100).is_err());
        assert!(parse_file(&[0u8; 100], 100).is_err());
    }

    #[test]
    fn lookup_picks_last_entry_at_or_below() {
        let e = vec![
            IndexEntry { rel: 10, pos: 100 },
            IndexEntry { rel: 20, pos: 200 },
        ];
        assert_eq!(lookup(&e, 1000, 1000), (0, 1000));
        assert_eq!(lookup(&e, 1000, 1009), (0, 1000));
        assert_eq!(lookup(&e, 1000, 1010), (100, 1010));
        assert_eq!(lookup(&e, 1000, 1019), (100, 1010));
        assert_eq!(lookup(&e, 1000, 5000), (200, 1020));
        assert_eq!(lookup(&[], 7, 9), (0, 7));
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::{btree_set, vec};
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = IndexHeader> {
        (
            any::<bool>(),
            0..=u64::MAX - u32::MAX as u64,
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(|(sealed, base_offset, len, data_size, first_ts, max_ts)| {
                IndexHeader {
                    sealed,
                    base_offset,
                    end_offset: base_offset + len as u64,
                    data_size,
                    first_ts,
                    max_ts,
                }
            })
    }

    /// Strictly increasing entries in both fields, none at 0 (the implicit one).
    fn entries() -> impl Strategy<Value = Vec<IndexEntry>> {
        (
            btree_set(1..=u32::MAX, 0..24),
            btree_set(1..=u32::MAX, 0..24),
        )
            .prop_map(|(r, p)| {
                r.into_iter()
                    .zip(p)
                    .map(|(rel, pos)| IndexEntry { rel, pos })
                    .collect()
            })
    }

    fn check_parsed(p: &ParsedIndex, len: usize) {
        let body = len - INDEX_HEADER_LEN;
        assert!(p.entries.len() <= body / INDEX_ENTRY_LEN);
        assert!(p.entries.capacity() <= body / INDEX_ENTRY_LEN);
        assert!(p.header.end_offset >= p.header.base_offset);
        for w in p.entries.windows(2) {
            assert!(w[0].rel < w[1].rel && w[0].pos < w[1].pos);
        }
        if let Some(e) = p.entries.first() {
            assert!(e.rel > 0 && e.pos > 0);
        }
        if p.clean {
            assert_eq!(p.entries.len() * INDEX_ENTRY_LEN, body);
        }
    }

    proptest! {
        #[test]
        fn prop_index_roundtrip(h in header(), e in entries()) {
            let img = encode_file(&h, &e);
            let p = parse_file(&img, h.base_offset).unwrap();
            prop_assert_eq!(p.header, h);
            prop_assert_eq!(&p.entries, &e);
            prop_assert!(p.clean);
            if h.base_offset > 0 {
                prop_assert!(parse_file(&img, h.base_offset - 1).is_err());
            }
        }

        #[test]
        fn prop_index_torn_tail_keeps_the_valid_prefix(
            h in header(),
            e in entries(),
            cut in any::<prop::sample::Index>(),
        ) {
            let img = encode_file(&h, &e);
            let cut = cut.index(img.len() + 1);
            match parse_file(&img[..cut], h.base_offset) {
                Ok(p) => {
                    prop_assert!(cut >= INDEX_HEADER_LEN);
                    let whole = (cut - INDEX_HEADER_LEN) / INDEX_ENTRY_LEN;
                    prop_assert_eq!(&p.entries[..], &e[..whole]);
                    prop_assert_eq!(p.clean, (cut - INDEX_HEADER_LEN).is_multiple_of(INDEX_ENTRY_LEN));
                }
                Err(_) => prop_assert!(cut < INDEX_HEADER_LEN),
            }
        }

        #[test]
        fn prop_index_arbitrary_bytes_never_panic(
            b in vec(any::<u8>(), 0..200),
            base in any::<u64>(),
        ) {
            if let Ok(p) = parse_file(&b, base) {
                check_parsed(&p, b.len());
            }
        }

        /// A valid header followed by arbitrary entry bytes (past the header CRC).
        #[test]
        fn prop_index_arbitrary_entries_never_panic(
            h in header(),
            body in vec(any::<u8>(), 0..200),
            flip in proptest::option::of((any::<prop::sample::Index>(), 0..8u8)),
        ) {
            let mut img = encode_header(&h).to_vec();
            img.extend_from_slice(&body);
            if let Some((at, bit)) = flip {
                let at = at.index(img.len());
                img[at] ^= 1 << bit;
            }
            if let Ok(p) = parse_file(&img, h.base_offset) {
                check_parsed(&p, img.len());
            }
        }

        #[test]
        fn prop_index_lookup_matches_a_linear_scan(
            e in entries(),
            base in 0..=u64::MAX / 2,
            delta in prop_oneof![0..64u64, any::<u32>().prop_map(u64::from)],
        ) {
            let offset = base + delta;
            let want = e
                .iter()
                .rev()
                .find(|x| base + x.rel as u64 <= offset)
                .map_or((0, base), |x| (x.pos as u64, base + x.rel as u64));
            prop_assert_eq!(lookup(&e, base, offset), want);
        }
    }
}
