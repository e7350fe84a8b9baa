//! Narad's metadata: a Raft-replicated state machine (openraft) persisted on disk (redb).
//!
//! - `types`: the records (topics, assignments, members) and `MetaCommand`s.
//! - `state`: `MetaState::apply`, the pure, deterministic core.
//! - `raft`: openraft type config, the redb log store and state machine, the network.
//! - `Meta`: the handle the broker uses: `write` a command, read the applied `view`.

mod state;
pub mod types;

pub use types::*;

use std::path::Path;
use std::sync::Arc;

/// Why a metadata write did not happen (or may have happened).
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The state machine refused the command.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// No leader / no quorum: nothing applied (→ 503).
    #[error("metadata unavailable: {0}")]
    Unavailable(String),
    /// The outcome is unknown (→ 503 with "the change may still be applied").
    #[error("the change may still be applied: {0}")]
    Uncertain(String),
    #[error("metadata storage error: {0}")]
    Storage(String),
}

/// Options for opening the metadata node.
#[derive(Debug, Clone)]
pub struct MetaOptions {
    pub node_id: NodeId,
    /// Address other nodes reach this node's cluster port at.
    pub cluster_addr: String,
}

/// Handle to the local metadata replica (and Raft node).
#[derive(Clone)]
pub struct Meta {
    _inner: Arc<()>,
}

impl Meta {
    /// Opens `dir` (the `metastore/` folder), starts the Raft node, and — when the store is
    /// empty — bootstraps a one-voter cluster of this node. Returns once the node is leader of
    /// its one-voter cluster and has applied every committed entry.
    pub async fn open_standalone(dir: &Path, opts: MetaOptions) -> Result<Meta, MetaError> {
        let _ = (dir, opts);
        todo!()
    }

    /// Proposes a command through Raft and waits until it is committed and applied locally.
    pub async fn write(&self, cmd: MetaCommand) -> Result<MetaResponse, MetaError> {
        let _ = cmd;
        todo!()
    }

    /// The latest applied state (lock-free snapshot).
    pub fn view(&self) -> Arc<MetaState> {
        todo!()
    }

    /// Changes whenever a new state is applied (value: last applied log index).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        todo!()
    }

    /// Stops the Raft node and flushes the store.
    pub async fn shutdown(&self) {}
}
