//! A remote child between a three-node cluster and a single node (SPEC §5.5): the attach
//! is forwarded to the metadata leader (node RPC 29, AttachRemoteChild) from whichever node
//! took it, every owner of a parent partition runs its cursors, lag sums over all owners,
//! and a detach through another node stops the copy.

use std::collections::BTreeSet;
use std::time::Duration;

use narad_e2e::TestCluster;
use narad_tests::{eventually, json, Msg, Server};

const COPY_TIMEOUT: Duration = Duration::from_secs(45);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_parent_owner_copies_to_the_remote() {
    let (c, mut remote) = tokio::join!(TestCluster::start(3), Server::start_default());
    let b = narad_tests::Http::new(remote.url());
    b.create_topic(&json!({"name": "orders-dr", "partitions": 3}))
        .await;
    c.http(0)
        .create_topic(&json!({"name": "orders", "partitions": 6}))
        .await;
    let owners: BTreeSet<String> = c.owners(0, "orders").await.into_iter().collect();
    assert_eq!(owners.len(), 3, "the parent spreads over every node");

    // Attach through a node that is not the leader: forwarded.
    let leader = c.leader(0).await.expect("a leader");
    let via = (leader + 1) % 3;
    let rec = c
        .http(via)
        .post_json(
            "/v1/topics/orders/children",
            &json!({"child": "dr", "remote": {"url": remote.url(), "topic": "orders-dr",
                    "username": "u", "password": "never-shown"}}),
        )
        .await
        .expect_json(200);
    assert_eq!(rec["remote_children"], json!(["dr"]), "{rec}");
    assert!(!rec.to_string().contains("never-shown"));
    // Every node sees the link at once.
    for i in 0..3 {
        let t = c.http(i).get_topic("orders", "").await;
        assert_eq!(t["remote_children"], json!(["dr"]), "node {i}: {t}");
    }

    let mut want = BTreeSet::new();
    for i in 0..120u32 {
        let id = format!("c-{i:04}");
        let q = if i % 3 == 0 {
            format!("key=k{i}")
        } else {
            String::new()
        };
        c.http(i as usize % 3)
            .produce_ok("orders", &q, id.clone())
            .await;
        want.insert(id);
    }
    eventually(COPY_TIMEOUT, Duration::from_millis(200), || async {
        let mut got = BTreeSet::new();
        for s in b.partition_stats("orders-dr").await {
            let p = s["index"].as_u64().unwrap();
            for o in s["oldest_offset"].as_u64().unwrap()..s["high_watermark"].as_u64().unwrap() {
                let r = b
                    .consume("orders-dr", &format!("partition={p}&offset={o}"))
                    .await;
                r.expect(200);
                got.insert(String::from_utf8(Msg::parse(&r.body)?.payload_bytes())?);
            }
        }
        anyhow::ensure!(got == want, "{} of {} arrived", got.len(), want.len());
        Ok(())
    })
    .await;

    // Lag sums every owner's cursors: complete and zero through any node.
    for i in 0..3 {
        eventually(COPY_TIMEOUT, Duration::from_millis(200), || async {
            let l = c
                .http(i)
                .get("/v1/topics/orders/children")
                .await
                .expect_json(200);
            let e = &l["children"][0];
            anyhow::ensure!(
                e["name"] == json!("dr")
                    && e["kind"] == json!("remote")
                    && e["lag_messages"] == json!(0)
                    && e["lag_complete"] == json!(true),
                "node {i}: {l}"
            );
            anyhow::ensure!(!l.to_string().contains("never-shown"), "node {i}: {l}");
            Ok(())
        })
        .await;
    }

    // `state` is the worst of every owner's cursors: with the remote down, records of one
    // partition make its owner's cursor retry, and every node reports it.
    remote.kill9();
    let owner0 = c.index_of(&c.owners(0, "orders").await[0]);
    for i in 0..3u32 {
        c.http(owner0)
            .produce_ok("orders", "partition=0", format!("down-{i}"))
            .await;
    }
    for i in (0..3).filter(|i| *i != owner0).chain([owner0]) {
        eventually(COPY_TIMEOUT, Duration::from_millis(200), || async {
            let l = c
                .http(i)
                .get("/v1/topics/orders/children")
                .await
                .expect_json(200);
            let e = &l["children"][0];
            anyhow::ensure!(
                e["state"] == json!("retrying") && e["last_error"].is_string(),
                "node {i}: {l}"
            );
            Ok(())
        })
        .await;
    }
    remote.restart().await;
    eventually(COPY_TIMEOUT, Duration::from_millis(200), || async {
        let l = c
            .http((owner0 + 1) % 3)
            .get("/v1/topics/orders/children")
            .await
            .expect_json(200);
        let e = &l["children"][0];
        anyhow::ensure!(
            e["state"] == json!("ok") && e["lag_messages"] == json!(0),
            "{l}"
        );
        Ok(())
    })
    .await;

    // Detach through yet another node: nothing more is copied.
    c.http((via + 1) % 3)
        .delete("/v1/topics/orders/children/dr")
        .await
        .expect(204);
    let before: u64 = b.high_watermarks("orders-dr").await.unwrap().values().sum();
    for i in 0..30u32 {
        c.http(i as usize % 3)
            .produce_ok("orders", "", format!("late-{i}"))
            .await;
    }
    c.http(0).wait_total_visible("orders", 150).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after: u64 = b.high_watermarks("orders-dr").await.unwrap().values().sum();
    assert_eq!(before, after, "copied after the detach");
}
