//! A three-node cluster on loopback (SPEC §6): any node serves any request, a topic created
//! through one node is usable through the others at once, and the data plane survives node
//! loss and quorum loss.

use std::time::{Duration, Instant};

use narad_e2e::load::Load;
use narad_e2e::{ClusterOpts, TestCluster};
use narad_tests::{json, metric_sum_where, Msg};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_serves_any_request() {
    let c = TestCluster::start(3).await;

    // Membership: three alive members, exactly one leader, sorted by id.
    let members = c.members(1).await;
    let ids: Vec<&str> = members.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["n0", "n1", "n2"], "{members:?}");
    assert!(
        members.iter().all(|m| m["status"] == "alive"),
        "{members:?}"
    );
    assert_eq!(
        members.iter().filter(|m| m["leader"] == true).count(),
        1,
        "{members:?}"
    );

    // Created on n0, used at once on n1 and n2 (catch-up before 404).
    c.http(0)
        .create_topic(&json!({"name": "orders", "partitions": 6}))
        .await;
    for i in 0..30u32 {
        c.http(1 + (i as usize % 2))
            .produce_ok("orders", "", format!("m{i}"))
            .await;
    }
    // Placement: partition p → member p mod 3.
    assert_eq!(
        c.owners(2, "orders").await,
        ["n0", "n1", "n2", "n0", "n1", "n2"]
    );
    c.http(0).wait_total_visible("orders", 30).await;
    // The backlog is summed over every owner's partitions, whichever node is asked.
    let v = c.http(1).get_topic("orders", "").await;
    assert_eq!(v["backlog"]["messages"], 30, "{v}");
    assert_eq!(v["backlog"]["in_flight"], 0, "{v}");

    // Consume through n2 (local partitions first, then remote owners), ack through n0.
    let mut got = Vec::new();
    while got.len() < 30 {
        let m: Msg = c.http(2).consume_msg("orders", "wait=2s").await;
        c.http(0)
            .ack_ok("orders", m.receipt_handle.as_deref().unwrap())
            .await;
        got.push(String::from_utf8(m.payload_bytes()).unwrap());
    }
    got.sort();
    let mut want: Vec<String> = (0..30).map(|i| format!("m{i}")).collect();
    want.sort();
    assert_eq!(got, want);
    c.http(1).consume_none("orders", "").await;

    // Pinned consume and replay of a remote partition are forwarded to its owner; the
    // attributes travel from n0's WAL to the owner n2 (`CommitProduceBatchAttrs`) and back
    // in the owner's answer.
    c.http(0)
        .request(
            narad_tests::Method::POST,
            "/v1/topics/orders/produce?partition=2&key=k",
        )
        .header("Narad-Attr-Traceparent", "00-1-2-01")
        .body("pinned")
        .send()
        .await
        .expect(202);
    let m = c.http(0).consume_msg("orders", "partition=2&wait=2s").await;
    assert_eq!(m.payload_bytes(), b"pinned");
    assert_eq!(m.key.as_deref(), Some("k"));
    assert_eq!(
        m.json["attributes"],
        json!({"traceparent": "00-1-2-01"}),
        "{}",
        m.json
    );
    // The owner counts deliveries: a nack through another node, and the redelivery through
    // the first counts 2.
    assert_eq!(m.json["delivery_count"], 1, "{}", m.json);
    c.http(1)
        .ack("orders", m.handle(), Some("0"))
        .await
        .expect(204);
    let m = c.http(0).consume_msg("orders", "partition=2&wait=2s").await;
    assert_eq!(m.payload_bytes(), b"pinned");
    assert_eq!(m.json["delivery_count"], 2, "{}", m.json);
    let replayed = c
        .http(1)
        .consume_msg("orders", &format!("partition=2&offset={}", m.offset))
        .await;
    assert_eq!(replayed.payload_bytes(), b"pinned");
    assert!(replayed.receipt_handle.is_none());
    // A settled handle is stale everywhere.
    let h = m.receipt_handle.clone().unwrap();
    c.http(1).ack_ok("orders", &h).await;
    c.http(2).ack("orders", &h, None).await.expect_error(410);

    // Batch ack across owners.
    for i in 0..6 {
        c.http(0)
            .produce_ok("orders", &format!("partition={i}"), format!("b{i}"))
            .await;
    }
    c.http(0).wait_total_visible("orders", 37).await;
    let mut handles = Vec::new();
    for i in 0..6 {
        let m = c
            .http(1)
            .consume_msg("orders", &format!("partition={i}&wait=2s"))
            .await;
        handles.push(m.receipt_handle.unwrap());
    }
    let refs: Vec<&str> = handles.iter().map(String::as_str).collect();
    let r = c
        .http(2)
        .ack_batch("orders", None, &refs)
        .await
        .expect_json(200);
    let statuses: Vec<u64> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [204; 6], "{r}");

    // Alter and delete through a follower reach every node.
    c.http(2)
        .patch_json("/v1/topics/orders", &json!({"partitions": 9}))
        .await
        .expect(200);
    // n0's replica applies the change within a replication round.
    narad_tests::eventually(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            match c.owners(0, "orders").await.len() {
                9 => Ok(()),
                n => Err(anyhow::anyhow!("n0 sees {n} partitions")),
            }
        },
    )
    .await;
    c.http(1).delete("/v1/topics/orders").await.expect(204);
    // Reads come from each node's replica, which applies the delete within a round.
    for i in 0..3 {
        narad_tests::eventually(
            Duration::from_secs(5),
            Duration::from_millis(20),
            || async {
                match c.http(i).get("/v1/topics/orders").await.status {
                    404 => Ok(()),
                    s => Err(anyhow::anyhow!("node {i} answers {s}")),
                }
            },
        )
        .await;
    }
}

/// SPEC §6.6: n2 plays a node of an older build that knows neither `CommitProduceBatch` (11)
/// nor `AckBatch` (31). The others fall back to `CommitProduce` (10) and `Ack` (3) for it,
/// and the cluster serves every request as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_an_older_build_interoperates() {
    let c = TestCluster::start_with(
        3,
        ClusterOpts {
            node_env: vec![(2, "NARAD_TEST_RPC_UNSUPPORTED".into(), "11,31".into())],
            ..ClusterOpts::default()
        },
    )
    .await;
    c.http(0)
        .create_topic(&json!({"name": "mixed", "partitions": 3}))
        .await;
    assert_eq!(c.owners(1, "mixed").await, ["n0", "n1", "n2"]);
    // Produced through the new nodes, into every partition (n2 owns partition 2).
    for i in 0..30u32 {
        c.http(i as usize % 2)
            .produce_ok("mixed", &format!("partition={}", i % 3), format!("m{i}"))
            .await;
    }
    c.http(2).wait_total_visible("mixed", 30).await;
    // Consumed through n0, acked through n1: single acks and one batch.
    let mut got = Vec::new();
    let mut batch = Vec::new();
    while got.len() < 30 {
        let m: Msg = c.http(0).consume_msg("mixed", "wait=2s").await;
        let h = m.receipt_handle.clone().unwrap();
        if m.partition == 2 && batch.len() < 5 {
            batch.push(h);
        } else {
            c.http(1).ack_ok("mixed", &h).await;
        }
        got.push(String::from_utf8(m.payload_bytes()).unwrap());
    }
    let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
    let r = c
        .http(1)
        .ack_batch("mixed", None, &refs)
        .await
        .expect_json(200);
    assert!(
        r["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["status"] == 204),
        "{r}"
    );
    got.sort();
    let mut want: Vec<String> = (0..30).map(|i| format!("m{i}")).collect();
    want.sort();
    assert_eq!(got, want);
    c.http(2).consume_none("mixed", "").await;
    // n2 was asked the new opcodes, answered them as unknown, and got the old ones instead.
    let text = c.http(2).metrics_text().await;
    let served = |op: &str| metric_sum_where(&text, "narad_rpc_served_total", &[("opcode", op)]);
    assert!(served("11").unwrap_or(0.0) >= 1.0, "{text}");
    assert_eq!(served("10"), Some(10.0), "one CommitProduce per record");
    assert!(served("31").unwrap_or(0.0) >= 1.0, "{text}");
    assert!(served("3").unwrap_or(0.0) >= 1.0, "{text}");
}

/// SPEC §6.2: a leader stopped with SIGTERM hands leadership to a caught-up voter. The
/// others see the new leader within one election round — an election after the old
/// leader's Raft stopped could not start before its 1 s lease ran out — and metadata writes
/// go on through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_gracefully_hands_leadership_off() {
    let mut c = TestCluster::start(3).await;
    let leader = c.leader(0).await.expect("a leader");
    let other = (leader + 1) % 3;
    let started = Instant::now();
    c.nodes[leader].server.terminate();
    let mut took = None;
    while started.elapsed() < Duration::from_secs(10) {
        if let Some(l) = c.leader(other).await {
            if l != leader {
                took = Some(started.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = took.expect("no new leader within 10 s");
    eprintln!("leadership moved {took:?} after SIGTERM");
    assert!(
        took < Duration::from_millis(900),
        "leadership took {took:?} to move: no handoff"
    );
    c.http(other)
        .create_topic(&json!({"name": "after-handoff", "partitions": 3}))
        .await;
    assert!(
        c.nodes[leader]
            .server
            .wait_exit(Duration::from_secs(30))
            .await
            .is_some_and(|s| s.success()),
        "the old leader did not exit cleanly"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_keeps_the_data_plane() {
    let mut c = TestCluster::start(3).await;
    c.http(0)
        .create_topic(&json!({"name": "q", "partitions": 6, "visibility_timeout_ms": 5000}))
        .await;
    let urls: Vec<String> = (0..3).map(|i| c.url(i)).collect();
    let load = Load::start(&urls, "q", 8, 2);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Two of three down: no quorum.
    c.kill9(1);
    c.kill9(2);
    let before = load.ledger.acked_count();
    // Produce still answers 202 on the survivor (rerouted to its own partitions).
    for i in 0..20 {
        c.http(0)
            .produce_ok("q", "", narad_tests::payload::make(9999, i + 1))
            .await;
        load.ledger
            .record_acked(narad_tests::payload::id(9999, i + 1));
    }
    // Control plane: 503.
    let r = c
        .http(0)
        .post_json("/v1/topics", &json!({"name": "q2"}))
        .await;
    r.expect_error(503);
    narad_tests::eventually(Duration::from_secs(20), Duration::from_millis(100), || {
        let l = load.ledger.clone();
        async move {
            anyhow::ensure!(l.acked_count() > before + 100, "{}", l.progress());
            Ok(())
        }
    })
    .await;

    // Quorum back: everything drains.
    c.restart(1).await;
    c.restart(2).await;
    c.wait_ready(1).await;
    c.wait_ready(2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (report, drained) = load.finish(Duration::from_secs(60)).await;
    eprintln!("quorum loss: {report}");
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    report.assert_ok();
    c.http(1)
        .post_json("/v1/topics", &json!({"name": "q2"}))
        .await
        .expect(201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_member_with_an_empty_disk_rejoins_instead_of_bootstrapping() {
    let mut c = TestCluster::start(3).await;
    c.http(0)
        .create_topic(&json!({"name": "before", "partitions": 3}))
        .await;
    // n2's volume is replaced: same id, same peers, empty data dir.
    c.kill9(2);
    let dir = c.nodes[2].server.data_dir().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    c.restart(2).await;
    c.wait_ready(2).await;
    // It joined the existing cluster (a second, bootstrapped one would not know the topic
    // and would elect its own leader).
    let t = c.http(2).get("/v1/topics/before").await.expect_json(200);
    assert_eq!(t["partitions"], 3, "{t}");
    assert_eq!(c.leader(2).await, c.leader(0).await);
    c.http(2)
        .create_topic(&json!({"name": "after", "partitions": 3}))
        .await;
    c.http(0).get("/v1/topics/after").await.expect(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_only_node_is_admitted_and_serves() {
    let mut c = TestCluster::start(3).await;
    let i = c.add_node().await;
    let members = c.members(i).await;
    assert_eq!(members.len(), 4, "{members:?}");
    assert!(
        members.iter().all(|m| m["status"] == "alive"),
        "{members:?}"
    );
    // New partitions are placed on it too (p mod 4).
    c.http(i)
        .create_topic(&json!({"name": "four", "partitions": 4}))
        .await;
    assert_eq!(c.owners(0, "four").await, ["n0", "n1", "n2", "n3"]);
    for k in 0..8 {
        c.http(k % 4).produce_ok("four", "", format!("m{k}")).await;
    }
    c.http(3).wait_total_visible("four", 8).await;
    // A restart keeps it a voter: it comes back ready without asking again.
    c.restart(i).await;
    c.wait_ready(i).await;
    c.http(i).get("/v1/topics/four").await.expect(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_and_replica_children_across_nodes() {
    let c = TestCluster::start(3).await;
    c.http(0)
        .create_topic(&json!({"name": "orders", "partitions": 3}))
        .await;
    c.http(1)
        .create_topic(&json!({"name": "audit", "partitions": 3}))
        .await;
    // Attach through a node that is not necessarily the leader.
    c.http(2)
        .post_json("/v1/topics/orders/children", &json!({"child": "audit"}))
        .await
        .expect(200);
    // A replica child: placed so that partition p never shares a node with the parent's p.
    c.http(1)
        .post_json(
            "/v1/topics",
            &json!({"name": "orders-dr", "parent": "orders"}),
        )
        .await
        .expect(201);
    let parent = c.owners(0, "orders").await;
    let replica = c.owners(0, "orders-dr").await;
    assert_eq!(replica.len(), 3);
    for p in 0..3 {
        assert_ne!(
            parent[p], replica[p],
            "partition {p}: {parent:?} vs {replica:?}"
        );
    }
    for i in 0..60u32 {
        c.http(i as usize % 3)
            .produce_ok("orders", &format!("key=k{i}"), format!("m{i}"))
            .await;
    }
    // Every copy arrives, whichever node owns the child partition.
    for child in ["audit", "orders-dr"] {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while got.len() < 60 && std::time::Instant::now() < deadline {
            let r = c.http(2).consume(child, "wait=1s&max=100").await;
            if r.status == 200 {
                for m in r.json()["messages"].as_array().unwrap() {
                    got.push(m["payload"].as_str().unwrap().to_string());
                    let h = m["receipt_handle"].as_str().unwrap();
                    c.http(0).ack_ok(child, h).await;
                }
            }
        }
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 60, "{child}: {got:?}");
    }
    // Lag sums every parent partition's cursor, whichever node runs it (FanoutCursors):
    // complete, and 0 once everything is copied.
    let http = c.http(1);
    narad_tests::eventually(Duration::from_secs(10), Duration::from_millis(100), || {
        let http = http.clone();
        async move {
            let kids = http
                .get("/v1/topics/orders/children")
                .await
                .expect_json(200);
            let list = kids["children"].as_array().cloned().unwrap_or_default();
            anyhow::ensure!(list.len() == 2, "{kids}");
            for k in &list {
                anyhow::ensure!(
                    k["lag_complete"] == true && k["lag_messages"] == 0,
                    "{kids}"
                );
            }
            Ok(())
        }
    })
    .await;
}

/// Issue 12, finding 5: a `max` consume through a node that does not own the partition made
/// the owner lease up to `max` messages and then fail to send a reply over the 16 MiB frame
/// limit: a pinned consume answered 500, an unpinned one 204, and the leased messages were
/// lost from view every round. Now the owner leases only what fits one answer: pinned and
/// unpinned `max=100` consumes through n0 of 1 MiB binary messages on n1 and n2 hand out
/// every message exactly once, in bounded batches, with nothing left leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_batch_consume_hands_out_large_messages_in_bounded_answers() {
    const N: u64 = 24;
    const MIB: usize = 1024 * 1024;
    let c = TestCluster::start(3).await;
    c.http(0)
        .create_topic(&json!({"name": "large", "partitions": 3}))
        .await;
    assert_eq!(c.owners(0, "large").await, ["n0", "n1", "n2"]);
    let leased = |i: usize| {
        let http = c.http(i);
        async move {
            let text = http.metrics_text().await;
            metric_sum_where(&text, "narad_inflight_size", &[("topic", "large")]).unwrap_or(0.0)
                as u64
        }
    };
    // Pinned: partition 1 lives on n1.
    for i in 0..N {
        c.http(1)
            .produce_ok("large", "partition=1", narad_tests::payload::binary(i, MIB))
            .await;
    }
    c.http(1).wait_visible("large", 1, N).await;
    let got = c
        .http(0)
        .drain_batches("large", "partition=1", || leased(1))
        .await;
    assert_eq!(offsets(&got), (0..N).collect::<Vec<_>>());
    assert!(got
        .iter()
        .all(|m| m.payload_bytes() == narad_tests::payload::binary(m.offset, MIB)));

    // Unpinned: n0's own partition is empty; the messages are on n2.
    for i in 0..N {
        c.http(2)
            .produce_ok(
                "large",
                "partition=2",
                narad_tests::payload::binary(N + i, MIB),
            )
            .await;
    }
    c.http(2).wait_visible("large", 2, N).await;
    let got = c
        .http(0)
        .drain_batches("large", "wait=0", || leased(2))
        .await;
    assert_eq!(offsets(&got), (0..N).collect::<Vec<_>>());
    assert!(got
        .iter()
        .all(|m| m.payload_bytes() == narad_tests::payload::binary(N + m.offset, MIB)));
    for i in 0..3 {
        assert_eq!(leased(i).await, 0, "n{i} still holds leases");
    }
}

fn offsets(msgs: &[narad_tests::Msg]) -> Vec<u64> {
    let mut o: Vec<u64> = msgs.iter().map(|m| m.offset).collect();
    o.sort();
    o
}

/// `topic.max_topics` holds cluster-wide: creates through every node at once, racing for the
/// last slots, are counted in metadata-log order on the leader, so exactly the limit gets in
/// and the rest are `409`, whichever node they came through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_count_limit_holds_across_nodes() {
    let c = TestCluster::start_with(
        3,
        ClusterOpts {
            env: vec![("NARAD_TOPIC_MAX_TOPICS".into(), "4".into())],
            ..ClusterOpts::default()
        },
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..12usize {
        let http = c.http(i % 3);
        tasks.push(tokio::spawn(async move {
            http.post_json("/v1/topics", &json!({"name": format!("race-{i}")}))
                .await
        }));
    }
    let mut created = 0;
    for t in tasks {
        let r = t.await.unwrap();
        match r.status {
            201 => created += 1,
            409 => assert!(
                r.expect_error(409).contains("topic limit reached"),
                "{}",
                r.describe()
            ),
            _ => panic!("{}", r.describe()),
        }
    }
    assert_eq!(created, 4);
    for i in 0..3 {
        let list = c.http(i).get("/v1/topics").await.expect_json(200);
        assert_eq!(list["topics"].as_array().map(Vec::len), Some(4), "{list}");
    }
    // A delete through one node frees a slot for a create through another.
    let list = c.http(0).get("/v1/topics").await.expect_json(200);
    let first = list["topics"][0]["name"].as_str().unwrap().to_string();
    c.http(2)
        .delete(format!("/v1/topics/{first}"))
        .await
        .expect(204);
    c.http(1)
        .create_topic(&json!({"name": "after-delete"}))
        .await;
    c.http(0)
        .post_json("/v1/topics", &json!({"name": "one-too-many"}))
        .await
        .expect_error(409);
}

/// Pause, purge and seek (ext §3.8) through any node reach every partition's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_purge_and_seek_reach_every_owner() {
    let mut c = TestCluster::start(3).await;
    let path = |what: &str| format!("/v1/topics/q/{what}");
    c.http(0)
        .create_topic(&json!({"name": "q", "partitions": 6}))
        .await;
    for i in 0..30u32 {
        c.http(1 + (i as usize % 2))
            .produce_ok("q", &format!("partition={}", i % 6), format!("m{i}"))
            .await;
    }
    c.http(0).wait_total_visible("q", 30).await;
    let backlog = |v: serde_json::Value| {
        (
            v["backlog"]["messages"].as_u64().unwrap(),
            v["backlog"]["in_flight"].as_u64().unwrap(),
        )
    };

    // Paused through n1: no node leases, pinned to a remote partition or not.
    let rec = c
        .http(1)
        .post_json(path("pause"), &json!({}))
        .await
        .expect_json(200);
    assert_eq!(rec["paused"], true, "{rec}");
    for n in 0..3 {
        assert_eq!(c.http(n).get_topic("q", "").await["paused"], true);
        c.http(n).consume_none("q", "wait=0").await;
        c.http(n).consume_none("q", "partition=2&wait=0").await;
    }
    c.http(2)
        .post_json(path("resume"), &json!({}))
        .await
        .expect_json(200);
    let held = c.http(0).consume_msg("q", "partition=2&wait=2s").await;

    // Purged through n2: every owner's frontier is at its high watermark.
    let v = c
        .http(2)
        .post_json(path("purge"), &json!({}))
        .await
        .expect_json(200);
    let parts = v["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 6, "{v}");
    for p in parts {
        assert_eq!(p["frontier"], 5, "{v}");
    }
    assert_eq!(backlog(c.http(1).get_topic("q", "").await), (0, 0));
    c.http(1)
        .ack("q", held.handle(), None)
        .await
        .expect_error(410);
    for n in 0..3 {
        c.http(n).consume_none("q", "wait=0").await;
    }

    // Sought back through n0, by time for all and by offset for one remote partition.
    let v = c
        .http(0)
        .post_json(path("seek"), &json!({"timestamp": 0}))
        .await
        .expect_json(200);
    assert!(
        v["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["frontier"] == 0),
        "{v}"
    );
    assert_eq!(backlog(c.http(2).get_topic("q", "").await), (30, 0));
    let v = c
        .http(0)
        .post_json(path("seek"), &json!({"partition": 4, "offset": 3}))
        .await
        .expect_json(200);
    assert_eq!(v["partitions"][0]["previous_frontier"], 0, "{v}");
    assert_eq!(v["partitions"][0]["frontier"], 3, "{v}");
    assert_eq!(backlog(c.http(1).get_topic("q", "").await), (27, 0));
    let mut got = 0;
    while c.http(1).get_topic("q", "").await["backlog"]["messages"] != 0 {
        let m = c.http(1).consume_msg("q", "wait=2s").await;
        c.http(2).ack_ok("q", m.handle()).await;
        got += 1;
    }
    assert_eq!(got, 27);

    // A delayed nack and a visibility through nodes that do not own the partition.
    c.http(0).produce_ok("q", "partition=2", "d").await;
    let m = c.http(0).consume_msg("q", "partition=2&wait=2s").await;
    let nacked = Instant::now();
    c.http(1)
        .ack_query(
            "q",
            &format!("receipt_handle={}&extend=0&delay=1s", m.handle()),
        )
        .await
        .expect(204);
    c.http(0).consume_none("q", "partition=2&wait=0").await;
    let again = c.http(0).consume_msg("q", "partition=2&wait=5s").await;
    assert!(nacked.elapsed() >= Duration::from_millis(990));
    assert_eq!(again.json["delivery_count"], 2, "{}", again.json);
    c.http(1)
        .ack_query(
            "q",
            &format!(
                "receipt_handle={}&extend=true&visibility=1s",
                again.handle()
            ),
        )
        .await
        .expect(204);
    let third = c.http(0).consume_msg("q", "partition=2&wait=5s").await;
    c.http(1).ack_ok("q", third.handle()).await;

    // An owner down: the others move, the answer is 503 naming the partitions that did not.
    c.kill9(2);
    let owned_by_n2: Vec<usize> = c
        .owners(0, "q")
        .await
        .iter()
        .enumerate()
        .filter(|(_, o)| *o == "n2")
        .map(|(p, _)| p)
        .collect();
    assert_eq!(owned_by_n2, [2, 5]);
    let msg = c
        .http(0)
        .post_json(path("seek"), &json!({"timestamp": 0}))
        .await
        .expect_error(503);
    assert!(
        msg.contains("partition 2") && msg.contains("partitions 5"),
        "{msg}"
    );
}

/// (ext) Idempotent produce across nodes: each message produced through one node with an
/// idempotency key and retried through the two others (unkeyed records go by the idempotency
/// key's hash, so every attempt meets at one owner) is stored once; a delayed one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_through_another_node_is_not_stored_again() {
    const N: usize = 60;
    let c = TestCluster::start(3).await;
    c.http(0)
        .create_topic(&json!({"name": "idem", "partitions": 6}))
        .await;
    for i in 0..N {
        for attempt in 0..3 {
            let r = c
                .http((i + attempt) % 3)
                .request(
                    narad_tests::Method::POST,
                    format!("{}/produce", narad_tests::topic_path("idem")),
                )
                .header("idempotency-key", &format!("id-{i}"))
                .body(format!("m{i}-{attempt}"))
                .send()
                .await;
            r.expect(202);
        }
    }
    for via in 0..3 {
        let r = c
            .http(via)
            .produce_batch(
                "idem",
                &json!({"messages": [{"payload": "late", "idempotency_key": "late-1", "delay": "1s"}]}),
            )
            .await;
        r.expect_json(202);
    }
    c.http(1).wait_total_visible("idem", N as u64 + 1).await;
    let got = c.http(2).drain("idem", "wait=0").await;
    // One attempt of each (whichever reached the owner first: each node's WAL commits on
    // its own schedule).
    let mut ids: Vec<String> = got
        .iter()
        .map(|m| {
            let p = String::from_utf8_lossy(&m.payload_bytes()).into_owned();
            p.split('-').next().unwrap_or_default().to_string()
        })
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(got.len(), N + 1, "{ids:?}");
    assert_eq!(ids.len(), N + 1, "an id stored twice");
    // Nothing was rerouted, so no pair could split.
    let mut split = 0.0;
    for i in 0..3 {
        split += metric_sum_where(
            &c.http(i).metrics_text().await,
            "narad_dedup_split_total",
            &[],
        )
        .unwrap_or(0.0);
    }
    assert_eq!(split, 0.0);
}
