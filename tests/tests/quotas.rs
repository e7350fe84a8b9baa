//! (ext) Per-user quotas against a real secured `narad`: `PUT /v1/users/{u}/quotas`, produce
//! rates (single and batch) answered `429` with `Retry-After`, `max_topics` answered `409`,
//! lifting them, and what survives a restart.

use std::time::{Duration, Instant};

use narad_tests::auth_matrix::add_user;
use narad_tests::*;

const ROOT_PW: &str = "root-Pa55-q7a2";
const PW: &str = "capped-Pa55-1";

async fn put_quotas(http: &Http, user: &str, v: Value) -> Resp {
    http.request(Method::PUT, format!("/v1/users/{user}/quotas"))
        .json(&v)
        .send()
        .await
}

/// Produces to `topic` until a `429`; returns the number accepted and the refusal.
async fn produce_until_throttled(http: &Http, topic: &str, most: usize) -> (usize, Option<Resp>) {
    for i in 0..most {
        let r = http.produce(topic, "", format!("m{i}")).await;
        match r.status {
            202 => continue,
            429 => return (i, Some(r)),
            s => panic!("produce {i}: {s} {}", r.describe()),
        }
    }
    (most, None)
}

#[tokio::test]
async fn quotas_limit_produce_rates_and_owned_topics_until_lifted() {
    let mut server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let anon = Http::new(server.url());
    let root = anon.as_user("admin", ROOT_PW);
    add_user(
        &root,
        "capped",
        PW,
        json!([{"action": "create", "patterns": ["q-*"]},
               {"action": "produce", "patterns": ["*"]}]),
    )
    .await;
    let capped = anon.as_user("capped", PW);

    // Bad quotas are refused whole; root has none; unknown users are 404.
    for bad in [
        json!({"produce_msgs_per_s": 0}),
        json!({"max_topics": -1}),
        json!({"produce_bytes_per_s": 1_099_511_627_777u64}),
        json!({"produce_msgs_per_s": "5"}),
        json!({"consume_rate": 5}),
    ] {
        let msg = put_quotas(&root, "capped", bad.clone())
            .await
            .expect_error(400);
        assert!(!msg.is_empty(), "{bad}");
    }
    put_quotas(&root, "admin", json!({"max_topics": 1}))
        .await
        .expect_error(403);
    put_quotas(&root, "ghost", json!({}))
        .await
        .expect_error(404);
    put_quotas(&capped, "capped", json!({}))
        .await
        .expect_error(403);

    let u = put_quotas(
        &root,
        "capped",
        json!({"produce_msgs_per_s": 5, "max_topics": 1}),
    )
    .await
    .expect_json(200);
    assert_eq!(
        u["quotas"],
        json!({"produce_msgs_per_s": 5, "max_topics": 1}),
        "{u}"
    );
    let got = root.get("/v1/users/capped").await.expect_json(200);
    assert_eq!(got["quotas"], u["quotas"]);

    // max_topics: the first topic is created, the second refused with 409 naming the quota.
    capped
        .post_json("/v1/topics", &json!({"name": "q-one", "partitions": 3}))
        .await
        .expect(201);
    let r = capped
        .post_json("/v1/topics", &json!({"name": "q-two"}))
        .await;
    let msg = r.expect_error(409);
    assert!(msg.contains("max_topics"), "{msg}");
    assert!(
        r.header("retry-after").is_none(),
        "a count is not waited out"
    );
    // Topics others create do not count against it.
    root.create_topic_named("shared").await;

    // Rate: one second's worth (5) passes at once, then 429 with Retry-After.
    let (passed, refused) = produce_until_throttled(&capped, "q-one", 50).await;
    assert!(
        (5..=7).contains(&passed),
        "{passed} passed before the first 429"
    );
    let refused = refused.expect("never throttled");
    let msg = refused.expect_error(429);
    assert!(msg.contains("produce quota"), "{msg}");
    let retry: u64 = refused
        .header("retry-after")
        .expect("429 without Retry-After")
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "Retry-After {retry}");
    // Other users are not limited by it.
    for i in 0..20 {
        root.produce_ok("shared", "", format!("r{i}")).await;
    }
    // After Retry-After, produce passes again; over ~3 s the rate holds at about 5/s.
    tokio::time::sleep(Duration::from_secs(retry)).await;
    capped.produce_ok("q-one", "", "after").await;
    let start = Instant::now();
    let mut accepted = 0u32;
    while start.elapsed() < Duration::from_secs(3) {
        match capped.produce("q-one", "", "x").await.status {
            202 => accepted += 1,
            429 => tokio::time::sleep(Duration::from_millis(20)).await,
            s => panic!("produce: {s}"),
        }
    }
    assert!(
        (10..=21).contains(&accepted),
        "{accepted} accepted in 3 s at 5/s"
    );

    // A batch larger than a second's worth passes once, then its debt is waited out. (The
    // PUT replaces every quota, so max_topics is given again.)
    let q = put_quotas(
        &root,
        "capped",
        json!({"produce_msgs_per_s": 5, "produce_bytes_per_s": 1_000_000, "max_topics": 1}),
    )
    .await
    .expect_json(200);
    assert_eq!(q["quotas"]["produce_bytes_per_s"], 1_000_000);
    let batch = |n: usize| json!({"messages": (0..n).map(|i| json!({"payload": format!("b{i}")})).collect::<Vec<_>>()});
    capped
        .produce_batch("q-one", &batch(15))
        .await
        .expect_json(202);
    let r = capped.produce_batch("q-one", &batch(1)).await;
    r.expect_error(429);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (2..=3).contains(&retry),
        "10 messages of debt at 5/s: Retry-After {retry}"
    );

    let metrics = anon.get("/metrics").await.text();
    let throttled = metric_sum_where(
        &metrics,
        "narad_produce_rejections_total",
        &[("topic", "q-one"), ("reason", "quota")],
    )
    .unwrap_or(0.0);
    assert!(throttled >= 2.0, "quota rejections counted: {throttled}");

    // Quotas are metadata: they survive a restart.
    server.restart().await;
    let got = root.get("/v1/users/capped").await.expect_json(200);
    assert_eq!(got["quotas"]["max_topics"], 1, "{got}");
    capped
        .post_json("/v1/topics", &json!({"name": "q-two"}))
        .await
        .expect_error(409);

    // Lifting them: no quotas field, no limits.
    let u = put_quotas(&root, "capped", json!({}))
        .await
        .expect_json(200);
    assert!(u.get("quotas").is_none(), "{u}");
    for i in 0..30 {
        capped.produce_ok("q-one", "", format!("free{i}")).await;
    }
    capped
        .post_json("/v1/topics", &json!({"name": "q-two"}))
        .await
        .expect(201);
}

/// `consume_in_flight`: a user holds at most that many unsettled messages; one more consume
/// answers `429` with `Retry-After` until one is acked, nacked or its lease lapses, a batch is
/// cut to what is left, and other users are not limited by it.
#[tokio::test]
async fn consume_in_flight_caps_the_leases_a_user_holds() {
    let server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let anon = Http::new(server.url());
    let root = anon.as_user("admin", ROOT_PW);
    add_user(
        &root,
        "worker",
        PW,
        json!([{"action": "consume", "patterns": ["jobs"]}]),
    )
    .await;
    let worker = anon.as_user("worker", PW);
    root.create_topic(&json!({"name": "jobs", "partitions": 3, "visibility_timeout_ms": 2000}))
        .await;
    for i in 0..20 {
        root.produce_ok("jobs", "", format!("j{i}")).await;
    }
    root.wait_total_visible("jobs", 20).await;
    put_quotas(&root, "worker", json!({"consume_in_flight": 0}))
        .await
        .expect_error(400);
    let u = put_quotas(&root, "worker", json!({"consume_in_flight": 3}))
        .await
        .expect_json(200);
    assert_eq!(u["quotas"], json!({"consume_in_flight": 3}), "{u}");

    // A batch of 10 is cut to 3; then nothing more until something is settled.
    let first = worker.consume_batch("jobs", "max=10&wait=0").await;
    assert_eq!(first.len(), 3);
    let r = worker.consume("jobs", "wait=0").await;
    let msg = r.expect_error(429);
    assert!(msg.contains("consume_in_flight"), "{msg}");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "Retry-After {retry}");
    // Another user is not limited by it.
    root.consume_batch("jobs", "max=5&wait=0").await;

    // An ack frees one, a nack another; an extend keeps its lease counted.
    worker.ack_ok("jobs", first[0].handle()).await;
    worker
        .ack("jobs", first[1].handle(), Some("0"))
        .await
        .expect(204);
    worker
        .ack("jobs", first[2].handle(), Some("true"))
        .await
        .expect(204);
    let second = worker.consume_batch("jobs", "max=10&wait=0").await;
    assert_eq!(second.len(), 2);
    worker.consume("jobs", "wait=0").await.expect_error(429);
    // A batch ack frees what it settled.
    let handles: Vec<&str> = second.iter().map(Msg::handle).collect();
    worker.ack_batch("jobs", None, &handles).await.expect(200);
    assert_eq!(worker.consume_batch("jobs", "max=10&wait=0").await.len(), 2);

    // Leases that lapse stop counting: after the visibility timeout, 3 again.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(worker.consume_batch("jobs", "max=10&wait=0").await.len(), 3);

    // Lifted: no limit.
    put_quotas(&root, "worker", json!({})).await.expect(200);
    assert_eq!(
        worker.consume_batch("jobs", "max=10&wait=0").await.len(),
        10
    );
}
