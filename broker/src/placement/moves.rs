//! Partition moves (SPEC §6.5): the verbatim copy, the owner's freeze, the compare-and-swap
//! flip, and the removal of the old copy.
//!
//! A move is an assignment with a `target` and a `move_id` (started by the leader's
//! controller, `controller`). The target drives it ([`run`]):
//!
//! 1. Copy the partition directory's log verbatim while produce continues
//!    (`ListPartitionSegments`, `FetchSegmentChunk` ≤ 4 MiB a call), into
//!    `topics/<id>/<p>.move-<move id>/`, in rounds until the remaining tail is small.
//! 2. `PrepareHandoff`: the owner freezes the partition (commits answer `503`, senders retry
//!    and reroute; consume goes on), and returns the exact high watermark, oldest offset,
//!    committed frontier, the files with their committed sizes, and the fan-out cursor files.
//! 3. Copy the tail, drop files retention removed, write the frontier and cursors, check that
//!    the copy reopens at exactly that high watermark, move it into place
//!    (`topics/<id>/<p>/`), and ask the leader for `CompleteMove` (compare-and-swap on owner,
//!    target and move id).
//!
//! The owner's freeze lasts [`FREEZE`]: when it lapses and the move is still in flight, the
//! owner proposes `AbortMove` for that move id and only lifts the freeze once its view shows
//! the move gone (so the flip can no longer happen: nothing committed after the freeze can be
//! missing from a copy that won). If the flip wins instead, the owner's view shows the new
//! owner and the registry closes the partition for good.
//!
//! Old copies (the previous owner's directory, a target's copy whose flip was refused) are
//! deleted only once the leader confirms, after a Raft barrier, that this node neither owns
//! nor receives the partition (SPEC §6.1).
//!
//! The target's retry loop decides through a pure state machine (`target::CopyIn`) and
//! reaches the source and the cluster only through a seam (`target::TargetIo`, implemented
//! here for [`Moves`]), so unit tests run whole moves against a fake peer (`fake_peer`).

mod target;

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_meta::{Assignment, MetaCommand, MetaState, Topic};
use narad_storage::{PartitionLog, StorageError};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;

use crate::cluster::calls::Call;
use crate::cluster::wire::{
    AssignmentReply, AssignmentRequest, ChunkRequest, HandoffReply, HandoffRequest, PartitionRef,
    SegmentInfo, SegmentList, SmallFile, MAX_CHUNK,
};
use crate::cluster::{Cluster, TopicLookup};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::health::Health;
use crate::metrics::{Metrics, MoveOutcomeLabels};
use crate::partition::{Partition, Registry, Released};
use crate::rpc::RpcReply;
use crate::wal::WalRecord;
use target::{Action, CopyIn, Finished, Outcome, Progress, SourceHealth, Step, TargetIo, Why};

/// How long an owner stays frozen for a move's final copy before it aborts the move.
pub const FREEZE: Duration = Duration::from_secs(5);
/// A pre-copy round that copied less than this goes on to the handoff.
const SMALL_TAIL: u64 = 1024 * 1024;
const MAX_PRECOPY_ROUNDS: usize = 20;

/// The moves this node takes part in, as owner (freezes, listings, chunks) and as target
/// (copies in), and the removal of old copies. Holds only the handles it uses.
pub struct Moves {
    pub node_id: String,
    pub meta: narad_meta::Meta,
    pub cluster: Arc<Cluster>,
    pub registry: Arc<Registry>,
    pub wal: crate::wal::Wal,
    /// (ext) Delayed produces held here: a draining node leaves once they are handed over.
    pub delayed: crate::delayed::Delayed,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// How long a move's source must stay marked dead before a copy that reached its last
    /// known high watermark is force-promoted (SPEC §6.5: 120 s; the test knob
    /// `NARAD_TEST_FORCE_PROMOTE_MS` shortens it).
    pub force_promote_after: Duration,
    /// Test knob `NARAD_TEST_MOVE_HANDOFF_PAUSE_MS`: a pause before the handoff.
    pub handoff_pause: Option<Duration>,
    tracker: Tracker,
    /// The node's task tracker: copies, freeze watches and janitor runs are awaited at
    /// shutdown.
    tasks: tokio_util::task::TaskTracker,
}

impl Moves {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node_id: String,
        meta: narad_meta::Meta,
        cluster: Arc<Cluster>,
        registry: Arc<Registry>,
        wal: crate::wal::Wal,
        delayed: crate::delayed::Delayed,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        knobs: &crate::config::TestKnobs,
        tasks: tokio_util::task::TaskTracker,
    ) -> Moves {
        Moves {
            node_id,
            meta,
            cluster,
            registry,
            wal,
            delayed,
            metrics,
            health,
            force_promote_after: knobs
                .force_promote_after
                .unwrap_or(Duration::from_secs(120)),
            handoff_pause: knobs.move_handoff_pause,
            tracker: Tracker::default(),
            tasks,
        }
    }
}

/// What runs on this node for moves.
#[derive(Default)]
struct Tracker {
    /// Partitions with a copy or a deletion in progress here (one at a time per partition).
    busy: Mutex<HashSet<(u64, u32)>>,
    /// Freezes this node (as owner) watches: (topic id, partition, move id).
    freezes: Mutex<HashSet<(u64, u32, u64)>>,
}

impl Tracker {
    fn claim(&self, key: (u64, u32)) -> bool {
        self.busy.lock().insert(key)
    }
    fn release(&self, key: (u64, u32)) {
        self.busy.lock().remove(&key);
    }
}

fn topic_partition(moves: &Moves, topic_id: u64, p: u32) -> Result<Arc<Topic>, RpcReply> {
    match moves.cluster.topic_by_id(topic_id) {
        TopicLookup::Known(t) if p < t.config.partitions => Ok(t),
        TopicLookup::Known(_) | TopicLookup::Deleted => Err(RpcReply::fail(
            ErrorCode::NotFound,
            "topic or partition not found",
        )),
        TopicLookup::Unknown => Err(RpcReply::fail(
            ErrorCode::Unavailable,
            "topic not known here yet",
        )),
    }
}

fn open_partition(moves: &Moves, topic: &Topic, p: u32) -> Result<Arc<Partition>, RpcReply> {
    moves
        .registry
        .topic(topic.id)
        .and_then(|rt| rt.partition(p))
        .ok_or_else(|| {
            RpcReply::fail(
                ErrorCode::Conflict,
                format!(
                    "partition {p} of {} is not open on {}",
                    topic.name, moves.node_id
                ),
            )
        })
}

/// `ListPartitionSegments`: the owner's segment files with their committed sizes, the
/// queue frontier and the fan-out cursors, all as of one instant.
pub async fn serve_list(moves: &Moves, req: PartitionRef) -> RpcReply {
    let topic = match topic_partition(moves, req.topic_id, req.partition) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if !moves.cluster.is_mine(&topic, req.partition) {
        return RpcReply::fail(ErrorCode::NotOwner, "not the owner of this partition");
    }
    let part = match open_partition(moves, &topic, req.partition) {
        Ok(p) => p,
        Err(r) => return r,
    };
    part.touch();
    match tokio::task::spawn_blocking(move || listing(&part)).await {
        Ok(list) => RpcReply::json(200, &list),
        Err(e) => RpcReply::fail(ErrorCode::Internal, format!("list task failed: {e}")),
    }
}

/// The listing of an owned partition as of one instant (blocking).
fn listing(part: &Partition) -> SegmentList {
    let state = part.committed_state();
    SegmentList {
        high_watermark: state.high_watermark,
        oldest_offset: state.oldest_offset,
        files: state.files.into_iter().map(SegmentInfo::from).collect(),
        frontier: Some(state.frontier),
        small_files: read_small_files(part.dir()),
    }
}

/// `FetchSegmentChunk`: raw committed bytes of one segment file.
pub async fn serve_chunk(moves: &Moves, req: ChunkRequest) -> RpcReply {
    let topic = match topic_partition(moves, req.topic_id, req.partition) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let part = match open_partition(moves, &topic, req.partition) {
        Ok(p) => p,
        Err(r) => return r,
    };
    part.touch();
    match tokio::task::spawn_blocking(move || chunk_reply(&part, &req)).await {
        Ok(reply) => reply,
        Err(e) => RpcReply::fail(ErrorCode::Internal, format!("read task failed: {e}")),
    }
}

/// The answer to `FetchSegmentChunk` from an open partition (blocking).
fn chunk_reply(part: &Partition, req: &ChunkRequest) -> RpcReply {
    let len = req.len.min(MAX_CHUNK) as usize;
    match part.log.read_segment_bytes(req.base, req.pos, len) {
        Ok(b) => RpcReply::new(200, "application/octet-stream", Bytes::from(b)),
        Err(StorageError::Gone { .. }) => RpcReply::fail(ErrorCode::Gone, "segment removed"),
        Err(e) => RpcReply::fail(ErrorCode::Internal, format!("read failed: {e}")),
    }
}

/// `PrepareHandoff`: freeze the partition for the final copy of a move to the caller.
pub async fn serve_handoff(moves: &Arc<Moves>, from: &str, req: HandoffRequest) -> RpcReply {
    let topic = match topic_partition(moves, req.topic_id, req.partition) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let a = &topic.assignments[req.partition as usize];
    if a.owner.as_deref() != Some(moves.node_id.as_str()) {
        return RpcReply::fail(ErrorCode::NotOwner, "not the owner of this partition");
    }
    if a.move_id < req.move_id {
        return RpcReply::fail(
            ErrorCode::Unavailable,
            "this node has not seen that move yet",
        );
    }
    if a.move_id != req.move_id || a.target.as_deref() != Some(from) {
        return RpcReply::fail(
            ErrorCode::Conflict,
            format!("move {} is not in flight", req.move_id),
        );
    }
    let part = match open_partition(moves, &topic, req.partition) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let p2 = part.clone();
    let move_id = req.move_id;
    let reply = match tokio::task::spawn_blocking(move || freeze_for(&p2, move_id)).await {
        Ok(r) => r,
        Err(e) => return RpcReply::fail(ErrorCode::Internal, format!("freeze task failed: {e}")),
    };
    let key = (req.topic_id, req.partition, req.move_id);
    if moves.tracker.freezes.lock().insert(key) {
        tracing::info!(topic = %topic.name, partition = req.partition, move_id, to = %from,
            high_watermark = reply.high_watermark, "partition frozen for a move's final copy");
        moves.tasks.spawn(watch_freeze(moves.clone(), part, key));
    }
    RpcReply::json(200, &reply)
}

/// Freezes an open partition for move `move_id` and returns the exact state its final copy
/// must reproduce (blocking; the caller watches the freeze).
fn freeze_for(part: &Partition, move_id: u64) -> HandoffReply {
    let state = part.freeze(move_id);
    let _ = part.persist_frontier();
    HandoffReply {
        high_watermark: state.high_watermark,
        oldest_offset: state.oldest_offset,
        frontier: state.frontier,
        files: state.files.into_iter().map(SegmentInfo::from).collect(),
        small_files: read_small_files(part.dir()),
        freeze_ms: FREEZE.as_millis() as u64,
    }
}

/// The fan-out cursor files, the delivery counts and the delays of a partition directory.
fn read_small_files(dir: &Path) -> Vec<SmallFile> {
    let mut out = Vec::new();
    for name in [
        crate::partition::DELIVERIES_FILE,
        crate::partition::DELAYS_FILE,
    ] {
        if let Ok(bytes) = std::fs::read(dir.join(name)) {
            out.push(SmallFile {
                path: name.to_string(),
                bytes,
            });
        }
    }
    if let Ok(rd) = std::fs::read_dir(dir.join("fanout")) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") || !e.path().is_file() {
                continue;
            }
            if let Ok(bytes) = std::fs::read(e.path()) {
                out.push(SmallFile {
                    path: format!("fanout/{name}"),
                    bytes,
                });
            }
        }
    }
    out
}

/// The owner's side of a freeze: lifts it once the move can no longer complete, aborting
/// the move itself when the freeze lapses; leaves it (the partition closes) when the move
/// completed.
async fn watch_freeze(moves: Arc<Moves>, part: Arc<Partition>, key: (u64, u32, u64)) {
    let (topic_id, p, move_id) = key;
    let until = Instant::now() + FREEZE;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            // The freeze is this process's: it ends with it.
            _ = moves.health.shutdown_signal() => break,
        }
        if part.frozen_for() != Some(move_id) {
            break;
        }
        let a = match moves.cluster.topic_by_id(topic_id) {
            TopicLookup::Known(t) => t.assignments.get(p as usize).cloned(),
            _ => None,
        };
        let Some(a) = a else {
            // The topic is gone: nothing to protect.
            part.unfreeze(move_id);
            break;
        };
        if a.owner.as_deref() != Some(moves.node_id.as_str()) {
            // The flip is applied: the registry closes the partition; it stays frozen.
            break;
        }
        if a.move_id != move_id || a.target.is_none() {
            part.unfreeze(move_id);
            tracing::info!(
                topic_id,
                partition = p,
                move_id,
                "move no longer in flight; freeze lifted"
            );
            break;
        }
        if Instant::now() >= until {
            let TopicLookup::Known(t) = moves.cluster.topic_by_id(topic_id) else {
                continue;
            };
            tracing::warn!(topic = %t.name, partition = p, move_id, "freeze lapsed before the move completed; aborting it");
            let cmd = MetaCommand::AbortMove {
                topic: t.name.clone(),
                topic_id,
                partition: p,
                move_id,
            };
            if let Err(e) = moves.cluster.propose(cmd).await {
                tracing::warn!(error = %e.message, "could not abort the move; the partition stays frozen");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    moves.tracker.freezes.lock().remove(&key);
}

/// `GetAssignment`: the leader's confirmed view of one assignment, plus the callee's WAL
/// backlog.
pub async fn serve_assignment(moves: &Moves, req: AssignmentRequest) -> RpcReply {
    let wal_outstanding = crate::delayed::to_hand_over(&moves.wal, &moves.delayed);
    let Some(topic_id) = req.topic_id else {
        return RpcReply::json(
            200,
            &AssignmentReply {
                index: 0,
                assignment: None,
                wal_outstanding,
            },
        );
    };
    if !moves.meta.is_leader() {
        return RpcReply::fail(ErrorCode::NotLeader, "not the metadata leader");
    }
    match moves.meta.barrier().await {
        Ok(index) => RpcReply::json(
            200,
            &AssignmentReply {
                index,
                assignment: assignment_in(&moves.meta.view(), topic_id, req.partition),
                wal_outstanding,
            },
        ),
        Err(e) => ApiError::from(e).to_reply(),
    }
}

fn assignment_in(view: &narad_meta::MetaState, topic_id: u64, p: u32) -> Option<Assignment> {
    view.topics
        .values()
        .find(|t| t.id == topic_id)
        .and_then(|t| t.assignments.get(p as usize).cloned())
}

/// The leader's current assignment of a partition (`None`: the topic or partition is gone),
/// with the leader's applied index it was read at.
async fn confirmed_assignment(
    moves: &Moves,
    topic_id: u64,
    p: u32,
) -> ApiResult<(u64, Option<Assignment>)> {
    if moves.meta.is_leader() {
        let index = moves.meta.barrier().await.map_err(ApiError::from)?;
        return Ok((index, assignment_in(&moves.meta.view(), topic_id, p)));
    }
    let Some((leader, _)) = moves.meta.current_leader() else {
        return Err(ApiError::unavailable("no metadata leader", 1));
    };
    let a = moves
        .cluster
        .ask(
            &leader,
            &AssignmentRequest {
                topic_id: Some(topic_id),
                partition: p,
            },
        )
        .await?;
    Ok((a.index, a.assignment))
}

/// The moves this node takes part in: starts a copy for every assignment targeting it, and
/// deletes old copies once the leader confirms they are not needed. Runs until shutdown.
pub async fn run(moves: Arc<Moves>) {
    let mut rx = moves.meta.subscribe();
    let mut last_janitor = Instant::now();
    let mut orphans_checked = false;
    loop {
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = moves.health.shutdown_signal() => return,
        }
        let view = moves.meta.view();
        if !orphans_checked && moves.health.is_ready() {
            // Once per start, with a view that has caught up enough to serve.
            orphans_checked = true;
            moves.registry.release_orphans(&view.topics, &moves.node_id);
        }
        for t in view.topics.values() {
            for (p, a) in t.assignments.iter().enumerate() {
                if a.target.as_deref() != Some(moves.node_id.as_str()) {
                    continue;
                }
                let Some(from) = a.owner.clone() else {
                    continue;
                };
                let key = (t.id, p as u32);
                if !moves.tracker.claim(key) {
                    continue;
                }
                moves
                    .tasks
                    .spawn(copy_in(moves.clone(), t.clone(), p as u32, from, a.move_id));
            }
        }
        if last_janitor.elapsed() >= Duration::from_secs(2) {
            last_janitor = Instant::now();
            moves.tasks.spawn(janitor(moves.clone()));
        }
    }
}

/// Deletes released partition directories the leader confirms this node neither owns nor
/// receives; keeps the others for a later try. A directory a force promotion left behind
/// first gives its records past the promoted high watermark back to the WAL (salvage).
async fn janitor(moves: Arc<Moves>) {
    let released = moves.registry.take_released();
    if released.is_empty() {
        return;
    }
    let mut keep = Vec::new();
    for r in released {
        let key = (r.topic_id, r.partition);
        if !moves.tracker.claim(key) {
            keep.push(r);
            continue;
        }
        let open = moves
            .registry
            .topic(r.topic_id)
            .and_then(|rt| rt.partition(r.partition))
            .is_some_and(|p| p.dir() == r.dir);
        if open {
            moves.tracker.release(key);
            continue;
        }
        let me = moves.node_id.as_str();
        match confirmed_assignment(&moves, r.topic_id, r.partition).await {
            Ok((index, Some(a)))
                if a.owner.as_deref() != Some(me) && a.target.as_deref() != Some(me) =>
            {
                match retire(&moves, &r, index).await {
                    Ok(()) => {
                        tracing::info!(topic = %r.topic, partition = r.partition, dir = %r.dir.display(), "removed the copy of a partition moved away")
                    }
                    Err(e) => {
                        tracing::warn!(topic = %r.topic, partition = r.partition, error = %e, "cannot remove a moved partition's old copy yet");
                        keep.push(r);
                    }
                }
            }
            // Owned or received here again: not garbage.
            Ok((_, Some(_))) => {}
            // The topic is gone: its deletion removes the data.
            Ok((_, None)) => {}
            Err(e) => {
                tracing::debug!(error = %e.message, "cannot confirm a moved partition's removal yet");
                keep.push(r);
            }
        }
        moves.tracker.release(key);
    }
    moves.registry.keep_released(keep);
}

/// Removes an old copy the leader confirmed (as of its applied `index`) is not this node's:
/// once the local replica has applied that index, a salvage claim on it is settled first.
async fn retire(moves: &Arc<Moves>, r: &Released, index: u64) -> Result<(), String> {
    if !moves.meta.wait_applied(index, Duration::from_secs(5)).await {
        return Err("the local replica is behind the leader".into());
    }
    let claim = moves
        .meta
        .view()
        .salvage_claim(r.topic_id, r.partition, &moves.node_id)
        .cloned();
    if let Some(claim) = claim {
        let n = salvage(moves, r, claim.high_watermark).await?;
        moves.metrics.moves_salvaged.inc_by(n as u64);
        tracing::warn!(topic = %r.topic, partition = r.partition, records = n, from_offset = claim.high_watermark,
            "re-produced the records a force promotion left behind on this node");
        moves
            .cluster
            .propose(MetaCommand::SalvageDone {
                topic_id: r.topic_id,
                partition: r.partition,
                from: moves.node_id.clone(),
            })
            .await
            .map_err(|e| format!("settle the salvage claim: {}", e.message))?;
    }
    let dir = r.dir.clone();
    tokio::task::spawn_blocking(move || remove_dir(&dir))
        .await
        .map_err(|e| format!("remove task failed: {e}"))?
        .map_err(|e| format!("remove {}: {e}", r.dir.display()))
}

/// Appends the records of the old copy at `r.dir` from offset `from` on to the WAL, for the
/// dispatcher to commit to the partition's owner (duplicates if this repeats, never loss).
/// Returns how many.
async fn salvage(moves: &Arc<Moves>, r: &Released, from: u64) -> Result<usize, String> {
    let (dir, cfg) = (r.dir.join("log"), moves.registry.log_config().clone());
    let log = tokio::task::spawn_blocking(move || PartitionLog::open(&dir, cfg))
        .await
        .map_err(|e| format!("open task failed: {e}"))?
        .map_err(|e| format!("open the old copy: {e}"))?;
    let log = Arc::new(log);
    let mut offset = from.max(log.oldest_offset());
    let mut total = 0;
    while offset < log.high_watermark() {
        let l = log.clone();
        let read = tokio::task::spawn_blocking(move || l.read_from(offset, 512, 4 << 20))
            .await
            .map_err(|e| format!("read task failed: {e}"))?;
        let records = match read {
            Ok(rs) if !rs.is_empty() => rs,
            Ok(_) => break,
            Err(StorageError::Unreadable {
                offset: bad,
                reason,
            }) => {
                tracing::error!(topic = %r.topic, partition = r.partition, offset = bad, %reason, "skipping an unreadable record of an old copy");
                offset = bad + 1;
                continue;
            }
            Err(e) => return Err(format!("read the old copy at {offset}: {e}")),
        };
        offset = records.last().map_or(offset, |x| x.offset + 1);
        total += records.len();
        let batch = records
            .into_iter()
            .map(|x| WalRecord {
                topic_id: r.topic_id,
                partition: r.partition,
                pinned: false,
                key: x.key,
                payload: x.payload,
                attrs: x.attrs,
            })
            .collect();
        moves
            .wal
            .append(batch)
            .await
            .map_err(|e| format!("append to the WAL: {e}"))?;
    }
    log.close();
    Ok(total)
}

fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => {
            if let Some(parent) = dir.parent() {
                let _ = std::fs::File::open(parent).and_then(|f| f.sync_all());
            }
            Ok(())
        }
    }
}

/// Whether move `move_id` of (topic, p) from `from` to this node is still in flight.
fn still_moving(moves: &Moves, topic_id: u64, p: u32, from: &str, move_id: u64) -> bool {
    match moves.cluster.topic_by_id(topic_id) {
        TopicLookup::Known(t) => t
            .assignments
            .get(p as usize)
            .is_some_and(|a| in_flight(a, from, &moves.node_id, move_id)),
        _ => false,
    }
}

/// Whether assignment `a` is move `move_id` from `from` to `to`.
fn in_flight(a: &Assignment, from: &str, to: &str, move_id: u64) -> bool {
    a.move_id == move_id && a.owner.as_deref() == Some(from) && a.target.as_deref() == Some(to)
}

fn staging_dir(registry: &Registry, topic_id: u64, p: u32, move_id: u64) -> PathBuf {
    registry
        .root()
        .join(topic_id.to_string())
        .join(format!("{p}.move-{move_id}"))
}

/// The target's world as this node sees it: the source over node RPC, the move and the
/// source's health in the local view, the flip through the metadata leader.
impl TargetIo for Moves {
    fn ask<C: Call + Sync>(
        &self,
        to: &str,
        req: &C,
    ) -> impl Future<Output = ApiResult<C::Reply>> + Send {
        self.cluster.ask(to, req)
    }

    fn still_moving(&self, topic_id: u64, p: u32, from: &str, move_id: u64) -> bool {
        still_moving(self, topic_id, p, from, move_id)
    }

    async fn source_health(&self, from: &str) -> SourceHealth {
        if !Cluster::is_alive(&self.meta.view(), from) {
            SourceHealth::Dead
        } else if self.cluster.reachable(from).await {
            SourceHealth::Answering
        } else {
            SourceHealth::Unreachable
        }
    }

    async fn propose(&self, cmd: MetaCommand) -> ApiResult<()> {
        self.cluster.propose(cmd).await.map(|_| ())
    }

    fn view(&self) -> Arc<MetaState> {
        self.meta.view()
    }

    fn shutting_down(&self) -> bool {
        self.health.is_shutting_down()
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    async fn wait(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.health.shutdown_signal() => {}
        }
    }
}

/// What the target side of a move works with: the seam to the source and the cluster
/// (`Moves` itself, a fake peer in tests) and this node's own handles.
struct Target<'a, I> {
    io: &'a I,
    node_id: &'a str,
    registry: &'a Registry,
    metrics: &'a Metrics,
    /// Test knob `NARAD_TEST_MOVE_HANDOFF_PAUSE_MS`: a pause before the handoff.
    handoff_pause: Option<Duration>,
    /// See [`Moves::force_promote_after`].
    force_promote_after: Duration,
}

impl Moves {
    fn target(&self) -> Target<'_, Moves> {
        Target {
            io: self,
            node_id: &self.node_id,
            registry: &self.registry,
            metrics: &self.metrics,
            handoff_pause: self.handoff_pause,
            force_promote_after: self.force_promote_after,
        }
    }
}

/// The target's side of one move, retried until it completes or is no longer in flight
/// (see [`run_copy_in`]); then the partition is free for another copy or deletion here.
async fn copy_in(moves: Arc<Moves>, topic: Arc<Topic>, p: u32, from: String, move_id: u64) {
    run_copy_in(&moves.target(), &topic, p, &from, move_id).await;
    moves.tracker.release((topic.id, p));
}

/// The target's retry loop: [`CopyIn`] decides, this runs its actions. While the source
/// answers, a failed attempt starts over from an empty copy; while it is marked dead the copy
/// is kept, and once it stayed dead [`Moves::force_promote_after`] a copy holding everything
/// of its last listing is promoted.
async fn run_copy_in<I: TargetIo>(
    t: &Target<'_, I>,
    topic: &Topic,
    p: u32,
    from: &str,
    move_id: u64,
) {
    let started = Instant::now();
    t.metrics.moves_inflight.inc();
    tracing::info!(topic = %topic.name, partition = p, from = %from, move_id, "copying a partition in");
    let staging = staging_dir(t.registry, topic.id, p, move_id);
    let mut state = CopyIn::new(t.force_promote_after);
    let ready = || Step::Ready {
        shutting_down: t.io.shutting_down(),
        in_flight: t.io.still_moving(topic.id, p, from, move_id),
    };
    let mut step = ready();
    loop {
        step = match state.next(step) {
            Action::Attempt => {
                match attempt(t, topic, p, from, move_id, &staging, state.progress()).await {
                    Ok(outcome) => Step::Attempted(outcome),
                    Err(e) => {
                        tracing::warn!(topic = %topic.name, partition = p, move_id, error = %e, "move attempt failed; retrying");
                        Step::Failed {
                            source: t.io.source_health(from).await,
                            now: t.io.now(),
                        }
                    }
                }
            }
            Action::StartOver => {
                let s = staging.clone();
                let _ = tokio::task::spawn_blocking(move || remove_dir(&s)).await;
                Step::Cleared
            }
            Action::ForcePromote(list) => {
                let high_watermark = list.high_watermark;
                let outcome = match force_promote(t, topic, p, from, move_id, &staging, list).await
                {
                    Ok(o) => Some(o),
                    Err(e) => {
                        tracing::warn!(topic = %topic.name, partition = p, move_id, error = %e, "force promotion failed; retrying");
                        None
                    }
                };
                Step::Promoted {
                    high_watermark,
                    outcome,
                }
            }
            Action::Wait(d) => {
                t.io.wait(d).await;
                ready()
            }
            Action::Done(finished) => {
                t.metrics
                    .moves_total
                    .get_or_create(&MoveOutcomeLabels {
                        outcome: finished.label(),
                    })
                    .inc();
                t.metrics
                    .moves_duration
                    .observe(started.elapsed().as_secs_f64());
                match finished {
                    Finished::Completed => {
                        tracing::info!(topic = %topic.name, partition = p, from = %from, move_id,
                            ms = started.elapsed().as_millis() as u64, "partition moved here")
                    }
                    Finished::ForcePromoted { high_watermark } => {
                        tracing::warn!(topic = %topic.name, partition = p, from = %from, move_id,
                            high_watermark,
                            "source stayed dead: its copy up to the last known high watermark was force-promoted")
                    }
                }
                break;
            }
            Action::Abandon(why) => {
                if why == Why::NotInFlight {
                    tracing::info!(topic = %topic.name, partition = p, move_id, "move no longer in flight; copy abandoned");
                }
                break;
            }
        };
    }
    let s = staging.clone();
    let _ = tokio::task::spawn_blocking(move || remove_dir(&s)).await;
    t.metrics.moves_inflight.dec();
}

/// The typed call `req` on `to`, its failure as the text a move reports.
async fn ask<C: Call + Sync, I: TargetIo>(io: &I, to: &str, req: &C) -> Result<C::Reply, String> {
    io.ask(to, req)
        .await
        .map_err(|e| format!("{to} answered {e}"))
}

/// One try: pre-copy, handoff, tail, verify, install, flip.
async fn attempt<I: TargetIo>(
    t: &Target<'_, I>,
    topic: &Topic,
    p: u32,
    from: &str,
    move_id: u64,
    staging: &Path,
    progress: &mut Progress,
) -> Result<Outcome, String> {
    let log_dir = staging.join("log");
    {
        let log_dir = log_dir.clone();
        tokio::task::spawn_blocking(move || {
            narad_storage::dirs::create_dir_all_durable(&log_dir)
                .map_err(|e| format!("create {}: {e}", log_dir.display()))
        })
        .await
        .map_err(|e| format!("create task failed: {e}"))??;
    }
    let part_ref = PartitionRef {
        topic_id: topic.id,
        partition: p,
    };
    // 1. Copy while produce goes on, until the tail is small.
    for _ in 0..MAX_PRECOPY_ROUNDS {
        if !t.io.still_moving(topic.id, p, from, move_id) {
            return Ok(Outcome::Abandoned);
        }
        let list = ask(t.io, from, &part_ref).await?;
        progress.listed(list.high_watermark);
        let copied = sync_log(t, from, topic.id, p, &log_dir, &list.files).await?;
        progress.synced(list);
        if copied < SMALL_TAIL {
            break;
        }
    }
    // Test knob `NARAD_TEST_MOVE_HANDOFF_PAUSE_MS`: tests act while a move is half done.
    if let Some(pause) = t.handoff_pause {
        tokio::time::sleep(pause).await;
    }
    if !t.io.still_moving(topic.id, p, from, move_id) {
        return Ok(Outcome::Abandoned);
    }
    // 2. Freeze: from here on the clock runs (the owner aborts after FREEZE).
    let frozen_at = t.io.now();
    let h = ask(
        t.io,
        from,
        &HandoffRequest {
            topic_id: topic.id,
            partition: p,
            move_id,
        },
    )
    .await?;
    // 3. The tail, exactly as frozen.
    progress.listed(h.high_watermark);
    sync_log(t, from, topic.id, p, &log_dir, &h.files).await?;
    let fin = Final {
        high_watermark: h.high_watermark,
        oldest_offset: h.oldest_offset,
        frontier: h.frontier,
        small_files: h.small_files,
    };
    prepare_copy(t.registry, staging, fin).await?;
    let elapsed = t.io.now().saturating_duration_since(frozen_at);
    if elapsed + Duration::from_millis(500) >= Duration::from_millis(h.freeze_ms) {
        return Err("the final copy outlasted the freeze".into());
    }
    // 4. Into place, then the flip.
    let cmd = MetaCommand::CompleteMove {
        topic: topic.name.clone(),
        topic_id: topic.id,
        partition: p,
        from: from.to_string(),
        to: t.node_id.to_string(),
        move_id,
    };
    install_and_flip(t, topic, p, staging, cmd).await
}

/// The source stayed dead: promote the staged copy of its last listing (`ForceCompleteMove`,
/// which the leader applies only while the source is marked dead). Records the source
/// committed after that listing stay on its disk; it re-produces them when it returns
/// (the salvage claim, see [`janitor`]).
async fn force_promote<I: TargetIo>(
    t: &Target<'_, I>,
    topic: &Topic,
    p: u32,
    from: &str,
    move_id: u64,
    staging: &Path,
    list: SegmentList,
) -> Result<Outcome, String> {
    let fin = Final {
        high_watermark: list.high_watermark,
        oldest_offset: list.oldest_offset,
        frontier: list.frontier.unwrap_or(list.oldest_offset),
        small_files: list.small_files,
    };
    let (log_dir, files) = (staging.join("log"), list.files);
    tokio::task::spawn_blocking(move || trim_to(&log_dir, &files))
        .await
        .map_err(|e| format!("trim task failed: {e}"))??;
    prepare_copy(t.registry, staging, fin).await?;
    let cmd = MetaCommand::ForceCompleteMove {
        topic: topic.name.clone(),
        topic_id: topic.id,
        partition: p,
        from: from.to_string(),
        to: t.node_id.to_string(),
        move_id,
        high_watermark: list.high_watermark,
    };
    install_and_flip(t, topic, p, staging, cmd).await
}

/// Cuts the staged log back to exactly `files` (a later round may have copied more, or files
/// a later listing dropped may be gone: then this listing cannot be installed).
fn trim_to(dir: &Path, files: &[SegmentInfo]) -> Result<(), String> {
    let listed: HashSet<&str> = files.iter().map(|f| f.name.as_str()).collect();
    for e in std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !listed.contains(name.as_str()) {
            std::fs::remove_file(e.path()).map_err(|e| format!("remove {name}: {e}"))?;
        }
    }
    for f in files {
        let path = dir.join(&f.name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| format!("the copy lacks {}: {e}", f.name))?;
        let have = file.metadata().map_err(|e| e.to_string())?.len();
        if have < f.size {
            return Err(format!(
                "the copy holds {have} of {} bytes of {}",
                f.size, f.name
            ));
        }
        if have > f.size {
            file.set_len(f.size)
                .map_err(|e| format!("truncate {}: {e}", f.name))?;
            file.sync_all()
                .map_err(|e| format!("fsync {}: {e}", f.name))?;
        }
    }
    Ok(())
}

/// What the installed copy must reproduce.
struct Final {
    high_watermark: u64,
    oldest_offset: u64,
    frontier: u64,
    small_files: Vec<SmallFile>,
}

/// Writes the frontier and the cursor files into the staged copy, checks that it reopens at
/// exactly the high watermark, and makes it durable.
async fn prepare_copy(registry: &Registry, staging: &Path, fin: Final) -> Result<(), String> {
    let staging = staging.to_path_buf();
    let cfg = registry.log_config().clone();
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        for f in &fin.small_files {
            if f.path.contains("..") || f.path.starts_with('/') {
                return Err(format!("refusing file path {}", f.path));
            }
            let path = staging.join(&f.path);
            if let Some(parent) = path.parent() {
                narad_storage::dirs::create_dir_all_durable(parent).map_err(|e| e.to_string())?;
            }
            write_synced(&path, &f.bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        crate::partition::write_frontier(&staging, fin.frontier)
            .map_err(|e| format!("write frontier: {e}"))?;
        PartitionLog::verify_copy(
            &staging.join("log"),
            cfg,
            fin.oldest_offset,
            fin.high_watermark,
        )
        .map_err(|e| format!("the copy does not verify: {e}"))?;
        for d in [staging.join("log"), staging.join("fanout"), staging.clone()] {
            if d.is_dir() {
                narad_storage::dirs::sync_dir(&d)
                    .map_err(|e| format!("fsync {}: {e}", d.display()))?;
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| format!("verify task failed: {e}"))?
}

/// Moves the verified copy into place and proposes the flip `cmd`.
async fn install_and_flip<I: TargetIo>(
    t: &Target<'_, I>,
    topic: &Topic,
    p: u32,
    staging: &Path,
    cmd: MetaCommand,
) -> Result<Outcome, String> {
    let dest = t.registry.partition_dir(topic.id, p);
    if t.registry
        .topic(topic.id)
        .and_then(|rt| rt.partition(p))
        .is_some()
    {
        return Err("the partition is open here already".into());
    }
    let (s, d) = (staging.to_path_buf(), dest.clone());
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        // A leftover of an earlier ownership or attempt: this node is not the owner (the
        // flip to it is what comes next, and only this task proposes it).
        remove_dir(&d)?;
        std::fs::rename(&s, &d)?;
        if let Some(parent) = d.parent() {
            narad_storage::dirs::sync_dir(parent)?;
        }
        Ok(())
    })
    .await
    .map_err(|e| format!("install task failed: {e}"))?
    .map_err(|e| format!("install the copy: {e}"))?;
    let released = || Released {
        topic_id: topic.id,
        topic: topic.name.clone(),
        partition: p,
        dir: dest.clone(),
    };
    let move_id = match &cmd {
        MetaCommand::CompleteMove { move_id, .. }
        | MetaCommand::ForceCompleteMove { move_id, .. } => *move_id,
        _ => 0,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match t.io.propose(cmd.clone()).await {
            Ok(()) => {
                t.registry
                    .apply(&t.io.view(), t.node_id)
                    .map_err(|e| e.message)?;
                return Ok(Outcome::Completed);
            }
            // The leader's state machine refused it (the move was aborted or superseded).
            Err(e) if matches!(e.code, ErrorCode::Conflict | ErrorCode::NotFound) => {
                tracing::warn!(topic = %topic.name, partition = p, move_id, error = %e.message, "the flip was refused; discarding the copy");
                t.registry.keep_released(vec![released()]);
                return Ok(Outcome::Abandoned);
            }
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(error = %e.message, "the flip is not confirmed yet; retrying");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => {
                // Unknown outcome: leave the copy in place; the janitor removes it only if
                // the leader confirms it is not ours.
                t.registry.keep_released(vec![released()]);
                return Err(format!("flip not confirmed: {}", e.message));
            }
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Brings the segment files in `dir` up to the listed committed sizes; removes copies of
/// segments the owner no longer lists. Returns the bytes copied.
async fn sync_log<I: TargetIo>(
    t: &Target<'_, I>,
    from: &str,
    topic_id: u64,
    p: u32,
    dir: &Path,
    files: &[SegmentInfo],
) -> Result<u64, String> {
    let names: HashSet<&str> = files.iter().map(|f| f.name.as_str()).collect();
    let mut rd = tokio::fs::read_dir(dir)
        .await
        .map_err(|e| format!("read {}: {e}", dir.display()))?;
    while let Ok(Some(e)) = rd.next_entry().await {
        let name = e.file_name().to_string_lossy().into_owned();
        if !names.contains(name.as_str()) {
            let _ = tokio::fs::remove_file(e.path()).await;
        }
    }
    let mut copied = 0u64;
    for f in files {
        if f.name.contains('/') || f.name.contains("..") {
            return Err(format!("refusing file name {}", f.name));
        }
        let path = dir.join(&f.name);
        let have = tokio::fs::metadata(&path)
            .await
            .map(|m| m.len())
            .unwrap_or(0);
        if have > f.size {
            return Err(format!(
                "{} is {have} bytes here, {} at the owner",
                f.name, f.size
            ));
        }
        if have == f.size && path.exists() {
            continue;
        }
        let mut out = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .await
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        let mut pos = have;
        while pos < f.size {
            let req = ChunkRequest {
                topic_id,
                partition: p,
                base: f.base,
                pos,
                len: ((f.size - pos).min(MAX_CHUNK as u64)) as u32,
            };
            let chunk = match t.io.ask(from, &req).await {
                Ok(chunk) => chunk,
                // Retention removed it meanwhile; the next listing no longer has it.
                Err(e) if e.code == ErrorCode::Gone => break,
                Err(e) => return Err(format!("{from} answered {e}")),
            };
            if chunk.is_empty() {
                return Err(format!("{} ended at {pos} of {}", f.name, f.size));
            }
            out.write_all(&chunk)
                .await
                .map_err(|e| format!("write {}: {e}", path.display()))?;
            pos += chunk.len() as u64;
            copied += chunk.len() as u64;
            t.metrics.moves_bytes.inc_by(chunk.len() as u64);
        }
        out.sync_all()
            .await
            .map_err(|e| format!("fsync {}: {e}", path.display()))?;
    }
    Ok(copied)
}

#[cfg(test)]
mod fake_peer;
