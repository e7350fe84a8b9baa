//! Child topics (SPEC §5): the fan-out engine.
//!
//! For each (parent partition owned here, attached local child) one cursor task runs. It
//! reads committed parent records in batches (≤ `max_batch_records` / `max_batch_bytes`,
//! lingering `linger` for a fuller batch), maps each to a child partition ([`route`]),
//! commits the groups through a [`ChildCommitter`] (locally: the dispatcher's own
//! fsync-and-verify commit), and only then durably advances its cursor file ([`cursor`]). A
//! crash re-sends the last batch (duplicates), never skips one (gaps). Each cursor stalls only
//! itself: a failing child commit is retried with backoff while every other cursor goes on.
//!
//! Delay children: a record is copied no earlier than its parent commit time (this node's
//! clock, stamped by the parent log) plus the delay. Commit times are monotonic per
//! partition, so a cursor whose head is not due sleeps until it is (waking at least every
//! `max_idle_sleep`), reading nothing else: an idle cursor with a huge delayed backlog costs
//! one sleeping task.
//!
//! Lifecycle: [`Children::sync`] brings the running cursors in line with the metadata (the
//! links and the locally open parent partitions) and waits until stopped cursors have
//! stopped; the attach, detach, delete and create handlers call it before answering, so an
//! attach copies everything committed after its answer and a detach stops copying at once.
//! A new cursor is anchored at the parent partition's high watermark (a partition added to
//! the parent after the attach: at its start) and written to disk before `sync` returns.
//!
//! Remote children (SPEC §5.5) run the same cursors, keyed by the link's epoch (their
//! cursor files use [`REMOTE_CHILD_ID`] as child id), but commit through the remote
//! cluster's HTTP API ([`remote`]): a cursor retries, blocks or skips exactly as §5.5 says
//! and exposes its `state` and `last_error`; it never holds up the parent's other cursors.
//!
//! Cluster hooks (see also `sink`): a remote [`ChildCommitter`] for child partitions owned
//! elsewhere; cursors of parent partitions owned elsewhere report lag over node RPC
//! (`FanoutCursors`; [`Children::partition_lags`] leaves them out, and the cluster's sum,
//! `queries::Queries::children_lag`, marks it incomplete until they report); anchoring a cursor
//! on a node whose view may be stale needs the leader's confirmation (SPEC §6.1): cursor
//! files of unknown links are removed only once the view is confirmed current
//! ([`Children::confirm_view`]: the node's own registration was applied locally); a moved partition keeps its cursors if the move copies the
//! partition directory (they live in `<partition dir>/fanout/`).

pub mod cursor;
pub use narad_api::hosts;
pub mod io;
pub mod remote;
pub mod route;
pub mod sink;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_meta::{ChildLink, Meta, MetaState, RemoteEndpoint, RemoteLink, Topic};
use narad_storage::{NewRecord, StorageError, StoredRecord};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::metrics::{ChildLabels, ChildPartitionLabels, Metrics, RemoteSendErrorLabels};
use crate::partition::{Partition, Registry};
use cursor::{CursorDir, CursorFile, CursorId, Loaded};
use io::IoThreads;
use remote::{BatchBody, LinkState, LinkStatus, RemoteClient, Verdict};
pub use sink::{ChildCommitError, ChildCommitter, RoutedCommitter};

/// Tunables (SPEC §8 `fanout.*`, §11).
#[derive(Debug, Clone)]
pub struct ChildrenConfig {
    pub max_batch_records: usize,
    pub max_batch_bytes: usize,
    pub linger: Duration,
    /// The longest an idle cursor sleeps without looking (SPEC: a delay cursor wakes ≤ 30 s).
    pub max_idle_sleep: Duration,
    /// Where remote child links may send (`remotes.allowed_hosts`).
    pub remote_hosts: hosts::HostPolicy,
    /// Opens the sealed passwords of remote links (`security::sealing`); `None` where the
    /// node seals nothing (a cluster without a secret).
    pub credentials: Option<Arc<crate::security::sealing::CredentialKey>>,
}

impl Default for ChildrenConfig {
    fn default() -> Self {
        ChildrenConfig {
            max_batch_records: 4096,
            max_batch_bytes: 4 * 1024 * 1024,
            linger: Duration::from_millis(25),
            max_idle_sleep: Duration::from_secs(30),
            remote_hosts: hosts::HostPolicy::default(),
            credentials: None,
        }
    }
}

/// Smallest read of a delay cursor (it adapts up to `max_batch_records`).
const MIN_DELAY_CHUNK: usize = 64;
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long `sync` waits for a stopping cursor.
const STOP_WAIT: Duration = Duration::from_secs(10);
/// Local-child commits (read, fsync, verify) in flight per node. Produce commits come
/// first: a cursor that waits for its turn reads a fuller batch when it gets it, so under
/// load fan-out costs fewer, larger commits instead of taking the disk from producers.
const COMMITS_IN_FLIGHT: usize = 1;

/// The child id of a remote link's cursor (its epoch alone identifies it; topic ids never
/// reach this value).
pub const REMOTE_CHILD_ID: u64 = u64::MAX;

/// A link as a cursor needs it: a local child or a remote link.
#[derive(Debug, Clone)]
struct LinkSpec {
    parent: String,
    /// The child topic, or the remote link's name.
    child: String,
    epoch: u64,
    delay_ms: u64,
    parent_partitions_at_attach: u32,
    remote: Option<RemoteEndpoint>,
}

impl From<&ChildLink> for LinkSpec {
    fn from(l: &ChildLink) -> Self {
        LinkSpec {
            parent: l.parent.clone(),
            child: l.child.clone(),
            epoch: l.epoch,
            delay_ms: l.delay_ms,
            parent_partitions_at_attach: l.parent_partitions_at_attach,
            remote: None,
        }
    }
}

impl From<&RemoteLink> for LinkSpec {
    fn from(l: &RemoteLink) -> Self {
        LinkSpec {
            parent: l.parent.clone(),
            child: l.link.clone(),
            epoch: l.epoch,
            delay_ms: 0,
            parent_partitions_at_attach: l.parent_partitions_at_attach,
            remote: Some(l.endpoint.clone()),
        }
    }
}

/// The remote side of a remote link's cursor.
struct RemoteCursor {
    client: Arc<RemoteClient>,
    status: Mutex<LinkStatus>,
}

/// One running cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    parent_id: u64,
    partition: u32,
    child_id: u64,
    epoch: u64,
}

/// What the outside may read of a cursor.
pub struct CursorState {
    pub parent: String,
    pub child: String,
    pub partition: u32,
    pub delay_ms: u64,
    pub epoch: u64,
    pub child_id: u64,
    /// The next parent offset to copy (in memory; the file may trail it by one batch).
    pub next: AtomicU64,
    part: Arc<Partition>,
    /// Set when the link is gone: the cursor removes its file when it stops.
    detached: AtomicBool,
    cancel: CancellationToken,
    done: watch::Receiver<bool>,
    /// Wakes a sleeping cursor early (retention removed parent records).
    wake: tokio::sync::Notify,
    /// Set for a remote link's cursor.
    remote: Option<RemoteCursor>,
}

impl CursorState {
    fn id(&self) -> CursorId {
        CursorId {
            child_id: self.child_id,
            epoch: self.epoch,
        }
    }
    fn labels(&self) -> ChildLabels {
        ChildLabels {
            parent: self.parent.clone(),
            child: self.child.clone(),
        }
    }
    fn partition_labels(&self) -> ChildPartitionLabels {
        ChildPartitionLabels {
            parent: self.parent.clone(),
            child: self.child.clone(),
            partition: self.partition.to_string(),
        }
    }
}

/// The fan-out engine of one node.
pub struct Children {
    meta: Meta,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    committer: Arc<dyn ChildCommitter>,
    cfg: ChildrenConfig,
    cursors: Mutex<HashMap<Key, Arc<CursorState>>>,
    /// Cursors told to stop whose tasks may still run.
    stopping: Mutex<Vec<Arc<CursorState>>>,
    /// Serialises reconciles (they do file I/O outside the `cursors` lock).
    reconcile_lock: Mutex<()>,
    /// Turns for local-child commits (see [`COMMITS_IN_FLIGHT`]).
    commit_gate: tokio::sync::Semaphore,
    /// One HTTP client per remote link (by epoch), shared by its cursors here.
    remote_clients: Mutex<HashMap<u64, Arc<RemoteClient>>>,
    shutdown: CancellationToken,
    swept: AtomicBool,
    /// Set once the local view is known to be current (SPEC §6.1): a restarted node may
    /// hold an old snapshot that lacks a link, so cursor files of links it does not know
    /// are only removed after that.
    view_confirmed: AtomicBool,
    rt: tokio::runtime::Handle,
    /// Where the cursors' blocking work runs (reads, local child commits, cursor files).
    io: Arc<IoThreads>,
}

impl Children {
    /// Must be called inside the tokio runtime the cursors will run on.
    pub fn new(
        meta: Meta,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        committer: Arc<dyn ChildCommitter>,
        cfg: ChildrenConfig,
        io: Arc<IoThreads>,
    ) -> Arc<Self> {
        Arc::new(Children {
            meta,
            registry,
            metrics,
            committer,
            cfg,
            cursors: Mutex::new(HashMap::new()),
            stopping: Mutex::new(Vec::new()),
            reconcile_lock: Mutex::new(()),
            commit_gate: tokio::sync::Semaphore::new(COMMITS_IN_FLIGHT),
            remote_clients: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
            swept: AtomicBool::new(false),
            view_confirmed: AtomicBool::new(false),
            rt: tokio::runtime::Handle::current(),
            io,
        })
    }

    /// Starts the cursors the metadata asks for (anchoring new ones durably), stops the
    /// others, and returns once every stopped cursor has stopped.
    pub async fn sync(self: &Arc<Self>) {
        let me = self.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || me.reconcile()).await {
            tracing::error!(error = %e, "fan-out reconcile failed");
        }
        let waiting: Vec<Arc<CursorState>> = self.stopping.lock().clone();
        for st in &waiting {
            let mut done = st.done.clone();
            if tokio::time::timeout(STOP_WAIT, done.wait_for(|d| *d))
                .await
                .is_err()
            {
                tracing::warn!(parent = %st.parent, child = %st.child, partition = st.partition,
                    "a fan-out cursor did not stop in time");
            }
        }
        self.stopping.lock().retain(|st| !*st.done.borrow());
    }

    /// The local view is current: it caught up with the leader after this start (a standalone
    /// node's view is always current).
    pub fn confirm_view(&self) {
        self.view_confirmed.store(true, Ordering::Release);
    }

    /// Stops every cursor (positions are persisted as they stop).
    pub async fn shutdown(self: &Arc<Self>) {
        self.shutdown.cancel();
        self.sync().await;
    }

    /// Per child, the lag of each parent partition whose cursor runs on this node (parent
    /// high watermark minus cursor). Partitions owned elsewhere are absent (the cluster asks
    /// their owners: `FanoutCursors`).
    pub fn partition_lags(
        &self,
        view: &MetaState,
        parent: &Topic,
    ) -> BTreeMap<String, BTreeMap<u32, u64>> {
        let cursors = self.cursors.lock();
        // Per parent partition whose cursor of (child id, epoch) runs here: its lag.
        let lags = |child_id: u64, epoch: u64| -> BTreeMap<u32, u64> {
            (0..parent.config.partitions)
                .filter_map(|p| {
                    let st = cursors.get(&Key {
                        parent_id: parent.id,
                        partition: p,
                        child_id,
                        epoch,
                    })?;
                    let hwm = st.part.log.high_watermark();
                    Some((p, hwm.saturating_sub(st.next.load(Ordering::Acquire))))
                })
                .collect()
        };
        let mut out = BTreeMap::new();
        for link in view.children_of(&parent.name) {
            if let Some(child) = view.topics.get(&link.child) {
                out.insert(link.child.clone(), lags(child.id, link.epoch));
            }
        }
        for link in view.remote_links_of(&parent.name) {
            out.insert(link.link.clone(), lags(REMOTE_CHILD_ID, link.epoch));
        }
        out
    }

    /// Per remote link of `parent`, the worst `state` (with its `last_error`) of its cursors
    /// running on this node; links without a cursor here are absent.
    pub fn remote_states(&self, view: &MetaState, parent: &Topic) -> BTreeMap<String, LinkStatus> {
        let cursors = self.cursors.lock();
        let mut out = BTreeMap::new();
        for link in view.remote_links_of(&parent.name) {
            let statuses: Vec<LinkStatus> = (0..parent.config.partitions)
                .filter_map(|p| {
                    let key = Key {
                        parent_id: parent.id,
                        partition: p,
                        child_id: REMOTE_CHILD_ID,
                        epoch: link.epoch,
                    };
                    Some(cursors.get(&key)?.remote.as_ref()?.status.lock().clone())
                })
                .collect();
            if let Some(w) = remote::worst(&statuses) {
                out.insert(link.link.clone(), w);
            }
        }
        out
    }

    /// Wakes the cursors of a parent partition whose oldest records retention just removed,
    /// so that a sleeping (delay) cursor counts what it lost at once.
    pub fn poke(&self, parent_id: u64, partition: u32) {
        for (k, st) in self.cursors.lock().iter() {
            if k.parent_id == parent_id && k.partition == partition {
                st.wake.notify_one();
            }
        }
    }

    /// Refreshes `fanout_lag_messages` and `fanout_due_lag_seconds` (on scrape).
    pub fn refresh_gauges(&self) {
        let all: Vec<Arc<CursorState>> = self.cursors.lock().values().cloned().collect();
        let now = now_ms();
        for st in all {
            let next = st.next.load(Ordering::Acquire);
            let hwm = st.part.log.high_watermark();
            let l = st.partition_labels();
            self.metrics
                .children
                .lag
                .get_or_create(&l)
                .set(hwm.saturating_sub(next) as i64);
            let due_lag = if next < hwm {
                match st.part.log.read(next) {
                    Ok(Some(r)) => route::due_lag_seconds(r.timestamp_ms, st.delay_ms, now),
                    _ => 0.0,
                }
            } else {
                0.0
            };
            self.metrics.children.due_lag.get_or_create(&l).set(due_lag);
            if st.detached.load(Ordering::Acquire) {
                // Its link went while this scrape ran: the cursor removed its series already.
                self.metrics.children.lag.remove(&l);
                self.metrics.children.due_lag.remove(&l);
            }
        }
    }

    /// The cursors the metadata wants on this node.
    fn desired(&self, view: &MetaState) -> HashMap<Key, (LinkSpec, Arc<Partition>)> {
        let mut want = HashMap::new();
        if self.shutdown.is_cancelled() {
            return want;
        }
        let local = view.child_links.values().filter_map(|link| {
            let c = view.topics.get(&link.child)?;
            Some((LinkSpec::from(link), c.id))
        });
        let remote = view
            .all_remote_links()
            .map(|link| (LinkSpec::from(link), REMOTE_CHILD_ID));
        for (link, child_id) in local.chain(remote) {
            let Some(p) = view.topics.get(&link.parent) else {
                continue;
            };
            let Some(rt) = self.registry.topic(p.id) else {
                continue;
            };
            for part in rt.partitions() {
                want.insert(
                    Key {
                        parent_id: p.id,
                        partition: part.index,
                        child_id,
                        epoch: link.epoch,
                    },
                    (link.clone(), part),
                );
            }
        }
        want
    }

    /// Blocking: file I/O for new cursors.
    fn reconcile(self: &Arc<Self>) {
        let _g = self.reconcile_lock.lock();
        let view = self.meta.view();
        let want = self.desired(&view);
        let linked: HashSet<(u64, u64)> = view
            .child_links
            .values()
            .filter_map(|l| Some((view.topics.get(&l.child)?.id, l.epoch)))
            .chain(view.all_remote_links().map(|l| (REMOTE_CHILD_ID, l.epoch)))
            .collect();
        // Stop what is no longer wanted.
        {
            let mut cursors = self.cursors.lock();
            let gone: Vec<Key> = cursors
                .keys()
                .filter(|k| !want.contains_key(k))
                .copied()
                .collect();
            let mut stopping = self.stopping.lock();
            for k in gone {
                let st = cursors
                    .remove(&k)
                    .expect("invariant: key taken from the map");
                if !linked.contains(&(k.child_id, k.epoch)) {
                    st.detached.store(true, Ordering::Release);
                }
                st.cancel.cancel();
                stopping.push(st);
            }
        }
        // Remote clients of links no longer running here go (their cursors hold their own
        // reference until they stop).
        self.remote_clients.lock().retain(|epoch, _| {
            want.keys()
                .any(|k| k.child_id == REMOTE_CHILD_ID && k.epoch == *epoch)
        });
        // Start what is missing.
        let missing: Vec<(Key, LinkSpec, Arc<Partition>)> = {
            let cursors = self.cursors.lock();
            want.iter()
                .filter(|(k, _)| !cursors.contains_key(k))
                .map(|(k, (l, p))| (*k, l.clone(), p.clone()))
                .collect()
        };
        for (key, link, part) in missing {
            let remote = match &link.remote {
                None => None,
                Some(endpoint) => match self.remote_client(&link, endpoint) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        self.metrics.error("fanout", "remote_client");
                        tracing::error!(parent = %link.parent, link = %link.child, error = %e,
                            "cannot set up the client of a remote child link; retried on the next change");
                        continue;
                    }
                },
            };
            match open_cursor(&link, &part, key.child_id) {
                Ok(next) => {
                    let st = self.spawn(key, &link, part, next, remote);
                    self.cursors.lock().insert(key, st);
                }
                Err(e) => {
                    self.metrics.error("fanout", "cursor_open");
                    tracing::error!(parent = %link.parent, child = %link.child, partition = key.partition,
                        error = %e, "cannot open a fan-out cursor; retried on the next change");
                }
            }
        }
        // Once per process, with a confirmed view: remove cursor files of links that no
        // longer exist (detached or deleted while the node was down).
        if !self.shutdown.is_cancelled()
            && self.view_confirmed.load(Ordering::Acquire)
            && !self.swept.swap(true, Ordering::AcqRel)
        {
            for rt in self.registry.all() {
                for part in rt.partitions() {
                    let dir = CursorDir::new(part.dir());
                    for id in dir.list() {
                        if !linked.contains(&(id.child_id, id.epoch)) {
                            let _ = dir.remove(id);
                            tracing::info!(topic = %rt.name, partition = part.index, child_id = id.child_id,
                                epoch = id.epoch, "removed the cursor of a link that no longer exists");
                        }
                    }
                }
            }
        }
    }

    /// The shared client of remote link `link` (built on first use, by epoch).
    fn remote_client(
        &self,
        link: &LinkSpec,
        endpoint: &RemoteEndpoint,
    ) -> Result<Arc<RemoteClient>, remote::RemoteConfigError> {
        if let Some(c) = self.remote_clients.lock().get(&link.epoch) {
            return Ok(c.clone());
        }
        let password = endpoint
            .password
            .as_deref()
            .map(|p| {
                crate::security::sealing::CredentialKey::open_stored(
                    self.cfg.credentials.as_deref(),
                    &link.parent,
                    &link.child,
                    p,
                )
            })
            .transpose();
        let c = RemoteClient::new(endpoint, &self.cfg.remote_hosts, password)?;
        Ok(self
            .remote_clients
            .lock()
            .entry(link.epoch)
            .or_insert(c)
            .clone())
    }

    fn spawn(
        self: &Arc<Self>,
        key: Key,
        link: &LinkSpec,
        part: Arc<Partition>,
        next: u64,
        remote: Option<Arc<RemoteClient>>,
    ) -> Arc<CursorState> {
        let (done_tx, done_rx) = watch::channel(false);
        let st = Arc::new(CursorState {
            parent: link.parent.clone(),
            child: link.child.clone(),
            partition: key.partition,
            delay_ms: link.delay_ms,
            epoch: link.epoch,
            child_id: key.child_id,
            next: AtomicU64::new(next),
            part,
            detached: AtomicBool::new(false),
            cancel: self.shutdown.child_token(),
            done: done_rx,
            wake: tokio::sync::Notify::new(),
            remote: remote.map(|client| RemoteCursor {
                client,
                status: Mutex::new(LinkStatus::default()),
            }),
        });
        tracing::debug!(parent = %st.parent, child = %st.child, partition = st.partition, epoch = st.epoch,
            next, delay_ms = st.delay_ms, "fan-out cursor started");
        let me = self.clone();
        let task_state = st.clone();
        self.rt.spawn(async move {
            me.run(&task_state).await;
            let _ = done_tx.send(true);
        });
        st
    }

    /// One cursor's loop; returns when cancelled or when its link is gone.
    async fn run(&self, st: &CursorState) {
        let part = st.part.clone();
        let dir = CursorDir::new(part.dir());
        let max = self.cfg.max_batch_records.max(1);
        let mut chunk = if st.delay_ms > 0 {
            MIN_DELAY_CHUNK.min(max)
        } else {
            max
        };
        let id = st.id();
        let mut pos = st.next.load(Ordering::Acquire);
        let mut file: Option<CursorFile> = None;
        let mut dirty = false;
        let mut backoff = RETRY_MIN;
        loop {
            if st.cancel.is_cancelled() {
                break;
            }
            let due = file.as_ref().is_some_and(CursorFile::sync_due);
            if dirty || due {
                match self
                    .persist(&dir, id, &mut file, dirty.then_some(pos), !dirty)
                    .await
                {
                    Ok(()) => dirty = false,
                    Err(e) => {
                        self.metrics.error("fanout", "cursor_persist");
                        tracing::error!(parent = %st.parent, child = %st.child, partition = st.partition,
                            error = %e, "cannot persist a fan-out cursor; retrying");
                        self.pause(st, &mut backoff).await;
                        continue;
                    }
                }
            }
            // An idle cursor wakes in time to fsync its last advance.
            let idle_bound = match &file {
                Some(f) if f.unsynced() => cursor::SYNC_EVERY,
                _ => self.cfg.max_idle_sleep,
            };
            let step = route::cursor_step(
                pos,
                part.log.oldest_offset(),
                part.log.high_watermark(),
                max,
                !self.cfg.linger.is_zero(),
            );
            let linger = match step {
                route::CursorStep::Skip { to: oldest, lost } => {
                    // Retention removed records this cursor had not copied yet.
                    self.metrics
                        .children
                        .dropped
                        .get_or_create(&st.labels())
                        .inc_by(lost);
                    tracing::warn!(parent = %st.parent, child = %st.child, partition = st.partition,
                    from = pos, to = oldest, "retention removed parent records before they were copied to the child");
                    pos = oldest;
                    st.next.store(pos, Ordering::Release);
                    dirty = true;
                    continue;
                }
                route::CursorStep::CaughtUp => {
                    self.wait_commit(st, pos, idle_bound).await;
                    continue;
                }
                route::CursorStep::Copy { linger, .. } => linger,
            };
            if st.delay_ms > 0 {
                let p2 = part.clone();
                let head = match self.read(move || p2.log.read(pos)).await {
                    Ok(Some(r)) => r.timestamp_ms,
                    Ok(None) => continue,
                    Err(e) => {
                        if self.read_failed(st, &mut pos, &mut dirty, e) {
                            self.pause(st, &mut backoff).await;
                        }
                        continue;
                    }
                };
                let now = now_ms();
                let due = route::due_ms(head, st.delay_ms);
                if due > now {
                    let nap = route::sleep_until_due(due, now, idle_bound);
                    tokio::select! {
                        _ = tokio::time::sleep(nap) => {}
                        _ = st.wake.notified() => {}
                        _ = st.cancel.cancelled() => {}
                    }
                    continue;
                }
            }
            if linger {
                tokio::select! {
                    _ = tokio::time::sleep(self.cfg.linger) => {}
                    _ = st.cancel.cancelled() => continue,
                }
            }
            // A local child's turn is taken before reading, so waiting fills the batch; it is
            // given back at the first failed attempt (a stalled child stalls only itself).
            let turn = if st.remote.is_none() {
                tokio::select! {
                    t = self.commit_gate.acquire() => t.ok(),
                    _ = st.cancel.cancelled() => continue,
                }
            } else {
                None
            };
            let turn = Mutex::new(turn);
            let want = if st.delay_ms > 0 { chunk } else { max };
            let bytes = self.cfg.max_batch_bytes;
            let p2 = part.clone();
            let recs = match self.read(move || p2.log.read_from(pos, want, bytes)).await {
                Ok(r) => r,
                Err(e) => {
                    if self.read_failed(st, &mut pos, &mut dirty, e) {
                        self.pause(st, &mut backoff).await;
                    }
                    continue;
                }
            };
            if recs.is_empty() {
                continue;
            }
            let n = if st.delay_ms > 0 {
                let due = route::due_prefix(&recs, st.delay_ms, now_ms());
                chunk = route::next_chunk(chunk, recs.len(), due, MIN_DELAY_CHUNK.min(max), max);
                due
            } else {
                recs.len()
            };
            if n == 0 {
                continue;
            }
            let batch = &recs[..n];
            let copied = match &st.remote {
                None => self.commit(st, batch, &turn).await,
                Some(r) => self.commit_remote(st, r, batch).await,
            };
            if !copied {
                break;
            }
            pos = batch[n - 1].offset + 1;
            st.next.store(pos, Ordering::Release);
            dirty = true;
            backoff = RETRY_MIN;
            let bytes: usize = batch.iter().map(|r| r.payload.len()).sum();
            let m = &self.metrics.children;
            if st.remote.is_none() {
                m.committed.get_or_create(&st.labels()).inc_by(n as u64);
            }
            m.batch_records.observe(n as f64);
            m.batch_bytes.observe(bytes as f64);
        }
        if st.detached.load(Ordering::Acquire) {
            drop(file);
            let _ = self.io.run(move || dir.remove(id)).await;
            let l = st.partition_labels();
            self.metrics.children.lag.remove(&l);
            self.metrics.children.due_lag.remove(&l);
            // The link's own series go with its last cursor here, unless a link of the same
            // names runs again (re-attached: the series are its own).
            let again = self
                .cursors
                .lock()
                .values()
                .any(|c| c.parent == st.parent && c.child == st.child);
            if !again {
                self.metrics.forget_link(&st.parent, &st.child);
            }
            tracing::debug!(parent = %st.parent, child = %st.child, partition = st.partition, "fan-out cursor removed");
        } else {
            let stored = self
                .persist(&dir, id, &mut file, dirty.then_some(pos), true)
                .await;
            if let Err(e) = stored {
                tracing::warn!(parent = %st.parent, child = %st.child, partition = st.partition, error = %e,
                    "cannot persist a stopping fan-out cursor; its last records will be copied again");
            }
        }
    }

    /// Advances the cursor file to `next` if given (opening it first if needed), then fsyncs
    /// it if `sync` (an advance also fsyncs by itself once `SYNC_EVERY` has passed). One job
    /// on an I/O thread.
    async fn persist(
        &self,
        dir: &CursorDir,
        id: CursorId,
        file: &mut Option<CursorFile>,
        next: Option<u64>,
        sync: bool,
    ) -> std::io::Result<()> {
        if file.is_none() && next.is_none() {
            return Ok(());
        }
        let dir = dir.clone();
        let held = file.take();
        let (back, r) = self
            .io
            .run(move || {
                let mut f = match held {
                    Some(f) => f,
                    None => match dir.open(id, next.unwrap_or(0)) {
                        Ok(f) => f,
                        Err(e) => return (None, Err(e)),
                    },
                };
                let r = next.map_or(Ok(()), |n| f.advance(n)).and_then(|()| {
                    if sync {
                        f.sync()
                    } else {
                        Ok(())
                    }
                });
                (Some(f), r)
            })
            .await
            .map_err(std::io::Error::other)?;
        *file = back;
        r
    }

    /// Reads the parent partition on an I/O thread.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        self.io.run(f).await.unwrap_or_else(|e| {
            Err(StorageError::Io {
                path: Default::default(),
                source: std::io::Error::other(e),
            })
        })
    }

    /// Handles a failed parent read: skips an unreadable record (loudly, counted as
    /// dropped for this child); `true` when the caller should back off (transient error).
    fn read_failed(
        &self,
        st: &CursorState,
        pos: &mut u64,
        dirty: &mut bool,
        e: StorageError,
    ) -> bool {
        match e {
            StorageError::Gone { .. } => false,
            StorageError::Unreadable { offset, reason } if offset >= *pos => {
                tracing::error!(parent = %st.parent, child = %st.child, partition = st.partition, offset,
                    %reason, "skipping an unreadable parent record; it is not copied");
                self.metrics
                    .children
                    .dropped
                    .get_or_create(&st.labels())
                    .inc_by(offset + 1 - *pos);
                *pos = offset + 1;
                st.next.store(*pos, Ordering::Release);
                *dirty = true;
                false
            }
            e => {
                self.metrics.error("fanout", "read");
                tracing::warn!(parent = %st.parent, child = %st.child, partition = st.partition,
                    error = %e, "reading the parent partition failed; retrying");
                true
            }
        }
    }

    async fn pause(&self, st: &CursorState, backoff: &mut Duration) {
        tokio::select! {
            _ = tokio::time::sleep(*backoff) => {}
            _ = st.cancel.cancelled() => {}
        }
        *backoff = (*backoff * 2).min(RETRY_MAX);
    }

    /// Waits until the parent partition commits past `pos` (or `bound`, or a stop).
    async fn wait_commit(&self, st: &CursorState, pos: u64, bound: Duration) {
        let notified = st.part.committed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if st.part.log.high_watermark() > pos {
            return;
        }
        tokio::select! {
            _ = notified => {}
            _ = st.wake.notified() => {}
            _ = tokio::time::sleep(bound) => {}
            _ = st.cancel.cancelled() => {}
        }
    }

    /// The child topic as the metadata has it now, while this cursor's link still holds.
    fn child_topic(&self, st: &CursorState) -> Option<Arc<Topic>> {
        let view = self.meta.view();
        let link = view.child_links.get(&st.child)?;
        if link.epoch != st.epoch || link.parent != st.parent {
            return None;
        }
        view.topics
            .get(&st.child)
            .filter(|t| t.id == st.child_id)
            .cloned()
    }

    /// Commits `batch` to the child's partitions, each group retried until it is durable.
    /// `false` when the cursor must stop (cancelled, or its link is gone).
    async fn commit(
        &self,
        st: &CursorState,
        batch: &[StoredRecord],
        turn: &Mutex<Option<tokio::sync::SemaphorePermit<'_>>>,
    ) -> bool {
        let Some(child) = self.child_topic(st) else {
            return false;
        };
        let mut groups: BTreeMap<u32, Vec<NewRecord>> = BTreeMap::new();
        for r in batch {
            let p = route::child_partition(r.key.as_deref(), st.partition, child.config.partitions);
            groups.entry(p).or_default().push(NewRecord {
                key: r.key.clone(),
                payload: r.payload.clone(),
                // The idempotency key is the parent's produce's: a child's commit must not
                // drop a copy as a repeat (a catching-up cursor copies records committed
                // far apart within one window).
                attrs: crate::dedup::without_key(r.attrs.as_ref()),
            });
        }
        let results = futures::future::join_all(
            groups
                .into_iter()
                .map(|(p, records)| self.commit_group(st, p, records, turn)),
        )
        .await;
        results.into_iter().all(|ok| ok)
    }

    /// Whether the remote link this cursor serves is still attached (same epoch).
    fn remote_link_holds(&self, st: &CursorState) -> bool {
        self.meta
            .view()
            .remote_link(&st.parent, &st.child)
            .is_some_and(|l| l.epoch == st.epoch)
    }

    /// Copies `batch` to the remote topic (SPEC §5.5): in batch produces (single produce
    /// when the remote lacks the batch route), retrying, blocking and skipping as
    /// [`remote::classify`] says, until every record is accepted (`202`) or skipped.
    /// `false` when the cursor must stop (cancelled, or the link is gone).
    async fn commit_remote(
        &self,
        st: &CursorState,
        r: &RemoteCursor,
        batch: &[StoredRecord],
    ) -> bool {
        let client = &r.client;
        let mut body = BatchBody::default();
        let mut backoff = remote::Backoff::default();
        let mut i = 0;
        // Records before this index go one by one (their batch was refused as a whole).
        let mut one_by_one_until = 0;
        // The batch route answered 404/405: is it missing, or is the topic?
        let mut probing = false;
        while i < batch.len() {
            if st.cancel.is_cancelled() || !self.remote_link_holds(st) {
                return false;
            }
            let mut n = 0;
            if !(probing || i < one_by_one_until || client.single_mode()) {
                n = body.fill(&batch[i..]);
            }
            let single = n == 0;
            let send = async {
                if single {
                    client.send_single(&batch[i]).await
                } else {
                    client.send_batch(body.bytes()).await
                }
            };
            // A stop (detach, shutdown) does not wait for a slow remote: the records are
            // sent again by the next cursor of this link, if any (at-least-once).
            let sent = tokio::select! {
                r = send => r,
                _ = st.cancel.cancelled() => return false,
            };
            if single {
                n = 1;
            }
            let (verdict, error, reason) = match &sent {
                Ok(a) => (
                    remote::classify(a.status, !single, a.retry_after),
                    a.describe(),
                    remote::error_reason(a.status),
                ),
                Err(e) => (Verdict::Retry { after: None }, e.to_string(), e.reason()),
            };
            match verdict {
                Verdict::Accepted | Verdict::Skip => {
                    if probing {
                        probing = false;
                        client.set_single_mode();
                        tracing::info!(parent = %st.parent, link = %st.child, url = %client.url,
                            "the remote has no batch produce; copying with single produce");
                    }
                    if verdict == Verdict::Skip {
                        self.count_send_error(st, reason);
                        self.metrics
                            .children
                            .dropped
                            .get_or_create(&st.labels())
                            .inc();
                        tracing::warn!(parent = %st.parent, link = %st.child, partition = st.partition,
                            offset = batch[i].offset, url = %client.url, topic = %client.topic, error = %error,
                            "the remote refused a record on its own; it is skipped (not copied)");
                    } else {
                        self.metrics
                            .children
                            .committed
                            .get_or_create(&st.labels())
                            .inc_by(n as u64);
                    }
                    i += n;
                    backoff.reset();
                    self.set_status(st, r, LinkState::Ok, None);
                }
                Verdict::NoBatchRoute => probing = true,
                Verdict::OneByOne => one_by_one_until = i + n,
                Verdict::Retry { after } => {
                    self.count_send_error(st, reason);
                    self.set_status(st, r, LinkState::Retrying, Some(error));
                    let wait = backoff.delay(after);
                    self.nap(st, wait).await;
                }
                Verdict::Block => {
                    probing = false;
                    self.count_send_error(st, reason);
                    self.set_status(st, r, LinkState::Blocked, Some(error));
                    self.nap(st, remote::BLOCKED_RETRY).await;
                }
            }
        }
        true
    }

    fn count_send_error(&self, st: &CursorState, reason: &'static str) {
        self.metrics
            .remote_child_send_errors
            .get_or_create(&RemoteSendErrorLabels {
                parent: st.parent.clone(),
                child: st.child.clone(),
                reason,
            })
            .inc();
    }

    /// Records a cursor's link state; a change is logged (warn when it gets worse).
    fn set_status(
        &self,
        st: &CursorState,
        r: &RemoteCursor,
        state: LinkState,
        error: Option<String>,
    ) {
        let before = {
            let mut s = r.status.lock();
            let before = s.state;
            s.state = state;
            s.last_error = error;
            before
        };
        if before == state {
            return;
        }
        let last_error = r.status.lock().last_error.clone().unwrap_or_default();
        if state > before {
            tracing::warn!(parent = %st.parent, link = %st.child, partition = st.partition,
                url = %r.client.url, topic = %r.client.topic, state = state.as_str(), error = %last_error,
                "remote child link cannot copy; retrying");
        } else {
            tracing::info!(parent = %st.parent, link = %st.child, partition = st.partition,
                url = %r.client.url, state = state.as_str(), "remote child link copies again");
        }
    }

    /// Sleeps `d` unless the cursor is stopped first.
    async fn nap(&self, st: &CursorState, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = st.cancel.cancelled() => {}
        }
    }

    async fn commit_group(
        &self,
        st: &CursorState,
        p: u32,
        records: Vec<NewRecord>,
        turn: &Mutex<Option<tokio::sync::SemaphorePermit<'_>>>,
    ) -> bool {
        let mut backoff = RETRY_MIN;
        loop {
            if st.cancel.is_cancelled() {
                return false;
            }
            let Some(child) = self.child_topic(st) else {
                return false;
            };
            match self.committer.commit(child, p, records.clone()).await {
                Ok(()) => return true,
                Err(e) => {
                    self.metrics.error("fanout", "child_commit");
                    tracing::warn!(parent = %st.parent, child = %st.child, partition = st.partition,
                        child_partition = p, error = %e, "fan-out commit failed; retrying (this cursor waits)");
                    drop(turn.lock().take());
                    self.pause(st, &mut backoff).await;
                }
            }
        }
    }
}

/// Loads (or anchors) a cursor. Blocking.
fn open_cursor(link: &LinkSpec, part: &Partition, child_id: u64) -> std::io::Result<u64> {
    let dir = CursorDir::new(part.dir());
    let id = CursorId {
        child_id,
        epoch: link.epoch,
    };
    let hwm = part.log.high_watermark();
    match dir.load(id)? {
        // Never ahead of what the partition holds (duplicates, never gaps).
        Loaded::At(n) => Ok(n.min(hwm)),
        Loaded::Missing => {
            let anchor = if part.index >= link.parent_partitions_at_attach {
                // Added to the parent after the attach: copy it from its start.
                part.log.oldest_offset()
            } else {
                hwm
            };
            dir.store(id, anchor)?;
            Ok(anchor)
        }
        Loaded::Corrupt => {
            let from = part.log.oldest_offset();
            tracing::error!(parent = %link.parent, child = %link.child, partition = part.index, from,
                "fan-out cursor file is damaged; copying again from the oldest retained record");
            dir.store(id, from)?;
            Ok(from)
        }
    }
}
