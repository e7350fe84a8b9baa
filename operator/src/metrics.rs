//! The operator's own metrics, served with `/healthz` on `--metrics-addr` (default
//! `0.0.0.0:8080`): reconciliations and their errors and durations per kind, pod deletions
//! of rolling upgrades, claim expansions, and whether this replica leads.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub kind: &'static str,
    /// `ok`, or the error class (`kube`, `broker`, `finalizer`, `waiting`, `invalid`).
    pub result: &'static str,
}

/// The operator's metrics (prefix `narad_operator_`).
pub struct Metrics {
    registry: Registry,
    pub reconciliations: Family<ResultLabels, Counter>,
    pub reconcile_duration: Family<KindLabels, Histogram>,
    pub rollout_pod_deletions: Counter,
    pub volume_expansions: Counter,
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("narad_operator");
        let reconciliations = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconciliations",
            "Reconciliations by kind and outcome (ok or the error class)",
            reconciliations.clone(),
        );
        let reconcile_duration =
            Family::<KindLabels, Histogram>::new_with_constructor(|| -> Histogram {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            });
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconciliation",
            reconcile_duration.clone(),
        );
        let rollout_pod_deletions = Counter::default();
        registry.register(
            "rollout_pod_deletions",
            "Broker pods deleted by rolling upgrades",
            rollout_pod_deletions.clone(),
        );
        let volume_expansions = Counter::default();
        registry.register(
            "volume_expansions",
            "Volume claims grown to a larger storage.size",
            volume_expansions.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica leads and runs the controllers",
            leader.clone(),
        );
        Metrics {
            registry,
            reconciliations,
            reconcile_duration,
            rollout_pod_deletions,
            volume_expansions,
            leader,
        }
    }

    /// Records one reconciliation of `kind`.
    pub fn observe(&self, kind: &'static str, result: &'static str, took: Duration) {
        self.reconciliations
            .get_or_create(&ResultLabels { kind, result })
            .inc();
        self.reconcile_duration
            .get_or_create(&KindLabels { kind })
            .observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("invariant: writing to a String cannot fail");
        out
    }
}

/// Serves `GET /metrics` and `GET /healthz` on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move {
                    (
                        [(
                            http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }));
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_reconciliations_by_kind_and_outcome() {
        let m = Metrics::new();
        m.observe("topic", "ok", Duration::from_millis(3));
        m.observe("topic", "broker", Duration::from_millis(30));
        m.rollout_pod_deletions.inc();
        m.leader.set(1);
        let text = m.encode();
        assert!(
            text.contains(r#"narad_operator_reconciliations_total{kind="topic",result="ok"} 1"#),
            "{text}"
        );
        assert!(text
            .contains(r#"narad_operator_reconciliations_total{kind="topic",result="broker"} 1"#));
        assert!(text.contains(r#"narad_operator_reconcile_duration_seconds_count{kind="topic"} 2"#));
        assert!(text.contains("narad_operator_rollout_pod_deletions_total 1"));
        assert!(text.contains("narad_operator_leader 1"));
    }

    #[tokio::test]
    async fn serves_metrics_and_healthz() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let m = Arc::new(Metrics::new());
        m.observe("grant", "ok", Duration::from_millis(1));
        let task = tokio::spawn(serve(l, m));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).await.unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains(r#"kind="grant""#), "{body}");
        task.abort();
    }
}
