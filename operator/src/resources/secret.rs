//! The security Secret: `cluster-secret` (required with security on) and `admin-password`.
//! The operator generates whichever is missing before the first pod starts, since it calls
//! the broker as root `admin` itself. Existing values are never changed.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use rand::RngCore;

use super::*;
use crate::crd::{CREDENTIALS_LABEL, CREDENTIALS_LABEL_VALUE};

/// A random 256-bit secret, URL-safe base64 without padding.
pub fn random_secret() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// The keys to add to the security Secret (`existing` = its current data, `None` if the
/// Secret does not exist). Empty when nothing is missing or security is off.
pub fn missing_security_entries(
    nc: &NaradCluster,
    existing: Option<&BTreeMap<String, ByteString>>,
    generate: &mut dyn FnMut() -> String,
) -> BTreeMap<String, ByteString> {
    let mut out = BTreeMap::new();
    if !nc.spec.security.enabled {
        return out;
    }
    for key in [CLUSTER_SECRET_KEY, ADMIN_PASSWORD_KEY] {
        let present = existing
            .and_then(|d| d.get(key))
            .is_some_and(|v| !v.0.is_empty());
        if !present {
            out.insert(key.to_string(), ByteString(generate().into_bytes()));
        }
    }
    out
}

/// The Secret object to create with the generated `entries`. A Secret the operator creates
/// is owned by the NaradCluster; one named by `secretRef` is the user's, so it gets no owner.
/// Both carry `narad.io/credentials: "true"` (see `reconcile::secrets`).
pub fn security_secret(
    nc: &NaradCluster,
    entries: BTreeMap<String, ByteString>,
    user_provided: bool,
) -> Secret {
    let mut meta = owned_meta(nc, nc.security_secret_name());
    if user_provided {
        meta.owner_references = None;
        meta.labels = None;
    }
    meta.labels.get_or_insert_with(Default::default).insert(
        CREDENTIALS_LABEL.to_string(),
        CREDENTIALS_LABEL_VALUE.to_string(),
    );
    Secret {
        metadata: meta,
        data: Some(entries),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::cluster;
    use super::*;
    use serde_json::json;

    #[test]
    fn generates_only_missing_keys() {
        let nc = cluster(json!({"version": "1"}));
        let mut n = 0;
        let mut gen = || {
            n += 1;
            format!("g{n}")
        };
        let all = missing_security_entries(&nc, None, &mut gen);
        assert_eq!(all.len(), 2);
        assert_eq!(all[CLUSTER_SECRET_KEY].0, b"g1");
        let have = BTreeMap::from([(CLUSTER_SECRET_KEY.to_string(), ByteString(b"x".to_vec()))]);
        let some = missing_security_entries(&nc, Some(&have), &mut gen);
        assert_eq!(some.keys().collect::<Vec<_>>(), vec![ADMIN_PASSWORD_KEY]);
        let full = BTreeMap::from([
            (CLUSTER_SECRET_KEY.to_string(), ByteString(b"x".to_vec())),
            (ADMIN_PASSWORD_KEY.to_string(), ByteString(b"y".to_vec())),
        ]);
        assert!(missing_security_entries(&nc, Some(&full), &mut gen).is_empty());
        let off = cluster(json!({"version": "1", "security": {"enabled": false}}));
        assert!(missing_security_entries(&off, None, &mut gen).is_empty());
    }

    #[test]
    fn ownership() {
        let nc = cluster(json!({"version": "1"}));
        let s = security_secret(&nc, BTreeMap::new(), false);
        assert_eq!(s.metadata.name.as_deref(), Some("prod-narad-security"));
        assert!(s.metadata.owner_references.is_some());
        let labels = s.metadata.labels.unwrap();
        assert_eq!(labels["narad.io/credentials"], "true");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "narad-operator");
        let user = cluster(json!({"version": "1", "security": {"secretRef": {"name": "mine"}}}));
        let s = security_secret(&user, BTreeMap::new(), true);
        assert_eq!(s.metadata.name.as_deref(), Some("mine"));
        assert!(s.metadata.owner_references.is_none());
        assert_eq!(
            s.metadata.labels,
            Some([("narad.io/credentials".to_string(), "true".to_string())].into())
        );
        assert_ne!(random_secret(), random_secret());
        assert_eq!(random_secret().len(), 43);
    }
}
