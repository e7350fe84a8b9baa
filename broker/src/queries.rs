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
                    backlog: Some(part.backlog(crate::clock::now_ms())),
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

#[cfg(test)]
mod tests {
    //! `Queries` on a node whose topic is spread over four members: itself, a fake peer that
    //! answers over the real node-RPC transport, one that refuses connections, and one the
    //! metadata marks dead.

    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use bytes::Bytes;
    use narad_meta::MetaCommand;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::cluster::wire::StatsRequest;
    use crate::metrics::Metrics;
    use crate::rpc::{handler_fn, ClusterAuth, ClusterSecret, Opcode, RpcReply, RpcServer};

    /// What the fake peer `n2` saw and how it behaves.
    #[derive(Default)]
    struct Peer {
        /// The `min_index` of the last catch-up request.
        min_index: AtomicU64,
        /// Answer nothing (a member that does not confirm in time).
        stall: AtomicBool,
        /// The partition of `t` it owns (set once the topic exists).
        owns: AtomicU64,
    }

    struct Rig {
        _dir: tempfile::TempDir,
        _server: RpcServer,
        peer: Arc<Peer>,
        meta: Meta,
        queries: Queries,
        /// Partition → owner.
        owners: BTreeMap<u32, String>,
    }

    impl Rig {
        fn owned_by(&self, id: &str) -> u32 {
            *self.owners.iter().find(|(_, o)| *o == id).unwrap().0
        }
        fn topic(&self) -> Arc<Topic> {
            self.meta.view().topics["t"].clone()
        }
    }

    async fn rig() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let secret = ClusterSecret::new("queries test secret");
        let peer = Arc::new(Peer::default());
        let p = peer.clone();
        // `n2` owns one partition of `t` (high watermark 42) and its child cursor lags 7.
        let server = RpcServer::bind(
            "127.0.0.1:0",
            "n2",
            secret.clone(),
            handler_fn(move |_from, op, body: Bytes| {
                let p = p.clone();
                async move {
                    if p.stall.load(Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    if op == Opcode::TopicPartitionStats.code() {
                        let req: StatsRequest = serde_json::from_slice(&body).unwrap();
                        if let Some(i) = req.min_index {
                            p.min_index.store(i, Ordering::Release);
                        }
                        let stats: Vec<PartitionStats> = req
                            .partitions
                            .iter()
                            .map(|&index| PartitionStats {
                                index,
                                high_watermark: 42,
                                owner_node: "n2".into(),
                                status: "ok".into(),
                                ..Default::default()
                            })
                            .collect();
                        RpcReply::json(200, &stats)
                    } else if op == Opcode::FanoutCursors.code() {
                        let mine = p.owns.load(Ordering::Acquire).to_string();
                        RpcReply::json(200, &serde_json::json!({"c": {mine: 7}}))
                    } else {
                        RpcReply::unsupported(op)
                    }
                }
            }),
        )
        .await
        .unwrap();
        let meta = crate::test_support::standalone_meta(dir.path()).await;
        let n2_addr = server.local_addr().to_string();
        for (id, addr) in [
            ("n1", String::new()),
            ("n2", n2_addr.clone()),
            // Nothing listens on port 1: every call is refused at once.
            ("n3", "127.0.0.1:1".to_string()),
            ("n4", "127.0.0.1:1".to_string()),
        ] {
            meta.write(MetaCommand::RegisterMember {
                id: id.into(),
                api_addr: String::new(),
                cluster_addr: addr,
                version: "test".into(),
                now_ms: 1_000,
            })
            .await
            .unwrap();
        }
        for (name, partitions) in [("t", 4), ("c", 1)] {
            let create = crate::test_support::create_topic(name, partitions);
            meta.write(create).await.unwrap();
        }
        meta.write(MetaCommand::AttachChild {
            parent: "t".into(),
            child: "c".into(),
            delay_ms: 0,
            now_ms: 1_000,
        })
        .await
        .unwrap();
        meta.write(MetaCommand::MarkMemberDead {
            id: "n4".into(),
            last_seen_ms: 1_000,
        })
        .await
        .unwrap();
        let view = meta.view();
        let owners: BTreeMap<u32, String> = view.topics["t"]
            .assignments
            .iter()
            .enumerate()
            .map(|(p, a)| (p as u32, a.owner.clone().unwrap()))
            .collect();
        assert_eq!(owners.len(), 4);
        for id in ["n1", "n2", "n3", "n4"] {
            assert_eq!(
                owners.values().filter(|o| *o == id).count(),
                1,
                "{owners:?}"
            );
        }
        let n2_owns = owners.iter().find(|(_, o)| *o == "n2").map(|(p, _)| *p);
        peer.owns
            .store(u64::from(n2_owns.unwrap()), Ordering::Release);

        let metrics = Arc::new(Metrics::new());
        let registry = Arc::new(
            Registry::new(
                dir.path().join("topics"),
                narad_storage::LogConfig::default(),
                metrics.clone(),
            )
            .unwrap(),
        );
        registry.apply(&view, "n1").unwrap();
        let auth = ClusterAuth::new(secret, None);
        let cluster = crate::test_support::cluster(&meta, auth, vec![("n2".into(), n2_addr)]);
        let wal = crate::wal::Wal::open(
            &dir.path().join("ingress"),
            crate::wal::WalOptions::default(),
        )
        .unwrap()
        .wal;
        let (visibility, _demands) = crate::wal::dispatcher::Visibility::new(wal.clone());
        let ingest = Arc::new(crate::ingest::Ingest::new(
            "n1".into(),
            meta.clone(),
            cluster.clone(),
            registry.clone(),
            wal,
            metrics.clone(),
            false,
        ));
        let delivery = Arc::new(Delivery::new(crate::delivery::Parts {
            meta: meta.clone(),
            registry: registry.clone(),
            cluster: cluster.clone(),
            metrics: metrics.clone(),
            max_wait: Duration::from_secs(1),
            visibility,
            store: ingest,
            shutdown: CancellationToken::new(),
        }));
        let children = Children::new(
            meta.clone(),
            registry.clone(),
            metrics,
            Arc::new(NoChild),
            crate::children::ChildrenConfig::default(),
            crate::children::io::IoThreads::start(1).unwrap(),
        );
        children.confirm_view();
        children.sync().await;
        let queries = Queries::new(
            "n1".into(),
            meta.clone(),
            registry,
            cluster,
            delivery,
            children,
        );
        Rig {
            _dir: dir,
            _server: server,
            peer,
            meta,
            queries,
            owners,
        }
    }

    /// A child committer for cursors that never have anything to copy.
    struct NoChild;
    impl crate::children::ChildCommitter for NoChild {
        fn commit(
            &self,
            _child: Arc<Topic>,
            _partition: u32,
            _records: Vec<narad_storage::NewRecord>,
        ) -> crate::children::sink::CommitFuture<'_> {
            Box::pin(async { Ok(()) })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn topic_stats_come_from_every_owner_and_say_why_one_is_missing() {
        let rig = rig().await;
        let topic = rig.topic();
        let stats = rig.queries.topic_stats(&topic, &[0, 1, 2, 3]).await;
        assert_eq!(
            stats.iter().map(|s| s.index).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        let of = |id: &str| &stats[rig.owned_by(id) as usize];
        // Read here.
        assert_eq!(of("n1").status, "ok");
        assert_eq!(of("n1").owner_node, "n1");
        // Asked of its owner.
        assert_eq!(of("n2").status, "ok");
        assert_eq!(of("n2").high_watermark, 42);
        // An owner that refuses the connection, and one the metadata marks dead (not asked).
        assert_eq!(of("n3").status, "owner_unavailable");
        assert_eq!(of("n3").owner_liveness.as_deref(), Some("unreachable"));
        assert_eq!(of("n4").status, "owner_unavailable");
        assert_eq!(of("n4").owner_liveness.as_deref(), Some("dead"));

        // Only the partitions asked for.
        let p2 = rig.owned_by("n2");
        let one = rig.queries.topic_stats(&topic, &[p2]).await;
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].index, one[0].high_watermark), (p2, 42));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn children_lag_adds_the_other_owners_cursors_and_says_when_it_is_a_lower_bound() {
        let rig = rig().await;
        let topic = rig.topic();
        let lag = rig.queries.children_lag(&rig.meta.view(), &topic).await;
        // This node's cursor (caught up: 0) plus n2's (7); n3 and n4 did not report.
        assert_eq!(lag.get("c"), Some(&(7, false)), "{lag:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_topic_change_waits_for_members_to_apply_it_but_no_longer_than_the_bound() {
        let rig = rig().await;
        let topic = rig.topic();
        rig.queries.await_members_applied(&topic).await;
        // n2 was asked to catch up to this node's applied index.
        assert_eq!(
            rig.peer.min_index.load(Ordering::Acquire),
            rig.meta.applied_index()
        );
        // A member that does not answer holds the change up for the bound only.
        rig.peer.stall.store(true, Ordering::Release);
        let started = Instant::now();
        rig.queries.await_members_applied(&topic).await;
        let took = started.elapsed();
        assert!(took >= MEMBER_CATCH_UP, "{took:?}");
        assert!(took < MEMBER_CATCH_UP + Duration::from_secs(5), "{took:?}");
    }
}
