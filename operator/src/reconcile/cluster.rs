//! NaradCluster → StatefulSet, Services, PDB, ConfigMap and security Secret (server-side
//! applied from the pure builders in `resources`), then status from the StatefulSet and the
//! broker's member list (`cluster_status`, pure). Rolling upgrades pick their next pod with
//! `next_rollout_step` (pure).

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event};
use kube::{Api, ResourceExt};
use narad_api::MemberInfo;

use super::*;
use crate::crd::validate::check_cluster;
use crate::crd::{
    cond, set_condition, MemberStatus, NaradCluster, NaradClusterStatus, PvcDeletionPolicy,
    CREDENTIALS_LABEL, CREDENTIALS_LABEL_VALUE, FINALIZER, MANAGER,
};
use crate::resources::{self, StatefulSetOptions};

/// What the status is computed from.
#[derive(Debug, Clone)]
pub struct Observed {
    /// StatefulSet `status.readyReplicas`.
    pub ready_replicas: i32,
    /// StatefulSet `spec.replicas` as applied.
    pub sts_replicas: Option<i32>,
    /// The broker's members, or why they could not be read.
    pub members: Result<Vec<MemberInfo>, String>,
    /// Whether a rollout is in progress (pods on an old template).
    pub rolling: bool,
    /// The rollout halted: a replaced pod was not ready within [`ROLLOUT_STALL`].
    pub stalled: Option<String>,
}

/// How long a replaced pod may take to become ready before the rollout halts.
pub const ROLLOUT_STALL: std::time::Duration = std::time::Duration::from_secs(600);

/// The status (without the recorded immutables) from what was observed.
pub fn cluster_status(
    nc: &NaradCluster,
    prev: &NaradClusterStatus,
    o: &Observed,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> NaradClusterStatus {
    let gen = nc.metadata.generation;
    let want = nc.spec.replicas;
    let mut s = prev.clone();
    s.observed_generation = gen;
    s.ready_replicas = o.ready_replicas;
    s.endpoint = Some(nc.broker_endpoint(None));
    let members = o.members.as_ref().ok().cloned().unwrap_or_default();
    s.members = members
        .iter()
        .map(|m| MemberStatus {
            id: m.id.clone(),
            status: m.status.clone(),
            draining: m.draining,
            owned_partitions: m.owned_partitions,
            version: m.version.clone(),
        })
        .collect();
    s.leader = members.iter().find(|m| m.leader).map(|m| m.id.clone());
    let versions: std::collections::BTreeSet<&str> =
        members.iter().map(|m| m.version.as_str()).collect();
    s.current_version = (versions.len() == 1).then(|| versions.iter().next().unwrap().to_string());
    let alive = members.iter().filter(|m| m.status == "alive").count();
    let quorum = s.leader.is_some() && !members.is_empty() && alive * 2 > members.len();
    let all_ready = o.ready_replicas >= want && o.members.is_ok() && alive == members.len();
    let ever_ran = prev.phase.as_deref().is_some_and(|p| p != "Creating");
    let scaling = o.sts_replicas.is_some_and(|r| r != want)
        || (o.members.is_ok() && members.len() as i32 != want && ever_ran);
    let upgrading = o.rolling
        || s.current_version
            .as_deref()
            .is_some_and(|v| v != nc.spec.version);
    let degraded = o.stalled.is_some()
        || (ever_ran
            && (!quorum || alive < members.len() || o.ready_replicas < want)
            && !upgrading
            && !scaling);
    s.phase = Some(
        if o.stalled.is_some() {
            "Degraded"
        } else if !ever_ran && !all_ready {
            "Creating"
        } else if upgrading {
            "Upgrading"
        } else if scaling {
            "Scaling"
        } else if degraded {
            "Degraded"
        } else if all_ready {
            "Running"
        } else {
            "Creating"
        }
        .to_string(),
    );
    let member_msg = match &o.members {
        Ok(_) => format!(
            "{alive}/{} members alive, {}/{want} pods ready",
            members.len(),
            o.ready_replicas
        ),
        Err(e) => format!("members unknown: {e}"),
    };
    let c = &mut s.conditions;
    set_condition(
        c,
        cond::READY,
        all_ready && quorum,
        if all_ready && quorum {
            "AllMembersReady"
        } else {
            "NotReady"
        },
        &member_msg,
        gen,
        now,
    );
    set_condition(
        c,
        cond::AVAILABLE,
        o.ready_replicas > 0 && quorum,
        if quorum {
            "QuorumAvailable"
        } else {
            "NoQuorum"
        },
        &member_msg,
        gen,
        now,
    );
    set_condition(
        c,
        cond::QUORUM_HEALTHY,
        quorum,
        if quorum { "LeaderElected" } else { "NoLeader" },
        &member_msg,
        gen,
        now,
    );
    set_condition(
        c,
        cond::PROGRESSING,
        upgrading || scaling || !all_ready,
        if upgrading {
            "Upgrading"
        } else if scaling {
            "Scaling"
        } else if all_ready {
            "Stable"
        } else {
            "Starting"
        },
        "",
        gen,
        now,
    );
    set_condition(
        c,
        cond::UPGRADING,
        upgrading && o.stalled.is_none(),
        match (&o.stalled, upgrading) {
            (Some(_), _) => "Stalled",
            (None, true) => "RollingUpdate",
            (None, false) => "UpToDate",
        },
        o.stalled.as_deref().unwrap_or(""),
        gen,
        now,
    );
    set_condition(
        c,
        cond::DEGRADED,
        degraded,
        match (&o.stalled, degraded) {
            (Some(_), _) => "Stalled",
            (None, true) => "MembersUnavailable",
            (None, false) => "Healthy",
        },
        o.stalled.as_deref().unwrap_or(&member_msg),
        gen,
        now,
    );
    s
}

/// One pod as the rollout sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub ordinal: i32,
    pub name: String,
    /// On the StatefulSet's update revision.
    pub updated: bool,
    pub ready: bool,
    pub terminating: bool,
    /// Seconds since the pod was created.
    pub age_secs: i64,
}

/// The rollout's next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutStep {
    /// Every pod runs the current template.
    Done,
    /// A precondition is not met (named).
    Wait(String),
    /// Delete this pod (the StatefulSet controller recreates it on the new template).
    Delete(String),
    /// Halted: this replaced pod was not ready within [`ROLLOUT_STALL`].
    Stalled(String),
}

/// SPEC §10.3: one pod at a time, highest ordinal first, each only when all `replicas` pods
/// exist and are ready, all members are alive, a leader exists and nothing drains; the next
/// waits until the replaced pod is back, ready, and its member reports `version` and `alive`.
pub fn next_rollout_step(
    pods: &[PodView],
    replicas: i32,
    members: &[MemberInfo],
    version: &str,
) -> RolloutStep {
    let mut pods = pods.to_vec();
    pods.sort_by_key(|p| std::cmp::Reverse(p.ordinal));
    if let Some(p) = pods.iter().find(|p| p.terminating) {
        return RolloutStep::Wait(format!("pod {} is terminating", p.name));
    }
    // A deleted pod is gone before the StatefulSet controller recreates it: not a pod less
    // to replace, but one still being replaced.
    if let Some(missing) = (0..replicas).find(|o| !pods.iter().any(|p| p.ordinal == *o)) {
        return RolloutStep::Wait(format!("pod with ordinal {missing} does not exist yet"));
    }
    if let Some(p) = pods.iter().find(|p| !p.ready) {
        if p.updated && p.age_secs >= ROLLOUT_STALL.as_secs() as i64 {
            return RolloutStep::Stalled(format!(
                "pod {} not ready {} s after its replacement",
                p.name, p.age_secs
            ));
        }
        return RolloutStep::Wait(format!("pod {} is not ready", p.name));
    }
    if let Some(p) = pods.iter().find(|p| p.updated) {
        // A replaced pod must have rejoined on the new version before the next goes.
        match members.iter().find(|m| m.id == p.name) {
            Some(m) if m.status == "alive" && m.version == version => {}
            Some(m) => {
                if pods.iter().any(|p| !p.updated) {
                    return RolloutStep::Wait(format!(
                        "member {} is {} on version {}",
                        m.id, m.status, m.version
                    ));
                }
            }
            None => {
                if pods.iter().any(|p| !p.updated) {
                    return RolloutStep::Wait(format!("member {} not reported yet", p.name));
                }
            }
        }
    }
    let Some(next) = pods.iter().find(|p| !p.updated) else {
        return RolloutStep::Done;
    };
    if members.iter().any(|m| m.status != "alive") {
        return RolloutStep::Wait("not all members are alive".into());
    }
    if !members.iter().any(|m| m.leader) {
        return RolloutStep::Wait("no leader".into());
    }
    if members.iter().any(|m| m.draining) {
        return RolloutStep::Wait("a decommission is running".into());
    }
    RolloutStep::Delete(next.name.clone())
}

/// The StatefulSet's replica count now, and what a scale-in needs first (SPEC §6.5, §10.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScaleStep {
    /// Apply this count (scale-out, steady state, or one drained ordinal dropped).
    Replicas(i32),
    /// Keep `keep` replicas and start decommissioning `member` (the highest ordinal).
    Decommission { keep: i32, member: String },
    /// Keep `keep` replicas: waiting (the member drains, or members are unknown).
    Wait { keep: i32, reason: String },
}

impl ScaleStep {
    /// The replica count to apply.
    pub fn replicas(&self) -> i32 {
        match self {
            ScaleStep::Replicas(n) => *n,
            ScaleStep::Decommission { keep, .. } | ScaleStep::Wait { keep, .. } => *keep,
        }
    }
}

/// Scale-out applies `desired` at once (join and rebalance are automatic). Scale-in drops
/// the highest ordinal only once its member is draining and owns nothing, decommissioning
/// it first; never below `initialClusterSize`, nor below 3 once there are 3. Unknown
/// members (`None`) never shrink anything.
pub fn plan_scale(
    fullname: &str,
    desired: i32,
    initial: i32,
    current: Option<i32>,
    members: Option<&[MemberInfo]>,
) -> ScaleStep {
    let Some(current) = current else {
        return ScaleStep::Replicas(desired);
    };
    let floor = if current >= 3 {
        initial.max(3)
    } else {
        initial
    };
    let target = desired.max(floor.min(current));
    if target >= current {
        return ScaleStep::Replicas(target);
    }
    let Some(members) = members else {
        return ScaleStep::Wait {
            keep: current,
            reason: "members unknown".into(),
        };
    };
    let id = format!("{fullname}-{}", current - 1);
    match members.iter().find(|m| m.id == id) {
        None => ScaleStep::Replicas(current - 1),
        Some(m) if m.draining && m.owned_partitions == 0 && m.outbound_moves == 0 => {
            ScaleStep::Replicas(current - 1)
        }
        Some(m) if m.draining => ScaleStep::Wait {
            keep: current,
            reason: format!("{id} still owns {} partitions", m.owned_partitions),
        },
        Some(_) => ScaleStep::Decommission {
            keep: current,
            member: id,
        },
    }
}

/// One PersistentVolumeClaim as the storage growth sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView {
    pub name: String,
    /// `status.phase` is `Bound` (only bound claims may be expanded).
    pub bound: bool,
    /// `spec.resources.requests.storage`.
    pub request: Option<String>,
}

/// `storage.size` grew (SPEC §10.3: it may only grow): the claims to raise to `size`. The
/// StatefulSet's claim template is immutable, so growth is written to each bound claim
/// whose request is smaller; an unbound one is left for a later pass (the API server
/// refuses to resize it), a larger or unparsable one is never touched.
pub fn plan_expansion(claims: &[ClaimView], size: &str) -> Vec<String> {
    let Some(want) = crate::crd::validate::parse_quantity(size) else {
        return Vec::new();
    };
    claims
        .iter()
        .filter(|c| c.bound)
        .filter(|c| {
            c.request
                .as_deref()
                .and_then(crate::crd::validate::parse_quantity)
                .is_some_and(|have| have < want)
        })
        .map(|c| c.name.clone())
        .collect()
}

/// Raises the bound claims of `nc` smaller than `spec.storage.size` to it; returns how many.
async fn expand_claims(ctx: &Context, nc: &NaradCluster, ns: &str) -> Result<usize> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let claims: Vec<ClaimView> = pvcs
        .list(&ListParams::default().labels(&label_selector(nc)))
        .await?
        .items
        .into_iter()
        .map(|p| ClaimView {
            name: p.name_any(),
            bound: p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
            request: p
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .map(|q| q.0.clone()),
        })
        .collect();
    let grow = plan_expansion(&claims, &nc.spec.storage.size);
    let patch =
        serde_json::json!({"spec": {"resources": {"requests": {"storage": nc.spec.storage.size}}}});
    for name in &grow {
        tracing::info!(claim = %name, size = %nc.spec.storage.size, "expanding volume claim");
        pvcs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        ctx.metrics.volume_expansions.inc();
    }
    Ok(grow.len())
}

/// `k=v,…` of the selector labels (pods and claims of `nc`).
fn label_selector(nc: &NaradCluster) -> String {
    resources::selector_labels(nc)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The controller's entry point for NaradClusters.
pub async fn reconcile(nc: Arc<NaradCluster>, ctx: Arc<Context>) -> Result<Action> {
    let ns = nc.namespace().unwrap_or_else(|| "default".into());
    let api: Api<NaradCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let key = object_key(&*nc);
    let r = finalizer(&api, FINALIZER, nc, |event| async {
        match event {
            Event::Apply(c) => apply(&api, &c, &ctx).await,
            Event::Cleanup(c) => cleanup(&c, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if r.is_ok() {
        ctx.succeeded(&key);
    }
    r
}

async fn ssa<K>(api: &Api<K>, obj: &K) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await?;
    Ok(())
}

/// Writes `Ready=False` with `reason` and `msg`, changing nothing else: the spec is refused.
async fn refuse(
    api: &Api<NaradCluster>,
    nc: &NaradCluster,
    prev: &NaradClusterStatus,
    reason: &str,
    msg: &str,
) -> Result<()> {
    let mut s = prev.clone();
    set_condition(
        &mut s.conditions,
        cond::READY,
        false,
        reason,
        msg,
        nc.metadata.generation,
        &now(),
    );
    patch_status(api, nc, &s).await
}

async fn apply(api: &Api<NaradCluster>, nc: &NaradCluster, ctx: &Context) -> Result<Action> {
    let ns = nc.namespace().unwrap_or_else(|| "default".into());
    let prev = nc.status.clone().unwrap_or_default();
    if let Err(msg) = check_cluster(&nc.spec, Some(&prev)) {
        refuse(api, nc, &prev, "Invalid", &msg).await?;
        return Err(Error::Invalid(msg));
    }
    // Nothing is read for, applied for or sent to an endpoint the operator may not use.
    if let Err(msg) = nc.check_endpoint(ctx.cluster_domain.as_deref()) {
        refuse(api, nc, &prev, "EndpointNotAllowed", &msg).await?;
        return Err(Error::Invalid(msg));
    }
    let c = &ctx.client;

    // The Secrets the pods mount, only those the rules of `secrets` allow; the security
    // Secret first, since the pods read it at start.
    if let Err(r) = secrets::check_tls_secret(ctx, nc).await? {
        refuse(api, nc, &prev, r.reason, &r.message).await?;
        return Err(Error::Waiting(r.message));
    }
    // The API-TLS Secret is mounted too, and its ca.crt is what the operator trusts when it
    // calls the brokers: one that is missing or unusable stops here, with its reason.
    if let Some(Err(r)) = secrets::api_tls_secret(ctx, nc).await? {
        refuse(api, nc, &prev, r.reason, &r.message).await?;
        return Err(Error::Waiting(r.message));
    }
    if nc.spec.security.enabled {
        let existing = match secrets::security_secret(ctx, nc).await? {
            Some(Err(r)) => {
                refuse(api, nc, &prev, r.reason, &r.message).await?;
                return Err(Error::Waiting(r.message));
            }
            Some(Ok(s)) => Some(s),
            None => None,
        };
        let missing = resources::missing_security_entries(
            nc,
            existing.as_ref().and_then(|s| s.data.as_ref()),
            &mut resources::random_secret,
        );
        let api_secrets: Api<Secret> = Api::namespaced(c.clone(), &ns);
        let secret_name = nc.security_secret_name();
        match existing {
            None => {
                let user_provided = nc.spec.security.secret_ref.is_some();
                let secret = resources::security_secret(nc, missing, user_provided);
                api_secrets.create(&Default::default(), &secret).await?;
            }
            // Generated keys are added; the Secret this operator created before Secrets
            // were labelled gets the label.
            Some(s) if !missing.is_empty() || !secrets::is_labelled(&s.metadata) => {
                let patch = serde_json::json!({
                    "metadata": {"labels": {CREDENTIALS_LABEL: CREDENTIALS_LABEL_VALUE}},
                    "data": missing,
                });
                api_secrets
                    .patch(&secret_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Some(_) => {}
        }
    }

    if let Some(cm) = resources::configmap(nc) {
        ssa(&Api::<ConfigMap>::namespaced(c.clone(), &ns), &cm).await?;
    }
    let services: Api<Service> = Api::namespaced(c.clone(), &ns);
    ssa(&services, &resources::headless_service(nc)).await?;
    ssa(&services, &resources::client_service(nc)).await?;
    let pdb_ar = resources::pdb_api_resource(&ctx.pdb_api_version);
    let pdbs: Api<DynamicObject> = Api::namespaced_with(c.clone(), &ns, &pdb_ar);
    let pdb = resources::pdb_dynamic(nc, &ctx.pdb_api_version);
    pdbs.patch(
        &nc.fullname(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&pdb),
    )
    .await?;

    let stss: Api<StatefulSet> = Api::namespaced(c.clone(), &ns);
    let current = stss.get_opt(&nc.fullname()).await?;
    let claim_size = current
        .as_ref()
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.volume_claim_templates.as_ref())
        .and_then(|v| v.first())
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone());
    // Members, best effort: the broker may not run yet.
    let broker = broker_for(ctx, &ns, &nc.name_any()).await?;
    let members = match &broker {
        Ok(b) => b.client.members().await.map_err(|e| e.to_string()),
        Err(u) => Err(format!("{u:?}")),
    };
    let step = plan_scale(
        &nc.fullname(),
        nc.spec.replicas,
        nc.spec.effective_initial_cluster_size(),
        current
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.replicas),
        members.as_deref().ok(),
    );
    if let (ScaleStep::Decommission { member, .. }, Ok(b)) = (&step, &broker) {
        tracing::info!(%member, "scale-in: decommissioning");
        b.client.decommission(member).await?;
    }
    let opts = StatefulSetOptions {
        cluster_domain: ctx
            .cluster_domain
            .clone()
            .unwrap_or_else(|| resources::DEFAULT_CLUSTER_DOMAIN.into()),
        claim_size,
        replicas: Some(step.replicas()),
    };
    let sts = resources::statefulset(nc, &opts).map_err(Error::Invalid)?;
    ssa(&stss, &sts).await?;
    let sts = stss.get(&nc.fullname()).await?;
    let st = sts.status.clone().unwrap_or_default();
    // `currentRevision` is not advanced for `OnDelete` StatefulSets by every server version;
    // the pods themselves say whether the rollout is done (below).
    let mut rolling = st.update_revision.is_some() && st.current_revision != st.update_revision;
    let mut observed = Observed {
        ready_replicas: st.ready_replicas.unwrap_or(0),
        sts_replicas: sts.spec.as_ref().and_then(|s| s.replicas),
        members: members.clone(),
        rolling,
        stalled: None,
    };
    if rolling {
        match roll_one(ctx, nc, &ns, &sts, members.as_deref().unwrap_or(&[])).await? {
            RolloutStep::Stalled(why) => {
                tracing::warn!(reason = %why, "rolling upgrade stalled");
                observed.stalled = Some(why);
            }
            RolloutStep::Done => {
                rolling = false;
                observed.rolling = false;
            }
            RolloutStep::Wait(why) => tracing::debug!(reason = %why, "rolling upgrade waits"),
            RolloutStep::Delete(_) => {}
        }
    }
    // Storage growth goes to the claims; a refusal (e.g. a class without
    // allowVolumeExpansion) is returned after the status is written, and retried.
    let expanded = expand_claims(ctx, nc, &ns).await;
    let mut status = cluster_status(nc, &prev, &observed, &now());
    status.initial_cluster_size = Some(nc.spec.effective_initial_cluster_size());
    status.storage_size = Some(nc.spec.storage.size.clone());
    if nc.status.as_ref() != Some(&status) {
        patch_status(api, nc, &status).await?;
    }
    expanded?;
    // A rollout re-checks its preconditions often (the members' versions and liveness are
    // not Kubernetes events); otherwise the periodic resync.
    let every = if rolling { 5 } else { 30 };
    Ok(Action::requeue(
        std::time::Duration::from_secs(every).min(ctx.resync),
    ))
}

/// Deletes the next pod of a rollout, when `next_rollout_step` says so; returns the step.
async fn roll_one(
    ctx: &Context,
    nc: &NaradCluster,
    ns: &str,
    sts: &StatefulSet,
    members: &[MemberInfo],
) -> Result<RolloutStep> {
    let revision = sts
        .status
        .as_ref()
        .and_then(|s| s.update_revision.clone())
        .unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let sel = label_selector(nc);
    let prefix = format!("{}-", nc.fullname());
    let views: Vec<PodView> = pods
        .list(&ListParams::default().labels(&sel))
        .await?
        .items
        .into_iter()
        .filter_map(|p| {
            let name = p.name_any();
            let ordinal = name.strip_prefix(&prefix)?.parse().ok()?;
            let labels = p.metadata.labels.clone().unwrap_or_default();
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Some(PodView {
                ordinal,
                updated: labels.get("controller-revision-hash") == Some(&revision),
                ready,
                terminating: p.metadata.deletion_timestamp.is_some(),
                age_secs: p
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| now().0.as_second() - t.0.as_second())
                    .unwrap_or(0),
                name,
            })
        })
        .collect();
    let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    let step = next_rollout_step(&views, replicas, members, &nc.spec.version);
    if let RolloutStep::Delete(name) = &step {
        tracing::info!(pod = %name, "rolling upgrade: deleting pod");
        pods.delete(name, &DeleteParams::default()).await?;
        ctx.metrics.rollout_pod_deletions.inc();
    }
    Ok(step)
}

async fn cleanup(nc: &NaradCluster, ctx: &Context) -> Result<Action> {
    if nc.spec.pvc_deletion_policy == PvcDeletionPolicy::Delete {
        let ns = nc.namespace().unwrap_or_else(|| "default".into());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        let sel = label_selector(nc);
        pvcs.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&sel),
        )
        .await?;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::cluster;
    use serde_json::json;

    fn member(id: &str, status: &str, leader: bool, version: &str) -> MemberInfo {
        MemberInfo {
            id: id.into(),
            addr: String::new(),
            status: status.into(),
            draining: false,
            owned_partitions: 1,
            outbound_moves: 0,
            leader,
            version: version.into(),
        }
    }

    fn healthy(v: &str) -> Vec<MemberInfo> {
        vec![
            member("prod-narad-0", "alive", false, v),
            member("prod-narad-1", "alive", true, v),
            member("prod-narad-2", "alive", false, v),
        ]
    }

    fn t() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(100).unwrap(),
        )
    }

    #[test]
    fn status_running() {
        let nc = cluster(json!({"version": "1.4.0"}));
        let o = Observed {
            ready_replicas: 3,
            sts_replicas: Some(3),
            members: Ok(healthy("1.4.0")),
            rolling: false,
            stalled: None,
        };
        let s = cluster_status(&nc, &Default::default(), &o, &t());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.leader.as_deref(), Some("prod-narad-1"));
        assert_eq!(s.current_version.as_deref(), Some("1.4.0"));
        assert_eq!(s.members.len(), 3);
        assert_eq!(
            s.endpoint.as_deref(),
            Some("http://prod-narad.default.svc:7942")
        );
        assert!(crate::crd::is_true(&s.conditions, cond::READY));
        assert!(crate::crd::is_true(&s.conditions, cond::QUORUM_HEALTHY));
        assert!(!crate::crd::is_true(&s.conditions, cond::DEGRADED));
    }

    #[test]
    fn status_endpoint_is_https_with_api_tls() {
        let nc = cluster(json!({"version": "1.4.0",
            "security": {"apiTLSSecretRef": {"name": "api-tls"}}}));
        let o = Observed {
            ready_replicas: 0,
            sts_replicas: Some(3),
            members: Err("starting".into()),
            rolling: false,
            stalled: None,
        };
        let s = cluster_status(&nc, &Default::default(), &o, &t());
        assert_eq!(
            s.endpoint.as_deref(),
            Some("https://prod-narad.default.svc:7942")
        );
    }

    #[test]
    fn status_creating_then_degraded() {
        let nc = cluster(json!({"version": "1.4.0"}));
        let o = Observed {
            ready_replicas: 0,
            sts_replicas: Some(3),
            members: Err("connection refused".into()),
            rolling: false,
            stalled: None,
        };
        let s = cluster_status(&nc, &Default::default(), &o, &t());
        assert_eq!(s.phase.as_deref(), Some("Creating"));
        assert!(!crate::crd::is_true(&s.conditions, cond::READY));
        let running = NaradClusterStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        let mut m = healthy("1.4.0");
        m[2].status = "dead".into();
        let o = Observed {
            ready_replicas: 2,
            sts_replicas: Some(3),
            members: Ok(m),
            rolling: false,
            stalled: None,
        };
        let s = cluster_status(&nc, &running, &o, &t());
        assert_eq!(s.phase.as_deref(), Some("Degraded"));
        assert!(crate::crd::is_true(&s.conditions, cond::DEGRADED));
        assert!(
            crate::crd::is_true(&s.conditions, cond::QUORUM_HEALTHY),
            "2 of 3 alive"
        );
    }

    #[test]
    fn status_upgrading_and_scaling() {
        let running = NaradClusterStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        let nc = cluster(json!({"version": "1.5.0"}));
        let o = Observed {
            ready_replicas: 3,
            sts_replicas: Some(3),
            members: Ok(healthy("1.4.0")),
            rolling: true,
            stalled: None,
        };
        let s = cluster_status(&nc, &running, &o, &t());
        assert_eq!(s.phase.as_deref(), Some("Upgrading"));
        assert!(crate::crd::is_true(&s.conditions, cond::UPGRADING));
        let nc = cluster(json!({"version": "1.4.0", "replicas": 5}));
        let o = Observed {
            ready_replicas: 3,
            sts_replicas: Some(5),
            members: Ok(healthy("1.4.0")),
            rolling: false,
            stalled: None,
        };
        assert_eq!(
            cluster_status(&nc, &running, &o, &t()).phase.as_deref(),
            Some("Scaling")
        );
    }

    #[test]
    fn scale_out_at_once_scale_in_after_decommission() {
        let m = healthy("1");
        assert_eq!(
            plan_scale("prod-narad", 3, 3, None, None),
            ScaleStep::Replicas(3)
        );
        assert_eq!(
            plan_scale("prod-narad", 5, 3, Some(3), Some(&m)),
            ScaleStep::Replicas(5)
        );
        assert_eq!(
            plan_scale("prod-narad", 3, 3, Some(3), Some(&m)),
            ScaleStep::Replicas(3)
        );
        let mut five = m.clone();
        five.push(member("prod-narad-3", "alive", false, "1"));
        five.push(member("prod-narad-4", "alive", false, "1"));
        // 5 → 4: decommission the highest ordinal first, keep 5 meanwhile.
        assert_eq!(
            plan_scale("prod-narad", 4, 3, Some(5), Some(&five)),
            ScaleStep::Decommission {
                keep: 5,
                member: "prod-narad-4".into()
            }
        );
        five[4].draining = true;
        assert!(matches!(
            plan_scale("prod-narad", 4, 3, Some(5), Some(&five)),
            ScaleStep::Wait { keep: 5, .. }
        ));
        five[4].owned_partitions = 0;
        assert_eq!(
            plan_scale("prod-narad", 4, 3, Some(5), Some(&five)),
            ScaleStep::Replicas(4)
        );
        // Unknown members never shrink anything.
        assert!(matches!(
            plan_scale("prod-narad", 3, 3, Some(5), None),
            ScaleStep::Wait { keep: 5, .. }
        ));
    }

    #[test]
    fn scale_in_never_below_the_floor() {
        let m = healthy("1");
        assert_eq!(
            plan_scale("prod-narad", 1, 3, Some(3), Some(&m)),
            ScaleStep::Replicas(3)
        );
        let mut seven: Vec<MemberInfo> = (0..7)
            .map(|i| member(&format!("prod-narad-{i}"), "alive", i == 0, "1"))
            .collect();
        for x in seven.iter_mut().skip(5) {
            x.draining = true;
            x.owned_partitions = 0;
        }
        // initialClusterSize 5: 7 → 5 at most, one ordinal at a time.
        assert_eq!(
            plan_scale("prod-narad", 3, 5, Some(7), Some(&seven)),
            ScaleStep::Replicas(6)
        );
        assert_eq!(
            plan_scale("prod-narad", 3, 5, Some(5), Some(&seven)),
            ScaleStep::Replicas(5)
        );
    }

    fn pod(ordinal: i32, updated: bool, ready: bool) -> PodView {
        PodView {
            ordinal,
            name: format!("prod-narad-{ordinal}"),
            updated,
            ready,
            terminating: false,
            age_secs: 30,
        }
    }

    #[test]
    fn rollout_highest_ordinal_first_one_at_a_time() {
        let pods = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, true),
        ];
        assert_eq!(
            next_rollout_step(&pods, 3, &healthy("1.4.0"), "1.5.0"),
            RolloutStep::Delete("prod-narad-2".into())
        );
        // 2 deleted and not recreated yet: wait (never 1 meanwhile).
        let gone = vec![pod(0, false, true), pod(1, false, true)];
        assert!(matches!(
            next_rollout_step(&gone, 3, &healthy("1.4.0"), "1.5.0"),
            RolloutStep::Wait(_)
        ));
        // 2 replaced and ready, but its member still reports the old version: wait.
        let pods = vec![pod(0, false, true), pod(1, false, true), pod(2, true, true)];
        assert!(matches!(
            next_rollout_step(&pods, 3, &healthy("1.4.0"), "1.5.0"),
            RolloutStep::Wait(_)
        ));
        let mut m = healthy("1.4.0");
        m[2].version = "1.5.0".into();
        assert_eq!(
            next_rollout_step(&pods, 3, &m, "1.5.0"),
            RolloutStep::Delete("prod-narad-1".into())
        );
        let all = vec![pod(0, true, true), pod(1, true, true), pod(2, true, true)];
        assert_eq!(
            next_rollout_step(&all, 3, &healthy("1.5.0"), "1.5.0"),
            RolloutStep::Done
        );
    }

    #[test]
    fn rollout_stalls_after_ten_minutes() {
        let mut pods = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, true, false),
        ];
        assert!(matches!(
            next_rollout_step(&pods, 3, &healthy("1"), "2"),
            RolloutStep::Wait(_)
        ));
        pods[2].age_secs = 601;
        assert!(matches!(
            next_rollout_step(&pods, 3, &healthy("1"), "2"),
            RolloutStep::Stalled(_)
        ));
        // An old pod that is merely not ready is waited for, not a stall.
        let mut old = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, false),
        ];
        old[2].age_secs = 10_000;
        assert!(matches!(
            next_rollout_step(&old, 3, &healthy("1"), "2"),
            RolloutStep::Wait(_)
        ));

        let running = NaradClusterStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        let nc = cluster(json!({"version": "2"}));
        let o = Observed {
            ready_replicas: 2,
            sts_replicas: Some(3),
            members: Ok(healthy("1")),
            rolling: true,
            stalled: Some("pod prod-narad-2 not ready".into()),
        };
        let s = cluster_status(&nc, &running, &o, &t());
        assert_eq!(s.phase.as_deref(), Some("Degraded"));
        let up = crate::crd::condition(&s.conditions, cond::UPGRADING).unwrap();
        assert_eq!(
            (up.status.as_str(), up.reason.as_str()),
            ("False", "Stalled")
        );
        let dg = crate::crd::condition(&s.conditions, cond::DEGRADED).unwrap();
        assert_eq!(
            (dg.status.as_str(), dg.reason.as_str()),
            ("True", "Stalled")
        );
    }

    #[test]
    fn storage_growth_expands_bound_smaller_claims_only() {
        let claim = |name: &str, bound: bool, request: Option<&str>| ClaimView {
            name: name.into(),
            bound,
            request: request.map(Into::into),
        };
        let claims = vec![
            claim("data-prod-narad-0", true, Some("10Gi")),
            claim("data-prod-narad-1", true, Some("20Gi")),
            claim("data-prod-narad-2", false, Some("10Gi")),
            claim("data-prod-narad-3", true, Some("30Gi")),
            claim("data-prod-narad-4", true, None),
        ];
        assert_eq!(
            plan_expansion(&claims, "20Gi"),
            vec!["data-prod-narad-0".to_string()]
        );
        // 0.02Ti is larger than 20Gi.
        assert_eq!(
            plan_expansion(&claims, "0.02Ti"),
            vec!["data-prod-narad-0".to_string(), "data-prod-narad-1".into()]
        );
        assert!(plan_expansion(&claims, "10Gi").is_empty());
        assert!(plan_expansion(&claims, "lots").is_empty());
    }

    #[test]
    fn rollout_waits_for_health() {
        let pods = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, false),
        ];
        assert!(matches!(
            next_rollout_step(&pods, 3, &healthy("1"), "2"),
            RolloutStep::Wait(_)
        ));
        let pods = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, true),
        ];
        let mut dead = healthy("1");
        dead[0].status = "dead".into();
        assert!(matches!(
            next_rollout_step(&pods, 3, &dead, "2"),
            RolloutStep::Wait(_)
        ));
        let mut leaderless = healthy("1");
        leaderless[1].leader = false;
        assert!(matches!(
            next_rollout_step(&pods, 3, &leaderless, "2"),
            RolloutStep::Wait(_)
        ));
        let mut draining = healthy("1");
        draining[0].draining = true;
        assert!(matches!(
            next_rollout_step(&pods, 3, &draining, "2"),
            RolloutStep::Wait(_)
        ));
        let mut term = pods.clone();
        term[2].terminating = true;
        assert!(matches!(
            next_rollout_step(&term, 3, &healthy("1"), "2"),
            RolloutStep::Wait(_)
        ));
    }
}
