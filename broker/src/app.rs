//! The application state: the handles to a node's services that both adapters (the HTTP
//! routes in `api`, the node-RPC handlers in `node_rpc`) are given, and a few lookups and
//! the metric gauges that read several of them.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use narad_meta::{Meta, MetaCommand, MetaResponse, Topic};

use crate::clock::now_ms;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::error::{ApiError, ApiResult};
use crate::health::Health;
use crate::ingest::Ingest;
use crate::metrics::{ErrorLabels, Metrics, PartitionLabels, StatusLabels, TopicLabels};
use crate::partition::{Registry, TopicRuntime};
use crate::placement::{Controller, Moves};
use crate::queries::Queries;
use crate::queries::MEMBER_CATCH_UP;
use crate::security::{Authenticator, Caller};
use crate::wal::Wal;

/// Handles to the node's services: what the HTTP routes and the node-RPC handlers are given.
/// Owns no request state.
pub struct App {
    pub config: Config,
    /// Seals remote-child passwords before they are proposed (`None`: stored as given).
    pub credentials: Option<Arc<crate::security::sealing::CredentialKey>>,
    pub node_id: String,
    pub meta: Meta,
    pub wal: Wal,
    /// (ext) Delayed produces held until due.
    pub delayed: crate::delayed::Delayed,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Checks Basic credentials (verified-credential cache, throttle); used only with
    /// security on.
    pub auth: Authenticator,
    /// (ext) Leases users took through this node, for their `consume_in_flight` quotas.
    pub lease_counts: crate::security::quotas::LeaseCounts,
    /// Child topics: the cursors copying parent records into children (SPEC §5).
    pub children: Arc<crate::children::Children>,
    /// Peers, placement, forwarding (a standalone node has one too).
    pub cluster: Arc<Cluster>,
    /// Produce: partition choice, schema validation, storage (SPEC §3.4).
    pub ingest: Arc<Ingest>,
    /// Statistics, lag and link states across owners; waiting for members to apply.
    pub queries: Arc<Queries>,
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

    /// Who sent a request with `headers` (SPEC §4.1): with security on, the user its Basic
    /// credentials prove, or the error that refuses it (`401`, `429` when throttled). The
    /// API's and the console's authentication.
    pub async fn caller_of(
        &self,
        headers: &axum::http::HeaderMap,
    ) -> Result<Caller, crate::security::AuthError> {
        if !self.security_on() {
            return Ok(Caller::SecurityOff);
        }
        let view = self.meta.view();
        self.auth
            .authenticate_headers(&view, headers)
            .await
            .map(Caller::User)
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

    /// Reconciles the local partitions with the metadata.
    pub fn apply_topics(&self) -> ApiResult<()> {
        self.registry.apply(&self.meta.view(), &self.node_id)
    }

    /// Proposes a metadata change (through the Raft leader) and returns what it applied.
    pub async fn propose(&self, cmd: MetaCommand) -> ApiResult<MetaResponse> {
        self.cluster.propose(cmd).await
    }

    /// Proposes a command answered with a topic (create, alter, attach): the topic as it is
    /// after it.
    pub async fn propose_topic(&self, cmd: MetaCommand) -> ApiResult<Arc<Topic>> {
        match self.propose(cmd).await? {
            MetaResponse::Topic(t) => Ok(t),
            other => Err(ApiError::internal(format!(
                "unexpected metadata answer {other:?}"
            ))),
        }
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
            let mut topic_backlog = 0u64;
            for p in rt.partitions() {
                open += 1;
                let s = p.log.stats();
                topic_bytes += s.size_bytes;
                let (lag, inflight, acked_ahead, _, _) = p.queue_stats();
                topic_backlog += lag.saturating_sub(inflight);
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
            let t = TopicLabels {
                topic: rt.name.clone(),
            };
            m.topic_bytes.get_or_create(&t).set(topic_bytes as i64);
            m.topic_backlog.get_or_create(&t).set(topic_backlog as i64);
        }
        // A topic deleted while its gauges were being set: its series go again.
        let after = self.meta.view();
        for rt in &runtimes {
            if rt.id < after.next_topic_id && !after.topics.contains_key(&rt.name) {
                m.forget_topic(&rt.name);
            }
        }
        m.open_partition_logs.set(open);
        self.children.refresh_gauges();
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
        let takeovers = w.first_lane_takeovers.load(Ordering::Relaxed);
        m.wal_first_lane_takeovers
            .inc_by(takeovers.saturating_sub(m.wal_first_lane_takeovers.get()));
        m.delayed_held.set(self.delayed.held() as i64);
        m.delayed_released.inc_by(
            self.delayed
                .released()
                .saturating_sub(m.delayed_released.get()),
        );
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
