//! The cluster: how a node finds, joins and serves its peers (SPEC §6).
//!
//! - [`Cluster`]: the node's view of the others — node-RPC connections ([`Peers`]), metadata
//!   writes forwarded to the Raft leader ([`Cluster::propose`]), catch-up reads
//!   ([`Cluster::read_current`]), ownership and liveness lookups, and calls to partition
//!   owners ([`Cluster::call`]).
//! - `membership`: bootstrap from `--peers`, join-only admission, heartbeats, and the
//!   leader's dead-member marking.
//! - `router`: where the dispatcher and the fan-out engine send a partition's records.
//! - `calls`: the table of node-RPC calls (request and reply types, timeout, fallback).
//! - `wire`: the payload of each opcode.
//!
//! The server side of node RPC is `node_rpc`; moves and the leader's move controller are
//! `placement`.
//!
//! A standalone node (no `--peers`) has a `Cluster` too: it is its own leader and owner of
//! everything, and nothing here leaves the process.

pub mod calls;
pub mod membership;
pub mod router;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use narad_meta::{ApplyError, Meta, MetaCommand, MetaError, MetaResponse, MetaState, Topic};

use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::rpc::{Opcode, Peers, RpcError, RpcReply};
use calls::Call;
use wire::{GetTopicRequest, ProposeRequest};

/// How long a forwarded metadata write may take (SPEC §6.3: a forwarded create may wait up
/// to 75 s).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(75);
/// How long a follower waits for its replica to apply what the leader applied.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(5);

/// Heartbeat and failure-detection timing (SPEC §6.2: 5 s and 30 s; tests shorten them).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub heartbeat: Duration,
    pub dead_after: Duration,
}

impl Timing {
    /// The SPEC's timing, unless the test knobs `NARAD_TEST_HEARTBEAT_MS` /
    /// `NARAD_TEST_DEAD_AFTER_MS` override it (tests that must not wait 30 s for a verdict).
    pub fn new(knobs: &crate::config::TestKnobs) -> Timing {
        Timing {
            heartbeat: knobs.heartbeat.unwrap_or(Duration::from_secs(5)),
            dead_after: knobs.dead_after.unwrap_or(Duration::from_secs(30)),
        }
    }
}

/// Topics by id (the cluster's own ids: a fast hasher), for the view they were indexed from.
type TopicIndex = (Arc<MetaState>, foldhash::HashMap<u64, Arc<Topic>>);

/// The topics of `view` by id.
fn topics_by_id(view: &MetaState) -> foldhash::HashMap<u64, Arc<Topic>> {
    view.topics.values().map(|t| (t.id, t.clone())).collect()
}

/// What the metadata says about a topic id.
pub enum TopicLookup {
    Known(Arc<Topic>),
    /// Deleted: the local replica applied its deletion (ids are never reused, so a missing id
    /// below `next_topic_id` was deleted by a committed command — not a stale view).
    Deleted,
    /// Not in this replica yet (created after the state it has applied).
    Unknown,
}

impl TopicLookup {
    /// The topic a write sent here by a peer names: `404` once deleted; `503` while this
    /// replica is behind the sender's (it retries).
    pub fn for_write(self) -> ApiResult<Arc<Topic>> {
        match self {
            TopicLookup::Known(t) => Ok(t),
            TopicLookup::Deleted => Err(ApiError::new(ErrorCode::TopicNotFound, "topic deleted")),
            TopicLookup::Unknown => Err(ApiError::new(
                ErrorCode::Unavailable,
                "topic not known here yet",
            )),
        }
    }
}

pub struct Cluster {
    pub node_id: String,
    pub meta: Meta,
    /// Node-RPC connections (Raft has its own, in the transport).
    pub peers: Peers,
    /// Started with `--peers`.
    pub clustered: bool,
    /// `--peers`: the seed voters (id, cluster address).
    pub seeds: Vec<(String, String)>,
    /// Initial members (bootstrap voters); default all seeds.
    pub initial_members: Vec<String>,
    /// The cluster address peers reach this node at.
    pub advertise_addr: String,
    pub timing: Timing,
    /// This node is a voter of an initialized cluster (always true standalone).
    admitted: AtomicBool,
    /// This node's member record reached the metadata.
    registered: AtomicBool,
    /// A leader shutting down takes no metadata writes while it hands leadership off.
    handing_off: AtomicBool,
    by_id: ArcSwap<TopicIndex>,
    /// `topic.max_topics`: the most topics a create on this node, as metadata leader, admits.
    max_topics: u64,
    /// Topic creates this node appends as leader pass one at a time (see [`Cluster::leader_write`]).
    create_gate: tokio::sync::Mutex<()>,
}

impl Cluster {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node_id: String,
        meta: Meta,
        peers: Peers,
        seeds: Vec<(String, String)>,
        initial_members: Vec<String>,
        advertise_addr: String,
        timing: Timing,
        max_topics: u64,
    ) -> Cluster {
        let clustered = !seeds.is_empty();
        let initial_members = if initial_members.is_empty() {
            seeds.iter().map(|(id, _)| id.clone()).collect()
        } else {
            initial_members
        };
        let view = meta.view();
        let by_id = topics_by_id(&view);
        Cluster {
            node_id,
            meta,
            peers,
            clustered,
            seeds,
            initial_members,
            advertise_addr,
            timing,
            admitted: AtomicBool::new(!clustered),
            registered: AtomicBool::new(false),
            handing_off: AtomicBool::new(false),
            by_id: ArcSwap::from_pointee((view, by_id)),
            max_topics,
            create_gate: tokio::sync::Mutex::new(()),
        }
    }

    /// Appends `cmd` to the metadata log on this node, the leader (or a standalone node), and
    /// returns once it is applied here, with its log index.
    ///
    /// A topic create (children included) is first held against `topic.max_topics` (`409`
    /// when the metadata already has that many topics). Creates pass one at a time, each
    /// counted against the applied state that holds every create before it, so racing
    /// creates through any node — followers forward theirs here — never exceed the limit
    /// (only creates a previous leader was still committing when leadership moved here can
    /// be missing from the count, since the new leader may not have applied them yet).
    /// The check is the leader's rather than the state machine's so that the log stays
    /// readable by builds without it (a replica that skipped the check would diverge). A
    /// name that exists already is left to the state machine's `409` (`already exists`).
    pub async fn leader_write(&self, cmd: MetaCommand) -> Result<(MetaResponse, u64), MetaError> {
        let name = match &cmd {
            MetaCommand::CreateTopic { name, .. } | MetaCommand::CreateChildTopic { name, .. } => {
                name
            }
            _ => return self.meta.write_indexed(cmd).await,
        };
        let _one_at_a_time = self.create_gate.lock().await;
        let view = self.meta.view();
        let taken = view.topics.contains_key(name)
            || view
                .topic_names_folded
                .contains_key(&name.to_ascii_lowercase());
        if !taken && view.topics.len() as u64 >= self.max_topics {
            return Err(MetaError::Apply(ApplyError::Conflict(format!(
                "topic limit reached: the cluster holds {} topics and topic.max_topics is {}; \
                 delete a topic first",
                view.topics.len(),
                self.max_topics
            ))));
        }
        self.meta.write_indexed(cmd).await
    }

    /// Whether this node is admitted (a voter of an initialized cluster).
    pub fn admitted(&self) -> bool {
        self.admitted.load(Ordering::Acquire)
    }
    pub(crate) fn set_admitted(&self) {
        self.admitted.store(true, Ordering::Release);
    }
    pub fn registered(&self) -> bool {
        self.registered.load(Ordering::Acquire)
    }
    pub(crate) fn set_registered(&self) {
        self.registered.store(true, Ordering::Release);
    }
    /// Whether this node (a leader shutting down) is handing leadership off.
    pub fn handing_off(&self) -> bool {
        self.handing_off.load(Ordering::Acquire)
    }

    /// Graceful shutdown of the leader (SPEC §6.2): stop taking metadata writes, wait until
    /// another voter holds every entry, ask it to start an election (`TransferLeadership`),
    /// and wait until it leads. Returns how long that took; `None` when leadership stayed
    /// here (not the leader, no caught-up voter within the budget, or the successor did not
    /// win), in which case this node takes writes again until it stops.
    pub async fn hand_off_leadership(&self) -> Option<Duration> {
        if !self.clustered || !self.meta.is_leader() || self.meta.voters().len() < 2 {
            return None;
        }
        let started = tokio::time::Instant::now();
        let deadline = started + HANDOFF_BUDGET;
        self.handing_off.store(true, Ordering::Release);
        let moved = async {
            let ((to, _), last_index) = loop {
                if let Some(v) = self.meta.caught_up_voter() {
                    break v;
                }
                if tokio::time::Instant::now() >= deadline {
                    tracing::warn!("no voter caught up in time; leadership stays until the node stops");
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            self.meta.set_electing(false);
            let transfer = wire::TransferRequest { last_index };
            // The successor's first election can fail: a leader elected less than a lease
            // ago still refuses votes. That failed round makes this node step down, so the
            // request is repeated until the successor leads.
            let mut asked = None::<tokio::time::Instant>;
            while tokio::time::Instant::now() < deadline {
                if let Some((leader, _)) = self.meta.current_leader() {
                    if leader != self.node_id && !self.meta.is_leader() {
                        tracing::info!(to = %leader, ms = started.elapsed().as_millis() as u64,
                            "metadata leadership handed off");
                        return true;
                    }
                }
                if asked.is_none_or(|t| t.elapsed() >= HANDOFF_RETRY) {
                    asked = Some(tokio::time::Instant::now());
                    if let Err(e) = self.ask(&to, &transfer).await {
                        tracing::warn!(to = %to, code = e.code.number(), error = %e.message, "leadership handoff refused or failed");
                        return false;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tracing::warn!(to = %to, "the successor did not take over in time");
            false
        }
        .await;
        if moved {
            return Some(started.elapsed());
        }
        self.meta.set_electing(true);
        self.handing_off.store(false, Ordering::Release);
        None
    }

    /// Looks a topic up by id in the current view (index rebuilt when the view changes).
    pub fn topic_by_id(&self, id: u64) -> TopicLookup {
        let view = self.meta.view();
        let cached = self.by_id.load();
        let found = if Arc::ptr_eq(&cached.0, &view) {
            cached.1.get(&id).cloned()
        } else {
            let map = topics_by_id(&view);
            let found = map.get(&id).cloned();
            self.by_id.store(Arc::new((view.clone(), map)));
            found
        };
        match found {
            Some(t) => TopicLookup::Known(t),
            None if id < view.next_topic_id => TopicLookup::Deleted,
            None => TopicLookup::Unknown,
        }
    }

    /// Whether member `id` is alive in `view` (unknown members count as dead).
    pub fn is_alive(view: &MetaState, id: &str) -> bool {
        view.members.get(id).is_some_and(|m| !m.dead)
    }

    /// The owner of partition `p` of `topic`, if assigned.
    pub fn owner(topic: &Topic, p: u32) -> Option<&str> {
        topic
            .assignments
            .get(p as usize)
            .and_then(|a| a.owner.as_deref())
    }

    /// Whether partition `p` of `topic` is owned by this node.
    pub fn is_mine(&self, topic: &Topic, p: u32) -> bool {
        Cluster::owner(topic, p) == Some(self.node_id.as_str())
    }

    /// Brings the node-RPC peer registry in line with the members and seeds.
    pub fn sync_peers(&self, view: &MetaState) {
        let mut addrs: HashMap<&str, &str> = self
            .seeds
            .iter()
            .map(|(id, a)| (id.as_str(), a.as_str()))
            .collect();
        for m in view.members.values() {
            if !m.cluster_addr.is_empty() {
                addrs.insert(m.id.as_str(), m.cluster_addr.as_str());
            }
        }
        self.peers.sync(addrs);
    }

    /// The typed call `req` on node `id` (its opcode and reply type from the table,
    /// `calls`), waiting its default timeout.
    pub async fn ask<C: calls::Call>(&self, id: &str, req: &C) -> ApiResult<C::Reply> {
        self.ask_within(id, req, C::TIMEOUT).await
    }

    /// [`Cluster::ask`] waiting at most `timeout`. A refusal is the peer's error with its
    /// code; a failure to reach the peer is [`rpc_error`]'s; an answer that cannot be read is
    /// `502` (the peer got the request, so it may have acted on it).
    pub async fn ask_within<C: calls::Call>(
        &self,
        id: &str,
        req: &C,
        timeout: Duration,
    ) -> ApiResult<C::Reply> {
        let op = req.opcode();
        self.ask_or_older(id, req, timeout)
            .await?
            .ok_or_else(|| rpc_error(id, &RpcError::PeerTooOld { op: op.code() }))
    }

    /// [`Cluster::ask_within`] for a call whose row has a fallback (`calls::TABLE`): `None`
    /// when the peer's build predates the opcode, so the caller falls back to the older one.
    pub async fn ask_or_older<C: calls::Call>(
        &self,
        id: &str,
        req: &C,
        timeout: Duration,
    ) -> ApiResult<Option<C::Reply>> {
        let op = req.opcode();
        let reply = match self.rpc_call(id, op, req.encode(), timeout).await {
            Ok(reply) => reply,
            Err(RpcError::PeerTooOld { .. }) => return Ok(None),
            Err(e) => return Err(rpc_error(id, &e)),
        };
        calls::read_answer::<C>(id, op, reply).map(Some)
    }

    /// The relayed call `req` on node `id`: its answer whatever the status (the forwarding
    /// node returns it to its client as it is); waits `extra` beyond the call's own timeout
    /// (the time the request itself may wait, e.g. a long poll). A failure to reach the peer
    /// is [`rpc_error`]'s: `503` when the request never reached the peer (it is down or cut
    /// off; SPEC §6.4), `502` when the peer may have executed it.
    pub async fn relay<R: calls::Relay>(
        &self,
        id: &str,
        req: &R,
        extra: Duration,
    ) -> ApiResult<RpcReply> {
        self.rpc_call(id, req.opcode(), req.encode(), extra + R::TIMEOUT)
            .await
            .map_err(|e| rpc_error(id, &e))
    }

    /// Calls `op` on node `id` and returns the transport's own error (e.g.
    /// [`RpcError::PeerTooOld`], for callers with an older opcode to fall back to).
    async fn rpc_call(
        &self,
        id: &str,
        op: Opcode,
        body: Bytes,
        timeout: Duration,
    ) -> Result<RpcReply, RpcError> {
        if self.peers.get(id).is_none() {
            self.sync_peers(&self.meta.view());
        }
        self.peers.call(id, op, body, timeout).await
    }

    /// Whether node `id` answers a ping within a second.
    pub async fn reachable(&self, id: &str) -> bool {
        if self.peers.get(id).is_none() {
            self.sync_peers(&self.meta.view());
        }
        match self.peers.get(id) {
            Some(c) => c.ping(Duration::from_secs(1)).await.is_ok(),
            None => false,
        }
    }

    /// Proposes a metadata command: on the leader directly, elsewhere forwarded to the leader
    /// (SPEC §6.3); returns once the local replica has applied it, so the caller reads its
    /// own write. No leader, no quorum → `503`.
    pub async fn propose(&self, cmd: MetaCommand) -> ApiResult<MetaResponse> {
        if !self.clustered {
            return self
                .leader_write(cmd)
                .await
                .map(|(r, _)| r)
                .map_err(ApiError::from);
        }
        let op = forward_opcode(&cmd);
        let deadline = tokio::time::Instant::now() + FORWARD_TIMEOUT;
        let mut last = ApiError::unavailable("no metadata leader", 1);
        // A leader change while forwarding answers "not the leader": try the new one, a few
        // times, within the forwarding budget.
        for attempt in 0..5u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            if self.meta.is_leader() && self.handing_off() {
                // Leadership is moving away: the write goes to the successor shortly.
                last = ApiError::unavailable("the metadata leader is handing off", 1);
                continue;
            }
            if self.meta.is_leader() {
                match self.leader_write(cmd.clone()).await.map(|(r, _)| r) {
                    Err(e @ MetaError::NotLeader { .. }) => {
                        last = ApiError::from(e);
                        continue;
                    }
                    other => return other.map_err(ApiError::from),
                }
            }
            let Some(op) = op else {
                return Err(ApiError::unavailable(
                    "this change can only be made on the metadata leader",
                    1,
                ));
            };
            let Some((leader, _)) = self.meta.current_leader() else {
                last = ApiError::unavailable("metadata unavailable: no metadata leader", 1);
                continue;
            };
            let req = ProposeRequest {
                command: cmd.clone(),
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // Not `ask`: a request that never left is retried here, one that may have been
            // applied is not.
            let reply = match self.rpc_call(&leader, op, req.encode(), left).await {
                Ok(r) => r,
                // The leader may have committed it: sending it again could apply it twice
                // (or answer `409 already exists` for the caller's own create).
                Err(e) if e.outcome_unknown() => return Err(rpc_error(&leader, &e)),
                Err(e) => {
                    last = rpc_error(&leader, &e);
                    continue;
                }
            };
            if reply.is_success() {
                let r = ProposeRequest::decode(reply).map_err(|e| {
                    ApiError::uncertain(format!("unreadable answer from the metadata leader: {e}"))
                })?;
                if !self.meta.wait_applied(r.index, CATCH_UP_TIMEOUT).await {
                    tracing::warn!(
                        index = r.index,
                        "local replica slow to apply a forwarded write"
                    );
                }
                return Ok(r.response);
            }
            let e = ApiError::from_reply(&reply);
            // Leadership moved while forwarding: try the new leader. (A leader of a build
            // before error codes answers a plain 503, which goes back to the client.)
            if matches!(e.code, ErrorCode::NotLeader | ErrorCode::LeaderHandingOff) {
                last = e;
                continue;
            }
            return Err(e);
        }
        Err(last)
    }

    /// A current read of the metadata (SPEC §6.1 "before answering 404 … catches up"): the
    /// leader confirms its leadership (a Raft barrier) and says how far its state goes; this
    /// node waits until its replica has applied that far. Returns the topic `name` as the
    /// leader knows it, when asked. Fails (`503`) without a leader.
    pub async fn read_current(&self, name: Option<&str>) -> ApiResult<Option<Arc<Topic>>> {
        let (_, topic) = self.leader_read(name).await?;
        Ok(match name {
            Some(n) => self
                .meta
                .view()
                .topics
                .get(n)
                .cloned()
                .or(topic.map(Arc::new)),
            None => None,
        })
    }

    /// Brings the local replica up to everything the leader had committed when asked
    /// (a node that restarted or joined answers from a current view before it is ready):
    /// `503` without a leader, or while the replica has not applied that far after
    /// [`CATCH_UP_TIMEOUT`].
    pub async fn catch_up(&self) -> ApiResult<u64> {
        let (index, _) = self.leader_read(None).await?;
        if self.meta.applied_index() < index {
            return Err(ApiError::unavailable(
                format!(
                    "the metadata replica is catching up (applied {} of {index})",
                    self.meta.applied_index()
                ),
                1,
            ));
        }
        Ok(index)
    }

    /// The leader's barrier index (and topic `name` as it knows it), with the local replica
    /// given up to [`CATCH_UP_TIMEOUT`] to apply that far.
    async fn leader_read(&self, name: Option<&str>) -> ApiResult<(u64, Option<Topic>)> {
        if !self.clustered || self.meta.is_leader() {
            let index = self.meta.barrier().await.map_err(ApiError::from)?;
            return Ok((index, None));
        }
        let Some((leader, _)) = self.meta.current_leader() else {
            return Err(ApiError::unavailable(
                "metadata unavailable: no metadata leader",
                1,
            ));
        };
        let r = self
            .ask(
                &leader,
                &GetTopicRequest {
                    name: name.map(str::to_string),
                },
            )
            .await?;
        self.meta.wait_applied(r.index, CATCH_UP_TIMEOUT).await;
        Ok((r.index, r.topic))
    }
}

/// The most a leader's shutdown waits for its handoff.
const HANDOFF_BUDGET: Duration = Duration::from_secs(3);
/// How often a handing-off leader repeats its request to the successor.
pub(super) const HANDOFF_RETRY: Duration = Duration::from_millis(150);

/// The opcode a command is forwarded with; `None` for leader-only commands.
pub fn forward_opcode(cmd: &MetaCommand) -> Option<Opcode> {
    Some(match cmd {
        MetaCommand::CreateTopic { .. } | MetaCommand::CreateChildTopic { .. } => {
            Opcode::CreateTopic
        }
        MetaCommand::AttachChild { .. } => Opcode::AttachChild,
        MetaCommand::AttachRemoteChild { .. } => Opcode::AttachRemoteChild,
        MetaCommand::DetachChild { .. } => Opcode::DetachChild,
        MetaCommand::AlterTopic { .. } => Opcode::AlterTopic,
        MetaCommand::DeleteTopic { .. } => Opcode::DeleteTopic,
        MetaCommand::RegisterMember { .. } => Opcode::RegisterMember,
        MetaCommand::CreateUser { .. } => Opcode::CreateUser,
        // A leader of an older build cannot decode `SetQuotas` and refuses it: never applied
        // half-known.
        MetaCommand::SetGrants { .. }
        | MetaCommand::SetPassword { .. }
        | MetaCommand::SetQuotas { .. } => Opcode::UpdateUser,
        MetaCommand::DeleteUser { .. } => Opcode::DeleteUser,
        // The forced flip and the settling of its salvage claim finish a move too.
        MetaCommand::CompleteMove { .. }
        | MetaCommand::ForceCompleteMove { .. }
        | MetaCommand::SalvageDone { .. } => Opcode::CompleteMove,
        MetaCommand::AbortMove { .. } => Opcode::AbortMove,
        MetaCommand::SetDraining { .. } => Opcode::DecommissionMember,
        MetaCommand::SeedRoot { .. }
        | MetaCommand::MarkMemberDead { .. }
        | MetaCommand::StartMove { .. }
        | MetaCommand::RemoveMember { .. } => return None,
    })
}

/// The HTTP answer for a node-RPC call to `id` that got no reply (SPEC §3.11), the one
/// place the classification of [`RpcError`] becomes a status:
///
/// - the request never left this node (connect refused, handshake failed, no connection,
///   still queued when the connection closed or the timeout passed): nothing was applied,
///   `503` + `Retry-After: 1`, safe to retry;
/// - it was written and no answer came back (connection lost, timeout, unreadable reply):
///   the owner or leader may have applied it, `502` with [`crate::error::UNCERTAIN`].
pub fn rpc_error(id: &str, e: &RpcError) -> ApiError {
    if e.outcome_unknown() {
        ApiError::uncertain(format!("node {id} did not answer: {e}"))
    } else {
        ApiError::unavailable(format!("node {id} is unavailable: {e}"), 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn a_request_that_never_left_is_503_and_one_that_did_is_502_uncertain() {
        for e in [
            RpcError::Unreachable("connect to 127.0.0.1:1: refused".into()),
            RpcError::NotSent("the connection closed before the request was written".into()),
            RpcError::Auth("bad proof".into()),
            RpcError::PeerTooOld { op: 1 },
        ] {
            let a = rpc_error("n1", &e);
            assert_eq!(a.status(), StatusCode::SERVICE_UNAVAILABLE, "{e:?}");
            assert_eq!(a.retry_after, Some(1));
            assert!(
                a.message.starts_with("node n1 is unavailable: "),
                "{}",
                a.message
            );
            assert!(!a.message.contains("may still be applied"), "{}", a.message);
        }
        for e in [
            RpcError::Timeout,
            RpcError::Disconnected("connection closed by the peer".into()),
            RpcError::BadReply("truncated".into()),
        ] {
            let a = rpc_error("n1", &e);
            assert_eq!(a.status(), StatusCode::BAD_GATEWAY, "{e:?}");
            // The text the Go SDK looks for (CLIENT-COMPAT §4.3).
            assert!(
                a.message.contains("the change may still be applied"),
                "{}",
                a.message
            );
            assert!(
                a.message.contains("the outcome is unknown"),
                "{}",
                a.message
            );
            assert!(
                a.message.starts_with("node n1 did not answer: "),
                "{}",
                a.message
            );
        }
    }

    #[test]
    fn a_metadata_write_not_confirmed_is_502_uncertain_and_a_refused_one_503() {
        let a = ApiError::from(MetaError::Uncertain("not committed within 10 s".into()));
        assert_eq!(a.status(), StatusCode::BAD_GATEWAY);
        assert!(
            a.message.contains("the change may still be applied"),
            "{}",
            a.message
        );
        let a = ApiError::from(MetaError::Unavailable("no quorum".into()));
        assert_eq!(a.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!a.message.contains("may still be applied"), "{}", a.message);
        let a = ApiError::from(MetaError::NotLeader {
            leader: Some("n2".into()),
        });
        assert_eq!(
            (a.status(), a.code),
            (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::NotLeader)
        );
        assert_eq!(
            a.message,
            "metadata unavailable: not the metadata leader; the leader is n2"
        );
    }

    #[test]
    fn a_relayed_502_keeps_its_status_and_retry_after() {
        let e = ApiError::from_reply(&ApiError::uncertain("x").to_reply());
        assert_eq!(e.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(e.retry_after, Some(1));
    }
}
