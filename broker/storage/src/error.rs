//! Error type of the partition log.

use std::path::{Path, PathBuf};

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
    /// A record to append over a bound: its key + payload over `MAX_RECORD_BYTES`, or its
    /// attributes over `MAX_ATTRS_BYTES` (`size`: the bytes of the part over its bound).
    #[error("record too large: {size} bytes")]
    TooLarge { size: usize },
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// `map_err` helper: attaches the path to an io error.
pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io {
        path: path.to_path_buf(),
        source,
    }
}
