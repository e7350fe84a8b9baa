//! `NaradCluster` (`nc`): a Narad cluster as a StatefulSet the operator owns (SPEC §10.3).

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// CEL: the effective initial cluster size (`initialClusterSize`, else 1 for one replica,
/// else 3), written for `self` or `oldSelf`.
macro_rules! effective_initial {
    ($s:literal) => {
        concat!(
            "(has(",
            $s,
            ".initialClusterSize) ? ",
            $s,
            ".initialClusterSize : (",
            $s,
            ".replicas == 1 ? 1 : 3))"
        )
    };
}

/// Desired state of a Narad cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "narad.io",
    version = "v1alpha1",
    kind = "NaradCluster",
    namespaced,
    status = "NaradClusterStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    shortname = "nc",
    category = "narad",
    doc = "A Narad cluster: a StatefulSet of broker nodes, its Services, PodDisruptionBudget, ConfigMap and security Secret, managed by narad-operator.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Creating, Running, Upgrading, Scaling or Degraded"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.currentVersion"
    ),
    printcolumn(name = "Leader", type_ = "string", json_path = ".status.leader"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(concat!("self.replicas >= ", effective_initial!("self"), " && (self.replicas == 1 || self.replicas >= 3)")).message("replicas must be 1, or >= 3 and >= initialClusterSize"),
    validation = Rule::new("!has(self.initialClusterSize) || self.initialClusterSize % 2 == 1").message("initialClusterSize must be odd"),
    validation = Rule::new(concat!(effective_initial!("self"), " == ", effective_initial!("oldSelf"))).message("initialClusterSize is immutable"),
)]
pub struct NaradClusterSpec {
    /// Number of broker nodes: 1, or >= 3 and >= initialClusterSize. Also set through the
    /// `scale` subresource (`kubectl scale nc <name> --replicas 4`, a HorizontalPodAutoscaler).
    /// Scale-out adds pods at once; scale-in decommissions the highest ordinal first and
    /// removes its pod only once its member has left the cluster, one at a time.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1))]
    pub replicas: i32,
    /// Size of the seed voter set (odd; default 3, or 1 when replicas is 1). Immutable: the
    /// peer list is built from these first ordinals only, so scaling never changes the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub initial_cluster_size: Option<i32>,
    /// Desired broker version; also the default image tag.
    pub version: String,
    /// Broker image.
    #[serde(default)]
    pub image: ImageSpec,
    /// One PersistentVolumeClaim per node, mounted at /var/lib/narad.
    #[serde(default)]
    pub storage: StorageSpec,
    /// Compute resources of the broker container (default requests: 500m CPU, 512Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Topic defaults of the brokers.
    #[serde(default)]
    pub defaults: TopicDefaults,
    /// Broker configuration file (SPEC §8), rendered as JSON into a ConfigMap and passed with
    /// --config. Unknown keys fail the broker's startup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "opaque_object")]
    pub config: Option<serde_json::Value>,
    /// Authentication of clients and nodes.
    #[serde(default)]
    pub security: SecuritySpec,
    /// Remote child topics (links to other Narad clusters).
    #[serde(default, skip_serializing_if = "RemotesSpec::is_empty")]
    pub remotes: RemotesSpec,
    /// The client Service.
    #[serde(default)]
    pub service: ServiceSpec,
    /// Pass-throughs to the broker pods.
    #[serde(default)]
    pub pod: PodSpecOverrides,
    /// What happens to the PersistentVolumeClaims when the NaradCluster is deleted.
    #[serde(default)]
    pub pvc_deletion_policy: PvcDeletionPolicy,
    /// Base URL (http or https) through which the operator calls the broker instead of the
    /// client Service. The operator sends this cluster's root admin credentials, User
    /// passwords and remote-child credentials there, so without `allowExternalEndpoint` it
    /// must name this cluster's own client Service
    /// (`http[s]://<name>-narad.<namespace>.svc[.<cluster domain>]:7942`); any other URL
    /// is never contacted (Ready=False, reason `EndpointNotAllowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://[^/?#@\s]+(/[^?#\s]*)?$"))]
    pub endpoint: Option<String>,
    /// Opt-in: let `endpoint` name any http(s) URL, not only this cluster's client Service
    /// (brokers outside the Kubernetes cluster, tests where no pod runs). Whoever can edit
    /// this NaradCluster then decides where its admin credentials go. Takes effect only when
    /// the operator is installed with external endpoints allowed (`--allow-external-endpoints`,
    /// chart value `operator.allowExternalEndpoints`, default off); otherwise such a cluster
    /// is refused (Ready=False, reason `EndpointNotAllowed`). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_external_endpoint: bool,
    /// Port of a separate metrics listener (`http.metrics_addr`): `/metrics` is then served
    /// only there, plain HTTP without credentials, and answers 404 on the API port. Adds the
    /// container and client Service port `metrics` and the `prometheus.io/*` pod
    /// annotations. Unset: `/metrics` on the API port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub metrics_port: Option<i32>,
}

fn default_replicas() -> i32 {
    3
}

/// Container image of the brokers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// Image repository.
    #[serde(default = "default_repository")]
    pub repository: String,
    /// Image tag; default: spec.version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Image pull policy.
    #[serde(default = "default_pull_policy")]
    pub pull_policy: String,
}

impl Default for ImageSpec {
    fn default() -> Self {
        ImageSpec {
            repository: default_repository(),
            tag: None,
            pull_policy: default_pull_policy(),
        }
    }
}

fn default_repository() -> String {
    "narad".into()
}
fn default_pull_policy() -> String {
    "IfNotPresent".into()
}

/// Persistent storage of each node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0").message("storage.size may only grow"))]
pub struct StorageSpec {
    /// Volume size (a Kubernetes quantity); may only grow.
    #[serde(default = "default_storage_size")]
    pub size: String,
    /// Storage class of the volumes; default: the cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

impl Default for StorageSpec {
    fn default() -> Self {
        StorageSpec {
            size: default_storage_size(),
            storage_class_name: None,
        }
    }
}

fn default_storage_size() -> String {
    "10Gi".into()
}

/// Topic defaults of the brokers; Topic resources without a setting get these.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicDefaults {
    /// Default retention (duration or "forever").
    #[serde(default = "default_retention")]
    #[schemars(regex(pattern = RETENTION_PATTERN))]
    pub retention: String,
    /// Default visibility timeout.
    #[serde(default = "default_visibility")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub visibility_timeout: String,
    /// Default partition count (3-108).
    #[serde(default = "default_partitions")]
    #[schemars(range(min = 3, max = 108))]
    pub partitions: i32,
    /// Longest long-poll wait of a consume.
    #[serde(default = "default_max_consume_wait")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_consume_wait: String,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults {
            retention: default_retention(),
            visibility_timeout: default_visibility(),
            partitions: default_partitions(),
            max_consume_wait: default_max_consume_wait(),
        }
    }
}

fn default_retention() -> String {
    "12h".into()
}
fn default_visibility() -> String {
    "30s".into()
}
fn default_partitions() -> i32 {
    3
}
fn default_max_consume_wait() -> String {
    "10s".into()
}

/// Authentication settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecuritySpec {
    /// Require HTTP Basic credentials and node-to-node authentication.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Secret with `cluster-secret` and `admin-password` (default: `<name>-narad-security`).
    /// Missing keys are generated by the operator before the first pod starts; a Secret it
    /// creates is labelled `narad.io/credentials: "true"`. An existing Secret must carry that
    /// label (or be the one the operator created for this cluster) and must not belong to
    /// another NaradCluster; otherwise nothing is applied (reason `SecretNotLabelled` or
    /// `SecretNotAllowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
    /// Secret with `tls.crt`, `tls.key` and `ca.crt` (what a cert-manager Certificate
    /// writes) for mutual TLS on the cluster port, mounted into the broker pods at
    /// /etc/narad-tls/cluster. Every node presents `tls.crt` and accepts only peers whose
    /// certificates chain to `ca.crt`; peers are reached as
    /// `<pod>.<name>-narad-headless.<namespace>.svc.<cluster domain>`, so the certificate must
    /// name that (a wildcard is simplest). It must exist and carry the label
    /// `narad.io/credentials: "true"` (with cert-manager: `secretTemplate.labels` of the
    /// Certificate); otherwise nothing is applied. The operator reads only its metadata.
    #[serde(
        default,
        rename = "clusterTLSSecretRef",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_tls_secret_ref: Option<SecretRef>,
    /// Secret with `tls.crt`, `tls.key` and `ca.crt` for HTTPS on the client API, mounted
    /// into the broker pods at /etc/narad-tls/api. The brokers then serve HTTPS only, the
    /// probes use HTTPS, and the operator calls them at `https://` trusting the Secret's
    /// `ca.crt` (so the certificate must name the client Service,
    /// `<name>-narad.<namespace>.svc[.<cluster domain>]`). It must exist, carry the label
    /// `narad.io/credentials: "true"` and hold all three keys with a `ca.crt` of PEM
    /// certificates; otherwise nothing is applied and the cluster reports `Ready=False`
    /// (reason `SecretNotFound`, `SecretNotLabelled` or `TLSSecretInvalid`), and its Topics,
    /// Users and Grants are not synced. The operator never falls back to plain HTTP.
    #[serde(
        default,
        rename = "apiTLSSecretRef",
        skip_serializing_if = "Option::is_none"
    )]
    pub api_tls_secret_ref: Option<SecretRef>,
}

impl Default for SecuritySpec {
    fn default() -> Self {
        SecuritySpec {
            enabled: true,
            secret_ref: None,
            cluster_tls_secret_ref: None,
            api_tls_secret_ref: None,
        }
    }
}

/// Remote child topics of the brokers (SPEC §5.5).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemotesSpec {
    /// Hosts a remote child topic may send to (`NARAD_REMOTES_ALLOWED_HOSTS`): host names
    /// (`queue.example.com`), suffix patterns (`*.example.com`: names below it), IP
    /// addresses, CIDR ranges (`10.0.0.0/8`) or `*` (any host). When set, every link's host
    /// must match an entry, admins' included; when empty, only admins may attach remote
    /// children. Link-local and instance-metadata addresses are never allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[^,\s]+$")))]
    pub allowed_hosts: Vec<String>,
}

impl RemotesSpec {
    /// Nothing set.
    pub fn is_empty(&self) -> bool {
        self.allowed_hosts.is_empty()
    }
}

fn default_true() -> bool {
    true
}

/// The client Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// Service type: ClusterIP, NodePort or LoadBalancer.
    #[serde(default = "default_service_type", rename = "type")]
    pub type_: String,
    /// Annotations of the client Service.
    #[serde(default, skip_serializing_if = "StringMap::is_empty")]
    pub annotations: StringMap,
}

impl Default for ServiceSpec {
    fn default() -> Self {
        ServiceSpec {
            type_: default_service_type(),
            annotations: StringMap::new(),
        }
    }
}

fn default_service_type() -> String {
    "ClusterIP".into()
}

/// Pass-throughs to the broker pods. Labels never enter the StatefulSet selector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecOverrides {
    /// Extra pod labels.
    #[serde(default, skip_serializing_if = "StringMap::is_empty")]
    pub labels: StringMap,
    /// Extra pod annotations.
    #[serde(default, skip_serializing_if = "StringMap::is_empty")]
    pub annotations: StringMap,
    /// Pod affinity (a core/v1 Affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "opaque_object")]
    pub affinity: Option<serde_json::Value>,
    /// Pod tolerations (core/v1 Toleration list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "opaque_array")]
    pub tolerations: Vec<serde_json::Value>,
    /// Node selector.
    #[serde(default, skip_serializing_if = "StringMap::is_empty")]
    pub node_selector: StringMap,
    /// Topology spread constraints (core/v1 TopologySpreadConstraint list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "opaque_array")]
    pub topology_spread_constraints: Vec<serde_json::Value>,
}

/// What deleting the NaradCluster does to its volumes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PvcDeletionPolicy {
    /// Keep the PersistentVolumeClaims.
    #[default]
    Retain,
    /// Delete the PersistentVolumeClaims with the cluster.
    Delete,
}

/// Observed state of a Narad cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NaradClusterStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Creating, Running, Upgrading, Scaling or Degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Pods passing readiness.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Broker pods that exist (the StatefulSet's `status.replicas`): the current count of
    /// the `scale` subresource. During a scale-in it stays above `spec.replicas` until the
    /// decommissioned members have left.
    #[serde(default)]
    pub replicas: i32,
    /// Label selector of the broker pods, as a string (`app.kubernetes.io/instance=<name>,
    /// app.kubernetes.io/name=narad`): the `scale` subresource's selector, which a
    /// HorizontalPodAutoscaler uses to find the pods' metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Version every member runs, when they agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// Node ID of the Raft leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// Base URL of the client Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Members as the broker reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// The initial cluster size the StatefulSet was built with (immutability check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_cluster_size: Option<i32>,
    /// The volume size applied (grow-only check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_size: Option<String>,
    /// Ready, Available, Progressing, Upgrading, QuorumHealthy, Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One member of the cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Node ID (the pod name).
    pub id: String,
    /// alive or dead.
    pub status: String,
    /// Decommission in progress.
    pub draining: bool,
    /// Partitions this member owns.
    pub owned_partitions: u64,
    /// Broker version of the member.
    pub version: String,
}

impl NaradClusterSpec {
    /// initialClusterSize with its default (1 for one replica, else 3).
    pub fn effective_initial_cluster_size(&self) -> i32 {
        self.initial_cluster_size
            .unwrap_or(if self.replicas == 1 { 1 } else { 3 })
    }

    /// The image reference `repository:tag` (tag defaults to the version).
    pub fn image_ref(&self) -> String {
        let tag = self.image.tag.as_deref().unwrap_or(&self.version);
        format!("{}:{}", self.image.repository, tag)
    }
}

impl NaradCluster {
    /// Name of the StatefulSet, the client Service and the pods' prefix: `<name>-narad`.
    pub fn fullname(&self) -> String {
        fullname(&kube::ResourceExt::name_any(self))
    }

    /// Name of the security Secret (spec.security.secretRef, else `<fullname>-security`).
    pub fn security_secret_name(&self) -> String {
        self.spec
            .security
            .secret_ref
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_else(|| format!("{}-security", self.fullname()))
    }

    /// Base URL through which the operator reaches the broker: spec.endpoint, else the
    /// client Service. Only used after [`NaradCluster::check_endpoint`] accepted it.
    pub fn broker_endpoint(&self, cluster_domain: Option<&str>) -> String {
        match &self.spec.endpoint {
            Some(e) => e.clone(),
            None => self.service_endpoint(cluster_domain),
        }
    }

    /// Base URL of the cluster's own client Service (`cluster_domain` `None`:
    /// `<svc>.<ns>.svc`): `https://` when the API serves TLS
    /// ([`SecuritySpec::api_tls_secret_ref`]).
    pub fn service_endpoint(&self, cluster_domain: Option<&str>) -> String {
        let ns = kube::ResourceExt::namespace(self).unwrap_or_else(|| "default".into());
        let host = match cluster_domain {
            Some(d) => format!("{}.{ns}.svc.{d}", self.fullname()),
            None => format!("{}.{ns}.svc", self.fullname()),
        };
        format!(
            "{}://{host}:{}",
            self.api_scheme(),
            crate::resources::API_PORT
        )
    }

    /// Whether the brokers serve the client API over HTTPS (`spec.security.apiTLSSecretRef`).
    pub fn api_tls(&self) -> bool {
        self.spec.security.api_tls_secret_ref.is_some()
    }

    /// `https` with API TLS, else `http`.
    pub fn api_scheme(&self) -> &'static str {
        if self.api_tls() {
            "https"
        } else {
            "http"
        }
    }

    /// Whether the operator may send credentials to `spec.endpoint`: an http(s) URL without
    /// user info, query or fragment and this cluster's own client Service
    /// (`<fullname>.<ns>.svc` or `<fullname>.<ns>.svc.<cluster_domain>` on the API port, no
    /// path), or any such URL when both `spec.allowExternalEndpoint` and the operator's
    /// install-wide switch (`install_allows`: `--allow-external-endpoints`, chart value
    /// `operator.allowExternalEndpoints`) say so. `Err` says why not. No endpoint is always
    /// fine.
    pub fn check_endpoint(
        &self,
        cluster_domain: Option<&str>,
        install_allows: bool,
    ) -> Result<(), String> {
        let Some(raw) = &self.spec.endpoint else {
            return Ok(());
        };
        let bad = |why: &str| Err(format!("spec.endpoint {raw:?}: {why}"));
        let Ok(uri) = raw.parse::<http::Uri>() else {
            return bad("not a URL");
        };
        let scheme = uri.scheme_str().map(str::to_ascii_lowercase);
        if !matches!(scheme.as_deref(), Some("http" | "https")) {
            return bad("must be an http or https URL");
        }
        let Some(authority) = uri.authority() else {
            return bad("has no host");
        };
        if authority.as_str().contains('@') {
            return bad("must not carry user info");
        }
        if authority.host().is_empty() {
            return bad("has no host");
        }
        if raw.contains('#') || uri.query().is_some() {
            return bad("must not carry a query or fragment");
        }
        // The brokers serve HTTPS only: a plain URL would send the admin credentials in the
        // clear (or to something else), so it is refused rather than tried.
        if self.api_tls() && scheme.as_deref() != Some("https") {
            return bad(
                "must be an https URL: spec.security.apiTLSSecretRef is set, so the brokers \
                 serve HTTPS only",
            );
        }
        let ns = kube::ResourceExt::namespace(self).unwrap_or_else(|| "default".into());
        let domain = cluster_domain.unwrap_or(crate::resources::DEFAULT_CLUSTER_DOMAIN);
        let service = format!("{}.{ns}.svc", self.fullname());
        let host = authority.host().to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        let own_host = host == service || host == format!("{service}.{domain}");
        let own_port = authority.port_u16() == Some(crate::resources::API_PORT as u16);
        let no_path = matches!(uri.path(), "" | "/");
        if own_host && own_port && no_path {
            return Ok(());
        }
        if self.spec.allow_external_endpoint {
            if install_allows {
                return Ok(());
            }
            return bad(
                "not this cluster's client Service, and although spec.allowExternalEndpoint \
                 is set, this operator is installed without external endpoints (its switch \
                 --allow-external-endpoints, chart value operator.allowExternalEndpoints, is \
                 off)",
            );
        }
        bad(&format!(
            "not this cluster's client Service ({}); set spec.allowExternalEndpoint: true to \
             let the operator send the admin credentials elsewhere",
            self.service_endpoint(Some(domain))
        ))
    }
}

/// `<cluster>-narad`.
pub fn fullname(cluster: &str) -> String {
    format!("{cluster}-narad")
}

#[cfg(test)]
mod tests {
    use crate::resources::fixtures::cluster;
    use serde_json::json;

    fn check(endpoint: &str, allow: bool, domain: Option<&str>) -> Result<(), String> {
        cluster(json!({"version": "1", "endpoint": endpoint, "allowExternalEndpoint": allow}))
            .check_endpoint(domain, true)
    }

    #[test]
    fn the_own_service_is_always_allowed() {
        assert_eq!(
            cluster(json!({"version": "1"})).check_endpoint(None, false),
            Ok(())
        );
        for e in [
            "http://prod-narad.default.svc:7942",
            "http://prod-narad.default.svc:7942/",
            "https://prod-narad.default.svc:7942",
            "http://prod-narad.default.svc.cluster.local:7942",
            "http://PROD-NARAD.default.svc.cluster.local.:7942",
        ] {
            assert_eq!(check(e, false, None), Ok(()), "{e}");
        }
        assert_eq!(
            check(
                "http://prod-narad.default.svc.k8s.example:7942",
                false,
                Some("k8s.example")
            ),
            Ok(())
        );
        // What the operator derives itself passes its own check.
        let nc = cluster(json!({"version": "1"}));
        let own = nc.service_endpoint(Some("cluster.local"));
        assert_eq!(check(&own, false, None), Ok(()));
    }

    #[test]
    fn anything_else_needs_the_opt_in() {
        for e in [
            "http://127.0.0.1:7942",
            "https://narad.example.com",
            // Another cluster's Service, or this one's in another namespace.
            "http://other-narad.default.svc:7942",
            "http://prod-narad.other.svc:7942",
            // A short name resolves in the operator's namespace, not the cluster's.
            "http://prod-narad:7942",
            "http://prod-narad.default:7942",
            // Other ports, paths, domains.
            "http://prod-narad.default.svc:80",
            "http://prod-narad.default.svc",
            "http://prod-narad.default.svc:7942/proxy",
            "http://prod-narad.default.svc.evil.example:7942",
            "http://prod-narad.default.svc.cluster.local.evil.example:7942",
        ] {
            let err = check(e, false, None).unwrap_err();
            assert!(err.contains("allowExternalEndpoint"), "{e}: {err}");
            assert_eq!(check(e, true, None), Ok(()), "{e} with the opt-in");
        }
        assert!(check(
            "http://prod-narad.default.svc.cluster.local:7942",
            false,
            Some("k8s.example")
        )
        .is_err());
    }

    #[test]
    fn the_opt_in_needs_the_install_wide_switch() {
        let nc = cluster(
            json!({"version": "1", "endpoint": "https://narad.example.com",
            "allowExternalEndpoint": true}),
        );
        assert_eq!(nc.check_endpoint(None, true), Ok(()));
        let err = nc.check_endpoint(None, false).unwrap_err();
        assert!(
            err.contains("operator.allowExternalEndpoints")
                && err.contains("--allow-external-endpoints"),
            "{err}"
        );
        // The own Service needs neither.
        let own = cluster(json!({"version": "1", "allowExternalEndpoint": true,
            "endpoint": "http://prod-narad.default.svc:7942"}));
        assert_eq!(own.check_endpoint(None, false), Ok(()));
    }

    #[test]
    fn api_tls_means_https_only() {
        let tls = |extra: serde_json::Value| {
            let mut spec =
                json!({"version": "1", "security": {"apiTLSSecretRef": {"name": "api-tls"}}});
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            cluster(spec)
        };
        let nc = tls(json!({}));
        assert!(nc.api_tls());
        assert_eq!(
            nc.service_endpoint(None),
            "https://prod-narad.default.svc:7942"
        );
        assert_eq!(
            nc.broker_endpoint(Some("cluster.local")),
            "https://prod-narad.default.svc.cluster.local:7942"
        );
        assert_eq!(nc.check_endpoint(None, false), Ok(()));
        assert_eq!(
            tls(json!({"endpoint": "https://prod-narad.default.svc:7942"}))
                .check_endpoint(None, false),
            Ok(())
        );
        for (e, allow) in [
            ("http://prod-narad.default.svc:7942", false),
            ("http://narad.example.com", true),
        ] {
            let err = tls(json!({"endpoint": e, "allowExternalEndpoint": allow}))
                .check_endpoint(None, true)
                .unwrap_err();
            assert!(
                err.contains("https") && err.contains("apiTLSSecretRef"),
                "{e}: {err}"
            );
        }
        // Without API TLS the own Service is plain HTTP.
        assert_eq!(
            cluster(json!({"version": "1"})).service_endpoint(None),
            "http://prod-narad.default.svc:7942"
        );
    }

    #[test]
    fn only_plain_http_urls_even_with_the_opt_in() {
        for e in [
            "ftp://prod-narad.default.svc:7942",
            "file:///etc/passwd",
            "prod-narad.default.svc:7942",
            "unix:///var/run/narad.sock",
            "http://admin:pw@prod-narad.default.svc:7942",
            "http://user@narad.example.com",
            "http://narad.example.com/?a=1",
            "http://narad.example.com/#x",
            "http://",
            "not a url",
        ] {
            for allow in [false, true] {
                let err = check(e, allow, None).unwrap_err();
                assert!(!err.contains("allowExternalEndpoint"), "{e} {allow}: {err}");
            }
        }
    }
}
