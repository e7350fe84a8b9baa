//! The lease table of one partition: Narad's queue semantics over the partition log
//! (SPEC §2.4, §2.5).
//!
//! State (all in memory, except the committed frontier, which the owner persists):
//! - `frontier`: every offset below it is settled (acked, or skipped as dropped/corrupt);
//! - `next_fresh`: the lowest offset never leased since this incarnation started;
//! - every offset in `[frontier, next_fresh)` is in exactly one of `inflight` (leased),
//!   `available` (expired or nacked, waiting for redelivery) or `acked_ahead` (acked while
//!   an earlier offset is unsettled);
//! - `deliveries`: how often each unsettled offset was delivered, for the `delivery_count`
//!   of its next delivery. The counts of at least 2 are persisted beside the frontier
//!   ([`LeaseTable::redelivered`]) and seed a new table ([`LeaseTable::restore_deliveries`]).
//!
//! Fresh offsets are leased only within `frontier ..= frontier + max_acked_ahead`, so the
//! acked-ahead set can fill only through redelivery or a lowered cap; when it is full the
//! partition re-offers just the offset blocking the frontier, and an ack that cannot be
//! parked answers 503.
//!
//! The table is a pure, deterministic core: time is passed in, it does no I/O, and its
//! memory is bounded by the two caps, never by the backlog.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use narad_meta::Backoff;

/// A lease on one delivery of one offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    nonce: u64,
    deadline: Instant,
}

/// Why an ack, extend or nack was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleError {
    /// The lease expired, was superseded or already settled (→ 410).
    Stale,
    /// Out-of-order ack while the acked-ahead set is full (→ 503).
    AckedAheadFull,
}

/// What a settle did to the frontier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The frontier moved (persist it).
    pub frontier_moved: bool,
}

/// Caps of the table (topic settings; may change at any time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub max_in_flight: u64,
    pub max_acked_ahead: u64,
}

/// One partition's queue state.
#[derive(Debug)]
pub struct LeaseTable {
    frontier: u64,
    next_fresh: u64,
    inflight: HashMap<u64, Lease>,
    /// Lease deadlines, for expiry in deadline order.
    deadlines: BTreeSet<(Instant, u64)>,
    available: BTreeSet<u64>,
    acked_ahead: BTreeSet<u64>,
    /// Deliveries so far of unsettled offsets delivered at least once (or restored).
    deliveries: HashMap<u64, u32>,
    /// A count of at least 2 changed since [`LeaseTable::redelivered`] last took them.
    redelivered_changed: bool,
    /// Offsets nacked with a delay: when each may be delivered again (Unix ms), for
    /// persistence. Until then each is held in `inflight` under a lease no consumer holds.
    delayed: HashMap<u64, u64>,
    /// `delayed` changed since [`LeaseTable::delays`] last took it.
    delayed_changed: bool,
    last_nonce: u64,
    /// Messages removed by retention before they were acked.
    pub dropped: u64,
}

/// A lease granted: the offset and the nonce of this delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub offset: u64,
    pub nonce: u64,
    /// Deliveries of the offset including this one (1 on the first).
    pub delivery_count: u32,
}

impl LeaseTable {
    /// A table resuming at the persisted `frontier`. `nonce_floor` seeds nonces (e.g. the
    /// wall clock in microseconds) so that they never repeat across restarts.
    pub fn new(frontier: u64, nonce_floor: u64) -> Self {
        LeaseTable {
            frontier,
            next_fresh: frontier,
            inflight: HashMap::new(),
            deadlines: BTreeSet::new(),
            available: BTreeSet::new(),
            acked_ahead: BTreeSet::new(),
            deliveries: HashMap::new(),
            redelivered_changed: false,
            delayed: HashMap::new(),
            delayed_changed: false,
            last_nonce: nonce_floor,
            dropped: 0,
        }
    }

    pub fn frontier(&self) -> u64 {
        self.frontier
    }
    pub fn inflight_len(&self) -> usize {
        self.inflight.len()
    }
    pub fn acked_ahead_len(&self) -> usize {
        self.acked_ahead.len()
    }
    /// Seeds the delivery counts of offsets at or above the frontier (persisted by an earlier
    /// incarnation or carried by a move); below it they are settled and ignored.
    pub fn restore_deliveries(&mut self, counts: impl IntoIterator<Item = (u64, u32)>) {
        for (offset, n) in counts {
            if offset >= self.frontier && n > 0 {
                self.deliveries.insert(offset, n);
            }
        }
    }

    /// The delivery counts of at least 2, by offset, if any changed since the last call (for
    /// persistence: a first delivery is not worth a write, so after a crash an offset's count
    /// is at most one short).
    pub fn redelivered(&mut self) -> Option<Vec<(u64, u32)>> {
        if !std::mem::take(&mut self.redelivered_changed) {
            return None;
        }
        let mut v: Vec<(u64, u32)> = self
            .deliveries
            .iter()
            .filter(|(_, n)| **n >= 2)
            .map(|(o, n)| (*o, *n))
            .collect();
        v.sort_unstable();
        Some(v)
    }

    /// The counts [`LeaseTable::redelivered`] returned were not saved: return them next time.
    pub fn redelivered_unsaved(&mut self) {
        self.redelivered_changed = true;
    }

    /// The delayed offsets and when each may be delivered again (Unix ms), if they changed
    /// since the last call (for persistence).
    pub fn delays(&mut self) -> Option<Vec<(u64, u64)>> {
        if !std::mem::take(&mut self.delayed_changed) {
            return None;
        }
        let mut v: Vec<(u64, u64)> = self.delayed.iter().map(|(o, t)| (*o, *t)).collect();
        v.sort_unstable();
        Some(v)
    }

    /// The delays [`LeaseTable::delays`] returned were not saved: return them next time.
    pub fn delays_unsaved(&mut self) {
        self.delayed_changed = true;
    }

    /// Holds back delayed offsets persisted by an earlier incarnation (or carried by a move)
    /// until their time (`not_before`, Unix ms; `now_ms` is the wall clock of `now`). Call on a
    /// new table, before any lease: offsets between the frontier and the last delayed one
    /// become available, the delayed ones wait. Past times and offsets below the frontier
    /// are ignored.
    pub fn restore_delays(
        &mut self,
        delays: impl IntoIterator<Item = (u64, u64)>,
        now: Instant,
        now_ms: u64,
        now_micros: u64,
    ) {
        let mut held: Vec<(u64, u64)> = delays
            .into_iter()
            .filter(|(o, t)| *o >= self.frontier && *t > now_ms)
            .collect();
        held.sort_unstable();
        held.dedup_by_key(|(o, _)| *o);
        let Some(&(last, _)) = held.last() else {
            return;
        };
        let from = self.next_fresh.max(self.frontier);
        self.available.extend(from..=last);
        self.next_fresh = self.next_fresh.max(last + 1);
        for (offset, not_before) in held {
            self.available.remove(&offset);
            if let Some(l) = self.inflight.remove(&offset) {
                self.deadlines.remove(&(l.deadline, offset));
            }
            self.hold(
                offset,
                now + Duration::from_millis(not_before - now_ms),
                now_micros,
            );
            self.delayed.insert(offset, not_before);
        }
        self.delayed_changed = true;
    }

    /// Holds `offset` in flight until `until` under a lease no consumer holds.
    fn hold(&mut self, offset: u64, until: Instant, now_micros: u64) {
        let nonce = self.next_nonce(now_micros);
        self.inflight.insert(
            offset,
            Lease {
                nonce,
                deadline: until,
            },
        );
        self.deadlines.insert((until, offset));
    }

    /// Forgets the delay of an offset that left `inflight`.
    fn undelay(&mut self, offset: u64) {
        if self.delayed.remove(&offset).is_some() {
            self.delayed_changed = true;
        }
    }

    /// Deliveries so far of `offset` (0 if none since it was restored or settled).
    pub fn delivery_count(&self, offset: u64) -> u32 {
        self.deliveries.get(&offset).copied().unwrap_or(0)
    }

    /// Forgets the delivery count of a settled offset.
    fn settled(&mut self, offset: u64) {
        if let Some(n) = self.deliveries.remove(&offset) {
            self.redelivered_changed |= n >= 2;
        }
    }

    /// The earliest lease deadline, to know when to look again.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Returns expired leases to `available`. Returns how many expired.
    pub fn expire(&mut self, now: Instant) -> usize {
        self.expire_with(now, None, 0, 0)
    }

    /// [`LeaseTable::expire`], with the topic's retry `backoff`: a consumer's lapsed lease is
    /// held back for the backoff of its delivery count (`now_ms`, `now_micros`: the clocks of
    /// `now`), a delay that ends makes its offset available.
    pub fn expire_with(
        &mut self,
        now: Instant,
        backoff: Option<Backoff>,
        now_ms: u64,
        now_micros: u64,
    ) -> usize {
        let mut n = 0;
        while let Some(&(deadline, offset)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            self.inflight.remove(&offset);
            let was_delayed = self.delayed.contains_key(&offset);
            self.undelay(offset);
            match backoff {
                Some(b) if !was_delayed => {
                    let wait = self.backoff_wait(offset, b);
                    self.delay(offset, wait, now, now_ms, now_micros);
                }
                _ => {
                    self.available.insert(offset);
                }
            }
            n += 1;
        }
        n
    }

    /// Skips everything below `oldest` (removed by retention): unacked ones count as dropped.
    /// Returns true when the frontier moved.
    pub fn skip_below(&mut self, oldest: u64) -> bool {
        if self.frontier >= oldest {
            return false;
        }
        let fresh_skipped = oldest.saturating_sub(self.next_fresh.max(self.frontier));
        let mut unsettled = 0u64;
        for o in self.frontier..self.next_fresh.min(oldest) {
            if !self.acked_ahead.remove(&o) {
                unsettled += 1;
            }
            self.available.remove(&o);
            if let Some(l) = self.inflight.remove(&o) {
                self.deadlines.remove(&(l.deadline, o));
            }
            self.undelay(o);
        }
        // Restored counts may lie past `next_fresh`.
        let below: Vec<u64> = self
            .deliveries
            .keys()
            .copied()
            .filter(|o| *o < oldest)
            .collect();
        for o in below {
            self.settled(o);
        }
        self.dropped += unsettled + fresh_skipped;
        self.frontier = oldest;
        self.next_fresh = self.next_fresh.max(oldest);
        self.advance_frontier();
        true
    }

    fn next_nonce(&mut self, now_micros: u64) -> u64 {
        self.last_nonce = (self.last_nonce + 1).max(now_micros);
        self.last_nonce
    }

    /// Leases the next deliverable offset below `high_watermark`, if the caps allow.
    /// `now` must have been passed to `expire` first (the caller does both under one lock).
    pub fn lease(
        &mut self,
        high_watermark: u64,
        caps: Caps,
        visibility: Duration,
        now: Instant,
        now_micros: u64,
    ) -> Option<Granted> {
        self.lease_with(high_watermark, caps, visibility, now, || now_micros)
    }

    /// [`LeaseTable::lease`], reading the wall clock (for the nonce) only when it grants one:
    /// most calls of a consumer that looks through a topic's partitions find nothing.
    pub fn lease_with(
        &mut self,
        high_watermark: u64,
        caps: Caps,
        visibility: Duration,
        now: Instant,
        now_micros: impl FnOnce() -> u64,
    ) -> Option<Granted> {
        if self.inflight.len() as u64 >= caps.max_in_flight {
            return None;
        }
        let offset = if self.acked_ahead.len() as u64 >= caps.max_acked_ahead {
            // Only the offset blocking the frontier may go out again.
            if self.available.remove(&self.frontier) {
                self.frontier
            } else {
                return None;
            }
        } else if let Some(o) = self.available.pop_first() {
            o
        } else if self.next_fresh < high_watermark
            && self.next_fresh - self.frontier <= caps.max_acked_ahead
        {
            // Fresh offsets stay within `frontier + max_acked_ahead`: an ack of any of them can
            // always be parked, so a well-behaved consumer never sees the acked-ahead 503.
            self.next_fresh += 1;
            self.next_fresh - 1
        } else {
            return None;
        };
        let nonce = self.next_nonce(now_micros());
        let deadline = now + visibility;
        self.inflight.insert(offset, Lease { nonce, deadline });
        self.deadlines.insert((deadline, offset));
        let n = self.deliveries.entry(offset).or_insert(0);
        *n = n.saturating_add(1);
        let delivery_count = *n;
        self.redelivered_changed |= delivery_count >= 2;
        Some(Granted {
            offset,
            nonce,
            delivery_count,
        })
    }

    fn check(&self, offset: u64, nonce: u64, now: Instant) -> Result<Lease, SettleError> {
        match self.inflight.get(&offset) {
            Some(l) if l.nonce == nonce && l.deadline > now => Ok(*l),
            _ => Err(SettleError::Stale),
        }
    }

    fn remove_lease(&mut self, offset: u64, lease: Lease) {
        self.inflight.remove(&offset);
        self.deadlines.remove(&(lease.deadline, offset));
        self.undelay(offset);
    }

    fn advance_frontier(&mut self) {
        while self.frontier < self.next_fresh
            && !self.inflight.contains_key(&self.frontier)
            && !self.available.contains(&self.frontier)
        {
            self.acked_ahead.remove(&self.frontier);
            self.frontier += 1;
        }
    }

    /// Acks a delivery: settled, never handed out again.
    pub fn ack(
        &mut self,
        offset: u64,
        nonce: u64,
        caps: Caps,
        now: Instant,
    ) -> Result<Settled, SettleError> {
        let lease = self.check(offset, nonce, now)?;
        if offset == self.frontier {
            self.remove_lease(offset, lease);
            self.settled(offset);
            self.advance_frontier();
            return Ok(Settled {
                frontier_moved: true,
            });
        }
        if self.acked_ahead.len() as u64 >= caps.max_acked_ahead {
            return Err(SettleError::AckedAheadFull);
        }
        self.remove_lease(offset, lease);
        self.settled(offset);
        self.acked_ahead.insert(offset);
        Ok(Settled {
            frontier_moved: false,
        })
    }

    /// Restarts the lease with a full visibility timeout from now; the handle stays valid.
    pub fn extend(
        &mut self,
        offset: u64,
        nonce: u64,
        visibility: Duration,
        now: Instant,
    ) -> Result<(), SettleError> {
        let lease = self.check(offset, nonce, now)?;
        self.deadlines.remove(&(lease.deadline, offset));
        let deadline = now + visibility;
        self.inflight.insert(offset, Lease { nonce, deadline });
        self.deadlines.insert((deadline, offset));
        Ok(())
    }

    /// Hands the delivery back: available again at once.
    pub fn nack(&mut self, offset: u64, nonce: u64, now: Instant) -> Result<(), SettleError> {
        let lease = self.check(offset, nonce, now)?;
        self.remove_lease(offset, lease);
        self.available.insert(offset);
        Ok(())
    }

    /// A plain nack under the topic's retry `backoff`: available again at once without one,
    /// else after the backoff of the offset's delivery count.
    pub fn nack_with_backoff(
        &mut self,
        offset: u64,
        nonce: u64,
        backoff: Option<Backoff>,
        now: Instant,
        now_ms: u64,
        now_micros: u64,
    ) -> Result<(), SettleError> {
        match backoff {
            None => self.nack(offset, nonce, now),
            Some(b) => {
                let wait = self.backoff_wait(offset, b);
                self.nack_delayed(offset, nonce, wait, now, now_ms, now_micros)
            }
        }
    }

    /// The wait a retry backoff gives the next delivery of `offset` (at least 1 ms).
    fn backoff_wait(&self, offset: u64, b: Backoff) -> Duration {
        Duration::from_millis(b.after(self.delivery_count(offset)).max(1))
    }

    /// Holds `offset` in flight under a lease no consumer holds until `delay` from `now`,
    /// and records the delay (persisted with the frontier).
    fn delay(&mut self, offset: u64, delay: Duration, now: Instant, now_ms: u64, now_micros: u64) {
        self.hold(offset, now + delay, now_micros);
        self.delayed
            .insert(offset, now_ms.saturating_add(delay.as_millis() as u64));
        self.delayed_changed = true;
    }

    /// Hands the delivery back to be delivered again no earlier than `delay` from now
    /// (`now_ms`: the wall clock of `now`): until then it stays in flight under a lease no
    /// consumer holds, and the handle is stale.
    pub fn nack_delayed(
        &mut self,
        offset: u64,
        nonce: u64,
        delay: Duration,
        now: Instant,
        now_ms: u64,
        now_micros: u64,
    ) -> Result<(), SettleError> {
        let lease = self.check(offset, nonce, now)?;
        self.remove_lease(offset, lease);
        self.delay(offset, delay, now, now_ms, now_micros);
        Ok(())
    }

    /// Hands back a lease whose message was never given to anyone (an answer without room
    /// for it, a read that failed, a prefetched message released unused): available again at
    /// once, and its delivery not counted.
    pub fn hand_back(&mut self, offset: u64, nonce: u64, now: Instant) -> Result<(), SettleError> {
        self.nack(offset, nonce, now)?;
        if let Some(n) = self.deliveries.get_mut(&offset) {
            self.redelivered_changed |= *n >= 2;
            *n -= 1;
            if *n == 0 {
                self.deliveries.remove(&offset);
            }
        }
        Ok(())
    }

    /// Settles an offset without a lease check (a record that cannot be read is skipped).
    pub fn settle_unreadable(&mut self, offset: u64) {
        if let Some(l) = self.inflight.remove(&offset) {
            self.deadlines.remove(&(l.deadline, offset));
        }
        self.undelay(offset);
        self.available.remove(&offset);
        self.settled(offset);
        if offset >= self.frontier && offset < self.next_fresh {
            self.acked_ahead.insert(offset);
            self.advance_frontier();
        }
    }

    /// Moves the frontier to `to` (a purge or a seek, SPEC (ext) §3.8): every offset below it
    /// is settled, every one at or above it unsettled and never delivered. Leases outstanding
    /// are void (their settles answer 410) and delivery counts are forgotten. Returns the
    /// previous frontier.
    pub fn reposition(&mut self, to: u64) -> u64 {
        let previous = self.frontier;
        self.inflight.clear();
        self.deadlines.clear();
        self.available.clear();
        self.acked_ahead.clear();
        self.redelivered_changed |= self.deliveries.values().any(|n| *n >= 2);
        self.deliveries.clear();
        self.delayed_changed |= !self.delayed.is_empty();
        self.delayed.clear();
        self.frontier = to;
        self.next_fresh = to;
        previous
    }

    /// Messages at or above the frontier that are not settled yet (for `consumer_lag`).
    pub fn lag(&self, high_watermark: u64) -> u64 {
        high_watermark
            .saturating_sub(self.frontier)
            .saturating_sub(self.acked_ahead.len() as u64)
    }
}

/// The persisted delays ([`LeaseTable::delays`]): `n` as u32, then `n` times (offset u64,
/// not-before Unix ms u64), then the CRC-32C of everything before it; little-endian.
pub fn encode_delays(delays: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + delays.len() * 16);
    b.extend_from_slice(&(delays.len() as u32).to_le_bytes());
    for (o, t) in delays {
        b.extend_from_slice(&o.to_le_bytes());
        b.extend_from_slice(&t.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Reads [`encode_delays`]' bytes; `None` when they are damaged.
pub fn decode_delays(b: &[u8]) -> Option<Vec<(u64, u64)>> {
    let n = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
    let body = 4usize.checked_add(n.checked_mul(16)?)?;
    if b.len() != body.checked_add(4)? {
        return None;
    }
    let crc = u32::from_le_bytes(b[body..].try_into().ok()?);
    if crc32c::crc32c(&b[..body]) != crc {
        return None;
    }
    Some(
        b[4..body]
            .chunks_exact(16)
            .map(|c| {
                (
                    u64::from_le_bytes(c[..8].try_into().unwrap()),
                    u64::from_le_bytes(c[8..].try_into().unwrap()),
                )
            })
            .collect(),
    )
}

/// The persisted delivery counts ([`LeaseTable::redelivered`]): `n` as u32, then `n` times
/// (offset u64, count u32), then the CRC-32C of everything before it; little-endian.
pub fn encode_deliveries(counts: &[(u64, u32)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + counts.len() * 12);
    b.extend_from_slice(&(counts.len() as u32).to_le_bytes());
    for (offset, n) in counts {
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Reads [`encode_deliveries`]' bytes; `None` unless they are exactly that (the length
/// must match the count before anything is allocated, and the CRC must hold).
pub fn decode_deliveries(b: &[u8]) -> Option<Vec<(u64, u32)>> {
    let n = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
    let body = n.checked_mul(12)?.checked_add(4)?;
    if b.len() != body.checked_add(4)? {
        return None;
    }
    let crc = u32::from_le_bytes(b[body..].try_into().ok()?);
    if crc32c::crc32c(&b[..body]) != crc {
        return None;
    }
    Some(
        b[4..body]
            .chunks_exact(12)
            .map(|c| {
                (
                    u64::from_le_bytes(c[..8].try_into().unwrap()),
                    u32::from_le_bytes(c[8..].try_into().unwrap()),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const VIS: Duration = Duration::from_secs(30);
    const CAPS: Caps = Caps {
        max_in_flight: 1024,
        max_acked_ahead: 1024,
    };

    fn lease(t: &mut LeaseTable, hwm: u64, now: Instant) -> Option<Granted> {
        t.expire(now);
        t.lease(hwm, CAPS, VIS, now, 0)
    }

    #[test]
    fn leases_in_order_and_acks_advance_frontier() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 100);
        let a = lease(&mut t, 3, now).unwrap();
        let b = lease(&mut t, 3, now).unwrap();
        let c = lease(&mut t, 3, now).unwrap();
        assert_eq!((a.offset, b.offset, c.offset), (0, 1, 2));
        assert!(
            lease(&mut t, 3, now).is_none(),
            "nothing past the high watermark"
        );
        assert!(a.nonce < b.nonce && b.nonce < c.nonce);
        assert_eq!(
            t.ack(b.offset, b.nonce, CAPS, now),
            Ok(Settled {
                frontier_moved: false
            })
        );
        assert_eq!(t.frontier(), 0);
        assert_eq!(
            t.ack(a.offset, a.nonce, CAPS, now),
            Ok(Settled {
                frontier_moved: true
            })
        );
        assert_eq!(
            t.frontier(),
            2,
            "acked-ahead offset 1 is folded into the frontier"
        );
        assert_eq!(
            t.ack(c.offset, c.nonce, CAPS, now),
            Ok(Settled {
                frontier_moved: true
            })
        );
        assert_eq!(t.frontier(), 3);
        assert_eq!(t.acked_ahead_len(), 0);
        assert_eq!(
            t.ack(c.offset, c.nonce, CAPS, now),
            Err(SettleError::Stale),
            "second ack is stale"
        );
    }

    #[test]
    fn expiry_redelivers_with_new_nonce_and_old_handle_is_stale() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let a = t.lease(1, CAPS, Duration::from_secs(1), now, 0).unwrap();
        let later = now + Duration::from_secs(2);
        assert_eq!(t.expire(later), 1);
        let b = t.lease(1, CAPS, VIS, later, 0).unwrap();
        assert_eq!(b.offset, a.offset);
        assert_ne!(b.nonce, a.nonce);
        assert_eq!(
            t.ack(a.offset, a.nonce, CAPS, later),
            Err(SettleError::Stale)
        );
        assert!(t.ack(b.offset, b.nonce, CAPS, later).is_ok());
    }

    #[test]
    fn a_lapsed_lease_is_stale_even_before_the_sweep() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let a = t.lease(1, CAPS, Duration::from_secs(1), now, 0).unwrap();
        let later = now + Duration::from_secs(1);
        assert_eq!(
            t.ack(a.offset, a.nonce, CAPS, later),
            Err(SettleError::Stale)
        );
        assert_eq!(
            t.extend(a.offset, a.nonce, VIS, later),
            Err(SettleError::Stale)
        );
        assert_eq!(t.nack(a.offset, a.nonce, later), Err(SettleError::Stale));
    }

    #[test]
    fn extend_outlives_the_original_timeout() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let vis = Duration::from_secs(10);
        let a = t.lease(1, CAPS, vis, now, 0).unwrap();
        let t1 = now + Duration::from_secs(8);
        t.extend(a.offset, a.nonce, vis, t1).unwrap();
        let t2 = now + Duration::from_secs(15);
        assert_eq!(t.expire(t2), 0);
        assert!(t.lease(1, CAPS, vis, t2, 0).is_none());
        assert!(t.ack(a.offset, a.nonce, CAPS, t2).is_ok());
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn nack_makes_it_available_at_once() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let a = lease(&mut t, 2, now).unwrap();
        t.nack(a.offset, a.nonce, now).unwrap();
        let b = lease(&mut t, 2, now).unwrap();
        assert_eq!(b.offset, 0, "the nacked offset comes before fresh ones");
        assert_eq!(t.nack(a.offset, a.nonce, now), Err(SettleError::Stale));
    }

    #[test]
    fn in_flight_cap() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let caps = Caps {
            max_in_flight: 2,
            max_acked_ahead: 10,
        };
        let a = t.lease(10, caps, VIS, now, 0).unwrap();
        t.lease(10, caps, VIS, now, 0).unwrap();
        assert!(t.lease(10, caps, VIS, now, 0).is_none());
        t.ack(a.offset, a.nonce, caps, now).unwrap();
        assert!(t.lease(10, caps, VIS, now, 0).is_some());
    }

    #[test]
    fn fresh_leases_stay_within_the_acked_ahead_window() {
        let now = Instant::now();
        let caps = Caps {
            max_in_flight: 100,
            max_acked_ahead: 2,
        };
        let mut t = LeaseTable::new(0, 0);
        let d: Vec<_> = (0..3)
            .map(|_| t.lease(10, caps, VIS, now, 0).unwrap())
            .collect();
        assert!(
            t.lease(10, caps, VIS, now, 0).is_none(),
            "offset 3 is beyond frontier + cap"
        );
        t.ack(d[1].offset, d[1].nonce, caps, now).unwrap();
        t.ack(d[2].offset, d[2].nonce, caps, now).unwrap();
        assert_eq!(t.acked_ahead_len(), 2);
        // The blocker expires and is the only one re-offered.
        let later = now + VIS + Duration::from_secs(1);
        t.expire(later);
        let again = t.lease(10, caps, VIS, later, 0).unwrap();
        assert_eq!(again.offset, 0);
        assert!(t.lease(10, caps, VIS, later, 0).is_none());
        t.ack(again.offset, again.nonce, caps, later).unwrap();
        assert_eq!(t.frontier(), 3);
        assert_eq!(t.lease(10, caps, VIS, later, 0).unwrap().offset, 3);
    }

    #[test]
    fn a_lowered_cap_refuses_acks_that_cannot_be_parked() {
        let now = Instant::now();
        let wide = Caps {
            max_in_flight: 100,
            max_acked_ahead: 10,
        };
        let mut t = LeaseTable::new(0, 0);
        let d: Vec<_> = (0..4)
            .map(|_| t.lease(10, wide, VIS, now, 0).unwrap())
            .collect();
        let narrow = Caps {
            max_in_flight: 100,
            max_acked_ahead: 2,
        };
        t.ack(d[1].offset, d[1].nonce, narrow, now).unwrap();
        t.ack(d[2].offset, d[2].nonce, narrow, now).unwrap();
        assert_eq!(
            t.ack(d[3].offset, d[3].nonce, narrow, now),
            Err(SettleError::AckedAheadFull)
        );
        assert!(
            t.lease(10, narrow, VIS, now, 0).is_none(),
            "no fresh offsets while full"
        );
        t.ack(d[0].offset, d[0].nonce, narrow, now).unwrap();
        assert_eq!(t.frontier(), 3);
        t.ack(d[3].offset, d[3].nonce, narrow, now).unwrap();
        assert_eq!(t.frontier(), 4);
    }

    #[test]
    fn nonces_follow_the_clock_and_never_repeat() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 1_000);
        let a = t.lease(5, CAPS, VIS, now, 500).unwrap();
        let b = t.lease(5, CAPS, VIS, now, 5_000).unwrap();
        let c = t.lease(5, CAPS, VIS, now, 4_000).unwrap();
        assert_eq!(a.nonce, 1_001);
        assert_eq!(b.nonce, 5_000);
        assert_eq!(c.nonce, 5_001);
    }

    #[test]
    fn retention_skip_counts_unacked_and_keeps_state_consistent() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let d: Vec<_> = (0..4).map(|_| lease(&mut t, 10, now).unwrap()).collect();
        t.ack(d[1].offset, d[1].nonce, CAPS, now).unwrap();
        // Offsets 0..6 removed: 0, 2, 3 were leased and unacked, 4 and 5 never leased.
        assert!(t.skip_below(6));
        assert_eq!(t.dropped, 5);
        assert_eq!(t.frontier(), 6);
        assert_eq!(t.inflight_len(), 0);
        assert_eq!(t.next_deadline(), None);
        assert_eq!(lease(&mut t, 10, now).unwrap().offset, 6);
        assert_eq!(
            t.ack(d[2].offset, d[2].nonce, CAPS, now),
            Err(SettleError::Stale)
        );
    }

    #[test]
    fn unreadable_records_are_settled() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let a = lease(&mut t, 3, now).unwrap();
        t.settle_unreadable(a.offset);
        assert_eq!(t.frontier(), 1);
        assert_eq!(lease(&mut t, 3, now).unwrap().offset, 1);
    }

    #[test]
    fn lag_excludes_acked_ahead() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        lease(&mut t, 5, now).unwrap();
        let b = lease(&mut t, 5, now).unwrap();
        t.ack(b.offset, b.nonce, CAPS, now).unwrap();
        assert_eq!(t.lag(5), 4);
    }

    #[test]
    fn a_delayed_nack_holds_the_offset_in_flight_until_its_time() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 1);
        let a = lease(&mut t, 3, now).unwrap();
        let delay = Duration::from_secs(30);
        t.nack_delayed(a.offset, a.nonce, delay, now, 1_000_000, 0)
            .unwrap();
        // The handle is spent; the offset is in flight but nobody's.
        assert_eq!(
            t.nack_delayed(a.offset, a.nonce, delay, now, 1_000_000, 0),
            Err(SettleError::Stale)
        );
        assert_eq!(t.ack(a.offset, a.nonce, CAPS, now), Err(SettleError::Stale));
        assert_eq!(t.inflight_len(), 1);
        assert_eq!(t.delays(), Some(vec![(0, 1_030_000)]));
        assert_eq!(t.delays(), None);
        // Others go out meanwhile; offset 0 only once its time has come.
        let b = lease(&mut t, 3, now + Duration::from_secs(29)).unwrap();
        assert_eq!(b.offset, 1);
        let c = lease(&mut t, 3, now + delay).unwrap();
        assert_eq!((c.offset, c.delivery_count), (0, 2));
        assert_eq!(t.delays(), Some(vec![]));
        // A delayed offset the frontier passes (a purge) is forgotten.
        t.nack_delayed(c.offset, c.nonce, delay, now + delay, 1_030_000, 0)
            .unwrap();
        assert!(t.delays().is_some());
        t.reposition(3);
        assert_eq!(t.delays(), Some(vec![]));
    }

    #[test]
    fn with_a_backoff_a_lapsed_lease_waits_twice_as_long_each_time_up_to_the_max() {
        let b = Backoff {
            min_ms: 1_000,
            max_ms: 4_000,
        };
        let t0 = Instant::now();
        let mut t = LeaseTable::new(0, 1);
        let lease_at = |t: &mut LeaseTable, at: Instant| {
            t.expire_with(at, Some(b), 0, 0);
            t.lease(1, CAPS, VIS, at, 0)
        };
        let mut at = t0;
        let mut waits = Vec::new();
        for delivery in 1..=5u32 {
            let g = lease_at(&mut t, at).expect("due");
            assert_eq!((g.offset, g.delivery_count), (0, delivery));
            // The lease lapses; the redelivery waits the backoff of this delivery count.
            at += VIS;
            assert_eq!(lease_at(&mut t, at), None);
            let wait = b.after(delivery);
            waits.push(wait);
            assert_eq!(t.delays(), Some(vec![(0, wait)]));
            assert_eq!(lease_at(&mut t, at + Duration::from_millis(wait - 1)), None);
            at += Duration::from_millis(wait);
        }
        assert_eq!(waits, [1_000, 2_000, 4_000, 4_000, 4_000]);
        // A delay that ends does not add a backoff of its own.
        assert!(lease_at(&mut t, at).is_some());
    }

    #[test]
    fn restored_delays_hold_their_offsets_and_free_the_ones_before() {
        let now = Instant::now();
        let mut t = LeaseTable::new(2, 1);
        // Offset 5 delayed 10 s more, 7 already due, 1 below the frontier.
        t.restore_delays([(5, 11_000), (7, 100), (1, 50_000)], now, 1_000, 0);
        assert_eq!(t.delays(), Some(vec![(5, 11_000)]));
        let got: Vec<u64> = (0..10)
            .filter_map(|_| lease(&mut t, 10, now))
            .map(|g| g.offset)
            .collect();
        assert_eq!(got, [2, 3, 4, 6, 7, 8, 9]);
        let g = lease(&mut t, 10, now + Duration::from_secs(10)).unwrap();
        assert_eq!(g.offset, 5);
        // Nothing else is held: restoring nothing changes nothing.
        let mut fresh = LeaseTable::new(0, 1);
        fresh.restore_delays([], now, 0, 0);
        assert_eq!(fresh.delays(), None);
        assert_eq!(lease(&mut fresh, 1, now).unwrap().offset, 0);
    }

    #[test]
    fn reposition_voids_leases_and_restarts_delivery_at_the_new_frontier() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 1);
        let a = lease(&mut t, 10, now).unwrap();
        let b = lease(&mut t, 10, now).unwrap();
        t.nack(b.offset, b.nonce, now).unwrap();
        let b = lease(&mut t, 10, now).unwrap();
        assert_eq!(b.delivery_count, 2);
        let c = lease(&mut t, 10, now).unwrap();
        t.ack(c.offset, c.nonce, CAPS, now).unwrap();
        assert!(t.redelivered().is_some());

        // Forward (a purge): everything below 10 is settled; old handles are stale.
        assert_eq!(t.reposition(10), 0);
        assert_eq!(t.frontier(), 10);
        assert_eq!(
            (t.inflight_len(), t.acked_ahead_len(), t.lag(10)),
            (0, 0, 0)
        );
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.ack(a.offset, a.nonce, CAPS, now), Err(SettleError::Stale));
        assert_eq!(lease(&mut t, 10, now), None);
        // The forgotten count of 2 is persisted (as none).
        assert_eq!(t.redelivered(), Some(vec![]));

        // Back (a seek): offsets from 3 are delivered again, each as a first delivery.
        assert_eq!(t.reposition(3), 10);
        assert_eq!(t.lag(10), 7);
        let again = lease(&mut t, 10, now).unwrap();
        assert_eq!((again.offset, again.delivery_count), (3, 1));
        assert!(again.nonce > c.nonce);
        t.ack(again.offset, again.nonce, CAPS, now).unwrap();
        assert_eq!(t.frontier(), 4);
    }

    #[test]
    fn each_delivery_is_counted_and_a_settled_offset_forgets_its_count() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let a = lease(&mut t, 2, now).unwrap();
        assert_eq!((a.offset, a.delivery_count), (0, 1));
        // A nack, then an expiry: each redelivery counts one more; an extend counts none.
        t.nack(a.offset, a.nonce, now).unwrap();
        let a = lease(&mut t, 2, now).unwrap();
        assert_eq!((a.offset, a.delivery_count), (0, 2));
        t.extend(a.offset, a.nonce, VIS, now).unwrap();
        let later = now + VIS * 2;
        let a = lease(&mut t, 2, later).unwrap();
        assert_eq!((a.offset, a.delivery_count), (0, 3));
        let b = lease(&mut t, 2, later).unwrap();
        assert_eq!((b.offset, b.delivery_count), (1, 1));
        // Acked (at the frontier, and ahead of it): forgotten.
        t.ack(b.offset, b.nonce, CAPS, later).unwrap();
        assert_eq!(t.delivery_count(1), 0);
        t.ack(a.offset, a.nonce, CAPS, later).unwrap();
        assert_eq!(t.delivery_count(0), 0);
        assert_eq!(t.frontier(), 2);
    }

    #[test]
    fn a_lease_handed_back_unsent_is_not_counted() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let a = lease(&mut t, 1, now).unwrap();
        t.hand_back(a.offset, a.nonce, now).unwrap();
        assert_eq!(t.delivery_count(0), 0);
        let a = lease(&mut t, 1, now).unwrap();
        assert_eq!(
            a.delivery_count, 1,
            "the handed-back lease was never delivered"
        );
        t.nack(a.offset, a.nonce, now).unwrap();
        let a = lease(&mut t, 1, now).unwrap();
        t.hand_back(a.offset, a.nonce, now).unwrap();
        assert_eq!(t.delivery_count(0), 1);
        // A stale handle hands nothing back.
        assert_eq!(t.hand_back(a.offset, a.nonce, now), Err(SettleError::Stale));
        assert_eq!(t.delivery_count(0), 1);
    }

    #[test]
    fn counts_of_two_or_more_are_reported_for_persistence_when_they_change() {
        let now = Instant::now();
        let mut t = LeaseTable::new(0, 0);
        let a = lease(&mut t, 3, now).unwrap();
        let b = lease(&mut t, 3, now).unwrap();
        // First deliveries are not worth a write.
        assert_eq!(t.redelivered(), None);
        t.nack(b.offset, b.nonce, now).unwrap();
        let b = lease(&mut t, 3, now).unwrap();
        assert_eq!(t.redelivered(), Some(vec![(1, 2)]));
        assert_eq!(t.redelivered(), None, "nothing changed since");
        // A failed save is reported again.
        t.nack(b.offset, b.nonce, now).unwrap();
        let b = lease(&mut t, 3, now).unwrap();
        assert_eq!(t.redelivered(), Some(vec![(1, 3)]));
        t.redelivered_unsaved();
        assert_eq!(t.redelivered(), Some(vec![(1, 3)]));
        // Settling a counted offset changes the set; settling a first delivery does not.
        t.ack(a.offset, a.nonce, CAPS, now).unwrap();
        assert_eq!(t.redelivered(), None);
        t.ack(b.offset, b.nonce, CAPS, now).unwrap();
        assert_eq!(t.redelivered(), Some(vec![]));
    }

    #[test]
    fn restored_counts_continue_at_or_above_the_frontier_and_retention_forgets_them() {
        let now = Instant::now();
        let mut t = LeaseTable::new(5, 0);
        t.restore_deliveries([(3, 7), (5, 4), (8, 2), (9, 0)]);
        assert_eq!(t.delivery_count(3), 0, "below the frontier: settled");
        assert_eq!(t.delivery_count(9), 0);
        let a = lease(&mut t, 10, now).unwrap();
        assert_eq!((a.offset, a.delivery_count), (5, 5));
        assert_eq!(lease(&mut t, 10, now).unwrap().delivery_count, 1);
        assert_eq!(t.redelivered(), Some(vec![(5, 5), (8, 2)]));
        // Retention past offset 8 forgets both, including the one never leased again.
        assert!(t.skip_below(9));
        assert_eq!(t.redelivered(), Some(vec![]));
        assert_eq!(t.delivery_count(8), 0);
    }

    #[test]
    fn persisted_counts_round_trip_and_damage_is_refused() {
        let counts = vec![(0, 2), (u64::MAX, u32::MAX), (42, 3)];
        let b = encode_deliveries(&counts);
        assert_eq!(decode_deliveries(&b), Some(counts));
        assert_eq!(decode_deliveries(&encode_deliveries(&[])), Some(vec![]));
        for cut in 0..b.len() {
            assert_eq!(decode_deliveries(&b[..cut]), None, "cut at {cut}");
        }
        let mut flipped = b.clone();
        flipped[9] ^= 1;
        assert_eq!(decode_deliveries(&flipped), None);
        // A count that claims more entries than the bytes hold allocates nothing.
        let mut huge = b.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_deliveries(&huge), None);
    }

    mod prop {
        use super::super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn prop_deliveries_roundtrip(counts in vec((any::<u64>(), any::<u32>()), 0..64)) {
                prop_assert_eq!(decode_deliveries(&encode_deliveries(&counts)), Some(counts));
            }

            #[test]
            fn prop_deliveries_decode_arbitrary_bytes(b in vec(any::<u8>(), 0..256)) {
                if let Some(v) = decode_deliveries(&b) {
                    prop_assert_eq!(encode_deliveries(&v), b);
                }
            }

            #[test]
            fn prop_deliveries_bit_flips_are_caught(
                counts in vec((any::<u64>(), any::<u32>()), 0..16),
                bit in any::<usize>(),
            ) {
                let mut b = encode_deliveries(&counts);
                let i = bit % (b.len() * 8);
                b[i / 8] ^= 1 << (i % 8);
                prop_assert_eq!(decode_deliveries(&b), None);
            }

            #[test]
            fn prop_delays_roundtrip(delays in vec((any::<u64>(), any::<u64>()), 0..64)) {
                prop_assert_eq!(decode_delays(&encode_delays(&delays)), Some(delays));
            }

            #[test]
            fn prop_delays_decode_arbitrary_bytes(b in vec(any::<u8>(), 0..256)) {
                if let Some(d) = decode_delays(&b) {
                    prop_assert_eq!(encode_delays(&d), b);
                }
            }

            #[test]
            fn prop_delays_bit_flips_are_caught(
                delays in vec((any::<u64>(), any::<u64>()), 0..16),
                bit in any::<usize>(),
            ) {
                let mut b = encode_delays(&delays);
                let i = bit % (b.len() * 8);
                b[i / 8] ^= 1 << (i % 8);
                prop_assert_eq!(decode_delays(&b), None);
            }
        }
    }
}
