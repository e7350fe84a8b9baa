//! Round trips, visibility, timestamps, segment rolls, reopen, close, stats, destroy.

mod common;

use std::fs;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use narad_storage::{LogConfig, NewRecord, PartitionLog, StorageError, MAX_RECORD_BYTES};

#[test]
fn round_trip_keys_binary_and_big_payloads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p0");
    let log = PartitionLog::open(&dir, LogConfig::default()).unwrap();
    assert_eq!(
        (log.high_watermark(), log.next_offset(), log.oldest_offset()),
        (0, 0, 0)
    );
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let records = vec![
        rec(Some(b"key"), b"{\"json\":true}"),
        rec(None, b"no key"),
        rec(Some(b""), b"empty key"),
        rec(Some(&[0xff, 0x00, 0xfe]), &all_bytes),
        rec(None, b""),
        rec(Some(b"big"), &big),
        rec(None, b"after big"),
    ];
    let range = log.append(&records, 1_000).unwrap();
    assert_eq!(range, 0..7);
    assert_eq!(log.commit().unwrap(), 7);
    for (i, r) in records.iter().enumerate() {
        let got = log.read(i as u64).unwrap().unwrap();
        assert_eq!(got.offset, i as u64);
        assert_eq!(got.timestamp_ms, 1_000);
        assert_eq!(got.key, r.key, "key of {i}");
        assert_eq!(got.payload, r.payload, "payload of {i}");
    }
    // the empty key is distinct from no key
    assert_eq!(log.read(1).unwrap().unwrap().key, None);
    assert_eq!(log.read(2).unwrap().unwrap().key, Some(Bytes::new()));
    let batch = log.read_from(0, 100, usize::MAX).unwrap();
    assert_eq!(batch.len(), 7);
    assert_eq!(batch[5].payload.len(), 1024 * 1024);
    assert!(log.read(7).unwrap().is_none());

    // survives a reopen byte-exact
    drop(log);
    let log = PartitionLog::open(&dir, LogConfig::default()).unwrap();
    assert_eq!((log.high_watermark(), log.next_offset()), (7, 7));
    for (i, r) in records.iter().enumerate() {
        let got = log.read(i as u64).unwrap().unwrap();
        assert_eq!((got.key, got.payload), (r.key.clone(), r.payload.clone()));
    }
}

#[test]
fn records_are_invisible_before_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
    fill(&log, 5, 5, 10);
    let r = log.append(&batch(5, 3), 20).unwrap();
    assert_eq!(r, 5..8);
    assert_eq!(log.next_offset(), 8);
    assert_eq!(log.high_watermark(), 5);
    for o in 5..8 {
        assert!(
            log.read(o).unwrap().is_none(),
            "offset {o} visible before commit"
        );
    }
    assert_eq!(log.read_from(0, 100, usize::MAX).unwrap().len(), 5);
    assert!(log.read_from(5, 100, usize::MAX).unwrap().is_empty());
    assert_eq!(log.stats().high_watermark, 5);
    assert_eq!(log.commit().unwrap(), 8);
    assert_eq!(log.read_from(0, 100, usize::MAX).unwrap().len(), 8);
    check(&log.read(7).unwrap().unwrap());
    // commit with nothing pending is a no-op
    assert_eq!(log.commit().unwrap(), 8);
    // an empty append assigns nothing
    assert_eq!(log.append(&[], 30).unwrap(), 8..8);
}

#[test]
fn timestamps_are_monotonic_even_if_the_clock_goes_back() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
    log.append(&batch(0, 1), 5_000).unwrap();
    log.append(&batch(1, 1), 4_000).unwrap();
    log.commit().unwrap();
    log.append(&batch(2, 1), 1_000).unwrap();
    log.append(&batch(3, 1), 6_000).unwrap();
    log.commit().unwrap();
    let ts: Vec<u64> = log
        .read_from(0, 10, usize::MAX)
        .unwrap()
        .iter()
        .map(|r| r.timestamp_ms)
        .collect();
    assert_eq!(ts, vec![5_000, 5_000, 5_000, 6_000]);
    drop(log);
    // the last timestamp survives a reopen
    let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
    log.append(&batch(4, 1), 10).unwrap();
    log.commit().unwrap();
    assert_eq!(log.read(4).unwrap().unwrap().timestamp_ms, 6_000);
}

#[test]
fn too_large_records_are_refused_and_the_log_stays_usable() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), LogConfig::default()).unwrap();
    let huge = NewRecord {
        key: Some(Bytes::from_static(b"k")),
        payload: Bytes::from(vec![0u8; MAX_RECORD_BYTES]),
        attrs: None,
    };
    match log.append(&[rec(None, b"ok"), huge], 1) {
        Err(StorageError::TooLarge { size }) => assert_eq!(size, MAX_RECORD_BYTES + 1),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(log.next_offset(), 0);
    fill(&log, 3, 3, 1);
    assert_eq!(check_all(&log), 3);
}

#[test]
fn read_from_respects_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(2_000)).unwrap();
    fill(&log, 300, 7, 1);
    let all = log.read_from(0, 1_000, usize::MAX).unwrap();
    assert_eq!(all.len(), 300);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.offset, i as u64);
        check(r);
    }
    assert_eq!(
        log.read_from(10, 5, usize::MAX)
            .unwrap()
            .iter()
            .map(|r| r.offset)
            .collect::<Vec<_>>(),
        vec![10, 11, 12, 13, 14]
    );
    // at least one record even when it alone exceeds max_bytes
    assert_eq!(log.read_from(42, 100, 1).unwrap().len(), 1);
    // max_bytes bounds key + payload bytes
    let some = log.read_from(0, 1_000, 1_000).unwrap();
    let size: usize = some
        .iter()
        .map(|r| r.payload.len() + r.key.as_ref().map_or(0, |k| k.len()))
        .sum();
    assert!(size <= 1_000 && !some.is_empty());
    let next = &some.last().unwrap();
    let extra = log.read(next.offset + 1).unwrap().unwrap();
    assert!(size + extra.payload.len() + extra.key.as_ref().map_or(0, |k| k.len()) > 1_000);
    assert!(log.read_from(300, 10, usize::MAX).unwrap().is_empty());
    assert!(log.read_from(0, 0, usize::MAX).unwrap().is_empty());
    assert_eq!(log.read_from(295, 100, usize::MAX).unwrap().len(), 5);
}

#[test]
fn offsets_are_contiguous_across_segment_rolls_and_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let cfg = small_cfg(1_024);
    let log = PartitionLog::open(&dir, cfg.clone()).unwrap();
    let mut n = 0u64;
    for i in 0..120u64 {
        let k = 1 + i % 9;
        let r = log.append(&batch(n, k), 100 + i).unwrap();
        assert_eq!(r, n..n + k);
        n += k;
        if i % 3 == 0 {
            log.commit().unwrap();
        }
    }
    log.commit().unwrap();
    let files = segment_files(&dir);
    assert!(
        files.len() > 5,
        "expected many segments, got {}",
        files.len()
    );
    assert_eq!(log.stats().segments, files.len() as u64);
    // segment files are named by base offset; no file (beyond a single frame) exceeds the max
    let mut expected_base = 0;
    for f in &files {
        let frames = frames_of(f);
        let name: u64 = f.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        assert_eq!(name, expected_base);
        assert_eq!(frames[0].base, expected_base);
        let len = fs::metadata(f).unwrap().len();
        assert!(
            len <= cfg.segment_max_bytes || frames.len() == 1,
            "{} is {len} bytes",
            f.display()
        );
        let last = frames.last().unwrap();
        expected_base = last.base + last.count;
    }
    assert_eq!(expected_base, n);
    assert_eq!(check_all(&log), n);
    assert_eq!(
        log.read_from(0, 10_000, usize::MAX).unwrap().len() as u64,
        n
    );
    let stats = log.stats();
    drop(log);

    let log = PartitionLog::open(&dir, cfg).unwrap();
    assert_eq!(log.high_watermark(), n);
    assert_eq!(log.next_offset(), n);
    let again = log.stats();
    assert_eq!(
        (
            again.segments,
            again.size_bytes,
            again.oldest_segment_last_write_ms
        ),
        (
            stats.segments,
            stats.size_bytes,
            stats.oldest_segment_last_write_ms
        )
    );
    assert_eq!(check_all(&log), n);
    fill(&log, 10, 4, 500);
    assert_eq!(check_all(&log), n + 10);
    assert!(narad_storage::verify_dir(&dir).unwrap().is_clean());
}

#[test]
fn a_record_larger_than_a_segment_gets_its_own_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(1_000)).unwrap();
    fill(&log, 3, 3, 1);
    let big = vec![7u8; 5_000];
    assert_eq!(log.append(&[rec(None, &big)], 2).unwrap(), 3..4);
    fill(&log, 3, 3, 3);
    let files = segment_files(tmp.path());
    assert_eq!(files.len(), 3);
    assert_eq!(frames_of(&files[1]).len(), 1);
    assert_eq!(log.read(3).unwrap().unwrap().payload.len(), 5_000);
}

#[test]
fn stats_report_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(1_000)).unwrap();
    let s = log.stats();
    assert_eq!(
        (
            s.segments,
            s.oldest_offset,
            s.next_offset,
            s.high_watermark,
            s.size_bytes,
            s.oldest_segment_last_write_ms
        ),
        (1, 0, 0, 0, 0, 0)
    );
    fill(&log, 10, 2, 1_000);
    fill(&log, 40, 2, 2_000);
    let s = log.stats();
    assert!(s.segments > 1);
    assert_eq!(
        (s.next_offset, s.high_watermark, s.oldest_offset),
        (50, 50, 0)
    );
    let on_disk: u64 = segment_files(tmp.path())
        .iter()
        .map(|f| fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(s.size_bytes, on_disk);
    assert!(s.oldest_segment_last_write_ms == 1_000 || s.oldest_segment_last_write_ms == 2_000);
}

#[test]
fn roll_if_due_seals_an_old_non_empty_active_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        segment_max_age: Duration::from_secs(1),
        ..LogConfig::default()
    };
    let log = PartitionLog::open(tmp.path(), cfg.clone()).unwrap();
    assert!(
        !log.roll_if_due(1_000_000).unwrap(),
        "empty active segment must not roll"
    );
    fill(&log, 3, 3, 10_000);
    fill(&log, 3, 3, 10_900);
    assert!(!log.roll_if_due(10_999).unwrap());
    assert!(log.roll_if_due(11_000).unwrap());
    assert_eq!(log.stats().segments, 2);
    assert!(
        !log.roll_if_due(20_000).unwrap(),
        "the new active segment is empty"
    );
    fill(&log, 2, 2, 20_000);
    assert_eq!(check_all(&log), 8);
    // rolling between append and commit is fine too
    log.append(&batch(8, 2), 30_000).unwrap();
    assert!(log.roll_if_due(40_000).unwrap());
    assert_eq!(log.commit().unwrap(), 10);
    assert_eq!(check_all(&log), 10);
    drop(log);
    let log = PartitionLog::open(tmp.path(), cfg).unwrap();
    assert_eq!(log.stats().segments, 3);
    assert_eq!(check_all(&log), 10);
}

#[test]
fn close_drops_files_and_reads_reopen_lazily() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("closing");
    let log = PartitionLog::open(&dir, small_cfg(500)).unwrap();
    fill(&log, 40, 3, 1);
    let open_fds = || {
        fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| fs::read_link(e.unwrap().path()).ok())
            .filter(|p| p.starts_with(&dir))
            .count()
    };
    assert!(open_fds() > 0);
    log.close();
    assert_eq!(open_fds(), 0, "files still open after close");
    assert_eq!(check_all(&log), 40);
    log.close();
    fill(&log, 5, 5, 2);
    assert_eq!(check_all(&log), 45);
}

#[test]
fn destroy_removes_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("doomed");
    let log = PartitionLog::open(&dir, small_cfg(500)).unwrap();
    fill(&log, 20, 3, 1);
    log.destroy().unwrap();
    assert!(!dir.exists());
}

#[test]
fn rejected_commit_rolls_back_and_the_log_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    fill(&log, 10, 5, 1);
    let seg = segment_files(tmp.path()).pop().unwrap();
    let committed_len = fs::metadata(&seg).unwrap().len();
    log.append(&batch(10, 5), 2).unwrap();
    // damage what was appended but not yet committed (as a bad disk or a stray writer would)
    let len = fs::metadata(&seg).unwrap().len();
    overwrite(&seg, len - 3, b"XYZ");
    match log.commit() {
        Err(StorageError::VerifyFailed { offset, .. }) => assert_eq!(offset, 10),
        other => panic!("expected VerifyFailed, got {other:?}"),
    }
    assert_eq!((log.high_watermark(), log.next_offset()), (10, 10));
    assert_eq!(fs::metadata(&seg).unwrap().len(), committed_len);
    assert!(log.read(10).unwrap().is_none());
    // the retry gets the same offsets
    assert_eq!(log.append(&batch(10, 5), 3).unwrap(), 10..15);
    assert_eq!(log.commit().unwrap(), 15);
    assert_eq!(check_all(&log), 15);
}

#[test]
fn rejected_commit_across_a_roll_removes_the_new_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(600)).unwrap();
    fill(&log, 3, 3, 1);
    let before = segment_files(tmp.path());
    log.append(&batch(3, 200), 2).unwrap(); // 4 frames of <= 64 records, one segment each
    let after = segment_files(tmp.path());
    assert!(after.len() > before.len() + 1);
    let last = after.last().unwrap();
    let len = fs::metadata(last).unwrap().len();
    overwrite(last, len / 2, &[0xAA; 8]);
    assert!(matches!(
        log.commit(),
        Err(StorageError::VerifyFailed { .. })
    ));
    assert_eq!(segment_files(tmp.path()), before);
    assert_eq!((log.high_watermark(), log.next_offset()), (3, 3));
    fill(&log, 200, 200, 3);
    assert_eq!(check_all(&log), 203);
    drop(log);
    let log = PartitionLog::open(tmp.path(), small_cfg(600)).unwrap();
    assert_eq!(check_all(&log), 203);
}

/// With `preallocate`, only the active segment carries zeros after its frames: a roll cuts
/// the sealed file to its frames (so the next open trusts its index instead of rebuilding
/// it), a failed commit's rollback cuts them too, and a reopen ends the file at its frames.
#[test]
fn preallocated_zeros_are_cut_when_a_segment_is_sealed_rolled_back_or_reopened() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        preallocate: true,
        ..small_cfg(4_000)
    };
    let log = PartitionLog::open(tmp.path(), cfg.clone()).unwrap();
    fill(&log, 90, 3, 1);
    let files = log.segment_files();
    assert!(files.len() >= 3);
    let on_disk = |name: &str| fs::metadata(tmp.path().join(name)).unwrap().len();
    let (active, sealed) = files.split_last().unwrap();
    for f in sealed {
        assert!(f.sealed);
        assert_eq!(on_disk(&f.name), f.size, "{} ends at its frames", f.name);
    }
    assert!(
        on_disk(&active.name) > active.size,
        "zeros ahead of the frames"
    );
    // A commit that fails verification rolls back to the high watermark, zeros included.
    log.append(&batch(90, 1), 2).unwrap();
    let frames_end = active.size;
    overwrite(&tmp.path().join(&active.name), frames_end + 30, &[0xAA; 4]);
    assert!(matches!(
        log.commit(),
        Err(StorageError::VerifyFailed { .. })
    ));
    assert_eq!(on_disk(&active.name), frames_end);
    fill(&log, 5, 1, 3);
    drop(log);
    let log = PartitionLog::open(tmp.path(), cfg).unwrap();
    assert_eq!(check_all(&log), 95);
    let files = log.segment_files();
    for f in &files {
        assert_eq!(on_disk(&f.name), f.size, "{} after reopen", f.name);
    }
    assert!(narad_storage::verify_dir(tmp.path()).unwrap().is_clean());
}
