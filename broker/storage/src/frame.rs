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
//! 13     1    flags: bits 0-2 codec of the records section (0 = none, 1 = zstd; 2-7 are
//!             unreadable), bit 3 attributes (record headers of 12 bytes), rest 0
//! 14     2    reserved (0)
//! 16     8    base offset (offset of the first record)
//! 24     4    record count (>= 1; at most 64 with codec 1)
//! 28     8    timestamp, Unix ms (commit time of every record of the frame)
//! 36     8    high watermark of the log when the frame was written ("attested committed")
//! 44          records section, as stored (codec 0: as below; codec 1: one zstd frame, with
//!             its content size, of the section below); `count` times:
//!               4  key length, 0xFFFF_FFFF = no key (distinct from an empty key)
//!               4  payload length
//!               4  attributes length, 0 = none (only with flag bit 3)
//!               .. key bytes, payload bytes, attribute bytes
//! ```
//!
//! Flag bit 3 is set on a frame iff at least one of its records has attributes (a non-empty
//! opaque block, see [`NewRecord::attrs`]); then every record header of the frame has the
//! attributes length, 0 for the records without (a reader also takes a frame with the flag
//! and only zero lengths as well formed). A frame without attributes is therefore
//! byte for byte what frames were before attributes existed: every older log reads
//! unchanged, only frames that carry attributes differ, and a reader that predates the
//! flag refuses such a frame (unknown flags) rather than misreading it.
//!
//! The frame length must match the stored bytes exactly, and the (decompressed) records
//! section must hold exactly `count` records and nothing else. The CRC covers the bytes as
//! stored, compressed or not, so the CRC check and torn-write detection do not depend on
//! the codec; a codec-1 frame that passes its CRC but does not decompress to exactly
//! `count` well-formed records (at most [`MAX_RECORDS_SECTION`] bytes, a bound checked
//! against the zstd frame header before anything is allocated) is damaged like a
//! malformed uncompressed frame. The writer uses codec 1 only for frames it makes smaller,
//! so a log may mix codecs. The "attested committed" field lets
//! recovery tell corruption of committed data (a later frame attests that the damaged
//! offsets had been fsynced and verified before it was written) from a torn unsynced write.

use std::cell::RefCell;

use bytes::Bytes;
use zstd::zstd_safe;

use crate::{NewRecord, StoredRecord};

pub const FRAME_MAGIC: [u8; 4] = *b"NRDF";
pub const FRAME_VERSION: u8 = 1;
pub const FRAME_HEADER_LEN: usize = 44;
/// Record header of a frame without attributes (the least a record takes).
pub const RECORD_HEADER_LEN: usize = 8;
/// Record header of a frame with [`FLAG_ATTRS`]: the attributes length follows.
pub const RECORD_HEADER_LEN_ATTRS: usize = RECORD_HEADER_LEN + 4;
pub const NO_KEY: u32 = u32::MAX;
/// Largest key + payload of one record.
pub const MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;
/// Largest attribute block of one record: a bound of the storage format (the broker
/// enforces a smaller one), refused on append like an oversize key + payload.
pub const MAX_ATTRS_BYTES: usize = 16 * 1024;
/// Largest valid frame (a single maximal record with maximal attributes).
pub const MAX_FRAME_LEN: usize =
    FRAME_HEADER_LEN + RECORD_HEADER_LEN_ATTRS + MAX_RECORD_BYTES + MAX_ATTRS_BYTES;
/// A frame is closed before it would exceed this many bytes (unless it holds one record).
pub const FRAME_TARGET_BYTES: usize = 64 * 1024;
/// At most this many records per frame.
pub const FRAME_MAX_RECORDS: usize = 64;
/// Largest records section (decompressed, for codec 1): the one of a single maximal record
/// with maximal attributes.
pub const MAX_RECORDS_SECTION: usize = MAX_FRAME_LEN - FRAME_HEADER_LEN;
const CODEC_MASK: u8 = 0x07;
/// Codec bits of an uncompressed frame.
pub const CODEC_NONE: u8 = 0;
/// Codec bits of a frame whose records section is one zstd frame.
pub const CODEC_ZSTD: u8 = 1;
/// Flag of a frame some record of which has attributes: its record headers are
/// [`RECORD_HEADER_LEN_ATTRS`] bytes.
pub const FLAG_ATTRS: u8 = 0x08;
/// The zstd compression buffer a writing thread keeps between frames (larger ones, for a
/// single big record, are freed after use).
const SCRATCH_KEEP: usize = 256 * 1024;

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

    /// The codec bits of the flags (0 = none, 1 = zstd).
    pub fn codec(&self) -> u8 {
        self.flags & CODEC_MASK
    }

    /// Whether the record headers carry an attributes length ([`FLAG_ATTRS`]).
    pub fn has_attrs(&self) -> bool {
        self.flags & FLAG_ATTRS != 0
    }

    /// Bytes of each record header of the frame.
    pub fn record_header_len(&self) -> usize {
        record_header_len(self.has_attrs())
    }
}

/// Bytes of a record header in a frame with (`attrs`) or without [`FLAG_ATTRS`].
pub fn record_header_len(attrs: bool) -> usize {
    if attrs {
        RECORD_HEADER_LEN_ATTRS
    } else {
        RECORD_HEADER_LEN
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Whether a record is stored with attributes: an empty block is stored as none, so that a
/// frame only changes layout when a record really carries some.
pub fn has_attrs(r: &NewRecord) -> bool {
    r.attrs.as_ref().is_some_and(|a| !a.is_empty())
}

/// Key, payload and attribute bytes of one record (its share of a frame but the header).
fn record_data_len(r: &NewRecord) -> usize {
    r.key.as_ref().map_or(0, |k| k.len())
        + r.payload.len()
        + r.attrs.as_ref().map_or(0, |a| a.len())
}

/// The exact encoded (uncompressed) length of a frame as records are added to it, which
/// [`encode_frame`] writes for the same records. A record's share depends on the others:
/// one record with attributes widens every record header of its frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameLen {
    records: usize,
    data: usize,
    attrs: bool,
}

impl FrameLen {
    /// The frame with `r` added after its records.
    pub fn with(self, r: &NewRecord) -> FrameLen {
        FrameLen {
            records: self.records + 1,
            data: self.data + record_data_len(r),
            attrs: self.attrs || has_attrs(r),
        }
    }

    /// Bytes of the frame: its header, the record headers, keys, payloads and attributes.
    pub fn bytes(self) -> usize {
        FRAME_HEADER_LEN + self.records * record_header_len(self.attrs) + self.data
    }
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
    // Stored uncompressed, each record takes at least its header (8 bytes, 12 with
    // attributes); compressed, the writer never puts more than FRAME_MAX_RECORDS in a frame.
    let max_count = if b[13] & CODEC_MASK == CODEC_ZSTD {
        FRAME_MAX_RECORDS
    } else {
        (len as usize - FRAME_HEADER_LEN) / record_header_len(b[13] & FLAG_ATTRS != 0)
    };
    if count == 0 || count as usize > max_count {
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

/// Where one record's key, payload and attributes lie inside the buffer of a decoded frame
/// (the attributes right after the payload).
#[derive(Debug, Clone, Copy)]
struct RecLoc {
    key_start: u32,
    key_len: u32, // NO_KEY = absent
    payload_start: u32,
    payload_len: u32,
    attrs_len: u32, // 0 = none
}

impl RecLoc {
    fn attrs_start(&self) -> usize {
        self.payload_start as usize + self.payload_len as usize
    }
}

/// Checks that `frame[start..]` is exactly `count` records (`start`: where the records
/// section begins in `frame`: after the header of an uncompressed frame, 0 in a decompressed
/// section; `attrs`: the frame has [`FLAG_ATTRS`], so record headers have the attributes
/// length), recording where each lies in `out`.
fn parse_records(
    frame: &[u8],
    start: usize,
    count: u32,
    attrs: bool,
    out: Option<&mut Vec<RecLoc>>,
) -> Result<(), String> {
    let mut out = out;
    let header_len = record_header_len(attrs);
    let mut p = start;
    for i in 0..count {
        if p + header_len > frame.len() {
            return Err(format!("record {i} header past the frame end"));
        }
        let key_len = u32_at(frame, p);
        let payload_len = u32_at(frame, p + 4);
        let attrs_len = if attrs { u32_at(frame, p + 8) } else { 0 };
        p += header_len;
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
        p = p
            .checked_add(attrs_len as usize)
            .ok_or("attributes length overflow")?;
        if p > frame.len() {
            return Err(format!("record {i} past the frame end"));
        }
        if let Some(o) = out.as_deref_mut() {
            o.push(RecLoc {
                key_start: key_start as u32,
                key_len,
                payload_start: payload_start as u32,
                payload_len,
                attrs_len,
            });
        }
    }
    if p != frame.len() {
        return Err(format!("{} stray bytes after the records", frame.len() - p));
    }
    Ok(())
}

/// Checks everything of a frame held in `frame` (exactly one frame) but its records
/// section: header, length, CRC, flags (codec bits and [`FLAG_ATTRS`] only), a known codec.
fn check_envelope(frame: &[u8]) -> Result<FrameHeader, String> {
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
    if h.flags & !(CODEC_MASK | FLAG_ATTRS) != 0 || frame[14] != 0 || frame[15] != 0 {
        return Err(format!("unknown flags {:#04x}", h.flags));
    }
    if !matches!(h.codec(), CODEC_NONE | CODEC_ZSTD) {
        return Err(format!("unsupported codec {}", h.codec()));
    }
    Ok(h)
}

/// Fully checks a frame held in `frame` (exactly one frame): header, CRC, codec, record
/// layout (of a compressed frame: after decompressing it, within the bound).
pub fn check_frame(frame: &[u8]) -> Result<FrameHeader, String> {
    let h = check_envelope(frame)?;
    if h.codec() == CODEC_NONE {
        parse_records(frame, FRAME_HEADER_LEN, h.count, h.has_attrs(), None)?;
    } else {
        let section = decompress_records(&frame[FRAME_HEADER_LEN..], &h)?;
        parse_records(&section, 0, h.count, h.has_attrs(), None)?;
    }
    Ok(h)
}

thread_local! {
    /// This thread's zstd decompression context, reused frame after frame (decompressing
    /// into a caller's buffer in one pass allocates nothing else).
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    /// This thread's zstd compression context (with its level) and output buffer: appends
    /// run on a few threads, so this keeps a context per writing thread rather than one per
    /// partition log (a zstd context holds from a few hundred KiB to MiBs), lock-free.
    static COMPRESSOR: RefCell<Compressor> = const {
        RefCell::new(Compressor { ctx: None, scratch: Vec::new() })
    };
}

struct Compressor {
    ctx: Option<(i32, zstd::bulk::Compressor<'static>)>,
    scratch: Vec<u8>,
}

/// Decompresses the records section `data` of the codec-1 frame of header `h`. The size
/// the zstd frame header announces must be there (the writer always records it), lie
/// within what `h.count` records can take (their headers at least) and
/// [`MAX_RECORDS_SECTION`], and be exactly what the data decompresses to; the buffer is
/// allocated only once that size has passed these checks, and the data must be exactly
/// one zstd frame.
fn decompress_records(data: &[u8], h: &FrameHeader) -> Result<Vec<u8>, String> {
    let count = h.count;
    let size = match zstd_safe::get_frame_content_size(data) {
        Ok(Some(n)) => n,
        Ok(None) => return Err("zstd frame without a content size".into()),
        Err(_) => return Err("not a zstd frame header".into()),
    };
    let least = count as u64 * h.record_header_len() as u64;
    if size < least || size > MAX_RECORDS_SECTION as u64 {
        return Err(format!(
            "implausible decompressed size {size} for {count} records"
        ));
    }
    match zstd_safe::find_frame_compressed_size(data) {
        Ok(n) if n == data.len() => {}
        Ok(n) => {
            return Err(format!(
                "{} stray bytes after the zstd frame",
                data.len().saturating_sub(n)
            ))
        }
        Err(code) => {
            return Err(format!(
                "bad zstd frame: {}",
                zstd_safe::get_error_name(code)
            ))
        }
    }
    let size = size as usize;
    let mut out = Vec::with_capacity(size);
    let got = DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        let d = match d.as_mut() {
            Some(d) => d,
            None => d.insert(
                zstd::bulk::Decompressor::new()
                    .map_err(|e| format!("cannot create a zstd context: {e}"))?,
            ),
        };
        // Writes at most `out.capacity()` (= size) bytes.
        d.decompress_to_buffer(data, &mut out)
            .map_err(|e| format!("zstd: {e}"))
    })?;
    if got != size || out.len() != size {
        return Err(format!(
            "zstd frame decompresses to {got} bytes, its header says {size}"
        ));
    }
    Ok(out)
}

/// Appends one encoded (uncompressed, codec 0) frame holding `records` to `out`.
pub fn encode_frame(
    out: &mut Vec<u8>,
    base_offset: u64,
    timestamp_ms: u64,
    attested: u64,
    records: &[NewRecord],
) {
    let start = out.len();
    write_frame(out, base_offset, timestamp_ms, attested, records);
    seal_frame(out, start);
}

/// Appends one encoded frame holding `records` to `out`, its records section compressed
/// with zstd at `level` (codec 1) if that makes the frame smaller, else uncompressed (codec
/// 0, also if compressing fails). Uses this thread's compression context.
pub fn encode_frame_zstd(
    out: &mut Vec<u8>,
    base_offset: u64,
    timestamp_ms: u64,
    attested: u64,
    records: &[NewRecord],
    level: i32,
) {
    let start = out.len();
    write_frame(out, base_offset, timestamp_ms, attested, records);
    COMPRESSOR.with(|c| compress_section(&mut c.borrow_mut(), out, start, level));
    seal_frame(out, start);
}

/// Replaces the records section of the unsealed frame at `out[start..]` by its zstd
/// compression and sets codec 1 (keeping the other flags), if the compressed section is
/// smaller.
fn compress_section(c: &mut Compressor, out: &mut Vec<u8>, start: usize, level: i32) {
    let body = start + FRAME_HEADER_LEN;
    let raw_len = out.len() - body;
    let ctx = match &mut c.ctx {
        Some((l, ctx)) if *l == level => ctx,
        Some((l, ctx)) => {
            if ctx.set_compression_level(level).is_err() {
                return;
            }
            *l = level;
            ctx
        }
        None => match zstd::bulk::Compressor::new(level) {
            Ok(ctx) => &mut c.ctx.insert((level, ctx)).1,
            Err(e) => {
                tracing::warn!(error = %e, "cannot create a zstd context; writing the frame uncompressed");
                return;
            }
        },
    };
    // zstd writes into the buffer's capacity from its start; output that does not fit in
    // fewer bytes than the input is an error, and the frame stays uncompressed.
    c.scratch.clear();
    c.scratch.reserve_exact(raw_len - 1);
    if let Ok(n) = ctx.compress_to_buffer(&out[body..], &mut c.scratch) {
        if n < raw_len && c.scratch.len() == n {
            out.truncate(body);
            out.extend_from_slice(&c.scratch);
            out[start + 13] |= CODEC_ZSTD;
        }
    }
    if c.scratch.capacity() > SCRATCH_KEEP {
        c.scratch = Vec::new();
    }
}

/// Appends the header (length and CRC left zero) and the uncompressed records section of a
/// frame holding `records` to `out`: with [`FLAG_ATTRS`] and 12-byte record headers iff a
/// record has attributes, else in the layout of frames without attributes.
fn write_frame(
    out: &mut Vec<u8>,
    base_offset: u64,
    timestamp_ms: u64,
    attested: u64,
    records: &[NewRecord],
) {
    debug_assert!(!records.is_empty());
    let attrs = records.iter().any(has_attrs);
    let flags = if attrs { FLAG_ATTRS } else { 0 };
    out.extend_from_slice(&FRAME_MAGIC);
    out.extend_from_slice(&[0u8; 8]); // length + crc, patched below
    out.extend_from_slice(&[FRAME_VERSION, flags, 0, 0]);
    out.extend_from_slice(&base_offset.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&timestamp_ms.to_le_bytes());
    out.extend_from_slice(&attested.to_le_bytes());
    for r in records {
        let key_len = r.key.as_ref().map_or(NO_KEY, |k| k.len() as u32);
        out.extend_from_slice(&key_len.to_le_bytes());
        out.extend_from_slice(&(r.payload.len() as u32).to_le_bytes());
        if attrs {
            let attrs_len = r.attrs.as_ref().map_or(0, |a| a.len() as u32);
            out.extend_from_slice(&attrs_len.to_le_bytes());
        }
        if let Some(k) = &r.key {
            out.extend_from_slice(k);
        }
        out.extend_from_slice(&r.payload);
        if let Some(a) = r.attrs.as_ref().filter(|_| attrs) {
            out.extend_from_slice(a);
        }
    }
}

/// Fills in the length and CRC of the frame that makes up `out[start..]`.
fn seal_frame(out: &mut [u8], start: usize) {
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
    /// Verifies (as [`check_frame`]) and decodes one frame. The records of an uncompressed
    /// frame are slices of `buf`; those of a compressed one, of its decompressed section.
    pub fn decode(buf: Bytes) -> Result<Self, String> {
        let header = check_envelope(&buf)?;
        let (buf, start) = if header.codec() == CODEC_NONE {
            (buf, FRAME_HEADER_LEN)
        } else {
            let section = decompress_records(&buf[FRAME_HEADER_LEN..], &header)?;
            (Bytes::from(section), 0)
        };
        let mut recs = Vec::with_capacity(header.count as usize);
        parse_records(
            &buf,
            start,
            header.count,
            header.has_attrs(),
            Some(&mut recs),
        )?;
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

    /// Key + payload + attribute bytes of the record at `offset` (must be contained): what
    /// a reader's byte budget counts of it.
    pub fn record_size(&self, offset: u64) -> usize {
        let r = &self.recs[(offset - self.base_offset()) as usize];
        let k = if r.key_len == NO_KEY {
            0
        } else {
            r.key_len as usize
        };
        k + r.payload_len as usize + r.attrs_len as usize
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
        let attrs = (r.attrs_len != 0).then(|| {
            self.buf
                .slice(r.attrs_start()..r.attrs_start() + r.attrs_len as usize)
        });
        StoredRecord {
            offset,
            timestamp_ms: self.header.timestamp_ms,
            key,
            payload,
            attrs,
        }
    }
}

/// Helpers of the crate's unit tests: frames with arbitrary sections, hand-made zstd
/// frames, and a probe of the largest allocation a piece of code makes.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A header in front of `body` with a correct length and CRC, so that the checks past
    /// the CRC (codec, record layout) see arbitrary bytes.
    pub fn frame_with_body(base: u64, count: u32, flags: u8, body: &[u8]) -> Vec<u8> {
        sealed_frame(base, count, flags, 7, 0, body)
    }

    /// A frame of the given header fields in front of `body`, its length and CRC correct.
    pub fn sealed_frame(
        base: u64,
        count: u32,
        flags: u8,
        timestamp_ms: u64,
        attested: u64,
        body: &[u8],
    ) -> Vec<u8> {
        let mut b = Vec::with_capacity(FRAME_HEADER_LEN + body.len());
        b.extend_from_slice(&FRAME_MAGIC);
        b.extend_from_slice(&((FRAME_HEADER_LEN + body.len()) as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
        b.extend_from_slice(&[FRAME_VERSION, flags, 0, 0]);
        b.extend_from_slice(&base.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(&timestamp_ms.to_le_bytes());
        b.extend_from_slice(&attested.to_le_bytes());
        b.extend_from_slice(body);
        reseal(&mut b);
        b
    }

    /// The uncompressed frame of `records` as the module documentation lays it out, written
    /// independently of [`write_frame`]: the flag and 12-byte record headers iff a record
    /// has a non-empty attribute block.
    pub fn documented_frame(base: u64, ts: u64, attested: u64, records: &[NewRecord]) -> Vec<u8> {
        let attrs = records
            .iter()
            .any(|r| r.attrs.as_ref().is_some_and(|a| !a.is_empty()));
        let mut body = Vec::new();
        for r in records {
            let key_len = r.key.as_ref().map_or(0xFFFF_FFFF, |k| k.len() as u32);
            body.extend_from_slice(&key_len.to_le_bytes());
            body.extend_from_slice(&(r.payload.len() as u32).to_le_bytes());
            let a: &[u8] = r.attrs.as_deref().unwrap_or_default();
            if attrs {
                body.extend_from_slice(&(a.len() as u32).to_le_bytes());
            }
            body.extend_from_slice(r.key.as_deref().unwrap_or_default());
            body.extend_from_slice(&r.payload);
            body.extend_from_slice(a);
        }
        let flags = if attrs { 0x08 } else { 0 };
        sealed_frame(base, records.len() as u32, flags, ts, attested, &body)
    }

    /// The attributes `r` reads back with: an empty block is none.
    pub fn stored_attrs(r: &NewRecord) -> Option<Bytes> {
        r.attrs.clone().filter(|a| !a.is_empty())
    }

    /// Key + payload + attribute bytes of `r` (what [`DecodedFrame::record_size`] says).
    pub fn data_len(r: &NewRecord) -> usize {
        r.key.as_ref().map_or(0, |k| k.len())
            + r.payload.len()
            + r.attrs.as_ref().map_or(0, |a| a.len())
    }

    /// Recomputes the CRC of the frame `b` (after a test changed its bytes).
    pub fn reseal(b: &mut [u8]) {
        let crc = crc32c::crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
    }

    /// The uncompressed records section of `records`.
    pub fn section(records: &[NewRecord]) -> Vec<u8> {
        let mut v = Vec::new();
        write_frame(&mut v, 0, 0, 0, records);
        v.split_off(FRAME_HEADER_LEN)
    }

    /// A zstd frame (single segment, 8-byte content size field) that says it holds
    /// `content_size` bytes, with `content` in raw blocks: a real zstd frame when the two
    /// agree, a lying one otherwise.
    pub fn raw_zstd_frame(content_size: u64, content: &[u8]) -> Vec<u8> {
        let mut v = vec![0x28, 0xB5, 0x2F, 0xFD, 0xE0];
        v.extend_from_slice(&content_size.to_le_bytes());
        let mut chunks = content.chunks(100).peekable();
        if chunks.peek().is_none() {
            v.extend_from_slice(&[1, 0, 0]); // last, raw, empty
        }
        while let Some(c) = chunks.next() {
            let last = chunks.peek().is_none() as u32;
            let h = last | (c.len() as u32) << 3;
            v.extend_from_slice(&h.to_le_bytes()[..3]);
            v.extend_from_slice(c);
        }
        v
    }

    pub mod alloc {
        //! A global allocator that notes, per thread, the largest single allocation made
        //! since [`largest`] started watching. (zstd's own context allocations go through
        //! C `malloc` and are not seen; decompression allocates nothing beyond the output
        //! buffer, which is Rust's.)
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        struct Probe;

        thread_local! {
            static LARGEST: Cell<usize> = const { Cell::new(0) };
        }

        fn note(size: usize) {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }

        // SAFETY: every call forwards to `System` with the caller's arguments.
        unsafe impl GlobalAlloc for Probe {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                note(layout.size());
                unsafe { System.alloc(layout) }
            }
            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                note(layout.size());
                unsafe { System.alloc_zeroed(layout) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                unsafe { System.dealloc(ptr, layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                note(new_size);
                unsafe { System.realloc(ptr, layout, new_size) }
            }
        }

        #[global_allocator]
        static PROBE: Probe = Probe;

        /// Runs `f`; returns its result and the largest single allocation it made on this
        /// thread.
        pub fn largest<T>(f: impl FnOnce() -> T) -> (T, usize) {
            let before = LARGEST.with(|l| l.replace(0));
            let out = f();
            let seen = LARGEST.with(|l| l.replace(before));
            (out, seen)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::alloc::largest;
    use super::test_support::*;
    use super::*;

    fn rec(key: Option<&[u8]>, payload: &[u8]) -> NewRecord {
        NewRecord {
            key: key.map(Bytes::copy_from_slice),
            payload: Bytes::copy_from_slice(payload),
            attrs: None,
        }
    }

    fn rec_attrs(key: Option<&[u8]>, payload: &[u8], attrs: Option<&[u8]>) -> NewRecord {
        NewRecord {
            attrs: attrs.map(Bytes::copy_from_slice),
            ..rec(key, payload)
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

    /// Golden bytes: a frame whose records have no attributes is laid out exactly as before
    /// attributes existed (flag bit 3 clear, 8-byte record headers).
    #[test]
    fn a_frame_without_attrs_keeps_the_old_layout_byte_for_byte() {
        let recs = vec![rec(Some(b"k"), b"pay"), rec(None, b"")];
        let mut buf = Vec::new();
        encode_frame(
            &mut buf,
            0x0102_0304_0506_0708,
            0x1122_3344_5566_7788,
            5,
            &recs,
        );
        let mut want: Vec<u8> = Vec::new();
        want.extend_from_slice(b"NRDF");
        want.extend_from_slice(&[64, 0, 0, 0]); // frame length
        want.extend_from_slice(&[0, 0, 0, 0]); // CRC, below
        want.extend_from_slice(&[1, 0x00, 0, 0]); // version, flags, reserved
        want.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]); // base offset
        want.extend_from_slice(&[2, 0, 0, 0]); // count
        want.extend_from_slice(&[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]); // timestamp
        want.extend_from_slice(&[5, 0, 0, 0, 0, 0, 0, 0]); // attested
        want.extend_from_slice(&[1, 0, 0, 0, 3, 0, 0, 0]);
        want.extend_from_slice(b"kpay");
        want.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
        let crc = crc32c::crc32c(&want[12..]);
        want[8..12].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(buf, want);
        assert_eq!(buf[13] & FLAG_ATTRS, 0);
        // Empty attribute blocks are none: the same bytes.
        let empty: Vec<NewRecord> = recs
            .iter()
            .map(|r| NewRecord {
                attrs: Some(Bytes::new()),
                ..r.clone()
            })
            .collect();
        let mut b2 = Vec::new();
        encode_frame(
            &mut b2,
            0x0102_0304_0506_0708,
            0x1122_3344_5566_7788,
            5,
            &empty,
        );
        assert_eq!(b2, want);
        let f = DecodedFrame::decode(Bytes::from(b2)).unwrap();
        assert!(!f.header.has_attrs());
        assert_eq!(
            (
                f.record(0x0102_0304_0506_0708).attrs,
                f.record(0x0102_0304_0506_0709).attrs
            ),
            (None, None)
        );
    }

    /// Golden bytes of a frame with attributes: flag bit 3, every record header of 12 bytes
    /// (attributes length 0 for a record without), attributes after the payload.
    #[test]
    fn a_frame_with_attrs_has_the_documented_layout() {
        let recs = vec![
            rec_attrs(Some(b"k"), b"pay", Some(b"a=1")),
            rec_attrs(None, b"", None),
            rec_attrs(Some(b""), b"x", Some(b"")),
        ];
        let mut buf = Vec::new();
        encode_frame(&mut buf, 9, 3, 2, &recs);
        let mut want: Vec<u8> = Vec::new();
        want.extend_from_slice(b"NRDF");
        want.extend_from_slice(&[88, 0, 0, 0]);
        want.extend_from_slice(&[0, 0, 0, 0]);
        want.extend_from_slice(&[1, 0x08, 0, 0]);
        want.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[3, 0, 0, 0]);
        want.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[1, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0]);
        want.extend_from_slice(b"kpaya=1");
        want.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(b"x");
        let crc = crc32c::crc32c(&want[12..]);
        want[8..12].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(buf, want);
        assert_eq!(
            FrameLen::default()
                .with(&recs[0])
                .with(&recs[1])
                .with(&recs[2])
                .bytes(),
            88
        );
        let f = DecodedFrame::decode(Bytes::from(buf)).unwrap();
        assert!(f.header.has_attrs());
        assert_eq!(f.header.record_header_len(), 12);
        let r = f.record(9);
        assert_eq!(
            (r.key.as_deref(), &r.payload[..]),
            (Some(&b"k"[..]), &b"pay"[..])
        );
        assert_eq!(r.attrs.as_deref(), Some(&b"a=1"[..]));
        let r = f.record(10);
        assert_eq!((r.key, r.payload.len(), r.attrs), (None, 0, None));
        let r = f.record(11);
        assert_eq!(
            (r.key, &r.payload[..], r.attrs),
            (Some(Bytes::new()), &b"x"[..], None)
        );
        assert_eq!(
            (f.record_size(9), f.record_size(10), f.record_size(11)),
            (7, 0, 1)
        );
    }

    #[test]
    fn attrs_round_trip_with_and_without_keys_mixed_in_one_frame() {
        let attrs = |i: usize| format!("region=eu-west-{i};tenant=acme;trace=0000{i}");
        let recs: Vec<NewRecord> = compressible(30)
            .into_iter()
            .enumerate()
            .map(|(i, r)| NewRecord {
                attrs: match i % 4 {
                    0 => None,
                    1 => Some(Bytes::new()),
                    _ => Some(Bytes::from(attrs(i))),
                },
                ..r
            })
            .collect();
        // Alone, with and without a key; then all together.
        let cases: Vec<Vec<NewRecord>> = vec![
            vec![rec_attrs(None, b"p", Some(b"a"))],
            vec![rec_attrs(Some(b"key"), b"p", Some(b"a"))],
            vec![rec_attrs(Some(b""), b"", Some(&[0xFF; 300]))],
            recs.clone(),
        ];
        for recs in &cases {
            let mut plain = Vec::new();
            encode_frame(&mut plain, 50, 6, 49, recs);
            let h = check_frame(&plain).unwrap();
            assert_eq!((h.codec(), h.flags), (CODEC_NONE, FLAG_ATTRS));
            assert_eq!(
                plain.len(),
                recs.iter()
                    .fold(FrameLen::default(), FrameLen::with)
                    .bytes()
            );
            assert_same_records(
                &DecodedFrame::decode(Bytes::from(plain)).unwrap(),
                50,
                6,
                recs,
            );
            for level in [1, 19] {
                let mut z = Vec::new();
                encode_frame_zstd(&mut z, 50, 6, 49, recs, level);
                let f = DecodedFrame::decode(Bytes::from(z)).unwrap();
                assert!(f.header.has_attrs());
                assert_same_records(&f, 50, 6, recs);
            }
        }
        // The mixed frame compresses, and compression keeps the flag.
        let mut z = Vec::new();
        encode_frame_zstd(&mut z, 50, 6, 49, &recs, 3);
        assert_eq!(z[13], FLAG_ATTRS | CODEC_ZSTD);
        assert_eq!(check_frame(&z).unwrap().codec(), CODEC_ZSTD);
    }

    #[test]
    fn frame_len_counts_the_widened_headers_of_a_mixed_frame() {
        let (plain, with) = (rec(None, b"abc"), rec_attrs(Some(b"k"), b"", Some(b"xy")));
        // Alone, each takes its own header: 8 bytes without attributes, 12 with.
        assert_eq!(
            FrameLen::default().with(&plain).bytes(),
            FRAME_HEADER_LEN + 8 + 3
        );
        assert_eq!(
            FrameLen::default().with(&with).bytes(),
            FRAME_HEADER_LEN + 12 + 3
        );
        let len = FrameLen::default().with(&plain).with(&plain).with(&with);
        // The two records before the one with attributes take 12-byte headers too.
        assert_eq!(len.bytes(), FRAME_HEADER_LEN + 3 * 12 + 3 + 3 + 3);
        let mut buf = Vec::new();
        encode_frame(&mut buf, 0, 0, 0, &[plain.clone(), plain, with]);
        assert_eq!(buf.len(), len.bytes());
        assert_eq!(FrameLen::default().bytes(), FRAME_HEADER_LEN);
    }

    /// Keys, payloads and attributes of a decoded frame are slices of its buffer (the
    /// frame's own for codec 0, the decompressed section's for codec 1), not copies.
    #[test]
    fn attrs_are_slices_of_the_frame_buffer() {
        let recs = vec![
            rec_attrs(Some(b"key"), b"payload", Some(b"attributes")),
            rec_attrs(None, b"p2", None),
            rec_attrs(None, b"p3", Some(b"more")),
        ];
        let mut buf = Vec::new();
        encode_frame(&mut buf, 0, 0, 0, &recs);
        let frame = Bytes::from(buf);
        let span = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
        let f = DecodedFrame::decode(frame.clone()).unwrap();
        for o in [0, 2] {
            let r = f.record(o);
            let a = r.attrs.unwrap();
            assert!(span.contains(&(a.as_ptr() as usize)));
            assert_eq!(
                a.as_ptr() as usize,
                r.payload.as_ptr() as usize + r.payload.len()
            );
        }
        let mut z = Vec::new();
        encode_frame_zstd(
            &mut z,
            0,
            0,
            0,
            &compressible(20)
                .into_iter()
                .map(|r| NewRecord {
                    attrs: Some(Bytes::from_static(b"same=attrs")),
                    ..r
                })
                .collect::<Vec<_>>(),
            1,
        );
        let f = DecodedFrame::decode(Bytes::from(z)).unwrap();
        assert_eq!(f.header.codec(), CODEC_ZSTD);
        let span = f.buf.as_ptr() as usize..f.buf.as_ptr() as usize + f.buf.len();
        for o in 0..20 {
            let r = f.record(o);
            let a = r.attrs.unwrap();
            assert_eq!(&a[..], b"same=attrs");
            assert!(span.contains(&(a.as_ptr() as usize)));
            assert_eq!(
                a.as_ptr() as usize,
                r.payload.as_ptr() as usize + r.payload.len()
            );
        }
    }

    /// Every length field of a frame with attributes set to another length (CRC resealed,
    /// so only the layout checks stand), in plain and compressed frames; the flag turned
    /// off or on; every truncation and every bit flip: all errors, no panic.
    #[test]
    fn damage_to_a_frame_with_attrs_is_detected() {
        let recs = vec![
            rec_attrs(Some(b"key"), b"payload", Some(b"attr=v")),
            rec_attrs(None, b"p2", None),
            rec_attrs(Some(b"k3"), b"", Some(b"z")),
            rec_attrs(Some(b""), b"last", Some(b"")),
        ];
        let mut buf = Vec::new();
        encode_frame(&mut buf, 3, 4, 2, &recs);
        assert!(check_frame(&buf).unwrap().has_attrs());
        // Where each record header is.
        let mut at = Vec::new();
        let mut p = FRAME_HEADER_LEN;
        for r in &recs {
            at.push(p);
            p += RECORD_HEADER_LEN_ATTRS + record_data_len(r);
        }
        assert_eq!(p, buf.len());
        let effective = |field: usize, v: u32| {
            if field == 0 && v == NO_KEY {
                0
            } else {
                v as u64
            }
        };
        let mut tried = 0;
        for &h in &at {
            for field in 0..3 {
                let pos = h + 4 * field;
                let v = u32_at(&buf, pos);
                for w in [
                    v.wrapping_add(1),
                    v.wrapping_sub(1),
                    0,
                    NO_KEY,
                    NO_KEY - 1,
                    1 << 31,
                    0x7FFF_FFFF,
                    1 << 16,
                    MAX_ATTRS_BYTES as u32 + 1,
                ] {
                    if effective(field, w) == effective(field, v) {
                        continue; // (no key for an empty key, or the same length)
                    }
                    tried += 1;
                    let mut b = buf.clone();
                    b[pos..pos + 4].copy_from_slice(&w.to_le_bytes());
                    assert!(
                        check_frame(&b).is_err(),
                        "field {field} at {pos}: {w}, CRC not resealed"
                    );
                    reseal(&mut b);
                    let e = check_frame(&b).unwrap_err();
                    assert!(e.contains("record") || e.contains("stray"), "{e}");
                    assert!(DecodedFrame::decode(Bytes::from(b.clone())).is_err());
                    // The same section compressed: the layout check still catches it.
                    let z = zstd::bulk::compress(&b[FRAME_HEADER_LEN..], 1).unwrap();
                    let c = frame_with_body(3, recs.len() as u32, CODEC_ZSTD | FLAG_ATTRS, &z);
                    assert!(
                        check_frame(&c).is_err(),
                        "field {field} at {pos}: {w}, zstd"
                    );
                    assert!(DecodedFrame::decode(Bytes::from(c)).is_err());
                }
            }
        }
        assert!(tried > 90, "{tried}");
        // The undamaged section compressed by hand decodes: the checks above test the damage.
        let z = zstd::bulk::compress(&buf[FRAME_HEADER_LEN..], 1).unwrap();
        let c = frame_with_body(3, recs.len() as u32, CODEC_ZSTD | FLAG_ATTRS, &z);
        assert_same_records(&DecodedFrame::decode(Bytes::from(c)).unwrap(), 3, 7, &recs);
        // The flag turned off: the 12-byte headers misread as 8-byte ones.
        let mut b = buf.clone();
        b[13] &= !FLAG_ATTRS;
        reseal(&mut b);
        assert!(check_frame(&b).is_err());
        // ... and turned on over a frame without attributes.
        let mut plain = Vec::new();
        encode_frame(
            &mut plain,
            3,
            4,
            2,
            &[rec(Some(b"key"), b"payload"), rec(None, b"p")],
        );
        plain[13] |= FLAG_ATTRS;
        reseal(&mut plain);
        assert!(check_frame(&plain).is_err());
        // A count the 12-byte headers cannot fit in the frame: refused by the header check.
        let mut b = buf.clone();
        let most = ((buf.len() - FRAME_HEADER_LEN) / RECORD_HEADER_LEN_ATTRS) as u32;
        b[24..28].copy_from_slice(&(most + 1).to_le_bytes());
        let e = parse_header(&b).unwrap_err();
        assert!(e.contains("record count"), "{e}");
        for cut in 0..buf.len() {
            assert!(check_frame(&buf[..cut]).is_err(), "cut at {cut}");
            assert!(DecodedFrame::decode(Bytes::copy_from_slice(&buf[..cut])).is_err());
        }
        for i in 0..buf.len() {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[i] ^= 1 << bit;
                assert!(check_frame(&b).is_err(), "flip of byte {i} bit {bit}");
            }
        }
    }

    /// The bounds fit together: one record of the largest key + payload with the largest
    /// attributes is exactly the largest frame, and compresses to the largest section.
    #[test]
    fn a_maximal_record_with_maximal_attrs_is_the_largest_frame() {
        let r = NewRecord {
            key: Some(Bytes::from_static(b"k")),
            payload: Bytes::from(vec![0u8; MAX_RECORD_BYTES - 1]),
            attrs: Some(Bytes::from(vec![1u8; MAX_ATTRS_BYTES])),
        };
        assert_eq!(FrameLen::default().with(&r).bytes(), MAX_FRAME_LEN);
        let mut buf = Vec::new();
        encode_frame(&mut buf, 0, 0, 0, std::slice::from_ref(&r));
        assert_eq!(buf.len(), MAX_FRAME_LEN);
        let f = DecodedFrame::decode(Bytes::from(buf)).unwrap();
        assert_eq!(f.record(0).attrs.unwrap().len(), MAX_ATTRS_BYTES);
        let mut z = Vec::new();
        encode_frame_zstd(&mut z, 0, 0, 0, std::slice::from_ref(&r), 1);
        let f = DecodedFrame::decode(Bytes::from(z)).unwrap();
        assert_eq!(f.header.codec(), CODEC_ZSTD);
        assert_eq!(f.buf.len(), MAX_RECORDS_SECTION);
        assert_eq!(f.record(0).attrs.unwrap().len(), MAX_ATTRS_BYTES);
        // One attribute byte more is past what a reader accepts (append refuses it).
        let over = NewRecord {
            attrs: Some(Bytes::from(vec![1u8; MAX_ATTRS_BYTES + 1])),
            ..r
        };
        let mut buf = Vec::new();
        encode_frame(&mut buf, 0, 0, 0, &[over]);
        assert!(parse_header(&buf).unwrap_err().contains("frame length"));
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
    fn rejects_unknown_codecs_and_bad_lengths() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, 0, 0, 0, &[rec(None, b"abc")]);
        for codec in 2..=7u8 {
            let mut b = buf.clone();
            b[13] = codec;
            reseal(&mut b);
            let e = check_frame(&b).unwrap_err();
            assert!(e.contains(&format!("unsupported codec {codec}")), "{e}");
            assert!(DecodedFrame::decode(Bytes::from(b)).is_err());
        }
        // Flag bits other than the codec and attributes ones.
        for bit in 4..8 {
            let mut b = buf.clone();
            b[13] |= 1 << bit;
            reseal(&mut b);
            let e = check_frame(&b).unwrap_err();
            assert!(e.contains("unknown flags"), "{e}");
        }
        // Codec 1 over a section that is no zstd frame.
        let mut b = buf.clone();
        b[13] = CODEC_ZSTD;
        reseal(&mut b);
        assert!(check_frame(&b).unwrap_err().contains("zstd"));
        assert!(check_frame(&buf[..buf.len() - 1]).is_err());
        assert!(parse_header(&buf[..10]).is_err());
    }

    /// Records that compress well: repeated JSON-ish text, keys absent, empty and present.
    fn compressible(n: usize) -> Vec<NewRecord> {
        (0..n)
            .map(|i| {
                let key = match i % 3 {
                    0 => None,
                    1 => Some(&b""[..]),
                    _ => Some(&b"customer-42"[..]),
                };
                let payload = format!(
                    r#"{{"order":{i},"customer":"customer-42","items":["apple","banana","cherry"],"note":"{}"}}"#,
                    "the quick brown fox ".repeat(1 + i % 4)
                );
                rec(key, payload.as_bytes())
            })
            .collect()
    }

    fn assert_same_records(f: &DecodedFrame, base: u64, ts: u64, recs: &[NewRecord]) {
        assert_eq!(
            (f.base_offset(), f.end_offset()),
            (base, base + recs.len() as u64)
        );
        for (i, r) in recs.iter().enumerate() {
            let got = f.record(base + i as u64);
            assert_eq!((got.offset, got.timestamp_ms), (base + i as u64, ts));
            assert_eq!(got.key, r.key, "key of record {i}");
            assert_eq!(got.payload, r.payload, "payload of record {i}");
            assert_eq!(got.attrs, stored_attrs(r), "attributes of record {i}");
            assert_eq!(f.record_size(base + i as u64), data_len(r));
        }
    }

    #[test]
    fn zstd_round_trip_keeps_the_header_and_shrinks_the_section() {
        let recs = compressible(40);
        let mut plain = Vec::new();
        encode_frame(&mut plain, 1000, 77, 990, &recs);
        for level in [1, 3, 7, 19] {
            let mut buf = vec![0xAA; 5]; // appends after what is there
            encode_frame_zstd(&mut buf, 1000, 77, 990, &recs, level);
            assert_eq!(&buf[..5], &[0xAA; 5]);
            let frame = Bytes::from(buf).slice(5..);
            let h = check_frame(&frame).unwrap();
            assert_eq!(h.codec(), CODEC_ZSTD);
            assert_eq!(h.len as usize, frame.len());
            assert!(
                frame.len() * 3 < plain.len(),
                "level {level}: {} bytes compressed, {} plain",
                frame.len(),
                plain.len()
            );
            // Everything but length, CRC, flags and the section is as in the plain frame.
            assert_eq!(frame[..4], plain[..4]);
            assert_eq!(frame[12], plain[12]);
            assert_eq!(frame[14..FRAME_HEADER_LEN], plain[14..FRAME_HEADER_LEN]);
            let ph = parse_header(&plain).unwrap();
            assert_eq!(
                (h.base_offset, h.count, h.timestamp_ms, h.attested_committed),
                (
                    ph.base_offset,
                    ph.count,
                    ph.timestamp_ms,
                    ph.attested_committed
                )
            );
            // The section is one zstd frame of exactly the plain section.
            assert_eq!(
                zstd::bulk::decompress(&frame[FRAME_HEADER_LEN..], MAX_RECORDS_SECTION).unwrap(),
                &plain[FRAME_HEADER_LEN..]
            );
            let f = DecodedFrame::decode(frame).unwrap();
            assert_same_records(&f, 1000, 77, &recs);
        }
    }

    #[test]
    fn a_single_large_record_round_trips_compressed() {
        let big = "0123456789abcdef".repeat(100_000); // 1.6 MB, past the kept scratch buffer
        let recs = vec![rec(Some(b"k"), big.as_bytes())];
        for _ in 0..2 {
            let mut buf = Vec::new();
            encode_frame_zstd(&mut buf, 3, 4, 0, &recs, 3);
            assert!(buf.len() < 100_000, "{}", buf.len());
            let f = DecodedFrame::decode(Bytes::from(buf)).unwrap();
            assert_eq!(f.header.codec(), CODEC_ZSTD);
            assert_same_records(&f, 3, 4, &recs);
        }
        COMPRESSOR.with(|c| assert!(c.borrow().scratch.capacity() <= SCRATCH_KEEP));
    }

    #[test]
    fn incompressible_records_stay_uncompressed() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for len in [1usize, 30, 500, 20_000] {
            let a: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let b: Vec<u8> = (0..len / 2).map(|_| rng.random()).collect();
            let recs = vec![rec(None, &a), rec(Some(b"k"), &b)];
            let mut plain = Vec::new();
            encode_frame(&mut plain, 9, 1, 8, &recs);
            let mut z = Vec::new();
            encode_frame_zstd(&mut z, 9, 1, 8, &recs, 19);
            assert_eq!(
                z, plain,
                "{len}-byte random payload: codec 0, byte for byte"
            );
            assert_eq!(check_frame(&z).unwrap().codec(), CODEC_NONE);
        }
        // A tiny frame: zstd's own overhead outweighs any gain.
        let recs = vec![rec(None, b"aaaa")];
        let (mut plain, mut z) = (Vec::new(), Vec::new());
        encode_frame(&mut plain, 0, 0, 0, &recs);
        encode_frame_zstd(&mut z, 0, 0, 0, &recs, 1);
        assert_eq!(z, plain);
    }

    #[test]
    fn every_single_byte_flip_of_a_compressed_frame_is_detected() {
        let recs = compressible(10);
        let mut buf = Vec::new();
        encode_frame_zstd(&mut buf, 7, 5, 0, &recs, 1);
        assert_eq!(check_frame(&buf).unwrap().codec(), CODEC_ZSTD);
        for i in 0..buf.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = buf.clone();
                b[i] ^= bit;
                assert!(check_frame(&b).is_err(), "flip of byte {i} bit {bit:#x}");
                assert!(DecodedFrame::decode(Bytes::from(b)).is_err());
            }
        }
    }

    /// A CRC-valid codec-1 frame whose zstd data is damaged: every outcome is an error or
    /// exactly `count` well-formed records (zstd data carries no checksum of its own, so a
    /// flip inside a literal may still decode), never a panic, and no allocation beyond
    /// the bound.
    #[test]
    fn crc_valid_but_damaged_zstd_data_is_an_error_or_well_formed() {
        let recs = compressible(20);
        let mut buf = Vec::new();
        encode_frame_zstd(&mut buf, 100, 5, 0, &recs, 3);
        let raw = section(&recs).len();
        let mut errors = 0;
        for i in FRAME_HEADER_LEN..buf.len() {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[i] ^= 1 << bit;
                reseal(&mut b);
                let (res, big) = largest(|| DecodedFrame::decode(Bytes::from(b.clone())));
                assert!(
                    big <= MAX_RECORDS_SECTION,
                    "byte {i} bit {bit}: allocated {big}"
                );
                assert_eq!(check_frame(&b).is_ok(), res.is_ok(), "byte {i} bit {bit}");
                match res {
                    Err(_) => errors += 1,
                    Ok(f) => {
                        let n: usize = (f.base_offset()..f.end_offset())
                            .map(|o| f.record_size(o) + RECORD_HEADER_LEN)
                            .sum();
                        assert_eq!((f.header.count, n), (20, raw));
                    }
                }
            }
        }
        // The zstd frame header and block headers catch most damage.
        assert!(errors > 8 * 8, "only {errors} flips rejected");
        // The zstd magic, the reserved bit of the frame header descriptor and the content
        // size (single-segment frame: right after the descriptor) in particular.
        assert_ne!(buf[FRAME_HEADER_LEN + 4] & 0x20, 0, "single segment");
        for (at, bit) in [(0, 0x10), (3, 0x01), (4, 0x08), (5, 0x01), (5, 0x80)] {
            let mut b = buf.clone();
            b[FRAME_HEADER_LEN + at] ^= bit;
            reseal(&mut b);
            assert!(check_frame(&b).is_err(), "zstd byte {at} bit {bit:#x}");
        }
    }

    #[test]
    fn a_section_of_the_wrong_record_count_is_an_error() {
        let recs = compressible(3);
        let z = zstd::bulk::compress(&section(&recs), 1).unwrap();
        assert!(check_frame(&frame_with_body(0, 3, CODEC_ZSTD, &z)).is_ok());
        for count in [1, 2, 4, 64] {
            let b = frame_with_body(0, count, CODEC_ZSTD, &z);
            let e = check_frame(&b).unwrap_err();
            assert!(
                e.contains("record") || e.contains("size"),
                "count {count}: {e}"
            );
            assert!(DecodedFrame::decode(Bytes::from(b)).is_err());
        }
        // More records than a compressed frame may hold: refused by the header check.
        let many: Vec<NewRecord> = (0..65).map(|_| rec(None, b"")).collect();
        let z = zstd::bulk::compress(&section(&many), 1).unwrap();
        let e = parse_header(&frame_with_body(0, 65, CODEC_ZSTD, &z)).unwrap_err();
        assert!(e.contains("record count"), "{e}");
        // A plain section of 65 empty records is a valid frame (its length covers them).
        let mut plain = Vec::new();
        encode_frame(&mut plain, 0, 0, 0, &many);
        assert!(check_frame(&plain).is_ok());
    }

    #[test]
    fn zstd_sizes_past_the_bound_are_refused_before_allocating() {
        // A real zstd frame of one record section over the bound (zeros compress to little).
        let over = vec![0u8; MAX_RECORDS_SECTION + 1];
        let z = zstd::bulk::compress(&over, 1).unwrap();
        assert!(z.len() < 4096);
        let b = frame_with_body(0, 1, CODEC_ZSTD, &z);
        let (res, big) = largest(|| DecodedFrame::decode(Bytes::from(b.clone())));
        let e = res.unwrap_err();
        assert!(e.contains("implausible decompressed size"), "{e}");
        assert!(big < 4096, "allocated {big}");
        // Lying content sizes: huge, and below what the count needs.
        for (size, count) in [(u64::MAX - 2, 1), (1 << 40, 1), (15, 2), (0, 1)] {
            let b = frame_with_body(0, count, CODEC_ZSTD, &raw_zstd_frame(size, &[0; 16]));
            let (res, big) = largest(|| DecodedFrame::decode(Bytes::from(b.clone())));
            assert!(res.is_err(), "size {size}");
            assert!(big < 4096, "size {size}: allocated {big}");
            assert!(check_frame(&b).is_err());
        }
        // A content size smaller than the data: refused by zstd, within the announced size.
        let data = section(&[rec(None, &[7u8; 40])]);
        let b = frame_with_body(0, 1, CODEC_ZSTD, &raw_zstd_frame(16, &data));
        let (res, big) = largest(|| DecodedFrame::decode(Bytes::from(b.clone())));
        assert!(res.is_err());
        assert!(big < 4096, "allocated {big}");
        // ... and exactly right: the hand-made frame decodes.
        let b = frame_with_body(0, 1, CODEC_ZSTD, &raw_zstd_frame(data.len() as u64, &data));
        let f = DecodedFrame::decode(Bytes::from(b)).unwrap();
        assert_eq!(&f.record(0).payload[..], &[7u8; 40]);
    }

    #[test]
    fn the_section_must_be_exactly_one_zstd_frame_with_a_size() {
        let recs = compressible(2);
        let sec = section(&recs);
        let z = zstd::bulk::compress(&sec, 1).unwrap();
        // Two frames back to back (the second empty), or trailing bytes.
        let mut two = z.clone();
        two.extend_from_slice(&raw_zstd_frame(0, &[]));
        let mut trailing = z.clone();
        trailing.push(0);
        for body in [two, trailing] {
            let e = check_frame(&frame_with_body(0, 2, CODEC_ZSTD, &body)).unwrap_err();
            assert!(e.contains("stray bytes"), "{e}");
        }
        // A zstd frame that does not record its content size (streamed without a size).
        let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
        std::io::Write::write_all(&mut enc, &sec).unwrap();
        let streamed = enc.finish().unwrap();
        assert!(matches!(
            zstd_safe::get_frame_content_size(&streamed),
            Ok(None)
        ));
        let e = check_frame(&frame_with_body(0, 2, CODEC_ZSTD, &streamed)).unwrap_err();
        assert!(e.contains("content size"), "{e}");
    }
}

#[cfg(test)]
mod prop_tests {
    use super::test_support::alloc::largest;
    use super::test_support::*;
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    /// A record: key absent, empty or not; attributes mostly absent, else absent, empty
    /// (stored as none) or not.
    fn record() -> impl Strategy<Value = NewRecord> {
        (
            proptest::option::of(vec(any::<u8>(), 0..48)),
            vec(any::<u8>(), 0..256),
            prop_oneof![
                2 => Just(None),
                1 => proptest::option::of(vec(any::<u8>(), 0..64)),
            ],
        )
            .prop_map(|(key, payload, attrs)| NewRecord {
                key: key.map(Bytes::from),
                payload: Bytes::from(payload),
                attrs: attrs.map(Bytes::from),
            })
    }

    /// A record area and a count for it: length fields that mostly, not always, match the
    /// bytes behind them, and a count that mostly matches the records. With `attrs`, record
    /// headers of 12 bytes (the layout of a frame with [`FLAG_ATTRS`]).
    fn loose_records(attrs: bool) -> impl Strategy<Value = (u32, Vec<u8>)> {
        let alen = if attrs { 0..12u32 } else { 0..1u32 };
        vec(
            (
                prop_oneof![Just(NO_KEY), 0..12u32],
                0..12u32,
                alen,
                prop_oneof![3 => Just(0i32), 1 => -3..4i32],
            ),
            1..6,
        )
        .prop_flat_map(|recs| {
            let n = recs.len() as u32;
            let bytes: Vec<_> = recs
                .into_iter()
                .map(|(klen, plen, alen, fudge)| {
                    let want = if klen == NO_KEY { 0 } else { klen } + plen + alen;
                    let len = (want as i32 + fudge).max(0) as usize;
                    (Just(klen), Just(plen), Just(alen), vec(any::<u8>(), len))
                })
                .collect();
            (prop_oneof![3 => Just(n), 1 => any::<u32>()], bytes)
        })
        .prop_map(move |(count, recs)| {
            let mut b = Vec::new();
            for (klen, plen, alen, data) in recs {
                b.extend_from_slice(&klen.to_le_bytes());
                b.extend_from_slice(&plen.to_le_bytes());
                if attrs {
                    b.extend_from_slice(&alen.to_le_bytes());
                }
                b.extend_from_slice(&data);
            }
            (count, b)
        })
    }

    /// Loose record areas of either layout.
    fn loose_records_any() -> impl Strategy<Value = (u32, Vec<u8>)> {
        prop_oneof![loose_records(false), loose_records(true)]
    }

    fn check_header_invariants(h: &FrameHeader) {
        let len = h.len as usize;
        assert!((FRAME_HEADER_LEN + RECORD_HEADER_LEN..=MAX_FRAME_LEN).contains(&len));
        assert!(h.count >= 1);
        if h.codec() == CODEC_ZSTD {
            assert!(h.count as usize <= FRAME_MAX_RECORDS);
        } else {
            assert!(h.count as usize <= (len - FRAME_HEADER_LEN) / h.record_header_len());
        }
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
                prop_assert_eq!(&got.attrs, &stored_attrs(r));
                prop_assert_eq!(f.record_size(off), data_len(r));
            }
            prop_assert!(!f.contains(base + recs.len() as u64));
            prop_assert_eq!(f.header.has_attrs(), recs.iter().any(has_attrs));
        }

        /// The writer lays frames out as documented (with and without attributes), and
        /// [`FrameLen`] says exactly how long they are, record by record.
        #[test]
        fn prop_frame_encoding_is_the_documented_layout(
            base in 0..=u64::MAX - 64,
            ts in any::<u64>(),
            attested in any::<u64>(),
            recs in vec(record(), 1..=FRAME_MAX_RECORDS),
            strip in any::<bool>(),
        ) {
            let mut recs = recs;
            if strip {
                recs.iter_mut().for_each(|r| r.attrs = None);
            }
            let mut buf = Vec::new();
            encode_frame(&mut buf, base, ts, attested, &recs);
            prop_assert_eq!(&buf, &documented_frame(base, ts, attested, &recs));
            prop_assert_eq!(buf[13] & FLAG_ATTRS != 0, recs.iter().any(has_attrs));
            let mut len = FrameLen::default();
            for (i, r) in recs.iter().enumerate() {
                len = len.with(r);
                let mut part = Vec::new();
                encode_frame(&mut part, base, ts, attested, &recs[..=i]);
                prop_assert_eq!(len.bytes(), part.len());
            }
            prop_assert_eq!(len.bytes(), buf.len());
        }

        /// Arbitrary bytes after a header with flag bit 3 (codec 0 or 1, other flags
        /// sometimes too), CRC resealed or not: decoding never panics and agrees with
        /// `check_frame`.
        #[test]
        fn prop_frame_arbitrary_bytes_with_the_attrs_flag_never_panic(
            b in vec(any::<u8>(), FRAME_HEADER_LEN..FRAME_HEADER_LEN + 160),
            flags in prop_oneof![
                Just(FLAG_ATTRS),
                Just(FLAG_ATTRS | CODEC_ZSTD),
                any::<u8>().prop_map(|f| f | FLAG_ATTRS),
            ],
            count in prop_oneof![1..8u32, any::<u32>()],
            len_ok in any::<bool>(),
            seal in any::<bool>(),
        ) {
            let mut b = b;
            b[..4].copy_from_slice(&FRAME_MAGIC);
            b[12] = FRAME_VERSION;
            b[13] = flags;
            b[24..28].copy_from_slice(&count.to_le_bytes());
            if len_ok {
                let n = b.len() as u32;
                b[4..8].copy_from_slice(&n.to_le_bytes());
            }
            if seal {
                reseal(&mut b);
            }
            if let Ok(h) = parse_header(&b) {
                check_header_invariants(&h);
            }
            let res = DecodedFrame::decode(Bytes::from(b.clone()));
            prop_assert_eq!(check_frame(&b).is_ok(), res.is_ok());
            if let Ok(f) = res {
                prop_assert!(f.header.has_attrs());
                for o in f.base_offset()..f.end_offset() {
                    let r = f.record(o);
                    prop_assert!(r.attrs.as_ref().is_none_or(|a| !a.is_empty()));
                }
            }
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
            attrs in any::<bool>(),
        ) {
            let flags = if attrs { FLAG_ATTRS } else { 0 };
            let header_len = record_header_len(attrs);
            let mut b = frame_with_body(base, count, flags, &rest);
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
                            || count as usize > (len - FRAME_HEADER_LEN) / header_len
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
                loose_records(false),
                loose_records(true),
            ],
            flags in prop_oneof![3 => Just(0u8), 3 => Just(FLAG_ATTRS), 1 => any::<u8>()],
        ) {
            let b = frame_with_body(base, count, flags, &body);
            let total = b.len();
            if let Ok(f) = DecodedFrame::decode(Bytes::from(b)) {
                check_header_invariants(&f.header);
                prop_assert_eq!(f.header.len as usize, total);
                // (A codec-1 frame decoding here would need a valid zstd frame in random
                // bytes; its section is the decompressed one.)
                let header_len = f.header.record_header_len();
                let (stored, max_recs) = if f.header.codec() == CODEC_NONE {
                    (total, (total - FRAME_HEADER_LEN) / header_len)
                } else {
                    (FRAME_HEADER_LEN + f.buf.len(), FRAME_MAX_RECORDS)
                };
                prop_assert!(f.recs.capacity() <= max_recs);
                let mut sum = FRAME_HEADER_LEN;
                for off in f.base_offset()..f.end_offset() {
                    let r = f.record(off);
                    prop_assert!(r.attrs.is_none() || f.header.has_attrs());
                    sum += header_len
                        + r.key.as_ref().map_or(0, |k| k.len())
                        + r.payload.len()
                        + r.attrs.as_ref().map_or(0, |a| a.len());
                }
                prop_assert_eq!(sum, stored);
            }
        }

        /// Codec-1 frames (valid CRC) over arbitrary sections: garbage, hand-made zstd
        /// frames announcing any content size, and real zstd frames of loose record
        /// sections (either layout), damaged or not, with or without flag bit 3. Decoding
        /// never panics, never allocates beyond the bound, agrees with `check_frame`, and
        /// what decodes is exactly `count` records.
        #[test]
        fn prop_frame_zstd_arbitrary_sections(
            (count, body) in prop_oneof![
                (prop_oneof![1..=64u32, any::<u32>()], vec(any::<u8>(), 0..200)),
                (
                    1..=64u32,
                    prop_oneof![
                        any::<u64>(),
                        (MAX_RECORDS_SECTION as u64 - 2)..(MAX_RECORDS_SECTION as u64 + 2),
                        0..600u64,
                    ],
                    vec(any::<u8>(), 0..300),
                )
                    .prop_map(|(count, size, content)| (count, raw_zstd_frame(size, &content))),
                (
                    loose_records_any(),
                    proptest::option::of((any::<prop::sample::Index>(), 0..8u8)),
                    1..4i32,
                )
                    .prop_map(|((count, section), flip, level)| {
                        let mut z = zstd::bulk::compress(&section, level).unwrap();
                        if let Some((at, bit)) = flip {
                            let at = at.index(z.len());
                            z[at] ^= 1 << bit;
                        }
                        (count, z)
                    }),
            ],
            base in 0..1000u64,
            attrs in any::<bool>(),
        ) {
            let flags = CODEC_ZSTD | if attrs { FLAG_ATTRS } else { 0 };
            let b = frame_with_body(base, count, flags, &body);
            let (res, big) = largest(|| DecodedFrame::decode(Bytes::from(b.clone())));
            prop_assert!(big <= MAX_RECORDS_SECTION, "allocated {}", big);
            prop_assert_eq!(check_frame(&b).is_ok(), res.is_ok());
            if let Ok(f) = res {
                check_header_invariants(&f.header);
                prop_assert_eq!(f.header.count, count);
                prop_assert!(f.recs.capacity() <= FRAME_MAX_RECORDS);
                let n: usize = (f.base_offset()..f.end_offset())
                    .map(|o| f.record_size(o) + f.header.record_header_len())
                    .sum();
                prop_assert_eq!(n, f.buf.len());
                prop_assert_eq!(
                    zstd::bulk::decompress(&body, MAX_RECORDS_SECTION).unwrap(),
                    f.buf.to_vec()
                );
            }
        }

        /// Records encoded with zstd at any level read back as written, compressed or not.
        #[test]
        fn prop_frame_zstd_roundtrip(
            base in 0..=u64::MAX - 64,
            recs in vec(record(), 1..=FRAME_MAX_RECORDS),
            level in prop_oneof![Just(1), Just(3), Just(7), Just(19)],
        ) {
            let mut buf = Vec::new();
            encode_frame_zstd(&mut buf, base, 5, 4, &recs, level);
            let mut plain = Vec::new();
            encode_frame(&mut plain, base, 5, 4, &recs);
            prop_assert!(buf.len() <= plain.len());
            if buf.len() == plain.len() {
                prop_assert_eq!(&buf, &plain);
            }
            let f = DecodedFrame::decode(Bytes::from(buf)).unwrap();
            prop_assert_eq!(f.header.codec() == CODEC_ZSTD, f.header.len as usize != plain.len());
            // Compressing keeps the attributes flag.
            prop_assert_eq!(f.header.has_attrs(), plain[13] & FLAG_ATTRS != 0);
            for (i, r) in recs.iter().enumerate() {
                let got = f.record(base + i as u64);
                prop_assert_eq!(&got.key, &r.key);
                prop_assert_eq!(&got.payload, &r.payload);
                prop_assert_eq!(&got.attrs, &stored_attrs(r));
            }
        }

        #[test]
        fn prop_frame_parse_records_never_panics(
            count in any::<u32>(),
            b in vec(any::<u8>(), FRAME_HEADER_LEN..FRAME_HEADER_LEN + 128),
            attrs in any::<bool>(),
        ) {
            let mut out = Vec::new();
            if parse_records(&b, FRAME_HEADER_LEN, count, attrs, Some(&mut out)).is_ok() {
                prop_assert_eq!(out.len() as u64, count as u64);
            }
            prop_assert!(out.len() <= (b.len() - FRAME_HEADER_LEN) / record_header_len(attrs));
            for r in &out {
                let key_end = r.key_start as usize
                    + if r.key_len == NO_KEY { 0 } else { r.key_len as usize };
                prop_assert!(key_end <= b.len());
                prop_assert!(r.payload_start as usize + r.payload_len as usize <= b.len());
                prop_assert!(r.attrs_start() + r.attrs_len as usize <= b.len());
                prop_assert!(attrs || r.attrs_len == 0);
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
