//! The chart's Grafana dashboard (`charts/narad/dashboards/narad.json`) queries only what a
//! node exports: a node is put through produce, consume, settles, refusals, a dead-lettered
//! message, a local and a remote child, then every metric the dashboard names must be among
//! the series of its `/metrics`, and every label a query groups by must be on the metric it
//! groups.

use std::collections::BTreeSet;
use std::time::Duration;

use narad_tests::*;

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../charts/narad/dashboards/narad.json"
);

/// The metric names in a PromQL expression.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("narad_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        out.push(name);
    }
    out
}

/// The labels of every `by (…)` of a PromQL expression.
fn grouped_by(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("by (") {
        let inner = &rest[i + 4..];
        let end = inner.find(')').unwrap();
        out.extend(inner[..end].split(',').map(|l| l.trim().to_string()));
        rest = &inner[end..];
    }
    out
}

/// Every PromQL query of the dashboard (panel targets and template variables), with the
/// panel's title.
fn queries(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            out.push((format!("variable {}", v["name"]), q.to_string()));
        }
    }
    out
}

#[test]
fn the_dashboard_is_well_formed() {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    assert_eq!(d["uid"], "narad-overview");
    let panels = d["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    for p in panels {
        let g = &p["gridPos"];
        assert!(
            g["x"].as_u64().unwrap() + g["w"].as_u64().unwrap() <= 24,
            "{p}"
        );
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            assert!(
                !p["targets"].as_array().unwrap().is_empty(),
                "{}",
                p["title"]
            );
        }
    }
    // What the issue asks the dashboard to show, by the metric that shows it.
    let all: String = queries(&d).into_iter().map(|(_, q)| q + "\n").collect();
    for m in [
        "narad_messages_produced_total",
        "narad_messages_consumed_total",
        "narad_http_request_duration_seconds_bucket",
        "narad_topic_backlog_messages",
        "narad_inflight_size",
        "narad_wal_group_commits_total",
        "narad_storage_fsync_duration_seconds_bucket",
        "narad_fanout_lag_messages",
        "narad_raft_is_leader",
        "narad_cluster_members",
        "narad_errors_total",
        "narad_dead_lettered_messages_total",
    ] {
        assert!(all.contains(m), "the dashboard does not show {m}");
    }
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "dash", "partitions": 3, "schema": {"type": "object"}}))
        .await;
    http.create_topic_named("dash-copy").await;
    http.post_json(
        format!("{}/children", topic_path("dash")),
        &json!({"child": "dash-copy"}),
    )
    .await
    .expect(200);
    // A remote child whose cluster is not there: its sends fail and are counted.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    http.post_json(
        format!("{}/children", topic_path("dash")),
        &json!({"child": "dash-dr", "remote": {"url": dead}}),
    )
    .await
    .expect(200);

    for i in 0..5 {
        http.produce_ok("dash", "partition=0", format!("{{\"n\":{i}}}"))
            .await;
    }
    http.produce("dash", "", "not json").await.expect_error(400);
    http.wait_visible("dash", 0, 5).await;
    let a = http.consume_msg("dash", "partition=0&wait=5s").await;
    http.ack("dash", a.handle(), Some("true")).await.expect(204);
    http.ack("dash", a.handle(), Some("0")).await.expect(204);
    http.ack("dash", a.handle(), None).await.expect_error(410);
    let b = http.consume_msg("dash", "partition=0&wait=5s").await;
    http.ack_ok("dash", b.handle()).await;
    http.consume_msg("dash-copy", "wait=5s").await;
    http.consume_none("dash", "partition=2&wait=0").await;
    // A message past its deliveries goes to the dead-letter topic.
    http.create_topic_named("dash-dlq").await;
    http.create_topic(
        &json!({"name": "dash-poison", "dead_letter": {"topic": "dash-dlq", "max_deliveries": 1}}),
    )
    .await;
    http.produce_ok("dash-poison", "", "poison").await;
    let p = http.consume_msg("dash-poison", "wait=5s").await;
    http.ack("dash-poison", p.handle(), Some("0"))
        .await
        .expect(204);
    http.consume_none("dash-poison", "wait=0").await;

    let d: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let wanted: BTreeSet<String> = queries(&d)
        .iter()
        .flat_map(|(_, q)| metrics_in(q))
        .collect();
    // Some series appear only once their event happened (a failed remote send is retried
    // with backoff): wait until every one is there.
    let text = eventually(Duration::from_secs(20), Duration::from_millis(200), || {
        let http = &http;
        let wanted = &wanted;
        async move {
            let text = http.metrics_text().await;
            let have = series(&text);
            let missing: Vec<&String> = wanted.iter().filter(|m| !have.contains_key(*m)).collect();
            if missing.is_empty() {
                Ok(text)
            } else {
                Err(anyhow::anyhow!("not exported: {missing:?}"))
            }
        }
    })
    .await;
    let have = series(&text);
    for (title, q) in queries(&d) {
        let labels: BTreeSet<String> = metrics_in(&q)
            .iter()
            .flat_map(|m| have[m].iter().cloned())
            .collect();
        for l in grouped_by(&q) {
            assert!(
                l == "le" || l == "instance" || labels.contains(&l),
                "{title}: groups by {l}, which {:?} do not carry: {q}",
                metrics_in(&q)
            );
        }
    }
    eprintln!(
        "{} queries over {} metrics, all exported",
        queries(&d).len(),
        wanted.len()
    );
}
