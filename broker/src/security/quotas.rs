//! (ext) Per-user quotas: produce token buckets of messages and bytes per second, and the
//! count of leases a user holds ([`LeaseCounts`]).
//!
//! A quota is a cluster-wide rate; every node enforces its even share among the live
//! members (`rate / live`, at least 1 per second), so a client spread over the nodes gets
//! about the whole rate and one pinned to a single node gets its share. A bucket holds one
//! second of its share. A request is admitted while every bucket it draws on holds a token,
//! and then takes its whole cost, so a batch larger than a second's share passes once and
//! the following requests wait for the debt to refill; the refused get `429` with the
//! seconds until the buckets are out of debt as `Retry-After`. Nothing is kept across
//! restarts: a restarted node starts with full buckets.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use narad_meta::Quotas;

/// A bucket of `rate` tokens per second holding at most one second of them.
#[derive(Debug, Clone)]
struct Bucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: u64, now: Instant) -> Bucket {
        Bucket {
            rate: rate as f64,
            tokens: rate as f64,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.rate);
        self.at = now;
    }

    /// How long until the bucket holds a token again (zero: it does).
    fn wait(&self) -> Duration {
        if self.tokens > 0.0 {
            Duration::ZERO
        } else {
            // Just past the moment the debt is repaid.
            Duration::from_secs_f64((-self.tokens + 1e-6) / self.rate)
        }
    }
}

/// The buckets of one user, for the quotas and the node's share they were made with.
#[derive(Debug)]
struct UserBuckets {
    quotas: Quotas,
    live: usize,
    msgs: Option<Bucket>,
    bytes: Option<Bucket>,
}

/// The share of a cluster-wide rate this node enforces.
fn share(rate: u64, live: usize) -> u64 {
    rate.div_ceil(live.max(1) as u64).max(1)
}

/// Every user's produce buckets on this node.
#[derive(Debug, Default)]
pub struct QuotaTable {
    users: Mutex<HashMap<String, UserBuckets>>,
}

impl QuotaTable {
    /// Admits a produce of `msgs` messages and `bytes` payload bytes by `username` under
    /// `quotas`, with `live` members sharing the rate, or answers how long to wait.
    pub fn admit_produce(
        &self,
        username: &str,
        quotas: &Quotas,
        live: usize,
        msgs: u64,
        bytes: u64,
        now: Instant,
    ) -> Result<(), Duration> {
        if !quotas.limits_produce() {
            return Ok(());
        }
        let mut users = self.users.lock().expect("quota table poisoned");
        let fresh = || UserBuckets {
            quotas: *quotas,
            live,
            msgs: quotas
                .produce_msgs_per_s
                .map(|r| Bucket::new(share(r, live), now)),
            bytes: quotas
                .produce_bytes_per_s
                .map(|r| Bucket::new(share(r, live), now)),
        };
        let u = users.entry(username.to_string()).or_insert_with(fresh);
        if u.quotas != *quotas || u.live != live {
            // Changed quotas or membership: start over with the new shares.
            *u = fresh();
        }
        let mut wait = Duration::ZERO;
        for b in [&mut u.msgs, &mut u.bytes].into_iter().flatten() {
            b.refill(now);
            wait = wait.max(b.wait());
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        if let Some(b) = &mut u.msgs {
            b.tokens -= msgs as f64;
        }
        if let Some(b) = &mut u.bytes {
            b.tokens -= bytes as f64;
        }
        Ok(())
    }
}

/// (ext) The leases each user took through this node and has not settled through it: each
/// counts until it is acknowledged or nacked here, or its lease deadline passes (a lease
/// settled through another node counts here until then; one extended there may stop
/// counting early). A user's `consume_in_flight` quota is a cluster-wide count of which
/// every node enforces its even share among the live members.
#[derive(Debug, Default)]
pub struct LeaseCounts {
    users: Mutex<HashMap<String, HashMap<String, Instant>>>,
}

impl LeaseCounts {
    /// How many more leases `username` may take now under `limit` (its share with `live`
    /// members), or how long until one of its leases ends when it may take none.
    pub fn room(
        &self,
        username: &str,
        limit: u64,
        live: usize,
        now: Instant,
    ) -> Result<u64, Duration> {
        let share = share(limit, live);
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = users.get_mut(username) else {
            return Ok(share);
        };
        held.retain(|_, deadline| *deadline > now);
        if held.is_empty() {
            users.remove(username);
            return Ok(share);
        }
        let n = held.len() as u64;
        if n < share {
            return Ok(share - n);
        }
        let first = held.values().min().copied().unwrap_or(now);
        Err(first.saturating_duration_since(now))
    }

    /// `username` took these leases (receipt handle, deadline).
    pub fn took(&self, username: &str, leases: impl IntoIterator<Item = (String, Instant)>) {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users
            .entry(username.to_string())
            .or_default()
            .extend(leases);
    }

    /// `username` settled lease `handle` here: gone (`None`), or extended to `deadline`.
    pub fn settled(&self, username: &str, handle: &str, deadline: Option<Instant>) {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = users.get_mut(username) else {
            return;
        };
        match deadline {
            None => {
                held.remove(handle);
            }
            Some(d) => {
                if let Some(at) = held.get_mut(handle) {
                    *at = d;
                }
            }
        }
        if held.is_empty() {
            users.remove(username);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(msgs: Option<u64>, bytes: Option<u64>) -> Quotas {
        Quotas {
            produce_msgs_per_s: msgs,
            produce_bytes_per_s: bytes,
            max_topics: None,
            consume_in_flight: None,
        }
    }

    #[test]
    fn leases_count_until_settled_or_past_their_deadline() {
        let t = LeaseCounts::default();
        let now = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(t.room("u", 3, 1, now), Ok(3));
        t.took(
            "u",
            [("a".to_string(), now + s), ("b".to_string(), now + 2 * s)],
        );
        assert_eq!(t.room("u", 3, 1, now), Ok(1));
        assert_eq!(t.room("other", 3, 1, now), Ok(3));
        t.took("u", [("c".to_string(), now + 3 * s)]);
        // Full: the wait is until the first deadline.
        assert_eq!(t.room("u", 3, 1, now), Err(s));
        // Two nodes share it: each enforces 2 (rounded up).
        assert_eq!(t.room("u", 3, 2, now), Err(s));
        // An ack frees one; an extend moves its deadline; a deadline passing frees one.
        t.settled("u", "a", None);
        assert_eq!(t.room("u", 3, 1, now), Ok(1));
        t.settled("u", "b", Some(now + 10 * s));
        t.took("u", [("d".to_string(), now + s)]);
        assert_eq!(t.room("u", 3, 1, now), Err(s));
        assert_eq!(t.room("u", 3, 1, now + s), Ok(1));
        assert_eq!(t.room("u", 3, 1, now + 3 * s), Ok(2));
        // Settling what it never took here changes nothing.
        t.settled("u", "zzz", None);
        t.settled("nobody", "a", None);
        t.settled("u", "b", None);
        assert_eq!(t.room("u", 3, 1, now + 3 * s), Ok(3));
        assert!(t.users.lock().unwrap().is_empty(), "an empty user goes");
    }

    #[test]
    fn a_second_of_messages_passes_then_the_rate_holds() {
        let t = QuotaTable::default();
        let q = q(Some(10), None);
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(t.admit_produce("u", &q, 1, 1, 100, t0), Ok(()), "{i}");
        }
        let wait = t.admit_produce("u", &q, 1, 1, 100, t0).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(101),
            "{wait:?}"
        );
        // A refusal takes nothing: 100 ms later one token is back, and one message passes.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(t.admit_produce("u", &q, 1, 1, 100, t1), Ok(()));
        assert!(t.admit_produce("u", &q, 1, 1, 100, t1).is_err());
        // Over 10 s at most 10/s pass (plus the first second's burst).
        let mut passed = 0;
        for ms in (101..10_100).step_by(7) {
            let now = t0 + Duration::from_millis(ms);
            passed += u32::from(t.admit_produce("u", &q, 1, 1, 1, now).is_ok());
        }
        assert!((95..=101).contains(&passed), "{passed}");
        // Another user has its own buckets; a user without quotas is never refused.
        assert_eq!(t.admit_produce("v", &q, 1, 1, 1, t1), Ok(()));
        assert_eq!(
            t.admit_produce("w", &Quotas::default(), 1, 1000, 1, t1),
            Ok(())
        );
    }

    #[test]
    fn a_big_batch_passes_once_and_its_debt_is_waited_out() {
        let t = QuotaTable::default();
        let q = q(Some(100), Some(1_000));
        let t0 = Instant::now();
        assert_eq!(t.admit_produce("u", &q, 1, 500, 900, t0), Ok(()));
        // 400 messages of debt at 100/s: 4 s (bytes have 100 left, so messages decide).
        let wait = t.admit_produce("u", &q, 1, 1, 1, t0).unwrap_err();
        assert!((3_999..=4_001).contains(&wait.as_millis()), "{wait:?}");
        assert!(t
            .admit_produce("u", &q, 1, 1, 1, t0 + Duration::from_millis(3_990))
            .is_err());
        assert!(t
            .admit_produce("u", &q, 1, 1, 1, t0 + Duration::from_millis(4_010))
            .is_ok());
        // Bytes alone refuse too: 2,000 bytes at 1,000/s.
        let t2 = t0 + Duration::from_secs(60);
        assert!(t.admit_produce("u", &q, 1, 1, 3_000, t2).is_ok());
        let wait = t.admit_produce("u", &q, 1, 1, 1, t2).unwrap_err();
        assert!((1_999..=2_001).contains(&wait.as_millis()), "{wait:?}");
    }

    #[test]
    fn each_node_enforces_its_share_and_changes_start_over() {
        let t = QuotaTable::default();
        let q3 = q(Some(10), None);
        let t0 = Instant::now();
        // 10/s over 3 live members: 4/s here (rounded up, never 0).
        let passed = (0..10)
            .filter(|_| t.admit_produce("u", &q3, 3, 1, 1, t0).is_ok())
            .count();
        assert_eq!(passed, 4);
        assert_eq!(share(1, 5), 1);
        // A member more or a new quota: fresh buckets of the new share.
        assert!(t.admit_produce("u", &q3, 2, 1, 1, t0).is_ok());
        let q20 = q(Some(20), None);
        let passed = (0..30)
            .filter(|_| t.admit_produce("u", &q20, 1, 1, 1, t0).is_ok())
            .count();
        assert_eq!(passed, 20);
    }
}
