//! The first lane written by the runtime thread itself, when it runs out of work (Redis's
//! event loop writes its append-only file the same way, before it sleeps).
//!
//! With a lane thread, every produce crosses threads twice: the request's task hands its
//! records to the lane (a futex wake) and the lane hands the answer back (an eventfd write
//! into the runtime's epoll). On 2 CPUs at 4,000 produces/s those hand-offs were 2.1 context
//! switches and about a fifth of the CPU of each produce. Here the runtime's thread, with
//! one worker, writes and fsyncs everything staged when it has nothing left to run
//! ([`flush_parked`], the runtime's `on_thread_park` hook), then runs the tasks its answers
//! woke, without a syscall between. Everything staged during one pass of the runtime goes
//! into one frame.
//!
//! What stays a thread's job, so that nothing waits on a runtime that cannot write:
//! - **A slow disk.** An fsync that takes longer than [`InlineOptions::fsync_limit`] has
//!   the runtime stalled for that long (probes, Raft, consumes). The lane's own thread then
//!   takes the lane over, as a lane without this mode runs, until its fsyncs have been
//!   quick again for [`InlineOptions::hand_back_after`] writes in a row.
//! - **A large request** (over [`InlineOptions::max_bytes`]: a batch of megabytes). Its
//!   write would hold the runtime for as long as a slow disk does, so the runtime calls the
//!   lane's thread to write it and runs on. A write may take longer the more it writes
//!   before it counts as slow ([`InlineOptions::limit_for`]).
//! - **A runtime that never runs out of work.** A record staged on the runtime's thread that
//!   waits [`InlineOptions::wait`] calls the lane's thread, which writes everything staged.
//! - **Records staged from another thread** (nothing there flushes when it parks) call the
//!   lane's thread at once.
//! - **Back-pressure.** While the dispatcher is behind ([`WalOptions::max_pending_bytes`]),
//!   the lane's thread takes the writing over: the dispatcher runs on the runtime, which must
//!   not wait for it.
//!
//! The standby lanes work as before: a record staged during the first lane's running write
//! (here: from another thread while the runtime writes) calls one when it has waited.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use super::{Queue, Shared, Staged, Take, WalError, Writer};

/// Tunables of the first lane written by the runtime (see the module).
#[derive(Debug, Clone)]
pub struct InlineOptions {
    /// A write and fsync of the runtime that takes longer than this (and as much again per
    /// [`Self::max_bytes`] written, see [`Self::limit_for`]) hands the lane to its thread.
    /// It bounds how long the runtime stalls for a disk that turned slow: once, before the
    /// thread takes over. Raft's heartbeats go out every 100 ms.
    pub fsync_limit: Duration,
    /// The runtime never writes a request of more bytes than this: the lane's thread does,
    /// called, while the runtime runs on. It is also the scale of a write's allowance
    /// ([`Self::limit_for`]): [`Self::fsync_limit`] more per this many bytes.
    pub max_bytes: usize,
    /// The lane's thread hands the lane back after this many writes in a row that each
    /// took less than half of their [`Self::limit_for`].
    pub hand_back_after: u32,
    /// How long a record staged on the runtime's thread waits for the runtime to run out of
    /// work before it calls the lane's thread.
    pub wait: Duration,
    /// The lane's thread, uncalled, looks this often for anything staged, and for the WAL
    /// being gone: a last resort behind the calls.
    pub idle_check: Duration,
}

impl InlineOptions {
    /// How long a write and fsync of `bytes` may take before the disk counts as slow:
    /// [`Self::fsync_limit`], and as much again per [`Self::max_bytes`]. A 16 MiB batch
    /// takes longer than a produce on any disk, which says nothing about the disk.
    pub(super) fn limit_for(&self, bytes: usize) -> Duration {
        self.fsync_limit
            + self
                .fsync_limit
                .mul_f64(bytes as f64 / self.max_bytes.max(1) as f64)
    }
}

impl Default for InlineOptions {
    fn default() -> Self {
        InlineOptions {
            fsync_limit: Duration::from_millis(20),
            // A MiB writes in a few milliseconds on any SSD; the allowance is 50 MB/s.
            max_bytes: 1024 * 1024,
            hand_back_after: 64,
            wait: Duration::from_millis(5),
            idle_check: Duration::from_secs(1),
        }
    }
}

thread_local! {
    /// This thread runs a runtime that calls [`flush_parked`] before it parks.
    static FLUSHES_AT_PARK: Cell<bool> = const { Cell::new(false) };
    /// The lanes opened on this thread, written by [`flush_parked`].
    static LANES: RefCell<Vec<Weak<FirstLane>>> = const { RefCell::new(Vec::new()) };
    /// This thread's identity, for [`FirstLane::wait`]'s check that it runs on the lane's
    /// runtime (cheaper than `thread::current`).
    static TOKEN: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// Marks the calling thread as one that runs an async runtime with a single thread, which
/// calls [`flush_parked`] before it parks (`on_thread_park`). WALs opened on it afterwards
/// with [`super::WalOptions::inline`] have their first lane written there; elsewhere their
/// first lane keeps its thread.
pub fn flush_at_park() {
    FLUSHES_AT_PARK.with(|f| f.set(true));
}

/// This thread's runtime writes first lanes at park (see [`flush_at_park`]).
pub(super) fn flushes_at_park() -> bool {
    FLUSHES_AT_PARK.with(Cell::get)
}

/// Writes what is staged in the first lanes opened on this thread: the runtime's
/// `on_thread_park` hook.
pub fn flush_parked() {
    LANES.with(|lanes| {
        let mut lanes = lanes.borrow_mut();
        lanes.retain(|lane| match lane.upgrade() {
            Some(lane) => {
                lane.flush_inline();
                true
            }
            None => false,
        });
    });
}

fn token() -> u64 {
    TOKEN.with(|t| *t)
}

/// The first lane of a WAL opened with [`super::WalOptions::inline`] on a thread that
/// flushes at park.
pub(super) struct FirstLane {
    /// The runtime thread that writes it (its [`TOKEN`]).
    owner: u64,
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    /// The lane's writer and what its last batch carried over; held by whoever writes.
    writer: parking_lot::Mutex<(Writer, Option<Staged>)>,
    /// When the oldest record staged on the runtime's thread since the last take was
    /// staged (microseconds after the standby epoch, plus one); 0: none.
    oldest: AtomicU64,
    /// The lane's thread writes it (a slow disk, or back-pressure).
    threaded: AtomicBool,
    /// A call for the lane's thread to write what is staged.
    called: std::sync::Mutex<bool>,
    wake: std::sync::Condvar,
    opts: InlineOptions,
}

/// What [`FirstLane::drain`] stopped at.
enum Drained {
    /// Nothing left staged.
    Empty,
    /// The queue closed: the WAL is gone.
    Closed,
    /// A write of `bytes` took `took`, longer than its limit.
    Slow { took: Duration, bytes: usize },
    /// The dispatcher is behind: the thread must write, waiting for it.
    Backlogged,
}

impl FirstLane {
    /// The first lane for `writer`, written at park by this thread (see
    /// [`flushes_at_park`]), with its own thread started.
    pub(super) fn start(
        writer: Writer,
        queue: Arc<Queue>,
        opts: InlineOptions,
    ) -> std::io::Result<Arc<FirstLane>> {
        let lane = Arc::new(FirstLane {
            owner: token(),
            shared: writer.shared.clone(),
            queue,
            writer: parking_lot::Mutex::new((writer, None)),
            oldest: AtomicU64::new(0),
            threaded: AtomicBool::new(false),
            called: std::sync::Mutex::new(false),
            wake: std::sync::Condvar::new(),
            opts,
        });
        let thread = lane.clone();
        std::thread::Builder::new()
            .name("narad-wal-0".into())
            .spawn(move || thread.run_thread())?;
        LANES.with(|lanes| lanes.borrow_mut().push(Arc::downgrade(&lane)));
        Ok(lane)
    }

    /// The runtime writes the lane (not its thread).
    pub(super) fn inline(&self) -> bool {
        !self.threaded.load(Ordering::Acquire)
    }

    /// Waits for the staged request answering on `rx`, calling the lane's thread if
    /// nothing on this thread will write it in time.
    pub(super) async fn wait(
        &self,
        mut rx: oneshot::Receiver<Result<(), WalError>>,
    ) -> Result<(), WalError> {
        if token() != self.owner {
            self.call();
            return rx.await.map_err(|_| WalError::Closed)?;
        }
        // The first record since the last take watches for all taken with it.
        let standby = &self.shared.standby;
        let staged = standby.epoch.elapsed().as_micros() as u64 + 1;
        if self
            .oldest
            .compare_exchange(0, staged, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let mut watch = Watch {
                lane: self,
                armed: true,
            };
            tokio::select! {
                biased;
                answer = &mut rx => {
                    watch.armed = false;
                    return answer.map_err(|_| WalError::Closed)?;
                }
                _ = tokio::time::sleep(self.opts.wait) => {}
            }
            watch.armed = false;
            if self.oldest.load(Ordering::Acquire) == staged {
                self.call();
            }
        }
        rx.await.map_err(|_| WalError::Closed)?
    }

    /// The lane's thread writes everything staged now.
    pub(super) fn call(&self) {
        let mut called = self.called.lock().unwrap_or_else(|p| p.into_inner());
        if !*called {
            *called = true;
            self.wake.notify_one();
        }
    }

    fn hand_to_thread(&self) {
        self.threaded.store(true, Ordering::Release);
        let _called = self.called.lock().unwrap_or_else(|p| p.into_inner());
        self.wake.notify_one();
    }

    /// A write of `bytes` took `took`, longer than its limit: the lane's thread writes
    /// until they are quick.
    fn slow_disk(&self, took: Duration, bytes: usize) {
        let m = &self.shared.metrics;
        m.first_lane_takeovers.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            took_ms = took.as_millis() as u64,
            bytes,
            limit_ms = self.opts.limit_for(bytes).as_millis() as u64,
            "a wal write and fsync was slow; the first lane's thread takes the lane over from the runtime"
        );
        self.hand_to_thread();
    }

    /// The runtime has nothing left to run: write what is staged, on its thread.
    fn flush_inline(&self) {
        if !self.inline() {
            return;
        }
        // Taken: the lane's thread writes for a call, or has just taken the lane over and
        // may hold it while it waits for work. Never wait for it here: what the runtime
        // staged then is the thread's to write.
        let Some(mut guard) = self.writer.try_lock() else {
            self.call();
            return;
        };
        if !self.inline() {
            return;
        }
        let (writer, carry) = &mut *guard;
        match self.drain(writer, carry, Take::Inline) {
            Drained::Empty | Drained::Closed => {}
            Drained::Slow { took, bytes } => self.slow_disk(took, bytes),
            Drained::Backlogged => self.hand_to_thread(),
        }
    }

    /// Writes frames of what is staged until nothing is (one frame each time round).
    fn drain(&self, writer: &mut Writer, carry: &mut Option<Staged>, take: Take) -> Drained {
        loop {
            self.oldest.store(0, Ordering::Release);
            let Some(batch) = writer.take_batch(&self.queue, carry, take) else {
                if take == Take::Inline {
                    if writer.backlogged() {
                        return Drained::Backlogged;
                    }
                    // A request is carried that the runtime does not write: one too large
                    // for it, or one left from the last frame while another lane holds
                    // the queue. The thread writes it.
                    if carry.is_some() {
                        self.call();
                        return Drained::Empty;
                    }
                    // Another lane held the queue: what it left staged is the thread's
                    // to write, since the runtime's watches were reset above.
                    match self.queue.try_lock() {
                        Ok(queue) if queue.is_empty() => {}
                        Ok(_) => continue,
                        Err(_) => self.call(),
                    }
                    return Drained::Empty;
                }
                let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                return if queue.is_closed() && queue.is_empty() && carry.is_none() {
                    Drained::Closed
                } else {
                    Drained::Empty
                };
            };
            let bytes = batch.bytes;
            let took = writer.commit_as_first(batch.staged);
            if took > self.opts.limit_for(bytes) {
                return Drained::Slow { took, bytes };
            }
        }
    }

    /// The lane's thread: sleeps until called or handed the lane; ends when the WAL does.
    fn run_thread(self: Arc<Self>) {
        loop {
            {
                let called = self.called.lock().unwrap_or_else(|p| p.into_inner());
                let (mut called, _) = self
                    .wake
                    .wait_timeout_while(called, self.opts.idle_check, |called| {
                        !*called && self.inline()
                    })
                    .unwrap_or_else(|p| p.into_inner());
                *called = false;
            }
            let open = if self.inline() {
                // Called, or `idle_check` passed: write what is staged, and look whether
                // the WAL is gone.
                let mut guard = self.writer.lock();
                let (writer, carry) = &mut *guard;
                match self
                    .inline()
                    .then(|| self.drain(writer, carry, Take::Ready))
                {
                    // Handed the lane while it waited for the runtime's write to end.
                    None => true,
                    Some(Drained::Closed) => false,
                    Some(Drained::Slow { took, bytes }) => {
                        self.slow_disk(took, bytes);
                        true
                    }
                    Some(Drained::Empty | Drained::Backlogged) => true,
                }
            } else {
                self.run_threaded()
            };
            if !open {
                break;
            }
        }
        self.shared.standby.stop();
    }

    /// Writes the lane as a lane thread does until its writes have been quick again for
    /// long enough; false once the WAL is gone.
    fn run_threaded(&self) -> bool {
        let mut guard = self.writer.lock();
        let (writer, carry) = &mut *guard;
        let mut quick = 0;
        while let Some(batch) = writer.take_batch(&self.queue, carry, Take::Wait) {
            let limit = self.opts.limit_for(batch.bytes);
            quick = if writer.commit_as_first(batch.staged) < limit / 2 {
                quick + 1
            } else {
                0
            };
            if quick >= self.opts.hand_back_after && carry.is_none() && !writer.backlogged() {
                tracing::info!(
                    "wal fsyncs are quick again; the runtime thread writes the first lane"
                );
                self.threaded.store(false, Ordering::Release);
                return true;
            }
        }
        false
    }
}

/// The watch a record staged on the runtime's thread keeps over everything staged after
/// it: dropped with its request (the client left), it passes the write to the lane's
/// thread, since nothing else may be watching.
struct Watch<'a> {
    lane: &'a FirstLane,
    armed: bool,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.lane.call();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::future::Future;
    use std::path::Path;
    use std::time::Instant;

    use bytes::Bytes;

    use super::super::tests::{lanes_that_wrote, rec, recovered_payloads};
    use super::super::{Opened, Wal, WalOptions};
    use super::*;

    /// Runs `test` on a thread of its own in a one-thread runtime that writes first lanes
    /// when it parks, as `main` builds it.
    fn on_parking_runtime<F, T>(test: impl FnOnce() -> F + Send + 'static) -> T
    where
        F: Future<Output = T>,
        T: Send + 'static,
    {
        std::thread::spawn(move || {
            flush_at_park();
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_park(flush_parked)
                .build()
                .unwrap()
                .block_on(test())
        })
        .join()
        .unwrap()
    }

    fn inline(dir: &Path, inline: InlineOptions) -> Opened {
        let opts = WalOptions {
            lanes: 2,
            // The standby lane is not what is tested.
            standby_after: Duration::from_secs(3600),
            standby_behind: usize::MAX,
            inline: Some(inline),
            ..WalOptions::default()
        };
        Wal::open(dir, opts).unwrap()
    }

    /// Runs `test` with a WAL opened in `dir` with `opts` on a runtime that writes its first
    /// lane when it parks.
    fn with_inline_wal<F, Fut>(dir: &Path, opts: InlineOptions, test: F)
    where
        F: FnOnce(Opened) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let path = dir.to_path_buf();
        on_parking_runtime(move || async move { test(inline(&path, opts)).await })
    }

    fn lane(wal: &Wal) -> &FirstLane {
        &wal.first_lane
            .as_ref()
            .expect("the runtime writes the first lane")
            .0
    }

    /// `n` appends started together, one record each, `"<round>-<i>"`.
    async fn appends(wal: &Wal, round: u32, n: u32) {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let wal = wal.clone();
                tokio::spawn(async move {
                    wal.append(vec![rec(1, 0, None, &format!("{round}-{i}"))])
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    }

    /// Waits (up to 10 s) until `cond` holds.
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let started = Instant::now();
        while !cond() {
            assert!(started.elapsed() < Duration::from_secs(10), "never: {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn frames(wal: &Wal) -> u64 {
        wal.metrics().frames.load(Ordering::Relaxed)
    }

    #[test]
    fn what_one_pass_of_the_runtime_stages_is_one_frame_written_when_it_parks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let opts = InlineOptions {
            wait: Duration::from_secs(3600),
            ..InlineOptions::default()
        };
        with_inline_wal(dir.path(), opts, |o| async move {
            appends(&o.wal, 0, 32).await;
            assert_eq!(frames(&o.wal), 1, "32 produces staged in one pass");
            appends(&o.wal, 1, 32).await;
            assert_eq!(frames(&o.wal), 2);
            assert!(lane(&o.wal).inline());
            assert_eq!(lanes_that_wrote(&path), BTreeSet::from(["0".into()]));
        });
        // Every record is durable: a restart finds them all.
        let o = Wal::open(dir.path(), WalOptions::default()).unwrap();
        let mut want: Vec<Bytes> = (0..2)
            .flat_map(|round| (0..32).map(move |i| Bytes::from(format!("{round}-{i}"))))
            .collect();
        want.sort();
        assert_eq!(recovered_payloads(&o), want);
    }

    #[test]
    fn records_staged_from_another_thread_do_not_wait_for_the_runtime_to_wake() {
        let dir = tempfile::tempdir().unwrap();
        with_inline_wal(dir.path(), InlineOptions::default(), |o| async move {
            let wal = o.wal.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            // The runtime sleeps in its park until this thread is done: only the lane's
            // thread can write what it stages.
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                for i in 0..10 {
                    rt.block_on(wal.append(vec![rec(1, 0, None, &i.to_string())]))
                        .unwrap();
                }
                tx.send(()).unwrap();
            });
            tokio::time::timeout(Duration::from_secs(10), rx)
                .await
                .expect("records staged from another thread waited for the runtime")
                .unwrap();
            assert_eq!(frames(&o.wal), 10);
        });
    }

    #[test]
    fn a_runtime_that_never_runs_out_of_work_has_its_records_written_after_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let opts = InlineOptions {
            wait: Duration::from_millis(20),
            ..InlineOptions::default()
        };
        with_inline_wal(dir.path(), opts, |o| async move {
            // A task always ready to run: the runtime never parks while it spins.
            let spin = Arc::new(AtomicBool::new(true));
            let spinning = spin.clone();
            let spinner = tokio::spawn(async move {
                while spinning.load(Ordering::Relaxed) {
                    tokio::task::yield_now().await;
                }
            });
            let started = Instant::now();
            tokio::time::timeout(Duration::from_secs(10), appends(&o.wal, 0, 4))
                .await
                .expect("records staged on a runtime that never parks were never written");
            assert!(started.elapsed() >= Duration::from_millis(20));
            spin.store(false, Ordering::Relaxed);
            spinner.await.unwrap();
            assert!(
                lane(&o.wal).inline(),
                "the lane's thread only wrote for a call"
            );
        });
    }

    #[test]
    fn a_slow_fsync_on_the_runtime_hands_the_lane_to_its_thread_until_fsyncs_are_quick() {
        let dir = tempfile::tempdir().unwrap();
        // A write counts as quick under 500 ms, far above any fsync of a test disk.
        let opts = InlineOptions {
            fsync_limit: Duration::from_secs(1),
            hand_back_after: 3,
            ..InlineOptions::default()
        };
        with_inline_wal(dir.path(), opts, |o| async move {
            *o.wal.shared.stall_first_lane.lock() = Some(Duration::from_millis(1500));
            appends(&o.wal, 0, 1).await;
            assert!(
                !lane(&o.wal).inline(),
                "the runtime kept writing after a slow fsync"
            );
            let takeovers = &o.wal.metrics().first_lane_takeovers;
            assert_eq!(takeovers.load(Ordering::Relaxed), 1);
            // The thread writes now, and the runtime runs while it does.
            *o.wal.shared.stall_first_lane.lock() = Some(Duration::from_millis(300));
            let wal = o.wal.clone();
            let stalled = tokio::spawn(async move { appends(&wal, 1, 1).await });
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!stalled.is_finished(), "the stall was not in the write");
            stalled.await.unwrap();
            // Two more quick writes, and the runtime has the lane back.
            appends(&o.wal, 2, 1).await;
            assert!(
                !lane(&o.wal).inline(),
                "handed back after two quick writes of three"
            );
            appends(&o.wal, 3, 1).await;
            until("the lane is handed back", || lane(&o.wal).inline()).await;
            let before = frames(&o.wal);
            appends(&o.wal, 4, 16).await;
            assert_eq!(frames(&o.wal), before + 1, "the runtime writes again");
            assert_eq!(takeovers.load(Ordering::Relaxed), 1);
        });
        let o = Wal::open(dir.path(), WalOptions::default()).unwrap();
        assert_eq!(recovered_payloads(&o).len(), 4 + 16);
    }

    #[test]
    fn the_runtime_never_waits_for_the_dispatcher_it_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        on_parking_runtime(move || async move {
            let opts = WalOptions {
                max_pending_bytes: 1,
                inline: Some(InlineOptions::default()),
                ..WalOptions::default()
            };
            let mut o = Wal::open(&path, opts).unwrap();
            o.wal.append(vec![rec(1, 0, None, "a")]).await.unwrap();
            let durable = o.durable_rx.recv().await.unwrap();
            // The dispatcher has not committed `a`: `b` waits for it, and the runtime
            // (where the dispatcher runs) goes on.
            let wal = o.wal.clone();
            let b = tokio::spawn(async move { wal.append(vec![rec(1, 0, None, "b")]).await });
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(
                !b.is_finished(),
                "b was taken while the dispatcher was behind"
            );
            o.wal.committed(&durable);
            tokio::time::timeout(Duration::from_secs(10), b)
                .await
                .expect("b never written once the dispatcher caught up")
                .unwrap()
                .unwrap();
        });
    }

    #[test]
    fn a_record_the_runtime_finds_the_queue_taken_for_is_written_by_the_thread() {
        let dir = tempfile::tempdir().unwrap();
        // No watch and no idle check to fall back on: only the call from the runtime's park.
        let opts = InlineOptions {
            wait: Duration::from_secs(3600),
            idle_check: Duration::from_secs(3600),
            ..InlineOptions::default()
        };
        with_inline_wal(dir.path(), opts, |o| async move {
            // Another lane holding the queue (it may wait there for the dispatcher).
            let queue = lane(&o.wal).queue.clone();
            let (held_tx, held_rx) = tokio::sync::oneshot::channel();
            let holder = std::thread::spawn(move || {
                let _held = queue.lock().unwrap();
                held_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(200));
            });
            held_rx.await.unwrap();
            // The runtime parks with the record staged and finds the queue taken; nothing
            // wakes it afterwards but the answer.
            let started = Instant::now();
            let append = o.wal.append(vec![rec(1, 0, None, "a")]);
            tokio::time::timeout(Duration::from_secs(10), append)
                .await
                .expect("never written")
                .unwrap();
            // Released after 200 ms. Left to the runtime, the record would wait for its
            // next wake-up: here, the timer wheel's, seconds later.
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(2),
                "the record waited {took:?} for the runtime's next park"
            );
            holder.join().unwrap();
        });
    }

    /// A request over `max_bytes` (a batch of megabytes) is the lane's thread's to write: the
    /// runtime runs on while it is written, and its time is no sign of a slow disk.
    #[test]
    fn a_request_too_large_for_the_runtime_is_written_by_the_thread_and_is_no_slow_disk() {
        const STALL: Duration = Duration::from_millis(600);
        /// A large and a small record appended together, the large one first or second,
        /// with lane 0's next write stalled; the runtime's ticks of 10 ms meanwhile.
        async fn large_and_small(wal: &Wal, large_first: bool, stall: Duration) -> u32 {
            *wal.shared.stall_first_lane.lock() = Some(stall);
            let started = Instant::now();
            let wal = wal.clone();
            let write = tokio::spawn(async move {
                let big = vec![rec(1, 0, None, &"b".repeat(128 * 1024))];
                let small = vec![rec(1, 0, None, "small")];
                let (a, b) = if large_first {
                    (big, small)
                } else {
                    (small, big)
                };
                let (a, b) = tokio::join!(wal.append(a), wal.append(b));
                a.and(b)
            });
            let mut ticks = 0;
            while !write.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks += 1;
            }
            write.await.unwrap().unwrap();
            assert!(started.elapsed() >= stall, "the stall was not in the write");
            ticks
        }
        let dir = tempfile::tempdir().unwrap();
        let opts = InlineOptions {
            max_bytes: 32 * 1024,
            // The stall is twice the limit of a small write, and less than half the limit
            // of the thread's write of 128 KiB.
            fsync_limit: Duration::from_millis(300),
            ..InlineOptions::default()
        };
        assert_eq!(opts.limit_for(128 * 1024), Duration::from_millis(1500));
        with_inline_wal(dir.path(), opts, |o| async move {
            let takeovers = &o.wal.metrics().first_lane_takeovers;
            // The runtime takes nothing and calls the thread, which writes both as one
            // frame while the runtime runs.
            let ticks = large_and_small(&o.wal, true, STALL).await;
            assert!(
                ticks >= 10,
                "the runtime stalled with the write: {ticks} ticks of 10 ms in {STALL:?}"
            );
            assert_eq!(frames(&o.wal), 1);
            assert_eq!(takeovers.load(Ordering::Relaxed), 0);
            assert!(
                lane(&o.wal).inline(),
                "a large write was taken for a slow disk"
            );
            // The large one second: the runtime writes the small one (its write would take
            // the stall, so there is none) and leaves the large one to the thread.
            large_and_small(&o.wal, false, Duration::ZERO).await;
            assert_eq!(frames(&o.wal), 3);
            assert_eq!(takeovers.load(Ordering::Relaxed), 0);
            assert!(lane(&o.wal).inline());
            // Small records are the runtime's again, one frame for 16.
            let before = frames(&o.wal);
            appends(&o.wal, 1, 16).await;
            assert_eq!(frames(&o.wal), before + 1);
        });
        let o = Wal::open(dir.path(), WalOptions::default()).unwrap();
        assert_eq!(recovered_payloads(&o).len(), 4 + 16);
    }

    #[test]
    fn a_wal_opened_where_nothing_flushes_at_park_keeps_its_lane_thread() {
        let dir = tempfile::tempdir().unwrap();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let o = inline(dir.path(), InlineOptions::default());
                assert!(o.wal.first_lane.is_none());
                appends(&o.wal, 0, 4).await;
            });
    }
}
