//! Backlog for autoscaling (ext): `GET /v1/topics/{t}` carries a top-level
//! `"backlog": {"messages", "in_flight", "oldest_unacked_age_seconds"}` summed over its
//! partitions (each partition's own in `partition_stats`), and every node exports
//! `narad_topic_backlog_messages{topic}` for its partitions.

use std::time::Duration;

use narad_tests::auth_matrix::add_user;
use narad_tests::*;

async fn backlog(http: &Http, query: &str) -> [u64; 3] {
    let v = http.get_topic("bl", query).await;
    let b = &v["backlog"];
    let n = |k: &str| {
        b[k].as_u64()
            .unwrap_or_else(|| panic!("backlog.{k} missing: {v}"))
    };
    [
        n("messages"),
        n("in_flight"),
        n("oldest_unacked_age_seconds"),
    ]
}

async fn exported(http: &Http) -> Option<f64> {
    let text = http.metrics_text().await;
    metric_sum_where(&text, "narad_topic_backlog_messages", &[("topic", "bl")])
}

#[tokio::test]
async fn backlog_counts_waiting_and_leased_messages_and_the_oldest_age() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "bl", "partitions": 3}))
        .await;
    assert_eq!(backlog(&http, "").await, [0, 0, 0]);
    for i in 0..6 {
        http.produce_ok("bl", &format!("partition={}", i % 3), format!("m{i}"))
            .await;
    }
    http.wait_total_visible("bl", 6).await;
    // The oldest unsettled message is at least a second old after 1.5 s (its commit time is
    // what ages).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let [messages, in_flight, age] = backlog(&http, "").await;
    assert_eq!((messages, in_flight), (6, 0));
    assert!((1..60).contains(&age), "age {age}");

    let a = http.consume_msg("bl", "partition=0").await;
    let b = http.consume_msg("bl", "partition=1").await;
    assert_eq!(&backlog(&http, "").await[..2], &[4, 2][..]);
    http.ack_ok("bl", a.handle()).await;
    assert_eq!(&backlog(&http, "").await[..2], &[4, 1][..]);
    // One partition's view, and the same in its `partition_stats` entry.
    assert_eq!(&backlog(&http, "partition=1").await[..2], &[1, 1][..]);
    let v = http.get_topic("bl", "").await;
    let p1 = &v["partition_stats"][1]["backlog"];
    assert_eq!(
        (p1["messages"].as_u64(), p1["in_flight"].as_u64()),
        (Some(1), Some(1))
    );
    // The exported gauge counts the waiting ones (refreshed when scraped).
    assert_eq!(exported(&http).await, Some(4.0));
    http.ack_ok("bl", b.handle()).await;
    assert_eq!(http.drain("bl", "").await.len(), 4);
    assert_eq!(backlog(&http, "").await, [0, 0, 0]);
    assert_eq!(exported(&http).await, Some(0.0));
}

/// The KEDA examples of the chart's README, as YAML documents.
fn keda_examples() -> Vec<serde_yaml::Value> {
    let readme = include_str!("../../charts/narad/README.md");
    let mut docs = Vec::new();
    for block in readme.split("```yaml\n").skip(1) {
        let yaml = block.split("```").next().unwrap();
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            docs.push(serde::Deserialize::deserialize(doc).unwrap());
        }
    }
    docs
}

/// The triggers of the examples' ScaledObjects, with their type.
fn triggers(docs: &[serde_yaml::Value], kind: &str) -> Vec<serde_yaml::Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some("ScaledObject"))
        .flat_map(|d| d["spec"]["triggers"].as_sequence().unwrap().clone())
        .filter(|t| t["type"].as_str() == Some(kind))
        .collect()
}

#[tokio::test]
async fn the_chart_s_keda_examples_read_what_a_secured_broker_serves() {
    const ROOT_PW: &str = "keda-root-pw";
    let docs = keda_examples();
    let api = triggers(&docs, "metrics-api");
    let prom = triggers(&docs, "prometheus");
    assert_eq!((api.len(), prom.len()), (1, 1), "{docs:?}");
    let (api, prom) = (&api[0]["metadata"], &prom[0]["metadata"]);
    // The metrics-api trigger authenticates with the TriggerAuthentication's username and
    // password, as a user holding only a consume grant on the topic.
    assert_eq!(api["authMode"].as_str(), Some("basic"));
    let auth = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("TriggerAuthentication"))
        .expect("a TriggerAuthentication");
    let params: Vec<&str> = auth["spec"]["secretTargetRef"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r["parameter"].as_str().unwrap())
        .collect();
    assert_eq!(params, ["username", "password"]);

    let server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let admin = Http::new(server.url()).as_user("admin", ROOT_PW);
    let url = api["url"].as_str().unwrap();
    let topic = url.rsplit('/').next().unwrap();
    admin
        .create_topic(&json!({"name": topic, "partitions": 3}))
        .await;
    for i in 0..5 {
        admin.produce_ok(topic, "", format!("m{i}")).await;
    }
    admin.wait_total_visible(topic, 5).await;
    add_user(
        &admin,
        "keda",
        "keda-pw",
        json!([{"action": "consume", "patterns": [topic]}]),
    )
    .await;
    let keda = Http::new(server.url()).as_user("keda", "keda-pw");
    let path = url.split_once("7942").unwrap().1;
    let answer = keda.get(path).await.expect_json(200);
    let mut v = &answer;
    for k in api["valueLocation"].as_str().unwrap().split('.') {
        v = &v[k];
    }
    assert_eq!(v.as_u64(), Some(5), "{answer}");

    // The Prometheus query's metric, for the same topic, is exported.
    let query = prom["query"].as_str().unwrap();
    assert!(query.contains(&format!("topic=\"{topic}\"")), "{query}");
    let metric = query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("narad_"))
        .unwrap();
    let text = admin.metrics_text().await;
    assert_eq!(
        metric_sum_where(&text, metric, &[("topic", topic)]),
        Some(5.0),
        "{metric}"
    );
}
