//! Chaos under sustained load (SPEC §1.1, §6.4): kill -9 partition owners, the Raft leader
//! and nodes in the middle of a restart, at random moments, and restart them; then a rolling
//! restart (SIGTERM) of every node. Every message that got `202` must be consumed at least
//! once; duplicates are allowed and reported.

use std::time::{Duration, Instant};

use narad_e2e::load::Load;
use narad_e2e::TestCluster;
use narad_tests::{json, test_rng};
use rand::Rng;

/// Producers (each its own keep-alive connection), spread over the nodes.
const PRODUCERS: u32 = 32;
const CONSUMERS_PER_NODE: usize = 2;
const KILLS: usize = 10;
const KILL_GAP_MS: std::ops::RangeInclusive<u64> = 500..=2000;
const DRAIN: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_owners_leader_and_restarting_nodes_loses_nothing() {
    let mut rng = test_rng("kill9_owners_leader_and_restarting_nodes_loses_nothing");
    let mut c = TestCluster::start(3).await;
    c.http(0)
        .create_topic(&json!({"name": "chaos", "partitions": 6, "visibility_timeout_ms": 5000}))
        .await;
    let urls: Vec<String> = (0..3).map(|i| c.url(i)).collect();
    let load = Load::start(&urls, "chaos", PRODUCERS, CONSUMERS_PER_NODE);
    let started = Instant::now();
    let mut recover = Vec::new();
    for kill in 1..=KILLS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(KILL_GAP_MS))).await;
        // Whom to kill: the leader, the owner of a random partition, or a node that is in
        // the middle of restarting.
        let live = (0..3).find(|i| *i != kill % 3).unwrap();
        let (victim, what) = match kill % 3 {
            0 => (c.leader(live).await.unwrap_or(kill % 3), "raft leader"),
            1 => {
                let owners = c.owners(live, "chaos").await;
                let p = rng.random_range(0..owners.len());
                (c.index_of(&owners[p]), "partition owner")
            }
            _ => {
                let v = rng.random_range(0..3);
                c.kill9(v);
                c.restart(v).await;
                (v, "node mid-restart")
            }
        };
        c.kill9(victim);
        eprintln!(
            "kill -9 #{kill} ({what} n{victim}) at {:?}: {}",
            started.elapsed(),
            load.progress()
        );
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..=1000))).await;
        let t = Instant::now();
        c.restart(victim).await;
        c.wait_ready(victim).await;
        recover.push(t.elapsed());
    }
    eprintln!(
        "after {KILLS} kills at {:?}: {}; restart-to-ready times {:?}",
        started.elapsed(),
        load.progress(),
        recover
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (report, drained) = load.finish(DRAIN).await;
    eprintln!("chaos: {report}");
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    assert!(report.produced > 0, "{report}");
    report.assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load_loses_nothing() {
    let mut c = TestCluster::start(3).await;
    c.http(0)
        .create_topic(&json!({"name": "roll", "partitions": 6, "visibility_timeout_ms": 5000}))
        .await;
    let urls: Vec<String> = (0..3).map(|i| c.url(i)).collect();
    let load = Load::start(&urls, "roll", 16, CONSUMERS_PER_NODE);
    let started = Instant::now();
    for i in (0..3).rev() {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let st = c.nodes[i].server.stop().await;
        assert!(st.success(), "n{i} exited with {st}");
        c.restart(i).await;
        c.wait_ready(i).await;
        eprintln!(
            "rolled n{i} at {:?}: {}",
            started.elapsed(),
            load.progress()
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (report, drained) = load.finish(DRAIN).await;
    eprintln!("rolling restart: {report}");
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    assert!(report.produced > 0, "{report}");
    report.assert_ok();
}
