//! The ingress write-ahead log: where a produce lands before it is answered. (With the
//! tuning knob `NARAD_WAL_SKIP_LOCAL` on, records of partitions this node owns are committed
//! straight into the partition log instead, `crate::group_commit`, and come here only if
//! that commit did not happen.)
//!
//! # Durability contract
//! - A produce request stages its records here and is answered `202` only after the frame
//!   holding them has been written **and fdatasync'ed** (group commit: one writer writes
//!   everything queued while the previous fsync ran, in one `write` + one `fdatasync`; the
//!   writer is a lane's thread, or with one worker the runtime's own thread whenever it runs
//!   out of work, `first_lane`). A staged record is written even if its client hangs up.
//! - The dispatcher (`dispatcher.rs`) then commits each record to its partition log, which
//!   fsyncs, re-reads and verifies it before moving the high watermark; only then does it
//!   call [`Wal::committed`]. A record leaves the WAL only after that.
//! - The checkpoint (lowest LSN not yet committed) is persisted every 100 ms; a sealed
//!   segment is deleted once its lane's next segment starts at or below it (so all its
//!   records are below it). A crash re-dispatches every record at or above the persisted
//!   checkpoint: records committed in that window are committed again (duplicates, never loss).
//! - A deleted segment can come back after a power loss (on a file system without a journal
//!   an unlink reaches the disk only with its directory), over blocks other files rewrote
//!   since. Open knows it by the same rule the deletion followed, its lane's next segment
//!   starting at or below the checkpoint, and removes it unread.
//!
//! # On-disk format
//! Segment files `wal-<first lsn, 20 digits>.log`, each a sequence of frames; one frame per
//! group commit, written with one `write`:
//! `magic u32 | frame length u32 | crc32c u32 (of everything after it) | first lsn u64 |
//! count u32 | count × (topic id u64 | partition u32 | flags u8 | key len u32 | payload len u32 |
//! [attrs len u32, with flag 4] | key | payload | [attrs])`, little-endian. Flags: 1 pinned,
//! 2 has a key, 4 has an attribute block (`crate::attrs`; a record without one is laid out as
//! before attributes existed). A frame that fails its check at the end of the last segment
//! is a torn write and is truncated; a bad frame followed by a valid one is corruption and
//! fails the open loudly.

pub mod dispatcher;
mod first_lane;

pub use first_lane::{flush_at_park, flush_parked, InlineOptions};

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_storage::checked_u64::{self, CheckedU64File, Stored};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

const MAGIC: u32 = 0x4E57_4131; // "NWA1"
const HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 8 + 4 + 1 + 4 + 4;
const FLAG_PINNED: u8 = 1;
const FLAG_HAS_KEY: u8 = 2;
const FLAG_HAS_ATTRS: u8 = 4;
const CHECKPOINT_FILE: &str = "checkpoint";
/// A lane's segment file is extended with written zeros this much at a time, ahead of the
/// frames: a frame then overwrites allocated blocks inside the file's size, and its
/// `fdatasync` flushes the data alone, without the inode write an append needs (the size
/// changes only with each extension). Recovery reads the zeros after the last frame as
/// unused space, not as a torn write.
const PREALLOC_BYTES: u64 = 1024 * 1024;
/// Default [`WalOptions::standby_after`]: several times an fsync on a healthy disk, far
/// below a stalled one. On 2 CPUs at 4,000 produces/s (32 producers, fsyncs of ~0.3 ms),
/// two lanes taking turns wrote ~1.15 records per frame; one lane with a standby writes ~2.
const STANDBY_AFTER: Duration = Duration::from_millis(1);
/// Default [`WalOptions::standby_behind`]. On 2 CPUs, 32 producers as fast as acks allow
/// reached 3–15 % more produces/s with lanes taking turns than with the first lane alone;
/// at 4,000/s a write has ~1 request behind it.
const STANDBY_BEHIND: usize = 8;

/// Errors of the WAL.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("wal io error on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("wal corrupt: {path} at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// The write or fsync failed: nothing of the request is acknowledged (→ 503).
    #[error("write-ahead log unwritable: {0}")]
    Unwritable(String),
    #[error("write-ahead log is shut down")]
    Closed,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A record to stage.
#[derive(Debug, Clone)]
pub struct WalRecord {
    pub topic_id: u64,
    pub partition: u32,
    /// The producer pinned the partition.
    pub pinned: bool,
    pub key: Option<Bytes>,
    pub payload: Bytes,
    /// (ext) The attribute block (`crate::attrs`), if the producer sent attributes.
    pub attrs: Option<Bytes>,
}

impl WalRecord {
    fn encoded_len(&self) -> usize {
        RECORD_HEADER_LEN
            + self.key.as_ref().map_or(0, |k| k.len())
            + self.payload.len()
            + self.attrs.as_ref().map_or(0, |a| 4 + a.len())
    }
}

/// A record that is durable in the WAL, on its way to its partition.
#[derive(Debug, Clone)]
pub struct DurableRecord {
    pub lsn: u64,
    pub record: WalRecord,
}

/// Tunables.
#[derive(Debug, Clone)]
pub struct WalOptions {
    pub segment_max_bytes: u64,
    /// Most bytes in one group-commit frame.
    pub max_frame_bytes: usize,
    /// Stop taking new records while this many bytes wait for the dispatcher.
    pub max_pending_bytes: u64,
    pub checkpoint_interval: Duration,
    /// Writer threads, each with its own segment files. The first lane writes everything
    /// while its writes are quick; the others stand by (see [`Self::standby_after`]).
    pub lanes: usize,
    /// How long a staged record waits for the first lane's running write and fsync before
    /// it calls a standby lane, which then writes and fsyncs everything staged at once. Each
    /// frame costs a lane's wake-up and fsync, so lanes taking turns at every fsync write
    /// smaller groups at a higher CPU cost per record; a standby lane is there for the
    /// fsync that stalls.
    pub standby_after: Duration,
    /// Staged requests waiting for the first lane's running write that call a standby lane
    /// at once: the first lane cannot keep up alone (a write of many records takes longer,
    /// and while it runs, as many more arrive).
    pub standby_behind: usize,
    /// The first lane is written by the runtime's thread when it runs out of work, if the
    /// WAL is opened on a thread that does that (see [`first_lane`]); else by its thread.
    pub inline: Option<InlineOptions>,
    /// (tests: `NARAD_TEST_WAL_FSYNC_STALL_MS`) Every write and fsync takes this much
    /// longer: a slow disk.
    pub stall_each_write: Option<Duration>,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_max_bytes: 64 * 1024 * 1024,
            max_frame_bytes: 8 * 1024 * 1024,
            max_pending_bytes: 256 * 1024 * 1024,
            checkpoint_interval: Duration::from_millis(100),
            lanes: 2,
            standby_after: STANDBY_AFTER,
            standby_behind: STANDBY_BEHIND,
            inline: None,
            stall_each_write: None,
        }
    }
}

/// The staged requests the lanes take from, one lane at a time.
type Queue = std::sync::Mutex<mpsc::UnboundedReceiver<Staged>>;

struct Staged {
    records: Vec<WalRecord>,
    done: oneshot::Sender<Result<(), WalError>>,
}

/// One segment file.
#[derive(Debug, Clone)]
struct SegmentFile {
    path: PathBuf,
    lane: usize,
    /// The LSN it is named by: the lane's next LSN when it was created, so at or above every
    /// record of the lane's earlier segments.
    first_lsn: u64,
    /// Highest LSN in it (`None`: none yet).
    max_lsn: Option<u64>,
    /// A lane is writing it.
    active: bool,
}

impl SegmentFile {
    /// Whether the checkpointer may delete `self`, of `all` the segments, at checkpoint
    /// `cp`. Exactly when [`Wal::open`] would remove it unread if it came back after a power
    /// loss: a later segment of its lane starts at or below the checkpoint. Its records
    /// lying below the checkpoint is not enough: while the checkpoint is between its last
    /// LSN and its successor's first (other lanes' records in between), a copy that came
    /// back over rewritten blocks would fail the open as corruption. A segment of a lane
    /// that no longer runs (fewer lanes configured since) has no successor: it goes once
    /// its records are below the checkpoint, and open reads it as its lane's newest, whose
    /// damage is a torn tail.
    fn deletable(&self, all: &[SegmentFile], cp: u64) -> bool {
        if self.active {
            return false;
        }
        let named = all.iter().map(|s| (s.lane, s.first_lsn));
        match next_first_of_lane(named, self.lane, self.first_lsn) {
            Some(next_first) => next_first <= cp,
            None => self.max_lsn.is_none_or(|m| m < cp),
        }
    }
}

/// The first LSN of the segment that follows, in its lane, the one of `lane` named by
/// `first_lsn`, among segments named (lane, first LSN); `None` when it is its lane's newest.
/// Every record of a segment lies below that LSN: the rule by which the checkpointer deletes
/// a segment and open recognises one that came back.
fn next_first_of_lane(
    segments: impl IntoIterator<Item = (usize, u64)>,
    lane: usize,
    first_lsn: u64,
) -> Option<u64> {
    segments
        .into_iter()
        .filter(|&(l, f)| l == lane && f > first_lsn)
        .map(|(_, f)| f)
        .min()
}

/// LSN bookkeeping, under one lock so that the checkpoint never passes an LSN that a lane
/// has taken but not yet made durable.
struct Lsns {
    /// LSNs taken by a lane and not yet committed to their partitions (or given back after
    /// a failed write).
    outstanding: BTreeSet<u64>,
    /// Next LSN to hand out.
    next: u64,
}

/// State shared by the writer threads, the dispatcher and the checkpointer.
struct Shared {
    dir: PathBuf,
    lsns: Mutex<Lsns>,
    segments: Mutex<Vec<SegmentFile>>,
    /// Bytes handed to the dispatcher and not yet committed.
    pending_bytes: AtomicU64,
    last_checkpoint: AtomicU64,
    /// The checkpoint file, kept open and overwritten in place; held by one writer at a time.
    checkpoint_file: Mutex<CheckedU64File>,
    closed: AtomicBool,
    metrics: WalMetrics,
    /// Notified when the last outstanding record is committed (see [`Wal::drained`]).
    drained: tokio::sync::Notify,
    standby: Standby,
    /// (tests) The first lane's next write stalls this long first.
    #[cfg(test)]
    stall_first_lane: Mutex<Option<Duration>>,
}

/// How the first lane's slow write calls a standby lane (see [`WalOptions::standby_after`]).
struct Standby {
    /// Lanes besides the first.
    lanes: usize,
    after: Duration,
    behind: usize,
    epoch: std::time::Instant,
    /// When the first lane's running write began, in microseconds after `epoch`, plus one;
    /// 0 while it waits for work.
    busy_since: AtomicU64,
    /// The write (its `busy_since`) for which a staged record already waits to call a
    /// standby: one timer per slow write, not one per record.
    watched: AtomicU64,
    /// Requests staged during the first lane's running write.
    staged_behind: std::sync::atomic::AtomicUsize,
    /// A call no standby lane has taken yet (at most one is outstanding).
    called_pending: std::sync::Mutex<bool>,
    called: std::sync::Condvar,
    /// The first lane has stopped (the queue closed): so do the standbys.
    stopped: AtomicBool,
}

impl Standby {
    fn new(lanes: usize, after: Duration, behind: usize) -> Standby {
        Standby {
            lanes: lanes.saturating_sub(1),
            after,
            behind: behind.max(1),
            staged_behind: Default::default(),
            epoch: std::time::Instant::now(),
            busy_since: AtomicU64::new(0),
            watched: AtomicU64::new(0),
            called_pending: std::sync::Mutex::new(false),
            called: std::sync::Condvar::new(),
            stopped: AtomicBool::new(false),
        }
    }

    /// The first lane starts (`true`) or ends a write.
    fn first_lane_busy(&self, busy: bool) {
        self.staged_behind.store(0, Ordering::Release);
        let since = if busy {
            self.epoch.elapsed().as_micros() as u64 + 1
        } else {
            0
        };
        self.busy_since.store(since, Ordering::Release);
    }

    /// A request was staged. If the first lane is writing, and has been for `after`, or
    /// another `behind` requests now wait for it, a standby lane is called (again for
    /// each such request, so that a standby keeps writing through a long stall); else the
    /// running write, if no staged record watches it yet: this caller then does (see
    /// [`Self::running`]).
    fn staged(&self) -> Option<(u64, std::time::Instant)> {
        let (write, due) = self.running()?;
        let behind = self.staged_behind.fetch_add(1, Ordering::AcqRel) + 1;
        if behind.is_multiple_of(self.behind) || std::time::Instant::now() >= due {
            self.call();
            return None;
        }
        (self.watched.swap(write, Ordering::AcqRel) != write).then_some((write, due))
    }

    /// The first lane's running write (its start as stored), and when a record staged
    /// during it calls a standby lane; `None` without standbys or while the lane waits.
    fn running(&self) -> Option<(u64, std::time::Instant)> {
        if self.lanes == 0 {
            return None;
        }
        let since = self.busy_since.load(Ordering::Acquire);
        (since != 0).then(|| {
            let started = self.epoch + Duration::from_micros(since - 1);
            (since, started + self.after)
        })
    }

    fn call(&self) {
        let mut pending = self
            .called_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !*pending {
            *pending = true;
            self.called.notify_one();
        }
    }

    /// A standby lane waits to be called: false once the WAL stops.
    fn wait_call(&self) -> bool {
        let mut pending = self
            .called_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return false;
            }
            if std::mem::take(&mut *pending) {
                return true;
            }
            pending = self
                .called
                .wait_timeout(pending, Duration::from_secs(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let _pending = self
            .called_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.called.notify_all();
    }
}

/// Counters the WAL keeps for `/metrics`.
#[derive(Debug, Default)]
pub struct WalMetrics {
    pub frames: AtomicU64,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub fsync_micros_total: AtomicU64,
    pub write_errors: AtomicU64,
    /// Times a slow write and fsync moved the first lane off the runtime's thread
    /// (`first_lane`).
    pub first_lane_takeovers: AtomicU64,
}

/// Handle to the WAL (cheap to clone).
#[derive(Clone)]
pub struct Wal {
    /// Dropped before `first_lane`: the lane's thread, woken by the last handle's drop,
    /// finds the queue closed.
    tx: mpsc::UnboundedSender<Staged>,
    shared: Arc<Shared>,
    /// The first lane, when the runtime's thread writes it.
    first_lane: Option<Arc<LastHandle>>,
}

/// Wakes the first lane's thread when the last [`Wal`] handle goes, so that it ends.
struct LastHandle(Arc<first_lane::FirstLane>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        self.0.call();
    }
}

/// What `Wal::open` hands back besides the handle.
pub struct Opened {
    pub wal: Wal,
    /// Records at or above the checkpoint found at open: to dispatch again.
    pub recovered: Vec<DurableRecord>,
    /// Durable records, batch by batch, for the dispatcher.
    pub durable_rx: mpsc::UnboundedReceiver<Vec<DurableRecord>>,
}

fn segment_path(dir: &Path, lane: usize, first_lsn: u64) -> PathBuf {
    dir.join(format!("wal-{lane}-{first_lsn:020}.log"))
}

fn fsync_dir(dir: &Path) -> Result<(), WalError> {
    narad_storage::dirs::sync_dir(dir).map_err(io_err(dir))
}

fn create_segment(dir: &Path, lane: usize, first_lsn: u64) -> Result<(PathBuf, File), WalError> {
    let path = segment_path(dir, lane, first_lsn);
    // Never reuse a name: a file that exists may hold records (or be listed for deletion).
    let file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .read(true)
        .open(&path)
        .map_err(io_err(&path))?;
    Ok((path, file))
}

impl Wal {
    /// Opens the WAL in `dir`, recovers what is there, and starts the writer threads.
    pub fn open(dir: &Path, opts: WalOptions) -> Result<Opened, WalError> {
        narad_storage::dirs::create_dir_all_durable(dir).map_err(io_err(dir))?;
        let checkpoint = read_checkpoint(dir)?;
        let found = list_segments(dir)?;
        let mut recovered = Vec::new();
        let mut next_lsn = checkpoint;
        let mut segments = Vec::new();
        for (lane, first_lsn, path) in &found {
            let named = found.iter().map(|(l, f, _)| (*l, *f));
            let next_first = next_first_of_lane(named, *lane, *first_lsn);
            if let Some(next_first) = next_first.filter(|&f| f <= checkpoint) {
                // Wholly below the checkpoint, so deleted once already: after a power loss
                // on a file system without a journal, a deletion that never reached the disk
                // brings the name back, over blocks that other files may have rewritten
                // since. Nothing in it is needed; it is not read.
                tracing::warn!(path = %path.display(), first_lsn, next_first, checkpoint,
                    "wal segment below the checkpoint came back; removed unread");
                fs::remove_file(path).map_err(io_err(path))?;
                continue;
            }
            // Only each lane's newest segment can hold a torn write.
            let newest_of_lane = next_first.is_none();
            let recs = recover_segment(path, newest_of_lane)?;
            let max_lsn = recs.iter().map(|r| r.lsn).max();
            if max_lsn.is_none() {
                // Holds nothing (a lane that never wrote before a crash, or a torn first
                // frame): remove it now. Kept, its name could be the one a new lane file
                // gets below, and the checkpointer would then delete that live file.
                fs::remove_file(path).map_err(io_err(path))?;
                continue;
            }
            for r in recs {
                next_lsn = next_lsn.max(r.lsn + 1);
                if r.lsn >= checkpoint {
                    recovered.push(r);
                }
            }
            segments.push(SegmentFile {
                path: path.clone(),
                lane: *lane,
                first_lsn: *first_lsn,
                max_lsn,
                active: false,
            });
        }
        recovered.sort_by_key(|r| r.lsn);
        // New writes go to fresh segments; old ones are deleted once committed.
        let lanes = opts.lanes.max(1);
        let mut files = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            let (path, file) = create_segment(dir, lane, next_lsn)?;
            segments.push(SegmentFile {
                path: path.clone(),
                lane,
                first_lsn: next_lsn,
                max_lsn: None,
                active: true,
            });
            files.push((path, file));
        }
        fsync_dir(dir)?;
        if !recovered.is_empty() {
            tracing::info!(
                records = recovered.len(),
                checkpoint,
                next_lsn,
                "wal recovered records to dispatch again"
            );
        }
        let outstanding: BTreeSet<u64> = recovered.iter().map(|r| r.lsn).collect();
        let pending: u64 = recovered
            .iter()
            .map(|r| r.record.encoded_len() as u64)
            .sum();
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            lsns: Mutex::new(Lsns {
                outstanding,
                next: next_lsn,
            }),
            segments: Mutex::new(segments),
            pending_bytes: AtomicU64::new(pending),
            last_checkpoint: AtomicU64::new(checkpoint),
            checkpoint_file: Mutex::new(CheckedU64File::new(dir.join(CHECKPOINT_FILE))),
            closed: AtomicBool::new(false),
            metrics: WalMetrics::default(),
            drained: tokio::sync::Notify::new(),
            standby: Standby::new(lanes, opts.standby_after, opts.standby_behind),
            #[cfg(test)]
            stall_first_lane: Mutex::new(None),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        // std's Mutex, not parking_lot's: the first lane holds it while it blocks in recv, so
        // a standby lane called in a race with its return may find it taken; parking_lot
        // would spin with sched_yield before parking, std parks on a futex.
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let (durable_tx, durable_rx) = mpsc::unbounded_channel();
        let mut inline_lane = None;
        for (lane, (path, file)) in files.into_iter().enumerate() {
            let writer = Writer {
                shared: shared.clone(),
                lane,
                file,
                path,
                len: 0,
                allocated: 0,
                opts: opts.clone(),
                buf: Vec::new(),
                durable_tx: durable_tx.clone(),
            };
            let rx = rx.clone();
            if let (0, Some(inline), true) = (lane, &opts.inline, first_lane::flushes_at_park()) {
                let started = first_lane::FirstLane::start(writer, rx, inline.clone())
                    .map_err(io_err(dir))?;
                inline_lane = Some(Arc::new(LastHandle(started)));
                continue;
            }
            std::thread::Builder::new()
                .name(format!("narad-wal-{lane}"))
                .spawn(move || writer.run(rx))
                .map_err(io_err(dir))?;
        }
        if opts.inline.is_some() {
            tracing::info!(
                runtime_thread = inline_lane.is_some(),
                dir = %dir.display(),
                "wal first lane opened"
            );
        }
        let cp_shared = shared.clone();
        std::thread::Builder::new()
            .name("narad-wal-checkpoint".into())
            .spawn(move || checkpoint_loop(cp_shared, opts.checkpoint_interval))
            .map_err(io_err(dir))?;
        Ok(Opened {
            wal: Wal {
                tx,
                shared,
                first_lane: inline_lane,
            },
            recovered,
            durable_rx,
        })
    }

    /// Stages `records` and resolves once they are durable (or failed). The write happens
    /// even if the returned future is dropped.
    pub async fn append(&self, records: Vec<WalRecord>) -> Result<(), WalError> {
        let (done, mut rx) = oneshot::channel();
        self.tx
            .send(Staged { records, done })
            .map_err(|_| WalError::Closed)?;
        if let Some(lane) = self.first_lane.as_ref().filter(|l| l.0.inline()) {
            return lane.0.wait(rx).await;
        }
        // Staged while the first lane writes: the records wait for that write to end, and
        // call a standby lane if it runs past `standby_after` (the first record staged
        // during a write watches it for all) or if `standby_behind` requests wait for it.
        // A write that began after the staging took them (the lane takes everything
        // staged), so it is not waited on.
        let standby = &self.shared.standby;
        if let Some((write, due)) = standby.staged() {
            tokio::select! {
                biased;
                answer = &mut rx => return answer.map_err(|_| WalError::Closed)?,
                _ = tokio::time::sleep_until(due.into()) => {}
            }
            if standby.running().is_some_and(|(now, _)| now == write) {
                standby.call();
            }
        }
        rx.await.map_err(|_| WalError::Closed)?
    }

    /// The dispatcher committed these records to their partitions (or discarded them for
    /// a deleted topic): they may leave the WAL.
    pub fn committed(&self, records: &[DurableRecord]) {
        let bytes: u64 = records.iter().map(|r| r.record.encoded_len() as u64).sum();
        let drained = {
            let mut l = self.shared.lsns.lock();
            for r in records {
                l.outstanding.remove(&r.lsn);
            }
            l.outstanding.is_empty()
        };
        self.shared.pending_bytes.fetch_sub(bytes, Ordering::AcqRel);
        if drained {
            self.shared.drained.notify_waiters();
        }
    }

    /// Resolves once every record staged so far has been committed to its partition (or
    /// discarded for a deleted topic): the WAL holds nothing a restart would re-send.
    pub async fn drained(&self) {
        loop {
            let notified = self.shared.drained.notified();
            tokio::pin!(notified);
            // Registered before the check, so a commit between the two is not missed.
            notified.as_mut().enable();
            if self.outstanding() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Records staged or durable and not yet committed to their partitions.
    pub fn outstanding(&self) -> usize {
        self.shared.lsns.lock().outstanding.len()
    }

    pub fn metrics(&self) -> &WalMetrics {
        &self.shared.metrics
    }

    /// Persists the checkpoint once more and stops the background threads.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        let _ = write_checkpoint_if_moved(&self.shared);
    }
}

/// Requests a lane took to write as one frame.
struct Batch {
    staged: Vec<Staged>,
    /// Their records' encoded bytes.
    bytes: usize,
}

/// How a lane takes staged requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    /// A lane's thread with nothing else to do: waits for a request, then while the
    /// dispatcher is far behind (back-pressure).
    Wait,
    /// A lane's thread called to write what is staged: takes it, then waits while the
    /// dispatcher is far behind.
    Ready,
    /// The runtime's thread: takes what is staged unless the dispatcher is far behind or
    /// another lane holds the queue, and never waits (the dispatcher runs on that thread).
    Inline,
}

struct Writer {
    shared: Arc<Shared>,
    lane: usize,
    file: File,
    path: PathBuf,
    /// End of the frames written.
    len: u64,
    /// Bytes of the file written so far: frames, then zeros (see [`PREALLOC_BYTES`]).
    allocated: u64,
    opts: WalOptions,
    buf: Vec<u8>,
    durable_tx: mpsc::UnboundedSender<Vec<DurableRecord>>,
}

impl Writer {
    fn run(self, rx: Arc<Queue>) {
        if self.lane == 0 {
            self.run_first(rx)
        } else {
            self.run_standby(rx)
        }
    }

    /// The first lane: takes everything queued, writes it as one frame, fsyncs, answers.
    fn run_first(mut self, rx: Arc<Queue>) {
        let mut carry: Option<Staged> = None;
        while let Some(batch) = self.take_batch(&rx, &mut carry, Take::Wait) {
            self.commit_as_first(batch.staged);
        }
        self.shared.standby.stop();
    }

    /// Writes `batch` as the first lane, whose running write a record staged meanwhile
    /// watches (see [`Standby`]); how long the write and fsync took.
    fn commit_as_first(&mut self, batch: Vec<Staged>) -> Duration {
        self.shared.standby.first_lane_busy(true);
        let started = std::time::Instant::now();
        self.commit_group(batch);
        let took = started.elapsed();
        self.shared.standby.first_lane_busy(false);
        took
    }

    /// A standby lane: called when a record would wait too long for the first lane's
    /// write, takes everything queued then, writes it, and waits for the next call.
    fn run_standby(mut self, rx: Arc<Queue>) {
        let mut carry: Option<Staged> = None;
        while self.shared.standby.wait_call() {
            // What did not fit into one frame goes into the next at once. (Nothing staged:
            // the first lane took it meanwhile.)
            while let Some(batch) = self.take_batch(&rx, &mut carry, Take::Ready) {
                self.commit_group(batch.staged);
                if carry.is_none() {
                    break;
                }
            }
        }
    }

    /// The dispatcher is far behind: no lane takes more until it catches up.
    fn backlogged(&self) -> bool {
        self.shared.pending_bytes.load(Ordering::Acquire) > self.opts.max_pending_bytes
    }

    /// What the last batch carried, else the next staged request (see [`Take`]), and
    /// whatever else is queued, up to a frame's bytes (the rest is carried). `None`:
    /// nothing staged (with [`Take::Wait`]: the queue closed; with [`Take::Inline`]: or
    /// the dispatcher is behind, or another lane holds the queue, or the next request is
    /// too large for the runtime to write and is carried for the lane's thread).
    fn take_batch(&self, rx: &Queue, carry: &mut Option<Staged>, take: Take) -> Option<Batch> {
        if take == Take::Inline && self.backlogged() {
            return None;
        }
        // A lane that panicked while holding it left the queue intact.
        let mut rx = match take {
            // A lane holding the queue may be waiting for the dispatcher, which runs on the
            // runtime: the runtime never waits for it (the lane takes what is staged).
            Take::Inline => match rx.try_lock() {
                Ok(rx) => rx,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return None,
            },
            Take::Wait | Take::Ready => rx.lock().unwrap_or_else(|p| p.into_inner()),
        };
        let first = match carry.take() {
            Some(s) => s,
            None if take == Take::Wait => rx.blocking_recv()?,
            None => rx.try_recv().ok()?,
        };
        while take != Take::Inline && self.backlogged() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // A request larger than this is not the runtime's to write (see
        // `InlineOptions::max_bytes`).
        let inline_max = match (take, &self.opts.inline) {
            (Take::Inline, Some(inline)) => inline.max_bytes,
            _ => usize::MAX,
        };
        let staged_bytes = |s: &Staged| s.records.iter().map(WalRecord::encoded_len).sum();
        let mut bytes: usize = staged_bytes(&first);
        if bytes > inline_max {
            *carry = Some(first);
            return None;
        }
        let mut staged = vec![first];
        while bytes < self.opts.max_frame_bytes {
            let Ok(s) = rx.try_recv() else { break };
            let n = staged_bytes(&s);
            if bytes + n > self.opts.max_frame_bytes || n > inline_max {
                *carry = Some(s);
                break;
            }
            bytes += n;
            staged.push(s);
        }
        Some(Batch { staged, bytes })
    }

    fn commit_group(&mut self, batch: Vec<Staged>) {
        let count: usize = batch.iter().map(|s| s.records.len()).sum();
        if count == 0 {
            for s in batch {
                let _ = s.done.send(Ok(()));
            }
            return;
        }
        // Take the LSNs and mark them outstanding in one step: the checkpoint cannot pass
        // them before they are durable and committed.
        let first_lsn = {
            let mut l = self.shared.lsns.lock();
            let first = l.next;
            l.next += count as u64;
            l.outstanding.extend(first..first + count as u64);
            first
        };
        #[cfg(test)]
        if self.lane == 0 {
            if let Some(stall) = self.shared.stall_first_lane.lock().take() {
                std::thread::sleep(stall);
            }
        }
        if let Some(stall) = self.opts.stall_each_write {
            std::thread::sleep(stall);
        }
        encode_frame(
            &mut self.buf,
            first_lsn,
            batch.iter().flat_map(|s| s.records.iter()),
            count,
        );
        let started = std::time::Instant::now();
        let result = self
            .preallocate(self.len + self.buf.len() as u64)
            .and_then(|_| self.file.write_all_at(&self.buf, self.len))
            .and_then(|_| self.file.sync_data());
        self.shared
            .metrics
            .fsync_micros_total
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        match result {
            Ok(()) => {
                self.len += self.buf.len() as u64;
                let last_lsn = first_lsn + count as u64 - 1;
                if let Some(seg) = self
                    .shared
                    .segments
                    .lock()
                    .iter_mut()
                    .find(|s| s.path == self.path)
                {
                    seg.max_lsn = Some(seg.max_lsn.map_or(last_lsn, |m| m.max(last_lsn)));
                }
                let m = &self.shared.metrics;
                m.frames.fetch_add(1, Ordering::Relaxed);
                m.records.fetch_add(count as u64, Ordering::Relaxed);
                m.bytes.fetch_add(self.buf.len() as u64, Ordering::Relaxed);
                let mut durable = Vec::with_capacity(count);
                let mut pending = 0u64;
                let mut lsn = first_lsn;
                for s in &batch {
                    for r in &s.records {
                        pending += r.encoded_len() as u64;
                        durable.push(DurableRecord {
                            lsn,
                            record: r.clone(),
                        });
                        lsn += 1;
                    }
                }
                self.shared
                    .pending_bytes
                    .fetch_add(pending, Ordering::AcqRel);
                // Hand over before answering, so a record is never only in the answer.
                let _ = self.durable_tx.send(durable);
                // Roll before answering (once per segment): whoever saw the answer sees the
                // sealed file cut back to its last frame.
                if self.len >= self.opts.segment_max_bytes {
                    if let Err(e) = self.roll() {
                        tracing::error!(error = %e, "wal segment roll failed; continuing in the current segment");
                    }
                }
                for s in batch {
                    let _ = s.done.send(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "wal write failed");
                self.shared
                    .metrics
                    .write_errors
                    .fetch_add(1, Ordering::Relaxed);
                // Cut what may have been written so the log stays clean.
                self.allocated = self.len;
                if let Err(e2) = self
                    .file
                    .set_len(self.len)
                    .and_then(|_| self.file.sync_all())
                {
                    tracing::error!(error = %e2, "wal truncate after a failed write failed");
                }
                {
                    let mut l = self.shared.lsns.lock();
                    for lsn in first_lsn..first_lsn + count as u64 {
                        l.outstanding.remove(&lsn);
                    }
                }
                let msg = e.to_string();
                for s in batch {
                    let _ = s.done.send(Err(WalError::Unwritable(msg.clone())));
                }
            }
        }
    }

    /// Makes sure the file is written up to the next multiple of [`PREALLOC_BYTES`] at or
    /// after `end`: `[len, end)` is the frame the caller writes next, zeros go after it
    /// (made durable by the frame's fsync that follows).
    fn preallocate(&mut self, end: u64) -> io::Result<()> {
        if end <= self.allocated {
            return Ok(());
        }
        let target = end.next_multiple_of(PREALLOC_BYTES);
        narad_storage::write_zeros_at(&self.file, end, target - end)?;
        self.allocated = target;
        Ok(())
    }

    fn roll(&mut self) -> Result<(), WalError> {
        // A sealed segment ends at its last frame: only a lane's newest one has unused space.
        self.file
            .set_len(self.len)
            .and_then(|_| self.file.sync_all())
            .map_err(io_err(&self.path))?;
        self.allocated = self.len;
        let first = self.shared.lsns.lock().next;
        let (path, file) = create_segment(&self.shared.dir, self.lane, first)?;
        fsync_dir(&self.shared.dir)?;
        {
            let mut segs = self.shared.segments.lock();
            if let Some(old) = segs.iter_mut().find(|s| s.path == self.path) {
                old.active = false;
            }
            segs.push(SegmentFile {
                path: path.clone(),
                lane: self.lane,
                first_lsn: first,
                max_lsn: None,
                active: true,
            });
        }
        self.file = file;
        self.path = path;
        self.len = 0;
        self.allocated = 0;
        Ok(())
    }
}

fn encode_frame<'a>(
    buf: &mut Vec<u8>,
    first_lsn: u64,
    records: impl Iterator<Item = &'a WalRecord>,
    count: usize,
) {
    buf.clear();
    buf.extend_from_slice(&MAGIC.to_le_bytes());
    buf.extend_from_slice(&[0u8; 8]); // length, crc: filled below
    buf.extend_from_slice(&first_lsn.to_le_bytes());
    buf.extend_from_slice(&(count as u32).to_le_bytes());
    for r in records {
        buf.extend_from_slice(&r.topic_id.to_le_bytes());
        buf.extend_from_slice(&r.partition.to_le_bytes());
        let mut flags = 0u8;
        if r.pinned {
            flags |= FLAG_PINNED;
        }
        if r.key.is_some() {
            flags |= FLAG_HAS_KEY;
        }
        if r.attrs.is_some() {
            flags |= FLAG_HAS_ATTRS;
        }
        buf.push(flags);
        let key: &[u8] = r.key.as_deref().unwrap_or(&[]);
        buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
        buf.extend_from_slice(&(r.payload.len() as u32).to_le_bytes());
        if let Some(a) = &r.attrs {
            buf.extend_from_slice(&(a.len() as u32).to_le_bytes());
        }
        buf.extend_from_slice(key);
        buf.extend_from_slice(&r.payload);
        if let Some(a) = &r.attrs {
            buf.extend_from_slice(a);
        }
    }
    let len = buf.len() as u32;
    buf[4..8].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&buf[12..]);
    buf[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the frame at the start of `data`: `Ok(Some((records, frame len)))`, `Ok(None)` if
/// it is not a valid frame.
fn decode_frame(data: &[u8]) -> Option<(Vec<DurableRecord>, usize)> {
    if data.len() < HEADER_LEN {
        return None;
    }
    let u32at = |p: usize| u32::from_le_bytes(data[p..p + 4].try_into().unwrap());
    let u64at = |p: usize| u64::from_le_bytes(data[p..p + 8].try_into().unwrap());
    if u32at(0) != MAGIC {
        return None;
    }
    let len = u32at(4) as usize;
    if len < HEADER_LEN || len > data.len() {
        return None;
    }
    if crc32c::crc32c(&data[12..len]) != u32at(8) {
        return None;
    }
    let first_lsn = u64at(12);
    let count = u32at(20) as usize;
    // Every record takes at least its header: a count the frame cannot hold is not a valid
    // frame (and is never trusted for an allocation); nor one whose lsns would wrap.
    if count > (len - HEADER_LEN) / RECORD_HEADER_LEN
        || first_lsn.checked_add(count as u64).is_none()
    {
        return None;
    }
    let frame = Bytes::copy_from_slice(&data[..len]);
    let mut out = Vec::with_capacity(count);
    let mut p = HEADER_LEN;
    for i in 0..count {
        if p + RECORD_HEADER_LEN > len {
            return None;
        }
        let topic_id = u64at(p);
        let partition = u32at(p + 8);
        let flags = data[p + 12];
        let klen = u32at(p + 13) as usize;
        let plen = u32at(p + 17) as usize;
        p += RECORD_HEADER_LEN;
        let alen = if flags & FLAG_HAS_ATTRS != 0 {
            if p + 4 > len {
                return None;
            }
            p += 4;
            Some(u32at(p - 4) as usize)
        } else {
            None
        };
        let body = klen + plen + alen.unwrap_or(0);
        if p + body > len {
            return None;
        }
        let key = (flags & FLAG_HAS_KEY != 0).then(|| frame.slice(p..p + klen));
        let payload = frame.slice(p + klen..p + klen + plen);
        let attrs = alen.map(|a| frame.slice(p + klen + plen..p + klen + plen + a));
        p += body;
        out.push(DurableRecord {
            lsn: first_lsn + i as u64,
            record: WalRecord {
                topic_id,
                partition,
                pinned: flags & FLAG_PINNED != 0,
                key,
                payload,
                attrs,
            },
        });
    }
    (p == len).then_some((out, len))
}

/// Reads every valid frame of a segment. In the last segment a bad tail (torn write) is
/// truncated; anywhere else, or when a valid frame follows the bad one, it is corruption.
fn recover_segment(path: &Path, last: bool) -> Result<Vec<DurableRecord>, WalError> {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(io_err(path))?;
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < data.len() {
        match decode_frame(&data[pos..]) {
            Some((recs, len)) => {
                out.extend(recs);
                pos += len;
            }
            None => {
                // Zeros to the end of the newest segment: the space preallocated ahead of
                // the frames, not a torn write. Cut like one (the segment is sealed now).
                let unused = last && data[pos..].iter().all(|&b| b == 0);
                if unused {
                    tracing::debug!(path = %path.display(), position = pos, "wal preallocated tail cut");
                    truncate_segment(path, pos)?;
                    break;
                }
                let valid_after = (pos + 1..data.len().saturating_sub(HEADER_LEN - 1)).any(|p| {
                    data[p..p + 4] == MAGIC.to_le_bytes() && decode_frame(&data[p..]).is_some()
                });
                if !last || valid_after {
                    tracing::error!(path = %path.display(), position = pos, "wal corruption before valid data");
                    return Err(WalError::Corrupt {
                        path: path.to_path_buf(),
                        position: pos as u64,
                        reason: if last {
                            "invalid frame followed by a valid one".into()
                        } else {
                            "invalid frame in a sealed segment".into()
                        },
                    });
                }
                tracing::warn!(path = %path.display(), position = pos, dropped_bytes = data.len() - pos, "wal torn tail truncated");
                truncate_segment(path, pos)?;
                break;
            }
        }
    }
    Ok(out)
}

fn truncate_segment(path: &Path, len: usize) -> Result<(), WalError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(len as u64).and_then(|_| f.sync_all()))
        .map_err(io_err(path))
}

/// Segment files as (lane, first lsn, path), oldest first.
fn list_segments(dir: &Path) -> Result<Vec<(usize, u64, PathBuf)>, WalError> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some(rest) = name
            .strip_prefix("wal-")
            .and_then(|s| s.strip_suffix(".log"))
        else {
            continue;
        };
        if let Some((lane, first)) = rest.split_once('-') {
            if let (Ok(lane), Ok(first)) = (lane.parse::<usize>(), first.parse::<u64>()) {
                found.push((first, lane, entry.path()));
            }
        }
    }
    found.sort();
    Ok(found
        .into_iter()
        .map(|(first, lane, path)| (lane, first, path))
        .collect())
}

fn read_checkpoint(dir: &Path) -> Result<u64, WalError> {
    let path = dir.join(CHECKPOINT_FILE);
    match checked_u64::read(&path) {
        Ok(Stored::Value(lsn)) => Ok(lsn),
        Ok(Stored::Missing) => Ok(0),
        Ok(Stored::Damaged(why)) => {
            tracing::warn!(path = %path.display(), why, "wal checkpoint damaged; replaying every segment");
            Ok(0)
        }
        Err(e) => Err(WalError::Io { path, source: e }),
    }
}

fn write_checkpoint_if_moved(shared: &Shared) -> Result<(), WalError> {
    let mut file = shared.checkpoint_file.lock();
    let cp = {
        let l = shared.lsns.lock();
        l.outstanding.first().copied().unwrap_or(l.next)
    };
    if cp == shared.last_checkpoint.load(Ordering::Acquire) {
        return Ok(());
    }
    file.write(cp).map_err(io_err(file.path()))?;
    shared.last_checkpoint.store(cp, Ordering::Release);
    // Delete sealed segments the checkpoint has passed, by the rule open applies to one
    // that comes back.
    let doomed: Vec<PathBuf> = {
        let mut segs = shared.segments.lock();
        let doomed: Vec<PathBuf> = segs
            .iter()
            .filter(|s| s.deletable(&segs, cp))
            .map(|s| s.path.clone())
            .collect();
        segs.retain(|s| !doomed.contains(&s.path));
        doomed
    };
    let deleted = !doomed.is_empty();
    for p in doomed {
        if let Err(e) = fs::remove_file(&p) {
            tracing::warn!(path = %p.display(), error = %e, "could not delete a checkpointed wal segment");
        }
    }
    if deleted {
        // Makes the deletions durable soon (on a file system without a journal, an
        // unlink reaches the disk only with its directory); `Wal::open` removes unread a
        // segment that comes back anyway.
        fsync_dir(&shared.dir)?;
    }
    Ok(())
}

fn checkpoint_loop(shared: Arc<Shared>, interval: Duration) {
    while !shared.closed.load(Ordering::Acquire) {
        std::thread::sleep(interval);
        if let Err(e) = write_checkpoint_if_moved(&shared) {
            tracing::error!(error = %e, "wal checkpoint failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn rec(topic: u64, p: u32, key: Option<&str>, payload: &str) -> WalRecord {
        WalRecord {
            topic_id: topic,
            partition: p,
            pinned: false,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            payload: Bytes::copy_from_slice(payload.as_bytes()),
            attrs: None,
        }
    }

    #[test]
    fn a_new_wal_dir_and_its_segments_are_durable() {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("ingress");
        let (o, synced) =
            narad_storage::dirs::record_dir_syncs(|| Wal::open(&dir, WalOptions::default()));
        let o = o.unwrap();
        // The directory's own entry (in the data dir), then the segment files' (in it).
        assert_eq!(
            synced,
            vec![dir.clone(), data.path().to_path_buf(), dir.clone()]
        );
        o.wal.close();
    }

    #[test]
    fn frame_round_trip_keeps_empty_and_absent_keys_apart() {
        let recs = [
            rec(1, 0, None, "a"),
            rec(2, 1, Some(""), "bb"),
            rec(3, 2, Some("k"), ""),
        ];
        let mut buf = Vec::new();
        encode_frame(&mut buf, 7, recs.iter(), recs.len());
        let (out, len) = decode_frame(&buf).unwrap();
        assert_eq!(len, buf.len());
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].lsn, 7);
        assert_eq!(out[2].lsn, 9);
        assert_eq!(out[0].record.key, None);
        assert_eq!(out[1].record.key.as_deref(), Some(&b""[..]));
        assert_eq!(out[2].record.payload.len(), 0);
        let mut bad = buf.clone();
        bad[30] ^= 1;
        assert!(decode_frame(&bad).is_none());
    }

    #[tokio::test]
    async fn append_recover_and_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            checkpoint_interval: Duration::from_millis(10),
            ..Default::default()
        };
        {
            let mut o = Wal::open(dir.path(), opts.clone()).unwrap();
            assert!(o.recovered.is_empty());
            o.wal
                .append(vec![rec(1, 0, None, "one"), rec(1, 1, Some("k"), "two")])
                .await
                .unwrap();
            o.wal.append(vec![rec(1, 2, None, "three")]).await.unwrap();
            let mut got = Vec::new();
            while got.len() < 3 {
                got.extend(o.durable_rx.recv().await.unwrap());
            }
            // Commit only the first: the other two must come back after a crash.
            o.wal.committed(&got[..1]);
            tokio::time::sleep(Duration::from_millis(50)).await;
            o.wal.close();
        }
        let o = Wal::open(dir.path(), opts).unwrap();
        let payloads: Vec<_> = o
            .recovered
            .iter()
            .map(|r| r.record.payload.clone())
            .collect();
        assert_eq!(
            payloads,
            vec![Bytes::from_static(b"two"), Bytes::from_static(b"three")]
        );
        assert_eq!(o.recovered[0].lsn, 1);
    }

    /// A crash before a lane wrote anything leaves empty segment files named after the next
    /// LSN; the next open must not reuse those names (the checkpointer would delete the
    /// stale entry's path, unlinking the live file with acknowledged records in it).
    #[tokio::test]
    async fn restarts_that_wrote_nothing_never_cost_records() {
        let dir = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            checkpoint_interval: Duration::from_millis(5),
            ..Default::default()
        };
        // Two incarnations that write nothing (killed right after start).
        for _ in 0..2 {
            let o = Wal::open(dir.path(), opts.clone()).unwrap();
            assert!(o.recovered.is_empty());
        }
        let want: Vec<Bytes> = (0..8).map(|i| Bytes::from(format!("kept-{i}"))).collect();
        {
            let mut o = Wal::open(dir.path(), opts.clone()).unwrap();
            for i in 0..4 {
                o.wal
                    .append(vec![rec(1, 0, None, &format!("done-{i}"))])
                    .await
                    .unwrap();
            }
            let mut got = Vec::new();
            while got.len() < 4 {
                got.extend(o.durable_rx.recv().await.unwrap());
            }
            // Everything so far committed: the checkpoint moves and old segments go.
            o.wal.committed(&got);
            tokio::time::sleep(Duration::from_millis(50)).await;
            // Then more records, on every lane; the process dies without closing.
            for p in &want {
                o.wal
                    .append(vec![rec(1, 0, None, std::str::from_utf8(p).unwrap())])
                    .await
                    .unwrap();
            }
        }
        let o = Wal::open(dir.path(), opts).unwrap();
        let payloads: Vec<_> = o
            .recovered
            .iter()
            .map(|r| r.record.payload.clone())
            .collect();
        assert_eq!(payloads, want);
    }

    /// After a power loss on a file system without a journal, a segment deleted below the
    /// checkpoint can come back under its name, over blocks other files rewrote since. Open
    /// removes it unread; a sealed segment that may still hold needed records stays loud.
    #[tokio::test]
    async fn a_deleted_segment_that_comes_back_is_removed_unread_only_below_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            lanes: 1,
            checkpoint_interval: Duration::from_millis(5),
            ..Default::default()
        };
        let commit_all = |o: &mut Opened, n: usize| {
            let mut got = Vec::new();
            while got.len() < n {
                got.extend(o.durable_rx.try_recv().unwrap_or_default());
                std::thread::yield_now();
            }
            o.wal.committed(&got);
        };
        {
            let mut o = Wal::open(dir.path(), opts.clone()).unwrap();
            o.wal.append(vec![rec(1, 0, None, "old")]).await.unwrap();
            commit_all(&mut o, 1);
            o.wal.close();
        }
        let first = segment_path(dir.path(), 0, 0);
        let garbage = b"not a frame: another file's blocks".repeat(40);
        {
            let mut o = Wal::open(dir.path(), opts.clone()).unwrap();
            let again = std::mem::take(&mut o.recovered);
            o.wal.committed(&again);
            o.wal.append(vec![rec(1, 0, None, "two")]).await.unwrap();
            commit_all(&mut o, 1);
            // The checkpoint passes the first incarnation's segment, which goes.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while first.exists() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "segment never deleted"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            o.wal.append(vec![rec(1, 0, None, "kept")]).await.unwrap();
            // Dies without committing "kept"; the deletion did not reach the disk.
            fs::write(&first, &garbage).unwrap();
        }
        let o = Wal::open(dir.path(), opts.clone()).unwrap();
        assert_eq!(recovered_payloads(&o), vec![Bytes::from_static(b"kept")]);
        assert!(!first.exists(), "the segment that came back is removed");
        drop(o);

        // A sealed segment whose records the checkpoint has not passed: garbage there is
        // corruption, not a deletion that came back.
        let dir = tempfile::tempdir().unwrap();
        for _ in 0..2 {
            let o = Wal::open(dir.path(), opts.clone()).unwrap();
            o.wal
                .append(vec![rec(1, 0, None, "pending")])
                .await
                .unwrap();
        }
        fs::write(segment_path(dir.path(), 0, 0), &garbage).unwrap();
        assert!(matches!(
            Wal::open(dir.path(), opts),
            Err(WalError::Corrupt { .. })
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_appends_over_lanes_are_all_recovered_once() {
        let dir = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            lanes: 3,
            // Every record staged during a write calls a standby: all lanes take turns.
            standby_after: Duration::ZERO,
            segment_max_bytes: 4096,
            checkpoint_interval: Duration::from_millis(5),
            ..Default::default()
        };
        let committed: Vec<DurableRecord>;
        {
            let mut o = Wal::open(dir.path(), opts.clone()).unwrap();
            produce_concurrently(&o.wal, 16, 50).await;
            let mut got = Vec::new();
            while got.len() < 800 {
                got.extend(o.durable_rx.recv().await.unwrap());
            }
            // Commit the even LSNs only; the odd ones must all come back, once each.
            committed = got.iter().filter(|r| r.lsn % 2 == 0).cloned().collect();
            o.wal.committed(&committed);
            tokio::time::sleep(Duration::from_millis(30)).await;
            o.wal.close();
        }
        let o = Wal::open(dir.path(), opts).unwrap();
        let lsns: Vec<u64> = o.recovered.iter().map(|r| r.lsn).collect();
        let mut want: Vec<u64> = (0..800).filter(|l| l % 2 == 1).collect();
        // The checkpoint may lag, so committed records above it may come back too.
        let cp = read_checkpoint(dir.path()).unwrap();
        want.extend(committed.iter().map(|r| r.lsn).filter(|l| *l >= cp));
        want.sort();
        assert_eq!(lsns, want);
        let mut payloads = recovered_payloads(&o);
        payloads.dedup();
        assert_eq!(
            payloads.len(),
            lsns.len(),
            "every LSN carries a distinct record"
        );
        assert!(cp > 0, "the checkpoint moved past the committed prefix");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_with_fewer_lanes_recovers_every_lane_s_records() {
        let dir = tempfile::tempdir().unwrap();
        let lanes = |n| WalOptions {
            lanes: n,
            standby_after: Duration::ZERO,
            ..Default::default()
        };
        {
            // The first lane stalls on its first write, so that the records staged during it
            // go to the standby lanes.
            let (o, stalled) =
                stall_first_write(dir.path(), lanes(3), Duration::from_millis(300), "9-0").await;
            produce_concurrently(&o.wal, 8, 20).await;
            stalled.await.unwrap().unwrap();
            o.wal.close();
        }
        // Lanes other than the first wrote frames...
        let other_lanes = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                !name.starts_with("wal-0-")
                    && name.starts_with("wal-")
                    && frames_end(&fs::read(e.path()).unwrap()) > 0
            })
            .count();
        assert!(
            other_lanes > 0,
            "only lane 0 wrote; the test proves nothing"
        );
        // ...and reopened with one lane, their segments are read all the same.
        let o = Wal::open(dir.path(), lanes(1)).unwrap();
        let mut payloads: Vec<String> = o
            .recovered
            .iter()
            .map(|r| String::from_utf8(r.record.payload.to_vec()).unwrap())
            .collect();
        payloads.sort();
        let mut want: Vec<String> = (0..8u64)
            .flat_map(|t| (0..20u64).map(move |i| format!("{t}-{i}")))
            .chain(["9-0".to_string()])
            .collect();
        want.sort();
        assert_eq!(payloads, want);
    }

    /// Lanes that wrote a frame into one of their segments.
    pub(super) fn lanes_that_wrote(dir: &Path) -> BTreeSet<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("wal-") && frames_end(&fs::read(e.path()).unwrap()) > 0
            })
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.split('-').nth(1).unwrap().to_string()
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quick_fsyncs_leave_the_standby_lanes_asleep() {
        let dir = tempfile::tempdir().unwrap();
        let opts = standby(3, Duration::from_secs(3600), 100);
        let o = Wal::open(dir.path(), opts).unwrap();
        produce_concurrently(&o.wal, 8, 25).await;
        let frames = o.wal.metrics().frames.load(Ordering::Relaxed);
        assert!(frames > 1, "{frames} frames: the test proves nothing");
        assert_eq!(lanes_that_wrote(dir.path()), BTreeSet::from(["0".into()]));
    }

    #[test]
    fn the_checkpointer_deletes_a_segment_only_when_open_would_remove_it_unread() {
        let seg = |lane: usize, first_lsn: u64, max_lsn: Option<u64>, active: bool| SegmentFile {
            path: PathBuf::from(format!("wal-{lane}-{first_lsn}")),
            lane,
            first_lsn,
            max_lsn,
            active,
        };
        // Lane 0 wrote LSNs 0..=9, lane 1 wrote 10..=19 meanwhile, then lane 0 rolled at 20.
        let all = vec![
            seg(0, 0, Some(9), false),
            seg(1, 0, Some(19), true),
            seg(0, 20, Some(25), true),
        ];
        let old = &all[0];
        // Every record of lane 0's old segment is below 15, but a copy of it that came back
        // after a power loss would be read at open (its successor starts above 15).
        assert!(!old.deletable(&all, 15));
        assert!(!old.deletable(&all, 19));
        assert!(old.deletable(&all, 20));
        assert!(old.deletable(&all, 26));
        // Active segments stay, whatever the checkpoint.
        assert!(!all[1].deletable(&all, u64::MAX));
        assert!(!all[2].deletable(&all, u64::MAX));
        // A lane no longer running (fewer lanes since the restart) has no successor: its
        // segment goes once the checkpoint has passed its records (open reads it as its
        // lane's newest, where damage is a torn tail).
        let retired = vec![seg(3, 5, Some(7), false), seg(0, 30, None, true)];
        assert!(!retired[0].deletable(&retired, 7));
        assert!(retired[0].deletable(&retired, 8));
        // A sealed segment that never held a record goes with its successor's start.
        let empty = vec![seg(0, 4, None, false), seg(0, 9, None, true)];
        assert!(!empty[0].deletable(&empty, 8));
        assert!(empty[0].deletable(&empty, 9));
    }

    /// The payloads a reopened WAL recovered, sorted.
    pub(super) fn recovered_payloads(o: &Opened) -> Vec<Bytes> {
        let mut payloads: Vec<_> = o
            .recovered
            .iter()
            .map(|r| r.record.payload.clone())
            .collect();
        payloads.sort();
        payloads
    }

    fn standby(lanes: usize, after: Duration, behind: usize) -> WalOptions {
        WalOptions {
            lanes,
            standby_after: after,
            standby_behind: behind,
            ..Default::default()
        }
    }

    /// `producers` tasks at once, each appending `each` records `"<task>-<i>"` one by one.
    async fn produce_concurrently(wal: &Wal, producers: u64, each: u64) {
        let mut tasks = Vec::new();
        for t in 0..producers {
            let wal = wal.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..each {
                    wal.append(vec![rec(t, 0, None, &format!("{t}-{i}"))])
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }

    /// Opens a WAL in `dir` whose first lane stalls `stall` in its first write, and starts
    /// a produce of `payload` that it waits for there: returns once the lane is in it.
    async fn stall_first_write(
        dir: &Path,
        opts: WalOptions,
        stall: Duration,
        payload: &str,
    ) -> (Opened, tokio::task::JoinHandle<Result<(), WalError>>) {
        let o = Wal::open(dir, opts).unwrap();
        *o.wal.shared.stall_first_lane.lock() = Some(stall);
        let wal = o.wal.clone();
        let r = rec(1, 0, None, payload);
        let stalled = tokio::spawn(async move { wal.append(vec![r]).await });
        let started = std::time::Instant::now();
        while o.wal.shared.standby.running().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "lane 0 never wrote"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (o, stalled)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_staged_during_a_stalled_fsync_is_written_by_a_standby_lane() {
        let dir = tempfile::tempdir().unwrap();
        let opts = standby(2, Duration::from_millis(20), STANDBY_BEHIND);
        let (o, stalled) = stall_first_write(dir.path(), opts, Duration::from_secs(3), "a").await;
        o.wal.append(vec![rec(1, 0, None, "b")]).await.unwrap();
        assert!(
            !stalled.is_finished(),
            "b was answered only after a's write: no standby lane took it"
        );
        // The stall goes on, and so does the standby.
        for p in ["c", "d"] {
            o.wal.append(vec![rec(1, 0, None, p)]).await.unwrap();
        }
        assert!(!stalled.is_finished(), "c and d waited for a's write");
        stalled.await.unwrap().unwrap();
        assert_eq!(
            lanes_that_wrote(dir.path()),
            BTreeSet::from(["0".into(), "1".into()])
        );
        // Both come back from a restart.
        drop(o);
        let o = Wal::open(dir.path(), WalOptions::default()).unwrap();
        let payloads = recovered_payloads(&o);
        assert_eq!(payloads, ["a", "b", "c", "d"].map(Bytes::from).to_vec());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_piling_up_behind_the_first_lane_call_a_standby_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let opts = standby(2, Duration::from_secs(3600), 3);
        let (o, stalled) = stall_first_write(dir.path(), opts, Duration::from_secs(3), "a").await;
        // Two behind the stalled write: both wait for it.
        let (w1, w2) = (o.wal.clone(), o.wal.clone());
        let b = tokio::spawn(async move { w1.append(vec![rec(1, 0, None, "b")]).await });
        let c = tokio::spawn(async move { w2.append(vec![rec(1, 0, None, "c")]).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!b.is_finished() && !c.is_finished());
        // The third calls a standby, which writes all three.
        o.wal.append(vec![rec(1, 0, None, "d")]).await.unwrap();
        b.await.unwrap().unwrap();
        c.await.unwrap().unwrap();
        assert!(!stalled.is_finished(), "answered only after a's write");
        stalled.await.unwrap().unwrap();
        assert_eq!(
            lanes_that_wrote(dir.path()),
            BTreeSet::from(["0".into(), "1".into()])
        );
    }

    /// Where the frames at the start of a segment image end.
    fn frames_end(data: &[u8]) -> usize {
        let mut pos = 0;
        while let Some((_, len)) = decode_frame(&data[pos..]) {
            pos += len;
        }
        pos
    }

    #[tokio::test]
    async fn frames_overwrite_preallocated_zeros_which_recovery_and_rolls_cut() {
        let dir = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            lanes: 1,
            segment_max_bytes: 1500,
            ..Default::default()
        };
        let seg0 = segment_path(dir.path(), 0, 0);
        {
            let o = Wal::open(dir.path(), opts.clone()).unwrap();
            o.wal.append(vec![rec(1, 0, None, "a")]).await.unwrap();
            // The file is extended ahead of the frames, with written zeros.
            let data = fs::read(&seg0).unwrap();
            assert_eq!(data.len() as u64, PREALLOC_BYTES);
            let end = frames_end(&data);
            assert!(end > 0 && data[end..].iter().all(|&b| b == 0));
            // Past segment_max_bytes the lane rolls: the sealed file ends at its last frame.
            o.wal
                .append(vec![rec(1, 0, None, &"x".repeat(2000))])
                .await
                .unwrap();
            let data = fs::read(&seg0).unwrap();
            assert_eq!(frames_end(&data), data.len());
            o.wal.append(vec![rec(1, 0, None, "c")]).await.unwrap();
        }
        let seg2 = segment_path(dir.path(), 0, 2);
        assert_eq!(fs::metadata(&seg2).unwrap().len(), PREALLOC_BYTES);
        // Reopened twice: the first open cuts the newest segment's zeros (it is sealed from
        // then on, so the second open, where it is no longer the newest, finds it clean).
        for _ in 0..2 {
            let o = Wal::open(dir.path(), opts.clone()).unwrap();
            let got: Vec<&[u8]> = o.recovered.iter().map(|r| &r.record.payload[..]).collect();
            assert_eq!(got.len(), 3);
            assert_eq!((got[0], got[2]), (&b"a"[..], &b"c"[..]));
            let data = fs::read(&seg2).unwrap();
            assert_eq!(frames_end(&data), data.len());
        }
    }

    #[tokio::test]
    async fn torn_tail_is_truncated_and_corruption_before_valid_data_fails() {
        let dir = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            lanes: 1,
            ..Default::default()
        };
        {
            let o = Wal::open(dir.path(), opts.clone()).unwrap();
            o.wal.append(vec![rec(1, 0, None, "keep-1")]).await.unwrap();
            o.wal.append(vec![rec(1, 0, None, "keep-2")]).await.unwrap();
        }
        let seg = segment_path(dir.path(), 0, 0);
        let good_len = frames_end(&fs::read(&seg).unwrap()) as u64;
        assert!(good_len > 0);
        // A torn frame after the last one, in the preallocated zeros.
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(&MAGIC.to_le_bytes(), good_len).unwrap();
        f.write_all_at(&[200, 0, 0, 0, 1, 2, 3], good_len + 4)
            .unwrap();
        drop(f);
        let o = Wal::open(dir.path(), opts.clone()).unwrap();
        assert_eq!(o.recovered.len(), 2);
        assert_eq!(fs::metadata(&seg).unwrap().len(), good_len);
        drop(o);
        // Flip a byte in the first frame: a valid frame follows, so this is corruption.
        let mut data = fs::read(&seg).unwrap();
        data[HEADER_LEN + 2] ^= 0xff;
        fs::write(&seg, &data).unwrap();
        assert!(matches!(
            Wal::open(dir.path(), opts),
            Err(WalError::Corrupt { .. })
        ));
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = WalRecord> {
        (
            any::<u64>(),
            any::<u32>(),
            any::<bool>(),
            proptest::option::of(vec(any::<u8>(), 0..32)),
            vec(any::<u8>(), 0..128),
            proptest::option::of(vec(any::<u8>(), 0..48)),
        )
            .prop_map(
                |(topic_id, partition, pinned, key, payload, attrs)| WalRecord {
                    topic_id,
                    partition,
                    pinned,
                    key: key.map(Bytes::from),
                    payload: Bytes::from(payload),
                    attrs: attrs.map(Bytes::from),
                },
            )
    }

    fn same(a: &WalRecord, b: &WalRecord) -> bool {
        (
            a.topic_id,
            a.partition,
            a.pinned,
            &a.key,
            &a.payload,
            &a.attrs,
        ) == (
            b.topic_id,
            b.partition,
            b.pinned,
            &b.key,
            &b.payload,
            &b.attrs,
        )
    }

    /// A frame header with a correct length and CRC in front of `body`, so the record
    /// parsing sees arbitrary bytes and counts.
    fn frame_with_body(first_lsn: u64, count: u32, body: &[u8]) -> Vec<u8> {
        let mut b = MAGIC.to_le_bytes().to_vec();
        b.extend_from_slice(&((HEADER_LEN + body.len()) as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
        b.extend_from_slice(&first_lsn.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(body);
        let crc = crc32c::crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn check_decoded(recs: &[DurableRecord], len: usize, input: &[u8]) {
        assert!(len >= HEADER_LEN && len <= input.len());
        assert!(recs.len() <= (len - HEADER_LEN) / RECORD_HEADER_LEN);
        for w in recs.windows(2) {
            assert_eq!(w[1].lsn, w[0].lsn + 1);
        }
    }

    /// Found by `prop_wal_decode_arbitrary_records_with_valid_crc`: a CRC-valid frame
    /// claiming 2^32-1 records made the decoder reserve ~300 GB and abort the process; and a
    /// first lsn near `u64::MAX` wrapped the lsns of the records after it.
    #[test]
    fn prop_regression_wal_count_and_lsn_are_checked_against_the_frame() {
        assert!(decode_frame(&frame_with_body(0, u32::MAX, &[])).is_none());
        assert!(decode_frame(&frame_with_body(0, 1, &[])).is_none());
        let mut one = Vec::new();
        let r = WalRecord {
            topic_id: 1,
            partition: 2,
            pinned: false,
            key: None,
            payload: Bytes::from_static(b"p"),
            attrs: None,
        };
        encode_frame(&mut one, 0, [r.clone(), r].iter(), 2);
        let body = one[HEADER_LEN..].to_vec();
        assert!(decode_frame(&frame_with_body(u64::MAX - 1, 2, &body)).is_none());
        let (recs, _) = decode_frame(&frame_with_body(u64::MAX - 2, 2, &body)).unwrap();
        assert_eq!(recs[1].lsn, u64::MAX - 1);
    }

    proptest! {
        #[test]
        fn prop_wal_frame_roundtrip(
            first_lsn in 0..=u64::MAX - 64,
            recs in vec(record(), 0..12),
            trailing in vec(any::<u8>(), 0..16),
        ) {
            let mut buf = Vec::new();
            encode_frame(&mut buf, first_lsn, recs.iter(), recs.len());
            let frame_len = buf.len();
            // Bytes after the frame (the next frame, a torn tail) are not part of it.
            buf.extend_from_slice(&trailing);
            let (out, len) = decode_frame(&buf).unwrap();
            prop_assert_eq!(len, frame_len);
            prop_assert_eq!(out.len(), recs.len());
            for (i, (d, r)) in out.iter().zip(&recs).enumerate() {
                prop_assert_eq!(d.lsn, first_lsn + i as u64);
                prop_assert!(same(&d.record, r));
            }
        }

        #[test]
        fn prop_wal_frame_truncation_and_bit_flips(
            recs in vec(record(), 1..6),
            cut in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            bit in 0..8u8,
        ) {
            let mut buf = Vec::new();
            encode_frame(&mut buf, 1, recs.iter(), recs.len());
            prop_assert!(decode_frame(&buf[..cut.index(buf.len())]).is_none());
            let at = at.index(buf.len());
            buf[at] ^= 1 << bit;
            prop_assert!(decode_frame(&buf).is_none(), "flip of byte {} bit {}", at, bit);
        }

        #[test]
        fn prop_wal_decode_arbitrary_bytes(b in vec(any::<u8>(), 0..128)) {
            if let Some((recs, len)) = decode_frame(&b) {
                check_decoded(&recs, len, &b);
            }
        }

        /// A valid CRC over arbitrary counts and record bytes: the count a frame claims is
        /// never trusted for an allocation, lsns never wrap, records stay inside the frame.
        #[test]
        fn prop_wal_decode_arbitrary_records_with_valid_crc(
            first_lsn in prop_oneof![0..1000u64, any::<u64>(), Just(u64::MAX)],
            count in prop_oneof![0..8u32, any::<u32>()],
            body in prop_oneof![
                vec(any::<u8>(), 0..96),
                vec(record(), 0..4).prop_map(|recs| {
                    let mut b = Vec::new();
                    encode_frame(&mut b, 0, recs.iter(), recs.len());
                    b[HEADER_LEN..].to_vec()
                }),
            ],
        ) {
            let b = frame_with_body(first_lsn, count, &body);
            if let Some((recs, len)) = decode_frame(&b) {
                check_decoded(&recs, len, &b);
                prop_assert_eq!(recs.len() as u64, count as u64);
                prop_assert!(recs.capacity() <= body.len() / RECORD_HEADER_LEN);
                prop_assert!(first_lsn.checked_add(count as u64).is_some());
            }
        }
    }
}
