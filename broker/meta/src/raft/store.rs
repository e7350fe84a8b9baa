//! The Raft log store and state machine, persisted in one redb database (`<dir>/raft.redb`).
//!
//! # Durability contract
//!
//! - **Log entries, vote, truncation, purge**: one redb write transaction each, committed with
//!   `Durability::Immediate` (redb fsyncs before `commit` returns) *before* openraft is told
//!   (the `LogFlushed` callback / the method's return). A purge deletes the entries and records
//!   the last purged log id in the same transaction.
//! - **Committed index**: saved with `Durability::None` — made durable by the next durable
//!   commit. It is only a hint that lets a restarted node re-apply its committed entries
//!   before it hears from a leader; losing it costs nothing but that.
//! - **State machine**: *not* persisted on apply. It lives in memory and is rebuilt on open
//!   from the last snapshot, after which openraft re-applies the logs from the snapshot up to
//!   the committed index (and a leader commits the rest on election). A snapshot is written
//!   (durably) before openraft may purge the logs it covers, so snapshot + log always cover
//!   every committed entry, whatever point a crash hits.
//! - **Snapshots**: the whole `MetaState` as JSON plus its `SnapshotMeta` (last applied log id,
//!   membership), stored together in one transaction; an older snapshot never overwrites a
//!   newer one.

// `StorageError` is openraft's type; its size is not ours to change.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, EntryPayload, OptionalSend, RaftLogReader, RaftSnapshotBuilder, StorageIOError,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;

use super::{
    ApplyResult, Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
    Vote,
};
use crate::types::{MetaResponse, MetaState};

/// Log entries by index, JSON-encoded `Entry`.
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Small records: `vote`, `committed`, `last_purged`, `node` (the owning node's string id).
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
/// The current snapshot: `meta` (`SnapshotMeta`) and `data` (`MetaState` JSON).
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_snapshot");

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_LAST_PURGED: &str = "last_purged";
const KEY_NODE: &str = "node";
const KEY_SNAP_META: &str = "meta";
const KEY_SNAP_DATA: &str = "data";

/// The database file's name inside the metastore directory.
pub const DB_FILE: &str = "raft.redb";

type Result<T, E = StorageError> = std::result::Result<T, E>;

fn read_err(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::read(AnyError::error(e.to_string())).into()
}

fn write_err(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::write(AnyError::error(e.to_string())).into()
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(write_err)
}

fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T> {
    serde_json::from_slice(b).map_err(read_err)
}

/// Runs blocking redb work (writes end in an fsync) off the async worker threads.
async fn blocking<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(write_err)?
}

/// What the state machine publishes to readers after every applied batch.
pub struct Published {
    /// The latest applied state; readers `load` it without locking.
    pub view: ArcSwap<MetaState>,
    /// The last applied log index (0 before anything was applied).
    pub applied: watch::Sender<u64>,
}

impl Published {
    pub fn new() -> Arc<Published> {
        Arc::new(Published {
            view: ArcSwap::from_pointee(MetaState::default()),
            applied: watch::channel(0).0,
        })
    }

    fn publish(&self, state: &Arc<MetaState>, last_applied: Option<&LogId>) {
        self.view.store(state.clone());
        self.applied
            .send_replace(last_applied.map_or(0, |l| l.index));
    }
}

/// The opened metastore database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Arc<Db>,
}

/// The database plus a signal that fires once it is fully closed: fields drop in order, so
/// `closed` is dropped (waking watchers) only after redb's own drop — which flushes and
/// releases the file lock — has finished.
struct Db {
    db: Database,
    closed: watch::Sender<()>,
}

impl std::ops::Deref for Db {
    type Target = Database;
    fn deref(&self) -> &Database {
        &self.db
    }
}

impl Store {
    /// Opens (creating if needed) `<dir>/raft.redb` and its tables.
    pub fn open(dir: &Path) -> Result<Store, String> {
        narad_storage::dirs::create_dir_all_durable(dir)
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let path = dir.join(DB_FILE);
        let db = Database::create(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
        // The database file's entry: redb fsyncs the file, not the directory that holds it.
        narad_storage::dirs::sync_dir(dir).map_err(|e| format!("fsync {}: {e}", dir.display()))?;
        let store = Store {
            db: Arc::new(Db {
                db,
                closed: watch::channel(()).0,
            }),
        };
        store
            .write(Durability::Immediate, |txn| {
                txn.open_table(LOG)?;
                txn.open_table(META)?;
                txn.open_table(SNAPSHOT)?;
                Ok(())
            })
            .map_err(|e| format!("init {}: {e}", path.display()))?;
        Ok(store)
    }

    /// Resolves (`changed()` returns `Err`) once every handle is gone and the file is closed.
    pub fn closed(&self) -> watch::Receiver<()> {
        self.db.closed.subscribe()
    }

    /// Records which node owns this store, or checks that it is `name`.
    pub fn claim(&self, name: &str) -> Result<(), String> {
        let owner: Option<String> = self.get(META, KEY_NODE).map_err(|e| e.to_string())?;
        match owner {
            Some(owner) if owner == name => Ok(()),
            Some(owner) => Err(format!(
                "this metastore belongs to node {owner:?}, not {name:?}"
            )),
            None => {
                let v = encode(&name).map_err(|e| e.to_string())?;
                self.write(Durability::Immediate, move |txn| {
                    txn.open_table(META)?.insert(KEY_NODE, v.as_slice())?;
                    Ok(())
                })
                .map_err(|e| e.to_string())
            }
        }
    }

    pub fn log_store(&self) -> LogStore {
        LogStore {
            store: self.clone(),
        }
    }

    /// The state machine, restored from the stored snapshot (if any), publishing to `published`.
    pub fn state_machine(&self, published: Arc<Published>) -> Result<StateMachine> {
        let (state, last_applied, last_membership) = match self.read_snapshot()? {
            Some((meta, data)) => {
                let state: MetaState = decode(&data)?;
                (Arc::new(state), meta.last_log_id, meta.last_membership)
            }
            None => (
                Arc::new(MetaState::default()),
                None,
                StoredMembership::default(),
            ),
        };
        published.publish(&state, last_applied.as_ref());
        Ok(StateMachine {
            store: self.clone(),
            state,
            last_applied,
            last_membership,
            published,
            snapshot_seq: 0,
        })
    }

    /// One write transaction with the given durability.
    fn write<F>(&self, durability: Durability, f: F) -> Result<(), redb::Error>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(durability)?;
        f(&txn)?;
        txn.commit()?;
        Ok(())
    }

    /// Blocking write off the async threads.
    async fn write_async<F>(&self, durability: Durability, f: F) -> Result<()>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error> + Send + 'static,
    {
        let this = self.clone();
        blocking(move || this.write(durability, f).map_err(write_err)).await
    }

    fn get<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(table).map_err(read_err)?;
        let v = table.get(key).map_err(read_err)?;
        v.map(|v| decode(v.value())).transpose()
    }

    fn read_snapshot(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(SNAPSHOT).map_err(read_err)?;
        let meta = table.get(KEY_SNAP_META).map_err(read_err)?;
        let data = table.get(KEY_SNAP_DATA).map_err(read_err)?;
        match (meta, data) {
            (Some(meta), Some(data)) => Ok(Some((decode(meta.value())?, data.value().to_vec()))),
            _ => Ok(None),
        }
    }

    /// Stores a snapshot unless a newer one is already stored. Durable on return.
    async fn put_snapshot(&self, meta: &SnapshotMeta, data: Vec<u8>) -> Result<()> {
        let meta_bytes = encode(meta)?;
        let last = meta.last_log_id;
        self.write_async(Durability::Immediate, move |txn| {
            let mut table = txn.open_table(SNAPSHOT)?;
            let stored: Option<SnapshotMeta> = match table.get(KEY_SNAP_META)? {
                Some(v) => serde_json::from_slice(v.value()).ok(),
                None => None,
            };
            if stored.is_some_and(|s| s.last_log_id > last) {
                return Ok(());
            }
            table.insert(KEY_SNAP_META, meta_bytes.as_slice())?;
            table.insert(KEY_SNAP_DATA, data.as_slice())?;
            Ok(())
        })
        .await
    }
}

/// openraft's log storage (and log reader) over the redb `raft_log` table.
#[derive(Clone)]
pub struct LogStore {
    store: Store,
}

impl LogStore {
    async fn put_meta<T: Serialize + Sync>(
        &self,
        key: &'static str,
        v: &T,
        durability: Durability,
    ) -> Result<()> {
        let bytes = encode(v)?;
        self.store
            .write_async(durability, move |txn| {
                txn.open_table(META)?.insert(key, bytes.as_slice())?;
                Ok(())
            })
            .await
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>> {
        let bounds: (Bound<u64>, Bound<u64>) =
            (range.start_bound().cloned(), range.end_bound().cloned());
        let txn = self.store.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        let mut out = Vec::new();
        for item in table.range::<u64>(bounds).map_err(read_err)? {
            let (_, v) = item.map_err(read_err)?;
            out.push(decode(v.value())?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>> {
        let last_purged: Option<LogId> = self.store.get(META, KEY_LAST_PURGED)?;
        let txn = self.store.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        let last = match table.last().map_err(read_err)? {
            Some((_, v)) => Some(decode::<Entry>(v.value())?.log_id),
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<()> {
        self.put_meta(KEY_VOTE, vote, Durability::Immediate).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>> {
        self.store.get(META, KEY_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<()> {
        // A hint only (see the module doc): no fsync of its own.
        self.put_meta(KEY_COMMITTED, &committed, Durability::None)
            .await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>> {
        Ok(self
            .store
            .get::<Option<LogId>>(META, KEY_COMMITTED)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let encoded = entries
            .into_iter()
            .map(|e| Ok((e.log_id.index, encode(&e)?)))
            .collect::<Result<Vec<_>>>()?;
        let res = self
            .store
            .write_async(Durability::Immediate, move |txn| {
                let mut table = txn.open_table(LOG)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice())?;
                }
                Ok(())
            })
            .await;
        // Durable (fsynced) before openraft hears about it.
        match &res {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        res
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<()> {
        tracing::debug!(%log_id, "raft log: truncate since");
        let from = log_id.index;
        self.store
            .write_async(Durability::Immediate, move |txn| {
                txn.open_table(LOG)?.retain_in(from.., |_, _| false)?;
                Ok(())
            })
            .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<()> {
        tracing::debug!(%log_id, "raft log: purge up to");
        let upto = log_id.index;
        let purged = encode(&log_id)?;
        self.store
            .write_async(Durability::Immediate, move |txn| {
                txn.open_table(META)?
                    .insert(KEY_LAST_PURGED, purged.as_slice())?;
                txn.open_table(LOG)?.retain_in(..=upto, |_, _| false)?;
                Ok(())
            })
            .await
    }
}

/// openraft's state machine: `MetaState` in memory, snapshots in redb.
pub struct StateMachine {
    store: Store,
    /// The applied state; shared (copy-on-write) with readers through `published`.
    state: Arc<MetaState>,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    published: Arc<Published>,
    snapshot_seq: u64,
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership)> {
        Ok((self.last_applied, self.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        // Copy-on-write: readers keep the Arc they loaded; the batch mutates a private copy.
        let state = Arc::make_mut(&mut self.state);
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let reply = match entry.payload {
                EntryPayload::Blank => Ok(MetaResponse::Ok),
                EntryPayload::Normal(cmd) => state.apply(&cmd),
                EntryPayload::Membership(m) => {
                    self.last_membership = StoredMembership::new(Some(entry.log_id), m);
                    Ok(MetaResponse::Ok)
                }
            };
            replies.push(reply);
        }
        self.published
            .publish(&self.state, self.last_applied.as_ref());
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        self.snapshot_seq += 1;
        SnapshotBuilder {
            store: self.store.clone(),
            state: self.state.clone(),
            last_applied: self.last_applied,
            last_membership: self.last_membership.clone(),
            seq: self.snapshot_seq,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<()> {
        tracing::info!(snapshot = %meta, "installing metadata snapshot");
        let data = snapshot.into_inner();
        let state: MetaState = serde_json::from_slice(&data).map_err(|e| {
            StorageError::from(StorageIOError::read_snapshot(
                Some(meta.signature()),
                AnyError::new(&e),
            ))
        })?;
        self.store.put_snapshot(meta, data).await?;
        self.state = Arc::new(state);
        self.last_applied = meta.last_log_id;
        self.last_membership = meta.last_membership.clone();
        self.published
            .publish(&self.state, self.last_applied.as_ref());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>> {
        Ok(self.store.read_snapshot()?.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Serialises a point-in-time copy of the state machine (taken when openraft asked for the
/// builder, so later applies do not race with it).
pub struct SnapshotBuilder {
    store: Store,
    state: Arc<MetaState>,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot> {
        let data = encode(&*self.state)?;
        let snapshot_id = match &self.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, self.seq),
            None => format!("none-{}", self.seq),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.last_membership.clone(),
            snapshot_id,
        };
        self.store.put_snapshot(&meta, data.clone()).await?;
        tracing::debug!(snapshot = %meta, bytes = data.len(), "built metadata snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_metastore_is_durable_with_its_database_file() {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("metastore");
        let (store, synced) = narad_storage::dirs::record_dir_syncs(|| Store::open(&dir));
        store.unwrap();
        // The directory's entry in the data dir, then raft.redb's entry in the directory.
        assert_eq!(synced, vec![dir.clone(), data.path().to_path_buf(), dir]);
    }
}
