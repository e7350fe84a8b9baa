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
    /// (ext) Exponential backoff of redeliveries after an expired lease or a plain nack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<Backoff>,
    /// (ext) Where a message goes once it was delivered `max_deliveries` times unsettled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// (ext) How long a produce's idempotency key is remembered (`None`: the API's default,
    /// `narad_api::DEFAULT_DEDUP_WINDOW_MS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<u64>,
}

/// (ext) A topic's dead-letter setting: the delivery that would be number
/// `max_deliveries + 1` commits the message to topic `topic` instead, then settles it here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub topic: String,
    pub max_deliveries: u32,
}

/// (ext) A redelivery waits `min_ms` after the first delivery, twice that after the second,
/// and so on, at most `max_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    pub min_ms: u64,
    pub max_ms: u64,
}

impl Backoff {
    /// The wait before the redelivery that follows delivery number `delivery_count`.
    pub fn after(&self, delivery_count: u32) -> u64 {
        let doublings = delivery_count.saturating_sub(1).min(63);
        self.min_ms
            .saturating_mul(1u64 << doublings)
            .min(self.max_ms)
    }
}

/// One registered schema version (version numbers start at 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaVersion {
    pub version: u32,
    /// The JSON Schema document, as JSON text exactly as registered.
    pub schema: String,
}

/// Placement of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The node holding the partition's only copy; `None` while unassigned.
    pub owner: Option<NodeId>,
    /// Move target while a rebalance copies the partition.
    pub target: Option<NodeId>,
    /// The id of the move in flight (set with `target`, after `MetaState::last_move_id`;
    /// never reused), so a late completion or abort of an older move of the same partition
    /// to the same target can never apply to a newer one. 0 when no move is in flight.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub move_id: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
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
    /// (ext) Consumes lease nothing while set (`POST /v1/topics/{t}/pause`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub paused: bool,
}

fn is_false(v: &bool) -> bool {
    !*v
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
    /// (ext) Set (`min_ms` > 0) or clear (`min_ms` = 0) the retry backoff. A member of an
    /// older build ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<Backoff>,
    /// (ext) Set (`max_deliveries` > 0) or clear (`max_deliveries` = 0) the dead-letter
    /// setting. A member of an older build ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// (ext) Set (> 0) or reset to the default (0) the idempotency window. A member of an
    /// older build ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<u64>,
    /// (ext) Pause or resume consumes. A member of an older build ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
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
    /// Creates a user. `password_hash` is a PHC string computed by the proposer (hashing is
    /// random and slow, so it never happens in apply). 409 when the name is taken; 409 when
    /// `root` is set and a root user already exists (there is exactly one root).
    CreateUser {
        username: String,
        password_hash: String,
        grants: Vec<Grant>,
        root: bool,
        now_ms: u64,
    },
    /// Replaces all grants of a user. 404 unknown user; 409 for root (its grants are fixed).
    SetGrants {
        username: String,
        grants: Vec<Grant>,
        now_ms: u64,
    },
    /// Replaces a user's password hash (PHC string, computed by the proposer). 404 unknown user.
    SetPassword {
        username: String,
        password_hash: String,
        now_ms: u64,
    },
    /// (ext) Replaces a user's quotas. 404 unknown user. Root has none (409). Appended
    /// after the other user commands: propose it only once every member runs a build that
    /// knows it.
    SetQuotas {
        username: String,
        quotas: Quotas,
        now_ms: u64,
    },
    /// Deletes a user. 404 unknown user; 409 for root (root cannot be deleted).
    DeleteUser {
        username: String,
    },
    /// Creates the root user [`ROOT_USERNAME`] with an `admin` grant, only if no user exists
    /// at all (SPEC §4.4). Idempotent and never overwrites: answers [`MetaResponse::User`]
    /// when it created root (so only the seeding node logs a generated password), and
    /// [`MetaResponse::Ok`] when it did nothing.
    SeedRoot {
        password_hash: String,
        now_ms: u64,
    },
    /// Attaches the existing topic `child` to `parent` (SPEC §5.1–5.3, §3.7) with a fresh
    /// attach epoch. Refused (state unchanged) when either is missing (404), or on any rule of
    /// §5.1 (409: child = parent, already attached, one parent, no chains, ≤ 108 children,
    /// schema history, parent retention vs delay). `delay_ms` 0 = fan-out child.
    AttachChild {
        parent: String,
        child: String,
        delay_ms: u64,
        now_ms: u64,
    },
    /// Detaches `child` from `parent` (404 when not attached there); the child keeps its data
    /// and becomes standalone.
    DetachChild {
        parent: String,
        child: String,
    },
    /// `POST /v1/topics` with `parent` (SPEC §3.3, §5.4): creates the topic and attaches it in
    /// one atomic step, so a refused attach leaves nothing behind. `config.partitions == 0`
    /// inherits the parent's count. Placement of partition p avoids the owner of parent
    /// partition p (see `state::assign_replica`).
    CreateChildTopic {
        name: String,
        config: TopicConfig,
        owner: Option<String>,
        schema: Option<String>,
        created_at_ms: u64,
        parent: String,
        delay_ms: u64,
    },
    /// The controller's verdict that a member went silent (SPEC §6.2): marks it dead, but only
    /// if its last heartbeat is still `last_seen_ms` (a heartbeat that won the race keeps it
    /// alive). Its next heartbeat (`RegisterMember`) makes it alive again.
    MarkMemberDead {
        id: NodeId,
        last_seen_ms: u64,
    },
    /// The controller starts a move of partition `partition` of topic `topic` (id
    /// `topic_id`) from its owner `from` to `to` (SPEC §6.5): sets `target` and a fresh
    /// `move_id`. Refused (409) unless the owner is still `from`, no move is in flight for the
    /// partition, and `to` is a live, non-draining member other than `from`.
    StartMove {
        topic: String,
        topic_id: u64,
        partition: u32,
        from: NodeId,
        to: NodeId,
    },
    /// The target's compare-and-swap flip once its copy is verified: `owner := to`,
    /// `target := None`, only if `owner == from`, `target == to` and the move is still
    /// `move_id`; answers `Ok` without change when `to` already owns the partition with no
    /// move in flight (a retried flip); otherwise 409.
    CompleteMove {
        topic: String,
        topic_id: u64,
        partition: u32,
        from: NodeId,
        to: NodeId,
        move_id: u64,
    },
    /// The target's flip when the owner `from` stayed dead (SPEC §6.5): like `CompleteMove`,
    /// and only while `from` is marked dead; the copy holds the owner's records below
    /// `high_watermark` (its last known high watermark). Records a returning `from` holds
    /// past it are re-produced (a [`SalvageClaim`], settled by `SalvageDone`).
    ForceCompleteMove {
        topic: String,
        topic_id: u64,
        partition: u32,
        from: NodeId,
        to: NodeId,
        move_id: u64,
        high_watermark: u64,
    },
    /// `from` re-produced what its old copy held past the claim's high watermark (or had
    /// nothing more): the claim goes. `Ok` when there is no such claim.
    SalvageDone {
        topic_id: u64,
        partition: u32,
        from: NodeId,
    },
    /// Abandons move `move_id` of a partition (`target := None`). A no-op (`Ok`) when that
    /// move is no longer in flight (completed or aborted before), so once it is applied the
    /// move can never complete.
    AbortMove {
        topic: String,
        topic_id: u64,
        partition: u32,
        move_id: u64,
    },
    /// Decommission (SPEC §6.5): marks a member draining (or cancels it). 404 unknown member.
    SetDraining {
        id: NodeId,
        draining: bool,
    },
    /// Forgets a drained member once the leader removed it from the voters. Refused (409)
    /// unless it is draining and neither owns nor is the target of any partition.
    RemoveMember {
        id: NodeId,
    },
    /// Attaches a remote child link named `link` to `parent` (SPEC §5.5, §3.7 ext) with a
    /// fresh attach epoch. Refused (state unchanged) when the parent is missing (404), is a
    /// child itself, already has a local child or remote link of that name, or has 108
    /// children, local and remote together (409). The proposer validated the endpoint.
    /// Detach travels as [`MetaCommand::DetachChild`] with the link name.
    AttachRemoteChild {
        parent: String,
        link: String,
        endpoint: RemoteEndpoint,
        now_ms: u64,
    },
}

/// Most children (local and remote) per parent (SPEC §5.1, §11).
pub const MAX_CHILDREN: usize = 108;
/// Longest fan-out delay: one year (365 days).
pub const MAX_FANOUT_DELAY_MS: u64 = 365 * 24 * 3600 * 1000;
/// A delay child needs parent retention of at least delay + this (SPEC §5.3).
pub const DELAY_RETENTION_MARGIN_MS: u64 = 3_600_000;

/// A local child link (SPEC §5): every record committed to `parent` from the attach on is
/// copied into `child`. One per child (a child has one parent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildLink {
    pub parent: String,
    pub child: String,
    /// This attachment's id: unique for the cluster's lifetime, so a detach and re-attach
    /// starts fresh (cursor state is keyed by child and epoch) and never resumes.
    pub epoch: u64,
    /// 0 = fan-out child; else the copy of a record is committed no earlier than the parent
    /// commit time plus this. Immutable while attached.
    pub delay_ms: u64,
    /// Born attached by a create with `parent` (placement anti-affine to the parent).
    pub replica: bool,
    /// The parent's partition count at attach: parent partitions added later are copied
    /// from their first record, earlier ones from their tail at attach.
    pub parent_partitions_at_attach: u32,
    /// The proposer's clock at attach (informational).
    pub attached_at_ms: u64,
}

impl ChildLink {
    /// `fanout`, `delay` or `replica` (SPEC §3.7 `kind`); a delayed replica reports `delay`.
    pub fn kind(&self) -> &'static str {
        if self.delay_ms > 0 {
            "delay"
        } else if self.replica {
            "replica"
        } else {
            "fanout"
        }
    }
}

/// The other cluster a remote child link copies to (SPEC §5.5). The credentials are stored
/// here and nowhere else: never returned by the API, never logged (`Debug` redacts them).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteEndpoint {
    /// `http`/`https` base URL, without credentials, query or fragment, no trailing `/`.
    pub url: String,
    /// The topic on the remote cluster.
    pub topic: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Extra CA certificates (PEM) trusted for the remote's https, besides the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
}

impl std::fmt::Debug for RemoteEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |o: &Option<String>| o.as_ref().map(|_| "<redacted>");
        f.debug_struct("RemoteEndpoint")
            .field("url", &self.url)
            .field("topic", &self.topic)
            .field("username", &redacted(&self.username))
            .field("password", &redacted(&self.password))
            .field("ca_pem_bytes", &self.ca_pem.as_ref().map(String::len))
            .finish()
    }
}

/// A remote child link (SPEC §5.5): every record committed to `parent` from the attach on is
/// copied to `endpoint.topic` on another cluster. Named `link` among the parent's children.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLink {
    pub parent: String,
    pub link: String,
    /// This attachment's id, from the same sequence as local links' epochs (cursor state
    /// is keyed by it, so a detach and re-attach starts fresh).
    pub epoch: u64,
    pub endpoint: RemoteEndpoint,
    /// As [`ChildLink::parent_partitions_at_attach`].
    pub parent_partitions_at_attach: u32,
    /// The proposer's clock at attach (informational).
    pub attached_at_ms: u64,
}

/// The name of the root user seeded on first start (SPEC §4.4).
pub const ROOT_USERNAME: &str = "admin";

/// What a grant allows (SPEC §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Action {
    /// produce, batch produce
    Produce,
    /// consume, replay, ack, extend, nack
    Consume,
    /// creating topics with matching names; the creator becomes owner
    Create,
    /// everything, incl. users and cluster operations; takes no patterns
    Admin,
}

impl Action {
    /// The wire name: `produce`, `consume`, `create`, `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Produce => "produce",
            Action::Consume => "consume",
            Action::Create => "create",
            Action::Admin => "admin",
        }
    }

    /// Parses a wire name (exact, lower case).
    pub fn parse(s: &str) -> Option<Action> {
        match s {
            "produce" => Some(Action::Produce),
            "consume" => Some(Action::Consume),
            "create" => Some(Action::Create),
            "admin" => Some(Action::Admin),
            _ => None,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An action plus topic-name patterns (exact name or prefix with one trailing `*`); `Admin`
/// has none. Validated by the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub action: Action,
    #[serde(default)]
    pub patterns: Vec<String>,
}

/// A user as stored in the metadata.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub username: String,
    /// argon2id PHC string (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`). Never returned or logged.
    pub password_hash: String,
    pub grants: Vec<Grant>,
    /// The seeded root admin: cannot be deleted, grants fixed, only it changes its password.
    pub root: bool,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Changes on every change of this record (create, grants, password) and is never reused
    /// across users or re-creations (drawn from `MetaState::next_user_version`), so caches
    /// keyed by it (verified credentials) are invalidated by any change, even within one
    /// millisecond or with a proposer whose clock went backwards.
    pub version: u64,
    /// (ext) Limits on what the user may do; none by default.
    #[serde(default, skip_serializing_if = "Quotas::is_none")]
    pub quotas: Quotas,
}

/// (ext) A user's quotas; `None` is unlimited. Rates are per second over the cluster, and
/// each node enforces its even share among the live members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produce_msgs_per_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produce_bytes_per_s: Option<u64>,
    /// Topics the user may own (topics it created and not deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_topics: Option<u64>,
    /// Messages the user may hold leased at once (each node its even share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consume_in_flight: Option<u64>,
}

impl Quotas {
    pub fn is_none(&self) -> bool {
        *self == Quotas::default()
    }

    /// Whether a produce rate is limited (messages or bytes per second).
    pub fn limits_produce(&self) -> bool {
        self.produce_msgs_per_s.is_some() || self.produce_bytes_per_s.is_some()
    }
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("username", &self.username)
            .field("password_hash", &"<redacted>")
            .field("grants", &self.grants)
            .field("root", &self.root)
            .field("created_at_ms", &self.created_at_ms)
            .field("updated_at_ms", &self.updated_at_ms)
            .field("version", &self.version)
            .field("quotas", &self.quotas)
            .finish()
    }
}

impl User {
    /// Root or holding an `admin` grant.
    pub fn is_admin(&self) -> bool {
        self.root || self.grants.iter().any(|g| g.action == Action::Admin)
    }
}

/// The result of applying a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaResponse {
    Topic(Arc<Topic>),
    /// The deleted topic (so its data can be purged).
    Deleted(Arc<Topic>),
    Ok,
    /// The user as created or changed (`CreateUser`, `SetGrants`, `SetPassword`, and
    /// `SeedRoot` when it seeded).
    User(Arc<User>),
    /// The deleted user.
    UserDeleted(Arc<User>),
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
    /// A user's quota (a count, `max_topics`) forbids it (→ 409).
    #[error("{0}")]
    QuotaExceeded(String),
}

/// The whole replicated state. Cheap to clone (topics are behind `Arc`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    pub topics: BTreeMap<String, Arc<Topic>>,
    /// lower-cased name → name, to refuse names differing only in letter case.
    pub topic_names_folded: BTreeMap<String, String>,
    pub next_topic_id: u64,
    pub members: BTreeMap<NodeId, Member>,
    /// Users by exact (case-sensitive) name.
    #[serde(default)]
    pub users: BTreeMap<String, Arc<User>>,
    /// The next `User::version`; only grows.
    #[serde(default)]
    pub next_user_version: u64,
    /// Local child links by child name (SPEC §5).
    #[serde(default)]
    pub child_links: BTreeMap<String, ChildLink>,
    /// The last attach epoch handed out; only grows.
    #[serde(default)]
    pub last_attach_epoch: u64,
    /// The last move id handed out (`Assignment::move_id`); only grows.
    #[serde(default)]
    pub last_move_id: u64,
    /// Remote child links (SPEC §5.5) by parent name, then link name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub remote_links: BTreeMap<String, BTreeMap<String, RemoteLink>>,
    /// Partitions force-promoted away from a dead owner whose old copy may hold records
    /// past the promoted high watermark (SPEC §6.5): that node re-produces them before it
    /// deletes the copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub salvage: Vec<SalvageClaim>,
}

/// A force-promoted partition's old copy: records of `topic_id`/`partition` at offsets
/// `high_watermark..` on node `from` are not in the promoted copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SalvageClaim {
    pub topic_id: u64,
    pub partition: u32,
    pub from: NodeId,
    pub high_watermark: u64,
}

impl MetaState {
    /// The salvage claim on `from`'s old copy of a partition, if any.
    pub fn salvage_claim(
        &self,
        topic_id: u64,
        partition: u32,
        from: &str,
    ) -> Option<&SalvageClaim> {
        self.salvage
            .iter()
            .find(|c| c.topic_id == topic_id && c.partition == partition && c.from == from)
    }
}
