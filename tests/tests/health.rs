//! Probes, metrics and graceful shutdown (SPEC §3.10, §6.2, §9).

use std::collections::BTreeMap;
use std::time::Duration;

use narad_tests::*;

/// SPEC §8: `http.shutdown_grace` default.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Slack on top of the grace for process teardown on a loaded CI machine.
const EXIT_SLACK: Duration = Duration::from_secs(3);

/// The label names used on samples of `name`.
fn metric_labels(text: &str, name: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(&format!("{name}{{"))) {
        let inner = &line[name.len() + 1..line.find('}').unwrap_or(line.len())];
        for pair in inner.split(',') {
            if let Some((k, _)) = pair.split_once('=') {
                *out.entry(k.trim().to_string()).or_default() += 1;
            }
        }
    }
    out
}

#[tokio::test]
async fn probes_answer_ok_and_ready() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    assert_eq!(
        http.get("/healthz").await.expect_json(200),
        json!({"status": "ok"})
    );
    assert_eq!(
        http.get("/readyz").await.expect_json(200),
        json!({"status": "ready"})
    );
}

#[tokio::test]
async fn metrics_count_requests_and_messages() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("metered").await;
    for i in 0..5 {
        http.produce_ok("metered", "", format!("m{i}")).await;
    }
    http.wait_total_visible("metered", 5).await;
    for _ in 0..3 {
        let m = http.consume_msg("metered", "wait=0").await;
        http.ack_ok("metered", m.handle()).await;
    }

    let text = eventually(
        Duration::from_secs(5),
        Duration::from_millis(100),
        || async {
            let r = http.get("/metrics").await;
            anyhow::ensure!(r.status == 200, "{}", r.describe());
            let text = r.text();
            for (name, at_least) in [
                ("narad_http_requests_total", 10.0),
                ("narad_messages_produced_total", 5.0),
                ("narad_messages_consumed_total", 3.0),
            ] {
                let v = metric_sum(&text, name);
                anyhow::ensure!(
                    v.is_some_and(|v| v >= at_least),
                    "{name} = {v:?}, want >= {at_least}"
                );
            }
            Ok(text)
        },
    )
    .await;
    let labels = metric_labels(&text, "narad_http_requests_total");
    for l in ["route", "method", "status"] {
        assert!(
            labels.contains_key(l),
            "narad_http_requests_total lacks label {l}: {labels:?}"
        );
    }
    let labels = metric_labels(&text, "narad_messages_produced_total");
    for l in ["topic", "partition"] {
        assert!(
            labels.contains_key(l),
            "narad_messages_produced_total lacks label {l}: {labels:?}"
        );
    }
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let mut server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("idle").await;

    // A long poll is in flight when SIGTERM arrives; it must get a real answer. The poll
    // is known to be in flight once the server's in-flight gauge rises (no sleep needed).
    let in_flight = |http: Http| async move {
        let r = http.get("/metrics").await;
        metric_sum(&r.text(), "narad_http_requests_in_flight").unwrap_or(0.0)
    };
    let baseline = in_flight(http.clone()).await;
    let poll = {
        let http = http.clone();
        tokio::spawn(async move {
            http.request(
                Method::GET,
                format!("{}/consume?wait=3s", topic_path("idle")),
            )
            .try_send()
            .await
        })
    };
    eventually(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            let n = in_flight(http.clone()).await;
            anyhow::ensure!(
                n >= baseline + 1.0,
                "narad_http_requests_in_flight = {n}, baseline {baseline}"
            );
            Ok(())
        },
    )
    .await;
    let t = tokio::time::Instant::now();
    server.terminate();

    // Health turns 503 (or the listener closes) soon after SIGTERM.
    eventually(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            match http
                .request(Method::GET, "/healthz")
                .timeout(Duration::from_secs(1))
                .try_send()
                .await
            {
                Err(_) => Ok(()),
                Ok(r) if r.status == 503 => {
                    anyhow::ensure!(
                        r.json() == json!({"status": "shutting down"}),
                        "{}",
                        r.describe()
                    );
                    Ok(())
                }
                Ok(r) => anyhow::bail!("/healthz after SIGTERM: {}", r.describe()),
            }
        },
    )
    .await;

    let status = server.wait_exit(SHUTDOWN_GRACE + EXIT_SLACK).await;
    let took = t.elapsed();
    let status = status.unwrap_or_else(|| panic!("narad still running {took:?} after SIGTERM"));
    assert!(status.success(), "exit status after SIGTERM: {status}");

    let r = poll.await.unwrap();
    match r {
        Ok(r) => assert!(
            matches!(r.status, 200 | 204 | 503),
            "in-flight long poll: {}",
            r.describe()
        ),
        Err(e) => panic!("the in-flight long poll was cut off instead of answered: {e:?}"),
    }
}

/// Issue 14 bug 7: with `http.shutdown_delay`, SIGTERM fails `/readyz` at once (so a load
/// balancer takes the node out) while the node keeps serving everything for the delay:
/// produce, consume, settle and `/healthz` (liveness) still work; then it shuts down
/// gracefully and exits. Without the delay the listener would stop right away.
#[tokio::test]
async fn shutdown_delay_fails_readiness_first_and_keeps_serving() {
    const DELAY: Duration = Duration::from_secs(4);
    let mut server =
        Server::start(ServerOpts::default().env("NARAD_HTTP_SHUTDOWN_DELAY", "4s")).await;
    let http = Http::new(server.url());
    http.create_topic_named("late").await;
    http.produce_ok("late", "", "before").await;
    http.wait_total_visible("late", 1).await;
    let t = tokio::time::Instant::now();
    server.terminate();
    // Not ready at once, with a reason.
    eventually(
        Duration::from_secs(2),
        Duration::from_millis(10),
        || async {
            let r = http.get("/readyz").await;
            anyhow::ensure!(r.status == 503, "/readyz after SIGTERM: {}", r.describe());
            anyhow::ensure!(r.text().contains("shutting down"), "{}", r.describe());
            Ok(())
        },
    )
    .await;
    // Still serving: liveness, produce, consume, ack.
    assert_eq!(
        http.get("/healthz").await.expect_json(200),
        json!({"status": "ok"})
    );
    // Every answer now closes its connection, so keep-alive clients reconnect elsewhere
    // (through a Service, to a ready pod) before this node stops listening.
    let r = http
        .request(Method::POST, "/v1/topics/late/produce")
        .body("during the delay")
        .send()
        .await;
    r.expect(202);
    assert_eq!(r.header("connection"), Some("close"), "{}", r.describe());
    http.produce_ok("late", "", "during the delay").await;
    http.wait_total_visible("late", 3).await;
    let m = http.consume_msg("late", "wait=0").await;
    http.ack_ok("late", m.handle()).await;
    assert!(
        t.elapsed() < DELAY,
        "the checks took the whole delay ({:?}); the test proves nothing",
        t.elapsed()
    );
    assert!(server.is_running(), "exited before the delay ended");
    // Then the graceful shutdown, and the process exits.
    let status = server
        .wait_exit(DELAY + SHUTDOWN_GRACE + EXIT_SLACK)
        .await
        .unwrap_or_else(|| panic!("narad still running {:?} after SIGTERM", t.elapsed()));
    assert!(status.success(), "exit status after SIGTERM: {status}");
    assert!(
        t.elapsed() >= DELAY,
        "exited after {:?}, before the delay",
        t.elapsed()
    );
}

/// A disk whose every WAL write and fsync takes `STALL`: the node's runtime writes the WAL
/// itself while fsyncs are quick (one worker, `NARAD_WAL_INLINE`), so the first slow one
/// stalls it once; the WAL's thread then takes the writing over, and probes and consumes
/// answer while produces wait for the disk.
#[tokio::test]
async fn a_slow_disk_delays_produces_not_probes_or_consumes() {
    const STALL: Duration = Duration::from_secs(3);
    let server = Server::start(ServerOpts::default().env("NARAD_WORKER_THREADS", "1").env(
        "NARAD_TEST_WAL_FSYNC_STALL_MS",
        STALL.as_millis().to_string(),
    ))
    .await;
    let http = server.http();
    http.create_topic_named("slow").await;
    let started = std::time::Instant::now();
    http.produce_ok("slow", "", "first").await;
    assert!(
        started.elapsed() >= STALL,
        "the stall never reached the WAL"
    );
    http.wait_total_visible("slow", 1).await;

    let producer = http.clone();
    let second = tokio::spawn(async move { producer.produce_ok("slow", "", "second").await });
    // The second produce is in its write by now (it takes `STALL`).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = std::time::Instant::now();
    http.get("/healthz").await.expect_json(200);
    let m = http.consume_msg("slow", "wait=0").await;
    let answered = asked.elapsed();
    assert!(
        answered < STALL / 2,
        "a probe and a consume took {answered:?} behind a slow WAL write"
    );
    assert!(
        !second.is_finished(),
        "the second produce was done before the probe: the test proves nothing"
    );
    assert_eq!(m.payload_bytes(), b"first");
    second.await.unwrap();
    http.wait_total_visible("slow", 2).await;
    // Once, at the first slow write; the WAL's thread has written since.
    let takeovers = eventually(
        Duration::from_secs(5),
        Duration::from_millis(100),
        || async {
            let text = http.metrics_text().await;
            metric_sum(&text, "narad_wal_first_lane_takeovers_total")
                .filter(|&n| n > 0.0)
                .ok_or_else(|| anyhow::anyhow!("no takeover counted"))
        },
    )
    .await;
    assert_eq!(takeovers, 1.0);
}
