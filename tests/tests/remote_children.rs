//! Remote children (SPEC §5.5, §3.7 ext): a topic copied to a topic of another Narad through
//! its public HTTP API. Two real `narad` processes on loopback, one of them the remote:
//! what is copied (everything committed after the attach, keys and exact payloads), the
//! remote going down (kill -9) and coming back (nothing lost), bad credentials (`blocked`,
//! nothing skipped, everything arrives once fixed), a record the remote refuses on its own
//! (skipped, counted), the single-produce fallback against a remote without the batch route,
//! every `400`/`404`/`409` of the attach, and credentials never returned or logged.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_tests::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Copies after a fault: the longest backoff step (30 s) or the blocked retry (30 s), plus
/// a margin for a loaded CI machine.
const RECOVER_TIMEOUT: Duration = Duration::from_secs(75);
const COPY_TIMEOUT: Duration = Duration::from_secs(30);
const SECRET: &str = "Rem0te-Pa55word-xyzzy";
const REMOTE_USER: &str = "replicator-dr";

fn children_path(parent: &str) -> String {
    format!("{}/children", topic_path(parent))
}

async fn attach(http: &Http, parent: &str, body: &Value) -> Resp {
    http.post_json(children_path(parent), body).await
}

/// The `children` entry named `name` of `parent`.
async fn child_entry(http: &Http, parent: &str, name: &str) -> Value {
    let list = http.get(children_path(parent)).await.expect_json(200);
    list["children"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == json!(name)).cloned())
        .unwrap_or_else(|| panic!("{name} not among the children of {parent}: {list}"))
}

/// Waits until the link's `state` is `want` (and returns the entry).
async fn wait_state(http: &Http, parent: &str, link: &str, want: &str, timeout: Duration) -> Value {
    eventually(timeout, Duration::from_millis(100), || async {
        let c = child_entry(http, parent, link).await;
        anyhow::ensure!(c["state"] == json!(want), "waiting for state {want}: {c}");
        Ok(c)
    })
    .await
}

/// Every retained message of `topic` by replay: (payload bytes, key) in partition/offset order.
async fn replay_all(http: &Http, topic: &str) -> Vec<Msg> {
    let mut out = Vec::new();
    for s in http.partition_stats(topic).await {
        let p = s["index"].as_u64().unwrap();
        let (from, to) = (
            s["oldest_offset"].as_u64().unwrap(),
            s["high_watermark"].as_u64().unwrap(),
        );
        for o in from..to {
            let r = http
                .consume(topic, &format!("partition={p}&offset={o}"))
                .await;
            r.expect(200);
            out.push(Msg::parse(&r.body).unwrap());
        }
    }
    out
}

async fn total(http: &Http, topic: &str) -> anyhow::Result<u64> {
    Ok(http.high_watermarks(topic).await?.values().sum())
}

/// Waits until every id of `want` is in `topic` on the remote (duplicates allowed:
/// at-least-once); returns the messages by id (the first copy).
async fn wait_all_arrived(
    http: &Http,
    topic: &str,
    want: &BTreeSet<String>,
    timeout: Duration,
) -> BTreeMap<String, Msg> {
    eventually(timeout, Duration::from_millis(200), || async {
        let n = total(http, topic).await?;
        anyhow::ensure!(
            n >= want.len() as u64,
            "{topic}: {n} of {} records",
            want.len()
        );
        let mut got = BTreeMap::new();
        for m in replay_all(http, topic).await {
            let id = String::from_utf8_lossy(&m.payload_bytes()).into_owned();
            got.entry(id).or_insert(m);
        }
        let missing: Vec<&String> = want.iter().filter(|id| !got.contains_key(*id)).collect();
        anyhow::ensure!(missing.is_empty(), "{topic}: missing {missing:?}");
        Ok(got)
    })
    .await
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET),
        "{what} shows the remote password: {text}"
    );
    assert!(
        !text.contains(REMOTE_USER),
        "{what} shows the remote username: {text}"
    );
}

#[tokio::test]
async fn copies_every_later_message_with_keys_and_exact_payloads() {
    let (local, remote) = tokio::join!(Server::start_default(), Server::start_default());
    let a = Http::new(local.url());
    let b = Http::new(remote.url());
    a.create_topic(&json!({"name": "orders", "partitions": 3}))
        .await;
    b.create_topic(&json!({"name": "orders-copy", "partitions": 4}))
        .await;

    for i in 0..20 {
        a.produce_ok("orders", &format!("key=pre-{i}"), format!("pre-{i}"))
            .await;
    }
    a.wait_total_visible("orders", 20).await;

    let rec = attach(
        &a,
        "orders",
        &json!({"child": "dr", "remote": {"url": format!("{}/", remote.url()), "topic": "orders-copy"}}),
    )
    .await
    .expect_json(200);
    assert_eq!(rec["name"], json!("orders"), "{rec}");
    assert_eq!(rec["role"], json!("parent"), "{rec}");
    assert_eq!(rec["remote_children"], json!(["dr"]), "{rec}");
    assert!(rec.get("children").is_none(), "no local children: {rec}");
    let got = a.get_topic("orders", "").await;
    assert_eq!(got["remote_children"], json!(["dr"]), "{got}");

    // JSON payloads (with inner whitespace), text and binary; keyed, unkeyed, non-UTF-8 keys.
    let mut want: BTreeMap<String, (Vec<u8>, Option<Vec<u8>>)> = BTreeMap::new();
    for i in 0..90u32 {
        let payload: Vec<u8> = match i % 3 {
            0 => format!("{{\"id\": \"j-{i}\", \"list\": [1, 2]}}").into_bytes(),
            1 => format!("t-{i}").into_bytes(),
            _ => {
                let mut b = format!("b-{i}").into_bytes();
                b.extend_from_slice(&[0xff, 0x00, 0xfe]);
                b
            }
        };
        let key: Option<Vec<u8>> = match i % 4 {
            0 => None,
            1 => Some(format!("cust-{i}").into_bytes()),
            2 => Some(vec![0xc3, 0x28, i as u8]),
            _ => Some(format!("k {i}/ü").into_bytes()),
        };
        let query = key
            .as_ref()
            .map(|k| format!("key={}", pct_bytes(k)))
            .unwrap_or_default();
        a.produce_ok("orders", &query, payload.clone()).await;
        want.insert(id_of(&payload), (payload, key));
    }
    let ids: BTreeSet<String> = want.keys().cloned().collect();
    let got = wait_all_arrived(&b, "orders-copy", &ids, COPY_TIMEOUT).await;
    let all = replay_all(&b, "orders-copy").await;
    assert_eq!(all.len(), 90, "exactly one copy each without faults");
    for m in &all {
        let body = m.payload_bytes();
        assert!(
            !body.starts_with(b"pre-"),
            "copied from before the attach: {}",
            m.json
        );
    }
    for (id, (payload, key)) in &want {
        let m = &got[id];
        if let Some(p) = m.payload_problem(payload) {
            panic!("{id}: {p}");
        }
        if let Some(p) = m.key_problem(key.as_deref()) {
            panic!("{id}: {p}");
        }
        if key.is_some() {
            assert_eq!(
                m.partition,
                partition_for_key(key.as_ref().unwrap(), 4) as u64,
                "the remote placed a keyed copy by its key: {}",
                m.json
            );
        }
    }

    let c = eventually(COPY_TIMEOUT, Duration::from_millis(100), || async {
        let c = child_entry(&a, "orders", "dr").await;
        anyhow::ensure!(c["lag_messages"] == json!(0), "{c}");
        Ok(c)
    })
    .await;
    assert_eq!(
        c,
        json!({"name": "dr", "delay_ms": 0, "lag_messages": 0, "lag_complete": true, "kind": "remote",
               "remote": {"url": remote.url(), "topic": "orders-copy"}, "state": "ok"})
    );
    let text = a.get("/metrics").await.text();
    assert_eq!(
        metric_sum_where(
            &text,
            "narad_fanout_committed_total",
            &[("parent", "orders"), ("child", "dr")]
        ),
        Some(90.0)
    );

    // Detach stops the copy at once; the remote topic keeps what it has.
    a.delete(format!("{}/dr", children_path("orders")))
        .await
        .expect(204);
    a.delete(format!("{}/dr", children_path("orders")))
        .await
        .expect_error(404);
    let rec = a.get_topic("orders", "").await;
    assert!(rec.get("remote_children").is_none(), "{rec}");
    assert_eq!(rec["role"], json!("standalone"), "{rec}");
    a.produce_ok("orders", "", "after-detach").await;
    a.wait_total_visible("orders", 111).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(total(&b, "orders-copy").await.unwrap(), 90);
}

#[tokio::test]
async fn remote_down_and_back_loses_nothing() {
    let (local, mut remote) = tokio::join!(Server::start_default(), Server::start_default());
    let a = Http::new(local.url());
    let b = Http::new(remote.url());
    a.create_topic(&json!({"name": "src", "partitions": 3}))
        .await;
    b.create_topic(&json!({"name": "src", "partitions": 3}))
        .await;
    // The remote topic defaults to the link name.
    attach(
        &a,
        "src",
        &json!({"child": "src", "remote": {"url": remote.url()}}),
    )
    .await
    .expect(200);
    let mut ids = BTreeSet::new();
    for i in 0..40 {
        let id = format!("m-{i:04}");
        a.produce_ok("src", &format!("key=k{}", i % 7), id.clone())
            .await;
        ids.insert(id);
    }
    wait_all_arrived(&b, "src", &ids, COPY_TIMEOUT).await;

    remote.kill9();
    for i in 40..160 {
        let id = format!("m-{i:04}");
        let q = if i % 2 == 0 {
            format!("key=k{}", i % 7)
        } else {
            String::new()
        };
        a.produce_ok("src", &q, id.clone()).await;
        ids.insert(id);
    }
    let c = wait_state(&a, "src", "src", "retrying", COPY_TIMEOUT).await;
    assert!(
        c["last_error"].as_str().is_some_and(|e| !e.is_empty()),
        "a retrying link says why: {c}"
    );
    assert!(c["lag_messages"].as_u64().unwrap() > 0, "{c}");

    remote.restart().await;
    wait_all_arrived(&b, "src", &ids, RECOVER_TIMEOUT).await;
    let c = wait_state(&a, "src", "src", "ok", COPY_TIMEOUT).await;
    assert!(c.get("last_error").is_none(), "{c}");
    let text = a.get("/metrics").await.text();
    let errors = metric_sum_where(
        &text,
        "narad_remote_child_send_errors_total",
        &[("parent", "src"), ("child", "src")],
    );
    assert!(
        errors.unwrap_or(0.0) >= 1.0,
        "send errors counted: {errors:?}"
    );
    let dropped = metric_sum_where(
        &text,
        "narad_fanout_child_dropped_messages_total",
        &[("parent", "src")],
    );
    assert!(
        dropped.unwrap_or(0.0) == 0.0,
        "nothing dropped: {dropped:?}"
    );
}

#[tokio::test]
async fn cursors_survive_kill9_of_the_parent_node() {
    let (mut local, remote) = tokio::join!(Server::start_default(), Server::start_default());
    let a = Http::new(local.url());
    let b = Http::new(remote.url());
    a.create_topic(&json!({"name": "jobs", "partitions": 3}))
        .await;
    b.create_topic(&json!({"name": "jobs", "partitions": 3}))
        .await;
    attach(
        &a,
        "jobs",
        &json!({"child": "jobs", "remote": {"url": remote.url()}}),
    )
    .await
    .expect(200);
    let mut ids = BTreeSet::new();
    for round in 0..3 {
        for i in 0..100 {
            let id = format!("r{round}-{i:03}");
            a.produce_ok("jobs", "", id.clone()).await;
            ids.insert(id);
        }
        // Killed while copying (or just after): the cursor resumes from its durable
        // position, so everything arrives (a re-sent batch may duplicate).
        local.kill9();
        local.restart().await;
    }
    wait_all_arrived(&b, "jobs", &ids, COPY_TIMEOUT).await;
    let c = wait_state(&a, "jobs", "jobs", "ok", COPY_TIMEOUT).await;
    assert_eq!(
        c["remote"],
        json!({"url": remote.url(), "topic": "jobs"}),
        "{c}"
    );
}

#[tokio::test]
async fn bad_credentials_block_skip_nothing_and_recover_once_fixed() {
    let (local, remote) = tokio::join!(
        Server::start(ServerOpts::secured("local-admin-pw")),
        Server::start(ServerOpts::secured("remote-admin-pw"))
    );
    let a = Http::new(local.url()).as_user("admin", "local-admin-pw");
    let b = Http::new(remote.url()).as_user("admin", "remote-admin-pw");
    a.create_topic_named("events").await;
    a.create_topic_named("events-local").await;
    b.create_topic_named("events-dr").await;
    attach(&a, "events", &json!({"child": "events-local"}))
        .await
        .expect(200);
    let r = attach(
        &a,
        "events",
        &json!({"child": "events-dr", "remote": {"url": remote.url(),
               "username": REMOTE_USER, "password": SECRET}}),
    )
    .await;
    assert_no_secret("the attach answer", &r.text());
    r.expect(200);
    let mut ids = BTreeSet::new();
    for i in 0..30 {
        let id = format!("e-{i:03}");
        a.produce_ok("events", &format!("key=k{i}"), id.clone())
            .await;
        ids.insert(id);
    }
    // Unknown user on the remote: 401 → blocked, nothing copied, nothing skipped. (Lag
    // counts committed parent records: the last produces may still be on their way from the
    // WAL to the parent partition when the link reports blocked.)
    let c = eventually(COPY_TIMEOUT, Duration::from_millis(100), || async {
        let c = child_entry(&a, "events", "events-dr").await;
        anyhow::ensure!(
            c["state"] == json!("blocked") && c["lag_messages"] == json!(30),
            "waiting for blocked with all 30 lagging: {c}"
        );
        Ok(c)
    })
    .await;
    assert!(
        c["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("401")),
        "{c}"
    );
    assert_eq!(total(&b, "events-dr").await.unwrap(), 0);
    // A blocked remote link holds up nothing else: a local child of the same parent gets
    // every message.
    let local_child = child_entry(&a, "events", "events-local").await;
    assert_eq!(local_child["kind"], json!("fanout"), "{local_child}");
    eventually(COPY_TIMEOUT, Duration::from_millis(100), || async {
        let n = total(&a, "events-local").await?;
        anyhow::ensure!(n == 30, "events-local: {n} of 30");
        Ok(())
    })
    .await;

    // The user exists but may not produce there: 403, still blocked.
    b.post_json(
        "/v1/users",
        &json!({"username": REMOTE_USER, "password": SECRET}),
    )
    .await
    .expect(201);
    eventually(RECOVER_TIMEOUT, Duration::from_millis(200), || async {
        let c = child_entry(&a, "events", "events-dr").await;
        anyhow::ensure!(
            c["state"] == json!("blocked")
                && c["last_error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("403")),
            "{c}"
        );
        Ok(())
    })
    .await;
    assert_eq!(total(&b, "events-dr").await.unwrap(), 0);

    // The grant fixes it: everything arrives, in full.
    b.request(Method::PUT, format!("/v1/users/{REMOTE_USER}/grants"))
        .json(&json!({"grants": [{"action": "produce", "patterns": ["events-dr"]}]}))
        .send()
        .await
        .expect(200);
    let got = wait_all_arrived(&b, "events-dr", &ids, RECOVER_TIMEOUT).await;
    assert_eq!(got.len(), 30);
    for (id, m) in &got {
        let i: u32 = id[2..].parse().unwrap();
        assert_eq!(
            m.key.as_deref(),
            Some(format!("k{i}").as_str()),
            "{}",
            m.json
        );
    }
    let c = wait_state(&a, "events", "events-dr", "ok", COPY_TIMEOUT).await;
    assert_eq!(
        c["remote"],
        json!({"url": remote.url(), "topic": "events-dr"})
    );

    // Credentials never come back, and never reach the log.
    for path in [
        children_path("events"),
        topic_path("events"),
        "/v1/topics".to_string(),
        "/metrics".to_string(),
    ] {
        assert_no_secret(&path, &a.get(path.as_str()).await.text());
    }
    let log = std::fs::read_to_string(local.log_path()).unwrap();
    assert!(!log.contains(SECRET), "the password reached the log");
    let basic = basic_auth(REMOTE_USER, SECRET);
    assert!(
        !log.contains(&basic["Basic ".len()..]),
        "the credentials reached the log"
    );
}

#[tokio::test]
async fn a_record_refused_alone_is_skipped_and_counted() {
    let (local, remote) = tokio::join!(Server::start_default(), Server::start_default());
    let a = Http::new(local.url());
    let b = Http::new(remote.url());
    a.create_topic(&json!({"name": "mixed", "partitions": 3}))
        .await;
    b.create_topic(&json!({"name": "objects", "schema": {"type": "object"}}))
        .await;
    attach(
        &a,
        "mixed",
        &json!({"child": "objs", "remote": {"url": remote.url(), "topic": "objects"}}),
    )
    .await
    .expect(200);
    // All on one parent partition, so they travel in one batch; #5 breaks the schema.
    let mut ids = BTreeSet::new();
    for i in 0..10 {
        let body = if i == 5 {
            "[\"not an object\"]".to_string()
        } else {
            let id = format!("{{\"id\":\"o-{i}\"}}");
            ids.insert(id.clone());
            id
        };
        a.produce_ok("mixed", "partition=1", body).await;
    }
    wait_all_arrived(&b, "objects", &ids, COPY_TIMEOUT).await;
    let c = eventually(COPY_TIMEOUT, Duration::from_millis(100), || async {
        let c = child_entry(&a, "mixed", "objs").await;
        anyhow::ensure!(c["lag_messages"] == json!(0), "{c}");
        Ok(c)
    })
    .await;
    assert_eq!(c["state"], json!("ok"), "a skip does not block: {c}");
    assert_eq!(total(&b, "objects").await.unwrap(), 9);
    let text = a.get("/metrics").await.text();
    assert_eq!(
        metric_sum_where(
            &text,
            "narad_fanout_child_dropped_messages_total",
            &[("parent", "mixed"), ("child", "objs")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_sum_where(
            &text,
            "narad_remote_child_send_errors_total",
            &[("child", "objs"), ("reason", "rejected")]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn falls_back_to_single_produce_without_the_batch_route() {
    let local = Server::start_default().await;
    let a = Http::new(local.url());
    let fake = FakeRemote::start().await;
    a.create_topic(&json!({"name": "old", "partitions": 3}))
        .await;
    attach(
        &a,
        "old",
        &json!({"child": "legacy", "remote": {"url": fake.url(),
          "username": REMOTE_USER, "password": SECRET}}),
    )
    .await
    .expect(200);
    let mut want = BTreeSet::new();
    for i in 0..25 {
        let key = if i % 2 == 0 {
            format!("key=k%20{i}")
        } else {
            String::new()
        };
        a.produce_ok("old", &key, format!("{{\"n\":{i}}}")).await;
        want.insert((
            format!("{{\"n\":{i}}}"),
            (i % 2 == 0).then(|| format!("k {i}")),
        ));
    }
    let got = eventually(COPY_TIMEOUT, Duration::from_millis(100), || async {
        let got: BTreeSet<(String, Option<String>)> = fake
            .singles()
            .into_iter()
            .map(|r| (String::from_utf8_lossy(&r.body).into_owned(), r.key))
            .collect();
        anyhow::ensure!(
            got.is_superset(&want),
            "{} of {} arrived",
            got.len(),
            want.len()
        );
        Ok(got)
    })
    .await;
    assert_eq!(got, want);
    let c = wait_state(&a, "old", "legacy", "ok", COPY_TIMEOUT).await;
    assert_eq!(c["lag_messages"], json!(0), "{c}");
    let reqs = fake.requests();
    assert!(
        reqs.iter().any(|r| r.path.ends_with("/produce/batch")),
        "batch tried first"
    );
    for r in &reqs {
        assert_eq!(
            r.path.split('?').next().unwrap().trim_end_matches("/batch"),
            "/v1/topics/legacy/produce"
        );
        assert_eq!(
            r.auth.as_deref(),
            Some(basic_auth(REMOTE_USER, SECRET).as_str()),
            "credentials sent"
        );
    }
    // Once the route is known missing, records go one by one (no batch per record).
    let batches = reqs.iter().filter(|r| r.path.ends_with("/batch")).count();
    assert!(batches <= 3, "{batches} batch attempts for 25 records");
}

#[tokio::test]
async fn attach_refusals_and_credentials_never_returned() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let mut c = Checks::new("remote attach refusals");
    for name in ["p", "c", "q", "free"] {
        http.create_topic_named(name).await;
    }
    attach(&http, "p", &json!({"child": "c"})).await.expect(200);
    let url = "http://127.0.0.1:9";
    for (label, body) in [
        ("no url", json!({"child": "dr", "remote": {}})),
        ("empty url", json!({"child": "dr", "remote": {"url": ""}})),
        (
            "relative url",
            json!({"child": "dr", "remote": {"url": "dr.example.com"}}),
        ),
        (
            "ftp url",
            json!({"child": "dr", "remote": {"url": "ftp://dr.example.com"}}),
        ),
        (
            "credentials in the url",
            json!({"child": "dr", "remote": {"url": "https://u:p@dr.example.com"}}),
        ),
        (
            "query in the url",
            json!({"child": "dr", "remote": {"url": "https://dr.example.com/?a=1"}}),
        ),
        (
            "bad port",
            json!({"child": "dr", "remote": {"url": "http://127.0.0.1:99999"}}),
        ),
        (
            "delay with remote",
            json!({"child": "dr", "delay_ms": 0, "remote": {"url": url}}),
        ),
        (
            "bad link name",
            json!({"child": "d/r", "remote": {"url": url}}),
        ),
        (
            "empty link name",
            json!({"child": "", "remote": {"url": url}}),
        ),
        (
            "bad remote topic",
            json!({"child": "dr", "remote": {"url": url, "topic": "a b"}}),
        ),
        (
            "empty remote topic",
            json!({"child": "dr", "remote": {"url": url, "topic": ""}}),
        ),
        (
            "password without user",
            json!({"child": "dr", "remote": {"url": url, "password": SECRET}}),
        ),
        (
            "bad ca_pem",
            json!({"child": "dr", "remote": {"url": url, "ca_pem": "not a certificate"}}),
        ),
        (
            "unknown remote field",
            json!({"child": "dr", "remote": {"url": url, "token": "x"}}),
        ),
    ] {
        let r = attach(&http, "p", &body).await;
        assert_no_secret(label, &r.text());
        c.error(label, &r, 400);
    }
    c.error(
        "parent missing",
        &attach(
            &http,
            "nope",
            &json!({"child": "dr", "remote": {"url": url}}),
        )
        .await,
        404,
    );
    let ok =
        json!({"child": "dr", "remote": {"url": url, "username": REMOTE_USER, "password": SECRET}});
    let r = attach(&http, "p", &ok).await;
    assert_no_secret("attach answer", &r.text());
    c.status("attach", &r, 200);
    for (label, parent, body) in [
        ("link already attached", "p", ok.clone()),
        (
            "link named like a local child",
            "p",
            json!({"child": "c", "remote": {"url": url}}),
        ),
        (
            "parent is a child",
            "c",
            json!({"child": "x", "remote": {"url": url}}),
        ),
        ("local child named like a link", "p", json!({"child": "dr"})),
    ] {
        if label == "local child named like a link" {
            http.create_topic_named("dr").await;
        }
        c.error(label, &attach(&http, parent, &body).await, 409);
    }
    // Credentials never returned.
    for path in [children_path("p"), topic_path("p"), "/v1/topics".into()] {
        let r = http.get(path.as_str()).await;
        assert_no_secret(&path, &r.text());
    }
    let e = child_entry(&http, "p", "dr").await;
    c.check(
        e["kind"] == json!("remote") && e["remote"] == json!({"url": url, "topic": "dr"}),
        || format!("remote entry: {e}"),
    );
    let rec = http.get_topic("p", "").await;
    c.check(
        rec["children"] == json!(["c"]) && rec["remote_children"] == json!(["dr"]),
        || format!("record: {rec}"),
    );

    // 108 children, local and remote together.
    for i in 0..106 {
        let r = attach(
            &http,
            "free",
            &json!({"child": format!("r{i}"), "remote": {"url": url}}),
        )
        .await;
        r.expect(200);
    }
    http.create_topic_named("local-107").await;
    http.create_topic_named("local-109").await;
    attach(&http, "free", &json!({"child": "local-107"}))
        .await
        .expect(200);
    attach(
        &http,
        "free",
        &json!({"child": "r107", "remote": {"url": url}}),
    )
    .await
    .expect(200);
    c.error(
        "109th remote",
        &attach(
            &http,
            "free",
            &json!({"child": "r108", "remote": {"url": url}}),
        )
        .await,
        409,
    );
    c.error(
        "109th local",
        &attach(&http, "free", &json!({"child": "local-109"})).await,
        409,
    );
    c.error(
        "a parent with only remote children cannot become a child",
        &attach(&http, "q", &json!({"child": "free"})).await,
        409,
    );
    // Detach by link name frees a place.
    http.delete(format!("{}/r0", children_path("free")))
        .await
        .expect(204);
    c.status(
        "after a detach",
        &attach(
            &http,
            "free",
            &json!({"child": "r108", "remote": {"url": url}}),
        )
        .await,
        200,
    );
    // Deleting a parent removes its remote links.
    http.delete(topic_path("p")).await.expect(204);
    http.create_topic_named("p").await;
    let list = http.get(children_path("p")).await.expect_json(200);
    c.check(list["children"] == json!([]), || {
        format!("re-created parent: {list}")
    });
    c.finish();
}

fn id_of(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

/// Percent-encodes any bytes for a query value.
fn pct_bytes(b: &[u8]) -> String {
    b.iter()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                (*c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

/// A request the fake remote received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    key: Option<String>,
    auth: Option<String>,
    body: Vec<u8>,
}

/// A remote that predates the batch route: `404` for `…/produce/batch`, `202` for
/// `…/produce`. Minimal HTTP/1.1 (keep-alive, `Content-Length` bodies).
struct FakeRemote {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeRemote {
    async fn start() -> FakeRemote {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = l.accept().await else {
                    return;
                };
                let seen = s2.clone();
                tokio::spawn(async move {
                    let _ = serve(sock, seen).await;
                });
            }
        });
        FakeRemote { port, seen, task }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn singles(&self) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| !r.path.contains("/batch"))
            .collect()
    }
}

impl Drop for FakeRemote {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(sock: tokio::net::TcpStream, seen: Arc<Mutex<Vec<Seen>>>) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let (mut len, mut auth) = (0usize, None);
        loop {
            let mut h = String::new();
            r.read_line(&mut h).await?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((h, ""));
            match k.to_ascii_lowercase().as_str() {
                "content-length" => len = v.trim().parse().unwrap_or(0),
                "authorization" => auth = Some(v.trim().to_string()),
                _ => {}
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).await?;
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let key = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("key="))
            .map(pct_decode);
        let batch = path.ends_with("/batch");
        seen.lock().unwrap().push(Seen {
            path: path.to_string(),
            key,
            auth,
            body,
        });
        let resp = if batch {
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 25\r\n\r\n{\"error\":\"no such route\"}"
        } else {
            "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"
        };
        w.write_all(resp.as_bytes()).await?;
    }
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap_or(b'?'));
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Issue 12, finding 6 (SSRF): any topic owner could point a remote child at loopback or
/// internal addresses with credentials, and what the target answered came back in
/// `last_error` to users with only a produce grant. Now: without `remotes.allowed_hosts`
/// only an admin attaches remote links; with it, only listed hosts (for everyone); link-local
/// and metadata addresses never; `last_error` only to the owner and admins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_hosts_are_restricted_and_link_errors_are_for_owners() {
    const PW: &str = "local-admin-pw-ssrf";
    let (open, listed, remote) = tokio::join!(
        Server::start(ServerOpts::secured(PW)),
        Server::start(ServerOpts::secured(PW).env("NARAD_REMOTES_ALLOWED_HOSTS", "127.0.0.1")),
        Server::start(ServerOpts::secured("remote-admin-pw"))
    );
    Http::new(remote.url())
        .as_user("admin", "remote-admin-pw")
        .create_topic_named("own-1")
        .await;
    let mut c = Checks::new("remote host policy");
    for (server, configured) in [(&open, false), (&listed, true)] {
        let admin = Http::new(server.url()).as_user("admin", PW);
        for (name, grants) in [
            (
                "owner",
                json!([{"action": "create", "patterns": ["own-*"]}]),
            ),
            (
                "viewer",
                json!([{"action": "produce", "patterns": ["own-1"]}]),
            ),
        ] {
            admin
                .post_json(
                    "/v1/users",
                    &json!({"username": name, "password": "user-pw-1234", "grants": grants}),
                )
                .await
                .expect(201);
        }
        let owner = Http::new(server.url()).as_user("owner", "user-pw-1234");
        owner.create_topic_named("own-1").await;
        let to = |url: &str| json!({"child": "dr", "remote": {"url": url}});
        for url in [
            "http://169.254.169.254/latest/meta-data",
            "http://[::ffff:169.254.169.254]",
            "http://[fe80::1]:7942",
            "http://metadata.google.internal",
            "http://100.100.100.200",
        ] {
            c.error(
                &format!("admin → {url}"),
                &attach(&admin, "own-1", &to(url)).await,
                400,
            );
        }
        let r = attach(&owner, "own-1", &to(&remote.url())).await;
        let link_owner = if configured {
            c.error(
                "owner → a host not listed",
                &attach(
                    &owner,
                    "own-1",
                    &to(&remote.url().replace("127.0.0.1", "localhost")),
                )
                .await,
                403,
            );
            c.status("owner → a listed host", &r, 200);
            &owner
        } else {
            c.error("owner without an allow-list", &r, 403);
            c.status(
                "admin",
                &attach(&admin, "own-1", &to(&remote.url())).await,
                200,
            );
            &admin
        };
        // No credentials: the remote answers 401, the link is blocked with the reason.
        admin.produce_ok("own-1", "", "x").await;
        let e = wait_state(link_owner, "own-1", "dr", "blocked", COPY_TIMEOUT).await;
        c.check(
            e["last_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("401")),
            || format!("owner's view: {e}"),
        );
        let seen = child_entry(&owner, "own-1", "dr").await;
        c.check(seen["last_error"].is_string(), || format!("owner: {seen}"));
        let viewer = Http::new(server.url()).as_user("viewer", "user-pw-1234");
        let seen = child_entry(&viewer, "own-1", "dr").await;
        c.check(
            seen["state"] == json!("blocked") && seen.get("last_error").is_none(),
            || format!("a produce grant sees no remote answer: {seen}"),
        );
    }
    c.finish();
}

/// Issue 12, finding 12: a link's password sat in plaintext in `metastore/raft.redb`. Now
/// only its sealed form is stored: no file under the data dir holds the password, the link
/// copies with it, and still does after a restart (the standalone node's key file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_passwords_are_sealed_at_rest() {
    const PW: &str = "local-admin-pw-sealed";
    let (mut local, remote) = tokio::join!(
        Server::start(ServerOpts::secured(PW)),
        Server::start(ServerOpts::secured("remote-admin-pw"))
    );
    let b = Http::new(remote.url()).as_user("admin", "remote-admin-pw");
    b.create_topic_named("sealed-dr").await;
    b.post_json(
        "/v1/users",
        &json!({"username": REMOTE_USER, "password": SECRET,
                "grants": [{"action": "produce", "patterns": ["sealed-dr"]}]}),
    )
    .await
    .expect(201);
    let a = Http::new(local.url()).as_user("admin", PW);
    a.create_topic_named("sealed").await;
    attach(
        &a,
        "sealed",
        &json!({"child": "sealed-dr", "remote": {"url": remote.url(),
               "username": REMOTE_USER, "password": SECRET}}),
    )
    .await
    .expect(200);
    let mut ids = BTreeSet::new();
    for i in 0..10 {
        let id = format!("s-{i:02}");
        a.produce_ok("sealed", "", id.clone()).await;
        ids.insert(id);
    }
    wait_all_arrived(&b, "sealed-dr", &ids, COPY_TIMEOUT).await;
    let mut files = 0;
    let mut stack = vec![local.data_dir().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
                "{} holds the link's password",
                p.display()
            );
            files += 1;
        }
    }
    assert!(files > 3, "only {files} files under the data dir");
    local.restart().await;
    let a = Http::new(local.url()).as_user("admin", PW);
    for i in 10..20 {
        let id = format!("s-{i:02}");
        a.produce_ok("sealed", "", id.clone()).await;
        ids.insert(id);
    }
    wait_all_arrived(&b, "sealed-dr", &ids, COPY_TIMEOUT).await;
}
