//! Message attributes (ext): `Narad-Attr-<name>` request headers on a produce and
//! `"attributes"` per message of a batch are stored beside the key and returned as
//! `"attributes"` on consume and replay, through a crash, compressed logs and child topics;
//! every rule (count, name, size, duplicates, UTF-8, the broker's `narad-` names) is a `400`
//! that stores nothing.

use narad_tests::*;

fn attrs(m: &Msg) -> Value {
    m.json.get("attributes").cloned().unwrap_or(Value::Null)
}

async fn produce_with(http: &Http, topic: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut req = http
        .request(
            Method::POST,
            format!("{}/produce?partition=0", topic_path(topic)),
        )
        .body(body.as_bytes().to_vec());
    for (k, v) in headers {
        req = req.header(k, v);
    }
    req.send().await
}

#[tokio::test]
async fn attributes_come_back_on_consume_and_replay_and_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("narad.json");
    // Compressed frames: the attribute block is compressed and read back with them.
    std::fs::write(&cfg, br#"{"storage": {"codec": "zstd"}}"#).unwrap();
    let mut server = Server::start(
        ServerOpts::default()
            .arg("--config")
            .arg(cfg.display().to_string()),
    )
    .await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "at", "partitions": 3, "schema": {
        "type": "object", "required": ["n"]
    }}))
    .await;

    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    produce_with(
        &http,
        "at",
        &[
            ("Narad-Attr-TraceParent", trace),
            ("narad-attr-tenant.id", "acme"),
            ("Narad-Attr-Empty", ""),
        ],
        r#"{"n":1}"#,
    )
    .await
    .expect(202);
    // A message without attributes has none, and the schema looks at the body only.
    http.produce_ok("at", "partition=0", r#"{"n":2}"#).await;
    let r = http
        .produce_batch(
            "at",
            &json!({"messages": [
                {"payload": {"n": 3}, "key": "k", "attributes": {"Trace.Id": "t-3", "übung": "x"}},
            ]}),
        )
        .await;
    // "übung" is not a valid name: the whole batch is refused, nothing stored.
    assert!(
        r.expect_error(400).contains("message 0"),
        "{}",
        r.describe()
    );
    http.produce_batch(
        "at",
        &json!({"messages": [
            {"payload": {"n": 3}, "key": "k", "partition": 0, "attributes": {"Trace.Id": "t-3", "kind": "größe ✓"}},
            {"payload": {"n": 4}, "partition": 0, "attributes": {}},
        ]}),
    )
    .await
    .expect(202);
    http.wait_visible("at", 0, 4).await;

    // By payload `n`: what each message must carry.
    let want = |n: u64| match n {
        1 => json!({"traceparent": trace, "tenant.id": "acme", "empty": ""}),
        // No attributes, and an empty object is none.
        2 | 4 => Value::Null,
        3 => json!({"trace.id": "t-3", "kind": "größe ✓"}),
        _ => panic!("unexpected message {n}"),
    };
    let check = |m: &Msg| {
        let n = m.json["payload"]["n"].as_u64().unwrap();
        assert_eq!(attrs(m), want(n), "{}", m.json);
        if n == 3 {
            assert_eq!(m.json["key"], "k");
        }
        n
    };
    for o in 0..4 {
        let m = http
            .consume_msg("at", &format!("partition=0&offset={o}"))
            .await;
        assert_eq!(check(&m), o + 1);
    }

    // After kill -9 the records are read back from the recovered log and leased (a record
    // the WAL had not checkpointed yet may come twice: at-least-once).
    server.restart().await;
    let mut seen = std::collections::BTreeSet::new();
    http.wait_visible("at", 0, 4).await;
    for m in http.drain("at", "wait=1s").await {
        seen.insert(check(&m));
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), [1, 2, 3, 4]);
}

#[tokio::test]
async fn every_attribute_rule_is_a_400_that_stores_nothing() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "ar", "partitions": 3}))
        .await;

    let seventeen: Vec<(String, String)> = (0..17)
        .map(|i| (format!("Narad-Attr-a{i}"), "v".to_string()))
        .collect();
    let long_name = format!("Narad-Attr-{}", "n".repeat(65));
    let big = "v".repeat(8 * 1024);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            seventeen
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            "at most 16",
        ),
        (vec![(long_name.as_str(), "v")], "1 to 64"),
        (vec![("Narad-Attr-a+b", "v")], "1 to 64"),
        (vec![("Narad-Attr-big", big.as_str())], "8192"),
        (vec![("Narad-Attr-NARAD-x", "v")], "are the broker's"),
    ];
    for (headers, want) in &cases {
        let r = produce_with(&http, "ar", headers, "x").await;
        let e = r.expect_error(400);
        assert!(e.contains(want), "{want}: {e}");
    }
    // The same rules in a batch, named by element; and values that are not strings.
    for (attributes, want) in [
        (json!({"a": "1", "A": "2"}), "given twice"),
        (json!({"a": 1}), "message 1"),
        (json!({"": "v"}), "1 to 64"),
        (
            json!({"narad-dead-letter-source-topic": "ar"}),
            "are the broker's",
        ),
        (json!(["a"]), "message 1"),
    ] {
        let r = http
            .produce_batch(
                "ar",
                &json!({"messages": [
                    {"payload": "fine"},
                    {"payload": "bad", "attributes": attributes},
                ]}),
            )
            .await;
        let e = r.expect_error(400);
        assert!(e.contains("message 1") && e.contains(want), "{want}: {e}");
    }
    // 16 attributes of 8 KiB in all pass.
    let names: Vec<String> = (0..16).map(|i| format!("Narad-Attr-a{i:02}")).collect();
    let value = "v".repeat(8 * 1024 / 16 - 3);
    let headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), value.as_str())).collect();
    produce_with(&http, "ar", &headers, "max").await.expect(202);
    http.wait_visible("ar", 0, 1).await;
    let m = http.consume_msg("ar", "wait=5s").await;
    assert_eq!(
        m.payload_bytes(),
        b"max",
        "only the accepted message was stored"
    );
    assert_eq!(attrs(&m).as_object().unwrap().len(), 16);
    http.consume_none("ar", "wait=0").await;
}

#[tokio::test]
async fn child_topics_copy_the_attributes() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "parent", "partitions": 3}))
        .await;
    http.create_topic(&json!({"name": "kid", "partitions": 3}))
        .await;
    http.post_json(
        format!("{}/children", topic_path("parent")),
        &json!({"child": "kid"}),
    )
    .await
    .expect(200);
    produce_with(&http, "parent", &[("Narad-Attr-Origin", "eu-1")], "copied")
        .await
        .expect(202);
    let m = http.consume_msg("kid", "wait=10s").await;
    assert_eq!(m.payload_bytes(), b"copied");
    assert_eq!(attrs(&m), json!({"origin": "eu-1"}));
}
