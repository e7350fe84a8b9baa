//! Natural batching of small node RPCs: concurrent requests for the same key (say, acks of
//! one topic's handles owned by one peer) share one call. The first request of a key sends
//! at once, alone; requests that arrive while a call of their key is in flight wait for it
//! and then go together in the next call (up to `max` per call). A lone request never
//! waits for company, so nothing is added to latency at low load, and under load one round
//! trip carries many requests instead of one each.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use parking_lot::Mutex;
use tokio::sync::oneshot;

struct Lane<T, R> {
    queue: Vec<(T, oneshot::Sender<R>)>,
    /// Calls of this key in flight (each one's driver takes the next batch when it returns).
    in_flight: usize,
}

/// Batches requests of type `T` per key `K` into calls answering one `R` per request.
pub struct Coalescer<K, T, R> {
    lanes: Mutex<HashMap<K, Lane<T, R>>>,
    max: usize,
    parallel: usize,
}

impl<K, T, R> Coalescer<K, T, R>
where
    K: Hash + Eq + Clone + Send + 'static,
    T: Send + 'static,
    R: Send + 'static,
{
    /// At most `max` requests per call and `parallel` calls in flight per key.
    pub fn new(max: usize, parallel: usize) -> Arc<Self> {
        Arc::new(Coalescer {
            lanes: Mutex::new(HashMap::new()),
            max: max.max(1),
            parallel: parallel.max(1),
        })
    }

    /// Submits `item` under `key` and waits for its answer. `call` sends one batch and must
    /// answer one `R` per item, in order; it runs in a task of its own (a caller that goes
    /// away does not cancel the others' call). `None` when the call answered fewer items
    /// than it was given (the missing ones).
    pub async fn submit<F, Fut>(self: &Arc<Self>, key: K, item: T, call: F) -> Option<R>
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut lanes = self.lanes.lock();
            let lane = lanes.entry(key.clone()).or_insert_with(|| Lane {
                queue: Vec::new(),
                in_flight: 0,
            });
            lane.queue.push((item, tx));
            // With every call of this key in flight, a returning driver takes this item.
            let lead = lane.in_flight < self.parallel;
            if lead {
                lane.in_flight += 1;
            }
            lead
        };
        if lead {
            let me = self.clone();
            tokio::spawn(async move { me.drive(key, call).await });
        }
        rx.await.ok()
    }

    /// Sends the key's queued items, batch after batch, until none is left; the last
    /// driver of a key removes its lane (the next submit leads again).
    async fn drive<F, Fut>(&self, key: K, call: F)
    where
        F: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = Vec<R>>,
    {
        loop {
            let batch: Vec<(T, oneshot::Sender<R>)> = {
                let mut lanes = self.lanes.lock();
                let Some(lane) = lanes.get_mut(&key) else {
                    return;
                };
                if lane.queue.is_empty() {
                    lane.in_flight -= 1;
                    if lane.in_flight == 0 {
                        lanes.remove(&key);
                    }
                    return;
                }
                let n = lane.queue.len().min(self.max);
                lane.queue.drain(..n).collect()
            };
            let (items, answers): (Vec<T>, Vec<oneshot::Sender<R>>) = batch.into_iter().unzip();
            // A panicking call answers no one (they see `None`); the lane goes on.
            let results = AssertUnwindSafe(call(items))
                .catch_unwind()
                .await
                .unwrap_or_default();
            for (tx, r) in answers.into_iter().zip(results) {
                let _ = tx.send(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_requests_share_calls_and_get_their_own_answers() {
        let c = Coalescer::<&'static str, u32, u32>::new(8, 1);
        let calls = Arc::new(Mutex::new(Vec::<Vec<u32>>::new()));
        let submit = |key, i| {
            let c = c.clone();
            let calls = calls.clone();
            async move {
                c.submit(key, i, move |items: Vec<u32>| {
                    let calls = calls.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        calls.lock().push(items.clone());
                        items.iter().map(|i| i * 10).collect()
                    }
                })
                .await
            }
        };
        let answers = futures::future::join_all(
            (0..20u32).map(|i| submit(if i % 2 == 0 { "a" } else { "b" }, i)),
        )
        .await;
        assert_eq!(
            answers,
            (0..20u32).map(|i| Some(i * 10)).collect::<Vec<_>>()
        );
        let calls = calls.lock().clone();
        // Per key: the leader alone, then the rest in batches of at most 8.
        assert_eq!(calls.iter().map(Vec::len).sum::<usize>(), 20);
        assert!(calls.iter().all(|b| b.len() <= 8));
        assert!(calls.len() <= 6, "{calls:?}");
        for b in &calls {
            assert!(b.iter().all(|i| i % 2 == b[0] % 2), "keys mixed: {b:?}");
        }
    }

    #[tokio::test]
    async fn a_lone_request_goes_at_once_and_the_lane_is_reused() {
        let c = Coalescer::<u8, u8, u8>::new(4, 2);
        let n = Arc::new(AtomicUsize::new(0));
        for round in 0..3u8 {
            let n = n.clone();
            let r = tokio::time::timeout(
                Duration::from_secs(1),
                c.submit(1, round, move |items: Vec<u8>| {
                    n.fetch_add(1, Ordering::SeqCst);
                    async move { items }
                }),
            )
            .await
            .unwrap();
            assert_eq!(r, Some(round));
        }
        assert_eq!(n.load(Ordering::SeqCst), 3);
        // A short answer leaves the unanswered ones `None`, and the lane goes on.
        let r = c.submit(1, 9, |_items: Vec<u8>| async { Vec::new() }).await;
        assert_eq!(r, None);
        assert_eq!(c.submit(1, 5, |i: Vec<u8>| async { i }).await, Some(5));
        let r = c
            .submit(1, 6, |_i: Vec<u8>| async { panic!("a failing call") })
            .await;
        assert_eq!(r, None);
        assert_eq!(c.submit(1, 7, |i: Vec<u8>| async { i }).await, Some(7));
        assert!(c.lanes.lock().is_empty());
    }
}
