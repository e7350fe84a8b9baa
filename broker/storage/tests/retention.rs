//! Retention: whole sealed segments only, never the active one, never a young record; Gone.

mod common;

use common::*;
use narad_storage::{PartitionLog, RetentionOutcome, StorageError};

const HOUR: u64 = 3_600_000;

/// Three sealed segments written at t=1h, 2h, 3h (one segment each) plus an active one at 4h.
fn four_segments(dir: &std::path::Path) -> (PartitionLog, Vec<u64>) {
    let log = PartitionLog::open(dir, small_cfg(1 << 20)).unwrap();
    let mut bases = Vec::new();
    for h in 1..=4u64 {
        bases.push(log.next_offset());
        fill(&log, 10, 5, h * HOUR);
        if h < 4 {
            // seal by age
            let cfg_age = 3_600_000; // default segment_max_age
            assert!(log.roll_if_due(h * HOUR + cfg_age).unwrap());
        }
    }
    assert_eq!(log.stats().segments, 4);
    (log, bases)
}

#[test]
fn retention_zero_keeps_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = four_segments(tmp.path());
    assert_eq!(
        log.enforce_retention(0, 100 * HOUR).unwrap(),
        RetentionOutcome::default()
    );
    assert_eq!(log.stats().segments, 4);
}

#[test]
fn deletes_only_whole_sealed_segments_older_than_retention() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, bases) = four_segments(tmp.path());
    // cutoff = 2h exactly: the segment with last write at 1h goes, the one at 2h is not older
    let out = log.enforce_retention(HOUR, 3 * HOUR).unwrap();
    assert_eq!(out.segments_deleted, 1);
    assert_eq!(out.messages_deleted, 10);
    assert!(out.bytes_deleted > 0);
    assert_eq!(log.oldest_offset(), bases[1]);
    assert_eq!(segment_files(tmp.path()).len(), 3);
    assert_eq!(index_files(tmp.path()).len(), 3);
    // nothing more while the next one is young
    assert_eq!(
        log.enforce_retention(HOUR, 3 * HOUR)
            .unwrap()
            .segments_deleted,
        0
    );
    // Gone below the oldest offset, for read and read_from
    match log.read(0) {
        Err(StorageError::Gone { offset: 0, oldest }) => assert_eq!(oldest, bases[1]),
        other => panic!("expected Gone, got {other:?}"),
    }
    assert!(matches!(
        log.read_from(bases[1] - 1, 10, usize::MAX),
        Err(StorageError::Gone { .. })
    ));
    assert_eq!(check_all(&log), 30);
    // far in the future: every sealed segment goes, the active one (old too) stays
    let out = log.enforce_retention(HOUR, 1_000 * HOUR).unwrap();
    assert_eq!(out.segments_deleted, 2);
    assert_eq!(log.stats().segments, 1);
    assert_eq!(log.oldest_offset(), bases[3]);
    assert_eq!(log.stats().oldest_segment_last_write_ms, 4 * HOUR);
    assert_eq!(check_all(&log), 10);
    // the state survives a reopen
    drop(log);
    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    assert_eq!(log.oldest_offset(), bases[3]);
    assert_eq!(log.high_watermark(), 40);
    assert!(matches!(
        log.read(bases[3] - 1),
        Err(StorageError::Gone { .. })
    ));
    assert_eq!(check_all(&log), 10);
}

#[test]
fn segments_retention_deleted_that_come_back_are_removed_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, bases) = four_segments(tmp.path());
    let files = segment_files(tmp.path());
    let kept_bytes: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(
        log.enforce_retention(HOUR, 4 * HOUR)
            .unwrap()
            .segments_deleted,
        2
    );
    assert_eq!(log.oldest_offset(), bases[2]);
    drop(log);
    // A power loss undid both unlinks (on a file system without a journal they reach the
    // disk only with their directory): the first came back over blocks another file
    // rewrote since, the second whole, with its index.
    std::fs::write(&files[0], b"another file's blocks, not frames".repeat(100)).unwrap();
    std::fs::write(&files[1], &kept_bytes[1]).unwrap();
    let index_1 = files[1].with_extension("index");
    std::fs::write(&index_1, b"stale").unwrap();
    let report = narad_storage::verify_dir(tmp.path()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(
        report.segments.len(),
        2,
        "verify skips what lies below the log start"
    );

    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    assert_eq!(log.oldest_offset(), bases[2], "retention stays done");
    assert_eq!(log.high_watermark(), 40);
    assert_eq!(check_all(&log), 20);
    assert!(!files[0].exists() && !files[1].exists() && !index_1.exists());
    assert_eq!(segment_files(tmp.path()).len(), 2);
    drop(log);

    // A start that no segment is left at or above is corruption, not a fresh log.
    for p in segment_files(tmp.path()) {
        std::fs::remove_file(p).unwrap();
    }
    std::fs::write(&files[0], &kept_bytes[0]).unwrap();
    assert!(matches!(
        PartitionLog::open(tmp.path(), small_cfg(1 << 20)),
        Err(StorageError::Corrupt { .. })
    ));
}

#[test]
fn retention_deletes_even_when_the_log_start_cannot_be_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, bases) = four_segments(tmp.path());
    // A directory where the start file goes: the write fails (as on a full disk, which is
    // when retention matters most), and so does every read of it at open.
    std::fs::create_dir(tmp.path().join("log-start")).unwrap();
    assert_eq!(
        log.enforce_retention(HOUR, 4 * HOUR)
            .unwrap()
            .segments_deleted,
        2
    );
    assert_eq!(segment_files(tmp.path()).len(), 2);
    drop(log);
    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    assert_eq!(log.oldest_offset(), bases[2]);
    assert_eq!(check_all(&log), 20);
}

#[test]
fn a_segment_with_a_young_record_stops_retention() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    fill(&log, 5, 5, HOUR); // old
    fill(&log, 5, 5, 10 * HOUR); // young record in the same segment
    assert!(log.roll_if_due(20 * HOUR).unwrap());
    fill(&log, 5, 5, 20 * HOUR);
    assert!(log.roll_if_due(40 * HOUR).unwrap());
    // cutoff 5h: the first segment's oldest record is old but its newest (10h) is young
    assert_eq!(
        log.enforce_retention(35 * HOUR, 40 * HOUR)
            .unwrap()
            .segments_deleted,
        0
    );
    assert_eq!(log.oldest_offset(), 0);
    // cutoff 10h + 1: the first goes, the second (20h) stays
    assert_eq!(
        log.enforce_retention(30 * HOUR - 1, 40 * HOUR)
            .unwrap()
            .segments_deleted,
        1
    );
    assert_eq!(log.oldest_offset(), 10);
    assert_eq!(check_all(&log), 5);
}

#[test]
fn stats_follow_retention() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, bases) = four_segments(tmp.path());
    let before = log.stats();
    assert_eq!(before.oldest_segment_last_write_ms, HOUR);
    log.enforce_retention(HOUR, 3 * HOUR + 1).unwrap();
    let after = log.stats();
    assert_eq!(after.segments, 2);
    assert_eq!(after.oldest_offset, bases[2]);
    assert_eq!(after.oldest_segment_last_write_ms, 3 * HOUR);
    assert!(after.size_bytes < before.size_bytes);
    assert_eq!(after.next_offset, 40);
}
