//! One reconciler per kind, each split into pure decision functions (`plan_*`, unit-tested)
//! and a thin async shell that reads the cluster and the broker, runs the plan and writes
//! `status`. Shared here: the error type, the context, reaching a cluster's broker and the
//! mapping of broker answers to condition reasons.

pub mod cluster;
pub mod grant;
pub mod secrets;
pub mod topic;
pub mod user;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;

use crate::crd::NaradCluster;
use crate::resources::ADMIN_PASSWORD_KEY as ADMIN_PASSWORD_KEY_NAME;

/// Errors of a reconcile; anything else is reported in conditions and retried.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// A broker call failed (also written to the conditions before it is returned).
    #[error("broker: {0}")]
    Broker(#[from] narad_api::Error),
    /// Adding or removing the finalizer failed, or the apply/cleanup inside it.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Something to wait for (cluster, parent, user, Secret); retried after a short delay.
    #[error("waiting: {0}")]
    Waiting(String),
    /// A spec the operator refuses (also in the conditions); retried at the resync period.
    #[error("invalid: {0}")]
    Invalid(String),
}

impl Error {
    /// A label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Broker(_) => "broker",
            Error::Finalizer(_) => "finalizer",
            Error::Waiting(_) => "waiting",
            Error::Invalid(_) => "invalid",
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What every reconciler shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: kube::Client,
    /// Broker base URL used for every cluster instead of its client Service (tests, or an
    /// operator running outside the Kubernetes cluster). Set by whoever runs the operator,
    /// so trusted; an accepted `spec.endpoint` wins over it.
    pub broker_endpoint: Option<String>,
    /// DNS domain used in client Service URLs (`None`: `<svc>.<ns>.svc`).
    pub cluster_domain: Option<String>,
    /// Period of drift correction.
    pub resync: Duration,
    /// Short retry while waiting for a dependency.
    pub wait_retry: Duration,
    /// `policy/v1` or `policy/v1beta1`, as the server serves PDBs.
    pub pdb_api_version: String,
    /// The install-wide switch of `spec.allowExternalEndpoint`: off, no NaradCluster may
    /// point the operator at an endpoint other than its own client Service, whatever its
    /// spec says (set by whoever installs the operator: `--allow-external-endpoints`).
    pub allow_external_endpoints: bool,
    /// Publishes the Kubernetes Events of the reconcilers (`kubectl describe`).
    pub recorder: kube::runtime::events::Recorder,
    /// The operator's metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Consecutive failures per object, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    /// A context with the default periods (resync 5 min, wait retry 5 s).
    pub fn new(client: kube::Client) -> Context {
        Context {
            client: client.clone(),
            broker_endpoint: None,
            cluster_domain: None,
            resync: Duration::from_secs(300),
            wait_retry: Duration::from_secs(5),
            pdb_api_version: "policy/v1".into(),
            allow_external_endpoints: false,
            recorder: kube::runtime::events::Recorder::new(client.clone(), reporter(None)),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Backoff after a failure of `key`: 1 s doubling to 5 min.
    pub fn backoff(&self, key: &str) -> Duration {
        let mut f = self.failures.lock().expect("invariant: lock not poisoned");
        let n = f.entry(key.to_string()).or_insert(0);
        *n = (*n + 1).min(20);
        backoff_for(*n)
    }

    /// Publishes `n` as an Event of `nc`; a failure is logged, never fails the reconcile.
    pub async fn publish(&self, nc: &NaradCluster, n: &cluster::Notice) {
        use kube::runtime::events::{Event, EventType};
        let ev = Event {
            type_: if n.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: n.reason.to_string(),
            note: Some(n.message.chars().take(1000).collect()),
            action: n.action.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &nc.object_ref(&())).await {
            tracing::warn!(object = %object_key(nc), reason = n.reason, error = %e, "could not publish an event");
        }
    }

    /// Forgets the failures of `key` after a success.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .expect("invariant: lock not poisoned")
            .remove(key);
    }
}

/// The reporter of the operator's Events: controller `narad-operator`, this replica.
pub fn reporter(instance: Option<String>) -> kube::runtime::events::Reporter {
    kube::runtime::events::Reporter {
        controller: "narad-operator".into(),
        instance,
    }
}

/// 1 s, 2 s, 4 s … capped at 300 s, for the `n`th consecutive failure.
pub fn backoff_for(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}

/// The requeue after an error: backoff for broker and API failures, the short retry for
/// waits, the resync period for invalid specs.
pub fn error_policy<K: Resource>(obj: Arc<K>, err: &Error, ctx: Arc<Context>) -> Action
where
    K::DynamicType: Default,
{
    let key = object_key(&*obj);
    tracing::warn!(object = %key, error = %err, kind = err.metric_label(), "reconcile failed");
    match err {
        Error::Waiting(_) => Action::requeue(ctx.wait_retry),
        Error::Invalid(_) => Action::requeue(ctx.resync),
        _ => Action::requeue(ctx.backoff(&key)),
    }
}

/// `Kind/namespace/name`, the key of an object in logs and the backoff table.
pub fn object_key<K: Resource>(obj: &K) -> String
where
    K::DynamicType: Default,
{
    format!(
        "{}/{}/{}",
        K::kind(&Default::default()),
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default()
    )
}

/// The current time as a condition timestamp.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The condition reason for a broker answer (SPEC §10.3: e.g. `UserNotFound`, `Forbidden`,
/// `Invalid`); `not_found` names what a `404` means in context.
pub fn broker_reason(e: &narad_api::Error, not_found: &'static str) -> &'static str {
    match e.status() {
        Some(400) => "Invalid",
        Some(401) => "Unauthorized",
        Some(403) => "Forbidden",
        Some(404) => not_found,
        Some(409) => "Conflict",
        Some(429) => "Throttled",
        Some(503) => "Unavailable",
        Some(_) => "BrokerError",
        None => "BrokerUnreachable",
    }
}

/// A reached broker: its client and the cluster it belongs to.
pub struct Broker {
    pub client: narad_api::Client,
    pub cluster: NaradCluster,
}

/// Why a cluster's broker cannot be used now.
#[derive(Debug, PartialEq, Eq)]
pub enum Unreachable {
    /// The NaradCluster is gone or being deleted: dependents release their finalizers
    /// without calling it.
    ClusterGone,
    /// Not usable yet (e.g. the security Secret lacks the admin password).
    NotReady(String),
    /// The operator will not send credentials to it: `spec.endpoint` is not allowed
    /// (`EndpointNotAllowed`) or its security Secret may not be used (a
    /// [`secrets::Refusal`] reason). Condition reason and message.
    Refused(&'static str, String),
}

impl Unreachable {
    /// The condition reason and message of a dependent of cluster `cluster`.
    pub fn condition(self, cluster: &str) -> (&'static str, String) {
        match self {
            Unreachable::ClusterGone => (
                "ClusterNotFound",
                format!("NaradCluster {cluster} not found"),
            ),
            Unreachable::NotReady(m) => ("ClusterNotReady", m),
            Unreachable::Refused(reason, m) => (reason, format!("NaradCluster {cluster}: {m}")),
        }
    }

    /// The error a dependent's cleanup returns (a vanished cluster is not one: `None`).
    pub fn cleanup_error(self) -> Option<Error> {
        match self {
            Unreachable::ClusterGone => None,
            Unreachable::NotReady(m) | Unreachable::Refused(_, m) => Some(Error::Waiting(m)),
        }
    }
}

/// Resolves the broker of cluster `name` in `ns`: the NaradCluster, its endpoint
/// (`spec.endpoint` if [`NaradCluster::check_endpoint`] allows it, else the operator's
/// override, else the client Service), with API TLS the CA of its API-TLS Secret (the only
/// root besides the system's the client trusts; the endpoint must then be `https://`)
/// and, with security on, the root admin's credentials from its security Secret (only
/// Secrets [`secrets::check_for_cluster`] allows). A refused endpoint or Secret is
/// reported before anything is read or sent; there is no fallback to plain HTTP.
pub async fn broker_for(
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<Result<Broker, Unreachable>> {
    let clusters: Api<NaradCluster> = Api::namespaced(ctx.client.clone(), ns);
    let Some(nc) = clusters.get_opt(name).await? else {
        return Ok(Err(Unreachable::ClusterGone));
    };
    if nc.meta().deletion_timestamp.is_some() {
        return Ok(Err(Unreachable::ClusterGone));
    }
    if let Err(m) = nc.check_endpoint(ctx.cluster_domain.as_deref(), ctx.allow_external_endpoints) {
        return Ok(Err(Unreachable::Refused("EndpointNotAllowed", m)));
    }
    let endpoint = match (&nc.spec.endpoint, &ctx.broker_endpoint) {
        (Some(e), _) => e.clone(),
        (None, Some(e)) => e.clone(),
        (None, None) => nc.broker_endpoint(ctx.cluster_domain.as_deref()),
    };
    // `spec.endpoint` was checked above; this catches the operator's own override.
    if nc.api_tls() && !endpoint.to_ascii_lowercase().starts_with("https://") {
        return Ok(Err(Unreachable::Refused(
            "EndpointNotAllowed",
            format!(
                "broker endpoint {endpoint:?} is not https://, but \
                 spec.security.apiTLSSecretRef is set (the brokers serve HTTPS only)"
            ),
        )));
    }
    let ca = match secrets::api_tls_secret(ctx, &nc).await? {
        None => None,
        Some(Ok(ca)) => Some(ca),
        Some(Err(r)) => return Ok(Err(Unreachable::Refused(r.reason, r.message))),
    };
    let auth = if nc.spec.security.enabled {
        let secret_name = nc.security_secret_name();
        let password = match secrets::security_secret(ctx, &nc).await? {
            Some(Err(r)) => return Ok(Err(Unreachable::Refused(r.reason, r.message))),
            None => None,
            Some(Ok(s)) => s
                .data
                .and_then(|d| d.get(ADMIN_PASSWORD_KEY_NAME).cloned())
                .map(|b| String::from_utf8_lossy(&b.0).into_owned()),
        };
        match password {
            Some(p) if !p.is_empty() => Some((crate::resources::ADMIN_USER.to_string(), p)),
            _ => {
                return Ok(Err(Unreachable::NotReady(format!(
                    "Secret {secret_name} has no {ADMIN_PASSWORD_KEY_NAME}"
                ))))
            }
        }
    } else {
        None
    };
    let client = narad_api::Client::with_ca(&endpoint, auth, ca.as_deref())
        .map_err(|e| Error::Invalid(format!("broker endpoint {endpoint:?}: {e}")))?
        .with_timeout(Duration::from_secs(10));
    Ok(Ok(Broker {
        client,
        cluster: nc,
    }))
}

/// The annotation that stops the operator from acting on a resource: `"true"` pauses it.
pub const PAUSE_ANNOTATION: &str = "narad.io/pause-reconciliation";

/// Whether the resource's annotations pause its reconciliation.
pub fn paused<K: Resource>(obj: &K) -> bool {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(PAUSE_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// A status with conditions (every kind's).
pub trait Conditions {
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
}

macro_rules! conditions {
    ($($t:ty),*) => {$(
        impl Conditions for $t {
            fn conditions_mut(&mut self) -> &mut Vec<Condition> {
                &mut self.conditions
            }
        }
    )*};
}
conditions!(
    crate::crd::NaradClusterStatus,
    crate::crd::TopicStatus,
    crate::crd::UserStatus,
    crate::crd::GrantStatus
);

/// A paused resource (see [`paused`]): nothing is created, changed or deleted on the broker or
/// in the cluster, a deletion waits (the finalizer stays), and the status says `Synced=False`
/// with reason `Paused`. Reconciled again when the resource changes (e.g. the annotation goes).
pub async fn hold_paused<K, S>(api: &Api<K>, obj: &K, status: Option<&S>) -> Result<Action>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Conditions + Clone + Default + PartialEq + Serialize,
{
    let mut s = status.cloned().unwrap_or_default();
    crate::crd::set_condition(
        s.conditions_mut(),
        crate::crd::cond::SYNCED,
        false,
        "Paused",
        "reconciliation is paused by the annotation narad.io/pause-reconciliation: \"true\"; \
         nothing is changed or deleted until it is removed",
        obj.meta().generation,
        &now(),
    );
    if status != Some(&s) {
        patch_status(api, obj, &s).await?;
    }
    Ok(Action::await_change())
}

/// Writes `status` with a JSON merge patch (works on every server version; lists such as
/// `conditions` are replaced whole, which is what the reconcilers compute).
pub async fn patch_status<K, S>(api: &Api<K>, obj: &K, status: &S) -> Result<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let patch = serde_json::json!({ "status": status });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Sets `Ready` and `Synced` together.
pub fn set_ready_synced(
    conditions: &mut Vec<Condition>,
    ready: (bool, &str, &str),
    synced: (bool, &str, &str),
    generation: Option<i64>,
) {
    let t = now();
    crate::crd::set_condition(
        conditions,
        crate::crd::cond::READY,
        ready.0,
        ready.1,
        ready.2,
        generation,
        &t,
    );
    crate::crd::set_condition(
        conditions,
        crate::crd::cond::SYNCED,
        synced.0,
        synced.1,
        synced.2,
        generation,
        &t,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_annotation_set_to_true_pauses() {
        let topic = |annotations: serde_json::Value| -> crate::crd::Topic {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "narad.io/v1alpha1", "kind": "Topic",
                "metadata": {"name": "t", "annotations": annotations},
                "spec": {"clusterRef": {"name": "prod"}}
            }))
            .unwrap()
        };
        assert!(paused(&topic(
            serde_json::json!({PAUSE_ANNOTATION: "true"})
        )));
        for other in [
            serde_json::json!({PAUSE_ANNOTATION: "false"}),
            serde_json::json!({PAUSE_ANNOTATION: "yes"}),
            serde_json::json!({"narad.io/other": "true"}),
            serde_json::json!({}),
        ] {
            assert!(!paused(&topic(other.clone())), "{other}");
        }
    }

    #[test]
    fn backoff_doubles_to_five_minutes() {
        assert_eq!(backoff_for(1), Duration::from_secs(1));
        assert_eq!(backoff_for(2), Duration::from_secs(2));
        assert_eq!(backoff_for(5), Duration::from_secs(16));
        assert_eq!(backoff_for(9), Duration::from_secs(256));
        assert_eq!(backoff_for(10), Duration::from_secs(300));
        assert_eq!(backoff_for(20), Duration::from_secs(300));
    }

    #[test]
    fn reasons() {
        let api = |s: u16| {
            narad_api::Error::Api(narad_api::HttpError {
                status: s,
                message: "m".into(),
                retry_after: None,
            })
        };
        assert_eq!(broker_reason(&api(404), "UserNotFound"), "UserNotFound");
        assert_eq!(broker_reason(&api(403), "x"), "Forbidden");
        assert_eq!(broker_reason(&api(400), "x"), "Invalid");
        assert_eq!(broker_reason(&api(409), "x"), "Conflict");
        assert_eq!(broker_reason(&api(503), "x"), "Unavailable");
        let t = narad_api::Error::Transport {
            message: "down".into(),
            timeout: false,
            connect: true,
        };
        assert_eq!(broker_reason(&t, "x"), "BrokerUnreachable");
    }
}
