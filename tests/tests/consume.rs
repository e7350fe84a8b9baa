//! Consume, leases and settlement (SPEC §2.4, §2.5, §2.8, §2.9, §3.5, §3.6): rendering,
//! long polls and `wait` parsing, batches, pinning, the in-flight and acked-ahead caps,
//! expiry/extend/nack, ack errors, batch ack, and replay.
//!
//! Sleeps here are only about elapsed-time semantics (a visibility timeout running out, a
//! long poll being in progress) and carry explicit margins.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use narad_tests::*;
use tokio::time::{sleep, sleep_until, Instant};

/// Margin for "must not happen before T" / "must have happened by T" timing checks.
const MARGIN: Duration = Duration::from_millis(100);

/// Produces `n` messages `"{prefix}-{i}"` pinned to `partition` and waits until visible.
async fn fill(http: &Http, topic: &str, partition: u64, prefix: &str, n: u64) {
    let before = http.high_watermarks(topic).await.unwrap()[&partition];
    for i in 0..n {
        http.produce_ok(
            topic,
            &format!("partition={partition}"),
            format!("{prefix}-{i}"),
        )
        .await;
    }
    http.wait_visible(topic, partition, before + n).await;
}

/// Leases every visible message of `partition`; returns handle by offset.
async fn lease_all(http: &Http, topic: &str, partition: u64) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    loop {
        let r = http
            .consume(topic, &format!("partition={partition}&wait=0"))
            .await;
        match r.status {
            204 => return out,
            200 => {
                let m = Msg::parse(&r.body).unwrap();
                assert!(
                    out.insert(m.offset, m.handle().to_string()).is_none(),
                    "offset leased twice: {}",
                    m.json
                );
            }
            _ => panic!("{}", r.describe()),
        }
    }
}

/// (label, stored payload bytes, key bytes).
type RenderCase = (&'static str, Vec<u8>, Option<Vec<u8>>);

#[tokio::test]
async fn payload_and_key_rendering_is_byte_exact() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("render").await;

    let cases: Vec<RenderCase> = vec![
        (
            "JSON object with inner whitespace",
            br#"{"order_id":"ord_123", "amount" : 4999,"n":{"a":[1,2 ,3]}}"#.to_vec(),
            Some(b"customer-42".to_vec()),
        ),
        ("JSON string", br#""a JSON string""#.to_vec(), None),
        ("JSON number", b"42".to_vec(), None),
        ("JSON array", b"[1, \"two\", false]".to_vec(), None),
        ("JSON true", b"true".to_vec(), None),
        (
            "plain text",
            b"hello world".to_vec(),
            Some("ü k".as_bytes().to_vec()),
        ),
        (
            "text with quotes and unicode",
            "he said \"hi\" \\ ü 日本".as_bytes().to_vec(),
            None,
        ),
        (
            "truncated JSON is text",
            br#"{"truncated": "#.to_vec(),
            None,
        ),
        ("control characters are text", b"a\x01b\tc\n".to_vec(), None),
        ("binary", vec![0xff, 0x00, 0x01], Some(vec![0xff, 0xfe])),
        ("invalid UTF-8", vec![0xc3, 0x28], None),
    ];
    let mut c = Checks::new("rendering");
    for (label, payload, key) in &cases {
        let q = match key {
            Some(k) => format!("partition=0&key={}", pct(k)),
            None => "partition=0".to_string(),
        };
        http.produce_ok("render", &q, payload.clone()).await;
        let m = http.consume_msg("render", "partition=0&wait=5s").await;
        if let Some(p) = m.payload_problem(payload) {
            c.check(false, || format!("{label}: {p}"));
        }
        if let Some(p) = m.key_problem(key.as_deref()) {
            c.check(false, || format!("{label}: {p}"));
        }
        http.ack_ok("render", m.handle()).await;
    }
    c.finish();
}

#[tokio::test]
async fn message_fields_and_receipt_handle_format() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("fields").await;
    fill(&http, "fields", 2, "f", 2).await;

    let mut handles = BTreeSet::new();
    for want_offset in 0..2 {
        let m = http.consume_msg("fields", "partition=2").await;
        assert_eq!(m.topic, "fields");
        assert_eq!((m.partition, m.offset), (2, want_offset), "{}", m.json);
        let now = now_s() as i64;
        assert!(
            (now - 5..=now + 1).contains(&m.timestamp),
            "timestamp {} should be Unix seconds near {now}",
            m.timestamp
        );
        let (p, o, _nonce) = m
            .handle_parts()
            .unwrap_or_else(|| panic!("handle not partition:offset:nonce: {}", m.json));
        assert_eq!((p, o), (m.partition, m.offset), "{}", m.json);
        assert!(handles.insert(m.handle().to_string()));
        assert!(
            m.json.get("payload_encoding").is_none() && m.json.get("key").is_none(),
            "{}",
            m.json
        );
    }
}

#[tokio::test]
async fn empty_consume_answers_204_after_the_wait() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("empty").await;

    for q in ["", "wait=0", "wait=-1s", "wait=-5m"] {
        let r = http.consume_none("empty", q).await;
        assert!(
            r.elapsed < Duration::from_millis(900),
            "{q:?} means no wait, took {:?}",
            r.elapsed
        );
    }
    let r = http.consume_none("empty", "wait=300ms").await;
    assert!(
        r.elapsed >= Duration::from_millis(300) - MARGIN / 5 && r.elapsed < Duration::from_secs(3),
        "wait=300ms took {:?}",
        r.elapsed
    );
}

#[tokio::test]
async fn long_poll_is_woken_by_a_produce() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("lp").await;

    let (r, _) = tokio::join!(http.consume("lp", "wait=5s"), async {
        sleep(Duration::from_millis(200)).await; // let the poll start waiting
        http.produce_ok("lp", "", "wake up").await;
    });
    r.expect(200);
    assert!(
        r.elapsed < Duration::from_millis(2500),
        "woken consume took {:?}",
        r.elapsed
    );
    assert_eq!(Msg::parse(&r.body).unwrap().payload_bytes(), b"wake up");
}

#[tokio::test]
async fn wait_accepts_go_durations_and_rejects_garbage() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("waits").await;
    let accepted = [
        "1.5s", "1m0s", "500ms", "0", "1m30s", "10s", "100us", "2h45m", "1h", "250000ns", "0s",
    ];
    let rejected = ["abc", "10", "1.5", "s", "5x", "1s2", "--1s", "1 s"];
    fill(&http, "waits", 0, "w", accepted.len() as u64).await;

    let mut c = Checks::new("wait parsing");
    for q in rejected {
        let r = http.consume("waits", &format!("wait={}", pct(q))).await;
        c.error(&format!("wait={q}"), &r, 400);
    }
    // A message is available, so every valid wait answers at once.
    for q in accepted {
        let r = http.consume("waits", &format!("wait={}", pct(q))).await;
        if c.status(&format!("wait={q}"), &r, 200) {
            c.check(r.elapsed < Duration::from_secs(2), || {
                format!("wait={q} with a message ready took {:?}", r.elapsed)
            });
        }
    }
    c.finish();
}

#[tokio::test]
async fn wait_is_clamped_to_ten_seconds() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("clamp").await;
    let r = http.consume_none("clamp", "wait=1h").await;
    assert!(
        r.elapsed >= Duration::from_secs(10) - MARGIN && r.elapsed < Duration::from_secs(13),
        "wait=1h must be clamped to max_consume_wait (10 s), took {:?}",
        r.elapsed
    );
}

#[tokio::test]
async fn batch_consume_leases_up_to_max() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("many").await;
    fill(&http, "many", 0, "b", 5).await;

    let first = http.consume_batch("many", "max=3").await;
    assert_eq!(first.len(), 3);
    let rest = http.consume_batch("many", "max=10").await;
    assert_eq!(
        rest.len(),
        2,
        "max is an upper bound; what is available comes back at once"
    );
    let handles: BTreeSet<&str> = first.iter().chain(&rest).map(|m| m.handle()).collect();
    let offsets: BTreeSet<u64> = first.iter().chain(&rest).map(|m| m.offset).collect();
    assert_eq!(
        (handles.len(), offsets.len()),
        (5, 5),
        "five distinct leases"
    );
    http.consume_none("many", "max=5").await;

    let spaced = br#"{"a" : [1,  2]}"#;
    http.produce_ok("many", "partition=1", spaced.to_vec())
        .await;
    http.wait_visible("many", 1, 1).await;
    let one = http.consume_batch("many", "max=1").await;
    assert_eq!(one.len(), 1, "max=1 still answers the batch shape");
    assert!(
        one[0].payload_problem(spaced).is_none(),
        "{}",
        one[0].payload_problem(spaced).unwrap()
    );

    let mut c = Checks::new("bad max");
    for q in [
        "max=0",
        "max=101",
        "max=x",
        "max=-1",
        "max=2&offset=0&partition=0",
    ] {
        c.error(q, &http.consume("many", q).await, 400);
    }
    c.status("max=100", &http.consume("many", "max=100").await, 204);
    c.finish();
}

#[tokio::test]
async fn pinned_consume_reads_only_that_partition() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("pinned").await;
    for p in 0..3 {
        fill(&http, "pinned", p, &format!("p{p}"), 1).await;
    }
    let m = http.consume_msg("pinned", "partition=2").await;
    assert_eq!((m.partition, m.payload_bytes()), (2, b"p2-0".to_vec()));
    http.consume_none("pinned", "partition=2").await;

    let mut c = Checks::new("bad pinned consume");
    for q in ["partition=3", "partition=-1", "partition=x"] {
        c.error(q, &http.consume("pinned", q).await, 400);
    }
    c.error(
        "unknown topic",
        &http.consume("nope", "partition=0").await,
        404,
    );
    c.finish();
}

#[tokio::test]
async fn in_flight_cap_limits_leases_per_partition() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "capped", "max_in_flight_per_partition": 2}))
        .await;
    for p in 0..3 {
        fill(&http, "capped", p, &format!("p{p}"), 3).await;
    }

    let mut by_partition: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for _ in 0..6 {
        let m = http.consume_msg("capped", "wait=0").await;
        by_partition
            .entry(m.partition)
            .or_default()
            .push(m.handle().to_string());
    }
    assert!(
        by_partition.values().all(|v| v.len() == 2),
        "2 leases per partition: {by_partition:?}"
    );
    http.consume_none("capped", "wait=0").await;

    // Settling one frees one slot on that partition.
    http.ack_ok("capped", &by_partition[&0][0]).await;
    let m = http.consume_msg("capped", "wait=0").await;
    assert_eq!(m.partition, 0);
    http.consume_none("capped", "wait=0").await;

    // Caps apply at once.
    http.patch_json(
        topic_path("capped"),
        &json!({"max_in_flight_per_partition": 3}),
    )
    .await
    .expect(200);
    let mut got: Vec<u64> = Vec::new();
    for _ in 0..2 {
        got.push(http.consume_msg("capped", "wait=0").await.partition);
    }
    got.sort();
    assert_eq!(got, [1, 2]);
    http.consume_none("capped", "wait=0").await;
}

#[tokio::test]
async fn expired_lease_redelivers_with_a_new_handle() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "expiry", "visibility_timeout_ms": 1000}))
        .await;
    fill(&http, "expiry", 0, "e", 1).await;

    let first = http.consume_msg("expiry", "wait=0").await;
    let leased_at = Instant::now();
    http.consume_none("expiry", "wait=0").await;

    // Expiry wakes waiters: the long poll gets the redelivery.
    let again = http.consume_msg("expiry", "wait=5s").await;
    let after = leased_at.elapsed();
    assert!(
        after >= Duration::from_millis(1000) - MARGIN,
        "redelivered {after:?} after the lease; timeout is 1 s"
    );
    assert!(
        after < Duration::from_millis(3000),
        "redelivery took {after:?}"
    );
    assert_eq!(
        (again.partition, again.offset),
        (first.partition, first.offset)
    );
    assert_ne!(
        again.handle(),
        first.handle(),
        "every delivery gets a new handle"
    );

    let mut c = Checks::new("stale handle after expiry");
    c.error("ack", &http.ack("expiry", first.handle(), None).await, 410);
    c.error(
        "extend",
        &http.ack("expiry", first.handle(), Some("true")).await,
        410,
    );
    c.error(
        "nack",
        &http.ack("expiry", first.handle(), Some("0")).await,
        410,
    );
    c.finish();
    http.ack_ok("expiry", again.handle()).await;
    http.consume_none("expiry", "wait=0").await;
}

#[tokio::test]
async fn extend_keeps_the_lease_past_the_original_timeout() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "extend", "visibility_timeout_ms": 2000}))
        .await;
    fill(&http, "extend", 0, "x", 1).await;

    let m = http.consume_msg("extend", "wait=0").await;
    let t0 = Instant::now();
    sleep_until(t0 + Duration::from_millis(500)).await;
    http.ack("extend", m.handle(), Some("1")).await.expect(204);
    sleep_until(t0 + Duration::from_millis(1000)).await;
    let r = http.ack("extend", m.handle(), Some("true")).await;
    r.expect(204);
    // Now leased until ~t0+3.0 s; the original lease ended at ~t0+2.0 s.
    sleep_until(t0 + Duration::from_millis(2500)).await;
    http.consume_none("extend", "wait=0").await;
    http.ack_ok("extend", m.handle()).await;
    http.consume_none("extend", "wait=0").await;
}

#[tokio::test]
async fn nack_makes_the_message_available_at_once() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("nack").await;
    fill(&http, "nack", 0, "n", 1).await;

    let h1 = http.consume_msg("nack", "wait=0").await;
    http.ack("nack", h1.handle(), Some("0")).await.expect(204);
    let h2 = http.consume_msg("nack", "wait=0").await;
    assert_eq!(h2.offset, h1.offset);
    assert_ne!(h2.handle(), h1.handle());
    http.ack("nack", h1.handle(), None).await.expect_error(410);

    // A nack wakes a waiting consumer.
    let (r, _) = tokio::join!(http.consume("nack", "wait=5s"), async {
        sleep(Duration::from_millis(200)).await; // let the poll start waiting
        http.ack("nack", h2.handle(), Some("0")).await.expect(204);
    });
    r.expect(200);
    assert!(
        r.elapsed < Duration::from_millis(2500),
        "nack should wake the waiter; took {:?}",
        r.elapsed
    );
    let h3 = Msg::parse(&r.body).unwrap();
    assert_eq!(h3.offset, h1.offset);
    assert!(h3.handle() != h2.handle() && h3.handle() != h1.handle());
    http.ack_ok("nack", h3.handle()).await;
}

#[tokio::test]
async fn ack_semantics_and_errors() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("acks").await;
    http.create_topic_named("other").await;
    fill(&http, "acks", 0, "a", 5).await;
    fill(&http, "other", 0, "o", 1).await;

    let mut c = Checks::new("ack");
    // Plain ack, then a second ack of the same handle.
    let m = http.consume_msg("acks", "partition=0").await;
    let r = http.ack("acks", m.handle(), None).await;
    c.status("ack", &r, 204);
    c.check(r.body.is_empty(), || {
        format!("204 with a body: {}", r.describe())
    });
    c.error("second ack", &http.ack("acks", m.handle(), None).await, 410);

    // extend=false and extend= (empty) are acks.
    for e in ["false", ""] {
        let m = http.consume_msg("acks", "partition=0").await;
        c.status(
            &format!("extend={e:?} acks"),
            &http.ack("acks", m.handle(), Some(e)).await,
            204,
        );
        c.error(
            &format!("after extend={e:?}"),
            &http.ack("acks", m.handle(), None).await,
            410,
        );
    }

    // Bad requests leave the lease alone.
    let m = http.consume_msg("acks", "partition=0").await;
    for e in ["garbage", "2", "yes", "TRUE1"] {
        c.error(
            &format!("extend={e}"),
            &http.ack("acks", m.handle(), Some(e)).await,
            400,
        );
    }
    c.error("missing handle", &http.ack_query("acks", "").await, 400);
    c.error(
        "empty handle",
        &http.ack_query("acks", "receipt_handle=").await,
        400,
    );
    for h in [
        "abc", "1:2", "1:2:x", "a:b:c", "1:2:3:4", "-1:0:5", "0:-1:5", ":::",
    ] {
        c.error(
            &format!("malformed handle {h:?}"),
            &http.ack("acks", h, None).await,
            400,
        );
    }
    // Well-formed but never issued (the message at 0:<offset> is leased under another nonce).
    let (p, o, n) = m.handle_parts().expect("handle format");
    c.error(
        "forged nonce",
        &http
            .ack("acks", &format!("{p}:{o}:{}", n.wrapping_add(1)), None)
            .await,
        410,
    );
    // Another topic's handle.
    let om = http.consume_msg("other", "partition=0").await;
    c.error(
        "handle of another topic",
        &http.ack("acks", om.handle(), None).await,
        410,
    );
    c.status(
        "that handle still works on its topic",
        &http.ack("other", om.handle(), None).await,
        204,
    );
    c.error(
        "unknown topic",
        &http.ack("nope", m.handle(), None).await,
        404,
    );
    c.status(
        "the lease survived the bad requests",
        &http.ack("acks", m.handle(), None).await,
        204,
    );
    c.finish();
}

#[tokio::test]
async fn batch_ack_answers_one_result_per_handle_in_order() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("batchack").await;
    fill(&http, "batchack", 0, "b", 3).await;
    let leased = lease_all(&http, "batchack", 0).await;
    let h: Vec<&str> = leased.values().map(String::as_str).collect();
    assert_eq!(h.len(), 3);

    http.ack_ok("batchack", h[0]).await;
    let forged = "0:999:1";
    let r = http
        .ack_batch("batchack", None, &[h[0], h[1], forged, h[2]])
        .await;
    let v = r.expect_json(200);
    let results = v["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {}", r.describe()));
    let statuses: Vec<u64> = results
        .iter()
        .map(|x| x["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [410, 204, 410, 204], "{}", r.describe());
    for (i, x) in results.iter().enumerate() {
        if statuses[i] == 410 {
            assert!(
                x["error"].as_str().is_some_and(|e| !e.is_empty()),
                "410 result without error text: {x}"
            );
        }
    }
    http.consume_none("batchack", "partition=0").await;

    // Batch nack, then batch extend, on fresh leases.
    fill(&http, "batchack", 1, "n", 2).await;
    let leased = lease_all(&http, "batchack", 1).await;
    let h: Vec<&str> = leased.values().map(String::as_str).collect();
    let v = http
        .ack_batch("batchack", Some("0"), &h)
        .await
        .expect_json(200);
    assert_all_204(&v, 2);
    let again = lease_all(&http, "batchack", 1).await;
    assert_eq!(
        again.keys().collect::<Vec<_>>(),
        leased.keys().collect::<Vec<_>>(),
        "nacked messages come back"
    );
    let h: Vec<&str> = again.values().map(String::as_str).collect();
    let v = http
        .ack_batch("batchack", Some("true"), &h)
        .await
        .expect_json(200);
    assert_all_204(&v, 2);

    // With receipt_handle in the query it is the single form; the body is ignored.
    let r = http
        .request(
            Method::POST,
            format!(
                "{}/ack?receipt_handle={}",
                topic_path("batchack"),
                pct(h[0])
            ),
        )
        .json(&json!({"receipt_handles": [h[1]]}))
        .send()
        .await;
    r.expect(204);
    http.ack_ok("batchack", h[1]).await;

    let mut c = Checks::new("bad batch acks");
    let many: Vec<String> = (0..101).map(|i| format!("0:{i}:1")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    c.error(
        "no handles",
        &http.ack_batch("batchack", None, &[]).await,
        400,
    );
    c.error(
        "101 handles",
        &http.ack_batch("batchack", None, &many).await,
        400,
    );
    let path = format!("{}/ack", topic_path("batchack"));
    c.error(
        "handles not an array",
        &http
            .post_json(&path, &json!({"receipt_handles": "0:0:1"}))
            .await,
        400,
    );
    c.error(
        "unknown field",
        &http
            .post_json(&path, &json!({"receipt_handles": ["0:0:1"], "x": 1}))
            .await,
        400,
    );
    c.error(
        "not JSON",
        &http.send_raw_json(Method::POST, &path, "nope").await,
        400,
    );
    c.error(
        "bad extend",
        &http.ack_batch("batchack", Some("maybe"), &["0:0:1"]).await,
        400,
    );
    c.finish();
}

fn assert_all_204(v: &Value, n: usize) {
    let results = v["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {v}"));
    assert!(
        results.len() == n && results.iter().all(|x| x["status"] == json!(204)),
        "want {n} x 204: {v}"
    );
}

#[tokio::test]
async fn acked_ahead_cap_blocks_out_of_order_acks_until_the_frontier_moves() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "ahead", "max_acked_ahead_per_partition": 2}))
        .await;
    fill(&http, "ahead", 0, "a", 4).await;
    // Fresh offsets are leased only within frontier + cap, so every ack of them can be parked.
    let h = lease_all(&http, "ahead", 0).await;
    assert_eq!(h.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    http.ack_ok("ahead", &h[&1]).await;
    http.ack_ok("ahead", &h[&2]).await;

    // Now full: no fresh offsets are leased ...
    http.consume_none("ahead", "partition=0&wait=0").await;
    // ... and only the offset blocking the frontier is re-offered.
    http.ack("ahead", &h[&0], Some("0")).await.expect(204);
    let blocker = http.consume_msg("ahead", "partition=0&wait=0").await;
    assert_eq!(
        blocker.offset, 0,
        "only the blocking offset may be re-offered: {}",
        blocker.json
    );
    http.consume_none("ahead", "partition=0&wait=0").await;
    http.ack_ok("ahead", blocker.handle()).await;

    // A cap lowered under leases already out: an ack that cannot be parked answers 503.
    fill(&http, "ahead", 0, "b", 2).await;
    let h = lease_all(&http, "ahead", 0).await;
    assert_eq!(h.keys().copied().collect::<Vec<_>>(), [3, 4, 5]);
    http.patch_json(
        "/v1/topics/ahead",
        &json!({"max_acked_ahead_per_partition": 1}),
    )
    .await
    .expect(200);
    http.ack_ok("ahead", &h[&4]).await;
    let r = http.ack("ahead", &h[&5], None).await;
    r.expect_error(503);
    let retry_after = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("503 without Retry-After: {}", r.describe()));
    assert!(
        retry_after.trim().parse::<u64>().is_ok(),
        "Retry-After must be seconds: {retry_after:?}"
    );
    http.ack_ok("ahead", &h[&3]).await;
    http.ack_ok("ahead", &h[&5]).await; // the refused ack, retried
    http.consume_none("ahead", "partition=0&wait=0").await;
}

#[tokio::test]
async fn replay_reads_by_offset_without_touching_the_queue() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("replay").await;
    fill(&http, "replay", 1, "r", 3).await;

    for o in 0..3u64 {
        let m = http
            .consume_msg("replay", &format!("partition=1&offset={o}"))
            .await;
        assert_eq!((m.topic.as_str(), m.partition, m.offset), ("replay", 1, o));
        assert_eq!(m.payload_bytes(), format!("r-{o}").into_bytes());
        assert!(
            m.json.get("receipt_handle").is_none(),
            "replay must not carry a receipt_handle: {}",
            m.json
        );
    }
    http.consume_none("replay", "partition=1&offset=3").await;
    http.consume_none("replay", "partition=1&offset=1000").await;
    let r = http
        .consume_none("replay", "partition=1&offset=3&wait=5s")
        .await;
    assert!(
        r.elapsed < Duration::from_secs(2),
        "replay ignores wait; took {:?}",
        r.elapsed
    );

    // The queue is untouched: all three are still there, in order.
    let first = http.consume_msg("replay", "partition=1").await;
    assert_eq!(first.offset, 0);
    // Replay of a leased, then an acked message still works.
    http.consume_msg("replay", "partition=1&offset=0").await;
    http.ack_ok("replay", first.handle()).await;
    let m = http.consume_msg("replay", "partition=1&offset=0").await;
    assert_eq!(m.payload_bytes(), b"r-0");
    let rest: Vec<u64> = http
        .drain("replay", "partition=1")
        .await
        .iter()
        .map(|m| m.offset)
        .collect();
    assert_eq!(rest, [1, 2]);

    let mut c = Checks::new("bad replays");
    for q in [
        "offset=0",
        "offset=-1&partition=1",
        "offset=x&partition=1",
        "offset=0&partition=3",
        "offset=0&partition=-1",
    ] {
        c.error(q, &http.consume("replay", q).await, 400);
    }
    c.error(
        "unknown topic",
        &http.consume("nope", "partition=0&offset=0").await,
        404,
    );
    c.finish();
}
