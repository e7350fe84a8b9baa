//! Bookkeeping for durability runs (SPEC §1.1: a message answered `202` is delivered until
//! acked; duplicates are allowed; nothing is invented or damaged).
//!
//! Producers record each id as `acked` (got `202`), `ambiguous` (transport error or `5xx`:
//! may or may not be stored) or `rejected` (a `4xx`, which must not happen to a valid
//! produce). Consumers verify every delivered payload ([`payload::verify`]) and count
//! deliveries per id. The [`Report`] then states what was lost (acked, never consumed),
//! corrupt, or foreign (consumed but never sent).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use tokio::task::JoinHandle;

use crate::api::{topic_path, Msg};
use crate::http::Http;
use crate::payload;

/// Long-poll used by consumer loops.
const CONSUME_WAIT: &str = "1s";
/// Failed produces described in a [`Report`] at most.
const KEPT_FAILURES: usize = 50;
/// Pause after a transport error or `5xx` (server down or restarting).
const ERROR_BACKOFF: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Inner {
    acked: HashSet<String>,
    ambiguous: HashSet<String>,
    rejected: Vec<String>,
    failures: Vec<String>,
    consumed: HashMap<String, u32>,
    corrupt: Vec<String>,
    unexpected: Vec<String>,
}

#[derive(Default)]
pub struct Ledger {
    inner: Mutex<Inner>,
}

impl Ledger {
    pub fn new() -> Arc<Ledger> {
        Arc::new(Ledger::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn record_acked(&self, id: String) {
        self.lock().acked.insert(id);
    }

    pub fn record_ambiguous(&self, id: String) {
        self.lock().ambiguous.insert(id);
    }

    pub fn record_rejected(&self, what: String) {
        self.lock().rejected.push(what);
    }

    /// What an ambiguous produce got (a transport error or a `5xx`), kept for the report
    /// (the first [`KEPT_FAILURES`]).
    pub fn record_failure(&self, what: String) {
        let mut g = self.lock();
        if g.failures.len() < KEPT_FAILURES {
            g.failures.push(what);
        }
    }

    /// A consumer saw a status no consumer should see (a `4xx`).
    pub fn record_unexpected(&self, what: String) {
        self.lock().unexpected.push(what);
    }

    /// Verifies one delivered message and counts it.
    pub fn record_delivery(&self, m: &Msg) {
        match payload::verify(m.payload_raw.as_bytes()) {
            Ok(id) if m.payload_encoding.is_none() => {
                *self.lock().consumed.entry(id).or_default() += 1;
            }
            Ok(id) => self.lock().corrupt.push(format!(
                "{}/{}@{} id {id}: payload_encoding {:?} on a JSON payload",
                m.topic, m.partition, m.offset, m.payload_encoding
            )),
            Err(why) => self
                .lock()
                .corrupt
                .push(format!("{}/{}@{}: {why}", m.topic, m.partition, m.offset)),
        }
    }

    /// Acked ids not yet consumed.
    pub fn missing(&self) -> Vec<String> {
        let g = self.lock();
        let mut v: Vec<String> = g
            .acked
            .iter()
            .filter(|id| !g.consumed.contains_key(*id))
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// Roughly how many acked messages are still unconsumed (producer backpressure).
    pub fn backlog(&self) -> usize {
        let g = self.lock();
        g.acked.len().saturating_sub(g.consumed.len())
    }

    pub fn acked_count(&self) -> usize {
        self.lock().acked.len()
    }

    /// A one-line progress summary for long runs.
    pub fn progress(&self) -> String {
        let g = self.lock();
        format!(
            "acked={} ambiguous={} consumed={} not-yet-consumed={}",
            g.acked.len(),
            g.ambiguous.len(),
            g.consumed.len(),
            g.acked
                .iter()
                .filter(|id| !g.consumed.contains_key(*id))
                .count()
        )
    }

    pub fn report(&self) -> Report {
        let g = self.lock();
        let mut lost: Vec<String> = g
            .acked
            .iter()
            .filter(|id| !g.consumed.contains_key(*id))
            .cloned()
            .collect();
        lost.sort();
        let mut foreign: Vec<String> = g
            .consumed
            .keys()
            .filter(|id| !g.acked.contains(*id) && !g.ambiguous.contains(*id))
            .cloned()
            .collect();
        foreign.sort();
        let deliveries: u64 = g.consumed.values().map(|&n| u64::from(n)).sum();
        Report {
            produced: g.acked.len(),
            ambiguous: g.ambiguous.len(),
            ambiguous_delivered: g
                .ambiguous
                .iter()
                .filter(|id| g.consumed.contains_key(*id))
                .count(),
            consumed: g.consumed.len(),
            deliveries,
            duplicates: deliveries - g.consumed.len() as u64,
            lost,
            corrupt: g.corrupt.clone(),
            foreign,
            rejected: g.rejected.clone(),
            failures: g.failures.clone(),
            unexpected: g.unexpected.clone(),
        }
    }
}

/// The outcome of a durability run.
#[derive(Debug)]
pub struct Report {
    /// Ids answered `202`.
    pub produced: usize,
    /// Ids whose produce failed ambiguously (transport error, `5xx`).
    pub ambiguous: usize,
    /// Ambiguous ids that were nevertheless delivered.
    pub ambiguous_delivered: usize,
    /// Distinct ids delivered.
    pub consumed: usize,
    /// All deliveries (incl. redeliveries).
    pub deliveries: u64,
    pub duplicates: u64,
    pub lost: Vec<String>,
    pub corrupt: Vec<String>,
    pub foreign: Vec<String>,
    pub rejected: Vec<String>,
    /// What the first ambiguous produces got (transport errors, `5xx`).
    pub failures: Vec<String>,
    pub unexpected: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "produced(202)={} ambiguous={} (delivered anyway {}) consumed={} deliveries={} duplicates={} \
             lost={} corrupt={} foreign={} rejected(4xx)={} unexpected-consume-status={}",
            self.produced,
            self.ambiguous,
            self.ambiguous_delivered,
            self.consumed,
            self.deliveries,
            self.duplicates,
            self.lost.len(),
            self.corrupt.len(),
            self.foreign.len(),
            self.rejected.len(),
            self.unexpected.len()
        )
    }
}

impl Report {
    /// Panics unless nothing was lost, corrupt, foreign, rejected or unexpected.
    pub fn assert_ok(&self) {
        let first = |v: &[String]| v.iter().take(10).cloned().collect::<Vec<_>>().join("; ");
        let mut problems = Vec::new();
        if !self.lost.is_empty() {
            problems.push(format!(
                "LOST {} acknowledged messages, e.g. {}",
                self.lost.len(),
                first(&self.lost)
            ));
        }
        if !self.corrupt.is_empty() {
            problems.push(format!(
                "{} corrupt deliveries: {}",
                self.corrupt.len(),
                first(&self.corrupt)
            ));
        }
        if !self.foreign.is_empty() {
            problems.push(format!(
                "{} delivered ids were never produced: {}",
                self.foreign.len(),
                first(&self.foreign)
            ));
        }
        if !self.rejected.is_empty() {
            problems.push(format!(
                "{} produces answered 4xx: {}",
                self.rejected.len(),
                first(&self.rejected)
            ));
        }
        if !self.unexpected.is_empty() {
            problems.push(format!(
                "{} consumes/acks answered 4xx: {}",
                self.unexpected.len(),
                first(&self.unexpected)
            ));
        }
        assert!(problems.is_empty(), "{self}\n{}", problems.join("\n"));
    }
}

/// Produces `count` tagged messages `p<producer>-1..=count` sequentially with `query`;
/// each must be answered `202` (the server is expected to be up).
pub async fn produce_tagged(
    http: &Http,
    topic: &str,
    query: &str,
    producer: u32,
    count: u64,
    ledger: &Ledger,
) {
    for seq in 1..=count {
        http.produce_ok(topic, query, payload::make(producer, seq))
            .await;
        ledger.record_acked(payload::id(producer, seq));
    }
}

/// Produces `per_producer` tagged messages from each of `producers` concurrent tasks (each
/// with its own keep-alive client); every one must be answered `202`.
pub async fn produce_tagged_concurrently(
    url: &str,
    topic: &str,
    producers: u32,
    per_producer: u64,
    ledger: &Arc<Ledger>,
) {
    let mut tasks = Vec::new();
    for p in 0..producers {
        let (http, topic, ledger) = (Http::new(url), topic.to_string(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            produce_tagged(&http, &topic, "", p, per_producer, &ledger).await;
        }));
    }
    for t in tasks {
        t.await.expect("producer task panicked");
    }
}

/// Called with each message's id just before a [`Producers`] loop sends it.
pub type SendHook = Arc<dyn Fn(&str) + Send + Sync>;

/// What a [`Producers`] loop sends and where: the one produce loop of every durability and
/// chaos run.
#[derive(Clone)]
pub struct ProduceSpec {
    /// Nodes to send to; a producer starts at `urls[producer % len]` and moves to the next
    /// after a transport error or a `5xx` (as a client behind a Service reaches another pod).
    pub urls: Vec<String>,
    pub topic: String,
    /// `[0]`: the topic's ledger (failures and refusals are described there); every ledger
    /// (the topic's children's too) records each acknowledgement and each ambiguous produce.
    pub ledgers: Vec<Arc<Ledger>>,
    /// Producers pause while the first ledger has this many acknowledged messages
    /// unconsumed, so the final drain stays bounded.
    pub max_backlog: usize,
    /// `Some(n)`: every `n`th message carries its id as key.
    pub key_every: Option<u64>,
    /// Called with each message's id just before it is sent.
    pub on_send: Option<SendHook>,
}

impl ProduceSpec {
    /// One node, one ledger, no keys.
    pub fn new(url: &str, topic: &str, ledger: &Arc<Ledger>, max_backlog: usize) -> ProduceSpec {
        ProduceSpec {
            urls: vec![url.to_string()],
            topic: topic.to_string(),
            ledgers: vec![ledger.clone()],
            max_backlog,
            key_every: None,
            on_send: None,
        }
    }
}

/// Per-produce timeout of a [`Producers`] loop; a produce that times out is ambiguous.
pub const PRODUCE_TIMEOUT: Duration = Duration::from_secs(10);

/// Producer tasks that send fresh tagged payloads until stopped, recording each outcome:
/// `202` acknowledged; a transport error or `5xx` ambiguous (it may have been stored); any
/// other answer ambiguous and refused (a valid produce is never refused).
pub struct Producers {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Producers {
    /// Starts producers `0..n`, each with its own keep-alive clients.
    pub fn spawn(n: u32, spec: &ProduceSpec) -> Producers {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..n)
            .map(|p| tokio::spawn(produce_loop(p, spec.clone(), stop.clone())))
            .collect();
        Producers { stop, tasks }
    }

    /// Stops the producers and waits for their last requests.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("producer task panicked");
        }
    }
}

async fn produce_loop(producer: u32, spec: ProduceSpec, stop: Arc<AtomicBool>) {
    let clients: Vec<Http> = spec.urls.iter().map(Http::new).collect();
    let mut node = producer as usize % clients.len();
    let ledger = &spec.ledgers[0];
    let path = format!("{}/produce", topic_path(&spec.topic));
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if ledger.backlog() > spec.max_backlog {
            tokio::time::sleep(Duration::from_millis(10)).await; // backpressure, not a sync wait
            continue;
        }
        seq += 1;
        let id = payload::id(producer, seq);
        let path = match spec.key_every {
            Some(n) if seq.is_multiple_of(n) => format!("{path}?key={id}"),
            _ => path.clone(),
        };
        if let Some(f) = &spec.on_send {
            f(&id);
        }
        let r = clients[node]
            .request(Method::POST, path)
            .header("content-type", "application/json")
            .body(payload::make(producer, seq))
            .timeout(PRODUCE_TIMEOUT)
            .try_send()
            .await;
        let ambiguous = |ledgers: &[Arc<Ledger>]| {
            for l in ledgers {
                l.record_ambiguous(id.clone());
            }
        };
        match r {
            Ok(r) if r.status == 202 => {
                for l in &spec.ledgers {
                    l.record_acked(id.clone());
                }
                continue;
            }
            Ok(r) if r.status >= 500 => {
                ambiguous(&spec.ledgers);
                ledger.record_failure(format!(
                    "{} via {}: {}",
                    wall_clock(),
                    spec.urls[node],
                    r.describe()
                ));
                node = (node + 1) % clients.len();
            }
            Ok(r) => {
                ambiguous(&spec.ledgers);
                ledger.record_rejected(r.describe());
            }
            Err(e) => {
                // Refused, reset or timed out: the node is down or was killed mid-request.
                ambiguous(&spec.ledgers);
                ledger.record_failure(format!("{} via {}: {e:?}", wall_clock(), spec.urls[node]));
                node = (node + 1) % clients.len();
            }
        }
        tokio::time::sleep(ERROR_BACKOFF).await;
    }
}

/// UTC time of day `HH:MM:SS.mmm`, to line failures up with the brokers' logs.
fn wall_clock() -> String {
    let ms = crate::now_ms() % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// Consumer tasks that consume, verify and ack until stopped, tolerating a dead server.
pub struct Consumers {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Consumers {
    /// Starts `n` consumer tasks on `topic`, each with its own keep-alive client.
    pub fn spawn(n: usize, url: &str, topic: &str, ledger: &Arc<Ledger>) -> Consumers {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..n)
            .map(|_| {
                let (http, topic, ledger, stop) = (
                    Http::new(url),
                    topic.to_string(),
                    ledger.clone(),
                    stop.clone(),
                );
                tokio::spawn(consume_loop(http, topic, ledger, stop))
            })
            .collect();
        Consumers { stop, tasks }
    }

    /// Signals the tasks to stop and waits for them (each finishes its current long poll).
    pub async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("consumer task panicked");
        }
    }
}

async fn consume_loop(http: Http, topic: String, ledger: Arc<Ledger>, stop: Arc<AtomicBool>) {
    let consume = format!("{}/consume?wait={CONSUME_WAIT}", topic_path(&topic));
    while !stop.load(Ordering::SeqCst) {
        let r = match http
            .request(Method::GET, consume.clone())
            .timeout(Duration::from_secs(15))
            .try_send()
            .await
        {
            Ok(r) => r,
            Err(_) => {
                tokio::time::sleep(ERROR_BACKOFF).await;
                continue;
            }
        };
        match r.status {
            200 => match Msg::parse(&r.body) {
                Ok(m) => {
                    ledger.record_delivery(&m);
                    if let Some(h) = &m.receipt_handle {
                        // A failed ack only means a redelivery later.
                        if let Ok(a) = http
                            .request(
                                Method::POST,
                                format!(
                                    "{}/ack?receipt_handle={}",
                                    topic_path(&topic),
                                    crate::util::pct(h)
                                ),
                            )
                            .header("content-type", "application/json")
                            .timeout(Duration::from_secs(10))
                            .try_send()
                            .await
                        {
                            // 410: the lease lapsed (slow ack) or the server restarted in between.
                            if a.status >= 400 && a.status < 500 && a.status != 410 {
                                ledger.record_unexpected(a.describe());
                            }
                        }
                    }
                }
                Err(e) => {
                    ledger.record_unexpected(format!("{}: unparsable message: {e:#}", r.describe()))
                }
            },
            204 => {}
            s if s >= 500 => tokio::time::sleep(ERROR_BACKOFF).await,
            _ => {
                ledger.record_unexpected(r.describe());
                tokio::time::sleep(ERROR_BACKOFF).await;
            }
        }
    }
}

/// Give up draining early when the set of unconsumed acked ids has not shrunk for this
/// long: longer than any lease the durability tests use, so redeliveries had their chance.
const DRAIN_STALL: Duration = Duration::from_secs(15);

/// Waits until every acked id has been consumed, for at most `timeout` (or until no
/// progress was made for [`DRAIN_STALL`]).
pub async fn wait_all_consumed(ledger: &Ledger, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut best = usize::MAX;
    let mut last_progress = Instant::now();
    loop {
        let missing = ledger.missing();
        if missing.is_empty() {
            return Ok(());
        }
        if missing.len() < best {
            best = missing.len();
            last_progress = Instant::now();
        }
        if start.elapsed() >= timeout || last_progress.elapsed() >= DRAIN_STALL {
            anyhow::bail!(
                "{} acked messages still not consumed after {:?} (last progress {:?} ago), e.g. {:?}",
                missing.len(),
                start.elapsed(),
                last_progress.elapsed(),
                &missing[..missing.len().min(5)]
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
