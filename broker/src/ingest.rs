//! Ingest: what a produce does once the HTTP route has parsed and authorized it (SPEC
//! §2.3, §3.4): the partition choice, schema validation, and storage — fsynced in the
//! ingress WAL, committed straight into a partition this node owns (`NARAD_WAL_SKIP_LOCAL`),
//! or, on a draining node, handed to a live node that is not draining. Knows neither HTTP
//! nor the RPC server: the routes in `api::produce` and the `Produce` handler in `node_rpc`
//! call it.

use std::sync::Arc;

use narad_meta::{Meta, Topic};

use crate::cluster::wire::{ForwardProduce, ForwardRecord};
use crate::cluster::Cluster;
use crate::error::{ApiError, ApiResult};
use crate::metrics::{Metrics, ReasonLabels};
use crate::partition::{Registry, TopicRuntime};
use crate::schema::SchemaCache;
use crate::security::quotas::QuotaTable;
use crate::security::Caller;
use crate::wal::{Wal, WalRecord};

/// Stores what producers send. Holds only the handles it uses.
pub struct Ingest {
    node_id: String,
    meta: Meta,
    cluster: Arc<Cluster>,
    registry: Arc<Registry>,
    wal: Wal,
    metrics: Arc<Metrics>,
    /// Compiled JSON Schemas by topic id and version.
    schemas: SchemaCache,
    /// `NARAD_WAL_SKIP_LOCAL`: records for a partition this node owns skip the WAL.
    wal_skip_local: bool,
    /// (ext) Users' produce quotas on this node.
    quotas: QuotaTable,
}

impl Ingest {
    pub fn new(
        node_id: String,
        meta: Meta,
        cluster: Arc<Cluster>,
        registry: Arc<Registry>,
        wal: Wal,
        metrics: Arc<Metrics>,
        wal_skip_local: bool,
    ) -> Ingest {
        Ingest {
            node_id,
            meta,
            cluster,
            registry,
            wal,
            metrics,
            schemas: SchemaCache::default(),
            wal_skip_local,
            quotas: QuotaTable::default(),
        }
    }

    /// (ext) Admits a produce of `msgs` messages and `bytes` payload bytes under the
    /// caller's quotas (see [`QuotaTable`]): `429` with `Retry-After` when over.
    pub fn admit(&self, caller: &Caller, topic: &Topic, msgs: u64, bytes: u64) -> ApiResult<()> {
        let Some(p) = caller.principal() else {
            return Ok(());
        };
        let q = &p.quotas;
        if !q.limits_produce() {
            return Ok(());
        }
        let live = self.meta.view().live_members().len();
        let now = std::time::Instant::now();
        self.quotas
            .admit_produce(&p.username, q, live, msgs, bytes, now)
            .map_err(|wait| {
                self.reject(topic, "quota");
                ApiError::throttled(
                    format!(
                        "user {} is over its produce quota (this node's share of {} over {live} \
                         live members); retry in {} ms",
                        p.username,
                        describe(q),
                        wait.as_millis().max(1)
                    ),
                    wait.as_secs_f64().ceil().max(1.0) as u64,
                )
            })
    }

    /// Counts a refused produce (`narad_produce_rejections_total{topic,reason}`).
    pub fn reject(&self, topic: &Topic, reason: &'static str) {
        debug_assert!(crate::metrics::REJECT_REASONS.contains(&reason), "{reason}");
        self.metrics
            .produce_rejections
            .get_or_create(&ReasonLabels {
                topic: topic.name.clone(),
                reason,
            })
            .inc();
        // The series of a topic this replica saw deleted goes again.
        self.metrics.forget_if_deleted(&self.meta.view(), topic);
    }

    /// A deleted topic's compiled schemas go.
    pub fn forget_topic(&self, topic_id: u64) {
        self.schemas.forget(topic_id);
    }

    /// The partition of a produce to `topic` ([`pick_partition`]), with this node's view of
    /// which owners are alive (standalone: all of them). (ext) A record without a key but with
    /// an idempotency key goes by that key's hash, so that its retries meet at one partition
    /// ([`crate::dedup`]); one sent elsewhere because that partition's owner is dead counts
    /// in `narad_dedup_split_total`.
    pub fn choose_partition(
        &self,
        topic: &Topic,
        rt: &TopicRuntime,
        key: Option<&[u8]>,
        idempotency_key: Option<&str>,
        pinned: Option<u32>,
    ) -> u32 {
        let n = topic.config.partitions;
        let key = key.or(idempotency_key.map(str::as_bytes));
        let round_robin = || rt.next_produce_partition(n);
        if !self.cluster.clustered {
            return pick_partition(n, pinned, key, round_robin, |_| true);
        }
        let view = self.meta.view();
        let live = |q: u32| Cluster::owner(topic, q).is_some_and(|o| Cluster::is_alive(&view, o));
        let p = pick_partition(n, pinned, key, round_robin, live);
        if let (Some(k), None, Some(_)) = (key, pinned, idempotency_key) {
            if p != crate::partitioner::key_partition(k, n) {
                self.metrics.dedup_split.inc();
            }
        }
        p
    }

    pub fn validate_schema(&self, topic: &Topic, body: &[u8]) -> ApiResult<()> {
        if let Some(s) = topic.current_schema() {
            let validator = self
                .schemas
                .validator(topic.id, s.version, &s.schema)
                .map_err(ApiError::internal)?;
            if let Err(reason) = crate::schema::validate(&validator, body) {
                self.reject(topic, "schema");
                return Err(ApiError::bad_request(reason));
            }
        }
        Ok(())
    }

    /// Stores accepted records on this node (SPEC §1): fsynced in the WAL (one fsync shared by
    /// every partition's records), from which the dispatcher commits them. With
    /// `NARAD_WAL_SKIP_LOCAL`, a record for a partition this node owns (and has open) is
    /// committed straight into that partition's log instead: fsynced, read back and verified,
    /// hence visible, before the `202`; one whose direct commit did not happen (a partition
    /// frozen for a move, a failing disk) goes through the WAL.
    pub async fn stage(&self, topic: &Topic, records: Vec<WalRecord>) -> ApiResult<()> {
        let records = if self.wal_skip_local {
            self.commit_owned(topic, records).await
        } else {
            records
        };
        if records.is_empty() {
            return Ok(());
        }
        self.wal
            .append(records)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string(), 1))
    }

    /// Commits the records whose partition this node owns and has open (group commit per
    /// partition); returns the others and those whose commit did not happen.
    pub async fn commit_owned(&self, topic: &Topic, records: Vec<WalRecord>) -> Vec<WalRecord> {
        let owned = |p: u32| {
            self.cluster
                .is_mine(topic, p)
                .then(|| self.registry.local(topic.id, p))
                .flatten()
        };
        let Some(first) = records.first().map(|r| r.partition) else {
            return records;
        };
        // One partition (every single produce): no grouping.
        if records.iter().all(|r| r.partition == first) {
            return match owned(first) {
                Some(part) => commit_direct(&part, records).await,
                None => records,
            };
        }
        let mut by_partition: std::collections::BTreeMap<u32, Vec<WalRecord>> = Default::default();
        for r in records {
            by_partition.entry(r.partition).or_default().push(r);
        }
        let mut rest = Vec::new();
        let mut commits = Vec::new();
        for (p, recs) in by_partition {
            match owned(p) {
                Some(part) => commits.push(async move { commit_direct(&part, recs).await }),
                None => rest.extend(recs),
            }
        }
        for failed in futures::future::join_all(commits).await {
            rest.extend(failed);
        }
        rest
    }

    /// Whether this node is draining (decommission, SPEC §6.5): it stores no new produce, so its
    /// WAL empties.
    pub fn draining(&self) -> bool {
        self.meta
            .view()
            .members
            .get(&self.node_id)
            .is_some_and(|m| m.draining)
    }

    /// The refusal of a draining node that found no other node to store a produce: nothing was
    /// stored, so the text is the one clients read as "safe to resend elsewhere"
    /// (CLIENT-COMPAT §4.2).
    pub fn decommissioned(&self, why: &str) -> ApiError {
        ApiError::unavailable(
            format!(
                "node {} is being decommissioned and takes no new produce ({why}); retry on another node",
                self.node_id
            ),
            1,
        )
    }

    /// Stores accepted records: in this node's WAL, or, on a draining node, in the WAL of a live
    /// node that is not draining (SPEC §6.5), whose `202` the producer then gets.
    pub async fn store(&self, topic: &Topic, records: Vec<WalRecord>) -> ApiResult<()> {
        if self.cluster.clustered && self.draining() {
            self.forward(records).await
        } else {
            self.stage(topic, records).await
        }
    }

    /// A draining node's produce: `Produce` to each live, non-draining member in turn (rotated
    /// per call) until one stores it. A target that did not get it (unreachable, an older build,
    /// itself draining or refusing with `503`) passes to the next; one that may have stored it
    /// without answering ends the attempt with the uncertain `502` (a resend may duplicate).
    pub async fn forward(&self, records: Vec<WalRecord>) -> ApiResult<()> {
        let Some(topic_id) = records.first().map(|r| r.topic_id) else {
            return Ok(());
        };
        let req = ForwardProduce {
            topic_id,
            records: records
                .into_iter()
                .map(|r| ForwardRecord {
                    partition: r.partition,
                    pinned: r.pinned,
                    key: r.key,
                    payload: r.payload,
                    attrs: r.attrs,
                })
                .collect(),
        };
        let mut targets: Vec<String> = {
            let view = self.meta.view();
            let mut t: Vec<String> = view
                .members
                .values()
                .filter(|m| m.id != self.node_id && !m.dead && !m.draining)
                .map(|m| m.id.clone())
                .collect();
            t.sort();
            t
        };
        if targets.len() > 1 {
            let k = (crate::clock::now_micros() as usize) % targets.len();
            targets.rotate_left(k);
        }
        let mut last = String::from("no live node that is not draining");
        for target in targets {
            match self.cluster.ask(&target, &req).await {
                Ok(_) => return Ok(()),
                // It did not take them (unreachable, an older build, draining, starting…):
                // nothing was stored there.
                Err(e) if e.is_unavailable() => {
                    last = format!("{target}: {}", e.message);
                }
                // Refused, or it may have stored them without answering.
                Err(e) => return Err(e),
            }
            tracing::debug!(to = %target, reason = %last, "forwarded produce not taken; trying the next node");
        }
        Err(self.decommissioned(&last))
    }

    /// (ext) Stores records that enter their partitions only after their delay (paired with
    /// each): fsynced in this node's delay store ([`crate::delayed`]), due at acceptance time
    /// plus the delay on this node's clock. A draining node takes none: its store must empty
    /// before it leaves, so the producer gets the refusal that means "resend elsewhere".
    /// Nothing to store is `Ok`.
    pub async fn store_delayed(
        &self,
        store: &crate::delayed::Delayed,
        records: Vec<(WalRecord, std::time::Duration)>,
    ) -> ApiResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        if self.cluster.clustered && self.draining() {
            return Err(self.decommissioned("a delayed produce is held by the node that takes it"));
        }
        let now = crate::clock::now_ms();
        let due = |delay: std::time::Duration| now.saturating_add(delay.as_millis() as u64);
        store
            .store(records.into_iter().map(|(r, d)| (r, due(d))).collect())
            .await
    }

    /// `Produce` (1) from a draining node: stores its records (of topic `topic_id`) in this
    /// node's WAL as a produce received here would be, and returns how many it accepted;
    /// `503` when this node drains too, or does not know the topic yet.
    pub async fn store_forwarded(
        &self,
        topic_id: u64,
        records: Vec<WalRecord>,
    ) -> ApiResult<usize> {
        let topic = self.cluster.topic_by_id(topic_id).for_write()?;
        if self.draining() {
            return Err(self.decommissioned("asked to store a forwarded produce"));
        }
        let n = topic.config.partitions;
        if let Some(r) = records.iter().find(|r| r.partition >= n) {
            return Err(ApiError::bad_request(format!(
                "partition {} out of range: {} has {n}",
                r.partition, topic.name
            )));
        }
        let accepted = records.len();
        self.stage(&topic, records).await?;
        Ok(accepted)
    }
}

/// Dead-lettered and redriven messages are stored as a produce received here is.
impl crate::delivery::dead_letter::Store for Ingest {
    fn store<'a>(
        &'a self,
        topic: &'a Topic,
        records: Vec<WalRecord>,
    ) -> crate::rpc::BoxFuture<'a, ApiResult<()>> {
        Box::pin(Ingest::store(self, topic, records))
    }

    fn partition_for(&self, topic: &Topic, key: Option<&[u8]>) -> u32 {
        match self.registry.runtime_of(&self.meta, &self.node_id, topic) {
            Ok(rt) => self.choose_partition(topic, &rt, key, None, None),
            // No runtime (the topic went meanwhile): its store fails anyway.
            Err(_) => 0,
        }
    }
}

/// Commits records of one local partition; returns them if the commit did not happen.
async fn commit_direct(
    part: &std::sync::Arc<crate::partition::Partition>,
    records: Vec<WalRecord>,
) -> Vec<WalRecord> {
    let n = records.len();
    let (topic_id, partition) = (part.topic_id, part.index);
    let pinned: Vec<bool> = records.iter().map(|r| r.pinned).collect();
    let batch = records
        .into_iter()
        .map(|r| narad_storage::NewRecord {
            key: r.key,
            payload: r.payload,
            attrs: r.attrs,
        })
        .collect();
    match crate::group_commit::commit_grouped(part, batch).await {
        Ok(()) => Vec::new(),
        Err(failed) => {
            tracing::warn!(topic_id, partition, records = n, refused = failed.refused, reason = %failed.reason,
                "direct commit into an owned partition did not happen; the records go through the wal");
            failed
                .records
                .into_iter()
                .zip(pinned)
                .map(|(r, pinned)| WalRecord {
                    topic_id,
                    partition,
                    pinned,
                    key: r.key,
                    payload: r.payload,
                    attrs: r.attrs,
                })
                .collect()
        }
    }
}

/// SPEC §2.3: pinned, else key hash, else round robin (`next` is asked only then); an
/// unpinned choice whose owner is not `live` walks forward to the first partition with a
/// live owner (if none, the original choice stands: the WAL holds the message until the
/// owner returns). A pinned partition is kept even when its owner is down.
pub fn pick_partition(
    n: u32,
    pinned: Option<u32>,
    key: Option<&[u8]>,
    next: impl FnOnce() -> u32,
    live: impl Fn(u32) -> bool,
) -> u32 {
    let p = match (pinned, key) {
        (Some(p), _) => return p,
        (None, Some(k)) => crate::partitioner::key_partition(k, n),
        (None, None) => next() % n,
    };
    (0..n).map(|i| (p + i) % n).find(|q| live(*q)).unwrap_or(p)
}

/// The produce rates of a quota, for an answer: `100 msgs/s and 1048576 bytes/s`.
fn describe(q: &narad_meta::Quotas) -> String {
    let rates: Vec<String> = [
        q.produce_msgs_per_s.map(|r| format!("{r} msgs/s")),
        q.produce_bytes_per_s.map(|r| format!("{r} bytes/s")),
    ]
    .into_iter()
    .flatten()
    .collect();
    rates.join(" and ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partitioner::key_partition;

    const ALL: fn(u32) -> bool = |_| true;

    #[test]
    fn pinned_wins_even_with_its_owner_down() {
        assert_eq!(pick_partition(4, Some(2), Some(b"k"), || 0, |_| false), 2);
        assert_eq!(pick_partition(4, Some(3), None, || 0, ALL), 3);
    }

    #[test]
    fn a_key_hashes_and_no_key_takes_the_round_robin_turn() {
        let k = b"customer-42";
        assert_eq!(
            pick_partition(6, None, Some(k), || panic!("no turn taken"), ALL),
            key_partition(k, 6)
        );
        assert_eq!(pick_partition(6, None, None, || 4, ALL), 4);
        assert_eq!(pick_partition(6, None, None, || 13, ALL), 1);
    }

    #[test]
    fn a_dead_owner_s_partition_passes_to_the_next_live_one() {
        let k = b"k";
        let home = key_partition(k, 5);
        let after = (home + 1) % 5;
        assert_eq!(pick_partition(5, None, Some(k), || 0, |q| q != home), after);
        // Wraps around.
        assert_eq!(pick_partition(3, None, None, || 2, |q| q == 0), 0);
        // Nobody alive: the first choice stands.
        assert_eq!(pick_partition(3, None, None, || 1, |_| false), 1);
    }

    proptest::proptest! {
        #[test]
        fn prop_the_choice_is_in_range_and_live_when_any_is(
            n in 1u32..64,
            turn in proptest::prelude::any::<u32>(),
            key in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..16)),
            alive in proptest::collection::vec(proptest::prelude::any::<bool>(), 64),
        ) {
            let live = |q: u32| alive[q as usize];
            let p = pick_partition(n, None, key.as_deref(), || turn, live);
            proptest::prop_assert!(p < n);
            if (0..n).any(live) {
                proptest::prop_assert!(live(p));
            }
        }
    }
}
