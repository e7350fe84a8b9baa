//! The composition root: builds a node from its `Config`, starts its tasks, serves HTTP,
//! and shuts down in order (stop taking requests, let in-flight ones finish, flush).

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use narad_api::PartitionStats;
use narad_meta::{Meta, MetaCommand, MetaOptions, MetaResponse, MetaState, Topic};
use narad_storage::LogConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::cluster::handler::NodeRpc;
use crate::cluster::router::NodeRouter;
use crate::cluster::{membership, Cluster, Timing};
use crate::config::Config;
use crate::error::{ApiError, ApiResult};
use crate::metrics::{
    ErrorLabels, Metrics, PartitionLabels, ReasonLabels, StatusLabels, TopicLabels, VersionLabels,
};
use crate::partition::{Registry, TopicRuntime};
use crate::schema::SchemaCache;
use crate::security::password::{self, HashParams};
use crate::security::{audit, Authenticator};
use crate::wal::dispatcher::Dispatcher;
use crate::wal::{Wal, WalOptions};

/// Threads for the fan-out engine's blocking work (reads, child commits, cursor files), at
/// a lower CPU priority than produce: one can read while the other waits for an fsync.
const FANOUT_IO_THREADS: usize = 2;

/// The most a node waits for a metadata index it was asked to apply, and the most a topic
/// change waits for the other live members to apply it (then the lagging ones catch up on
/// demand).
pub const MEMBER_CATCH_UP: Duration = Duration::from_secs(2);

/// The version this binary reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Handles to everything a request may need. Owns no request state.
pub struct Node {
    pub config: Config,
    /// Seals remote-child passwords before they are proposed (`None`: stored as given).
    pub credentials: Option<Arc<crate::security::sealing::CredentialKey>>,
    pub node_id: String,
    pub meta: Meta,
    pub wal: Wal,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub schemas: SchemaCache,
    /// Checks Basic credentials (verified-credential cache, throttle); used only with
    /// security on.
    pub auth: Authenticator,
    /// Child topics: the cursors copying parent records into children (SPEC §5).
    pub fanout: Arc<crate::fanout::Fanout>,
    /// Peers, placement, forwarding (a standalone node has one too).
    pub cluster: Arc<Cluster>,
    /// Consumes, replays and settles (SPEC §3.5, §3.6), here and on other owners.
    pub delivery: Arc<crate::delivery::Delivery>,
    /// The leader's reasons why drained members are not removed yet (empty elsewhere).
    decommission_reasons: parking_lot::Mutex<BTreeMap<String, String>>,
    ready: AtomicBool,
    /// SIGTERM arrived: `/readyz` fails while the node still serves for
    /// `http.shutdown_delay`, before the graceful shutdown.
    stopping: AtomicBool,
    /// `/readyz` answered ready once.
    was_ready: AtomicBool,
    shutdown: CancellationToken,
    data_dir: PathBuf,
    _lock: DirLock,
}

/// An exclusive lock on the data dir, so two processes never share one.
struct DirLock(#[allow(dead_code, reason = "held for its flock")] fs::File);

impl DirLock {
    fn acquire(dir: &Path) -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd;
        let path = dir.join("LOCK");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        narad_storage::dirs::sync_dir(dir).with_context(|| format!("fsync {}", dir.display()))?;
        // SAFETY: flock on a file descriptor we own; no memory is touched.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            anyhow::bail!(
                "data dir {} is in use by another narad process",
                dir.display()
            );
        }
        Ok(DirLock(f))
    }
}

/// Turns `:7942` into `0.0.0.0:7942`.
pub fn listen_addr(addr: &str) -> String {
    if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    }
}

impl Node {
    /// Whether requests need credentials (`config.security.enabled`; off with `--dev`).
    pub fn security_on(&self) -> bool {
        self.config.security.enabled
    }

    pub fn topic(&self, name: &str) -> ApiResult<Arc<Topic>> {
        self.meta
            .view()
            .topics
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::topic_not_found(name))
    }

    /// The local runtime of a topic (opening it if the metadata is ahead of the registry).
    pub fn runtime(&self, topic: &Topic) -> ApiResult<Arc<TopicRuntime>> {
        self.registry.runtime_of(&self.meta, &self.node_id, topic)
    }

    /// Topic `id` as this node knows it; a topic id it has not seen yet (newer than its
    /// view) makes it catch up with the leader first (a read index: the leader confirms its
    /// leadership and says how far its state goes) and open its partitions, so a request
    /// that raced a create is answered from the created topic, not refused (SPEC §3.3).
    pub async fn topic_by_id_current(&self, id: u64) -> crate::cluster::TopicLookup {
        self.delivery.topic_by_id_current(id).await
    }

    /// Waits (at most [`MEMBER_CATCH_UP`]) until this node has applied metadata `index`, then
    /// opens what it applied.
    pub async fn catch_up_to(&self, index: u64) {
        if !self.meta.wait_applied(index, MEMBER_CATCH_UP).await {
            tracing::debug!(
                index,
                applied = self.meta.applied_index(),
                "metadata not applied in time"
            );
        }
        if let Err(e) = self.apply_topics() {
            tracing::warn!(error = %e.message, "applying metadata to local partitions failed");
        }
    }

    /// After a topic change this node proposed (create, alter, delete, child attach): waits
    /// until every other live member has applied it and opened its partitions, so a client
    /// that goes to any node next sees the change (SPEC §3.3). Bounded by
    /// [`MEMBER_CATCH_UP`]: a member that is dead (or does not answer in time) is not waited
    /// for; it catches up with the leader when a request needs the topic
    /// ([`Node::topic_by_id_current`], the catch-up before a `404`).
    pub async fn await_members_applied(&self, topic: &Topic) {
        if !self.cluster.clustered {
            return;
        }
        let index = self.meta.applied_index();
        let view = self.meta.view();
        let others: Vec<String> = view
            .members
            .values()
            .filter(|m| !m.dead && m.id != self.node_id)
            .map(|m| m.id.clone())
            .collect();
        let started = Instant::now();
        let calls = others.iter().map(|id| {
            let req = crate::cluster::wire::StatsRequest {
                topic_id: topic.id,
                topic: topic.name.clone(),
                partitions: Vec::new(),
                min_index: Some(index),
            };
            async move {
                let r = self
                    .cluster
                    .ask_within(id, &req, MEMBER_CATCH_UP + Duration::from_millis(500))
                    .await;
                if let Err(e) = r {
                    tracing::debug!(member = %id, index, error = %e.message, "member did not confirm a topic change");
                }
            }
        });
        futures::future::join_all(calls).await;
        tracing::debug!(
            topic = %topic.name,
            index,
            members = others.len(),
            took_us = started.elapsed().as_micros() as u64,
            "members applied a topic change"
        );
    }

    /// Reconciles the local partitions with the metadata.
    pub fn apply_topics(&self) -> ApiResult<()> {
        self.registry.apply(&self.meta.view(), &self.node_id)
    }

    pub fn partition_stats(&self, topic: &Topic, p: u32) -> PartitionStats {
        let owner = topic
            .assignments
            .get(p as usize)
            .and_then(|a| a.owner.clone())
            .unwrap_or_default();
        match self.registry.topic(topic.id).and_then(|rt| rt.partition(p)) {
            Some(part) => {
                let s = part.log.stats();
                PartitionStats {
                    index: p,
                    segments: s.segments,
                    oldest_offset: s.oldest_offset,
                    next_offset: s.next_offset,
                    high_watermark: s.high_watermark,
                    size_bytes: s.size_bytes,
                    oldest_segment_at: (s.oldest_segment_last_write_ms > 0)
                        .then_some(s.oldest_segment_last_write_ms / 1000),
                    owner_node: owner,
                    status: "ok".into(),
                    owner_liveness: None,
                }
            }
            None => PartitionStats {
                index: p,
                owner_node: owner.clone(),
                status: "owner_unavailable".into(),
                owner_liveness: Some(
                    if owner.is_empty() {
                        "unassigned"
                    } else {
                        "unknown"
                    }
                    .into(),
                ),
                ..Default::default()
            },
        }
    }

    /// Stats of `partitions` of `topic`: local ones read here, the others asked of their
    /// owners (one call per owner, concurrently). An owner that is dead or does not answer
    /// yields `status: owner_unavailable` for its partitions (SPEC §3.2).
    pub async fn topic_stats(&self, topic: &Topic, partitions: &[u32]) -> Vec<PartitionStats> {
        let mut by_owner: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
        let mut out: Vec<PartitionStats> = Vec::with_capacity(partitions.len());
        // Partitions this node owns but has not opened yet (the metadata background task
        // lags the apply): open them now rather than report them unavailable.
        if self.registry.topic(topic.id).is_none() {
            let _ = self.runtime(topic);
        }
        // Counts include every record acknowledged before the call.
        self.delivery.make_visible(topic, None).await;
        for &p in partitions {
            match crate::cluster::Cluster::owner(topic, p) {
                Some(o) if o != self.node_id => by_owner.entry(o.to_string()).or_default().push(p),
                _ => out.push(self.partition_stats(topic, p)),
            }
        }
        let view = self.meta.view();
        let calls = by_owner.into_iter().map(|(owner, ps)| {
            let alive = crate::cluster::Cluster::is_alive(&view, &owner);
            async move {
                let unavailable = |liveness: &str| -> Vec<PartitionStats> {
                    ps.iter()
                        .map(|p| PartitionStats {
                            index: *p,
                            owner_node: owner.clone(),
                            status: "owner_unavailable".into(),
                            owner_liveness: Some(liveness.into()),
                            ..Default::default()
                        })
                        .collect()
                };
                if !alive {
                    return unavailable("dead");
                }
                let req = crate::cluster::wire::StatsRequest {
                    topic_id: topic.id,
                    topic: topic.name.clone(),
                    partitions: ps.clone(),
                    min_index: None,
                };
                match self.cluster.ask(&owner, &req).await {
                    Ok(got) => {
                        let missing = unavailable("alive");
                        ps.iter()
                            .map(|p| {
                                got.iter()
                                    .chain(missing.iter())
                                    .find(|g| g.index == *p)
                                    .cloned()
                                    .expect("invariant: missing covers every partition")
                            })
                            .collect()
                    }
                    Err(_) => unavailable("unreachable"),
                }
            }
        });
        for part in futures::future::join_all(calls).await {
            out.extend(part);
        }
        out.sort_by_key(|s| s.index);
        out.dedup_by_key(|s| s.index);
        out
    }

    /// Asks every other owner of a partition of `parent`, concurrently, the call `ask` makes
    /// of a `FanoutCursorsRequest`; the answers (owners that fail are left out).
    async fn ask_parent_owners<C: crate::cluster::calls::Call>(
        &self,
        parent: &Topic,
        ask: impl Fn(crate::cluster::wire::FanoutCursorsRequest) -> C,
    ) -> Vec<C::Reply> {
        let owners: std::collections::BTreeSet<&str> = parent
            .assignments
            .iter()
            .filter_map(|a| a.owner.as_deref())
            .filter(|o| *o != self.node_id)
            .collect();
        let req = ask(crate::cluster::wire::FanoutCursorsRequest {
            parent_id: parent.id,
            parent: parent.name.clone(),
        });
        let calls = owners.iter().map(|o| self.cluster.ask(o, &req));
        futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Lag per child of `parent` (SPEC §3.7): this node's cursors, plus those of the other
    /// parent partition owners (`FanoutCursors`, one call per owner, concurrently). A
    /// partition whose cursor did not report makes the sum a lower bound (`false`).
    pub async fn children_lag(
        &self,
        view: &MetaState,
        parent: &Topic,
    ) -> std::collections::BTreeMap<String, (u64, bool)> {
        let mut lags = self.fanout.partition_lags(view, parent);
        for remote in self
            .ask_parent_owners(parent, crate::cluster::calls::CursorLags)
            .await
        {
            for (child, parts) in remote {
                lags.entry(child).or_default().extend(parts);
            }
        }
        lags.into_iter()
            .map(|(child, parts)| {
                let complete = parts.len() as u32 == parent.config.partitions;
                (child, (parts.values().sum(), complete))
            })
            .collect()
    }

    /// `state`/`last_error` per remote link of `parent` across the cluster (SPEC §3.7): the
    /// worst of this node's cursors and every other parent-partition owner's
    /// (`RemoteLinkStates`); links with no cursor reporting are absent.
    pub async fn remote_link_states(
        &self,
        view: &MetaState,
        parent: &Topic,
    ) -> std::collections::BTreeMap<String, crate::fanout::remote::LinkStatus> {
        use crate::fanout::remote::{LinkState, LinkStatus};
        let mut all: std::collections::BTreeMap<String, Vec<LinkStatus>> = self
            .fanout
            .remote_states(view, parent)
            .into_iter()
            .map(|(k, v)| (k, vec![v]))
            .collect();
        if view.remote_links_of(&parent.name).is_empty() {
            return std::collections::BTreeMap::new();
        }
        for states in self
            .ask_parent_owners(parent, crate::cluster::calls::RemoteLinkStates)
            .await
        {
            for (link, s) in states {
                if let Some(state) = LinkState::parse(&s.state) {
                    all.entry(link).or_default().push(LinkStatus {
                        state,
                        last_error: s.last_error,
                    });
                }
            }
        }
        all.into_iter()
            .filter_map(|(k, v)| Some((k, crate::fanout::remote::worst(&v)?)))
            .collect()
    }

    /// `/readyz` (SPEC §3.10): recovery done, admitted to the cluster with a leader known and
    /// this node registered, and, with security on, the root admin seeded.
    /// Once ready, a node stays ready while it runs: losing the metadata quorum later must
    /// not take it out of service, since produce and consume go on without one (SPEC §1.1).
    pub fn is_ready(&self) -> bool {
        if self.was_ready.load(Ordering::Acquire) {
            return true;
        }
        let ready = self.startup_done()
            && self.cluster.admitted()
            && self.cluster.registered()
            && self.meta.current_leader().is_some()
            && (!self.security_on() || seeding_settled(&self.meta.view()));
        if ready {
            self.was_ready.store(true, Ordering::Release);
        }
        ready
    }

    /// Why a ready node takes itself out of service (`/readyz` 503, liveness unaffected):
    /// it is draining (it takes no new produce, SPEC §6.5) or no longer a member (it left
    /// the voters or its member record is gone). `None`: in service, or standalone.
    pub fn out_of_service(&self) -> Option<String> {
        if !self.cluster.clustered || !self.cluster.registered() {
            return None;
        }
        match self.meta.view().members.get(&self.node_id) {
            None => {
                return Some(format!(
                    "node {} is not a member of the cluster",
                    self.node_id
                ))
            }
            Some(m) if m.draining => {
                return Some(format!(
                    "node {} is draining (decommission): it takes no new produce",
                    self.node_id
                ))
            }
            Some(_) => {}
        }
        if !self.meta.voters().iter().any(|(id, _)| *id == self.node_id) {
            return Some(format!(
                "node {} is no longer a member of the cluster (not a voter)",
                self.node_id
            ));
        }
        None
    }

    /// Why `/readyz` is not ready (for its error body).
    pub fn not_ready_reason(&self) -> &'static str {
        if !self.startup_done() {
            "starting up"
        } else if !self.cluster.admitted() {
            "not admitted to the cluster yet"
        } else if self.meta.current_leader().is_none() {
            "no metadata leader"
        } else if !self.cluster.registered() {
            "member not registered yet"
        } else {
            "root admin not seeded yet"
        }
    }

    /// Why drained member `id` is not removed yet, when this node leads and knows.
    pub fn decommission_reason(&self, id: &str) -> Option<String> {
        self.decommission_reasons.lock().get(id).cloned()
    }

    /// The leader's controller publishes why drained members stay (see
    /// `cluster::controller::decommission_step`).
    pub fn set_decommission_reasons(&self, reasons: BTreeMap<String, String>) {
        *self.decommission_reasons.lock() = reasons;
    }

    /// Proposes a metadata change (through the Raft leader) and returns what it applied.
    pub async fn propose(&self, cmd: MetaCommand) -> ApiResult<MetaResponse> {
        self.cluster.propose(cmd).await
    }

    /// Recovery and startup reconciliation are done (readiness but for root seeding).
    pub fn startup_done(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }
    /// Whether the node is on its way out: `/readyz` fails, though it may still serve
    /// (`http.shutdown_delay`).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire) || self.is_shutting_down()
    }
    pub fn shutdown_signal(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.shutdown.cancelled()
    }

    pub fn reject(&self, topic: &Topic, reason: &'static str) {
        debug_assert!(crate::metrics::REJECT_REASONS.contains(&reason), "{reason}");
        self.metrics
            .produce_rejections
            .get_or_create(&ReasonLabels {
                topic: topic.name.clone(),
                reason,
            })
            .inc();
        self.forget_if_deleted(topic);
    }
    /// Removes the series of `topic` again if this replica has applied its deletion (see
    /// [`crate::metrics::Metrics::forget_if_deleted`]).
    fn forget_if_deleted(&self, topic: &Topic) {
        self.metrics.forget_if_deleted(&self.meta.view(), topic);
    }

    /// Refreshes the gauges that describe state rather than events.
    pub fn refresh_gauges(&self) {
        let m = &self.metrics;
        let view = self.meta.view();
        m.topics_total.set(view.topics.len() as i64);
        m.partitions_total.set(
            view.topics
                .values()
                .map(|t| t.config.partitions as i64)
                .sum(),
        );
        m.raft_is_leader.set(i64::from(self.meta.is_leader()));
        let alive = view.members.values().filter(|x| !x.dead).count() as i64;
        m.cluster_members
            .get_or_create(&StatusLabels { status: "alive" })
            .set(alive);
        m.cluster_members
            .get_or_create(&StatusLabels { status: "dead" })
            .set(view.members.len() as i64 - alive);
        let mut open = 0;
        let now = now_ms();
        let runtimes = self.registry.all();
        for rt in &runtimes {
            if !view.topics.get(&rt.name).is_some_and(|t| t.id == rt.id) {
                continue;
            }
            let mut topic_bytes = 0u64;
            for p in rt.partitions() {
                open += 1;
                let s = p.log.stats();
                topic_bytes += s.size_bytes;
                let (lag, inflight, acked_ahead, _, _) = p.queue_stats();
                let l = PartitionLabels {
                    topic: rt.name.clone(),
                    partition: p.index.to_string(),
                };
                m.consumer_lag.get_or_create(&l).set(lag as i64);
                m.inflight.get_or_create(&l).set(inflight as i64);
                m.oldest_unconsumed_age
                    .get_or_create(&l)
                    .set(p.oldest_unconsumed_age_secs(now) as i64);
                m.acked_ahead.get_or_create(&l).set(acked_ahead as i64);
                m.partition_size.get_or_create(&l).set(s.size_bytes as i64);
                m.segments.get_or_create(&l).set(s.segments as i64);
            }
            m.topic_bytes
                .get_or_create(&TopicLabels {
                    topic: rt.name.clone(),
                })
                .set(topic_bytes as i64);
        }
        // A topic deleted while its gauges were being set: its series go again.
        let after = self.meta.view();
        for rt in &runtimes {
            if rt.id < after.next_topic_id && !after.topics.contains_key(&rt.name) {
                m.forget_topic(&rt.name);
            }
        }
        m.open_partition_logs.set(open);
        self.fanout.refresh_gauges();
        if let Some((total, avail)) = fs_space(&self.data_dir) {
            m.data_dir_size.set((total - avail) as i64);
            m.data_dir_available.set(avail as i64);
        }
        let w = self.wal.metrics();
        let frames = w.frames.load(Ordering::Relaxed);
        m.wal_fsyncs
            .inc_by(frames.saturating_sub(m.wal_fsyncs.get()));
        let recs = w.records.load(Ordering::Relaxed);
        m.wal_records
            .inc_by(recs.saturating_sub(m.wal_records.get()));
        let wal_errors = m.errors.get_or_create(&ErrorLabels {
            component: "wal",
            kind: "write",
        });
        wal_errors.inc_by(
            w.write_errors
                .load(Ordering::Relaxed)
                .saturating_sub(wal_errors.get()),
        );
    }
}

fn fs_space(dir: &Path) -> Option<(u64, u64)> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| {
        (
            st.f_blocks as u64 * st.f_frsize as u64,
            st.f_bavail as u64 * st.f_frsize as u64,
        )
    })
}

/// A running server (for `main` and for in-process tests).
pub struct Running {
    pub node: Arc<Node>,
    pub addr: SocketAddr,
    /// The cluster port (node RPC and Raft).
    pub cluster_addr: SocketAddr,
    /// The metrics listener (`http.metrics_addr`), when configured.
    pub metrics_addr: Option<SocketAddr>,
    rpc: crate::rpc::RpcServer,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
    metrics_server: Option<tokio::task::JoinHandle<()>>,
    dispatcher: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Graceful shutdown: refuse new work, give in-flight requests the grace period, let the
    /// dispatcher drain (bounded), persist frontiers and the WAL checkpoint.
    ///
    /// With `http.shutdown_delay`, `/readyz` fails at once and the node keeps serving
    /// everything (produce, consume, settle) for that long first, so a load balancer that
    /// still routes to it (kube-proxy after a pod deletion) gets answers, not refused
    /// connections, until it has taken the node out.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let node = self.node.clone();
        node.stopping.store(true, Ordering::Release);
        let delay = node.config.http.shutdown_delay;
        if !delay.is_zero() {
            tracing::info!(
                delay_ms = delay.as_millis() as u64,
                "stopping: /readyz fails; serving on until the shutdown delay ends"
            );
            tokio::time::sleep(delay).await;
        }
        tracing::info!("shutting down");
        node.shutdown.cancel();
        for rt in node.registry.all() {
            rt.notify.notify_waiters();
        }
        // A leader hands off first, so metadata writes pause for one election round instead
        // of an election timeout after this node's Raft stops.
        node.cluster.hand_off_leadership().await;
        let grace = node.config.http.shutdown_grace;
        match tokio::time::timeout(grace, self.server).await {
            Ok(r) => r??,
            Err(_) => tracing::warn!("in-flight requests outlived the shutdown grace"),
        }
        if let Some(m) = self.metrics_server {
            // Stopped by the same signal; a scrape in flight gets a moment to finish.
            if tokio::time::timeout(Duration::from_secs(1), m)
                .await
                .is_err()
            {
                tracing::debug!("a scrape outlived the shutdown");
            }
        }
        // Messages prefetched from remote owners go back to them at once.
        node.delivery.release_all_kept().await;
        // Let the dispatcher commit what the WAL holds, so a restart re-sends little.
        let until = Instant::now() + Duration::from_secs(5);
        while node.wal.outstanding() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        node.fanout.shutdown().await;
        self.rpc.shutdown(Duration::from_secs(1)).await;
        self.dispatcher.abort();
        node.registry.persist_frontiers();
        node.wal.close();
        node.meta.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Starts a node: opens storage, recovers, joins its cluster (in the background), and serves
/// HTTP on `config.http.addr`.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let boot = Instant::now();
    let data_dir = config.storage.data_dir.clone();
    // Everything this process creates is its own: files 0600, directories 0700 (the metadata
    // holds password hashes and remote-link credentials; logs hold messages).
    // SAFETY: umask only swaps the process's file-mode mask.
    unsafe {
        libc::umask(0o077);
    }
    narad_storage::dirs::create_dir_all_durable(&data_dir)
        .with_context(|| format!("create data dir {}", data_dir.display()))?;
    // A data dir made by an older build may be world-readable: close it (nothing below it is
    // reachable without search permission on it).
    {
        use std::os::unix::fs::PermissionsExt;
        match fs::set_permissions(&data_dir, fs::Permissions::from_mode(0o700)) {
            Ok(()) => {}
            // A volume root this process does not own (a Kubernetes PVC: root with the pod's
            // fsGroup): its mode is the platform's, and what the node creates in it is still
            // private (umask 077).
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!(data_dir = %data_dir.display(), error = %e,
                    "the data dir is not this process's to restrict; the files it creates there are private (0600/0700)");
            }
            Err(e) => {
                return Err(e).with_context(|| format!("restrict data dir {}", data_dir.display()))
            }
        }
    }
    let lock = DirLock::acquire(&data_dir)?;
    let node_id = config.cluster.node_id.clone();
    let clustered = !config.cluster.peers.is_empty();

    // The cluster port first: Raft needs it from the moment the metadata node starts.
    // Standalone without an explicit address it is an OS-assigned loopback port, so
    // standalone servers run side by side (SPEC §7.1).
    let cluster_listen = config.cluster.addr.clone().unwrap_or_else(|| {
        if clustered {
            ":7943".into()
        } else {
            "127.0.0.1:0".into()
        }
    });
    // The configured secret; a standalone node without one makes a random secret nobody else
    // knows, so its cluster port serves no one. Only a cluster with security off and no secret
    // runs on the empty secret (SPEC §4.5; `rpc::auth`).
    let secret = match &config.security.cluster_secret {
        Some(s) => crate::rpc::ClusterSecret::new(s.clone().into_bytes()),
        None if !clustered => crate::rpc::ClusterSecret::random(),
        None => {
            tracing::warn!("security is off and NARAD_CLUSTER_SECRET is unset: any process that reaches the cluster port is trusted as a member");
            crate::rpc::ClusterSecret::none()
        }
    };
    // Mutual TLS on the cluster port when configured; files that do not load stop the node.
    let cluster_tls = match config.security.cluster_tls_files() {
        Some(files) => Some(
            crate::tls::ReloadingTls::load(files, crate::tls::TlsRole::ClusterMutual)
                .context("cluster TLS")?,
        ),
        None => {
            if clustered && config.security.enabled {
                tracing::warn!("cluster port is plaintext: set NARAD_CLUSTER_TLS_{{CERT,KEY,CA}}_FILE for mutual TLS, or keep the cluster network private (SPEC §4.5)");
            }
            None
        }
    };
    let auth = crate::rpc::ClusterAuth::new(secret, cluster_tls);
    // HTTPS on the API when configured; files that do not load stop the node.
    let http_tls = match config.http.tls_files() {
        Some(files) => Some(
            crate::tls::ReloadingTls::load(files, crate::tls::TlsRole::ApiServer)
                .context("HTTP TLS")?,
        ),
        None => None,
    };
    let rpc_handler = NodeRpc::new();
    let rpc = crate::rpc::RpcServer::bind(
        &listen_addr(&cluster_listen),
        node_id.clone(),
        auth.clone(),
        rpc_handler.clone(),
    )
    .await
    .with_context(|| format!("listen on cluster address {cluster_listen}"))?;
    let cluster_addr = rpc.local_addr();
    let advertise_addr = config
        .cluster
        .advertise_addr
        .clone()
        .or_else(|| {
            config
                .cluster
                .peers
                .iter()
                .find(|(id, _)| *id == node_id)
                .map(|(_, a)| a.clone())
        })
        .unwrap_or_else(|| routable(cluster_addr, &node_id));

    let meta_opts = MetaOptions {
        node_id: node_id.clone(),
        cluster_addr: advertise_addr.clone(),
    };
    let meta = if clustered {
        Meta::open(
            &data_dir.join("metastore"),
            meta_opts,
            Arc::new(crate::rpc::RpcRaftTransport::new(
                node_id.clone(),
                auth.clone(),
            )),
        )
        .await
    } else {
        Meta::open_standalone(&data_dir.join("metastore"), meta_opts).await
    }
    .context("open metadata")?;
    rpc.set_raft_handler(crate::rpc::MetaRaftHandler::new(
        meta.clone(),
        config.security.enabled,
    ));

    let listener = TcpListener::bind(listen_addr(&config.http.addr))
        .await
        .with_context(|| format!("listen on {}", config.http.addr))?;
    let addr = listener.local_addr()?;
    // The metrics listener, bound now so that a taken port stops the start.
    let metrics_listener = match &config.http.metrics_addr {
        Some(a) => Some(
            TcpListener::bind(listen_addr(a))
                .await
                .with_context(|| format!("listen on {a} (http.metrics_addr)"))?,
        ),
        None => None,
    };
    let metrics_addr = metrics_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;

    let cluster = Arc::new(Cluster::new(
        node_id.clone(),
        meta.clone(),
        crate::rpc::Peers::new(node_id.clone(), auth).with_faults(config.test.rpc_faults.clone()),
        config.cluster.peers.clone(),
        config.cluster.initial_members.clone(),
        advertise_addr,
        Timing::new(&config.test),
        config.topic.max_topics,
    ));
    let api_addr = api_advertise(
        config.http.advertise_addr.as_deref(),
        addr,
        &cluster.advertise_addr,
    );
    if !clustered {
        meta.write(MetaCommand::RegisterMember {
            id: node_id.clone(),
            api_addr: api_addr.clone(),
            cluster_addr: String::new(),
            version: VERSION.to_string(),
            now_ms: now_ms(),
        })
        .await
        .context("register this node")?;
        cluster.set_registered();
    }

    let metrics = Arc::new(Metrics::new());
    metrics
        .build_info
        .get_or_create(&VersionLabels { version: VERSION })
        .set(1);
    let log_cfg = LogConfig {
        segment_max_bytes: config.storage.segment_max_bytes,
        verify_from_device: config.storage.verify_from_device,
        preallocate: true,
        ..LogConfig::default()
    };
    let registry = Arc::new(Registry::new(
        data_dir.join("topics"),
        log_cfg,
        metrics.clone(),
    )?);
    registry
        .reconcile(&meta.view(), &node_id)
        .context("open partitions")?;

    let opened = Wal::open(
        &data_dir.join("ingress"),
        WalOptions {
            lanes: config.tuning.wal_lanes,
            ..WalOptions::default()
        },
    )
    .context("open the ingress wal")?;
    // Cluster hook: the remote committer for child partitions owned by other nodes.
    let fanout_io = crate::fanout::io::IoThreads::start(FANOUT_IO_THREADS)
        .context("start the fan-out I/O threads")?;
    // Remote-child passwords are sealed at rest (`security::sealing`): with a key derived from
    // the cluster secret every member shares, or a standalone node's key file.
    let credentials = match &config.security.cluster_secret {
        Some(s) => Some(Arc::new(
            crate::security::sealing::CredentialKey::from_secret(s.as_bytes()),
        )),
        None if !clustered => Some(Arc::new(
            crate::security::sealing::CredentialKey::from_key_file(&config.storage.data_dir)
                .context("the remote-child credential key")?,
        )),
        None => {
            tracing::warn!("NARAD_CLUSTER_SECRET is unset: remote-child passwords are stored unsealed in the metadata");
            None
        }
    };
    let mut fanout_config = config.fanout.clone();
    fanout_config.credentials = credentials.clone();
    let fanout = crate::fanout::Fanout::new(
        meta.clone(),
        registry.clone(),
        metrics.clone(),
        Arc::new(crate::fanout::RoutedCommitter::new(
            node_id.clone(),
            registry.clone(),
            fanout_io.clone(),
            Some(Arc::new(crate::cluster::router::RemoteChildCommitter {
                cluster: cluster.clone(),
            })),
        )),
        fanout_config,
        fanout_io,
    );
    if !clustered {
        fanout.confirm_view();
    }
    let shutdown = CancellationToken::new();
    let (visibility, demands) = crate::wal::dispatcher::Visibility::new(opened.wal.clone());
    let delivery = Arc::new(crate::delivery::Delivery::new(
        meta.clone(),
        registry.clone(),
        cluster.clone(),
        metrics.clone(),
        config.http.max_consume_wait,
        visibility,
        shutdown.clone(),
    ));
    let node = Arc::new(Node {
        credentials,
        config: config.clone(),
        node_id,
        meta: meta.clone(),
        wal: opened.wal.clone(),
        registry: registry.clone(),
        metrics: metrics.clone(),
        schemas: SchemaCache::default(),
        auth: Authenticator::default(),
        fanout,
        cluster: cluster.clone(),
        delivery,
        decommission_reasons: Default::default(),
        ready: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        was_ready: AtomicBool::new(false),
        shutdown,
        data_dir: data_dir.clone(),
        _lock: lock,
    });
    rpc_handler.set_node(node.clone());

    let dispatcher = Dispatcher::new(
        opened.wal.clone(),
        Arc::new(NodeRouter {
            cluster: cluster.clone(),
            registry: registry.clone(),
        }),
        metrics.clone(),
        config.tuning.dispatch_linger,
        config.tuning.dispatch_idle_linger,
        config.tuning.dispatch_parallel,
    );
    let dispatcher = tokio::spawn(dispatcher.run(opened.recovered, opened.durable_rx, demands));

    spawn_background(node.clone());
    if clustered {
        let token = node.shutdown.clone();
        tokio::spawn(membership::establish(cluster.clone(), token.clone()));
        // The test knob `NARAD_TEST_VERSION` changes the version this member reports, so a
        // rolling-upgrade test can restart the same binary as the "new" version.
        let member_version = node
            .config
            .test
            .version
            .clone()
            .unwrap_or_else(|| VERSION.to_string());
        tokio::spawn(membership::heartbeat(
            cluster.clone(),
            api_addr,
            member_version,
            token.clone(),
        ));
        tokio::spawn(membership::controller(cluster.clone(), token));
        tokio::spawn(crate::cluster::moves::run(node.clone()));
        tokio::spawn(crate::cluster::controller::run(node.clone()));
    }
    node.fanout.sync().await;
    if node.security_on() {
        tokio::spawn(seed_root(node.clone()));
    }

    let decoders =
        crate::api::encoding::Decoders::for_this_machine().context("start the decoding threads")?;
    let app = crate::api::router(node.clone(), decoders);
    let shutdown = node.shutdown.clone();
    let timeouts = crate::api::server::HttpTimeouts {
        read: config.http.read_timeout,
        write: config.http.write_timeout,
        idle: config.http.idle_timeout,
    };
    let https = http_tls.is_some();
    // Plain HTTP and no credentials, like `/metrics` on the API listener (SPEC §9); the point
    // is a port that is not the public one.
    let metrics_server = metrics_listener.map(|l| {
        let app = crate::api::metrics_router(node.clone());
        let shutdown = node.shutdown.clone();
        tokio::spawn(crate::api::server::serve(l, app, timeouts, None, shutdown))
    });
    let server = tokio::spawn(async move {
        crate::api::server::serve(listener, app, timeouts, http_tls, shutdown).await;
        Ok(())
    });
    node.ready.store(true, Ordering::Release);
    metrics.boot_duration.set(boot.elapsed().as_secs_f64());
    tracing::info!(addr = %addr, cluster_addr = %cluster_addr, node_id = %node.node_id, data_dir = %data_dir.display(), clustered, https, boot_ms = boot.elapsed().as_millis() as u64, "narad listening");
    if let Some(m) = metrics_addr {
        tracing::info!(metrics_addr = %m, "metrics listening (plain HTTP, GET /metrics)");
    }
    Ok(Running {
        node,
        addr,
        cluster_addr,
        metrics_addr,
        rpc,
        server,
        metrics_server,
        dispatcher,
    })
}

/// An address peers can reach a listener at: its own, unless it listens on every interface
/// (then this node's id, which is its resolvable host name in a StatefulSet).
/// The API address this member reports (`http.advertise_addr`): as configured; else the
/// bound address, unless it names every interface: then the host of the cluster advertise
/// address (a name peers resolve, e.g. `narad-0.narad-headless:7943`) with the API port.
fn api_advertise(configured: Option<&str>, bound: SocketAddr, cluster_advertise: &str) -> String {
    if let Some(a) = configured {
        return a.to_string();
    }
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    match cluster_advertise.rsplit_once(':') {
        Some((host, _)) if !host.is_empty() && !is_unspecified_host(host) => {
            format!("{host}:{}", bound.port())
        }
        _ => bound.to_string(),
    }
}

fn is_unspecified_host(host: &str) -> bool {
    host.trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
}

fn routable(bound: SocketAddr, node_id: &str) -> String {
    if bound.ip().is_unspecified() {
        format!("{node_id}:{}", bound.port())
    } else {
        bound.to_string()
    }
}

/// Whether root seeding is over: the root admin exists, or users exist without one (created
/// while security was off; `SeedRoot` never adds root next to existing users, so waiting
/// would never end — `seed_root` warns about it instead).
fn seeding_settled(view: &MetaState) -> bool {
    view.root_user().is_some() || !view.users.is_empty()
}

/// SPEC §4.4: on a secured node whose metadata holds no user, the Raft leader proposes
/// `SeedRoot` with the argon2id hash of `NARAD_ADMIN_PASSWORD`, or of a random 192-bit
/// password that this node then logs exactly once (warn). `SeedRoot` is a no-op once any
/// user exists, so a restart (or another node) never changes an existing root. Retries until
/// the root exists (no leader yet, no quorum) or shutdown.
async fn seed_root(node: Arc<Node>) {
    let mut changes = node.meta.subscribe();
    loop {
        if node.is_shutting_down() {
            return;
        }
        let view = node.meta.view();
        if view.root_user().is_some() {
            return;
        }
        if !view.users.is_empty() {
            tracing::warn!(
                component = "security",
                users = view.users.len(),
                "security is on but no root admin exists (users were created while security \
                 was off); root is not seeded next to existing users"
            );
            return;
        }
        if node.meta.is_leader() {
            let (secret, generated) = match node.config.security.admin_password.as_deref() {
                Some(p) if !p.is_empty() => (p.to_string(), false),
                _ => (password::generate_password(), true),
            };
            let hash = match password::hash_async(secret.clone(), HashParams::DEFAULT).await {
                Ok(h) => h,
                Err(e) => {
                    tracing::error!(error = %e, "hashing the root password failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            match node
                .meta
                .write(MetaCommand::SeedRoot {
                    password_hash: hash,
                    now_ms: now_ms(),
                })
                .await
            {
                Ok(MetaResponse::User(u)) => {
                    if generated {
                        tracing::warn!(
                            component = "security",
                            username = %u.username,
                            password = %secret,
                            "seeded the root admin with a generated password; it is logged only \
                             this once: store it now, or set NARAD_ADMIN_PASSWORD before the \
                             first start"
                        );
                    } else {
                        tracing::info!(
                            component = "security",
                            username = %u.username,
                            "seeded the root admin with NARAD_ADMIN_PASSWORD"
                        );
                    }
                    audit::event("user.create", "-", &u.username);
                    return;
                }
                // Someone else seeded first (or a user appeared): nothing to do.
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "seeding the root admin failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            }
        }
        tokio::select! {
            r = changes.changed() => {
                if r.is_err() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = node.shutdown_signal() => return,
        }
    }
}

fn spawn_background(node: Arc<Node>) {
    // Frontier persistence: at least every 100 ms (SPEC §2.4).
    let n = node.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !n.is_shutting_down() {
            tick.tick().await;
            let r = n.registry.clone();
            let _ = tokio::task::spawn_blocking(move || r.persist_frontiers()).await;
        }
    });
    // Retention and time-based segment roll.
    let n = node.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(n.config.storage.retention_check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        while !n.is_shutting_down() {
            tick.tick().await;
            let n2 = n.clone();
            let _ = tokio::task::spawn_blocking(move || run_retention(&n2)).await;
        }
    });
    // Idle partition logs close their files; an unused topic costs only metadata.
    let idle_ms = node.config.storage.idle_log_eviction_ms;
    if idle_ms > 0 {
        let n = node.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis((idle_ms / 4).clamp(100, 60_000)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !n.is_shutting_down() {
                tick.tick().await;
                let now = now_ms();
                for rt in n.registry.all() {
                    for p in rt.partitions() {
                        if p.evict_if_idle(idle_ms, now) {
                            n.metrics.idle_logs_evicted.inc();
                        }
                    }
                }
            }
        });
    }
    // Metadata changes reach the local partitions and the peer registry even without a
    // local request.
    let n = node;
    tokio::spawn(async move {
        let mut rx = n.meta.subscribe();
        let mut remote_links = n.meta.view().all_remote_links().count();
        while rx.changed().await.is_ok() {
            // A remote link went: compact the log so its (sealed) credentials leave it.
            let now = n.meta.view().all_remote_links().count();
            if now < remote_links {
                match n.meta.compact_log(Duration::from_secs(10)).await {
                    Ok(upto) => tracing::info!(
                        upto,
                        "metadata log compacted after a remote link was detached"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "metadata log compaction after a remote link detach failed; the next snapshot covers it")
                    }
                }
            }
            remote_links = now;
            if n.cluster.clustered {
                n.cluster.sync_peers(&n.meta.view());
            }
            // Registered = this node's own registration, proposed after this start, is
            // applied here: the local view has caught up with the leader (SPEC §6.1).
            if !n.cluster.clustered || n.cluster.registered() {
                n.fanout.confirm_view();
            }
            // Cursors of removed links stop before a deleted topic's data goes; new ones
            // start once their partitions are open.
            n.fanout.sync().await;
            if let Err(e) = n.apply_topics() {
                tracing::error!(error = %e.message, "applying metadata to local partitions failed");
            }
            n.fanout.sync().await;
        }
    });
}

fn run_retention(node: &Node) {
    let started = Instant::now();
    let now = (now_ms() as i64 + node.config.storage.clock_offset_ms).max(0) as u64;
    let view = node.meta.view();
    for t in view.topics.values() {
        let Some(rt) = node.registry.topic(t.id) else {
            continue;
        };
        for p in rt.partitions() {
            match p.run_retention(t.config.retention_ms, now) {
                Ok(out) if out.segments_deleted > 0 => {
                    node.fanout.poke(t.id, p.index);
                    let l = PartitionLabels {
                        topic: t.name.clone(),
                        partition: p.index.to_string(),
                    };
                    node.metrics
                        .retention_bytes_deleted
                        .get_or_create(&l)
                        .inc_by(out.bytes_deleted);
                    node.metrics
                        .retention_messages_deleted
                        .get_or_create(&l)
                        .inc_by(out.messages_deleted);
                    tracing::info!(topic = %t.name, partition = p.index, segments = out.segments_deleted, messages = out.messages_deleted, "retention removed segments");
                }
                Ok(_) => {}
                Err(e) => {
                    node.metrics.error("storage", "retention");
                    tracing::error!(topic = %t.name, partition = p.index, error = %e, "retention failed")
                }
            }
        }
    }
    node.metrics
        .retention_run_duration
        .observe(started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertised_api_address_is_routable() {
        let any: SocketAddr = "0.0.0.0:7942".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:7942".parse().unwrap();
        // Configured wins.
        assert_eq!(
            api_advertise(Some("narad-0.narad-headless.ns.svc:7942"), any, "x:7943"),
            "narad-0.narad-headless.ns.svc:7942"
        );
        // A bound address that names one interface is reachable as it is.
        assert_eq!(api_advertise(None, lo, "narad-0:7943"), "127.0.0.1:7942");
        // Every interface: the cluster advertise host with the API port.
        assert_eq!(
            api_advertise(None, any, "narad-0.narad-headless:7943"),
            "narad-0.narad-headless:7942"
        );
        assert_eq!(api_advertise(None, any, "[fd00::5]:7943"), "[fd00::5]:7942");
        // Nothing better known.
        assert_eq!(api_advertise(None, any, "0.0.0.0:7943"), "0.0.0.0:7942");
        assert_eq!(api_advertise(None, any, "[::]:7943"), "0.0.0.0:7942");
        assert_eq!(api_advertise(None, any, ""), "0.0.0.0:7942");
    }
}
