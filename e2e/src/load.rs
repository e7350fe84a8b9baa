//! Sustained produce and consume spread over a cluster's nodes, with the durability ledger.
//!
//! Producers send unique self-checking payloads; a producer whose node refuses or drops the
//! connection moves to the next node (as a client behind a Service would reach another pod).
//! Every `202` is recorded as acknowledged, every failure as ambiguous (never counted lost).

use std::sync::Arc;
use std::time::Duration;

use narad_tests::ledger::{wait_all_consumed, Consumers, ProduceSpec, Producers};
use narad_tests::{Http, Ledger, Method, Report};

/// Producers pause while this many acknowledged messages are unconsumed, so the final drain
/// stays bounded on a 2-core machine.
pub const MAX_BACKLOG: usize = 5000;

pub struct Load {
    pub ledger: Arc<Ledger>,
    urls: Vec<String>,
    topic: String,
    producers: Option<Producers>,
    consumers: Vec<Consumers>,
    /// Child topics consumed too: every message acknowledged by the parent must reach each.
    children: Vec<(String, Arc<Ledger>, Vec<Consumers>)>,
}

impl Load {
    /// `producers` producers spread round-robin over `urls`, and `consumers_per_node`
    /// consume+ack loops on each node.
    pub fn start(urls: &[String], topic: &str, producers: u32, consumers_per_node: usize) -> Load {
        Load::start_with_children(urls, topic, &[], producers, consumers_per_node)
    }

    /// Like [`Load::start`], and also consumes the (attached) child topics `children`, each
    /// with its own ledger fed by the parent's acknowledgements.
    pub fn start_with_children(
        urls: &[String],
        topic: &str,
        children: &[&str],
        producers: u32,
        consumers_per_node: usize,
    ) -> Load {
        let ledger = Ledger::new();
        let child_ledgers: Vec<Arc<Ledger>> = children.iter().map(|_| Ledger::new()).collect();
        let mut ledgers = vec![ledger.clone()];
        ledgers.extend(child_ledgers.iter().cloned());
        let spec = ProduceSpec {
            urls: urls.to_vec(),
            topic: topic.to_string(),
            ledgers,
            max_backlog: MAX_BACKLOG,
            key_every: None,
            on_send: None,
        };
        let producers = Some(Producers::spawn(producers, &spec));
        let spawn = |t: &str, l: &Arc<Ledger>| -> Vec<Consumers> {
            urls.iter()
                .map(|u| Consumers::spawn(consumers_per_node, u, t, l))
                .collect()
        };
        let consumers = spawn(topic, &ledger);
        let children = children
            .iter()
            .zip(child_ledgers)
            .map(|(c, l)| (c.to_string(), l.clone(), spawn(c, &l)))
            .collect();
        Load {
            ledger,
            urls: urls.to_vec(),
            topic: topic.to_string(),
            producers,
            consumers,
            children,
        }
    }

    pub fn progress(&self) -> String {
        self.ledger.progress()
    }

    /// Stops the producers (waiting for their last requests).
    pub async fn stop_producing(&mut self) {
        if let Some(p) = self.producers.take() {
            p.stop().await;
        }
    }

    /// Stops producing, waits until every acknowledged message was consumed (at most
    /// `drain`), stops the consumers and returns the ledger's report.
    pub async fn finish(self, drain: Duration) -> (Report, anyhow::Result<()>) {
        let mut all = self.finish_all(drain).await;
        let (_, report, drained) = all.remove(0);
        (report, drained)
    }

    /// [`Load::finish`] for the topic and each child topic, in that order: (topic, report,
    /// drained).
    pub async fn finish_all(
        mut self,
        drain: Duration,
    ) -> Vec<(String, Report, anyhow::Result<()>)> {
        self.stop_producing().await;
        let mut out = Vec::new();
        let mut topics = vec![(
            self.topic.clone(),
            self.ledger.clone(),
            std::mem::take(&mut self.consumers),
        )];
        topics.append(&mut self.children);
        for (topic, ledger, consumers) in topics {
            let drained = wait_all_consumed(&ledger, drain).await;
            if drained.is_err() {
                diagnose(&self.urls, &topic).await;
            }
            for c in consumers {
                c.stop().await;
            }
            out.push((topic, ledger.report(), drained));
        }
        out
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
