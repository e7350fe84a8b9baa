//! (ext) Dead-letter topics against a real `narad`: the setting's rules, a message nacked or
//! expired past `max_deliveries` lands in the dead-letter topic (payload, key, attributes and
//! where it came from) and leaves its source, redrive moves it back, the grants both need,
//! and at-least-once across kill -9 under load with every message counted.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::sleep;

use narad_tests::auth_matrix::add_user;
use narad_tests::*;

fn attrs(m: &Msg) -> BTreeMap<String, String> {
    serde_json::from_value(m.json.get("attributes").cloned().unwrap_or(json!({}))).unwrap()
}

async fn set_dead_letter(http: &Http, topic: &str, dl: Value) -> Resp {
    http.patch_json(topic_path(topic), &json!({ "dead_letter": dl }))
        .await
}

async fn redrive(http: &Http, topic: &str, query: &str) -> Resp {
    http.request(
        Method::POST,
        format!("{}/redrive?{query}", topic_path(topic)),
    )
    .send()
    .await
}

async fn dead_lettered(http: &Http, topic: &str) -> f64 {
    metric_sum_where(
        &http.metrics_text().await,
        "narad_dead_lettered_messages_total",
        &[("topic", topic)],
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn a_message_past_its_deliveries_moves_to_the_dead_letter_topic_and_redrive_brings_it_back() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("dlq").await;
    http.create_topic_named("other").await;

    // The rules: an existing target that is not the topic itself, 1 to 1000 deliveries.
    let r = http
        .post_json(
            "/v1/topics",
            &json!({"name": "src", "dead_letter": {"topic": "src", "max_deliveries": 2}}),
        )
        .await;
    assert!(
        r.expect_error(400).contains("own dead-letter"),
        "{}",
        r.describe()
    );
    let r = http
        .post_json(
            "/v1/topics",
            &json!({"name": "src", "dead_letter": {"topic": "nope", "max_deliveries": 2}}),
        )
        .await;
    assert!(r.expect_error(404).contains("nope"), "{}", r.describe());
    for bad in [
        json!({"topic": "dlq", "max_deliveries": 1001}),
        json!({"max_deliveries": 3}),
        json!({"topic": "dlq", "max_deliveries": -1}),
        json!({"topic": "dlq"}),
        json!({"topic": "dlq", "max_deliveries": 2, "extra": 1}),
    ] {
        let r = http
            .post_json("/v1/topics", &json!({"name": "src", "dead_letter": bad}))
            .await;
        r.expect_error(400);
    }
    let t = http
        .create_topic(&json!({"name": "src", "dead_letter": {"topic": "dlq", "max_deliveries": 2}}))
        .await;
    assert_eq!(
        t["dead_letter"],
        json!({"topic": "dlq", "max_deliveries": 2})
    );
    // The target cannot go while named.
    let r = http.delete(topic_path("dlq")).await;
    assert!(r.expect_error(409).contains("src"), "{}", r.describe());

    // Two deliveries, both nacked: the third lease dead-letters it instead.
    let produced = http
        .request(
            Method::POST,
            format!("{}/produce?key=k1&partition=1", topic_path("src")),
        )
        .header("Narad-Attr-Tenant", "acme")
        .body(b"\xffpoison".to_vec())
        .send()
        .await;
    produced.expect(202);
    http.wait_visible("src", 1, 1).await;
    for n in 1..=2 {
        let m = http.consume_msg("src", "wait=0").await;
        assert_eq!(m.json["delivery_count"], n);
        http.ack("src", m.handle(), Some("0")).await.expect(204);
    }
    http.consume_none("src", "wait=0").await;
    assert_eq!(http.backlog("src").await, (0, 0));
    assert_eq!(dead_lettered(&http, "src").await, 1.0);

    let d = http.consume_msg("dlq", "wait=5s").await;
    assert_eq!(d.payload_bytes(), b"\xffpoison");
    assert_eq!(d.key_problem(Some(b"k1")), None);
    let a = attrs(&d);
    assert_eq!(a["tenant"], "acme");
    assert_eq!(a["narad-dead-letter-source-topic"], "src");
    assert_eq!(a["narad-dead-letter-source-partition"], "1");
    assert_eq!(a["narad-dead-letter-source-offset"], "0");
    assert_eq!(a["narad-dead-letter-delivery-count"], "3");
    // Nacked: it stays in the dead-letter topic for the redrive.
    http.ack("dlq", d.handle(), Some("0")).await.expect(204);

    // An expired lease counts as a delivery too.
    http.patch_json(topic_path("src"), &json!({"visibility_timeout_ms": 1000}))
        .await
        .expect(200);
    http.request(Method::POST, format!("{}/produce", topic_path("src")))
        .header("Narad-Attr-Tenant", "initech")
        .body(b"expires".to_vec())
        .send()
        .await
        .expect(202);
    for _ in 0..2 {
        http.consume_msg("src", "wait=5s").await;
    }
    // The third lease, after the second lapsed, dead-letters it.
    http.consume_none("src", "wait=2s").await;
    assert_eq!(dead_lettered(&http, "src").await, 2.0);

    // A producer cannot send the broker's attributes.
    let r = http
        .request(Method::POST, format!("{}/produce", topic_path("src")))
        .header("Narad-Attr-Narad-Dead-Letter-Source-Topic", "forged")
        .body(b"x".to_vec())
        .send()
        .await;
    assert!(r.expect_error(400).contains("broker's"), "{}", r.describe());

    // Redrive: its parameters, then both back to their source, without the broker's
    // attributes, as new messages.
    for (q, status) in [
        ("max=0", 400),
        ("max=100001", 400),
        ("max=x", 400),
        ("to=dlq", 400),
        ("to=missing", 404),
    ] {
        redrive(&http, "dlq", q).await.expect_error(status);
    }
    redrive(&http, "missing", "").await.expect_error(404);
    let moved = redrive(&http, "dlq", "").await.expect_json(200);
    assert_eq!(moved, json!({"moved": 2, "to": {"src": 2}}));
    assert_eq!(http.backlog("dlq").await, (0, 0));
    http.wait_total_visible("src", 4).await;
    let mut back = Vec::new();
    for _ in 0..2 {
        let m = http.consume_msg("src", "wait=5s").await;
        assert_eq!(m.json["delivery_count"], 1);
        back.push((m.payload_bytes(), attrs(&m)));
        http.ack_ok("src", m.handle()).await;
    }
    back.sort();
    assert_eq!(
        back,
        [
            (
                b"expires".to_vec(),
                BTreeMap::from([("tenant".into(), "initech".into())])
            ),
            (
                b"\xffpoison".to_vec(),
                BTreeMap::from([("tenant".into(), "acme".into())])
            ),
        ]
    );
    http.consume_none("src", "wait=0").await;

    // to= sends them elsewhere; max bounds the move.
    for i in 0..3 {
        http.produce_ok("dlq", "", format!("d{i}")).await;
    }
    http.wait_total_visible("dlq", 5).await;
    let moved = redrive(&http, "dlq", "to=other&max=2")
        .await
        .expect_json(200);
    assert_eq!(moved, json!({"moved": 2, "to": {"other": 2}}));
    // Without a source attribute and without to=, a message stays.
    let left = redrive(&http, "dlq", "").await.expect_json(200);
    assert_eq!(left["moved"], 0, "{left}");
    assert_eq!(left["skipped"], 1, "{left}");
    assert!(
        left["last_error"].as_str().unwrap().contains("to="),
        "{left}"
    );
    assert_eq!(http.backlog("dlq").await, (1, 0));

    // Turned off, a message is delivered again and again.
    set_dead_letter(&http, "src", json!({"max_deliveries": 0}))
        .await
        .expect(200);
    assert!(http.get_topic("src", "").await.get("dead_letter").is_none());
    http.delete(topic_path("dlq")).await.expect(204);
}

#[tokio::test]
async fn setting_a_dead_letter_topic_needs_produce_on_it_and_redrive_needs_both_grants() {
    const ROOT_PW: &str = "root-Pa55-dl1";
    const PW: &str = "svc-Pa55-dl1";
    let server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let anon = Http::new(server.url());
    let root = anon.as_user("admin", ROOT_PW);
    root.create_topic_named("app-dlq").await;
    root.create_topic_named("audit-dlq").await;
    add_user(
        &root,
        "svc",
        PW,
        json!([{"action": "create", "patterns": ["app-*"]},
               {"action": "produce", "patterns": ["app-*"]},
               {"action": "consume", "patterns": ["app-*"]}]),
    )
    .await;
    let svc = anon.as_user("svc", PW);
    let r = svc
        .post_json(
            "/v1/topics",
            &json!({"name": "app-a", "dead_letter": {"topic": "audit-dlq", "max_deliveries": 3}}),
        )
        .await;
    assert!(
        r.expect_error(403).contains("audit-dlq"),
        "{}",
        r.describe()
    );
    // No produce grant: 403 whether or not the target exists.
    let r = svc
        .post_json(
            "/v1/topics",
            &json!({"name": "app-a", "dead_letter": {"topic": "audit-none", "max_deliveries": 3}}),
        )
        .await;
    r.expect_error(403);
    svc.create_topic(
        &json!({"name": "app-a", "dead_letter": {"topic": "app-dlq", "max_deliveries": 3}}),
    )
    .await;
    // Redrive: consume on the source of the move, produce on where it goes.
    redrive(&svc, "audit-dlq", "to=app-a")
        .await
        .expect_error(403);
    redrive(&svc, "app-dlq", "to=audit-dlq")
        .await
        .expect_error(403);
    redrive(&anon, "app-dlq", "to=app-a")
        .await
        .expect_error(401);
    let moved = redrive(&svc, "app-dlq", "to=app-a").await.expect_json(200);
    assert_eq!(moved["moved"], 0);
}

/// A consumer that nacks everything it gets, on a topic that dead-letters after one delivery,
/// while the node is killed twice mid-stream: every produced message ends up in the
/// dead-letter topic (at least once), none stays behind in the source.
#[tokio::test]
async fn every_message_reaches_the_dead_letter_topic_across_kill9() {
    const N: usize = 600;
    let mut server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "dead", "partitions": 3}))
        .await;
    http.create_topic(
        &json!({"name": "live", "partitions": 3, "visibility_timeout_ms": 1000,
        "dead_letter": {"topic": "dead", "max_deliveries": 1}}),
    )
    .await;
    for chunk in 0..N / 100 {
        let batch: Vec<Value> = (0..100)
            .map(|i| json!({"payload": format!("m{}", chunk * 100 + i)}))
            .collect();
        http.produce_batch("live", &json!({ "messages": batch }))
            .await
            .expect(202);
    }
    http.wait_total_visible("live", N as u64).await;

    // Consumes 10 at a time and nacks them: the next consume dead-letters what it nacked.
    // Requests refused while the node is down are tried again.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = tokio::spawn({
        let (http, stop) = (http.clone(), stop.clone());
        async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let path = format!("{}/consume?max=10&wait=200ms", topic_path("live"));
                let Ok(r) = http.request(Method::GET, path).try_send().await else {
                    sleep(Duration::from_millis(50)).await;
                    continue;
                };
                if r.status != 200 {
                    continue;
                }
                let handles: Vec<String> = http
                    .consume_batch_of(&r)
                    .iter()
                    .map(|m| m.handle().to_string())
                    .collect();
                let _ = http
                    .request(Method::POST, format!("{}/ack?extend=0", topic_path("live")))
                    .json(&json!({ "receipt_handles": handles }))
                    .try_send()
                    .await;
                // A steady stream rather than a burst that a kill cannot land in the middle of.
                sleep(Duration::from_millis(10)).await;
            }
        }
    });

    // Killed twice, once a quarter and once half of the messages are settled in the source
    // (what a restart keeps of it).
    let mut kills = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the source did not empty"
        );
        sleep(Duration::from_millis(20)).await;
        let (waiting, in_flight) = http.backlog("live").await;
        let settled = N as u64 - waiting - in_flight;
        if (kills == 0 && settled >= N as u64 / 4) || (kills == 1 && settled >= N as u64 / 2) {
            server.kill9();
            server.restart().await;
            kills += 1;
            eprintln!("killed with {settled} of {N} settled in the source");
            continue;
        }
        if kills == 2 && settled == N as u64 {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    consumer.await.unwrap();

    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let got = http
        .drain_batches("dead", "wait=0", || async { http.backlog("dead").await.1 })
        .await;
    for m in &got {
        *seen
            .entry(String::from_utf8(m.payload_bytes()).unwrap())
            .or_default() += 1;
        assert_eq!(attrs(m)["narad-dead-letter-source-topic"], "live");
    }
    let missing: Vec<String> = (0..N)
        .map(|i| format!("m{i}"))
        .filter(|p| !seen.contains_key(p))
        .collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    let dups = got.len() - N;
    eprintln!("{N} messages dead-lettered, {dups} of them twice or more (at least once)");
    // Nothing is left to deliver in the source.
    http.consume_none("live", "wait=1500ms").await;
}
