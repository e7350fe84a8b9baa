//! Readers running concurrently with the writer (and with retention).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use common::*;
use narad_storage::{PartitionLog, StorageError};
use rand::{Rng, SeedableRng};

#[test]
fn readers_never_see_uncommitted_or_torn_records() {
    let tmp = tempfile::tempdir().unwrap();
    let log = Arc::new(PartitionLog::open(tmp.path(), small_cfg(8_000)).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for seed in 0..3u64 {
        let (log, done) = (log.clone(), done.clone());
        readers.push(thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (mut reads, mut batches) = (0u64, 0u64);
            while !done.load(Ordering::Acquire) {
                // probe around and past the visible end, including uncommitted offsets
                let o = rng.random_range(0..log.next_offset() + 3);
                let r = log.read(o).unwrap();
                let hwm_after = log.high_watermark();
                if let Some(r) = r {
                    assert!(
                        o < hwm_after,
                        "offset {o} read while the high watermark is {hwm_after}"
                    );
                    assert_eq!(r.offset, o);
                    check(&r);
                    reads += 1;
                }
                let from = rng.random_range(0..log.high_watermark() + 1);
                let batch = log
                    .read_from(from, rng.random_range(1..50), rng.random_range(1..20_000))
                    .unwrap();
                let hwm_after = log.high_watermark();
                for (i, r) in batch.iter().enumerate() {
                    assert_eq!(r.offset, from + i as u64);
                    assert!(r.offset < hwm_after);
                    check(r);
                }
                batches += 1;
                let s = log.stats();
                assert!(s.high_watermark <= s.next_offset);
            }
            (reads, batches)
        }));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    for i in 0..250u64 {
        let start = log.next_offset();
        let k = rng.random_range(1..20);
        assert_eq!(log.append(&batch(start, k), i).unwrap(), start..start + k);
        assert!(log.read(start).unwrap().is_none());
        assert_eq!(log.commit().unwrap(), start + k);
    }
    done.store(true, Ordering::Release);
    for r in readers {
        let (reads, batches) = r.join().unwrap();
        assert!(reads > 0 && batches > 0);
    }
    assert!(log.stats().segments > 3);
    check_all(&log);
}

#[test]
fn readers_racing_retention_get_records_or_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let log = Arc::new(PartitionLog::open(tmp.path(), small_cfg(2_000)).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for seed in 0..2u64 {
        let (log, done) = (log.clone(), done.clone());
        readers.push(thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut gone = 0u64;
            while !done.load(Ordering::Acquire) {
                let hwm = log.high_watermark();
                let o = rng.random_range(0..hwm + 1);
                match log.read(o) {
                    Ok(Some(r)) => check(&r),
                    Ok(None) => assert!(o >= hwm),
                    Err(StorageError::Gone { .. }) => {
                        assert!(o < log.oldest_offset());
                        gone += 1;
                    }
                    Err(e) => panic!("offset {o}: {e}"),
                }
                match log.read_from(o, 30, usize::MAX) {
                    Ok(b) => b.iter().for_each(check),
                    Err(StorageError::Gone { .. }) => gone += 1,
                    Err(e) => panic!("batch at {o}: {e}"),
                }
                if rng.random_range(0..50) == 0 {
                    log.close();
                }
            }
            gone
        }));
    }
    // timestamps advance 1 per append; keep ~100 ms of history
    let mut deleted = 0;
    for t in 1..=300u64 {
        let start = log.next_offset();
        log.append(&batch(start, 3), t).unwrap();
        log.commit().unwrap();
        deleted += log.enforce_retention(100, t).unwrap().segments_deleted;
        assert!(log.stats().oldest_segment_last_write_ms + 100 >= t || log.stats().segments == 1);
    }
    done.store(true, Ordering::Release);
    let gone: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(deleted > 5, "retention deleted {deleted} segments");
    assert!(gone > 0, "readers never hit a deleted offset");
    assert!(log.oldest_offset() > 0);
    check_all(&log);
}
