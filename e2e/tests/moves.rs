//! A move whose source dies half-way (SPEC §6.5): the target keeps its copy, and once the
//! source stayed dead long enough, promotes a copy that reached the source's last known high
//! watermark. Records the source committed after that listing survive on its disk; when it
//! returns it re-produces them (its salvage claim) before deleting the old copy. Under
//! load, every message that got `202` is consumed at least once.

use std::time::{Duration, Instant};

use narad_e2e::load::Load;
use narad_e2e::{ClusterOpts, TestCluster};
use narad_tests::{json, metric_sum, metric_sum_where};

const PARTITIONS: u64 = 6;
/// The target pauses this long between its pre-copy and the handoff; the test kills the
/// source inside that window.
const HANDOFF_PAUSE_MS: u64 = 5000;
const FORCE_AFTER_MS: u64 = 2000;
const SETTLE: Duration = Duration::from_secs(40);
const DRAIN: Duration = Duration::from_secs(60);

async fn metrics(c: &TestCluster, i: usize) -> String {
    c.http(i).metrics_text().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_whose_source_dies_is_force_promoted_and_loses_nothing() {
    let started = Instant::now();
    let mut c = TestCluster::start_with(
        3,
        ClusterOpts {
            env: vec![
                (
                    "NARAD_TEST_MOVE_HANDOFF_PAUSE_MS".into(),
                    HANDOFF_PAUSE_MS.to_string(),
                ),
                (
                    "NARAD_TEST_FORCE_PROMOTE_MS".into(),
                    FORCE_AFTER_MS.to_string(),
                ),
            ],
            ..ClusterOpts::default()
        },
    )
    .await;
    c.http(0)
        .create_topic(
            &json!({"name": "fp", "partitions": PARTITIONS, "visibility_timeout_ms": 5000}),
        )
        .await;
    let urls: Vec<String> = (0..3).map(|i| c.url(i)).collect();
    let load = Load::start(&urls, "fp", 8, 1);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // n3 joins: the leader starts moves onto it; n3 pre-copies, then pauses.
    let n3 = c.add_node().await;
    let target = c.nodes[n3].id.clone();
    let until = Instant::now() + SETTLE;
    let (source, partition) = loop {
        let ms = c.moves(0).await;
        let copied = metric_sum(&metrics(&c, n3).await, "narad_moves_bytes_total").unwrap_or(0.0);
        if let Some(m) = ms.first().filter(|_| copied > 0.0) {
            break (
                m["from"].as_str().unwrap().to_string(),
                m["partition"].as_u64().unwrap(),
            );
        }
        assert!(Instant::now() < until, "no move copied anything: {ms:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Every move of the rebalance pre-copies within milliseconds; give the slowest a
    // moment (well inside the handoff pause) so the killed source's move has its listing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let src = c.index_of(&source);
    eprintln!(
        "killing {source} while partition {partition} moves to {target} ({:?}): {}",
        started.elapsed(),
        load.progress()
    );
    c.kill9(src);

    // The source is marked dead; the copy is force-promoted while it stays down.
    let survivor = (src + 1) % 3;
    let until = Instant::now() + SETTLE;
    loop {
        let owners = c.owners(survivor, "fp").await;
        let forced = metric_sum_where(
            &metrics(&c, n3).await,
            "narad_moves_total",
            &[("outcome", "force_promoted")],
        )
        .unwrap_or(0.0);
        if owners[partition as usize] == target && forced >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "partition {partition} not force-promoted: owners {owners:?}, forced {forced}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "force-promoted at {:?}: {}",
        started.elapsed(),
        load.progress()
    );
    // The promoted partition serves consumers while its old owner is still down.
    let before = load.progress();
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("with {source} down: {before} → {}", load.progress());

    // The source returns: it finds its old copy owned elsewhere and gives back what the
    // promoted copy lacks before deleting it.
    c.restart(src).await;
    c.wait_ready(src).await;
    eprintln!("{source} back at {:?}", started.elapsed());
    // It committed records after the target's last listing (producers kept going during
    // the paused handoff): those come back from its old copy.
    let until = Instant::now() + SETTLE;
    loop {
        let salvaged = metric_sum(
            &metrics(&c, src).await,
            "narad_moves_salvaged_records_total",
        )
        .unwrap_or(0.0);
        if salvaged > 0.0 {
            eprintln!("{source} re-produced {salvaged} records of its old copy");
            break;
        }
        assert!(Instant::now() < until, "{source} salvaged nothing");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let until = Instant::now() + SETTLE;
    loop {
        let ms = c.moves(survivor).await;
        if ms.is_empty() {
            break;
        }
        assert!(Instant::now() < until, "moves still in flight: {ms:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (report, drained) = load.finish(DRAIN).await;
    eprintln!("force promotion: {report} (total {:?})", started.elapsed());
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    assert!(report.produced > 0, "{report}");
    report.assert_ok();
}
