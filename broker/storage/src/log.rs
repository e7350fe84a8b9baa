//! `PartitionLog`: the writer path (append, commit with read-back verification, rolls,
//! rollback), the reader path (index lookup, frame cache) and retention.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use crate::error::{io_err, Result, StorageError};
use crate::frame::{
    encode_frame, encode_frame_zstd, DecodedFrame, FrameLen, FRAME_HEADER_LEN, FRAME_MAX_RECORDS,
    FRAME_TARGET_BYTES, MAX_ATTRS_BYTES, MAX_RECORD_BYTES,
};
use crate::recovery::{self, sync_dir};
use crate::segment::{
    drop_cache, log_file_name, probe, ChunkReader, Cursor, Entry, Probe, Segment, SCAN_CHUNK,
};
use crate::{Codec, LogConfig, LogStats, NewRecord, RetentionOutcome, SegmentFile, StoredRecord};

/// Decoded frames (or damaged ranges) kept for readers: the last ones read, or committed.
const CACHE_ENTRIES: usize = 4;
/// Segments never grow past this (index positions are u32; one frame may overshoot).
const MAX_SEGMENT_BYTES: u64 = 1 << 31;
const PAGE: u64 = 4096;
/// Most time the active segment's index header (end offset, sparse entries) lags the
/// high watermark after single-frame commits; recovery scans from the last entry written.
const INDEX_REFRESH: Duration = Duration::from_millis(50);

/// The committed state the writer rolls back to when an append or a commit fails.
#[derive(Debug, Clone, Copy)]
struct Checkpoint {
    seg_base: u64,
    pos: u64,
    first_ts: u64,
    max_ts: u64,
    index_len: usize,
    last_index_pos: u64,
}

impl Checkpoint {
    fn of(seg: &Segment) -> Checkpoint {
        Checkpoint {
            seg_base: seg.base,
            pos: seg.size.load(Ordering::Acquire),
            first_ts: seg.first_ts.load(Ordering::Acquire),
            max_ts: seg.max_ts.load(Ordering::Acquire),
            index_len: seg.index.read().len(),
            last_index_pos: seg.w.lock().last_index_pos,
        }
    }
}

struct Writer {
    last_ts: u64,
    /// Frames written since the last commit (or a roll made since then).
    pending: bool,
    /// Set when a failed write could not be rolled back: writes fail until reopened.
    poisoned: Option<String>,
    ckpt: Checkpoint,
    /// When, and for which segment (base), the index header was last written after a
    /// commit.
    index_written: Option<(Instant, u64)>,
    /// A commit since then did not write it (written at close and drop).
    index_stale: bool,
    /// The file system refused `O_DIRECT`: verification drops the range from the page cache
    /// and re-reads it instead.
    no_direct_io: bool,
}

/// One partition's log.
pub struct PartitionLog {
    dir: PathBuf,
    cfg: LogConfig,
    /// Sorted by base offset; the last one is the active segment.
    segments: RwLock<Vec<Arc<Segment>>>,
    hwm: AtomicU64,
    next: AtomicU64,
    oldest: AtomicU64,
    writer: Mutex<Writer>,
    cache: Mutex<VecDeque<Entry>>,
    /// Frame lookups that went to the file (cache misses).
    loads: AtomicU64,
}

impl PartitionLog {
    /// Opens (creating if missing) the log in `dir`; recovers: truncates a torn tail of the
    /// active segment, rebuilds a missing or bad index, fails with `Corrupt` on corruption
    /// that is followed by valid data. After open, high_watermark == next_offset.
    pub fn open(dir: &Path, cfg: LogConfig) -> Result<Self> {
        let rec = recovery::recover(dir, &cfg)?;
        let ckpt = Checkpoint::of(rec.segments.last().expect("at least one segment"));
        let oldest = rec.segments[0].base;
        tracing::debug!(dir = %dir.display(), segments = rec.segments.len(), oldest, next_offset = rec.next_offset,
            "partition log opened");
        Ok(PartitionLog {
            dir: dir.to_path_buf(),
            cfg,
            segments: RwLock::new(rec.segments),
            hwm: AtomicU64::new(rec.next_offset),
            next: AtomicU64::new(rec.next_offset),
            oldest: AtomicU64::new(oldest),
            writer: Mutex::new(Writer {
                last_ts: rec.last_ts,
                pending: false,
                poisoned: None,
                ckpt,
                index_written: None,
                index_stale: false,
                no_direct_io: false,
            }),
            cache: Mutex::new(VecDeque::with_capacity(CACHE_ENTRIES)),
            loads: AtomicU64::new(0),
        })
    }

    /// The directory of this log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn active(&self) -> Arc<Segment> {
        self.segments
            .read()
            .last()
            .expect("at least one segment")
            .clone()
    }

    fn check_poisoned(&self, w: &Writer) -> Result<()> {
        match &w.poisoned {
            None => Ok(()),
            Some(why) => Err(StorageError::Io {
                path: self.dir.clone(),
                source: io::Error::other(format!(
                    "log unusable after a failed rollback ({why}); reopen it"
                )),
            }),
        }
    }

    /// Writes the records as new frames (not yet durable, not yet visible).
    /// Timestamps are `max(now_ms, last timestamp)`. Returns the offsets assigned.
    /// `TooLarge` (nothing written) if a record's key + payload exceed [`MAX_RECORD_BYTES`]
    /// or its attributes [`MAX_ATTRS_BYTES`]: together the bounds keep every frame within
    /// the largest one a reader accepts.
    pub fn append(&self, records: &[NewRecord], now_ms: u64) -> Result<Range<u64>> {
        for r in records {
            let size = r.key.as_ref().map_or(0, |k| k.len()) + r.payload.len();
            if size > MAX_RECORD_BYTES {
                return Err(StorageError::TooLarge { size });
            }
            let size = r.attrs.as_ref().map_or(0, |a| a.len());
            if size > MAX_ATTRS_BYTES {
                return Err(StorageError::TooLarge { size });
            }
        }
        let mut w = self.writer.lock();
        self.check_poisoned(&w)?;
        let start = self.next.load(Ordering::Acquire);
        if records.is_empty() {
            return Ok(start..start);
        }
        let ts = now_ms.max(w.last_ts);
        w.pending = true;
        match self.write_frames(&mut w, records, start, ts) {
            Ok(end) => {
                self.next.store(end, Ordering::Release);
                w.last_ts = ts;
                Ok(start..end)
            }
            Err(e) => {
                self.rollback(&mut w, &e);
                Err(e)
            }
        }
    }

    fn write_frames(
        &self,
        w: &mut Writer,
        records: &[NewRecord],
        start: u64,
        ts: u64,
    ) -> Result<u64> {
        let attested = self.hwm.load(Ordering::Acquire);
        let max = self.cfg.segment_max_bytes.clamp(1, MAX_SEGMENT_BYTES);
        // (A capacity hint: the records as one frame, whose record headers are at least as
        // wide as those of any frame they end up in, plus the headers of the fewest frames.)
        let total: usize = records
            .iter()
            .fold(FrameLen::default(), FrameLen::with)
            .bytes()
            + (records.len().div_ceil(FRAME_MAX_RECORDS) - 1) * FRAME_HEADER_LEN;
        let mut seg = self.active();
        let mut buf_start = seg.size.load(Ordering::Acquire);
        let mut buf: Vec<u8> = Vec::with_capacity(total.min(max as usize + FRAME_TARGET_BYTES));
        let (mut off, mut i) = (start, 0);
        while i < records.len() {
            let mut j = i;
            // Exact, also when a record with attributes widens the headers of the records
            // before it in the frame.
            let mut len = FrameLen::default();
            while j < records.len() && j - i < FRAME_MAX_RECORDS {
                let with = len.with(&records[j]);
                if j > i && with.bytes() > FRAME_TARGET_BYTES {
                    break;
                }
                len = with;
                j += 1;
            }
            let frame_bytes = len.bytes();
            let cur = buf_start + buf.len() as u64;
            // (`frame_bytes` is the uncompressed size: a compressed frame is no larger.)
            if cur > 0 && cur + frame_bytes as u64 > max {
                self.flush(&seg, &buf, buf_start)?;
                buf.clear();
                seg = self.roll(w, off)?;
                buf_start = 0;
            }
            let frame_pos = buf_start + buf.len() as u64;
            match self.cfg.codec {
                Codec::None => encode_frame(&mut buf, off, ts, attested, &records[i..j]),
                Codec::Zstd => encode_frame_zstd(
                    &mut buf,
                    off,
                    ts,
                    attested,
                    &records[i..j],
                    self.cfg.compression_level.zstd_level(),
                ),
            }
            debug_assert!(buf_start + buf.len() as u64 - frame_pos <= frame_bytes as u64);
            seg.note_frame(
                &mut seg.w.lock(),
                frame_pos,
                off,
                self.cfg.index_interval_bytes,
            );
            off += (j - i) as u64;
            seg.end_offset.store(off, Ordering::Release);
            if frame_pos == 0 {
                seg.first_ts.store(ts, Ordering::Release);
            }
            seg.max_ts.store(ts, Ordering::Release);
            i = j;
        }
        self.flush(&seg, &buf, buf_start)?;
        Ok(off)
    }

    fn flush(&self, seg: &Segment, buf: &[u8], at: u64) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let f = seg.file().map_err(io_err(&seg.log_path))?;
        if self.cfg.preallocate {
            seg.preallocate(&f, at + buf.len() as u64)
                .map_err(io_err(&seg.log_path))?;
        }
        f.write_all_at(buf, at).map_err(io_err(&seg.log_path))?;
        seg.size.store(at + buf.len() as u64, Ordering::Release);
        Ok(())
    }

    /// Seals the active segment (fsync data, write + fsync its complete index) and starts a
    /// new one at `new_base` (created, then the directory fsynced).
    fn roll(&self, w: &mut Writer, new_base: u64) -> Result<Arc<Segment>> {
        let old = self.active();
        old.file()
            .and_then(|f| old.cut_preallocated(&f).and_then(|_| f.sync_data()))
            .map_err(io_err(&old.log_path))?;
        old.sealed.store(true, Ordering::Release);
        old.persist_index(&mut old.w.lock(), true, true)
            .map_err(io_err(&old.index_path))?;
        let new = Arc::new(Segment::create(&self.dir, new_base).map_err(io_err(&self.dir))?);
        self.segments.write().push(new.clone());
        sync_dir(&self.dir).map_err(io_err(&self.dir))?;
        if !w.pending {
            w.ckpt = Checkpoint::of(&new);
        }
        tracing::debug!(dir = %self.dir.display(), sealed = old.base, new = new_base, "segment rolled");
        Ok(new)
    }

    /// fsyncs everything appended, re-reads the frames appended since the high watermark,
    /// checks their CRC32C, and only then advances the high watermark. Returns the new HWM.
    pub fn commit(&self) -> Result<u64> {
        let mut w = self.writer.lock();
        self.check_poisoned(&w)?;
        let hwm = self.hwm.load(Ordering::Acquire);
        let next = self.next.load(Ordering::Acquire);
        if next == hwm {
            return Ok(hwm);
        }
        match self.sync_and_verify(&mut w, hwm, next) {
            Ok((segs, frames, tail)) => {
                for s in &segs {
                    s.readable
                        .store(s.size.load(Ordering::Acquire), Ordering::Release);
                }
                let (active, sealed) = segs.split_last().expect("active segment");
                // A sealed segment is never verified again.
                sealed.iter().for_each(|s| s.close_direct());
                // The header's end offset is recovery's evidence that offsets below it were
                // committed. A commit of one frame needs none: any frame written after it
                // attests the high watermark it moved (see `recovery`). A commit of several
                // frames does (a damaged first frame followed by a valid second one of the
                // same commit is corruption, not a torn write), and so does a new segment.
                let due = frames > 1
                    || w.index_written.is_none_or(|(at, base)| {
                        base != active.base || at.elapsed() >= INDEX_REFRESH
                    });
                if due {
                    persist_active_index(active);
                    w.index_written = Some((Instant::now(), active.base));
                }
                w.index_stale = !due;
                w.ckpt = Checkpoint::of(active);
                w.pending = false;
                self.hwm.store(next, Ordering::Release);
                // Readers that keep up read what was just committed: from here, not the file.
                for f in tail {
                    self.cache_put(&Entry::Frame(Arc::new(f)));
                }
                Ok(next)
            }
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), error = %e, "commit failed; rolling back to the high watermark");
                self.rollback(&mut w, &e);
                Err(e)
            }
        }
    }

    /// The segments of the range, how many frames it holds, and its last frames (as many as
    /// the cache keeps), decoded.
    fn sync_and_verify(
        &self,
        w: &mut Writer,
        hwm: u64,
        next: u64,
    ) -> Result<(Vec<Arc<Segment>>, usize, Vec<DecodedFrame>)> {
        let segs: Vec<Arc<Segment>> = self
            .segments
            .read()
            .iter()
            .filter(|s| s.base >= w.ckpt.seg_base)
            .cloned()
            .collect();
        let last = segs.last().expect("active segment");
        // Earlier segments of the range were fsynced when they were sealed.
        last.file()
            .and_then(|f| f.sync_data())
            .map_err(io_err(&last.log_path))?;
        let mut expected = hwm;
        let mut frames = 0;
        let mut tail = Vec::new();
        for s in &segs {
            let start = if s.base == w.ckpt.seg_base {
                w.ckpt.pos
            } else {
                0
            };
            let end = s.size.load(Ordering::Acquire);
            let mut rd = self.verify_reader(w, s, start, end)?;
            let mut pos = start;
            let mut last_frames = VecDeque::with_capacity(CACHE_ENTRIES);
            while pos < end {
                let fail = |reason: String| StorageError::VerifyFailed {
                    path: s.log_path.clone(),
                    offset: expected,
                    reason,
                };
                match probe(&mut rd, pos).map_err(io_err(&s.log_path))? {
                    Probe::Valid(h) if h.base_offset == expected => {
                        if last_frames.len() == CACHE_ENTRIES {
                            last_frames.pop_front();
                        }
                        last_frames.push_back((pos, h.len as usize));
                        pos += h.len as u64;
                        expected = h.end_offset();
                        frames += 1;
                    }
                    Probe::Valid(h) => {
                        return Err(fail(format!(
                            "frame at byte {pos} has offset {}",
                            h.base_offset
                        )));
                    }
                    Probe::Invalid(r) => return Err(fail(format!("frame at byte {pos}: {r}"))),
                }
            }
            if Arc::ptr_eq(s, last) {
                tail = decoded_copies(&mut rd, &last_frames);
            }
        }
        if expected != next {
            return Err(StorageError::VerifyFailed {
                path: last.log_path.clone(),
                offset: expected,
                reason: format!("read back ends at offset {expected}, appended up to {next}"),
            });
        }
        Ok((segs, frames, tail))
    }

    /// The reader a commit verifies `[start, end)` of segment `s` with. From the device, not
    /// from the page cache, when `verify_from_device`: through `O_DIRECT` (the cached pages
    /// stay, so neither consumers nor the next append into the last page read the device
    /// again), or where the file system refuses it, after dropping the range from the cache.
    fn verify_reader(
        &self,
        w: &mut Writer,
        s: &Segment,
        start: u64,
        end: u64,
    ) -> Result<ChunkReader> {
        if self.cfg.verify_from_device && end > start && !w.no_direct_io {
            match s.direct_file() {
                Ok(f) => return Ok(ChunkReader::from_device(f, end, SCAN_CHUNK)),
                Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| {
                        tracing::warn!(dir = %self.dir.display(), error = %e,
                            "the file system refuses O_DIRECT; commits verify by dropping the page cache and re-reading")
                    });
                    w.no_direct_io = true;
                }
                Err(e) => return Err(io_err(&s.log_path)(e)),
            }
        }
        let file = s.file().map_err(io_err(&s.log_path))?;
        if self.cfg.verify_from_device && end > start {
            let from = start / PAGE * PAGE;
            drop_cache(&file, from, end.div_ceil(PAGE) * PAGE - from);
        }
        Ok(ChunkReader::new(file, end, SCAN_CHUNK))
    }

    /// Undoes everything written since the last commit: removes segments created since,
    /// truncates the checkpoint segment back and restores its state. Poisons on failure.
    fn rollback(&self, w: &mut Writer, cause: &StorageError) {
        let hwm = self.hwm.load(Ordering::Acquire);
        let ck = w.ckpt;
        let res = (|| -> Result<()> {
            let mut removed = false;
            loop {
                let last = self.active();
                if last.base <= ck.seg_base {
                    break;
                }
                self.segments.write().pop();
                last.deleted.store(true, Ordering::Release);
                last.close_files();
                for p in [&last.log_path, &last.index_path] {
                    match fs::remove_file(p) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(p)(e)),
                        _ => {}
                    }
                }
                removed = true;
            }
            if removed {
                sync_dir(&self.dir).map_err(io_err(&self.dir))?;
            }
            let seg = self.active();
            if seg.base != ck.seg_base {
                return Err(StorageError::Io {
                    path: seg.log_path.clone(),
                    source: io::Error::other("checkpoint segment missing"),
                });
            }
            let f = seg.file().map_err(io_err(&seg.log_path))?;
            f.set_len(ck.pos)
                .and_then(|_| f.sync_all())
                .map_err(io_err(&seg.log_path))?;
            seg.size.store(ck.pos, Ordering::Release);
            seg.allocated.store(ck.pos, Ordering::Release);
            seg.readable.store(ck.pos, Ordering::Release);
            seg.end_offset.store(hwm, Ordering::Release);
            seg.first_ts.store(ck.first_ts, Ordering::Release);
            seg.max_ts.store(ck.max_ts, Ordering::Release);
            seg.sealed.store(false, Ordering::Release);
            seg.index.write().truncate(ck.index_len);
            let mut sw = seg.w.lock();
            sw.last_index_pos = ck.last_index_pos;
            // synced: a sealed index written by a roll being undone must not survive
            if let Err(e) = seg.persist_index(&mut sw, true, true) {
                tracing::warn!(path = %seg.index_path.display(), error = %e, "cannot rewrite the index (rebuilt at open)");
            }
            drop(sw);
            self.next.store(hwm, Ordering::Release);
            w.pending = false;
            Ok(())
        })();
        match res {
            Ok(()) => {
                tracing::warn!(dir = %self.dir.display(), high_watermark = hwm, cause = %cause,
                "rolled back uncommitted appends")
            }
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), cause = %cause, error = %e,
                    "rollback failed; the log refuses writes until reopened");
                w.poisoned = Some(format!("{cause}; rollback: {e}"));
            }
        }
    }

    pub fn high_watermark(&self) -> u64 {
        self.hwm.load(Ordering::Acquire)
    }
    pub fn next_offset(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }
    pub fn oldest_offset(&self) -> u64 {
        self.oldest.load(Ordering::Acquire)
    }

    fn check_gone(&self, offset: u64) -> Result<()> {
        let oldest = self.oldest.load(Ordering::Acquire);
        if offset < oldest {
            return Err(StorageError::Gone { offset, oldest });
        }
        Ok(())
    }

    fn cache_get(&self, offset: u64) -> Option<Entry> {
        self.cache
            .lock()
            .iter()
            .rev()
            .find(|e| e.contains(offset))
            .cloned()
    }

    fn cache_put(&self, e: &Entry) {
        let mut c = self.cache.lock();
        if c.iter()
            .any(|x| x.start() == e.start() && x.end() == e.end())
        {
            return;
        }
        if let Entry::Corrupt { start, end, reason } = e {
            tracing::error!(dir = %self.dir.display(), from = start, to = end, %reason, "unreadable records");
        }
        if c.len() >= CACHE_ENTRIES {
            c.pop_front();
        }
        c.push_back(e.clone());
    }

    fn read_err(&self, seg: &Segment, offset: u64, e: io::Error) -> StorageError {
        if seg.deleted.load(Ordering::Acquire) {
            StorageError::Gone {
                offset,
                oldest: self.oldest.load(Ordering::Acquire),
            }
        } else {
            StorageError::Io {
                path: seg.log_path.clone(),
                source: e,
            }
        }
    }

    /// Finds the frame (or damaged range) holding `offset` (< `hwm`, >= oldest): a short lock
    /// to pick the segment, then the index, then positional reads.
    fn locate(&self, offset: u64, hwm: u64) -> Result<(Entry, Cursor)> {
        self.loads.fetch_add(1, Ordering::Relaxed);
        let seg = {
            let segs = self.segments.read();
            let i = segs.partition_point(|s| s.base <= offset);
            if i == 0 {
                return Err(StorageError::Gone {
                    offset,
                    oldest: self.oldest.load(Ordering::Acquire),
                });
            }
            segs[i - 1].clone()
        };
        let mut cur =
            Cursor::seek(seg.clone(), offset, hwm).map_err(|e| self.read_err(&seg, offset, e))?;
        loop {
            match cur
                .next_entry()
                .map_err(|e| self.read_err(&seg, offset, e))?
            {
                Some(e) if e.end() > offset => {
                    self.cache_put(&e);
                    return Ok((e, cur));
                }
                Some(_) => {}
                None => {
                    return Err(StorageError::Unreadable {
                        offset,
                        reason: format!(
                            "{}: offset not found in its segment",
                            seg.log_path.display()
                        ),
                    })
                }
            }
        }
    }

    /// Reads one committed record. `Ok(None)` at or past the high watermark;
    /// `Err(Gone)` below the oldest retained offset; `Err(Unreadable)` for a corrupt frame.
    pub fn read(&self, offset: u64) -> Result<Option<StoredRecord>> {
        let hwm = self.hwm.load(Ordering::Acquire);
        if offset >= hwm {
            return Ok(None);
        }
        self.check_gone(offset)?;
        let entry = match self.cache_get(offset) {
            Some(e) => e,
            None => self.locate(offset, hwm)?.0,
        };
        match entry {
            Entry::Frame(f) => Ok(Some(f.record(offset))),
            Entry::Corrupt { reason, .. } => Err(StorageError::Unreadable {
                offset,
                reason: reason.to_string(),
            }),
        }
    }

    /// Reads committed records from `offset` on, at most `max_records` and about `max_bytes`
    /// (at least one record if any is available). Empty at/past the high watermark.
    pub fn read_from(
        &self,
        offset: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>> {
        let hwm = self.hwm.load(Ordering::Acquire);
        if offset >= hwm || max_records == 0 {
            return Ok(Vec::new());
        }
        self.check_gone(offset)?;
        let mut out: Vec<StoredRecord> = Vec::new();
        let (mut off, mut bytes) = (offset, 0usize);
        let mut cur: Option<Cursor> = None;
        let mut last: Option<Entry> = None;
        loop {
            // The entry holding `off`: the cursor continues where the previous entry ended.
            let next = match self.cache_get(off) {
                Some(e) => {
                    cur = None;
                    Ok(e)
                }
                None => {
                    let from_cursor = match cur.as_mut() {
                        Some(c) => c.next_entry().map_err(|e| self.read_err(&c.seg, off, e))?,
                        None => None,
                    };
                    match from_cursor {
                        Some(e) if e.contains(off) => Ok(e),
                        _ => self.locate(off, hwm).map(|(e, mut c)| {
                            c.sequential();
                            cur = Some(c);
                            e
                        }),
                    }
                }
            };
            let entry = match next {
                Ok(e) => e,
                Err(e) if out.is_empty() => return Err(e),
                Err(_) => break,
            };
            match &entry {
                Entry::Frame(f) => {
                    while off < f.end_offset() && off < hwm {
                        let size = f.record_size(off);
                        if !out.is_empty() && (out.len() >= max_records || bytes + size > max_bytes)
                        {
                            break;
                        }
                        out.push(f.record(off));
                        bytes += size;
                        off += 1;
                    }
                }
                Entry::Corrupt { reason, .. } => {
                    if out.is_empty() {
                        return Err(StorageError::Unreadable {
                            offset: off,
                            reason: reason.to_string(),
                        });
                    }
                    break;
                }
            }
            let done =
                off >= hwm || out.len() >= max_records || bytes >= max_bytes || off < entry.end();
            last = Some(entry);
            if done {
                break;
            }
        }
        if let Some(e) = last {
            self.cache_put(&e);
        }
        Ok(out)
    }

    pub fn stats(&self) -> LogStats {
        let segs = self.segments.read();
        let first = &segs[0];
        LogStats {
            segments: segs.len() as u64,
            oldest_offset: self.oldest.load(Ordering::Acquire),
            next_offset: self.next.load(Ordering::Acquire),
            high_watermark: self.hwm.load(Ordering::Acquire),
            size_bytes: segs.iter().map(|s| s.size.load(Ordering::Acquire)).sum(),
            oldest_segment_last_write_ms: if first.size.load(Ordering::Acquire) > 0 {
                first.max_ts.load(Ordering::Acquire)
            } else {
                0
            },
        }
    }

    /// Seals the active segment if it is older than `segment_max_age`.
    pub fn roll_if_due(&self, now_ms: u64) -> Result<bool> {
        let mut w = self.writer.lock();
        self.check_poisoned(&w)?;
        let seg = self.active();
        if seg.size.load(Ordering::Acquire) == 0 {
            return Ok(false);
        }
        let age_ms = u64::try_from(self.cfg.segment_max_age.as_millis()).unwrap_or(u64::MAX);
        if now_ms.saturating_sub(seg.first_ts.load(Ordering::Acquire)) < age_ms {
            return Ok(false);
        }
        let next = self.next.load(Ordering::Acquire);
        match self.roll(&mut w, next) {
            Ok(_) => Ok(true),
            Err(e) => {
                self.rollback(&mut w, &e);
                Err(e)
            }
        }
    }

    /// Deletes whole sealed segments whose last write is older than `retention_ms`
    /// (0 = keep forever). Never deletes the active segment.
    pub fn enforce_retention(&self, retention_ms: u64, now_ms: u64) -> Result<RetentionOutcome> {
        let mut out = RetentionOutcome::default();
        if retention_ms == 0 || now_ms < retention_ms {
            return Ok(out);
        }
        let cutoff = now_ms - retention_ms;
        let w = self.writer.lock();
        let hwm = self.hwm.load(Ordering::Acquire);
        let victims: Vec<Arc<Segment>> = {
            let segs = self.segments.read();
            segs[..segs.len() - 1]
                .iter()
                .take_while(|s| {
                    s.base < w.ckpt.seg_base
                        && s.end_offset.load(Ordering::Acquire) <= hwm
                        && s.max_ts.load(Ordering::Acquire) < cutoff
                })
                .cloned()
                .collect()
        };
        if victims.is_empty() {
            return Ok(out);
        }
        // The new start is durable before any deletion is: a deleted segment that comes back
        // after a power loss is then removed unread at open (`recovery::drop_below_start`).
        // Should it not be written (a full disk, which retention is there to relieve), the
        // segments go anyway: one that came back would then open as damage, as it did before
        // the start was kept.
        let oldest = self.segments.read()[victims.len()].base;
        let start_path = self.dir.join(recovery::START_FILE);
        if let Err(e) = crate::checked_u64::replace(&start_path, oldest) {
            tracing::warn!(path = %start_path.display(), error = %e,
                "cannot write the log start; deleting the expired segments anyway");
        }
        {
            let mut segs = self.segments.write();
            segs.drain(..victims.len());
            self.oldest.store(oldest, Ordering::Release);
        }
        drop(w);
        self.cache.lock().retain(|e| e.start() >= oldest);
        let mut first_err = None;
        for v in &victims {
            v.deleted.store(true, Ordering::Release);
            v.close_files();
            for p in [&v.log_path, &v.index_path] {
                if let Err(e) = fs::remove_file(p) {
                    if e.kind() != io::ErrorKind::NotFound {
                        tracing::warn!(path = %p.display(), error = %e, "cannot delete an expired segment file");
                        first_err.get_or_insert(io_err(p)(e));
                    }
                }
            }
            out.segments_deleted += 1;
            out.bytes_deleted += v.size.load(Ordering::Acquire);
            out.messages_deleted += v.end_offset.load(Ordering::Acquire) - v.base;
        }
        if let Err(e) = sync_dir(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot fsync the log directory");
        }
        tracing::info!(dir = %self.dir.display(), segments = out.segments_deleted, bytes = out.bytes_deleted,
            messages = out.messages_deleted, oldest, "retention deleted segments");
        if let Some(e) = first_err {
            tracing::warn!(error = %e, "some expired segment files remain on disk");
        }
        Ok(out)
    }

    /// The segment files as a verbatim copy (a partition move) sees them: name, base offset
    /// and committed size (bytes below it never change), oldest first; the last one is the
    /// active segment.
    pub fn segment_files(&self) -> Vec<SegmentFile> {
        self.segments
            .read()
            .iter()
            .map(|s| SegmentFile {
                name: log_file_name(s.base),
                base: s.base,
                size: s.readable.load(Ordering::Acquire),
                sealed: s.sealed.load(Ordering::Acquire),
            })
            .collect()
    }

    /// Reads up to `len` committed bytes of segment `base` from byte `pos` (fewer at its
    /// committed end). `Gone` when retention removed the segment.
    pub fn read_segment_bytes(&self, base: u64, pos: u64, len: usize) -> Result<Vec<u8>> {
        let seg = self
            .segments
            .read()
            .iter()
            .find(|s| s.base == base)
            .cloned()
            .ok_or(StorageError::Gone {
                offset: base,
                oldest: self.oldest.load(Ordering::Acquire),
            })?;
        let end = seg.readable.load(Ordering::Acquire);
        if pos >= end {
            return Ok(Vec::new());
        }
        let n = (end - pos).min(len as u64) as usize;
        let mut buf = vec![0u8; n];
        let file = seg.file().map_err(|e| self.read_err(&seg, base, e))?;
        let got = crate::segment::read_full_at(&file, &mut buf, pos)
            .map_err(|e| self.read_err(&seg, base, e))?;
        buf.truncate(got);
        Ok(buf)
    }

    /// Opens a log directory made by a verbatim copy and checks that it recovers to exactly
    /// `expected_hwm` (and starts at `expected_oldest`); closes it again.
    pub fn verify_copy(
        dir: &Path,
        cfg: LogConfig,
        expected_oldest: u64,
        expected_hwm: u64,
    ) -> Result<()> {
        let log = PartitionLog::open(dir, cfg)?;
        let (oldest, hwm) = (log.oldest_offset(), log.high_watermark());
        log.close();
        if hwm != expected_hwm || oldest != expected_oldest {
            return Err(StorageError::VerifyFailed {
                path: dir.to_path_buf(),
                offset: hwm,
                reason: format!(
                    "the copy reopens with offsets {oldest}..{hwm}, expected {expected_oldest}..{expected_hwm}"
                ),
            });
        }
        Ok(())
    }

    /// Closes files (for idle eviction and shutdown). Reads after close reopen lazily or fail.
    pub fn close(&self) {
        self.write_stale_index();
        for s in self.segments.read().iter() {
            s.close_files();
        }
        self.cache.lock().clear();
    }

    /// Writes the active segment's index header if a commit left it behind, so that a
    /// log closed or dropped (a graceful stop) reopens from its latest index point. Not
    /// while frames appended since the last commit are pending: the header would then claim
    /// them committed.
    fn write_stale_index(&self) {
        let mut w = self.writer.lock();
        if !w.pending && std::mem::take(&mut w.index_stale) {
            persist_active_index(&self.active());
        }
    }

    /// Deletes the whole log directory (topic deletion).
    pub fn destroy(self) -> Result<()> {
        self.close();
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&self.dir)(e)),
            _ => {}
        }
        if let Some(parent) = self.dir.parent() {
            if let Err(e) = sync_dir(parent) {
                tracing::warn!(dir = %parent.display(), error = %e, "cannot fsync after removing a log");
            }
        }
        Ok(())
    }
}

impl Drop for PartitionLog {
    fn drop(&mut self) {
        self.write_stale_index();
    }
}

fn persist_active_index(active: &Segment) {
    if let Err(e) = active.persist_index(&mut active.w.lock(), false, false) {
        tracing::warn!(path = %active.index_path.display(), error = %e, "cannot write the index (rebuilt at open)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recs(n: usize) -> Vec<NewRecord> {
        (0..n)
            .map(|i| NewRecord {
                key: None,
                payload: Bytes::from(format!("r{i}")),
                attrs: None,
            })
            .collect()
    }

    #[test]
    fn sequential_reads_decode_each_frame_once() {
        let tmp = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
        log.append(&recs(200), 1).unwrap(); // frames of 64, 64, 64, 8 records
        log.commit().unwrap();
        log.close(); // empties the cache the commit filled
        for o in 0..200 {
            assert_eq!(
                log.read(o).unwrap().unwrap().payload,
                Bytes::from(format!("r{o}"))
            );
        }
        assert_eq!(log.loads.load(Ordering::Relaxed), 4);
        // re-reading recent frames hits the cache
        for o in 64..200 {
            log.read(o).unwrap().unwrap();
        }
        assert_eq!(log.loads.load(Ordering::Relaxed), 4);
        // a batch read walks on from one lookup
        log.close();
        assert_eq!(log.read_from(0, 1000, usize::MAX).unwrap().len(), 200);
        assert_eq!(log.loads.load(Ordering::Relaxed), 5);
        // and leaves its last frame in the cache for the next single reads
        log.read(199).unwrap().unwrap();
        assert_eq!(log.loads.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_commit_leaves_its_last_frames_for_readers() {
        let tmp = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
        log.append(&recs(400), 1).unwrap(); // 6 frames of 64 records, then one of 16
        log.commit().unwrap();
        // The last CACHE_ENTRIES frames (offsets 192..400) are read without the file.
        for o in 192..400 {
            assert_eq!(
                log.read(o).unwrap().unwrap().payload,
                Bytes::from(format!("r{o}"))
            );
        }
        assert_eq!(log.loads.load(Ordering::Relaxed), 0);
        // An earlier one is loaded.
        assert_eq!(log.read(0).unwrap().unwrap().payload, Bytes::from("r0"));
        assert_eq!(log.loads.load(Ordering::Relaxed), 1);
        // The next commit's frame joins them.
        log.append(&recs(1), 1).unwrap();
        log.commit().unwrap();
        assert_eq!(log.read(400).unwrap().unwrap().payload, Bytes::from("r0"));
        assert_eq!(log.loads.load(Ordering::Relaxed), 1);
        // Past the high watermark, nothing.
        assert!(log.read(401).unwrap().is_none());
    }

    #[test]
    fn records_share_the_frame_buffer() {
        let tmp = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
        log.append(&recs(3), 1).unwrap();
        log.commit().unwrap();
        let a = log.read(0).unwrap().unwrap().payload;
        let b = log.read(1).unwrap().unwrap().payload;
        // slices of one buffer: adjacent in memory (record header of 8 bytes in between)
        assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, a.len() + 8);
    }

    #[test]
    fn frames_batch_up_to_64_records_and_64_kib() {
        let tmp = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
        log.append(&recs(130), 1).unwrap();
        let big: Vec<NewRecord> = (0..5)
            .map(|_| NewRecord {
                key: None,
                payload: Bytes::from(vec![1u8; 30 * 1024]),
                attrs: None,
            })
            .collect();
        log.append(&big, 1).unwrap();
        log.commit().unwrap();
        let seg = log.active();
        let mut rd = ChunkReader::new(
            seg.file().unwrap(),
            seg.size.load(Ordering::Acquire),
            SCAN_CHUNK,
        );
        let (mut pos, mut counts) = (0, Vec::new());
        while let Probe::Valid(h) = probe(&mut rd, pos).unwrap() {
            counts.push(h.count);
            pos += h.len as u64;
        }
        assert_eq!(counts, vec![64, 64, 2, 2, 2, 1]);
    }

    /// Headers of the frames of every segment: (segment base, segment size, frame header).
    fn frames_of(log: &PartitionLog) -> Vec<(u64, u64, crate::frame::FrameHeader)> {
        let mut out = Vec::new();
        for seg in log.segments.read().iter() {
            let size = seg.size.load(Ordering::Acquire);
            let mut rd = ChunkReader::new(seg.file().unwrap(), size, SCAN_CHUNK);
            let mut pos = 0;
            while let Probe::Valid(h) = probe(&mut rd, pos).unwrap() {
                out.push((seg.base, size, h));
                pos += h.len as u64;
            }
            assert_eq!(pos, size);
        }
        out
    }

    fn with_attrs(payload: usize, attrs: Option<usize>) -> NewRecord {
        NewRecord {
            key: None,
            payload: Bytes::from(vec![7u8; payload]),
            attrs: attrs.map(|n| Bytes::from(vec![b'a'; n])),
        }
    }

    /// A record with attributes widens the headers of the records before it in its frame:
    /// the frame is sized with the wide headers. Ten records and an eleventh with
    /// attributes would fit the target with 8-byte headers for the ten, not with 12.
    #[test]
    fn a_record_with_attrs_widens_its_frame_before_it_is_closed() {
        let tmp = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
        let mut recs: Vec<NewRecord> = (0..10).map(|_| with_attrs(6000, None)).collect();
        recs.push(with_attrs(5399, Some(1)));
        assert_eq!(
            FRAME_HEADER_LEN + 10 * 8 + 12 + 10 * 6000 + 5399 + 1,
            FRAME_TARGET_BYTES
        );
        log.append(&recs, 1).unwrap();
        // Without attributes the eleven records make one frame of just under the target.
        recs[10].attrs = None;
        log.append(&recs, 1).unwrap();
        log.commit().unwrap();
        let hs: Vec<_> = frames_of(&log).into_iter().map(|(_, _, h)| h).collect();
        let shape: Vec<_> = hs.iter().map(|h| (h.count, h.has_attrs())).collect();
        assert_eq!(shape, vec![(10, false), (1, true), (11, false)]);
        assert!(hs.iter().all(|h| h.len as usize <= FRAME_TARGET_BYTES));
        assert_eq!(
            log.read(10).unwrap().unwrap().attrs,
            Some(Bytes::from_static(b"a"))
        );
        assert_eq!(log.read(21).unwrap().unwrap().attrs, None);
    }

    /// Random mixes of records with and without attributes: every frame of more than one
    /// record stays within the target, every segment within its most bytes unless it is a
    /// single frame, and a frame was only closed early when the next record did not fit
    /// it (the sizing is exact, not only an upper bound).
    #[test]
    fn frames_and_segments_with_mixed_attrs_keep_their_bounds() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let tmp = tempfile::tempdir().unwrap();
        let cfg = LogConfig {
            segment_max_bytes: 150 * 1024,
            ..LogConfig::default()
        };
        let log = PartitionLog::open(tmp.path(), cfg.clone()).unwrap();
        let mut all = Vec::new();
        for _ in 0..40 {
            let batch: Vec<NewRecord> = (0..rng.random_range(1..90))
                .map(|_| {
                    let payload = match rng.random_range(0..4) {
                        0 => rng.random_range(0..40),
                        1 => rng.random_range(0..2000),
                        _ => rng.random_range(0..9000),
                    };
                    let attrs = match rng.random_range(0..4) {
                        0 => Some(rng.random_range(1..300)),
                        1 => Some(0),
                        _ => None,
                    };
                    with_attrs(payload, attrs)
                })
                .collect();
            log.append(&batch, 1).unwrap();
            all.push(batch);
        }
        log.commit().unwrap();
        let frames = frames_of(&log);
        let mut by_seg: std::collections::BTreeMap<u64, (u64, usize)> = Default::default();
        for (base, size, h) in &frames {
            assert!(h.count as usize <= FRAME_MAX_RECORDS);
            assert!(
                h.count == 1 || h.len as usize <= FRAME_TARGET_BYTES,
                "{h:?}"
            );
            by_seg.entry(*base).or_insert((*size, 0)).1 += 1;
        }
        for (base, (size, n)) in &by_seg {
            assert!(
                *size <= cfg.segment_max_bytes || *n == 1,
                "segment {base}: {size} bytes in {n} frames"
            );
        }
        assert!(by_seg.len() > 3, "{} segments", by_seg.len());
        // Each frame but an append's last: the next record would not have fitted.
        let recs: Vec<&NewRecord> = all.iter().flatten().collect();
        let mut append_ends = std::collections::HashSet::new();
        let mut end = 0;
        for b in &all {
            end += b.len() as u64;
            append_ends.insert(end);
        }
        for (_, _, h) in &frames {
            let (from, to) = (h.base_offset as usize, h.end_offset() as usize);
            let len = recs[from..to]
                .iter()
                .fold(FrameLen::default(), |l, r| l.with(r));
            assert_eq!(len.bytes(), h.len as usize, "{h:?}");
            if !append_ends.contains(&h.end_offset()) {
                let longer = len.with(recs[to]);
                assert!(
                    h.count as usize == FRAME_MAX_RECORDS || longer.bytes() > FRAME_TARGET_BYTES,
                    "{h:?} closed early"
                );
            }
        }
        for (o, r) in recs.iter().enumerate() {
            let got = log.read(o as u64).unwrap().unwrap();
            assert_eq!(got.payload, r.payload);
            assert_eq!(got.attrs, r.attrs.clone().filter(|a| !a.is_empty()));
        }
    }

    #[test]
    fn attrs_over_the_bound_are_refused_like_an_oversize_record() {
        let tmp = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
        let ok = with_attrs(1, Some(MAX_ATTRS_BYTES));
        let over = with_attrs(1, Some(MAX_ATTRS_BYTES + 1));
        match log.append(&[ok.clone(), over], 1) {
            Err(StorageError::TooLarge { size }) => assert_eq!(size, MAX_ATTRS_BYTES + 1),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(log.next_offset(), 0);
        assert_eq!(log.append(&[ok], 1).unwrap(), 0..1);
        log.commit().unwrap();
        assert_eq!(
            log.read(0).unwrap().unwrap().attrs.unwrap().len(),
            MAX_ATTRS_BYTES
        );
    }
}

/// Logs written with zstd (frame codec 1), alone and mixed with uncompressed frames.
/// The frames at `at` (byte position, length) that a commit just verified, decoded from a
/// copy of their bytes: a cached frame holds its own bytes, not the commit's whole read
/// buffer. One that cannot be had is left out (a reader then loads it from the file).
fn decoded_copies(rd: &mut ChunkReader, at: &VecDeque<(u64, usize)>) -> Vec<DecodedFrame> {
    at.iter()
        .filter_map(|&(pos, len)| {
            let bytes = rd.get(pos, len).ok()??;
            DecodedFrame::decode(Bytes::copy_from_slice(&bytes)).ok()
        })
        .collect()
}

#[cfg(test)]
mod codec_tests {
    use super::*;
    use crate::frame::test_support::reseal;
    use crate::frame::{FrameHeader, CODEC_NONE, CODEC_ZSTD};
    use crate::{verify_dir, CompressionLevel};
    use rand::{Rng, SeedableRng};

    fn cfg(codec: Codec) -> LogConfig {
        LogConfig {
            codec,
            compression_level: CompressionLevel::Default,
            index_interval_bytes: 256,
            ..LogConfig::default()
        }
    }

    /// The deterministic, compressible record of `offset` (JSON-ish text; keys absent,
    /// empty or present).
    fn text(offset: u64) -> NewRecord {
        let key = match offset % 3 {
            0 => None,
            1 => Some(Bytes::new()),
            _ => Some(Bytes::from(format!("customer-{}", offset % 7))),
        };
        let payload = format!(
            r#"{{"id":{offset},"kind":"order","status":"paid","items":[{}]}}"#,
            r#"{"sku":"apple","qty":1},"#.repeat(1 + (offset % 5) as usize)
        );
        NewRecord {
            key,
            payload: Bytes::from(payload),
            attrs: None,
        }
    }

    fn texts(start: u64, n: u64) -> Vec<NewRecord> {
        (start..start + n).map(text).collect()
    }

    /// Appends and commits `n` text records, `per` to a commit.
    fn fill(log: &PartitionLog, n: u64, per: u64) {
        let mut left = n;
        while left > 0 {
            let k = left.min(per);
            let start = log.next_offset();
            assert_eq!(log.append(&texts(start, k), 1).unwrap(), start..start + k);
            log.commit().unwrap();
            left -= k;
        }
    }

    /// Every record below the high watermark, one by one and in batches, against `want`
    /// (the text records unless overridden).
    fn check_all(log: &PartitionLog, want: &dyn Fn(u64) -> NewRecord) {
        let hwm = log.high_watermark();
        for o in 0..hwm {
            let r = log.read(o).unwrap().unwrap();
            let w = want(o);
            assert_eq!((r.offset, &r.key, &r.payload), (o, &w.key, &w.payload));
        }
        let mut o = 0;
        while o < hwm {
            let batch = log.read_from(o, 100, 1 << 20).unwrap();
            assert!(!batch.is_empty());
            for r in batch {
                assert_eq!(r.offset, o);
                assert_eq!(r.payload, want(o).payload);
                o += 1;
            }
        }
    }

    /// (position, header) of every frame of the segment file `path`.
    fn frames_in(path: &Path) -> Vec<(u64, FrameHeader)> {
        let f = Arc::new(fs::File::open(path).unwrap());
        let len = f.metadata().unwrap().len();
        let mut rd = ChunkReader::new(f, len, SCAN_CHUNK);
        let (mut pos, mut out) = (0, Vec::new());
        while let Probe::Valid(h) = probe(&mut rd, pos).unwrap() {
            out.push((pos, h));
            pos += h.len as u64;
        }
        out
    }

    /// The headers of every frame of the log.
    fn headers(log: &PartitionLog) -> Vec<FrameHeader> {
        log.segment_files()
            .iter()
            .flat_map(|s| frames_in(&log.dir().join(&s.name)))
            .map(|(_, h)| h)
            .collect()
    }

    fn copy_dir(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }

    fn edit(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
        let mut b = fs::read(path).unwrap();
        f(&mut b);
        fs::write(path, b).unwrap();
    }

    #[test]
    fn zstd_log_round_trips_and_reopens() {
        let tmp = tempfile::tempdir().unwrap();
        let (zdir, pdir) = (tmp.path().join("zstd"), tmp.path().join("plain"));
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let noise: Vec<u8> = (0..3000).map(|_| rng.random()).collect();
        let big = Bytes::from("a large, repetitive record; ".repeat(20_000)); // 560 KB
        let want = |o: u64| match o {
            200 => NewRecord {
                key: None,
                payload: Bytes::copy_from_slice(&noise),
                attrs: None,
            },
            201 => NewRecord {
                key: Some(Bytes::from_static(b"big")),
                payload: big.clone(),
                attrs: None,
            },
            _ => text(o),
        };
        let mut sizes = Vec::new();
        for (dir, codec) in [(&zdir, Codec::Zstd), (&pdir, Codec::None)] {
            let log = PartitionLog::open(dir, cfg(codec)).unwrap();
            fill(&log, 130, 1);
            fill(&log, 70, 64);
            log.append(&[want(200)], 1).unwrap(); // incompressible: stays codec 0
            log.append(&[want(201)], 1).unwrap();
            log.commit().unwrap();
            fill(&log, 98, 7);
            assert_eq!(log.high_watermark(), 300);
            check_all(&log, &want);
            sizes.push(log.stats().size_bytes);
            let hs = headers(&log);
            assert_eq!(hs.len(), 130 + 2 + 2 + 14);
            if codec == Codec::Zstd {
                // Frames of several records and the large one compressed, the random one
                // not; a lone short record may not shrink (zstd's frame overhead).
                for h in &hs {
                    let want = match h.base_offset {
                        200 => Some(CODEC_NONE),
                        201 => Some(CODEC_ZSTD),
                        _ if h.count > 1 => Some(CODEC_ZSTD),
                        _ => None,
                    };
                    assert!(want.is_none_or(|c| c == h.codec()), "{h:?}");
                }
                let n = hs.iter().filter(|h| h.codec() == CODEC_ZSTD).count();
                assert!(n > 100, "{n} frames compressed");
            } else {
                assert!(hs.iter().all(|h| h.codec() == CODEC_NONE));
            }
            drop(log);
            let log = PartitionLog::open(dir, cfg(codec)).unwrap();
            assert_eq!(log.high_watermark(), 300);
            check_all(&log, &want);
            assert!(verify_dir(dir).unwrap().is_clean());
        }
        assert!(
            sizes[0] * 4 < sizes[1],
            "zstd {} bytes, plain {}",
            sizes[0],
            sizes[1]
        );
    }

    #[test]
    fn switching_codecs_between_opens_keeps_every_record_readable() {
        for first in [Codec::None, Codec::Zstd] {
            let second = if first == Codec::None {
                Codec::Zstd
            } else {
                Codec::None
            };
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            let small = |c| LogConfig {
                segment_max_bytes: 8 * 1024,
                ..cfg(c)
            };
            for (round, codec) in [first, second, first].into_iter().enumerate() {
                let log = PartitionLog::open(dir, small(codec)).unwrap();
                assert_eq!(log.high_watermark(), 200 * round as u64);
                check_all(&log, &text);
                fill(&log, 200, 1 + round as u64 * 10);
                check_all(&log, &text);
            }
            let log = PartitionLog::open(dir, small(second)).unwrap();
            assert_eq!(log.high_watermark(), 600);
            check_all(&log, &text);
            assert!(log.segment_files().len() > 3);
            // The frames of each round are in its codec (with zstd: those it shrinks).
            for (round, codec) in [first, second, first].into_iter().enumerate() {
                let hs: Vec<FrameHeader> = headers(&log)
                    .into_iter()
                    .filter(|h| h.base_offset / 200 == round as u64)
                    .collect();
                let compressed = hs.iter().filter(|h| h.codec() == CODEC_ZSTD).count();
                match codec {
                    Codec::None => assert_eq!(compressed, 0, "{first:?} round {round}"),
                    Codec::Zstd => assert!(
                        compressed * 10 >= hs.len() * 7,
                        "{first:?} round {round}: {compressed} of {} compressed",
                        hs.len()
                    ),
                }
            }
            assert!(verify_dir(dir).unwrap().is_clean());
        }
    }

    /// Cuts (truncation, garbage, zeros) inside the last compressed frames of the active
    /// segment: recovery keeps exactly the frames before the cut, as with plain frames.
    #[test]
    fn a_torn_compressed_tail_is_truncated() {
        let tmp = tempfile::tempdir().unwrap();
        let pristine = tmp.path().join("pristine");
        let cfg = LogConfig {
            index_interval_bytes: 1 << 20,
            ..cfg(Codec::Zstd)
        };
        let mut bounds = vec![(0u64, 0u64)];
        {
            let log = PartitionLog::open(&pristine, cfg.clone()).unwrap();
            for _ in 0..12 {
                fill(&log, 20, 20);
                bounds.push((log.segment_files()[0].size, log.next_offset()));
            }
        }
        let file = pristine.join(log_file_name(0));
        let frames = frames_in(&file);
        assert_eq!(frames.len(), 12);
        assert!(frames.iter().all(|(_, h)| h.codec() == CODEC_ZSTD));
        let full = fs::metadata(&file).unwrap().len();
        assert_eq!(full, bounds.last().unwrap().0);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let first_cut = frames[8].0;
        for case in 0..40 {
            let dir = tmp.path().join(format!("case{case}"));
            copy_dir(&pristine, &dir);
            let f = dir.join(log_file_name(0));
            let cut = rng.random_range(first_cut..full);
            match case % 3 {
                0 => fs::OpenOptions::new()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_len(cut)
                    .unwrap(),
                1 => edit(&f, |b| {
                    for x in &mut b[cut as usize..] {
                        *x = rng.random();
                    }
                }),
                _ => edit(&f, |b| b[cut as usize..].fill(0)),
            }
            let &(keep_len, keep_next) = bounds.iter().rev().find(|b| b.0 <= cut).unwrap();
            let log = PartitionLog::open(&dir, cfg.clone())
                .unwrap_or_else(|e| panic!("case {case} cut {cut}: {e}"));
            assert_eq!(log.high_watermark(), keep_next, "case {case} cut {cut}");
            assert_eq!(fs::metadata(&f).unwrap().len(), keep_len, "case {case}");
            check_all(&log, &text);
            fill(&log, 5, 5);
            drop(log);
            let log = PartitionLog::open(&dir, cfg.clone()).unwrap();
            assert_eq!(log.high_watermark(), keep_next + 5);
            check_all(&log, &text);
            assert!(verify_dir(&dir).unwrap().is_clean(), "case {case}");
        }
    }

    /// Frames of 64 small records compress to far less than 8 bytes a record: damage in a
    /// committed one, followed by valid frames, is still corruption before valid data
    /// (the search for the next frame allows for compressed frames), whether the damage
    /// breaks the CRC or leaves a CRC-valid frame with bad zstd data.
    #[test]
    fn damage_before_valid_compressed_frames_fails_the_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        let cfg = LogConfig {
            index_interval_bytes: 1 << 20,
            ..cfg(Codec::Zstd)
        };
        let tiny = |o: u64| NewRecord {
            key: None,
            payload: Bytes::from(format!("{}", o % 10)),
            attrs: None,
        };
        {
            let log = PartitionLog::open(&dir, cfg.clone()).unwrap();
            for _ in 0..20 {
                let start = log.next_offset();
                log.append(&(start..start + 64).map(tiny).collect::<Vec<_>>(), 1)
                    .unwrap();
                log.commit().unwrap();
            }
        }
        let name = log_file_name(0);
        let frames = frames_in(&dir.join(&name));
        assert_eq!(frames.len(), 20);
        let (pos, h) = frames[10];
        assert_eq!(h.codec(), CODEC_ZSTD);
        assert!((h.len as usize) < 64 * 8 / 2, "frame of {} bytes", h.len);
        let at = (pos + FRAME_HEADER_LEN as u64) as usize;
        type Damage<'a> = (&'a str, &'a dyn Fn(&mut Vec<u8>));
        let damages: [Damage; 3] = [
            ("crc", &|b| b[at + 2] ^= 0x40),
            ("zstd magic, crc valid", &|b| {
                b[at] ^= 0x01;
                reseal(&mut b[pos as usize..(pos + h.len as u64) as usize]);
            }),
            ("zstd size, crc valid", &|b| {
                b[at + 5] ^= 0x04;
                reseal(&mut b[pos as usize..(pos + h.len as u64) as usize]);
            }),
        ];
        for (what, damage) in damages {
            for without_index in [false, true] {
                let case = tmp.path().join(format!("{what}-{without_index}"));
                copy_dir(&dir, &case);
                let f = case.join(&name);
                edit(&f, damage);
                if without_index {
                    // no index header: the later frames' attested high watermark is the evidence
                    fs::remove_file(case.join(crate::segment::index_file_name(0))).unwrap();
                }
                let len = fs::metadata(&f).unwrap().len();
                match PartitionLog::open(&case, cfg.clone()) {
                    Err(StorageError::Corrupt { position, .. }) => {
                        assert_eq!(position, pos, "{what}")
                    }
                    Err(e) => panic!("{what}/{without_index}: expected Corrupt, got {e}"),
                    Ok(_) => panic!("{what}/{without_index}: a corrupt log opened"),
                }
                assert_eq!(fs::metadata(&f).unwrap().len(), len, "{what}: truncated");
                let report = verify_dir(&case).unwrap();
                assert_eq!(report.segments[0].damaged.len(), 1, "{what}: {report:?}");
                assert_eq!(report.segments[0].end_offset, 20 * 64, "{what}");
            }
        }
    }

    /// Damage to a compressed frame of a sealed segment costs that frame's records only,
    /// read through the trusted index and after an index rebuild alike.
    #[test]
    fn a_damaged_compressed_frame_of_a_sealed_segment_is_unreadable_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        // (A segment rolls before a frame's uncompressed size would take it past the most.)
        let cfg = LogConfig {
            segment_max_bytes: 16 * 1024,
            index_interval_bytes: 1 << 20,
            ..cfg(Codec::Zstd)
        };
        {
            let log = PartitionLog::open(&dir, cfg.clone()).unwrap();
            fill(&log, 64 * 40, 64);
            assert!(log.segment_files().len() >= 3);
        }
        let name = log_file_name(0);
        let frames = frames_in(&dir.join(&name));
        assert!(frames.len() >= 6, "{}", frames.len());
        let (pos, h) = frames[frames.len() / 2];
        assert_eq!(h.codec(), CODEC_ZSTD);
        let at = (pos + FRAME_HEADER_LEN as u64) as usize;
        for (what, crc_valid) in [("crc", false), ("zstd, crc valid", true)] {
            for rebuild in [false, true] {
                let case = tmp.path().join(format!("{crc_valid}-{rebuild}"));
                copy_dir(&dir, &case);
                edit(&case.join(&name), |b| {
                    b[at] ^= 0x02;
                    if crc_valid {
                        reseal(&mut b[pos as usize..(pos + h.len as u64) as usize]);
                    }
                });
                if rebuild {
                    fs::remove_file(case.join(crate::segment::index_file_name(0))).unwrap();
                }
                let log = PartitionLog::open(&case, cfg.clone()).unwrap();
                assert_eq!(log.high_watermark(), 64 * 40);
                for o in 0..log.high_watermark() {
                    match log.read(o) {
                        Ok(Some(r)) => {
                            assert!(!(h.base_offset..h.end_offset()).contains(&o), "{what}");
                            assert_eq!(r.payload, text(o).payload);
                        }
                        Err(StorageError::Unreadable { .. }) => assert!(
                            (h.base_offset..h.end_offset()).contains(&o),
                            "{what}/{rebuild}: offset {o} unreadable"
                        ),
                        other => panic!("{what}: offset {o}: {other:?}"),
                    }
                }
                let report = verify_dir(&case).unwrap();
                assert_eq!(report.segments[0].damaged.len(), 1, "{what}: {report:?}");
                assert_eq!(report.segments[0].damaged[0].1, h.base_offset);
            }
        }
    }
}
