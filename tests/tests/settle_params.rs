//! Settles with a parameter (ext, SPEC §3.6): `extend=0&delay=D` hands a message back to be
//! delivered again no earlier than `D` from now (also across a crash of the owner), and
//! `extend=true&visibility=V` restarts the lease with `V` instead of the topic's visibility
//! timeout; the batch forms take the same parameters.

use std::time::{Duration, Instant};

use narad_tests::*;

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
    assert_eq!(http.backlog("dn").await.1, 1);
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

#[tokio::test]
async fn a_retry_backoff_spaces_redeliveries_after_nacks_and_lapsed_leases() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let rec = http
        .create_topic(&json!({"name": "rb", "retry_backoff": {"min": "1s", "max": "2s"}}))
        .await;
    assert_eq!(
        rec["retry_backoff"],
        json!({"min": "1s", "max": "2s"}),
        "{rec}"
    );
    http.produce_ok("rb", "partition=0", "poison").await;
    http.wait_visible("rb", 0, 1).await;

    // Plain nacks: 1 s after the first delivery, 2 s after the second, 2 s after the third.
    let mut m = http.consume_msg("rb", "wait=0").await;
    for want in [1000u64, 2000, 2000] {
        let nacked = Instant::now();
        http.ack("rb", m.handle(), Some("0")).await.expect(204);
        http.consume_none("rb", "wait=0").await;
        m = http.consume_msg("rb", "wait=10s").await;
        assert!(
            nacked.elapsed() >= Duration::from_millis(want - 10),
            "{want} ms: {:?}",
            nacked.elapsed()
        );
    }
    assert_eq!(m.json["delivery_count"], 4);

    // A lapsed lease waits too: 1 s of visibility, then 1.5 s of backoff.
    let rec = http
        .patch_json(
            topic_path("rb"),
            &json!({"visibility_timeout_ms": 1000, "retry_backoff": {"min": "1500ms", "max": "1500ms"}}),
        )
        .await
        .expect_json(200);
    assert_eq!(
        rec["retry_backoff"],
        json!({"min": "1.5s", "max": "1.5s"}),
        "{rec}"
    );
    http.ack("rb", m.handle(), Some("0")).await.expect(204);
    let leased = Instant::now() + Duration::from_millis(1500);
    let _lapses = http.consume_msg("rb", "wait=10s").await;
    let again = http.consume_msg("rb", "wait=10s").await;
    assert!(
        leased.elapsed() >= Duration::from_millis(2490),
        "{:?}",
        leased.elapsed()
    );
    assert_eq!(again.json["delivery_count"], 6);

    // Off again: a nack is back at once.
    let rec = http
        .patch_json(
            topic_path("rb"),
            &json!({"retry_backoff": {"min": "0s", "max": "0s"}}),
        )
        .await
        .expect_json(200);
    assert!(rec.get("retry_backoff").is_none(), "{rec}");
    http.ack("rb", again.handle(), Some("0")).await.expect(204);
    let m = http.consume_msg("rb", "wait=0").await;
    http.ack_ok("rb", m.handle()).await;

    for bad in [
        json!({"min": "5s", "max": "1s"}),
        json!({"min": "1s", "max": "13h"}),
        json!({"min": "500us", "max": "1s"}),
        json!({"min": "soon", "max": "1s"}),
        json!({"min": "1s"}),
        json!({"min": "1s", "max": "2s", "factor": 3}),
    ] {
        http.patch_json(topic_path("rb"), &json!({ "retry_backoff": bad }))
            .await
            .expect_error(400);
        http.post_json("/v1/topics", &json!({"name": "rb2", "retry_backoff": bad}))
            .await
            .expect_error(400);
    }
}
