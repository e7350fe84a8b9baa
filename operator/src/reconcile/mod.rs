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
    /// Who publishes the reconcilers' Kubernetes Events (`kubectl describe`).
    pub reporter: kube::runtime::events::Reporter,
    /// The operator's metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Consecutive failures per object, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The Kubernetes API failure last announced per object (see [`error_policy`]).
    reported: Mutex<HashMap<String, String>>,
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
            reporter: reporter(None),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            failures: Mutex::new(HashMap::new()),
            reported: Mutex::new(HashMap::new()),
        }
    }

    /// Backoff after a failure of `key`: 1 s doubling to 5 min.
    pub fn backoff(&self, key: &str) -> Duration {
        let mut f = self.failures.lock().expect("invariant: lock not poisoned");
        let n = f.entry(key.to_string()).or_insert(0);
        *n = (*n + 1).min(20);
        backoff_for(*n)
    }

    /// Publishes `n` as an Event of `obj`; a failure is logged, never fails the reconcile.
    /// Each is an Event object of its own: the reconcilers publish only actions and changes
    /// of a condition, never the same wait on every pass, and a recorder that outlives one
    /// call would fold Events of the same reason within six minutes into a series that
    /// keeps the first one's note (the pods of a rollout, the objects created, two different
    /// refusals would all read as the first).
    pub async fn publish<K>(&self, obj: &K, n: &Notice)
    where
        K: Resource<DynamicType = ()>,
    {
        use kube::runtime::events::{Event, EventType};
        let ev = Event {
            type_: if n.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: n.reason.clone(),
            note: Some(n.message.chars().take(1000).collect()),
            action: n.action.to_string(),
            secondary: None,
        };
        let recorder =
            kube::runtime::events::Recorder::new(self.client.clone(), self.reporter.clone());
        if let Err(e) = recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(object = %object_key(obj), reason = %n.reason, error = %e, "could not publish an event");
        }
    }

    /// Forgets the failures of `key` after a success.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .expect("invariant: lock not poisoned")
            .remove(key);
        self.reported
            .lock()
            .expect("invariant: lock not poisoned")
            .remove(key);
    }
}

/// A Kubernetes Event to publish about a resource (`kubectl describe` shows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub warning: bool,
    pub reason: String,
    pub message: String,
    /// What the operator did or tried: `Create`, `Update`, `Delete`, `Reconcile`,
    /// `Rollout`, `Scale`.
    pub action: &'static str,
}

impl Notice {
    /// A Normal Event: something done, or a wait that is expected to end by itself.
    pub fn normal(reason: impl Into<String>, action: &'static str, message: String) -> Notice {
        Notice {
            warning: false,
            reason: reason.into(),
            message,
            action,
        }
    }
}

/// `Synced=False` reasons that are waits expected to end by themselves: announced as Normal
/// Events. Every other `False` reason is a refusal or a failure, announced as a Warning.
pub const WAIT_REASONS: [&str; 6] = [
    "Paused",
    "WaitingForParent",
    "WaitingForUser",
    "ClusterNotReady",
    "NotFound",
    "Observed",
];

/// The Event for a change of the `Synced` condition between `prev` and `next` (its status
/// or reason), so a refusal, a wait or a recovery is announced once, not on every pass. A
/// first `Synced=True` is not announced: the actions that got there were.
pub fn synced_notice(prev: &[Condition], next: &[Condition]) -> Option<Notice> {
    let n = crate::crd::condition(next, crate::crd::cond::SYNCED)?;
    let p = crate::crd::condition(prev, crate::crd::cond::SYNCED);
    if p.is_some_and(|p| p.status == n.status && p.reason == n.reason) {
        return None;
    }
    let ok = n.status == "True";
    if ok && p.is_none() {
        return None;
    }
    // An empty message is stored as the reason (`set_condition`).
    let plain = n.message.is_empty() || n.message == n.reason;
    let message = match (ok && plain, p) {
        (true, Some(p)) => format!("in sync with the spec again (was {})", p.reason),
        _ => n.message.clone(),
    };
    Some(Notice {
        warning: !ok && !WAIT_REASONS.contains(&n.reason.as_str()),
        reason: n.reason.clone(),
        message,
        action: "Reconcile",
    })
}

/// The Event of a change the operator made to match the spec: `Updated` with `updated` when
/// the spec changed since it was last applied (`generation` ≠ `observed`), otherwise
/// `DriftCorrected` with `drifted` (the broker or the object was changed behind the
/// operator's back).
pub fn change_notice(
    generation: Option<i64>,
    observed: Option<i64>,
    updated: String,
    drifted: String,
) -> Notice {
    if generation == observed {
        Notice::normal("DriftCorrected", "Update", drifted)
    } else {
        Notice::normal("Updated", "Update", updated)
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
///
/// A failure the conditions do not show, the Kubernetes API refusing what the operator
/// sends (e.g. an object someone edited so that the operator's version of it is invalid),
/// is also announced as a Warning Event `ReconcileFailed`, once per distinct message until
/// a reconcile succeeds.
pub fn error_policy<K>(obj: Arc<K>, err: &Error, ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    let key = object_key(&*obj);
    tracing::warn!(object = %key, error = %err, kind = err.metric_label(), "reconcile failed");
    if let Some(message) = kube_failure(err) {
        let new = ctx
            .reported
            .lock()
            .expect("invariant: lock not poisoned")
            .insert(key.clone(), message.clone())
            .as_ref()
            != Some(&message);
        if new {
            let n = Notice {
                warning: true,
                reason: "ReconcileFailed".into(),
                message,
                action: "Reconcile",
            };
            let (ctx, obj) = (ctx.clone(), obj.clone());
            tokio::spawn(async move { ctx.publish(&*obj, &n).await });
        }
    }
    match err {
        Error::Waiting(_) => Action::requeue(ctx.wait_retry),
        Error::Invalid(_) => Action::requeue(ctx.resync),
        _ => Action::requeue(ctx.backoff(&key)),
    }
}

/// What the Kubernetes API answered, when a call to it is what failed: the errors the
/// reconcilers do not write into the conditions themselves (broker failures, waits and
/// refused specs they do).
pub fn kube_failure(err: &Error) -> Option<String> {
    use kube::runtime::finalizer::Error as F;
    let e = match err {
        Error::Kube(e) => e,
        Error::Finalizer(f) => match &**f {
            F::ApplyFailed(e) | F::CleanupFailed(e) => return kube_failure(e),
            F::AddFinalizer(e) | F::RemoveFinalizer(e) => e,
            _ => return None,
        },
        _ => return None,
    };
    Some(match e {
        kube::Error::Api(s) if !s.message.is_empty() => {
            format!(
                "the Kubernetes API refused a call ({}): {}",
                s.code, s.message
            )
        }
        other => format!("a Kubernetes API call failed: {other}"),
    })
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
    fn conditions(&self) -> &[Condition];
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
}

/// A kind this operator reconciles: its status carries conditions.
pub trait Stateful:
    Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug
{
    type Status: Conditions + Clone + Default + PartialEq + Serialize;
    fn status(&self) -> Option<&Self::Status>;
}

macro_rules! stateful {
    ($($k:ty => $s:ty),*) => {$(
        impl Conditions for $s {
            fn conditions(&self) -> &[Condition] {
                &self.conditions
            }
            fn conditions_mut(&mut self) -> &mut Vec<Condition> {
                &mut self.conditions
            }
        }
        impl Stateful for $k {
            type Status = $s;
            fn status(&self) -> Option<&$s> {
                self.status.as_ref()
            }
        }
    )*};
}
stateful!(
    crate::crd::NaradCluster => crate::crd::NaradClusterStatus,
    crate::crd::Topic => crate::crd::TopicStatus,
    crate::crd::User => crate::crd::UserStatus,
    crate::crd::Grant => crate::crd::GrantStatus
);

/// Writes `status` when it differs from the one `obj` carries, and announces a change of
/// its `Synced` condition as an Event ([`synced_notice`]).
pub async fn write_status<K: Stateful>(
    ctx: &Context,
    api: &Api<K>,
    obj: &K,
    status: &K::Status,
) -> Result<()> {
    let prev = obj.status();
    if prev == Some(status) {
        return Ok(());
    }
    patch_status(api, obj, status).await?;
    let before = prev.map(|s| s.conditions()).unwrap_or_default();
    if let Some(n) = synced_notice(before, status.conditions()) {
        ctx.publish(obj, &n).await;
    }
    Ok(())
}

/// A paused resource (see [`paused`]): nothing is created, changed or deleted on the broker or
/// in the cluster, a deletion waits (the finalizer stays), and the status says `Synced=False`
/// with reason `Paused`. Reconciled again when the resource changes (e.g. the annotation goes).
pub async fn hold_paused<K: Stateful>(ctx: &Context, api: &Api<K>, obj: &K) -> Result<Action> {
    let mut s = obj.status().cloned().unwrap_or_default();
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
    write_status(ctx, api, obj, &s).await?;
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

    fn synced(status: bool, reason: &str, message: &str) -> Vec<Condition> {
        let mut c = Vec::new();
        crate::crd::set_condition(
            &mut c,
            crate::crd::cond::SYNCED,
            status,
            reason,
            message,
            Some(1),
            &now(),
        );
        c
    }

    #[test]
    fn a_synced_change_is_announced_once() {
        // The first success: its actions were announced already.
        assert_eq!(synced_notice(&[], &synced(true, "Synced", "")), None);
        // A refusal: a Warning, with the condition's message.
        let refused = synced(false, "Invalid", "partitions may not shrink");
        let n = synced_notice(&synced(true, "Synced", ""), &refused).unwrap();
        assert!(n.warning);
        assert_eq!(
            (n.reason.as_str(), n.message.as_str()),
            ("Invalid", "partitions may not shrink")
        );
        // The same refusal on the next pass: nothing.
        assert_eq!(
            synced_notice(&refused, &synced(false, "Invalid", "other text")),
            None
        );
        // Another reason: announced again.
        let n = synced_notice(&refused, &synced(false, "NotEmpty", "3 waiting")).unwrap();
        assert!(n.warning && n.reason == "NotEmpty");
        // Waits are Normal.
        for wait in WAIT_REASONS {
            let n = synced_notice(&[], &synced(false, wait, "m")).unwrap();
            assert!(!n.warning, "{wait}");
        }
        // A recovery is Normal and says from what.
        let n = synced_notice(&refused, &synced(true, "Synced", "")).unwrap();
        assert!(!n.warning);
        assert_eq!(n.reason, "Synced");
        assert!(n.message.contains("was Invalid"), "{}", n.message);
        // Without a Synced condition there is nothing to announce.
        assert_eq!(synced_notice(&refused, &[]), None);
    }

    #[test]
    fn only_kubernetes_api_failures_are_announced_by_the_error_policy() {
        let refused = || {
            kube::Error::Api(Box::new(kube::core::Status::failure(
                "Service \"prod-narad\" is invalid: spec.ports[1].name: Duplicate value: \"api\"",
                "Invalid",
            ).with_code(422)))
        };
        let m = kube_failure(&Error::Kube(refused())).unwrap();
        assert!(
            m.contains("refused a call (422)") && m.contains("Duplicate value"),
            "{m}"
        );
        let wrapped = Error::Finalizer(Box::new(kube::runtime::finalizer::Error::ApplyFailed(
            Error::Kube(refused()),
        )));
        assert_eq!(kube_failure(&wrapped), Some(m));
        // The reconcilers put these in the conditions (and their Events) themselves.
        for other in [Error::Waiting("w".into()), Error::Invalid("i".into())] {
            assert_eq!(kube_failure(&other), None);
        }
        let inner = Error::Finalizer(Box::new(kube::runtime::finalizer::Error::ApplyFailed(
            Error::Invalid("i".into()),
        )));
        assert_eq!(kube_failure(&inner), None);
    }

    #[test]
    fn changes_are_updates_after_a_spec_change_and_drift_otherwise() {
        let n = |g, o| change_notice(g, o, "u".into(), "d".into());
        for (g, o) in [(Some(3), Some(2)), (Some(3), None)] {
            let n = n(g, o);
            assert_eq!((n.reason.as_str(), n.message.as_str()), ("Updated", "u"));
        }
        let n = n(Some(3), Some(3));
        assert_eq!(
            (n.reason.as_str(), n.message.as_str()),
            ("DriftCorrected", "d")
        );
        assert!(!n.warning && n.action == "Update");
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
