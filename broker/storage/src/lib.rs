//! Narad's partition log: one partition's append-only, segmented, CRC32C-framed log.
//!
//! Concurrency contract: one writer at a time (`append` + `commit` are serialised by an
//! internal writer lock, the dispatcher is the only caller), any number of concurrent
//! readers (`read`, `read_from`, `stats`) that never wait for an fsync.
//!
//! # On-disk layout
//!
//! A directory per partition holding, per segment, `<base offset, 20 digits>.log` (frames,
//! see [`frame`]) and `<base offset>.index` (sparse offset index, see [`index`]). The last
//! segment is the active one; all others are sealed (fsynced with a complete index before
//! the next segment was created). A frame never spans segments. Once retention has deleted
//! segments, `log-start` holds the base offset of the oldest one kept (a checked number,
//! see [`checked_u64`]), written before the deletions.
//!
//! # Durability
//!
//! `append` writes frames (one `pwrite` per segment touched) but exposes nothing. `commit`
//! fdatasyncs, re-reads the written range from the device (`O_DIRECT`, so the cached pages
//! stay for readers; where refused, after dropping the range from the page cache), checks
//! every frame (CRC32C, layout, contiguous offsets), then advances the high
//! watermark. A failed append or commit truncates the log back to the high watermark, so
//! the caller can simply retry.
//!
//! # Recovery (`open`)
//!
//! Sealed segments: the index is trusted when complete and consistent, else rebuilt by a
//! scan (damaged frames stay in place and read as `Unreadable`). The active segment is
//! scanned from its last valid index point: a torn tail is truncated (warning); damage
//! followed by a valid frame, when the damaged offsets are known to have been committed
//! (index header, or a later frame's attested high watermark), fails with `Corrupt`.
//! Segments below `log-start` are removed unread: retention deleted them, and a power loss
//! brought them back (on a file system without a journal an unlink reaches the disk only
//! with its directory), possibly over blocks other files rewrote since.
//! [`verify_dir`] checks a log offline without changing it.
//!
//! # Compression
//!
//! With [`LogConfig::codec`] `Zstd`, the writer stores the records section of each frame
//! zstd-compressed where that makes the frame smaller (see [`frame`]). Frames are
//! self-describing: every reader path decodes both codecs, so a log may mix them and the
//! codec can be changed between opens.

use std::time::Duration;

use bytes::Bytes;

pub mod checked_u64;
pub mod dirs;
mod error;
pub mod frame;
pub mod index;
mod log;
mod recovery;
mod segment;
pub mod verify;
mod zeros;

pub use error::{Result, StorageError};
pub use frame::{MAX_ATTRS_BYTES, MAX_RECORD_BYTES};
pub use log::PartitionLog;
pub use verify::{verify_dir, SegmentReport, VerifyReport};
pub use zeros::write_zeros_at;

/// Tunables of one partition log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Seal the active segment once it reaches this size (SPEC: 64 MiB).
    pub segment_max_bytes: u64,
    /// Seal the active segment once its oldest record is this old (SPEC: 1 h).
    pub segment_max_age: Duration,
    /// Sparse index: one entry at least every this many bytes.
    pub index_interval_bytes: u32,
    /// `commit` re-reads the new frames from the device (with `O_DIRECT`, or where the file
    /// system refuses it, after dropping them from the page cache) rather than through the
    /// page cache. Stronger (it catches a device that acknowledged a write it did not
    /// keep), at the cost of one device read per commit.
    pub verify_from_device: bool,
    /// The active segment's file is extended with written zeros ahead of its frames (64 KiB
    /// to 1 MiB at a time), so that a commit's fdatasync overwrites allocated blocks within
    /// the file's size and flushes no metadata; a sealed segment is cut to its frames. Off
    /// by default here (the file length is then the frames' length); the broker turns it on.
    pub preallocate: bool,
    /// Codec of the frames written from now on (`storage.codec`). Reading never depends on
    /// it: each frame says how it is stored.
    pub codec: Codec,
    /// zstd level of the frames written with [`Codec::Zstd`] (`storage.compression_level`).
    pub compression_level: CompressionLevel,
}

/// How the writer stores the records section of a frame (`storage.codec`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Uncompressed (frame codec 0). The writer does no extra work.
    #[default]
    None,
    /// zstd (frame codec 1) for each frame it makes smaller; a frame it would not shrink is
    /// written uncompressed (codec 0).
    Zstd,
}

impl Codec {
    /// The configuration names, in the order of the variants.
    pub const NAMES: [&'static str; 2] = ["none", "zstd"];

    /// The codec of a configuration name (`none`, `zstd`).
    pub fn from_name(name: &str) -> Option<Codec> {
        match name {
            "none" => Some(Codec::None),
            "zstd" => Some(Codec::Zstd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Zstd => "zstd",
        }
    }
}

/// zstd compression level of [`Codec::Zstd`] (`storage.compression_level`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum CompressionLevel {
    /// zstd level 1.
    #[default]
    Fastest,
    /// zstd level 3 (zstd's own default).
    Default,
    /// zstd level 7.
    Better,
    /// zstd level 19: several times slower per byte than `better` for a few percent more,
    /// and compression runs in the partition's write path (a frame holds at most 64 KiB of
    /// records unless it is one larger record), so it caps a partition's write throughput.
    Best,
}

impl CompressionLevel {
    /// The configuration names, in the order of the variants.
    pub const NAMES: [&'static str; 4] = ["fastest", "default", "better", "best"];

    /// The level of a configuration name (`fastest`, `default`, `better`, `best`).
    pub fn from_name(name: &str) -> Option<CompressionLevel> {
        match name {
            "fastest" => Some(CompressionLevel::Fastest),
            "default" => Some(CompressionLevel::Default),
            "better" => Some(CompressionLevel::Better),
            "best" => Some(CompressionLevel::Best),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CompressionLevel::Fastest => "fastest",
            CompressionLevel::Default => "default",
            CompressionLevel::Better => "better",
            CompressionLevel::Best => "best",
        }
    }

    /// The zstd level it stands for: 1, 3, 7, 19.
    pub fn zstd_level(self) -> i32 {
        match self {
            CompressionLevel::Fastest => 1,
            CompressionLevel::Default => 3,
            CompressionLevel::Better => 7,
            CompressionLevel::Best => 19,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_max_bytes: 64 * 1024 * 1024,
            segment_max_age: Duration::from_secs(3600),
            index_interval_bytes: 4096,
            verify_from_device: true,
            preallocate: false,
            codec: Codec::None,
            compression_level: CompressionLevel::Fastest,
        }
    }
}

/// One segment file of a log as a verbatim copy sees it ([`PartitionLog::segment_files`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentFile {
    /// The file name inside the log directory (`<20-digit base>.log`).
    pub name: String,
    pub base: u64,
    /// Committed bytes.
    pub size: u64,
    pub sealed: bool,
}

/// A record to append.
#[derive(Debug, Clone)]
pub struct NewRecord {
    pub key: Option<Bytes>,
    pub payload: Bytes,
    /// An opaque, already-encoded attribute block the broker stores beside the key (`None` =
    /// no attributes; the storage layer never interprets it). At most [`MAX_ATTRS_BYTES`].
    /// An empty block is stored as no block and reads back as `None`: frames of records
    /// without attributes keep the layout they had before attributes existed.
    pub attrs: Option<Bytes>,
}

/// A committed record as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    /// Commit time, Unix milliseconds; monotonic (non-decreasing) within a partition.
    pub timestamp_ms: u64,
    pub key: Option<Bytes>,
    pub payload: Bytes,
    /// The opaque attribute block stored with the record (`None` = no attributes, also for
    /// a record appended with an empty block); the storage layer never interprets it. A
    /// slice of the frame's buffer, as key and payload are.
    pub attrs: Option<Bytes>,
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

/// `PartitionLog` is shared between the dispatcher and many readers.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<PartitionLog>();
};
