//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use narad_storage::frame::{parse_header, FRAME_HEADER_LEN};
use narad_storage::{LogConfig, NewRecord, PartitionLog, StoredRecord};

pub fn rec(key: Option<&[u8]>, payload: &[u8]) -> NewRecord {
    NewRecord {
        key: key.map(Bytes::copy_from_slice),
        payload: Bytes::copy_from_slice(payload),
        attrs: None,
    }
}

/// Deterministic payload of a record at `offset` (length varies with the offset).
pub fn payload_for(offset: u64) -> Vec<u8> {
    let len = 1 + (offset * 37 % 200) as usize;
    let mut v = format!("rec-{offset}-").into_bytes();
    v.extend((0..len).map(|i| (offset as usize * 31 + i) as u8));
    v
}

pub fn key_for(offset: u64) -> Option<Vec<u8>> {
    match offset % 3 {
        0 => None,
        1 => Some(Vec::new()),
        _ => Some(format!("k{offset}").into_bytes()),
    }
}

/// Records for offsets `start..start+n` with the deterministic content.
pub fn batch(start: u64, n: u64) -> Vec<NewRecord> {
    (start..start + n)
        .map(|o| NewRecord {
            key: key_for(o).map(Bytes::from),
            payload: Bytes::from(payload_for(o)),
            attrs: None,
        })
        .collect()
}

/// Panics unless `r` has the deterministic content of its offset.
pub fn check(r: &StoredRecord) {
    assert_eq!(
        r.payload.as_ref(),
        payload_for(r.offset).as_slice(),
        "payload of offset {}",
        r.offset
    );
    assert_eq!(
        r.key.as_deref(),
        key_for(r.offset).as_deref(),
        "key of offset {}",
        r.offset
    );
}

pub fn small_cfg(segment_max_bytes: u64) -> LogConfig {
    LogConfig {
        segment_max_bytes,
        segment_max_age: Duration::from_secs(3600),
        index_interval_bytes: 256,
        verify_from_device: true,
        preallocate: false,
        ..LogConfig::default()
    }
}

/// Appends and commits `n` deterministic records one append of `per` records at a time.
pub fn fill(log: &PartitionLog, n: u64, per: u64, now_ms: u64) {
    let mut left = n;
    while left > 0 {
        let k = left.min(per);
        let start = log.next_offset();
        let r = log.append(&batch(start, k), now_ms).unwrap();
        assert_eq!(r, start..start + k);
        log.commit().unwrap();
        left -= k;
    }
}

/// Sorted segment files (`.log`) of a log directory.
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

pub fn index_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "index"))
        .collect();
    v.sort();
    v
}

/// A frame as found in a segment file.
#[derive(Debug, Clone, Copy)]
pub struct FrameAt {
    pub pos: u64,
    pub len: u64,
    pub base: u64,
    pub count: u64,
}

/// Walks the frames of an intact segment file.
pub fn frames_of(path: &Path) -> Vec<FrameAt> {
    let b = fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut p = 0usize;
    while p + FRAME_HEADER_LEN <= b.len() {
        let h = parse_header(&b[p..]).expect("intact frame");
        out.push(FrameAt {
            pos: p as u64,
            len: h.len as u64,
            base: h.base_offset,
            count: h.count as u64,
        });
        p += h.len as usize;
    }
    out
}

/// Overwrites bytes of a file in place.
pub fn overwrite(path: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at).unwrap();
    f.sync_all().unwrap();
}

pub fn flip_byte(path: &Path, at: u64) {
    let b = fs::read(path).unwrap();
    overwrite(path, at, &[b[at as usize] ^ 0x5a]);
}

pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Reads every committed record one by one and checks contents; returns how many.
pub fn check_all(log: &PartitionLog) -> u64 {
    let hwm = log.high_watermark();
    for o in log.oldest_offset()..hwm {
        let r = log
            .read(o)
            .unwrap()
            .unwrap_or_else(|| panic!("offset {o} missing below hwm {hwm}"));
        assert_eq!(r.offset, o);
        check(&r);
    }
    assert!(log.read(hwm).unwrap().is_none());
    hwm - log.oldest_offset()
}
