//! Produce (SPEC §2.3, §2.9, §2.10, §3.4): single and batch, size limits, partition choice
//! (pin, FNV-1a key affinity, round robin), keys of any bytes, schema validation.

use std::collections::BTreeMap;

use narad_tests::*;

const MIB: usize = 1 << 20;

/// Consumes one message (waiting for it), checks nothing else is pending there, acks it.
async fn take_one(http: &Http, topic: &str, query: &str) -> Msg {
    let m = http.consume_msg(topic, &format!("wait=5s&{query}")).await;
    http.ack_ok(topic, m.handle()).await;
    m
}

#[tokio::test]
async fn produce_answers_202_and_validates_the_basics() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("basic").await;

    http.produce_ok("basic", "", "hello").await;

    // Content-Type is ignored: any, none, or a misleading one.
    for ct in [
        Some("text/plain"),
        Some("application/json"),
        Some("image/png"),
        None,
    ] {
        let mut req = http
            .request(Method::POST, format!("{}/produce", topic_path("basic")))
            .body("not json");
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        let r = req.send().await;
        assert_eq!(
            r.status,
            202,
            "Content-Type {ct:?} must be ignored: {}",
            r.describe()
        );
    }
    http.wait_total_visible("basic", 5).await;

    http.produce("basic", "", "").await.expect_error(400);
    http.produce("missing", "", "x").await.expect_error(404);
    // Unknown query parameters are ignored.
    http.produce_ok("basic", "bogus=1", "x").await;
}

#[tokio::test]
async fn produce_size_limits() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("size").await;

    let exactly: Vec<u8> = (0..MIB).map(|i| b'a' + (i % 26) as u8).collect();
    http.produce_ok("size", "partition=0", exactly.clone())
        .await;
    // On its own client: keep-alive after a 413 is `topics::connection_stays_usable_after_a_413`.
    let r = Http::new(server.url())
        .produce("size", "partition=0", vec![b'x'; MIB + 1])
        .await;
    r.expect_error(413);

    let m = take_one(&http, "size", "partition=0").await;
    assert_eq!(m.offset, 0);
    assert!(
        m.payload_bytes() == exactly,
        "the 1 MiB message did not round-trip"
    );
    http.consume_none("size", "partition=0").await;
}

#[tokio::test]
async fn partition_pin_places_the_message_and_keeps_the_key() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("pin").await;

    for p in 0..3 {
        http.produce_ok("pin", &format!("partition={p}"), format!("to-{p}"))
            .await;
    }
    // A pin wins over the key's hash (customer-42 hashes to partition 1), and the key is stored.
    http.produce_ok("pin", "key=customer-42&partition=2", "pinned-with-key")
        .await;
    for p in 0..3 {
        let m = take_one(&http, "pin", &format!("partition={p}")).await;
        assert_eq!(
            (m.partition, m.payload_bytes()),
            (p, format!("to-{p}").into_bytes())
        );
        assert!(m.key_problem(None).is_none(), "{}", m.json);
    }
    let m = take_one(&http, "pin", "partition=2").await;
    assert_eq!(m.payload_bytes(), b"pinned-with-key");
    assert!(m.key_problem(Some(b"customer-42")).is_none(), "{}", m.json);

    let mut c = Checks::new("bad partition parameters");
    for q in [
        "partition=3",
        "partition=-1",
        "partition=x",
        "partition=1.0",
        "partition=1&partition=2",
    ] {
        c.error(q, &http.produce("pin", q, "x").await, 400);
    }
    c.finish();
}

#[tokio::test]
async fn key_affinity_follows_fnv1a_32() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("keys3").await;
    http.create_topic(&json!({"name": "keys7", "partitions": 7}))
        .await;

    // SPEC §2.3 vector: customer-42 -> partition 1 of 3, every time.
    for i in 0..4 {
        http.produce_ok("keys3", "key=customer-42", format!("c42-{i}"))
            .await;
    }
    for i in 0..4 {
        let m = take_one(&http, "keys3", "").await;
        assert_eq!(
            m.partition, 1,
            "customer-42 must land on partition 1 of 3: {}",
            m.json
        );
        assert_eq!(
            m.payload_bytes(),
            format!("c42-{i}").into_bytes(),
            "single-partition order"
        );
        assert!(m.key_problem(Some(b"customer-42")).is_none(), "{}", m.json);
    }

    let mut rng = test_rng("key_affinity_follows_fnv1a_32");
    let mut c = Checks::new("key -> partition");
    for i in 0..25 {
        let key: String = (0..1 + rand::Rng::random_range(&mut rng, 0..12usize))
            .map(|_| char::from(rand::Rng::random_range(&mut rng, b'!'..=b'~')))
            .collect();
        let topic = if i % 2 == 0 { "keys3" } else { "keys7" };
        let n = if i % 2 == 0 { 3 } else { 7 };
        http.produce_ok(topic, &format!("key={}", pct(&key)), format!("k{i}"))
            .await;
        let m = take_one(&http, topic, "").await;
        let want = u64::from(partition_for_key(key.as_bytes(), n));
        c.check(m.partition == want, || {
            format!(
                "key {key:?} on {n} partitions: got {}, want {want}",
                m.partition
            )
        });
        c.check(m.key_problem(Some(key.as_bytes())).is_none(), || {
            format!("key {key:?}: {}", m.json)
        });
    }
    c.finish();
}

#[tokio::test]
async fn keyless_produce_round_robins_and_stores_no_key() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("rr").await;
    for i in 0..30 {
        http.produce_ok("rr", "", format!("m{i}")).await;
    }
    http.wait_total_visible("rr", 30).await;
    let hwm = http.high_watermarks("rr").await.unwrap();
    assert_eq!(
        hwm,
        BTreeMap::from([(0, 10), (1, 10), (2, 10)]),
        "sequential keyless produces take turns"
    );

    // An empty key is no key.
    http.produce_ok("rr", "key=", "empty-key").await;
    http.wait_total_visible("rr", 31).await;
    let msgs = http.drain("rr", "wait=0").await;
    assert_eq!(msgs.len(), 31);
    for m in &msgs {
        assert!(
            m.key_problem(None).is_none(),
            "no key may be invented: {}",
            m.json
        );
    }
}

#[tokio::test]
async fn key_parameter_is_percent_decoded_bytes() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("kp").await;

    let mut c = Checks::new("key decoding");
    for (query, key) in [
        ("key=caf%C3%A9%20x", "café x".as_bytes().to_vec()),
        // Go's url.Values.Encode sends a space as '+'.
        ("key=a+b", b"a b".to_vec()),
        ("key=%2F%3F%26%3D", b"/?&=".to_vec()),
        ("key=%FF%FEab", vec![0xff, 0xfe, b'a', b'b']),
        ("key=%00", vec![0x00]),
    ] {
        http.produce_ok("kp", query, "v").await;
        let m = take_one(&http, "kp", "").await;
        let want = u64::from(partition_for_key(&key, 3));
        c.check(m.key_problem(Some(&key)).is_none(), || {
            format!("{query}: {}", m.key_problem(Some(&key)).unwrap())
        });
        c.check(m.partition == want, || {
            format!(
                "{query}: partition {}, want {want} (FNV of the key bytes)",
                m.partition
            )
        });
    }
    c.error(
        "repeated key",
        &http.produce("kp", "key=a&key=b", "v").await,
        400,
    );
    c.finish();
}

/// (partition, stored payload bytes, key bytes).
type Stored = (u64, &'static [u8], Option<&'static [u8]>);

#[tokio::test]
async fn batch_produce_stores_each_element_exactly() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "batch", "partitions": 5}))
        .await;

    // Written by hand: element 0's payload must be stored as these exact bytes.
    let body = r#"{"messages":[
        {"payload":{"a" : [1, 2],  "b":{}},"partition":0},
        {"payload":"AAEC/w==","payload_encoding":"base64","partition":1},
        {"payload":"aGVsbG8gd29ybGQ=","payload_encoding":"base64","key":"k2","partition":2},
        {"payload":"just a string","key":"/w==","key_encoding":"base64","partition":3},
        {"payload":42,"key":"customer-42"}
    ]}"#;
    let r = http
        .send_raw_json(
            Method::POST,
            format!("{}/produce/batch", topic_path("batch")),
            body,
        )
        .await;
    assert_eq!(r.expect_json(202), json!({"accepted": 5}));

    let expect: [Stored; 5] = [
        (0, br#"{"a" : [1, 2],  "b":{}}"#, None),
        (1, &[0x00, 0x01, 0x02, 0xff], None),
        (2, b"hello world", Some(b"k2")),
        (3, br#""just a string""#, Some(&[0xff])),
        (
            u64::from(partition_for_key(b"customer-42", 5)),
            b"42",
            Some(b"customer-42"),
        ),
    ];
    let mut c = Checks::new("batch elements");
    for (p, payload, key) in expect {
        let m = take_one(&http, "batch", &format!("partition={p}")).await;
        c.check(m.payload_problem(payload).is_none(), || {
            format!("partition {p}: {}", m.payload_problem(payload).unwrap())
        });
        c.check(m.key_problem(key).is_none(), || {
            format!("partition {p}: {}", m.key_problem(key).unwrap())
        });
    }
    c.finish();

    // 100 elements is the maximum.
    let hundred: Vec<Value> = (0..100).map(|i| json!({"payload": {"i": i}})).collect();
    let r = http
        .produce_batch("batch", &json!({"messages": hundred}))
        .await;
    assert_eq!(r.expect_json(202), json!({"accepted": 100}));
    http.wait_total_visible("batch", 100).await;
}

#[tokio::test]
async fn batch_produce_is_all_or_nothing() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("bv").await;
    let path = format!("{}/produce/batch", topic_path("bv"));
    let ok = json!({"payload": {"ok": true}});
    let mut c = Checks::new("invalid batches");

    for (label, elements, index) in [
        (
            "partition out of range",
            vec![ok.clone(), json!({"payload": 1, "partition": 7})],
            1,
        ),
        (
            "negative partition",
            vec![ok.clone(), json!({"payload": 1, "partition": -1})],
            1,
        ),
        ("missing payload", vec![json!({"partition": 0})], 0),
        (
            "bad base64",
            vec![
                ok.clone(),
                ok.clone(),
                json!({"payload": "%%%", "payload_encoding": "base64"}),
            ],
            2,
        ),
        (
            "unknown payload_encoding",
            vec![
                ok.clone(),
                json!({"payload": "AA==", "payload_encoding": "hex"}),
            ],
            1,
        ),
        (
            "unknown key_encoding",
            vec![
                ok.clone(),
                json!({"payload": 1, "key": "zz", "key_encoding": "rot13"}),
            ],
            1,
        ),
        (
            "bad key base64",
            vec![
                ok.clone(),
                json!({"payload": 1, "key": "%%", "key_encoding": "base64"}),
            ],
            1,
        ),
        (
            "empty message",
            vec![json!({"payload": "", "payload_encoding": "base64"})],
            0,
        ),
    ] {
        let r = http
            .produce_batch("bv", &json!({ "messages": elements }))
            .await;
        if let Some(msg) = c.error(label, &r, 400) {
            let prefix = format!("message {index}: ");
            c.check(msg.starts_with(&prefix), || {
                format!("{label}: error should start with {prefix:?}: {msg:?}")
            });
        }
    }
    let many: Vec<Value> = (0..1001).map(|_| ok.clone()).collect();
    for (label, body) in [
        ("no messages", json!({"messages": []})),
        ("1001 messages", json!({"messages": many})),
        ("missing messages", json!({})),
        (
            "unknown top-level field",
            json!({"messages": [ok.clone()], "bogus": 1}),
        ),
        (
            "unknown element field",
            json!({"messages": [ok.clone(), {"payload": 1, "bogus": 1}]}),
        ),
    ] {
        c.error(label, &http.post_json(&path, &body).await, 400);
    }
    for (label, raw) in [
        ("not JSON", "messages"),
        ("trailing data", r#"{"messages":[{"payload":1}]} x"#),
    ] {
        c.error(
            label,
            &http.send_raw_json(Method::POST, &path, raw).await,
            400,
        );
    }
    c.error(
        "unknown topic",
        &http
            .produce_batch("missing", &json!({"messages": [ok]}))
            .await,
        404,
    );

    assert_nothing_stored_but_sentinels(&http, "bv", 3, &mut c).await;
    c.finish();
}

/// Produces one sentinel per partition after the rejected requests and, once those are
/// visible, checks each partition holds exactly its sentinel (so nothing rejected earlier
/// was stored).
async fn assert_nothing_stored_but_sentinels(
    http: &Http,
    topic: &str,
    partitions: u64,
    c: &mut Checks,
) {
    let sentinels: Vec<Value> = (0..partitions)
        .map(|p| json!({"payload": "sentinel", "partition": p}))
        .collect();
    http.produce_batch(topic, &json!({ "messages": sentinels }))
        .await
        .expect(202);
    for p in 0..partitions {
        http.wait_visible(topic, p, 1).await;
    }
    let hwm = http.high_watermarks(topic).await.unwrap();
    c.check(hwm.values().all(|&h| h == 1), || {
        format!("rejected requests stored messages: high watermarks {hwm:?}")
    });
}

#[tokio::test]
async fn schema_topic_validates_every_produce() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let schema = json!({
        "type": "object",
        "properties": {"n": {"type": "integer"}, "tag": {"type": "string"}},
        "required": ["n"]
    });
    let rec = http
        .create_topic(&json!({"name": "typed", "schema": schema}))
        .await;
    assert_eq!(rec["schema"], schema, "{rec}");
    assert_eq!(rec["schema_version"], json!(1), "{rec}");

    http.produce_ok("typed", "", r#"{"n": 1, "tag": "a"}"#)
        .await;
    http.produce_ok("typed", "", r#"{"n":2}"#).await;

    let mut c = Checks::new("schema violations");
    for (label, body) in [
        ("wrong type", r#"{"n": "one"}"#),
        ("missing required", r#"{"tag": "a"}"#),
        ("not an object", "[1]"),
        ("not JSON", "hello"),
        ("truncated JSON", r#"{"n": 1"#),
    ] {
        c.error(label, &http.produce("typed", "", body).await, 400);
    }
    let r = http
        .produce_batch("typed", &json!({"messages": [{"payload": {"n": 3}}, {"payload": {"n": "x"}}, {"payload": {"n": 4}}]}))
        .await;
    if let Some(msg) = c.error("batch with one invalid element", &r, 400) {
        c.check(msg.starts_with("message 1: "), || {
            format!("batch schema error should name message 1: {msg:?}")
        });
    }
    let r = http
        .produce_batch(
            "typed",
            &json!({"messages": [{"payload": "bm90IGpzb24=", "payload_encoding": "base64"}]}),
        )
        .await;
    c.error("batch with a non-JSON element", &r, 400);
    c.finish();

    let r = http
        .produce_batch(
            "typed",
            &json!({"messages": [{"payload": {"n": 5}}, {"payload": {"n": 6, "tag": "z"}}]}),
        )
        .await;
    assert_eq!(r.expect_json(202), json!({"accepted": 2}));

    // Exactly the four valid messages are there.
    http.wait_total_visible("typed", 4).await;
    let mut seen: Vec<i64> = http
        .drain("typed", "wait=0")
        .await
        .iter()
        .map(|m| {
            serde_json::from_str::<Value>(&m.payload_raw).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    seen.sort();
    assert_eq!(seen, [1, 2, 5, 6]);
    let total: u64 = http.high_watermarks("typed").await.unwrap().values().sum();
    assert_eq!(total, 4, "rejected messages were stored");
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

async fn post_coded(http: &Http, path: &str, coding: &str, body: Vec<u8>) -> Resp {
    http.request(Method::POST, path)
        .header("content-encoding", coding)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
}

/// SPEC §3.4: produce and batch produce take `Content-Encoding: gzip`, `zstd` or `identity`
/// and store the decoded bytes exactly; other or stacked codings are `415` (with the codings
/// taken), a corrupt stream `400`; nothing of a refused body is stored.
#[tokio::test]
async fn compressed_produce_and_batch_are_stored_byte_exact() {
    let server = Server::start_default().await;
    let http = server.http();
    http.create_topic(&json!({"name": "coded", "partitions": 3}))
        .await;
    let single = format!("{}/produce?partition=0", topic_path("coded"));
    let batch = format!("{}/produce/batch", topic_path("coded"));
    let mut rng = test_rng("compressed");
    let binary: Vec<u8> = (0..200_000)
        .map(|_| rand::Rng::random::<u8>(&mut rng))
        .collect();
    let text = b"compressible ".repeat(50_000);
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for (coding, enc) in [
        ("gzip", gzip as fn(&[u8]) -> Vec<u8>),
        ("zstd", zstd),
        ("identity", |d: &[u8]| d.to_vec()),
    ] {
        for payload in [&binary, &text] {
            post_coded(&http, &single, coding, enc(payload))
                .await
                .expect(202);
            expected.push(payload.clone());
        }
        let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &binary);
        let body = json!({"messages": [
            {"payload": {"coding": coding}, "partition": 0},
            {"payload": b64, "payload_encoding": "base64", "partition": 0},
        ]});
        let r = post_coded(&http, &batch, coding, enc(body.to_string().as_bytes())).await;
        assert_eq!(r.expect_json(202), json!({"accepted": 2}), "{coding}");
        expected.push(format!("{{\"coding\":\"{coding}\"}}").into_bytes());
        expected.push(binary.clone());
    }
    // Refused: nothing of these is stored.
    let r = post_coded(&http, &single, "br", b"x".to_vec()).await;
    r.expect_error(415);
    assert_eq!(
        r.header("accept-encoding"),
        Some("gzip, zstd, identity"),
        "{}",
        r.describe()
    );
    post_coded(&http, &batch, "gzip, zstd", zstd(&gzip(b"{}")))
        .await
        .expect_error(415);
    let mut corrupt = gzip(&text);
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0x55;
    let msg = post_coded(&http, &single, "gzip", corrupt.clone())
        .await
        .expect_error(400);
    assert!(msg.contains("gzip"), "{msg}");
    post_coded(&http, &batch, "gzip", corrupt)
        .await
        .expect_error(400);
    post_coded(&http, &single, "zstd", b"not zstd at all".to_vec())
        .await
        .expect_error(400);
    // Other routes still take identity only.
    let r = http
        .request(Method::POST, "/v1/topics")
        .header("content-encoding", "gzip")
        .header("content-type", "application/json")
        .body(gzip(br#"{"name":"zz"}"#))
        .send()
        .await;
    r.expect_error(415);
    assert_eq!(r.header("accept-encoding"), Some("identity"));

    http.wait_visible("coded", 0, expected.len() as u64).await;
    let mut c = Checks::new("decoded bodies");
    for (i, want) in expected.iter().enumerate() {
        let m = http
            .consume_msg("coded", &format!("partition=0&offset={i}&wait=0"))
            .await;
        c.check(m.payload_bytes() == *want, || {
            format!("offset {i}: {:?}", m.payload_problem(want))
        });
    }
    c.finish();
    let hwm = http.high_watermarks("coded").await.unwrap();
    assert_eq!(hwm[&0], expected.len() as u64, "a refused body was stored");
}

/// A decompression bomb (1 GiB of zeros, about 1 MiB gzipped) is `413` like a plain body
/// over the limit: decoding stops at the limit, so the node's memory barely moves.
#[tokio::test]
async fn decompression_bombs_are_413_and_cost_no_memory() {
    const ROUNDS: usize = 16;
    let bomb = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; MIB];
        for _ in 0..1024 {
            e.write_all(&zeros).unwrap();
        }
        e.finish().unwrap()
    };
    assert!(bomb.len() < MIB, "{}", bomb.len());
    let zbomb = {
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        let zeros = vec![0u8; MIB];
        for _ in 0..1024 {
            std::io::Write::write_all(&mut e, &zeros).unwrap();
        }
        e.finish().unwrap()
    };
    // The bombs are built first: that takes seconds, which a kept-alive connection would
    // otherwise spend idle.
    let server = Server::start_default().await;
    let http = server.http();
    http.create_topic(&json!({"name": "bomb", "partitions": 3}))
        .await;
    let pid = server.pid().unwrap();
    let single = format!("{}/produce?partition=0", topic_path("bomb"));
    let batch = format!("{}/produce/batch", topic_path("bomb"));
    // Baseline: the node after legitimate bodies at the limits, in both codings (its
    // allocator and threads warmed by a full 1 MiB and a full 16 MiB decode). A bomb must
    // cost no more than such a body.
    let full: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let full_batch = {
        let b64 = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            &full[..MIB / 4 * 3 - 3],
        );
        let one = json!({"payload": b64, "payload_encoding": "base64", "partition": 0});
        json!({ "messages": vec![one; 15] }).to_string()
    };
    for (coding, enc) in [("gzip", gzip as fn(&[u8]) -> Vec<u8>), ("zstd", zstd)] {
        post_coded(&http, &single, coding, enc(&full))
            .await
            .expect(202);
        post_coded(&http, &batch, coding, enc(full_batch.as_bytes()))
            .await
            .expect(202);
    }
    let before = rss_bytes(pid);
    for _ in 0..3 {
        let msg = post_coded(&http, &single, "gzip", bomb.clone())
            .await
            .expect_error(413);
        assert!(msg.contains("decoded"), "{msg}");
        post_coded(&http, &single, "zstd", zbomb.clone())
            .await
            .expect_error(413);
    }
    let after_single = rss_bytes(pid);
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        post_coded(&http, &batch, "gzip", bomb.clone())
            .await
            .expect_error(413);
        post_coded(&http, &batch, "zstd", zbomb.clone())
            .await
            .expect_error(413);
        rounds.push(rss_bytes(pid) / 1024);
    }
    let after_batch = rss_bytes(pid);
    eprintln!(
        "VmRSS: baseline {} KiB, after 6 single-produce bombs {} KiB, after each round of 2 batch bombs {rounds:?} KiB (each bomb inflates to 1 GiB)",
        before / 1024,
        after_single / 1024,
    );
    // RSS moves a little with the allocator's caches (a body's buffer freed on another
    // thread than the one that made it is reused later), within a bound; what must never
    // happen is memory in proportion to what a bomb inflates to (1 GiB), to the cap it is
    // decoded up to (16 MiB for a batch, kept once would already pass these bounds), or
    // to the number of bombs.
    // The allocator's caches alone were seen to take 8.1 MiB here under the whole suite on
    // 2 cores, and 14.0 MiB on a CI machine (bodies freed on a decoding thread are reused
    // by the runtime's thread later); six bombs kept whole would be 6 GiB.
    assert!(
        after_single < before + 32 * MIB as u64,
        "single-produce bombs grew RSS from {before} to {after_single}"
    );
    assert!(
        after_batch < before + 32 * MIB as u64,
        "batch bombs grew RSS from {before} to {after_batch}"
    );
    let half = rounds[ROUNDS / 2 - 1];
    assert!(
        rounds[ROUNDS - 1] < half + 8 * 1024,
        "repeated batch bombs keep growing RSS: {rounds:?} KiB"
    );
    http.wait_visible("bomb", 0, 2 + 30).await;
    let hwm = http.high_watermarks("bomb").await.unwrap();
    assert_eq!(hwm[&0], 2 + 30, "a bomb was stored");
}

/// SPEC §11: a batch holds up to 1,000 messages and 16 MiB (decoded); 1,001 messages is
/// `400`, a byte over 16 MiB `413`. Batches of the old 100 / 1 MiB limits work as before.
#[tokio::test]
async fn batches_of_1000_messages_and_16_mib_are_accepted() {
    let server = Server::start_default().await;
    let http = server.http();
    http.create_topic(&json!({"name": "wide", "partitions": 4}))
        .await;
    let thousand: Vec<Value> = (0..1000).map(|i| json!({"payload": {"i": i}})).collect();
    let r = http
        .produce_batch("wide", &json!({ "messages": thousand }))
        .await;
    assert_eq!(r.expect_json(202), json!({"accepted": 1000}));
    let r = post_coded(
        &http,
        &format!("{}/produce/batch", topic_path("wide")),
        "gzip",
        gzip(json!({ "messages": thousand }).to_string().as_bytes()),
    )
    .await;
    assert_eq!(r.expect_json(202), json!({"accepted": 1000}));

    // Exactly 16 MiB of body: 17 string payloads just under 1 MiB each, padded to size.
    let build = |total: usize| {
        let n = 17;
        let frame = "{\"messages\":[]}".len() + (n - 1);
        let per = (total - frame) / n;
        let mut elems: Vec<String> = Vec::new();
        for i in 0..n {
            let extra = if i == 0 { (total - frame) % n } else { 0 };
            let wrap = "{\"payload\":\"\"}".len();
            elems.push(format!(
                "{{\"payload\":\"{}\"}}",
                "y".repeat(per + extra - wrap)
            ));
        }
        let body = format!("{{\"messages\":[{}]}}", elems.join(","));
        assert_eq!(body.len(), total);
        body
    };
    let path = format!("{}/produce/batch", topic_path("wide"));
    let r = http
        .send_raw_json(Method::POST, &path, build(16 * MIB))
        .await;
    assert_eq!(r.expect_json(202), json!({"accepted": 17}));
    Http::new(server.url())
        .send_raw_json(Method::POST, &path, build(16 * MIB + 1))
        .await
        .expect_error(413);
    let r = http
        .request(Method::POST, &path)
        .header("content-encoding", "zstd")
        .body(zstd(build(16 * MIB).as_bytes()))
        .send()
        .await;
    assert_eq!(r.expect_json(202), json!({"accepted": 17}));
    Http::new(server.url())
        .request(Method::POST, &path)
        .header("content-encoding", "zstd")
        .body(zstd(build(16 * MIB + 1).as_bytes()))
        .send()
        .await
        .expect_error(413);
    http.wait_total_visible("wide", 2000 + 34).await;
}
