//! The cursor loop (`Children::run`) driven end to end in process: a standalone node's
//! metadata and registry, real parent partitions on disk, and a scripted child committer in
//! place of the real one, so every copy the engine makes is seen, with the time it was made.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_meta::{Meta, MetaCommand};
use narad_storage::{LogConfig, NewRecord};
use parking_lot::Mutex;

use super::cursor::{CursorDir, CursorId, Loaded};
use super::io::IoThreads;
use super::sink::{ChildCommitError, ChildCommitter, CommitFuture};
use super::{Children, ChildrenConfig};
use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::partition::{Partition, Registry};

/// One commit the engine made: the child partition, the payloads, when (Unix ms).
#[derive(Debug, Clone)]
struct Copy {
    partition: u32,
    payloads: Vec<Bytes>,
    at_ms: u64,
}

/// A child committer that records every batch and can be told to fail the next ones.
#[derive(Default)]
struct Scripted {
    copies: Mutex<Vec<Copy>>,
    fail_next: AtomicUsize,
    failed: AtomicUsize,
}

impl ChildCommitter for Scripted {
    fn commit(
        &self,
        _child: Arc<narad_meta::Topic>,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> CommitFuture<'_> {
        Box::pin(async move {
            let fail = self
                .fail_next
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            if fail {
                self.failed.fetch_add(1, Ordering::AcqRel);
                return Err(ChildCommitError("scripted failure".into()));
            }
            self.copies.lock().push(Copy {
                partition,
                payloads: records.into_iter().map(|r| r.payload).collect(),
                at_ms: now_ms(),
            });
            Ok(())
        })
    }
}

impl Scripted {
    fn payloads(&self) -> Vec<Bytes> {
        self.copies
            .lock()
            .iter()
            .flat_map(|c| c.payloads.iter().cloned())
            .collect()
    }

    /// Waits (bounded: a hang guard) until `n` payloads were copied.
    async fn until_copied(&self, n: usize) -> Vec<Bytes> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.payloads();
            if got.len() >= n {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "copied {} of {n}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A standalone node's metadata and registry over `dir`, with topics `p` (parent) and `c`.
struct Node {
    meta: Meta,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    io: Arc<IoThreads>,
}

async fn node(dir: &Path) -> Node {
    let meta = crate::test_support::standalone_meta(dir).await;
    let metrics = Arc::new(Metrics::new());
    let registry =
        Arc::new(Registry::new(dir.join("topics"), LogConfig::default(), metrics.clone()).unwrap());
    let node = Node {
        meta,
        registry,
        metrics,
        io: IoThreads::start(1).unwrap(),
    };
    if node.meta.view().topics.is_empty() {
        node.write(MetaCommand::RegisterMember {
            id: "n1".into(),
            api_addr: "127.0.0.1:7942".into(),
            cluster_addr: String::new(),
            version: "test".into(),
            now_ms: now_ms(),
        })
        .await;
        for name in ["p", "c"] {
            node.write(crate::test_support::create_topic(name, 1)).await;
        }
    }
    node.registry.apply(&node.meta.view(), "n1").unwrap();
    node
}

impl Node {
    async fn write(&self, cmd: MetaCommand) {
        self.meta.write(cmd).await.unwrap();
        self.registry.apply(&self.meta.view(), "n1").unwrap();
    }

    fn engine(&self, committer: Arc<Scripted>) -> Arc<Children> {
        let engine = Children::new(
            self.meta.clone(),
            self.registry.clone(),
            self.metrics.clone(),
            committer,
            ChildrenConfig::default(),
            self.io.clone(),
        );
        engine.confirm_view();
        engine
    }

    fn parent(&self) -> Arc<Partition> {
        let id = self.meta.view().topics["p"].id;
        self.registry
            .local(id, 0)
            .expect("the parent partition is open")
    }

    /// Commits `payloads` to the parent partition, as produce would.
    fn produce(&self, payloads: impl IntoIterator<Item = String>) {
        let batch: Vec<NewRecord> = payloads
            .into_iter()
            .map(|p| NewRecord {
                key: None,
                payload: Bytes::from(p),
                attrs: None,
            })
            .collect();
        self.parent().commit_batch(&batch).unwrap();
    }

    /// The cursor file of the link to `c` on the parent partition.
    fn cursor(&self) -> Loaded {
        let view = self.meta.view();
        let id = CursorId {
            child_id: view.topics["c"].id,
            epoch: view.child_links["c"].epoch,
        };
        CursorDir::new(self.parent().dir()).load(id).unwrap()
    }

    async fn attach(&self, delay_ms: u64) {
        self.write(MetaCommand::AttachChild {
            parent: "p".into(),
            child: "c".into(),
            delay_ms,
            now_ms: now_ms(),
        })
        .await;
    }
}

fn named(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn bytes(v: &[String]) -> Vec<Bytes> {
    v.iter().map(|s| Bytes::from(s.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_copies_from_the_attach_on_retries_without_a_gap_and_resumes_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    // Committed before the attach: not copied (a new cursor starts at the high watermark).
    node.produce(named("before", 3));
    node.attach(0).await;
    let child = Arc::new(Scripted::default());
    child.fail_next.store(2, Ordering::Release);
    let engine = node.engine(child.clone());
    engine.sync().await;
    assert!(matches!(node.cursor(), Loaded::At(3)), "anchored durably");

    let first: Vec<String> = (0..4).flat_map(|b| named(&format!("b{b}"), 25)).collect();
    for batch in first.chunks(25) {
        node.produce(batch.to_vec());
    }
    // Two failed commits were retried: every record once, in order, nothing skipped.
    assert_eq!(child.until_copied(100).await, bytes(&first));
    assert_eq!(child.failed.load(Ordering::Acquire), 2);
    assert!(child.copies.lock().iter().all(|c| c.partition == 0));

    // A stop persists the position; records committed while no cursor runs are copied by
    // the next engine, from exactly there.
    engine.shutdown().await;
    assert!(matches!(node.cursor(), Loaded::At(103)));
    let later = named("later", 10);
    node.produce(later.clone());
    let again = Arc::new(Scripted::default());
    let engine = node.engine(again.clone());
    engine.sync().await;
    assert_eq!(again.until_copied(10).await, bytes(&later));
    engine.shutdown().await;
    assert!(matches!(node.cursor(), Loaded::At(113)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_child_gets_no_copy_before_commit_time_plus_the_delay() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    const DELAY_MS: u64 = 300;
    node.attach(DELAY_MS).await;
    let child = Arc::new(Scripted::default());
    let engine = node.engine(child.clone());
    engine.sync().await;
    let sent: Vec<String> = (0..3).flat_map(|b| named(&format!("d{b}"), 10)).collect();
    for batch in sent.chunks(10) {
        node.produce(batch.to_vec());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(child.until_copied(30).await, bytes(&sent));
    // Each copy came no earlier than its record's parent commit time plus the delay.
    let stored = node.parent().log.read_from(0, 100, 1 << 20).unwrap();
    let committed_at: std::collections::HashMap<Bytes, u64> = stored
        .into_iter()
        .map(|r| (r.payload, r.timestamp_ms))
        .collect();
    for copy in child.copies.lock().iter() {
        for p in &copy.payloads {
            assert!(
                copy.at_ms >= committed_at[p] + DELAY_MS,
                "{p:?} copied at {} but due at {}",
                copy.at_ms,
                committed_at[p] + DELAY_MS
            );
        }
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_stops_the_cursor_and_removes_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    node.attach(0).await;
    let child = Arc::new(Scripted::default());
    let engine = node.engine(child.clone());
    engine.sync().await;
    node.produce(named("x", 5));
    child.until_copied(5).await;
    let parent = node.meta.view().topics["p"].clone();
    assert!(engine
        .partition_lags(&node.meta.view(), &parent)
        .contains_key("c"));
    let file_id = {
        let view = node.meta.view();
        CursorId {
            child_id: view.topics["c"].id,
            epoch: view.child_links["c"].epoch,
        }
    };

    node.write(MetaCommand::DetachChild {
        parent: "p".into(),
        child: "c".into(),
    })
    .await;
    engine.sync().await;
    // `sync` returned once the cursor stopped: its file is gone, and it reports no lag.
    assert!(matches!(
        CursorDir::new(node.parent().dir()).load(file_id).unwrap(),
        Loaded::Missing
    ));
    assert!(engine.partition_lags(&node.meta.view(), &parent).is_empty());
    engine.shutdown().await;
}
