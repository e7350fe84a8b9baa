//! Settles with a parameter (ext, SPEC §3.6): `extend=0&delay=D` hands a message back to be
//! delivered again no earlier than `D` from now (also across a crash of the owner), and
//! `extend=true&visibility=V` restarts the lease with `V` instead of the topic's visibility
//! timeout; the batch forms take the same parameters.

use std::time::{Duration, Instant};

use narad_tests::*;

async fn in_flight(http: &Http, topic: &str) -> u64 {
    http.get_topic(topic, "").await["backlog"]["in_flight"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn a_delayed_nack_is_redelivered_no_earlier_even_across_a_crash() {
    let mut server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "dn"})).await;
    http.produce_ok("dn", "partition=0", "late").await;
    http.wait_visible("dn", 0, 1).await;

    let m = http.consume_msg("dn", "wait=0").await;
    let nacked = Instant::now();
    http.ack_query(
        "dn",
        &format!("receipt_handle={}&extend=0&delay=2s", m.handle()),
    )
    .await
    .expect(204);
    // Held back, counted in flight, its handle spent.
    http.consume_none("dn", "wait=0").await;
    assert_eq!(in_flight(&http, "dn").await, 1);
    http.ack("dn", m.handle(), None).await.expect_error(410);
    let again = http.consume_msg("dn", "wait=10s").await;
    assert!(
        nacked.elapsed() >= Duration::from_millis(1990),
        "{:?}",
        nacked.elapsed()
    );
    assert_eq!(again.json["delivery_count"], 2, "{}", again.json);

    // Delayed again, then the node is killed at once: the delay is on disk.
    let nacked = Instant::now();
    http.ack_query(
        "dn",
        &format!("receipt_handle={}&extend=0&delay=3s", again.handle()),
    )
    .await
    .expect(204);
    server.restart().await;
    http.consume_none("dn", "wait=0").await;
    let third = http.consume_msg("dn", "wait=10s").await;
    assert!(
        nacked.elapsed() >= Duration::from_millis(2990),
        "{:?}",
        nacked.elapsed()
    );
    assert_eq!(third.payload_bytes(), b"late");
    http.ack_ok("dn", third.handle()).await;
    http.consume_none("dn", "wait=0").await;

    // delay=0s is a plain nack.
    http.produce_ok("dn", "partition=0", "now").await;
    let m = http.consume_msg("dn", "wait=5s").await;
    http.ack_query(
        "dn",
        &format!("receipt_handle={}&extend=0&delay=0s", m.handle()),
    )
    .await
    .expect(204);
    let m = http.consume_msg("dn", "wait=0").await;
    http.ack_ok("dn", m.handle()).await;
}

#[tokio::test]
async fn an_extend_with_a_visibility_sets_that_lease_alone() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "vis", "visibility_timeout_ms": 60000}))
        .await;
    http.produce_ok("vis", "partition=0", "x").await;
    http.wait_visible("vis", 0, 1).await;
    let m = http.consume_msg("vis", "wait=0").await;
    let extended = Instant::now();
    http.ack_query(
        "vis",
        &format!("receipt_handle={}&extend=true&visibility=1s", m.handle()),
    )
    .await
    .expect(204);
    // The lease now lapses after 1 s, not 60 s: redelivered, the old handle stale.
    let again = http.consume_msg("vis", "wait=10s").await;
    assert!(extended.elapsed() >= Duration::from_millis(990));
    assert!(extended.elapsed() < Duration::from_secs(30));
    assert_eq!(again.json["delivery_count"], 2);
    http.ack("vis", m.handle(), None).await.expect_error(410);
    // A longer one holds it past the topic's.
    http.ack_query(
        "vis",
        &format!(
            "receipt_handle={}&extend=true&visibility=2h",
            again.handle()
        ),
    )
    .await
    .expect(204);
    http.ack_ok("vis", again.handle()).await;
}

#[tokio::test]
async fn batch_settles_take_the_same_parameters_and_bad_ones_are_refused() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "bd", "partitions": 3}))
        .await;
    for i in 0..3 {
        http.produce_ok("bd", &format!("partition={i}"), format!("b{i}"))
            .await;
    }
    http.wait_total_visible("bd", 3).await;
    let msgs = http.consume_batch("bd", "max=10&wait=0").await;
    assert_eq!(msgs.len(), 3);
    let handles: Vec<&str> = msgs.iter().map(|m| m.handle()).collect();
    let nacked = Instant::now();
    let r = http
        .post_json(
            format!("{}/ack?extend=0&delay=2s", topic_path("bd")),
            &json!({ "receipt_handles": handles }),
        )
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
    http.consume_none("bd", "wait=0").await;
    let mut back = 0;
    while back < 3 {
        back += http.consume_batch("bd", "max=10&wait=10s").await.len();
    }
    assert!(nacked.elapsed() >= Duration::from_millis(1990));

    for (q, why) in [
        ("extend=true&delay=1s", "only with extend=0"),
        ("delay=1s", "only with extend=0"),
        ("extend=0&visibility=1m", "only with extend=true"),
        ("visibility=1m", "only with extend=true"),
        ("extend=0&delay=1s&visibility=1s", "not both"),
        ("extend=0&delay=13h", "longer than 12h"),
        ("extend=true&visibility=13h", "longer than 12h"),
        ("extend=true&visibility=500ms", "shorter than 1s"),
        ("extend=0&delay=soon", "invalid delay"),
    ] {
        let msg = http
            .ack_query("bd", &format!("receipt_handle=0:0:1&{q}"))
            .await
            .expect_error(400);
        assert!(msg.contains(why), "{q}: {msg}");
    }
}
