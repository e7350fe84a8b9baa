//! Durability under simulated power loss (SPEC §1.1: "nothing that got `202` is lost" after
//! a crash, kill -9, restart or power loss of a node). A kill -9 leaves the page cache
//! intact, so it cannot catch a write that was acknowledged before it was fsynced, a
//! directory entry never fsynced, or a file overwritten in place in the wrong order; a power
//! loss can. The node's data dir lives on its own ext4 image ([`narad_e2e::power`]); each
//! cut freezes the node under load, keeps only what had reached the image, checks it with
//! `e2fsck` and boots the node on it. Every message answered `202` must then be delivered.
//!
//! `NARAD_POWER_CUTS` sets the number of cuts per file system (default 5); CI runs the
//! default, a longer run is a local soak.

use std::time::{Duration, Instant};

use narad_e2e::power::{self, FsKind, PowerLab};
use narad_tests::ledger::{wait_all_consumed, Consumers, ProduceSpec, Producers};
use narad_tests::*;
use rand::Rng;

const TOPIC: &str = "powered";
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

async fn acknowledged_messages_survive_power_loss(kind: FsKind, test: &str) {
    if !power::available(test) {
        return;
    }
    let mut rng = test_rng(test);
    let mut lab = PowerLab::create(kind, IMAGE_MB).expect("power lab");
    let data_dir = lab.mount_point().join("narad");
    let mut server = Server::start(ServerOpts::default().data_dir(&data_dir)).await;
    let url = server.url();
    Http::new(&url)
        .create_topic(
            &json!({"name": TOPIC, "partitions": 6, "visibility_timeout_ms": VISIBILITY_MS}),
        )
        .await;

    let ledger = Ledger::new();
    let producers = Producers::spawn(
        PRODUCERS,
        &ProduceSpec::new(&url, TOPIC, &ledger, MAX_BACKLOG),
    );
    let consumers = Consumers::spawn(CONSUMERS, &url, TOPIC, &ledger);

    let started = Instant::now();
    let cuts = cuts();
    let mut repaired = 0;
    for cut in 1..=cuts {
        tokio::time::sleep(Duration::from_millis(rng.random_range(CUT_GAP_MS))).await;
        let at = started.elapsed();
        let fsck = tokio::task::block_in_place(|| lab.cut(&mut server))
            .unwrap_or_else(|e| panic!("power cut #{cut} ({kind:?}): {e:#}"));
        if fsck.code != 0 {
            repaired += 1;
        }
        eprintln!(
            "power cut #{cut} ({kind:?}) at {at:?}, e2fsck exit {}: {}\n{}",
            fsck.code,
            ledger.progress(),
            fsck.report.trim_end()
        );
        server.restart().await;
    }
    tokio::time::sleep(FINAL_RUN).await;
    producers.stop().await;
    let drained = wait_all_consumed(&ledger, DRAIN_TIMEOUT).await;
    consumers.stop().await;
    let report = ledger.report();
    eprintln!(
        "final after {:?}, {cuts} power cuts on {:?} ext4 ({repaired} needed e2fsck's repair or journal replay): \
         {report}",
        started.elapsed(),
        lab.kind()
    );
    server.kill9();
    assert!(
        report.produced > 0,
        "no produce was ever acknowledged: {report}"
    );
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    report.assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_power_loss_on_journaled_ext4() {
    acknowledged_messages_survive_power_loss(
        FsKind::Journaled,
        "acknowledged_messages_survive_power_loss_on_journaled_ext4",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_power_loss_on_ext4_without_journal() {
    acknowledged_messages_survive_power_loss(
        FsKind::NoJournal,
        "acknowledged_messages_survive_power_loss_on_ext4_without_journal",
    )
    .await;
}
