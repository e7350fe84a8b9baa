//! A network cut (SPEC §6.4): one node of three loses its network (its veth goes down) under
//! sustained load. The others mark it dead, produce routes around its partitions, and when
//! the link comes back nothing that got `202` — on either side of the cut — is lost.
//!
//! Nodes run in network namespaces on a bridge (`narad_e2e::netns`); this needs root,
//! iproute2 and iptables, which CI has (and requires, `NARAD_REQUIRE_NETNS=1`). Elsewhere the
//! test is skipped with the reason printed.

use std::time::Duration;

use narad_e2e::load::Load;
use narad_e2e::netns::NetLab;
use narad_e2e::{ClusterOpts, TestCluster};
use narad_tests::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_node_is_routed_around_and_loses_nothing() {
    if !narad_e2e::netns::available("a_cut_off_node_is_routed_around_and_loses_nothing") {
        return;
    }
    let lab = NetLab::create(3).expect("network namespaces on a bridge");
    let hosts = (0..3).map(|i| (lab.ip(i), lab.ns(i))).collect();
    let c = TestCluster::start_with(
        3,
        ClusterOpts {
            hosts,
            ..ClusterOpts::default()
        },
    )
    .await;
    c.http(0)
        .create_topic(&json!({"name": "cut", "partitions": 6, "visibility_timeout_ms": 5000}))
        .await;
    let urls: Vec<String> = (0..3).map(|i| c.url(i)).collect();
    let load = Load::start(&urls, "cut", 16, 2);
    tokio::time::sleep(Duration::from_secs(1)).await;

    lab.cut(2).expect("cut n2");
    eprintln!("cut n2: {}", load.progress());
    // The others see n2 dead and keep producing into their own partitions.
    c.wait_status(0, "n2", "dead").await;
    let before = load.ledger.acked_count();
    narad_tests::eventually(Duration::from_secs(20), Duration::from_millis(100), || {
        let l = load.ledger.clone();
        async move {
            anyhow::ensure!(l.acked_count() > before + 500, "{}", l.progress());
            Ok(())
        }
    })
    .await;
    let owners = c.owners(1, "cut").await;
    assert_eq!(
        owners.iter().filter(|o| *o == "n2").count(),
        2,
        "{owners:?}"
    );
    eprintln!("n2 dead, produce goes on: {}", load.progress());

    lab.heal(2).expect("heal n2");
    c.wait_status(0, "n2", "alive").await;
    eprintln!("healed n2: {}", load.progress());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (report, drained) = load.finish(Duration::from_secs(60)).await;
    eprintln!("network cut: {report}");
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    report.assert_ok();
}
