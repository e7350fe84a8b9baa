//! The brokers' ServiceAccount: one per NaradCluster, owned by it, with no token mounted
//! (the brokers call no Kubernetes API), as the chart's brokers have.

use k8s_openapi::api::core::v1::ServiceAccount;

use super::*;

/// `<fullname>`: the ServiceAccount of the broker pods.
pub fn service_account_name(nc: &NaradCluster) -> String {
    nc.fullname()
}

/// The brokers' ServiceAccount (`automountServiceAccountToken: false`).
pub fn service_account(nc: &NaradCluster) -> ServiceAccount {
    ServiceAccount {
        metadata: owned_meta(nc, service_account_name(nc)),
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::cluster;
    use super::*;
    use serde_json::json;

    #[test]
    fn owned_and_without_a_token() {
        let nc = cluster(json!({"version": "1"}));
        let sa = service_account(&nc);
        assert_eq!(sa.metadata.name.as_deref(), Some("prod-narad"));
        assert_eq!(sa.metadata.namespace.as_deref(), Some("default"));
        let owner = &sa.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("NaradCluster", Some(true))
        );
        assert_eq!(sa.automount_service_account_token, Some(false));
    }
}
