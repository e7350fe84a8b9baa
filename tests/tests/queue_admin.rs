//! Queue administration (ext, SPEC §3.8): `POST /v1/topics/{t}/pause` and `…/resume`
//! (consumes lease nothing while paused; produce and replay go on), `…/purge` (every
//! partition's frontier jumps to its high watermark; leases of purged messages answer 410)
//! and `…/seek` (the frontier moves back to redeliver or forward to skip, to an offset or to
//! a time), across restarts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_tests::*;

fn frontiers(v: &Value) -> Vec<(u64, u64, u64)> {
    v["partitions"]
        .as_array()
        .unwrap_or_else(|| panic!("no partitions: {v}"))
        .iter()
        .map(|p| {
            (
                p["partition"].as_u64().unwrap(),
                p["previous_frontier"].as_u64().unwrap(),
                p["frontier"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn purge_settles_everything_committed_and_voids_leases_under_concurrent_consumers() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "pq", "partitions": 3}))
        .await;
    for i in 0..600 {
        http.produce_ok("pq", "", format!("m{i}")).await;
    }
    http.wait_total_visible("pq", 600).await;
    // A lease taken before the purge.
    let held = http.consume_msg("pq", "wait=0").await;

    // Consumers at work while the purge runs: each acks what it gets.
    let acked = Arc::new(AtomicU64::new(0));
    let gone = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut consumers = Vec::new();
    for _ in 0..4 {
        let (http, acked, gone, stop) = (http.clone(), acked.clone(), gone.clone(), stop.clone());
        consumers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = http.consume("pq", "wait=0").await;
                if r.status != 200 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let m = Msg::parse(&r.body).unwrap();
                match http.ack("pq", m.handle(), None).await.status {
                    204 => acked.fetch_add(1, Ordering::Relaxed),
                    410 => gone.fetch_add(1, Ordering::Relaxed),
                    s => panic!("ack answered {s}"),
                };
            }
        }));
    }
    eventually(Duration::from_secs(10), Duration::from_millis(10), || {
        let n = acked.load(Ordering::Relaxed);
        async move {
            (n >= 20)
                .then_some(())
                .ok_or_else(|| anyhow::anyhow!("{n} acked"))
        }
    })
    .await;
    let v = http
        .post_json(format!("{}/purge", topic_path("pq")), &json!({}))
        .await
        .expect_json(200);
    assert_eq!(v["topic"], "pq");
    let hwms = http.high_watermarks("pq").await.unwrap();
    let moved = frontiers(&v);
    assert_eq!(moved.len(), 3, "{v}");
    for (p, previous, frontier) in &moved {
        assert_eq!(Some(frontier), hwms.get(p), "partition {p}: {v}");
        assert!(previous <= frontier, "{v}");
    }
    // Nothing is left to lease: whatever the consumers get now is gone at once.
    let acked_at_purge = acked.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for c in consumers {
        c.await.unwrap();
    }
    // At most the four leases in flight at the purge were acked after it, and they got 410.
    assert!(acked.load(Ordering::Relaxed) <= acked_at_purge + 4);
    assert!(
        acked_at_purge < 600,
        "the consumers finished before the purge"
    );
    assert_eq!(http.backlog("pq").await, (0, 0));
    http.consume_none("pq", "wait=0").await;
    // The lease held across the purge is gone.
    http.ack("pq", held.handle(), None).await.expect_error(410);
    // Replay still reads what retention keeps.
    let r = http.consume("pq", "partition=0&offset=0").await;
    assert_eq!(r.status, 200, "{}", r.describe());
    // New messages are delivered.
    for i in 0..5 {
        http.produce_ok("pq", "", format!("after{i}")).await;
    }
    http.wait_total_visible("pq", 605).await;
    let got = http.drain("pq", "wait=0").await;
    let mut bodies: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8(m.payload_bytes()).unwrap())
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["after0", "after1", "after2", "after3", "after4"]);
    // A second purge is a no-op.
    let v = http
        .post_json(format!("{}/purge", topic_path("pq")), &json!({}))
        .await
        .expect_json(200);
    assert!(frontiers(&v).iter().all(|(_, a, b)| a == b), "{v}");
    http.post_json(format!("{}/purge", topic_path("nope")), &json!({}))
        .await
        .expect_error(404);
}

#[tokio::test]
async fn a_paused_topic_leases_nothing_until_resumed_and_stays_paused_across_restarts() {
    let mut server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "pz", "partitions": 3}))
        .await;
    let rec = http.get_topic("pz", "").await;
    assert!(rec.get("paused").is_none(), "{rec}");

    let rec = http
        .post_json(format!("{}/pause", topic_path("pz")), &json!({}))
        .await
        .expect_json(200);
    assert_eq!(rec["paused"], true, "{rec}");
    assert_eq!(http.get_topic("pz", "").await["paused"], true);
    // Produce goes on while paused; consumes get nothing (after their wait), pinned or not.
    for i in 0..4 {
        http.produce_ok("pz", &format!("partition={}", i % 2), format!("p{i}"))
            .await;
    }
    http.wait_total_visible("pz", 4).await;
    http.consume_none("pz", "wait=0").await;
    http.consume_none("pz", "partition=1&wait=0").await;
    let started = Instant::now();
    http.consume_none("pz", "wait=1s").await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        http.get(format!("{}/consume?max=10&wait=0", topic_path("pz")))
            .await
            .status,
        204
    );
    // Replay is a read and goes on.
    assert_eq!(http.consume("pz", "partition=0&offset=0").await.status, 200);
    assert_eq!(http.backlog("pz").await, (4, 0));

    // Pausing is idempotent and survives a restart.
    http.post_json(format!("{}/pause", topic_path("pz")), &json!({}))
        .await
        .expect_json(200);
    server.restart().await;
    assert_eq!(http.get_topic("pz", "").await["paused"], true);
    http.consume_none("pz", "wait=0").await;

    // A consume waiting when the topic is resumed gets a message.
    let waiting = {
        let http = http.clone();
        tokio::spawn(async move { http.consume("pz", "wait=10s").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rec = http
        .post_json(format!("{}/resume", topic_path("pz")), &json!({}))
        .await
        .expect_json(200);
    assert!(rec.get("paused").is_none(), "{rec}");
    let r = waiting.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.describe());
    let m = Msg::parse(&r.body).unwrap();
    http.ack_ok("pz", m.handle()).await;
    assert_eq!(http.drain("pz", "wait=0").await.len(), 3);
    http.post_json(format!("{}/resume", topic_path("nope")), &json!({}))
        .await
        .expect_error(404);
}

#[tokio::test]
async fn seek_moves_the_frontier_back_and_forward_to_an_offset_or_a_time() {
    let mut server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "sk", "partitions": 3}))
        .await;
    let seek = |body: Value| {
        let http = http.clone();
        async move {
            http.post_json(format!("{}/seek", topic_path("sk")), &body)
                .await
        }
    };
    for i in 0..10 {
        http.produce_ok("sk", "partition=0", format!("a{i}")).await;
    }
    http.wait_visible("sk", 0, 10).await;
    assert_eq!(http.drain("sk", "wait=0").await.len(), 10);

    // Back: offsets 3.. are delivered again, each as a first delivery.
    let v = seek(json!({"partition": 0, "offset": 3}))
        .await
        .expect_json(200);
    assert_eq!(frontiers(&v), [(0, 10, 3)]);
    assert_eq!(http.backlog("sk").await, (7, 0));
    let m = http.consume_msg("sk", "wait=0").await;
    assert_eq!((m.offset, m.json["delivery_count"].as_u64()), (3, Some(1)));
    // Forward, past the lease just taken: it is void, and offsets 8 and 9 remain.
    let v = seek(json!({"partition": 0, "offset": 8}))
        .await
        .expect_json(200);
    assert_eq!(frontiers(&v), [(0, 3, 8)]);
    http.ack("sk", m.handle(), None).await.expect_error(410);
    let left: Vec<u64> = http
        .drain("sk", "wait=0")
        .await
        .iter()
        .map(|m| m.offset)
        .collect();
    assert_eq!(left, [8, 9]);
    // To the high watermark and to the oldest offset are both in range.
    seek(json!({"partition": 0, "offset": 10}))
        .await
        .expect_json(200);
    seek(json!({"partition": 0, "offset": 0}))
        .await
        .expect_json(200);
    assert_eq!(http.backlog("sk").await, (10, 0));

    // By time: messages committed in a later second than the first batch.
    let first_second = http
        .consume_msg("sk", "partition=0&offset=9")
        .await
        .timestamp as u64;
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    while now() <= first_second {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = now();
    for i in 0..4 {
        http.produce_ok("sk", &format!("partition={}", i % 2), format!("b{i}"))
            .await;
    }
    http.wait_total_visible("sk", 14).await;
    let v = seek(json!({"timestamp": t})).await.expect_json(200);
    assert_eq!(frontiers(&v), [(0, 0, 10), (1, 0, 0), (2, 0, 0)], "{v}");
    let mut bodies: Vec<String> = http
        .drain("sk", "wait=0")
        .await
        .iter()
        .map(|m| String::from_utf8(m.payload_bytes()).unwrap())
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["b0", "b1", "b2", "b3"]);
    // One partition by time; a time before everything rewinds to the oldest, one after
    // everything skips all.
    let v = seek(json!({"timestamp": 0, "partition": 1}))
        .await
        .expect_json(200);
    assert_eq!(frontiers(&v), [(1, 2, 0)]);
    let v = seek(json!({"timestamp": t + 3600})).await.expect_json(200);
    assert_eq!(frontiers(&v), [(0, 12, 12), (1, 0, 2), (2, 0, 0)]);

    // Refusals: 400 with a reason, nothing moved.
    for (body, why) in [
        (json!({"partition": 0, "offset": 13}), "outside the log"),
        (json!({"offset": 1}), "needs the partition"),
        (
            json!({"partition": 0, "offset": 1, "timestamp": 1}),
            "not both",
        ),
        (json!({"partition": 0}), "give offset"),
        (json!({}), "give offset"),
        (json!({"partition": 3, "offset": 0}), "out of range"),
        (json!({"partition": 0, "offset": -1}), ""),
        (json!({"partition": 0, "offset": 1, "extra": 1}), ""),
    ] {
        let msg = seek(body.clone()).await.expect_error(400);
        assert!(msg.contains(why), "{body}: {msg}");
    }
    let r = http
        .request(reqwest::Method::POST, format!("{}/seek", topic_path("sk")))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await;
    r.expect_error(400);
    assert_eq!(http.backlog("sk").await, (0, 0));

    // The frontier is persisted before the answer: a crash right after keeps it. (A crash may
    // commit again what its WAL's last checkpoint window held, above the high watermark:
    // duplicates, never an offset below the frontier.)
    seek(json!({"partition": 0, "offset": 5}))
        .await
        .expect_json(200);
    server.restart().await;
    let left: Vec<u64> = http
        .drain("sk", "partition=0&wait=0")
        .await
        .iter()
        .map(|m| m.offset)
        .collect();
    assert!(left.starts_with(&[5, 6, 7, 8, 9, 10, 11]), "{left:?}");
    assert!(left.iter().all(|o| *o >= 5), "{left:?}");
}
