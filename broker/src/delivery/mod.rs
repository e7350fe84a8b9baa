//! Delivery (SPEC §3.5, §3.6, §6.3): leasing messages to consumers, replaying offsets and
//! settling leases, on this node's partitions and, through their owners, on others'. It
//! knows neither HTTP nor the node-RPC server: the HTTP routes (`api::consume`) and the
//! RPC handler (`node_rpc`) both parse their request and call [`Delivery`], which
//! answers with rendered JSON or an [`ApiError`].
//!
//! - `handle`: [`ReceiptHandle`], `partition:offset:nonce`.
//! - `render`: the consume answer, rendered while its messages are leased and bounded in
//!   bytes.
//! - `remote`: consumes and settles on other owners: forwarding, probing, prefetch (kept
//!   messages, `prefetch`) and coalesced settles (`coalesce`).
//!
//! The local core ([`lease_local`], [`settle_local`]) works on a [`TopicRuntime`] alone and
//! is unit-tested over real partitions; [`Delivery`] adds the waiting, the remote owners and
//! the metrics.

pub mod coalesce;
pub mod dead_letter;
mod handle;
mod position;
pub mod prefetch;
mod remote;
mod render;

use std::sync::Arc;
use std::time::Duration;

use narad_api::AckResult;
use narad_meta::{Meta, Topic};
use narad_storage::{StorageError, StoredRecord};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, TopicLookup};
use crate::error::{ApiError, ApiResult};
use crate::leases::SettleError;
use crate::metrics::{AckReasonLabels, Metrics, OutcomeLabels, TopicLabels};
use crate::partition::{Leased, QueuePolicy, Registry, TopicRuntime};
use crate::wal::dispatcher::Visibility;

pub use crate::cluster::wire::SettleKind;
pub use handle::{HandleError, ReceiptHandle};
pub use remote::SettleCoalescer;
use render::Answer;
pub use render::MAX_ANSWER_BYTES;

/// Most messages in one batch consume or ack (SPEC §11).
pub const MAX_BATCH: u64 = 100;

/// Forwarded single settles in flight per (owner, topic, kind); more wait and go together.
const SETTLE_CALLS_IN_FLIGHT: usize = 2;

/// How often a waiting consume asks remote owners again (SPEC §6.3).
const REPROBE_EVERY: Duration = Duration::from_millis(250);
/// Longest a reader waits for acknowledged records to become visible before it answers
/// with what is (a partition whose commits fail keeps its records in the WAL).
const VISIBLE_WAIT: Duration = Duration::from_secs(1);

/// What a consume asks for (SPEC §3.5).
#[derive(Debug, Clone, Copy)]
pub struct ConsumeAsk {
    /// Only this partition (a pinned consume).
    pub partition: Option<u32>,
    /// A batch of at most this many (`None`: one message, unbatched body).
    pub max: Option<u32>,
    /// How long to wait for a message (already capped at `http.max_consume_wait`).
    pub wait: Duration,
}

impl ConsumeAsk {
    fn want(&self) -> usize {
        self.max.unwrap_or(1).clamp(1, MAX_BATCH as u32) as usize
    }
}

/// The consume and settle service of a node.
pub struct Delivery {
    node_id: String,
    meta: Meta,
    registry: Arc<Registry>,
    cluster: Arc<Cluster>,
    metrics: Arc<Metrics>,
    /// Messages leased on remote owners, kept for this node's next consumes.
    prefetch: prefetch::Prefetch,
    /// Single settles forwarded to the same owner (topic, kind) share one `AckBatch` call.
    settles: Arc<SettleCoalescer>,
    /// `http.max_consume_wait`: the longest a forwarded consume waits on this owner.
    max_wait: Duration,
    /// Acknowledged records the dispatcher still holds become visible on demand.
    visibility: Visibility,
    /// Where dead-lettered and redriven messages are stored.
    store: Arc<dyn dead_letter::Store>,
    shutdown: CancellationToken,
}

/// What a [`Delivery`] is built from.
pub struct Parts {
    pub meta: Meta,
    pub registry: Arc<Registry>,
    pub cluster: Arc<Cluster>,
    pub metrics: Arc<Metrics>,
    /// `http.max_consume_wait`.
    pub max_wait: Duration,
    pub visibility: Visibility,
    /// Where dead-lettered and redriven messages are stored (the node's `Ingest`).
    pub store: Arc<dyn dead_letter::Store>,
    pub shutdown: CancellationToken,
}

impl Delivery {
    pub fn new(p: Parts) -> Delivery {
        Delivery {
            node_id: p.cluster.node_id.clone(),
            meta: p.meta,
            registry: p.registry,
            cluster: p.cluster,
            metrics: p.metrics,
            prefetch: Default::default(),
            settles: coalesce::Coalescer::new(MAX_BATCH as usize, SETTLE_CALLS_IN_FLIGHT),
            max_wait: p.max_wait,
            visibility: p.visibility,
            store: p.store,
            shutdown: p.shutdown,
        }
    }

    /// The local runtime of a topic (opening it if the metadata is ahead of the registry).
    fn runtime(&self, topic: &Topic) -> ApiResult<Arc<TopicRuntime>> {
        self.registry.runtime_of(&self.meta, &self.node_id, topic)
    }

    fn shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// A queue consume (SPEC §3.5): leases up to `ask.max` messages (one without it) from the
    /// topic's partitions here and on their other owners, waiting up to `ask.wait`; the
    /// rendered answer, or `None` (`204`) when nothing came.
    pub async fn consume(&self, topic: &Arc<Topic>, ask: ConsumeAsk) -> ApiResult<Option<Vec<u8>>> {
        let started = Instant::now();
        let deadline = started + ask.wait;
        let resumed = if topic.paused {
            self.wait_resumed(topic, deadline).await
        } else {
            Some(topic.clone())
        };
        let found = match resumed {
            None => None,
            Some(ref topic) => {
                let ask = ConsumeAsk {
                    wait: deadline.saturating_duration_since(Instant::now()),
                    ..ask
                };
                match ask.partition {
                    // A pinned consume goes to the owner with its full wait.
                    Some(p) => match self.remote_owner_of(topic, p)? {
                        Some(owner) => self.forward_pinned(topic, &owner, p, ask).await?,
                        None => {
                            let rt = self.runtime(topic)?;
                            self.lease_spread(topic, &rt, ask, deadline, &[]).await?
                        }
                    },
                    None => {
                        let rt = self.runtime(topic)?;
                        let remotes = self.remote_owners(topic);
                        let _consuming = self.prefetch.enter(topic.id);
                        self.lease_spread(topic, &rt, ask, deadline, &remotes)
                            .await?
                    }
                }
            }
        };
        let outcome = match (found.is_none(), ask.wait.is_zero()) {
            (_, true) => "no_wait",
            (false, false) => "hit",
            (true, false) if self.shutting_down() => "cancelled",
            (true, false) => "timeout",
        };
        self.observe_consume_wait(topic, outcome, started.elapsed());
        if found.is_none() {
            self.count(topic, |m| &m.consume_empty);
        }
        Ok(found)
    }

    /// A paused topic (SPEC (ext) §3.8): waits until it is resumed (the topic as it is then)
    /// or until `deadline` (`None`: nothing to deliver).
    async fn wait_resumed(&self, topic: &Arc<Topic>, deadline: Instant) -> Option<Arc<Topic>> {
        loop {
            match self.meta.view().topics.get(&topic.name) {
                Some(t) if t.id == topic.id && !t.paused => return Some(t.clone()),
                Some(t) if t.id == topic.id => {}
                _ => return None,
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            tokio::select! {
                _ = tokio::time::sleep((deadline - now).min(REPROBE_EVERY)) => {}
                _ = self.shutdown.cancelled() => return None,
            }
        }
    }

    /// A consume forwarded by another node: served from this node's own partitions only
    /// (never forwarded again), waiting at most `http.max_consume_wait`. Nothing while this
    /// node sees the topic paused.
    pub async fn consume_here(&self, topic: &Topic, ask: ConsumeAsk) -> ApiResult<Option<Vec<u8>>> {
        if topic.paused {
            return Ok(None);
        }
        let rt = self.runtime(topic)?;
        let ask = ConsumeAsk {
            wait: ask.wait.min(self.max_wait),
            ..ask
        };
        self.lease_spread(topic, &rt, ask, Instant::now() + ask.wait, &[])
            .await
    }

    /// The record at `offset` of partition `partition` (SPEC §3.5 replay: read, never leased),
    /// from its owner; `None` when the offset is not written yet.
    pub async fn replay(
        &self,
        topic: &Topic,
        partition: u32,
        offset: u64,
    ) -> ApiResult<Option<Vec<u8>>> {
        match self.remote_owner_of(topic, partition)? {
            Some(owner) => self.forward_replay(topic, &owner, partition, offset).await,
            None => self.replay_here(topic, partition, offset).await,
        }
    }

    /// Replay from a partition of this node (of every record acknowledged before it).
    pub async fn replay_here(
        &self,
        topic: &Topic,
        partition: u32,
        offset: u64,
    ) -> ApiResult<Option<Vec<u8>>> {
        let rt = self.runtime(topic)?;
        if offset
            >= rt
                .partition(partition)
                .map_or(0, |p| p.log.high_watermark())
        {
            self.make_visible(topic, Some(partition)).await;
        }
        let part = rt.partition(partition).ok_or_else(|| {
            ApiError::unavailable(format!("partition {partition} is not open on this node"), 1)
        })?;
        part.touch();
        match part.log.read(offset) {
            Ok(Some(rec)) => {
                let mut out = Vec::with_capacity(rec.payload.len() + 128);
                render::write_message(&mut out, &topic.name, &rec, partition, None);
                Ok(Some(out))
            }
            Ok(None) => Ok(None),
            Err(StorageError::Gone { offset, oldest }) => Err(ApiError::gone(format!(
                "offset {offset} is gone: the oldest retained offset is {oldest}"
            ))),
            Err(StorageError::Unreadable { offset, reason }) => {
                tracing::error!(topic = %topic.name, partition, offset, reason = %reason, "replay of an unreadable record");
                Err(ApiError::gone(format!(
                    "offset {offset} is permanently unreadable"
                )))
            }
            Err(e) => Err(ApiError::internal(format!("read failed: {e}"))),
        }
    }

    /// Settles one lease (SPEC §3.6): here when this node owns its partition, else on the
    /// owner, together with other settles of the same owner, topic and kind.
    pub async fn settle(&self, topic: &Arc<Topic>, handle: &str, how: SettleKind) -> ApiResult<()> {
        match self.settle_route(topic, handle)? {
            (h, None) => {
                self.settle_here(topic, h, how)?;
                if let SettleKind::Delay(_) = how {
                    self.persist_delays(topic, &[h.partition]).await?;
                }
                Ok(())
            }
            (_, Some(owner)) => {
                let r = self
                    .settle_remote_one(topic, owner, handle.to_string(), how)
                    .await;
                if r.status == 204 {
                    Ok(())
                } else {
                    Err(ApiError::new(
                        crate::error::ErrorCode::for_status(r.status),
                        r.error.unwrap_or_default(),
                    ))
                }
            }
        }
    }

    /// Settles up to [`MAX_BATCH`] leases: one result per handle, in order; the remote ones
    /// in one call per owner.
    pub async fn settle_batch(
        &self,
        topic: &Arc<Topic>,
        handles: &[String],
        how: SettleKind,
    ) -> Vec<AckResult> {
        let mut results: Vec<Option<AckResult>> = vec![None; handles.len()];
        // Remote handles grouped by owner: (owner, [(index, handle)]).
        let mut remote: Vec<(String, Vec<(usize, String)>)> = Vec::new();
        for (i, h) in handles.iter().enumerate() {
            let local = match self.settle_route(topic, h) {
                Ok((parsed, None)) => self.settle_here(topic, parsed, how),
                Ok((_, Some(owner))) => {
                    match remote.iter_mut().find(|(o, _)| *o == owner) {
                        Some((_, v)) => v.push((i, h.clone())),
                        None => remote.push((owner, vec![(i, h.clone())])),
                    }
                    continue;
                }
                Err(e) => Err(e),
            };
            results[i] = Some(ack_result(local));
        }
        if let SettleKind::Delay(_) = how {
            self.persist_settled_delays(topic, handles, &mut results)
                .await;
        }
        for (owner, items) in remote {
            let (idx, handles): (Vec<usize>, Vec<String>) = items.into_iter().unzip();
            let answers = remote::settle_remote(&self.cluster, topic, &owner, handles, how).await;
            for (i, r) in idx.into_iter().zip(answers) {
                results[i] = Some(r);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("invariant: every handle got a result"))
            .collect()
    }

    /// Settles forwarded by another node, for partitions this node owns: one result per
    /// handle, in order.
    pub fn settle_forwarded(
        &self,
        topic: &Topic,
        handles: &[String],
        how: SettleKind,
    ) -> Vec<AckResult> {
        handles
            .iter()
            .map(|h| ack_result(self.settle_owned(topic, h, how)))
            .collect()
    }

    /// Settles forwarded with a parameter (`SettleWith`): as
    /// [`Delivery::settle_forwarded`], and the delays made durable before the answer.
    pub async fn settle_forwarded_with(
        &self,
        topic: &Topic,
        handles: &[String],
        how: SettleKind,
    ) -> Vec<AckResult> {
        let mut results: Vec<Option<AckResult>> = self
            .settle_forwarded(topic, handles, how)
            .into_iter()
            .map(Some)
            .collect();
        if let SettleKind::Delay(_) = how {
            self.persist_settled_delays(topic, handles, &mut results)
                .await;
        }
        results.into_iter().flatten().collect()
    }

    /// Makes the delays of the handles settled here (`204` in `results`) durable; if a
    /// partition's cannot be persisted, its handles answer `500` (the delay holds until a
    /// restart).
    async fn persist_settled_delays(
        &self,
        topic: &Topic,
        handles: &[String],
        results: &mut [Option<AckResult>],
    ) {
        let mut partitions: Vec<u32> = handles
            .iter()
            .zip(results.iter())
            .filter(|(_, r)| r.as_ref().is_some_and(|r| r.status == 204))
            .filter_map(|(h, _)| h.parse::<ReceiptHandle>().ok().map(|h| h.partition))
            .collect();
        partitions.sort_unstable();
        partitions.dedup();
        for p in partitions {
            if let Err(e) = self.persist_delays(topic, &[p]).await {
                for (h, r) in handles.iter().zip(results.iter_mut()) {
                    let here = h.parse::<ReceiptHandle>().is_ok_and(|h| h.partition == p);
                    if here && r.as_ref().is_some_and(|r| r.status == 204) {
                        *r = Some(ack_result(Err(e.clone())));
                    }
                }
            }
        }
    }

    /// Persists the delays of `partitions` (local ones) before a delayed nack is answered.
    async fn persist_delays(&self, topic: &Topic, partitions: &[u32]) -> ApiResult<()> {
        let rt = self.runtime(topic)?;
        for &p in partitions {
            let Some(part) = rt.partition(p) else {
                continue;
            };
            tokio::task::spawn_blocking(move || part.persist_frontier())
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?
                .map_err(|e| {
                    ApiError::internal(format!(
                        "the delay was set but not persisted (a restart would end it): {e}"
                    ))
                })?;
        }
        Ok(())
    }

    /// A settle forwarded by another node: [`Delivery::settle_here`] for a handle whose
    /// partition must be this node's.
    pub fn settle_owned(&self, topic: &Topic, handle: &str, how: SettleKind) -> ApiResult<()> {
        let h: ReceiptHandle = handle.parse()?;
        if h.partition < topic.config.partitions && !self.cluster.is_mine(topic, h.partition) {
            return Err(ApiError::unavailable(
                format!("partition {} is not owned by this node", h.partition),
                1,
            ));
        }
        self.settle_here(topic, h, how)
    }

    /// Settles lease `h` of a partition this node owns.
    fn settle_here(&self, topic: &Topic, h: ReceiptHandle, how: SettleKind) -> ApiResult<()> {
        let rt = self.runtime(topic)?;
        match settle_local(topic, &rt, h, how) {
            Ok(()) => {
                match how {
                    SettleKind::Extend | SettleKind::ExtendFor(_) => {
                        self.count(topic, |m| &m.ack_extended)
                    }
                    SettleKind::Nack | SettleKind::Delay(_) => self.count(topic, |m| &m.nack),
                    SettleKind::Ack | SettleKind::Release => {}
                }
                Ok(())
            }
            Err(Unsettled::Stale(why)) => Err(self.stale(why)),
            Err(Unsettled::AckedAheadFull) => {
                self.ack_rejected("acked_ahead_full");
                Err(ApiError::unavailable(
                    format!("acked-ahead limit reached on partition {}: an earlier message is still unsettled; retry", h.partition),
                    1,
                ))
            }
        }
    }

    /// The parsed handle and where it is settled: `None` here, else the owner's id.
    fn settle_route(
        &self,
        topic: &Topic,
        handle: &str,
    ) -> ApiResult<(ReceiptHandle, Option<String>)> {
        let h: ReceiptHandle = handle.parse()?;
        if h.partition >= topic.config.partitions {
            return Err(self.stale("no such partition"));
        }
        Ok((h, self.remote_owner_of(topic, h.partition)?))
    }

    fn stale(&self, why: &str) -> ApiError {
        self.ack_rejected("stale");
        ApiError::gone(format!(
            "lease expired, superseded or already settled ({why})"
        ))
    }

    /// The queue consume loop: prefetched messages and local partitions first, then each of
    /// `remotes` once (a non-blocking, local-only scan on the owner), then waits until
    /// `deadline` for a local commit, nack or expiry, asking the remote owners again every
    /// 250 ms.
    async fn lease_spread(
        &self,
        topic: &Topic,
        rt: &TopicRuntime,
        ask: ConsumeAsk,
        deadline: Instant,
        remotes: &[String],
    ) -> ApiResult<Option<Vec<u8>>> {
        let want = ask.want();
        let mut got = Answer::new(ask.max.is_some());
        let mut next_probe = Instant::now();
        let mut flushed = false;
        let mut parked = None;
        let dead_letter = self.dead_letter_of(topic);
        let mut doomed = Vec::new();
        loop {
            let notified = rt.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Prefetched messages first: their leases already run.
            if !remotes.is_empty() && got.is_empty() {
                if let Some(kept) = self.take_kept(topic, want) {
                    return Ok(Some(prefetch::render(&kept, ask.max.is_some())));
                }
            }
            let limit = dead_letter.as_ref().map(|(_, n)| *n);
            lease_local(topic, rt, ask.partition, want, &mut got, limit, &mut doomed)?;
            if let Some((target, _)) = dead_letter.as_ref().filter(|_| !doomed.is_empty()) {
                self.dead_letter(topic, rt, target, std::mem::take(&mut doomed))
                    .await;
                if got.count < want {
                    // What the dead-lettered messages held back may be deliverable now.
                    continue;
                }
            }
            // Before answering with less than asked: messages acknowledged before this
            // consume may still wait in the dispatcher; they become visible, once.
            if got.count < want
                && !flushed
                && (!got.is_empty() || Instant::now() >= deadline)
                && self.visibility.pending()
            {
                flushed = true;
                self.make_visible(topic, ask.partition).await;
                continue;
            }
            if !got.is_empty() {
                return Ok(Some(got.finish()));
            }
            if !remotes.is_empty() && Instant::now() >= next_probe {
                if let Some(found) = self.probe_remotes(topic, rt, want, ask.max, remotes).await {
                    return Ok(Some(found));
                }
                next_probe = Instant::now() + REPROBE_EVERY;
            }
            let now = Instant::now();
            if now >= deadline || self.shutting_down() {
                return Ok(None);
            }
            let mut wake = rt
                .next_deadline()
                .map(|d| Instant::from_std(d) + Duration::from_millis(1))
                .unwrap_or(deadline)
                .min(deadline);
            if !remotes.is_empty() {
                wake = wake.min(next_probe);
            }
            if parked.is_none() {
                // Counted as waiting, the topic's local records commit without the
                // dispatcher's idle linger; the first waiter has those pending now
                // committed at once (later ones find the short linger in force).
                let p = rt.parked();
                if p.first {
                    self.visibility.hurry(topic.id);
                }
                parked = Some(p);
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.shutdown.cancelled() => {}
            }
        }
    }

    /// Commits what the dispatcher holds for the topic (one partition or all) and waits for
    /// it, at most [`VISIBLE_WAIT`].
    pub async fn make_visible(&self, topic: &Topic, partition: Option<u32>) {
        if !self
            .visibility
            .flush(topic.id, partition, VISIBLE_WAIT)
            .await
        {
            tracing::debug!(topic = %topic.name, ?partition,
                "acknowledged records did not become visible within the wait; answering with what is");
        }
    }

    /// The owner of partition `p` when it is another node (`503` if it is unassigned).
    fn remote_owner_of(&self, topic: &Topic, p: u32) -> ApiResult<Option<String>> {
        match Cluster::owner(topic, p) {
            Some(o) if o == self.node_id => Ok(None),
            Some(o) => Ok(Some(o.to_string())),
            None => Err(ApiError::unavailable(
                format!("partition {p} of {} has no owner yet", topic.name),
                1,
            )),
        }
    }

    /// Whether partition `p` of `topic` is this node's.
    pub fn owns(&self, topic: &Topic, p: u32) -> bool {
        self.cluster.is_mine(topic, p)
    }

    /// Topic `id` as this node's replica knows it.
    pub fn topic_by_id(&self, id: u64) -> TopicLookup {
        self.cluster.topic_by_id(id)
    }

    /// Topic `id` as this node knows it, catching up first for an id newer than its view
    /// (see [`Cluster::topic_by_id`]).
    pub async fn topic_by_id_current(&self, id: u64) -> TopicLookup {
        let found = self.cluster.topic_by_id(id);
        if !matches!(found, TopicLookup::Unknown) || !self.cluster.clustered {
            return found;
        }
        if let Err(e) = self.cluster.read_current(None).await {
            tracing::debug!(topic_id = id, error = %e.message, "catch-up read failed");
        }
        if let Err(e) = self.registry.reconcile(&self.meta.view(), &self.node_id) {
            tracing::warn!(error = %e, "applying metadata to local partitions failed");
        }
        self.cluster.topic_by_id(id)
    }

    fn observe_consume_wait(&self, topic: &Topic, outcome: &'static str, waited: Duration) {
        debug_assert!(
            crate::metrics::CONSUME_OUTCOMES.contains(&outcome),
            "{outcome}"
        );
        self.metrics
            .consume_wait
            .get_or_create(&OutcomeLabels {
                topic: topic.name.clone(),
                outcome,
            })
            .observe(waited.as_secs_f64());
        self.metrics.forget_if_deleted(&self.meta.view(), topic);
    }

    /// Counts one event of `topic` in the per-topic counter `which` picks.
    fn count(&self, topic: &Topic, which: impl FnOnce(&Metrics) -> &TopicCounter) {
        self.count_n(topic, 1, which)
    }

    /// Counts `n` events of `topic` in the per-topic counter `which` picks.
    fn count_n(&self, topic: &Topic, n: u64, which: impl FnOnce(&Metrics) -> &TopicCounter) {
        which(&self.metrics)
            .get_or_create(&TopicLabels {
                topic: topic.name.clone(),
            })
            .inc_by(n);
        self.metrics.forget_if_deleted(&self.meta.view(), topic);
    }

    fn ack_rejected(&self, reason: &'static str) {
        self.metrics
            .ack_rejected
            .get_or_create(&AckReasonLabels { reason })
            .inc();
    }
}

type TopicCounter = prometheus_client::metrics::family::Family<
    TopicLabels,
    prometheus_client::metrics::counter::Counter,
>;

/// An [`AckResult`] of a settle's outcome.
fn ack_result(r: ApiResult<()>) -> AckResult {
    match r {
        Ok(()) => AckResult {
            status: 204,
            error: None,
        },
        Err(e) => AckResult {
            status: e.status().as_u16(),
            error: Some(e.message),
        },
    }
}

/// (ext) A leased message carrying a W3C `traceparent` attribute is logged inside a span
/// that holds it, so a trace can be followed from producer to consumer through the logs.
fn log_trace_context(topic: &Topic, partition: u32, rec: &StoredRecord, attrs: &[u8]) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    if let Some(traceparent) = crate::attrs::get(attrs, "traceparent") {
        let span = tracing::debug_span!("deliver", topic = %topic.name, partition, offset = rec.offset, traceparent);
        span.in_scope(|| tracing::debug!("leased a message carrying a trace context"));
    }
}

/// Leases messages from the topic's local partitions (or only `only`) into `out`, up to `max`
/// and as many as its byte budget holds. A message that does not fit is handed back at once,
/// so nothing is leased that the answer does not carry. With a dead-letter `limit`, a message
/// leased for a delivery past it goes into `doomed` instead (at most
/// [`dead_letter::DOOMED_PER_PASS`] of them), still leased, for the caller to dead-letter.
fn lease_local(
    topic: &Topic,
    rt: &TopicRuntime,
    only: Option<u32>,
    max: usize,
    out: &mut Answer,
    limit: Option<u32>,
    doomed: &mut Vec<dead_letter::Doomed>,
) -> ApiResult<()> {
    let policy = QueuePolicy::of(topic);
    let parts = rt.partitions();
    if parts.is_empty() {
        return Ok(());
    }
    let n = parts.len();
    let start = rt.next_consume_start() as usize;
    for i in 0..n {
        let part = &parts[(start + i) % n];
        if only.is_some_and(|o| o != part.index) {
            continue;
        }
        while out.count < max {
            match part.lease(policy) {
                Leased::Message(rec, d) if limit.is_some_and(|n| d.delivery_count > n) => {
                    doomed.push(dead_letter::Doomed {
                        partition: part.index,
                        rec,
                        nonce: d.nonce,
                        delivery_count: d.delivery_count,
                    });
                    if doomed.len() >= dead_letter::DOOMED_PER_PASS {
                        return Ok(());
                    }
                }
                Leased::Message(rec, d) => {
                    if !out.push(&topic.name, &rec, part.index, d.nonce, d.delivery_count) {
                        let _ = part.hand_back(d.offset, d.nonce);
                        return Ok(());
                    }
                    part.metrics.consumed.inc();
                    part.metrics.consumed_bytes.inc_by(rec.payload.len() as u64);
                    if let Some(a) = &rec.attrs {
                        log_trace_context(topic, part.index, &rec, a);
                    }
                }
                Leased::Nothing => break,
                Leased::Failed(e) if out.is_empty() => {
                    return Err(ApiError::unavailable(
                        format!("partition {} cannot be read now: {e}", part.index),
                        1,
                    ));
                }
                Leased::Failed(_) => break,
            }
        }
        if out.count >= max {
            break;
        }
    }
    Ok(())
}

/// Why a local settle did not happen.
#[derive(Debug, PartialEq, Eq)]
enum Unsettled {
    /// Expired, superseded, already settled, or no such partition here (`410`).
    Stale(&'static str),
    /// The partition's acked-ahead window is full (`503`, retry).
    AckedAheadFull,
}

/// Settles lease `h` of a partition of `rt`; a nack wakes one waiting consumer.
fn settle_local(
    topic: &Topic,
    rt: &TopicRuntime,
    h: ReceiptHandle,
    how: SettleKind,
) -> Result<(), Unsettled> {
    let Some(part) = (h.partition < topic.config.partitions)
        .then(|| rt.partition(h.partition))
        .flatten()
    else {
        return Err(Unsettled::Stale("no such partition"));
    };
    let policy = QueuePolicy::of(topic);
    let res = match how {
        SettleKind::Ack => part.ack(h.offset, h.nonce, policy),
        SettleKind::Extend => part.extend(h.offset, h.nonce, policy),
        SettleKind::Nack => part.nack(h.offset, h.nonce, policy),
        SettleKind::Release => part.hand_back(h.offset, h.nonce),
        SettleKind::Delay(ms) => part.nack_delayed(h.offset, h.nonce, Duration::from_millis(ms)),
        SettleKind::ExtendFor(ms) => part.extend_for(h.offset, h.nonce, Duration::from_millis(ms)),
    };
    match res {
        Ok(()) => {
            if matches!(how, SettleKind::Nack | SettleKind::Release) {
                rt.wake_consumers(1);
            }
            Ok(())
        }
        Err(SettleError::Stale) => Err(Unsettled::Stale("handle no longer valid")),
        Err(SettleError::AckedAheadFull) => Err(Unsettled::AckedAheadFull),
    }
}

#[cfg(test)]
mod tests;
