//! Offline verification of a log directory (read-only; for tools and tests).

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{io_err, Result};
use crate::index;
use crate::recovery::{list_segments, log_start};
use crate::segment::{
    index_file_name, log_file_name, probe, resync, zeros_to_end, ChunkReader, Probe, SCAN_CHUNK,
};

/// What a full scan of one segment found.
#[derive(Debug, Clone, Default)]
pub struct SegmentReport {
    pub path: PathBuf,
    pub base_offset: u64,
    pub size_bytes: u64,
    pub frames: u64,
    pub records: u64,
    /// Next offset after the last valid frame.
    pub end_offset: u64,
    pub first_timestamp_ms: u64,
    pub last_timestamp_ms: u64,
    /// Damaged regions: (byte position, first offset affected, reason).
    pub damaged: Vec<(u64, u64, String)>,
    /// "ok", "missing", "incomplete" or the reason it is bad.
    pub index: String,
}

/// The result of [`verify_dir`].
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    pub segments: Vec<SegmentReport>,
    /// Every problem found, human readable.
    pub problems: Vec<String>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Scans every frame of every segment of the log in `dir` and checks indexes and offset
/// continuity. Never modifies anything. (A torn tail of the last segment shows up as damage;
/// zeros after its last frame, the space preallocated ahead of the frames, do not.)
pub fn verify_dir(dir: &Path) -> Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let start = log_start(dir).unwrap_or(0);
    // Below the log's start: deleted by retention and come back (removed unread at open).
    let bases: Vec<u64> = list_segments(dir, false)?
        .into_iter()
        .filter(|&b| b >= start)
        .collect();
    for (i, &base) in bases.iter().enumerate() {
        let path = dir.join(log_file_name(base));
        let file = File::open(&path).map_err(io_err(&path))?;
        let len = file.metadata().map_err(io_err(&path))?.len();
        let mut rd = ChunkReader::new(Arc::new(file), len, SCAN_CHUNK);
        let mut r = SegmentReport {
            path: path.clone(),
            base_offset: base,
            size_bytes: len,
            ..Default::default()
        };
        let mut starts = HashMap::new();
        let (mut pos, mut expected) = (0u64, base);
        while pos < len {
            let reason = match probe(&mut rd, pos).map_err(io_err(&path))? {
                Probe::Valid(h) if h.base_offset == expected => {
                    starts.insert(pos, h.base_offset);
                    r.frames += 1;
                    r.records += h.count as u64;
                    if r.first_timestamp_ms == 0 {
                        r.first_timestamp_ms = h.timestamp_ms;
                    }
                    r.last_timestamp_ms = h.timestamp_ms;
                    pos += h.len as u64;
                    expected = h.end_offset();
                    continue;
                }
                Probe::Valid(h) => format!(
                    "offset discontinuity: expected {expected}, frame says {}",
                    h.base_offset
                ),
                Probe::Invalid(why) => why,
            };
            if i + 1 == bases.len() && zeros_to_end(&mut rd, pos).map_err(io_err(&path))? {
                // The active segment's preallocated space.
                break;
            }
            report.problems.push(format!(
                "{}: byte {pos} (offset {expected}): {reason}",
                path.display()
            ));
            r.damaged.push((pos, expected, reason));
            match resync(&mut rd, pos, pos, expected).map_err(io_err(&path))? {
                Some((q, h)) => {
                    pos = q;
                    expected = h.base_offset;
                }
                None => break,
            }
        }
        r.end_offset = expected;
        if let Some(&next) = bases.get(i + 1) {
            if expected != next {
                report.problems.push(format!(
                    "{}: ends at offset {expected}, next segment starts at {next}",
                    path.display()
                ));
            }
        }
        let ipath = dir.join(index_file_name(base));
        r.index = match fs::read(&ipath) {
            Err(_) => "missing".into(),
            Ok(b) => match index::parse_file(&b, base) {
                Err(e) => e,
                Ok(p) => {
                    let bad = p
                        .entries
                        .iter()
                        .find(|e| starts.get(&(e.pos as u64)) != Some(&(base + e.rel as u64)));
                    match bad {
                        Some(e) => {
                            format!("entry ({}, {}) does not point at its frame", e.rel, e.pos)
                        }
                        None if !p.clean => "incomplete".into(),
                        None => "ok".into(),
                    }
                }
            },
        };
        if r.index != "ok" && r.index != "missing" && r.index != "incomplete" {
            report
                .problems
                .push(format!("{}: {}", ipath.display(), r.index));
        }
        report.segments.push(r);
    }
    Ok(report)
}
