//! A partition this node owns: its log, its lease table and its persisted frontier, and the
//! registry of the topics whose partitions live here.
//!
//! On disk (SPEC §7.1): `topics/<topic id>/<partition>/log/` (the partition log) and
//! `topics/<topic id>/<partition>/frontier` (the committed consumer frontier, written every
//! 90 ms when it moved, by the housekeeping, in place: see [`narad_storage::checked_u64`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_meta::{MetaState, Topic};
use narad_storage::checked_u64::{self, CheckedU64File, Stored};
use narad_storage::{LogConfig, NewRecord, PartitionLog, StorageError, StoredRecord};
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::clock::{now_micros, now_ms};
use crate::leases::{
    decode_delays, decode_deliveries, encode_delays, encode_deliveries, Caps, Granted, LeaseTable,
    SettleError, Settled,
};
use crate::metrics::{Metrics, PartitionMetrics};

/// Settings the lease table needs, taken from the topic record at each call.
#[derive(Debug, Clone, Copy)]
pub struct QueuePolicy {
    pub caps: Caps,
    pub visibility: Duration,
    /// (ext) Redeliveries after a lapsed lease or a plain nack wait this backoff.
    pub backoff: Option<narad_meta::Backoff>,
}

impl QueuePolicy {
    pub fn of(topic: &Topic) -> Self {
        QueuePolicy {
            caps: Caps {
                max_in_flight: topic.config.max_in_flight_per_partition,
                max_acked_ahead: topic.config.max_acked_ahead_per_partition,
            },
            visibility: Duration::from_millis(topic.config.visibility_timeout_ms),
            backoff: topic.config.retry_backoff,
        }
    }
}

/// What a lease attempt found.
pub enum Leased {
    Message(StoredRecord, Granted),
    /// Nothing deliverable now (empty, capped, or all leased).
    Nothing,
    /// The record could not be read now (I/O error): the delivery was handed back.
    Failed(String),
}

/// Where a purge or a seek puts a partition's frontier (SPEC (ext) §3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Position {
    /// The high watermark: everything committed is settled (a purge).
    End,
    /// This offset, from the oldest retained one up to the high watermark.
    Offset(u64),
    /// The first record committed at or after this time (Unix ms), else the high watermark.
    TimestampMs(u64),
}

/// Why a frontier could not be moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepositionError {
    /// The partition is being moved to another node, or has moved (retry).
    Moving,
    /// The offset is outside what the log holds: below its oldest retained offset or above
    /// its high watermark.
    OutOfRange {
        offset: u64,
        oldest: u64,
        high_watermark: u64,
    },
    /// The log could not be read or the frontier not persisted.
    Storage(String),
}

/// One locally owned partition.
pub struct Partition {
    pub topic_id: u64,
    pub index: u32,
    dir: PathBuf,
    pub log: PartitionLog,
    queue: Mutex<LeaseTable>,
    frontier_dirty: AtomicBool,
    /// Last lease, commit or read (Unix ms), for idle-log eviction.
    last_used_ms: AtomicU64,
    /// The log's files are closed and nothing used it since.
    evicted: AtomicBool,
    pub metrics: PartitionMetrics,
    /// Serialises append + commit (a failed commit rolls back everything appended since the
    /// last one): the dispatcher, fan-out cursors and peers' commits over node RPC all write.
    write_lock: Mutex<()>,
    /// One persistence of the frontier files at a time (they share temporary names), and
    /// the frontier file, open while the partition is in use.
    persisted: Mutex<CheckedU64File>,
    /// Woken (all waiters) after every commit that moved the high watermark: fan-out
    /// cursors wait on it.
    pub committed: Notify,
    /// The move whose final copy froze this partition (SPEC §6.5): commits are refused
    /// until the move is aborted (the freeze then lifts) or completes (the partition
    /// closes). Consume is never frozen.
    frozen_for: Mutex<Option<u64>>,
    /// Closed after a move handed the partition to another node: refuses commits forever.
    closed: AtomicBool,
    /// Callers waiting for a group commit ([`crate::group_commit`]).
    group: crate::group_commit::GroupCommit,
    /// The topic's consumer waiters ([`TopicRuntime::notify`]): every commit wakes as many as
    /// it made messages available, whoever committed.
    consumers: Arc<Notify>,
    /// (ext) The idempotency keys committed within the topic's window ([`crate::dedup`]);
    /// `None` until the first keyed record after the partition opened (then read from the
    /// log). Taken only under `write_lock`.
    dedup: Mutex<Option<crate::dedup::Window>>,
    /// (ext) The topic's `dedup_window_ms`, kept current by [`Registry::reconcile`].
    pub dedup_window_ms: AtomicU64,
}

impl crate::group_commit::Committer for Partition {
    type Error = CommitError;
    fn commit_batch(&self, batch: &[NewRecord]) -> Result<(), CommitError> {
        Partition::commit_batch(self, batch)
    }
    fn is_refusal(e: &CommitError) -> bool {
        e.is_refusal()
    }
    fn group(&self) -> &crate::group_commit::GroupCommit {
        &self.group
    }
}

/// Why a commit into a partition did not happen.
#[derive(Debug)]
pub enum CommitError {
    /// Frozen for move `move_id` (its final copy is being taken): the sender retries, and
    /// reroutes; `503`.
    Frozen {
        partition: u32,
        move_id: u64,
    },
    /// The partition moved to another node: the sender retries at the new owner; `503`.
    MovedAway {
        partition: u32,
    },
    Storage(StorageError),
}

impl CommitError {
    /// Refused by the partition (nothing written; a retry elsewhere or later succeeds), as
    /// opposed to failed.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            CommitError::Frozen { .. } | CommitError::MovedAway { .. }
        )
    }
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommitError::Frozen { partition, move_id } => {
                write!(f, "partition {partition} is frozen for move {move_id}")
            }
            CommitError::MovedAway { partition } => {
                write!(f, "partition {partition} moved to another node")
            }
            CommitError::Storage(e) => e.fmt(f),
        }
    }
}

impl From<StorageError> for CommitError {
    fn from(e: StorageError) -> Self {
        CommitError::Storage(e)
    }
}

/// What the owner hands the target when it freezes a partition for a move's final copy.
#[derive(Debug, Clone)]
pub struct FrozenState {
    pub high_watermark: u64,
    pub oldest_offset: u64,
    pub frontier: u64,
    pub files: Vec<narad_storage::SegmentFile>,
}

const FRONTIER_FILE: &str = "frontier";
/// The delivery counts of at least 2 of unsettled offsets, persisted with the frontier
/// (see [`crate::leases::encode_deliveries`]); a move carries it with the cursor files.
pub(crate) const DELIVERIES_FILE: &str = "deliveries";
/// The delayed offsets and when each may be delivered again, persisted before a delayed nack
/// is answered (see [`crate::leases::encode_delays`]); a move carries it too.
pub(crate) const DELAYS_FILE: &str = "delays";
/// Most consumers one commit wakes.
const MAX_WAKE_PER_EVENT: usize = 64;

/// Wakes up to `n` of `waiters` (at most [`MAX_WAKE_PER_EVENT`]).
fn wake(waiters: &Notify, n: usize) {
    for _ in 0..n.min(MAX_WAKE_PER_EVENT) {
        waiters.notify_one();
    }
}

impl Partition {
    fn open(
        dir: PathBuf,
        topic_id: u64,
        index: u32,
        log_cfg: LogConfig,
        metrics: PartitionMetrics,
        consumers: Arc<Notify>,
    ) -> Result<Self, StorageError> {
        let log = PartitionLog::open(&dir.join("log"), log_cfg)?;
        let frontier = read_frontier(&dir)
            .max(log.oldest_offset())
            .min(log.high_watermark());
        // An unused partition costs no open files: they reopen on first use.
        log.close();
        let frontier_file = dir.join(FRONTIER_FILE);
        let mut table = LeaseTable::new(frontier, now_micros());
        table.restore_deliveries(read_deliveries(&dir));
        table.restore_delays(read_delays(&dir), Instant::now(), now_ms(), now_micros());
        Ok(Partition {
            topic_id,
            index,
            dir,
            log,
            queue: Mutex::new(table),
            frontier_dirty: AtomicBool::new(false),
            last_used_ms: AtomicU64::new(now_ms()),
            evicted: AtomicBool::new(true),
            metrics,
            write_lock: Mutex::new(()),
            persisted: Mutex::new(CheckedU64File::new(frontier_file)),
            committed: Notify::new(),
            frozen_for: Mutex::new(None),
            closed: AtomicBool::new(false),
            group: Default::default(),
            consumers,
            dedup: Mutex::new(None),
            dedup_window_ms: AtomicU64::new(narad_api::DEFAULT_DEDUP_WINDOW_MS),
        })
    }

    /// Appends and commits one batch (blocking: fsync, re-read and verify, then the high
    /// watermark moves), then wakes the fan-out cursors and as many waiting consumers as
    /// records were committed. The one write path into a partition log: the dispatcher,
    /// fan-out and group commits ([`crate::group_commit`]: produces to a partition this node
    /// owns, batches peers commit over node RPC) all come here.
    pub fn commit_batch(&self, batch: &[NewRecord]) -> Result<(), CommitError> {
        self.touch();
        let _one_at_a_time = self.write_lock.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(CommitError::MovedAway {
                partition: self.index,
            });
        }
        if let Some(move_id) = *self.frozen_for.lock() {
            return Err(CommitError::Frozen {
                partition: self.index,
                move_id,
            });
        }
        let now = now_ms();
        let kept: Vec<NewRecord>;
        let mut batch = batch;
        let mut undo = None;
        if batch
            .iter()
            .any(|r| crate::dedup::key_of(r.attrs.as_deref()).is_some())
        {
            let (keep, inserted) = self.dedup_filter(batch, now);
            let dropped = keep.iter().filter(|k| !**k).count();
            if dropped > 0 {
                self.metrics.dedup_dropped.inc_by(dropped as u64);
                kept = batch
                    .iter()
                    .zip(&keep)
                    .filter(|(_, k)| **k)
                    .map(|(r, _)| r.clone())
                    .collect();
                batch = &kept;
            }
            undo = Some(inserted);
        }
        if batch.is_empty() {
            return Ok(());
        }
        let bytes: u64 = batch.iter().map(|r| r.payload.len() as u64).sum();
        let started = Instant::now();
        let written = self.log.append(batch, now).and_then(|_| {
            let appended = Instant::now();
            self.metrics
                .flush_seconds
                .observe(appended.duration_since(started).as_secs_f64());
            self.metrics.flush_bytes.inc_by(bytes);
            self.log.commit().map(|_| appended)
        });
        let appended = match written {
            Ok(t) => t,
            Err(e) => {
                // Not committed: its keys were not either.
                if let (Some(keys), Some(w)) = (undo, self.dedup.lock().as_mut()) {
                    for k in keys {
                        w.remove(k.as_bytes(), now);
                    }
                }
                return Err(e.into());
            }
        };
        self.metrics
            .fsync_seconds
            .observe(appended.elapsed().as_secs_f64());
        self.metrics.produced.inc_by(batch.len() as u64);
        self.metrics.produced_bytes.inc_by(bytes);
        self.committed.notify_waiters();
        wake(&self.consumers, batch.len());
        Ok(())
    }

    /// (ext) Which records of `batch` to keep under the idempotency window (see
    /// [`crate::dedup::filter`]), building the window from the log first if this is the
    /// first keyed record since the partition opened. Called under `write_lock`.
    fn dedup_filter(&self, batch: &[NewRecord], now: u64) -> (Vec<bool>, Vec<String>) {
        let window_ms = self.dedup_window_ms.load(Ordering::Relaxed);
        let mut guard = self.dedup.lock();
        let w = guard.get_or_insert_with(|| self.read_window(now, window_ms));
        let keys: Vec<Option<&str>> = batch
            .iter()
            .map(|r| crate::dedup::key_of(r.attrs.as_deref()))
            .collect();
        let evicted = w.evicted;
        let out = crate::dedup::filter(w, &keys, now, window_ms);
        if w.evicted > evicted {
            tracing::warn!(
                topic_id = self.topic_id,
                partition = self.index,
                keys = crate::dedup::MAX_KEYS,
                "idempotency window full: the oldest keys were forgotten before their time"
            );
        }
        out
    }

    /// The idempotency keys of the records committed within `window_ms` before `now`, read
    /// from the log (what a restart or a move keeps of the window). A read error ends the
    /// scan with what was read so far (a retry of an unread key would be stored again).
    fn read_window(&self, now: u64, window_ms: u64) -> crate::dedup::Window {
        let mut w = crate::dedup::Window::default();
        let (oldest, hwm) = (self.log.oldest_offset(), self.log.high_watermark());
        let mut next = match self.first_at_or_after(now.saturating_sub(window_ms), oldest, hwm) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(topic_id = self.topic_id, partition = self.index, error = ?e,
                    "idempotency window not read from the log");
                return w;
            }
        };
        let from = next;
        while next < hwm {
            match self.log.read_from(next, 4096, 4 << 20) {
                Ok(recs) if !recs.is_empty() => {
                    for r in &recs {
                        if let Some(k) = crate::dedup::key_of(r.attrs.as_deref()) {
                            w.insert(k.as_bytes(), r.timestamp_ms);
                        }
                    }
                    next = recs.last().map_or(hwm, |r| r.offset + 1);
                }
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(topic_id = self.topic_id, partition = self.index, offset = next, error = %e,
                        "idempotency window read from the log only in part");
                    break;
                }
            }
        }
        tracing::info!(
            topic_id = self.topic_id,
            partition = self.index,
            keys = w.len(),
            records = next - from,
            "idempotency window read from the log"
        );
        w
    }

    /// Freezes the partition for the final copy of move `move_id`: waits for a commit in
    /// progress, then refuses commits until [`Partition::unfreeze`] (or for good once the
    /// partition closes). Returns the exact committed state the copy must reproduce.
    pub fn freeze(&self, move_id: u64) -> FrozenState {
        let _no_commit_in_progress = self.write_lock.lock();
        *self.frozen_for.lock() = Some(move_id);
        self.touch();
        self.state_locked()
    }

    /// The committed state as of one instant (a commit in progress finishes first): files
    /// whose committed sizes hold exactly the records below the high watermark.
    pub fn committed_state(&self) -> FrozenState {
        let _no_commit_in_progress = self.write_lock.lock();
        self.state_locked()
    }

    fn state_locked(&self) -> FrozenState {
        FrozenState {
            high_watermark: self.log.high_watermark(),
            oldest_offset: self.log.oldest_offset(),
            frontier: self.queue.lock().frontier(),
            files: self.log.segment_files(),
        }
    }

    /// Lifts the freeze of move `move_id` (once that move can no longer complete).
    pub fn unfreeze(&self, move_id: u64) -> bool {
        let _g = self.write_lock.lock();
        let mut f = self.frozen_for.lock();
        if *f == Some(move_id) {
            *f = None;
            return true;
        }
        false
    }

    /// The move this partition is frozen for.
    pub fn frozen_for(&self) -> Option<u64> {
        *self.frozen_for.lock()
    }

    /// Marks the partition moved away: commits are refused for good.
    pub fn close_moved(&self) {
        let _g = self.write_lock.lock();
        self.closed.store(true, Ordering::Release);
    }

    /// Leases the next deliverable record, skipping records that retention removed or that
    /// cannot be read (loudly).
    ///
    /// A consumer looks through its topic's partitions in turn, so most calls find nothing:
    /// those read one clock, and the wall clock only when a lease ends or is granted.
    pub fn lease(&self, policy: QueuePolicy) -> Leased {
        loop {
            let delivery = {
                let mut q = self.queue.lock();
                let now = Instant::now();
                self.skip_removed(&mut q);
                if q.next_deadline().is_some_and(|d| d <= now) {
                    q.expire_with(now, policy.backoff, now_ms(), now_micros());
                }
                match q.lease_with(
                    self.log.high_watermark(),
                    policy.caps,
                    policy.visibility,
                    now,
                    now_micros,
                ) {
                    Some(d) => d,
                    None => return Leased::Nothing,
                }
            };
            // In use: its log stays open (idle ones are closed).
            self.touch();
            match self.log.read(delivery.offset) {
                Ok(Some(rec)) => return Leased::Message(rec, delivery),
                Ok(None) => {
                    // Cannot happen below the high watermark; hand it back.
                    let mut q = self.queue.lock();
                    let _ = q.hand_back(delivery.offset, delivery.nonce, Instant::now());
                    return Leased::Nothing;
                }
                Err(StorageError::Gone { .. }) => {
                    let mut q = self.queue.lock();
                    q.settle_unreadable(delivery.offset);
                    q.dropped += 1;
                    self.metrics.dropped.inc();
                    self.skip_removed(&mut q);
                    self.frontier_dirty.store(true, Ordering::Release);
                }
                Err(e @ StorageError::Unreadable { .. }) => {
                    tracing::error!(topic_id = self.topic_id, partition = self.index, offset = delivery.offset, error = %e,
                        "skipping an unreadable record");
                    self.metrics.corrupt_skipped.inc();
                    self.queue.lock().settle_unreadable(delivery.offset);
                    self.frontier_dirty.store(true, Ordering::Release);
                }
                Err(e) => {
                    // A transient read failure: hand the delivery back and report it.
                    let _ = self.queue.lock().hand_back(
                        delivery.offset,
                        delivery.nonce,
                        Instant::now(),
                    );
                    return Leased::Failed(e.to_string());
                }
            }
        }
    }

    pub fn ack(&self, offset: u64, nonce: u64, policy: QueuePolicy) -> Result<(), SettleError> {
        let Settled { frontier_moved } =
            self.queue
                .lock()
                .ack(offset, nonce, policy.caps, Instant::now())?;
        if frontier_moved {
            self.frontier_dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    pub fn extend(&self, offset: u64, nonce: u64, policy: QueuePolicy) -> Result<(), SettleError> {
        self.queue
            .lock()
            .extend(offset, nonce, policy.visibility, Instant::now())
    }

    /// A plain nack: available again at once, or after the topic's retry backoff.
    pub fn nack(&self, offset: u64, nonce: u64, policy: QueuePolicy) -> Result<(), SettleError> {
        self.queue.lock().nack_with_backoff(
            offset,
            nonce,
            policy.backoff,
            Instant::now(),
            now_ms(),
            now_micros(),
        )
    }

    /// A nack whose message is delivered again no earlier than `delay` from now. Persist
    /// ([`Partition::persist_frontier`]) before answering, so that a restart keeps the delay.
    pub fn nack_delayed(
        &self,
        offset: u64,
        nonce: u64,
        delay: Duration,
    ) -> Result<(), SettleError> {
        self.queue
            .lock()
            .nack_delayed(offset, nonce, delay, Instant::now(), now_ms(), now_micros())
    }

    /// An extend to `visibility` from now instead of the topic's visibility timeout.
    pub fn extend_for(
        &self,
        offset: u64,
        nonce: u64,
        visibility: Duration,
    ) -> Result<(), SettleError> {
        self.queue
            .lock()
            .extend(offset, nonce, visibility, Instant::now())
    }

    /// Hands back a lease no one was given (a consume answer had no room for its message):
    /// the offset is available again at once, as if it had not been leased, and the delivery
    /// is not counted.
    pub fn hand_back(&self, offset: u64, nonce: u64) -> Result<(), SettleError> {
        self.queue.lock().hand_back(offset, nonce, Instant::now())
    }

    /// The directory of this partition (its log, frontier and fan-out cursors live in it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Marks the partition as in use (idle logs are closed after a while).
    pub fn touch(&self) {
        self.last_used_ms.store(now_ms(), Ordering::Relaxed);
        if self.evicted.load(Ordering::Relaxed) {
            self.evicted.store(false, Ordering::Relaxed);
        }
    }

    /// Closes the log's files and the frontier file (a partition moved away or deleted).
    fn close_files(&self) {
        self.log.close();
        self.persisted.lock().close();
    }

    /// Closes the log's files if unused for `idle_ms`; they reopen on next use.
    pub fn evict_if_idle(&self, idle_ms: u64, now_ms: u64) -> bool {
        if self.evicted.load(Ordering::Relaxed) {
            return false;
        }
        let idle = now_ms.saturating_sub(self.last_used_ms.load(Ordering::Relaxed)) >= idle_ms;
        if idle && self.queue.lock().inflight_len() == 0 {
            self.evicted.store(true, Ordering::Relaxed);
            self.log.close();
            // A persistence running now closes the file when it ends (it sees `evicted`).
            if let Some(mut f) = self.persisted.try_lock() {
                f.close();
            }
            return true;
        }
        false
    }

    /// Age of the oldest unsettled message, seconds (0 when none).
    pub fn oldest_unconsumed_age_secs(&self, now_ms: u64) -> u64 {
        let frontier = self.queue.lock().frontier();
        if frontier >= self.log.high_watermark() {
            return 0;
        }
        match self.log.read(frontier.max(self.log.oldest_offset())) {
            Ok(Some(r)) => now_ms.saturating_sub(r.timestamp_ms) / 1000,
            _ => 0,
        }
    }

    /// The earliest lease deadline (a waiter wakes then to pick up an expired lease).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.queue.lock().next_deadline()
    }

    /// The queue's backlog now: unsettled messages waiting and leased, and the age of the
    /// oldest unsettled one.
    pub fn backlog(&self, now_ms: u64) -> narad_api::Backlog {
        let (lag, in_flight, ..) = self.queue_stats();
        narad_api::Backlog {
            messages: lag.saturating_sub(in_flight),
            in_flight,
            oldest_unacked_age_seconds: self.oldest_unconsumed_age_secs(now_ms),
        }
    }

    /// Queue gauges: (lag, in flight, acked ahead, dropped, frontier).
    pub fn queue_stats(&self) -> (u64, u64, u64, u64, u64) {
        let q = self.queue.lock();
        let hwm = self.log.high_watermark();
        (
            q.lag(hwm),
            q.inflight_len() as u64,
            q.acked_ahead_len() as u64,
            q.dropped,
            q.frontier(),
        )
    }

    /// Moves the queue's frontier to `to` (a purge or a seek): offsets below it are settled,
    /// those from it on are delivered afresh, leases outstanding answer 410. Waits for a
    /// commit in progress (a purge covers every record committed before it) and persists
    /// the frontier before it returns. Blocking (fsync). Returns (previous, new) frontier.
    pub fn reposition(&self, to: Position) -> Result<(u64, u64), RepositionError> {
        self.touch();
        let (previous, frontier) = {
            let _no_commit_in_progress = self.write_lock.lock();
            if self.closed.load(Ordering::Acquire) || self.frozen_for.lock().is_some() {
                return Err(RepositionError::Moving);
            }
            let hwm = self.log.high_watermark();
            let oldest = self.log.oldest_offset();
            let target = match to {
                Position::End => hwm,
                Position::Offset(o) if o < oldest || o > hwm => {
                    return Err(RepositionError::OutOfRange {
                        offset: o,
                        oldest,
                        high_watermark: hwm,
                    })
                }
                Position::Offset(o) => o,
                Position::TimestampMs(t) => self.first_at_or_after(t, oldest, hwm)?,
            };
            let previous = self.queue.lock().reposition(target);
            self.frontier_dirty.store(true, Ordering::Release);
            (previous, target)
        };
        self.persist_frontier()
            .map_err(|e| RepositionError::Storage(format!("frontier not persisted: {e}")))?;
        // Fresh offsets (a seek back) are there for waiting consumers.
        if frontier < previous {
            wake(&self.consumers, (previous - frontier) as usize);
        }
        Ok((previous, frontier))
    }

    /// The first offset in `[oldest, hwm)` whose record was committed at or after `t_ms`
    /// (commit times follow offsets, as one owner commits them in order), else `hwm`.
    fn first_at_or_after(&self, t_ms: u64, oldest: u64, hwm: u64) -> Result<u64, RepositionError> {
        let (mut lo, mut hi) = (oldest, hwm);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let at = match self.log.read(mid) {
                Ok(Some(rec)) => rec.timestamp_ms,
                Ok(None) => return Ok(hwm),
                Err(e) => return Err(RepositionError::Storage(e.to_string())),
            };
            if at >= t_ms {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(lo)
    }

    /// Persists the frontier if it moved (in place), and the delays and the delivery
    /// counts of at least 2 if they changed (each replaced whole: tmp file, fsync, rename,
    /// directory fsync).
    pub fn persist_frontier(&self) -> std::io::Result<()> {
        let mut file = self.persisted.lock();
        let res = self.persist_with(&mut file);
        if self.evicted.load(Ordering::Relaxed) {
            file.close();
        }
        res
    }

    fn persist_with(&self, file: &mut CheckedU64File) -> std::io::Result<()> {
        let delays = self.queue.lock().delays();
        if let Some(delays) = delays {
            if let Err(e) = write_synced(&self.dir, DELAYS_FILE, &encode_delays(&delays)) {
                self.queue.lock().delays_unsaved();
                return Err(e);
            }
        }
        let redelivered = self.queue.lock().redelivered();
        if let Some(counts) = redelivered {
            if let Err(e) = write_synced(&self.dir, DELIVERIES_FILE, &encode_deliveries(&counts)) {
                self.queue.lock().redelivered_unsaved();
                return Err(e);
            }
        }
        if !self.frontier_dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let frontier = self.queue.lock().frontier();
        let res = file.write(frontier);
        if res.is_err() {
            self.frontier_dirty.store(true, Ordering::Release);
        }
        res
    }

    /// Runs retention and the time-based segment roll; skips removed records in the queue.
    pub fn run_retention(
        &self,
        retention_ms: u64,
        now_ms: u64,
    ) -> Result<narad_storage::RetentionOutcome, StorageError> {
        self.log.roll_if_due(now_ms)?;
        let out = self.log.enforce_retention(retention_ms, now_ms)?;
        if out.segments_deleted > 0 {
            self.skip_removed(&mut self.queue.lock());
        }
        Ok(out)
    }

    /// Moves the queue past records retention removed, counting the unacked ones.
    fn skip_removed(&self, q: &mut LeaseTable) {
        let before = q.dropped;
        if q.skip_below(self.log.oldest_offset()) {
            self.frontier_dirty.store(true, Ordering::Release);
            self.metrics.dropped.inc_by(q.dropped - before);
        }
    }
}

fn read_frontier(dir: &Path) -> u64 {
    let path = dir.join(FRONTIER_FILE);
    match checked_u64::read(&path) {
        Ok(Stored::Value(v)) => v,
        Ok(Stored::Missing) => 0,
        Ok(Stored::Damaged(why)) => {
            tracing::warn!(path = %path.display(), why, "frontier file damaged; redelivering from the oldest offset");
            0
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "frontier file unreadable; redelivering from the oldest offset");
            0
        }
    }
}

/// Writes a new `frontier` file whole (a move's staged copy).
pub(crate) fn write_frontier(dir: &Path, frontier: u64) -> std::io::Result<()> {
    checked_u64::replace(&dir.join(FRONTIER_FILE), frontier)
}

/// Replaces `dir/name` with `bytes` whole ([`narad_storage::dirs::replace_file`]).
fn write_synced(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    narad_storage::dirs::replace_file(&dir.join(name), bytes)
}

/// The persisted delivery counts; none when the file is missing, and none (loudly) when it
/// is damaged: counts are approximate, a message is never held back for them.
fn read_deliveries(dir: &Path) -> Vec<(u64, u32)> {
    match fs::read(dir.join(DELIVERIES_FILE)) {
        Ok(b) => decode_deliveries(&b).unwrap_or_else(|| {
            tracing::warn!(dir = %dir.display(), "delivery counts file damaged; counting deliveries afresh");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    }
}

/// The persisted delays; none when the file is missing, and none (loudly) when it is damaged
/// (the delayed messages are then delivered at once, early).
fn read_delays(dir: &Path) -> Vec<(u64, u64)> {
    match fs::read(dir.join(DELAYS_FILE)) {
        Ok(b) => decode_delays(&b).unwrap_or_else(|| {
            tracing::error!(dir = %dir.display(), "delays file damaged; delayed messages are delivered at once");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    }
}

/// A topic's local runtime: its partitions and the waiters of its consumers.
pub struct TopicRuntime {
    pub id: u64,
    pub name: String,
    /// Indexed by partition; `None` where another node owns the partition.
    partitions: RwLock<Vec<Option<Arc<Partition>>>>,
    /// Woken by commits (each partition's [`Partition::commit_batch`]), nacks and expiries.
    pub notify: Arc<Notify>,
    produce_rr: AtomicU32,
    consume_rr: AtomicU32,
    /// Consumers parked on `notify` now: while there are any, WAL records of the topic's
    /// local partitions commit without the dispatcher's idle linger.
    waiting: AtomicUsize,
}

/// A consumer parked on a topic ([`TopicRuntime::parked`]); counted until dropped.
pub struct Parked<'a> {
    count: &'a AtomicUsize,
    /// No other consumer was waiting when this one started.
    pub first: bool,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl TopicRuntime {
    /// Counts a consumer as waiting for the topic's messages until the guard drops.
    pub fn parked(&self) -> Parked<'_> {
        let before = self.waiting.fetch_add(1, Ordering::AcqRel);
        Parked {
            count: &self.waiting,
            first: before == 0,
        }
    }

    /// Consumers waiting for the topic's messages now.
    pub fn consumers_waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// The partitions open on this node.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().iter().flatten().cloned().collect()
    }
    pub fn partition(&self, index: u32) -> Option<Arc<Partition>> {
        self.partitions
            .read()
            .get(index as usize)
            .cloned()
            .flatten()
    }
    /// Next partition in turn for an unkeyed, unpinned produce.
    pub fn next_produce_partition(&self, count: u32) -> u32 {
        self.produce_rr.fetch_add(1, Ordering::Relaxed) % count.max(1)
    }
    /// Wakes up to `n` waiting consumers, one per newly available message (not every waiter:
    /// a woken consumer that finds nothing only costs a scan). A waiter that was woken but
    /// went away passes its wake-up on to the next one (tokio's `Notify` does that).
    pub fn wake_consumers(&self, n: usize) {
        wake(&self.notify, n);
    }

    /// Where a queue consume starts scanning, rotating for fairness.
    pub fn next_consume_start(&self) -> u32 {
        self.consume_rr.fetch_add(1, Ordering::Relaxed)
    }
    /// The earliest lease deadline over the partitions.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.partitions
            .read()
            .iter()
            .flatten()
            .filter_map(|p| p.next_deadline())
            .min()
    }
}

/// The topics with partitions on this node.
pub struct Registry {
    root: PathBuf,
    log_cfg: LogConfig,
    metrics: Arc<Metrics>,
    /// By topic id (the cluster's own, so a fast hasher: the WAL dispatcher asks per turn).
    topics: RwLock<foldhash::HashMap<u64, Arc<TopicRuntime>>>,
    /// Serialises reconciles (opening logs is slow; readers never wait for it).
    reconcile_lock: Mutex<()>,
    /// Partitions closed because a move handed them to another node: their directories
    /// wait here until the leader confirms this node neither owns nor receives them
    /// (SPEC §6.1: never destroy on a stale view).
    released: Mutex<Vec<Released>>,
}

/// A partition directory a completed move left behind.
#[derive(Debug, Clone)]
pub struct Released {
    pub topic_id: u64,
    pub topic: String,
    pub partition: u32,
    pub dir: PathBuf,
}

impl Registry {
    pub fn new(root: PathBuf, log_cfg: LogConfig, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        narad_storage::dirs::create_dir_all_durable(&root)?;
        sweep_move_staging(&root);
        Ok(Registry {
            root,
            log_cfg,
            metrics,
            topics: RwLock::new(Default::default()),
            reconcile_lock: Mutex::new(()),
            released: Mutex::new(Vec::new()),
        })
    }

    pub fn topic(&self, id: u64) -> Option<Arc<TopicRuntime>> {
        self.topics.read().get(&id).cloned()
    }

    /// Opens and closes partitions to match the metadata `view` (see [`Registry::reconcile`]),
    /// as an API error (`500`).
    pub fn apply(&self, view: &MetaState, node_id: &str) -> crate::error::ApiResult<()> {
        self.reconcile(view, node_id).map_err(|e| {
            crate::error::ApiError::internal(format!("opening partitions failed: {e}"))
        })
    }

    /// The local runtime of `topic`, first opening the partitions the metadata gives
    /// `node_id` if it is ahead of the registry (`503` while the topic is still not open).
    /// The metadata is read only then.
    pub fn runtime_of(
        &self,
        meta: &narad_meta::Meta,
        node_id: &str,
        topic: &Topic,
    ) -> crate::error::ApiResult<Arc<TopicRuntime>> {
        if let Some(rt) = self.topic(topic.id) {
            return Ok(rt);
        }
        self.apply(&meta.view(), node_id)?;
        self.topic(topic.id).ok_or_else(|| {
            crate::error::ApiError::unavailable(
                format!("topic {} is not open on this node yet", topic.name),
                1,
            )
        })
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn all(&self) -> Vec<Arc<TopicRuntime>> {
        self.topics.read().values().cloned().collect()
    }

    /// Takes the partitions released by moves (for the janitor, see `placement::moves`).
    pub fn take_released(&self) -> Vec<Released> {
        std::mem::take(&mut *self.released.lock())
    }

    /// Puts back released partitions whose deletion could not be confirmed yet.
    pub fn keep_released(&self, r: Vec<Released>) {
        self.released.lock().extend(r);
    }

    /// Queues for the janitor every partition directory of a topic in `topics` that is not
    /// open here and that `topics` gives to another node: old copies a move left behind
    /// (the node went down before removing one, or a force promotion happened while it was
    /// down). Nothing is removed here: the janitor asks the leader first.
    pub fn release_orphans(&self, topics: &BTreeMap<String, Arc<Topic>>, node_id: &str) {
        let mut found = Vec::new();
        for t in topics.values() {
            let Ok(rd) = fs::read_dir(self.topic_dir(t.id)) else {
                continue;
            };
            for e in rd.flatten() {
                let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                let elsewhere = t
                    .assignments
                    .get(p as usize)
                    .is_some_and(|a| a.owner.as_deref().is_some_and(|o| o != node_id));
                let open = self.topic(t.id).and_then(|rt| rt.partition(p)).is_some();
                if elsewhere && !open && e.path().is_dir() {
                    tracing::info!(topic = %t.name, partition = p, dir = %e.path().display(),
                        "found the old copy of a partition owned elsewhere");
                    found.push(Released {
                        topic_id: t.id,
                        topic: t.name.clone(),
                        partition: p,
                        dir: e.path(),
                    });
                }
            }
        }
        let mut released = self.released.lock();
        found.retain(|f| !released.iter().any(|r| r.dir == f.dir));
        released.extend(found);
    }

    /// The root of all topic data (`<data dir>/topics`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where partition `p` of topic `id` lives.
    pub fn partition_dir(&self, id: u64, p: u32) -> PathBuf {
        self.topic_dir(id).join(p.to_string())
    }

    pub fn log_config(&self) -> &LogConfig {
        &self.log_cfg
    }

    fn topic_dir(&self, id: u64) -> PathBuf {
        self.root.join(id.to_string())
    }

    /// Brings the local runtimes in line with the metadata: opens the partitions assigned to
    /// `node_id` that are not open yet, and removes the data of topics whose deletion the
    /// local replica has applied. A replica that is merely behind (a restarted node with an
    /// old snapshot) never destroys data it does not know about (SPEC §6.1).
    pub fn reconcile(&self, view: &MetaState, node_id: &str) -> Result<(), StorageError> {
        let topics = &view.topics;
        // Ids are never reused and only committed commands are applied, so an id below
        // `next_topic_id` that the view lacks was deleted; an id at or above it belongs to a
        // topic this replica has not caught up with yet and must be kept.
        let deleted = |id: u64| id < view.next_topic_id;
        let _g = self.reconcile_lock.lock();
        let mut live = std::collections::HashSet::new();
        for t in topics.values() {
            live.insert(t.id);
            let mine: Vec<u32> = t
                .assignments
                .iter()
                .enumerate()
                .filter(|(_, a)| a.owner.as_deref() == Some(node_id))
                .map(|(p, _)| p as u32)
                .collect();
            let rt = self.topic(t.id).unwrap_or_else(|| {
                let rt = Arc::new(TopicRuntime {
                    id: t.id,
                    name: t.name.clone(),
                    partitions: RwLock::new(Vec::new()),
                    notify: Arc::new(Notify::new()),
                    produce_rr: AtomicU32::new(0),
                    consume_rr: AtomicU32::new(0),
                    waiting: AtomicUsize::new(0),
                });
                self.topics.write().insert(t.id, rt.clone());
                rt
            });
            for p in mine {
                if rt.partition(p).is_some() {
                    continue;
                }
                let dir = self.topic_dir(t.id).join(p.to_string());
                narad_storage::dirs::create_dir_all_durable(&dir).map_err(|source| {
                    StorageError::Io {
                        path: dir.clone(),
                        source,
                    }
                })?;
                let metrics = self.metrics.partition(&t.name, p);
                let part = Partition::open(
                    dir,
                    t.id,
                    p,
                    self.log_cfg.clone(),
                    metrics,
                    rt.notify.clone(),
                )?;
                let mut parts = rt.partitions.write();
                if parts.len() <= p as usize {
                    parts.resize(p as usize + 1, None);
                }
                parts[p as usize] = Some(Arc::new(part));
            }
            for part in rt.partitions() {
                let window = t.config.dedup_window_ms;
                part.dedup_window_ms.store(
                    window.unwrap_or(narad_api::DEFAULT_DEDUP_WINDOW_MS),
                    Ordering::Relaxed,
                );
            }
            // Partitions a completed move handed to another node (the flip is committed:
            // the applied view only shows another owner after it). Closed here; the data
            // goes once the leader confirms (see `take_released`).
            let moved: Vec<Arc<Partition>> = {
                let mut parts = rt.partitions.write();
                let mut out = Vec::new();
                for (p, slot) in parts.iter_mut().enumerate() {
                    let gone = t
                        .assignments
                        .get(p)
                        .is_some_and(|a| a.owner.as_deref().is_some_and(|o| o != node_id));
                    if gone {
                        if let Some(part) = slot.take() {
                            out.push(part);
                        }
                    }
                }
                out
            };
            for part in moved {
                part.close_moved();
                let _ = part.persist_frontier();
                part.close_files();
                tracing::info!(topic = %t.name, partition = part.index, "partition moved to another node; closed here");
                self.released.lock().push(Released {
                    topic_id: t.id,
                    topic: t.name.clone(),
                    partition: part.index,
                    dir: part.dir.clone(),
                });
            }
            if rt.partitions.read().iter().all(|p| p.is_none()) {
                rt.notify.notify_waiters();
            }
        }
        let doomed: Vec<Arc<TopicRuntime>> = {
            let mut map = self.topics.write();
            let ids: Vec<u64> = map
                .keys()
                .copied()
                .filter(|id| !live.contains(id) && deleted(*id))
                .collect();
            ids.into_iter().filter_map(|id| map.remove(&id)).collect()
        };
        for rt in doomed {
            rt.notify.notify_waiters();
            for p in rt.partitions() {
                p.close_files();
            }
            let dir = self.topic_dir(rt.id);
            if let Err(e) = fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove a deleted topic's data");
            }
            // A topic created again under the same name keeps the series (they are its own
            // now: its partitions' handles are in them).
            if !topics.contains_key(&rt.name) {
                self.metrics.forget_topic(&rt.name);
            }
            tracing::info!(topic = %rt.name, topic_id = rt.id, "topic data removed");
        }
        // Remove leftovers of topics deleted while the node was down.
        if let Ok(rd) = fs::read_dir(&self.root) {
            for e in rd.flatten() {
                if let Some(id) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) {
                    if !live.contains(&id) && deleted(id) {
                        let _ = fs::remove_dir_all(e.path());
                        tracing::info!(
                            topic_id = id,
                            "removed data of a topic deleted while the node was down"
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Partition `p` of topic `topic_id`, if it is open here.
    pub fn local(&self, topic_id: u64, p: u32) -> Option<Arc<Partition>> {
        self.topic(topic_id)?.partition(p)
    }

    /// Persists every moved frontier.
    pub fn persist_frontiers(&self) {
        for rt in self.all() {
            for p in rt.partitions() {
                if let Err(e) = p.persist_frontier() {
                    self.metrics.error("storage", "frontier_persist");
                    tracing::error!(topic = %rt.name, partition = p.index, error = %e, "frontier persist failed");
                }
            }
        }
    }
}

/// Removes the staging directories of partition moves (`topics/<id>/<p>.move-<move id>/`)
/// that a crash left behind. A staging copy is never the live partition (it is moved into
/// place only once verified), and a move still in flight starts its copy afresh.
fn sweep_move_staging(root: &Path) {
    let Ok(topics) = fs::read_dir(root) else {
        return;
    };
    for t in topics.flatten() {
        let Ok(entries) = fs::read_dir(t.path()) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().contains(".move-") {
                match fs::remove_dir_all(e.path()) {
                    Ok(()) => {
                        tracing::info!(dir = %e.path().display(), "removed a leftover move staging copy")
                    }
                    Err(err) => {
                        tracing::warn!(dir = %e.path().display(), error = %err, "could not remove a leftover move staging copy")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_storage::dirs::record_dir_syncs;

    /// Partition 0 of topic 3 of `view`, opened by a new registry over `root` (as after a
    /// restart).
    fn open_first(root: &Path, view: &MetaState) -> Arc<Partition> {
        let reg = Registry::new(
            root.to_path_buf(),
            LogConfig::default(),
            Arc::new(Metrics::new()),
        )
        .unwrap();
        reg.reconcile(view, "me").unwrap();
        reg.local(3, 0).unwrap()
    }

    #[test]
    fn a_new_partition_is_durable_from_its_log_up_to_the_data_dir() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("topics");
        let (reg, synced) = record_dir_syncs(|| {
            Registry::new(root.clone(), LogConfig::default(), Arc::new(Metrics::new())).unwrap()
        });
        assert_eq!(synced, vec![root.clone(), data.path().to_path_buf()]);
        let mut view = MetaState::default();
        view.topics.insert(
            "orders".into(),
            Arc::new(crate::test_support::topic(5, "orders", &["other", "me"])),
        );
        view.next_topic_id = 6;
        let (r, synced) = record_dir_syncs(|| reg.reconcile(&view, "me"));
        r.unwrap();
        let p = root.join("5").join("1");
        // Each new entry's directory is fsynced: the log's, the partition's, the topic's.
        for d in [p.join("log"), p.clone(), root.join("5"), root.clone()] {
            assert!(
                synced.contains(&d),
                "{} not fsynced: {synced:?}",
                d.display()
            );
        }
        assert!(
            !root.join("5").join("0").exists(),
            "another node's partition"
        );
    }

    /// (ext) Idempotent produce at the commit: a key committed within the window is not
    /// stored again — in the same batch, in a later one, and after the partition reopened
    /// (the window read back from the log) — and is stored again once the window passed.
    #[test]
    fn a_repeated_idempotency_key_is_dropped_within_the_window_across_a_reopen() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("topics");
        let mut view = MetaState::default();
        let mut t = crate::test_support::topic(3, "t", &["me"]);
        t.config.dedup_window_ms = Some(1_000);
        view.topics.insert("t".into(), Arc::new(t));
        view.next_topic_id = 4;
        let open = || open_first(&root, &view);
        let rec = |payload: &str, key: Option<&str>| NewRecord {
            key: None,
            payload: bytes::Bytes::from(payload.to_string()),
            attrs: key.and_then(|k| crate::attrs::with_reserved(None, &[(crate::dedup::ATTR, k)])),
        };
        let payloads = |part: &Partition| -> Vec<String> {
            part.log
                .read_from(0, 100, 1 << 20)
                .unwrap()
                .iter()
                .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
                .collect()
        };
        let part = open();
        assert_eq!(part.dedup_window_ms.load(Ordering::Relaxed), 1_000);
        part.commit_batch(&[rec("a1", Some("a")), rec("x", None), rec("a2", Some("a"))])
            .unwrap();
        part.commit_batch(&[rec("a3", Some("a")), rec("b1", Some("b"))])
            .unwrap();
        // Every record of a batch a repeat: nothing written, still Ok.
        part.commit_batch(&[rec("b2", Some("b"))]).unwrap();
        assert_eq!(payloads(&part), ["a1", "x", "b1"]);
        drop(part);

        let part = open();
        part.commit_batch(&[rec("a4", Some("a")), rec("c1", Some("c"))])
            .unwrap();
        assert_eq!(
            payloads(&part),
            ["a1", "x", "b1", "c1"],
            "the window came back from the log"
        );
        std::thread::sleep(Duration::from_millis(1_100));
        part.commit_batch(&[rec("a5", Some("a"))]).unwrap();
        assert_eq!(
            payloads(&part),
            ["a1", "x", "b1", "c1", "a5"],
            "past the window"
        );
    }

    #[test]
    fn reposition_finds_times_refuses_out_of_range_and_moving_and_persists() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("topics");
        let mut view = MetaState::default();
        view.topics.insert(
            "t".into(),
            Arc::new(crate::test_support::topic(3, "t", &["me"])),
        );
        view.next_topic_id = 4;
        let open = || open_first(&root, &view);
        let part = open();
        let batch = |n: usize| -> Vec<NewRecord> {
            (0..n)
                .map(|i| NewRecord {
                    key: None,
                    payload: bytes::Bytes::from(format!("m{i}")),
                    attrs: None,
                })
                .collect()
        };
        part.commit_batch(&batch(4)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let t = now_ms();
        part.commit_batch(&batch(3)).unwrap();
        assert_eq!(part.log.high_watermark(), 7);

        assert_eq!(part.reposition(Position::TimestampMs(t)), Ok((0, 4)));
        assert_eq!(part.reposition(Position::TimestampMs(0)), Ok((4, 0)));
        assert_eq!(part.reposition(Position::TimestampMs(u64::MAX)), Ok((0, 7)));
        assert_eq!(
            part.reposition(Position::Offset(8)),
            Err(RepositionError::OutOfRange {
                offset: 8,
                oldest: 0,
                high_watermark: 7
            })
        );
        assert_eq!(part.reposition(Position::Offset(2)), Ok((7, 2)));
        part.freeze(9);
        assert_eq!(part.reposition(Position::End), Err(RepositionError::Moving));
        assert!(part.unfreeze(9));
        assert_eq!(part.reposition(Position::End), Ok((2, 7)));
        assert_eq!(part.reposition(Position::Offset(5)), Ok((7, 5)));
        // Persisted before the answer: a new incarnation resumes there.
        drop(part);
        let part = open();
        assert_eq!(part.queue_stats().4, 5);
    }

    #[test]
    fn leftover_move_staging_copies_are_removed_and_partitions_kept() {
        let root = tempfile::tempdir().unwrap();
        let live = root.path().join("7").join("2").join("log");
        let staging = root.path().join("7").join("2.move-41").join("log");
        std::fs::create_dir_all(&live).unwrap();
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::write(live.join("00000000000000000000.log"), b"x").unwrap();
        sweep_move_staging(root.path());
        assert!(live.join("00000000000000000000.log").exists());
        assert!(!root.path().join("7").join("2.move-41").exists());
    }
}
