//! Crash recovery: torn tails, corruption before valid data, sealed-segment corruption,
//! index rebuild, offline verification.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use narad_storage::{verify_dir, LogConfig, PartitionLog, StorageError};
use rand::{Rng, SeedableRng};

/// A log of several segments whose last segment holds many single-frame commits; returns
/// the (active segment's frame bytes, next offset) after each commit into it.
fn build(dir: &Path, cfg: LogConfig) -> Vec<(u64, u64)> {
    let log = PartitionLog::open(dir, cfg).unwrap();
    fill(&log, 60, 3, 1);
    let frames = |log: &PartitionLog| log.segment_files().pop().unwrap().size;
    let mut bounds = vec![(frames(&log), log.next_offset())];
    // grow the active segment without rolling: one frame per commit
    for i in 0..40u64 {
        let k = 1 + i % 4;
        let before = segment_files(dir).len();
        log.append(&batch(log.next_offset(), k), 2).unwrap();
        log.commit().unwrap();
        if segment_files(dir).len() != before {
            bounds.clear();
        }
        bounds.push((frames(&log), log.next_offset()));
    }
    assert!(segment_files(dir).len() >= 3);
    bounds.retain(|&(len, _)| len > 0);
    bounds
}

#[test]
fn torn_tail_at_random_cut_points_is_truncated() {
    torn_tail_at_random_cut_points(small_cfg(4_000));
}

/// With zeros written ahead of the frames, the cuts land in frames and in the zeros alike;
/// whatever the zeros become, recovery ends the file at the last whole frame.
#[test]
fn torn_tail_at_random_cut_points_is_truncated_when_preallocating() {
    torn_tail_at_random_cut_points(LogConfig {
        preallocate: true,
        ..small_cfg(4_000)
    });
}

fn torn_tail_at_random_cut_points(cfg: LogConfig) {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let bounds = build(&pristine, cfg.clone());
    let active_name = segment_files(&pristine)
        .pop()
        .unwrap()
        .file_name()
        .unwrap()
        .to_owned();
    let active_base: u64 = active_name
        .to_str()
        .unwrap()
        .trim_end_matches(".log")
        .parse()
        .unwrap();
    let full_len = fs::metadata(pristine.join(&active_name)).unwrap().len();
    assert!(bounds.len() > 5);
    if cfg.preallocate {
        assert!(
            full_len > bounds.last().unwrap().0,
            "zeros after the frames"
        );
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for case in 0..60 {
        let dir = tmp.path().join(format!("case{case}"));
        copy_dir(&pristine, &dir);
        let file = dir.join(&active_name);
        let cut = rng.random_range(0..full_len);
        let mode = case % 3;
        match mode {
            0 => fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .unwrap()
                .set_len(cut)
                .unwrap(),
            1 => {
                let garbage: Vec<u8> = (cut..full_len).map(|_| rng.random()).collect();
                overwrite(&file, cut, &garbage);
            }
            _ => overwrite(&file, cut, &vec![0u8; (full_len - cut) as usize]),
        }
        // frames fully before the cut survive, the rest goes
        let (keep_len, keep_next) = bounds
            .iter()
            .rev()
            .find(|&&(len, _)| len <= cut)
            .copied()
            .unwrap_or((0, active_base));
        let log = PartitionLog::open(&dir, cfg.clone())
            .unwrap_or_else(|e| panic!("case {case} (mode {mode}, cut {cut}): {e}"));
        assert_eq!(
            log.high_watermark(),
            keep_next,
            "case {case} mode {mode} cut {cut}"
        );
        assert_eq!(log.next_offset(), keep_next);
        assert_eq!(
            fs::metadata(&file).unwrap().len(),
            keep_len,
            "case {case}: file not truncated at the frame start"
        );
        assert_eq!(check_all(&log), keep_next);
        // appending afterwards works and survives another reopen
        fill(&log, 7, 3, 3);
        drop(log);
        let log = PartitionLog::open(&dir, cfg.clone()).unwrap();
        assert_eq!(check_all(&log), keep_next + 7);
        assert!(verify_dir(&dir).unwrap().is_clean(), "case {case}");
        drop(log);
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn corruption_followed_by_valid_frames_fails_the_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    // one index point only: the open scans the whole active segment
    let cfg = narad_storage::LogConfig {
        index_interval_bytes: 1 << 20,
        ..small_cfg(1 << 20)
    };
    {
        let log = PartitionLog::open(&dir, cfg.clone()).unwrap();
        fill(&log, 30, 1, 1); // 30 frames, each committed
    }
    let file = segment_files(&dir).pop().unwrap();
    let frames = frames_of(&file);
    let victim = frames[10];
    let len = fs::metadata(&file).unwrap().len();
    for (name, at) in [
        ("payload", victim.pos + victim.len - 2),
        ("magic", victim.pos),
        ("length", victim.pos + 5),
    ] {
        for without_index in [false, true] {
            let case = tmp.path().join(format!("{name}-{without_index}"));
            copy_dir(&dir, &case);
            let f = case.join(file.file_name().unwrap());
            flip_byte(&f, at);
            if without_index {
                // no index header: the later frames' attested high watermark is the evidence
                for i in index_files(&case) {
                    fs::remove_file(i).unwrap();
                }
            }
            match PartitionLog::open(&case, cfg.clone()) {
                Err(StorageError::Corrupt { position, .. }) => {
                    assert_eq!(position, victim.pos, "{name}")
                }
                Err(e) => panic!("{name}/{without_index}: expected Corrupt, got {e}"),
                Ok(_) => panic!("{name}/{without_index}: corrupt log opened"),
            }
            assert_eq!(
                fs::metadata(&f).unwrap().len(),
                len,
                "a corrupt log must not be truncated"
            );
            assert!(!verify_dir(&case).unwrap().is_clean());
        }
    }
}

#[test]
fn corruption_behind_the_last_index_point_is_found_on_read() {
    // The open only scans the active segment from its last valid index point on; damage
    // before it is committed data and reads as Unreadable (like in a sealed segment).
    let tmp = tempfile::tempdir().unwrap();
    {
        let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
        fill(&log, 30, 1, 1);
    }
    let file = segment_files(tmp.path()).pop().unwrap();
    let victim = frames_of(&file)[3];
    flip_byte(&file, victim.pos + victim.len - 1);
    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    assert_eq!(log.high_watermark(), 30);
    assert!(matches!(
        log.read(victim.base),
        Err(StorageError::Unreadable { .. })
    ));
    check(&log.read(victim.base + 1).unwrap().unwrap());
    check(&log.read(victim.base - 1).unwrap().unwrap());
}

#[test]
fn damaged_unsynced_write_followed_by_its_own_frames_is_a_torn_tail() {
    // A power cut can persist the later pages of a multi-frame write but not the first;
    // nothing of that write was committed, so it is a torn tail, not corruption.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let committed_len;
    {
        let log = PartitionLog::open(&dir, small_cfg(1 << 20)).unwrap();
        fill(&log, 20, 2, 1);
        committed_len = fs::metadata(segment_files(&dir).pop().unwrap())
            .unwrap()
            .len();
        log.append(&batch(20, 200), 2).unwrap(); // several frames, never committed
    }
    let file = segment_files(&dir).pop().unwrap();
    let frames = frames_of(&file);
    let first_uncommitted = frames
        .iter()
        .find(|f| f.pos == committed_len)
        .copied()
        .unwrap();
    assert!(frames.len() > 12);
    flip_byte(&file, first_uncommitted.pos + 50);
    let log = PartitionLog::open(&dir, small_cfg(1 << 20)).unwrap();
    assert_eq!(log.high_watermark(), 20);
    assert_eq!(fs::metadata(&file).unwrap().len(), committed_len);
    assert_eq!(check_all(&log), 20);
    fill(&log, 5, 5, 3);
    assert_eq!(check_all(&log), 25);
}

#[test]
fn unsynced_but_intact_frames_are_recovered() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
        fill(&log, 10, 2, 1);
        log.append(&batch(10, 5), 2).unwrap();
    }
    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    assert_eq!((log.high_watermark(), log.next_offset()), (15, 15));
    assert_eq!(check_all(&log), 15);
}

/// Builds a multi-segment log, returns the first segment file and its frames.
fn sealed_fixture(dir: &Path) -> (std::path::PathBuf, Vec<FrameAt>) {
    let log = PartitionLog::open(dir, small_cfg(3_000)).unwrap();
    fill(&log, 120, 2, 1);
    let files = segment_files(dir);
    assert!(files.len() >= 3);
    let frames = frames_of(&files[0]);
    assert!(frames.len() >= 5);
    (files[0].clone(), frames)
}

fn assert_only_victim_unreadable(log: &PartitionLog, victim: FrameAt) {
    for o in 0..log.high_watermark() {
        let r = log.read(o);
        if o >= victim.base && o < victim.base + victim.count {
            match r {
                Err(StorageError::Unreadable { offset, .. }) => assert_eq!(offset, o),
                other => panic!("offset {o}: expected Unreadable, got {other:?}"),
            }
        } else {
            check(&r.unwrap_or_else(|e| panic!("offset {o}: {e}")).unwrap());
        }
    }
    // batch reads stop before the damage, fail at it, and resume after it
    let before = log.read_from(0, 1_000, usize::MAX).unwrap();
    assert_eq!(before.len() as u64, victim.base);
    assert!(matches!(
        log.read_from(victim.base, 10, usize::MAX),
        Err(StorageError::Unreadable { .. })
    ));
    let after = log
        .read_from(victim.base + victim.count, 1_000, usize::MAX)
        .unwrap();
    assert_eq!(after[0].offset, victim.base + victim.count);
    assert_eq!(after.last().unwrap().offset, log.high_watermark() - 1);
}

#[test]
fn corruption_in_a_sealed_segment_reads_as_unreadable() {
    for (name, byte) in [("payload", 60u64), ("length", 5), ("magic", 0)] {
        for without_index in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let (file, frames) = sealed_fixture(tmp.path());
            let victim = frames[3];
            flip_byte(&file, victim.pos + byte.min(victim.len - 1));
            if without_index {
                fs::remove_file(file.with_extension("index")).unwrap();
            }
            let log = PartitionLog::open(tmp.path(), small_cfg(3_000)).unwrap_or_else(|e| {
                panic!("{name}/{without_index}: sealed corruption must not fail the open: {e}")
            });
            assert_eq!(log.high_watermark(), 120);
            assert_only_victim_unreadable(&log, victim);
            // appends still work
            fill(&log, 3, 3, 5);
            assert_eq!(log.read(121).unwrap().unwrap().offset, 121);
        }
    }
}

#[test]
fn corruption_under_a_live_log_is_detected_on_read() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(3_000)).unwrap();
    fill(&log, 120, 2, 1);
    log.close(); // drop cached frames
    let file = segment_files(tmp.path()).remove(1);
    let victim = frames_of(&file)[2];
    flip_byte(&file, victim.pos + victim.len - 1);
    assert_only_victim_unreadable(&log, victim);
}

#[test]
fn a_missing_middle_segment_reads_as_unreadable() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, _) = sealed_fixture(tmp.path());
    let files = segment_files(tmp.path());
    let gone = &files[1];
    let frames = frames_of(gone);
    let (from, to) = (
        frames[0].base,
        frames.last().unwrap().base + frames.last().unwrap().count,
    );
    fs::remove_file(gone).unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(3_000)).unwrap();
    assert_eq!(log.high_watermark(), 120);
    check(&log.read(from - 1).unwrap().unwrap());
    for o in from..to {
        assert!(
            matches!(log.read(o), Err(StorageError::Unreadable { .. })),
            "offset {o}"
        );
    }
    check(&log.read(to).unwrap().unwrap());
}

#[test]
fn missing_or_garbage_indexes_are_rebuilt() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for mode in ["delete", "garbage", "truncate", "swap"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        {
            let log = PartitionLog::open(dir, small_cfg(3_000)).unwrap();
            fill(&log, 150, 2, 1);
        }
        let idx = index_files(dir);
        assert_eq!(idx.len(), segment_files(dir).len());
        let originals: Vec<Vec<u8>> = idx.iter().map(|p| fs::read(p).unwrap()).collect();
        assert!(originals[0].len() > 56, "the sealed index has entries");
        for (i, p) in idx.iter().enumerate() {
            match mode {
                "delete" => fs::remove_file(p).unwrap(),
                "garbage" => fs::write(
                    p,
                    (0..originals[i].len())
                        .map(|_| rng.random::<u8>())
                        .collect::<Vec<_>>(),
                )
                .unwrap(),
                "truncate" => fs::write(p, &originals[i][..originals[i].len() / 2]).unwrap(),
                _ => fs::write(p, &originals[(i + 1) % originals.len()]).unwrap(),
            }
        }
        let log = PartitionLog::open(dir, small_cfg(3_000)).unwrap();
        assert_eq!(log.high_watermark(), 150, "{mode}");
        assert_eq!(check_all(&log), 150);
        assert_eq!(log.read_from(0, 1_000, usize::MAX).unwrap().len(), 150);
        // the indexes were rewritten and are consistent with the log
        let report = verify_dir(dir).unwrap();
        assert!(report.is_clean(), "{mode}: {:?}", report.problems);
        for s in &report.segments {
            assert_eq!(s.index, "ok", "{mode}: {}", s.path.display());
        }
        for (i, p) in idx.iter().enumerate() {
            assert_eq!(
                fs::read(p).unwrap(),
                originals[i],
                "{mode}: rebuilt index differs from the original"
            );
        }
    }
}

#[test]
fn verify_reports_a_clean_log() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(3_000)).unwrap();
    fill(&log, 100, 3, 1);
    let r = verify_dir(tmp.path()).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    assert_eq!(r.segments.iter().map(|s| s.records).sum::<u64>(), 100);
    assert_eq!(r.segments.last().unwrap().end_offset, 100);
}

/// The end offset in the index header of the active segment, as on disk.
fn header_end(dir: &Path) -> u64 {
    let idx = index_files(dir).pop().expect("an index file");
    let base: u64 = idx.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    narad_storage::index::parse_file(&fs::read(&idx).unwrap(), base)
        .unwrap()
        .header
        .end_offset
}

#[test]
fn the_index_header_is_written_after_multi_frame_commits_new_segments_and_a_close() {
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    let started = std::time::Instant::now();
    fill(&log, 1, 1, 1);
    assert_eq!(header_end(tmp.path()), 1, "the segment's first commit");
    fill(&log, 3, 1, 1);
    // One-frame commits within 50 ms of the last header write leave it (a later frame
    // attests them). Only checked when this thread was not held up for that long.
    if started.elapsed() < std::time::Duration::from_millis(40) {
        assert_eq!(header_end(tmp.path()), 1, "one-frame commits");
    }
    let start = log.next_offset();
    log.append(&batch(start, 200), 2).unwrap();
    log.commit().unwrap();
    assert_eq!(header_end(tmp.path()), start + 200, "a multi-frame commit");
    fill(&log, 1, 1, 3);
    drop(log);
    assert_eq!(header_end(tmp.path()), start + 201, "written at drop");
}

#[test]
fn damage_in_a_committed_multi_frame_write_is_corruption_after_one_frame_commits() {
    // The last commit wrote several frames; a crash follows (no close). Damage to its first
    // frame with its second intact is committed data lost: the open must not truncate it as
    // a torn write, although the one-frame commits before it did not write the header. It
    // refuses the open, or (when an index point past the damage lets it start scanning
    // there) opens with the damaged frame unreadable and everything else kept.
    let tmp = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(tmp.path(), small_cfg(1 << 20)).unwrap();
    fill(&log, 5, 1, 1);
    log.append(&batch(5, 200), 2).unwrap();
    log.commit().unwrap();
    std::mem::forget(log); // a crash: nothing written at drop
    let file = segment_files(tmp.path()).pop().unwrap();
    let frames = frames_of(&file);
    let victim = *frames.iter().find(|f| f.base == 5).unwrap();
    assert!(
        frames.iter().any(|f| f.base > victim.base),
        "several frames"
    );
    flip_byte(&file, victim.pos + victim.len - 2);
    let len = fs::metadata(&file).unwrap().len();
    match PartitionLog::open(tmp.path(), small_cfg(1 << 20)) {
        Err(StorageError::Corrupt { position, .. }) => assert_eq!(position, victim.pos),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(log) => {
            assert_eq!(log.high_watermark(), 205);
            assert!(matches!(
                log.read(victim.base),
                Err(StorageError::Unreadable { .. })
            ));
            check(&log.read(204).unwrap().unwrap());
        }
    }
    assert_eq!(fs::metadata(&file).unwrap().len(), len, "nothing truncated");
}
