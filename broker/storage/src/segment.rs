//! One segment: a `<base>.log` data file of frames plus its in-memory sparse index, and the
//! positional-read machinery shared by readers, commit verification and recovery.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use crate::frame::{
    self, DecodedFrame, FrameHeader, FRAME_HEADER_LEN, FRAME_MAGIC, FRAME_MAX_RECORDS,
    RECORD_HEADER_LEN,
};
use crate::index::{self, IndexEntry, IndexHeader, INDEX_ENTRY_LEN, INDEX_HEADER_LEN};

/// Read-ahead of single-record reads (one `pread` usually covers the gap from the index
/// point to the wanted frame; a larger frame costs one more `pread` of its exact size).
pub(crate) const READ_CHUNK: usize = 16 * 1024;
/// Read-ahead once a reader walks on sequentially (`read_from`).
pub(crate) const BATCH_CHUNK: usize = 256 * 1024;
/// Window of the search for the next valid frame after damage.
const RESYNC_WINDOW: usize = 64 * 1024;
/// Read-ahead of sequential scans (recovery, verification, rebuild).
pub(crate) const SCAN_CHUNK: usize = 1024 * 1024;
/// Least and most the active segment's file is extended by at a time ahead of its frames
/// (with `LogConfig::preallocate`); between the two, as much as the segment holds already, so
/// an idle partition carries at most 64 KiB of zeros and a busy one extends once per MiB.
const PREALLOC_MIN: u64 = 64 * 1024;
const PREALLOC_MAX: u64 = 1024 * 1024;
/// What `O_DIRECT` reads align their offset, length and buffer to: a multiple of every
/// logical block size Linux file systems use.
pub(crate) const DIRECT_ALIGN: usize = 4096;

pub(crate) fn log_file_name(base: u64) -> String {
    format!("{base:020}.log")
}
pub(crate) fn index_file_name(base: u64) -> String {
    format!("{base:020}.index")
}

/// Writer-only bookkeeping of a segment (only touched under the log's writer lock, or by
/// `close`).
#[derive(Default)]
pub(crate) struct SegWriter {
    pub index_file: Option<File>,
    /// Entries already in the index file (entries are appended lazily).
    pub persisted_entries: usize,
    /// Position of the last index entry (0 = the implicit start entry).
    pub last_index_pos: u64,
}

pub(crate) struct Segment {
    pub base: u64,
    pub log_path: PathBuf,
    pub index_path: PathBuf,
    file: RwLock<Option<Arc<File>>>,
    /// The data file opened with `O_DIRECT`, for commit verification (writer only).
    direct: Mutex<Option<Arc<File>>>,
    /// Bytes written (including uncommitted frames).
    pub size: AtomicU64,
    /// Committed bytes: readers never read past this.
    pub readable: AtomicU64,
    /// Bytes of the file written: the frames (`size`), then zeros written ahead of them
    /// (`preallocate`); never below `size`.
    pub allocated: AtomicU64,
    /// Next offset after the last record written to this segment.
    pub end_offset: AtomicU64,
    /// Timestamp of the first record (0 = empty).
    pub first_ts: AtomicU64,
    /// Timestamp of the last (= largest) record (0 = empty).
    pub max_ts: AtomicU64,
    pub sealed: AtomicBool,
    /// Removed by retention or rollback: lazily reopening must fail.
    pub deleted: AtomicBool,
    pub index: RwLock<Vec<IndexEntry>>,
    pub w: Mutex<SegWriter>,
}

impl Segment {
    pub fn new(dir: &Path, base: u64) -> Segment {
        Segment {
            base,
            log_path: dir.join(log_file_name(base)),
            index_path: dir.join(index_file_name(base)),
            file: RwLock::new(None),
            direct: Mutex::new(None),
            size: AtomicU64::new(0),
            readable: AtomicU64::new(0),
            allocated: AtomicU64::new(0),
            end_offset: AtomicU64::new(base),
            first_ts: AtomicU64::new(0),
            max_ts: AtomicU64::new(0),
            sealed: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            index: RwLock::new(Vec::new()),
            w: Mutex::new(SegWriter::default()),
        }
    }

    /// Creates a new, empty segment file (the caller fsyncs the directory).
    pub fn create(dir: &Path, base: u64) -> io::Result<Segment> {
        let seg = Segment::new(dir, base);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&seg.log_path)?;
        *seg.file.write() = Some(Arc::new(f));
        Ok(seg)
    }

    /// The data file, opened lazily (read + write; never `O_APPEND`: writes are positional).
    pub fn file(&self) -> io::Result<Arc<File>> {
        if let Some(f) = self.file.read().as_ref() {
            return Ok(f.clone());
        }
        let mut g = self.file.write();
        if let Some(f) = g.as_ref() {
            return Ok(f.clone());
        }
        if self.deleted.load(Ordering::Acquire) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "segment deleted"));
        }
        let f = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&self.log_path)?,
        );
        *g = Some(f.clone());
        Ok(f)
    }

    pub fn set_file(&self, f: Arc<File>) {
        *self.file.write() = Some(f);
    }

    /// The data file opened read-only with `O_DIRECT` (reads bypass the page cache and come
    /// from the device), opened once. An error of kind `Unsupported` where the file system
    /// refuses `O_DIRECT` (tmpfs, some FUSE and overlay mounts).
    pub fn direct_file(&self) -> io::Result<Arc<File>> {
        let mut g = self.direct.lock();
        if let Some(f) = g.as_ref() {
            return Ok(f.clone());
        }
        if self.deleted.load(Ordering::Acquire) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "segment deleted"));
        }
        let f = Arc::new(open_direct(&self.log_path)?);
        *g = Some(f.clone());
        Ok(f)
    }

    /// Makes sure the file has been written (frames or zeros) up to `end`, extending it with
    /// zeros ahead: a frame written inside the file's size over written blocks changes no
    /// metadata, so the commit's `fdatasync` flushes the data alone instead of also the inode
    /// (file size) or, on a journaling file system, a journal commit. Recovery and
    /// verification read zeros after the last frame of the active segment as unused space.
    pub fn preallocate(&self, f: &File, end: u64) -> io::Result<()> {
        let have = self.allocated.load(Ordering::Acquire);
        if end <= have {
            return Ok(());
        }
        // [have, end) is what the caller writes next; zeros go after it.
        let step = have.clamp(PREALLOC_MIN, PREALLOC_MAX);
        let target = (end + step).next_multiple_of(DIRECT_ALIGN as u64);
        crate::zeros::write_zeros_at(f, end, target - end)?;
        self.allocated.store(target, Ordering::Release);
        Ok(())
    }

    /// Cuts the file back to its frames (`size`), when zeros were written after them: a
    /// sealed segment ends at its last frame. The caller fsyncs.
    pub fn cut_preallocated(&self, f: &File) -> io::Result<()> {
        let size = self.size.load(Ordering::Acquire);
        if self.allocated.load(Ordering::Acquire) > size {
            f.set_len(size)?;
        }
        self.allocated.store(size, Ordering::Release);
        Ok(())
    }

    /// Closes the `O_DIRECT` handle (a sealed segment is never verified again).
    pub fn close_direct(&self) {
        *self.direct.lock() = None;
    }

    /// Drops the open handles (readers holding a clone finish undisturbed).
    pub fn close_files(&self) {
        *self.file.write() = None;
        self.close_direct();
        self.w.lock().index_file = None;
    }

    pub fn lookup(&self, offset: u64) -> (u64, u64) {
        index::lookup(&self.index.read(), self.base, offset)
    }

    /// Writer: records a frame start in the sparse index when due.
    pub fn note_frame(&self, w: &mut SegWriter, pos: u64, base_offset: u64, interval: u32) {
        if pos > 0 && pos - w.last_index_pos >= interval.max(1) as u64 {
            self.index.write().push(IndexEntry {
                rel: (base_offset - self.base) as u32,
                pos: pos as u32,
            });
            w.last_index_pos = pos;
        }
    }

    /// The index header describing the segment as it stands (all of it committed).
    pub fn index_header(&self, sealed: bool) -> IndexHeader {
        IndexHeader {
            sealed,
            base_offset: self.base,
            end_offset: self.end_offset.load(Ordering::Acquire),
            data_size: self.size.load(Ordering::Acquire),
            first_ts: self.first_ts.load(Ordering::Acquire),
            max_ts: self.max_ts.load(Ordering::Acquire),
        }
    }

    fn index_file<'a>(&self, w: &'a mut SegWriter) -> io::Result<&'a File> {
        if w.index_file.is_none() {
            w.index_file = Some(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&self.index_path)?,
            );
        }
        Ok(w.index_file.as_ref().unwrap())
    }

    /// Writes the index file: the whole file when `full`, else only the entries added since
    /// the last write plus the header. `sync` fsyncs it (sealing).
    pub fn persist_index(&self, w: &mut SegWriter, full: bool, sync: bool) -> io::Result<()> {
        let header = self.index_header(self.sealed.load(Ordering::Acquire));
        let persisted = w.persisted_entries;
        // Only the entries not in the file yet are copied (the whole index only for a full
        // rewrite): a commit's header update costs the same early and late in a segment.
        let (rewrite, new_entries, count) = {
            let entries = self.index.read();
            let rewrite = full || persisted > entries.len();
            let from = if rewrite { 0 } else { persisted };
            (rewrite, entries[from..].to_vec(), entries.len())
        };
        let f = self.index_file(w)?;
        if rewrite {
            let img = index::encode_file(&header, &new_entries);
            f.write_all_at(&img, 0)?;
            f.set_len(img.len() as u64)?;
        } else {
            if !new_entries.is_empty() {
                let mut buf = Vec::new();
                index::encode_entries(self.base, &new_entries, &mut buf);
                f.write_all_at(
                    &buf,
                    (INDEX_HEADER_LEN + persisted * INDEX_ENTRY_LEN) as u64,
                )?;
            }
            f.write_all_at(&index::encode_header(&header), 0)?;
        }
        if sync {
            f.sync_data()?;
        }
        w.persisted_entries = count;
        Ok(())
    }
}

/// Reads as much of `buf` as the file holds at `pos` (short only at end of file).
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], pos: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], pos + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => io::Error::new(io::ErrorKind::Unsupported, e),
            _ => e,
        })
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_: &Path) -> io::Result<File> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "O_DIRECT is Linux only here",
    ))
}

/// Reads `len` bytes at `pos` through an `O_DIRECT` handle (fewer only at end of file): the
/// aligned range around them is read from the device into an aligned buffer, and the page
/// cache is neither consulted nor changed (clean cached pages stay for readers).
pub(crate) fn read_direct_at(file: &File, pos: u64, len: usize) -> io::Result<Bytes> {
    let a = DIRECT_ALIGN as u64;
    let from = pos / a * a;
    let to = (pos + len as u64).div_ceil(a) * a;
    let span = (to - from) as usize;
    if span == 0 {
        return Ok(Bytes::new());
    }
    let mut buf = ReadBuf::new(span, DIRECT_ALIGN);
    buf.fill_from(file, from)?;
    let lead = (pos - from) as usize;
    if buf.len() <= lead {
        // The file ends before `pos`.
        return Ok(Bytes::new());
    }
    let avail = (buf.len() - lead).min(len);
    Ok(Bytes::from_owner(buf).slice(lead..lead + avail))
}

/// Reads `len` bytes at `pos` through the page cache (fewer only at end of file).
fn read_buffered_at(file: &File, pos: u64, len: usize) -> io::Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    let mut buf = ReadBuf::new(len, 1);
    buf.fill_from(file, pos)?;
    Ok(Bytes::from_owner(buf))
}

/// A heap buffer that reads fill, never zeroed first: a commit's verification read used to
/// zero a buffer that its read then overwrote, 9 % of a produce's user-space instructions
/// (callgrind, 200 produces/s). Allocated with the alignment asked for (`O_DIRECT` needs
/// [`DIRECT_ALIGN`]); only the bytes read into it are ever seen.
struct ReadBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
    /// Bytes read into it so far, from the start.
    len: usize,
}

// SAFETY: a `ReadBuf` owns its allocation alone, and a shared `ReadBuf` is only read.
unsafe impl Send for ReadBuf {}
unsafe impl Sync for ReadBuf {}

impl ReadBuf {
    /// Room for `size` bytes (more than 0) at an address aligned to `align` (a power of two).
    fn new(size: usize, align: usize) -> ReadBuf {
        let layout = std::alloc::Layout::from_size_align(size, align).expect("read buffer layout");
        assert!(size > 0, "an empty read buffer");
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        ReadBuf {
            ptr,
            layout,
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Fills the buffer from file offset `start` on: until it is full, the file ends, or a
    /// read ends off the buffer's alignment (with `O_DIRECT` that is the end of the file,
    /// and the next offset could not be read anyway; with an alignment of 1 it never is).
    fn fill_from(&mut self, file: &File, start: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (size, align) = (self.layout.size(), self.layout.align());
        while self.len < size {
            let off = libc::off_t::try_from(start + self.len as u64)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            // SAFETY: `[len, size)` lies inside the allocation, which only `self`
            // references, and `pread` writes at most `size - len` bytes from its start.
            let n = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    self.ptr.as_ptr().add(self.len).cast(),
                    size - self.len,
                    off,
                )
            };
            match usize::try_from(n) {
                Ok(0) => break,
                Ok(n) => {
                    self.len += n;
                    if n % align != 0 {
                        break;
                    }
                }
                Err(_) => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }
}

impl AsRef<[u8]> for ReadBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the allocation were written by `pread`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ReadBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, and freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Drops the clean page-cache pages of a range so that the next read comes from the device
/// (commit verification where the file system refuses `O_DIRECT`).
pub(crate) fn drop_cache(file: &File, pos: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on an open descriptor; failure is harmless (advice only).
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                pos as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, pos, len);
}

/// A positional reader with read-ahead over `[0, end)` of a file.
pub(crate) struct ChunkReader {
    file: Arc<File>,
    end: u64,
    chunk: usize,
    buf: Bytes,
    buf_pos: u64,
    /// `file` is an `O_DIRECT` handle (reads go through [`read_direct_at`]).
    direct: bool,
}

impl ChunkReader {
    pub fn new(file: Arc<File>, end: u64, chunk: usize) -> Self {
        ChunkReader {
            file,
            end,
            chunk,
            buf: Bytes::new(),
            buf_pos: 0,
            direct: false,
        }
    }

    /// A reader over an `O_DIRECT` handle: every byte it returns comes from the device.
    pub fn from_device(file: Arc<File>, end: u64, chunk: usize) -> Self {
        ChunkReader {
            direct: true,
            ..ChunkReader::new(file, end, chunk)
        }
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    pub fn set_chunk(&mut self, chunk: usize) {
        self.chunk = chunk;
    }

    fn fill(&mut self, pos: u64, want: usize) -> io::Result<()> {
        let n = (want.max(self.chunk) as u64).min(self.end.saturating_sub(pos)) as usize;
        self.buf = if self.direct {
            read_direct_at(&self.file, pos, n)?
        } else {
            read_buffered_at(&self.file, pos, n)?
        };
        self.buf_pos = pos;
        Ok(())
    }

    /// Bytes `[pos, pos + len)`, or `None` if they do not all lie below `end` in the file.
    pub fn get(&mut self, pos: u64, len: usize) -> io::Result<Option<Bytes>> {
        if pos.checked_add(len as u64).is_none_or(|e| e > self.end) {
            return Ok(None);
        }
        let in_buf =
            pos >= self.buf_pos && pos + len as u64 <= self.buf_pos + self.buf.len() as u64;
        if !in_buf {
            self.fill(pos, len)?;
            if (self.buf.len()) < len {
                return Ok(None);
            }
        }
        let at = (pos - self.buf_pos) as usize;
        Ok(Some(self.buf.slice(at..at + len)))
    }

    /// Up to `max` bytes from `pos` (fewer near `end`).
    pub fn get_upto(&mut self, pos: u64, max: usize) -> io::Result<Bytes> {
        let len = (max as u64).min(self.end.saturating_sub(pos)) as usize;
        Ok(self.get(pos, len)?.unwrap_or_default())
    }
}

/// Whether every byte from `from` to the reader's end is zero (the space preallocated after
/// the last frame of an active segment, rather than a torn write).
pub(crate) fn zeros_to_end(rd: &mut ChunkReader, from: u64) -> io::Result<bool> {
    let mut p = from;
    while p < rd.end() {
        let chunk = rd.get_upto(p, SCAN_CHUNK)?;
        if chunk.is_empty() {
            break;
        }
        if chunk.iter().any(|&b| b != 0) {
            return Ok(false);
        }
        p += chunk.len() as u64;
    }
    Ok(true)
}

/// The outcome of looking at the bytes at one position.
pub(crate) enum Probe {
    /// A complete, CRC-valid, well-formed frame.
    Valid(FrameHeader),
    Invalid(String),
}

pub(crate) fn probe(rd: &mut ChunkReader, pos: u64) -> io::Result<Probe> {
    Ok(match frame_bytes(rd, pos)? {
        Ok(f) => match frame::check_frame(&f) {
            Ok(h) => Probe::Valid(h),
            Err(e) => Probe::Invalid(e),
        },
        Err(e) => Probe::Invalid(e),
    })
}

/// Like [`probe`], but decodes the frame (checking it once: a compressed frame is
/// decompressed once, for its check and its records).
pub(crate) fn probe_decode(
    rd: &mut ChunkReader,
    pos: u64,
) -> io::Result<Result<DecodedFrame, String>> {
    Ok(frame_bytes(rd, pos)?.and_then(DecodedFrame::decode))
}

/// The bytes of the frame whose header is at `pos` (as long as its header says), unchecked.
fn frame_bytes(rd: &mut ChunkReader, pos: u64) -> io::Result<Result<Bytes, String>> {
    let Some(h) = rd.get(pos, FRAME_HEADER_LEN)? else {
        return Ok(Err("frame header past the end of the data".into()));
    };
    let header = match frame::parse_header(&h) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    Ok(rd
        .get(pos, header.len as usize)?
        .ok_or_else(|| format!("frame length {} past the end of the data", header.len)))
}

/// The most offsets `bytes` bytes of frames can hold: in uncompressed frames a record takes
/// at least its 8-byte header; a compressed frame takes at least a header and an 8-byte
/// section (any valid frame does) and holds at most `FRAME_MAX_RECORDS` records.
fn max_offsets_in(bytes: u64) -> u64 {
    let min_frame = (FRAME_HEADER_LEN + RECORD_HEADER_LEN) as u64;
    (bytes / RECORD_HEADER_LEN as u64).max(bytes / min_frame * FRAME_MAX_RECORDS as u64)
}

/// Searches `[from, end)` for the first plausible valid frame after damage that starts at
/// byte `bad_pos` where offset `expected` was due (used to step over a damaged region).
/// Plausible: offset >= `expected`, no more offsets skipped than the bytes skipped can hold
/// (a record takes at least 8 bytes; a compressed frame of up to 64 records at least 52),
/// and an attested high watermark not above its own offset (so a frame image inside a
/// payload is not mistaken for one).
pub(crate) fn resync(
    rd: &mut ChunkReader,
    from: u64,
    bad_pos: u64,
    expected: u64,
) -> io::Result<Option<(u64, FrameHeader)>> {
    let mut p = from;
    while p + FRAME_HEADER_LEN as u64 <= rd.end() {
        let chunk = rd.get_upto(p, RESYNC_WINDOW)?;
        if chunk.len() < FRAME_MAGIC.len() {
            break;
        }
        let mut i = 0;
        while let Some(j) = chunk[i..]
            .windows(FRAME_MAGIC.len())
            .position(|w| w == FRAME_MAGIC)
        {
            let q = p + (i + j) as u64;
            if let Probe::Valid(h) = probe(rd, q)? {
                let plausible = h.base_offset >= expected
                    && h.base_offset - expected <= max_offsets_in(q - bad_pos)
                    && h.attested_committed <= h.base_offset;
                if plausible {
                    return Ok(Some((q, h)));
                }
            }
            i += j + 1;
        }
        p += (chunk.len() - (FRAME_MAGIC.len() - 1)) as u64;
    }
    Ok(None)
}

/// What a reader finds while walking a segment: a frame, or a range of offsets that cannot
/// be read (damaged frame, gap).
#[derive(Debug, Clone)]
pub(crate) enum Entry {
    Frame(Arc<DecodedFrame>),
    Corrupt {
        start: u64,
        end: u64,
        reason: Arc<str>,
    },
}

impl Entry {
    pub fn start(&self) -> u64 {
        match self {
            Entry::Frame(f) => f.base_offset(),
            Entry::Corrupt { start, .. } => *start,
        }
    }
    pub fn end(&self) -> u64 {
        match self {
            Entry::Frame(f) => f.end_offset(),
            Entry::Corrupt { end, .. } => *end,
        }
    }
    pub fn contains(&self, offset: u64) -> bool {
        offset >= self.start() && offset < self.end()
    }
}

/// Walks the committed frames of one segment from an index point on.
pub(crate) struct Cursor {
    pub seg: Arc<Segment>,
    rd: ChunkReader,
    pos: u64,
    expected: u64,
    /// Stop at this offset (segment end or high watermark).
    limit: u64,
}

impl Cursor {
    /// Positions at the last index point at or below `offset`; walks up to `hwm`.
    pub fn seek(seg: Arc<Segment>, offset: u64, hwm: u64) -> io::Result<Cursor> {
        let file = seg.file()?;
        let (pos, expected) = seg.lookup(offset);
        let limit = seg.end_offset.load(Ordering::Acquire).min(hwm);
        let rd = ChunkReader::new(file, seg.readable.load(Ordering::Acquire), READ_CHUNK);
        Ok(Cursor {
            seg,
            rd,
            pos,
            expected,
            limit,
        })
    }

    /// Reads ahead more per `pread` (for sequential walks).
    pub fn sequential(&mut self) {
        self.rd.set_chunk(BATCH_CHUNK);
    }

    /// The next frame or damaged range; `None` at the end of the segment (or the limit).
    pub fn next_entry(&mut self) -> io::Result<Option<Entry>> {
        loop {
            if self.expected >= self.limit {
                return Ok(None);
            }
            let path = self.seg.log_path.display();
            if self.pos >= self.rd.end() {
                let e = Entry::Corrupt {
                    start: self.expected,
                    end: self.limit,
                    reason: format!(
                        "{path}: data ends at byte {} before offset {}",
                        self.pos, self.expected
                    )
                    .into(),
                };
                self.expected = self.limit;
                return Ok(Some(e));
            }
            let reason = match probe_decode(&mut self.rd, self.pos)? {
                Ok(f) if f.base_offset() == self.expected => {
                    self.pos += f.header.len as u64;
                    self.expected = f.end_offset();
                    return Ok(Some(Entry::Frame(Arc::new(f))));
                }
                Ok(f) if f.base_offset() > self.expected => {
                    let e = Entry::Corrupt {
                        start: self.expected,
                        end: f.base_offset().min(self.limit),
                        reason: format!("{path}: offsets missing before byte {}", self.pos).into(),
                    };
                    self.expected = f.base_offset().min(self.limit);
                    return Ok(Some(e));
                }
                Ok(f) => {
                    format!("offset discontinuity (frame says {})", f.base_offset())
                }
                Err(r) => r,
            };
            let bad_pos = self.pos;
            let (resume_pos, resume_offset) =
                match resync(&mut self.rd, bad_pos + 1, bad_pos, self.expected)? {
                    Some((q, h)) => (q, h.base_offset.min(self.limit)),
                    None => (self.rd.end(), self.limit),
                };
            self.pos = resume_pos;
            if resume_offset > self.expected {
                let e = Entry::Corrupt {
                    start: self.expected,
                    end: resume_offset,
                    reason: format!("{path}: damaged frame at byte {bad_pos}: {reason}").into(),
                };
                self.expected = resume_offset;
                return Ok(Some(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NewRecord;

    fn frame(base: u64, attested: u64, n: usize) -> Vec<u8> {
        let recs: Vec<NewRecord> = (0..n)
            .map(|i| NewRecord {
                key: None,
                payload: bytes::Bytes::from(vec![i as u8; 10]),
                attrs: None,
            })
            .collect();
        let mut v = Vec::new();
        frame::encode_frame(&mut v, base, 1, attested, &recs);
        v
    }

    fn reader(bytes: &[u8]) -> (tempfile::TempDir, ChunkReader) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, bytes).unwrap();
        let f = Arc::new(File::open(&p).unwrap());
        (dir, ChunkReader::new(f, bytes.len() as u64, 7))
    }

    proptest::proptest! {
        /// Whatever the offset and length, an `O_DIRECT` read returns exactly the file's
        /// bytes there (fewer only at the end of the file), and a chunked reader over an
        /// `O_DIRECT` handle returns what a buffered one does.
        #[test]
        fn direct_reads_return_the_files_bytes(size in 0usize..20_000, pos in 0u64..21_000,
                                               len in 0usize..13_000, chunk in 1usize..9_000) {
            let img: Vec<u8> = (0..size).map(|i| (i * 31 % 253) as u8).collect();
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("f");
            std::fs::write(&p, &img).unwrap();
            let f = match open_direct(&p) {
                Ok(f) => Arc::new(f),
                Err(e) if e.kind() == io::ErrorKind::Unsupported => return Ok(()),
                Err(e) => panic!("{e}"),
            };
            let want = &img[(pos as usize).min(size)..(pos as usize + len).min(size)];
            proptest::prop_assert_eq!(&read_direct_at(&f, pos, len).unwrap()[..], want);
            let end = size as u64;
            let mut direct = ChunkReader::from_device(f, end, chunk);
            let mut buffered = ChunkReader::new(Arc::new(File::open(&p).unwrap()), end, chunk);
            proptest::prop_assert_eq!(direct.get(pos, len).unwrap(), buffered.get(pos, len).unwrap());
            proptest::prop_assert_eq!(direct.get_upto(pos, len).unwrap(), buffered.get_upto(pos, len).unwrap());
        }
    }

    #[test]
    fn resync_finds_the_next_plausible_frame() {
        let mut img = vec![0xEEu8; 40];
        img.extend(frame(3, 0, 2)); // 40 bytes can hold 5 records: plausible
        let (_d, mut rd) = reader(&img);
        assert_eq!(
            resync(&mut rd, 1, 0, 0)
                .unwrap()
                .map(|(q, h)| (q, h.base_offset)),
            Some((40, 3))
        );
        // below the expected offset: not plausible
        assert!(resync(&mut rd, 1, 0, 4).unwrap().is_none());
    }

    #[test]
    fn resync_rejects_implausible_frames() {
        // too many offsets skipped for the bytes skipped
        let mut img = vec![0u8; 16];
        img.extend(frame(100, 0, 1));
        let (_d, mut rd) = reader(&img);
        assert!(resync(&mut rd, 1, 0, 0).unwrap().is_none());
        // a frame attesting a high watermark above its own offset cannot have been written
        let mut img = vec![0u8; 16];
        img.extend(frame(1, 2, 1));
        let (_d, mut rd) = reader(&img);
        assert!(resync(&mut rd, 1, 0, 0).unwrap().is_none());
    }

    #[test]
    fn chunk_reader_reads_across_chunks_and_stops_at_end() {
        let img: Vec<u8> = (0..100u8).collect();
        let (_d, mut rd) = reader(&img);
        assert_eq!(&rd.get(5, 20).unwrap().unwrap()[..], &img[5..25]);
        assert_eq!(&rd.get(90, 10).unwrap().unwrap()[..], &img[90..100]);
        assert!(rd.get(95, 10).unwrap().is_none());
        assert_eq!(rd.get_upto(98, 10).unwrap().len(), 2);
    }

    #[test]
    fn probe_classifies_frames() {
        let mut img = frame(0, 0, 3);
        let len = img.len();
        img.extend_from_slice(&frame(3, 0, 1)[..20]); // torn second frame
        let (_d, mut rd) = reader(&img);
        assert!(matches!(probe(&mut rd, 0).unwrap(), Probe::Valid(h) if h.count == 3));
        assert!(matches!(
            probe(&mut rd, len as u64).unwrap(),
            Probe::Invalid(_)
        ));
        assert!(matches!(probe(&mut rd, 1).unwrap(), Probe::Invalid(_)));
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use crate::NewRecord;
    use proptest::collection::vec;
    use proptest::prelude::*;

    /// Segment bytes: valid frames, garbage, frames with a header that announces more than
    /// the file holds, in any order.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            vec(any::<u8>(), 0..64),
            (0..1000u64, 1..4usize).prop_map(|(base, n)| {
                let recs: Vec<NewRecord> = (0..n)
                    .map(|i| NewRecord {
                        key: None,
                        payload: Bytes::from(vec![i as u8; 9]),
                        attrs: None,
                    })
                    .collect();
                let mut v = Vec::new();
                frame::encode_frame(&mut v, base, 1, 0, &recs);
                v
            }),
            any::<u32>().prop_map(|len| {
                let mut v = Vec::new();
                frame::encode_frame(
                    &mut v,
                    0,
                    1,
                    0,
                    &[NewRecord {
                        key: None,
                        payload: Bytes::from_static(b"x"),
                        attrs: None,
                    }],
                );
                v[4..8].copy_from_slice(&len.to_le_bytes());
                v
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn prop_probe_and_resync_never_panic(pieces in vec(piece(), 0..6), chunk in 1..128usize) {
            let img: Vec<u8> = pieces.concat();
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("seg");
            std::fs::write(&p, &img).unwrap();
            let f = Arc::new(File::open(&p).unwrap());
            let mut rd = ChunkReader::new(f, img.len() as u64, chunk);
            for pos in 0..=img.len() as u64 + 1 {
                if let Probe::Valid(h) = probe(&mut rd, pos).unwrap() {
                    let end = pos as usize + h.len as usize;
                    prop_assert!(end <= img.len());
                    prop_assert_eq!(frame::check_frame(&img[pos as usize..end]), Ok(h));
                }
            }
            if let Some((q, h)) = resync(&mut rd, 0, 0, 0).unwrap() {
                prop_assert!(matches!(probe(&mut rd, q).unwrap(), Probe::Valid(v) if v == h));
                prop_assert!(h.attested_committed <= h.base_offset);
            }
        }
    }
}
