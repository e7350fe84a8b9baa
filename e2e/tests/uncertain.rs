//! Certain and uncertain failures of forwarded operations (SPEC §3.11, CLIENT-COMPAT §4.3).
//!
//! A node-RPC call that failed before its request was written (nothing was applied) answers
//! `503`; one that failed after (connection lost, no reply) answers `502` with a body saying
//! the outcome is unknown and `the change may still be applied`. The test knob
//! `NARAD_TEST_RPC_FAULT` (`before:<opcode>:<n>` / `after:<opcode>:<n>`) breaks the
//! forwarding node's n-th request of an opcode: `before` drops the connection just before
//! the request is written; `after` writes it and drops the peer's reply, so the caller sees
//! the connection lost once the peer has acted. Each case is reproduced deterministically.
//!
//! A draining node (decommission, SPEC §6.5) forwards produce to a live, non-draining node;
//! with no node to take it, it refuses with the text clients read as "nothing stored".

use std::collections::HashMap;
use std::time::{Duration, Instant};

use narad_e2e::{ClusterOpts, TestCluster};
use narad_tests::{eventually, json, Msg};

/// Opcodes (SPEC §6.6 registry).
const PRODUCE: u8 = 1;
const CONSUME: u8 = 2;
const CREATE_TOPIC: u8 = 4;
const ACK_BATCH: u8 = 31;

const UNCERTAIN: &str = "the change may still be applied";

/// A three-node cluster whose node 0 breaks its node-RPC connections at `faults`.
async fn cluster_faulting_on(node: usize, faults: &str) -> TestCluster {
    TestCluster::start_with(
        3,
        ClusterOpts {
            node_env: vec![(node, "NARAD_TEST_RPC_FAULT".into(), faults.into())],
            ..ClusterOpts::default()
        },
    )
    .await
}

/// A topic with a short visibility timeout and a partition owned by `n1`.
async fn topic_on_n1(c: &TestCluster, name: &str) -> u64 {
    c.http(0)
        .create_topic(&json!({"name": name, "partitions": 3, "visibility_timeout_ms": 2000}))
        .await;
    c.owners(1, name)
        .await
        .iter()
        .position(|o| o == "n1")
        .expect("n1 owns a partition") as u64
}

#[track_caller]
fn assert_certain_503(r: &narad_tests::Resp) {
    let msg = r.expect_error(503);
    assert!(!msg.contains(UNCERTAIN), "{}", r.describe());
    assert_eq!(r.header("retry-after"), Some("1"), "{}", r.describe());
}

#[track_caller]
fn assert_uncertain_502(r: &narad_tests::Resp) {
    let msg = r.expect_error(502);
    assert!(msg.contains(UNCERTAIN), "{}", r.describe());
    assert!(msg.contains("the outcome is unknown"), "{}", r.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_settle_lost_after_sending_is_502_and_landed_on_the_owner() {
    // n0's AckBatch calls: the 1st breaks before it is written, the 2nd and 4th after.
    let c = cluster_faulting_on(
        0,
        &format!("before:{ACK_BATCH}:1,after:{ACK_BATCH}:2,after:{ACK_BATCH}:4"),
    )
    .await;
    let p = topic_on_n1(&c, "settles").await;
    for m in ["a", "b", "c"] {
        c.http(1)
            .produce_ok("settles", &format!("partition={p}"), m)
            .await;
    }
    c.http(1).wait_visible("settles", p, 3).await;
    let pinned = format!("partition={p}");

    let a = c.http(1).consume_msg("settles", &pinned).await;
    let ha = a.receipt_handle.clone().unwrap();
    // Before sending: not applied, 503, the lease still holds.
    assert_certain_503(&c.http(0).ack("settles", &ha, None).await);
    // After sending: 502 uncertain; the owner applied it.
    assert_uncertain_502(&c.http(0).ack("settles", &ha, None).await);
    // The SDK's retry now gets 410: the handle was settled by the lost call.
    c.http(0).ack("settles", &ha, None).await.expect_error(410);

    // Batch ack: the item carries the uncertain answer.
    let b = c.http(1).consume_msg("settles", &pinned).await;
    let hb = b.receipt_handle.clone().unwrap();
    let v = c
        .http(0)
        .ack_batch("settles", None, &[hb.as_str()])
        .await
        .expect_json(200);
    assert_eq!(v["results"][0]["status"], 502, "{v}");
    assert!(
        v["results"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains(UNCERTAIN)),
        "{v}"
    );
    c.http(1).ack("settles", &hb, None).await.expect_error(410);

    // Neither acked message comes back once their leases would have run out: only "c".
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let rest = c.http(1).consume_msg("settles", &pinned).await;
    assert_eq!(rest.payload_bytes(), b"c");
    c.http(1)
        .consume_none("settles", &format!("{pinned}&wait=1s"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_consume_lost_after_sending_is_502_and_leased_on_the_owner() {
    let c = cluster_faulting_on(0, &format!("before:{CONSUME}:1,after:{CONSUME}:2")).await;
    let p = topic_on_n1(&c, "leases").await;
    c.http(1)
        .produce_ok("leases", &format!("partition={p}"), "x")
        .await;
    c.http(1).wait_visible("leases", p, 1).await;
    let pinned = format!("partition={p}");

    // Before sending: 503 and nothing leased — the owner hands the message out at once.
    assert_certain_503(&c.http(0).consume("leases", &pinned).await);
    let m = c.http(1).consume_msg("leases", &pinned).await;
    assert_eq!(m.payload_bytes(), b"x");
    c.http(1)
        .ack("leases", m.receipt_handle.as_deref().unwrap(), Some("0"))
        .await
        .expect(204);

    // After sending: 502 uncertain; the owner leased it to the lost answer.
    assert_uncertain_502(&c.http(0).consume("leases", &pinned).await);
    c.http(1).consume_none("leases", &pinned).await;
    // The lease runs out and the message is delivered again.
    let again = c
        .http(1)
        .consume_msg("leases", &format!("{pinned}&wait=5s"))
        .await;
    assert_eq!(again.payload_bytes(), b"x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_write_lost_after_reaching_the_leader_is_502_and_committed() {
    // Every node carries the faults; only a follower forwards creates.
    let faults = format!("after:{CREATE_TOPIC}:1,before:{CREATE_TOPIC}:2");
    let c = TestCluster::start_with(
        3,
        ClusterOpts {
            env: vec![("NARAD_TEST_RPC_FAULT".into(), faults)],
            ..ClusterOpts::default()
        },
    )
    .await;
    let leader = c.leader(0).await.expect("a leader");
    let f = (leader + 1) % 3;

    // After sending: 502 uncertain, and the create did commit (no retry, so no false 409).
    let r = c
        .http(f)
        .post_json("/v1/topics", &json!({"name": "landed"}))
        .await;
    assert_uncertain_502(&r);
    c.http(f).get("/v1/topics/landed").await.expect(200);
    c.http(f)
        .post_json("/v1/topics", &json!({"name": "landed"}))
        .await
        .expect_error(409);
    // Before sending: nothing reached the leader; the follower tries again and creates it.
    c.http(f).create_topic(&json!({"name": "retried"})).await;
    let list = c.http(leader).get("/v1/topics").await.expect_json(200);
    let names: Vec<&str> = list["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["landed", "retried"], "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_node_forwards_produce_to_a_live_node() {
    // n2's Produce calls: the 2nd breaks after it is written, the 3rd before.
    let c = cluster_faulting_on(2, &format!("after:{PRODUCE}:2,before:{PRODUCE}:3")).await;
    c.http(0)
        .create_topic(&json!({"name": "drain", "partitions": 3}))
        .await;
    c.decommission(0, "n2").await;
    let n2 = c.http(2);
    eventually(Duration::from_secs(10), Duration::from_millis(50), || {
        let n2 = n2.clone();
        async move {
            let v = n2.get("/v1/cluster/members").await.json();
            let draining = v["members"]
                .as_array()
                .is_some_and(|ms| ms.iter().any(|m| m["id"] == "n2" && m["draining"] == true));
            anyhow::ensure!(draining, "n2 not draining yet: {v}");
            Ok(())
        }
    })
    .await;

    // Stored by another node; the producer gets its 202.
    c.http(2).produce_ok("drain", "", "d1").await;
    // Lost after the target got it: uncertain, and it was stored.
    assert_uncertain_502(&c.http(2).produce("drain", "", "d2").await);
    // Not sent to the first target: the next one takes it.
    c.http(2).produce_ok("drain", "key=k", "d3").await;
    let v = c
        .http(2)
        .produce_batch(
            "drain",
            &json!({"messages": [{"payload": "b1"}, {"payload": "b2", "partition": 1}]}),
        )
        .await
        .expect_json(202);
    assert_eq!(v["accepted"], 2, "{v}");

    // The decommission moves n2's partitions away; a move supersedes the leases taken
    // before it, so consume once n2 owns nothing and moves nothing.
    let n0 = c.http(0);
    eventually(Duration::from_secs(60), Duration::from_millis(100), || {
        let n0 = n0.clone();
        async move {
            let v = n0.get("/v1/cluster/members").await.json();
            let drained = v["members"].as_array().is_some_and(|ms| {
                ms.iter().any(|m| {
                    m["id"] == "n2" && m["owned_partitions"] == 0 && m["outbound_moves"] == 0
                })
            });
            anyhow::ensure!(drained, "n2 still owns or moves partitions: {v}");
            Ok(())
        }
    })
    .await;

    // Each exactly once.
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 5 {
        assert!(Instant::now() < deadline, "consumed only {seen:?}");
        let r = c.http(0).consume("drain", "wait=1s").await;
        if r.status == 200 {
            let m = Msg::parse(&r.body).unwrap();
            c.http(0)
                .ack_ok("drain", m.receipt_handle.as_deref().unwrap())
                .await;
            *seen.entry(m.payload_bytes()).or_default() += 1;
        }
    }
    c.http(0).consume_none("drain", "wait=1s").await;
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");

    // No node to take it: refused with the text for "nothing was stored" (a produce
    // written to a connection the kernel has not yet seen reset may answer 502 first).
    let mut c = c;
    c.kill9(0);
    c.kill9(1);
    let n2 = c.http(2);
    eventually(Duration::from_secs(10), Duration::from_millis(100), || {
        let n2 = n2.clone();
        async move {
            let r = n2.produce("drain", "", "late").await;
            anyhow::ensure!(
                r.status == 503
                    && r.error_message().is_some_and(
                        |m| m.contains("being decommissioned and takes no new produce")
                    ),
                "{}",
                r.describe()
            );
            Ok(())
        }
    })
    .await;
}
