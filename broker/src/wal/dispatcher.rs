//! The dispatcher: commits the WAL's records into partition logs. It takes durable WAL records,
//! batches them per (topic, partition), commits up to 16 batches in parallel (append, fsync,
//! read back and verify, move the high watermark; the commit wakes the partition's consumers),
//! and only then lets the WAL drop the records. Records for a healthy partition flow past a
//! stuck one; a failed commit is retried with backoff and its records stay in the WAL.
//!
//! Where a batch goes is the [`Router`]'s call: a local partition (committed here, on a
//! blocking thread), or its owner on another node (the router sends it as
//! `CommitProduceBatch`, which the owner answers only once it has verified the commit; this
//! module knows no wire format). A record whose partition failed
//! [`REROUTE_AFTER_FAILURES`] passes in a row — at once if membership says the owner is dead —
//! is committed to the next live, non-stuck partition of the same topic instead, pinned
//! records included (SPEC §6.4).
//!
//! # When a partition commits
//! Each commit of a partition costs an fsync and a read-back from the device, and the
//! records already are durable in the WAL, so waiting only delays their visibility. A
//! partition commits at most once per `linger` (5 ms) while someone is waiting for it: a
//! consumer parked on its topic ([`Router::lazy`] is false), a remote owner (its consumers
//! are out of sight), or a reader that asked through [`Visibility`]. Otherwise — a local
//! partition nobody waits on — at most once per `idle_linger` (50 ms): with 32 producers at
//! 4,000 msgs/s into 8 partitions that is 0.04 partition commits per message instead of
//! 0.27. A reader that must see what was acknowledged before it asked (a consume that found
//! less than it wanted, a replay, topic statistics) calls [`Visibility::flush`], which
//! commits the topic's pending records at once and waits for them.

// Keyed by partition (topic id, number): the node's own ids, so a fast hasher (this loop
// looks partitions up several times a message).
use foldhash::{HashMap, HashMapExt, HashSet};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use narad_storage::NewRecord;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{DurableRecord, Wal};
use crate::group_commit::{MAX_BATCH_BYTES, MAX_BATCH_RECORDS};
use crate::partition::Partition;
use crate::rpc::BoxFuture;

/// Most batches committing at once (SPEC §11).
pub const MAX_PARALLEL: usize = 16;
const RETRY_BACKOFF: Duration = Duration::from_millis(200);
/// Failed passes after which a partition's records go to a sibling partition.
pub const REROUTE_AFTER_FAILURES: u32 = 3;
/// After that, new records for the partition go to siblings for this long before its owner
/// is tried again (a partition is not retried 3 times for every new record).
const STUCK_FOR: Duration = Duration::from_secs(1);
/// How soon a partition that is not open yet is tried again.
const NOT_READY_RETRY: Duration = Duration::from_millis(20);
/// A partition with at least this many pending records commits without lingering.
const LINGER_RECORDS: usize = 256;

type Key = (u64, u32);

/// Debug tracing of every record's way (`RUST_LOG=narad_trace=trace`), for chasing a lost
/// record in a fault test: the first bytes of each payload (test payloads start with their id).
fn trace_records(what: &str, key: Key, records: &[DurableRecord]) {
    if tracing::enabled!(target: "narad_trace", tracing::Level::TRACE) {
        let ids: Vec<String> = records
            .iter()
            .map(|r| {
                let p = &r.record.payload[..r.record.payload.len().min(20)];
                format!("{}:{}", r.lsn, String::from_utf8_lossy(p))
            })
            .collect();
        tracing::trace!(target: "narad_trace", what, topic_id = key.0, partition = key.1, records = ?ids);
    }
}

/// Where a batch for (topic id, partition) goes.
pub enum Route {
    /// Owned by this node: committed here, on a blocking thread.
    Local(Arc<Partition>),
    /// Owned by another node; `dead` when membership says it is.
    Remote { owner: String, dead: bool },
    /// The topic was deleted: drop the records.
    Gone,
    /// Not known or not open yet (a create or growth still being applied): try again soon.
    NotReady,
}

/// The dispatcher's view of placement and the way to remote owners.
pub trait Router: Send + Sync + 'static {
    fn route(&self, topic_id: u64, partition: u32) -> Route;
    /// Whether the partition is local and nobody waits for its records (no consumer parked
    /// on its topic): its commits may linger `idle_linger`.
    fn lazy(&self, _topic_id: u64, _partition: u32) -> bool {
        false
    }
    /// The first partition after `from` (`from`+1, +2, … mod the count) of the topic whose
    /// owner is alive and that `usable` accepts; `None` if there is none.
    fn reroute(&self, topic_id: u64, from: u32, usable: &dyn Fn(u32) -> bool) -> Option<u32>;
    /// Commits `records` into partition `partition` of topic `topic_id` on `owner`; `Ok` once
    /// the owner has made them visible. (How they travel is the router's business.)
    fn commit_remote(
        &self,
        owner: String,
        topic_id: u64,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> BoxFuture<'static, Result<(), String>>;
}

/// A reader's request to see a topic's acknowledged records ([`Visibility`]).
struct Demand {
    topic_id: u64,
    /// One partition, or all of the topic's.
    partition: Option<u32>,
    /// Answered once the records pending when the demand arrived are committed (or moved
    /// on: rerouted, discarded); `None` only hurries them.
    done: Option<oneshot::Sender<()>>,
}

/// What readers use to make acknowledged records visible now rather than after the
/// dispatcher's linger. Cheap to clone.
#[derive(Clone)]
pub struct Visibility {
    tx: mpsc::UnboundedSender<Demand>,
    wal: Wal,
}

impl Visibility {
    /// A handle and the receiving end the [`Dispatcher`] takes.
    pub fn new(wal: Wal) -> (Visibility, DemandReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Visibility { tx, wal }, DemandReceiver(rx))
    }

    /// Whether any record is staged or durable in the WAL and not yet committed (a cheap
    /// check before [`Self::flush`]).
    pub fn pending(&self) -> bool {
        self.wal.outstanding() > 0
    }

    /// Commits at once what the dispatcher holds for partition `partition` (or every
    /// partition) of topic `topic_id`, and waits until every record acknowledged before
    /// this call is committed, at most `bound`. False if it waited `bound` in vain (a
    /// failing partition: its records stay in the WAL and are retried).
    pub async fn flush(&self, topic_id: u64, partition: Option<u32>, bound: Duration) -> bool {
        if !self.pending() {
            return true;
        }
        let (done, answer) = oneshot::channel();
        let demand = Demand {
            topic_id,
            partition,
            done: Some(done),
        };
        if self.tx.send(demand).is_err() {
            return true; // the dispatcher has stopped: nothing will commit sooner
        }
        tokio::time::timeout(bound, answer).await.is_ok()
    }

    /// Has the topic's pending records committed at once (a consumer starts waiting).
    pub fn hurry(&self, topic_id: u64) {
        if self.pending() {
            let _ = self.tx.send(Demand {
                topic_id,
                partition: None,
                done: None,
            });
        }
    }
}

/// The dispatcher's end of [`Visibility`].
pub struct DemandReceiver(mpsc::UnboundedReceiver<Demand>);

/// A reader waiting for the records pending before its demand: for each partition, how
/// many of its records must have moved on (`moved` reaching this count).
struct Waiting {
    until: Vec<(Key, u64)>,
    done: oneshot::Sender<()>,
}

pub struct Dispatcher {
    wal: Wal,
    router: Arc<dyn Router>,
    metrics: Arc<crate::metrics::Metrics>,
    pending: HashMap<Key, VecDeque<DurableRecord>>,
    /// When each partition's last commit started (kept for `idle_linger` only).
    last_start: HashMap<Key, Instant>,
    /// Least time between the starts of two commits of one partition someone waits for
    /// (see [`due`]).
    linger: Duration,
    /// The same for a local partition nobody waits for.
    idle_linger: Duration,
    /// Per partition, records ever queued and records that moved on (committed, discarded
    /// or rerouted): what a [`Waiting`] reader counts.
    queued_total: HashMap<Key, u64>,
    moved_total: HashMap<Key, u64>,
    /// Partitions a reader asked for: they commit at once.
    forced: HashSet<Key>,
    waiting: Vec<Waiting>,
    /// Most commits in flight (at most `MAX_PARALLEL`): under load, partitions waiting for
    /// a slot gather larger batches, so the disk sees fewer, larger fsyncs.
    parallel: usize,
    busy: HashMap<Key, ()>,
    faults: Faults,
    /// Local commits in flight (at most `parallel`; remote ones up to `MAX_PARALLEL`).
    local_busy: usize,
}

struct Outcome {
    key: Key,
    records: Vec<DurableRecord>,
    result: Result<(), String>,
    /// A local commit (counted against `parallel`).
    local: bool,
}

impl Dispatcher {
    pub fn new(
        wal: Wal,
        router: Arc<dyn Router>,
        metrics: Arc<crate::metrics::Metrics>,
        linger: Duration,
        idle_linger: Duration,
        parallel: usize,
    ) -> Self {
        Dispatcher {
            wal,
            router,
            metrics,
            pending: HashMap::new(),
            last_start: HashMap::new(),
            linger,
            idle_linger: idle_linger.max(linger),
            queued_total: HashMap::new(),
            moved_total: HashMap::new(),
            forced: Default::default(),
            waiting: Vec::new(),
            parallel: parallel.clamp(1, MAX_PARALLEL),
            busy: HashMap::new(),
            faults: Faults::default(),
            local_busy: 0,
        }
    }

    fn add(&mut self, recs: Vec<DurableRecord>) {
        if let Some(r) = recs.first() {
            trace_records("received", (r.record.topic_id, r.record.partition), &recs);
        }
        for r in recs {
            let key = (r.record.topic_id, r.record.partition);
            *self.queued_total.entry(key).or_insert(0) += 1;
            self.pending.entry(key).or_default().push_back(r);
        }
    }

    /// `n` records of `key` moved on (committed, discarded or rerouted).
    fn moved(&mut self, key: Key, n: usize) {
        *self.moved_total.entry(key).or_insert(0) += n as u64;
    }

    /// Whether a partition's pending records should commit now, else when.
    fn due(&self, key: &Key, queued: usize, now: Instant) -> Result<(), Instant> {
        if self.forced.contains(key) {
            return Ok(());
        }
        // Asked only when the answer depends on it: this runs for every pending partition
        // at every turn of the loop, and the router looks the topic up.
        let linger = || {
            if self.router.lazy(key.0, key.1) {
                self.idle_linger
            } else {
                self.linger
            }
        };
        due(self.last_start.get(key).copied(), linger, queued, now)
    }

    /// A reader's demand: its partitions commit at once; a waiting reader is answered once
    /// the records queued for them so far have moved on.
    fn demand(&mut self, d: Demand) {
        let keys: Vec<Key> = self
            .queued_total
            .keys()
            .filter(|k| k.0 == d.topic_id && d.partition.is_none_or(|p| p == k.1))
            .copied()
            .collect();
        let mut until = Vec::new();
        for key in keys {
            let queued = self.queued_total[&key];
            if self.moved_total.get(&key).copied().unwrap_or(0) < queued {
                until.push((key, queued));
                if self.pending.contains_key(&key) {
                    self.forced.insert(key);
                }
            }
        }
        if let Some(done) = d.done {
            if until.is_empty() {
                let _ = done.send(());
            } else {
                self.waiting.push(Waiting { until, done });
            }
        }
    }

    /// Answers the readers whose records all moved on (or who stopped waiting), and forgets
    /// the counts of partitions with nothing queued and nobody waiting.
    fn answer_waiting(&mut self) {
        let moved = &self.moved_total;
        let mut still = Vec::with_capacity(self.waiting.len());
        for w in self.waiting.drain(..) {
            let done = w
                .until
                .iter()
                .all(|(k, n)| moved.get(k).copied().unwrap_or(0) >= *n);
            if done {
                let _ = w.done.send(());
            } else if !w.done.is_closed() {
                still.push(w);
            }
        }
        self.waiting = still;
        if self.waiting.is_empty() && self.queued_total.len() > 1024 {
            let moved = &self.moved_total;
            self.queued_total
                .retain(|k, n| moved.get(k).copied().unwrap_or(0) < *n);
            let queued = &self.queued_total;
            self.moved_total.retain(|k, _| queued.contains_key(k));
        }
    }

    /// Runs until the WAL's channel closes and everything pending is committed.
    pub async fn run(
        mut self,
        recovered: Vec<DurableRecord>,
        mut rx: mpsc::UnboundedReceiver<Vec<DurableRecord>>,
        demands: DemandReceiver,
    ) {
        let mut demands = demands.0;
        let mut demands_open = true;
        self.add(recovered);
        let mut jobs: JoinSet<Outcome> = JoinSet::new();
        let mut open = true;
        loop {
            let next_linger = self.start_jobs(&mut jobs);
            self.answer_waiting();
            if !open && jobs.is_empty() && self.pending.is_empty() {
                return;
            }
            let next_retry = self
                .faults
                .next_retry()
                .into_iter()
                .chain(next_linger)
                .min();
            tokio::select! {
                msg = rx.recv(), if open => match msg {
                    Some(batch) => {
                        self.add(batch);
                        while let Ok(more) = rx.try_recv() {
                            self.add(more);
                        }
                    }
                    None => open = false,
                },
                d = demands.recv(), if demands_open => match d {
                    Some(d) => {
                        // The records a reader asks for were sent before its demand (the
                        // WAL hands them over before the `202`): take them first.
                        while let Ok(more) = rx.try_recv() {
                            self.add(more);
                        }
                        self.demand(d);
                        while let Ok(d) = demands.try_recv() {
                            self.demand(d);
                        }
                    }
                    None => demands_open = false,
                },
                Some(done) = jobs.join_next(), if !jobs.is_empty() => {
                    match done {
                        Ok(outcome) => self.finish(outcome),
                        Err(e) => tracing::error!(error = %e, "dispatcher commit task failed"),
                    }
                }
                _ = tokio::time::sleep_until(next_retry.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))), if next_retry.is_some() => {
                    self.faults.expire_retries(Instant::now());
                    // Lingering partitions are picked up by start_jobs.
                }
            }
        }
    }

    /// Starts the commits that are due; returns when the earliest lingering partition is due
    /// (`None`: none lingers).
    fn start_jobs(&mut self, jobs: &mut JoinSet<Outcome>) -> Option<Instant> {
        let mut lingering = None;
        // Rerouting moves records to other keys, which may then be ready too.
        for _ in 0..4 {
            let (rerouted, until) = self.start_jobs_once(jobs);
            lingering = lingering.into_iter().chain(until).min();
            if !rerouted {
                break;
            }
        }
        lingering
    }

    /// One pass; returns whether records were rerouted (worth another pass) and when the
    /// earliest partition left lingering is due. Each pending partition's [`Self::due`] is
    /// asked once a pass: it may look its topic up.
    fn start_jobs_once(&mut self, jobs: &mut JoinSet<Outcome>) -> (bool, Option<Instant>) {
        if jobs.len() >= MAX_PARALLEL {
            // Nothing can start before a commit ends, and that wakes the loop to look again:
            // no linger needs a wake-up of its own.
            return (false, None);
        }
        let now = Instant::now();
        self.faults.expire_stuck(now);
        let linger = self.idle_linger;
        self.last_start.retain(|_, at| *at + linger > now);
        let mut lingering = None;
        let mut ready: Vec<Key> = Vec::new();
        for (k, q) in &self.pending {
            if self.busy.contains_key(k) {
                continue;
            }
            match self.due(k, q.len(), now) {
                Ok(()) if !self.faults.waiting(k) || self.faults.is_stuck(k) => ready.push(*k),
                Ok(()) => {}
                Err(until) => lingering = lingering.into_iter().chain([until]).min(),
            }
        }
        let mut rerouted = false;
        for key in ready {
            if jobs.len() >= MAX_PARALLEL {
                break;
            }
            let route = self.router.route(key.0, key.1);
            let owner_dead = matches!(route, Route::Remote { dead: true, .. });
            // Failed too often, now or within the last `STUCK_FOR`: its records (new ones
            // too) go to a sibling rather than to it again.
            let failing = self.faults.is_stuck(&key);
            if (owner_dead || failing) && !matches!(route, Route::Gone) {
                if self.reroute(key, now) {
                    rerouted = true;
                    continue;
                }
                if self.faults.waiting(&key) {
                    continue;
                }
                if owner_dead {
                    // No live sibling: keep the records (the WAL holds them) and try later.
                    self.faults.later(key, now + RETRY_BACKOFF);
                    continue;
                }
            }
            if matches!(route, Route::Local(..)) && self.local_busy >= self.parallel {
                continue;
            }
            let records = self.take_batch(key, now);
            match route {
                Route::Gone => {
                    trace_records("gone", key, &records);
                    tracing::warn!(
                        topic_id = key.0,
                        records = records.len(),
                        "discarding wal records of a deleted topic"
                    );
                    self.faults.succeeded(key);
                    self.wal.committed(&records);
                    self.moved(key, records.len());
                }
                Route::NotReady => {
                    self.requeue(key, records);
                    self.faults.later(key, Instant::now() + NOT_READY_RETRY);
                }
                Route::Local(part) => {
                    trace_records("local", key, &records);
                    self.busy.insert(key, ());
                    self.local_busy += 1;
                    jobs.spawn_blocking(move || {
                        let result = commit(&part, &records);
                        Outcome {
                            key,
                            records,
                            result,
                            local: true,
                        }
                    });
                }
                Route::Remote { owner, .. } => {
                    trace_records(&format!("remote {owner}"), key, &records);
                    self.busy.insert(key, ());
                    let fut = self
                        .router
                        .commit_remote(owner, key.0, key.1, new_records(&records));
                    jobs.spawn(async move {
                        let result = fut.await;
                        Outcome {
                            key,
                            records,
                            result,
                            local: false,
                        }
                    });
                }
            }
        }
        (rerouted, lingering)
    }

    /// Takes the next batch of `key`'s pending records.
    fn take_batch(&mut self, key: Key, now: Instant) -> Vec<DurableRecord> {
        let queue = self
            .pending
            .get_mut(&key)
            .expect("invariant: key taken from pending");
        let mut records = Vec::new();
        let mut bytes = 0usize;
        while let Some(r) = queue.front() {
            if records.len() >= MAX_BATCH_RECORDS
                || (bytes > 0 && bytes + r.record.payload.len() > MAX_BATCH_BYTES)
            {
                break;
            }
            bytes += r.record.payload.len();
            records.push(queue.pop_front().expect("invariant: front exists"));
        }
        if queue.is_empty() {
            self.pending.remove(&key);
        }
        self.forced.remove(&key);
        self.last_start.insert(key, now);
        records
    }

    /// Moves every pending record of `key` to the next live, non-stuck partition of its
    /// topic. Returns false (and moves nothing) when there is none.
    fn reroute(&mut self, key: Key, now: Instant) -> bool {
        let usable = |p: u32| p != key.1 && !self.faults.is_stuck(&(key.0, p));
        let Some(to) = self.router.reroute(key.0, key.1, &usable) else {
            return false;
        };
        if self.faults.rerouted(key, now) {
            tracing::warn!(topic_id = key.0, partition = key.1, to,
                "partition failed {REROUTE_AFTER_FAILURES} passes in a row; its records go to sibling partitions for now");
        }
        let Some(queue) = self.pending.remove(&key) else {
            return false;
        };
        {
            let moved: Vec<DurableRecord> = queue.iter().cloned().collect();
            trace_records(&format!("reroute to {to}"), key, &moved);
        }
        self.forced.remove(&key);
        let n = queue.len();
        self.moved(key, n);
        let target = (key.0, to);
        *self.queued_total.entry(target).or_insert(0) += n as u64;
        let q = self.pending.entry(target).or_default();
        let mut keyed = 0;
        for mut r in queue {
            r.record.partition = to;
            keyed += u64::from(crate::dedup::key_of(r.record.attrs.as_deref()).is_some());
            q.push_back(r);
        }
        // (ext) A retry of one of these may meet its first attempt nowhere.
        self.metrics.dedup_split.inc_by(keyed);
        self.metrics.error("dispatcher", "reroute");
        tracing::warn!(
            topic_id = key.0,
            from = key.1,
            to,
            records = n,
            "rerouting records of an unavailable partition"
        );
        true
    }

    fn requeue(&mut self, key: Key, records: Vec<DurableRecord>) {
        let q = self.pending.entry(key).or_default();
        for r in records.into_iter().rev() {
            q.push_front(r);
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        self.busy.remove(&outcome.key);
        if outcome.local {
            self.local_busy -= 1;
        }
        match outcome.result {
            Ok(()) => {
                trace_records("done", outcome.key, &outcome.records);
                self.faults.succeeded(outcome.key);
                self.wal.committed(&outcome.records);
                self.moved(outcome.key, outcome.records.len());
            }
            Err(e) => {
                trace_records("failed", outcome.key, &outcome.records);
                self.metrics.error("dispatcher", "commit");
                let failures = self.faults.failed(outcome.key, Instant::now());
                tracing::warn!(topic_id = outcome.key.0, partition = outcome.key.1, failures, error = %e,
                    "partition commit failed; the records stay in the wal and are retried");
                self.requeue(outcome.key, outcome.records);
            }
        }
    }
}

/// What the dispatcher remembers of failing partitions, with time passed in: a partition is
/// retried no earlier than [`RETRY_BACKOFF`] after a failed pass (or a set time after a
/// route that is not ready); after [`REROUTE_AFTER_FAILURES`] failed passes in a row its
/// records go to sibling partitions, and once rerouted it stays skipped for [`STUCK_FOR`]
/// (a partition whose owner keeps failing is not tried again with every new record).
#[derive(Debug, Default)]
struct Faults {
    /// Partitions not to try before then.
    retry_at: HashMap<Key, Instant>,
    /// Consecutive failed passes per partition.
    failures: HashMap<Key, u32>,
    /// Partitions whose records go to siblings until then (after repeated failures).
    stuck_until: HashMap<Key, Instant>,
}

impl Faults {
    /// A failed pass of `key` at `now`: retried after [`RETRY_BACKOFF`]. Returns the
    /// failures in a row.
    fn failed(&mut self, key: Key, now: Instant) -> u32 {
        let n = self.failures.entry(key).or_insert(0);
        *n += 1;
        self.retry_at.insert(key, now + RETRY_BACKOFF);
        *n
    }

    /// A pass of `key` that committed (or discarded) its batch: the run of failures ends.
    fn succeeded(&mut self, key: Key) {
        self.failures.remove(&key);
    }

    /// Not to try `key` before `at`.
    fn later(&mut self, key: Key, at: Instant) {
        self.retry_at.insert(key, at);
    }

    /// Whether `key` waits for a retry time.
    fn waiting(&self, key: &Key) -> bool {
        self.retry_at.contains_key(key)
    }

    /// Whether `key` failed too often lately: its records go to siblings.
    fn is_stuck(&self, key: &Key) -> bool {
        self.failures.get(key).copied().unwrap_or(0) >= REROUTE_AFTER_FAILURES
            || self.stuck_until.contains_key(key)
    }

    /// `key`'s records went to a sibling at `now`. A partition that was failing stays
    /// skipped for [`STUCK_FOR`] and its count starts over (returns true then); one rerouted
    /// for a dead owner is not marked. Its retry time no longer applies.
    fn rerouted(&mut self, key: Key, now: Instant) -> bool {
        self.retry_at.remove(&key);
        let was_failing = self.failures.remove(&key).is_some();
        if was_failing {
            self.stuck_until.insert(key, now + STUCK_FOR);
        }
        was_failing
    }

    /// The earliest retry time.
    fn next_retry(&self) -> Option<Instant> {
        self.retry_at.values().min().copied()
    }

    /// Retry times reached by `now` are over.
    fn expire_retries(&mut self, now: Instant) {
        self.retry_at.retain(|_, at| *at > now);
    }

    /// Skips that ended by `now` are over.
    fn expire_stuck(&mut self, now: Instant) {
        self.stuck_until.retain(|_, until| *until > now);
    }
}

/// When a partition whose last commit started at `last_start` and that has `queued`
/// records pending may commit: at once with `LINGER_RECORDS` pending or when its last commit
/// started `linger` ago or longer (so a partition idle that long commits at once), else at
/// `last_start + linger` (`Err`). A busy partition thus commits at most once per `linger`,
/// with everything that arrived meanwhile: each partition commit costs an fsync and a
/// read-back, and the records already are durable in the WAL, so waiting delays only their
/// visibility, never a `202`.
fn due(
    last_start: Option<Instant>,
    linger: impl FnOnce() -> Duration,
    queued: usize,
    now: Instant,
) -> Result<(), Instant> {
    match last_start {
        Some(at) if queued < LINGER_RECORDS => {
            let until = at + linger();
            if until > now {
                Err(until)
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// Appends and commits one batch to a local partition (blocking: fsync).
fn commit(part: &Partition, records: &[DurableRecord]) -> Result<(), String> {
    commit_records(part, &new_records(records))
}

/// The records of WAL entries, as a partition commit takes them.
fn new_records(records: &[DurableRecord]) -> Vec<NewRecord> {
    records
        .iter()
        .map(|r| NewRecord {
            key: r.record.key.clone(),
            payload: r.record.payload.clone(),
            attrs: r.record.attrs.clone(),
        })
        .collect()
}

/// How the dispatcher and fan-out commit into a local partition: `Partition::commit_batch`
/// (the one write path into a partition log, which group commits use too), with the error
/// as text. Blocking.
pub(crate) fn commit_records(part: &Partition, batch: &[NewRecord]) -> Result<(), String> {
    part.commit_batch(batch).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_partition_waits_its_backoff_and_is_skipped_once_it_failed_too_often() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let (k, other) = ((1, 0), (1, 1));
        let mut f = Faults::default();
        assert_eq!(f.failed(k, t0), 1);
        assert!(f.waiting(&k) && !f.waiting(&other));
        assert_eq!(f.next_retry(), Some(t0 + RETRY_BACKOFF));
        // Never before the backoff is over.
        f.expire_retries(t0 + RETRY_BACKOFF - ms);
        assert!(f.waiting(&k));
        f.expire_retries(t0 + RETRY_BACKOFF);
        assert!(!f.waiting(&k));
        assert_eq!(f.next_retry(), None);
        // A success ends the run: the count starts over.
        f.succeeded(k);
        for n in 1..REROUTE_AFTER_FAILURES {
            assert_eq!(f.failed(k, t0), n);
            assert!(!f.is_stuck(&k), "{n} failures");
        }
        assert_eq!(f.failed(k, t0), REROUTE_AFTER_FAILURES);
        assert!(f.is_stuck(&k));
        assert!(!f.is_stuck(&other));
    }

    #[test]
    fn a_rerouted_failing_partition_stays_skipped_for_stuck_for_then_is_tried_again() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let k = (1, 0);
        let mut f = Faults::default();
        for _ in 0..REROUTE_AFTER_FAILURES {
            f.failed(k, t0);
        }
        let t1 = t0 + 5 * ms;
        assert!(f.rerouted(k, t1), "it was failing: marked");
        // Its retry time no longer applies; its records went elsewhere.
        assert!(!f.waiting(&k));
        f.expire_stuck(t1 + STUCK_FOR - ms);
        assert!(f.is_stuck(&k), "still skipped");
        f.expire_stuck(t1 + STUCK_FOR);
        assert!(!f.is_stuck(&k), "tried again");
        // A fresh run of failures is needed to skip it again.
        assert_eq!(f.failed(k, t1 + STUCK_FOR), 1);
        assert!(!f.is_stuck(&k));
        // Records moved off a partition whose owner is dead do not mark it.
        let dead = (1, 2);
        f.later(dead, t1 + RETRY_BACKOFF);
        assert!(!f.rerouted(dead, t1));
        assert!(!f.is_stuck(&dead) && !f.waiting(&dead));
    }

    #[test]
    fn a_partition_commits_at_most_once_per_linger_unless_its_queue_is_full() {
        let t0 = Instant::now();
        let l = Duration::from_millis(5);
        // Never committed, or idle for a linger or longer: at once.
        assert_eq!(due(None, || l, 1, t0), Ok(()));
        assert_eq!(due(Some(t0), || l, 1, t0 + l), Ok(()));
        assert_eq!(due(Some(t0), || l, 1, t0 + 3 * l), Ok(()));
        // Committed less than a linger ago: when the linger since that start is over.
        let ms = Duration::from_millis(1);
        assert_eq!(due(Some(t0), || l, 1, t0 + ms), Err(t0 + l));
        assert_eq!(
            due(Some(t0), || l, LINGER_RECORDS - 1, t0 + 4 * ms),
            Err(t0 + l)
        );
        // A full queue does not wait.
        assert_eq!(due(Some(t0), || l, LINGER_RECORDS, t0 + ms), Ok(()));
        // No linger: never waits.
        assert_eq!(due(Some(t0), || Duration::ZERO, 1, t0), Ok(()));
        // Whether the partition is lazy is not asked where the answer does not depend on it.
        let unasked = || -> Duration { panic!("the linger was asked for") };
        assert_eq!(due(None, unasked, 1, t0), Ok(()));
        assert_eq!(due(Some(t0), unasked, LINGER_RECORDS, t0), Ok(()));
    }
}

/// The dispatcher over a real WAL and real partitions: when records become visible.
#[cfg(test)]
mod visibility_tests {
    use super::*;
    use crate::partition::Registry;
    use crate::wal::{WalOptions, WalRecord};
    use bytes::Bytes;
    use narad_meta::MetaState;
    use narad_storage::LogConfig;

    struct Local(Arc<Registry>);

    impl Router for Local {
        fn route(&self, topic_id: u64, partition: u32) -> Route {
            match self.0.local(topic_id, partition) {
                Some(p) => Route::Local(p),
                None => Route::Gone,
            }
        }
        fn lazy(&self, topic_id: u64, partition: u32) -> bool {
            self.0
                .topic(topic_id)
                .is_some_and(|rt| rt.consumers_waiting() == 0 && rt.partition(partition).is_some())
        }
        fn reroute(&self, _: u64, _: u32, _: &dyn Fn(u32) -> bool) -> Option<u32> {
            None
        }
        fn commit_remote(
            &self,
            _: String,
            _: u64,
            _: u32,
            _: Vec<NewRecord>,
        ) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(async { Err("no remote owners here".to_string()) })
        }
    }

    struct Setup {
        _dir: tempfile::TempDir,
        registry: Arc<Registry>,
        wal: Wal,
        visibility: Visibility,
    }

    /// Topic 1 with one partition on this node, a WAL and a dispatcher with a 5 ms linger
    /// and the given idle linger.
    fn start(idle: Duration) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let registry = Arc::new(
            Registry::new(
                dir.path().join("topics"),
                LogConfig::default(),
                metrics.clone(),
            )
            .unwrap(),
        );
        let mut view = MetaState::default();
        let topic = crate::test_support::topic(1, "t", &["me"]);
        view.topics.insert("t".into(), Arc::new(topic));
        view.next_topic_id = 2;
        registry.reconcile(&view, "me").unwrap();
        let opened = Wal::open(&dir.path().join("ingress"), WalOptions::default()).unwrap();
        let (visibility, demands) = Visibility::new(opened.wal.clone());
        let d = Dispatcher::new(
            opened.wal.clone(),
            Arc::new(Local(registry.clone())),
            metrics,
            Duration::from_millis(5),
            idle,
            4,
        );
        tokio::spawn(d.run(opened.recovered, opened.durable_rx, demands));
        Setup {
            _dir: dir,
            registry,
            wal: opened.wal,
            visibility,
        }
    }

    impl Setup {
        async fn produce(&self, payload: &str) {
            let r = WalRecord {
                topic_id: 1,
                partition: 0,
                pinned: false,
                key: None,
                payload: Bytes::from(payload.to_string()),
                attrs: None,
            };
            self.wal.append(vec![r]).await.unwrap();
        }
        fn hwm(&self) -> u64 {
            self.registry.local(1, 0).unwrap().log.high_watermark()
        }
        async fn until_hwm(&self, want: u64) {
            let part = self.registry.local(1, 0).unwrap();
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    let committed = part.committed.notified();
                    if part.log.high_watermark() >= want {
                        return;
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(50), committed).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("high watermark {} never reached {want}", self.hwm()));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nobody_waiting_a_partition_lingers_idle_until_a_reader_asks() {
        let s = start(Duration::from_secs(3600));
        // Idle partition: its first record commits at once.
        s.produce("a").await;
        s.until_hwm(1).await;
        // The next one waits for the idle linger (an hour here)...
        s.produce("b").await;
        s.produce("c").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(s.hwm(), 1, "committed before anyone asked");
        // ...until a reader asks: then it is visible when the flush returns.
        assert!(
            s.visibility
                .flush(1, Some(0), Duration::from_secs(10))
                .await
        );
        assert_eq!(s.hwm(), 3);
        // Nothing pending: a flush answers at once.
        assert!(!s.visibility.pending());
        assert!(s.visibility.flush(1, None, Duration::ZERO).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_consumer_brings_back_the_short_linger() {
        let s = start(Duration::from_secs(3600));
        s.produce("a").await;
        s.until_hwm(1).await;
        s.produce("b").await;
        let rt = s.registry.topic(1).unwrap();
        // The first consumer to wait hurries what is pending...
        let first = rt.parked();
        assert!(first.first);
        s.visibility.hurry(1);
        s.until_hwm(2).await;
        // ...and while it waits, new records commit after the 5 ms linger, not the hour.
        let second = rt.parked();
        assert!(!second.first);
        s.produce("c").await;
        s.until_hwm(3).await;
        drop((first, second));
        assert_eq!(rt.consumers_waiting(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_of_another_topic_or_partition_does_not_wait_for_these_records() {
        let s = start(Duration::from_secs(3600));
        s.produce("a").await;
        s.until_hwm(1).await;
        s.produce("b").await;
        assert!(s.visibility.flush(2, None, Duration::from_secs(5)).await);
        assert!(s.visibility.flush(1, Some(1), Duration::from_secs(5)).await);
        assert_eq!(s.hwm(), 1);
        // Its own topic's flush commits it.
        assert!(s.visibility.flush(1, None, Duration::from_secs(5)).await);
        assert_eq!(s.hwm(), 2);
    }
}

/// The dispatcher over a fake router (every partition remote, owners scripted): retries,
/// reroutes and discards, with no clock in the assertions. (Real time, not tokio's paused
/// clock: that needs tokio's `test-util` feature, which would build the whole dependency
/// tree twice and put a clock check on every timer of the production build.)
#[cfg(test)]
mod routing_tests {
    use super::*;
    use crate::wal::{WalOptions, WalRecord};
    use bytes::Bytes;
    use parking_lot::Mutex;

    /// Topic 1 with `owners.len()` partitions; partition `p` is on `owners[p]`.
    struct Fake {
        owners: Vec<&'static str>,
        /// Owners membership marks dead.
        dead: Vec<&'static str>,
        /// Owners whose commits fail.
        failing: Vec<&'static str>,
        /// Topic 1 was deleted.
        gone: bool,
        /// Routes answered `NotReady` before the topic is known.
        not_ready_for: Mutex<u32>,
        /// Every remote commit attempted.
        commits: Mutex<Vec<Attempt>>,
    }

    struct Attempt {
        partition: u32,
        payloads: Vec<String>,
        /// The owner took it.
        taken: bool,
    }

    impl Fake {
        fn new(owners: &[&'static str]) -> Fake {
            Fake {
                owners: owners.to_vec(),
                dead: vec![],
                failing: vec![],
                gone: false,
                not_ready_for: Mutex::new(0),
                commits: Mutex::new(vec![]),
            }
        }
        fn attempts_on(&self, partition: u32) -> usize {
            self.commits
                .lock()
                .iter()
                .filter(|c| c.partition == partition)
                .count()
        }
        /// Payloads committed (taken) per partition, in commit order.
        fn taken(&self, partition: u32) -> Vec<String> {
            self.commits
                .lock()
                .iter()
                .filter(|c| c.partition == partition && c.taken)
                .flat_map(|c| c.payloads.clone())
                .collect()
        }
    }

    impl Router for Arc<Fake> {
        fn route(&self, topic_id: u64, partition: u32) -> Route {
            assert_eq!(topic_id, 1);
            if self.gone {
                return Route::Gone;
            }
            {
                let mut n = self.not_ready_for.lock();
                if *n > 0 {
                    *n -= 1;
                    return Route::NotReady;
                }
            }
            let owner = self.owners[partition as usize];
            Route::Remote {
                owner: owner.to_string(),
                dead: self.dead.contains(&owner),
            }
        }
        fn reroute(&self, _: u64, from: u32, usable: &dyn Fn(u32) -> bool) -> Option<u32> {
            let n = self.owners.len() as u32;
            (1..n)
                .map(|i| (from + i) % n)
                .find(|p| usable(*p) && !self.dead.contains(&self.owners[*p as usize]))
        }
        fn commit_remote(
            &self,
            owner: String,
            _: u64,
            partition: u32,
            records: Vec<NewRecord>,
        ) -> BoxFuture<'static, Result<(), String>> {
            let ok = !self.failing.contains(&owner.as_str());
            let payloads = records
                .iter()
                .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
                .collect();
            self.commits.lock().push(Attempt {
                partition,
                payloads,
                taken: ok,
            });
            Box::pin(async move {
                if ok {
                    Ok(())
                } else {
                    Err(format!("{owner} refused"))
                }
            })
        }
    }

    struct Setup {
        _dir: tempfile::TempDir,
        wal: Wal,
    }

    fn start(fake: &Arc<Fake>) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let opened = Wal::open(&dir.path().join("ingress"), WalOptions::default()).unwrap();
        let (_visibility, demands) = Visibility::new(opened.wal.clone());
        let d = Dispatcher::new(
            opened.wal.clone(),
            Arc::new(fake.clone()),
            Arc::new(crate::metrics::Metrics::new()),
            Duration::from_millis(5),
            Duration::from_millis(50),
            4,
        );
        tokio::spawn(d.run(opened.recovered, opened.durable_rx, demands));
        Setup {
            _dir: dir,
            wal: opened.wal,
        }
    }

    impl Setup {
        async fn produce(&self, partition: u32, pinned: bool, payloads: &[&str]) {
            let records = payloads
                .iter()
                .map(|p| WalRecord {
                    topic_id: 1,
                    partition,
                    pinned,
                    key: None,
                    payload: Bytes::from(p.to_string()),
                    attrs: None,
                })
                .collect();
            self.wal.append(records).await.unwrap();
        }
        /// Waits until the WAL holds nothing (the bound is a hang guard only).
        async fn drained(&self) {
            tokio::time::timeout(Duration::from_secs(30), self.wal.drained())
                .await
                .expect("the WAL never drained");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_for_a_live_owner_are_committed_there_and_leave_the_wal() {
        let fake = Arc::new(Fake::new(&["a", "b", "c"]));
        let s = start(&fake);
        s.produce(1, false, &["x", "y"]).await;
        s.drained().await;
        assert_eq!(fake.taken(1), ["x", "y"]);
        assert_eq!(fake.commits.lock().len(), 1, "one batch, one commit");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partition_that_keeps_failing_gives_its_records_to_the_next_live_one() {
        let mut f = Fake::new(&["a", "b", "c"]);
        f.failing = vec!["a"];
        let fake = Arc::new(f);
        let s = start(&fake);
        // Pinned records too (SPEC §6.4): durable records must reach some partition.
        s.produce(0, true, &["p1", "p2"]).await;
        s.drained().await;
        assert_eq!(
            fake.attempts_on(0),
            REROUTE_AFTER_FAILURES as usize,
            "retried until the reroute threshold, then no more"
        );
        assert!(fake.taken(0).is_empty());
        assert_eq!(fake.taken(1), ["p1", "p2"]);
        // The failing partition is skipped for a while: new records go on to partition 1
        // without trying partition 0 again.
        s.produce(0, false, &["n1"]).await;
        s.drained().await;
        assert_eq!(fake.attempts_on(0), REROUTE_AFTER_FAILURES as usize);
        assert_eq!(fake.taken(1), ["p1", "p2", "n1"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_owner_is_not_tried_its_records_go_to_a_live_sibling_at_once() {
        let mut f = Fake::new(&["a", "b", "c"]);
        f.dead = vec!["a", "b"];
        let fake = Arc::new(f);
        let s = start(&fake);
        s.produce(0, false, &["d1"]).await;
        s.drained().await;
        assert_eq!(fake.attempts_on(0), 0);
        assert_eq!(fake.attempts_on(1), 0, "b is dead too");
        assert_eq!(fake.taken(2), ["d1"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_every_owner_dead_the_records_stay_in_the_wal() {
        let mut f = Fake::new(&["a", "b"]);
        f.dead = vec!["a", "b"];
        let fake = Arc::new(f);
        let s = start(&fake);
        s.produce(0, false, &["kept"]).await;
        // Several retry passes go by: nothing is attempted, nothing dropped.
        tokio::time::sleep(RETRY_BACKOFF * 5).await;
        assert!(fake.commits.lock().is_empty());
        assert_eq!(s.wal.outstanding(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deleted_topic_s_records_are_dropped_from_the_wal_without_a_commit() {
        let mut f = Fake::new(&["a"]);
        f.gone = true;
        let fake = Arc::new(f);
        let s = start(&fake);
        s.produce(0, false, &["g1", "g2"]).await;
        s.drained().await;
        assert!(fake.commits.lock().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partition_not_open_yet_is_retried_until_it_is() {
        let f = Fake::new(&["a", "b"]);
        *f.not_ready_for.lock() = 5;
        let fake = Arc::new(f);
        let s = start(&fake);
        s.produce(1, false, &["later"]).await;
        s.drained().await;
        assert_eq!(*fake.not_ready_for.lock(), 0);
        assert_eq!(fake.taken(1), ["later"]);
    }
}
