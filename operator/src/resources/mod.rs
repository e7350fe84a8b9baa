//! Pure builders of the objects a NaradCluster owns (SPEC §10.2, §10.3): the StatefulSet, the
//! headless and client Services, the brokers' ServiceAccount, the PodDisruptionBudget, the ConfigMap and the security
//! Secret's generated entries. No I/O: each takes the NaradCluster (and what was observed)
//! and returns the object to server-side apply, so every shape is unit-tested.

mod configmap;
mod pdb;
mod secret;
mod serviceaccount;
mod services;
mod statefulset;

pub use configmap::*;
pub use pdb::*;
pub use secret::*;
pub use serviceaccount::*;
pub use services::*;
pub use statefulset::*;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::crd::NaradCluster;

/// API port (SPEC §3.1).
pub const API_PORT: i32 = 7942;
/// Cluster port (node RPC and Raft, SPEC §6.6).
pub const CLUSTER_PORT: i32 = 7943;
/// Where each node's volume is mounted.
pub const DATA_DIR: &str = "/var/lib/narad";
/// The image's non-root user and group.
pub const NARAD_UID: i64 = 10001;
/// Default Kubernetes cluster DNS domain.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// Secret key of the node-to-node secret.
pub const CLUSTER_SECRET_KEY: &str = "cluster-secret";
/// Secret key of the root admin password.
pub const ADMIN_PASSWORD_KEY: &str = "admin-password";
/// Name of the root admin user.
pub const ADMIN_USER: &str = "admin";

/// The fixed selector labels (never user labels): selector and volumeClaimTemplates use these.
pub fn selector_labels(nc: &NaradCluster) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "narad".to_string()),
        ("app.kubernetes.io/instance".to_string(), nc.name_any()),
    ])
}

/// Selector labels plus the management labels, on every owned object.
pub fn common_labels(nc: &NaradCluster) -> BTreeMap<String, String> {
    let mut l = selector_labels(nc);
    l.insert(
        "app.kubernetes.io/managed-by".into(),
        "narad-operator".into(),
    );
    l.insert("app.kubernetes.io/component".into(), "broker".into());
    l
}

/// Metadata of an owned object: name, namespace, common labels, controller owner reference.
pub fn owned_meta(nc: &NaradCluster, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: nc.namespace(),
        labels: Some(common_labels(nc)),
        owner_references: nc.controller_owner_ref(&()).map(|r| vec![r]),
        ..Default::default()
    }
}

/// `<fullname>-headless`.
pub fn headless_name(nc: &NaradCluster) -> String {
    format!("{}-headless", nc.fullname())
}

/// Stable DNS name of pod `ordinal`, through the headless Service.
pub fn pod_host(nc: &NaradCluster, ordinal: i32, cluster_domain: &str) -> String {
    let ns = nc.namespace().unwrap_or_else(|| "default".into());
    format!(
        "{}-{ordinal}.{}.{ns}.svc.{cluster_domain}",
        nc.fullname(),
        headless_name(nc)
    )
}

#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A NaradCluster `prod` in namespace `default`, uid set so owner references render.
    pub fn cluster(spec: serde_json::Value) -> NaradCluster {
        let mut nc: NaradCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "narad.io/v1alpha1",
            "kind": "NaradCluster",
            "metadata": {"name": "prod", "namespace": "default", "uid": "u-1", "generation": 1},
            "spec": spec,
        }))
        .unwrap();
        nc.metadata.resource_version = Some("1".into());
        nc
    }
}
