//! Topic control plane (SPEC §2.1, §3.1–3.3, §3.11): create, list, get, patch, delete,
//! strict JSON bodies, the uniform error body, unknown routes and wrong methods.

use std::time::Duration;

use narad_tests::*;

const DEFAULT_RETENTION_MS: u64 = 604_800_000;
const DEFAULT_VISIBILITY_MS: u64 = 30_000;
const DEFAULT_CAP: u64 = 1024;
const ONE_HOUR_MS: u64 = 3_600_000;
/// 365 days: within one year under any reading of "1 year".
const ONE_YEAR_MS: u64 = 31_536_000_000;
/// 366 days + 1 ms: over one year under any reading.
const OVER_ONE_YEAR_MS: u64 = 31_622_400_001;
const MIB: usize = 1 << 20;

/// Keys a standalone topic record must not carry with security off (SPEC §3.2).
const ABSENT_ON_STANDALONE: &[&str] = &[
    "owner",
    "children",
    "remote_children",
    "schema",
    "schema_version",
    "parent",
    "attach_epoch",
    "fanout_delay_ms",
];

fn assert_default_record(rec: &Value, name: &str, created_window: (u64, u64)) {
    assert_eq!(rec["name"], json!(name), "{rec}");
    assert_eq!(rec["partitions"], json!(3), "{rec}");
    assert_eq!(rec["retention_ms"], json!(DEFAULT_RETENTION_MS), "{rec}");
    assert_eq!(
        rec["visibility_timeout_ms"],
        json!(DEFAULT_VISIBILITY_MS),
        "{rec}"
    );
    assert_eq!(
        rec["max_in_flight_per_partition"],
        json!(DEFAULT_CAP),
        "{rec}"
    );
    assert_eq!(
        rec["max_acked_ahead_per_partition"],
        json!(DEFAULT_CAP),
        "{rec}"
    );
    assert_eq!(rec["role"], json!("standalone"), "{rec}");
    let created = rec["created_at"]
        .as_u64()
        .unwrap_or_else(|| panic!("created_at not an integer: {rec}"));
    let (lo, hi) = created_window;
    assert!(
        (lo.saturating_sub(1000)..=hi + 1000).contains(&created),
        "created_at {created} should be Unix ms within [{lo}, {hi}]: {rec}"
    );
    for k in ABSENT_ON_STANDALONE {
        assert!(
            rec.get(*k).is_none(),
            "{k} must be omitted on a standalone dev-mode topic: {rec}"
        );
    }
}

#[tokio::test]
async fn create_returns_full_record_with_defaults() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());

    let before = now_ms();
    let r = http
        .post_json("/v1/topics", &json!({"name": "orders"}))
        .await;
    let after = now_ms();
    let rec = r.expect_json(201);
    assert_default_record(&rec, "orders", (before, after));

    // GET returns the same record (plus stats).
    let mut got = http.get_topic("orders", "").await;
    for stat in ["partition_stats", "backlog", "partial"] {
        got.as_object_mut().unwrap().remove(stat);
    }
    assert_eq!(got, rec, "GET record differs from the create answer");

    // A sent owner is ignored (owner = caller; none with security off).
    let rec = http
        .create_topic(&json!({"name": "owned", "owner": "mallory"}))
        .await;
    assert!(
        rec.get("owner").is_none(),
        "owner must be ignored in dev mode: {rec}"
    );

    // Trailing whitespace is not trailing data.
    http.send_raw_json(Method::POST, "/v1/topics", "{\"name\":\"newline\"}\n")
        .await
        .expect(201);
}

#[tokio::test]
async fn create_accepts_explicit_settings_and_boundaries() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());

    let rec = http
        .create_topic(&json!({
            "name": "custom", "partitions": 7, "retention_ms": 0, "visibility_timeout_ms": 1500,
            "max_in_flight_per_partition": 5, "max_acked_ahead_per_partition": 6
        }))
        .await;
    assert_eq!(rec["partitions"], json!(7), "{rec}");
    assert_eq!(
        rec["retention_ms"],
        json!(0),
        "retention 0 means forever: {rec}"
    );
    assert_eq!(rec["visibility_timeout_ms"], json!(1500), "{rec}");
    assert_eq!(rec["max_in_flight_per_partition"], json!(5), "{rec}");
    assert_eq!(rec["max_acked_ahead_per_partition"], json!(6), "{rec}");

    // 0 = default for the visibility timeout and the caps.
    let rec = http
        .create_topic(&json!({"name": "zeros", "visibility_timeout_ms": 0,
            "max_in_flight_per_partition": 0, "max_acked_ahead_per_partition": 0}))
        .await;
    assert_eq!(
        rec["visibility_timeout_ms"],
        json!(DEFAULT_VISIBILITY_MS),
        "{rec}"
    );
    assert_eq!(
        rec["max_in_flight_per_partition"],
        json!(DEFAULT_CAP),
        "{rec}"
    );
    assert_eq!(
        rec["max_acked_ahead_per_partition"],
        json!(DEFAULT_CAP),
        "{rec}"
    );

    let mut c = Checks::new("create boundaries that must be accepted");
    let name200 = "n".repeat(200);
    for (label, body) in [
        ("partitions 3", json!({"name": "p3", "partitions": 3})),
        ("partitions 108", json!({"name": "p108", "partitions": 108})),
        (
            "retention exactly 1 h",
            json!({"name": "r1h", "retention_ms": ONE_HOUR_MS}),
        ),
        (
            "visibility 365 days",
            json!({"name": "v1y", "visibility_timeout_ms": ONE_YEAR_MS}),
        ),
        ("name of 200 bytes", json!({"name": name200})),
        (
            "name with every allowed character class",
            json!({"name": "Az09._-x"}),
        ),
        ("name of three dots", json!({"name": "..."})),
    ] {
        let r = http.post_json("/v1/topics", &body).await;
        if c.status(label, &r, 201) {
            let rec = r.json();
            c.check(rec["name"] == body["name"], || {
                format!("{label}: record name {}", rec["name"])
            });
        }
    }
    c.finish();
    let rec = http.get_topic("p108", "").await;
    assert_eq!(
        rec["partition_stats"].as_array().map(Vec::len),
        Some(108),
        "{rec}"
    );
}

#[tokio::test]
async fn create_rejects_invalid_requests() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let mut c = Checks::new("invalid topic creates");

    let name201 = "n".repeat(201);
    for (label, body) in [
        ("empty name", json!({"name": ""})),
        ("missing name", json!({})),
        ("name of 201 bytes", json!({"name": name201})),
        ("name .", json!({"name": "."})),
        ("name ..", json!({"name": ".."})),
        ("name with /", json!({"name": "a/b"})),
        ("name with space", json!({"name": "a b"})),
        ("name with non-ASCII", json!({"name": "caf\u{e9}"})),
        ("name not a string", json!({"name": 5})),
        ("partitions 2", json!({"name": "bad-p2", "partitions": 2})),
        (
            "partitions 109",
            json!({"name": "bad-p109", "partitions": 109}),
        ),
        (
            "partitions -1",
            json!({"name": "bad-pneg", "partitions": -1}),
        ),
        (
            "partitions as string",
            json!({"name": "bad-pstr", "partitions": "3"}),
        ),
        (
            "retention -1",
            json!({"name": "bad-rneg", "retention_ms": -1}),
        ),
        (
            "retention 1000 (below 1 h)",
            json!({"name": "bad-r1000", "retention_ms": 1000}),
        ),
        (
            "retention 1 h - 1 ms",
            json!({"name": "bad-r1hm", "retention_ms": ONE_HOUR_MS - 1}),
        ),
        (
            "visibility -1",
            json!({"name": "bad-vneg", "visibility_timeout_ms": -1}),
        ),
        (
            "visibility over 1 year",
            json!({"name": "bad-v1y", "visibility_timeout_ms": OVER_ONE_YEAR_MS}),
        ),
        (
            "max_in_flight -1",
            json!({"name": "bad-ifneg", "max_in_flight_per_partition": -1}),
        ),
        (
            "max_acked_ahead -1",
            json!({"name": "bad-aaneg", "max_acked_ahead_per_partition": -1}),
        ),
        ("unknown field", json!({"name": "bad-unknown", "bogus": 1})),
        (
            "fanout_delay_ms without parent",
            json!({"name": "bad-delay", "fanout_delay_ms": 1000}),
        ),
        (
            "invalid schema",
            json!({"name": "bad-schema", "schema": {"type": 5}}),
        ),
        ("body is an array", json!([{"name": "bad-array"}])),
    ] {
        let r = http.post_json("/v1/topics", &body).await;
        c.error(label, &r, 400);
    }
    for (label, raw) in [
        ("trailing data", "{\"name\":\"bad-trailing\"} x"),
        (
            "second JSON value",
            "{\"name\":\"bad-second\"}{\"name\":\"bad-second2\"}",
        ),
        ("not JSON", "name=bad-form"),
        ("truncated JSON", "{\"name\":\"bad-trunc\""),
        ("empty body", ""),
    ] {
        let r = http.send_raw_json(Method::POST, "/v1/topics", raw).await;
        c.error(label, &r, 400);
    }

    // A JSON body over 1 MiB: 413. (On its own client: whether the connection survives a
    // 413 is checked by `connection_stays_usable_after_a_413`.)
    let r = Http::new(server.url())
        .post_json("/v1/topics", &oversized_create())
        .await;
    c.error("JSON body over 1 MiB", &r, 413);

    // Nothing above may have created a topic.
    let list = http.get("/v1/topics").await.expect_json(200);
    c.check(list["topics"] == json!([]), || {
        format!("rejected creates left topics behind: {list}")
    });
    c.finish();
}

fn oversized_create() -> Value {
    json!({"name": "bad-big", "schema": {"description": "x".repeat(MIB)}})
}

/// HTTP/1.1 keep-alive (SPEC §3.1; the Go SDK pools connections): a server that refuses an
/// oversized body must either keep the connection usable or announce `Connection: close`;
/// closing it silently makes the client's next request on that connection fail. Checked on
/// a raw connection, since a pooled client only sees this as a timing-dependent error.
#[tokio::test]
async fn connection_stays_usable_after_a_413() {
    let server = Server::start_default().await;
    Http::new(server.url()).create_topic_named("t").await;
    let mut c = Checks::new("keep-alive after 413");
    for (label, path, body) in [
        (
            "create topic",
            "/v1/topics".to_string(),
            serde_json::to_vec(&oversized_create()).unwrap(),
        ),
        (
            "produce",
            format!("{}/produce", topic_path("t")),
            vec![b'x'; MIB + 1],
        ),
    ] {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", server.port()))
            .await
            .unwrap();
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: narad\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(&body);
        let (head, _) = match narad_tests::http::raw_exchange(&mut conn, &req).await {
            Ok(x) => x,
            Err(e) => {
                c.check(false, || {
                    format!("{label}: no 413 response on the connection: {e}")
                });
                continue;
            }
        };
        c.check(head.starts_with("http/1.1 413"), || {
            format!("{label}: want 413, got {head:?}")
        });
        if head.lines().any(|l| l.trim() == "connection: close") {
            continue; // announced: the client will not reuse the connection
        }
        let next = narad_tests::http::raw_exchange(
            &mut conn,
            b"GET /healthz HTTP/1.1\r\nHost: narad\r\n\r\n",
        )
        .await;
        c.check(next.as_ref().is_ok_and(|(h, _)| h.starts_with("http/1.1 200")), || {
            format!("{label}: the 413 had no `Connection: close`, but the next request on that connection got {next:?}")
        });
    }
    c.finish();
}

#[tokio::test]
async fn create_conflicts_on_exact_and_case_only_names() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let first = http.create_topic_named("orders").await;

    let r = http
        .post_json("/v1/topics", &json!({"name": "orders", "partitions": 5}))
        .await;
    r.expect_error(409);

    for other in ["Orders", "ORDERS", "orderS"] {
        let r = http.post_json("/v1/topics", &json!({"name": other})).await;
        let msg = r.expect_error(409);
        assert!(
            msg.contains("differs only in letter case"),
            "{}",
            r.describe()
        );
        http.get(topic_path(other)).await.expect_error(404);
    }

    // The original is untouched.
    let mut got = http.get_topic("orders", "").await;
    for stat in ["partition_stats", "backlog", "partial"] {
        got.as_object_mut().unwrap().remove(stat);
    }
    assert_eq!(got, first);
}

#[tokio::test]
async fn list_paginates_in_ascending_name_order() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());

    let empty = http.get("/v1/topics").await.expect_json(200);
    assert_eq!(empty, json!({"topics": [], "next_page_token": ""}));

    // Created out of order; byte order puts upper case first.
    let mut records = std::collections::BTreeMap::new();
    for name in ["delta", "Bravo", "alpha", "echo", "charlie", "alpha-2"] {
        records.insert(name.to_string(), http.create_topic_named(name).await);
    }
    let page = |q: &'static str| {
        let http = http.clone();
        async move {
            let v = http.get(format!("/v1/topics{q}")).await.expect_json(200);
            let names: Vec<String> = v["topics"]
                .as_array()
                .unwrap_or_else(|| panic!("{q}: no topics array: {v}"))
                .iter()
                .map(|t| t["name"].as_str().unwrap_or_default().to_string())
                .collect();
            let token = v["next_page_token"]
                .as_str()
                .unwrap_or_else(|| panic!("{q}: no next_page_token: {v}"))
                .to_string();
            (names, token, v)
        }
    };

    let (names, token, v) = page("").await;
    assert_eq!(
        names,
        ["Bravo", "alpha", "alpha-2", "charlie", "delta", "echo"]
    );
    assert_eq!(token, "");
    for t in v["topics"].as_array().unwrap() {
        assert_eq!(
            t,
            &records[t["name"].as_str().unwrap()],
            "list item differs from the record"
        );
    }

    assert_eq!(page("?limit=2").await.0[..], ["Bravo", "alpha"]);
    assert_eq!(page("?limit=2").await.1, "alpha");
    let (names, token, _) = page("?limit=2&page_token=alpha").await;
    assert_eq!(
        (names, token),
        (
            vec!["alpha-2".to_string(), "charlie".to_string()],
            "charlie".to_string()
        )
    );
    let (names, token, _) = page("?limit=2&page_token=charlie").await;
    assert_eq!(names, ["delta", "echo"]);
    assert_eq!(
        token, "",
        "nothing follows the last page, so the token must be empty"
    );
    let (names, token, _) = page("?page_token=echo").await;
    assert!(names.is_empty() && token.is_empty(), "{names:?} {token:?}");

    // The token is a position, not a reference: it works after its topic is deleted, and
    // for names that never existed.
    http.delete(topic_path("charlie")).await.expect(204);
    let (names, token, _) = page("?limit=1&page_token=charlie").await;
    assert_eq!(
        (names, token),
        (vec!["delta".to_string()], "delta".to_string())
    );
    let (names, _, _) = page("?page_token=b").await;
    assert_eq!(names, ["delta", "echo"]);

    // Over the cap is clamped, not refused.
    let (names, _, _) = page("?limit=5000").await;
    assert_eq!(names, ["Bravo", "alpha", "alpha-2", "delta", "echo"]);
}

#[tokio::test]
async fn list_default_limit_is_100() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let names: Vec<String> = (0..=100).map(|i| format!("t{i:03}")).collect();
    let mut tasks = Vec::new();
    for chunk in names.chunks(13) {
        let (http, chunk) = (http.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            for n in chunk {
                http.create_topic_named(&n).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let v = http.get("/v1/topics").await.expect_json(200);
    let topics = v["topics"].as_array().unwrap();
    assert_eq!(topics.len(), 100, "default limit is 100");
    assert_eq!(topics[99]["name"], json!("t099"));
    assert_eq!(v["next_page_token"], json!("t099"));
    let v = http
        .get("/v1/topics?page_token=t099")
        .await
        .expect_json(200);
    assert_eq!(v["topics"].as_array().unwrap().len(), 1);
    assert_eq!(v["topics"][0]["name"], json!("t100"));
    assert_eq!(v["next_page_token"], json!(""));
    // limit is clamped to 1000, not to the default: one page holds all 101.
    let v = http.get("/v1/topics?limit=5000").await.expect_json(200);
    assert_eq!(v["topics"].as_array().unwrap().len(), 101);
    assert_eq!(v["next_page_token"], json!(""));
}

#[tokio::test]
async fn list_rejects_bad_limit() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let mut c = Checks::new("bad list limits");
    for q in ["limit=0", "limit=-1", "limit=x", "limit=1.5", "limit=10abc"] {
        let r = http.get(format!("/v1/topics?{q}")).await;
        c.error(q, &r, 400);
    }
    // Unknown query parameters are ignored.
    let r = http.get("/v1/topics?bogus=1").await;
    c.status("unknown parameter ignored", &r, 200);
    c.finish();
}

#[tokio::test]
async fn get_reports_partition_stats() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "stats", "partitions": 4}))
        .await;

    let rec = http.get_topic("stats", "").await;
    assert_eq!(rec["name"], json!("stats"));
    assert_ne!(rec.get("partial"), Some(&json!(true)), "{rec}");
    let stats = rec["partition_stats"].as_array().expect("partition_stats");
    assert_eq!(stats.len(), 4, "{rec}");
    for (i, s) in stats.iter().enumerate() {
        assert_eq!(s["index"], json!(i), "{s}");
        assert_eq!(s["status"], json!("ok"), "{s}");
        assert!(
            s["owner_node"].as_str().is_some_and(|o| !o.is_empty()),
            "owner_node: {s}"
        );
        assert!(s.get("owner_liveness").is_none(), "{s}");
        for k in ["oldest_offset", "next_offset", "high_watermark"] {
            assert_eq!(s[k], json!(0), "{k} of an empty partition: {s}");
        }
        for k in ["segments", "size_bytes"] {
            assert!(s[k].as_u64().is_some(), "{k} must be an integer: {s}");
        }
    }

    for i in 0..2 {
        http.produce_ok("stats", "partition=1", format!("m{i}"))
            .await;
    }
    http.wait_visible("stats", 1, 2).await;
    let stats = http.partition_stats("stats").await;
    let s1 = &stats[1];
    assert_eq!(s1["high_watermark"], json!(2), "{s1}");
    assert_eq!(s1["next_offset"], json!(2), "{s1}");
    assert_eq!(s1["oldest_offset"], json!(0), "{s1}");
    assert!(s1["size_bytes"].as_u64().unwrap() > 0, "{s1}");
    assert!(s1["segments"].as_u64().unwrap() >= 1, "{s1}");
    for p in [0, 2, 3] {
        assert_eq!(stats[p]["high_watermark"], json!(0), "{}", stats[p]);
    }

    let one = http.get_topic("stats", "partition=1").await;
    let only = one["partition_stats"].as_array().expect("partition_stats");
    assert_eq!(only.len(), 1, "{one}");
    assert_eq!(only[0]["index"], json!(1));
    assert_eq!(only[0]["high_watermark"], json!(2));

    let mut c = Checks::new("GET topic errors");
    for q in ["partition=4", "partition=-1", "partition=x"] {
        c.error(
            q,
            &http.get(format!("{}?{q}", topic_path("stats"))).await,
            400,
        );
    }
    c.error("missing topic", &http.get(topic_path("nope")).await, 404);
    c.finish();
}

#[tokio::test]
async fn patch_alters_settings() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let created = http.create_topic_named("alter").await;
    let path = topic_path("alter");

    let rec = http
        .patch_json(&path, &json!({"partitions": 5}))
        .await
        .expect_json(200);
    assert_eq!(rec["partitions"], json!(5), "{rec}");
    assert_eq!(rec["created_at"], created["created_at"]);
    assert_eq!(http.partition_stats("alter").await.len(), 5);
    http.produce_ok("alter", "partition=4", "on a new partition")
        .await;
    let m = http.consume_msg("alter", "partition=4&wait=5s").await;
    assert_eq!(m.payload_bytes(), b"on a new partition");

    for (body, field, want) in [
        (json!({"retention_ms": 0}), "retention_ms", json!(0)),
        (
            json!({"retention_ms": ONE_HOUR_MS}),
            "retention_ms",
            json!(ONE_HOUR_MS),
        ),
        (
            json!({"visibility_timeout_ms": 2000}),
            "visibility_timeout_ms",
            json!(2000),
        ),
        (
            json!({"max_in_flight_per_partition": 7}),
            "max_in_flight_per_partition",
            json!(7),
        ),
        (
            json!({"max_acked_ahead_per_partition": 9}),
            "max_acked_ahead_per_partition",
            json!(9),
        ),
        (
            json!({"max_in_flight_per_partition": 0}),
            "max_in_flight_per_partition",
            json!(DEFAULT_CAP),
        ),
        (
            json!({"max_acked_ahead_per_partition": 0}),
            "max_acked_ahead_per_partition",
            json!(DEFAULT_CAP),
        ),
    ] {
        let rec = http.patch_json(&path, &body).await.expect_json(200);
        assert_eq!(rec[field], want, "PATCH {body}: {rec}");
        assert_eq!(
            http.get_topic("alter", "").await[field],
            want,
            "GET after PATCH {body}"
        );
    }

    // Several fields at once.
    let rec = http
        .patch_json(&path, &json!({"retention_ms": 2 * ONE_HOUR_MS, "visibility_timeout_ms": 3000, "partitions": 6}))
        .await
        .expect_json(200);
    assert_eq!(
        (
            &rec["retention_ms"],
            &rec["visibility_timeout_ms"],
            &rec["partitions"]
        ),
        (&json!(2 * ONE_HOUR_MS), &json!(3000), &json!(6)),
        "{rec}"
    );
}

#[tokio::test]
async fn patch_rejects_invalid_changes_atomically() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "alter", "partitions": 5, "visibility_timeout_ms": 4000}))
        .await;
    let path = topic_path("alter");
    let before = http.get_topic("alter", "").await;
    let mut c = Checks::new("invalid PATCHes");

    for (label, body) in [
        ("equal partitions", json!({"partitions": 5})),
        ("fewer partitions", json!({"partitions": 4})),
        ("partitions 109", json!({"partitions": 109})),
        ("retention 1000", json!({"retention_ms": 1000})),
        ("retention -1", json!({"retention_ms": -1})),
        ("visibility -1", json!({"visibility_timeout_ms": -1})),
        (
            "visibility over 1 year",
            json!({"visibility_timeout_ms": OVER_ONE_YEAR_MS}),
        ),
        (
            "max_in_flight -1",
            json!({"max_in_flight_per_partition": -1}),
        ),
        (
            "max_acked_ahead -1",
            json!({"max_acked_ahead_per_partition": -1}),
        ),
        ("unknown field", json!({"bogus": 1})),
        ("name is not alterable", json!({"name": "other"})),
        ("empty patch", json!({})),
        (
            "atomic: valid retention + shrinking partitions",
            json!({"retention_ms": 2 * ONE_HOUR_MS, "partitions": 3}),
        ),
        (
            "atomic: valid visibility + negative cap",
            json!({"visibility_timeout_ms": 9000, "max_in_flight_per_partition": -1}),
        ),
        (
            "atomic: valid partitions + unknown field",
            json!({"partitions": 8, "bogus": true}),
        ),
    ] {
        c.error(label, &http.patch_json(&path, &body).await, 400);
    }
    for (label, raw) in [
        ("not JSON", "partitions=6"),
        ("trailing data", "{\"partitions\":6} x"),
        ("empty body", ""),
    ] {
        c.error(
            label,
            &http.send_raw_json(Method::PATCH, &path, raw).await,
            400,
        );
    }
    c.error(
        "missing topic",
        &http
            .patch_json(topic_path("nope"), &json!({"partitions": 9}))
            .await,
        404,
    );

    let mut after = http.get_topic("alter", "").await;
    let mut before = before;
    for v in [&mut after, &mut before] {
        // Stats may differ; the settings must not.
        v.as_object_mut().unwrap().remove("partition_stats");
        v.as_object_mut().unwrap().remove("backlog");
    }
    c.check(after == before, || {
        format!("rejected PATCHes changed the topic:\nbefore {before}\nafter  {after}")
    });
    c.finish();
}

#[tokio::test]
async fn delete_removes_topic_and_recreate_starts_at_offset_zero() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("gone").await;
    for i in 0..3 {
        http.produce_ok("gone", "partition=0", format!("old-{i}"))
            .await;
    }
    http.wait_visible("gone", 0, 3).await;

    let r = http.delete(topic_path("gone")).await;
    r.expect(204);
    assert!(r.body.is_empty(), "{}", r.describe());

    let mut c = Checks::new("a deleted topic is gone");
    c.error("GET", &http.get(topic_path("gone")).await, 404);
    c.error("second DELETE", &http.delete(topic_path("gone")).await, 404);
    c.error("produce", &http.produce("gone", "", "x").await, 404);
    c.error("consume", &http.consume("gone", "").await, 404);
    let list = http.get("/v1/topics").await.expect_json(200);
    c.check(list["topics"] == json!([]), || {
        format!("deleted topic still listed: {list}")
    });
    c.finish();

    http.create_topic_named("gone").await;
    for s in http.partition_stats("gone").await {
        assert_eq!(
            (&s["next_offset"], &s["high_watermark"]),
            (&json!(0), &json!(0)),
            "recreated: {s}"
        );
    }
    http.produce_ok("gone", "partition=0", "new").await;
    let m = http.consume_msg("gone", "partition=0&wait=5s").await;
    assert_eq!(
        (m.offset, m.payload_bytes()),
        (0, b"new".to_vec()),
        "{}",
        m.json
    );
    http.ack_ok("gone", m.handle()).await;
    http.consume_none("gone", "partition=0").await;
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_json_errors() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("t").await;
    let t = topic_path("t");
    let mut c = Checks::new("routing errors");

    for path in [
        "/nope",
        "/v1/nope",
        "/v1/topics/t/nope",
        "/v1/topics/t/produce/nope",
        "/v2/topics",
    ] {
        c.error(&format!("GET {path}"), &http.get(path).await, 404);
    }
    for (method, path, allowed) in [
        (
            Method::DELETE,
            "/v1/topics".to_string(),
            &["GET", "POST"][..],
        ),
        (Method::PUT, t.clone(), &["GET", "PATCH", "DELETE"][..]),
        (Method::GET, format!("{t}/produce"), &["POST"][..]),
        (Method::GET, format!("{t}/produce/batch"), &["POST"][..]),
        (Method::POST, format!("{t}/consume"), &["GET"][..]),
        (Method::GET, format!("{t}/ack"), &["POST"][..]),
    ] {
        let label = format!("{method} {path}");
        let r = http.request(method, path).send().await;
        if c.error(&label, &r, 405).is_some() {
            let allow = r.header("allow").unwrap_or("").to_uppercase();
            let listed: Vec<&str> = allow.split(',').map(str::trim).collect();
            c.check(allowed.iter().all(|m| listed.contains(m)), || {
                format!("{label}: Allow {allow:?} should list {allowed:?}")
            });
        }
    }
    c.finish();
}

#[tokio::test]
async fn topic_names_are_case_sensitive_in_lookups() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("Mixed").await;
    http.get(topic_path("mixed")).await.expect_error(404);
    http.get(topic_path("Mixed")).await.expect(200);
    // A long-poll against a missing topic fails at once rather than waiting.
    let r = http.consume("mixed", "wait=5s").await;
    r.expect_error(404);
    assert!(r.elapsed < Duration::from_secs(3), "{:?}", r.elapsed);
}
