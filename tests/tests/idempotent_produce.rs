//! (ext) Idempotent produce against a real `narad`: the `Idempotency-Key` header and a batch
//! element's `"idempotency_key"`, their limits, the topic's `dedup_window_ms`, a retry
//! answered `202` and not stored again (in one batch, across requests, after kill -9), and
//! stored again once the window has passed.

use std::time::Duration;

use narad_tests::*;

async fn produce_keyed(http: &Http, topic: &str, key: &str, body: &str) -> Resp {
    http.request(Method::POST, format!("{}/produce", topic_path(topic)))
        .header("idempotency-key", key)
        .body(body.to_string())
        .send()
        .await
}

async fn stored(http: &Http, topic: &str) -> u64 {
    http.high_watermarks(topic).await.unwrap().values().sum()
}

async fn dropped(http: &Http, topic: &str) -> f64 {
    metric_sum_where(
        &http.metrics_text().await,
        "narad_dedup_dropped_total",
        &[("topic", topic)],
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn a_retry_with_the_same_idempotency_key_is_answered_but_not_stored_again() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("t").await;
    http.create_topic_named("u").await;

    // The limits: 1 to 128 visible ASCII bytes, one header.
    for bad in ["", "a b", &"k".repeat(129)] {
        produce_keyed(&http, "t", bad, "x").await.expect_error(400);
    }
    let r = http
        .request(Method::POST, format!("{}/produce", topic_path("t")))
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body("x")
        .send()
        .await;
    r.expect_error(400);
    http.batch_element_refused("t", json!({"payload": "x", "idempotency_key": "é"}))
        .await;
    // Producers cannot set the broker's attribute themselves.
    let r = http
        .request(Method::POST, format!("{}/produce", topic_path("t")))
        .header("narad-attr-narad-idempotency-key", "k")
        .body("x")
        .send()
        .await;
    r.expect_error(400);
    assert_eq!(stored(&http, "t").await, 0);

    // Three attempts, one message; the key comes back as a broker attribute.
    for _ in 0..3 {
        produce_keyed(&http, "t", "order-1", "first")
            .await
            .expect(202);
    }
    http.wait_total_visible("t", 1).await;
    let m = http.consume_msg("t", "wait=1s").await;
    assert_eq!(m.payload_bytes(), b"first");
    assert_eq!(
        m.json["attributes"],
        json!({"narad-idempotency-key": "order-1"})
    );
    http.ack_ok("t", m.handle()).await;
    // Another topic has a window of its own.
    produce_keyed(&http, "u", "order-1", "other topic")
        .await
        .expect(202);
    http.wait_total_visible("u", 1).await;

    // A batch: a repeat within it and one of an earlier produce go; a message key routes
    // as usual, the idempotency key only decides repeats.
    let r = http
        .produce_batch(
            "t",
            &json!({"messages": [
                {"payload": "b1", "idempotency_key": "order-2"},
                {"payload": "b2", "idempotency_key": "order-2"},
                {"payload": "b3", "idempotency_key": "order-1"},
                {"payload": "b4", "idempotency_key": "order-3", "key": "customer-7"},
                {"payload": "b5"},
            ]}),
        )
        .await;
    r.expect_json(202);
    assert_eq!(r.json()["accepted"], 5, "every message is answered");
    http.wait_total_visible("t", 4).await;
    let got: Vec<Vec<u8>> = http
        .drain("t", "wait=0")
        .await
        .iter()
        .map(|m| m.payload_bytes())
        .collect();
    let mut got: Vec<String> = got
        .iter()
        .map(|p| String::from_utf8_lossy(p).into())
        .collect();
    got.sort();
    assert_eq!(got, ["b1", "b4", "b5"]);
    assert_eq!(stored(&http, "t").await, 4);
    assert_eq!(dropped(&http, "t").await, 4.0);
}

#[tokio::test]
async fn the_window_is_a_topic_setting_and_a_key_is_stored_again_after_it() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    for bad in [999, 86_400_001, -1] {
        http.post_json("/v1/topics", &json!({"name": "w", "dedup_window_ms": bad}))
            .await
            .expect_error(400);
    }
    let t = http
        .create_topic(&json!({"name": "w", "dedup_window_ms": 1000}))
        .await;
    assert_eq!(t["dedup_window_ms"], 1000);
    produce_keyed(&http, "w", "k", "one").await.expect(202);
    produce_keyed(&http, "w", "k", "one again")
        .await
        .expect(202);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    produce_keyed(&http, "w", "k", "after the window")
        .await
        .expect(202);
    http.wait_total_visible("w", 2).await;

    // 0 goes back to the default (5 minutes), shown by the setting's absence.
    let r = http
        .patch_json(topic_path("w"), &json!({"dedup_window_ms": 0}))
        .await;
    r.expect_json(200);
    assert!(
        r.json().get("dedup_window_ms").is_none(),
        "{}",
        r.describe()
    );
    http.patch_json(topic_path("w"), &json!({"dedup_window_ms": 500}))
        .await
        .expect_error(400);
    produce_keyed(&http, "w", "k", "within the default window")
        .await
        .expect(202);
    produce_keyed(&http, "w", "k2", "new").await.expect(202);
    http.wait_total_visible("w", 3).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    produce_keyed(&http, "w", "k", "still within it")
        .await
        .expect(202);
    assert_eq!(stored(&http, "w").await, 3);
}

/// Keys produced, the node killed -9, every produce retried after the restart: none is
/// stored again (the window is read back from the log).
#[tokio::test]
async fn retries_after_kill9_are_not_stored_again() {
    const N: usize = 200;
    let mut server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "k", "partitions": 3}))
        .await;
    let batch = |tag: &str| -> Value {
        let msgs: Vec<Value> = (0..N)
            .map(|i| json!({"payload": format!("{tag}{i}"), "idempotency_key": format!("id-{i}")}))
            .collect();
        json!({ "messages": msgs })
    };
    http.produce_batch("k", &batch("first"))
        .await
        .expect_json(202);
    server.kill9();
    server.restart().await;
    http.produce_batch("k", &batch("retry"))
        .await
        .expect_json(202);
    for i in (0..N).step_by(7) {
        produce_keyed(&http, "k", &format!("id-{i}"), "single retry")
            .await
            .expect(202);
    }
    http.wait_total_visible("k", N as u64).await;
    let got = http
        .drain_batches("k", "wait=0", || async { http.backlog("k").await.1 })
        .await;
    assert_eq!(got.len(), N);
    assert!(
        got.iter().all(|m| m.payload_bytes().starts_with(b"first")),
        "a retry was stored"
    );
    assert_eq!(stored(&http, "k").await, N as u64);
}
