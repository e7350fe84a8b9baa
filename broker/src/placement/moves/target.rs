//! The target's side of a move (SPEC §6.5) as decisions apart from I/O.
//!
//! [`CopyIn`] is the retry loop's state (what the copy holds, since when the source is dead)
//! and its one transition, [`CopyIn::next`]: from how the last step ended and what the loop
//! read of the cluster right after it, the next [`Action`] (attempt, start over from an empty
//! copy, wait, force-promote, finish, abandon). It reads no clock and does no I/O, so every
//! rule of the loop has a unit test here.
//!
//! [`TargetIo`] is everything the target asks of the world: the source's listing, chunks and
//! freeze (node RPC), whether the move is still in flight, the source's health, the flip,
//! and time. `Moves` implements it over the cluster and the metadata; the tests of
//! `moves::fake_peer` implement it with a source partition log in a temporary directory,
//! scripted to fail.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_meta::{MetaCommand, MetaState};

use crate::cluster::calls::Call;
use crate::cluster::wire::SegmentList;
use crate::error::ApiResult;

/// How long the target waits after a failed attempt (or force promotion) before the next.
pub(super) const RETRY: Duration = Duration::from_secs(1);

/// How an attempt or a force promotion ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The flip is applied: the partition is this node's.
    Completed,
    /// The move is no longer in flight (aborted, topic gone, another owner), or the leader
    /// refused its flip.
    Abandoned,
}

/// The source of a move as the target finds it after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SourceHealth {
    /// Alive in the metadata and answering: its refusal had a reason (start over).
    Answering,
    /// Alive in the metadata but not answering: it may be dying (keep what is copied).
    Unreachable,
    /// Marked dead in the metadata (not probed): keep the copy, and once it stayed dead long
    /// enough, force-promote it.
    Dead,
}

/// What the loop reports to [`CopyIn::next`]: how its last action ended, with the facts the
/// next decision needs, read right after it. Only those: the source's health (a ping) is
/// read only after a failed attempt, as it always was.
#[derive(Debug)]
pub(super) enum Step {
    /// Before an attempt (the first one, or after a wait).
    Ready {
        shutting_down: bool,
        in_flight: bool,
    },
    /// [`Action::Attempt`] ended.
    Attempted(Outcome),
    /// [`Action::Attempt`] failed; the source as found right after, at `now`.
    Failed { source: SourceHealth, now: Instant },
    /// [`Action::StartOver`] removed the staged copy.
    Cleared,
    /// [`Action::ForcePromote`] of the listing at `high_watermark` ended; `None`: it failed.
    Promoted {
        high_watermark: u64,
        outcome: Option<Outcome>,
    },
}

/// What the target does next.
#[derive(Debug)]
pub(super) enum Action {
    /// One try: pre-copy, handoff, tail, verify, install, flip.
    Attempt,
    /// Remove the staged copy (the progress is already reset), then report [`Step::Cleared`].
    StartOver,
    /// Promote the staged copy of this listing (`ForceCompleteMove`): the source stayed dead
    /// and the copy holds everything it ever listed.
    ForcePromote(SegmentList),
    /// Wait this long (less if the node starts shutting down), then report [`Step::Ready`].
    Wait(Duration),
    /// The move is done here; count it under its outcome.
    Done(Finished),
    /// Stop without an outcome.
    Abandon(Why),
}

/// How a move ended on its target (`narad_moves_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finished {
    /// The handoff's exact copy was flipped to (`CompleteMove`).
    Completed,
    /// The source stayed dead: the copy of its listing at `high_watermark` was promoted
    /// (`ForceCompleteMove`).
    ForcePromoted { high_watermark: u64 },
}

impl Finished {
    /// The `outcome` label of `narad_moves_total`.
    pub(super) fn label(self) -> &'static str {
        match self {
            Finished::Completed => "completed",
            Finished::ForcePromoted { .. } => "force_promoted",
        }
    }
}

/// Why the target stops without an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// The node is shutting down (a restart finds the move in flight and starts afresh).
    ShuttingDown,
    /// The loop found the move no longer in flight (aborted, superseded, topic gone).
    NotInFlight,
    /// An attempt or a force promotion ended as [`Outcome::Abandoned`] (and said why).
    AttemptAbandoned,
}

/// What a target knows of its copy across attempts.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// The last listing of the source that the staged copy holds completely (it may hold
    /// more: a later round that failed part-way).
    synced: Option<SegmentList>,
    /// The highest high watermark the source ever listed (or froze at).
    last_known_hwm: u64,
}

impl Progress {
    /// The source listed, or froze at, `high_watermark`.
    pub(super) fn listed(&mut self, high_watermark: u64) {
        self.last_known_hwm = self.last_known_hwm.max(high_watermark);
    }

    /// The staged copy now holds every file of `list` at its listed size.
    pub(super) fn synced(&mut self, list: SegmentList) {
        self.synced = Some(list);
    }

    /// The listing a force promotion may install: one that reached the source's last known
    /// high watermark (SPEC §6.5); otherwise the move waits for the source.
    pub(super) fn promotable(&self) -> Option<&SegmentList> {
        self.synced
            .as_ref()
            .filter(|l| l.high_watermark >= self.last_known_hwm)
    }
}

/// The target's retry loop for one move, as state and one transition ([`CopyIn::next`]):
///
/// | step | the state becomes | action |
/// |---|---|---|
/// | `Ready`, shutting down | | `Abandon(ShuttingDown)` |
/// | `Ready`, not in flight | | `Abandon(NotInFlight)` |
/// | `Ready` | | `Attempt` |
/// | `Attempted(Completed)` | | `Done(Completed)` |
/// | `Attempted(Abandoned)`, `Promoted(Abandoned)` | | `Abandon(AttemptAbandoned)` |
/// | `Failed`, source answering | empty progress, not dead | `StartOver` |
/// | `Cleared` | | `Wait(RETRY)` |
/// | `Failed`, source alive, unreachable | not dead (progress kept) | `Wait(RETRY)` |
/// | `Failed`, source dead | dead since the first such `now` | `ForcePromote(listing)` once dead for `force_promote_after` with a promotable listing, else `Wait(RETRY)` |
/// | `Promoted(Completed)` | | `Done(ForcePromoted)` |
/// | `Promoted` failed | | `Wait(RETRY)` |
#[derive(Debug)]
pub(super) struct CopyIn {
    progress: Progress,
    /// When the source was first found dead after a failure (reset when found alive).
    dead_since: Option<Instant>,
    /// See `Moves::force_promote_after`.
    force_promote_after: Duration,
}

impl CopyIn {
    pub(super) fn new(force_promote_after: Duration) -> CopyIn {
        CopyIn {
            progress: Progress::default(),
            dead_since: None,
            force_promote_after,
        }
    }

    /// What the copy holds, for an attempt to extend.
    pub(super) fn progress(&mut self) -> &mut Progress {
        &mut self.progress
    }

    /// The next action after `step` (see the table on [`CopyIn`]).
    pub(super) fn next(&mut self, step: Step) -> Action {
        match step {
            Step::Ready {
                shutting_down: true,
                ..
            } => Action::Abandon(Why::ShuttingDown),
            Step::Ready {
                in_flight: false, ..
            } => Action::Abandon(Why::NotInFlight),
            Step::Ready { .. } => Action::Attempt,
            Step::Attempted(Outcome::Completed) => Action::Done(Finished::Completed),
            Step::Attempted(Outcome::Abandoned)
            | Step::Promoted {
                outcome: Some(Outcome::Abandoned),
                ..
            } => Action::Abandon(Why::AttemptAbandoned),
            Step::Failed {
                source: SourceHealth::Answering,
                ..
            } => {
                // A source that answers had a reason: start over from an empty copy.
                self.dead_since = None;
                self.progress = Progress::default();
                Action::StartOver
            }
            Step::Failed {
                source: SourceHealth::Unreachable,
                ..
            } => {
                // One that does not answer may be dying: keep what is copied.
                self.dead_since = None;
                Action::Wait(RETRY)
            }
            Step::Failed {
                source: SourceHealth::Dead,
                now,
            } => {
                let since = *self.dead_since.get_or_insert(now);
                let due = now.saturating_duration_since(since) >= self.force_promote_after;
                match self.progress.promotable().filter(|_| due) {
                    Some(list) => Action::ForcePromote(list.clone()),
                    None => Action::Wait(RETRY),
                }
            }
            Step::Cleared => Action::Wait(RETRY),
            Step::Promoted {
                high_watermark,
                outcome: Some(Outcome::Completed),
            } => Action::Done(Finished::ForcePromoted { high_watermark }),
            Step::Promoted { outcome: None, .. } => Action::Wait(RETRY),
        }
    }
}

/// What the target of a move asks of the world. `Moves` implements it over node RPC, the
/// metadata and the node's health; tests, with a fake peer.
pub(super) trait TargetIo: Sync {
    /// The typed node RPC `req` on node `to`, as `Cluster::ask` (the source's
    /// `ListPartitionSegments`, `FetchSegmentChunk` and `PrepareHandoff`).
    fn ask<C: Call + Sync>(
        &self,
        to: &str,
        req: &C,
    ) -> impl Future<Output = ApiResult<C::Reply>> + Send;

    /// Whether move `move_id` of partition `p` of topic `topic_id` from `from` to this node
    /// is still in flight, in the local view.
    fn still_moving(&self, topic_id: u64, p: u32, from: &str, move_id: u64) -> bool;

    /// The source `from` now: dead in the local view, else whether it answers a ping.
    fn source_health(&self, from: &str) -> impl Future<Output = SourceHealth> + Send;

    /// Proposes a flip (`CompleteMove`, `ForceCompleteMove`); returns once the local
    /// replica applied it. A refusal carries the state machine's code (`409`, `404`).
    fn propose(&self, cmd: MetaCommand) -> impl Future<Output = ApiResult<()>> + Send;

    /// The local replica's metadata, for the registry to open the partition after a flip.
    fn view(&self) -> Arc<MetaState>;

    /// Whether the node is shutting down.
    fn shutting_down(&self) -> bool;

    /// The time the loop's decisions and the freeze deadline are measured in.
    fn now(&self) -> Instant;

    /// Waits `d`, or until the node starts shutting down.
    fn wait(&self, d: Duration) -> impl Future<Output = ()> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::wire::SegmentInfo;

    const FORCE_AFTER: Duration = Duration::from_secs(120);

    fn list(hwm: u64) -> SegmentList {
        SegmentList {
            high_watermark: hwm,
            oldest_offset: 0,
            files: vec![SegmentInfo {
                name: "00000000000000000000.log".into(),
                base: 0,
                size: hwm * 10,
                sealed: false,
            }],
            frontier: Some(0),
            small_files: vec![],
        }
    }

    /// A loop whose copy holds the listing at `hwm`, which is the highest the source listed.
    fn synced_at(hwm: u64) -> CopyIn {
        let mut c = CopyIn::new(FORCE_AFTER);
        c.progress().listed(hwm);
        c.progress().synced(list(hwm));
        c
    }

    fn failed(source: SourceHealth, now: Instant) -> Step {
        Step::Failed { source, now }
    }

    fn ready(shutting_down: bool, in_flight: bool) -> Step {
        Step::Ready {
            shutting_down,
            in_flight,
        }
    }

    fn promoted_hwm(a: &Action) -> Option<u64> {
        match a {
            Action::ForcePromote(l) => Some(l.high_watermark),
            _ => None,
        }
    }

    #[test]
    fn ready_attempts_while_in_flight_and_abandons_on_shutdown_or_when_no_longer_in_flight() {
        let mut c = CopyIn::new(FORCE_AFTER);
        assert!(matches!(c.next(ready(false, true)), Action::Attempt));
        assert!(matches!(
            c.next(ready(false, false)),
            Action::Abandon(Why::NotInFlight)
        ));
        // Shutdown wins, in flight or not.
        assert!(matches!(
            c.next(ready(true, true)),
            Action::Abandon(Why::ShuttingDown)
        ));
        assert!(matches!(
            c.next(ready(true, false)),
            Action::Abandon(Why::ShuttingDown)
        ));
    }

    #[test]
    fn a_completed_attempt_is_done_and_an_abandoned_one_stops() {
        let mut c = synced_at(10);
        match c.next(Step::Attempted(Outcome::Completed)) {
            Action::Done(f) => {
                assert_eq!(f, Finished::Completed);
                assert_eq!(f.label(), "completed");
            }
            a => panic!("{a:?}"),
        }
        assert!(matches!(
            c.next(Step::Attempted(Outcome::Abandoned)),
            Action::Abandon(Why::AttemptAbandoned)
        ));
    }

    #[test]
    fn a_failure_with_a_live_answering_source_starts_over_from_an_empty_copy() {
        let t0 = Instant::now();
        let mut c = synced_at(10);
        // Dead for a while first: the timer must not survive the source's return.
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, t0)),
            Action::Wait(RETRY)
        ));
        assert!(matches!(
            c.next(failed(SourceHealth::Answering, t0 + Duration::from_secs(1))),
            Action::StartOver
        ));
        assert!(c.progress().promotable().is_none(), "progress reset");
        assert_eq!(c.progress.last_known_hwm, 0);
        assert_eq!(c.dead_since, None);
        assert!(matches!(c.next(Step::Cleared), Action::Wait(RETRY)));
        assert!(matches!(c.next(ready(false, true)), Action::Attempt));
    }

    #[test]
    fn a_failure_with_a_live_unreachable_source_keeps_the_copy_and_waits() {
        let t0 = Instant::now();
        let mut c = synced_at(10);
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, t0)),
            Action::Wait(RETRY)
        ));
        assert!(matches!(
            c.next(failed(SourceHealth::Unreachable, t0 + FORCE_AFTER)),
            Action::Wait(RETRY)
        ));
        assert_eq!(
            c.progress().promotable().map(|l| l.high_watermark),
            Some(10)
        );
        assert_eq!(c.dead_since, None, "alive: the dead timer is reset");
    }

    #[test]
    fn a_dead_source_keeps_the_copy_and_promotes_it_only_after_force_promote_after() {
        let t0 = Instant::now();
        let mut c = synced_at(10);
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, t0)),
            Action::Wait(RETRY)
        ));
        // Later failures do not restart the timer.
        let almost = t0 + FORCE_AFTER - Duration::from_millis(1);
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, almost)),
            Action::Wait(RETRY)
        ));
        assert_eq!(c.dead_since, Some(t0));
        let a = c.next(failed(SourceHealth::Dead, t0 + FORCE_AFTER));
        assert_eq!(promoted_hwm(&a), Some(10), "{a:?}");
        // The copy is still there for another try if the promotion fails.
        assert!(c.progress().promotable().is_some());
    }

    #[test]
    fn with_no_force_promote_delay_a_dead_source_is_promoted_at_the_first_failure() {
        let mut c = CopyIn::new(Duration::ZERO);
        c.progress().listed(4);
        c.progress().synced(list(4));
        let a = c.next(failed(SourceHealth::Dead, Instant::now()));
        assert_eq!(promoted_hwm(&a), Some(4), "{a:?}");
    }

    #[test]
    fn a_dead_source_is_promoted_only_from_a_listing_that_reached_the_highest_high_watermark() {
        let t0 = Instant::now();
        let late = t0 + 10 * FORCE_AFTER;
        // Nothing synced yet: nothing to promote, ever.
        let mut c = CopyIn::new(FORCE_AFTER);
        c.progress().listed(10);
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, t0)),
            Action::Wait(RETRY)
        ));
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, late)),
            Action::Wait(RETRY)
        ));
        // Synced the listing at 10, but the freeze (or a later listing) showed 12: the copy
        // lacks records the source acknowledged, so the move waits for the source.
        let mut c = synced_at(10);
        c.progress().listed(12);
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, t0)),
            Action::Wait(RETRY)
        ));
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, late)),
            Action::Wait(RETRY)
        ));
        // A later round synced the listing at 12: promotable (the timer kept running).
        c.progress().synced(list(12));
        let a = c.next(failed(SourceHealth::Dead, late));
        assert_eq!(promoted_hwm(&a), Some(12), "{a:?}");
        // A smaller high watermark listed later never lowers the bar.
        c.progress().listed(11);
        assert_eq!(c.progress.last_known_hwm, 12);
    }

    #[test]
    fn a_source_back_alive_resets_the_dead_timer() {
        let t0 = Instant::now();
        let mut c = synced_at(10);
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, t0)),
            Action::Wait(RETRY)
        ));
        // Alive (but not answering) just before the promotion was due.
        let back = t0 + FORCE_AFTER - Duration::from_secs(1);
        assert!(matches!(
            c.next(failed(SourceHealth::Unreachable, back)),
            Action::Wait(RETRY)
        ));
        // Dead again: the full delay runs from now.
        let again = t0 + FORCE_AFTER;
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, again)),
            Action::Wait(RETRY)
        ));
        assert!(matches!(
            c.next(failed(
                SourceHealth::Dead,
                again + FORCE_AFTER - Duration::from_millis(1)
            )),
            Action::Wait(RETRY)
        ));
        let a = c.next(failed(SourceHealth::Dead, again + FORCE_AFTER));
        assert_eq!(promoted_hwm(&a), Some(10), "{a:?}");
    }

    #[test]
    fn a_force_promotion_is_done_or_abandoned_or_retried_with_the_dead_timer_kept() {
        let t0 = Instant::now();
        let mut c = synced_at(10);
        assert!(matches!(
            c.next(failed(SourceHealth::Dead, t0)),
            Action::Wait(RETRY)
        ));
        let due = t0 + FORCE_AFTER;
        assert!(promoted_hwm(&c.next(failed(SourceHealth::Dead, due))).is_some());
        // It failed: wait, try again, and promote again at once (still dead, still due).
        assert!(matches!(
            c.next(Step::Promoted {
                high_watermark: 10,
                outcome: None
            }),
            Action::Wait(RETRY)
        ));
        assert!(matches!(c.next(ready(false, true)), Action::Attempt));
        let a = c.next(failed(SourceHealth::Dead, due + RETRY));
        assert_eq!(promoted_hwm(&a), Some(10), "{a:?}");
        match c.next(Step::Promoted {
            high_watermark: 10,
            outcome: Some(Outcome::Completed),
        }) {
            Action::Done(f) => {
                assert_eq!(f, Finished::ForcePromoted { high_watermark: 10 });
                assert_eq!(f.label(), "force_promoted");
            }
            a => panic!("{a:?}"),
        }
        // The leader refused it (the move was aborted meanwhile).
        assert!(matches!(
            c.next(Step::Promoted {
                high_watermark: 10,
                outcome: Some(Outcome::Abandoned)
            }),
            Action::Abandon(Why::AttemptAbandoned)
        ));
    }
}
