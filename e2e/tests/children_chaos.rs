//! Child topics under kill -9 (SPEC §5.1, §5.3): a parent with a fan-out child and a delay
//! child, under sustained produce and consume on all three, while parent-partition owners,
//! child-partition owners and the Raft leader are killed and restarted. Every message that
//! got `202` from the parent is consumed from the parent and from both children (nothing
//! lost; duplicates reported), and no message is ever consumable from the delay child
//! before its due time.
//!
//! "Due" is the parent commit time plus the delay. The test cannot see commit times in
//! milliseconds (consume renders seconds), so it checks two lower bounds of the commit
//! time that no correct delivery can violate: the moment the producer sent the message and
//! the parent copy's commit second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narad_e2e::TestCluster;
use narad_tests::ledger::{wait_all_consumed, Consumers, Ledger, ProduceSpec, Producers};
use narad_tests::{json, now_ms, payload, test_rng, topic_path, Http, Method, Msg};
use rand::Rng;
use tokio::task::JoinHandle;

const PRODUCERS: u32 = 8;
const KILLS: usize = 6;
const DELAY_MS: u64 = 3000;
const DRAIN: Duration = Duration::from_secs(90);

/// What the test knows of each message's timing (Unix ms).
#[derive(Default)]
struct Times {
    sent: HashMap<String, u64>,
    /// Earliest parent commit second seen on a parent delivery, in ms.
    parent_commit: HashMap<String, u64>,
    /// Earliest consume of the delay child's copy.
    delayed_seen: HashMap<String, u64>,
}

type Shared = Arc<Mutex<Times>>;

/// Consumes `topic` through `url`, acking each message; records timing for the parent and
/// the delay child.
async fn consume_loop(
    url: String,
    topic: &'static str,
    ledger: Arc<Ledger>,
    times: Shared,
    stop: Arc<AtomicBool>,
) {
    let http = Http::new(&url);
    let consume = format!("{}/consume?wait=1s", topic_path(topic));
    while !stop.load(Ordering::SeqCst) {
        let r = match http
            .request(Method::GET, consume.clone())
            .timeout(Duration::from_secs(10))
            .try_send()
            .await
        {
            Ok(r) => r,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if r.status != 200 {
            if r.status >= 400 && r.status < 500 {
                ledger.record_unexpected(r.describe());
            }
            if r.status != 204 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            continue;
        }
        let at = now_ms();
        let Ok(m) = Msg::parse(&r.body) else {
            ledger.record_unexpected(format!("unparsable: {}", r.describe()));
            continue;
        };
        ledger.record_delivery(&m);
        if let Ok(id) = payload::verify(m.payload_raw.as_bytes()) {
            let mut t = times.lock().unwrap();
            let slot = if topic == "feed" {
                t.parent_commit.entry(id).or_insert(u64::MAX)
            } else {
                t.delayed_seen.entry(id).or_insert(u64::MAX)
            };
            let v = if topic == "feed" {
                m.timestamp as u64 * 1000
            } else {
                at
            };
            *slot = (*slot).min(v);
        }
        if let Some(h) = &m.receipt_handle {
            let _ = http
                .request(
                    Method::POST,
                    format!(
                        "{}/ack?receipt_handle={}",
                        topic_path(topic),
                        narad_tests::pct(h)
                    ),
                )
                .timeout(Duration::from_secs(10))
                .try_send()
                .await;
        }
    }
}

fn percentile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_and_delay_children_survive_kill9_without_loss_or_early_delivery() {
    let mut rng = test_rng("fan_out_and_delay_children_survive_kill9");
    let mut c = TestCluster::start(3).await;
    let h = c.http(0);
    h.create_topic(
        &json!({"name": "feed", "partitions": 6, "retention_ms": 0, "visibility_timeout_ms": 5000}),
    )
    .await;
    for child in ["feed-fan", "feed-late"] {
        h.create_topic(&json!({"name": child, "partitions": 3, "visibility_timeout_ms": 5000}))
            .await;
    }
    h.post_json("/v1/topics/feed/children", &json!({"child": "feed-fan"}))
        .await
        .expect(200);
    h.post_json(
        "/v1/topics/feed/children",
        &json!({"child": "feed-late", "delay_ms": DELAY_MS}),
    )
    .await
    .expect(200);

    let urls: Vec<String> = (0..3).map(|i| c.url(i)).collect();
    let ledgers: Vec<Arc<Ledger>> = (0..3).map(|_| Ledger::new()).collect();
    let times: Shared = Arc::default();
    let stop_consuming = Arc::new(AtomicBool::new(false));
    // Half the messages keyed: keys travel to the children too.
    let sent = times.clone();
    let producers = Producers::spawn(
        PRODUCERS,
        &ProduceSpec {
            urls: urls.clone(),
            topic: "feed".into(),
            ledgers: ledgers.clone(),
            max_backlog: 2000,
            key_every: Some(2),
            on_send: Some(Arc::new(move |id: &str| {
                sent.lock().unwrap().sent.insert(id.to_string(), now_ms());
            })),
        },
    );
    let mut consumers: Vec<JoinHandle<()>> = Vec::new();
    for u in &urls {
        for (topic, ledger) in [("feed", &ledgers[0]), ("feed-late", &ledgers[2])] {
            consumers.push(tokio::spawn(consume_loop(
                u.clone(),
                topic,
                ledger.clone(),
                times.clone(),
                stop_consuming.clone(),
            )));
        }
    }
    let fan: Vec<Consumers> = urls
        .iter()
        .map(|u| Consumers::spawn(1, u, "feed-fan", &ledgers[1]))
        .collect();

    // Kills: owners of parent partitions, owners of child partitions, the leader.
    let started = Instant::now();
    for kill in 1..=KILLS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(800..=2000))).await;
        let live = (0..3).find(|i| *i != kill % 3).unwrap();
        let (victim, what) = match kill % 3 {
            0 => (c.leader(live).await.unwrap_or(kill % 3), "raft leader"),
            1 => {
                let owners = c.owners(live, "feed").await;
                let p = rng.random_range(0..owners.len());
                (c.index_of(&owners[p]), "parent partition owner")
            }
            _ => {
                let child = if kill % 2 == 0 {
                    "feed-late"
                } else {
                    "feed-fan"
                };
                let owners = c.owners(live, child).await;
                let p = rng.random_range(0..owners.len());
                (c.index_of(&owners[p]), "child partition owner")
            }
        };
        c.kill9(victim);
        eprintln!(
            "kill -9 #{kill} ({what} n{victim}) at {:?}: {}",
            started.elapsed(),
            ledgers[0].progress()
        );
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..=1000))).await;
        c.restart(victim).await;
        c.wait_ready(victim).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    producers.stop().await;
    let mut drained = Vec::new();
    for (name, l) in ["feed", "feed-fan", "feed-late"].iter().zip(&ledgers) {
        drained.push((*name, wait_all_consumed(l, DRAIN).await));
    }
    stop_consuming.store(true, Ordering::SeqCst);
    for t in consumers {
        t.await.unwrap();
    }
    for f in fan {
        f.stop().await;
    }

    // Never early; how late.
    let t = times.lock().unwrap();
    let mut early = Vec::new();
    let mut lateness = Vec::new();
    for (id, seen) in &t.delayed_seen {
        let sent = t.sent.get(id).copied().unwrap_or(0);
        let committed = t.parent_commit.get(id).copied().unwrap_or(0);
        let bound = sent.max(committed) + DELAY_MS;
        if *seen < bound {
            early.push(format!("{id}: consumed at {seen}, not before {bound}"));
        }
        lateness.push(*seen as i64 - (sent + DELAY_MS) as i64);
    }
    lateness.sort_unstable();
    eprintln!(
        "delay child: {} messages, lateness after send+delay p50 {} ms, p99 {} ms, max {} ms",
        lateness.len(),
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99),
        lateness.last().copied().unwrap_or(0)
    );
    for ((name, d), l) in drained.iter().zip(&ledgers) {
        eprintln!("{name}: {}", l.report());
        if let Err(e) = d {
            eprintln!("{name}: drain incomplete: {e:#}");
        }
    }
    assert!(
        early.is_empty(),
        "delivered early: {:?}",
        &early[..early.len().min(10)]
    );
    for l in &ledgers {
        assert!(l.report().produced > 0);
        l.report().assert_ok();
    }
}
