//! Durable fan-out cursors: one small file per (parent partition, child, attach epoch) in
//! `<partition dir>/fanout/`, holding the next parent offset to copy. Written atomically
//! (tmp file, fsync, rename, directory fsync), so after a crash a cursor is either its old or
//! its new value: the last batch may be copied again (duplicates), never skipped (gaps).
//!
//! File name `<child topic id>-<epoch>.cursor`; contents (32 bytes, little endian):
//! magic `NFC1`, child topic id (u64), epoch (u64), next offset (u64), then the CRC32C of
//! the 28 bytes before it (see [`encode`]).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"NFC1";
const LEN: usize = 4 + 8 + 8 + 8 + 4;
const SUFFIX: &str = ".cursor";

/// Identifies one cursor within a parent partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CursorId {
    pub child_id: u64,
    pub epoch: u64,
}

/// What a load found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// No cursor yet: anchor it.
    Missing,
    At(u64),
    /// Damaged beyond reading: the caller must resume from a safe place (the parent's
    /// oldest offset: duplicates, never gaps).
    Corrupt,
}

/// The cursor files of one parent partition.
#[derive(Debug, Clone)]
pub struct CursorDir {
    dir: PathBuf,
}

impl CursorDir {
    /// The cursors of the partition stored in `partition_dir`.
    pub fn new(partition_dir: &Path) -> Self {
        CursorDir {
            dir: partition_dir.join("fanout"),
        }
    }

    fn path(&self, id: CursorId) -> PathBuf {
        self.dir
            .join(format!("{}-{}{SUFFIX}", id.child_id, id.epoch))
    }

    pub fn load(&self, id: CursorId) -> io::Result<Loaded> {
        match fs::read(self.path(id)) {
            Ok(b) => Ok(match decode(&b) {
                Some((cid, epoch, next)) if cid == id.child_id && epoch == id.epoch => {
                    Loaded::At(next)
                }
                _ => Loaded::Corrupt,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Loaded::Missing),
            Err(e) => Err(e),
        }
    }

    /// Durably sets the cursor to `next` (tmp + fsync + rename + directory fsync).
    pub fn store(&self, id: CursorId, next: u64) -> io::Result<()> {
        if !self.dir.is_dir() {
            fs::create_dir_all(&self.dir)?;
            if let Some(parent) = self.dir.parent() {
                sync_dir(parent)?;
            }
        }
        let path = self.path(id);
        let tmp = path.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&encode(id.child_id, id.epoch, next))?;
        f.sync_data()?;
        drop(f);
        fs::rename(&tmp, &path)?;
        sync_dir(&self.dir)
    }

    pub fn remove(&self, id: CursorId) -> io::Result<()> {
        match fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every cursor stored here (leftover temp files are ignored).
    pub fn list(&self) -> Vec<CursorId> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<CursorId> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let stem = name.to_str()?.strip_suffix(SUFFIX)?;
                let (c, ep) = stem.split_once('-')?;
                Some(CursorId {
                    child_id: c.parse().ok()?,
                    epoch: ep.parse().ok()?,
                })
            })
            .collect();
        out.sort();
        out
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

pub fn encode(child_id: u64, epoch: u64, next: u64) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    b[0..4].copy_from_slice(MAGIC);
    b[4..12].copy_from_slice(&child_id.to_le_bytes());
    b[12..20].copy_from_slice(&epoch.to_le_bytes());
    b[20..28].copy_from_slice(&next.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

/// `(child id, epoch, next)`, or `None` when the bytes are not a whole, intact cursor.
pub fn decode(b: &[u8]) -> Option<(u64, u64, u64)> {
    if b.len() != LEN || &b[0..4] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[28..32].try_into().ok()?);
    if crc32c::crc32c(&b[0..28]) != crc {
        return None;
    }
    let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().unwrap());
    Some((u(4..12), u(12..20), u(20..28)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: CursorId = CursorId {
        child_id: 7,
        epoch: 3,
    };

    #[test]
    fn store_load_roundtrip_and_overwrite() {
        let d = tempfile::tempdir().unwrap();
        let c = CursorDir::new(d.path());
        assert_eq!(c.load(A).unwrap(), Loaded::Missing);
        assert!(c.list().is_empty());
        c.store(A, 0).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(0));
        c.store(A, 4096).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(4096));
        let b = CursorId {
            child_id: 7,
            epoch: 9,
        };
        c.store(b, 5).unwrap();
        assert_eq!(c.list(), vec![A, b]);
        // A fresh handle (a restart) sees the same.
        assert_eq!(CursorDir::new(d.path()).load(A).unwrap(), Loaded::At(4096));
        c.remove(A).unwrap();
        c.remove(A).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::Missing);
        assert_eq!(c.list(), vec![b]);
    }

    #[test]
    fn recovery_ignores_temp_files_and_flags_damage() {
        let d = tempfile::tempdir().unwrap();
        let c = CursorDir::new(d.path());
        c.store(A, 42).unwrap();
        // A crash between writing the temp file and the rename leaves the old value.
        let path = c.path(A);
        fs::write(path.with_extension("tmp"), b"half").unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(42));
        assert_eq!(c.list(), vec![A]);
        // The next store replaces the temp file.
        c.store(A, 43).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(43));
        // Torn or flipped bytes are detected, never read as a position.
        let good = fs::read(&path).unwrap();
        fs::write(&path, &good[..10]).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::Corrupt);
        let mut bad = good.clone();
        bad[21] ^= 0x40;
        fs::write(&path, &bad).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::Corrupt);
        // A file of another epoch under this name (never written so) is not trusted.
        fs::write(&path, encode(7, 4, 1)).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::Corrupt);
    }

    #[test]
    fn codec() {
        let b = encode(1, 2, u64::MAX);
        assert_eq!(decode(&b), Some((1, 2, u64::MAX)));
        assert_eq!(decode(&b[..LEN - 1]), None);
        assert_eq!(decode(&[0u8; LEN]), None);
    }
}
