//! The PodDisruptionBudget (`maxUnavailable: 1`). policy/v1 exists from Kubernetes 1.21;
//! older servers (the 1.20 test server) get the same object as policy/v1beta1.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

use super::*;

/// The PDB as policy/v1.
pub fn pdb(nc: &NaradCluster) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: owned_meta(nc, nc.fullname()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(nc)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The policy API version a server of `minor` version serves PDBs under.
pub fn pdb_api_version(minor: u32) -> &'static str {
    if minor >= 21 {
        "policy/v1"
    } else {
        "policy/v1beta1"
    }
}

/// The `ApiResource` of PDBs at `api_version`.
pub fn pdb_api_resource(api_version: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("policy", "v1"));
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, "PodDisruptionBudget"),
        "poddisruptionbudgets",
    )
}

/// The PDB as a dynamic object of `api_version` (the spec fields used are the same in
/// policy/v1beta1 and policy/v1).
pub fn pdb_dynamic(nc: &NaradCluster, api_version: &str) -> DynamicObject {
    let p = pdb(nc);
    let mut obj = DynamicObject::new(
        p.metadata.name.as_deref().unwrap_or_default(),
        &pdb_api_resource(api_version),
    );
    obj.metadata = p.metadata;
    obj.data = serde_json::json!({
        "spec": serde_json::to_value(p.spec).expect("invariant: a PDB spec serializes")
    });
    obj
}

/// Parses a server's minor version (`"20"`, `"20+"`).
pub fn parse_minor(minor: &str) -> Option<u32> {
    minor.trim_end_matches('+').parse().ok()
}

#[cfg(test)]
mod tests {
    use super::fixtures::cluster;
    use super::*;
    use serde_json::json;

    #[test]
    fn shape() {
        let nc = cluster(json!({"version": "1"}));
        let p = pdb(&nc);
        assert_eq!(p.metadata.name.as_deref(), Some("prod-narad"));
        let spec = p.spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(
            spec.selector.unwrap().match_labels.unwrap(),
            selector_labels(&nc)
        );
    }

    #[test]
    fn version_per_server() {
        assert_eq!(pdb_api_version(20), "policy/v1beta1");
        assert_eq!(pdb_api_version(21), "policy/v1");
        assert_eq!(parse_minor("20+"), Some(20));
        let nc = cluster(json!({"version": "1"}));
        let d = serde_json::to_value(pdb_dynamic(&nc, "policy/v1beta1")).unwrap();
        assert_eq!(d["apiVersion"], "policy/v1beta1");
        assert_eq!(d["kind"], "PodDisruptionBudget");
        assert_eq!(d["spec"]["maxUnavailable"], 1);
        assert_eq!(d["metadata"]["ownerReferences"][0]["kind"], "NaradCluster");
    }
}
