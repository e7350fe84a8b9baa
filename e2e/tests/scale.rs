//! Scale out and in under load (SPEC §6.5): a fourth node joins and the leader moves
//! partitions onto it (verbatim copy, freeze, compare-and-swap flip) until each node holds
//! ⌊T/R⌋..⌈T/R⌉; then it is decommissioned: it sheds every partition, leaves the voters and
//! the member list. Every message that got `202` is consumed at least once.

use std::time::{Duration, Instant};

use narad_e2e::load::Load;
use narad_e2e::TestCluster;
use narad_tests::{json, Method};
use serde_json::Value;

const PARTITIONS: u64 = 12;
/// The fan-out child's partitions (they move too).
const CHILD_PARTITIONS: u64 = 4;
const PRODUCERS: u32 = 16;
const CONSUMERS_PER_NODE: usize = 2;
const SETTLE: Duration = Duration::from_secs(40);
const DRAIN: Duration = Duration::from_secs(45);

async fn members(c: &TestCluster, via: usize) -> Vec<Value> {
    c.list_or_empty(via, "/v1/cluster/members", "members").await
}

/// `narad_moves_total{outcome="completed"}` of node `i` (moves it copied in).
async fn completed_moves(c: &TestCluster, i: usize) -> u64 {
    let r = c.http(i).get("/metrics").await;
    String::from_utf8_lossy(&r.body)
        .lines()
        .find(|l| l.starts_with("narad_moves_total{outcome=\"completed\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn owned(ms: &[Value], id: &str) -> Option<u64> {
    ms.iter()
        .find(|m| m["id"] == id)
        .and_then(|m| m["owned_partitions"].as_u64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_and_decommission_under_load_loses_nothing() {
    let started = Instant::now();
    let mut c = TestCluster::start(3).await;
    c.http(0)
        .create_topic(
            &json!({"name": "scale", "partitions": PARTITIONS, "visibility_timeout_ms": 5000}),
        )
        .await;
    // A fan-out child: its cursors live in the parent partitions' directories and travel
    // with every move (SPEC §5.1 "cursors survive partition moves").
    c.http(0)
        .create_topic(&json!({"name": "scale-fan", "partitions": CHILD_PARTITIONS, "visibility_timeout_ms": 5000}))
        .await;
    c.http(0)
        .post_json("/v1/topics/scale/children", &json!({"child": "scale-fan"}))
        .await
        .expect(200);
    let urls: Vec<String> = (0..3).map(|i| c.url(i)).collect();
    let load = Load::start_with_children(
        &urls,
        "scale",
        &["scale-fan"],
        PRODUCERS,
        CONSUMERS_PER_NODE,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Unknown members cannot be decommissioned.
    let r = c
        .http(1)
        .request(Method::POST, "/v1/cluster/members/nope/decommission")
        .send()
        .await;
    assert_eq!(r.status, 404, "{}", r.describe());

    // Scale out: n3 joins; the leader rebalances 12 partitions over 4 nodes (3 each).
    let n3 = c.add_node().await;
    let id = c.nodes[n3].id.clone();
    eprintln!(
        "{id} joined at {:?}: {}",
        started.elapsed(),
        load.progress()
    );
    let total = PARTITIONS + CHILD_PARTITIONS;
    let (lo, hi) = (total / 4, total.div_ceil(4));
    let mut max_moves = 0;
    let until = Instant::now() + SETTLE;
    loop {
        let ms = members(&c, 0).await;
        let inflight = c.moves(0).await.len();
        max_moves = max_moves.max(inflight);
        let balanced = ms.len() == 4
            && ms.iter().all(|m| {
                m["owned_partitions"]
                    .as_u64()
                    .is_some_and(|n| (lo..=hi).contains(&n))
            });
        if balanced && inflight == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "not balanced after {SETTLE:?}: {ms:?}, {inflight} moves in flight"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(max_moves <= 8, "at most 8 moves in flight, saw {max_moves}");
    eprintln!(
        "balanced at {:?} (most moves seen in flight: {max_moves}): {}",
        started.elapsed(),
        load.progress()
    );
    // Keep producing and consuming against the new placement for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let copied_in = completed_moves(&c, n3).await;
    assert_eq!(copied_in, hi, "{id} completed {copied_in} moves");
    let mut owners = c.owners(1, "scale").await;
    owners.extend(c.owners(1, "scale-fan").await);
    assert_eq!(
        owners.iter().filter(|o| **o == id).count() as u64,
        owned(&members(&c, 1).await, &id).unwrap_or(0),
        "{owners:?}"
    );

    // Scale in: decommission n3; it sheds its partitions and leaves the cluster.
    c.decommission(1, &id).await;
    let mut saw_draining = false;
    let until = Instant::now() + SETTLE;
    loop {
        let ms = members(&c, 0).await;
        if let Some(m) = ms.iter().find(|m| m["id"] == id.as_str()) {
            saw_draining |= m["draining"] == true;
        } else if ms.len() == 3 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{id} not removed after {SETTLE:?}: {ms:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(saw_draining, "{id} was never reported draining");
    let ms = members(&c, 2).await;
    assert!(ms.iter().all(|m| m["id"] != id.as_str()), "{ms:?}");
    let mut owners = c.owners(0, "scale").await;
    owners.extend(c.owners(0, "scale-fan").await);
    assert!(owners.iter().all(|o| *o != id), "{owners:?}");
    let mut shed = 0;
    for i in 0..3 {
        shed += completed_moves(&c, i).await;
    }
    assert!(shed >= hi, "only {shed} moves off {id}");
    eprintln!(
        "{id} decommissioned at {:?}: {}",
        started.elapsed(),
        load.progress()
    );

    tokio::time::sleep(Duration::from_secs(1)).await;
    let all = load.finish_all(DRAIN).await;
    for (topic, report, drained) in &all {
        eprintln!("{topic}: {report} (total {:?})", started.elapsed());
        if let Err(e) = drained {
            eprintln!("{topic}: drain incomplete: {e:#}");
        }
    }
    for (_, report, _) in &all {
        assert!(report.produced > 0, "{report}");
        report.assert_ok();
    }
}
