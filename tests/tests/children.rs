//! Child topics (SPEC §3.3 create with `parent`, §3.7, §5): fan-out, delay and replica
//! children on one node — what is copied (everything committed after the attach, with keys,
//! to the right child partition), detach and re-attach, every refusal of §3.7 / §5.1, the
//! delay rule (never early, judged from the parent commit time) and at-least-once copying
//! across kill -9.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narad_tests::payload;
use narad_tests::*;
use rand::Rng;

const HOUR_MS: u64 = 3_600_000;
/// How long copies may take to show up in a child on a loaded debug build.
const COPY_TIMEOUT: Duration = Duration::from_secs(30);

fn children_path(parent: &str) -> String {
    format!("{}/children", topic_path(parent))
}

async fn attach(http: &Http, parent: &str, body: &Value) -> Resp {
    http.post_json(children_path(parent), body).await
}

async fn detach(http: &Http, parent: &str, child: &str) -> Resp {
    http.delete(format!("{}/{}", children_path(parent), pct(child)))
        .await
}

/// Every retained message of `topic`, by replay (no leases): partition → messages in
/// offset order.
async fn replay_all(http: &Http, topic: &str) -> BTreeMap<u64, Vec<Msg>> {
    let mut out = BTreeMap::new();
    for s in http.partition_stats(topic).await {
        let p = s["index"].as_u64().unwrap();
        let (from, to) = (
            s["oldest_offset"].as_u64().unwrap(),
            s["high_watermark"].as_u64().unwrap(),
        );
        let mut msgs = Vec::new();
        for o in from..to {
            let r = http
                .consume(topic, &format!("partition={p}&offset={o}"))
                .await;
            r.expect(200);
            msgs.push(Msg::parse(&r.body).unwrap());
        }
        out.insert(p, msgs);
    }
    out
}

fn total(h: &BTreeMap<u64, u64>) -> u64 {
    h.values().sum()
}

/// Waits until `topic` holds exactly `n` records in all (never more).
async fn wait_total_exact(http: &Http, topic: &str, n: u64) {
    eventually(COPY_TIMEOUT, Duration::from_millis(50), || async {
        let t = total(&http.high_watermarks(topic).await?);
        if t > n {
            panic!("{topic} holds {t} records, expected exactly {n}");
        }
        anyhow::ensure!(t == n, "{topic}: {t} of {n} records");
        Ok(())
    })
    .await
}

async fn children(http: &Http, parent: &str) -> Value {
    http.get(children_path(parent)).await.expect_json(200)
}

#[tokio::test]
async fn attach_copies_later_messages_with_keys_to_the_right_partitions() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "orders", "partitions": 3}))
        .await;
    http.create_topic(&json!({"name": "audit", "partitions": 5}))
        .await;

    // Before the attach: never copied.
    for i in 0..20 {
        http.produce_ok("orders", &format!("key=pre-{i}"), format!("pre-{i}"))
            .await;
    }
    http.wait_total_visible("orders", 20).await;

    let parent = attach(&http, "orders", &json!({"child": "audit"}))
        .await
        .expect_json(200);
    assert_eq!(parent["name"], json!("orders"), "{parent}");
    assert_eq!(parent["role"], json!("parent"), "{parent}");
    assert_eq!(parent["children"], json!(["audit"]), "{parent}");
    let child = http.get_topic("audit", "").await;
    assert_eq!(child["role"], json!("child"), "{child}");
    assert_eq!(child["parent"], json!("orders"), "{child}");
    assert!(child["attach_epoch"].is_string(), "{child}");
    assert!(child.get("fanout_delay_ms").is_none(), "{child}");

    // After: keyed ones hash with the child's count; unkeyed ones (pinned on the parent)
    // go to parent partition mod child count.
    let mut keyed = BTreeMap::new();
    for i in 0..40 {
        let key = format!("customer-{i}");
        http.produce_ok("orders", &format!("key={key}"), format!("k-{i}"))
            .await;
        keyed.insert(format!("k-{i}"), key);
    }
    let mut unkeyed = BTreeMap::new();
    for i in 0..30u64 {
        let p = i % 3;
        http.produce_ok("orders", &format!("partition={p}"), format!("u-{i}"))
            .await;
        unkeyed.insert(format!("u-{i}"), p);
    }
    wait_total_exact(&http, "audit", 70).await;

    let mut seen = BTreeSet::new();
    for (p, msgs) in replay_all(&http, "audit").await {
        for m in msgs {
            let body = String::from_utf8(m.payload_bytes()).unwrap();
            assert!(
                !body.starts_with("pre-"),
                "copied from before the attach: {body}"
            );
            assert!(seen.insert(body.clone()), "duplicate copy of {body}");
            if let Some(key) = keyed.get(&body) {
                assert_eq!(m.key.as_deref(), Some(key.as_str()), "key kept: {}", m.json);
                assert_eq!(
                    p,
                    partition_for_key(key.as_bytes(), 5) as u64,
                    "keyed copy in the wrong child partition: {}",
                    m.json
                );
            } else {
                let pp = unkeyed[&body];
                assert!(m.key.is_none(), "no key invented: {}", m.json);
                assert_eq!(p, pp % 5, "unkeyed copy: parent index mod 5: {}", m.json);
            }
        }
    }
    assert_eq!(seen.len(), 70);

    // The child is an ordinary queue: consume and ack works, lag reaches 0.
    let m = http.consume_msg("audit", "wait=1s").await;
    http.ack_ok("audit", m.handle()).await;
    let list = eventually(COPY_TIMEOUT, Duration::from_millis(50), || async {
        let l = children(&http, "orders").await;
        anyhow::ensure!(l["children"][0]["lag_messages"] == json!(0), "{l}");
        Ok(l)
    })
    .await;
    assert_eq!(
        list,
        json!({"parent": "orders", "children": [
            {"name": "audit", "delay_ms": 0, "lag_messages": 0, "lag_complete": true, "kind": "fanout"}]})
    );
    // Metrics of §9.
    let text = http.get("/metrics").await.text();
    let committed = metric_sum_where(
        &text,
        "narad_fanout_committed_total",
        &[("parent", "orders"), ("child", "audit")],
    );
    assert_eq!(committed, Some(70.0), "fanout_committed_total");
}

#[tokio::test]
async fn detach_stops_at_once_and_reattach_starts_from_the_tail() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("src").await;
    http.create_topic_named("copy").await;
    attach(&http, "src", &json!({"child": "copy"}))
        .await
        .expect(200);
    let epoch1 = http.get_topic("copy", "").await["attach_epoch"].clone();
    for i in 0..10 {
        http.produce_ok("src", "", format!("a-{i}")).await;
    }
    wait_total_exact(&http, "copy", 10).await;

    detach(&http, "src", "copy").await.expect(204);
    let copy = http.get_topic("copy", "").await;
    assert_eq!(copy["role"], json!("standalone"), "{copy}");
    assert!(copy.get("parent").is_none(), "{copy}");
    assert_eq!(http.get_topic("src", "").await["role"], json!("standalone"));
    assert_eq!(children(&http, "src").await["children"], json!([]));
    detach(&http, "src", "copy").await.expect_error(404);

    // Produced after the detach answer: never copied.
    for i in 0..10 {
        http.produce_ok("src", "", format!("b-{i}")).await;
    }
    http.wait_total_visible("src", 20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(total(&http.high_watermarks("copy").await.unwrap()), 10);

    // Re-attach: a new epoch, from the tail (the b-* records are not copied).
    attach(&http, "src", &json!({"child": "copy"}))
        .await
        .expect(200);
    let epoch2 = http.get_topic("copy", "").await["attach_epoch"].clone();
    assert_ne!(epoch1, epoch2, "a re-attach is a new attachment");
    for i in 0..5 {
        http.produce_ok("src", "", format!("c-{i}")).await;
    }
    wait_total_exact(&http, "copy", 15).await;
    let bodies: BTreeSet<String> = replay_all(&http, "copy")
        .await
        .into_values()
        .flatten()
        .map(|m| String::from_utf8(m.payload_bytes()).unwrap())
        .collect();
    assert!(bodies.iter().all(|b| !b.starts_with("b-")), "{bodies:?}");
    assert_eq!(bodies.len(), 15);

    // Deleting the child detaches it; the parent keeps going.
    http.delete(topic_path("copy")).await.expect(204);
    assert_eq!(children(&http, "src").await["children"], json!([]));
    http.produce_ok("src", "", "after-delete").await;
    // Deleting a parent leaves its children standalone with their data.
    http.create_topic_named("kept").await;
    attach(&http, "src", &json!({"child": "kept"}))
        .await
        .expect(200);
    http.produce_ok("src", "", "one").await;
    wait_total_exact(&http, "kept", 1).await;
    http.delete(topic_path("src")).await.expect(204);
    let kept = http.get_topic("kept", "").await;
    assert_eq!(kept["role"], json!("standalone"), "{kept}");
    assert_eq!(total(&http.high_watermarks("kept").await.unwrap()), 1);
}

#[tokio::test]
async fn every_refusal_of_attach_detach_and_create_with_parent() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let mut c = Checks::new("child topic refusals");
    for name in ["p", "c", "other", "free", "q"] {
        http.create_topic_named(name).await;
    }
    http.create_topic(&json!({"name": "short", "retention_ms": 2 * HOUR_MS}))
        .await;
    http.create_topic(&json!({"name": "typed", "schema": {"type": "object"}}))
        .await;
    http.create_topic(&json!({"name": "typed2", "schema": {"type": "array"}}))
        .await;
    attach(&http, "p", &json!({"child": "c"})).await.expect(200);
    attach(&http, "q", &json!({"child": "other"}))
        .await
        .expect(200);

    // 400: malformed requests.
    for (label, body) in [
        ("no child", json!({})),
        ("empty child", json!({"child": ""})),
        ("negative delay", json!({"child": "free", "delay_ms": -1})),
        (
            "delay over one year",
            json!({"child": "free", "delay_ms": 31_622_400_001u64}),
        ),
        (
            "delay with remote",
            json!({"child": "dr", "delay_ms": 5, "remote": {"url": "http://127.0.0.1:1"}}),
        ),
        ("unknown field", json!({"child": "free", "bogus": 1})),
    ] {
        c.error(label, &attach(&http, "p", &body).await, 400);
    }
    // 404: parent or local child missing.
    c.error(
        "parent missing",
        &attach(&http, "nope", &json!({"child": "free"})).await,
        404,
    );
    c.error(
        "child missing",
        &attach(&http, "p", &json!({"child": "nope"})).await,
        404,
    );
    // 409: every role conflict and rule.
    for (label, parent, body) in [
        ("child = parent", "p", json!({"child": "p"})),
        ("already attached", "p", json!({"child": "c"})),
        ("attached elsewhere", "p", json!({"child": "other"})),
        ("parent is a child", "c", json!({"child": "free"})),
        ("child is a parent", "free", json!({"child": "p"})),
        (
            "parent retention < delay + 1 h",
            "short",
            json!({"child": "free", "delay_ms": HOUR_MS + 1}),
        ),
        ("schema mismatch", "typed", json!({"child": "typed2"})),
        (
            "schema-less parent, typed child",
            "free",
            json!({"child": "typed"}),
        ),
    ] {
        c.error(label, &attach(&http, parent, &body).await, 409);
    }
    // The delay exactly at the limit is fine (2 h retention = 1 h delay + 1 h).
    let r = attach(
        &http,
        "short",
        &json!({"child": "free", "delay_ms": HOUR_MS}),
    )
    .await;
    c.status("delay = retention - 1 h", &r, 200);
    // A schema-less child adopts the parent's schema.
    http.create_topic_named("bare").await;
    c.status(
        "schema-less child of a typed parent",
        &attach(&http, "typed", &json!({"child": "bare"})).await,
        200,
    );
    let bare = http.get_topic("bare", "").await;
    c.check(bare["schema"] == json!({"type": "object"}), || {
        format!("a schema-less child adopts the parent's schema: {bare}")
    });
    // PATCH: the parent's retention below the delay child's need, a child's own schema.
    let r = http
        .patch_json(
            topic_path("short"),
            &json!({"retention_ms": 2 * HOUR_MS - 1}),
        )
        .await;
    c.error("retention below a delay child's need", &r, 409);
    let r = http
        .patch_json(topic_path("short"), &json!({"retention_ms": 0}))
        .await;
    c.status("retention forever", &r, 200);
    let r = http
        .patch_json(topic_path("bare"), &json!({"schema": {"type": "object"}}))
        .await;
    c.error("schema change on an attached child", &r, 409);
    // Direct produce to a delay child: 409 with the SDK's text.
    for r in [
        http.produce("free", "", "x").await,
        http.produce_batch("free", &json!({"messages": [{"payload": 1}]}))
            .await,
    ] {
        if let Some(msg) = c.error("produce to a delay child", &r, 409) {
            c.check(msg.contains("delayed child topic is not allowed"), || {
                format!("409 text: {msg}")
            });
        }
    }
    // Detach: not attached, parent missing.
    c.error(
        "detach not attached",
        &detach(&http, "p", "free").await,
        404,
    );
    c.error(
        "detach from another parent",
        &detach(&http, "p", "other").await,
        404,
    );
    c.error(
        "detach parent missing",
        &detach(&http, "nope", "c").await,
        404,
    );
    // Children list: 404 missing parent, [] for none.
    c.error(
        "children of a missing topic",
        &http.get(children_path("nope")).await,
        404,
    );
    let none = http.get(children_path("c")).await;
    c.check(
        none.status == 200 && none.json() == json!({"parent": "c", "children": []}),
        || format!("children of a child: {}", none.describe()),
    );

    // Create with parent.
    for (label, body, want) in [
        ("own parent", json!({"name": "self", "parent": "self"}), 400),
        (
            "negative delay",
            json!({"name": "r1", "parent": "p", "fanout_delay_ms": -1}),
            400,
        ),
        (
            "delay over one year",
            json!({"name": "r2", "parent": "p", "fanout_delay_ms": 31_622_400_001u64}),
            400,
        ),
        (
            "parent missing",
            json!({"name": "r3", "parent": "nope"}),
            404,
        ),
        (
            "parent is a child",
            json!({"name": "r4", "parent": "c"}),
            409,
        ),
        (
            "parent retention too short",
            json!({"name": "r5", "parent": "p", "fanout_delay_ms": 604_800_000u64}),
            409,
        ),
        ("name taken", json!({"name": "free", "parent": "p"}), 409),
        (
            "name taken (case)",
            json!({"name": "FREE", "parent": "p"}),
            409,
        ),
    ] {
        let r = http.post_json("/v1/topics", &body).await;
        c.error(label, &r, want);
    }
    for name in ["self", "r1", "r2", "r3", "r4", "r5"] {
        let r = http.get(topic_path(name)).await;
        c.check(r.status == 404, || {
            format!("a refused create left {name} behind: {}", r.describe())
        });
    }
    c.check(
        children(&http, "p").await["children"]
            .as_array()
            .unwrap()
            .len()
            == 1,
        || "a refused create left a link behind".into(),
    );
    c.finish();

    // A replica child: inherits the partition count, is born attached.
    http.create_topic(&json!({"name": "wide", "partitions": 7}))
        .await;
    let rec = http
        .create_topic(&json!({"name": "wide-replica", "parent": "wide", "fanout_delay_ms": 0}))
        .await;
    assert_eq!(rec["partitions"], json!(7), "{rec}");
    assert_eq!(rec["role"], json!("child"), "{rec}");
    assert_eq!(rec["parent"], json!("wide"), "{rec}");
    let list = children(&http, "wide").await;
    assert_eq!(list["children"][0]["kind"], json!("replica"), "{list}");
    http.produce_ok("wide", "key=k", "hello").await;
    wait_total_exact(&http, "wide-replica", 1).await;
    let m = http.consume_msg("wide-replica", "wait=1s").await;
    assert_eq!(m.payload_bytes(), b"hello");
    assert_eq!(m.key.as_deref(), Some("k"));
    // A delayed replica reports its delay.
    let rec = http
        .create_topic(&json!({"name": "wide-later", "parent": "wide", "fanout_delay_ms": 60000}))
        .await;
    assert_eq!(rec["fanout_delay_ms"], json!(60000), "{rec}");
}

#[tokio::test]
async fn at_most_108_children() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("hub").await;
    for i in 0..108 {
        let name = format!("leaf-{i}");
        http.create_topic_named(&name).await;
        attach(&http, "hub", &json!({"child": name}))
            .await
            .expect(200);
    }
    http.create_topic_named("leaf-108").await;
    let msg = attach(&http, "hub", &json!({"child": "leaf-108"}))
        .await
        .expect_error(409);
    assert!(msg.contains("108"), "{msg}");
    http.post_json("/v1/topics", &json!({"name": "leaf-109", "parent": "hub"}))
        .await
        .expect_error(409);
    let rec = http.get_topic("hub", "").await;
    assert_eq!(rec["children"].as_array().unwrap().len(), 108);
    assert_eq!(rec["children"][0], json!("leaf-0"), "attach order");
    // One produce reaches all 108.
    http.produce_ok("hub", "", "everyone").await;
    for i in [0, 57, 107] {
        wait_total_exact(&http, &format!("leaf-{i}"), 1).await;
    }
}

/// Consumes `topic` with long polls until `n` distinct payloads arrived; returns each
/// payload's first consume time (Unix ms, taken when the answer arrived).
async fn consume_times(
    http: &Http,
    topic: &str,
    n: usize,
    timeout: Duration,
) -> HashMap<String, u64> {
    let mut seen = HashMap::new();
    let until = Instant::now() + timeout;
    while seen.len() < n {
        assert!(
            Instant::now() < until,
            "{topic}: only {} of {n} messages within {timeout:?}",
            seen.len()
        );
        let r = http.consume(topic, "wait=1s").await;
        let at = now_ms();
        match r.status {
            204 => continue,
            200 => {
                let m = Msg::parse(&r.body).unwrap();
                let body = String::from_utf8(m.payload_bytes()).unwrap();
                seen.entry(body).or_insert(at);
                http.ack_ok(topic, m.handle()).await;
            }
            _ => panic!("{}", r.describe()),
        }
    }
    seen
}

#[tokio::test]
async fn delay_child_is_never_consumable_before_due() {
    const DELAY_MS: u64 = 1500;
    /// Due + this: "typically within 1 s after due", with room for a loaded debug build.
    const LATE_BOUND_MS: u64 = 3000;
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "jobs", "partitions": 3}))
        .await;
    http.create_topic_named("jobs-retry").await;
    attach(
        &http,
        "jobs",
        &json!({"child": "jobs-retry", "delay_ms": DELAY_MS}),
    )
    .await
    .expect(200);
    let list = children(&http, "jobs").await;
    assert_eq!(list["children"][0]["kind"], json!("delay"), "{list}");
    assert_eq!(list["children"][0]["delay_ms"], json!(DELAY_MS), "{list}");
    assert_eq!(
        http.get_topic("jobs-retry", "").await["fanout_delay_ms"],
        json!(DELAY_MS)
    );

    // Spread over ~1.5 s so that copies fall due while others are still waiting.
    const N: usize = 30;
    let mut sent = HashMap::new();
    for i in 0..N {
        let body = format!("job-{i}");
        sent.insert(body.clone(), now_ms());
        http.produce_ok("jobs", &format!("key=j{i}"), body).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The parent's commit times (seconds) bound each commit from below, as does the send.
    let mut commit_floor = HashMap::new();
    http.wait_total_visible("jobs", N as u64).await;
    for m in replay_all(&http, "jobs").await.into_values().flatten() {
        let body = String::from_utf8(m.payload_bytes()).unwrap();
        let floor = sent[&body].max(m.timestamp as u64 * 1000);
        commit_floor.insert(body, floor);
    }
    let times = consume_times(&http, "jobs-retry", N, Duration::from_secs(30)).await;
    for (body, at) in &times {
        let due = commit_floor[body] + DELAY_MS;
        assert!(
            *at >= due,
            "{body} consumed at {at}, {} ms before it was due",
            due - at
        );
        assert!(
            *at <= sent[body] + DELAY_MS + LATE_BOUND_MS,
            "{body} consumed {} ms after its send: later than due + {LATE_BOUND_MS} ms",
            at - sent[body]
        );
    }
    let text = http.get("/metrics").await.text();
    assert!(
        text.contains("narad_fanout_due_lag_seconds"),
        "fanout_due_lag_seconds is exported"
    );
}

/// Produces tagged payloads until stopped; returns the ids answered `202`.
async fn produce_until(
    url: String,
    topic: &'static str,
    producer: u32,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeSet<String>>>,
) {
    let http = Http::new(url);
    let path = format!("{}/produce", topic_path(topic));
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        seq += 1;
        let r = http
            .request(Method::POST, format!("{path}?key=k{}", seq % 17))
            .body(payload::make(producer, seq))
            .timeout(Duration::from_secs(5))
            .try_send()
            .await;
        if matches!(r, Ok(ref r) if r.status == 202) {
            acked.lock().unwrap().insert(payload::id(producer, seq));
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// id → commit timestamps (seconds) of every copy in `topic`, verifying each payload.
async fn copies(http: &Http, topic: &str) -> BTreeMap<String, Vec<i64>> {
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for m in replay_all(http, topic).await.into_values().flatten() {
        let id = payload::verify(&m.payload_bytes())
            .unwrap_or_else(|e| panic!("{topic}: corrupt copy {e}: {}", m.json));
        out.entry(id).or_default().push(m.timestamp);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_and_delay_survive_repeated_kill9() {
    const KILLS: usize = 5;
    /// A whole number of seconds, so that second-resolution timestamps decide "early"
    /// exactly: child commit ≥ parent commit + 2 s ⟺ child second ≥ parent second + 2.
    const DELAY_S: i64 = 2;
    let mut rng = test_rng("fanout_and_delay_survive_repeated_kill9");
    let mut server = Server::start_default().await;
    let url = server.url();
    let http = Http::new(&url);
    http.create_topic(&json!({"name": "events", "partitions": 3}))
        .await;
    http.create_topic(&json!({"name": "events-all", "partitions": 4}))
        .await;
    http.create_topic_named("events-late").await;
    attach(&http, "events", &json!({"child": "events-all"}))
        .await
        .expect(200);
    attach(
        &http,
        "events",
        &json!({"child": "events-late", "delay_ms": DELAY_S * 1000}),
    )
    .await
    .expect(200);

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let producers: Vec<_> = (0..2)
        .map(|p| {
            tokio::spawn(produce_until(
                url.clone(),
                "events",
                p,
                stop.clone(),
                acked.clone(),
            ))
        })
        .collect();
    for kill in 1..=KILLS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(700..=2500))).await;
        server.kill9();
        eprintln!(
            "kill -9 #{kill}: {} acked so far",
            acked.lock().unwrap().len()
        );
        server.restart().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for p in producers {
        p.await.unwrap();
    }
    let acked: BTreeSet<String> = acked.lock().unwrap().clone();
    assert!(acked.len() > 100, "too little traffic: {}", acked.len());

    // Every acked message reaches the parent and both children (duplicates allowed).
    let missing_in = |have: &BTreeMap<String, Vec<i64>>| -> Vec<String> {
        acked
            .iter()
            .filter(|id| !have.contains_key(*id))
            .take(5)
            .cloned()
            .collect()
    };
    let parent = eventually(COPY_TIMEOUT, Duration::from_millis(500), || async {
        let c = copies(&http, "events").await;
        let missing = missing_in(&c);
        anyhow::ensure!(missing.is_empty(), "parent lacks acked {missing:?}");
        Ok(c)
    })
    .await;
    for child in ["events-all", "events-late"] {
        let have = eventually(COPY_TIMEOUT, Duration::from_millis(500), || async {
            let c = copies(&http, child).await;
            let missing = missing_in(&c);
            anyhow::ensure!(missing.is_empty(), "{child} lacks acked {missing:?}");
            Ok(c)
        })
        .await;
        for id in have.keys() {
            assert!(
                parent.contains_key(id),
                "{child} holds {id}, unknown to the parent"
            );
        }
        if child == "events-late" {
            // Never early: every copy committed ≥ its parent's first commit + delay.
            for (id, ts) in &have {
                let first_parent = parent[id].iter().min().unwrap();
                for t in ts {
                    assert!(
                        *t >= first_parent + DELAY_S,
                        "{id}: copy committed at second {t}, parent at {first_parent}: early"
                    );
                }
            }
        }
        let dups: usize = have.values().map(|v| v.len() - 1).sum();
        eprintln!("{child}: {} ids, {dups} duplicates", have.len());
    }
    let list = children(&http, "events").await;
    for c in list["children"].as_array().unwrap() {
        assert_eq!(c["lag_complete"], json!(true), "{list}");
    }
}

#[tokio::test]
async fn retention_aging_out_a_lagging_cursor_is_counted() {
    // Small segments, a fast retention check, and (after a restart) a clock offset for
    // retention only: the parent's records age out while the delay child's cursor — judged
    // on the real clock — is still waiting for them to fall due.
    let mut server = Server::start(
        ServerOpts::default()
            .env("NARAD_STORAGE_SEGMENT_MAX_BYTES", "4096")
            .env("NARAD_STORAGE_RETENTION_CHECK_INTERVAL", "100ms"),
    )
    .await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "src", "retention_ms": 2 * HOUR_MS}))
        .await;
    http.create_topic_named("now").await;
    http.create_topic_named("later").await;
    attach(&http, "src", &json!({"child": "now"}))
        .await
        .expect(200);
    attach(
        &http,
        "src",
        &json!({"child": "later", "delay_ms": HOUR_MS}),
    )
    .await
    .expect(200);
    const N: u64 = 15;
    for i in 0..N {
        let mut body = format!("m-{i}-").into_bytes();
        body.resize(1000, b'x');
        http.produce_ok("src", "partition=0", body).await;
        http.wait_visible("src", 0, i + 1).await;
    }
    wait_total_exact(&http, "now", N).await;
    let lag = children(&http, "src").await;
    assert_eq!(lag["children"][1]["lag_messages"], json!(N), "{lag}");

    server.set_env(
        "NARAD_TEST_CLOCK_OFFSET_MS",
        (2 * HOUR_MS + 60_000).to_string(),
    );
    server.restart().await;
    // Everything the cursor had not copied and retention removed is counted, exactly
    // (the restart may have re-committed a WAL window: count against the log, not N).
    let (oldest, hwm) = eventually(COPY_TIMEOUT, Duration::from_millis(100), || async {
        let s = http.partition_stats("src").await;
        let oldest = s[0]["oldest_offset"].as_u64().unwrap();
        let hwm = s[0]["high_watermark"].as_u64().unwrap();
        let text = http.get("/metrics").await.text();
        let d = metric_sum_where(
            &text,
            "narad_fanout_child_dropped_messages_total",
            &[("parent", "src"), ("child", "later")],
        )
        .unwrap_or(0.0) as u64;
        anyhow::ensure!(
            oldest > 0 && d == oldest,
            "dropped {d}, oldest offset {oldest}"
        );
        Ok((oldest, hwm))
    })
    .await;
    let text = http.get("/metrics").await.text();
    let caught_up = metric_sum_where(
        &text,
        "narad_fanout_child_dropped_messages_total",
        &[("parent", "src"), ("child", "now")],
    )
    .unwrap_or(0.0);
    assert_eq!(
        caught_up, 0.0,
        "a child that had copied everything lost nothing"
    );
    // Lag now counts only what is still retained.
    let lag = children(&http, "src").await;
    let left = lag["children"][1]["lag_messages"].as_u64().unwrap();
    assert_eq!(left, hwm - oldest, "{lag}");
    assert_eq!(
        total(&http.high_watermarks("later").await.unwrap()),
        0,
        "never early"
    );
}

#[tokio::test]
async fn partitions_added_to_the_parent_after_the_attach_are_copied_from_their_start() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("grow").await;
    http.create_topic_named("grow-copy").await;
    attach(&http, "grow", &json!({"child": "grow-copy"}))
        .await
        .expect(200);
    http.patch_json(topic_path("grow"), &json!({"partitions": 5}))
        .await
        .expect(200);
    // At once, racing the cursor's start: nothing committed to the new partitions is missed.
    for i in 0..10 {
        http.produce_ok(
            "grow",
            &format!("partition={}", 3 + i % 2),
            format!("n-{i}"),
        )
        .await;
    }
    wait_total_exact(&http, "grow-copy", 10).await;
    let list = children(&http, "grow").await;
    assert_eq!(list["children"][0]["lag_complete"], json!(true), "{list}");
}

#[tokio::test]
async fn with_security_attach_needs_ownership_of_parent_and_child() {
    const ROOT_PW: &str = "root-pw";
    let server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let anon = Http::new(server.url());
    let root = anon.as_user("admin", ROOT_PW);
    for (name, grants) in [
        (
            "team",
            json!([{"action": "create", "patterns": ["team-*"]}]),
        ),
        (
            "other",
            json!([{"action": "create", "patterns": ["other-*"]}]),
        ),
    ] {
        root.post_json(
            "/v1/users",
            &json!({"username": name, "password": "pw", "grants": grants}),
        )
        .await
        .expect(201);
    }
    let team = anon.as_user("team", "pw");
    let other = anon.as_user("other", "pw");
    team.create_topic_named("team-src").await;
    team.create_topic_named("team-dst").await;
    other.create_topic_named("other-dst").await;

    // Owner of the parent but not of the child, and the reverse: 403. Missing: 404 first.
    attach(&team, "team-src", &json!({"child": "other-dst"}))
        .await
        .expect_error(403);
    attach(&other, "team-src", &json!({"child": "other-dst"}))
        .await
        .expect_error(403);
    attach(&team, "team-src", &json!({"child": "team-nope"}))
        .await
        .expect_error(404);
    // Invisible: 403 whether or not it exists.
    other.get(children_path("team-src")).await.expect_error(403);
    // Both owned: fine; the owner may list and detach.
    attach(&team, "team-src", &json!({"child": "team-dst"}))
        .await
        .expect(200);
    let list = team.get(children_path("team-src")).await.expect_json(200);
    assert_eq!(list["children"][0]["name"], json!("team-dst"), "{list}");
    detach(&other, "team-src", "team-dst")
        .await
        .expect_error(403);
    detach(&team, "team-src", "team-dst").await.expect(204);
    // Create with parent: `create` on the name plus ownership of the parent.
    other
        .post_json(
            "/v1/topics",
            &json!({"name": "other-r", "parent": "team-src"}),
        )
        .await
        .expect_error(403);
    let rec = team
        .create_topic(&json!({"name": "team-r", "parent": "team-src"}))
        .await;
    assert_eq!(rec["owner"], json!("team"), "{rec}");
    // The admin may attach anything.
    attach(&root, "team-src", &json!({"child": "other-dst"}))
        .await
        .expect(200);
}
