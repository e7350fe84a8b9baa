//! Decommission edge cases seen on real pods (issue 14): a drained member that dies before
//! the leader removes it must still leave the voters and the member list (its data already
//! moved), and a draining or removed node must fail `/readyz` so a Service stops routing to
//! it, while `/healthz` (liveness) stays `200`. (ext) A draining member refuses delayed
//! produce and leaves only once the delayed messages it holds are due and handed over.

use std::time::Duration;

use narad_e2e::{ClusterOpts, TestCluster, READY_TIMEOUT};
use narad_tests::{eventually, json, Method};
use serde_json::Value;

const PARTITIONS: u64 = 4;
const MESSAGES: usize = 20;

async fn members(c: &TestCluster, via: usize) -> Vec<Value> {
    c.list_or_empty(via, "/v1/cluster/members", "members").await
}

/// `(status, body)` of `GET path` on node `i`.
async fn probe(c: &TestCluster, i: usize, path: &str) -> (u16, String) {
    let r = c.http(i).request(Method::GET, path).send().await;
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

/// Three members plus a joined fourth (so one can leave without going below three voters)
/// and a topic with some messages produced through the fourth.
async fn four_nodes(env: Vec<(String, String)>) -> (TestCluster, usize) {
    let mut c = TestCluster::start_with(
        3,
        ClusterOpts {
            env,
            ..ClusterOpts::default()
        },
    )
    .await;
    c.http(0)
        .create_topic(&json!({"name": "dc", "partitions": PARTITIONS}))
        .await;
    let n3 = c.add_node().await;
    for i in 0..MESSAGES {
        c.http(n3).produce_ok("dc", "", format!("m{i}")).await;
    }
    (c, n3)
}

/// Every message produced through the fourth node is consumable on node `via`.
async fn assert_all_consumable(c: &TestCluster, via: usize) {
    let mut got = std::collections::BTreeSet::new();
    for p in 0..PARTITIONS {
        for offset in 0.. {
            let r = c
                .http(via)
                .consume("dc", &format!("partition={p}&offset={offset}"))
                .await;
            if r.status == 204 {
                break;
            }
            let m = narad_tests::Msg::parse(&r.body)
                .unwrap_or_else(|e| panic!("{}: {e:#}", r.describe()));
            got.insert(String::from_utf8_lossy(&m.payload_bytes()).into_owned());
        }
    }
    assert_eq!(got.len(), MESSAGES, "{got:?}");
}

/// Issue 14 bug 1: the member drains (no partitions, empty WAL), then is killed -9 before
/// the leader removes it (held by a test knob). Before the fix it stayed `dead draining` for
/// good and one more node down blocked every metadata write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_member_killed_before_removal_still_leaves() {
    let (mut c, n3) = four_nodes(vec![(
        "NARAD_TEST_HOLD_DRAINED_VOTERS".into(),
        "true".into(),
    )])
    .await;
    let id = c.nodes[n3].id.clone();
    c.decommission(0, &id).await;
    // Drained, and the leader says why it keeps it (the knob), so its WAL was checked.
    eventually(READY_TIMEOUT, Duration::from_millis(200), || {
        let c = &c;
        let id = id.clone();
        async move {
            let leader = c.leader(0).await.expect("a leader");
            let ms = members(c, leader).await;
            let m = ms
                .iter()
                .find(|m| m["id"] == id.as_str())
                .expect("still a member");
            let reason = m["decommission_reason"].as_str().unwrap_or_default();
            anyhow::ensure!(
                m["draining"] == true
                    && m["owned_partitions"] == 0
                    && reason.contains("NARAD_TEST_HOLD_DRAINED_VOTERS"),
                "not drained and held yet: {m}"
            );
            Ok(())
        }
    })
    .await;
    c.kill9(n3);
    // It is declared dead, then leaves the voters and the member list.
    eventually(READY_TIMEOUT, Duration::from_millis(200), || {
        let c = &c;
        let id = id.clone();
        async move {
            let ms = members(c, 0).await;
            anyhow::ensure!(
                ms.len() == 3 && ms.iter().all(|m| m["id"] != id.as_str()),
                "{id} still listed: {ms:?}"
            );
            Ok(())
        }
    })
    .await;
    assert_all_consumable(&c, 1).await;
    // Out of the voters: with one more node down, the two left are a majority of three, so
    // metadata writes still commit (with the dead voter kept, 2 of 4 could not).
    let down = if c.leader(0).await == Some(2) { 1 } else { 2 };
    c.kill9(down);
    let up = 3 - down;
    eventually(READY_TIMEOUT, Duration::from_millis(250), || {
        let http = c.http(up);
        async move {
            let r = http
                .request(Method::POST, "/v1/topics")
                .json(&json!({"name": "after-dc"}))
                .timeout(Duration::from_secs(10))
                .try_send()
                .await?;
            anyhow::ensure!(
                r.status == 201 || r.status == 409,
                "create: {}",
                r.describe()
            );
            Ok(())
        }
    })
    .await;
}

/// Issue 14 bug 2: `/readyz` fails while the node drains and once it is no longer a member;
/// `/healthz` stays `200` throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_draining_and_after_removal() {
    let (c, n3) = four_nodes(Vec::new()).await;
    let id = c.nodes[n3].id.clone();
    assert_eq!(probe(&c, n3, "/readyz").await.0, 200);
    c.decommission(0, &id).await;
    // Draining: out of service at once (its own view has the flag) …
    eventually(Duration::from_secs(10), Duration::from_millis(20), || {
        let c = &c;
        async move {
            let (status, body) = probe(c, n3, "/readyz").await;
            anyhow::ensure!(
                status == 503 && body.contains("draining"),
                "{status} {body}"
            );
            Ok(())
        }
    })
    .await;
    assert_eq!(probe(&c, n3, "/healthz").await.0, 200);
    // … and it stays so until and after it is removed.
    loop {
        let (status, body) = probe(&c, n3, "/readyz").await;
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains("draining") || body.contains("not a member"),
            "{body}"
        );
        let ms = members(&c, 0).await;
        if ms.len() == 3 && ms.iter().all(|m| m["id"] != id.as_str()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = probe(&c, n3, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(probe(&c, n3, "/healthz").await.0, 200);
    // The others stay ready.
    for i in 0..3 {
        assert_eq!(probe(&c, i, "/readyz").await.0, 200, "node {i}");
    }
}

/// (ext) Delayed messages a member holds keep it in the cluster until they are due: its
/// decommission waits for them (the leader says so), it refuses new delayed produce while
/// draining, and once it is gone every delayed message is consumable, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_member_leaves_only_after_its_delayed_messages_are_due() {
    const DELAYED: usize = 10;
    let (c, n3) = four_nodes(Vec::new()).await;
    let id = c.nodes[n3].id.clone();
    let sent = std::time::Instant::now();
    let msgs: Vec<Value> = (0..DELAYED)
        .map(|i| json!({"payload": format!("late{i}"), "delay": "8s"}))
        .collect();
    c.http(n3)
        .produce_batch("dc", &json!({ "messages": msgs }))
        .await
        .expect_json(202);
    let due = sent + Duration::from_secs(8);
    c.decommission(0, &id).await;
    eventually(Duration::from_secs(10), Duration::from_millis(20), || {
        let http = c.http(n3);
        async move {
            let r = http.produce("dc", "delay=1s", "refused").await;
            anyhow::ensure!(r.status == 503, "{}", r.describe());
            anyhow::ensure!(r.text().contains("decommissioned"), "{}", r.describe());
            Ok(())
        }
    })
    .await;
    // Drained of partitions, held back by what its delay store holds.
    eventually(READY_TIMEOUT, Duration::from_millis(100), || {
        let c = &c;
        let id = id.clone();
        async move {
            let leader = c.leader(0).await.expect("a leader");
            let ms = members(c, leader).await;
            let m = ms.iter().find(|m| m["id"] == id.as_str());
            let reason = m
                .and_then(|m| m["decommission_reason"].as_str())
                .unwrap_or_default();
            anyhow::ensure!(
                reason.contains(&format!("hold {DELAYED} records")),
                "not held by its delayed messages: {m:?}"
            );
            Ok(())
        }
    })
    .await;
    assert!(
        std::time::Instant::now() < due,
        "the check came too late to mean anything"
    );
    // It leaves, but not before its delayed messages were due.
    eventually(READY_TIMEOUT, Duration::from_millis(100), || {
        let c = &c;
        let id = id.clone();
        async move {
            let ms = members(c, 0).await;
            anyhow::ensure!(
                ms.iter().all(|m| m["id"] != id.as_str()),
                "{id} still listed"
            );
            Ok(())
        }
    })
    .await;
    assert!(
        std::time::Instant::now() >= due,
        "it left before its delayed messages were due"
    );
    let mut got = std::collections::BTreeSet::new();
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < DELAYED {
        assert!(
            std::time::Instant::now() < end,
            "{} of {DELAYED} delayed messages: {got:?}",
            got.len()
        );
        let r = c.http(0).consume("dc", "wait=1s").await;
        if r.status != 200 {
            continue;
        }
        let m = narad_tests::Msg::parse(&r.body).unwrap();
        let p = String::from_utf8_lossy(&m.payload_bytes()).into_owned();
        if p.starts_with("late") {
            got.insert(p);
        }
        c.http(0).ack_ok("dc", m.handle()).await;
    }
}
