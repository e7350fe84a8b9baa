//! Opening a log directory: listing segments, trusting or rebuilding sealed indexes, and
//! recovering the active segment (torn tail vs corruption).
//!
//! Invariants the writer keeps, which recovery relies on:
//! - every segment but the last was fsynced (data and sealed index) before the next one was
//!   created, so a torn write can only be in the last segment;
//! - every frame carries the high watermark of the log when it was written, so a frame
//!   written after a commit attests that everything the commit covered was fsynced;
//! - the index header of the active segment is rewritten after every successful commit of
//!   more than one frame, or that started a segment (and at least every 50 ms after others),
//!   so (once it reaches the disk) its end offset says "everything below was fsynced" where
//!   no later frame could say it: for the first frames of a multi-frame commit. (Of a
//!   one-frame commit, a later frame is the only evidence that could follow it.)
//!
//! In the last segment, zeros from the first invalid position to the end of the file are the
//! space written ahead of the frames (`LogConfig::preallocate`), or a write of which nothing
//! reached the disk: cut without a warning. Otherwise, at the first invalid frame (bad
//! header, length past the end, CRC mismatch, offset discontinuity) recovery looks for any later valid frame with a plausible
//! offset (>= the expected one). If there is one and there is evidence that the damaged
//! offsets had been committed (index header end offset, or a later frame's attested high
//! watermark, beyond the damaged offset), this is corruption before valid data: `Corrupt`,
//! nothing is changed. Otherwise it is a torn tail (possibly a multi-page write of which
//! later pages reached the disk first; nothing in it had been committed): the file is
//! truncated at the start of the bad frame and fsynced, with a warning.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::checked_u64::Stored;
use crate::error::{io_err, Result, StorageError};
use crate::index::{self, IndexEntry};
use crate::segment::{
    index_file_name, log_file_name, probe, resync, zeros_to_end, ChunkReader, Probe, Segment,
    READ_CHUNK, SCAN_CHUNK,
};
use crate::LogConfig;

pub(crate) struct Recovered {
    pub segments: Vec<Arc<Segment>>,
    pub next_offset: u64,
    pub last_ts: u64,
}

pub(crate) use crate::dirs::sync_dir;

fn parse_base(name: &str, ext: &str) -> Option<u64> {
    let stem = name.strip_suffix(ext)?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Lists the segment bases present in `dir` (and removes orphan index files).
pub(crate) fn list_segments(dir: &Path, remove_orphans: bool) -> Result<Vec<u64>> {
    let mut logs = BTreeSet::new();
    let mut indexes = Vec::new();
    for ent in fs::read_dir(dir).map_err(io_err(dir))? {
        let ent = ent.map_err(io_err(dir))?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(b) = parse_base(name, ".log") {
            logs.insert(b);
        } else if let Some(b) = parse_base(name, ".index") {
            indexes.push(b);
        }
    }
    if remove_orphans {
        for b in indexes.into_iter().filter(|b| !logs.contains(b)) {
            let p = dir.join(index_file_name(b));
            tracing::warn!(path = %p.display(), "removing an index file without its segment");
            fs::remove_file(&p).map_err(io_err(&p))?;
        }
    }
    Ok(logs.into_iter().collect())
}

/// The file in a log directory that holds the log's start: the base offset of its oldest
/// segment, written (whole, synced) by retention before it deletes the segments below it.
pub(crate) const START_FILE: &str = "log-start";

/// The log's persisted start, if retention has written one ([`START_FILE`]). A damaged or
/// unreadable file counts as none, loudly: every segment present is then opened, as before
/// the file existed.
pub(crate) fn log_start(dir: &Path) -> Option<u64> {
    let path = dir.join(START_FILE);
    match crate::checked_u64::read(&path) {
        Ok(Stored::Value(v)) => Some(v),
        Ok(Stored::Missing) => None,
        Ok(Stored::Damaged(why)) => {
            tracing::warn!(path = %path.display(), why, "log start file damaged; opening every segment");
            None
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "log start file unreadable; opening every segment");
            None
        }
    }
}

/// Removes, unread, the segments below the log's persisted start: retention deleted them
/// already, and after a power loss (on a file system without a journal an unlink reaches
/// the disk only with its directory) such a file can come back, over blocks that other files
/// rewrote since. `Corrupt` if no segment at or above the start is left.
fn drop_below_start(dir: &Path, bases: Vec<u64>) -> Result<Vec<u64>> {
    let Some(start) = log_start(dir) else {
        return Ok(bases);
    };
    let (below, kept): (Vec<u64>, Vec<u64>) = bases.into_iter().partition(|&b| b < start);
    if below.is_empty() {
        return Ok(kept);
    }
    if kept.is_empty() {
        return Err(StorageError::Corrupt {
            path: dir.join(START_FILE),
            position: 0,
            reason: format!(
                "the log starts at offset {start}, but only segments below it are left ({below:?})"
            ),
        });
    }
    for b in below {
        for p in [dir.join(log_file_name(b)), dir.join(index_file_name(b))] {
            match fs::remove_file(&p) {
                Ok(()) => tracing::warn!(path = %p.display(), start,
                    "segment below the log start came back; removed unread"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&p)(e)),
            }
        }
    }
    sync_dir(dir).map_err(io_err(dir))?;
    Ok(kept)
}

pub(crate) fn recover(dir: &Path, cfg: &LogConfig) -> Result<Recovered> {
    if !dir.is_dir() {
        crate::dirs::create_dir_all_durable(dir).map_err(io_err(dir))?;
    }
    let bases = drop_below_start(dir, list_segments(dir, true)?)?;
    if bases.is_empty() {
        let seg = Segment::create(dir, 0).map_err(io_err(&dir.join(log_file_name(0))))?;
        sync_dir(dir).map_err(io_err(dir))?;
        return Ok(Recovered {
            segments: vec![Arc::new(seg)],
            next_offset: 0,
            last_ts: 0,
        });
    }
    let mut segments = Vec::with_capacity(bases.len());
    for w in bases.windows(2) {
        segments.push(Arc::new(open_sealed(dir, w[0], w[1], cfg)?));
    }
    let active = Arc::new(recover_active(dir, *bases.last().unwrap(), cfg)?);
    let next_offset = active.end_offset.load(Ordering::Acquire);
    segments.push(active);
    let last_ts = segments
        .iter()
        .rev()
        .map(|s| s.max_ts.load(Ordering::Acquire))
        .find(|&t| t > 0)
        .unwrap_or(0);
    Ok(Recovered {
        segments,
        next_offset,
        last_ts,
    })
}

fn open_rw(path: &Path) -> Result<(Arc<File>, u64)> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(path))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    Ok((Arc::new(f), len))
}

fn install(seg: &Segment, file: Arc<File>, entries: Vec<IndexEntry>) {
    seg.w.lock().last_index_pos = entries.last().map_or(0, |e| e.pos as u64);
    *seg.index.write() = entries;
    seg.set_file(file);
}

/// A sealed segment: trust its index when complete and consistent, else rebuild it by a full
/// scan that steps over damaged frames (they stay unreadable; nothing is repaired).
fn open_sealed(dir: &Path, base: u64, next_base: u64, cfg: &LogConfig) -> Result<Segment> {
    let seg = Segment::new(dir, base);
    let (file, len) = open_rw(&seg.log_path)?;
    // small reads for the spot check of a trusted index; large ones for a rebuild scan
    let mut rd = ChunkReader::new(file.clone(), len, READ_CHUNK);
    let why = match fs::read(&seg.index_path) {
        Err(e) => format!("index unreadable: {e}"),
        Ok(bytes) => match index::parse_file(&bytes, base) {
            Err(e) => e,
            Ok(p) if !p.clean || !p.header.sealed => "index not complete".to_string(),
            Ok(p) if p.header.data_size != len => {
                format!("index says {} bytes, file has {len}", p.header.data_size)
            }
            Ok(p) if p.header.end_offset != next_base => {
                format!(
                    "index says end offset {}, next segment starts at {next_base}",
                    p.header.end_offset
                )
            }
            Ok(p) => {
                let (pos, want) = p
                    .entries
                    .last()
                    .map_or((0, base), |e| (e.pos as u64, base + e.rel as u64));
                let spot_ok = len == 0
                    || matches!(probe(&mut rd, pos).map_err(io_err(&seg.log_path))?,
                    Probe::Valid(h) if h.base_offset == want);
                if spot_ok {
                    seg.size.store(len, Ordering::Release);
                    seg.allocated.store(len, Ordering::Release);
                    seg.readable.store(len, Ordering::Release);
                    seg.end_offset.store(next_base, Ordering::Release);
                    seg.first_ts.store(p.header.first_ts, Ordering::Release);
                    seg.max_ts.store(p.header.max_ts, Ordering::Release);
                    seg.sealed.store(true, Ordering::Release);
                    seg.w.lock().persisted_entries = p.entries.len();
                    install(&seg, file, p.entries);
                    return Ok(seg);
                }
                "last index entry does not point at its frame".to_string()
            }
        },
    };
    tracing::info!(path = %seg.index_path.display(), reason = %why, "rebuilding the index of a sealed segment");

    let path = seg.log_path.clone();
    rd.set_chunk(SCAN_CHUNK);
    let interval = cfg.index_interval_bytes.max(1) as u64;
    let (mut pos, mut expected) = (0u64, base);
    let (mut first_ts, mut max_ts, mut last_index_pos) = (0u64, 0u64, 0u64);
    let mut entries = Vec::new();
    while pos < len {
        let reason = match probe(&mut rd, pos).map_err(io_err(&path))? {
            Probe::Valid(h) if h.base_offset == expected => {
                if pos > 0 && pos - last_index_pos >= interval {
                    entries.push(IndexEntry {
                        rel: (expected - base) as u32,
                        pos: pos as u32,
                    });
                    last_index_pos = pos;
                }
                if first_ts == 0 {
                    first_ts = h.timestamp_ms;
                }
                max_ts = max_ts.max(h.timestamp_ms);
                pos += h.len as u64;
                expected = h.end_offset();
                continue;
            }
            Probe::Valid(h) => format!(
                "offset discontinuity: expected {expected}, frame says {}",
                h.base_offset
            ),
            Probe::Invalid(r) => r,
        };
        match resync(&mut rd, pos, pos, expected).map_err(io_err(&path))? {
            Some((q, h)) => {
                tracing::error!(path = %path.display(), position = pos, resumes_at = q, offset = expected,
                    next_valid_offset = h.base_offset, %reason,
                    "corrupt frame in a sealed segment; its records are unreadable");
                if q > 0 {
                    entries.push(IndexEntry {
                        rel: (h.base_offset - base) as u32,
                        pos: q as u32,
                    });
                    last_index_pos = q;
                }
                pos = q;
                expected = h.base_offset;
            }
            None => {
                tracing::error!(path = %path.display(), position = pos, offset = expected, unreadable_bytes = len - pos,
                    %reason, "corrupt tail in a sealed segment; its records are unreadable");
                break;
            }
        }
    }
    if expected > next_base {
        return Err(StorageError::Corrupt {
            path,
            position: pos,
            reason: format!(
                "segment holds offsets up to {expected}, past the next segment's base {next_base}"
            ),
        });
    }
    if expected < next_base {
        tracing::error!(path = %path.display(), from = expected, to = next_base,
            "offsets missing at the end of a sealed segment; they are unreadable");
    }
    seg.size.store(len, Ordering::Release);
    seg.allocated.store(len, Ordering::Release);
    seg.readable.store(len, Ordering::Release);
    seg.end_offset.store(next_base, Ordering::Release);
    seg.first_ts.store(first_ts, Ordering::Release);
    seg.max_ts.store(max_ts, Ordering::Release);
    seg.sealed.store(true, Ordering::Release);
    install(&seg, file, entries);
    let mut w = seg.w.lock();
    if let Err(e) = seg.persist_index(&mut w, true, true) {
        tracing::warn!(path = %seg.index_path.display(), error = %e, "cannot write a rebuilt index");
    }
    drop(w);
    Ok(seg)
}

/// Frames after a damaged position: the first plausible one (offset >= `expected`) and the
/// highest committed offset any of them attests.
fn later_frames(
    rd: &mut ChunkReader,
    from: u64,
    expected: u64,
) -> io::Result<(Option<(u64, u64)>, u64)> {
    let (mut first, mut attested) = (None, 0u64);
    let mut p = from;
    while let Some((q, h)) = resync(rd, p, from, expected)? {
        first.get_or_insert((q, h.base_offset));
        attested = attested.max(h.attested_committed);
        p = q + h.len as u64;
    }
    Ok((first, attested))
}

/// The last segment: scan from the last trusted index point to the end; truncate a torn
/// tail, fail on corruption before valid data.
fn recover_active(dir: &Path, base: u64, cfg: &LogConfig) -> Result<Segment> {
    let seg = Segment::new(dir, base);
    let path = seg.log_path.clone();
    let (file, mut len) = open_rw(&path)?;
    let mut rd = ChunkReader::new(file.clone(), len, SCAN_CHUNK);
    let parsed = fs::read(&seg.index_path)
        .ok()
        .and_then(|b| index::parse_file(&b, base).ok());
    // Offsets below `marker` were fsynced (and, unless sealed by a time roll, verified).
    let marker = parsed.as_ref().map_or(base, |p| p.header.end_offset);
    let mut entries: Vec<IndexEntry> = parsed.map(|p| p.entries).unwrap_or_default();
    entries.retain(|e| (e.pos as u64) < len);

    let (mut pos, mut expected) = (0u64, base);
    let mut tries = 0;
    while let Some(e) = entries.last().copied() {
        tries += 1;
        let ok = tries <= 8
            && matches!(probe(&mut rd, e.pos as u64).map_err(io_err(&path))?,
                Probe::Valid(h) if h.base_offset == base + e.rel as u64);
        if ok {
            pos = e.pos as u64;
            expected = base + e.rel as u64;
            break;
        }
        if tries > 8 {
            entries.clear();
        } else {
            entries.pop();
        }
    }
    let mut first_ts = 0;
    if pos > 0 {
        if let Probe::Valid(h) = probe(&mut rd, 0).map_err(io_err(&path))? {
            first_ts = h.timestamp_ms;
        }
    }
    let mut max_ts = 0;
    let interval = cfg.index_interval_bytes.max(1) as u64;
    let mut last_index_pos = pos;
    while pos < len {
        let reason = match probe(&mut rd, pos).map_err(io_err(&path))? {
            Probe::Valid(h) if h.base_offset == expected => {
                if pos > 0 && pos - last_index_pos >= interval {
                    entries.push(IndexEntry {
                        rel: (expected - base) as u32,
                        pos: pos as u32,
                    });
                    last_index_pos = pos;
                }
                if first_ts == 0 {
                    first_ts = h.timestamp_ms;
                }
                max_ts = max_ts.max(h.timestamp_ms);
                pos += h.len as u64;
                expected = h.end_offset();
                continue;
            }
            Probe::Valid(h) => format!(
                "offset discontinuity: expected {expected}, frame says {}",
                h.base_offset
            ),
            Probe::Invalid(r) => r,
        };
        if zeros_to_end(&mut rd, pos).map_err(io_err(&path))? {
            // The zeros written ahead of the frames (`preallocate`), or a write of which
            // nothing reached the disk: cut quietly (appends preallocate again).
            tracing::debug!(path = %path.display(), position = pos, bytes = len - pos,
                "cutting the zeros after the last frame");
            file.set_len(pos).map_err(io_err(&path))?;
            file.sync_all().map_err(io_err(&path))?;
            len = pos;
            break;
        }
        let (first_later, attested) =
            later_frames(&mut rd, pos, expected).map_err(io_err(&path))?;
        if let Some((q, later_offset)) = first_later {
            let committed = marker.max(attested);
            if committed > expected {
                tracing::error!(path = %path.display(), position = pos, offset = expected, %reason,
                    valid_frame_at = q, valid_offset = later_offset, committed_up_to = committed,
                    "corruption before valid data; refusing to open the log");
                return Err(StorageError::Corrupt {
                    path,
                    position: pos,
                    reason: format!(
                        "{reason} (offset {expected}); a valid frame with offset {later_offset} follows at byte {q} \
                         and offsets up to {committed} had been committed"
                    ),
                });
            }
            tracing::warn!(path = %path.display(), position = pos, valid_frame_at = q,
                "torn unsynced write: valid frames of the same uncommitted write follow the damage; dropping them");
        }
        tracing::warn!(path = %path.display(), position = pos, dropped_bytes = len - pos, offset = expected, %reason,
            "truncating a torn tail");
        file.set_len(pos).map_err(io_err(&path))?;
        file.sync_all().map_err(io_err(&path))?;
        len = pos;
        break;
    }
    if marker > expected {
        tracing::error!(path = %path.display(), from = expected, to = marker,
            "records that had been committed are missing from the end of the log (lost by the disk?)");
    }
    seg.size.store(len, Ordering::Release);
    seg.allocated.store(len, Ordering::Release);
    seg.readable.store(len, Ordering::Release);
    seg.end_offset.store(expected, Ordering::Release);
    seg.first_ts.store(first_ts, Ordering::Release);
    seg.max_ts.store(
        max_ts.max(if expected > base { first_ts } else { 0 }),
        Ordering::Release,
    );
    install(&seg, file, entries);
    let mut w = seg.w.lock();
    if let Err(e) = seg.persist_index(&mut w, true, false) {
        tracing::warn!(path = %seg.index_path.display(), error = %e, "cannot write the index");
    }
    drop(w);
    Ok(seg)
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn prop_parse_base_roundtrip(base in any::<u64>()) {
            prop_assert_eq!(parse_base(&log_file_name(base), ".log"), Some(base));
            prop_assert_eq!(parse_base(&index_file_name(base), ".index"), Some(base));
            prop_assert_eq!(parse_base(&log_file_name(base), ".index"), None);
        }

        /// Only the exact 20-digit name of a base is accepted: no sign, no short or long
        /// forms, nothing past `u64::MAX`.
        #[test]
        fn prop_parse_base_accepts_only_canonical_names(
            name in prop_oneof![
                any::<String>(),
                "[+-]?[0-9]{18,22}\\.(log|index)",
                "[0-9 ]{20}\\.log",
            ],
        ) {
            for ext in [".log", ".index"] {
                if let Some(b) = parse_base(&name, ext) {
                    prop_assert_eq!(&name, &format!("{b:020}{ext}"));
                }
            }
        }
    }
}
