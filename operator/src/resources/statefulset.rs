//! The broker StatefulSet: `Parallel` pod management, `OnDelete` updates (the operator rolls
//! pods itself), one PVC per pod, node ID = pod name, peers = the initial members only.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecretKeySelector, SecretVolumeSource, SecurityContext, Toleration, TopologySpreadConstraint,
    Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use super::*;
use crate::crd::{parse_duration_ms, parse_retention_ms, NaradCluster};

/// Annotation on the pod template carrying a hash of the rendered config, so a config change
/// is a template change (and so a rolling restart).
pub const CONFIG_HASH_ANNOTATION: &str = "narad.io/config-hash";
/// Annotation on a NaradCluster asking for a rolling restart of its broker pods: whenever its
/// value changes (any string; `kubectl rollout restart` style timestamps do), the pods are
/// replaced through the same gated rollout as an upgrade. Removing it changes nothing.
pub const RESTART_ANNOTATION: &str = "narad.io/restart";
/// Annotation on the pod template carrying the value of [`RESTART_ANNOTATION`], so a new
/// value is a template change (a new StatefulSet revision, rolled pod by pod by the
/// operator, since the StatefulSet updates `OnDelete`).
pub const RESTARTED_AT_ANNOTATION: &str = "narad.io/restartedAt";
/// Name of the data volume claim template (PVCs are `data-<pod>`).
pub const DATA_VOLUME: &str = "data";

/// How long a broker keeps serving after SIGTERM with `/readyz` failing
/// (`NARAD_HTTP_SHUTDOWN_DELAY`), so that the Services and kube-proxy stop routing to it
/// before it stops listening.
pub const SHUTDOWN_DELAY: &str = "5s";
/// The broker's default `http.shutdown_grace` (its graceful HTTP shutdown after the delay).
pub const DEFAULT_SHUTDOWN_GRACE_SECS: i64 = 10;
/// What the pod's termination grace period adds to delay + grace (the Raft handoff and the
/// last flush after the HTTP shutdown).
pub const TERMINATION_MARGIN_SECS: i64 = 15;

/// `terminationGracePeriodSeconds`: the shutdown delay, plus the HTTP shutdown grace
/// (`spec.config.http.shutdown_grace` when set, else the broker's 10 s), plus a margin, so
/// that the kubelet never kills a broker in the middle of its orderly shutdown.
pub fn termination_grace_secs(nc: &NaradCluster) -> Result<i64, String> {
    let secs = |what: &str, v: &str| {
        narad_api::duration::parse_go_duration_nonnegative(v)
            .map(|d| d.as_secs() as i64 + i64::from(d.subsec_nanos() > 0))
            .map_err(|e| format!("{what}: {e}"))
    };
    let delay = secs("shutdown delay", SHUTDOWN_DELAY)?;
    let grace = match nc
        .spec
        .config
        .as_ref()
        .and_then(|c| c.pointer("/http/shutdown_grace"))
    {
        None => DEFAULT_SHUTDOWN_GRACE_SECS,
        Some(serde_json::Value::String(v)) => secs("spec.config.http.shutdown_grace", v)?,
        Some(other) => {
            return Err(format!(
                "spec.config.http.shutdown_grace must be a duration string, got {other}"
            ))
        }
    };
    Ok(delay + grace + TERMINATION_MARGIN_SECS)
}

/// Options of the StatefulSet builder that do not come from the NaradCluster spec.
#[derive(Debug, Clone)]
pub struct StatefulSetOptions {
    /// DNS domain of the Kubernetes cluster (`cluster.local`).
    pub cluster_domain: String,
    /// Size in the volumeClaimTemplates: the size the StatefulSet was created with, since
    /// that field is immutable; growth is applied to the PVCs themselves.
    pub claim_size: Option<String>,
    /// Replicas to apply instead of `spec.replicas`: during a scale-in the StatefulSet
    /// shrinks one drained ordinal at a time.
    pub replicas: Option<i32>,
    /// The pod template's [`RESTARTED_AT_ANNOTATION`] ([`restarted_at`]).
    pub restarted_at: Option<String>,
}

/// The restart value the pod template carries: the NaradCluster's [`RESTART_ANNOTATION`],
/// else the value the current StatefulSet's template already carries, so that removing the
/// annotation from the NaradCluster does not roll the pods again.
pub fn restarted_at(nc: &NaradCluster, current: Option<&StatefulSet>) -> Option<String> {
    if let Some(v) = nc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESTART_ANNOTATION))
    {
        return Some(v.clone());
    }
    current
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(RESTARTED_AT_ANNOTATION))
        .cloned()
}

impl Default for StatefulSetOptions {
    fn default() -> Self {
        StatefulSetOptions {
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
            claim_size: None,
            replicas: None,
            restarted_at: None,
        }
    }
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env_secret(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(optional),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Where the cluster-TLS Secret is mounted (as the chart does): `tls.crt`, `tls.key`,
/// `ca.crt`.
pub const CLUSTER_TLS_DIR: &str = "/etc/narad-tls/cluster";
/// Where the API-TLS Secret is mounted (as the chart does): `tls.crt`, `tls.key`.
pub const API_TLS_DIR: &str = "/etc/narad-tls/api";

/// A probe of `path` on the API port, over HTTPS when the API serves TLS (the kubelet does
/// not verify the certificate).
fn http_probe(path: &str, period: i32, failures: i32, https: bool) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("api".into()),
            scheme: https.then(|| "HTTPS".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(3),
        ..Default::default()
    }
}

/// `id@host:7943` for each initial member, and the IDs, in ordinal order.
pub fn peers(nc: &NaradCluster, cluster_domain: &str) -> (String, String) {
    let n = nc.spec.effective_initial_cluster_size();
    let ids: Vec<String> = (0..n).map(|i| format!("{}-{i}", nc.fullname())).collect();
    let peers: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "{}@{}:{CLUSTER_PORT}",
                ids[i as usize],
                pod_host(nc, i, cluster_domain)
            )
        })
        .collect();
    (peers.join(","), ids.join(","))
}

/// Converts a free-form pass-through into its typed form, naming the field on error.
fn typed<T: serde::de::DeserializeOwned>(what: &str, v: serde_json::Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| format!("spec.pod.{what}: {e}"))
}

/// The broker container's environment.
pub fn broker_env(nc: &NaradCluster, cluster_domain: &str) -> Result<Vec<EnvVar>, String> {
    let s = &nc.spec;
    let ns = kube::ResourceExt::namespace(nc).unwrap_or_else(|| "default".into());
    let (peers, initial) = peers(nc, cluster_domain);
    let retention = parse_retention_ms(&s.defaults.retention)?;
    let visibility = parse_duration_ms(&s.defaults.visibility_timeout)?;
    parse_duration_ms(&s.defaults.max_consume_wait)?;
    let mut e = vec![
        env_field("POD_NAME", "metadata.name"),
        env_field("POD_NAMESPACE", "metadata.namespace"),
        env("NARAD_NODE_ID", "$(POD_NAME)"),
        env(
            "NARAD_CLUSTER_ADVERTISE_ADDR",
            format!(
                "$(POD_NAME).{}.{ns}.svc.{cluster_domain}:{CLUSTER_PORT}",
                headless_name(nc)
            ),
        ),
        env("NARAD_CLUSTER_PEERS", peers),
        env("NARAD_CLUSTER_INITIAL_MEMBERS", initial),
        env(
            "NARAD_TOPIC_DEFAULT_PARTITIONS",
            s.defaults.partitions.to_string(),
        ),
        env(
            "NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS",
            retention.to_string(),
        ),
        env(
            "NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS",
            visibility.to_string(),
        ),
        env(
            "NARAD_HTTP_MAX_CONSUME_WAIT",
            s.defaults.max_consume_wait.clone(),
        ),
        env("NARAD_LOG_FORMAT", "json"),
        env("NARAD_HTTP_SHUTDOWN_DELAY", SHUTDOWN_DELAY),
        env("NARAD_SECURITY_ENABLED", s.security.enabled.to_string()),
    ];
    if s.security.enabled {
        let secret = nc.security_secret_name();
        e.push(env_secret(
            "NARAD_CLUSTER_SECRET",
            &secret,
            CLUSTER_SECRET_KEY,
            false,
        ));
        e.push(env_secret(
            "NARAD_ADMIN_PASSWORD",
            &secret,
            ADMIN_PASSWORD_KEY,
            true,
        ));
    }
    // All three or none: the broker refuses a partial set, and one whose files do not load.
    if s.security.cluster_tls_secret_ref.is_some() {
        for (var, file) in [
            ("NARAD_CLUSTER_TLS_CERT_FILE", "tls.crt"),
            ("NARAD_CLUSTER_TLS_KEY_FILE", "tls.key"),
            ("NARAD_CLUSTER_TLS_CA_FILE", "ca.crt"),
        ] {
            e.push(env(var, format!("{CLUSTER_TLS_DIR}/{file}")));
        }
    }
    // Both or none.
    if s.security.api_tls_secret_ref.is_some() {
        for (var, file) in [
            ("NARAD_HTTP_TLS_CERT_FILE", "tls.crt"),
            ("NARAD_HTTP_TLS_KEY_FILE", "tls.key"),
        ] {
            e.push(env(var, format!("{API_TLS_DIR}/{file}")));
        }
    }
    if let Some(p) = s.metrics_port {
        e.push(env("NARAD_HTTP_METRICS_ADDR", format!("0.0.0.0:{p}")));
    }
    // Unset when empty: the broker then lets only admins attach remote children.
    if !s.remotes.allowed_hosts.is_empty() {
        e.push(env(
            "NARAD_REMOTES_ALLOWED_HOSTS",
            s.remotes.allowed_hosts.join(","),
        ));
    }
    Ok(e)
}

/// Default requests: 500m CPU, 512Mi memory.
pub fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("500m".into())),
            ("memory".to_string(), Quantity("512Mi".into())),
        ])),
        ..Default::default()
    }
}

/// The broker StatefulSet.
pub fn statefulset(nc: &NaradCluster, opts: &StatefulSetOptions) -> Result<StatefulSet, String> {
    let s = &nc.spec;
    let selector = selector_labels(nc);
    let mut pod_labels = s.pod.labels.clone();
    pod_labels.extend(selector.clone());
    let mut annotations = s.pod.annotations.clone();
    let config = config_json(nc);
    if let Some(c) = &config {
        let hash = Sha256::digest(c.as_bytes());
        let hex: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
        annotations.insert(CONFIG_HASH_ANNOTATION.into(), hex);
    }
    if let Some(v) = &opts.restarted_at {
        annotations.insert(RESTARTED_AT_ANNOTATION.into(), v.clone());
    }
    // As the chart: Prometheus scrapes the metrics listener (plain HTTP, no credentials).
    if let Some(p) = s.metrics_port {
        annotations.insert("prometheus.io/scrape".into(), "true".into());
        annotations.insert("prometheus.io/port".into(), p.to_string());
        annotations.insert("prometheus.io/path".into(), "/metrics".into());
    }

    let mut args: Vec<String> = [
        "server",
        "start",
        "--addr",
        "0.0.0.0:7942",
        "--data-dir",
        DATA_DIR,
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut mounts = vec![VolumeMount {
        name: DATA_VOLUME.into(),
        mount_path: DATA_DIR.into(),
        ..Default::default()
    }];
    let mut volumes = Vec::new();
    if config.is_some() {
        args.extend(["--config".to_string(), format!("/etc/narad/{CONFIG_FILE}")]);
        mounts.push(VolumeMount {
            name: "config".into(),
            mount_path: "/etc/narad".into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: configmap_name(nc),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    // The TLS Secrets in the chart's layout, outside /etc/narad: that is the ConfigMap's
    // read-only volume, inside which the runtime would have to create the mount point.
    for (name, dir, secret) in [
        (
            "cluster-tls",
            CLUSTER_TLS_DIR,
            &s.security.cluster_tls_secret_ref,
        ),
        ("api-tls", API_TLS_DIR, &s.security.api_tls_secret_ref),
    ] {
        let Some(secret) = secret else { continue };
        mounts.push(VolumeMount {
            name: name.into(),
            mount_path: dir.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: name.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }

    let mut ports = vec![
        ContainerPort {
            name: Some("api".into()),
            container_port: API_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        },
        ContainerPort {
            name: Some("cluster".into()),
            container_port: CLUSTER_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        },
    ];
    if let Some(p) = s.metrics_port {
        ports.push(ContainerPort {
            name: Some("metrics".into()),
            container_port: p,
            protocol: Some("TCP".into()),
            ..Default::default()
        });
    }

    let container = Container {
        name: "narad".into(),
        image: Some(s.image_ref()),
        image_pull_policy: Some(s.image.pull_policy.clone()),
        args: Some(args),
        ports: Some(ports),
        env: Some(broker_env(nc, &opts.cluster_domain)?),
        resources: Some(s.resources.clone().unwrap_or_else(default_resources)),
        startup_probe: Some(http_probe("/healthz", 5, 60, nc.api_tls())),
        liveness_probe: Some(http_probe("/healthz", 10, 3, nc.api_tls())),
        readiness_probe: Some(http_probe("/readyz", 5, 3, nc.api_tls())),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(NARAD_UID),
            run_as_group: Some(NARAD_UID),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    };

    let affinity: Option<Affinity> = s
        .pod
        .affinity
        .clone()
        .map(|v| typed("affinity", v))
        .transpose()?;
    let tolerations: Vec<Toleration> = typed(
        "tolerations",
        serde_json::Value::Array(s.pod.tolerations.clone()),
    )?;
    let spread: Vec<TopologySpreadConstraint> = typed(
        "topologySpreadConstraints",
        serde_json::Value::Array(s.pod.topology_spread_constraints.clone()),
    )?;

    let pod = PodSpec {
        containers: vec![container],
        // The brokers call no Kubernetes API: their own ServiceAccount, no token mounted.
        service_account_name: Some(service_account_name(nc)),
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(termination_grace_secs(nc)?),
        security_context: Some(PodSecurityContext {
            fs_group: Some(NARAD_UID),
            run_as_user: Some(NARAD_UID),
            run_as_group: Some(NARAD_UID),
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        affinity,
        tolerations: (!tolerations.is_empty()).then_some(tolerations),
        node_selector: (!s.pod.node_selector.is_empty()).then(|| s.pod.node_selector.clone()),
        topology_spread_constraints: (!spread.is_empty()).then_some(spread),
        volumes: (!volumes.is_empty()).then_some(volumes),
        enable_service_links: Some(false),
        ..Default::default()
    };

    let claim_size = opts
        .claim_size
        .clone()
        .unwrap_or_else(|| s.storage.size.clone());
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.into()),
            labels: Some(selector.clone()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: s.storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(claim_size),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };

    Ok(StatefulSet {
        metadata: owned_meta(nc, nc.fullname()),
        spec: Some(StatefulSetSpec {
            replicas: Some(opts.replicas.unwrap_or(s.replicas)),
            service_name: Some(headless_name(nc)),
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                ..Default::default()
            }),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: (!annotations.is_empty()).then_some(annotations),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            volume_claim_templates: Some(vec![claim]),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::fixtures::cluster;
    use super::*;
    use serde_json::json;

    fn env_of(sts: &StatefulSet) -> BTreeMap<String, EnvVar> {
        sts.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .env
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect()
    }

    fn val(env: &BTreeMap<String, EnvVar>, k: &str) -> String {
        env[k].value.clone().unwrap_or_default()
    }

    #[test]
    fn shape() {
        let nc = cluster(json!({"version": "1.4.0", "replicas": 5}));
        let sts = statefulset(&nc, &StatefulSetOptions::default()).unwrap();
        assert_eq!(sts.metadata.name.as_deref(), Some("prod-narad"));
        assert_eq!(sts.metadata.namespace.as_deref(), Some("default"));
        let owner = &sts.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "NaradCluster");
        assert_eq!(owner.controller, Some(true));
        let spec = sts.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(5));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(
            spec.update_strategy.as_ref().unwrap().type_.as_deref(),
            Some("OnDelete")
        );
        assert_eq!(spec.service_name.as_deref(), Some("prod-narad-headless"));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.termination_grace_period_seconds, Some(30));
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.fs_group, Some(10001));
        assert_eq!(psc.run_as_non_root, Some(true));
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("narad:1.4.0"));
        assert_eq!(
            c.args.as_ref().unwrap().join(" "),
            "server start --addr 0.0.0.0:7942 --data-dir /var/lib/narad"
        );
        let csc = c.security_context.as_ref().unwrap();
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(
            csc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        let path = |p: &Option<Probe>| {
            p.as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .clone()
                .unwrap()
        };
        assert_eq!(path(&c.startup_probe), "/healthz");
        assert_eq!(path(&c.liveness_probe), "/healthz");
        assert_eq!(path(&c.readiness_probe), "/readyz");
        let ports: Vec<i32> = c
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.container_port)
            .collect();
        assert_eq!(ports, vec![7942, 7943]);
        let req = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
        assert_eq!(req["cpu"].0, "500m");
        assert_eq!(req["memory"].0, "512Mi");
        assert_eq!(c.volume_mounts.as_ref().unwrap()[0].mount_path, DATA_DIR);
        let vct = &spec.volume_claim_templates.as_ref().unwrap()[0];
        assert_eq!(vct.metadata.name.as_deref(), Some("data"));
        assert_eq!(
            vct.spec
                .as_ref()
                .unwrap()
                .resources
                .as_ref()
                .unwrap()
                .requests
                .as_ref()
                .unwrap()["storage"]
                .0,
            "10Gi"
        );
    }

    /// Issue 14, bugs 6 and 7: the brokers get their own ServiceAccount without a token, a
    /// shutdown delay, and a termination grace period that covers delay + grace + margin.
    #[test]
    fn service_account_and_orderly_shutdown() {
        let nc = cluster(json!({"version": "1"}));
        let sts = statefulset(&nc, &StatefulSetOptions::default()).unwrap();
        let pod = pod_of(&sts);
        assert_eq!(pod.service_account_name.as_deref(), Some("prod-narad"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let env = env_of(&sts);
        assert_eq!(val(&env, "NARAD_HTTP_SHUTDOWN_DELAY"), "5s");
        // 5 s delay + the broker's 10 s grace + 15 s margin.
        assert_eq!(pod.termination_grace_period_seconds, Some(30));
        let long = cluster(json!({"version": "1",
            "config": {"http": {"shutdown_grace": "1m30s"}}}));
        let pod = pod_of(&statefulset(&long, &StatefulSetOptions::default()).unwrap());
        assert_eq!(pod.termination_grace_period_seconds, Some(5 + 90 + 15));
        let bad = cluster(json!({"version": "1", "config": {"http": {"shutdown_grace": 10}}}));
        assert!(statefulset(&bad, &StatefulSetOptions::default())
            .unwrap_err()
            .contains("shutdown_grace"));
    }

    #[test]
    fn metrics_listener() {
        let plain = statefulset(&cluster(json!({"version": "1"})), &Default::default()).unwrap();
        assert!(!env_of(&plain).contains_key("NARAD_HTTP_METRICS_ADDR"));
        let nc = cluster(json!({"version": "1", "metricsPort": 9090}));
        let sts = statefulset(&nc, &StatefulSetOptions::default()).unwrap();
        assert_eq!(
            val(&env_of(&sts), "NARAD_HTTP_METRICS_ADDR"),
            "0.0.0.0:9090"
        );
        let ports: Vec<(Option<String>, i32)> = pod_of(&sts).containers[0]
            .ports
            .clone()
            .unwrap()
            .into_iter()
            .map(|p| (p.name, p.container_port))
            .collect();
        assert_eq!(ports[2], (Some("metrics".into()), 9090));
        let ann = sts
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap();
        assert_eq!(ann["prometheus.io/scrape"], "true");
        assert_eq!(ann["prometheus.io/port"], "9090");
        assert_eq!(ann["prometheus.io/path"], "/metrics");
    }

    #[test]
    fn peers_are_the_initial_members_only() {
        let three = cluster(json!({"version": "1", "replicas": 3}));
        let five = cluster(json!({"version": "1", "replicas": 5}));
        let a = statefulset(&three, &StatefulSetOptions::default()).unwrap();
        let b = statefulset(&five, &StatefulSetOptions::default()).unwrap();
        let env = env_of(&a);
        assert_eq!(
            val(&env, "NARAD_CLUSTER_PEERS"),
            "prod-narad-0@prod-narad-0.prod-narad-headless.default.svc.cluster.local:7943,\
             prod-narad-1@prod-narad-1.prod-narad-headless.default.svc.cluster.local:7943,\
             prod-narad-2@prod-narad-2.prod-narad-headless.default.svc.cluster.local:7943"
        );
        assert_eq!(
            val(&env, "NARAD_CLUSTER_INITIAL_MEMBERS"),
            "prod-narad-0,prod-narad-1,prod-narad-2"
        );
        assert_eq!(
            val(&env, "NARAD_CLUSTER_ADVERTISE_ADDR"),
            "$(POD_NAME).prod-narad-headless.default.svc.cluster.local:7943"
        );
        assert_eq!(val(&env, "NARAD_NODE_ID"), "$(POD_NAME)");
        // Scaling changes replicas only, never the pod template.
        assert_eq!(
            a.spec.as_ref().unwrap().template,
            b.spec.as_ref().unwrap().template
        );
    }

    #[test]
    fn defaults_and_security_env() {
        let nc = cluster(json!({"version": "1"}));
        let env = env_of(&statefulset(&nc, &StatefulSetOptions::default()).unwrap());
        assert_eq!(
            val(&env, "NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS"),
            "43200000"
        );
        assert_eq!(
            val(&env, "NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS"),
            "30000"
        );
        assert_eq!(val(&env, "NARAD_TOPIC_DEFAULT_PARTITIONS"), "3");
        assert_eq!(val(&env, "NARAD_HTTP_MAX_CONSUME_WAIT"), "10s");
        assert_eq!(val(&env, "NARAD_SECURITY_ENABLED"), "true");
        let secret = |k: &str| {
            env[k]
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .clone()
                .unwrap()
        };
        let cs = secret("NARAD_CLUSTER_SECRET");
        assert_eq!(cs.name, "prod-narad-security");
        assert_eq!(cs.key, "cluster-secret");
        assert_eq!(cs.optional, Some(false));
        let ap = secret("NARAD_ADMIN_PASSWORD");
        assert_eq!(ap.key, "admin-password");
        assert_eq!(ap.optional, Some(true));

        let off = cluster(json!({"version": "1", "security": {"enabled": false}}));
        let env = env_of(&statefulset(&off, &StatefulSetOptions::default()).unwrap());
        assert_eq!(val(&env, "NARAD_SECURITY_ENABLED"), "false");
        assert!(!env.contains_key("NARAD_CLUSTER_SECRET"));

        let tls = cluster(json!({"version": "1", "security": {
            "secretRef": {"name": "s"}, "clusterTLSSecretRef": {"name": "t"}}}));
        let sts = statefulset(&tls, &StatefulSetOptions::default()).unwrap();
        let env = env_of(&sts);
        assert_eq!(
            val(&env, "NARAD_CLUSTER_TLS_CA_FILE"),
            "/etc/narad-tls/cluster/ca.crt"
        );
        assert_eq!(
            env["NARAD_CLUSTER_SECRET"]
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .name,
            "s"
        );
        let vols = sts.spec.unwrap().template.spec.unwrap().volumes.unwrap();
        assert_eq!(
            vols[0].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("t")
        );
    }

    fn pod_of(sts: &StatefulSet) -> PodSpec {
        sts.spec.as_ref().unwrap().template.spec.clone().unwrap()
    }

    /// mount path → (volume name, read-only) of the broker container.
    fn mounts_of(sts: &StatefulSet) -> BTreeMap<String, (String, bool)> {
        pod_of(sts).containers[0]
            .volume_mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| (m.mount_path, (m.name, m.read_only == Some(true))))
            .collect()
    }

    /// volume name → Secret name of the pod's Secret volumes.
    fn secret_volumes(sts: &StatefulSet) -> BTreeMap<String, String> {
        pod_of(sts)
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| Some((v.name, v.secret?.secret_name?)))
            .collect()
    }

    /// The HTTP schemes of the startup, liveness and readiness probes.
    fn probe_schemes(sts: &StatefulSet) -> Vec<Option<String>> {
        let c = pod_of(sts).containers[0].clone();
        [c.startup_probe, c.liveness_probe, c.readiness_probe]
            .into_iter()
            .map(|p| p.unwrap().http_get.unwrap().scheme)
            .collect()
    }

    const TLS_VARS: [&str; 5] = [
        "NARAD_CLUSTER_TLS_CERT_FILE",
        "NARAD_CLUSTER_TLS_KEY_FILE",
        "NARAD_CLUSTER_TLS_CA_FILE",
        "NARAD_HTTP_TLS_CERT_FILE",
        "NARAD_HTTP_TLS_KEY_FILE",
    ];

    #[test]
    fn without_tls_nothing_tls_is_set() {
        let sts = statefulset(&cluster(json!({"version": "1"})), &Default::default()).unwrap();
        let env = env_of(&sts);
        for v in TLS_VARS.iter().chain(&["NARAD_REMOTES_ALLOWED_HOSTS"]) {
            assert!(!env.contains_key(*v), "{v}");
        }
        assert!(secret_volumes(&sts).is_empty());
        assert_eq!(probe_schemes(&sts), vec![None, None, None]);
    }

    #[test]
    fn cluster_tls_follows_the_chart_layout() {
        // With a config file too: its ConfigMap is at /etc/narad, the certificates beside it.
        let nc = cluster(
            json!({"version": "1", "config": {"storage": {"codec": "none"}},
            "security": {"clusterTLSSecretRef": {"name": "narad-cluster-tls"}}}),
        );
        let sts = statefulset(&nc, &StatefulSetOptions::default()).unwrap();
        let env = env_of(&sts);
        // All three, consistently in the mounted directory (the broker takes all or none).
        assert_eq!(
            val(&env, "NARAD_CLUSTER_TLS_CERT_FILE"),
            "/etc/narad-tls/cluster/tls.crt"
        );
        assert_eq!(
            val(&env, "NARAD_CLUSTER_TLS_KEY_FILE"),
            "/etc/narad-tls/cluster/tls.key"
        );
        assert_eq!(
            val(&env, "NARAD_CLUSTER_TLS_CA_FILE"),
            "/etc/narad-tls/cluster/ca.crt"
        );
        assert!(!env.contains_key("NARAD_HTTP_TLS_CERT_FILE"));
        let mounts = mounts_of(&sts);
        assert_eq!(
            mounts["/etc/narad-tls/cluster"],
            ("cluster-tls".to_string(), true)
        );
        assert_eq!(mounts["/etc/narad"], ("config".to_string(), true));
        assert!(
            !mounts.keys().any(|p| p.starts_with("/etc/narad/")),
            "nothing mounted inside the ConfigMap volume: {mounts:?}"
        );
        assert_eq!(
            secret_volumes(&sts),
            BTreeMap::from([("cluster-tls".to_string(), "narad-cluster-tls".to_string())])
        );
        // Cluster TLS alone leaves the API, and so the probes, on plain HTTP.
        assert_eq!(probe_schemes(&sts), vec![None, None, None]);
    }

    #[test]
    fn api_tls_mounts_env_and_https_probes() {
        let nc = cluster(json!({"version": "1",
            "security": {"apiTLSSecretRef": {"name": "narad-api-tls"}}}));
        let sts = statefulset(&nc, &StatefulSetOptions::default()).unwrap();
        let env = env_of(&sts);
        assert_eq!(
            val(&env, "NARAD_HTTP_TLS_CERT_FILE"),
            "/etc/narad-tls/api/tls.crt"
        );
        assert_eq!(
            val(&env, "NARAD_HTTP_TLS_KEY_FILE"),
            "/etc/narad-tls/api/tls.key"
        );
        for v in &TLS_VARS[..3] {
            assert!(!env.contains_key(*v), "{v}");
        }
        assert_eq!(
            mounts_of(&sts)["/etc/narad-tls/api"],
            ("api-tls".to_string(), true)
        );
        assert_eq!(
            secret_volumes(&sts),
            BTreeMap::from([("api-tls".to_string(), "narad-api-tls".to_string())])
        );
        let https = Some("HTTPS".to_string());
        assert_eq!(
            probe_schemes(&sts),
            vec![https.clone(), https.clone(), https]
        );
        // The probe paths and port are the same as without TLS.
        let c = pod_of(&sts).containers[0].clone();
        let get = c.readiness_probe.unwrap().http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some("/readyz"));
        assert_eq!(get.port, IntOrString::String("api".into()));
    }

    #[test]
    fn both_tls_secrets_get_their_own_volumes() {
        let nc = cluster(json!({"version": "1", "security": {
            "clusterTLSSecretRef": {"name": "c"}, "apiTLSSecretRef": {"name": "a"}}}));
        let sts = statefulset(&nc, &StatefulSetOptions::default()).unwrap();
        let env = env_of(&sts);
        for v in TLS_VARS {
            assert!(env.contains_key(v), "{v}");
        }
        assert_eq!(
            secret_volumes(&sts),
            BTreeMap::from([
                ("api-tls".to_string(), "a".to_string()),
                ("cluster-tls".to_string(), "c".to_string())
            ])
        );
        let mounts = mounts_of(&sts);
        assert_eq!(mounts["/etc/narad-tls/api"].0, "api-tls");
        assert_eq!(mounts["/etc/narad-tls/cluster"].0, "cluster-tls");
    }

    #[test]
    fn allowed_hosts_env() {
        let nc = cluster(json!({"version": "1", "remotes": {
            "allowedHosts": ["narad-dr.example.com", "*.corp.example", "10.0.0.0/8"]}}));
        let env = env_of(&statefulset(&nc, &StatefulSetOptions::default()).unwrap());
        assert_eq!(
            val(&env, "NARAD_REMOTES_ALLOWED_HOSTS"),
            "narad-dr.example.com,*.corp.example,10.0.0.0/8"
        );
        let empty = cluster(json!({"version": "1", "remotes": {"allowedHosts": []}}));
        let env = env_of(&statefulset(&empty, &StatefulSetOptions::default()).unwrap());
        assert!(!env.contains_key("NARAD_REMOTES_ALLOWED_HOSTS"));
    }

    #[test]
    fn user_labels_never_reach_the_selector() {
        let nc = cluster(json!({"version": "1", "pod": {
            "labels": {"team": "a", "app.kubernetes.io/name": "evil"},
            "annotations": {"x": "y"},
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "affinity": {"podAntiAffinity": {}},
        }}));
        let sts = statefulset(&nc, &StatefulSetOptions::default()).unwrap();
        let spec = sts.spec.unwrap();
        let sel = spec.selector.match_labels.unwrap();
        assert_eq!(sel.len(), 2);
        assert_eq!(sel["app.kubernetes.io/name"], "narad");
        let tl = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(tl["team"], "a");
        assert_eq!(tl["app.kubernetes.io/name"], "narad", "selector wins");
        let vct_labels = spec.volume_claim_templates.unwrap()[0]
            .metadata
            .labels
            .clone()
            .unwrap();
        assert_eq!(vct_labels, sel);
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()["disk"], "ssd");
        assert_eq!(pod.tolerations.unwrap()[0].key.as_deref(), Some("k"));
        assert!(pod.affinity.unwrap().pod_anti_affinity.is_some());

        let bad = cluster(json!({"version": "1", "pod": {"tolerations": [{"key": 5}]}}));
        assert!(statefulset(&bad, &StatefulSetOptions::default())
            .unwrap_err()
            .contains("spec.pod.tolerations"));
    }

    #[test]
    fn config_mounts_and_hash() {
        let nc = cluster(json!({"version": "1", "config": {"storage": {"codec": "none"}}}));
        let sts = statefulset(&nc, &StatefulSetOptions::default()).unwrap();
        let t = sts.spec.unwrap().template;
        let c = &t.spec.as_ref().unwrap().containers[0];
        assert!(c
            .args
            .as_ref()
            .unwrap()
            .join(" ")
            .ends_with("--config /etc/narad/narad.json"));
        let h1 = t.metadata.unwrap().annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone();
        let other = cluster(json!({"version": "1", "config": {"storage": {"codec": "zstd"}}}));
        let t2 = statefulset(&other, &StatefulSetOptions::default())
            .unwrap()
            .spec
            .unwrap()
            .template;
        assert_ne!(
            h1,
            t2.metadata.unwrap().annotations.unwrap()[CONFIG_HASH_ANNOTATION]
        );
    }

    fn template_annotations(sts: &StatefulSet) -> BTreeMap<String, String> {
        sts.spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .clone()
            .unwrap_or_default()
    }

    #[test]
    fn the_restart_annotation_reaches_the_pod_template_and_stays() {
        let with = |v: Option<&str>| {
            let mut nc = cluster(json!({"version": "1"}));
            if let Some(v) = v {
                nc.metadata.annotations =
                    Some(BTreeMap::from([(RESTART_ANNOTATION.into(), v.into())]));
            }
            nc
        };
        let build = |nc: &NaradCluster, current: Option<&StatefulSet>| {
            let opts = StatefulSetOptions {
                restarted_at: restarted_at(nc, current),
                ..Default::default()
            };
            statefulset(nc, &opts).unwrap()
        };
        // Never restarted: no annotation on the template.
        let plain = build(&with(None), None);
        assert!(!template_annotations(&plain).contains_key(RESTARTED_AT_ANNOTATION));
        // A value: carried into the template, so a template (revision) change.
        let first = build(&with(Some("2026-12-06T09:00:00Z")), Some(&plain));
        assert_eq!(
            template_annotations(&first)[RESTARTED_AT_ANNOTATION],
            "2026-12-06T09:00:00Z"
        );
        assert_ne!(
            first.spec.as_ref().unwrap().template,
            plain.spec.as_ref().unwrap().template
        );
        // The same value again: the same template, nothing rolls.
        let again = build(&with(Some("2026-12-06T09:00:00Z")), Some(&first));
        assert_eq!(
            again.spec.as_ref().unwrap().template,
            first.spec.as_ref().unwrap().template
        );
        // A new value: a new template.
        let second = build(&with(Some("later")), Some(&first));
        assert_eq!(
            template_annotations(&second)[RESTARTED_AT_ANNOTATION],
            "later"
        );
        // The annotation removed: the template keeps the last value (no rollout).
        let removed = build(&with(None), Some(&second));
        assert_eq!(
            removed.spec.as_ref().unwrap().template,
            second.spec.as_ref().unwrap().template
        );
    }

    #[test]
    fn claim_size_is_kept_from_creation() {
        let nc = cluster(
            json!({"version": "1", "storage": {"size": "50Gi", "storageClassName": "fast"}}),
        );
        let opts = StatefulSetOptions {
            claim_size: Some("10Gi".into()),
            ..Default::default()
        };
        let vct = &statefulset(&nc, &opts)
            .unwrap()
            .spec
            .unwrap()
            .volume_claim_templates
            .unwrap()[0];
        let spec = vct.spec.as_ref().unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
            "10Gi"
        );
    }

    #[test]
    fn image_tag_and_cluster_domain() {
        let nc = cluster(json!({"version": "1.4.0", "image": {
            "repository": "example.org/narad", "tag": "custom", "pullPolicy": "Always"}}));
        let opts = StatefulSetOptions {
            cluster_domain: "k8s.example".into(),
            ..Default::default()
        };
        let sts = statefulset(&nc, &opts).unwrap();
        let c = sts
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .clone();
        assert_eq!(c.image.as_deref(), Some("example.org/narad:custom"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert!(val(&env_of(&sts), "NARAD_CLUSTER_PEERS").contains(".svc.k8s.example:7943"));
    }
}
