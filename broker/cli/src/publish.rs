//! `narad pub <topic> [msg] [--key K] [--partition N] [--attr NAME=VALUE]… [--delay D]
//! [--idempotency-key K] [--file F] [--count N] [--rate R]`.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use indicatif::{ProgressBar, ProgressStyle};

use narad_api::retry::Retry;

use crate::conn::{connect, ConnArgs};

/// Concurrent requests when publishing many messages.
const MAX_WORKERS: u64 = 16;

#[derive(Debug, clap::Args)]
pub struct PubArgs {
    /// Topic
    pub topic: String,
    /// The message (default: --file, else stdin)
    #[arg(conflicts_with = "file")]
    pub msg: Option<String>,
    /// Message key (picks the partition by hash)
    #[arg(long, short = 'k')]
    pub key: Option<String>,
    /// Pin the message to this partition
    #[arg(long)]
    pub partition: Option<u32>,
    /// An attribute stored beside the key, NAME=VALUE (repeatable: up to 16; names of
    /// A-Za-z0-9-_. are returned lowercased)
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = parse_attr)]
    pub attrs: Vec<(String, String)>,
    /// The message enters its partition (consumable, replayable) no earlier than this after
    /// the broker accepted it: 90s, 2m, 1500ms; at most 15m
    #[arg(long, value_name = "D", value_parser = parse_delay)]
    pub delay: Option<String>,
    /// A retry (--retries) or a second pub with the same key within the topic's dedup window
    /// is not stored again (1-128 visible ASCII characters; with --count every message
    /// carries it, so one is stored)
    #[arg(long, value_name = "K")]
    pub idempotency_key: Option<String>,
    /// Read the message from this file ("-" for stdin)
    #[arg(long, short = 'f', value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Publish the message this many times
    #[arg(long, short = 'n', default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// Pace at this many messages per second
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Attempts per message in total (1: no retry). A refused connection, a timeout, 408,
    /// 429 and 5xx are retried with jittered backoff, honouring Retry-After, as the SDK does;
    /// a retry after an uncertain failure may store the message twice (at-least-once)
    #[arg(long, default_value_t = 4, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub retries: u32,
    #[command(flatten)]
    pub conn: ConnArgs,
}

fn parse_attr(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((n, v)) if !n.is_empty() => Ok((n.to_string(), v.to_string())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

fn parse_delay(s: &str) -> Result<String, String> {
    narad_api::parse_produce_delay(s).map(|_| s.to_string())
}

/// What a message carries besides its payload, key and partition.
#[derive(Debug, Clone, Default)]
struct Extras {
    attrs: Option<BTreeMap<String, String>>,
    delay: Option<String>,
    idempotency_key: Option<String>,
}

/// The message bytes: the argument, the file, or stdin.
pub fn read_message(a: &PubArgs) -> anyhow::Result<Vec<u8>> {
    let bytes = if let Some(m) = &a.msg {
        m.as_bytes().to_vec()
    } else {
        match &a.file {
            Some(p) if p.as_os_str() != "-" => {
                std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?
            }
            _ => {
                let stdin = std::io::stdin();
                if stdin.is_terminal() {
                    eprintln!("reading the message from stdin (end with Ctrl-D)");
                }
                let mut b = Vec::new();
                stdin
                    .lock()
                    .read_to_end(&mut b)
                    .context("cannot read stdin")?;
                b
            }
        }
    };
    if bytes.is_empty() {
        bail!("empty message: a message has 1 byte to 1 MiB");
    }
    if bytes.len() > 1 << 20 {
        bail!("message too large: {} bytes (at most 1 MiB)", bytes.len());
    }
    Ok(bytes)
}

/// Runs `pub`.
pub async fn run(a: PubArgs) -> anyhow::Result<()> {
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0) {
            bail!("--rate must be a positive number of messages per second");
        }
    }
    let client = connect(&a.conn)?;
    let payload = Bytes::from(read_message(&a)?);
    let key: Option<Bytes> = a.key.clone().filter(|k| !k.is_empty()).map(Bytes::from);
    let extras = Arc::new(Extras {
        attrs: (!a.attrs.is_empty()).then(|| a.attrs.iter().cloned().collect()),
        delay: a.delay.clone(),
        idempotency_key: a.idempotency_key.clone(),
    });
    let count = a.count;
    let start = Instant::now();
    let retry = Retry {
        attempts: a.retries,
        ..Retry::default()
    };

    if count == 1 {
        produce(
            &client,
            retry,
            &a.topic,
            &payload,
            key.as_deref(),
            a.partition,
            &extras,
        )
        .await?;
        if std::io::stderr().is_terminal() {
            eprintln!("published 1 message to {}", a.topic);
        }
        return Ok(());
    }

    let bar = if (count > 1000 || a.rate.is_some()) && std::io::stderr().is_terminal() {
        let b = ProgressBar::new(count);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} msgs  {per_sec}  eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };

    // Workers take tickets; ticket i is sent no earlier than start + i/rate.
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers = count.min(MAX_WORKERS);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (client, topic, payload, key, extras) = (
            client.clone(),
            a.topic.clone(),
            payload.clone(),
            key.clone(),
            extras.clone(),
        );
        let (next, done, stop, bar) = (next.clone(), done.clone(), stop.clone(), bar.clone());
        let (rate, partition) = (a.rate, a.partition);
        set.spawn(async move {
            loop {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok(());
                }
                if let Some(r) = rate {
                    let due = start + Duration::from_secs_f64(i as f64 / r);
                    tokio::time::sleep_until(due.into()).await;
                }
                if let Err(e) = produce(
                    &client,
                    retry,
                    &topic,
                    &payload,
                    key.as_deref(),
                    partition,
                    &extras,
                )
                .await
                {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                done.fetch_add(1, Ordering::Relaxed);
                if let Some(b) = &bar {
                    b.inc(1);
                }
            }
        });
    }
    let mut first_err = None;
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(narad_api::Error::Invalid(format!("worker failed: {e}")));
            }
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let n = done.load(Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    if let Some(e) = first_err {
        bail!("{e} (after publishing {n} of {count} messages)");
    }
    eprintln!(
        "published {n} messages to {} in {secs:.2}s ({:.0} msg/s)",
        a.topic,
        n as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// One produce, retried per `retry`; each retry is reported on stderr. With attributes, a
/// delay or an idempotency key it is a batch of one (`"attributes"`, `"delay"`,
/// `"idempotency_key"` in the element).
async fn produce(
    client: &narad_api::Client,
    retry: Retry,
    topic: &str,
    payload: &Bytes,
    key: Option<&[u8]>,
    partition: Option<u32>,
    extras: &Extras,
) -> Result<(), narad_api::Error> {
    let report = |e: &narad_api::Error, wait: Duration| {
        eprintln!("narad: {e}; retrying in {} ms", wait.as_millis())
    };
    match extras {
        Extras {
            attrs: None,
            delay: None,
            idempotency_key: None,
        } => {
            retry
                .run(
                    || client.produce(topic, payload.clone(), key, partition),
                    report,
                )
                .await
        }
        Extras {
            attrs,
            delay,
            idempotency_key,
        } => {
            let mut m = narad_api::client::batch_message(payload, key, partition);
            m.attributes = attrs.clone();
            m.delay = delay.clone();
            m.idempotency_key = idempotency_key.clone();
            let batch = [m];
            retry
                .run(|| client.produce_batch(topic, &batch), report)
                .await
                .map(|_| ())
        }
    }
}
