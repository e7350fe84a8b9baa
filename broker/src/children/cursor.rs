//! Durable fan-out cursors: one small file per (parent partition, child, attach epoch) in
//! `<partition dir>/fanout/`, holding the next parent offset to copy.
//!
//! A cursor is created atomically (tmp file, fsync, rename, directory fsync) and then
//! advanced in place by its running cursor ([`CursorFile`]): each advance overwrites the
//! older of two slots (in different pages, so one torn write can damage only the slot being
//! written) and is fsynced at most every [`SYNC_EVERY`] and when the cursor stops. Every
//! value ever written is a position whose records are already durable in the child, so
//! whichever intact slot a restart finds, the newest by sequence number, is safe: after a
//! crash the records since that position are copied again (duplicates), never skipped
//! (gaps). A power loss costs at most about `SYNC_EVERY` of re-copying; a kill -9 nothing.
//!
//! File name `<child topic id>-<epoch>.cursor`. Contents: slot 0 at byte 0 and slot 1 at
//! byte [`SLOT_STRIDE`], each 40 bytes, little endian: magic `NFC2`, child topic id (u64),
//! epoch (u64), sequence number (u64), next offset (u64), then the CRC32C of the 36 bytes
//! before it. Files of the first format (32 bytes: magic `NFC1`, child id, epoch, next,
//! CRC32C) are still read and are rewritten in this one when their cursor next runs.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use narad_storage::dirs::sync_dir;

/// The first format (one 32-byte record, replaced by rename on every store).
const MAGIC: &[u8; 4] = b"NFC1";
const LEN: usize = 4 + 8 + 8 + 8 + 4;
const MAGIC2: &[u8; 4] = b"NFC2";
const SLOT_LEN: usize = 4 + 8 + 8 + 8 + 8 + 4;
/// Where slot 1 starts: a page away from slot 0.
pub const SLOT_STRIDE: u64 = 4096;
const FILE_LEN: usize = SLOT_STRIDE as usize + SLOT_LEN;
const SUFFIX: &str = ".cursor";
/// The longest an in-place advance stays without an fsync.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

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
            Ok(b) => Ok(match newest(&b, id) {
                Some(Found { next, .. }) => Loaded::At(next),
                None => Loaded::Corrupt,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Loaded::Missing),
            Err(e) => Err(e),
        }
    }

    /// Opens the cursor for in-place advances, at `next` (what [`load`](Self::load) found,
    /// or the anchor just stored). A file of the first format, or one no slot of which is
    /// intact, is first rewritten durably at `next`.
    pub fn open(&self, id: CursorId, next: u64) -> io::Result<CursorFile> {
        let path = self.path(id);
        let found = match fs::read(&path) {
            Ok(b) if b.len() == FILE_LEN => newest(&b, id),
            Ok(_) => None,
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let seq = match found {
            Some(f) => f.seq,
            None => {
                self.store(id, next)?;
                1
            }
        };
        let file = fs::OpenOptions::new().read(true).write(true).open(&path)?;
        Ok(CursorFile {
            file,
            id,
            seq,
            synced_at: Instant::now(),
            unsynced: false,
        })
    }

    /// Durably sets the cursor to `next` (tmp + fsync + rename + directory fsync). An open
    /// [`CursorFile`] of the same cursor no longer reaches the file afterwards.
    pub fn store(&self, id: CursorId, next: u64) -> io::Result<()> {
        if !self.dir.is_dir() {
            narad_storage::dirs::create_dir_all_durable(&self.dir)?;
        }
        let path = self.path(id);
        let tmp = path.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        let mut b = vec![0u8; FILE_LEN];
        b[..SLOT_LEN].copy_from_slice(&encode_slot(id, 1, next));
        f.write_all(&b)?;
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

/// A running cursor's file, advanced in place (see the module docs).
#[derive(Debug)]
pub struct CursorFile {
    file: fs::File,
    id: CursorId,
    /// The sequence number of the newest slot written.
    seq: u64,
    synced_at: Instant,
    unsynced: bool,
}

impl CursorFile {
    /// Sets the cursor to `next` (every record before it is durable in the child): writes the
    /// older slot, and fsyncs when `SYNC_EVERY` has passed since the last fsync.
    pub fn advance(&mut self, next: u64) -> io::Result<()> {
        let seq = self.seq + 1;
        let at = (seq % 2) * SLOT_STRIDE;
        self.file
            .write_all_at(&encode_slot(self.id, seq, next), at)?;
        self.seq = seq;
        self.unsynced = true;
        if self.synced_at.elapsed() >= SYNC_EVERY {
            self.sync()?;
        }
        Ok(())
    }

    /// Makes every advance so far durable.
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            self.file.sync_data()?;
            self.unsynced = false;
        }
        self.synced_at = Instant::now();
        Ok(())
    }

    /// Whether an advance waits for an fsync.
    pub fn unsynced(&self) -> bool {
        self.unsynced
    }

    /// Whether an advance has waited `SYNC_EVERY` for its fsync.
    pub fn sync_due(&self) -> bool {
        self.unsynced && self.synced_at.elapsed() >= SYNC_EVERY
    }
}

/// An intact slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Found {
    seq: u64,
    next: u64,
}

/// The newest intact record of cursor `id` in a file's bytes (either format).
fn newest(b: &[u8], id: CursorId) -> Option<Found> {
    if b.len() == LEN {
        return match decode(b) {
            Some((cid, epoch, next)) if cid == id.child_id && epoch == id.epoch => {
                Some(Found { seq: 0, next })
            }
            _ => None,
        };
    }
    [0, SLOT_STRIDE as usize]
        .into_iter()
        .filter_map(|at| decode_slot(b.get(at..at + SLOT_LEN)?))
        .filter(|(cid, epoch, _)| *cid == id.child_id && *epoch == id.epoch)
        .map(|(_, _, f)| f)
        .max_by_key(|f| f.seq)
}

fn encode_slot(id: CursorId, seq: u64, next: u64) -> [u8; SLOT_LEN] {
    let mut b = [0u8; SLOT_LEN];
    encode_record(&mut b, MAGIC2, &[id.child_id, id.epoch, seq, next]);
    b
}

fn decode_slot(b: &[u8]) -> Option<(u64, u64, Found)> {
    let [child_id, epoch, seq, next] = decode_record(b, MAGIC2)?;
    Some((child_id, epoch, Found { seq, next }))
}

/// Both formats are one record shape: magic, little-endian u64 fields, then the CRC32C of
/// everything before it. Writes one into `out`, which must be exactly its length.
fn encode_record(out: &mut [u8], magic: &[u8; 4], fields: &[u64]) {
    debug_assert_eq!(out.len(), 4 + 8 * fields.len() + 4);
    out[0..4].copy_from_slice(magic);
    for (i, v) in fields.iter().enumerate() {
        out[4 + 8 * i..12 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    let end = out.len() - 4;
    let crc = crc32c::crc32c(&out[..end]);
    out[end..].copy_from_slice(&crc.to_le_bytes());
}

/// The `N` fields of a record with `magic`, or `None` unless `b` is exactly one whole,
/// intact record.
fn decode_record<const N: usize>(b: &[u8], magic: &[u8; 4]) -> Option<[u64; N]> {
    let end = 4 + 8 * N;
    if b.len() != end + 4 || &b[0..4] != magic {
        return None;
    }
    let crc = u32::from_le_bytes(b[end..].try_into().ok()?);
    if crc32c::crc32c(&b[..end]) != crc {
        return None;
    }
    Some(std::array::from_fn(|i| {
        u64::from_le_bytes(b[4 + 8 * i..12 + 8 * i].try_into().unwrap())
    }))
}

/// A record of the first format (only tests write it now).
#[cfg(test)]
fn encode(child_id: u64, epoch: u64, next: u64) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    encode_record(&mut b, MAGIC, &[child_id, epoch, next]);
    b
}

/// `(child id, epoch, next)`, or `None` when the bytes are not a whole, intact cursor.
fn decode(b: &[u8]) -> Option<(u64, u64, u64)> {
    let [child_id, epoch, next] = decode_record(b, MAGIC)?;
    Some((child_id, epoch, next))
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
    fn advances_in_place_and_survives_a_torn_slot() {
        let d = tempfile::tempdir().unwrap();
        let c = CursorDir::new(d.path());
        c.store(A, 10).unwrap();
        let mut f = c.open(A, 10).unwrap();
        assert!(!f.unsynced());
        for next in [11, 12, 13] {
            f.advance(next).unwrap();
            // Readable at once by a restart after kill -9 (the page cache holds it).
            assert_eq!(c.load(A).unwrap(), Loaded::At(next));
        }
        assert!(f.unsynced());
        f.sync().unwrap();
        assert!(!f.unsynced());
        // seq 4 (next 13) is in slot 0, seq 3 (next 12) in slot 1: a torn write of the
        // newest slot falls back to the one before it, never to garbage.
        let path = c.path(A);
        let mut b = fs::read(&path).unwrap();
        b[30] ^= 0xff;
        fs::write(&path, &b).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(12));
        // Both damaged: the caller must start from a safe place.
        let at = SLOT_STRIDE as usize + 30;
        b[at] ^= 0xff;
        fs::write(&path, &b).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::Corrupt);
        // Reopening a damaged file rewrites it at the position the caller resumes from.
        let mut f = c.open(A, 5).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(5));
        f.advance(6).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(6));
        // A reopened healthy file continues its sequence: the next advance wins.
        drop(f);
        let mut f = c.open(A, 6).unwrap();
        f.advance(7).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(7));
        f.advance(8).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(8));
    }

    #[test]
    fn reads_and_upgrades_the_first_format() {
        let d = tempfile::tempdir().unwrap();
        let c = CursorDir::new(d.path());
        fs::create_dir_all(&c.dir).unwrap();
        fs::write(c.path(A), encode(A.child_id, A.epoch, 77)).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(77));
        let mut f = c.open(A, 77).unwrap();
        assert_eq!(fs::metadata(c.path(A)).unwrap().len(), FILE_LEN as u64);
        assert_eq!(c.load(A).unwrap(), Loaded::At(77));
        f.advance(78).unwrap();
        assert_eq!(c.load(A).unwrap(), Loaded::At(78));
    }

    #[test]
    fn codec() {
        let b = encode(1, 2, u64::MAX);
        assert_eq!(decode(&b), Some((1, 2, u64::MAX)));
        assert_eq!(decode(&b[..LEN - 1]), None);
        assert_eq!(decode(&[0u8; LEN]), None);
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn id() -> impl Strategy<Value = CursorId> {
        (any::<u64>(), any::<u64>()).prop_map(|(child_id, epoch)| CursorId { child_id, epoch })
    }

    /// A two-slot file image: each slot intact for `id`, intact for another cursor, damaged,
    /// or never written.
    fn file(id: CursorId) -> impl Strategy<Value = (Vec<u8>, [Option<Found>; 2])> {
        let slot = move || {
            prop_oneof![
                (any::<u64>(), any::<u64>()).prop_map(move |(seq, next)| (
                    Some(Found { seq, next }),
                    encode_slot(id, seq, next).to_vec()
                )),
                (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(move |(other, seq, next)| {
                    let o = CursorId {
                        child_id: id.child_id ^ other.max(1),
                        epoch: id.epoch,
                    };
                    (None, encode_slot(o, seq, next).to_vec())
                }),
                (any::<u64>(), any::<u64>(), 0..SLOT_LEN, 0..8u8).prop_map(
                    move |(seq, next, at, bit)| {
                        let mut b = encode_slot(id, seq, next);
                        b[at] ^= 1 << bit;
                        (None, b.to_vec())
                    }
                ),
                Just((None, vec![0u8; SLOT_LEN])),
            ]
        };
        (
            slot(),
            slot(),
            vec(any::<u8>(), SLOT_STRIDE as usize - SLOT_LEN),
        )
            .prop_map(|((f0, s0), (f1, s1), gap)| {
                let mut b = s0;
                b.extend_from_slice(&gap);
                b.extend_from_slice(&s1);
                (b, [f0, f1])
            })
    }

    proptest! {
        #[test]
        fn prop_cursor_slot_roundtrip(id in id(), seq in any::<u64>(), next in any::<u64>()) {
            let b = encode_slot(id, seq, next);
            prop_assert_eq!(decode_slot(&b), Some((id.child_id, id.epoch, Found { seq, next })));
            // The slot of the other format is not read as this one, nor a prefix or more.
            prop_assert_eq!(decode(&b), None);
            prop_assert_eq!(decode_slot(&b[..SLOT_LEN - 1]), None);
            let mut longer = b.to_vec();
            longer.push(0);
            prop_assert_eq!(decode_slot(&longer), None);
        }

        #[test]
        fn prop_cursor_v1_roundtrip(c in any::<u64>(), e in any::<u64>(), next in any::<u64>()) {
            let b = encode(c, e, next);
            prop_assert_eq!(decode(&b), Some((c, e, next)));
            prop_assert_eq!(decode_slot(&b), None);
            let id = CursorId { child_id: c, epoch: e };
            prop_assert_eq!(newest(&b, id), Some(Found { seq: 0, next }));
        }

        /// A flipped bit anywhere in a record is never read as a position.
        #[test]
        fn prop_cursor_bit_flip_is_detected(
            id in id(),
            seq in any::<u64>(),
            next in any::<u64>(),
            at in 0..SLOT_LEN,
            bit in 0..8u8,
        ) {
            let mut b = encode_slot(id, seq, next);
            b[at] ^= 1 << bit;
            prop_assert_eq!(decode_slot(&b), None);
            let mut v1 = encode(id.child_id, id.epoch, next);
            let at = at % LEN;
            v1[at] ^= 1 << bit;
            prop_assert_eq!(decode(&v1), None);
        }

        /// The newest intact slot of this cursor wins; damaged slots and other cursors' slots
        /// are ignored.
        #[test]
        fn prop_cursor_newest_intact_slot_wins(
            (id, (b, found)) in id().prop_flat_map(|id| (Just(id), file(id))),
        ) {
            prop_assert_eq!(b.len(), FILE_LEN);
            let want = found.iter().flatten().copied().max_by_key(|f| f.seq);
            prop_assert_eq!(newest(&b, id).map(|f| f.seq), want.map(|f| f.seq));
            if let (Some(a), Some(w)) = (newest(&b, id), want) {
                prop_assert!(found.contains(&Some(a)));
                prop_assert_eq!(a.seq, w.seq);
            }
        }

        #[test]
        fn prop_cursor_decode_arbitrary_bytes(
            id in id(),
            b in prop_oneof![
                vec(any::<u8>(), 0..64),
                vec(any::<u8>(), FILE_LEN - 2..FILE_LEN + 2),
            ],
        ) {
            let _ = decode(&b);
            let _ = decode_slot(&b);
            if let Some(f) = newest(&b, id) {
                // Only an intact record of this cursor is ever found.
                let slot0 = b.get(..SLOT_LEN).and_then(decode_slot);
                let slot1 = b.get(SLOT_STRIDE as usize..SLOT_STRIDE as usize + SLOT_LEN).and_then(decode_slot);
                let v1 = decode(&b).map(|(c, e, next)| (c, e, Found { seq: 0, next }));
                prop_assert!([slot0, slot1, v1].contains(&Some((id.child_id, id.epoch, f))));
            }
        }
    }
}
