//! Runs of zeros written into files (the preallocation of WAL and segment files) from one
//! static buffer that is never written. Its pages are shared and never cleared, so a run
//! neither allocates nor makes the kernel zero fresh memory: a new `vec![0u8; n]` per run did
//! both, and clearing the huge page behind each one was an eighth of a produce's CPU.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The largest run written by one call.
const CHUNK: usize = 128 * 1024;
static ZEROS: [u8; CHUNK] = [0; CHUNK];

/// Writes `len` zero bytes to `f` at `offset` (positional: the file offset is not moved).
pub fn write_zeros_at(f: &File, offset: u64, len: u64) -> io::Result<()> {
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        f.write_all_at(&ZEROS[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_exactly_the_run_asked_for_around_existing_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let len = 2 * CHUNK as u64 + 12_345;
        f.write_all_at(&[7u8; 10], 0).unwrap();
        f.write_all_at(&[9u8; 3], 10 + len).unwrap();
        write_zeros_at(&f, 10, len).unwrap();
        write_zeros_at(&f, 5, 0).unwrap();
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len() as u64, 10 + len + 3);
        assert!(
            data[..10].iter().all(|b| *b == 7),
            "before the run: untouched"
        );
        assert!(data[10..10 + len as usize].iter().all(|b| *b == 0));
        assert_eq!(
            &data[10 + len as usize..],
            &[9, 9, 9],
            "after the run: untouched"
        );
    }
}
