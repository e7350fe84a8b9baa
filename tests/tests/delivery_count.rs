//! Delivery counts (ext): every leased message carries `delivery_count`, 1 on its first
//! delivery and one more on each redelivery (after a nack or an expired lease); an extend
//! is not a delivery, a replay carries none. Counts of at least 2 are persisted with the
//! frontier, so they survive a graceful restart exactly and kill -9 once persisted; a first
//! delivery in flight at a crash is not persisted (its count is one short afterwards).

use std::time::Duration;

use narad_tests::*;

/// Persistence of the frontier and the counts (SPEC §2.4: at least every 100 ms), with a
/// wide margin.
const PERSISTED_AFTER: Duration = Duration::from_millis(500);

fn count(m: &Msg) -> u64 {
    m.json["delivery_count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no delivery_count: {}", m.json))
}

/// Leases the message at offset 0 of partition 0 of topic `t` until it was delivered
/// `n` times, nacking each delivery but the last, and returns the last.
async fn deliver(http: &Http, t: &str, n: u64) -> Msg {
    let mut m = http.consume_msg(t, "partition=0").await;
    for _ in 1..n {
        http.ack(t, m.handle(), Some("0")).await.expect(204);
        m = http.consume_msg(t, "partition=0").await;
    }
    assert_eq!(m.offset, 0);
    m
}

#[tokio::test]
async fn each_delivery_counts_one_and_extends_and_replays_count_none() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "dc", "partitions": 3, "visibility_timeout_ms": 1000}))
        .await;
    http.produce_ok("dc", "partition=0", "first").await;
    http.wait_visible("dc", 0, 1).await;

    let m = http.consume_msg("dc", "partition=0").await;
    assert_eq!((m.offset, count(&m)), (0, 1));
    // An extend is not a delivery.
    http.ack("dc", m.handle(), Some("true")).await.expect(204);
    // A nack: the redelivery counts 2.
    http.ack("dc", m.handle(), Some("0")).await.expect(204);
    let m = http.consume_msg("dc", "partition=0").await;
    assert_eq!((m.offset, count(&m)), (0, 2));
    // An expired lease (1 s; the expiry wakes the long poll): the redelivery counts 3.
    let m = http.consume_msg("dc", "partition=0&wait=5s").await;
    assert_eq!((m.offset, count(&m)), (0, 3));
    http.produce_ok("dc", "partition=0", "second").await;
    http.wait_visible("dc", 0, 2).await;
    // A batch carries the count of each message.
    http.ack("dc", m.handle(), Some("0")).await.expect(204);
    let batch = http.consume_batch("dc", "partition=0&max=10").await;
    let mut got: Vec<(u64, u64)> = batch.iter().map(|m| (m.offset, count(m))).collect();
    got.sort();
    assert_eq!(got, vec![(0, 4), (1, 1)]);
    // Once acked, nothing is left to count; a replay carries no count.
    for m in &batch {
        http.ack_ok("dc", m.handle()).await;
    }
    let r = http.consume("dc", "partition=0&offset=0").await;
    r.expect(200);
    assert!(Msg::parse(&r.body)
        .unwrap()
        .json
        .get("delivery_count")
        .is_none());
}

async fn counts_survive(kill9: bool) {
    let mut server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "dcr", "partitions": 3}))
        .await;
    http.produce_ok("dcr", "partition=0", "poison").await;
    http.wait_visible("dcr", 0, 1).await;
    let m = deliver(&http, "dcr", 3).await;
    assert_eq!(count(&m), 3);
    if kill9 {
        tokio::time::sleep(PERSISTED_AFTER).await;
        server.kill9();
    } else {
        let st = server.stop().await;
        assert!(st.success(), "SIGTERM exit status: {st}");
    }
    server.restart().await;
    // Leases are forgotten by a restart: the message comes back, its fourth delivery.
    let m = http.consume_msg("dcr", "partition=0&wait=5s").await;
    assert_eq!((m.offset, count(&m)), (0, 4), "kill -9: {kill9}");
}

#[tokio::test]
async fn counts_survive_a_graceful_restart() {
    counts_survive(false).await;
}

#[tokio::test]
async fn persisted_counts_survive_kill9() {
    counts_survive(true).await;
}
