//! Resource cost of topics (SPEC §8 `storage.idle_log_eviction_ms`): an idle topic costs
//! only metadata — no threads, no open files — and a partition log left idle closes its files
//! and reopens them on next use.
//!
//! Counts come from `/proc/<pid>/fd` and `/proc/<pid>/task` of the server (Linux). They are
//! polled, not sampled once: connections, the blocking thread pool (idle threads exit after
//! ~10 s) and idle eviction settle asynchronously.

use std::time::Duration;

use narad_tests::*;

/// How much the fd or thread count may exceed its baseline (connections, a blocking thread).
const SLACK: usize = 5;
/// How long counts may take to settle (the blocking pool keeps idle threads ~10 s).
const SETTLE: Duration = Duration::from_secs(20);
/// Idle-log eviction time for the eviction test (test knob; the user floor is 60 s).
const EVICT_MS: u64 = 500;

const EVICTED: &str = "narad_idle_logs_evicted_total";

/// Waits until the server's fd and thread counts are at most `fds` and `threads` (`None`: not
/// checked); returns the counts.
async fn wait_counts_at_most(
    server: &Server,
    fds: usize,
    threads: Option<usize>,
    what: &str,
) -> (usize, usize) {
    eventually(SETTLE, Duration::from_millis(100), || async {
        let (f, t) = (server.open_fds(), server.threads());
        anyhow::ensure!(
            f <= fds && threads.is_none_or(|max| t <= max),
            "{what}: {f} open fds (at most {fds} allowed), {t} threads (at most {threads:?})"
        );
        Ok((f, t))
    })
    .await
}

#[tokio::test]
async fn idle_topics_cost_no_threads_or_open_files() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    // Warm up the paths used below (metadata commit, topic read) so that what they create
    // once, lazily, is part of the baseline.
    http.create_topic_named("warmup").await;
    http.get_topic("warmup", "").await;
    let (fd0, th0) = (server.open_fds(), server.threads());
    eprintln!("baseline: {fd0} open fds, {th0} threads");

    for i in 0..200 {
        http.create_topic(&json!({"name": format!("idle-{i:03}"), "partitions": 3}))
            .await;
    }
    let list = http.get("/v1/topics?limit=1000").await.expect_json(200);
    assert_eq!(
        list["topics"].as_array().map(Vec::len),
        Some(201),
        "all topics exist"
    );
    eprintln!(
        "after creating 200 topics x 3 partitions: {} open fds, {} threads",
        server.open_fds(),
        server.threads()
    );
    let (fds, threads) = wait_counts_at_most(
        &server,
        fd0 + SLACK,
        Some(th0 + SLACK),
        "200 idle topics (600 partitions) must cost no open files or threads",
    )
    .await;
    eprintln!("settled: {fds} open fds, {threads} threads");
}

#[tokio::test]
async fn idle_logs_close_their_files_and_reopen_on_use() {
    let server = Server::start(
        ServerOpts::default().env("NARAD_TEST_IDLE_LOG_EVICTION_MS", EVICT_MS.to_string()),
    )
    .await;
    let http = Http::new(server.url());
    http.get("/v1/topics").await.expect_json(200);
    let fd0 = server.open_fds();

    // Produce to and consume from every partition of 50 topics: their logs open files.
    let mut peak = fd0;
    for i in 0..50 {
        let topic = format!("busy-{i:02}");
        http.create_topic(&json!({"name": topic, "partitions": 3}))
            .await;
        let batch: Vec<Value> = (0..3)
            .map(|p| json!({"payload": format!("{topic}/{p}"), "partition": p}))
            .collect();
        http.produce_batch(&topic, &json!({ "messages": batch }))
            .await
            .expect_json(202);
        http.wait_total_visible(&topic, 3).await;
        let got = http.drain(&topic, "wait=0").await;
        assert_eq!(got.len(), 3, "{topic}: {got:?}");
        peak = peak.max(server.open_fds());
    }
    eprintln!("baseline {fd0} open fds; peak {peak} while 50 topics were in use");
    assert!(
        peak >= fd0 + 3,
        "partition logs in use should hold open files (baseline {fd0}, peak {peak})"
    );

    // Idle for EVICT_MS: every log closes its files.
    let (fds, _) = wait_counts_at_most(
        &server,
        fd0 + SLACK,
        None,
        "idle logs must close their files",
    )
    .await;
    eprintln!("after idling: {fds} open fds");
    let text = http.metrics_text().await;
    let evicted = metric_sum(&text, EVICTED).unwrap_or(0.0);
    assert!(
        evicted >= 150.0,
        "{EVICTED} = {evicted}; every one of the 150 used partition logs was closed"
    );

    // A closed log reopens on use: produce and consume again, and replay the old record.
    http.produce_ok("busy-07", "partition=1", "after eviction")
        .await;
    http.wait_visible("busy-07", 1, 2).await;
    let m = http.consume_msg("busy-07", "wait=0").await;
    assert_eq!(
        (m.partition, m.offset, m.payload_bytes()),
        (1, 1, b"after eviction".to_vec())
    );
    http.ack_ok("busy-07", m.handle()).await;
    http.consume_none("busy-07", "wait=0").await;
    let old = http.consume_msg("busy-07", "partition=2&offset=0").await;
    assert_eq!(old.payload_bytes(), b"busy-07/2".to_vec());
    let old = http.consume_msg("busy-42", "partition=0&offset=0").await;
    assert_eq!(old.payload_bytes(), b"busy-42/0".to_vec());

    // The counter counts closes: logs that are already closed are not "evicted" again.
    wait_counts_at_most(&server, fd0 + SLACK, None, "idle logs close again").await;
    let quiet_from = eventually(SETTLE, Duration::from_millis(100), || async {
        // Stable across two eviction periods: everything is closed and counted.
        let a = metric_sum(&http.metrics_text().await, EVICTED).unwrap_or(0.0);
        tokio::time::sleep(Duration::from_millis(2 * EVICT_MS)).await;
        let b = metric_sum(&http.metrics_text().await, EVICTED).unwrap_or(0.0);
        anyhow::ensure!(
            a == b,
            "{EVICTED} went from {a} to {b} in {}ms while no partition was used and no file \
             was open: already-closed logs are counted again on every eviction tick",
            2 * EVICT_MS
        );
        Ok(b)
    })
    .await;
    eprintln!("{EVICTED} = {quiet_from}");
}
