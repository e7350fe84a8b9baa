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

use parking_lot::{Mutex, RwLock};

use crate::error::{io_err, Result, StorageError};
use crate::frame::{
    encode_frame, record_size, FRAME_HEADER_LEN, FRAME_MAX_RECORDS, FRAME_TARGET_BYTES,
    MAX_RECORD_BYTES,
};
use crate::recovery::{self, sync_dir};
use crate::segment::{
    drop_cache, log_file_name, probe, ChunkReader, Cursor, Entry, Probe, Segment, SCAN_CHUNK,
};
use crate::{LogConfig, LogStats, NewRecord, RetentionOutcome, SegmentFile, StoredRecord};

/// Decoded frames (or damaged ranges) kept for readers.
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
    pub fn append(&self, records: &[NewRecord], now_ms: u64) -> Result<Range<u64>> {
        for r in records {
            let size = r.key.as_ref().map_or(0, |k| k.len()) + r.payload.len();
            if size > MAX_RECORD_BYTES {
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
        let total: usize = records.iter().map(record_size).sum::<usize>()
            + records.len().div_ceil(FRAME_MAX_RECORDS) * FRAME_HEADER_LEN;
        let mut seg = self.active();
        let mut buf_start = seg.size.load(Ordering::Acquire);
        let mut buf: Vec<u8> = Vec::with_capacity(total.min(max as usize + FRAME_TARGET_BYTES));
        let (mut off, mut i) = (start, 0);
        while i < records.len() {
            let mut j = i;
            let mut frame_bytes = FRAME_HEADER_LEN;
            while j < records.len() && j - i < FRAME_MAX_RECORDS {
                let rs = record_size(&records[j]);
                if j > i && frame_bytes + rs > FRAME_TARGET_BYTES {
                    break;
                }
                frame_bytes += rs;
                j += 1;
            }
            let cur = buf_start + buf.len() as u64;
            if cur > 0 && cur + frame_bytes as u64 > max {
                self.flush(&seg, &buf, buf_start)?;
                buf.clear();
                seg = self.roll(w, off)?;
                buf_start = 0;
            }
            let frame_pos = buf_start + buf.len() as u64;
            encode_frame(&mut buf, off, ts, attested, &records[i..j]);
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
            Ok((segs, frames)) => {
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
                Ok(next)
            }
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), error = %e, "commit failed; rolling back to the high watermark");
                self.rollback(&mut w, &e);
                Err(e)
            }
        }
    }

    /// The segments of the range and how many frames it holds.
    fn sync_and_verify(
        &self,
        w: &mut Writer,
        hwm: u64,
        next: u64,
    ) -> Result<(Vec<Arc<Segment>>, usize)> {
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
        for s in &segs {
            let start = if s.base == w.ckpt.seg_base {
                w.ckpt.pos
            } else {
                0
            };
            let end = s.size.load(Ordering::Acquire);
            let mut rd = self.verify_reader(w, s, start, end)?;
            let mut pos = start;
            while pos < end {
                let fail = |reason: String| StorageError::VerifyFailed {
                    path: s.log_path.clone(),
                    offset: expected,
                    reason,
                };
                match probe(&mut rd, pos).map_err(io_err(&s.log_path))? {
                    Probe::Valid(h, _) if h.base_offset == expected => {
                        pos += h.len as u64;
                        expected = h.end_offset();
                        frames += 1;
                    }
                    Probe::Valid(h, _) => {
                        return Err(fail(format!(
                            "frame at byte {pos} has offset {}",
                            h.base_offset
                        )));
                    }
                    Probe::Invalid(r) => return Err(fail(format!("frame at byte {pos}: {r}"))),
                }
            }
        }
        if expected != next {
            return Err(StorageError::VerifyFailed {
                path: last.log_path.clone(),
                offset: expected,
                reason: format!("read back ends at offset {expected}, appended up to {next}"),
            });
        }
        Ok((segs, frames))
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
        let oldest = {
            let mut segs = self.segments.write();
            segs.drain(..victims.len());
            let oldest = segs[0].base;
            self.oldest.store(oldest, Ordering::Release);
            oldest
        };
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
    use bytes::Bytes;

    fn recs(n: usize) -> Vec<NewRecord> {
        (0..n)
            .map(|i| NewRecord {
                key: None,
                payload: Bytes::from(format!("r{i}")),
            })
            .collect()
    }

    #[test]
    fn sequential_reads_decode_each_frame_once() {
        let tmp = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
        log.append(&recs(200), 1).unwrap(); // frames of 64, 64, 64, 8 records
        log.commit().unwrap();
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
        while let Probe::Valid(h, _) = probe(&mut rd, pos).unwrap() {
            counts.push(h.count);
            pos += h.len as u64;
        }
        assert_eq!(counts, vec![64, 64, 2, 2, 2, 1]);
    }
}
