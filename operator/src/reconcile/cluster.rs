//! NaradCluster → StatefulSet, Services, PDB, ConfigMap and security Secret (server-side
//! applied from the pure builders in `resources`), then status from the StatefulSet and the
//! broker's member list (`cluster_status`, pure). Rolling upgrades pick their next pod with
//! `next_rollout_step` (pure).

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
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

/// What a scale or rollout step waits for, or does now: a condition reason (PascalCase)
/// and a message naming the pod or member and why. Messages carry nothing that changes
/// by itself (no ages): a status that changed on every pass would reconcile in a loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Why {
    pub reason: &'static str,
    pub message: String,
}

impl Why {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Why {
        Why {
            reason,
            message: message.into(),
        }
    }
}

/// Reasons that name an action taken in this pass (one Event each), not a wait.
pub const ACTION_REASONS: [&str; 3] = ["ReplacingPod", "ReplacingNotReadyPod", "Decommissioning"];

/// What the status is computed from.
#[derive(Debug, Clone)]
pub struct Observed {
    /// StatefulSet `status.readyReplicas`.
    pub ready_replicas: i32,
    /// StatefulSet `spec.replicas` as applied.
    pub sts_replicas: Option<i32>,
    /// The broker's members, or why they could not be read.
    pub members: Result<Vec<MemberInfo>, String>,
    /// Whether a rollout is in progress: a pod (below `spec.replicas`) carries a
    /// `controller-revision-hash` other than the StatefulSet's `status.updateRevision`
    /// ([`rollout_pending`]).
    pub rolling: bool,
    /// The rollout halted: a replaced pod was not ready within [`ROLLOUT_STALL`].
    pub stalled: Option<String>,
    /// What the rollout waits for, or the pod it replaced in this pass.
    pub rollout: Option<Why>,
    /// What the scale step waits for, or the member it started decommissioning.
    pub scale: Option<Why>,
}

impl Observed {
    /// Nothing in progress: `ready` pods of `sts_replicas`, these members.
    pub fn steady(
        ready_replicas: i32,
        sts_replicas: Option<i32>,
        members: Result<Vec<MemberInfo>, String>,
    ) -> Observed {
        Observed {
            ready_replicas,
            sts_replicas,
            members,
            rolling: false,
            stalled: None,
            rollout: None,
            scale: None,
        }
    }
}

/// How long a replaced pod may take to become ready before the rollout halts.
pub const ROLLOUT_STALL: std::time::Duration = std::time::Duration::from_secs(600);

/// The requeue while a scale or rollout step is in progress (members' liveness, versions
/// and drains are not Kubernetes events, and a drained member must leave the client
/// Service's pods soon after it left the cluster).
pub const PROGRESS_REQUEUE: std::time::Duration = std::time::Duration::from_secs(3);
/// The requeue otherwise (capped by the resync period).
pub const STEADY_REQUEUE: std::time::Duration = std::time::Duration::from_secs(30);

/// When to look again after a pass that computed `status` from `o`: soon while anything
/// moves (a rollout, a scale step, pods or members not there yet), else the steady period.
/// A stalled rollout waits for a person, so it is not polled quickly.
pub fn requeue_after(status: &NaradClusterStatus, o: &Observed) -> std::time::Duration {
    if o.stalled.is_some() {
        return STEADY_REQUEUE;
    }
    let moving = o.rolling
        || o.scale.is_some()
        || matches!(
            status.phase.as_deref(),
            Some("Creating" | "Scaling" | "Upgrading")
        );
    if moving {
        PROGRESS_REQUEUE
    } else {
        STEADY_REQUEUE
    }
}

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
    let majority_alive = !members.is_empty() && alive * 2 > members.len();
    let quorum = s.leader.is_some() && majority_alive;
    let all_ready = o.ready_replicas >= want && o.members.is_ok() && alive == members.len();
    let ever_ran = prev.phase.as_deref().is_some_and(|p| p != "Creating");
    let scaling = o.sts_replicas.is_some_and(|r| r != want)
        || o.scale.is_some()
        || (o.members.is_ok() && members.len() as i32 != want && ever_ran);
    let upgrading = o.rolling
        || s.current_version
            .as_deref()
            .is_some_and(|v| v != nc.spec.version);
    // A step ends when its last new pod is ready: the replaced or added pod is on the update
    // revision and registered before its readiness passes, and that is not a degradation.
    // Nor are two things that replacing a pod brings with it: a leader election (the
    // replaced pod was the leader: no leader for a moment, a majority still alive) and a
    // members call that failed (the Service routed it to the pod going away). Only a
    // majority of the members known to be down ends the step's benefit of the doubt; a pod
    // that never becomes ready is `stalled`.
    let finishing = match prev.phase.as_deref() {
        Some(p @ ("Upgrading" | "Scaling"))
            if (majority_alive || o.members.is_err()) && o.ready_replicas < want =>
        {
            Some(p)
        }
        _ => None,
    }
    .filter(|_| o.stalled.is_none());
    let degraded = o.stalled.is_some()
        || (ever_ran
            && (!quorum || alive < members.len() || o.ready_replicas < want)
            && !upgrading
            && !scaling
            && finishing.is_none());
    s.phase = Some(
        if o.stalled.is_some() {
            "Degraded"
        } else if !ever_ran && !all_ready {
            "Creating"
        } else if upgrading {
            "Upgrading"
        } else if scaling {
            "Scaling"
        } else if let Some(p) = finishing {
            p
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
    // Progressing names the step that moves (or waits) now: the scale step first, since a
    // rollout does not replace pods while a member drains.
    let rollout = o.rollout.as_ref().filter(|_| upgrading);
    let (p_reason, p_msg) = match (&o.scale, rollout) {
        (Some(w), _) => (w.reason, w.message.as_str()),
        (None, Some(w)) => (w.reason, w.message.as_str()),
        (None, None) if upgrading => ("Upgrading", ""),
        (None, None) if scaling => ("Scaling", member_msg.as_str()),
        (None, None) if all_ready => ("Stable", ""),
        (None, None) => ("Starting", member_msg.as_str()),
    };
    set_condition(
        c,
        cond::PROGRESSING,
        upgrading || scaling || !all_ready,
        p_reason,
        p_msg,
        gen,
        now,
    );
    let (u_reason, u_msg) = match (&o.stalled, upgrading, rollout) {
        (Some(m), _, _) => ("Stalled", m.as_str()),
        (None, true, Some(w)) => (w.reason, w.message.as_str()),
        (None, true, None) => ("RollingUpdate", ""),
        (None, false, _) => ("UpToDate", ""),
    };
    set_condition(
        c,
        cond::UPGRADING,
        upgrading && o.stalled.is_none(),
        u_reason,
        u_msg,
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
    // The spec was accepted and applied (a refusal or a pause sets it False).
    set_condition(c, cond::SYNCED, true, "Synced", "", gen, now);
    s
}

/// The Events of a pass: every action (a pod replaced, a decommission started) and every
/// wait whose reason differs from the reason the previous status recorded for it
/// (`Upgrading` for the rollout, `Progressing` for the scale step), so a wait that lasts is
/// announced once, not on every pass.
pub fn notices(prev: &NaradClusterStatus, o: &Observed) -> Vec<Notice> {
    let prev_reason =
        |t: &str| crate::crd::condition(&prev.conditions, t).map(|c| c.reason.as_str());
    let mut out = Vec::new();
    if let Some(m) = &o.stalled {
        if prev_reason(cond::UPGRADING) != Some("Stalled") {
            out.push(Notice {
                warning: true,
                reason: "Stalled".into(),
                message: m.clone(),
                action: "Rollout",
            });
        }
    } else if let Some(w) = &o.rollout {
        if ACTION_REASONS.contains(&w.reason) || prev_reason(cond::UPGRADING) != Some(w.reason) {
            out.push(Notice {
                warning: false,
                reason: w.reason.into(),
                message: w.message.clone(),
                action: "Rollout",
            });
        }
    }
    if let Some(w) = &o.scale {
        if ACTION_REASONS.contains(&w.reason) || prev_reason(cond::PROGRESSING) != Some(w.reason) {
            out.push(Notice {
                warning: false,
                reason: w.reason.into(),
                message: w.message.clone(),
                action: "Scale",
            });
        }
    }
    out
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
    /// What keeps a container from running, as the kubelet says ([`waiting`]).
    pub waiting: Option<String>,
}

/// The first container (init containers first) the kubelet reports waiting, with its
/// reason and message: `container narad: ImagePullBackOff (Back-off pulling image ...)`.
pub fn waiting(p: &Pod) -> Option<String> {
    let st = p.status.as_ref()?;
    let init = st.init_container_statuses.iter().flatten();
    init.chain(st.container_statuses.iter().flatten())
        .find_map(|c| {
            let w = c.state.as_ref()?.waiting.as_ref()?;
            let reason = w.reason.as_deref().unwrap_or("Waiting");
            Some(match w.message.as_deref().filter(|m| !m.is_empty()) {
                Some(m) => format!("container {}: {reason} ({m})", c.name),
                None => format!("container {}: {reason}", c.name),
            })
        })
}

impl PodView {
    /// ` (container narad: ErrImagePull ...)`, or nothing.
    fn why_not_ready(&self) -> String {
        self.waiting
            .as_ref()
            .map(|w| format!(": {w}"))
            .unwrap_or_default()
    }
}

/// The pods of the StatefulSet `<prefix><ordinal>` as the rollout sees them: `updated` when
/// the pod's `controller-revision-hash` label is `update_revision` (with `OnDelete` the
/// StatefulSet's `currentRevision` never advances, so only the pods say what runs).
pub fn pod_views(
    pods: &[Pod],
    prefix: &str,
    update_revision: Option<&str>,
    now_secs: i64,
) -> Vec<PodView> {
    pods.iter()
        .filter_map(|p| {
            let name = p.name_any();
            let ordinal = name.strip_prefix(prefix)?.parse().ok()?;
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let revision = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("controller-revision-hash"))
                .map(String::as_str);
            Some(PodView {
                ordinal,
                updated: update_revision.is_some() && revision == update_revision,
                ready,
                terminating: p.metadata.deletion_timestamp.is_some(),
                age_secs: p
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| now_secs - t.0.as_second())
                    .unwrap_or(0),
                waiting: waiting(p),
                name,
            })
        })
        .collect()
}

/// Whether a rollout is pending: the StatefulSet has an update revision and a pod below
/// `replicas` is not on it (pods above are being removed by a scale-in).
pub fn rollout_pending(update_revision: Option<&str>, pods: &[PodView], replicas: i32) -> bool {
    update_revision.is_some() && pods.iter().any(|p| p.ordinal < replicas && !p.updated)
}

/// The rollout's next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutStep {
    /// Every pod runs the current template.
    Done,
    /// A precondition is not met (reason and message name the pod or member).
    Wait(Why),
    /// Delete `pod` (the StatefulSet controller recreates it on the new template).
    Delete { pod: String, why: Why },
    /// Halted: this replaced pod was not ready within [`ROLLOUT_STALL`].
    Stalled(String),
}

/// SPEC §10.3: one pod at a time, highest ordinal first, each only when all `replicas` pods
/// exist and are ready, all members are alive, a leader exists and nothing drains; the next
/// waits until every replaced pod is back, ready, and its member reports `version` and
/// `alive`. A not-ready pod of the old revision is replaced first (it serves nothing, and
/// the new template may be what it needs, e.g. requests that fit), unless its member
/// drains or another member is not alive (replacing it could then cost the quorum).
/// Pods at or above `replicas` (leaving in a scale-in) are never replaced. `members` is
/// `None` when they could not be read: then only not-ready old pods are replaced.
pub fn next_rollout_step(
    pods: &[PodView],
    replicas: i32,
    members: Option<&[MemberInfo]>,
    version: &str,
) -> RolloutStep {
    let mut pods = pods.to_vec();
    pods.sort_by_key(|p| std::cmp::Reverse(p.ordinal));
    if let Some(p) = pods.iter().find(|p| p.terminating) {
        return RolloutStep::Wait(Why::new(
            "PodTerminating",
            format!("pod {} is terminating", p.name),
        ));
    }
    pods.retain(|p| p.ordinal < replicas);
    // A deleted pod is gone before the StatefulSet controller recreates it: not a pod less
    // to replace, but one still being replaced.
    if let Some(missing) = (0..replicas).find(|o| !pods.iter().any(|p| p.ordinal == *o)) {
        return RolloutStep::Wait(Why::new(
            "PodMissing",
            format!("the pod with ordinal {missing} does not exist yet"),
        ));
    }
    if let Some(p) = pods.iter().find(|p| !p.ready && p.updated) {
        if p.age_secs >= ROLLOUT_STALL.as_secs() as i64 {
            return RolloutStep::Stalled(format!(
                "pod {} not ready {} s after its replacement{}",
                p.name,
                p.age_secs,
                p.why_not_ready()
            ));
        }
        return RolloutStep::Wait(Why::new(
            "PodNotReady",
            format!(
                "pod {} (new revision) is not ready yet{}",
                p.name,
                p.why_not_ready()
            ),
        ));
    }
    let known = members.unwrap_or(&[]);
    if let Some(p) = pods.iter().find(|p| !p.ready) {
        // Not ready and on the old revision.
        if let Some(m) = known.iter().find(|m| m.id == p.name && m.draining) {
            return RolloutStep::Wait(Why::new(
                "DecommissionRunning",
                format!(
                    "pod {} is not ready and member {} is draining (decommission); it is not \
                     replaced mid-drain",
                    p.name, m.id
                ),
            ));
        }
        if let Some(m) = known.iter().find(|m| m.id != p.name && m.status != "alive") {
            return RolloutStep::Wait(Why::new(
                "MemberNotAlive",
                format!(
                    "pod {} (old revision) is not ready, but member {} is {}: replacing {} \
                     now could cost the quorum",
                    p.name, m.id, m.status, p.name
                ),
            ));
        }
        return RolloutStep::Delete {
            pod: p.name.clone(),
            why: Why::new(
                "ReplacingNotReadyPod",
                format!(
                    "replacing pod {} first: it is not ready and on the old revision",
                    p.name
                ),
            ),
        };
    }
    let old = pods.iter().filter(|p| !p.updated).count();
    if old == 0 {
        return RolloutStep::Done;
    }
    let Some(members) = members else {
        return RolloutStep::Wait(Why::new(
            "MembersUnknown",
            "the cluster's members could not be read: no ready pod is replaced without them",
        ));
    };
    // Every replaced pod must have rejoined on the new version before the next goes.
    for p in pods.iter().filter(|p| p.updated) {
        match members.iter().find(|m| m.id == p.name) {
            Some(m) if m.status == "alive" && m.version == version => {}
            Some(m) => {
                return RolloutStep::Wait(Why::new(
                    "MemberNotRejoined",
                    format!(
                        "member {} is {} on version {}; waiting for it alive on {version}",
                        m.id, m.status, m.version
                    ),
                ))
            }
            None => {
                return RolloutStep::Wait(Why::new(
                    "MemberNotRejoined",
                    format!("member {} is not reported by the cluster yet", p.name),
                ))
            }
        }
    }
    if let Some(m) = members.iter().find(|m| m.status != "alive") {
        return RolloutStep::Wait(Why::new(
            "MemberNotAlive",
            format!("member {} is {}", m.id, m.status),
        ));
    }
    if !members.iter().any(|m| m.leader) {
        return RolloutStep::Wait(Why::new("NoLeader", "the cluster has no leader"));
    }
    if let Some(m) = members.iter().find(|m| m.draining) {
        return RolloutStep::Wait(Why::new(
            "DecommissionRunning",
            format!("member {} is draining (decommission)", m.id),
        ));
    }
    let next = pods.iter().find(|p| !p.updated).expect("old > 0");
    RolloutStep::Delete {
        pod: next.name.clone(),
        why: Why::new(
            "ReplacingPod",
            format!(
                "replacing pod {} ({old} of {} pods on the old revision)",
                next.name,
                pods.len()
            ),
        ),
    }
}

/// The StatefulSet's replica count now, and what a scale-in needs first (SPEC §6.5, §10.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScaleStep {
    /// Apply this count (scale-out, steady state, or one drained ordinal dropped).
    Replicas(i32),
    /// Keep `keep` replicas and start decommissioning `member` (the highest ordinal).
    Decommission { keep: i32, member: String },
    /// Keep `keep` replicas: waiting (the member drains, leaves the voters and members, or
    /// members are unknown).
    Wait { keep: i32, why: Why },
}

impl ScaleStep {
    /// The replica count to apply.
    pub fn replicas(&self) -> i32 {
        match self {
            ScaleStep::Replicas(n) => *n,
            ScaleStep::Decommission { keep, .. } | ScaleStep::Wait { keep, .. } => *keep,
        }
    }

    /// What the step waits for or does, for the conditions and Events (`None`: nothing).
    pub fn why(&self) -> Option<Why> {
        match self {
            ScaleStep::Replicas(_) => None,
            ScaleStep::Decommission { member, .. } => Some(Why::new(
                "Decommissioning",
                format!("decommissioning member {member} before its pod is removed"),
            )),
            ScaleStep::Wait { why, .. } => Some(why.clone()),
        }
    }
}

/// Scale-out applies `desired` at once (join and rebalance are automatic). Scale-in drops
/// the highest ordinal only once its member has left the cluster (SPEC §10.3: drained,
/// removed from the voters, then from the members; the broker does both), decommissioning
/// it first; never below `initialClusterSize`, nor below 3 once there are 3. Unknown
/// members (`None`) never shrink anything. A pod removed while its member is still a
/// voter would leave a dead voter behind.
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
            why: Why::new(
                "MembersUnknown",
                "the cluster's members could not be read: nothing is removed without them",
            ),
        };
    };
    let id = format!("{fullname}-{}", current - 1);
    match members.iter().find(|m| m.id == id) {
        None => ScaleStep::Replicas(current - 1),
        Some(m) if !m.draining => ScaleStep::Decommission {
            keep: current,
            member: id,
        },
        Some(m) if m.owned_partitions > 0 || m.outbound_moves > 0 => ScaleStep::Wait {
            keep: current,
            why: Why::new(
                "WaitingForDrain",
                format!(
                    "member {id} is draining: it still owns {} partitions ({} moves out)",
                    m.owned_partitions, m.outbound_moves
                ),
            ),
        },
        Some(m) => ScaleStep::Wait {
            keep: current,
            why: Why::new(
                "WaitingForMemberRemoval",
                format!(
                    "member {id} is drained ({}); pod {id} is removed once the cluster has \
                     taken the member out of its voters and members",
                    m.status
                ),
            ),
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

/// `k=v,…` of the selector labels (pods and claims of `nc`); also `status.selector`, the
/// `scale` subresource's label selector.
pub fn label_selector(nc: &NaradCluster) -> String {
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
    if paused(&*nc) {
        return hold_paused(&ctx, &api, &*nc).await;
    }
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

/// What a server-side apply changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Created,
    Changed,
    Unchanged,
}

/// Applies `obj` server-side as this operator's field manager and says what that changed
/// against `before` (the object as read before, `None`: absent), with the object as applied
/// ([`applied`]).
async fn ssa<K>(api: &Api<K>, obj: &K, before: Option<&K>) -> Result<(Applied, K)>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let after = api
        .patch(
            &obj.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await?;
    Ok((applied(before, &after), after))
}

/// `Created` without a `before`; otherwise whether the object differs, leaving out what the
/// server maintains by itself (`status`, `resourceVersion`, `generation`, `managedFields`).
pub fn applied<K: serde::Serialize>(before: Option<&K>, after: &K) -> Applied {
    fn content<K: serde::Serialize>(o: &K) -> serde_json::Value {
        let mut v = serde_json::to_value(o).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.remove("status");
            if let Some(meta) = m.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                for k in ["resourceVersion", "generation", "managedFields"] {
                    meta.remove(k);
                }
            }
        }
        v
    }
    match before {
        None => Applied::Created,
        Some(b) if content(b) != content(after) => Applied::Changed,
        Some(_) => Applied::Unchanged,
    }
}

/// The Event of an applied child object `what` (e.g. `StatefulSet narad-prod`), if it
/// changed: `Created`, `Updated` after a spec change, `DriftCorrected` otherwise.
pub fn applied_notice(nc: &NaradCluster, applied: Applied, what: &str) -> Option<Notice> {
    match applied {
        Applied::Unchanged => None,
        Applied::Created => Some(created(what)),
        Applied::Changed => Some(change_notice(
            nc.metadata.generation,
            nc.status.as_ref().and_then(|s| s.observed_generation),
            format!("applied the changed spec to {what}"),
            format!("{what} had been changed outside the operator; the spec was reapplied"),
        )),
    }
}

/// The Event of an object the operator created.
fn created(what: &str) -> Notice {
    Notice::normal("Created", "Create", format!("created {what}"))
}

/// Reads `obj` (a `kind`), applies it ([`apply_child_over`]) and returns it as applied.
async fn apply_child<K>(
    ctx: &Context,
    nc: &NaradCluster,
    api: &Api<K>,
    kind: &str,
    obj: &K,
) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let before = api.get_opt(&obj.name_any()).await?;
    apply_child_over(ctx, nc, api, kind, obj, before.as_ref()).await
}

/// Applies `obj` (a `kind`) over `before`, as read ([`ssa`]), announces what changed
/// ([`applied_notice`]) and returns it as applied.
async fn apply_child_over<K>(
    ctx: &Context,
    nc: &NaradCluster,
    api: &Api<K>,
    kind: &str,
    obj: &K,
    before: Option<&K>,
) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let (applied, after) = ssa(api, obj, before).await?;
    let what = format!("{kind} {}", obj.name_any());
    if let Some(n) = applied_notice(nc, applied, &what) {
        ctx.publish(nc, &n).await;
    }
    Ok(after)
}

/// Writes `Ready=False` with `reason` and `msg`, changing nothing else: the spec is refused.
async fn refuse(
    ctx: &Context,
    api: &Api<NaradCluster>,
    nc: &NaradCluster,
    prev: &NaradClusterStatus,
    reason: &str,
    msg: &str,
) -> Result<()> {
    let mut s = prev.clone();
    set_ready_synced(
        &mut s.conditions,
        (false, reason, msg),
        (false, reason, msg),
        nc.metadata.generation,
    );
    write_status(ctx, api, nc, &s).await
}

async fn apply(api: &Api<NaradCluster>, nc: &NaradCluster, ctx: &Context) -> Result<Action> {
    let ns = nc.namespace().unwrap_or_else(|| "default".into());
    let prev = nc.status.clone().unwrap_or_default();
    if let Err(msg) = check_cluster(&nc.spec, Some(&prev)) {
        refuse(ctx, api, nc, &prev, "Invalid", &msg).await?;
        return Err(Error::Invalid(msg));
    }
    // Nothing is read for, applied for or sent to an endpoint the operator may not use.
    if let Err(msg) = nc.check_endpoint(ctx.cluster_domain.as_deref(), ctx.allow_external_endpoints)
    {
        refuse(ctx, api, nc, &prev, "EndpointNotAllowed", &msg).await?;
        return Err(Error::Invalid(msg));
    }
    let c = &ctx.client;

    // The Secrets the pods mount, only those the rules of `secrets` allow; the security
    // Secret first, since the pods read it at start.
    if let Err(r) = secrets::check_tls_secret(ctx, nc).await? {
        refuse(ctx, api, nc, &prev, r.reason, &r.message).await?;
        return Err(Error::Waiting(r.message));
    }
    // The API-TLS Secret is mounted too, and its ca.crt is what the operator trusts when it
    // calls the brokers: one that is missing or unusable stops here, with its reason.
    if let Some(Err(r)) = secrets::api_tls_secret(ctx, nc).await? {
        refuse(ctx, api, nc, &prev, r.reason, &r.message).await?;
        return Err(Error::Waiting(r.message));
    }
    if nc.spec.security.enabled {
        let existing = match secrets::security_secret(ctx, nc).await? {
            Some(Err(r)) => {
                refuse(ctx, api, nc, &prev, r.reason, &r.message).await?;
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
                let what = format!("Secret {secret_name} with the generated credentials");
                ctx.publish(nc, &created(&what)).await;
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
                if !missing.is_empty() {
                    let keys = missing.keys().cloned().collect::<Vec<_>>().join(", ");
                    let n = Notice::normal(
                        "Updated",
                        "Update",
                        format!("added the generated {keys} to Secret {secret_name}"),
                    );
                    ctx.publish(nc, &n).await;
                }
            }
            Some(_) => {}
        }
    }

    if let Some(cm) = resources::configmap(nc) {
        let cms = Api::<ConfigMap>::namespaced(c.clone(), &ns);
        apply_child(ctx, nc, &cms, "ConfigMap", &cm).await?;
    }
    let services: Api<Service> = Api::namespaced(c.clone(), &ns);
    apply_child(
        ctx,
        nc,
        &services,
        "Service",
        &resources::headless_service(nc),
    )
    .await?;
    apply_child(
        ctx,
        nc,
        &services,
        "Service",
        &resources::client_service(nc),
    )
    .await?;
    // Before the StatefulSet: its pods name it.
    let sas = Api::<ServiceAccount>::namespaced(c.clone(), &ns);
    apply_child(
        ctx,
        nc,
        &sas,
        "ServiceAccount",
        &resources::service_account(nc),
    )
    .await?;
    let pdb_ar = resources::pdb_api_resource(&ctx.pdb_api_version);
    let pdbs: Api<DynamicObject> = Api::namespaced_with(c.clone(), &ns, &pdb_ar);
    let pdb = resources::pdb_dynamic(nc, &ctx.pdb_api_version);
    apply_child(ctx, nc, &pdbs, "PodDisruptionBudget", &pdb).await?;

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
    match (&step, &broker) {
        (ScaleStep::Decommission { member, .. }, Ok(b)) => {
            tracing::info!(%member, "scale-in: decommissioning");
            b.client.decommission(member).await?;
        }
        (ScaleStep::Wait { why, .. }, _) => {
            tracing::info!(reason = why.reason, message = %why.message, "scale-in waits");
        }
        _ => {}
    }
    let restarted_at = resources::restarted_at(nc, current.as_ref());
    let opts = StatefulSetOptions {
        restarted_at,
        cluster_domain: ctx
            .cluster_domain
            .clone()
            .unwrap_or_else(|| resources::DEFAULT_CLUSTER_DOMAIN.into()),
        claim_size,
        replicas: Some(step.replicas()),
    };
    let sts = resources::statefulset(nc, &opts).map_err(Error::Invalid)?;
    // Read once, above, for its claim size; the apply answers with it as it is now.
    let sts = apply_child_over(ctx, nc, &stss, "StatefulSet", &sts, current.as_ref()).await?;
    let st = sts.status.clone().unwrap_or_default();
    let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    // Whether a rollout is pending is read from the pods' revision labels: with `OnDelete`
    // the StatefulSet's `currentRevision` never advances.
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let pod_list = pods
        .list(&ListParams::default().labels(&label_selector(nc)))
        .await?
        .items;
    let revision = st.update_revision.clone();
    let views = pod_views(
        &pod_list,
        &format!("{}-", nc.fullname()),
        revision.as_deref(),
        now().0.as_second(),
    );
    let mut observed = Observed {
        rolling: rollout_pending(revision.as_deref(), &views, replicas),
        scale: step.why(),
        ..Observed::steady(
            st.ready_replicas.unwrap_or(0),
            sts.spec.as_ref().and_then(|s| s.replicas),
            members.clone(),
        )
    };
    if observed.rolling {
        let step = next_rollout_step(&views, replicas, members.as_deref().ok(), &nc.spec.version);
        match step {
            RolloutStep::Stalled(why) => {
                tracing::warn!(reason = %why, "rolling upgrade stalled");
                observed.stalled = Some(why);
            }
            RolloutStep::Done => observed.rolling = false,
            RolloutStep::Wait(why) => {
                tracing::info!(reason = why.reason, message = %why.message, "rolling upgrade waits");
                observed.rollout = Some(why);
            }
            RolloutStep::Delete { pod, why } => {
                tracing::info!(%pod, reason = why.reason, "rolling upgrade: deleting pod");
                pods.delete(&pod, &DeleteParams::default()).await?;
                ctx.metrics.rollout_pod_deletions.inc();
                observed.rollout = Some(why);
            }
        }
    }
    // Storage growth goes to the claims; a refusal (e.g. a class without
    // allowVolumeExpansion) is returned after the status is written, and retried.
    let expanded = expand_claims(ctx, nc, &ns).await;
    let mut status = cluster_status(nc, &prev, &observed, &now());
    status.initial_cluster_size = Some(nc.spec.effective_initial_cluster_size());
    status.storage_size = Some(nc.spec.storage.size.clone());
    // The `scale` subresource's current count and selector.
    status.replicas = st.replicas;
    status.selector = Some(label_selector(nc));
    write_status(ctx, api, nc, &status).await?;
    for n in notices(&prev, &observed) {
        ctx.publish(nc, &n).await;
    }
    expanded?;
    Ok(Action::requeue(
        requeue_after(&status, &observed).min(ctx.resync),
    ))
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
    fn the_scale_selector_is_the_pods_selector() {
        let nc = cluster(json!({"version": "1"}));
        assert_eq!(
            label_selector(&nc),
            "app.kubernetes.io/instance=prod,app.kubernetes.io/name=narad"
        );
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
            rollout: None,
            scale: None,
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
            rollout: None,
            scale: None,
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
            rollout: None,
            scale: None,
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
            rollout: None,
            scale: None,
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
            rollout: None,
            scale: None,
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
            rollout: None,
            scale: None,
        };
        assert_eq!(
            cluster_status(&nc, &running, &o, &t()).phase.as_deref(),
            Some("Scaling")
        );
    }

    /// The last pod of an upgrade is being replaced (none on the old revision is left, not
    /// all ready): a leader election or a members call that failed is still the upgrade,
    /// not a degradation; a majority of the members down is.
    #[test]
    fn status_finishing_an_upgrade_through_an_election_or_an_unanswered_call() {
        let upgrading = NaradClusterStatus {
            phase: Some("Upgrading".into()),
            ..Default::default()
        };
        let nc = cluster(json!({"version": "1.5.0"}));
        let observed = |members| Observed::steady(2, Some(3), members);
        let mut electing = healthy("1.5.0");
        electing[1].leader = false;
        electing[0].status = "dead".into();
        let phase = |prev: &NaradClusterStatus, o: &Observed| {
            cluster_status(&nc, prev, o, &t()).phase.unwrap()
        };
        assert_eq!(
            phase(&upgrading, &observed(Ok(electing.clone()))),
            "Upgrading"
        );
        assert_eq!(
            phase(&upgrading, &observed(Err("connection refused".into()))),
            "Upgrading"
        );
        let mut lost = electing;
        lost[2].status = "dead".into();
        assert_eq!(phase(&upgrading, &observed(Ok(lost))), "Degraded");
        // Outside a step the same pictures are degraded.
        let running = NaradClusterStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        assert_eq!(
            phase(&running, &observed(Err("refused".into()))),
            "Degraded"
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
        // Drained, but still a member (and maybe a voter): the pod stays.
        assert!(matches!(
            plan_scale("prod-narad", 4, 3, Some(5), Some(&five)),
            ScaleStep::Wait { keep: 5, .. }
        ));
        // The cluster removed it: now the pod goes.
        five.pop();
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
        // 5 and 6 were drained and removed by the cluster.
        seven.truncate(5);
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

    /// The pod a step deletes, if it deletes one.
    fn deleted(step: &RolloutStep) -> Option<&str> {
        match step {
            RolloutStep::Delete { pod, .. } => Some(pod),
            _ => None,
        }
    }

    /// The reason of a wait (panics on anything else).
    #[track_caller]
    fn waits(step: RolloutStep) -> Why {
        match step {
            RolloutStep::Wait(w) => w,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    fn pod(ordinal: i32, updated: bool, ready: bool) -> PodView {
        PodView {
            ordinal,
            name: format!("prod-narad-{ordinal}"),
            updated,
            ready,
            terminating: false,
            age_secs: 30,
            waiting: None,
        }
    }

    /// Seen on real pods: a rollout to an image that cannot be pulled waits on a pod whose
    /// container the kubelet reports waiting; the condition and its Event say why.
    #[test]
    fn a_not_ready_pod_says_what_its_container_waits_for() {
        let mut p = k8s_pod(2, "rev-2", false);
        p.status.as_mut().unwrap().container_statuses = Some(vec![serde_json::from_value(json!({
            "name": "narad", "image": "narad:0.1.0-missing", "imageID": "", "ready": false,
            "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff",
                                  "message": "Back-off pulling image \"narad:0.1.0-missing\""}}
        }))
        .unwrap()]);
        let views = pod_views(&[p], "prod-narad-", Some("rev-2"), 100);
        assert_eq!(
            views[0].waiting.as_deref(),
            Some("container narad: ImagePullBackOff (Back-off pulling image \"narad:0.1.0-missing\")")
        );
        let mut pods = vec![pod(0, false, true), pod(1, false, true)];
        pods.extend(views);
        let w = waits(next_rollout_step(&pods, 3, Some(&healthy("1")), "2"));
        assert_eq!(w.reason, "PodNotReady");
        assert!(w.message.ends_with("is not ready yet: container narad: ImagePullBackOff (Back-off pulling image \"narad:0.1.0-missing\")"), "{}", w.message);
        let mut old = pods[2].clone();
        old.age_secs = ROLLOUT_STALL.as_secs() as i64;
        pods[2] = old;
        match next_rollout_step(&pods, 3, Some(&healthy("1")), "2") {
            RolloutStep::Stalled(m) => assert!(m.contains("ImagePullBackOff"), "{m}"),
            other => panic!("expected a stall, got {other:?}"),
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
            deleted(&next_rollout_step(
                &pods,
                3,
                Some(&healthy("1.4.0")),
                "1.5.0"
            )),
            Some("prod-narad-2")
        );
        // 2 deleted and not recreated yet: wait (never 1 meanwhile).
        let gone = vec![pod(0, false, true), pod(1, false, true)];
        assert!(matches!(
            next_rollout_step(&gone, 3, Some(&healthy("1.4.0")), "1.5.0"),
            RolloutStep::Wait(_)
        ));
        // 2 replaced and ready, but its member still reports the old version: wait.
        let pods = vec![pod(0, false, true), pod(1, false, true), pod(2, true, true)];
        assert!(matches!(
            next_rollout_step(&pods, 3, Some(&healthy("1.4.0")), "1.5.0"),
            RolloutStep::Wait(_)
        ));
        let mut m = healthy("1.4.0");
        m[2].version = "1.5.0".into();
        assert_eq!(
            deleted(&next_rollout_step(&pods, 3, Some(&m), "1.5.0")),
            Some("prod-narad-1")
        );
        let all = vec![pod(0, true, true), pod(1, true, true), pod(2, true, true)];
        assert_eq!(
            next_rollout_step(&all, 3, Some(&healthy("1.5.0")), "1.5.0"),
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
            next_rollout_step(&pods, 3, Some(&healthy("1")), "2"),
            RolloutStep::Wait(_)
        ));
        pods[2].age_secs = 601;
        assert!(matches!(
            next_rollout_step(&pods, 3, Some(&healthy("1")), "2"),
            RolloutStep::Stalled(_)
        ));
        // An old pod that is merely not ready is no stall: it is replaced first.
        let mut old = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, false),
        ];
        old[2].age_secs = 10_000;
        assert_eq!(
            deleted(&next_rollout_step(&old, 3, Some(&healthy("1")), "2")),
            Some("prod-narad-2")
        );

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
            rollout: None,
            scale: None,
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
        // A replaced pod that is not ready yet.
        let pods = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, true, false),
        ];
        assert!(matches!(
            next_rollout_step(&pods, 3, Some(&healthy("1")), "2"),
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
            next_rollout_step(&pods, 3, Some(&dead), "2"),
            RolloutStep::Wait(_)
        ));
        let mut leaderless = healthy("1");
        leaderless[1].leader = false;
        assert!(matches!(
            next_rollout_step(&pods, 3, Some(&leaderless), "2"),
            RolloutStep::Wait(_)
        ));
        let mut draining = healthy("1");
        draining[0].draining = true;
        assert!(matches!(
            next_rollout_step(&pods, 3, Some(&draining), "2"),
            RolloutStep::Wait(_)
        ));
        let mut term = pods.clone();
        term[2].terminating = true;
        assert!(matches!(
            next_rollout_step(&term, 3, Some(&healthy("1")), "2"),
            RolloutStep::Wait(_)
        ));
    }

    fn running() -> NaradClusterStatus {
        NaradClusterStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }
    }

    /// Issue 14, bug 1: a drained member still in the members list (a voter, maybe dead)
    /// keeps its pod; only once the cluster removed it does the StatefulSet shrink.
    #[test]
    fn scale_in_waits_until_the_member_left_the_voters_and_members() {
        let mut four = healthy("1");
        four.push(member("prod-narad-3", "alive", false, "1"));
        four[3].draining = true;
        four[3].owned_partitions = 0;
        let step = plan_scale("prod-narad", 3, 3, Some(4), Some(&four));
        let ScaleStep::Wait { keep: 4, why } = step else {
            panic!("expected a wait, got {step:?}")
        };
        assert_eq!(why.reason, "WaitingForMemberRemoval");
        assert!(why.message.contains("prod-narad-3"), "{}", why.message);
        // Dead after its drain: still waited for (the broker removes it), and said so.
        four[3].status = "dead".into();
        let step = plan_scale("prod-narad", 3, 3, Some(4), Some(&four));
        let Some(why) = step.why() else {
            panic!("expected a wait, got {step:?}")
        };
        assert_eq!(step.replicas(), 4);
        assert!(why.message.contains("dead"), "{}", why.message);
        // Outbound moves still running: a drain wait that says so.
        four[3].status = "alive".into();
        four[3].outbound_moves = 2;
        let why = plan_scale("prod-narad", 3, 3, Some(4), Some(&four))
            .why()
            .unwrap();
        assert_eq!(why.reason, "WaitingForDrain");
        assert!(why.message.contains("2 moves"), "{}", why.message);
        four.pop();
        assert_eq!(
            plan_scale("prod-narad", 3, 3, Some(4), Some(&four)),
            ScaleStep::Replicas(3)
        );
    }

    /// Issue 14, bug 2: a pass with a scale or rollout step in progress looks again within
    /// seconds, not after the 30 s steady requeue.
    #[test]
    fn requeue_is_quick_while_a_step_is_in_progress() {
        let steady = Observed::steady(3, Some(3), Ok(healthy("1")));
        assert_eq!(requeue_after(&running(), &steady), STEADY_REQUEUE);
        let scale = Observed {
            scale: Some(Why::new("WaitingForMemberRemoval", "m")),
            ..steady.clone()
        };
        assert_eq!(requeue_after(&running(), &scale), PROGRESS_REQUEUE);
        let rolling = Observed {
            rolling: true,
            ..steady.clone()
        };
        assert_eq!(requeue_after(&running(), &rolling), PROGRESS_REQUEUE);
        for phase in ["Creating", "Scaling", "Upgrading"] {
            let st = NaradClusterStatus {
                phase: Some(phase.into()),
                ..Default::default()
            };
            assert_eq!(requeue_after(&st, &steady), PROGRESS_REQUEUE, "{phase}");
        }
        // A stall waits for a person.
        let stalled = Observed {
            stalled: Some("x".into()),
            ..rolling
        };
        assert_eq!(requeue_after(&running(), &stalled), STEADY_REQUEUE);
        assert!(PROGRESS_REQUEUE <= std::time::Duration::from_secs(5));
    }

    /// A broker pod as the API server has it: `controller-revision-hash` and readiness.
    fn k8s_pod(ordinal: i32, revision: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("prod-narad-{ordinal}"), "namespace": "default",
                "labels": {"app.kubernetes.io/name": "narad", "controller-revision-hash": revision},
                "creationTimestamp": "1970-01-01T00:01:00Z"},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    /// The phase of `pods` under a StatefulSet whose `updateRevision` is `rev-2` (its
    /// `currentRevision`, never advanced with OnDelete, is still `rev-1`: not consulted).
    fn phase_of(
        pods: &[Pod],
        replicas: i32,
        want: i32,
        members: Vec<MemberInfo>,
    ) -> (bool, String) {
        let views = pod_views(pods, "prod-narad-", Some("rev-2"), 100);
        let ready = views.iter().filter(|p| p.ready).count() as i32;
        let o = Observed {
            rolling: rollout_pending(Some("rev-2"), &views, replicas),
            ..Observed::steady(ready, Some(replicas), Ok(members))
        };
        let nc = cluster(json!({"version": "1", "replicas": want}));
        let s = cluster_status(&nc, &running(), &o, &t());
        (o.rolling, s.phase.unwrap())
    }

    /// Issue 14, bug 3: `Upgrading` only while a pod is on an old revision.
    #[test]
    fn phase_is_judged_by_the_pods_revision_labels() {
        let all_new = |ready: [bool; 3]| -> Vec<Pod> {
            (0..3)
                .map(|i| k8s_pod(i, "rev-2", ready[i as usize]))
                .collect()
        };
        // After an upgrade: everything on rev-2 and healthy.
        assert_eq!(
            phase_of(&all_new([true; 3]), 3, 3, healthy("1")),
            (false, "Running".into())
        );
        // A lost pod after the upgrade: Degraded, not Upgrading.
        let mut m = healthy("1");
        m[2].status = "dead".into();
        assert_eq!(
            phase_of(&all_new([true, true, false]), 3, 3, m),
            (false, "Degraded".into())
        );
        // A not-ready pod of the update revision, members fine: Degraded.
        assert_eq!(
            phase_of(&all_new([true, false, true]), 3, 3, healthy("1")),
            (false, "Degraded".into())
        );
        // Scale-out 3 → 4: the new pod is on rev-2 and not ready yet: Scaling.
        let mut four = all_new([true; 3]);
        four.push(k8s_pod(3, "rev-2", false));
        assert_eq!(
            phase_of(&four, 4, 4, healthy("1")),
            (false, "Scaling".into())
        );
        // One pod still on rev-1: Upgrading.
        let mut mixed = all_new([true; 3]);
        mixed[0] = k8s_pod(0, "rev-1", true);
        assert_eq!(
            phase_of(&mixed, 3, 3, healthy("1")),
            (true, "Upgrading".into())
        );
        // An old pod above the replicas (leaving in a scale-in) is no rollout.
        let mut leaving = all_new([true; 3]);
        leaving.push(k8s_pod(3, "rev-1", false));
        assert!(!phase_of(&leaving, 3, 3, healthy("1")).0);
        // Without an update revision nothing is judged outdated.
        let views = pod_views(&mixed, "prod-narad-", None, 100);
        assert!(!rollout_pending(None, &views, 3));
        assert_eq!(views[0].age_secs, 40);
    }

    /// Seen on real pods: the last replaced pod of an upgrade, or the pod a scale-out added,
    /// registers as a member before its readiness passes. The step is still ending: not
    /// Degraded. A cluster that was Running and loses readiness is Degraded.
    #[test]
    fn a_step_lasts_until_its_last_new_pod_is_ready() {
        let four: Vec<Pod> = (0..4).map(|i| k8s_pod(i, "rev-2", i != 3)).collect();
        let views = pod_views(&four, "prod-narad-", Some("rev-2"), 100);
        let mut members = healthy("1");
        members.push(member("prod-narad-3", "alive", false, "1"));
        let o = Observed::steady(3, Some(4), Ok(members.clone()));
        let nc = cluster(json!({"version": "1", "replicas": 4}));
        assert!(!rollout_pending(Some("rev-2"), &views, 4));
        for step in ["Scaling", "Upgrading"] {
            let prev = NaradClusterStatus {
                phase: Some(step.into()),
                ..Default::default()
            };
            let s = cluster_status(&nc, &prev, &o, &t());
            assert_eq!(s.phase.as_deref(), Some(step));
        }
        let s = cluster_status(&nc, &running(), &o, &t());
        assert_eq!(s.phase.as_deref(), Some("Degraded"));
        // Once every pod is ready the step is over.
        let done = Observed::steady(4, Some(4), Ok(members));
        let prev = NaradClusterStatus {
            phase: Some("Scaling".into()),
            ..Default::default()
        };
        let s = cluster_status(&nc, &prev, &done, &t());
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    /// Issue 14, bug 4: a not-ready pod of the old revision (e.g. Pending: its requests do
    /// not fit) is replaced first instead of blocking the rollout forever.
    #[test]
    fn rollout_replaces_a_not_ready_old_pod_first() {
        let pods = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, true),
            pod(3, false, false),
        ];
        // prod-narad-3 never joined: the members are the three others.
        match next_rollout_step(&pods, 4, Some(&healthy("1")), "2") {
            RolloutStep::Delete { pod, why } => {
                assert_eq!(pod, "prod-narad-3");
                assert_eq!(why.reason, "ReplacingNotReadyPod");
                assert!(why.message.contains("prod-narad-3"), "{}", why.message);
            }
            other => panic!("expected prod-narad-3 replaced, got {other:?}"),
        }
        // Even when the members cannot be read (the pods serve nothing anyway).
        assert_eq!(
            deleted(&next_rollout_step(&pods, 4, None, "2")),
            Some("prod-narad-3")
        );
        // Not while another member is not alive: that could cost the quorum.
        let mut dead = healthy("1");
        dead[0].status = "dead".into();
        let w = waits(next_rollout_step(&pods, 4, Some(&dead), "2"));
        assert_eq!(w.reason, "MemberNotAlive");
        assert!(
            w.message.contains("prod-narad-0") && w.message.contains("prod-narad-3"),
            "{}",
            w.message
        );
        // Not mid-drain.
        let mut draining = healthy("1");
        draining.push(member("prod-narad-3", "alive", false, "1"));
        draining[3].draining = true;
        let w = waits(next_rollout_step(&pods, 4, Some(&draining), "2"));
        assert_eq!(w.reason, "DecommissionRunning");
        // A ready old pod with members unknown: waited for, with the reason.
        let ready_old = vec![
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, true),
        ];
        assert_eq!(
            waits(next_rollout_step(&ready_old, 3, None, "2")).reason,
            "MembersUnknown"
        );
    }

    /// Every replaced pod must have rejoined on the new version, not only the highest.
    #[test]
    fn rollout_waits_for_every_replaced_member() {
        let pods = vec![pod(0, false, true), pod(1, true, true), pod(2, true, true)];
        let mut m = healthy("1");
        m[2].version = "2".into();
        // prod-narad-1 was replaced last and still reports version 1.
        let w = waits(next_rollout_step(&pods, 3, Some(&m), "2"));
        assert_eq!(w.reason, "MemberNotRejoined");
        assert!(w.message.contains("prod-narad-1"), "{}", w.message);
        m[1].version = "2".into();
        assert_eq!(
            deleted(&next_rollout_step(&pods, 3, Some(&m), "2")),
            Some("prod-narad-0")
        );
    }

    #[test]
    fn applied_children_are_announced_as_created_updated_or_drift_corrected() {
        use k8s_openapi::api::core::v1::Service;
        let svc = |port: i32, rv: &str| -> Service {
            serde_json::from_value(json!({
                "metadata": {"name": "prod-narad", "resourceVersion": rv, "managedFields": [
                    {"manager": "narad-operator", "time": format!("2026-12-06T10:00:0{rv}Z")}]},
                "spec": {"ports": [{"port": port}]},
                "status": {"loadBalancer": {"ingress": [{"ip": rv}]}}
            }))
            .unwrap()
        };
        assert_eq!(applied(None, &svc(8080, "1")), Applied::Created);
        // Only what the server maintains moved: unchanged.
        assert_eq!(
            applied(Some(&svc(8080, "1")), &svc(8080, "2")),
            Applied::Unchanged
        );
        assert_eq!(
            applied(Some(&svc(9090, "1")), &svc(8080, "2")),
            Applied::Changed
        );

        let mut nc = cluster(json!({"version": "1"}));
        nc.metadata.generation = Some(4);
        nc.status = Some(NaradClusterStatus {
            observed_generation: Some(4),
            ..Default::default()
        });
        assert_eq!(
            applied_notice(&nc, Applied::Unchanged, "Service prod-narad"),
            None
        );
        let n = applied_notice(&nc, Applied::Created, "Service prod-narad").unwrap();
        assert_eq!((n.reason.as_str(), n.warning), ("Created", false));
        assert!(n.message.contains("Service prod-narad"), "{}", n.message);
        // The spec did not change since it was applied: someone else changed the object.
        let n = applied_notice(&nc, Applied::Changed, "StatefulSet prod-narad").unwrap();
        assert_eq!(n.reason, "DriftCorrected");
        assert!(n.message.contains("outside the operator"), "{}", n.message);
        nc.metadata.generation = Some(5);
        let n = applied_notice(&nc, Applied::Changed, "StatefulSet prod-narad").unwrap();
        assert_eq!(n.reason, "Updated");
    }

    /// Issue 14, bug 8: every wait names the pod or member in the conditions, and becomes
    /// an Event once per reason (actions: every time).
    #[test]
    fn waits_go_into_conditions_and_events() {
        let nc = cluster(json!({"version": "2"}));
        let why = waits(next_rollout_step(
            &[
                pod(0, false, true),
                pod(1, false, true),
                pod(2, true, false),
            ],
            3,
            Some(&healthy("1")),
            "2",
        ));
        let o = Observed {
            rolling: true,
            rollout: Some(why),
            ..Observed::steady(2, Some(3), Ok(healthy("1")))
        };
        let s = cluster_status(&nc, &running(), &o, &t());
        assert_eq!(s.phase.as_deref(), Some("Upgrading"));
        for c in [cond::UPGRADING, cond::PROGRESSING] {
            let c = crate::crd::condition(&s.conditions, c).unwrap();
            assert_eq!(c.reason, "PodNotReady");
            assert!(c.message.contains("prod-narad-2"), "{}", c.message);
        }
        let n = notices(&running(), &o);
        assert_eq!(n.len(), 1);
        assert_eq!(
            (n[0].reason.as_str(), n[0].action),
            ("PodNotReady", "Rollout")
        );
        // The same wait on the next pass: no second Event.
        assert!(notices(&s, &o).is_empty());
        // A pod replaced: an Event every time.
        let o2 = Observed {
            rollout: Some(Why::new("ReplacingPod", "replacing pod prod-narad-1")),
            ..o.clone()
        };
        let s2 = cluster_status(&nc, &s, &o2, &t());
        assert_eq!(notices(&s2, &o2).len(), 1);

        // A scale-in wait: in Progressing, with its Event.
        let nc3 = cluster(json!({"version": "1", "replicas": 3}));
        let mut four = healthy("1");
        four.push(member("prod-narad-3", "dead", false, "1"));
        four[3].draining = true;
        four[3].owned_partitions = 0;
        let step = plan_scale("prod-narad", 3, 3, Some(4), Some(&four));
        let o = Observed {
            scale: step.why(),
            ..Observed::steady(3, Some(step.replicas()), Ok(four))
        };
        let s = cluster_status(&nc3, &running(), &o, &t());
        assert_eq!(s.phase.as_deref(), Some("Scaling"));
        let p = crate::crd::condition(&s.conditions, cond::PROGRESSING).unwrap();
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("True", "WaitingForMemberRemoval")
        );
        assert!(p.message.contains("prod-narad-3"), "{}", p.message);
        let n = notices(&running(), &o);
        assert_eq!((n.len(), n[0].action), (1, "Scale"));
        assert!(notices(&s, &o).is_empty());
        // A stall: one Warning.
        let o = Observed {
            rolling: true,
            stalled: Some("pod prod-narad-2 not ready 601 s after its replacement".into()),
            ..Observed::steady(2, Some(3), Ok(healthy("1")))
        };
        let n = notices(&running(), &o);
        assert!(
            n.len() == 1 && n[0].warning && n[0].reason == "Stalled",
            "{n:?}"
        );
        let s = cluster_status(&nc, &running(), &o, &t());
        assert!(notices(&s, &o).is_empty());
    }
}
