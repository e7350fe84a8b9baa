//! Crash recovery with torn tails (SPEC §1.1, §6.4 "Corruption"): a torn tail is truncated
//! at recovery and nothing acknowledged is lost.
//!
//! Each cycle produces a known set of self-checking messages, waits until they are
//! committed (visible), kills the server with SIGKILL, then appends junk — random bytes, a
//! partial copy of a frame, or a zero-filled block (as after preallocation) — to the newest
//! segment file of every partition under `<data-dir>/topics/` and to the newest WAL file
//! under `<data-dir>/ingress/`. The restarted node must open, serve every acknowledged
//! message exactly as produced, never a record made of junk, and keep appending correctly
//! after the truncation point (checked by one more kill -9 and a full replay).
//!
//! File layout is not part of the SPEC, so "the newest file" is found by a heuristic
//! (see [`newest_log_files`]); the files touched are printed.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use narad_tests::ledger::{produce_tagged, wait_all_consumed, Consumers};
use narad_tests::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore};

const PARTITIONS: u64 = 3;
const BEFORE_CRASH: u64 = 60;
const AFTER_RESTART: u64 = 30;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
enum Junk {
    /// 1–64 random bytes.
    Random,
    /// A prefix of the file's own head: plausibly a frame header without its body.
    PartialFrame,
    /// A 4 KiB block of zeros.
    Zeros,
}

/// For every leaf directory under `root` (a partition dir, the WAL dir), the newest log
/// file: among the files whose names contain a digit (numbered segments) — or all files if
/// none do — take those with a log-like extension (`log`, `seg`, `wal`) if any, else those
/// sharing the extension of the largest file (sparse indexes are small), and pick the
/// highest name.
fn newest_log_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return out;
    };
    let mut files = Vec::new();
    let mut has_subdirs = false;
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => {
                has_subdirs = true;
                out.extend(newest_log_files(&p));
            }
            Ok(t) if t.is_file() => files.push(p),
            _ => {}
        }
    }
    if has_subdirs || files.is_empty() {
        return out;
    }
    let numbered: Vec<PathBuf> = files
        .iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .chars()
                .any(|c| c.is_ascii_digit())
        })
        .cloned()
        .collect();
    let pool = if numbered.is_empty() { files } else { numbered };
    let size = |p: &PathBuf| fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let log_like = pool.iter().find(|p| {
        p.extension()
            .is_some_and(|e| ["log", "seg", "wal"].contains(&&*e.to_string_lossy()))
    });
    let family = log_like
        .cloned()
        .unwrap_or_else(|| pool.iter().max_by_key(|p| size(p)).unwrap().clone());
    let ext = family.extension().map(|e| e.to_owned());
    if let Some(newest) = pool
        .iter()
        .filter(|p| p.extension().map(|e| e.to_owned()) == ext)
        .max()
    {
        out.push(newest.clone());
    }
    out
}

fn append_junk(path: &Path, junk: Junk, rng: &mut StdRng) {
    let bytes: Vec<u8> = match junk {
        Junk::Random => {
            let mut b = vec![0u8; rng.random_range(1..=64)];
            rng.fill_bytes(&mut b);
            b
        }
        Junk::PartialFrame => {
            let head = fs::read(path).unwrap_or_default();
            if head.len() < 8 {
                vec![0xA5; 13]
            } else {
                let n = rng.random_range(5..=head.len().min(40));
                head[..n].to_vec()
            }
        }
        Junk::Zeros => vec![0u8; 4096],
    };
    let mut f = OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(&bytes).unwrap();
    f.sync_all().unwrap();
    eprintln!(
        "  appended {} junk bytes ({junk:?}) to {}",
        bytes.len(),
        path.display()
    );
}

/// Reads every retained record of `topic` by replay and checks it against `ledger`.
async fn replay_all(http: &Http, topic: &str, acked: &[String]) -> Report {
    let check = Ledger::new();
    for id in acked {
        check.record_acked(id.clone());
    }
    for s in http.partition_stats(topic).await {
        let (p, from, to) = (
            s["index"].as_u64().unwrap(),
            s["oldest_offset"].as_u64().unwrap(),
            s["high_watermark"].as_u64().unwrap(),
        );
        for o in from..to {
            let r = http
                .consume(topic, &format!("partition={p}&offset={o}"))
                .await;
            match r.status {
                200 => check.record_delivery(&Msg::parse(&r.body).unwrap()),
                _ => check.record_unexpected(r.describe()),
            }
        }
    }
    check.report()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_tails_are_truncated_and_nothing_acknowledged_is_lost() {
    let mut rng = test_rng("torn_tails_are_truncated_and_nothing_acknowledged_is_lost");
    let mut server = Server::start_default().await;
    let url = server.url();
    let http = Http::new(&url);

    for (cycle, junk) in [Junk::Random, Junk::PartialFrame, Junk::Zeros]
        .into_iter()
        .enumerate()
    {
        let topic = format!("recover-{cycle}");
        let producer = cycle as u32 * 10;
        eprintln!("cycle {cycle}: {junk:?}");
        http.create_topic(&json!({"name": topic, "partitions": PARTITIONS}))
            .await;
        let ledger: Arc<Ledger> = Ledger::new();
        produce_tagged(&http, &topic, "", producer, BEFORE_CRASH, &ledger).await;
        http.wait_total_visible(&topic, BEFORE_CRASH).await;

        server.kill9();
        let data = server.data_dir().to_path_buf();
        let mut victims = newest_log_files(&data.join("topics"));
        let wal = newest_log_files(&data.join("ingress"));
        assert!(
            !victims.is_empty(),
            "no segment files found under {}",
            data.join("topics").display()
        );
        assert!(
            !wal.is_empty(),
            "no WAL file found under {}",
            data.join("ingress").display()
        );
        victims.extend(wal);
        for v in &victims {
            append_junk(v, junk, &mut rng);
        }
        server.restart().await;

        // The log keeps working after the truncation point.
        produce_tagged(&http, &topic, "", producer + 1, AFTER_RESTART, &ledger).await;
        let consumers = Consumers::spawn(2, &url, &topic, &ledger);
        let drained = wait_all_consumed(&ledger, DRAIN_TIMEOUT).await;
        consumers.stop().await;
        let report = ledger.report();
        eprintln!("cycle {cycle} consume: {report}");
        if let Err(e) = drained {
            eprintln!("drain incomplete: {e:#}");
        }
        report.assert_ok();

        // Once more without junk: everything written before and after the repair reads back.
        server.kill9();
        server.restart().await;
        let mut acked: Vec<String> = (1..=BEFORE_CRASH)
            .map(|s| payload::id(producer, s))
            .collect();
        acked.extend((1..=AFTER_RESTART).map(|s| payload::id(producer + 1, s)));
        let report = replay_all(&http, &topic, &acked).await;
        eprintln!("cycle {cycle} replay: {report}");
        report.assert_ok();
    }
}
