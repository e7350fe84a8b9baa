//! `storage.codec` / `storage.compression_level` (SPEC §8): a node writing its partition
//! logs with zstd serves every message byte for byte across a kill -9, and across restarts
//! that switch the codec to `none` and back (frames say how they are stored); the logs'
//! `size_bytes` shows the compression. An unknown codec or level stops the node with an
//! error naming the key and the allowed values.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use narad_tests::*;

const TOPIC: &str = "zq";
/// Messages produced with zstd (then 100 more with `none`, and 100 with zstd again).
const FIRST: u64 = 400;

/// The payload of message `i`: unique, compressible, of three kinds — JSON (rendered
/// verbatim), plain text (a JSON string) and binary (base64).
fn payload(i: u64) -> Vec<u8> {
    match i % 3 {
        0 => {
            let items: Vec<String> = (0..1 + i % 6)
                .map(|n| format!(r#"{{"sku":"sku-{n:04}","qty":{},"price_cents":1999}}"#, 1 + n))
                .collect();
            format!(
                r#"{{"order_id":"ord_{i:06}","customer":"customer-{}","status":"paid","currency":"EUR","items":[{}],"note":"{}"}}"#,
                i % 17,
                items.join(","),
                "leave the parcel at the back door, ".repeat(1 + (i % 4) as usize)
            )
            .into_bytes()
        }
        1 => format!(
            "{i} 10.0.{}.{} - - GET /api/v1/orders?page={}&size=50 HTTP/1.1 200 {} user-agent=narad-test/1.0 (compressible log line) {}",
            i % 250,
            (i * 7) % 250,
            i % 9,
            400 + i,
            "x-request-trace=abcdef0123456789 ".repeat(2 + (i % 3) as usize)
        )
        .into_bytes(),
        _ => {
            let mut v = vec![0xFF, 0xFE, 0x00];
            v.extend_from_slice(&i.to_le_bytes());
            v.extend((0..240u32).map(|n| (n % 16) as u8 | 0x80));
            v
        }
    }
}

fn key(i: u64) -> Option<Vec<u8>> {
    match i % 4 {
        0 => None,
        _ => Some(format!("customer-{}", i % 10).into_bytes()),
    }
}

/// Produces messages `ids` in batches of 100 (payloads as base64: stored byte-exact).
async fn produce(http: &Http, ids: std::ops::Range<u64>) {
    let ids: Vec<u64> = ids.collect();
    for chunk in ids.chunks(100) {
        let messages: Vec<Value> = chunk
            .iter()
            .map(|&i| {
                let mut m =
                    json!({"payload": B64.encode(payload(i)), "payload_encoding": "base64"});
                if let Some(k) = key(i) {
                    m["key"] = json!(String::from_utf8(k).unwrap());
                }
                m
            })
            .collect();
        let r = http
            .produce_batch(TOPIC, &json!({ "messages": messages }))
            .await;
        assert_eq!(
            r.expect_json(202),
            json!({"accepted": chunk.len()}),
            "{}",
            r.describe()
        );
    }
}

fn bytes_of(ids: std::ops::Range<u64>) -> u64 {
    ids.map(|i| (payload(i).len() + key(i).map_or(0, |k| k.len())) as u64)
        .sum()
}

/// (sum of the partitions' high watermarks, sum of their `size_bytes`).
async fn totals(http: &Http) -> (u64, u64) {
    let stats = http.partition_stats(TOPIC).await;
    let n = |k: &str| -> u64 { stats.iter().map(|s| s[k].as_u64().unwrap()).sum() };
    (n("high_watermark"), n("size_bytes"))
}

/// Checks that `m` is message `i`'s payload and key, exactly as SPEC §2.9 renders them.
fn check_msg(m: &Msg, by_payload: &HashMap<Vec<u8>, u64>) -> u64 {
    let got = m.payload_bytes();
    let Some(&i) = by_payload.get(&got) else {
        panic!(
            "partition {} offset {}: a payload never produced: {}",
            m.partition, m.offset, m.json
        );
    };
    if let Some(p) = m.payload_problem(&payload(i)) {
        panic!("message {i} (offset {}): {p}", m.offset);
    }
    if let Some(p) = m.key_problem(key(i).as_deref()) {
        panic!("message {i} (offset {}): {p}", m.offset);
    }
    i
}

/// Replays every offset of every partition (`consume?partition=P&offset=O`) and checks
/// each message; returns the message numbers found. (Only after a kill -9 may a message
/// appear twice: the WAL re-commits its window, SPEC §2.6.)
async fn replay_all(http: &Http, by_payload: &HashMap<Vec<u8>, u64>) -> BTreeMap<u64, usize> {
    let mut seen = BTreeMap::new();
    for (p, hwm) in http.high_watermarks(TOPIC).await.unwrap() {
        for o in 0..hwm {
            let m = http
                .consume_msg(TOPIC, &format!("partition={p}&offset={o}"))
                .await;
            assert_eq!((m.partition, m.offset), (p, o));
            *seen.entry(check_msg(&m, by_payload)).or_insert(0) += 1;
        }
    }
    seen
}

fn write_config(path: &Path, storage: Value) {
    std::fs::write(
        path,
        serde_json::to_vec(&json!({ "storage": storage })).unwrap(),
    )
    .unwrap();
}

#[tokio::test]
async fn zstd_logs_serve_every_message_across_kill9_and_codec_switches() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("narad.json");
    write_config(
        &cfg,
        json!({"codec": "zstd", "compression_level": "default"}),
    );
    let mut server = Server::start(
        ServerOpts::default()
            .arg("--config")
            .arg(cfg.display().to_string()),
    )
    .await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": TOPIC, "partitions": 3}))
        .await;
    let all = 0..FIRST + 200;
    let by_payload: HashMap<Vec<u8>, u64> = all.clone().map(|i| (payload(i), i)).collect();
    assert_eq!(by_payload.len(), all.clone().count(), "payloads are unique");

    // 1. zstd: produce, let it commit, check the stored size.
    produce(&http, 0..FIRST).await;
    http.wait_total_visible(TOPIC, FIRST).await;
    let (hwm, stored) = totals(&http).await;
    assert_eq!(hwm, FIRST);
    let raw = bytes_of(0..FIRST);
    eprintln!(
        "zstd (default): {raw} payload+key bytes of {FIRST} messages stored in {stored} log bytes \
         (frame headers included): ratio {:.2}",
        raw as f64 / stored as f64
    );
    assert!(
        stored * 2 < raw,
        "zstd logs hold {stored} bytes for {raw} bytes of messages"
    );

    // 2. kill -9; after the restart a queue consumer gets every message, then a replay
    //    reads every offset, byte for byte.
    server.kill9();
    server.restart().await;
    let drained = http.drain(TOPIC, "wait=0").await;
    let got: BTreeSet<u64> = drained.iter().map(|m| check_msg(m, &by_payload)).collect();
    assert_eq!(got, (0..FIRST).collect(), "consumed after kill -9");
    let seen = replay_all(&http, &by_payload).await;
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (0..FIRST).collect::<Vec<_>>()
    );

    // 3. Switch to `none` (graceful restart): new frames are stored plain, old ones stay
    //    readable.
    let (hwm_before, size_before) = totals(&http).await;
    write_config(&cfg, json!({"codec": "none"}));
    assert!(server.stop().await.success());
    server.restart().await;
    produce(&http, FIRST..FIRST + 100).await;
    http.wait_total_visible(TOPIC, hwm_before + 100).await;
    let (_, size_after) = totals(&http).await;
    assert!(
        size_after - size_before > bytes_of(FIRST..FIRST + 100),
        "codec none: {} log bytes for {} bytes of messages",
        size_after - size_before,
        bytes_of(FIRST..FIRST + 100)
    );
    let seen = replay_all(&http, &by_payload).await;
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (0..FIRST + 100).collect::<Vec<_>>()
    );
    assert!(
        seen.range(FIRST..).all(|(_, &n)| n == 1),
        "a graceful restart duplicated"
    );

    // 4. And back to zstd (kill -9): a log of both codecs, read and appended to.
    write_config(&cfg, json!({"codec": "zstd", "compression_level": "best"}));
    let (hwm_before, size_before) = totals(&http).await;
    server.kill9();
    server.restart().await;
    produce(&http, FIRST + 100..FIRST + 200).await;
    http.wait_total_visible(TOPIC, hwm_before + 100).await;
    let (_, size_after) = totals(&http).await;
    assert!(
        (size_after - size_before) * 2 < bytes_of(FIRST + 100..FIRST + 200),
        "zstd again: {} log bytes for {} bytes of messages",
        size_after - size_before,
        bytes_of(FIRST + 100..FIRST + 200)
    );
    let seen = replay_all(&http, &by_payload).await;
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        all.collect::<Vec<_>>()
    );
}

/// An unknown `storage.codec` or `storage.compression_level` stops the node before it
/// serves, with an error naming the key, the allowed values and the value given.
#[test]
fn an_unknown_codec_or_level_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("narad.json");
    for (storage, wants) in [
        (
            json!({"codec": "lz4"}),
            ["storage.codec", "none or zstd", r#""lz4""#],
        ),
        (
            json!({"codec": "zstd", "compression_level": "max"}),
            [
                "storage.compression_level",
                "fastest, default, better or best",
                r#""max""#,
            ],
        ),
    ] {
        write_config(&cfg, storage.clone());
        let out = ServerOpts::default()
            .arg("--config")
            .arg(cfg.display().to_string())
            .start_refused();
        for w in wants {
            assert!(out.contains(w), "{storage}: {w:?} missing from:\n{out}");
        }
    }
}
