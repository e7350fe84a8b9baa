//! `Meta` end to end on a real redb store in a tempdir, and openraft's storage conformance
//! suite against the redb log store and state machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_meta::raft::BoxFuture;
use narad_meta::raft::{LogStore, Published, StateMachine, Store, TypeConfig};
use narad_meta::{
    ApplyError, Meta, MetaCommand, MetaError, MetaNode, MetaOptions, MetaResponse, RaftReply,
    RaftRequest, RaftTransport, Topic, TopicConfig, TopicPatch, TransportError,
};
use openraft::testing::{StoreBuilder, Suite};

fn opts() -> MetaOptions {
    MetaOptions {
        node_id: "narad-0".into(),
        cluster_addr: "127.0.0.1:7943".into(),
    }
}

fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        retention_ms: 604_800_000,
        visibility_timeout_ms: 30_000,
        max_in_flight_per_partition: 1024,
        max_acked_ahead_per_partition: 1024,
        retry_backoff: None,
        dead_letter: None,
        dedup_window_ms: None,
    }
}

fn create(name: &str, partitions: u32) -> MetaCommand {
    MetaCommand::CreateTopic {
        name: name.into(),
        config: config(partitions),
        owner: None,
        schema: None,
        created_at_ms: 1_767_225_600_000,
    }
}

fn topic(r: MetaResponse) -> Arc<Topic> {
    match r {
        MetaResponse::Topic(t) => t,
        other => panic!("expected a topic, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_view_restart() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let meta = Meta::open_standalone(dir.path(), opts()).await.unwrap();
    assert!(meta.is_leader());
    assert_eq!(
        meta.current_leader(),
        Some(("narad-0".into(), "127.0.0.1:7943".into()))
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bootstrap took {:?}",
        started.elapsed()
    );
    assert!(meta.view().topics.is_empty());

    let mut applied = meta.subscribe();
    let before = *applied.borrow_and_update();

    let r = meta
        .write(MetaCommand::RegisterMember {
            id: "narad-0".into(),
            api_addr: "127.0.0.1:7942".into(),
            cluster_addr: "127.0.0.1:7943".into(),
            version: "0.1.0".into(),
            now_ms: 1000,
        })
        .await
        .unwrap();
    assert_eq!(r, MetaResponse::Ok);
    assert!(applied.has_changed().unwrap());
    assert!(*applied.borrow() > before);

    let orders = topic(meta.write(create("orders", 3)).await.unwrap());
    assert_eq!(orders.id, 0);
    assert!(orders
        .assignments
        .iter()
        .all(|a| a.owner.as_deref() == Some("narad-0")));
    // Read-your-writes: the view already holds what `write` returned.
    assert_eq!(meta.view().topics["orders"], orders);

    match meta.write(create("ORDERS", 3)).await {
        Err(MetaError::Apply(ApplyError::Conflict(m))) => {
            assert!(m.contains("differs only in letter case"))
        }
        other => panic!("{other:?}"),
    }

    let altered = topic(
        meta.write(MetaCommand::AlterTopic {
            name: "orders".into(),
            patch: TopicPatch {
                partitions: Some(5),
                schema: Some(r#"{"type":"object"}"#.into()),
                ..Default::default()
            },
        })
        .await
        .unwrap(),
    );
    assert_eq!(altered.assignments.len(), 5);
    assert_eq!(altered.current_schema().unwrap().version, 1);

    topic(meta.write(create("tmp", 3)).await.unwrap());
    match meta
        .write(MetaCommand::DeleteTopic { name: "tmp".into() })
        .await
        .unwrap()
    {
        MetaResponse::Deleted(t) => assert_eq!((t.name.as_str(), t.id), ("tmp", 1)),
        other => panic!("{other:?}"),
    }
    match meta
        .write(MetaCommand::DeleteTopic { name: "tmp".into() })
        .await
    {
        Err(MetaError::Apply(ApplyError::NotFound(_))) => {}
        other => panic!("{other:?}"),
    }
    meta.barrier().await.unwrap();

    let state = meta.view();
    assert_eq!(state.next_topic_id, 2);
    let applied_before = meta.applied_index();
    meta.shutdown().await;
    drop(meta);

    // Re-open the same directory: same state, including the id counter.
    let meta = Meta::open_standalone(dir.path(), opts()).await.unwrap();
    assert_eq!(*meta.view(), *state);
    // A sole voter restarts straight into leadership of its old term and re-commits its log.
    assert_eq!(meta.applied_index(), applied_before);
    assert!(meta.is_leader());
    let t = topic(meta.write(create("tmp", 3)).await.unwrap());
    assert_eq!(t.id, 2, "ids are never reused, across restarts too");
    meta.shutdown().await;
}

/// Also checks that `Meta` works on a current-thread runtime (plain `#[tokio::test]`).
#[tokio::test]
async fn open_refuses_another_nodes_store() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Meta::open_standalone(dir.path(), opts()).await.unwrap();
    topic(meta.write(create("orders", 3)).await.unwrap());
    meta.shutdown().await;
    let other = MetaOptions {
        node_id: "narad-1".into(),
        cluster_addr: "x:1".into(),
    };
    match Meta::open_standalone(dir.path(), other).await {
        Err(MetaError::Storage(m)) => assert!(m.contains("belongs to node"), "{m}"),
        Ok(_) => panic!("opened another node's store"),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_all_apply_and_survive_snapshots() {
    const TASKS: usize = 8;
    const PER_TASK: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let meta = Meta::open_standalone(dir.path(), opts()).await.unwrap();
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let meta = meta.clone();
        handles.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..PER_TASK {
                let t = topic(
                    meta.write(create(&format!("t-{task}-{i}"), 3))
                        .await
                        .unwrap(),
                );
                ids.push(t.id);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.extend(h.await.unwrap());
    }
    let elapsed = started.elapsed();
    ids.sort_unstable();
    assert_eq!(ids, (0..(TASKS * PER_TASK) as u64).collect::<Vec<_>>());
    let view = meta.view();
    assert_eq!(view.topics.len(), TASKS * PER_TASK);
    assert_eq!(view.next_topic_id, (TASKS * PER_TASK) as u64);
    eprintln!("{} concurrent writes in {elapsed:?}", TASKS * PER_TASK);
    let started = Instant::now();
    for i in 0..20 {
        meta.write(MetaCommand::AlterTopic {
            name: "t-0-0".into(),
            patch: TopicPatch {
                retention_ms: Some(i),
                ..Default::default()
            },
        })
        .await
        .unwrap();
    }
    eprintln!("sequential write latency {:?}", started.elapsed() / 20);

    // Force a snapshot (and the purge behind it), then restart from snapshot + log tail.
    meta.raft().trigger().snapshot().await.unwrap();
    meta.raft()
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.snapshot.is_some(), "snapshot built")
        .await
        .unwrap();
    topic(meta.write(create("after-snapshot", 3)).await.unwrap());
    let state = meta.view();
    meta.shutdown().await;

    let meta = Meta::open_standalone(dir.path(), opts()).await.unwrap();
    assert_eq!(*meta.view(), *state);
    meta.shutdown().await;
}

/// An in-process network: JSON round-trips every request and reply (as a real RPC layer
/// would) and hands them to the target's `Meta::handle_raft_rpc`. Nodes in `down` can neither
/// send nor receive.
#[derive(Default)]
struct Router {
    nodes: parking_lot::Mutex<std::collections::HashMap<String, Meta>>,
    down: parking_lot::Mutex<std::collections::HashSet<String>>,
}

/// One node's transport into the router.
struct Link {
    from: String,
    router: Arc<Router>,
}

impl RaftTransport for Link {
    fn send<'a>(
        &'a self,
        target: &'a MetaNode,
        req: RaftRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<RaftReply, TransportError>> {
        Box::pin(async move {
            {
                let down = self.router.down.lock();
                if down.contains(&self.from) || down.contains(&target.name) {
                    return Err(TransportError::Unreachable(target.name.clone()));
                }
            }
            let peer = self
                .router
                .nodes
                .lock()
                .get(&target.name)
                .cloned()
                .ok_or_else(|| TransportError::Unreachable(target.name.clone()))?;
            let req: RaftRequest =
                serde_json::from_slice(&serde_json::to_vec(&req).unwrap()).unwrap();
            let reply = tokio::time::timeout(timeout, peer.handle_raft_rpc(req))
                .await
                .map_err(|_| TransportError::Timeout)?;
            Ok(serde_json::from_slice(&serde_json::to_vec(&reply).unwrap()).unwrap())
        })
    }
}

/// Waits until `meta`'s view satisfies `f`.
async fn eventually(meta: &Meta, what: &str, f: impl Fn(&narad_meta::MetaState) -> bool) {
    let mut applied = meta.subscribe();
    tokio::time::timeout(Duration::from_secs(15), async {
        while !f(&meta.view()) {
            applied.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} never saw {what}", meta.node_id()));
}

async fn leader_of(metas: &[Meta], excluding: Option<&str>) -> Meta {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(m) = metas
            .iter()
            .find(|m| m.is_leader() && Some(m.node_id().as_str()) != excluding)
        {
            return m.clone();
        }
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes through whichever node leads, retrying while leadership settles.
async fn write_to_leader(metas: &[Meta], cmd: MetaCommand) -> (Meta, MetaResponse) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let leader = leader_of(metas, None).await;
        match leader.write(cmd.clone()).await {
            Ok(r) => return (leader, r),
            Err(e @ (MetaError::Unavailable(_) | MetaError::NotLeader { .. }))
                if Instant::now() < deadline =>
            {
                eprintln!("retrying write: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_node_cluster_over_a_transport() {
    let router = Arc::new(Router::default());
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let peers: Vec<(String, String)> = (0..3)
        .map(|i| (format!("narad-{i}"), format!("n{i}:7943")))
        .collect();
    let mut metas = Vec::new();
    for (i, (id, addr)) in peers.iter().enumerate() {
        let opts = MetaOptions {
            node_id: id.clone(),
            cluster_addr: addr.clone(),
        };
        let link = Arc::new(Link {
            from: id.clone(),
            router: router.clone(),
        });
        let meta = Meta::open(dirs[i].path(), opts, link).await.unwrap();
        router.nodes.lock().insert(id.clone(), meta.clone());
        metas.push(meta);
    }
    for meta in &metas {
        meta.initialize(&peers).await.unwrap();
    }
    let (leader, r) = write_to_leader(&metas, create("orders", 3)).await;
    let t = topic(r);
    let follower = metas.iter().find(|m| !m.is_leader()).unwrap().clone();
    leader.barrier().await.unwrap();
    match follower.write(create("other", 3)).await {
        Err(MetaError::NotLeader { leader: l }) => {
            assert_eq!(l.as_deref(), Some(&leader.node_id()[..]))
        }
        other => panic!("{other:?}"),
    }
    for meta in &metas {
        eventually(meta, "orders", |s| s.topics.contains_key("orders")).await;
        assert_eq!(meta.view().topics["orders"], t);
        assert_eq!(meta.current_leader().unwrap().0, *leader.node_id());
    }

    // Snapshot catch-up: cut the follower off, advance and compact the leader's log, reconnect.
    router.down.lock().insert(follower.node_id().clone());
    for i in 0..5 {
        topic(
            leader
                .write(create(&format!("while-away-{i}"), 3))
                .await
                .unwrap(),
        );
    }
    let last = leader.applied_index();
    // Compact both connected nodes, so whichever leads after the reconnect must send a snapshot.
    for meta in metas.iter().filter(|m| m.node_id() != follower.node_id()) {
        eventually(meta, "the writes", |s| s.topics.len() == 6).await;
        meta.raft().trigger().snapshot().await.unwrap();
        meta.raft()
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.snapshot.is_some_and(|s| s.index >= last), "snapshot")
            .await
            .unwrap();
        meta.raft().trigger().purge_log(last).await.unwrap();
        meta.raft()
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.purged.is_some_and(|p| p.index >= last), "purged")
            .await
            .unwrap();
    }
    router.down.lock().clear();
    eventually(&follower, "the snapshot", |s| s.topics.len() == 6).await;
    follower
        .raft()
        .wait(Some(Duration::from_secs(5)))
        .metrics(|m| m.snapshot.is_some(), "caught up through a snapshot")
        .await
        .unwrap();
    topic(write_to_leader(&metas, create("after", 3)).await.1);
    for meta in &metas {
        eventually(meta, "after", |s| {
            s.topics.len() == 7 && s.next_topic_id == 7
        })
        .await;
    }

    for meta in &metas {
        meta.shutdown().await;
    }
    router.nodes.lock().clear();
}

/// Builds a fresh redb store in its own tempdir for each conformance test.
struct RedbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), openraft::StorageError<u64>> {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sm = store.state_machine(Published::new())?;
        Ok((dir, store.log_store(), sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(RedbBuilder).unwrap();
}

/// A snapshot chunk far past what was received would make the receiver allocate the gap (a
/// 256 MiB offset used to add 258 MiB): it is refused as a mismatch before openraft sees it.
#[tokio::test]
async fn snapshot_chunks_must_be_contiguous() {
    use openraft::error::{InstallSnapshotError, RaftError};
    use openraft::raft::InstallSnapshotRequest;
    use openraft::{SnapshotMeta, StoredMembership, Vote};
    let dir = tempfile::tempdir().unwrap();
    let meta = Meta::open_standalone(dir.path(), opts()).await.unwrap();
    let chunk = |id: &str, offset: u64, len: usize, done: bool| {
        RaftRequest::InstallSnapshot(InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new(0, 0),
            meta: SnapshotMeta {
                last_log_id: None,
                last_membership: StoredMembership::default(),
                snapshot_id: id.into(),
            },
            offset,
            data: vec![0u8; len],
            done,
        })
    };
    let mismatch = |r: RaftReply| match r {
        RaftReply::InstallSnapshot(Err(RaftError::APIError(
            InstallSnapshotError::SnapshotMismatch(m),
        ))) => Some((m.expect.offset, m.got.offset)),
        _ => None,
    };
    // A first chunk not at 0, and a gap after a chunk: refused, with the expected offset.
    assert_eq!(
        mismatch(
            meta.handle_raft_rpc(chunk("s1", 256 << 20, 10, false))
                .await
        ),
        Some((0, 256 << 20))
    );
    // Offset 0 passes the check (openraft then judges the vote).
    assert_eq!(
        mismatch(meta.handle_raft_rpc(chunk("s1", 0, 100, false)).await),
        None
    );
    assert_eq!(
        mismatch(meta.handle_raft_rpc(chunk("s1", 1000, 10, false)).await),
        Some((100, 1000))
    );
    // The next chunk and a resent overlapping one are fine.
    assert_eq!(
        mismatch(meta.handle_raft_rpc(chunk("s1", 100, 100, false)).await),
        None
    );
    assert_eq!(
        mismatch(meta.handle_raft_rpc(chunk("s1", 150, 50, false)).await),
        None
    );
    // Another snapshot id starts over at 0.
    assert_eq!(
        mismatch(meta.handle_raft_rpc(chunk("s2", 200, 10, false)).await),
        Some((0, 200))
    );
    meta.shutdown().await;
}

/// A detached remote link's (sealed) password leaves the log: `compact_log` snapshots the
/// applied state and purges every entry up to it, the attach among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_purges_a_detached_links_entries() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Meta::open_standalone(dir.path(), opts()).await.unwrap();
    meta.write(create("p", 3)).await.unwrap();
    let (_, attached_at) = meta
        .write_indexed(MetaCommand::AttachRemoteChild {
            parent: "p".into(),
            link: "dr".into(),
            endpoint: narad_meta::RemoteEndpoint {
                url: "https://dr.example.com".into(),
                topic: "p".into(),
                username: Some("replicator".into()),
                password: Some("narad-sealed:v1:c2VhbGVk".into()),
                ca_pem: None,
            },
            now_ms: 1_767_225_600_000,
        })
        .await
        .unwrap();
    let (_, detached_at) = meta
        .write_indexed(MetaCommand::DetachChild {
            parent: "p".into(),
            child: "dr".into(),
        })
        .await
        .unwrap();
    assert!(meta.metrics().purged.is_none());
    let upto = meta.compact_log(Duration::from_secs(10)).await.unwrap();
    assert!(upto >= detached_at, "{upto} < {detached_at}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let purged = meta.metrics().purged.map_or(0, |l| l.index);
        if purged >= attached_at {
            break;
        }
        assert!(Instant::now() < deadline, "purged only to {purged}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The state (and so the snapshot) has no link, before and after a restart.
    assert!(meta.view().all_remote_links().next().is_none());
    meta.shutdown().await;
    let meta = Meta::open_standalone(dir.path(), opts()).await.unwrap();
    assert!(meta.view().all_remote_links().next().is_none());
    assert!(meta.view().topics.contains_key("p"));
    meta.shutdown().await;
}
