//! The pure rules of fan-out: which child partition a copy goes to, and when a delayed copy
//! is due (SPEC §5.1, §5.3).

use std::time::Duration;

use narad_storage::StoredRecord;

use crate::partitioner::key_partition;

/// SPEC §5.1: a keyed record hashes (FNV-1a-32) with the child's partition count; an unkeyed
/// one goes to (parent partition index mod child partition count) **(ext)**.
pub fn child_partition(key: Option<&[u8]>, parent_index: u32, child_partitions: u32) -> u32 {
    let n = child_partitions.max(1);
    match key {
        Some(k) if !k.is_empty() => key_partition(k, n),
        _ => parent_index % n,
    }
}

/// What a cursor at parent offset `pos` does next, given the parent partition's oldest
/// retained offset and its high watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorStep {
    /// Retention removed `lost` records the cursor had not copied: it moves on to `to` (and
    /// counts them as dropped).
    Skip { to: u64, lost: u64 },
    /// Everything committed is copied: wait for the next parent commit.
    CaughtUp,
    /// `available` committed records wait to be copied; `linger` when they are fewer than
    /// a batch and a linger is configured (wait to fill it first).
    Copy { available: u64, linger: bool },
}

/// The cursor loop's decision before it reads (the delay check, which needs the head
/// record's commit time, comes after a `Copy`).
pub fn cursor_step(pos: u64, oldest: u64, hwm: u64, batch: usize, linger: bool) -> CursorStep {
    if pos < oldest {
        return CursorStep::Skip {
            to: oldest,
            lost: oldest - pos,
        };
    }
    if pos >= hwm {
        return CursorStep::CaughtUp;
    }
    let available = hwm - pos;
    CursorStep::Copy {
        available,
        linger: linger && available < batch as u64,
    }
}

/// When the copy of a record committed at `commit_ms` (parent owner's clock) may be committed
/// to a child with `delay_ms`.
pub fn due_ms(commit_ms: u64, delay_ms: u64) -> u64 {
    commit_ms.saturating_add(delay_ms)
}

/// How many leading records are due at `now_ms`. Commit times are monotonic per partition,
/// so the due records are always a prefix; the rest are never copied early.
pub fn due_prefix(records: &[StoredRecord], delay_ms: u64, now_ms: u64) -> usize {
    records.partition_point(|r| due_ms(r.timestamp_ms, delay_ms) <= now_ms)
}

/// How long an idle delay cursor whose head is due at `due_ms` sleeps: until then, but at
/// most `max` (it wakes at least that often to notice detaches, clock jumps and retention).
pub fn sleep_until_due(due_ms: u64, now_ms: u64, max: Duration) -> Duration {
    Duration::from_millis(due_ms.saturating_sub(now_ms)).min(max)
}

/// Seconds the oldest uncopied record has been due (0 when none is due yet).
pub fn due_lag_seconds(head_commit_ms: u64, delay_ms: u64, now_ms: u64) -> f64 {
    now_ms.saturating_sub(due_ms(head_commit_ms, delay_ms)) as f64 / 1000.0
}

/// How many records a delay cursor asks for next: doubling while whole reads were due,
/// halving when only part was (so a wide backlog that trickles due costs small reads).
pub fn next_chunk(chunk: usize, read: usize, due: usize, min: usize, max: usize) -> usize {
    if read > 0 && due == read && read >= chunk {
        (chunk * 2).clamp(min, max)
    } else if due < read {
        (chunk / 2).clamp(min, max)
    } else {
        chunk.clamp(min, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_skips_what_retention_removed_waits_when_caught_up_and_lingers_for_a_batch() {
        // Retention passed the cursor: skip to the oldest record, counting the loss.
        assert_eq!(
            cursor_step(3, 10, 20, 64, true),
            CursorStep::Skip { to: 10, lost: 7 }
        );
        // Caught up (and never past the high watermark).
        assert_eq!(cursor_step(20, 10, 20, 64, true), CursorStep::CaughtUp);
        assert_eq!(cursor_step(25, 10, 20, 64, true), CursorStep::CaughtUp);
        // Fewer than a batch: linger first, if configured.
        assert_eq!(
            cursor_step(15, 10, 20, 64, true),
            CursorStep::Copy {
                available: 5,
                linger: true
            }
        );
        assert_eq!(
            cursor_step(15, 10, 20, 64, false),
            CursorStep::Copy {
                available: 5,
                linger: false
            }
        );
        // A full batch waiting: copy at once.
        assert_eq!(
            cursor_step(0, 0, 64, 64, true),
            CursorStep::Copy {
                available: 64,
                linger: false
            }
        );
    }
    use bytes::Bytes;

    fn rec(offset: u64, ts: u64) -> StoredRecord {
        StoredRecord {
            offset,
            timestamp_ms: ts,
            key: None,
            payload: Bytes::from_static(b"x"),
            attrs: None,
        }
    }

    #[test]
    fn keyed_records_rehash_with_the_child_count() {
        // SPEC §2.3 vectors: "customer-42" → 0xfe68adbe, partition 1 of 3.
        assert_eq!(child_partition(Some(b"customer-42"), 0, 3), 1);
        assert_eq!(
            child_partition(Some(b"customer-42"), 2, 7),
            0xfe68adbe % 7,
            "the parent partition does not matter for keyed records"
        );
        assert_eq!(child_partition(Some(b"a"), 5, 10), 0xe40c292c % 10);
    }

    #[test]
    fn unkeyed_records_follow_the_parent_index() {
        assert_eq!(child_partition(None, 4, 3), 1);
        assert_eq!(child_partition(None, 2, 6), 2);
        assert_eq!(
            child_partition(Some(b""), 7, 5),
            2,
            "an empty key is no key"
        );
        assert_eq!(child_partition(None, 3, 0), 0, "never divides by zero");
    }

    #[test]
    fn due_prefix_is_never_early() {
        let recs = [rec(0, 1000), rec(1, 1000), rec(2, 1500), rec(3, 2000)];
        assert_eq!(due_prefix(&recs, 500, 1499), 0);
        assert_eq!(
            due_prefix(&recs, 500, 1500),
            2,
            "due exactly at commit + delay"
        );
        assert_eq!(due_prefix(&recs, 500, 1999), 2);
        assert_eq!(due_prefix(&recs, 500, 2000), 3);
        assert_eq!(due_prefix(&recs, 500, 10_000), 4);
        assert_eq!(due_prefix(&recs, 0, 1000), 2, "no delay: due at commit");
        assert_eq!(due_prefix(&[], 5, 5), 0);
        assert_eq!(due_ms(u64::MAX - 1, 10), u64::MAX, "saturates");
    }

    #[test]
    fn idle_sleep_is_bounded() {
        let max = Duration::from_secs(30);
        assert_eq!(sleep_until_due(5_000, 1_000, max), Duration::from_secs(4));
        assert_eq!(sleep_until_due(3_600_000, 0, max), max);
        assert_eq!(sleep_until_due(1_000, 5_000, max), Duration::ZERO);
        assert_eq!(due_lag_seconds(1_000, 500, 3_500), 2.0);
        assert_eq!(due_lag_seconds(1_000, 500, 1_000), 0.0);
    }

    #[test]
    fn chunk_adapts() {
        assert_eq!(next_chunk(64, 64, 64, 64, 4096), 128);
        assert_eq!(next_chunk(4096, 4096, 4096, 64, 4096), 4096);
        assert_eq!(next_chunk(256, 256, 10, 64, 4096), 128);
        assert_eq!(next_chunk(64, 64, 0, 64, 4096), 64);
        assert_eq!(
            next_chunk(256, 30, 30, 64, 4096),
            256,
            "a short read (the tail) keeps the size"
        );
    }
}
