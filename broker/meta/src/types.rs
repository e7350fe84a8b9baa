//! The replicated metadata records. Plain data: serde-serialisable, no I/O.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A node id (e.g. the pod name `narad-0`).
pub type NodeId = String;

/// Settings of a topic, with every default already resolved by the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    pub partitions: u32,
    /// 0 = keep forever.
    pub retention_ms: u64,
    pub visibility_timeout_ms: u64,
    pub max_in_flight_per_partition: u64,
    pub max_acked_ahead_per_partition: u64,
}

/// One registered schema version (version numbers start at 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaVersion {
    pub version: u32,
    /// The JSON Schema document, as JSON text exactly as registered.
    pub schema: String,
}

/// Placement of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The node holding the partition's only copy; `None` while unassigned.
    pub owner: Option<NodeId>,
    /// Move target while a rebalance copies the partition.
    pub target: Option<NodeId>,
}

/// A topic as stored in the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    /// Unique for the cluster's lifetime, never reused: a topic re-created under the same
    /// name gets a new id, so its data directories and WAL records never mix with the old.
    pub id: u64,
    pub name: String,
    pub config: TopicConfig,
    pub created_at_ms: u64,
    /// Creating user; `None` when security is off.
    pub owner: Option<String>,
    /// Schema history, oldest first; empty = no schema.
    pub schemas: Vec<SchemaVersion>,
    /// One entry per partition.
    pub assignments: Vec<Assignment>,
}

impl Topic {
    pub fn current_schema(&self) -> Option<&SchemaVersion> {
        self.schemas.last()
    }
}

/// A cluster member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: NodeId,
    pub api_addr: String,
    pub cluster_addr: String,
    pub version: String,
    /// Last heartbeat, Unix milliseconds (proposer's clock).
    pub last_seen_ms: u64,
    pub dead: bool,
    pub draining: bool,
}

/// Changes to a topic, validated by the proposer; applied atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPatch {
    pub partitions: Option<u32>,
    pub retention_ms: Option<u64>,
    pub visibility_timeout_ms: Option<u64>,
    pub max_in_flight_per_partition: Option<u64>,
    pub max_acked_ahead_per_partition: Option<u64>,
    /// New schema version (JSON text); compatibility is checked by the proposer
    /// against `schema_base_version`.
    pub schema: Option<String>,
    /// When set, the change applies only if the current schema version equals it.
    pub schema_base_version: Option<u32>,
}

/// A command of the replicated state machine. Append-only: never change a variant's meaning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaCommand {
    CreateTopic {
        name: String,
        config: TopicConfig,
        owner: Option<String>,
        schema: Option<String>,
        created_at_ms: u64,
    },
    AlterTopic {
        name: String,
        patch: TopicPatch,
    },
    DeleteTopic {
        name: String,
    },
    /// Heartbeat / registration of a member (upsert).
    RegisterMember {
        id: NodeId,
        api_addr: String,
        cluster_addr: String,
        version: String,
        now_ms: u64,
    },
}

/// The result of applying a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaResponse {
    Topic(Arc<Topic>),
    /// The deleted topic (so its data can be purged).
    Deleted(Arc<Topic>),
    Ok,
}

/// A refusal by the state machine (deterministic; the same on every replica).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApplyError {
    /// → 404
    #[error("{0}")]
    NotFound(String),
    /// → 409
    #[error("{0}")]
    Conflict(String),
    /// → 400
    #[error("{0}")]
    Invalid(String),
}

/// The whole replicated state. Cheap to clone (topics are behind `Arc`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    pub topics: BTreeMap<String, Arc<Topic>>,
    /// lower-cased name → name, to refuse names differing only in letter case.
    pub topic_names_folded: BTreeMap<String, String>,
    pub next_topic_id: u64,
    pub members: BTreeMap<NodeId, Member>,
}
