//! Narad's metadata: a Raft-replicated state machine (openraft) persisted on disk (redb).
//!
//! - `types`: the records (topics, assignments, members) and `MetaCommand`s.
//! - `state`: `MetaState::apply`, the pure, deterministic core.
//! - `raft`: openraft type config, the redb log store and state machine, the network.
//! - `Meta`: the handle the broker uses: `write` a command, read the applied `view`.
//!
//! # Durability and restart
//!
//! Everything lives in one redb file, `<dir>/raft.redb`. Log entries, the vote, truncations
//! and purges are fsynced before openraft is told they are persisted. The state machine is
//! kept in memory and rebuilt on open from the last snapshot (the whole `MetaState` as JSON,
//! written durably every [`SNAPSHOT_EVERY_LOGS`] entries, always before the logs it covers are
//! purged) plus a replay of the committed log after it. So a crash at any point loses nothing
//! that was committed, and `view()` never shows a state the log does not back.
//! See `raft::store` for the details.
//!
//! # Timing
//!
//! A `write` on the leader costs one redb commit (fsync) of the log entry, then the apply; with
//! a quorum of others, one network round trip plus their fsyncs. Concurrent writes share
//! appends when openraft batches them.

mod children;
pub mod raft;
mod state;
pub mod types;

pub use raft::{
    raft_node_id, MetaNode, NoTransport, RaftReply, RaftRequest, RaftTransport, TransportError,
};
pub use types::*;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{ServerState, SnapshotPolicy};

use raft::{Published, RaftMetrics, RaftNodeId, Store};

/// Raft heartbeat: a leader pings followers this often (ms).
pub const HEARTBEAT_INTERVAL_MS: u64 = 100;
/// A follower that hears no leader for a random time in this range starts an election (ms).
/// 5–10 heartbeats: tolerant of a slow fsync or a busy 2-core node, and an election
/// (detection + one vote round) stays around a second, as SPEC §6.2 expects.
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 500;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 1000;
/// Build a snapshot after this many applied entries since the last one. Bounds the replay on
/// restart and the log kept on disk.
pub const SNAPSHOT_EVERY_LOGS: u64 = 1000;
/// Logs kept behind a snapshot so slightly lagging followers catch up without a snapshot.
pub const LOGS_KEPT_AFTER_SNAPSHOT: u64 = 500;
/// How long a write may wait to be committed and applied (SPEC §6.3: commits 30 s).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `open_standalone` waits to become leader and catch up.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `barrier` waits for a quorum to confirm leadership.
pub const BARRIER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a metadata write did not happen (or may have happened).
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The state machine refused the command.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// This node is not the metadata leader (`leader`: the one it knows of): nothing applied;
    /// the caller retries at the leader (→ 503).
    #[error("metadata unavailable: {}", match leader {
        Some(l) => format!("not the metadata leader; the leader is {l}"),
        None => "no metadata leader".to_string(),
    })]
    NotLeader { leader: Option<String> },
    /// No leader / no quorum: nothing applied (→ 503).
    #[error("metadata unavailable: {0}")]
    Unavailable(String),
    /// The outcome is unknown (→ 503 with "the change may still be applied").
    #[error("the change may still be applied: {0}")]
    Uncertain(String),
    #[error("metadata storage error: {0}")]
    Storage(String),
}

/// Options for opening the metadata node.
#[derive(Debug, Clone)]
pub struct MetaOptions {
    pub node_id: NodeId,
    /// Address other nodes reach this node's cluster port at.
    pub cluster_addr: String,
}

/// Handle to the local metadata replica (and Raft node).
#[derive(Clone)]
pub struct Meta {
    inner: Arc<Inner>,
}

struct Inner {
    node_id: NodeId,
    raft_id: RaftNodeId,
    cluster_addr: String,
    raft: raft::Raft,
    published: Arc<Published>,
    /// Lets `shutdown` wait until the database file is closed (so it can be re-opened).
    db_closed: tokio::sync::watch::Receiver<()>,
    /// The snapshot being received from the leader: its id and the bytes received so far
    /// (see [`Meta::handle_raft_rpc`]).
    snapshot_rx: std::sync::Mutex<Option<(String, u64)>>,
}

/// The openraft configuration Narad runs with.
pub fn raft_config() -> openraft::Config {
    let config = openraft::Config {
        cluster_name: "narad-meta".into(),
        heartbeat_interval: HEARTBEAT_INTERVAL_MS,
        election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        // Per snapshot chunk; metadata snapshots are small but the link may be busy.
        install_snapshot_timeout: 2000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_LOGS),
        max_in_snapshot_log_to_keep: LOGS_KEPT_AFTER_SNAPSHOT,
        purge_batch_size: 64,
        ..Default::default()
    };
    config
        .validate()
        .expect("invariant: the built-in raft config is valid")
}

impl Meta {
    /// Opens `dir` (the `metastore/` folder), starts the Raft node, and — when the store is
    /// empty — bootstraps a one-voter cluster of this node. Returns once the node is leader of
    /// its one-voter cluster and has applied every committed entry.
    pub async fn open_standalone(dir: &Path, opts: MetaOptions) -> Result<Meta, MetaError> {
        let meta = Meta::open(dir, opts, Arc::new(NoTransport)).await?;
        let raft = &meta.inner.raft;
        let me = meta.inner.raft_id;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| MetaError::Storage(e.to_string()))?;
        if !initialized {
            tracing::info!(node = %meta.inner.node_id, "bootstrapping a one-voter metadata cluster");
            meta.initialize(&[(meta.inner.node_id.clone(), meta.inner.cluster_addr.clone())])
                .await?;
        } else {
            let (voters, state) = {
                let m = raft.metrics();
                let m = m.borrow();
                (m.membership_config.voter_ids().collect::<Vec<_>>(), m.state)
            };
            if voters != [me] {
                tracing::warn!(?voters, "standalone node's metastore lists other voters");
            } else if state != ServerState::Leader {
                // Sole voter: no need to sit out an election timeout. (One whose vote was
                // committed usually restarts as leader at once.)
                let _ = raft.trigger().elect().await;
            }
        }
        meta.wait_leader_caught_up(STARTUP_TIMEOUT).await?;
        tracing::info!(node = %meta.inner.node_id, applied = meta.applied_index(), "metadata leader elected");
        Ok(meta)
    }

    /// Opens `dir`, restores the state machine (snapshot + committed log) and starts the Raft
    /// node with `transport` for node-to-node RPCs. Does not bootstrap: see [`Meta::initialize`].
    /// The returned node may not have a leader yet.
    pub async fn open(
        dir: &Path,
        opts: MetaOptions,
        transport: Arc<dyn RaftTransport>,
    ) -> Result<Meta, MetaError> {
        let owned_dir = dir.to_path_buf();
        let store = tokio::task::spawn_blocking(move || Store::open(&owned_dir))
            .await
            .map_err(|e| MetaError::Storage(e.to_string()))?
            .map_err(MetaError::Storage)?;
        store.claim(&opts.node_id).map_err(MetaError::Storage)?;
        let published = Published::new();
        let sm = store
            .state_machine(published.clone())
            .map_err(|e| MetaError::Storage(e.to_string()))?;
        let raft_id = raft_node_id(&opts.node_id);
        let network = raft::NetworkFactory {
            self_id: raft_id,
            transport,
        };
        let db_closed = store.closed();
        let raft = raft::Raft::new(
            raft_id,
            Arc::new(raft_config()),
            network,
            store.log_store(),
            sm,
        )
        .await
        .map_err(|e| MetaError::Storage(e.to_string()))?;
        drop(store);
        Ok(Meta {
            inner: Arc::new(Inner {
                node_id: opts.node_id,
                raft_id,
                cluster_addr: opts.cluster_addr,
                raft,
                published,
                db_closed,
                snapshot_rx: std::sync::Mutex::new(None),
            }),
        })
    }

    /// Bootstraps a cluster whose voters are `members` (string id, cluster address). Calling it
    /// on several nodes with the same list is safe. A node that is already initialized, or has
    /// already voted for a peer that bootstrapped first, answers `Ok` and leaves its state as is.
    pub async fn initialize(&self, members: &[(NodeId, String)]) -> Result<(), MetaError> {
        let nodes: BTreeMap<RaftNodeId, MetaNode> = members
            .iter()
            .map(|(name, addr)| {
                (
                    raft_node_id(name),
                    MetaNode {
                        name: name.clone(),
                        addr: addr.clone(),
                    },
                )
            })
            .collect();
        if nodes.len() != members.len() {
            return Err(MetaError::Unavailable(
                "duplicate (or colliding) node ids in the voter list".into(),
            ));
        }
        match self.inner.raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                tracing::info!(reason = %e, "metadata raft already initialized or contacted; not bootstrapping");
                Ok(())
            }
            Err(e) => Err(MetaError::Unavailable(format!("initialize: {e}"))),
        }
    }

    /// Proposes a command through Raft and waits until it is committed and applied locally.
    pub async fn write(&self, cmd: MetaCommand) -> Result<MetaResponse, MetaError> {
        self.write_indexed(cmd).await.map(|(r, _)| r)
    }

    /// Like [`Meta::write`], also returning the log index the command was applied at (a
    /// follower that forwarded the write waits until it has applied that index itself).
    pub async fn write_indexed(&self, cmd: MetaCommand) -> Result<(MetaResponse, u64), MetaError> {
        // Errors before the entry is appended: nothing happened.
        let rx = self
            .inner
            .raft
            .client_write_ff(cmd)
            .await
            .map_err(|e| MetaError::Unavailable(e.to_string()))?;
        match tokio::time::timeout(WRITE_TIMEOUT, rx).await {
            Err(_) => Err(MetaError::Uncertain(format!(
                "not committed within {} s",
                WRITE_TIMEOUT.as_secs()
            ))),
            // The core stopped or dropped the responder after accepting the entry.
            Ok(Err(_)) => Err(MetaError::Uncertain(
                "the metadata node stopped or lost leadership".into(),
            )),
            Ok(Ok(Ok(resp))) => {
                let index = resp.log_id.index;
                resp.data.map(|d| (d, index)).map_err(MetaError::Apply)
            }
            // Not the leader, or the entry was overwritten by a new leader: never applied.
            Ok(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => Err(MetaError::NotLeader {
                leader: f.leader_node.map(|n| n.name),
            }),
            Ok(Ok(Err(e @ ClientWriteError::ChangeMembershipError(_)))) => {
                Err(MetaError::Unavailable(e.to_string()))
            }
        }
    }

    /// Whether this node's Raft state holds a membership (it bootstrapped or joined).
    pub async fn is_initialized(&self) -> bool {
        self.inner.raft.is_initialized().await.unwrap_or(false)
    }

    /// The voters of the current membership: (string id, cluster address), sorted by id.
    pub fn voters(&self) -> Vec<(NodeId, String)> {
        let metrics = self.metrics();
        let cfg = &metrics.membership_config;
        let mut out: Vec<(NodeId, String)> = cfg
            .voter_ids()
            .filter_map(|id| {
                cfg.nodes()
                    .find(|(n, _)| **n == id)
                    .map(|(_, n)| (n.name.clone(), n.addr.clone()))
            })
            .collect();
        out.sort();
        out
    }

    /// Every node of the membership, voters and learners: (string id, cluster address).
    pub fn membership_nodes(&self) -> Vec<(NodeId, String)> {
        self.metrics()
            .membership_config
            .nodes()
            .map(|(_, n)| (n.name.clone(), n.addr.clone()))
            .collect()
    }

    /// Leader only: makes `name` (at cluster address `addr`) a voter. Idempotent: a node that
    /// already votes answers `Ok` at once. Catches the node up as a learner first, so a slow
    /// joiner never costs the quorum.
    pub async fn add_voter(&self, name: &str, addr: &str) -> Result<(), MetaError> {
        let id = raft_node_id(name);
        let metrics = self.metrics();
        let cfg = &metrics.membership_config;
        let is_voter = cfg.voter_ids().any(|v| v == id);
        let known_name = cfg
            .nodes()
            .find(|(n, _)| **n == id)
            .map(|(_, n)| n.name.clone());
        if let Some(known) = known_name.as_deref() {
            if known != name {
                return Err(MetaError::Unavailable(format!(
                    "node id {name} collides with member {known}"
                )));
            }
        }
        if is_voter {
            return Ok(());
        }
        let node = MetaNode {
            name: name.to_string(),
            addr: addr.to_string(),
        };
        self.inner
            .raft
            .add_learner(id, node, true)
            .await
            .map_err(|e| MetaError::Unavailable(format!("add learner {name}: {e}")))?;
        self.inner
            .raft
            .change_membership(
                openraft::ChangeMembers::AddVoterIds([id].into_iter().collect()),
                false,
            )
            .await
            .map_err(|e| MetaError::Unavailable(format!("add voter {name}: {e}")))?;
        tracing::info!(node = %name, addr = %addr, "admitted a voter");
        Ok(())
    }

    /// Leader only: removes `name` from the voters (and the membership). Idempotent: a node
    /// that does not vote answers `Ok`. Refused when it would leave fewer than `min_voters`.
    pub async fn remove_voter(&self, name: &str, min_voters: usize) -> Result<(), MetaError> {
        let id = raft_node_id(name);
        let metrics = self.metrics();
        let cfg = &metrics.membership_config;
        let voters: Vec<RaftNodeId> = cfg.voter_ids().collect();
        if !voters.contains(&id) {
            return Ok(());
        }
        if voters.len() <= min_voters {
            return Err(MetaError::Unavailable(format!(
                "removing {name} would leave fewer than {min_voters} voters"
            )));
        }
        self.inner
            .raft
            .change_membership(
                openraft::ChangeMembers::RemoveVoters([id].into_iter().collect()),
                false,
            )
            .await
            .map_err(|e| MetaError::Unavailable(format!("remove voter {name}: {e}")))?;
        tracing::info!(node = %name, "removed a voter");
        Ok(())
    }

    /// Waits until the local replica has applied `index` (false on timeout).
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        let mut rx = self.subscribe();
        let wait = async {
            loop {
                if *rx.borrow_and_update() >= index {
                    return true;
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(false)
    }

    /// The latest applied state (lock-free snapshot).
    pub fn view(&self) -> Arc<MetaState> {
        self.inner.published.view.load_full()
    }

    /// Changes whenever a new state is applied (value: last applied log index).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.published.applied.subscribe()
    }

    /// The last applied log index (what `subscribe` reports).
    pub fn applied_index(&self) -> u64 {
        *self.inner.published.applied.borrow()
    }

    /// Stops the Raft node and flushes the store. Returns once the database file is closed,
    /// so the same directory can be opened again.
    pub async fn shutdown(&self) {
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft core did not stop cleanly");
        }
        // The state-machine worker and snapshot builders let go of the database shortly after
        // the core stops; wait until redb has closed the file.
        let mut closed = self.inner.db_closed.clone();
        if tokio::time::timeout(Duration::from_secs(10), async {
            while closed.changed().await.is_ok() {}
        })
        .await
        .is_err()
        {
            tracing::warn!("metastore database still open 10 s after shutdown");
        }
    }

    /// This node's string id.
    pub fn node_id(&self) -> &NodeId {
        &self.inner.node_id
    }

    /// The underlying openraft node (membership changes, metrics, triggers).
    pub fn raft(&self) -> &raft::Raft {
        &self.inner.raft
    }

    /// The latest Raft metrics.
    pub fn metrics(&self) -> RaftMetrics {
        self.inner.raft.metrics().borrow().clone()
    }

    /// Whether this node currently believes it is the leader (no quorum check; see `barrier`).
    pub fn is_leader(&self) -> bool {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.inner.raft_id)
    }

    /// The current leader as this node knows it: (string id, cluster address).
    pub fn current_leader(&self) -> Option<(NodeId, String)> {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader?;
        let found = m
            .membership_config
            .nodes()
            .find(|(id, _)| **id == leader)
            .map(|(_, n)| (n.name.clone(), n.addr.clone()));
        found
    }

    /// Leader only: a voter other than this node whose log holds this node's last entry,
    /// and that last index: where a leadership handoff can go (SPEC §6.2).
    pub fn caught_up_voter(&self) -> Option<((NodeId, String), u64)> {
        let m = self.metrics();
        let last = m.last_log_index?;
        let replication = m.replication.as_ref()?;
        let cfg = &m.membership_config;
        cfg.voter_ids()
            .filter(|id| *id != self.inner.raft_id)
            .filter(|id| {
                replication
                    .get(id)
                    .and_then(|l| l.as_ref())
                    .is_some_and(|l| l.index >= last)
            })
            .find_map(|id| {
                cfg.nodes()
                    .find(|(n, _)| **n == id)
                    .map(|(_, n)| ((n.name.clone(), n.addr.clone()), last))
            })
    }

    /// The successor's side of a handoff: a voter whose log reaches `last_index` starts an
    /// election at once. The old leader grants its vote (its own lease dates from when it
    /// became leader, and the candidate's log is as long as its own), which makes a majority
    /// of three by itself; the other voters follow the new term.
    pub async fn elect_now(&self, last_index: u64) -> Result<(), MetaError> {
        let m = self.metrics();
        if !m
            .membership_config
            .voter_ids()
            .any(|id| id == self.inner.raft_id)
        {
            return Err(MetaError::Unavailable("not a voter".into()));
        }
        if m.last_log_index.unwrap_or(0) < last_index {
            return Err(MetaError::Unavailable(format!(
                "log at {} of {last_index}",
                m.last_log_index.unwrap_or(0)
            )));
        }
        self.inner
            .raft
            .trigger()
            .elect()
            .await
            .map_err(|e| MetaError::Unavailable(e.to_string()))
    }

    /// Compacts this node's log: builds a snapshot of everything applied and purges the log
    /// entries it covers (openraft may delay the purge while a follower still replicates
    /// them). What left the state (a detached remote link and its sealed password) then
    /// leaves the log too; its database pages are freed and reused by later writes. Returns
    /// the index the log was purged to.
    pub async fn compact_log(&self, timeout: Duration) -> Result<u64, MetaError> {
        let Some(applied) = self.metrics().last_applied else {
            return Ok(0);
        };
        let raft = &self.inner.raft;
        let unavailable = |e: &dyn std::fmt::Display| MetaError::Unavailable(e.to_string());
        raft.trigger()
            .snapshot()
            .await
            .map_err(|e| unavailable(&e))?;
        let m = raft
            .wait(Some(timeout))
            .metrics(
                |m| m.snapshot.is_some_and(|s| s.index >= applied.index),
                "a snapshot of the applied log",
            )
            .await
            .map_err(|e| unavailable(&e))?;
        let upto = m.snapshot.map_or(0, |s| s.index);
        raft.trigger()
            .purge_log(upto)
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(upto)
    }

    /// Whether this node starts elections (off while a leader hands off before it stops).
    pub fn set_electing(&self, on: bool) {
        self.inner.raft.runtime_config().elect(on);
    }

    /// Linearizable barrier: confirms with a quorum that this node is still the leader and
    /// waits until the state machine has applied every entry committed before the call. After
    /// `Ok`, `view()` is current (SPEC §6.1 "never destroy on a stale view"). Fails with
    /// `Unavailable` on a non-leader or without a quorum.
    /// Returns the log index the view is current to.
    pub async fn barrier(&self) -> Result<u64, MetaError> {
        match tokio::time::timeout(BARRIER_TIMEOUT, self.inner.raft.ensure_linearizable()).await {
            Err(_) => Err(MetaError::Unavailable(
                "leadership not confirmed in time".into(),
            )),
            Ok(Ok(read)) => Ok(read.map_or(0, |l| l.index).max(self.applied_index())),
            Ok(Err(RaftError::APIError(e))) => Err(MetaError::Unavailable(e.to_string())),
            Ok(Err(RaftError::Fatal(e))) => Err(MetaError::Unavailable(e.to_string())),
        }
    }

    /// Serves a Raft RPC received from a peer (the receiving end of a [`RaftTransport`]).
    pub async fn handle_raft_rpc(&self, req: RaftRequest) -> RaftReply {
        let raft = &self.inner.raft;
        match req {
            RaftRequest::AppendEntries(r) => RaftReply::AppendEntries(raft.append_entries(r).await),
            RaftRequest::Vote(r) => RaftReply::Vote(raft.vote(r).await),
            RaftRequest::InstallSnapshot(r) => {
                if let Err(mismatch) = self.check_snapshot_chunk(&r) {
                    return RaftReply::InstallSnapshot(Err(RaftError::APIError(
                        openraft::error::InstallSnapshotError::SnapshotMismatch(mismatch),
                    )));
                }
                RaftReply::InstallSnapshot(raft.install_snapshot(r).await)
            }
        }
    }

    /// A snapshot chunk is written at its offset into an in-memory buffer, so a chunk far past
    /// what was received would allocate the gap. Chunks must be contiguous: a new snapshot
    /// starts at offset 0, each later chunk at most at the bytes received so far (a resent
    /// chunk may overlap). Anything else is a mismatch, which makes the leader start over at 0.
    fn check_snapshot_chunk(
        &self,
        r: &openraft::raft::InstallSnapshotRequest<raft::TypeConfig>,
    ) -> Result<(), openraft::error::SnapshotMismatch> {
        let id = &r.meta.snapshot_id;
        let mut rx = self
            .inner
            .snapshot_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let received = match &*rx {
            Some((current, received)) if current == id => *received,
            _ => 0,
        };
        if r.offset > received {
            return Err(openraft::error::SnapshotMismatch {
                expect: openraft::SnapshotSegmentId {
                    id: id.clone(),
                    offset: received,
                },
                got: openraft::SnapshotSegmentId {
                    id: id.clone(),
                    offset: r.offset,
                },
            });
        }
        let end = (r.offset + r.data.len() as u64).max(received);
        *rx = if r.done {
            None
        } else {
            Some((id.clone(), end))
        };
        Ok(())
    }

    /// Waits until this node leads and has applied its whole log.
    async fn wait_leader_caught_up(&self, timeout: Duration) -> Result<(), MetaError> {
        let me = self.inner.raft_id;
        self.inner
            .raft
            .wait(Some(timeout))
            .metrics(
                |m| {
                    m.state == ServerState::Leader
                        && m.current_leader == Some(me)
                        && m.last_log_index.is_some()
                        && m.last_applied.map(|l| l.index) == m.last_log_index
                },
                "leader with every entry applied",
            )
            .await
            .map(|_| ())
            .map_err(|e| {
                MetaError::Unavailable(format!("metadata node did not become leader: {e}"))
            })
    }
}
