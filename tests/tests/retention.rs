//! Retention (SPEC §2.7, §2.8, §3.2, §9): whole sealed segments older than `retention_ms`
//! are deleted, the active one never is; replay below the oldest retained offset answers
//! `410`; the queue skips what was deleted and counts it in
//! `narad_consumer_dropped_messages`; `retention_ms` 0 keeps everything.
//!
//! Time travel uses the server's test knobs: small segments
//! (`NARAD_STORAGE_SEGMENT_MAX_BYTES`), a fast retention check
//! (`NARAD_STORAGE_RETENTION_CHECK_INTERVAL`) and a clock offset for retention decisions
//! (`NARAD_TEST_CLOCK_OFFSET_MS`, fixed per process start, so each jump is a restart).
//!
//! Layout: every message of the fill is committed on its own (the test waits for it to be
//! visible before the next), so a 1000-byte message is one ~1 KiB frame and a 4 KiB segment
//! holds three. After a real-time gap, one 8000-byte message rolls the segment and becomes
//! the only record of the active segment. The gap separates "last write of the sealed
//! segments" from "first write of the active segment", so one clock offset can make the sealed
//! segments older than the retention while the active segment is not yet an hour old (the
//! time-based roll of §2.7 would otherwise seal it too).

use std::time::{Duration, Instant};

use narad_tests::*;

const HOUR_MS: u64 = 3_600_000;
const SEGMENT_BYTES: u64 = 4096;
const CHECK_INTERVAL: &str = "100ms";
/// Messages of the fill, each `FILL_BYTES` long (three per segment).
const FILL: u64 = 15;
const FILL_BYTES: usize = 1000;
/// The message written after the gap, alone in the active segment.
const BIG_BYTES: usize = 8000;
/// Real time between the last sealed write and the active segment's first write.
const GAP: Duration = Duration::from_secs(5);
/// How far past the retention cutoff the sealed segments are put (so the first pass
/// deletes them); the active segment stays younger than an hour for `GAP - MARGIN`.
const MARGIN_MS: u64 = 500;
/// How long a retention effect may take to show (many check intervals).
const EFFECT_TIMEOUT: Duration = Duration::from_secs(10);

const CLOCK: &str = "NARAD_TEST_CLOCK_OFFSET_MS";

fn fill_payload(i: u64) -> Vec<u8> {
    let mut p = format!("aged-{i:03}-").into_bytes();
    p.resize(FILL_BYTES, b'x');
    p
}

fn big_payload() -> Vec<u8> {
    let mut p = b"active-".to_vec();
    p.resize(BIG_BYTES, b'y');
    p
}

/// Stats of one partition as (segments, oldest_offset, next_offset, high_watermark,
/// size_bytes).
async fn stats(http: &Http, topic: &str, partition: u64) -> (u64, u64, u64, u64, u64) {
    let all = http.partition_stats(topic).await;
    let s = all
        .iter()
        .find(|s| s["index"].as_u64() == Some(partition))
        .unwrap_or_else(|| panic!("{topic}: no stats for partition {partition}: {all:?}"));
    let f = |k: &str| {
        s[k].as_u64()
            .unwrap_or_else(|| panic!("{topic}/{partition}: bad {k} in {s}"))
    };
    (
        f("segments"),
        f("oldest_offset"),
        f("next_offset"),
        f("high_watermark"),
        f("size_bytes"),
    )
}

/// Produces one message pinned to `partition` and waits until it is committed.
async fn produce_committed(http: &Http, topic: &str, partition: u64, body: Vec<u8>) {
    let hwm = http.high_watermarks(topic).await.unwrap()[&partition];
    http.produce_ok(topic, &format!("partition={partition}"), body)
        .await;
    http.wait_visible(topic, partition, hwm + 1).await;
}

/// Completed retention passes of this process (`storage_retention_run_duration_seconds`).
async fn retention_passes(http: &Http) -> anyhow::Result<f64> {
    let text = http.metrics_text().await;
    metric_sum(&text, "narad_storage_retention_run_duration_seconds_count")
        .ok_or_else(|| anyhow::anyhow!("no narad_storage_retention_run_duration_seconds_count"))
}

/// Waits until at least two retention passes completed since the (re)start.
async fn wait_retention_ran(http: &Http) {
    eventually(EFFECT_TIMEOUT, Duration::from_millis(50), || async {
        let n = retention_passes(http).await?;
        anyhow::ensure!(n >= 2.0, "{n} retention passes so far");
        Ok(())
    })
    .await
}

/// The counter `name` (with or without the OpenMetrics `_total` suffix) for one partition.
fn partition_counter(text: &str, name: &str, topic: &str, partition: u64) -> Option<f64> {
    let p = partition.to_string();
    let labels = [("topic", topic), ("partition", p.as_str())];
    metric_sum_where(text, &format!("{name}_total"), &labels)
        .or_else(|| metric_sum_where(text, name, &labels))
}

async fn replay(http: &Http, topic: &str, partition: u64, offset: u64) -> Resp {
    http.consume(topic, &format!("partition={partition}&offset={offset}"))
        .await
}

async fn restart_with_clock_offset(server: &mut Server, offset_ms: u64) {
    let st = server.stop().await;
    assert!(st.success(), "SIGTERM exit status: {st}");
    server.set_env(CLOCK, offset_ms.to_string());
    server.restart().await;
}

#[tokio::test]
async fn retention_deletes_old_sealed_segments_never_the_active_one() {
    let mut server = Server::start(
        ServerOpts::default()
            .env("NARAD_STORAGE_SEGMENT_MAX_BYTES", SEGMENT_BYTES.to_string())
            .env("NARAD_STORAGE_RETENTION_CHECK_INTERVAL", CHECK_INTERVAL)
            .env(CLOCK, "0"),
    )
    .await;
    let http = Http::new(server.url());
    http.create_topic(&json!({"name": "aging", "partitions": 3, "retention_ms": HOUR_MS}))
        .await;
    http.create_topic(&json!({"name": "forever", "partitions": 3, "retention_ms": 0}))
        .await;

    // Fill: sealed segments of aging/1 and forever/0, nothing consumed.
    for i in 0..FILL {
        produce_committed(&http, "aging", 1, fill_payload(i)).await;
        produce_committed(&http, "forever", 0, fill_payload(i)).await;
    }
    // Every sealed record was committed (timestamped) before this instant.
    let sealed_written_by = now_ms();
    let (filled_segments, ..) = stats(&http, "aging", 1).await;
    assert!(
        filled_segments >= 4,
        "{FILL} messages of {FILL_BYTES} B should fill several {SEGMENT_BYTES} B segments; \
         aging/1 has {filled_segments}"
    );

    // After the gap, one message alone in a new active segment.
    tokio::time::sleep(GAP).await;
    produce_committed(&http, "aging", 1, big_payload()).await;
    let before = stats(&http, "aging", 1).await;
    let (segments, oldest, _, hwm, _) = before;
    assert_eq!(
        (segments, oldest, hwm),
        (filled_segments + 1, 0, FILL + 1),
        "the big message should roll the segment and be the active segment's only record"
    );
    let active_offset = FILL;
    let forever_before = stats(&http, "forever", 0).await;
    let idle_partition_before = stats(&http, "aging", 0).await;

    // +30 min: younger than the retention, nothing goes.
    restart_with_clock_offset(&mut server, HOUR_MS / 2).await;
    wait_retention_ran(&http).await;
    assert_eq!(
        stats(&http, "aging", 1).await,
        before,
        "+30 min: retention must not delete anything"
    );
    assert_eq!(stats(&http, "forever", 0).await, forever_before);
    let m = http.consume_msg("aging", "partition=1&offset=0").await;
    assert_eq!(
        m.payload_bytes(),
        fill_payload(0),
        "+30 min: replay of offset 0"
    );

    // Just past the retention for the sealed segments, the active one under an hour old:
    // the sealed ones go, the active one stays.
    let window = GAP - Duration::from_millis(MARGIN_MS);
    let window_ends = Instant::now() + window;
    let offset = HOUR_MS - (now_ms() - sealed_written_by) + MARGIN_MS;
    restart_with_clock_offset(&mut server, offset).await;
    let after = eventually(EFFECT_TIMEOUT, Duration::from_millis(20), || async {
        let s = stats(&http, "aging", 1).await;
        anyhow::ensure!(s.1 > 0, "aging/1 oldest_offset still 0: {s:?}");
        Ok(s)
    })
    .await;
    let (segments, oldest, next, hwm, size) = after;
    assert!(
        Instant::now() < window_ends,
        "the retention pass came too late to tell the active segment apart (it is an hour \
         old {window:?} after the restart); stats {after:?}"
    );
    assert_eq!(
        (oldest, hwm, next),
        (active_offset, FILL + 1, FILL + 1),
        "sealed segments deleted, the active segment kept"
    );
    assert_eq!(segments, 1, "only the active segment is left: {after:?}");
    assert!(
        size < before.4 && size >= BIG_BYTES as u64,
        "size_bytes {size} (before {})",
        before.4
    );
    assert_eq!(
        stats(&http, "aging", 0).await,
        idle_partition_before,
        "an empty partition is untouched"
    );
    // The deleted messages, all unconsumed, are counted as dropped. Checked before any
    // consume: a consume racing the retention pass skips them in the lease path, which does
    // not count them in the metric (a server bug, reported; this order keeps the test
    // deterministic).
    eventually(window, Duration::from_millis(20), || async {
        let text = http.metrics_text().await;
        let dropped = partition_counter(&text, "narad_consumer_dropped_messages", "aging", 1);
        let deleted = partition_counter(
            &text,
            "narad_storage_retention_messages_deleted",
            "aging",
            1,
        );
        let want = Some(active_offset as f64);
        anyhow::ensure!(
            dropped == want && deleted == want,
            "aging/1: narad_consumer_dropped_messages {dropped:?}, \
             narad_storage_retention_messages_deleted {deleted:?}, want {want:?}"
        );
        Ok(())
    })
    .await;

    // Replay below the oldest retained offset is gone; the active record is still there.
    for o in [0, active_offset - 1] {
        replay(&http, "aging", 1, o).await.expect_error(410);
    }
    let m = http
        .consume_msg("aging", &format!("partition=1&offset={active_offset}"))
        .await;
    assert_eq!(m.payload_bytes(), big_payload());
    // The queue skips the deleted messages.
    let m = http.consume_msg("aging", "wait=0").await;
    assert!(
        m.offset >= oldest,
        "queue consume delivered offset {} below the oldest retained {oldest}",
        m.offset
    );
    assert_eq!(
        (m.partition, m.offset),
        (1, active_offset),
        "the first message left"
    );
    assert_eq!(m.payload_bytes(), big_payload());
    assert!(
        Instant::now() < window_ends,
        "checks overran the window in which the active segment is younger than an hour"
    );
    http.consume_none("aging", "wait=0").await;

    // +1000 h: the active segment is now over an hour old, so it is sealed (§2.7) and, being
    // older than the retention, deleted; retention_ms 0 still keeps everything.
    restart_with_clock_offset(&mut server, 1000 * HOUR_MS).await;
    let gone = eventually(EFFECT_TIMEOUT, Duration::from_millis(20), || async {
        let s = stats(&http, "aging", 1).await;
        anyhow::ensure!(s.1 == s.3, "aging/1 not emptied yet: {s:?}");
        Ok(s)
    })
    .await;
    assert_eq!(
        gone,
        (1, FILL + 1, FILL + 1, FILL + 1, 0),
        "+1000 h: one empty active segment left"
    );
    replay(&http, "aging", 1, active_offset)
        .await
        .expect_error(410);
    http.consume_none("aging", &format!("partition=1&offset={}", FILL + 1))
        .await;
    http.consume_none("aging", "wait=0").await;

    wait_retention_ran(&http).await;
    let (_, oldest, next, hwm, size) = stats(&http, "forever", 0).await;
    assert_eq!(
        (oldest, next, hwm, size),
        (
            forever_before.1,
            forever_before.2,
            forever_before.3,
            forever_before.4
        ),
        "retention_ms 0 must keep everything, even at +1000 h"
    );
    replay(&http, "forever", 0, 0).await.expect(200);
    let all: Vec<Vec<u8>> = http
        .drain("forever", "wait=0")
        .await
        .iter()
        .map(Msg::payload_bytes)
        .collect();
    let want: Vec<Vec<u8>> = (0..FILL).map(fill_payload).collect();
    assert_eq!(all.len(), want.len(), "forever: every message is delivered");
    assert!(
        all == want,
        "forever: payloads differ from what was produced"
    );
}
