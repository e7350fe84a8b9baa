//! Group commit into one partition log: concurrent callers queue their records, and one
//! blocking thread commits everything queued in one append + fsync + verify, then answers
//! every caller whose records were in it. While a commit runs, the next callers gather in
//! the queue, so under load each commit carries many requests and an idle partition commits
//! at once (no linger).
//!
//! Used where a caller waits for its own records to be durable and visible: a produce to a
//! partition the accepting node owns (SPEC §1: the partition log is then the fsynced copy,
//! with no WAL write in front of it) and the owner's side of `CommitProduceBatch`.

use std::collections::VecDeque;
use std::sync::Arc;

use narad_storage::NewRecord;
use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Most records in one partition commit (a group commit's, the dispatcher's).
pub const MAX_BATCH_RECORDS: usize = 4096;
/// About the most bytes in one partition commit.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// What a group commit commits into.
pub trait Committer: Send + Sync + 'static {
    /// Why a commit did not happen.
    type Error: std::fmt::Display;
    /// Appends and commits one batch (blocking: fsync, read back, verify).
    fn commit_batch(&self, batch: &[NewRecord]) -> Result<(), Self::Error>;
    /// Whether `e` is a refusal (nothing written, a retry elsewhere or later succeeds) rather
    /// than a failure.
    fn is_refusal(e: &Self::Error) -> bool;
    /// The queue of this committer's pending callers.
    fn group(&self) -> &GroupCommit;
}

/// A grouped commit that did not happen: nothing of it is visible, and the caller gets its
/// records back to store another way.
#[derive(Debug)]
pub struct GroupFailure {
    /// The partition refused commits (frozen for a move or moved away), rather than failing.
    pub refused: bool,
    pub reason: String,
    /// The caller's records, in order; empty only if the commit thread died outside a
    /// commit (the caller then answers that nothing was stored).
    pub records: Vec<NewRecord>,
}

struct Waiter {
    count: usize,
    bytes: usize,
    done: oneshot::Sender<Result<(), GroupFailure>>,
}

#[derive(Default)]
struct Queue {
    /// A blocking thread is committing this queue (and takes what arrives meanwhile).
    running: bool,
    records: Vec<NewRecord>,
    waiters: VecDeque<Waiter>,
}

/// The pending callers of one committer.
#[derive(Default)]
pub struct GroupCommit {
    queue: Mutex<Queue>,
}

/// Commits `records` together with whatever other callers queue meanwhile; `Ok` once they are
/// fsynced, verified and below the high watermark. An empty `records` is `Ok` at once.
pub async fn commit_grouped<C: Committer>(
    c: &Arc<C>,
    records: Vec<NewRecord>,
) -> Result<(), GroupFailure> {
    if records.is_empty() {
        return Ok(());
    }
    let (done, answer) = oneshot::channel();
    let lead = {
        let mut q = c.group().queue.lock();
        q.waiters.push_back(Waiter {
            count: records.len(),
            bytes: records.iter().map(|r| r.payload.len()).sum(),
            done,
        });
        if q.records.is_empty() {
            q.records = records;
        } else {
            q.records.extend(records);
        }
        !std::mem::replace(&mut q.running, true)
    };
    if lead {
        let c = c.clone();
        tokio::task::spawn_blocking(move || run(&*c));
    }
    answer.await.unwrap_or_else(|_| {
        Err(GroupFailure {
            refused: false,
            reason: "the commit thread failed".into(),
            records: Vec::new(),
        })
    })
}

/// The commit thread: commits the queue until it is empty.
fn run<C: Committer>(c: &C) {
    // Should this thread die outside a commit anyway, the callers still queued are answered
    // (their senders dropped) and the next caller starts a new thread.
    struct OnPanic<'a>(&'a GroupCommit);
    impl Drop for OnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let mut q = self.0.queue.lock();
                q.running = false;
                q.records.clear();
                q.waiters.clear();
            }
        }
    }
    let _on_panic = OnPanic(c.group());
    loop {
        let Some((batch, waiters)) = next_batch(&mut c.group().queue.lock()) else {
            return;
        };
        // A panicking commit fails its batch as an error would (its callers get their
        // records back), and the queue goes on.
        let failure =
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.commit_batch(&batch)))
            {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some((C::is_refusal(&e), e.to_string())),
                Err(_) => {
                    tracing::error!("a partition commit panicked; its records are handed back");
                    Some((false, "the commit panicked".to_string()))
                }
            };
        match failure {
            None => {
                for w in waiters {
                    let _ = w.done.send(Ok(()));
                }
            }
            Some((refused, reason)) => {
                let mut batch = batch.into_iter();
                for w in waiters {
                    let records: Vec<NewRecord> = batch.by_ref().take(w.count).collect();
                    let _ = w.done.send(Err(GroupFailure {
                        refused,
                        reason: reason.clone(),
                        records,
                    }));
                }
            }
        }
    }
}

/// The next batch, or `None` when the queue is empty: then the thread ends, and it is marked
/// ended under the same lock as the check, so a caller that queues after it starts the next
/// thread instead of waiting behind one that is gone.
fn next_batch(q: &mut Queue) -> Option<(Vec<NewRecord>, Vec<Waiter>)> {
    if q.waiters.is_empty() {
        q.running = false;
        return None;
    }
    Some(take(q))
}

/// The next batch: whole callers from the front, up to the dispatcher's batch limits (at
/// least one caller).
fn take(q: &mut Queue) -> (Vec<NewRecord>, Vec<Waiter>) {
    let (mut n, mut records, mut bytes) = (0, 0, 0);
    for w in &q.waiters {
        if n > 0 && (records + w.count > MAX_BATCH_RECORDS || bytes + w.bytes > MAX_BATCH_BYTES) {
            break;
        }
        n += 1;
        records += w.count;
        bytes += w.bytes;
    }
    let waiters: Vec<Waiter> = q.waiters.drain(..n).collect();
    let batch = if q.waiters.is_empty() {
        std::mem::take(&mut q.records)
    } else {
        q.records.drain(..records).collect()
    };
    (batch, waiters)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// Records every batch; blocks each commit until released, to let callers gather.
    #[derive(Default)]
    struct Fake {
        group: GroupCommit,
        batches: Mutex<Vec<Vec<String>>>,
        gate: std::sync::Mutex<()>,
        refuse: AtomicBool,
        panic_next: AtomicBool,
    }

    /// The fake's refusal.
    #[derive(Debug)]
    struct Frozen;

    impl std::fmt::Display for Frozen {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("frozen for move 7")
        }
    }

    impl Committer for Fake {
        type Error = Frozen;
        fn is_refusal(_: &Frozen) -> bool {
            true
        }
        fn commit_batch(&self, batch: &[NewRecord]) -> Result<(), Frozen> {
            let _wait = self.gate.lock().unwrap_or_else(|e| e.into_inner());
            if self.panic_next.swap(false, Ordering::SeqCst) {
                panic!("commit bug");
            }
            self.batches.lock().push(
                batch
                    .iter()
                    .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
                    .collect(),
            );
            if self.refuse.load(Ordering::SeqCst) {
                return Err(Frozen);
            }
            Ok(())
        }
        fn group(&self) -> &GroupCommit {
            &self.group
        }
    }

    fn recs(names: &[&str]) -> Vec<NewRecord> {
        names
            .iter()
            .map(|n| NewRecord {
                key: None,
                payload: Bytes::copy_from_slice(n.as_bytes()),
                attrs: None,
            })
            .collect()
    }

    fn queued(f: &Fake) -> usize {
        f.group.queue.lock().waiters.len()
    }

    fn spawn(f: &Arc<Fake>, names: &[&str]) -> tokio::task::JoinHandle<Result<(), GroupFailure>> {
        let (f, r) = (f.clone(), recs(names));
        tokio::spawn(async move { commit_grouped(&f, r).await })
    }

    /// The commit thread took everything queued and waits at the gate.
    async fn first_commit_started(f: &Fake) {
        until("the first commit to start", || {
            queued(f) == 0 && f.group.queue.lock().running
        })
        .await;
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        for _ in 0..2000 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(
        clippy::await_holding_lock,
        reason = "the guard is the gate the blocking commit thread waits at"
    )]
    async fn callers_that_arrive_during_a_commit_share_the_next_one() {
        let f = Arc::new(Fake::default());
        let gate = f.gate.lock().unwrap();
        let first = spawn(&f, &["a"]);
        // The commit thread took "a" and waits at the gate; b, c, d and e queue behind it.
        first_commit_started(&f).await;
        let rest: Vec<_> = [&["b"][..], &["c", "d"], &["e"]]
            .into_iter()
            .map(|names| spawn(&f, names))
            .collect();
        until("three callers to queue", || queued(&f) == 3).await;
        drop(gate);
        first.await.unwrap().unwrap();
        for r in rest {
            r.await.unwrap().unwrap();
        }
        let batches = f.batches.lock().clone();
        assert_eq!(batches.len(), 2, "{batches:?}");
        assert_eq!(batches[0], ["a"]);
        let mut second = batches[1].clone();
        second.sort();
        assert_eq!(second, ["b", "c", "d", "e"]);
        until("the thread to end with the queue", || {
            !f.group.queue.lock().running
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(
        clippy::await_holding_lock,
        reason = "the guard is the gate the blocking commit thread waits at"
    )]
    async fn a_failed_commit_gives_every_caller_its_own_records_back() {
        let f = Arc::new(Fake::default());
        f.refuse.store(true, Ordering::SeqCst);
        let gate = f.gate.lock().unwrap();
        let first = spawn(&f, &["x"]);
        first_commit_started(&f).await;
        let a = spawn(&f, &["a1", "a2"]);
        until("a to queue", || queued(&f) == 1).await;
        let b = spawn(&f, &["b1"]);
        until("b to queue", || queued(&f) == 2).await;
        drop(gate);
        let back = |r: Result<(), GroupFailure>| {
            let e = r.unwrap_err();
            assert!(e.refused && e.reason.contains("move 7"), "{e:?}");
            e.records
                .iter()
                .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(back(first.await.unwrap()), ["x"]);
        assert_eq!(back(a.await.unwrap()), ["a1", "a2"]);
        assert_eq!(back(b.await.unwrap()), ["b1"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_commit_answers_its_callers_and_the_next_caller_commits() {
        let f = Arc::new(Fake::default());
        f.panic_next.store(true, Ordering::SeqCst);
        let e = commit_grouped(&f, recs(&["p"])).await.unwrap_err();
        assert!(!e.refused && e.reason.contains("panicked"), "{e:?}");
        assert_eq!(e.records.len(), 1, "the records come back");
        commit_grouped(&f, recs(&["q"])).await.unwrap();
        assert_eq!(f.batches.lock().clone(), vec![vec!["q".to_string()]]);
    }

    #[test]
    fn the_thread_is_marked_ended_in_the_same_lock_as_it_finds_the_queue_empty() {
        let mut q = Queue {
            running: true,
            ..Queue::default()
        };
        let (done, _rx) = oneshot::channel();
        q.records.push(NewRecord {
            key: None,
            payload: Bytes::from_static(b"x"),
            attrs: None,
        });
        q.waiters.push_back(Waiter {
            count: 1,
            bytes: 1,
            done,
        });
        assert!(next_batch(&mut q).is_some());
        assert!(q.running, "still committing");
        assert!(next_batch(&mut q).is_none());
        assert!(!q.running, "a caller queueing now must start a new thread");
    }

    #[test]
    fn a_batch_takes_whole_callers_within_the_limits() {
        let mut q = Queue::default();
        let mut answers = Vec::new();
        for count in [MAX_BATCH_RECORDS - 1, 2, 1] {
            let (done, rx) = oneshot::channel();
            answers.push(rx);
            q.records.extend((0..count).map(|_| NewRecord {
                key: None,
                payload: Bytes::from_static(b"x"),
                attrs: None,
            }));
            q.waiters.push_back(Waiter {
                count,
                bytes: count,
                done,
            });
        }
        // The second caller would pass the record limit: the first goes alone.
        let (batch, w) = take(&mut q);
        assert_eq!((batch.len(), w.len()), (MAX_BATCH_RECORDS - 1, 1));
        let (batch, w) = take(&mut q);
        assert_eq!((batch.len(), w.len()), (3, 2));
        assert!(q.records.is_empty() && q.waiters.is_empty());
        // One caller over the limits still goes (alone).
        let (done, _rx) = oneshot::channel();
        q.records.push(NewRecord {
            key: None,
            payload: Bytes::from(vec![0u8; MAX_BATCH_BYTES + 1]),
            attrs: None,
        });
        q.waiters.push_back(Waiter {
            count: 1,
            bytes: MAX_BATCH_BYTES + 1,
            done,
        });
        assert_eq!(take(&mut q).0.len(), 1);
    }
}
