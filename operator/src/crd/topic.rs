//! `Topic` (`ntopic`): a broker topic with its settings and links (SPEC §2.1, §3.3, §5).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// Desired state of a broker topic.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "narad.io",
    version = "v1alpha1",
    kind = "Topic",
    namespaced,
    status = "TopicStatus",
    shortname = "ntopic",
    category = "narad",
    doc = "A topic on a Narad cluster's broker, created, altered and deleted by narad-operator.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.clusterRef.name"
    ),
    printcolumn(name = "Topic", type_ = "string", json_path = ".status.topicName"),
    printcolumn(
        name = "Partitions",
        type_ = "integer",
        json_path = ".status.partitions"
    ),
    printcolumn(name = "Role", type_ = "string", json_path = ".status.role"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.name) == has(oldSelf.name)) && (!has(self.name) || self.name == oldSelf.name)").message("name is immutable"),
    validation = Rule::new("!has(oldSelf.partitions) || (has(self.partitions) && self.partitions >= oldSelf.partitions)").message("partitions may only grow"),
    validation = Rule::new("(has(self.replica) ? self.replica : false) == (has(oldSelf.replica) ? oldSelf.replica : false)").message("replica is immutable"),
    validation = Rule::new("(has(self.delay) == has(oldSelf.delay)) && (!has(self.delay) || self.delay == oldSelf.delay)").message("delay is immutable"),
    validation = Rule::new("has(self.parent) || !has(self.replica) || !self.replica").message("replica needs parent"),
    validation = Rule::new("has(self.parent) || !has(self.delay)").message("delay needs parent"),
    validation = Rule::new("!has(self.parent) || !has(self.remoteChildren) || size(self.remoteChildren) == 0").message("remoteChildren are for parents only"),
)]
pub struct TopicSpec {
    /// The NaradCluster holding the topic.
    pub cluster_ref: ClusterRef,
    /// Topic name on the broker (default: metadata.name); immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 200), regex(pattern = r"^[A-Za-z0-9._-]+$"))]
    pub name: Option<String>,
    /// Partition count (3-108; default: the cluster default); may only grow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 3, max = 108))]
    pub partitions: Option<i32>,
    /// Retention: a duration (>= 1h) or "forever"; default: the cluster default (12h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = RETENTION_PATTERN))]
    pub retention: Option<String>,
    /// Lease length of a consumed message (<= 1 year); default: the broker's (30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub visibility_timeout: Option<String>,
    /// Leased messages per partition; default: the broker's (1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_in_flight_per_partition: Option<i64>,
    /// Acked offsets parked above the frontier per partition; default: the broker's (1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_acked_ahead_per_partition: Option<i64>,
    /// JSON Schema of the messages; changes must be backward compatible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "opaque_object")]
    pub schema: Option<serde_json::Value>,
    /// Backoff of redeliveries after an expired lease or a plain nack: `min` after the first
    /// delivery, doubling per delivery up to `max` (1ms <= min <= max <= 12h; min "0s" turns
    /// it off); default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<RetryBackoffSpec>,
    /// Dead-letter topic: a message delivered `maxDeliveries` times without being
    /// acknowledged goes there instead of being delivered again; default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterSpec>,
    /// How long a produce's Idempotency-Key is remembered (1s to 24h, e.g. "10m"); default:
    /// the broker's (5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub dedup_window: Option<String>,
    /// Broker name of the parent topic: this topic is its child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// With parent: created together with the link, anti-affine to the parent; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<bool>,
    /// With parent: a delay child (<= 1 year); immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub delay: Option<String>,
    /// Remote children (parents only): copies to topics on other Narad clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_children: Vec<RemoteChild>,
    /// What deleting the resource does to the broker topic: `Delete` (default) deletes it,
    /// `Retain` keeps it, `DeleteIfEmpty` deletes it once no message waits or is in flight
    /// (until then the resource stays, reason `NotEmpty`). Unused with
    /// `managementPolicy: Observe`, which never deletes the broker topic.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// `Manage` (default): the operator creates the broker topic, converges it to this spec
    /// and deletes it per `deletionPolicy`. `Observe`: it adopts an existing broker topic
    /// read-only: it never creates, alters, links or deletes it (not on deletion of the
    /// resource either), reports what it reads in the status (partitions, role, owners,
    /// children, backlog, pause) with Ready and Synced `True`, reason `Observed` (the
    /// message lists every declared spec field that differs from the broker, none of which
    /// is applied), or `False`, reason `NotFound`, while the topic does not exist (looked up
    /// again every resync period). Switching to `Manage` makes the operator converge it.
    #[serde(default)]
    pub management_policy: ManagementPolicy,
}

/// Whether the operator manages the broker topic or only reads it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ManagementPolicy {
    /// Create, converge and delete the broker topic.
    #[default]
    Manage,
    /// Read an existing broker topic and report it; never change or delete it.
    Observe,
}

/// `deadLetter`: where messages go after their last allowed delivery.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterSpec {
    /// Broker name of the dead-letter topic (it must exist, and is not this topic). Unused
    /// when maxDeliveries is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Deliveries before a message is dead-lettered (1-1000; 0 turns dead-lettering off).
    #[schemars(range(min = 0, max = 1000))]
    pub max_deliveries: u32,
}

/// `retryBackoff`: the first and the longest wait before a redelivery.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryBackoffSpec {
    /// Wait after the first delivery (e.g. "1s"; "0s" turns the backoff off).
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub min: String,
    /// Longest wait (<= 12h).
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max: String,
}

/// A remote child link (SPEC §5.5).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteChild {
    /// Link name.
    pub name: String,
    /// Base URL of the remote cluster (http or https).
    #[schemars(regex(pattern = r"^https?://"))]
    pub url: String,
    /// Topic on the remote cluster (default: the link name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Secret with the remote credentials, which the broker sends to `url`. The Secret must
    /// carry the label `narad.io/credentials: "true"` and must not be a NaradCluster's
    /// security or TLS Secret; otherwise nothing is read or attached (reason
    /// `SecretNotLabelled` or `SecretNotAllowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<CredentialsSecretRef>,
}

/// Where the remote credentials are: a Secret labelled `narad.io/credentials: "true"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSecretRef {
    /// Secret name (same namespace; labelled `narad.io/credentials: "true"`).
    pub name: String,
    /// Key of the username.
    #[serde(default = "default_username_key")]
    pub username_key: String,
    /// Key of the password.
    #[serde(default = "default_password_key")]
    pub password_key: String,
}

fn default_username_key() -> String {
    "username".into()
}
fn default_password_key() -> String {
    "password".into()
}

/// Observed state of a topic.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Name of the topic on the broker, recorded when created (immutability check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_name: Option<String>,
    /// Partition count on the broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
    /// standalone, parent or child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Owner (creator) of the topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Owner node of each partition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_owners: Vec<String>,
    /// Children and their lag.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildStatus>,
    /// Remote links the operator attached (only these are ever detached by it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_links: Vec<String>,
    /// Whether it was created as a replica child (as applied; immutability check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<bool>,
    /// Delay applied, in milliseconds (immutability check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The queue's backlog as the broker reported it at the last reconcile (every resync
    /// period): for a look with kubectl; autoscalers read the broker or its metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<TopicBacklog>,
    /// Whether consumes are paused on the broker (true: they get no messages; produce and
    /// replay go on), as read at the last reconcile. Pausing and resuming are done through
    /// the broker (`narad topic pause` / `resume`, `POST /v1/topics/{topic}/pause`); the
    /// operator reports the flag and never changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Ready and Synced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A queue's backlog (the broker's `backlog` of `GET /v1/topics/{topic}`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicBacklog {
    /// Unsettled messages waiting for a consumer.
    pub messages: u64,
    /// Messages leased to consumers now.
    pub in_flight: u64,
    /// Seconds since the commit of the oldest unsettled message.
    pub oldest_unacked_age_seconds: u64,
}

/// One child of the topic.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildStatus {
    /// Child (or link) name.
    pub name: String,
    /// fanout, delay, replica or remote.
    pub kind: String,
    /// Messages not yet copied.
    pub lag_messages: u64,
    /// ok, retrying or blocked (remote links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl Topic {
    /// The broker topic name: spec.name, else metadata.name.
    pub fn topic_name(&self) -> String {
        self.spec
            .name
            .clone()
            .unwrap_or_else(|| kube::ResourceExt::name_any(self))
    }
}
