//! Sustained produce and consume spread over a cluster's nodes, with the durability ledger.
//!
//! Producers send unique self-checking payloads; a producer whose node refuses or drops the
//! connection moves to the next node (as a client behind a Service would reach another pod).
//! Every `202` is recorded as acknowledged, every failure as ambiguous (never counted lost).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_tests::ledger::{wait_all_consumed, Consumers};
use narad_tests::{payload, topic_path, Http, Ledger, Method, Report};
use tokio::task::JoinHandle;

/// Producers pause while this many acknowledged messages are unconsumed, so the final drain
/// stays bounded on a 2-core machine.
pub const MAX_BACKLOG: usize = 5000;
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Load {
    pub ledger: Arc<Ledger>,
    urls: Vec<String>,
    topic: String,
    stop: Arc<AtomicBool>,
    producers: Vec<JoinHandle<()>>,
    consumers: Vec<Consumers>,
}

impl Load {
    /// `producers` producers spread round-robin over `urls`, and `consumers_per_node`
    /// consume+ack loops on each node.
    pub fn start(urls: &[String], topic: &str, producers: u32, consumers_per_node: usize) -> Load {
        let ledger = Ledger::new();
        let stop = Arc::new(AtomicBool::new(false));
        let producers = (0..producers)
            .map(|p| {
                tokio::spawn(produce_loop(
                    p,
                    urls.to_vec(),
                    topic.to_string(),
                    ledger.clone(),
                    stop.clone(),
                ))
            })
            .collect();
        let consumers = urls
            .iter()
            .map(|u| Consumers::spawn(consumers_per_node, u, topic, &ledger))
            .collect();
        Load {
            ledger,
            urls: urls.to_vec(),
            topic: topic.to_string(),
            stop,
            producers,
            consumers,
        }
    }

    pub fn progress(&self) -> String {
        self.ledger.progress()
    }

    /// Stops the producers (waiting for their last requests).
    pub async fn stop_producing(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for p in self.producers.drain(..) {
            p.await.expect("producer panicked");
        }
    }

    /// Stops producing, waits until every acknowledged message was consumed (at most
    /// `drain`), stops the consumers and returns the ledger's report.
    pub async fn finish(mut self, drain: Duration) -> (Report, anyhow::Result<()>) {
        self.stop_producing().await;
        let drained = wait_all_consumed(&self.ledger, drain).await;
        if drained.is_err() {
            diagnose(&self.urls, &self.topic).await;
        }
        for c in self.consumers.drain(..) {
            c.stop().await;
        }
        (self.ledger.report(), drained)
    }
}

async fn produce_loop(
    producer: u32,
    urls: Vec<String>,
    topic: String,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
) {
    let clients: Vec<Http> = urls.iter().map(Http::new).collect();
    let mut node = producer as usize % clients.len();
    let path = format!("{}/produce", topic_path(&topic));
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if ledger.backlog() > MAX_BACKLOG {
            tokio::time::sleep(Duration::from_millis(10)).await; // backpressure
            continue;
        }
        seq += 1;
        let id = payload::id(producer, seq);
        let r = clients[node]
            .request(Method::POST, path.clone())
            .body(payload::make(producer, seq))
            .timeout(PRODUCE_TIMEOUT)
            .try_send()
            .await;
        match r {
            Ok(r) if r.status == 202 => ledger.record_acked(id),
            Ok(r) if r.status >= 500 => {
                ledger.record_ambiguous(id);
                node = (node + 1) % clients.len();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(r) => {
                ledger.record_ambiguous(id);
                ledger.record_rejected(r.describe());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => {
                ledger.record_ambiguous(id);
                node = (node + 1) % clients.len();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Prints what each node says about the topic and its queues (for a drain that stalled).
pub async fn diagnose(urls: &[String], topic: &str) {
    for (i, u) in urls.iter().enumerate() {
        let http = Http::new(u);
        let t = http
            .request(Method::GET, format!("/v1/topics/{topic}"))
            .timeout(Duration::from_secs(5))
            .try_send()
            .await;
        eprintln!(
            "--- node {i} ({u}) topic: {}",
            t.map(|r| r.text()).unwrap_or_else(|e| e.to_string())
        );
        if let Ok(m) = http
            .request(Method::GET, "/metrics")
            .timeout(Duration::from_secs(5))
            .try_send()
            .await
        {
            for line in m.text().lines() {
                if !line.starts_with('#')
                    && (line.contains("consumer_lag")
                        || line.contains("inflight_size")
                        || line.contains("acked_ahead_size")
                        || line.contains("cluster_members")
                        || line.contains("errors_total")
                        || line.contains("wal_records"))
                {
                    eprintln!("    {line}");
                }
            }
        }
    }
}
