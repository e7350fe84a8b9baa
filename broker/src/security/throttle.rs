//! The failed-login throttle (SPEC §4.1, §11): per username, 5 attempts, refilled one per
//! 12 s; an empty bucket answers `429` with `Retry-After`. Plus the injectable [`Clock`].
//!
//! An attempt is taken before a password verification and given back when the password was
//! right, so only failures count. Pure data; the `Authenticator` holds it under its lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Attempts per username before `429`.
pub const ATTEMPTS: u32 = 5;
/// One attempt comes back every 12 s.
pub const REFILL_MS: u64 = 12_000;

/// Milliseconds on a monotonic clock (only differences matter).
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// The real clock: milliseconds since the clock was made, monotonic.
#[derive(Debug)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock {
            start: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// A clock moved by hand (tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now_ms: u64) -> Self {
        ManualClock(AtomicU64::new(now_ms))
    }
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A token bucket: `tokens` as of `since_ms`; one token accrues per `refill_ms` after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    tokens: u32,
    since_ms: u64,
}

/// Per-username failed-login throttle.
#[derive(Debug)]
pub struct LoginThrottle {
    capacity: u32,
    refill_ms: u64,
    buckets: HashMap<String, Bucket>,
}

impl Default for LoginThrottle {
    fn default() -> Self {
        Self::new(ATTEMPTS, REFILL_MS)
    }
}

impl LoginThrottle {
    pub fn new(capacity: u32, refill_ms: u64) -> Self {
        assert!(
            capacity > 0 && refill_ms > 0,
            "a throttle needs attempts and a refill"
        );
        LoginThrottle {
            capacity,
            refill_ms,
            buckets: HashMap::new(),
        }
    }

    /// The bucket of `username`, refilled up to `now_ms`.
    fn refilled(&self, username: &str, now_ms: u64) -> Bucket {
        let Some(b) = self.buckets.get(username).copied() else {
            return Bucket {
                tokens: self.capacity,
                since_ms: now_ms,
            };
        };
        let elapsed = now_ms.saturating_sub(b.since_ms);
        let gained = elapsed / self.refill_ms;
        let tokens = (b.tokens as u64 + gained).min(self.capacity as u64) as u32;
        if tokens >= self.capacity {
            Bucket {
                tokens,
                since_ms: now_ms,
            }
        } else {
            // Keep the partial progress towards the next token.
            Bucket {
                tokens,
                since_ms: b.since_ms + gained * self.refill_ms,
            }
        }
    }

    fn store(&mut self, username: &str, b: Bucket) {
        if b.tokens >= self.capacity {
            // A full bucket is the same as none: keeps the map to users under attack.
            self.buckets.remove(username);
        } else {
            self.buckets.insert(username.to_string(), b);
        }
    }

    /// Takes one attempt for `username`; when none is left, `Err(retry_after_secs)` — the
    /// whole seconds (at least 1) until the next attempt accrues.
    pub fn try_acquire(&mut self, username: &str, now_ms: u64) -> Result<(), u64> {
        let mut b = self.refilled(username, now_ms);
        if b.tokens == 0 {
            let wait_ms = (b.since_ms + self.refill_ms).saturating_sub(now_ms);
            self.store(username, b);
            return Err(wait_ms.div_ceil(1000).max(1));
        }
        b.tokens -= 1;
        self.store(username, b);
        Ok(())
    }

    /// Gives an attempt back (the password was right); never above capacity.
    pub fn release(&mut self, username: &str, now_ms: u64) {
        let mut b = self.refilled(username, now_ms);
        b.tokens = (b.tokens + 1).min(self.capacity);
        self.store(username, b);
    }

    /// Attempts left for `username` now.
    pub fn remaining(&self, username: &str, now_ms: u64) -> u32 {
        self.refilled(username, now_ms).tokens
    }

    /// Drops buckets that have refilled completely (bounded memory).
    pub fn sweep(&mut self, now_ms: u64) {
        let cap = self.capacity as u64;
        let refill = self.refill_ms;
        self.buckets.retain(|_, b| {
            let gained = now_ms.saturating_sub(b.since_ms) / refill;
            (b.tokens as u64 + gained) < cap
        });
    }

    /// Users with a bucket that is not full (tests, metrics).
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_attempts_then_retry_after() {
        let mut t = LoginThrottle::default();
        for i in 0..5 {
            assert_eq!(t.try_acquire("u", 1_000 + i), Ok(()), "attempt {i}");
        }
        // 5th taken at 1_004; the first refill is due 12 s after the first take (1_000).
        assert_eq!(t.try_acquire("u", 1_004), Err(12));
        assert_eq!(t.try_acquire("u", 5_000), Err(8));
        assert_eq!(t.try_acquire("u", 12_999), Err(1)); // 1 ms left → 1 s
        assert_eq!(t.try_acquire("u", 13_000), Ok(()));
        assert_eq!(t.try_acquire("u", 13_000), Err(12));
        // Other users are independent.
        assert_eq!(t.remaining("v", 13_000), 5);
        assert_eq!(t.try_acquire("v", 13_000), Ok(()));
    }

    #[test]
    fn refill_one_per_12s_up_to_capacity() {
        let mut t = LoginThrottle::default();
        for _ in 0..5 {
            t.try_acquire("u", 0).unwrap();
        }
        assert_eq!(t.remaining("u", 11_999), 0);
        assert_eq!(t.remaining("u", 12_000), 1);
        assert_eq!(t.remaining("u", 36_000), 3);
        assert_eq!(t.remaining("u", 10_000_000), 5);
        // Partial progress is kept across a take.
        t.try_acquire("u", 18_000).unwrap(); // had 1 (12 s), now 0; next due at 24 s
        assert_eq!(t.remaining("u", 23_999), 0);
        assert_eq!(t.remaining("u", 24_000), 1);
    }

    #[test]
    fn release_returns_an_attempt_and_caps() {
        let mut t = LoginThrottle::default();
        t.try_acquire("u", 0).unwrap();
        assert_eq!(t.remaining("u", 0), 4);
        t.release("u", 0);
        assert_eq!(t.remaining("u", 0), 5);
        assert_eq!(t.tracked(), 0, "full buckets are dropped");
        t.release("u", 0);
        assert_eq!(t.remaining("u", 0), 5);
    }

    #[test]
    fn sweep_drops_refilled_buckets() {
        let mut t = LoginThrottle::default();
        t.try_acquire("a", 0).unwrap();
        for _ in 0..5 {
            t.try_acquire("b", 0).unwrap();
        }
        assert_eq!(t.tracked(), 2);
        t.sweep(12_000); // a refilled (4 + 1), b has 1 of 5
        assert_eq!(t.tracked(), 1);
        assert_eq!(t.remaining("b", 12_000), 1);
        t.sweep(60_000);
        assert_eq!(t.tracked(), 0);
    }

    #[test]
    fn manual_clock() {
        let c = ManualClock::new(5);
        c.advance(10);
        assert_eq!(c.now_ms(), 15);
        c.set(1);
        assert_eq!(c.now_ms(), 1);
        let m = MonotonicClock::new();
        assert!(m.now_ms() < 60_000);
    }
}
