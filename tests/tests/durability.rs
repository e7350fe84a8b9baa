//! Durability under kill -9 (SPEC §1.1). The contract pinned here:
//!
//! - `202` means fsynced on the accepting node: a message answered `202` is delivered (and
//!   redelivered until acked) even if the node is killed with SIGKILL at any moment and
//!   restarted on the same data directory.
//! - A produce that failed (connection refused/reset, timeout, `5xx`) is *ambiguous*: it
//!   may or may not be delivered, and is never counted as lost; if delivered, it is intact.
//! - Nothing is corrupted, nothing is invented; duplicates are allowed (and counted).
//!
//! Every payload is self-checking (see `narad_tests::payload`), so each delivery is
//! verified byte for byte.

use std::time::{Duration, Instant};

use narad_tests::ledger::{
    produce_tagged_concurrently, wait_all_consumed, Consumers, ProduceSpec, Producers,
};
use narad_tests::*;
use rand::Rng;

const TOPIC: &str = "durable";
/// Concurrent producers, each with its own keep-alive connection.
const PRODUCERS: u32 = 32;
/// Concurrent consume+ack loops.
const CONSUMERS: usize = 8;
/// kill -9 count, and the random gap before each (from the previous restart).
const KILLS: usize = 6;
const KILL_GAP_MS: std::ops::RangeInclusive<u64> = 500..=2000;
/// Produce on the last incarnation for this long before stopping the producers.
const FINAL_RUN: Duration = Duration::from_secs(1);
/// After producing stops, every acked message must be consumed within this.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Producers pause while this many acked messages are unconsumed, so the drain stays
/// bounded on a slow machine.
const MAX_BACKLOG: usize = 5000;
/// Leases lapse quickly if an ack was lost while the server was alive.
const VISIBILITY_MS: u64 = 5000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_repeated_kill9() {
    let mut rng = test_rng("acknowledged_messages_survive_repeated_kill9");
    let mut server = Server::start_default().await;
    let url = server.url();
    let http = Http::new(&url);
    http.create_topic(
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
    for kill in 1..=KILLS {
        // The chaos schedule itself: a random moment to pull the plug.
        tokio::time::sleep(Duration::from_millis(rng.random_range(KILL_GAP_MS))).await;
        server.kill9();
        eprintln!(
            "kill -9 #{kill} at {:?}: {}",
            started.elapsed(),
            ledger.progress()
        );
        server.restart().await;
    }
    tokio::time::sleep(FINAL_RUN).await;
    producers.stop().await;
    eprintln!(
        "producers stopped at {:?}: {}",
        started.elapsed(),
        ledger.progress()
    );

    let drained = wait_all_consumed(&ledger, DRAIN_TIMEOUT).await;
    consumers.stop().await;
    let report = ledger.report();
    eprintln!(
        "final after {:?} and {KILLS} kill -9: {report}",
        started.elapsed()
    );
    assert!(
        report.produced > 0,
        "no produce was ever acknowledged: {report}"
    );
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    report.assert_ok();
}

/// Produces 16 × 50 tagged messages, kills the node with SIGKILL right after the last
/// `202`, restarts it and checks that every acknowledged message is delivered. With
/// `visible_at_once`, first checks that the high watermarks already count them all (reading
/// them makes pending records visible, so without it nothing is read before the kill).
async fn kill9_right_after_the_last_202(opts: ServerOpts, visible_at_once: bool) {
    let mut server = Server::start(opts).await;
    let url = server.url();
    let http = Http::new(&url);
    http.create_topic_named(TOPIC).await;

    let ledger = Ledger::new();
    produce_tagged_concurrently(&url, TOPIC, 16, 50, &ledger).await;
    if visible_at_once {
        let visible: u64 = http.high_watermarks(TOPIC).await.unwrap().values().sum();
        assert_eq!(
            visible,
            16 * 50,
            "every answered produce is visible at once"
        );
    }
    // The last 202 has just arrived: pull the plug before anything else can happen.
    server.kill9();
    server.restart().await;

    let consumers = Consumers::spawn(4, &url, TOPIC, &ledger);
    let drained = wait_all_consumed(&ledger, Duration::from_secs(30)).await;
    consumers.stop().await;
    let report = ledger.report();
    eprintln!("{report}");
    assert_eq!(report.produced, 16 * 50);
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    report.assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_202_survives_a_kill9_right_after_it() {
    // The default: every record through the WAL, whose dispatcher commits a partition no
    // consumer waits on only every 50 ms, so most records are in the WAL alone at the kill.
    kill9_right_after_the_last_202(ServerOpts::default(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_202_survives_a_kill9_right_after_it_committed_directly() {
    // Each produce committed into its partition log (no WAL copy): visible when answered.
    let opts = ServerOpts::default().env("NARAD_WAL_SKIP_LOCAL", "true");
    kill9_right_after_the_last_202(opts, true).await;
}
