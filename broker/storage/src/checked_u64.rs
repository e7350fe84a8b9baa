//! A number kept in a file of its own, as 12 bytes: the `u64` little-endian, then the CRC-32C
//! of those 8 bytes. A partition's consumer frontier and the WAL's checkpoint are kept so.
//!
//! [`CheckedU64File`] writes one the way a value that changes many times a second should
//! be written: the first write (and the first after an error or a close) replaces the file
//! whole, as a synced temporary file renamed into place with its directory synced after
//! it; later writes overwrite the 12 bytes in place and fdatasync them. That saves a file
//! creation, a rename and their metadata commit per write, and the format stays the one
//! earlier versions read and write.
//!
//! An overwrite in place is one 12-byte write inside the file's first sector, and a device
//! writes a sector whole or not at all (PostgreSQL relies on the same for `pg_control`). A
//! write torn anyway fails the CRC: [`read`] reports the file [`Stored::Damaged`], and its
//! reader falls back to what it would do without the file.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The file's bytes for `value`.
pub fn encode(value: u64) -> [u8; 12] {
    let le = value.to_le_bytes();
    let mut b = [0; 12];
    b[0..8].copy_from_slice(&le);
    b[8..12].copy_from_slice(&crc32c::crc32c(&le).to_le_bytes());
    b
}

/// What a [`read`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    Missing,
    Value(u64),
    /// Not 12 bytes, or their CRC does not match: why, for a log line.
    Damaged(&'static str),
}

/// Reads the number stored at `path`; `Err` only for an I/O error other than a missing file.
pub fn read(path: &Path) -> io::Result<Stored> {
    match fs::read(path) {
        Ok(b) if b.len() == 12 => {
            let le: [u8; 8] = b[0..8].try_into().expect("invariant: 12 bytes");
            if b[8..12] == crc32c::crc32c(&le).to_le_bytes() {
                Ok(Stored::Value(u64::from_le_bytes(le)))
            } else {
                Ok(Stored::Damaged("its checksum does not match"))
            }
        }
        Ok(_) => Ok(Stored::Damaged("it is not 12 bytes long")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Stored::Missing),
        Err(e) => Err(e),
    }
}

/// Replaces the file at `path` with one holding `value` ([`crate::dirs::replace_file`]).
pub fn replace(path: &Path, value: u64) -> io::Result<()> {
    crate::dirs::replace_file(path, &encode(value))
}

/// The file at a path as its one writer keeps it: open between writes, overwritten in place
/// (see the module documentation).
#[derive(Debug)]
pub struct CheckedU64File {
    path: PathBuf,
    open: Option<File>,
}

impl CheckedU64File {
    pub fn new(path: PathBuf) -> Self {
        CheckedU64File { path, open: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stores `value` durably: in place when the file is open, else by [`replace`] (then
    /// kept open for the next write).
    pub fn write(&mut self, value: u64) -> io::Result<()> {
        if let Some(f) = &self.open {
            let res = f
                .write_all_at(&encode(value), 0)
                .and_then(|()| f.sync_data());
            if res.is_err() {
                // Replaced whole next time: nothing is assumed of a file a failed write left.
                self.open = None;
            }
            return res;
        }
        replace(&self.path, value)?;
        // Unopened, the next write replaces the file again.
        self.open = OpenOptions::new().write(true).open(&self.path).ok();
        Ok(())
    }

    /// Closes the file; the next write replaces it.
    pub fn close(&mut self) {
        self.open = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dirs::record_dir_syncs;
    use std::os::unix::fs::MetadataExt;

    /// Replaced whole, its directory synced, by the first write; overwritten in place (the
    /// same file, no directory sync) by later ones; replaced again after a close.
    #[test]
    fn the_first_write_replaces_the_file_and_later_ones_overwrite_it_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let path = d.join("frontier");
        let inode = || fs::metadata(&path).unwrap().ino();
        let mut file = CheckedU64File::new(path.clone());
        let (r, synced) = record_dir_syncs(|| file.write(7));
        r.unwrap();
        assert_eq!(
            synced,
            vec![d.to_path_buf()],
            "the new entry is made durable"
        );
        assert_eq!(read(&path).unwrap(), Stored::Value(7));
        let first = inode();
        for v in [8, 1 << 40, 3] {
            let (r, synced) = record_dir_syncs(|| file.write(v));
            r.unwrap();
            assert!(synced.is_empty(), "{synced:?}");
            assert_eq!(read(&path).unwrap(), Stored::Value(v));
            assert_eq!(inode(), first, "overwritten in place");
        }
        assert_eq!(fs::read(&path).unwrap(), encode(3));
        assert!(!d.join("frontier.tmp").exists());
        file.close();
        let (r, synced) = record_dir_syncs(|| file.write(9));
        r.unwrap();
        assert_eq!(synced, vec![d.to_path_buf()]);
        assert_ne!(inode(), first, "replaced whole after a close");
        assert_eq!(read(&path).unwrap(), Stored::Value(9));
    }

    /// The bytes earlier versions wrote and read (the value little-endian, then the CRC-32C
    /// of those 8 bytes); a short, long or damaged file reads as damaged, none as missing.
    #[test]
    fn the_format_is_the_one_earlier_versions_use() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("checkpoint");
        assert_eq!(read(&path).unwrap(), Stored::Missing);
        let v: u64 = 0x0102_0304_0506_0708;
        let mut old = v.to_le_bytes().to_vec();
        old.extend_from_slice(&crc32c::crc32c(&v.to_le_bytes()).to_le_bytes());
        assert_eq!(encode(v).to_vec(), old);
        fs::write(&path, &old).unwrap();
        assert_eq!(read(&path).unwrap(), Stored::Value(v));
        let mut bad = old.clone();
        bad[3] ^= 1;
        fs::write(&path, &bad).unwrap();
        assert!(matches!(read(&path).unwrap(), Stored::Damaged(_)));
        for len in [0, 11, 13] {
            let mut b = old.clone();
            b.resize(len, 0);
            fs::write(&path, &b).unwrap();
            assert!(
                matches!(read(&path).unwrap(), Stored::Damaged(_)),
                "{len} bytes"
            );
        }
    }
}
