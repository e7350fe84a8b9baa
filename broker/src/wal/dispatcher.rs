//! The dispatcher: the only writer into partition logs. It takes durable WAL records,
//! batches them per (topic, partition), commits up to 16 batches in parallel (append, fsync,
//! read back and verify, move the high watermark), wakes the partition's consumers, and
//! only then lets the WAL drop the records. Records for a healthy partition flow past a
//! stuck one; a failed commit is retried with backoff and its records stay in the WAL.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use narad_storage::NewRecord;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{DurableRecord, Wal};
use crate::partition::{now_ms, Partition, Registry, Resolve, TopicRuntime};

/// Most batches committing at once (SPEC §11).
pub const MAX_PARALLEL: usize = 16;
/// Most records in one partition commit.
pub const MAX_BATCH_RECORDS: usize = 4096;
/// About the most bytes in one partition commit.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
const RETRY_BACKOFF: Duration = Duration::from_millis(200);
/// A partition with at least this many pending records commits without lingering.
const LINGER_RECORDS: usize = 256;

type Key = (u64, u32);

/// Tells the dispatcher whether a topic id still exists in the metadata.
pub type TopicExists = Arc<dyn Fn(u64) -> bool + Send + Sync>;

pub struct Dispatcher {
    wal: Wal,
    registry: Arc<Registry>,
    topic_exists: TopicExists,
    pending: HashMap<Key, VecDeque<DurableRecord>>,
    /// When each pending queue last went from empty to non-empty.
    first_pending_at: HashMap<Key, Instant>,
    /// How long a partition's first pending record may wait for more before it commits
    /// while other commits are in flight: fewer, larger commits leave the disk's fsyncs to
    /// the WAL. With nothing in flight, records commit at once.
    linger: Duration,
    /// Most commits in flight (at most `MAX_PARALLEL`): under load, partitions waiting for
    /// a slot gather larger batches, so the disk sees fewer, larger fsyncs.
    parallel: usize,
    busy: HashMap<Key, ()>,
    retry_at: HashMap<Key, Instant>,
}

struct Outcome {
    key: Key,
    records: Vec<DurableRecord>,
    result: Result<(), String>,
    target: Option<(Arc<TopicRuntime>, Arc<Partition>)>,
}

impl Dispatcher {
    pub fn new(
        wal: Wal,
        registry: Arc<Registry>,
        topic_exists: TopicExists,
        linger: Duration,
        parallel: usize,
    ) -> Self {
        Dispatcher {
            wal,
            registry,
            topic_exists,
            pending: HashMap::new(),
            first_pending_at: HashMap::new(),
            linger,
            parallel: parallel.clamp(1, MAX_PARALLEL),
            busy: HashMap::new(),
            retry_at: HashMap::new(),
        }
    }

    fn add(&mut self, recs: Vec<DurableRecord>) {
        let now = Instant::now();
        for r in recs {
            let key = (r.record.topic_id, r.record.partition);
            self.first_pending_at.entry(key).or_insert(now);
            self.pending.entry(key).or_default().push_back(r);
        }
    }

    /// Whether a partition's pending records should commit now, else when.
    fn due(&self, key: &Key, queued: usize, now: Instant) -> Result<(), Instant> {
        let at = self.first_pending_at.get(key).copied().unwrap_or(now) + self.linger;
        if queued >= LINGER_RECORDS || at <= now {
            Ok(())
        } else {
            Err(at)
        }
    }

    /// Runs until the WAL's channel closes and everything pending is committed.
    pub async fn run(
        mut self,
        recovered: Vec<DurableRecord>,
        mut rx: mpsc::UnboundedReceiver<Vec<DurableRecord>>,
    ) {
        self.add(recovered);
        let mut jobs: JoinSet<Outcome> = JoinSet::new();
        let mut open = true;
        loop {
            self.start_jobs(&mut jobs);
            if !open && jobs.is_empty() && self.pending.is_empty() {
                return;
            }
            let now = Instant::now();
            let next_linger = self
                .pending
                .iter()
                .filter(|(k, _)| !self.busy.contains_key(k))
                .filter_map(|(k, q)| self.due(k, q.len(), now).err())
                .min();
            let next_retry = self
                .retry_at
                .values()
                .min()
                .copied()
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
                Some(done) = jobs.join_next(), if !jobs.is_empty() => {
                    match done {
                        Ok(outcome) => self.finish(outcome),
                        Err(e) => tracing::error!(error = %e, "dispatcher commit task failed"),
                    }
                }
                _ = tokio::time::sleep_until(next_retry.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))), if next_retry.is_some() => {
                    let now = Instant::now();
                    self.retry_at.retain(|_, at| *at > now);
                    // Lingering partitions are picked up by start_jobs.
                }
            }
        }
    }

    fn start_jobs(&mut self, jobs: &mut JoinSet<Outcome>) {
        if jobs.len() >= self.parallel {
            return;
        }
        let now = Instant::now();
        // With no commit in flight the disk is idle: commit at once. Linger only while
        // other commits run, when waiting a little buys a larger batch.
        let idle = jobs.is_empty();
        let ready: Vec<Key> = self
            .pending
            .iter()
            .filter(|(k, q)| {
                !self.busy.contains_key(k)
                    && !self.retry_at.contains_key(k)
                    && (idle || self.due(k, q.len(), now).is_ok())
            })
            .map(|(k, _)| *k)
            .collect();
        for key in ready {
            if jobs.len() >= self.parallel {
                break;
            }
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
                self.first_pending_at.remove(&key);
            } else {
                self.first_pending_at.insert(key, now);
            }
            match self
                .registry
                .resolve(key.0, key.1, |id| (self.topic_exists)(id))
            {
                Resolve::Gone => {
                    tracing::debug!(
                        topic_id = key.0,
                        records = records.len(),
                        "discarding wal records of a deleted topic"
                    );
                    self.wal.committed(&records);
                }
                Resolve::NotReady => {
                    self.requeue(key, records);
                    self.retry_at
                        .insert(key, Instant::now() + Duration::from_millis(20));
                }
                Resolve::Local(rt, part) => {
                    self.busy.insert(key, ());
                    jobs.spawn_blocking(move || {
                        let result = commit(&part, &records);
                        Outcome {
                            key,
                            records,
                            result,
                            target: Some((rt, part)),
                        }
                    });
                }
            }
        }
    }

    fn requeue(&mut self, key: Key, records: Vec<DurableRecord>) {
        self.first_pending_at
            .entry(key)
            .or_insert_with(Instant::now);
        let q = self.pending.entry(key).or_default();
        for r in records.into_iter().rev() {
            q.push_front(r);
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        self.busy.remove(&outcome.key);
        match outcome.result {
            Ok(()) => {
                if let Some((rt, part)) = outcome.target {
                    let bytes: u64 = outcome
                        .records
                        .iter()
                        .map(|r| r.record.payload.len() as u64)
                        .sum();
                    part.metrics.produced.inc_by(outcome.records.len() as u64);
                    part.metrics.produced_bytes.inc_by(bytes);
                    rt.wake_consumers(outcome.records.len());
                }
                self.wal.committed(&outcome.records);
            }
            Err(e) => {
                self.registry.metrics().error("dispatcher", "commit");
                tracing::error!(topic_id = outcome.key.0, partition = outcome.key.1, error = %e,
                    "partition commit failed; the records stay in the wal and are retried");
                self.requeue(outcome.key, outcome.records);
                self.retry_at
                    .insert(outcome.key, Instant::now() + RETRY_BACKOFF);
            }
        }
    }
}

/// Appends and commits one batch to a local partition (blocking: fsync).
fn commit(part: &Partition, records: &[DurableRecord]) -> Result<(), String> {
    let batch: Vec<NewRecord> = records
        .iter()
        .map(|r| NewRecord {
            key: r.record.key.clone(),
            payload: r.record.payload.clone(),
        })
        .collect();
    commit_records(part, &batch)
}

/// The one commit path into a local partition log (the dispatcher's and fan-out's): append,
/// fsync, re-read and verify, move the high watermark, wake fan-out cursors. Blocking.
pub(crate) fn commit_records(part: &Partition, batch: &[NewRecord]) -> Result<(), String> {
    part.touch();
    let _writer = part.write_guard();
    let bytes: u64 = batch.iter().map(|r| r.payload.len() as u64).sum();
    let started = std::time::Instant::now();
    part.log
        .append(batch, now_ms())
        .map_err(|e| e.to_string())?;
    let appended = std::time::Instant::now();
    part.metrics
        .flush_seconds
        .observe(appended.duration_since(started).as_secs_f64());
    part.metrics.flush_bytes.inc_by(bytes);
    part.log.commit().map_err(|e| e.to_string())?;
    part.metrics
        .fsync_seconds
        .observe(appended.elapsed().as_secs_f64());
    part.committed.notify_waiters();
    Ok(())
}
