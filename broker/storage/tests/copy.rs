//! A verbatim copy (partition moves): list the segment files with their committed sizes,
//! copy byte ranges while the log keeps growing, and reopen the copy at the exact high
//! watermark.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use common::*;
use narad_storage::PartitionLog;

/// Brings `to` up to the source's committed sizes in chunks of `chunk` bytes; removes
/// copies of segments the source no longer has (retention).
fn sync(src: &PartitionLog, to: &Path, chunk: usize) {
    fs::create_dir_all(to).unwrap();
    let files = src.segment_files();
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    for e in fs::read_dir(to).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if !names.contains(&n.as_str()) {
            fs::remove_file(e.path()).unwrap();
        }
    }
    for f in files {
        let path = to.join(&f.name);
        let have = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let mut out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let mut pos = have;
        while pos < f.size {
            let b = src.read_segment_bytes(f.base, pos, chunk).unwrap();
            assert!(!b.is_empty());
            out.write_all(&b).unwrap();
            pos += b.len() as u64;
        }
        out.sync_all().unwrap();
    }
}

#[test]
fn a_copy_taken_while_appending_reopens_at_the_exact_high_watermark() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let copy = tmp.path().join("copy");
    let log = PartitionLog::open(&dir, small_cfg(2_048)).unwrap();
    fill(&log, 200, 7, 100);
    sync(&log, &copy, 1000);
    // More commits, and uncommitted appends the copy must not pick up.
    fill(&log, 150, 3, 200);
    log.append(&batch(log.next_offset(), 5), 300).unwrap();
    assert!(log.next_offset() > log.high_watermark());
    sync(&log, &copy, 333);
    let sizes: BTreeMap<String, u64> = log
        .segment_files()
        .into_iter()
        .map(|f| (f.name, f.size))
        .collect();
    assert!(sizes.len() > 3, "{sizes:?}");
    for (name, size) in &sizes {
        assert_eq!(
            fs::metadata(copy.join(name)).unwrap().len(),
            *size,
            "{name}"
        );
    }
    PartitionLog::verify_copy(&copy, small_cfg(2_048), 0, log.high_watermark()).unwrap();
    // A mismatch is reported, not hidden.
    assert!(PartitionLog::verify_copy(&copy, small_cfg(2_048), 0, log.next_offset()).is_err());
    let reopened = PartitionLog::open(&copy, small_cfg(2_048)).unwrap();
    assert_eq!(reopened.high_watermark(), log.high_watermark());
    assert_eq!(check_all(&reopened), log.high_watermark());
    // Reading past the committed end gives nothing; an unknown segment is gone.
    let last = log.segment_files().pop().unwrap();
    assert!(log
        .read_segment_bytes(last.base, last.size, 10)
        .unwrap()
        .is_empty());
    assert!(log.read_segment_bytes(u64::MAX, 0, 10).is_err());
}
