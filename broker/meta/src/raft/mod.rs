//! The openraft wiring: type config, the redb-backed log store and state machine, and the
//! network adapter over a pluggable [`RaftTransport`].
//!
//! - `store`: [`LogStore`] (`RaftLogStorage`) and [`StateMachine`] (`RaftStateMachine`), both
//!   over one redb database file (`<dir>/raft.redb`).
//! - `network`: [`RaftTransport`] — the one trait a node-to-node RPC layer implements — and
//!   the `RaftNetworkFactory` adapter openraft talks to.

mod network;
mod store;

use serde::{Deserialize, Serialize};

pub(crate) use network::NetworkFactory;
pub use network::{BoxFuture, NoTransport, RaftReply, RaftRequest, RaftTransport, TransportError};
pub use store::{LogStore, Published, SnapshotBuilder, StateMachine, Store, DB_FILE};

use crate::types::{ApplyError, MetaCommand, MetaResponse};

/// Openraft's numeric node id. Derived from the string node id with [`raft_node_id`].
pub type RaftNodeId = u64;

/// What a state-machine apply returns for one entry (refusals are deterministic results, not
/// storage errors).
pub type ApplyResult = Result<MetaResponse, ApplyError>;

/// A member of the Raft membership: the string node id and its cluster address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaNode {
    /// The string node id (`narad-0`).
    pub name: String,
    /// Where its cluster port listens (`host:port`).
    pub addr: String,
}

impl std::fmt::Display for MetaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.addr)
    }
}

openraft::declare_raft_types!(
    /// Narad's Raft types.
    pub TypeConfig:
        D = MetaCommand,
        R = ApplyResult,
        NodeId = RaftNodeId,
        Node = MetaNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<RaftNodeId>;
pub type Vote = openraft::Vote<RaftNodeId>;
pub type StoredMembership = openraft::StoredMembership<RaftNodeId, MetaNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<RaftNodeId, MetaNode>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<RaftNodeId>;
pub type RaftMetrics = openraft::RaftMetrics<RaftNodeId, MetaNode>;

/// The Raft node id of a string node id: 64-bit FNV-1a of its UTF-8 bytes.
///
/// Stable across versions and platforms (never change it: it is stored in the log and the
/// vote). Two names colliding is astronomically unlikely; `Meta::add_voter` refuses it anyway.
pub fn raft_node_id(name: &str) -> RaftNodeId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn raft_node_id_is_fnv1a_64() {
        // Reference vectors of FNV-1a 64.
        assert_eq!(super::raft_node_id(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::raft_node_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(
            super::raft_node_id("narad-0"),
            super::raft_node_id("narad-1")
        );
    }
}
