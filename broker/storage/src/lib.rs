//! Narad's partition log: one partition's append-only, segmented, CRC32C-framed log.
//!
//! (Interface fixed by the broker; the implementation fills it in.)
//!
//! Concurrency contract: one writer at a time (`append` + `commit` are serialised by an
//! internal writer lock, the dispatcher is the only caller), any number of concurrent
//! readers (`read`, `read_from`, `stats`) that never wait for an fsync.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;

/// Errors of the partition log.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Corruption before valid data (not a torn tail): the open fails loudly.
    #[error("corrupt log {path} at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// A committed record failed its read-back check (CRC) after fsync.
    #[error("verification failed for {path} at offset {offset}: {reason}")]
    VerifyFailed {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The offset is below the oldest retained offset.
    #[error("offset {offset} is gone (oldest retained is {oldest})")]
    Gone { offset: u64, oldest: u64 },
    /// A record that cannot be read any more (corrupt frame below the high watermark).
    #[error("record at offset {offset} is unreadable: {reason}")]
    Unreadable { offset: u64, reason: String },
    #[error("record too large: {size} bytes")]
    TooLarge { size: usize },
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Tunables of one partition log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Seal the active segment once it reaches this size (SPEC: 64 MiB).
    pub segment_max_bytes: u64,
    /// Seal the active segment once its oldest record is this old (SPEC: 1 h).
    pub segment_max_age: Duration,
    /// Sparse index: one entry at least every this many bytes.
    pub index_interval_bytes: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_max_bytes: 64 * 1024 * 1024,
            segment_max_age: Duration::from_secs(3600),
            index_interval_bytes: 4096,
        }
    }
}

/// A record to append.
#[derive(Debug, Clone)]
pub struct NewRecord {
    pub key: Option<Bytes>,
    pub payload: Bytes,
}

/// A committed record as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    /// Commit time, Unix milliseconds; monotonic (non-decreasing) within a partition.
    pub timestamp_ms: u64,
    pub key: Option<Bytes>,
    pub payload: Bytes,
}

/// Numbers for `partition_stats` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogStats {
    pub segments: u64,
    pub oldest_offset: u64,
    pub next_offset: u64,
    pub high_watermark: u64,
    pub size_bytes: u64,
    /// Last write of the oldest segment, Unix milliseconds (0 when empty).
    pub oldest_segment_last_write_ms: u64,
}

/// What one retention pass removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub segments_deleted: u64,
    pub bytes_deleted: u64,
    pub messages_deleted: u64,
}

/// One partition's log.
pub struct PartitionLog {
    _dir: PathBuf,
}

impl PartitionLog {
    /// Opens (creating if missing) the log in `dir`; recovers: truncates a torn tail of the
    /// active segment, rebuilds a missing or bad index, fails with `Corrupt` on corruption
    /// that is followed by valid data. After open, high_watermark == next_offset.
    pub fn open(dir: &Path, cfg: LogConfig) -> Result<Self> {
        let _ = (dir, cfg);
        todo!()
    }

    /// Writes the records as new frames (not yet durable, not yet visible).
    /// Timestamps are `max(now_ms, last timestamp)`. Returns the offsets assigned.
    pub fn append(&self, records: &[NewRecord], now_ms: u64) -> Result<Range<u64>> {
        let _ = (records, now_ms);
        todo!()
    }

    /// fsyncs everything appended, re-reads the frames appended since the high watermark,
    /// checks their CRC32C, and only then advances the high watermark. Returns the new HWM.
    pub fn commit(&self) -> Result<u64> {
        todo!()
    }

    pub fn high_watermark(&self) -> u64 {
        todo!()
    }
    pub fn next_offset(&self) -> u64 {
        todo!()
    }
    pub fn oldest_offset(&self) -> u64 {
        todo!()
    }

    /// Reads one committed record. `Ok(None)` at or past the high watermark;
    /// `Err(Gone)` below the oldest retained offset; `Err(Unreadable)` for a corrupt frame.
    pub fn read(&self, offset: u64) -> Result<Option<StoredRecord>> {
        let _ = offset;
        todo!()
    }

    /// Reads committed records from `offset` on, at most `max_records` and about `max_bytes`
    /// (at least one record if any is available). Empty at/past the high watermark.
    pub fn read_from(
        &self,
        offset: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>> {
        let _ = (offset, max_records, max_bytes);
        todo!()
    }

    pub fn stats(&self) -> LogStats {
        todo!()
    }

    /// Seals the active segment if it is older than `segment_max_age`.
    pub fn roll_if_due(&self, now_ms: u64) -> Result<bool> {
        let _ = now_ms;
        todo!()
    }

    /// Deletes whole sealed segments whose last write is older than `retention_ms`
    /// (0 = keep forever). Never deletes the active segment.
    pub fn enforce_retention(&self, retention_ms: u64, now_ms: u64) -> Result<RetentionOutcome> {
        let _ = (retention_ms, now_ms);
        todo!()
    }

    /// Closes files (for idle eviction and shutdown). Reads after close reopen lazily or fail.
    pub fn close(&self) {}

    /// Deletes the whole log directory (topic deletion).
    pub fn destroy(self) -> Result<()> {
        todo!()
    }
}
