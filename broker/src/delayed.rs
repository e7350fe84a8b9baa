//! Delayed produce (ext): a produce with `delay` is fsynced on the accepting node, in its
//! delay store, before the `202`, and enters its partition — staged in the ingress WAL as a
//! produce received at that moment is — no earlier than its acceptance time plus the delay,
//! judged on this node's clock. Until then it has no offset: consume, replay and the backlog
//! do not see it.
//!
//! # Why a store of its own
//! A delayed record placed in its partition at once would hold the partition's frontier back
//! for its whole delay: every later record acked meanwhile would park above the frontier, and
//! a steady stream of delayed messages would fill the acked-ahead window and stall the
//! partition's fresh messages. Outside the partition, a delayed message costs the partition
//! nothing until it is due.
//!
//! # How
//! The store is a second write-ahead log ([`crate::wal`]: group commit, one fdatasync per
//! frame, torn-write recovery, segments deleted below the checkpoint) in `<data>/delayed`,
//! one lane. A record's payload is prefixed with its due time (Unix ms, u64 LE). Durable
//! records wait in memory, ordered by due time ([`MAX_HELD_BYTES`] at most: beyond it a
//! delayed produce answers `503`), and the [`Releaser`] hands the due ones, in batches, to the
//! ingress WAL; once that has fsynced them, they leave the store (the checkpoint may pass
//! them) and a *release mark* naming their LSNs is appended, so that a restart does not hand
//! them over again although the checkpoint still lies below them (it is held by the
//! longest-delayed record). A crash between the hand-over and its mark hands that batch over
//! again: a duplicate, never a loss, never early.
//!
//! A draining node takes no delayed produce (`503`, as for a draining node that found no
//! other node: the producer resends elsewhere), and its decommission waits for its store to
//! empty, at most [`narad_api::MAX_PRODUCE_DELAY`] after it began draining.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, ApiResult};
use crate::rpc::BoxFuture;
use crate::wal::{DurableRecord, Wal, WalOptions, WalRecord};

/// Most payload bytes (with keys and attributes) a node holds delayed.
pub const MAX_HELD_BYTES: u64 = 256 * 1024 * 1024;
/// The topic id of a release mark (no topic has it).
const MARK_TOPIC: u64 = u64::MAX;
/// One hand-over: at most this many records and bytes.
const RELEASE_RECORDS: usize = 4096;
const RELEASE_BYTES: u64 = 4 * 1024 * 1024;
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// An empty store looks at its queue at least this often (nothing is due without a record).
const IDLE_WAKE: Duration = Duration::from_secs(30);

/// Where due records go: the ingress WAL, which answers once they are fsynced there.
pub trait Release: Send + Sync + 'static {
    fn release(&self, records: Vec<WalRecord>) -> BoxFuture<'static, Result<(), String>>;
}

impl Release for Wal {
    fn release(&self, records: Vec<WalRecord>) -> BoxFuture<'static, Result<(), String>> {
        let wal = self.clone();
        Box::pin(async move { wal.append(records).await.map_err(|e| e.to_string()) })
    }
}

/// The delay store's handle (cheap to clone).
#[derive(Clone)]
pub struct Delayed {
    wal: Wal,
    held: Arc<Held>,
}

#[derive(Default)]
struct Held {
    queue: Mutex<Queue>,
    released: AtomicU64,
}

/// Durable records by (due ms, lsn).
#[derive(Default)]
struct Queue {
    by_due: BTreeMap<(u64, u64), DurableRecord>,
    bytes: u64,
}

impl Queue {
    fn push(&mut self, due: u64, r: DurableRecord) {
        self.bytes += held_bytes(&r.record);
        self.by_due.insert((due, r.lsn), r);
    }

    /// The records due at `now_ms`, oldest first, one hand-over's worth.
    fn pop_due(&mut self, now_ms: u64) -> Vec<DurableRecord> {
        let mut out = Vec::new();
        let mut bytes = 0;
        while out.len() < RELEASE_RECORDS && bytes < RELEASE_BYTES {
            let Some(entry) = self.by_due.first_entry() else {
                break;
            };
            if entry.key().0 > now_ms {
                break;
            }
            let r = entry.remove();
            let b = held_bytes(&r.record);
            bytes += b;
            self.bytes -= b;
            out.push(r);
        }
        out
    }
}

fn held_bytes(r: &WalRecord) -> u64 {
    (r.payload.len()
        + r.key.as_ref().map_or(0, |k| k.len())
        + r.attrs.as_ref().map_or(0, |a| a.len())) as u64
}

/// The due time a stored record carries (`None`: too short to carry one).
fn due_of(r: &WalRecord) -> Option<u64> {
    let b: [u8; 8] = r.payload.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// The record as it enters its partition: without the due-time prefix.
fn undelayed(r: &WalRecord) -> WalRecord {
    WalRecord {
        payload: r.payload.slice(8..),
        ..r.clone()
    }
}

/// A release mark: the LSNs handed over, u64 LE each.
fn mark(lsns: &[u64]) -> WalRecord {
    let mut b = BytesMut::with_capacity(lsns.len() * 8);
    for l in lsns {
        b.put_u64_le(*l);
    }
    WalRecord {
        topic_id: MARK_TOPIC,
        partition: 0,
        pinned: false,
        key: None,
        payload: b.freeze(),
        attrs: None,
    }
}

fn marked(payload: &[u8]) -> impl Iterator<Item = u64> + '_ {
    payload
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

impl Delayed {
    /// Opens the store in `dir` and recovers what it holds; the [`Releaser`] must run for
    /// anything to come out.
    pub fn open(dir: &Path) -> anyhow::Result<(Delayed, Releaser)> {
        let opened = Wal::open(
            dir,
            WalOptions {
                segment_max_bytes: 16 * 1024 * 1024,
                lanes: 1,
                // The store refuses past MAX_HELD_BYTES itself; the WAL must not block first.
                max_pending_bytes: 2 * MAX_HELD_BYTES,
                ..WalOptions::default()
            },
        )?;
        let wal = opened.wal;
        let mut marks = HashSet::new();
        let mut done = Vec::new();
        let mut records = Vec::new();
        for r in opened.recovered {
            if r.record.topic_id == MARK_TOPIC {
                marks.extend(marked(&r.record.payload));
                done.push(r);
            } else {
                records.push(r);
            }
        }
        let mut queue = Queue::default();
        for r in records {
            match due_of(&r.record) {
                _ if marks.contains(&r.lsn) => done.push(r),
                Some(due) => queue.push(due, r),
                None => {
                    tracing::error!(
                        lsn = r.lsn,
                        "a delayed record without its due time: dropped"
                    );
                    done.push(r);
                }
            }
        }
        if !queue.by_due.is_empty() || !done.is_empty() {
            tracing::info!(
                held = queue.by_due.len(),
                already_released = done.len(),
                "delay store recovered"
            );
        }
        wal.committed(&done);
        let delayed = Delayed {
            wal,
            held: Arc::new(Held {
                queue: Mutex::new(queue),
                released: AtomicU64::new(0),
            }),
        };
        let releaser = Releaser {
            delayed: delayed.clone(),
            durable_rx: opened.durable_rx,
        };
        Ok((delayed, releaser))
    }

    /// Stores `records`, each to enter its partition at its due time (Unix ms) or later, and
    /// resolves once they are fsynced. `503` when the node holds [`MAX_HELD_BYTES`] already.
    pub async fn store(&self, records: Vec<(WalRecord, u64)>) -> ApiResult<()> {
        let bytes: u64 = records.iter().map(|(r, _)| held_bytes(r)).sum();
        if self.held_bytes() + bytes > MAX_HELD_BYTES {
            return Err(ApiError::unavailable(
                format!(
                    "this node holds {MAX_HELD_BYTES} bytes of delayed messages already; \
                     retry later or on another node"
                ),
                1,
            ));
        }
        let records = records
            .into_iter()
            .map(|(r, due_ms)| {
                let mut p = BytesMut::with_capacity(8 + r.payload.len());
                p.put_u64_le(due_ms);
                p.put_slice(&r.payload);
                WalRecord {
                    payload: p.freeze(),
                    ..r
                }
            })
            .collect();
        self.wal
            .append(records)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string(), 1))
    }

    /// Delayed records held (durable, not yet handed over; marks excluded).
    pub fn held(&self) -> usize {
        self.held.queue.lock().by_due.len()
    }

    fn held_bytes(&self) -> u64 {
        self.held.queue.lock().bytes
    }

    /// Records stored and not yet handed over (what a decommission waits for).
    pub fn outstanding(&self) -> usize {
        self.wal.outstanding()
    }

    /// Records handed over to their partitions since this process started.
    pub fn released(&self) -> u64 {
        self.held.released.load(Ordering::Relaxed)
    }

    /// Persists the checkpoint and stops the store's threads.
    pub fn close(&self) {
        self.wal.close();
    }
}

/// What a draining node must hand to the partitions before it leaves: the records in its
/// ingress WAL not yet committed, and the delayed produces its store holds.
pub fn to_hand_over(wal: &Wal, delayed: &Delayed) -> u64 {
    (wal.outstanding() + delayed.outstanding()) as u64
}

/// Hands due records over; runs until `shutdown` (what is held stays in the store).
pub struct Releaser {
    delayed: Delayed,
    durable_rx: mpsc::UnboundedReceiver<Vec<DurableRecord>>,
}

impl Releaser {
    pub async fn run(self, to: Arc<dyn Release>, shutdown: CancellationToken) {
        tokio::select! {
            _ = self.release(to) => {}
            _ = shutdown.cancelled() => {}
        }
    }

    async fn release(mut self, to: Arc<dyn Release>) {
        let mut retry = RETRY_FIRST;
        let mut not_before = tokio::time::Instant::now();
        loop {
            let now = crate::clock::now_ms();
            let next_due = self.queue().by_due.first_key_value().map(|((d, _), _)| *d);
            if next_due.is_some_and(|d| d <= now) && tokio::time::Instant::now() >= not_before {
                let batch = self.queue().pop_due(now);
                match self.hand_over(&*to, batch).await {
                    Ok(()) => retry = RETRY_FIRST,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in_ms = retry.as_millis() as u64,
                            "due delayed records not handed over; they stay in the delay store");
                        not_before = tokio::time::Instant::now() + retry;
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                }
                continue;
            }
            let wait = match next_due {
                Some(d) => Duration::from_millis(d.saturating_sub(now)),
                None => IDLE_WAKE,
            };
            let until = (tokio::time::Instant::now() + wait).max(not_before);
            tokio::select! {
                batch = self.durable_rx.recv() => match batch {
                    Some(batch) => self.take(batch),
                    None => return,
                },
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    fn queue(&self) -> parking_lot::MutexGuard<'_, Queue> {
        self.delayed.held.queue.lock()
    }

    /// Newly durable records join the queue; release marks leave the store at once.
    fn take(&mut self, batch: Vec<DurableRecord>) {
        let mut done = Vec::new();
        {
            let mut q = self.queue();
            for r in batch {
                match due_of(&r.record) {
                    Some(due) if r.record.topic_id != MARK_TOPIC => q.push(due, r),
                    _ => done.push(r),
                }
            }
        }
        self.delayed.wal.committed(&done);
    }

    /// Stages `batch` in the ingress WAL; once it is durable there, the records leave the
    /// store and their release mark is written. On failure they go back to the queue.
    async fn hand_over(
        &mut self,
        to: &dyn Release,
        batch: Vec<DurableRecord>,
    ) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        let records = batch.iter().map(|r| undelayed(&r.record)).collect();
        if let Err(e) = to.release(records).await {
            let mut q = self.queue();
            for r in batch {
                let due = due_of(&r.record).expect("queued records carry a due time");
                q.push(due, r);
            }
            return Err(e);
        }
        let lsns: Vec<u64> = batch.iter().map(|r| r.lsn).collect();
        self.delayed.wal.committed(&batch);
        self.delayed
            .held
            .released
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        tracing::debug!(
            records = batch.len(),
            "delayed records handed to their partitions"
        );
        // Without its mark a restart hands the batch over again (a duplicate): worth a line.
        if let Err(e) = self.delayed.wal.append(vec![mark(&lsns)]).await {
            tracing::warn!(error = %e, records = lsns.len(),
                "release mark not written: a restart before the checkpoint passes these records hands them over again");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// Records what is handed over, and when; fails while `failing` is set.
    #[derive(Default)]
    struct Sink {
        got: Mutex<Vec<(u64, WalRecord)>>,
        failing: std::sync::atomic::AtomicBool,
    }

    impl Release for Sink {
        fn release(&self, records: Vec<WalRecord>) -> BoxFuture<'static, Result<(), String>> {
            let r = if self.failing.load(Ordering::Relaxed) {
                Err("ingress wal unwritable".to_string())
            } else {
                let now = crate::clock::now_ms();
                self.got
                    .lock()
                    .extend(records.into_iter().map(|r| (now, r)));
                Ok(())
            };
            Box::pin(async move { r })
        }
    }

    impl Sink {
        fn payloads(&self) -> Vec<String> {
            self.got
                .lock()
                .iter()
                .map(|(_, r)| String::from_utf8_lossy(&r.payload).into_owned())
                .collect()
        }
    }

    fn rec(payload: &str) -> WalRecord {
        WalRecord {
            topic_id: 7,
            partition: 2,
            pinned: true,
            key: Some(Bytes::from_static(b"k")),
            payload: Bytes::copy_from_slice(payload.as_bytes()),
            attrs: None,
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        let end = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(
                tokio::time::Instant::now() < end,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn records_come_out_in_due_order_never_early_and_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let (d, r) = Delayed::open(dir.path()).unwrap();
        let sink = Arc::new(Sink::default());
        tokio::spawn(r.run(sink.clone(), CancellationToken::new()));
        let now = crate::clock::now_ms();
        let dues = [("late", now + 600), ("early", now + 200), ("past", now - 5)];
        for (p, due) in dues {
            d.store(vec![(rec(p), due)]).await.unwrap();
        }
        until("all three", || sink.got.lock().len() == 3).await;
        assert_eq!(sink.payloads(), ["past", "early", "late"]);
        for ((at, r), (_, due)) in sink.got.lock().iter().zip([dues[2], dues[1], dues[0]]) {
            assert!(*at >= due, "handed over at {at}, due {due}");
            assert_eq!((r.topic_id, r.partition, r.pinned), (7, 2, true));
            assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        }
        until("the store empty", || d.outstanding() == 0).await;
        assert_eq!((d.held(), d.released()), (0, 3));
    }

    #[tokio::test]
    async fn a_restart_keeps_what_is_held_and_does_not_hand_over_again_what_was_marked() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::clock::now_ms();
        {
            let (d, r) = Delayed::open(dir.path()).unwrap();
            let sink = Arc::new(Sink::default());
            let task = tokio::spawn(r.run(sink.clone(), CancellationToken::new()));
            // One far in the future (it holds the checkpoint below the others), one handed
            // over (and marked), one due after the restart.
            d.store(vec![(rec("later"), now + 60_000)]).await.unwrap();
            d.store(vec![(rec("now"), now)]).await.unwrap();
            d.store(vec![(rec("soon"), now + 1_500)]).await.unwrap();
            until("the first", || sink.got.lock().len() == 1).await;
            until("the mark", || d.outstanding() == 2).await;
            task.abort();
            d.close();
        }
        let (d, r) = Delayed::open(dir.path()).unwrap();
        assert_eq!(d.held(), 2, "later and soon are held again, now is not");
        let sink = Arc::new(Sink::default());
        tokio::spawn(r.run(sink.clone(), CancellationToken::new()));
        until("soon", || sink.got.lock().len() == 1).await;
        assert_eq!(sink.payloads(), ["soon"]);
        assert!(sink.got.lock()[0].0 >= now + 1_500);
        assert_eq!(d.held(), 1);
    }

    #[tokio::test]
    async fn a_failed_hand_over_keeps_the_records_and_tries_again() {
        let dir = tempfile::tempdir().unwrap();
        let (d, r) = Delayed::open(dir.path()).unwrap();
        let sink = Arc::new(Sink::default());
        sink.failing.store(true, Ordering::Relaxed);
        tokio::spawn(r.run(sink.clone(), CancellationToken::new()));
        let now = crate::clock::now_ms();
        d.store(vec![(rec("a"), now), (rec("b"), now)])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!((d.held(), d.released()), (2, 0));
        sink.failing.store(false, Ordering::Relaxed);
        until("both", || sink.got.lock().len() == 2).await;
        assert_eq!(sink.payloads(), ["a", "b"]);
        assert_eq!(d.held(), 0);
    }

    #[tokio::test]
    async fn the_store_refuses_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _r) = Delayed::open(dir.path()).unwrap();
        let big = WalRecord {
            payload: Bytes::from(vec![b'x'; (MAX_HELD_BYTES + 1) as usize]),
            ..rec("")
        };
        let e = d.store(vec![(big, 0)]).await.unwrap_err();
        assert_eq!(e.status().as_u16(), 503, "{}", e.message);
    }

    proptest::proptest! {
        #[test]
        fn prop_a_mark_lists_its_lsns(lsns in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..64)) {
            let m = mark(&lsns);
            proptest::prop_assert_eq!(marked(&m.payload).collect::<Vec<_>>(), lsns);
        }
    }
}
