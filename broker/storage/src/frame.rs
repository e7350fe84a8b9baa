//! Frame encoding, decoding and CRC32C checking.
//!
//! A frame is a small batch of consecutive records written with one `write`. All integers are
//! little-endian.
//!
//! ```text
//! offset size field
//!  0     4    magic "NRDF"
//!  4     4    frame length (bytes, header included)
//!  8     4    CRC32C (Castagnoli) of bytes [12, frame length)
//! 12     1    version (1)
//! 13     1    flags: bits 0-2 codec (0 = none; anything else is unreadable for now), rest 0
//! 14     2    reserved (0)
//! 16     8    base offset (offset of the first record)
//! 24     4    record count (>= 1)
//! 28     8    timestamp, Unix ms (commit time of every record of the frame)
//! 36     8    high watermark of the log when the frame was written ("attested committed")
//! 44          records, `count` times:
//!               4  key length, 0xFFFF_FFFF = no key (distinct from an empty key)
//!               4  payload length
//!               .. key bytes, payload bytes
//! ```
//!
//! The frame length must match the records exactly. The "attested committed" field lets
//! recovery tell corruption of committed data (a later frame attests that the damaged
//! offsets had been fsynced and verified before it was written) from a torn unsynced write.

use bytes::Bytes;

use crate::{NewRecord, StoredRecord};

pub const FRAME_MAGIC: [u8; 4] = *b"NRDF";
pub const FRAME_VERSION: u8 = 1;
pub const FRAME_HEADER_LEN: usize = 44;
pub const RECORD_HEADER_LEN: usize = 8;
pub const NO_KEY: u32 = u32::MAX;
/// Largest key + payload of one record.
pub const MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;
/// Largest valid frame (a single maximal record).
pub const MAX_FRAME_LEN: usize = FRAME_HEADER_LEN + RECORD_HEADER_LEN + MAX_RECORD_BYTES;
/// A frame is closed before it would exceed this many bytes (unless it holds one record).
pub const FRAME_TARGET_BYTES: usize = 64 * 1024;
/// At most this many records per frame.
pub const FRAME_MAX_RECORDS: usize = 64;
const CODEC_MASK: u8 = 0x07;

/// The parsed fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub len: u32,
    pub crc: u32,
    pub flags: u8,
    pub base_offset: u64,
    pub count: u32,
    pub timestamp_ms: u64,
    pub attested_committed: u64,
}

impl FrameHeader {
    /// The offset after the last record of the frame.
    pub fn end_offset(&self) -> u64 {
        self.base_offset + self.count as u64
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Encoded size of one record.
pub fn record_size(r: &NewRecord) -> usize {
    RECORD_HEADER_LEN + r.key.as_ref().map_or(0, |k| k.len()) + r.payload.len()
}

/// Parses and sanity-checks the fixed header (`b` holds at least `FRAME_HEADER_LEN` bytes).
/// Does not check the CRC.
pub fn parse_header(b: &[u8]) -> Result<FrameHeader, String> {
    if b.len() < FRAME_HEADER_LEN {
        return Err("short header".into());
    }
    if b[0..4] != FRAME_MAGIC {
        return Err("bad magic".into());
    }
    let len = u32_at(b, 4);
    if b[12] != FRAME_VERSION {
        return Err(format!("unknown frame version {}", b[12]));
    }
    if (len as usize) < FRAME_HEADER_LEN + RECORD_HEADER_LEN || len as usize > MAX_FRAME_LEN {
        return Err(format!("implausible frame length {len}"));
    }
    let count = u32_at(b, 24);
    if count == 0 || count as usize > (len as usize - FRAME_HEADER_LEN) / RECORD_HEADER_LEN {
        return Err(format!("implausible record count {count}"));
    }
    let base_offset = u64_at(b, 16);
    if base_offset.checked_add(count as u64).is_none() {
        return Err("offset overflow".into());
    }
    Ok(FrameHeader {
        len,
        crc: u32_at(b, 8),
        flags: b[13],
        base_offset,
        count,
        timestamp_ms: u64_at(b, 28),
        attested_committed: u64_at(b, 36),
    })
}

/// Where one record's key and payload lie inside the frame buffer.
#[derive(Debug, Clone, Copy)]
struct RecLoc {
    key_start: u32,
    key_len: u32, // NO_KEY = absent
    payload_start: u32,
    payload_len: u32,
}

fn parse_records(frame: &[u8], count: u32, out: Option<&mut Vec<RecLoc>>) -> Result<(), String> {
    let mut out = out;
    let mut p = FRAME_HEADER_LEN;
    for i in 0..count {
        if p + RECORD_HEADER_LEN > frame.len() {
            return Err(format!("record {i} header past the frame end"));
        }
        let key_len = u32_at(frame, p);
        let payload_len = u32_at(frame, p + 4);
        p += RECORD_HEADER_LEN;
        let key_start = p;
        if key_len != NO_KEY {
            p = p
                .checked_add(key_len as usize)
                .ok_or("key length overflow")?;
        }
        let payload_start = p;
        p = p
            .checked_add(payload_len as usize)
            .ok_or("payload length overflow")?;
        if p > frame.len() {
            return Err(format!("record {i} past the frame end"));
        }
        if let Some(o) = out.as_deref_mut() {
            o.push(RecLoc {
                key_start: key_start as u32,
                key_len,
                payload_start: payload_start as u32,
                payload_len,
            });
        }
    }
    if p != frame.len() {
        return Err(format!("{} stray bytes after the records", frame.len() - p));
    }
    Ok(())
}

/// Fully checks a frame held in `frame` (exactly one frame): header, CRC, record layout, codec.
pub fn check_frame(frame: &[u8]) -> Result<FrameHeader, String> {
    let h = parse_header(frame)?;
    if frame.len() != h.len as usize {
        return Err("frame buffer length mismatch".into());
    }
    let crc = crc32c::crc32c(&frame[12..]);
    if crc != h.crc {
        return Err(format!(
            "CRC32C mismatch (stored {:08x}, computed {crc:08x})",
            h.crc
        ));
    }
    if h.flags & !CODEC_MASK != 0 || frame[14] != 0 || frame[15] != 0 {
        return Err(format!("unknown flags {:#04x}", h.flags));
    }
    if h.flags & CODEC_MASK != 0 {
        return Err(format!("unsupported codec {}", h.flags & CODEC_MASK));
    }
    parse_records(frame, h.count, None)?;
    Ok(h)
}

/// Appends one encoded frame holding `records` to `out`.
pub fn encode_frame(
    out: &mut Vec<u8>,
    base_offset: u64,
    timestamp_ms: u64,
    attested: u64,
    records: &[NewRecord],
) {
    debug_assert!(!records.is_empty());
    let start = out.len();
    out.extend_from_slice(&FRAME_MAGIC);
    out.extend_from_slice(&[0u8; 8]); // length + crc, patched below
    out.extend_from_slice(&[FRAME_VERSION, 0, 0, 0]);
    out.extend_from_slice(&base_offset.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&timestamp_ms.to_le_bytes());
    out.extend_from_slice(&attested.to_le_bytes());
    for r in records {
        let key_len = r.key.as_ref().map_or(NO_KEY, |k| k.len() as u32);
        out.extend_from_slice(&key_len.to_le_bytes());
        out.extend_from_slice(&(r.payload.len() as u32).to_le_bytes());
        if let Some(k) = &r.key {
            out.extend_from_slice(k);
        }
        out.extend_from_slice(&r.payload);
    }
    let len = (out.len() - start) as u32;
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&out[start + 12..]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// A verified, decoded frame; records are slices of its buffer.
#[derive(Debug)]
pub struct DecodedFrame {
    pub header: FrameHeader,
    buf: Bytes,
    recs: Vec<RecLoc>,
}

impl DecodedFrame {
    /// Verifies (`check_frame`) and decodes one frame.
    pub fn decode(buf: Bytes) -> Result<Self, String> {
        let header = check_frame(&buf)?;
        let mut recs = Vec::with_capacity(header.count as usize);
        parse_records(&buf, header.count, Some(&mut recs))?;
        Ok(DecodedFrame { header, buf, recs })
    }

    pub fn base_offset(&self) -> u64 {
        self.header.base_offset
    }
    pub fn end_offset(&self) -> u64 {
        self.header.end_offset()
    }
    pub fn contains(&self, offset: u64) -> bool {
        offset >= self.base_offset() && offset < self.end_offset()
    }

    /// Key + payload bytes of the record at `offset` (must be contained).
    pub fn record_size(&self, offset: u64) -> usize {
        let r = &self.recs[(offset - self.base_offset()) as usize];
        let k = if r.key_len == NO_KEY {
            0
        } else {
            r.key_len as usize
        };
        k + r.payload_len as usize
    }

    /// The record at `offset` (must be contained).
    pub fn record(&self, offset: u64) -> StoredRecord {
        let r = &self.recs[(offset - self.base_offset()) as usize];
        let key = (r.key_len != NO_KEY).then(|| {
            self.buf
                .slice(r.key_start as usize..r.key_start as usize + r.key_len as usize)
        });
        let payload = self
            .buf
            .slice(r.payload_start as usize..r.payload_start as usize + r.payload_len as usize);
        StoredRecord {
            offset,
            timestamp_ms: self.header.timestamp_ms,
            key,
            payload,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: Option<&[u8]>, payload: &[u8]) -> NewRecord {
        NewRecord {
            key: key.map(Bytes::copy_from_slice),
            payload: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn round_trip_keys_and_payloads() {
        let recs = vec![
            rec(None, b"a"),
            rec(Some(b""), b""),
            rec(Some(b"k\x00\xff"), &[0, 1, 2, 255]),
        ];
        let mut buf = Vec::new();
        encode_frame(&mut buf, 42, 1000, 40, &recs);
        let f = DecodedFrame::decode(Bytes::from(buf)).unwrap();
        assert_eq!(f.base_offset(), 42);
        assert_eq!(f.end_offset(), 45);
        assert_eq!(f.header.attested_committed, 40);
        let r0 = f.record(42);
        assert_eq!(r0.key, None);
        assert_eq!(&r0.payload[..], b"a");
        let r1 = f.record(43);
        assert_eq!(r1.key.as_deref(), Some(&b""[..]));
        assert!(r1.payload.is_empty());
        let r2 = f.record(44);
        assert_eq!(r2.key.as_deref(), Some(&b"k\x00\xff"[..]));
        assert_eq!(&r2.payload[..], &[0, 1, 2, 255]);
        assert_eq!(r2.timestamp_ms, 1000);
        assert_eq!(f.record_size(44), 7);
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let recs = vec![rec(Some(b"key"), b"payload-bytes"), rec(None, b"x")];
        let mut buf = Vec::new();
        encode_frame(&mut buf, 7, 5, 0, &recs);
        for i in 0..buf.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = buf.clone();
                b[i] ^= bit;
                assert!(
                    check_frame(&b).is_err(),
                    "flip of byte {i} bit {bit:#x} not detected"
                );
            }
        }
    }

    #[test]
    fn rejects_nonzero_codec_and_bad_lengths() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, 0, 0, 0, &[rec(None, b"abc")]);
        let mut b = buf.clone();
        b[13] = 1;
        let crc = crc32c::crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        assert!(check_frame(&b).unwrap_err().contains("codec"));
        assert!(check_frame(&buf[..buf.len() - 1]).is_err());
        assert!(parse_header(&buf[..10]).is_err());
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = NewRecord> {
        (
            proptest::option::of(vec(any::<u8>(), 0..48)),
            vec(any::<u8>(), 0..256),
        )
            .prop_map(|(key, payload)| NewRecord {
                key: key.map(Bytes::from),
                payload: Bytes::from(payload),
            })
    }

    /// A frame header in front of `body` with a correct length and CRC, so that checks past
    /// the CRC (the record layout) see arbitrary bytes.
    fn frame_with_body(base: u64, count: u32, flags: u8, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(FRAME_HEADER_LEN + body.len());
        b.extend_from_slice(&FRAME_MAGIC);
        b.extend_from_slice(&((FRAME_HEADER_LEN + body.len()) as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
        b.extend_from_slice(&[FRAME_VERSION, flags, 0, 0]);
        b.extend_from_slice(&base.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(&7u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(body);
        let crc = crc32c::crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// A record area and a count for it: length fields that mostly, not always, match the
    /// bytes behind them, and a count that mostly matches the records.
    fn loose_records() -> impl Strategy<Value = (u32, Vec<u8>)> {
        vec(
            (
                prop_oneof![Just(NO_KEY), 0..12u32],
                0..12u32,
                prop_oneof![3 => Just(0i32), 1 => -3..4i32],
            ),
            1..6,
        )
        .prop_flat_map(|recs| {
            let n = recs.len() as u32;
            let bytes: Vec<_> = recs
                .into_iter()
                .map(|(klen, plen, fudge)| {
                    let want = if klen == NO_KEY { 0 } else { klen } + plen;
                    let len = (want as i32 + fudge).max(0) as usize;
                    (Just(klen), Just(plen), vec(any::<u8>(), len))
                })
                .collect();
            (prop_oneof![3 => Just(n), 1 => any::<u32>()], bytes)
        })
        .prop_map(|(count, recs)| {
            let mut b = Vec::new();
            for (klen, plen, data) in recs {
                b.extend_from_slice(&klen.to_le_bytes());
                b.extend_from_slice(&plen.to_le_bytes());
                b.extend_from_slice(&data);
            }
            (count, b)
        })
    }

    fn check_header_invariants(h: &FrameHeader) {
        let len = h.len as usize;
        assert!((FRAME_HEADER_LEN + RECORD_HEADER_LEN..=MAX_FRAME_LEN).contains(&len));
        assert!(h.count >= 1);
        assert!(h.count as usize <= (len - FRAME_HEADER_LEN) / RECORD_HEADER_LEN);
        assert!(h.base_offset.checked_add(h.count as u64).is_some());
    }

    proptest! {
        #[test]
        fn prop_frame_roundtrip(
            base in 0..=u64::MAX - 64,
            ts in any::<u64>(),
            attested in any::<u64>(),
            recs in vec(record(), 1..=FRAME_MAX_RECORDS),
        ) {
            let mut buf = vec![0xAA; 3]; // appends after what is there
            encode_frame(&mut buf, base, ts, attested, &recs);
            let frame = Bytes::from(buf).slice(3..);
            let f = DecodedFrame::decode(frame.clone()).unwrap();
            prop_assert_eq!(f.header.len as usize, frame.len());
            prop_assert_eq!(f.base_offset(), base);
            prop_assert_eq!(f.end_offset(), base + recs.len() as u64);
            prop_assert_eq!(f.header.timestamp_ms, ts);
            prop_assert_eq!(f.header.attested_committed, attested);
            for (i, r) in recs.iter().enumerate() {
                let off = base + i as u64;
                prop_assert!(f.contains(off));
                let got = f.record(off);
                prop_assert_eq!(got.offset, off);
                prop_assert_eq!(got.timestamp_ms, ts);
                prop_assert_eq!(&got.key, &r.key);
                prop_assert_eq!(&got.payload, &r.payload);
                prop_assert_eq!(f.record_size(off), record_size(r) - RECORD_HEADER_LEN);
            }
            prop_assert!(!f.contains(base + recs.len() as u64));
        }

        #[test]
        fn prop_frame_parse_header_never_panics(b in vec(any::<u8>(), 0..96)) {
            if let Ok(h) = parse_header(&b) {
                check_header_invariants(&h);
            }
            let _ = check_frame(&b);
            let _ = DecodedFrame::decode(Bytes::from(b));
        }

        /// Headers that pass the magic and version checks, with arbitrary length, count and
        /// base offset fields.
        #[test]
        fn prop_frame_parse_header_fields(
            len in any::<u32>(),
            count in any::<u32>(),
            base in any::<u64>(),
            rest in vec(any::<u8>(), 0..64),
        ) {
            let mut b = frame_with_body(base, count, 0, &rest);
            b[4..8].copy_from_slice(&len.to_le_bytes());
            match parse_header(&b) {
                Ok(h) => {
                    check_header_invariants(&h);
                    prop_assert_eq!((h.len, h.count, h.base_offset), (len, count, base));
                }
                Err(_) => {
                    let len = len as usize;
                    prop_assert!(
                        !(FRAME_HEADER_LEN + RECORD_HEADER_LEN..=MAX_FRAME_LEN).contains(&len)
                            || count == 0
                            || count as usize > (len - FRAME_HEADER_LEN) / RECORD_HEADER_LEN
                            || base.checked_add(count as u64).is_none()
                    );
                }
            }
            // A header announcing up to 16 MiB over a short buffer is refused, not read.
            prop_assert!(check_frame(&b).is_err() || b.len() == len as usize);
        }

        /// A correct CRC over an arbitrary record area: the layout checks must hold on their
        /// own, and the record table allocated is bounded by the frame's bytes.
        #[test]
        fn prop_frame_arbitrary_records_with_valid_crc(
            base in any::<u64>(),
            (count, body) in prop_oneof![
                (prop_oneof![1..8u32, any::<u32>()], vec(any::<u8>(), 0..160)),
                loose_records(),
            ],
            flags in prop_oneof![3 => Just(0u8), 1 => any::<u8>()],
        ) {
            let b = frame_with_body(base, count, flags, &body);
            let total = b.len();
            if let Ok(f) = DecodedFrame::decode(Bytes::from(b)) {
                check_header_invariants(&f.header);
                prop_assert_eq!(f.header.len as usize, total);
                prop_assert!(f.recs.capacity() <= (total - FRAME_HEADER_LEN) / RECORD_HEADER_LEN);
                let mut sum = FRAME_HEADER_LEN;
                for off in f.base_offset()..f.end_offset() {
                    let r = f.record(off);
                    sum += RECORD_HEADER_LEN
                        + r.key.as_ref().map_or(0, |k| k.len())
                        + r.payload.len();
                }
                prop_assert_eq!(sum, total);
            }
        }

        #[test]
        fn prop_frame_parse_records_never_panics(
            count in any::<u32>(),
            b in vec(any::<u8>(), FRAME_HEADER_LEN..FRAME_HEADER_LEN + 128),
        ) {
            let mut out = Vec::new();
            if parse_records(&b, count, Some(&mut out)).is_ok() {
                prop_assert_eq!(out.len() as u64, count as u64);
            }
            prop_assert!(out.len() <= (b.len() - FRAME_HEADER_LEN) / RECORD_HEADER_LEN);
            for r in &out {
                let key_end = r.key_start as usize
                    + if r.key_len == NO_KEY { 0 } else { r.key_len as usize };
                prop_assert!(key_end <= b.len());
                prop_assert!(r.payload_start as usize + r.payload_len as usize <= b.len());
            }
        }

        #[test]
        fn prop_frame_truncation_is_an_error(
            recs in vec(record(), 1..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut buf = Vec::new();
            encode_frame(&mut buf, 1, 2, 0, &recs);
            let cut = cut.index(buf.len());
            prop_assert!(check_frame(&buf[..cut]).is_err());
            prop_assert!(DecodedFrame::decode(Bytes::copy_from_slice(&buf[..cut])).is_err());
            // And a frame with bytes after it is not one frame.
            let mut longer = buf.clone();
            longer.push(0);
            prop_assert!(check_frame(&longer).is_err());
        }

        #[test]
        fn prop_frame_bit_flip_is_detected(
            recs in vec(record(), 1..4),
            at in any::<prop::sample::Index>(),
            bit in 0..8u8,
        ) {
            let mut buf = Vec::new();
            encode_frame(&mut buf, 5, 6, 4, &recs);
            let at = at.index(buf.len());
            buf[at] ^= 1 << bit;
            prop_assert!(check_frame(&buf).is_err(), "flip of byte {} bit {}", at, bit);
        }
    }
}
