//! `Grant` (`ngrant`): one action on topic patterns for a user (SPEC §4.2).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// A grant to a user. The user's broker grants are exactly the union of its Grants.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "narad.io",
    version = "v1alpha1",
    kind = "Grant",
    namespaced,
    status = "GrantStatus",
    shortname = "ngrant",
    category = "narad",
    doc = "Allows a User an action (produce, consume, create, admin) on topics matching patterns.",
    printcolumn(name = "User", type_ = "string", json_path = ".spec.user"),
    printcolumn(name = "Action", type_ = "string", json_path = ".spec.action"),
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
    validation = Rule::new("self.action == 'admin' ? size(self.patterns) == 0 : size(self.patterns) > 0").message("admin takes no patterns; other actions need at least one"),
)]
pub struct GrantSpec {
    /// The NaradCluster holding the user.
    pub cluster_ref: ClusterRef,
    /// Name of the User resource (same namespace) receiving the grant.
    #[schemars(length(min = 1))]
    pub user: String,
    /// produce, consume, create or admin.
    pub action: GrantAction,
    /// Topic names or prefixes with one trailing `*` (`orders-*`; `*` = all); empty for admin.
    #[serde(default)]
    #[schemars(inner(regex(pattern = r"^[A-Za-z0-9._-]{0,255}\*?$"), length(min = 1)))]
    pub patterns: Vec<String>,
}

/// A grant's action.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum GrantAction {
    /// Produce and batch produce.
    Produce,
    /// Consume, replay, ack, extend, nack.
    Consume,
    /// Create topics with matching names (the creator owns them).
    Create,
    /// Everything, including users and cluster operations.
    Admin,
}

impl GrantAction {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            GrantAction::Produce => "produce",
            GrantAction::Consume => "consume",
            GrantAction::Create => "create",
            GrantAction::Admin => "admin",
        }
    }
}

/// Observed state of a grant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready and Synced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
