//! Remote prefetch for queue consumes (SPEC §6.3). A consume that finds nothing on this
//! node's partitions asks a remote owner for a message; with several consumers of the topic
//! waiting here it asks for up to one per waiting consumer (`Consume` with `max`), answers
//! its caller and keeps the rest — already leased on their owner, receipt handles and all —
//! for the next consumes of the topic on this node. One round trip then serves many
//! consumers instead of one.
//!
//! A kept message is handed out only while at least half of its visibility timeout is left
//! and its owner is alive; otherwise it is released (`Nack` to the owner) for someone else.
//! What is kept when the node stops is released the same way. At most as many messages are
//! kept as consumers were waiting, so nothing sits here long.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

/// Most messages one prefetch asks an owner for.
pub const MAX_FETCH: usize = 16;

/// One message leased on `owner`, rendered as the consume answer renders it.
#[derive(Debug, Clone)]
pub struct Stashed {
    pub body: Bytes,
    pub owner: String,
    pub handle: String,
    usable_until: Instant,
}

#[derive(Default)]
struct TopicStash {
    items: VecDeque<Stashed>,
    /// Queue consumes of the topic in progress on this node.
    consumers: usize,
}

/// The kept messages of every topic on this node.
#[derive(Default)]
pub struct Prefetch {
    topics: Mutex<HashMap<u64, TopicStash>>,
}

/// Counts a queue consume of a topic while it runs (see [`Prefetch::enter`]).
pub struct Consuming<'a> {
    prefetch: &'a Prefetch,
    topic_id: u64,
}

impl Drop for Consuming<'_> {
    fn drop(&mut self) {
        let mut topics = self.prefetch.topics.lock();
        if let Some(t) = topics.get_mut(&self.topic_id) {
            t.consumers = t.consumers.saturating_sub(1);
            if t.consumers == 0 && t.items.is_empty() {
                topics.remove(&self.topic_id);
            }
        }
    }
}

/// A split remote answer: what the caller gets, and what is kept.
pub struct Split {
    pub mine: Vec<Bytes>,
    pub kept: usize,
}

#[derive(Deserialize)]
struct Batch<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
struct HandleOnly {
    receipt_handle: String,
}

impl Prefetch {
    /// Marks a queue consume of `topic_id` as running until the guard drops.
    pub fn enter(&self, topic_id: u64) -> Consuming<'_> {
        self.topics.lock().entry(topic_id).or_default().consumers += 1;
        Consuming {
            prefetch: self,
            topic_id,
        }
    }

    /// How many messages a prefetch for a caller wanting `want` asks for: one per consume of
    /// the topic running here, at least `want`, at most [`MAX_FETCH`] (or `want`, if more).
    pub fn fetch_size(&self, topic_id: u64, want: usize) -> usize {
        let running = self.topics.lock().get(&topic_id).map_or(1, |t| t.consumers);
        running.clamp(1, MAX_FETCH).max(want)
    }

    /// Up to `want` kept messages of `topic_id` still usable, whose owner `alive` says is up,
    /// of at most `budget` bytes together (the first one whatever its size); the unusable ones
    /// it meets are removed and returned second, for release.
    pub fn take(
        &self,
        topic_id: u64,
        want: usize,
        budget: usize,
        alive: impl Fn(&str) -> bool,
    ) -> (Vec<Stashed>, Vec<Stashed>) {
        let mut topics = self.topics.lock();
        let Some(t) = topics.get_mut(&topic_id) else {
            return (Vec::new(), Vec::new());
        };
        let now = Instant::now();
        let (mut got, mut stale) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        while got.len() < want {
            let Some(s) = t.items.pop_front() else { break };
            if s.usable_until > now && alive(&s.owner) {
                // One byte for the comma between messages.
                if !got.is_empty() && bytes + s.body.len() + 1 > budget {
                    t.items.push_front(s);
                    break;
                }
                bytes += s.body.len() + 1;
                got.push(s);
            } else {
                stale.push(s);
            }
        }
        (got, stale)
    }

    /// Splits an owner's `{"messages":[…]}` answer: the first `want` for the caller, the rest
    /// kept for `usable_for`. Messages without a receipt handle are never kept.
    pub fn split(
        &self,
        topic_id: u64,
        owner: &str,
        body: &[u8],
        want: usize,
        usable_for: Duration,
    ) -> Result<Split, String> {
        let batch: Batch = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let usable_until = Instant::now() + usable_for;
        let mut mine = Vec::with_capacity(want);
        let mut kept = Vec::new();
        for raw in batch.messages {
            let bytes = Bytes::copy_from_slice(raw.get().as_bytes());
            if mine.len() < want {
                mine.push(bytes);
                continue;
            }
            let handle = serde_json::from_str::<HandleOnly>(raw.get())
                .map_err(|e| format!("a message without a receipt handle: {e}"))?
                .receipt_handle;
            kept.push(Stashed {
                body: bytes,
                owner: owner.to_string(),
                handle,
                usable_until,
            });
        }
        let n = kept.len();
        if n > 0 {
            self.topics
                .lock()
                .entry(topic_id)
                .or_default()
                .items
                .extend(kept);
        }
        Ok(Split { mine, kept: n })
    }

    /// Everything kept of `topic_id`, for release (its partitions were purged or sought).
    pub fn take_all(&self, topic_id: u64) -> Vec<Stashed> {
        self.topics
            .lock()
            .get_mut(&topic_id)
            .map_or_else(Vec::new, |t| t.items.drain(..).collect())
    }

    /// Everything kept, for release (shutdown).
    pub fn drain(&self) -> Vec<(u64, Stashed)> {
        let mut topics = self.topics.lock();
        let mut out = Vec::new();
        for (id, t) in topics.iter_mut() {
            out.extend(t.items.drain(..).map(|s| (*id, s)));
        }
        out
    }
}

/// Renders messages as a consume answer: one object, or `{"messages":[…]}` for a batch.
pub fn render(bodies: &[Bytes], batch: bool) -> Vec<u8> {
    if !batch {
        return bodies.first().map(|b| b.to_vec()).unwrap_or_default();
    }
    let mut out = Vec::with_capacity(16 + bodies.iter().map(|b| b.len() + 1).sum::<usize>());
    out.extend_from_slice(b"{\"messages\":[");
    for (i, b) in bodies.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b);
    }
    out.extend_from_slice(b"]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(n: usize) -> Vec<u8> {
        let msgs: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"topic":"t","partition":1,"offset":{i},"payload":{{"n":{i}}},"timestamp":1,"receipt_handle":"1:{i}:9"}}"#
                )
            })
            .collect();
        format!(r#"{{"messages":[{}]}}"#, msgs.join(",")).into_bytes()
    }

    #[tokio::test]
    async fn splits_keeps_and_hands_out_in_order() {
        let p = Prefetch::default();
        let _c = p.enter(7);
        let s = p
            .split(7, "n1", &answer(4), 1, Duration::from_secs(10))
            .unwrap();
        assert_eq!(s.mine.len(), 1);
        assert_eq!(s.kept, 3);
        assert!(std::str::from_utf8(&s.mine[0])
            .unwrap()
            .contains(r#""offset":0"#));
        let (got, stale) = p.take(7, 2, usize::MAX, |_| true);
        assert!(stale.is_empty());
        assert_eq!(
            got.iter().map(|s| s.handle.as_str()).collect::<Vec<_>>(),
            ["1:1:9", "1:2:9"]
        );
        // A dead owner's message is released, not handed out.
        let (got, stale) = p.take(7, 1, usize::MAX, |o| o != "n1");
        assert!(got.is_empty());
        assert_eq!(stale.len(), 1);
        assert!(p.drain().is_empty());
        // Rendering: one message as it came, or the batch form.
        let b = render(&s.mine, false);
        assert_eq!(b, s.mine[0].to_vec());
        let v: serde_json::Value = serde_json::from_slice(&render(&s.mine, true)).unwrap();
        assert_eq!(v["messages"][0]["offset"], 0);
    }

    #[tokio::test]
    async fn kept_messages_go_stale_after_their_window() {
        let p = Prefetch::default();
        p.split(1, "n2", &answer(3), 0, Duration::from_millis(0))
            .unwrap();
        let (got, stale) = p.take(1, 3, usize::MAX, |_| true);
        assert!(got.is_empty());
        assert_eq!(stale.len(), 3);
    }

    #[tokio::test]
    async fn take_stops_at_the_byte_budget_and_keeps_the_rest() {
        let p = Prefetch::default();
        let _c = p.enter(3);
        p.split(3, "n1", &answer(4), 0, Duration::from_secs(10))
            .unwrap();
        let one = p.topics.lock()[&3].items[0].body.len() + 1;
        // Room for two messages and a bit: two come out, the others stay kept, in order.
        let (got, stale) = p.take(3, 4, 2 * one + one / 2, |_| true);
        assert!(stale.is_empty());
        assert_eq!(
            got.iter().map(|s| s.handle.as_str()).collect::<Vec<_>>(),
            ["1:0:9", "1:1:9"]
        );
        // A budget smaller than one message still hands out one.
        let (got, _) = p.take(3, 4, 1, |_| true);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].handle, "1:2:9");
        assert_eq!(p.drain().len(), 1);
    }

    #[test]
    fn fetch_size_follows_the_running_consumes() {
        let p = Prefetch::default();
        assert_eq!(p.fetch_size(3, 1), 1);
        let guards: Vec<_> = (0..40).map(|_| p.enter(3)).collect();
        assert_eq!(p.fetch_size(3, 1), MAX_FETCH);
        assert_eq!(p.fetch_size(3, 50), 50);
        drop(guards);
        assert_eq!(p.fetch_size(3, 1), 1);
        assert!(
            p.topics.lock().is_empty(),
            "an idle topic leaves nothing behind"
        );
    }
}
