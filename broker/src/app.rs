//! The application state: the handles to a node's services that both adapters (the HTTP
//! routes in `api`, the node-RPC handlers in `node_rpc`) are given, and the queries that
//! span several services (topic statistics across owners, children's lag, remote links'
//! state, metric gauges).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_api::PartitionStats;
use narad_meta::{Meta, MetaCommand, MetaResponse, MetaState, Topic};

use crate::clock::now_ms;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::error::{ApiError, ApiResult};
use crate::health::Health;
use crate::ingest::Ingest;
use crate::metrics::{ErrorLabels, Metrics, PartitionLabels, StatusLabels, TopicLabels};
use crate::partition::{Registry, TopicRuntime};
use crate::placement::{Controller, Moves};
use crate::security::Authenticator;
use crate::wal::Wal;

/// The most a node waits for a metadata index it was asked to apply, and the most a topic
/// change waits for the other live members to apply it (then the lagging ones catch up on
/// demand).
pub const MEMBER_CATCH_UP: Duration = Duration::from_secs(2);

/// Handles to the node's services: what the HTTP routes and the node-RPC handlers are given.
/// Owns no request state.
pub struct App {
    pub config: Config,
    /// Seals remote-child passwords before they are proposed (`None`: stored as given).
    pub credentials: Option<Arc<crate::security::sealing::CredentialKey>>,
    pub node_id: String,
    pub meta: Meta,
    pub wal: Wal,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Checks Basic credentials (verified-credential cache, throttle); used only with
    /// security on.
    pub auth: Authenticator,
    /// Child topics: the cursors copying parent records into children (SPEC §5).
    pub fanout: Arc<crate::fanout::Fanout>,
    /// Peers, placement, forwarding (a standalone node has one too).
    pub cluster: Arc<Cluster>,
    /// Produce: partition choice, schema validation, storage (SPEC §3.4).
    pub ingest: Arc<Ingest>,
    /// Consumes, replays and settles (SPEC §3.5, §3.6), here and on other owners.
    pub delivery: Arc<crate::delivery::Delivery>,
    /// Starting, ready, stopping, shut down.
    pub health: Arc<Health>,
    /// Partition moves this node takes part in (copies in, freezes, old copies' removal).
    pub moves: Arc<Moves>,
    /// The leader's move and decommission controller.
    pub controller: Arc<Controller>,
    pub data_dir: PathBuf,
}

impl App {
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
    /// ([`App::topic_by_id_current`], the catch-up before a `404`).
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

    /// Proposes a metadata change (through the Raft leader) and returns what it applied.
    pub async fn propose(&self, cmd: MetaCommand) -> ApiResult<MetaResponse> {
        self.cluster.propose(cmd).await
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
            if view.topics.get(&rt.name).is_none_or(|t| t.id != rt.id) {
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
