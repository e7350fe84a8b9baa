//! Client tests against a tiny in-process HTTP/1.1 server with canned answers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::client::{Client, Replay, Settle};
use crate::types::*;

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

type Answer = (u16, Vec<(&'static str, String)>, String);

/// Starts a server answering each request with `answer(&seen)`; returns its base URL and
/// the log of requests.
async fn serve(answer: fn(&Seen) -> Answer) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let log = log2.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // Read one request.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let mut lines = head.split("\r\n");
                    let mut first = lines.next().unwrap().split(' ');
                    let method = first.next().unwrap().to_string();
                    let target = first.next().unwrap().to_string();
                    let headers: Vec<(String, String)> = lines
                        .filter(|l| !l.is_empty())
                        .map(|l| {
                            let (k, v) = l.split_once(':').unwrap();
                            (k.trim().to_string(), v.trim().to_string())
                        })
                        .collect();
                    let len: usize = headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                        .map(|(_, v)| v.parse().unwrap())
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        let mut chunk = [0u8; 4096];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = buf[head_end..head_end + len].to_vec();
                    buf.drain(..head_end + len);
                    let seen = Seen {
                        method,
                        target,
                        headers,
                        body,
                    };
                    let (status, extra, body) = answer(&seen);
                    log.lock().unwrap().push(seen);
                    let mut resp =
                        format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
                    if !body.is_empty() {
                        resp.push_str("content-type: application/json\r\n");
                    }
                    for (k, v) in extra {
                        resp.push_str(&format!("{k}: {v}\r\n"));
                    }
                    resp.push_str("\r\n");
                    resp.push_str(&body);
                    if sock.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), log)
}

const MSG: &str = r#"{"topic":"orders","partition":1,"offset":42,"key":"customer-42","payload":{"order_id":"ord_123"},"timestamp":1767225601,"receipt_handle":"1:42:7"}"#;

const REC: &str = r#"{"name":"orders","partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1,"role":"standalone"}"#;

fn router(s: &Seen) -> Answer {
    let path = s.target.split('?').next().unwrap();
    let q = s.target.split_once('?').map(|x| x.1).unwrap_or("");
    match (s.method.as_str(), path) {
        ("POST", "/v1/topics/orders/produce") => (202, vec![], String::new()),
        ("POST", "/v1/topics/full/produce") => (
            503,
            vec![("retry-after", "1".into())],
            r#"{"error":"node is being decommissioned and takes no new produce"}"#.into(),
        ),
        ("GET", "/v1/topics/orders/consume") if q.contains("offset=7") => (410, vec![], r#"{"error":"offset gone"}"#.into()),
        ("GET", "/v1/topics/orders/consume") if q.contains("offset=99") => (204, vec![], String::new()),
        ("GET", "/v1/topics/orders/consume") if q.contains("offset=") => (200, vec![], MSG.replace(r#","receipt_handle":"1:42:7""#, "")),
        ("GET", "/v1/topics/orders/consume") if q.contains("max=") => (200, vec![], format!(r#"{{"messages":[{MSG},{MSG}]}}"#)),
        ("GET", "/v1/topics/orders/consume") if q.contains("partition=2") => (204, vec![], String::new()),
        ("GET", "/v1/topics/orders/consume") => (200, vec![], MSG.into()),
        ("GET", "/v1/topics/old/consume") => (200, vec![], MSG.into()),
        ("POST", "/v1/topics/orders/ack") if q.contains("receipt_handle=gone") => {
            (410, vec![], r#"{"error":"lease expired"}"#.into())
        }
        ("POST", "/v1/topics/orders/ack") if q.contains("receipt_handle") => (204, vec![], String::new()),
        ("POST", "/v1/topics/orders/ack") => (200, vec![], r#"{"results":[{"status":204},{"status":410,"error":"lease expired"}]}"#.into()),
        ("GET", "/v1/topics") if q.is_empty() || q == "limit=1000" => (
            200,
            vec![],
            r#"{"topics":[{"name":"a","partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1,"role":"standalone"}],"next_page_token":"a"}"#.into(),
        ),
        ("GET", "/v1/topics") => (
            200,
            vec![],
            r#"{"topics":[{"name":"b","partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1,"role":"standalone"}],"next_page_token":""}"#.into(),
        ),
        ("POST", "/v1/topics/orders/pause") => (200, vec![], REC.replace('}', r#","paused":true}"#)),
        ("POST", "/v1/topics/orders/resume") => (200, vec![], REC.into()),
        ("POST", "/v1/topics/orders/purge") => (
            200,
            vec![],
            r#"{"topic":"orders","partitions":[{"partition":0,"previous_frontier":3,"frontier":10},{"partition":1,"previous_frontier":0,"frontier":0}]}"#.into(),
        ),
        ("POST", "/v1/topics/orders/seek") if s.body.starts_with(b"{\"timestamp\"") => (
            400,
            vec![],
            r#"{"error":"timestamp 99999999999 is after every message"}"#.into(),
        ),
        ("POST", "/v1/topics/orders/seek") => (
            200,
            vec![],
            r#"{"topic":"orders","partitions":[{"partition":1,"previous_frontier":50,"frontier":42}]}"#.into(),
        ),
        ("GET", "/v1/topics/missing") => (404, vec![], r#"{"error":"topic \"missing\" not found"}"#.into()),
        ("GET", "/healthz") => (200, vec![], r#"{"status":"ok"}"#.into()),
        ("GET", "/readyz") => (503, vec![], "proxy says no\n".into()),
        _ => (404, vec![], r#"{"error":"no route"}"#.into()),
    }
}

#[tokio::test]
async fn produce_sends_bytes_key_and_partition() {
    let (base, log) = serve(router).await;
    let c = Client::new(&base, Some(("bob".into(), "pw".into()))).unwrap();
    c.produce(
        "orders",
        b"\x00hi".to_vec(),
        Some(&[0xff, b' ', b'&']),
        Some(2),
    )
    .await
    .unwrap();
    c.produce("orders", "x", Some(b""), None).await.unwrap();
    let seen = log.lock().unwrap().clone();
    assert_eq!(
        seen[0].target,
        "/v1/topics/orders/produce?key=%FF%20%26&partition=2"
    );
    assert_eq!(seen[0].body, b"\x00hi");
    assert_eq!(
        seen[0].header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(seen[0].header("authorization"), Some("Basic Ym9iOnB3"));
    assert!(seen[0].header("x-narad-client").is_some());
    assert_eq!(seen[1].target, "/v1/topics/orders/produce");
    // Empty payloads are refused before sending.
    assert!(c.produce("orders", Vec::new(), None, None).await.is_err());
}

#[tokio::test]
async fn errors_carry_status_message_and_retry_after() {
    let (base, _) = serve(router).await;
    let c = Client::new(&base, None).unwrap();
    let e = c.produce("full", "x", None, None).await.unwrap_err();
    assert_eq!(e.status(), Some(503));
    assert_eq!(e.retry_after(), Some(1));
    assert_eq!(
        e.to_string(),
        "http 503: node is being decommissioned and takes no new produce"
    );
    let e = c.get_topic("missing", None).await.unwrap_err();
    assert_eq!(e.to_string(), "http 404: topic \"missing\" not found");
    let e = c.readyz().await.unwrap_err();
    assert_eq!(e.to_string(), "http 503: proxy says no");
    assert_eq!(c.healthz().await.unwrap().status, "ok");
}

#[tokio::test]
async fn consume_replay_and_settle() {
    let (base, log) = serve(router).await;
    let c = Client::new(&base, None).unwrap();
    let m = c
        .consume("orders", Some(Duration::from_secs(10)), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.offset, 42);
    assert_eq!(m.payload.get(), r#"{"order_id":"ord_123"}"#);
    assert!(c
        .consume("orders", Some(Duration::from_millis(1500)), Some(2))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        c.consume_batch("orders", None, None, 10)
            .await
            .unwrap()
            .len(),
        2
    );
    // An old server answering the single shape to a batch consume.
    assert_eq!(
        c.consume_batch("old", None, None, 10).await.unwrap().len(),
        1
    );

    match c.replay("orders", 1, 42).await.unwrap() {
        Replay::Message(m) => assert!(m.receipt_handle.is_none()),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.replay("orders", 1, 7).await.unwrap(),
        Replay::Gone
    ));
    assert!(matches!(
        c.replay("orders", 1, 99).await.unwrap(),
        Replay::End
    ));

    c.ack("orders", "1:42:7").await.unwrap();
    c.settle("orders", "1:42:7", Settle::Extend).await.unwrap();
    c.nack("orders", "1:42:7").await.unwrap();
    assert_eq!(
        c.ack("orders", "gone").await.unwrap_err().status(),
        Some(410)
    );
    let r = c
        .ack_batch("orders", &["a".to_string(), "b".to_string()])
        .await
        .unwrap();
    assert_eq!(r[1].status, 410);
    // Three results expected, two given: undecodable.
    assert!(c
        .nack_batch("orders", &["a".into(), "b".into(), "c".into()])
        .await
        .is_err());

    let seen = log.lock().unwrap().clone();
    let targets: Vec<&str> = seen.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(targets[0], "/v1/topics/orders/consume?wait=10s");
    assert_eq!(
        targets[1],
        "/v1/topics/orders/consume?partition=2&wait=1.5s"
    );
    assert_eq!(targets[2], "/v1/topics/orders/consume?max=10");
    assert_eq!(
        targets[4],
        "/v1/topics/orders/consume?offset=42&partition=1"
    );
    assert_eq!(
        targets[7],
        "/v1/topics/orders/ack?receipt_handle=1%3A42%3A7"
    );
    assert_eq!(
        targets[8],
        "/v1/topics/orders/ack?extend=true&receipt_handle=1%3A42%3A7"
    );
    assert_eq!(
        targets[9],
        "/v1/topics/orders/ack?extend=0&receipt_handle=1%3A42%3A7"
    );
    assert_eq!(targets[11], "/v1/topics/orders/ack");
    assert_eq!(seen[11].body, br#"{"receipt_handles":["a","b"]}"#);
    assert_eq!(targets[12], "/v1/topics/orders/ack?extend=0");
}

#[tokio::test]
async fn list_follows_pages() {
    let (base, log) = serve(router).await;
    let c = Client::new(&base, None).unwrap();
    let all = c.list_topics().await.unwrap();
    let names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen[1].target, "/v1/topics?limit=1000&page_token=a");
    let _unused: Option<TopicRecord> = None;
}

#[tokio::test]
async fn queue_administration() {
    let (base, log) = serve(router).await;
    let c = Client::new(&base, None).unwrap();
    assert!(c.pause_topic("orders").await.unwrap().paused);
    assert!(!c.resume_topic("orders").await.unwrap().paused);
    let r = c.purge_topic("orders").await.unwrap();
    assert_eq!(r.topic, "orders");
    assert_eq!(
        r.partitions[0],
        PartitionFrontier {
            partition: 0,
            previous_frontier: 3,
            frontier: 10
        }
    );
    let seek = SeekRequest {
        partition: Some(1),
        offset: Some(42),
        timestamp: None,
    };
    let r = c.seek_topic("orders", &seek).await.unwrap();
    assert_eq!(r.partitions[0].frontier, 42);
    let late = SeekRequest {
        timestamp: Some(99_999_999_999),
        ..Default::default()
    };
    let e = c.seek_topic("orders", &late).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "http 400: timestamp 99999999999 is after every message"
    );
    // The topic name is one escaped path segment.
    let e = c.pause_topic("a/b c").await.unwrap_err();
    assert_eq!(e.status(), Some(404));

    let seen = log.lock().unwrap().clone();
    let calls: Vec<(&str, &str)> = seen
        .iter()
        .map(|s| (s.method.as_str(), s.target.as_str()))
        .collect();
    assert_eq!(
        calls,
        [
            ("POST", "/v1/topics/orders/pause"),
            ("POST", "/v1/topics/orders/resume"),
            ("POST", "/v1/topics/orders/purge"),
            ("POST", "/v1/topics/orders/seek"),
            ("POST", "/v1/topics/orders/seek"),
            ("POST", "/v1/topics/a%2Fb%20c/pause"),
        ]
    );
    assert!(seen[2].body.is_empty());
    assert_eq!(seen[3].body, br#"{"partition":1,"offset":42}"#);
    assert_eq!(seen[3].header("content-type"), Some("application/json"));
    assert_eq!(seen[4].body, br#"{"timestamp":99999999999}"#);
}
