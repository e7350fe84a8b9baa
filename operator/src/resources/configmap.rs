//! The ConfigMap holding `spec.config` as the broker's JSON `--config` file.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::*;

/// File name of the config inside the ConfigMap and the mount.
pub const CONFIG_FILE: &str = "narad.json";

/// `<fullname>-config`.
pub fn configmap_name(nc: &NaradCluster) -> String {
    format!("{}-config", nc.fullname())
}

/// The config file's content, when `spec.config` is set and not empty.
pub fn config_json(nc: &NaradCluster) -> Option<String> {
    let c = nc.spec.config.as_ref()?;
    if c.as_object().is_some_and(|o| o.is_empty()) || c.is_null() {
        return None;
    }
    Some(serde_json::to_string_pretty(c).expect("invariant: JSON serializes"))
}

/// The ConfigMap, when there is a config.
pub fn configmap(nc: &NaradCluster) -> Option<ConfigMap> {
    let body = config_json(nc)?;
    Some(ConfigMap {
        metadata: owned_meta(nc, configmap_name(nc)),
        data: Some(BTreeMap::from([(CONFIG_FILE.to_string(), body)])),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::fixtures::cluster;
    use super::*;
    use serde_json::json;

    #[test]
    fn rendered_only_when_set() {
        assert!(configmap(&cluster(json!({"version": "1"}))).is_none());
        assert!(configmap(&cluster(json!({"version": "1", "config": {}}))).is_none());
        let cm = configmap(&cluster(
            json!({"version": "1", "config": {"storage": {"codec": "zstd"}}}),
        ))
        .unwrap();
        assert_eq!(cm.metadata.name.as_deref(), Some("prod-narad-config"));
        let body: serde_json::Value = serde_json::from_str(&cm.data.unwrap()[CONFIG_FILE]).unwrap();
        assert_eq!(body, json!({"storage": {"codec": "zstd"}}));
    }
}
