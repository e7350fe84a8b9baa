//! Whole moves against a fake peer, with no cluster: the source node is a real `Registry`
//! and partition log in a temporary directory, served through the owner's own listing,
//! chunk and freeze code (`listing`, `chunk_reply`, `freeze_for`) and the wire types'
//! encoding; the cluster is one real `MetaState` that the flip is applied to, so the leader's
//! own rules accept or refuse it. The fake can be scripted to fail a chunk, answer the
//! handoff with a freeze that already lapsed, abort the move, die, or shut the node down.
//! Its clock moves only when the target waits, so a dead source's 120 s before a force
//! promotion take no time.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use narad_meta::{Member, MetaError};
use narad_storage::{LogConfig, NewRecord, StoredRecord};
use tempfile::TempDir;

use super::*;
use crate::partition::{Leased, QueuePolicy};
use crate::rpc::{Opcode, RpcError};

const TOPIC_ID: u64 = 5;
const TOPIC: &str = "orders";
const SRC: &str = "src";
const ME: &str = "me";
const FORCE_AFTER: Duration = Duration::from_secs(120);

/// Small segments: a log of a few hundred records spans many files (one chunk each).
fn log_cfg() -> LogConfig {
    LogConfig {
        segment_max_bytes: 4096,
        ..LogConfig::default()
    }
}

/// What the fake does besides answering.
#[derive(Default)]
struct Script {
    /// The k-th `FetchSegmentChunk` of the test (1-based) fails with `500`.
    fail_chunk: Option<usize>,
    /// Records the source commits right after each listing (produce goes on).
    produce_after_list: u64,
    /// The next handoff answers with this `freeze_ms` instead of `FREEZE`.
    freeze_ms: Option<u64>,
    /// The owner aborts the move right after it answers the handoff (its freeze lapsed).
    abort_after_handoff: bool,
    /// The source dies when asked for the handoff: it is marked dead and answers nothing.
    die_at_handoff: bool,
    /// The source answers the handoff, then dies.
    die_after_handoff: bool,
    /// The move is aborted during the n-th wait (1-based).
    abort_at_wait: Option<usize>,
    /// The node starts shutting down during the first wait.
    shutdown_at_wait: bool,
}

/// The source node and the cluster as one move's target sees them.
struct FakePeer {
    _src_dir: TempDir,
    /// The source node's partitions.
    src: Registry,
    view: Mutex<MetaState>,
    script: Mutex<Script>,
    /// Whether the source answers pings while alive.
    reachable: AtomicBool,
    shutting_down: AtomicBool,
    /// Records committed at the source so far.
    produced: AtomicU64,
    lists: AtomicUsize,
    handoffs: AtomicUsize,
    /// `(base, pos)` of every chunk asked for.
    chunks: Mutex<Vec<(u64, u64)>>,
    proposed: Mutex<Vec<MetaCommand>>,
    clock: Mutex<Instant>,
    waits: Mutex<Vec<Duration>>,
}

fn member(id: &str) -> Member {
    Member {
        id: id.to_string(),
        api_addr: String::new(),
        cluster_addr: String::new(),
        version: "test".into(),
        last_seen_ms: 0,
        dead: false,
        draining: false,
    }
}

/// The deterministic content of the record at `offset`.
fn record(offset: u64) -> NewRecord {
    NewRecord {
        key: offset
            .is_multiple_of(2)
            .then(|| Bytes::from(format!("k{offset}"))),
        payload: Bytes::from(format!("record {offset};").repeat(1 + (offset % 7) as usize)),
        attrs: None,
    }
}

impl FakePeer {
    /// A source owning partition 0 of a one-partition topic with `records` committed, and
    /// the move of it to this node started.
    fn new(records: u64) -> FakePeer {
        let dir = tempfile::tempdir().unwrap();
        let src = Registry::new(
            dir.path().join("topics"),
            log_cfg(),
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let mut view = MetaState::default();
        for id in [SRC, ME] {
            view.members.insert(id.to_string(), member(id));
        }
        view.topics.insert(
            TOPIC.into(),
            Arc::new(crate::test_support::topic(TOPIC_ID, TOPIC, &[SRC])),
        );
        view.next_topic_id = TOPIC_ID + 1;
        src.apply(&view, SRC).unwrap();
        view.apply(&MetaCommand::StartMove {
            topic: TOPIC.into(),
            topic_id: TOPIC_ID,
            partition: 0,
            from: SRC.into(),
            to: ME.into(),
        })
        .unwrap();
        let fake = FakePeer {
            _src_dir: dir,
            src,
            view: Mutex::new(view),
            script: Mutex::new(Script::default()),
            reachable: AtomicBool::new(true),
            shutting_down: AtomicBool::new(false),
            produced: AtomicU64::new(0),
            lists: AtomicUsize::new(0),
            handoffs: AtomicUsize::new(0),
            chunks: Mutex::new(Vec::new()),
            proposed: Mutex::new(Vec::new()),
            clock: Mutex::new(Instant::now()),
            waits: Mutex::new(Vec::new()),
        };
        fake.produce(records);
        fake
    }

    /// The source's partition.
    fn source(&self) -> Arc<Partition> {
        self.src.local(TOPIC_ID, 0).unwrap()
    }

    /// Commits `n` more records at the source, ten at a time.
    fn produce(&self, n: u64) {
        let part = self.source();
        let start = self.produced.fetch_add(n, Ordering::SeqCst);
        let records: Vec<NewRecord> = (start..start + n).map(record).collect();
        for batch in records.chunks(10) {
            part.commit_batch(batch).unwrap();
        }
    }

    fn topic(&self) -> Arc<Topic> {
        self.view.lock().topics[TOPIC].clone()
    }

    fn assignment(&self) -> Assignment {
        self.topic().assignments[0].clone()
    }

    fn move_id(&self) -> u64 {
        self.assignment().move_id
    }

    fn dead(&self) -> bool {
        !Cluster::is_alive(&self.view.lock(), SRC)
    }

    fn die(&self) {
        if let Some(m) = self.view.lock().members.get_mut(SRC) {
            m.dead = true;
        }
    }

    /// Aborts the move, as the source does when its freeze lapses.
    fn abort(&self) {
        let cmd = MetaCommand::AbortMove {
            topic: TOPIC.into(),
            topic_id: TOPIC_ID,
            partition: 0,
            move_id: self.move_id(),
        };
        self.view.lock().apply(&cmd).unwrap();
    }

    /// The source's answer to one node RPC, as its `node_rpc` would give it.
    fn serve(&self, op: Opcode, body: &[u8]) -> RpcReply {
        let part = self.source();
        match op {
            Opcode::ListPartitionSegments => {
                self.lists.fetch_add(1, Ordering::SeqCst);
                let list = listing(&part);
                let more = self.script.lock().produce_after_list;
                self.produce(more);
                RpcReply::json(200, &list)
            }
            Opcode::FetchSegmentChunk => {
                let req: ChunkRequest = serde_json::from_slice(body).unwrap();
                let k = {
                    let mut chunks = self.chunks.lock();
                    chunks.push((req.base, req.pos));
                    chunks.len()
                };
                if self.script.lock().fail_chunk == Some(k) {
                    return RpcReply::fail(ErrorCode::Internal, "read failed: scripted");
                }
                chunk_reply(&part, &req)
            }
            Opcode::PrepareHandoff => {
                let req: HandoffRequest = serde_json::from_slice(body).unwrap();
                self.handoffs.fetch_add(1, Ordering::SeqCst);
                let mut reply = freeze_for(&part, req.move_id);
                let (freeze_ms, abort, die) = {
                    let mut s = self.script.lock();
                    (
                        s.freeze_ms.take(),
                        s.abort_after_handoff,
                        s.die_after_handoff,
                    )
                };
                if let Some(ms) = freeze_ms {
                    reply.freeze_ms = ms;
                }
                if abort {
                    self.abort();
                }
                if die {
                    self.die();
                }
                RpcReply::json(200, &reply)
            }
            other => RpcReply::unsupported(other.into()),
        }
    }
}

impl TargetIo for FakePeer {
    fn ask<C: Call + Sync>(
        &self,
        to: &str,
        req: &C,
    ) -> impl Future<Output = ApiResult<C::Reply>> + Send {
        assert_eq!(to, SRC, "a move's target asks only its source");
        if req.opcode() == Opcode::PrepareHandoff && self.script.lock().die_at_handoff {
            self.die();
        }
        // What `Cluster::ask` makes of the answer.
        let answer = if self.dead() {
            Err(crate::cluster::rpc_error(
                to,
                &RpcError::Unreachable(format!("connect to {to}: refused")),
            ))
        } else {
            Ok(self.serve(req.opcode(), &req.encode()))
        };
        let op = req.opcode();
        async move { crate::cluster::calls::read_answer::<C>(to, op, answer?) }
    }

    fn still_moving(&self, topic_id: u64, p: u32, from: &str, move_id: u64) -> bool {
        let topic = self.topic();
        topic.id == topic_id
            && topic
                .assignments
                .get(p as usize)
                .is_some_and(|a| in_flight(a, from, ME, move_id))
    }

    async fn source_health(&self, from: &str) -> SourceHealth {
        assert_eq!(from, SRC);
        if self.dead() {
            SourceHealth::Dead
        } else if self.reachable.load(Ordering::SeqCst) {
            SourceHealth::Answering
        } else {
            SourceHealth::Unreachable
        }
    }

    async fn propose(&self, cmd: MetaCommand) -> ApiResult<()> {
        self.proposed.lock().push(cmd.clone());
        let applied = self.view.lock().apply(&cmd);
        applied
            .map(|_| ())
            .map_err(|e| ApiError::from(MetaError::Apply(e)))
    }

    fn view(&self) -> Arc<MetaState> {
        Arc::new(self.view.lock().clone())
    }

    fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    fn now(&self) -> Instant {
        *self.clock.lock()
    }

    async fn wait(&self, d: Duration) {
        let n = {
            let mut waits = self.waits.lock();
            waits.push(d);
            waits.len()
        };
        *self.clock.lock() += d;
        let (abort, shutdown) = {
            let s = self.script.lock();
            (s.abort_at_wait == Some(n), s.shutdown_at_wait)
        };
        if abort {
            self.abort();
        }
        if shutdown {
            self.shutting_down.store(true, Ordering::SeqCst);
        }
    }
}

/// The target node: its registry in a temporary directory, its metrics, and the fake.
struct Env {
    fake: FakePeer,
    /// The move (the view forgets its id once it is flipped or aborted).
    move_id: u64,
    _dir: TempDir,
    registry: Registry,
    metrics: Arc<Metrics>,
}

impl Env {
    fn new(records: u64, script: Script) -> Env {
        let fake = FakePeer::new(records);
        *fake.script.lock() = script;
        let move_id = fake.move_id();
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let registry =
            Registry::new(dir.path().join("topics"), log_cfg(), metrics.clone()).unwrap();
        Env {
            fake,
            move_id,
            _dir: dir,
            registry,
            metrics,
        }
    }

    fn target(&self) -> Target<'_, FakePeer> {
        Target {
            io: &self.fake,
            node_id: ME,
            registry: &self.registry,
            metrics: &self.metrics,
            handoff_pause: None,
            force_promote_after: FORCE_AFTER,
        }
    }

    /// The whole target side of the move, as `copy_in` runs it.
    async fn run(&self) {
        let topic = self.fake.topic();
        run_copy_in(&self.target(), &topic, 0, SRC, self.move_id).await;
    }

    fn staging(&self) -> PathBuf {
        staging_dir(&self.registry, TOPIC_ID, 0, self.move_id)
    }

    fn dest(&self) -> PathBuf {
        self.registry.partition_dir(TOPIC_ID, 0)
    }

    fn proposed(&self) -> Vec<MetaCommand> {
        self.fake.proposed.lock().clone()
    }

    fn waits(&self) -> Vec<Duration> {
        self.fake.waits.lock().clone()
    }

    fn outcomes(&self, outcome: &'static str) -> u64 {
        self.metrics
            .moves_total
            .get_or_create(&MoveOutcomeLabels { outcome })
            .get()
    }

    /// The bytes of every segment file of the source's log.
    fn source_bytes(&self) -> u64 {
        self.fake
            .source()
            .log
            .segment_files()
            .iter()
            .map(|f| f.size)
            .sum()
    }

    fn complete_move(&self, move_id: u64) -> MetaCommand {
        MetaCommand::CompleteMove {
            topic: TOPIC.into(),
            topic_id: TOPIC_ID,
            partition: 0,
            from: SRC.into(),
            to: ME.into(),
            move_id,
        }
    }
}

fn read_all(log: &PartitionLog, hwm: u64) -> Vec<StoredRecord> {
    let mut out = Vec::new();
    while (out.len() as u64) < hwm {
        let batch = log.read_from(out.len() as u64, 64, 1 << 20).unwrap();
        assert!(!batch.is_empty(), "nothing readable at {}", out.len());
        out.extend(batch);
    }
    out.truncate(hwm as usize);
    out
}

/// The installed copy holds exactly the source's first `hwm` records (offsets, keys,
/// payloads, commit times), and no more.
fn assert_copy_of(installed: &Partition, source: &Partition, hwm: u64) {
    assert_eq!(installed.log.high_watermark(), hwm);
    assert_eq!(installed.log.oldest_offset(), source.log.oldest_offset());
    assert_eq!(read_all(&installed.log, hwm), read_all(&source.log, hwm));
}

#[tokio::test]
async fn a_move_copies_every_record_and_the_copy_opens_at_exactly_the_frozen_high_watermark() {
    let env = Env::new(
        300,
        Script {
            // Producers keep going between the pre-copy's listing and the handoff: the
            // records of that window come with the tail.
            produce_after_list: 25,
            ..Script::default()
        },
    );
    let source = env.fake.source();
    // Consumers acked the first 10 records, and a child's cursor file sits beside the log.
    let topic = env.fake.topic();
    for _ in 0..10 {
        let Leased::Message(r, granted) = source.lease(QueuePolicy::of(&topic)) else {
            panic!("nothing to lease");
        };
        source
            .ack(r.offset, granted.nonce, QueuePolicy::of(&topic))
            .unwrap();
    }
    // Record 10 was delivered twice and handed back each time.
    for _ in 0..2 {
        let Leased::Message(r, granted) = source.lease(QueuePolicy::of(&topic)) else {
            panic!("nothing to lease");
        };
        assert_eq!(r.offset, 10);
        source
            .nack(r.offset, granted.nonce, QueuePolicy::of(&topic))
            .unwrap();
    }
    // Record 11 was nacked with an hour's delay (10, leased first, was handed back unsent).
    let Leased::Message(ten, ten_granted) = source.lease(QueuePolicy::of(&topic)) else {
        panic!("nothing to lease");
    };
    assert_eq!(ten.offset, 10);
    let Leased::Message(r, granted) = source.lease(QueuePolicy::of(&topic)) else {
        panic!("nothing to lease");
    };
    assert_eq!(r.offset, 11);
    source.hand_back(ten.offset, ten_granted.nonce).unwrap();
    source
        .nack_delayed(r.offset, granted.nonce, Duration::from_secs(3600))
        .unwrap();
    source.persist_frontier().unwrap();
    let cursor = source.dir().join("fanout").join("child-a");
    std::fs::create_dir_all(cursor.parent().unwrap()).unwrap();
    std::fs::write(&cursor, b"cursor slots").unwrap();
    let move_id = env.move_id;

    env.run().await;

    assert_eq!(env.proposed(), vec![env.complete_move(move_id)]);
    assert_eq!(
        env.fake.lists.load(Ordering::SeqCst),
        1,
        "one pre-copy round"
    );
    assert!(env.waits().is_empty(), "{:?}", env.waits());
    // The source froze at 325: exactly that is installed, verified, and open here.
    assert_eq!(source.frozen_for(), Some(move_id));
    assert_eq!(source.log.high_watermark(), 325);
    PartitionLog::verify_copy(&env.dest().join("log"), log_cfg(), 0, 325).unwrap();
    let installed = env
        .registry
        .local(TOPIC_ID, 0)
        .expect("open after the flip");
    assert_copy_of(&installed, &source, 325);
    assert_eq!(installed.queue_stats().4, 10, "the frontier came along");
    let Leased::Message(r, granted) = installed.lease(QueuePolicy::of(&topic)) else {
        panic!("nothing to lease after the move");
    };
    assert_eq!(
        (r.offset, granted.delivery_count),
        (10, 3),
        "the delivery counts came along"
    );
    let Leased::Message(r, _) = installed.lease(QueuePolicy::of(&topic)) else {
        panic!("nothing more to lease after the move");
    };
    assert_eq!(r.offset, 12, "the delay of 11 came along");
    assert_eq!(
        std::fs::read(env.dest().join("fanout").join("child-a")).unwrap(),
        b"cursor slots"
    );
    assert_eq!(
        env.fake.assignment().owner.as_deref(),
        Some(ME),
        "the flip is applied"
    );
    // Every byte copied once; counted; nothing left behind.
    assert_eq!(env.metrics.moves_bytes.get(), env.source_bytes());
    assert_eq!(env.outcomes("completed"), 1);
    assert_eq!(env.metrics.moves_inflight.get(), 0);
    assert!(!env.staging().exists());
    assert!(env.registry.take_released().is_empty());
}

#[tokio::test]
async fn a_chunk_failure_with_a_live_answering_source_starts_over_and_then_completes() {
    let env = Env::new(
        300,
        Script {
            fail_chunk: Some(3),
            ..Script::default()
        },
    );
    let first = env.fake.source().log.segment_files()[0].base;
    let move_id = env.move_id;

    env.run().await;

    // The second attempt started from an empty copy: the first file was fetched again
    // from its first byte.
    assert_eq!(env.waits(), vec![target::RETRY]);
    assert_eq!(env.fake.lists.load(Ordering::SeqCst), 2);
    let refetched = env
        .fake
        .chunks
        .lock()
        .iter()
        .filter(|c| **c == (first, 0))
        .count();
    assert_eq!(refetched, 2);
    assert!(env.metrics.moves_bytes.get() > env.source_bytes());
    assert_eq!(env.proposed(), vec![env.complete_move(move_id)]);
    let installed = env
        .registry
        .local(TOPIC_ID, 0)
        .expect("open after the flip");
    assert_copy_of(&installed, &env.fake.source(), 300);
    assert_eq!(env.outcomes("completed"), 1);
}

#[tokio::test]
async fn a_chunk_failure_with_a_live_unreachable_source_keeps_the_copy_and_resumes() {
    let env = Env::new(
        300,
        Script {
            fail_chunk: Some(3),
            ..Script::default()
        },
    );
    env.fake.reachable.store(false, Ordering::SeqCst);
    let first = env.fake.source().log.segment_files()[0].base;

    env.run().await;

    // Nothing copied twice: the second attempt went on from what the first one had.
    assert_eq!(env.waits(), vec![target::RETRY]);
    let refetched = env
        .fake
        .chunks
        .lock()
        .iter()
        .filter(|c| **c == (first, 0))
        .count();
    assert_eq!(refetched, 1);
    assert_eq!(env.metrics.moves_bytes.get(), env.source_bytes());
    let installed = env
        .registry
        .local(TOPIC_ID, 0)
        .expect("open after the flip");
    assert_copy_of(&installed, &env.fake.source(), 300);
    assert_eq!(env.outcomes("completed"), 1);
}

#[tokio::test]
async fn a_refused_flip_abandons_the_move_and_leaves_the_installed_copy_to_the_janitor() {
    let env = Env::new(
        120,
        Script {
            abort_after_handoff: true,
            ..Script::default()
        },
    );
    let move_id = env.move_id;

    env.run().await;

    // The leader's state machine refused the flip (the move was aborted meanwhile).
    assert_eq!(env.proposed(), vec![env.complete_move(move_id)]);
    let a = env.fake.assignment();
    assert_eq!((a.owner.as_deref(), a.target), (Some(SRC), None));
    assert!(env.registry.local(TOPIC_ID, 0).is_none(), "not opened here");
    // The copy was already in place: it waits for the janitor, which removes it only once
    // the leader confirms the partition is not this node's.
    let released = env.registry.take_released();
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!((released[0].topic_id, released[0].partition), (TOPIC_ID, 0));
    assert_eq!(released[0].dir, env.dest());
    PartitionLog::verify_copy(&env.dest().join("log"), log_cfg(), 0, 120).unwrap();
    assert!(env.waits().is_empty(), "abandoned, not retried");
    assert_eq!(env.outcomes("completed"), 0);
    assert_eq!(env.metrics.moves_inflight.get(), 0);
    assert!(!env.staging().exists());
}

#[tokio::test]
async fn a_handoff_whose_freeze_already_lapsed_fails_the_attempt() {
    let env = Env::new(
        100,
        Script {
            // Not even the 500 ms margin is left.
            freeze_ms: Some(400),
            ..Script::default()
        },
    );
    let (topic, move_id) = (env.fake.topic(), env.move_id);
    let mut progress = Progress::default();
    let r = attempt(
        &env.target(),
        &topic,
        0,
        SRC,
        move_id,
        &env.staging(),
        &mut progress,
    )
    .await;
    assert_eq!(
        r.err().as_deref(),
        Some("the final copy outlasted the freeze")
    );
    assert!(env.proposed().is_empty());
    assert!(!env.dest().exists(), "nothing installed");
    // The copy stays staged, holding the pre-copy's listing, for the loop to decide on.
    assert_eq!(progress.promotable().map(|l| l.high_watermark), Some(100));
    PartitionLog::verify_copy(&env.staging().join("log"), log_cfg(), 0, 100).unwrap();
}

#[tokio::test]
async fn a_lapsed_freeze_with_a_live_source_starts_over_and_the_next_handoff_completes() {
    let env = Env::new(
        100,
        Script {
            freeze_ms: Some(400),
            ..Script::default()
        },
    );
    let move_id = env.move_id;

    env.run().await;

    assert_eq!(env.fake.handoffs.load(Ordering::SeqCst), 2);
    assert_eq!(env.waits(), vec![target::RETRY]);
    assert_eq!(env.proposed(), vec![env.complete_move(move_id)]);
    let installed = env
        .registry
        .local(TOPIC_ID, 0)
        .expect("open after the flip");
    assert_copy_of(&installed, &env.fake.source(), 100);
}

#[tokio::test]
async fn a_source_that_stayed_dead_is_force_promoted_from_its_last_listing() {
    let env = Env::new(
        200,
        Script {
            // The source commits 20 more after the listing, then dies at the handoff:
            // those 20 stay on its disk (its salvage claim).
            produce_after_list: 20,
            die_at_handoff: true,
            ..Script::default()
        },
    );
    let move_id = env.move_id;

    env.run().await;

    // Dead at the first failure; retried every second; promoted once dead for 120 s.
    assert_eq!(env.waits(), vec![target::RETRY; 120]);
    assert_eq!(
        env.proposed(),
        vec![MetaCommand::ForceCompleteMove {
            topic: TOPIC.into(),
            topic_id: TOPIC_ID,
            partition: 0,
            from: SRC.into(),
            to: ME.into(),
            move_id,
            high_watermark: 200,
        }]
    );
    let view = env.fake.view();
    assert_eq!(
        view.salvage_claim(TOPIC_ID, 0, SRC)
            .map(|c| c.high_watermark),
        Some(200)
    );
    let source = env.fake.source();
    assert_eq!(source.log.high_watermark(), 220);
    let installed = env
        .registry
        .local(TOPIC_ID, 0)
        .expect("open after the flip");
    assert_copy_of(&installed, &source, 200);
    assert_eq!(env.outcomes("force_promoted"), 1);
    assert_eq!(env.outcomes("completed"), 0);
    assert!(!env.staging().exists());
}

#[tokio::test]
async fn a_dead_source_whose_copy_lacks_records_it_froze_at_is_not_promoted() {
    let env = Env::new(
        200,
        Script {
            // The handoff freezes at 220, then the source dies before the tail is copied:
            // the copy (200) lacks records it acknowledged.
            produce_after_list: 20,
            die_after_handoff: true,
            // Long after the force-promotion delay, the leader aborts the move.
            abort_at_wait: Some(300),
            ..Script::default()
        },
    );

    env.run().await;

    assert_eq!(env.waits().len(), 300);
    assert!(env.proposed().is_empty(), "{:?}", env.proposed());
    assert!(env.registry.local(TOPIC_ID, 0).is_none());
    assert!(!env.dest().exists());
    assert!(!env.staging().exists());
    assert_eq!(env.outcomes("force_promoted"), 0);
    assert_eq!(env.metrics.moves_inflight.get(), 0);
}

#[tokio::test]
async fn shutdown_ends_the_copy_and_removes_the_staged_copy() {
    let env = Env::new(
        100,
        Script {
            fail_chunk: Some(1),
            shutdown_at_wait: true,
            ..Script::default()
        },
    );
    // Unreachable: the failed attempt keeps its copy; shutdown removes it anyway.
    env.fake.reachable.store(false, Ordering::SeqCst);

    env.run().await;

    assert_eq!(env.waits(), vec![target::RETRY]);
    assert_eq!(env.fake.lists.load(Ordering::SeqCst), 1);
    assert!(env.proposed().is_empty());
    assert!(!env.staging().exists());
    assert!(!env.dest().exists());
    assert_eq!(env.metrics.moves_inflight.get(), 0);
}
