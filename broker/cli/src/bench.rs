//! `narad bench <topic> [--count N] [--size B] [--workers W] [--consume]`: produce N messages
//! of B bytes with W concurrent workers, optionally consume and ack them all; prints throughput
//! and p50/p95/p99 latency.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::Bytes;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use narad_api::{Client, CreateTopicRequest, Error};
use rand::Rng;

use crate::conn::{connect, ConnArgs};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Topic (created with defaults if missing)
    pub topic: String,
    /// Messages to produce
    #[arg(long, short = 'n', default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// Payload size in bytes (1 B – 1 MiB)
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub size: u64,
    /// Concurrent workers
    #[arg(long, short = 'w', default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub workers: u64,
    /// Then consume and ack all of them
    #[arg(long)]
    pub consume: bool,
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// Results of one phase.
pub struct PhaseReport {
    pub name: &'static str,
    pub messages: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    pub hist: Histogram<u64>,
    pub errors: u64,
}

impl PhaseReport {
    /// `produce: 10000 msgs in 1.23 s = 8130 msg/s, 2.08 MB/s; latency p50 … p99 …`
    pub fn render(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
        let mut s = format!(
            "{:<8} {} msgs in {:.2} s = {:.0} msg/s, {:.2} MB/s; latency p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            format!("{}:", self.name),
            self.messages,
            secs,
            self.messages as f64 / secs,
            self.bytes as f64 / secs / 1e6,
            q(0.50),
            q(0.95),
            q(0.99),
            self.hist.max() as f64 / 1000.0,
        );
        if self.errors > 0 {
            s.push_str(&format!("; {} errors", self.errors));
        }
        s
    }
}

fn new_hist() -> Histogram<u64> {
    // Microseconds, 1 µs – 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

fn progress(total: u64, label: &str) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template(&format!(
            "{label:<8} {{bar:40}} {{pos}}/{{len}}  {{per_sec}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(b)
}

/// A payload of `size` random alphanumeric bytes (text: rendered as a JSON string).
pub fn payload(size: usize) -> Bytes {
    let mut rng = rand::rng();
    let b: Vec<u8> = (0..size)
        .map(|_| rng.sample(rand::distr::Alphanumeric))
        .collect();
    Bytes::from(b)
}

async fn ensure_topic(client: &Client, topic: &str) -> anyhow::Result<()> {
    match client.get_topic(topic, None).await {
        Ok(_) => Ok(()),
        Err(e) if e.status() == Some(404) => {
            let req = CreateTopicRequest {
                name: topic.to_string(),
                ..Default::default()
            };
            match client.create_topic(&req).await {
                Ok(t) => {
                    eprintln!("created topic {} ({} partitions)", t.name, t.partitions);
                    Ok(())
                }
                Err(e) if e.status() == Some(409) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Shared state of the workers of one phase.
struct Shared {
    next: AtomicU64,
    done: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
    fatal: Mutex<Option<Error>>,
    hist: Mutex<Histogram<u64>>,
    bar: Option<ProgressBar>,
}

impl Shared {
    fn new(bar: Option<ProgressBar>) -> Arc<Shared> {
        Arc::new(Shared {
            next: AtomicU64::new(0),
            done: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            fatal: Mutex::new(None),
            hist: Mutex::new(new_hist()),
            bar,
        })
    }

    fn fail(&self, e: Error) {
        self.stop.store(true, Ordering::Relaxed);
        self.fatal.lock().unwrap().get_or_insert(e);
    }

    fn record(&self, local: &Histogram<u64>) {
        self.hist.lock().unwrap().add(local).ok();
    }
}

async fn produce_phase(client: &Client, a: &BenchArgs) -> anyhow::Result<PhaseReport> {
    let body = payload(a.size as usize);
    let sh = Shared::new(progress(a.count, "produce"));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..a.workers.min(a.count) {
        let (client, topic, body, sh) = (client.clone(), a.topic.clone(), body.clone(), sh.clone());
        let count = a.count;
        set.spawn(async move {
            let mut h = new_hist();
            let mut retries = 0u32;
            while !sh.stop.load(Ordering::Relaxed) {
                let i = sh.next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                loop {
                    let t0 = Instant::now();
                    match client.produce(&topic, body.clone(), None, None).await {
                        Ok(()) => {
                            h.saturating_record(t0.elapsed().as_micros() as u64);
                            sh.done.fetch_add(1, Ordering::Relaxed);
                            if let Some(b) = &sh.bar {
                                b.inc(1);
                            }
                            retries = 0;
                            break;
                        }
                        Err(e) if e.is_retryable() && retries < 20 => {
                            sh.errors.fetch_add(1, Ordering::Relaxed);
                            retries += 1;
                            tokio::time::sleep(crate::subscribe::backoff(retries, Some(&e))).await;
                        }
                        Err(e) => {
                            sh.fail(e);
                            break;
                        }
                    }
                }
            }
            sh.record(&h);
        });
    }
    while set.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    if let Some(b) = &sh.bar {
        b.finish_and_clear();
    }
    if let Some(e) = sh.fatal.lock().unwrap().take() {
        bail!("produce failed: {e}");
    }
    let n = sh.done.load(Ordering::Relaxed);
    let hist = sh.hist.lock().unwrap().clone();
    Ok(PhaseReport {
        name: "produce",
        messages: n,
        bytes: n * a.size,
        elapsed,
        hist,
        errors: sh.errors.load(Ordering::Relaxed),
    })
}

/// Consumes and acks until `count` messages are acked or nothing arrives for `idle`.
async fn consume_phase(client: &Client, a: &BenchArgs) -> anyhow::Result<PhaseReport> {
    const IDLE: Duration = Duration::from_secs(15);
    let sh = Shared::new(progress(a.count, "consume"));
    let last_progress = Arc::new(Mutex::new(Instant::now()));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..a.workers.min(a.count) {
        let (client, topic, sh, last) = (
            client.clone(),
            a.topic.clone(),
            sh.clone(),
            last_progress.clone(),
        );
        let count = a.count;
        set.spawn(async move {
            let mut h = new_hist();
            let mut retries = 0u32;
            while !sh.stop.load(Ordering::Relaxed) && sh.done.load(Ordering::Relaxed) < count {
                if last.lock().unwrap().elapsed() > IDLE {
                    break;
                }
                let t0 = Instant::now();
                let m = match client
                    .consume(&topic, Some(Duration::from_secs(1)), None)
                    .await
                {
                    Ok(Some(m)) => m,
                    Ok(None) => continue,
                    Err(e) if e.is_retryable() && retries < 20 => {
                        sh.errors.fetch_add(1, Ordering::Relaxed);
                        retries += 1;
                        tokio::time::sleep(crate::subscribe::backoff(retries, Some(&e))).await;
                        continue;
                    }
                    Err(e) => {
                        sh.fail(e);
                        break;
                    }
                };
                let handle = m.receipt_handle.clone().unwrap_or_default();
                let acked = loop {
                    match client.ack(&m.topic, &handle).await {
                        Ok(()) => break true,
                        Err(e) if e.is_retryable() && retries < 20 => {
                            sh.errors.fetch_add(1, Ordering::Relaxed);
                            retries += 1;
                            tokio::time::sleep(crate::subscribe::backoff(retries, Some(&e))).await;
                        }
                        Err(_) => {
                            sh.errors.fetch_add(1, Ordering::Relaxed);
                            break false;
                        }
                    }
                };
                if !acked {
                    continue;
                }
                retries = 0;
                h.saturating_record(t0.elapsed().as_micros() as u64);
                sh.done.fetch_add(1, Ordering::Relaxed);
                *last.lock().unwrap() = Instant::now();
                if let Some(b) = &sh.bar {
                    b.inc(1);
                }
            }
            sh.record(&h);
        });
    }
    while set.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    if let Some(b) = &sh.bar {
        b.finish_and_clear();
    }
    if let Some(e) = sh.fatal.lock().unwrap().take() {
        bail!("consume failed: {e}");
    }
    let n = sh.done.load(Ordering::Relaxed);
    if n < a.count {
        eprintln!(
            "narad: only {n} of {} messages consumed (nothing more arrived within {}s)",
            a.count,
            IDLE.as_secs()
        );
    }
    let hist = sh.hist.lock().unwrap().clone();
    Ok(PhaseReport {
        name: "consume",
        messages: n,
        bytes: n * a.size,
        elapsed,
        hist,
        errors: sh.errors.load(Ordering::Relaxed),
    })
}

/// Runs `bench`.
pub async fn run(a: BenchArgs) -> anyhow::Result<()> {
    let client = connect(&a.conn)?;
    ensure_topic(&client, &a.topic).await?;
    println!(
        "bench {}: {} messages of {} B, {} workers",
        a.topic, a.count, a.size, a.workers
    );
    let p = produce_phase(&client, &a).await?;
    println!("{}", p.render());
    if a.consume {
        let c = consume_phase(&client, &a).await?;
        println!("{}  (consume + ack)", c.render());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_line() {
        let mut h = new_hist();
        for v in 1..=1000u64 {
            h.record(v * 10).unwrap();
        }
        let r = PhaseReport {
            name: "produce",
            messages: 1000,
            bytes: 256_000,
            elapsed: Duration::from_millis(500),
            hist: h,
            errors: 0,
        };
        let s = r.render();
        assert!(
            s.starts_with(
                "produce: 1000 msgs in 0.50 s = 2000 msg/s, 0.51 MB/s; latency p50 5.00 ms"
            ),
            "{s}"
        );
        assert!(s.contains("p99 9.90 ms"), "{s}");
    }

    #[test]
    fn payloads() {
        let p = payload(300);
        assert_eq!(p.len(), 300);
        assert!(p.iter().all(u8::is_ascii_alphanumeric));
    }
}
