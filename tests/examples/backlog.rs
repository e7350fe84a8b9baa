//! Backlog benchmark (run by hand, not a test): shows that the cost of consume + ack does not
//! grow with the backlog.
//!
//! It fills `backlog-big` (8 partitions) with `--backlog` messages of 256 B and
//! `backlog-small` (8 partitions) with `--small` messages, by batch produce (100 messages per
//! request, `--producers` concurrent tasks, progress printed), waits until all are visible,
//! then on each topic runs `--consumers` tasks doing single consume (`wait=1s`) + single ack
//! for `--seconds`, and prints acked msg/s (with consume+ack latency percentiles) and the ratio
//! big/small. A ratio near 1 means the backlog size does not matter.
//!
//! Every task has its own HTTP/1.1 keep-alive client. Against a running server:
//!
//!     cargo run --release -p narad-tests --example backlog -- \
//!         --url http://127.0.0.1:7942 --backlog 10000000
//!
//! Options: `--url U` (default http://127.0.0.1:7942), `--backlog N` (10000000),
//! `--small N` (300000), `--seconds S` (10), `--producers P` (32), `--consumers C` (32),
//! `--reset` (delete both topics first; without it, existing topics are an error).
//! The server should run with security off (`--dev`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

const BIG: &str = "backlog-big";
const SMALL: &str = "backlog-small";
const PARTITIONS: u32 = 8;
const PAYLOAD_BYTES: usize = 256;
const BATCH: u64 = 100;
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

struct Args {
    url: String,
    backlog: u64,
    small: u64,
    seconds: u64,
    producers: u64,
    consumers: u64,
    reset: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: backlog [--url URL] [--backlog N] [--small N] [--seconds S] [--producers P] \
         [--consumers C] [--reset]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        url: "http://127.0.0.1:7942".into(),
        backlog: 10_000_000,
        small: 300_000,
        seconds: 10,
        producers: 32,
        consumers: 32,
        reset: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--reset" {
            a.reset = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            usage();
        }
        let Some(v) = it.next() else { usage() };
        let num = |v: &str| -> u64 {
            v.replace('_', "").parse().unwrap_or_else(|_| {
                eprintln!("{flag}: not a number: {v}");
                usage()
            })
        };
        match flag.as_str() {
            "--url" => a.url = v.trim_end_matches('/').to_string(),
            "--backlog" => a.backlog = num(&v),
            "--small" => a.small = num(&v),
            "--seconds" => a.seconds = num(&v).max(1),
            "--producers" => a.producers = num(&v).max(1),
            "--consumers" => a.consumers = num(&v).max(1),
            _ => usage(),
        }
    }
    a
}

/// One keep-alive HTTP/1.1 client (one per task).
fn client() -> reqwest::Client {
    narad_tests::http::client_builder(None)
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("build reqwest client")
}

fn topic_url(base: &str, topic: &str) -> String {
    format!("{base}/v1/topics/{topic}")
}

/// Sum of the topic's high watermarks.
async fn visible(c: &reqwest::Client, base: &str, topic: &str) -> anyhow::Result<u64> {
    let r = c.get(topic_url(base, topic)).send().await?;
    let status = r.status();
    let v: Value = r.json().await?;
    if !status.is_success() {
        bail!("GET {topic}: {status} {v}");
    }
    Ok(v["partition_stats"]
        .as_array()
        .context("no partition_stats")?
        .iter()
        .filter_map(|s| s["high_watermark"].as_u64())
        .sum())
}

async fn create(c: &reqwest::Client, a: &Args, topic: &str) -> anyhow::Result<()> {
    if a.reset {
        let r = c.delete(topic_url(&a.url, topic)).send().await?;
        match r.status().as_u16() {
            204 => eprintln!("deleted {topic}"),
            404 => {}
            s => bail!("DELETE {topic}: {s} {}", r.text().await.unwrap_or_default()),
        }
    }
    let r = c
        .post(format!("{}/v1/topics", a.url))
        .header("content-type", "application/json")
        .body(json!({"name": topic, "partitions": PARTITIONS}).to_string())
        .send()
        .await?;
    match r.status().as_u16() {
        201 => Ok(()),
        409 => bail!("topic {topic} exists: pass --reset to delete and refill it"),
        s => bail!("create {topic}: {s} {}", r.text().await.unwrap_or_default()),
    }
}

/// The batch body for messages `first..first+n`: JSON strings of exactly 256 bytes.
fn batch_body(first: u64, n: u64) -> String {
    let messages: Vec<Value> = (first..first + n)
        .map(|i| {
            // 254 characters + the two quotes = 256 stored bytes.
            let mut s = format!("m{i:012}-");
            s.extend(std::iter::repeat_n('x', PAYLOAD_BYTES - 2 - s.len()));
            json!({ "payload": s })
        })
        .collect();
    json!({ "messages": messages }).to_string()
}

async fn fill(a: &Args, topic: &str, total: u64) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.producers {
        let (next, done, stop) = (next.clone(), done.clone(), stop.clone());
        let url = format!("{}/produce/batch", topic_url(&a.url, topic));
        tasks.spawn(async move {
            let c = client();
            while !stop.load(Ordering::Relaxed) {
                let first = next.fetch_add(BATCH, Ordering::Relaxed);
                if first >= total {
                    break;
                }
                let n = BATCH.min(total - first);
                let body = batch_body(first, n);
                let mut attempt = 0;
                loop {
                    let r = c
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    match r {
                        Ok(r) if r.status().as_u16() == 202 => break,
                        Ok(r) if r.status().as_u16() == 503 && attempt < 50 => {}
                        Ok(r) => {
                            stop.store(true, Ordering::Relaxed);
                            let s = r.status();
                            bail!("produce: {s} {}", r.text().await.unwrap_or_default());
                        }
                        Err(e) if attempt < 50 => eprintln!("produce: {e} (retrying)"),
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            return Err(e.into());
                        }
                    }
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                done.fetch_add(n, Ordering::Relaxed);
            }
            Ok(())
        });
    }
    let progress = {
        let done = done.clone();
        let topic = topic.to_string();
        tokio::spawn(async move {
            let mut last = (Instant::now(), 0u64);
            loop {
                tokio::time::sleep(PROGRESS_EVERY).await;
                let d = done.load(Ordering::Relaxed);
                let rate = (d - last.1) as f64 / last.0.elapsed().as_secs_f64();
                last = (Instant::now(), d);
                eprintln!(
                    "fill {topic}: {d}/{total} ({:.1}%), {rate:.0} msg/s",
                    100.0 * d as f64 / total.max(1) as f64
                );
            }
        })
    };
    let mut first_err = None;
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r.context("producer task").and_then(|r| r) {
            first_err.get_or_insert(e);
        }
    }
    progress.abort();
    if let Some(e) = first_err {
        return Err(e);
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "fill {topic}: {total} messages accepted in {secs:.1} s ({:.0} msg/s); waiting until \
         all are visible",
        total as f64 / secs
    );
    let c = client();
    let mut last_report = Instant::now();
    loop {
        let v = visible(&c, &a.url, topic).await?;
        if v >= total {
            break;
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            eprintln!("fill {topic}: {v}/{total} visible");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct Consumed {
    receipt_handle: String,
}

struct Phase {
    acked: u64,
    errors: u64,
    empty: u64,
    secs: f64,
    /// Consume + ack latencies, microseconds, sorted.
    lat_us: Vec<u32>,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.acked as f64 / self.secs
    }

    fn pct(&self, p: f64) -> f64 {
        if self.lat_us.is_empty() {
            return 0.0;
        }
        let i = ((self.lat_us.len() - 1) as f64 * p).round() as usize;
        f64::from(self.lat_us[i]) / 1000.0
    }
}

async fn consume(a: &Args, topic: &str) -> anyhow::Result<Phase> {
    let acked = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let empty = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(a.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.consumers {
        let (acked, errors, empty) = (acked.clone(), errors.clone(), empty.clone());
        let consume_url = format!("{}/consume?wait=1s", topic_url(&a.url, topic));
        let ack_url = format!("{}/ack?receipt_handle=", topic_url(&a.url, topic));
        tasks.spawn(async move {
            let c = client();
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let r = match c.get(&consume_url).send().await {
                    Ok(r) => r,
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                match r.status().as_u16() {
                    200 => {}
                    204 => {
                        empty.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let _ = r.bytes().await;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                }
                let m: Consumed = match r.json().await {
                    Ok(m) => m,
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                let url = format!("{ack_url}{}", narad_tests::pct(&m.receipt_handle));
                match c.post(&url).send().await {
                    Ok(r) if r.status().as_u16() == 204 => {
                        acked.fetch_add(1, Ordering::Relaxed);
                        lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            lat
        });
    }
    let mut lat_us = Vec::new();
    while let Some(r) = tasks.join_next().await {
        lat_us.extend(r.context("consumer task")?);
    }
    lat_us.sort_unstable();
    Ok(Phase {
        acked: acked.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        empty: empty.load(Ordering::Relaxed),
        secs: start.elapsed().as_secs_f64(),
        lat_us,
    })
}

/// Whether consumers ran out of messages (then the rate measures the backlog size, not the
/// server).
fn exhausted(backlog: u64, p: &Phase) -> bool {
    p.empty > 0 || p.acked >= backlog
}

fn report(topic: &str, backlog: u64, p: &Phase) {
    println!(
        "{topic:<14} backlog {backlog:>10}: {:>9.0} acked msg/s ({} in {:.1} s); consume+ack \
         p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms; {} empty polls, {} errors",
        p.rate(),
        p.acked,
        p.secs,
        p.pct(0.50),
        p.pct(0.95),
        p.pct(0.99),
        p.empty,
        p.errors
    );
    if exhausted(backlog, p) {
        println!(
            "  note: {topic} ran out of messages during the run; its rate is a lower bound \
             (raise its backlog or lower --seconds)"
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = parse_args();
    let c = client();
    let health = c
        .get(format!("{}/healthz", a.url))
        .send()
        .await
        .with_context(|| format!("cannot reach {}", a.url))?;
    if !health.status().is_success() {
        bail!("{}/healthz: {}", a.url, health.status());
    }
    println!(
        "backlog benchmark against {}: {BIG} {} msgs, {SMALL} {} msgs ({PAYLOAD_BYTES} B, \
         {PARTITIONS} partitions); {} consumers for {} s each",
        a.url, a.backlog, a.small, a.consumers, a.seconds
    );
    for (topic, n) in [(BIG, a.backlog), (SMALL, a.small)] {
        create(&c, &a, topic).await?;
        fill(&a, topic, n).await?;
    }
    let big = consume(&a, BIG).await?;
    report(BIG, a.backlog, &big);
    let small = consume(&a, SMALL).await?;
    report(SMALL, a.small, &small);
    println!(
        "ratio big/small: {:.2} (1.00 = consume+ack cost independent of the backlog){}",
        big.rate() / small.rate().max(1e-9),
        if exhausted(a.backlog, &big) || exhausted(a.small, &small) {
            "; NOT MEANINGFUL: a backlog ran out"
        } else {
            ""
        }
    );
    Ok(())
}
