//! `User` (`nuser`): a broker user whose password comes from a Secret (SPEC §3.8, §4).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// Desired state of a broker user. Its grants are the union of the Grant resources naming it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "narad.io",
    version = "v1alpha1",
    kind = "User",
    namespaced,
    status = "UserStatus",
    shortname = "nuser",
    category = "narad",
    doc = "A user on a Narad cluster's broker; the password is re-applied whenever its Secret changes.",
    validation = Rule::new("has(self.spec.username) ? self.spec.username != 'admin' : self.metadata.name != 'admin'").message("the root user admin cannot be managed"),
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef.name"),
    printcolumn(name = "Username", type_ = "string", json_path = ".status.username"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.username) == has(oldSelf.username)) && (!has(self.username) || self.username == oldSelf.username)").message("username is immutable"),
    validation = Rule::new("!has(self.deletionPolicy) || self.deletionPolicy != 'DeleteIfEmpty'").message("DeleteIfEmpty is for topics"),
)]
pub struct UserSpec {
    /// The NaradCluster holding the user.
    pub cluster_ref: ClusterRef,
    /// Username on the broker (default: metadata.name); immutable; never admin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9._-]+$"))]
    pub username: Option<String>,
    /// The Secret key holding the password. The Secret must carry the label
    /// `narad.io/credentials: "true"` and must not be a NaradCluster's security or TLS
    /// Secret; otherwise it is not read (reason `SecretNotLabelled` or `SecretNotAllowed`).
    pub password_secret_ref: SecretKeyRef,
    /// Limits on the user (cluster-wide rates, each broker enforcing its share); left out,
    /// the broker's quotas are not managed; `{}` lifts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<UserQuotas>,
    /// Delete (default) or Retain the broker user when the resource is deleted.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
}

/// A user's quotas; a field left out is unlimited.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserQuotas {
    /// Messages produced per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1099511627776u64))]
    pub produce_msgs_per_s: Option<u64>,
    /// Payload bytes produced per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1099511627776u64))]
    pub produce_bytes_per_s: Option<u64>,
    /// Topics the user may own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1099511627776u64))]
    pub max_topics: Option<u64>,
    /// Messages the user may hold leased and unsettled at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1099511627776u64))]
    pub consume_in_flight: Option<u64>,
}

impl UserQuotas {
    /// The broker's form.
    pub fn wire(&self) -> narad_api::Quotas {
        narad_api::Quotas {
            produce_msgs_per_s: self.produce_msgs_per_s,
            produce_bytes_per_s: self.produce_bytes_per_s,
            max_topics: self.max_topics,
            consume_in_flight: self.consume_in_flight,
        }
    }
}

/// Observed state of a user.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Username on the broker, recorded when created (immutability check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Version of the password Secret whose content was applied last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_version: Option<String>,
    /// Ready and Synced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl User {
    /// The broker username: spec.username, else metadata.name.
    pub fn username(&self) -> String {
        self.spec
            .username
            .clone()
            .unwrap_or_else(|| kube::ResourceExt::name_any(self))
    }
}
