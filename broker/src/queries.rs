//! Questions about topics that span nodes and services: partition statistics from every
//! owner, children's lag and remote links' state across the parent's owners, and waiting for
//! the other members to apply a topic change (SPEC §3.2, §3.3, §3.7).

use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_api::PartitionStats;
use narad_meta::{Meta, MetaState, Topic};

use crate::children::Children;
use crate::cluster::Cluster;
use crate::delivery::Delivery;
use crate::partition::Registry;

/// The most a node waits for a metadata index it was asked to apply, and the most a topic
/// change waits for the other live members to apply it (then the lagging ones catch up on
/// demand).
pub const MEMBER_CATCH_UP: Duration = Duration::from_secs(2);

/// Answers cross-node topic questions. Holds only the handles it uses.
pub struct Queries {
    node_id: String,
    meta: Meta,
    registry: Arc<Registry>,
    cluster: Arc<Cluster>,
    delivery: Arc<Delivery>,
    children: Arc<Children>,
}

impl Queries {
    pub fn new(
        node_id: String,
        meta: Meta,
        registry: Arc<Registry>,
        cluster: Arc<Cluster>,
        delivery: Arc<Delivery>,
        children: Arc<Children>,
    ) -> Queries {
        Queries {
            node_id,
            meta,
            registry,
            cluster,
            delivery,
            children,
        }
    }

    /// After a topic change this node proposed (create, alter, delete, child attach): waits
    /// until every other live member has applied it and opened its partitions, so a client
    /// that goes to any node next sees the change (SPEC §3.3). Bounded by
    /// [`MEMBER_CATCH_UP`]: a member that is dead (or does not answer in time) is not waited
    /// for; it catches up with the leader when a request needs the topic
    /// ([`crate::delivery::Delivery::topic_by_id_current`], the catch-up before a `404`).
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
            let _ = self.registry.runtime_of(&self.meta, &self.node_id, topic);
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
    /// of a `ChildCursorsRequest`; the answers (owners that fail are left out).
    async fn ask_parent_owners<C: crate::cluster::calls::Call>(
        &self,
        parent: &Topic,
        ask: impl Fn(crate::cluster::wire::ChildCursorsRequest) -> C,
    ) -> Vec<C::Reply> {
        let owners: std::collections::BTreeSet<&str> = parent
            .assignments
            .iter()
            .filter_map(|a| a.owner.as_deref())
            .filter(|o| *o != self.node_id)
            .collect();
        let req = ask(crate::cluster::wire::ChildCursorsRequest {
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
        let mut lags = self.children.partition_lags(view, parent);
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
    ) -> std::collections::BTreeMap<String, crate::children::remote::LinkStatus> {
        use crate::children::remote::{LinkState, LinkStatus};
        let mut all: std::collections::BTreeMap<String, Vec<LinkStatus>> = self
            .children
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
            .filter_map(|(k, v)| Some((k, crate::children::remote::worst(&v)?)))
            .collect()
    }
}
