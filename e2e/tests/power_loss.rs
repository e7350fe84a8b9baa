//! Durability under simulated power loss (SPEC §1.1: "nothing that got `202` is lost" after
//! a crash, kill -9, restart or power loss of a node). A kill -9 leaves the page cache
//! intact, so it cannot catch a write that was acknowledged before it was fsynced, a file
//! overwritten in place before what it points at was durable, or a deleted file that comes
//! back; a power loss can (a build whose WAL skipped its fdatasync lost 925 and 2,158
//! acknowledged messages in 5 cuts here). The node's data dir lives on its own ext4 image ([`narad_e2e::power`]); each
//! cut freezes the node under load, keeps only what had reached the image, checks it with
//! `e2fsck` and boots the node on it. Every message answered `202` must then be delivered,
//! from the topic and from its two children: a fan-out child (its cursor files are
//! overwritten in place) and a delay child (its copies wait in the delay index).
//!
//! Three runs: the WAL path on journaled ext4 and on ext4 without a journal, and the direct
//! commit (`NARAD_WAL_SKIP_LOCAL`) without a journal. `NARAD_POWER_CUTS` sets the number of
//! cuts per run (default 5); CI runs the default, a longer run is a local soak.

use std::time::{Duration, Instant};

use narad_e2e::power::{self, FsKind, PowerLab};
use narad_tests::ledger::{wait_all_consumed, Consumers, ProduceSpec, Producers};
use narad_tests::*;
use rand::Rng;

const TOPIC: &str = "powered";
const FAN: &str = "powered-fan";
const LATE: &str = "powered-late";
const DELAY_MS: u64 = 1000;
const PRODUCERS: u32 = 16;
const CONSUMERS: usize = 4;
/// Random run time before each cut, from the previous boot.
const CUT_GAP_MS: std::ops::RangeInclusive<u64> = 300..=2500;
const FINAL_RUN: Duration = Duration::from_secs(1);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);
const MAX_BACKLOG: usize = 5000;
/// Leases lapse quickly, so that messages leased before a cut come back soon after it.
const VISIBILITY_MS: u64 = 5000;
/// Big enough for every cut's records and the WAL's preallocation, small to copy.
const IMAGE_MB: u64 = 768;

fn cuts() -> usize {
    std::env::var("NARAD_POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

/// How a produce reaches its durable copy.
#[derive(Debug, Clone, Copy)]
enum Commit {
    /// The default: the WAL's group commit, then the dispatcher into the partition log.
    Wal,
    /// `NARAD_WAL_SKIP_LOCAL`: straight into the partition log, fsynced and verified
    /// before the `202`.
    Direct,
}

async fn acknowledged_messages_survive_power_loss(kind: FsKind, commit: Commit, test: &str) {
    if !power::available(test) {
        return;
    }
    let mut rng = test_rng(test);
    let mut lab = PowerLab::create(kind, IMAGE_MB).expect("power lab");
    let data_dir = lab.mount_point().join("narad");
    let mut opts = ServerOpts::default().data_dir(&data_dir);
    if let Commit::Direct = commit {
        opts = opts.env("NARAD_WAL_SKIP_LOCAL", "true");
    }
    let mut server = Server::start(opts).await;
    let url = server.url();
    let http = Http::new(&url);
    http.create_topic(
        &json!({"name": TOPIC, "partitions": 6, "visibility_timeout_ms": VISIBILITY_MS}),
    )
    .await;
    for child in [FAN, LATE] {
        http.create_topic(
            &json!({"name": child, "partitions": 3, "visibility_timeout_ms": VISIBILITY_MS}),
        )
        .await;
    }
    let children = format!("/v1/topics/{TOPIC}/children");
    http.post_json(&children, &json!({"child": FAN}))
        .await
        .expect(200);
    http.post_json(&children, &json!({"child": LATE, "delay_ms": DELAY_MS}))
        .await
        .expect(200);

    // One ledger per topic: every message the parent acknowledged must reach all three.
    let topics = [TOPIC, FAN, LATE];
    let ledgers: Vec<_> = topics.iter().map(|_| Ledger::new()).collect();
    let ledger = &ledgers[0];
    let mut spec = ProduceSpec::new(&url, TOPIC, ledger, MAX_BACKLOG);
    spec.ledgers = ledgers.clone();
    let producers = Producers::spawn(PRODUCERS, &spec);
    let consumers: Vec<Consumers> = topics
        .iter()
        .zip(&ledgers)
        .map(|(t, l)| Consumers::spawn(CONSUMERS, &url, t, l))
        .collect();

    let started = Instant::now();
    let cuts = cuts();
    let mut repaired = 0;
    for cut in 1..=cuts {
        tokio::time::sleep(Duration::from_millis(rng.random_range(CUT_GAP_MS))).await;
        let at = started.elapsed();
        let fsck = tokio::task::block_in_place(|| lab.cut(&mut server))
            .unwrap_or_else(|e| panic!("power cut #{cut} ({kind:?}, {commit:?}): {e:#}"));
        if fsck.code != 0 {
            repaired += 1;
        }
        eprintln!(
            "power cut #{cut} ({kind:?}, {commit:?}) at {at:?}, e2fsck exit {}: {}\n{}",
            fsck.code,
            ledger.progress(),
            fsck.report.trim_end()
        );
        server.restart().await;
    }
    tokio::time::sleep(FINAL_RUN).await;
    producers.stop().await;
    let mut results = Vec::new();
    for (topic, l) in topics.iter().zip(&ledgers) {
        results.push((topic, wait_all_consumed(l, DRAIN_TIMEOUT).await, l.report()));
    }
    for c in consumers {
        c.stop().await;
    }
    server.kill9();
    for (topic, drained, report) in &results {
        eprintln!(
            "{topic}: final after {:?}, {cuts} power cuts on {:?} ext4, {commit:?} commit \
             ({repaired} needed e2fsck's repair or journal replay): {report}",
            started.elapsed(),
            lab.kind()
        );
        if let Err(e) = drained {
            eprintln!("{topic}: drain incomplete: {e:#}");
        }
    }
    for (topic, _, report) in results {
        assert!(
            report.produced > 0,
            "{topic}: no produce was ever acknowledged: {report}"
        );
        report.assert_ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_power_loss_on_journaled_ext4() {
    acknowledged_messages_survive_power_loss(
        FsKind::Journaled,
        Commit::Wal,
        "acknowledged_messages_survive_power_loss_on_journaled_ext4",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_power_loss_on_ext4_without_journal() {
    acknowledged_messages_survive_power_loss(
        FsKind::NoJournal,
        Commit::Wal,
        "acknowledged_messages_survive_power_loss_on_ext4_without_journal",
    )
    .await;
}

/// The direct commit (`NARAD_WAL_SKIP_LOCAL`), a tuning knob that takes the WAL out of a
/// local produce's path: its `202` rests on the partition log's own fsync alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_power_loss_through_the_direct_commit() {
    acknowledged_messages_survive_power_loss(
        FsKind::NoJournal,
        Commit::Direct,
        "acknowledged_messages_survive_power_loss_through_the_direct_commit",
    )
    .await;
}
