//! Per-record attributes: round trips through append, reads, reopen (recovery), index
//! rebuilds and verification, with either codec; frames without attributes unchanged.

mod common;

use std::fs;
use std::path::Path;

use bytes::Bytes;
use common::*;
use narad_storage::frame::FLAG_ATTRS;
use narad_storage::{
    verify_dir, Codec, LogConfig, NewRecord, PartitionLog, StorageError, StoredRecord,
    MAX_ATTRS_BYTES,
};

/// The deterministic attributes of the record at `offset`: none, an empty block (stored as
/// none), a short one, or (rarely) one of the largest size.
fn attrs_for(offset: u64) -> Option<Bytes> {
    match offset % 5 {
        0 => None,
        1 => Some(Bytes::new()),
        2 if offset % 45 == 2 => Some(Bytes::from(vec![(offset % 251) as u8; MAX_ATTRS_BYTES])),
        _ => Some(Bytes::from(format!(
            "\x06region\x07\x00eu-west\x05trace\x05\x00{offset:05}"
        ))),
    }
}

/// Records for offsets `start..start+n`: the common deterministic keys and payloads, with
/// [`attrs_for`] when `attrs`.
fn batch_with(start: u64, n: u64, attrs: bool) -> Vec<NewRecord> {
    batch(start, n)
        .into_iter()
        .zip(start..)
        .map(|(r, o)| NewRecord {
            attrs: if attrs { attrs_for(o) } else { None },
            ..r
        })
        .collect()
}

/// Panics unless `r` has the content of its offset, attributes included (an empty block
/// reads back as none).
fn check_with(r: &StoredRecord, attrs: bool) {
    check(r);
    let want = if attrs {
        attrs_for(r.offset).filter(|a| !a.is_empty())
    } else {
        None
    };
    assert_eq!(r.attrs, want, "attributes of offset {}", r.offset);
}

/// Of every 500 offsets, the first 400 have attributes, the last 100 none.
fn has_attrs(offset: u64) -> bool {
    offset % 500 < 400
}

fn cfg(codec: Codec) -> LogConfig {
    LogConfig {
        codec,
        ..small_cfg(6 * 1024)
    }
}

/// Appends and commits 500 records (the log is at a multiple of 500), 400 with attributes,
/// then 100 without, in appends of varying size.
fn fill_mixed(log: &PartitionLog) {
    let start = log.next_offset();
    assert_eq!(start % 500, 0);
    let mut o = start;
    for (i, n) in [1u64, 7, 64, 65, 3, 100, 160]
        .into_iter()
        .cycle()
        .enumerate()
    {
        if o >= start + 500 {
            break;
        }
        let n = n.min(if has_attrs(o) {
            start + 400 - o
        } else {
            start + 500 - o
        });
        assert_eq!(
            log.append(&batch_with(o, n, has_attrs(o)), 1).unwrap(),
            o..o + n
        );
        if i % 2 == 1 {
            log.commit().unwrap();
        }
        o += n;
    }
    log.commit().unwrap();
}

fn check_log(log: &PartitionLog, hwm: u64) {
    assert_eq!(log.high_watermark(), hwm);
    for o in 0..hwm {
        check_with(&log.read(o).unwrap().unwrap(), has_attrs(o));
    }
    let mut o = 0;
    while o < hwm {
        let got = log.read_from(o, 50, 64 * 1024).unwrap();
        assert!(!got.is_empty());
        for r in got {
            assert_eq!(r.offset, o);
            check_with(&r, has_attrs(o));
            o += 1;
        }
    }
}

#[test]
fn attrs_round_trip_through_append_read_reopen_and_rebuild() {
    for codec in [Codec::None, Codec::Zstd] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let log = PartitionLog::open(&dir, cfg(codec)).unwrap();
        fill_mixed(&log);
        check_log(&log, 500);
        assert!(log.stats().segments > 2, "{codec:?}: {:?}", log.stats());
        drop(log);
        // Recovery: the active segment is scanned, sealed ones trusted by their index.
        let log = PartitionLog::open(&dir, cfg(codec)).unwrap();
        check_log(&log, 500);
        drop(log);
        assert!(verify_dir(&dir).unwrap().is_clean(), "{codec:?}");
        // Every frame with a record with attributes has the flag, the others not.
        for seg in segment_files(&dir) {
            let b = fs::read(&seg).unwrap();
            for f in frames_of(&seg) {
                let flags = b[f.pos as usize + 13];
                let any = (f.base..f.base + f.count)
                    .any(|o| has_attrs(o) && attrs_for(o).is_some_and(|a| !a.is_empty()));
                assert_eq!(flags & FLAG_ATTRS != 0, any, "{codec:?}: {f:?}");
            }
        }
        // Without indexes: every segment rebuilt by a scan.
        for i in index_files(&dir) {
            fs::remove_file(i).unwrap();
        }
        let log = PartitionLog::open(&dir, cfg(codec)).unwrap();
        check_log(&log, 500);
        // And the log goes on, in the other codec too.
        fill_mixed(&log);
        drop(log);
        let other = if codec == Codec::None {
            Codec::Zstd
        } else {
            Codec::None
        };
        let log = PartitionLog::open(&dir, cfg(other)).unwrap();
        check_log(&log, 1000);
        assert!(verify_dir(&dir).unwrap().is_clean());
    }
}

/// Zstd compresses frames with attributes (the flag kept): repeated attributes shrink the
/// log as payloads do.
#[test]
fn zstd_compresses_frames_with_attrs() {
    let tmp = tempfile::tempdir().unwrap();
    let mut sizes = Vec::new();
    for codec in [Codec::Zstd, Codec::None] {
        let dir = tmp.path().join(codec.name());
        let log = PartitionLog::open(&dir, cfg(codec)).unwrap();
        fill_mixed(&log);
        sizes.push(log.stats().size_bytes);
        check_log(&log, 500);
    }
    assert!(sizes[0] * 2 < sizes[1], "zstd {sizes:?}");
}

/// A torn write of frames with attributes is cut back to the last whole frame, as any
/// other torn tail.
#[test]
fn a_torn_tail_of_frames_with_attrs_is_truncated() {
    for codec in [Codec::None, Codec::Zstd] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let cfg = LogConfig {
            segment_max_bytes: 1 << 30,
            ..cfg(codec)
        };
        {
            let log = PartitionLog::open(&dir, cfg.clone()).unwrap();
            for o in (0..300).step_by(30) {
                log.append(&batch_with(o, 30, true), 1).unwrap();
                log.commit().unwrap();
            }
        }
        let seg = &segment_files(&dir)[0];
        let frames = frames_of(seg);
        let last = *frames.last().unwrap();
        assert_eq!(last.base + last.count, 300);
        for cut in [last.pos + 1, last.pos + 50, last.pos + last.len - 1] {
            let case = tmp.path().join(format!("cut{cut}"));
            copy_dir(&dir, &case);
            let f = &segment_files(&case)[0];
            fs::OpenOptions::new()
                .write(true)
                .open(f)
                .unwrap()
                .set_len(cut)
                .unwrap();
            let log = PartitionLog::open(&case, cfg.clone()).unwrap();
            assert_eq!(log.high_watermark(), last.base, "{codec:?} cut {cut}");
            for o in 0..last.base {
                check_with(&log.read(o).unwrap().unwrap(), true);
            }
            assert_eq!(fs::metadata(f).unwrap().len(), last.pos);
        }
    }
}

/// Records without attributes, or with empty blocks, write exactly the bytes they did
/// before attributes existed.
#[test]
fn empty_attrs_write_the_same_log_as_none() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |dir: &Path, attrs: Option<Bytes>| {
        let log = PartitionLog::open(dir, small_cfg(8 * 1024)).unwrap();
        for o in (0..200).step_by(20) {
            let b: Vec<NewRecord> = batch(o, 20)
                .into_iter()
                .map(|r| NewRecord {
                    attrs: attrs.clone(),
                    ..r
                })
                .collect();
            log.append(&b, 1).unwrap();
            log.commit().unwrap();
        }
    };
    let (a, b) = (tmp.path().join("none"), tmp.path().join("empty"));
    write(&a, None);
    write(&b, Some(Bytes::new()));
    let (fa, fb) = (segment_files(&a), segment_files(&b));
    assert!(fa.len() > 1);
    assert_eq!(fa.len(), fb.len());
    for (x, y) in fa.iter().zip(&fb) {
        assert_eq!(
            fs::read(x).unwrap(),
            fs::read(y).unwrap(),
            "{}",
            x.display()
        );
        let bytes = fs::read(x).unwrap();
        for f in frames_of(x) {
            assert_eq!(bytes[f.pos as usize + 13] & FLAG_ATTRS, 0);
        }
    }
    let log = PartitionLog::open(&b, small_cfg(8 * 1024)).unwrap();
    assert_eq!(check_all(&log), 200);
    assert!(log
        .read_from(0, 500, usize::MAX)
        .unwrap()
        .iter()
        .all(|r| r.attrs.is_none()));
}

/// `read_from`'s byte budget counts attributes as it counts keys and payloads.
#[test]
fn the_read_byte_budget_counts_attrs() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
    let recs: Vec<NewRecord> = (0..10)
        .map(|_| NewRecord {
            key: None,
            payload: Bytes::from(vec![1u8; 10]),
            attrs: Some(Bytes::from(vec![2u8; 90])),
        })
        .collect();
    log.append(&recs, 1).unwrap();
    log.commit().unwrap();
    assert_eq!(log.read_from(0, 100, 250).unwrap().len(), 2);
    assert_eq!(log.read_from(0, 100, 1000).unwrap().len(), 10);
    assert_eq!(log.read_from(0, 100, 1).unwrap().len(), 1);
}

#[test]
fn attrs_over_the_bound_are_refused_and_the_log_stays_usable() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
    let over = NewRecord {
        attrs: Some(Bytes::from(vec![0u8; MAX_ATTRS_BYTES + 1])),
        ..rec(None, b"x")
    };
    match log.append(&[rec(None, b"ok"), over], 1) {
        Err(StorageError::TooLarge { size }) => assert_eq!(size, MAX_ATTRS_BYTES + 1),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(log.next_offset(), 0);
    fill(&log, 3, 3, 1);
    assert_eq!(check_all(&log), 3);
}
