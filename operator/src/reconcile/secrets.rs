//! Which Secrets a resource may make the operator read, and reading them (SPEC §10.3).
//!
//! Resources name Secrets that the operator then hands to a broker (User passwords,
//! remote-child credentials the broker sends to another cluster, a NaradCluster's admin
//! password) or mounts into broker pods (security, cluster-TLS and API-TLS Secrets; of the
//! last the operator also reads `ca.crt`, to trust the brokers' HTTPS). Whoever may write
//! such a resource must not thereby reach every Secret of the namespace, so:
//!
//! - a Secret is used only when it carries [`CREDENTIALS_LABEL`]` = "true"` (the Secret's
//!   owner consents), except the security Secret the operator created for this very
//!   NaradCluster (controller owner reference), which it labels when it meets it;
//! - a NaradCluster never uses a Secret that another NaradCluster owns;
//! - a User password or remote-child credentials never come from a NaradCluster's security
//!   or TLS Secret (owned by one, or named by one's `spec.security`), labelled or not.
//!
//! The label and owners are read from the Secret's metadata alone (`PartialObjectMetadata`);
//! its data is fetched only once they allow it, and checked again on the fetched object.
//! The checks are pure ([`check_for_cluster`], [`check_credentials`]); a refusal is a
//! condition reason and message for the resource's status.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::{Context, Result};
use crate::crd::{NaradCluster, CREDENTIALS_LABEL, CREDENTIALS_LABEL_VALUE, GROUP};

/// Why a referenced Secret is not used: the condition reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `SecretNotFound`, `SecretNotLabelled` or `SecretNotAllowed`.
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    fn not_found(name: &str) -> Refusal {
        Refusal {
            reason: "SecretNotFound",
            message: format!("Secret {name} does not exist"),
        }
    }

    fn not_labelled(name: &str) -> Refusal {
        Refusal {
            reason: "SecretNotLabelled",
            message: format!(
                "Secret {name} is not labelled {CREDENTIALS_LABEL}={CREDENTIALS_LABEL_VALUE:?}; \
                 the operator uses only Secrets marked for Narad"
            ),
        }
    }

    fn not_allowed(name: &str, why: &str) -> Refusal {
        Refusal {
            reason: "SecretNotAllowed",
            message: format!("Secret {name} {why}"),
        }
    }

    fn invalid_tls(name: &str, why: &str) -> Refusal {
        Refusal {
            reason: "TLSSecretInvalid",
            message: format!("Secret {name} (spec.security.apiTLSSecretRef): {why}"),
        }
    }
}

/// Whether the Secret carries `narad.io/credentials: "true"`.
pub fn is_labelled(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(CREDENTIALS_LABEL))
        .is_some_and(|v| v == CREDENTIALS_LABEL_VALUE)
}

/// The uids of the NaradClusters among the Secret's owners.
fn cluster_owners(meta: &ObjectMeta) -> Vec<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == "NaradCluster" && o.api_version.starts_with(&format!("{GROUP}/")))
        .map(|o| o.uid.as_str())
        .collect()
}

/// Whether the Secret is the one the operator created for `nc` (`nc` is its controller).
pub fn owned_by(meta: &ObjectMeta, nc: &NaradCluster) -> bool {
    let Some(uid) = nc.metadata.uid.as_deref() else {
        return false;
    };
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "NaradCluster" && o.uid == uid && o.controller == Some(true))
}

/// May NaradCluster `nc` use this Secret as its security or cluster-TLS Secret? Its own
/// (controller-owned) Secret always; otherwise a labelled one that no other NaradCluster
/// owns.
pub fn check_for_cluster(meta: &ObjectMeta, nc: &NaradCluster) -> Result<(), Refusal> {
    let name = meta.name.as_deref().unwrap_or_default();
    if owned_by(meta, nc) {
        return Ok(());
    }
    if !cluster_owners(meta).is_empty() {
        return Err(Refusal::not_allowed(
            name,
            "belongs to another NaradCluster",
        ));
    }
    if !is_labelled(meta) {
        return Err(Refusal::not_labelled(name));
    }
    Ok(())
}

/// May a User password or remote-child credentials come from this Secret? Only a labelled
/// one that is no NaradCluster's security or TLS Secret (`cluster_secrets`: the names the
/// namespace's NaradClusters use; `None` before they are known, which checks the label and
/// owners only).
pub fn check_credentials(
    meta: &ObjectMeta,
    cluster_secrets: Option<&BTreeSet<String>>,
) -> Result<(), Refusal> {
    let name = meta.name.as_deref().unwrap_or_default();
    let cluster_secret = "is a NaradCluster's security or TLS Secret and never serves as \
                          a User password or remote credentials";
    if !cluster_owners(meta).is_empty() {
        return Err(Refusal::not_allowed(name, cluster_secret));
    }
    if !is_labelled(meta) {
        return Err(Refusal::not_labelled(name));
    }
    if cluster_secrets.is_some_and(|s| s.contains(name)) {
        return Err(Refusal::not_allowed(name, cluster_secret));
    }
    Ok(())
}

/// The security and TLS Secret names of the NaradClusters in `ns`.
async fn cluster_secret_names(ctx: &Context, ns: &str) -> Result<BTreeSet<String>> {
    let clusters: Api<NaradCluster> = Api::namespaced(ctx.client.clone(), ns);
    Ok(clusters
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .flat_map(|nc| {
            let sec = &nc.spec.security;
            let tls = [&sec.cluster_tls_secret_ref, &sec.api_tls_secret_ref];
            std::iter::once(nc.security_secret_name())
                .chain(tls.into_iter().flatten().map(|r| r.name.clone()))
        })
        .collect())
}

/// Fetches the Secret `name` of `ns` whole, once `check` passes on its metadata and again
/// on the fetched object; `None` if it does not exist.
async fn fetch_checked(
    secrets: &Api<Secret>,
    name: &str,
    check: impl Fn(&ObjectMeta) -> Result<(), Refusal>,
) -> Result<Option<Result<Secret, Refusal>>> {
    let Some(meta) = secrets.get_metadata_opt(name).await? else {
        return Ok(None);
    };
    if let Err(r) = check(&meta.metadata) {
        return Ok(Some(Err(r)));
    }
    let Some(secret) = secrets.get_opt(name).await? else {
        return Ok(None);
    };
    Ok(Some(check(&secret.metadata).map(|()| secret)))
}

/// The Secret holding a User password or remote-child credentials, if the rules allow it:
/// its metadata first (label, owners), then the namespace's NaradClusters (is it one of
/// their security or TLS Secrets?), then its data.
pub async fn credentials_secret(
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<Result<Secret, Refusal>> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let Some(meta) = secrets.get_metadata_opt(name).await? else {
        return Ok(Err(Refusal::not_found(name)));
    };
    if let Err(r) = check_credentials(&meta.metadata, None) {
        return Ok(Err(r));
    }
    let taken = cluster_secret_names(ctx, ns).await?;
    if let Err(r) = check_credentials(&meta.metadata, Some(&taken)) {
        return Ok(Err(r));
    }
    Ok(match secrets.get_opt(name).await? {
        None => Err(Refusal::not_found(name)),
        Some(s) => check_credentials(&s.metadata, Some(&taken)).map(|()| s),
    })
}

/// The security Secret of `nc` (`None`: it does not exist yet), if the rules allow it.
pub async fn security_secret(
    ctx: &Context,
    nc: &NaradCluster,
) -> Result<Option<Result<Secret, Refusal>>> {
    let ns = nc.namespace().unwrap_or_else(|| "default".into());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    fetch_checked(&secrets, &nc.security_secret_name(), |m| {
        check_for_cluster(m, nc)
    })
    .await
}

/// Checks the cluster-TLS Secret of `nc` (metadata only: the operator never reads its
/// data, the pods mount it).
pub async fn check_tls_secret(ctx: &Context, nc: &NaradCluster) -> Result<Result<(), Refusal>> {
    let Some(r) = &nc.spec.security.cluster_tls_secret_ref else {
        return Ok(Ok(()));
    };
    let ns = nc.namespace().unwrap_or_else(|| "default".into());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    Ok(match secrets.get_metadata_opt(&r.name).await? {
        None => Err(Refusal::not_found(&r.name)),
        Some(m) => check_for_cluster(&m.metadata, nc),
    })
}

/// The keys of a TLS Secret of cert-manager's shape.
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_KEY_KEY: &str = "tls.key";
pub const TLS_CA_KEY: &str = "ca.crt";

/// The trust root of the operator's HTTPS calls to the brokers: the `ca.crt` of the
/// API-TLS Secret, once the Secret holds `tls.crt`, `tls.key` and a `ca.crt` that the
/// broker client accepts as roots (PEM certificates). Otherwise a `TLSSecretInvalid`
/// refusal saying what is wrong.
pub fn api_tls_ca(secret: &Secret) -> Result<Vec<u8>, Refusal> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let data = secret.data.clone().unwrap_or_default();
    let missing: Vec<&str> = [TLS_CERT_KEY, TLS_KEY_KEY, TLS_CA_KEY]
        .into_iter()
        .filter(|k| data.get(*k).is_none_or(|v| v.0.is_empty()))
        .collect();
    if !missing.is_empty() {
        return Err(Refusal::invalid_tls(
            name,
            &format!(
                "no {} (a TLS Secret needs tls.crt, tls.key and ca.crt; with cert-manager, \
                 an issuer that writes ca.crt)",
                missing.join(", ")
            ),
        ));
    }
    let ca = data[TLS_CA_KEY].0.clone();
    narad_api::client::tls_config(Some(&ca))
        .map_err(|e| Refusal::invalid_tls(name, &format!("{TLS_CA_KEY}: {e}")))?;
    Ok(ca)
}

/// The CA of `nc`'s API-TLS Secret (`None`: the API serves plain HTTP), if the rules allow
/// the Secret (as for the cluster's other Secrets) and it is a usable TLS Secret
/// ([`api_tls_ca`]); a missing Secret is `SecretNotFound`.
pub async fn api_tls_secret(
    ctx: &Context,
    nc: &NaradCluster,
) -> Result<Option<Result<Vec<u8>, Refusal>>> {
    let Some(r) = &nc.spec.security.api_tls_secret_ref else {
        return Ok(None);
    };
    let ns = nc.namespace().unwrap_or_else(|| "default".into());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    Ok(Some(
        match fetch_checked(&secrets, &r.name, |m| check_for_cluster(m, nc)).await? {
            None => Err(Refusal::not_found(&r.name)),
            Some(Err(refusal)) => Err(refusal),
            Some(Ok(secret)) => api_tls_ca(&secret),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::cluster;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use serde_json::json;

    fn meta(name: &str, labelled: bool, owner: Option<(&str, bool)>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            labels: labelled.then(|| {
                [(CREDENTIALS_LABEL.to_string(), "true".to_string())]
                    .into_iter()
                    .collect()
            }),
            owner_references: owner.map(|(uid, controller)| {
                vec![OwnerReference {
                    api_version: "narad.io/v1alpha1".into(),
                    kind: "NaradCluster".into(),
                    name: "some".into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_label_must_say_true() {
        assert!(is_labelled(&meta("s", true, None)));
        assert!(!is_labelled(&meta("s", false, None)));
        let mut m = meta("s", false, None);
        m.labels = Some([(CREDENTIALS_LABEL.to_string(), "yes".to_string())].into());
        assert!(!is_labelled(&m));
    }

    #[test]
    fn a_cluster_uses_its_own_or_labelled_secrets_only() {
        let nc = cluster(json!({"version": "1"})); // uid u-1
        assert_eq!(check_for_cluster(&meta("s", true, None), &nc), Ok(()));
        // The Secret the operator created before Secrets were labelled still works.
        assert_eq!(
            check_for_cluster(&meta("s", false, Some(("u-1", true))), &nc),
            Ok(())
        );
        let r = check_for_cluster(&meta("s", false, None), &nc).unwrap_err();
        assert_eq!(r.reason, "SecretNotLabelled");
        assert!(r.message.contains("narad.io/credentials"), "{}", r.message);
        // Another cluster's generated Secret, labelled as every generated one is.
        let r = check_for_cluster(&meta("s", true, Some(("u-2", true))), &nc).unwrap_err();
        assert_eq!(r.reason, "SecretNotAllowed");
    }

    fn tls_secret(data: &[(&str, &[u8])]) -> Secret {
        Secret {
            metadata: meta("api-tls", true, None),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn api_tls_ca_is_the_secrets_ca_crt_when_it_is_usable() {
        let ca = narad_tests::certs::TestCa::new("narad-test-ca").pem();
        let ok = tls_secret(&[
            ("tls.crt", b"c"),
            ("tls.key", b"k"),
            ("ca.crt", ca.as_bytes()),
        ]);
        assert_eq!(api_tls_ca(&ok), Ok(ca.clone().into_bytes()));

        // ca.crt missing (an ACME issuer writes none) or empty.
        for s in [
            tls_secret(&[("tls.crt", b"c"), ("tls.key", b"k")]),
            tls_secret(&[("tls.crt", b"c"), ("tls.key", b"k"), ("ca.crt", b"")]),
        ] {
            let r = api_tls_ca(&s).unwrap_err();
            assert_eq!(r.reason, "TLSSecretInvalid");
            assert!(r.message.contains("no ca.crt"), "{}", r.message);
            assert!(r.message.contains("Secret api-tls"), "{}", r.message);
        }
        let r = api_tls_ca(&tls_secret(&[("ca.crt", ca.as_bytes())])).unwrap_err();
        assert!(r.message.contains("no tls.crt, tls.key"), "{}", r.message);

        // A ca.crt that is not PEM certificates, or PEM of something that is no certificate.
        let garbage = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n";
        for bad in [&b"not a certificate"[..], &garbage[..]] {
            let s = tls_secret(&[("tls.crt", b"c"), ("tls.key", b"k"), ("ca.crt", bad)]);
            let r = api_tls_ca(&s).unwrap_err();
            assert_eq!(r.reason, "TLSSecretInvalid");
            assert!(r.message.contains("ca.crt: CA file"), "{}", r.message);
        }
    }

    #[test]
    fn credentials_never_come_from_cluster_secrets() {
        assert_eq!(check_credentials(&meta("dr", true, None), None), Ok(()));
        let taken: BTreeSet<String> = ["prod-narad-security".to_string()].into();
        assert_eq!(
            check_credentials(&meta("dr", true, None), Some(&taken)),
            Ok(())
        );
        let r = check_credentials(&meta("dr", false, None), Some(&taken)).unwrap_err();
        assert_eq!(r.reason, "SecretNotLabelled");
        for m in [
            meta("prod-narad-security", true, Some(("u-1", true))),
            meta("prod-narad-security", false, Some(("u-1", true))),
        ] {
            let r = check_credentials(&m, None).unwrap_err();
            assert_eq!(r.reason, "SecretNotAllowed");
        }
        // A user-provided security Secret, labelled for its cluster.
        let r =
            check_credentials(&meta("prod-narad-security", true, None), Some(&taken)).unwrap_err();
        assert_eq!(r.reason, "SecretNotAllowed");
    }
}
