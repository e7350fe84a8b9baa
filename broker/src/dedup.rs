//! Idempotent produce (ext): a produce may carry an `Idempotency-Key` (a batch element its
//! `"idempotency_key"`). The key travels with the record as the broker attribute
//! [`ATTR`], and the partition's owner, committing, drops a record whose key it committed
//! within the topic's window (`dedup_window_ms`, default 5 minutes): the retry of a produce
//! whose answer was lost is answered `202` and not stored again, whichever node it reached,
//! because a record without a message key is routed by its idempotency key's hash, so both
//! attempts meet at the same partition.
//!
//! The window is kept per partition, in memory, under the partition's write lock, and built
//! from the log itself the first time a keyed record is committed after the partition opened
//! (a restart, a move): the keys of the records committed within the window, read back from
//! the log. So it survives restarts and moves exactly as the records do, and a partition
//! that never sees a key never reads anything.
//!
//! What it cannot promise (an AP broker): a pair split across partitions — the first attempt
//! committed on its partition, the retry rerouted to a sibling because that partition's
//! owner was dead or failing — is stored twice; `narad_dedup_split_total` counts the keyed
//! records so rerouted.

use std::collections::{HashMap, VecDeque};

/// The broker attribute holding a record's idempotency key.
pub const ATTR: &str = "narad-idempotency-key";
/// The request header.
pub const HEADER: &str = "idempotency-key";
/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 128;
/// Most keys one partition remembers; past it the oldest are forgotten early (a retry of
/// one of those would be stored again), and a warning says so.
pub const MAX_KEYS: usize = 2_000_000;

/// Checks an idempotency key: 1 to 128 visible ASCII characters (no spaces).
pub fn check_key(k: &[u8]) -> Result<&str, String> {
    if k.is_empty() || k.len() > MAX_KEY_LEN {
        return Err(format!(
            "an idempotency key is 1 to {MAX_KEY_LEN} bytes, got {}",
            k.len()
        ));
    }
    if !k.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err("an idempotency key is visible ASCII (no spaces or control characters)".into());
    }
    Ok(std::str::from_utf8(k).expect("ASCII"))
}

/// The idempotency key a stored record carries, if any.
pub fn key_of(attrs: Option<&[u8]>) -> Option<&str> {
    crate::attrs::get(attrs?, ATTR)
}

/// `attrs` without the idempotency key (a copy the broker makes of a record: a child's, a
/// dead-lettered or redriven one, is never a repeat of a produce).
pub fn without_key(attrs: Option<&bytes::Bytes>) -> Option<bytes::Bytes> {
    crate::attrs::without(attrs, |n| n == ATTR)
}

/// The keys one partition committed within its window, oldest first.
#[derive(Debug, Default)]
pub struct Window {
    /// Key → commit time (Unix ms) of its latest commit.
    seen: HashMap<Box<[u8]>, u64>,
    /// (commit time, key) in commit order; a key committed again appears twice (the older
    /// entry no longer matches `seen` and is skipped when it expires).
    order: VecDeque<(u64, Box<[u8]>)>,
    /// Keys forgotten early because of [`MAX_KEYS`].
    pub evicted: u64,
}

impl Window {
    /// Forgets what was committed before `now_ms - window_ms`.
    pub fn expire(&mut self, now_ms: u64, window_ms: u64) {
        let cutoff = now_ms.saturating_sub(window_ms);
        while let Some((t, _)) = self.order.front() {
            if *t >= cutoff && self.seen.len() <= MAX_KEYS {
                break;
            }
            let (t, k) = self.order.pop_front().expect("front exists");
            if self.seen.get(&k) == Some(&t) {
                self.seen.remove(&k);
                if t >= cutoff {
                    self.evicted += 1;
                }
            }
        }
    }

    /// Whether `key` was committed at or after `now_ms - window_ms`.
    pub fn contains(&self, key: &[u8], now_ms: u64, window_ms: u64) -> bool {
        self.seen
            .get(key)
            .is_some_and(|t| *t >= now_ms.saturating_sub(window_ms))
    }

    /// Records `key` as committed at `at_ms`.
    pub fn insert(&mut self, key: &[u8], at_ms: u64) {
        let k: Box<[u8]> = key.into();
        self.seen.insert(k.clone(), at_ms);
        self.order.push_back((at_ms, k));
    }

    /// Takes back an [`Window::insert`] whose commit did not happen.
    pub fn remove(&mut self, key: &[u8], at_ms: u64) {
        if self.seen.get(key) == Some(&at_ms) {
            self.seen.remove(key);
        }
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Which records of a batch to keep, given the partition's window: drops those whose key
/// the window holds and repeats of a key within the batch, and records the kept keys as
/// committed at `now_ms` (undo with [`Window::remove`] if the commit fails). Returns the
/// kept indices' mask and the keys it inserted.
pub fn filter(
    window: &mut Window,
    keys: &[Option<&str>],
    now_ms: u64,
    window_ms: u64,
) -> (Vec<bool>, Vec<String>) {
    window.expire(now_ms, window_ms);
    let mut keep = Vec::with_capacity(keys.len());
    let mut inserted = Vec::new();
    for k in keys {
        match k {
            None => keep.push(true),
            Some(k) if window.contains(k.as_bytes(), now_ms, window_ms) => keep.push(false),
            Some(k) => {
                window.insert(k.as_bytes(), now_ms);
                inserted.push(k.to_string());
                keep.push(true);
            }
        }
    }
    (keep, inserted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_are_one_to_128_visible_ascii_bytes() {
        assert_eq!(check_key(b"order-42/retry"), Ok("order-42/retry"));
        assert!(check_key(b"").is_err());
        assert!(check_key(&[b'a'; 129]).is_err());
        assert!(check_key(&[b'a'; 128]).is_ok());
        assert!(check_key(b"with space").is_err());
        assert!(check_key("é".as_bytes()).is_err());
        assert!(check_key(b"tab\there").is_err());
    }

    #[test]
    fn a_copy_loses_the_key_and_keeps_every_other_attribute() {
        let mut b = crate::attrs::Builder::default();
        b.push("trace", "t1").unwrap();
        let block = crate::attrs::with_reserved(
            b.finish().as_deref(),
            &[(ATTR, "k1"), ("narad-dead-letter-source-topic", "src")],
        )
        .unwrap();
        assert_eq!(key_of(Some(&block)), Some("k1"));
        let copy = without_key(Some(&block)).unwrap();
        let pairs: Vec<_> = crate::attrs::Iter(&copy).collect();
        assert_eq!(
            pairs,
            [("trace", "t1"), ("narad-dead-letter-source-topic", "src")]
        );
        let only = crate::attrs::with_reserved(None, &[(ATTR, "k1")]).unwrap();
        assert_eq!(without_key(Some(&only)), None);
        assert_eq!(without_key(None), None);
    }

    #[test]
    fn a_key_is_dropped_within_the_window_and_kept_after_it() {
        let mut w = Window::default();
        let (keep, ins) = filter(&mut w, &[Some("a"), None, Some("b"), Some("a")], 1_000, 500);
        assert_eq!(
            keep,
            [true, true, true, false],
            "a repeat within the batch goes too"
        );
        assert_eq!(ins, ["a", "b"]);
        let (keep, _) = filter(&mut w, &[Some("a"), Some("c")], 1_499, 500);
        assert_eq!(keep, [false, true]);
        // "a" and "b" were committed at 1000: past the window at 1501.
        let (keep, _) = filter(&mut w, &[Some("a"), Some("b"), Some("c")], 1_501, 500);
        assert_eq!(keep, [true, true, false]);
        assert_eq!(w.len(), 3);
    }

    #[test]
    fn an_undone_insert_is_forgotten() {
        let mut w = Window::default();
        let (_, ins) = filter(&mut w, &[Some("a")], 10, 100);
        for k in &ins {
            w.remove(k.as_bytes(), 10);
        }
        assert!(w.is_empty());
        assert_eq!(filter(&mut w, &[Some("a")], 11, 100).0, [true]);
    }

    #[test]
    fn a_key_committed_again_expires_from_its_latest_commit() {
        let mut w = Window::default();
        w.insert(b"a", 100);
        w.insert(b"a", 300);
        w.expire(450, 200);
        assert!(
            w.contains(b"a", 450, 200),
            "the older entry must not remove the newer"
        );
        w.expire(501, 200);
        assert!(w.is_empty());
        assert_eq!(w.evicted, 0);
    }

    proptest! {
        /// Against a model: a key is kept iff it was not kept within the window before.
        #[test]
        fn prop_filter_matches_a_model(
            steps in proptest::collection::vec((0u64..50, proptest::collection::vec(proptest::option::of(0u8..6), 0..6)), 1..40),
            window_ms in 1u64..200,
        ) {
            let mut w = Window::default();
            let mut model: HashMap<String, u64> = HashMap::new();
            let mut now = 0;
            for (dt, keys) in steps {
                now += dt;
                let keys: Vec<Option<String>> = keys.into_iter().map(|k| k.map(|k| format!("k{k}"))).collect();
                let refs: Vec<Option<&str>> = keys.iter().map(|k| k.as_deref()).collect();
                let (keep, _) = filter(&mut w, &refs, now, window_ms);
                for (k, kept) in keys.iter().zip(keep) {
                    let want = match k {
                        None => true,
                        Some(k) => match model.get(k) {
                            Some(t) if *t >= now.saturating_sub(window_ms) => false,
                            _ => { model.insert(k.clone(), now); true }
                        },
                    };
                    prop_assert_eq!(kept, want, "key {:?} at {}", k, now);
                }
            }
        }
    }
}
