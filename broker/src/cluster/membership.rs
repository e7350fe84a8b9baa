//! Bootstrap, join, heartbeats and the leader's controller (SPEC §6.2).
//!
//! - An initial member with empty Raft state asks the other seeds whether a cluster exists:
//!   if one answers yes it joins (a replaced volume); once a majority of the initial members
//!   (itself included) answered "not initialized" and none "initialized", it bootstraps with
//!   exactly the initial members (several doing so at once is safe: same voters).
//! - Any other empty node is join-only: every 2 s it asks the seeds and known members to
//!   admit it; the leader adds it as a voter (idempotent), others say "not the leader".
//! - Every admitted node upserts its member record every 5 s (forwarded to the leader, which
//!   stamps it with its own clock); the leader marks members silent for 30 s dead.

use std::sync::Arc;
use std::time::Duration;

use narad_meta::MetaCommand;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::calls::Call;
use super::wire::JoinRequest;
use super::Cluster;
use crate::clock::now_ms;

/// How often a join-only node asks to be admitted.
const JOIN_EVERY: Duration = Duration::from_secs(2);
/// How often an initial member re-asks the seeds before bootstrapping.
const PROBE_EVERY: Duration = Duration::from_millis(500);

/// Brings this node into its cluster: bootstraps, joins, or finds it already belongs.
/// Returns once the node is a voter (or at shutdown).
pub async fn establish(cluster: Arc<Cluster>, shutdown: CancellationToken) {
    if !cluster.clustered {
        return;
    }
    let me = cluster.node_id.clone();
    if !cluster.meta.is_initialized().await && cluster.initial_members.contains(&me) {
        bootstrap_or_find(&cluster, &shutdown).await;
    }
    // Join (join-only nodes, and initial members that found an existing cluster) until this
    // node is a voter of the membership it has applied.
    let mut last_ask = None::<Instant>;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        if cluster.meta.voters().iter().any(|(id, _)| *id == me)
            && cluster.meta.current_leader().is_some()
        {
            break;
        }
        if last_ask.is_none_or(|t| t.elapsed() >= JOIN_EVERY) {
            last_ask = Some(Instant::now());
            if ask_to_join(&cluster, false).await.admitted {
                tracing::info!(node = %me, "admitted to the cluster");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
    cluster.set_admitted();
    tracing::info!(node = %me, voters = ?cluster.meta.voters().iter().map(|v| &v.0).collect::<Vec<_>>(), "cluster membership established");
}

/// What the peers said to a join request or probe.
#[derive(Default)]
struct Asked {
    initialized: usize,
    uninitialized: usize,
    admitted: bool,
}

async fn ask_to_join(cluster: &Cluster, probe: bool) -> Asked {
    let req = JoinRequest {
        id: cluster.node_id.clone(),
        cluster_addr: cluster.advertise_addr.clone(),
        probe,
    };
    let (op, body) = (req.opcode(), req.encode());
    // A probe is answered at once; a join waits for the membership change.
    let timeout = if probe {
        Duration::from_secs(2)
    } else {
        JoinRequest::TIMEOUT
    };
    cluster.sync_peers(&cluster.meta.view());
    let mut out = Asked::default();
    let ids: Vec<String> = cluster.peers.ids();
    let calls = ids.iter().map(|id| {
        let body = body.clone();
        async move { cluster.peers.call(id, op, body, timeout).await }
    });
    for r in futures::future::join_all(calls).await {
        let Ok(reply) = r else { continue };
        if !reply.is_success() {
            // A reachable node answering "not the leader" belongs to a cluster.
            if reply.status == 503 {
                out.initialized += 1;
            }
            continue;
        }
        if let Ok(j) = JoinRequest::decode(reply) {
            if j.initialized {
                out.initialized += 1;
            } else {
                out.uninitialized += 1;
            }
            out.admitted |= j.admitted;
        }
    }
    out
}

async fn bootstrap_or_find(cluster: &Cluster, shutdown: &CancellationToken) {
    let me = &cluster.node_id;
    let k = cluster.initial_members.len();
    loop {
        if shutdown.is_cancelled() || cluster.meta.is_initialized().await {
            return;
        }
        let asked = ask_to_join(cluster, true).await;
        if asked.initialized > 0 {
            tracing::info!(node = %me, "a cluster already exists; joining it instead of bootstrapping");
            return;
        }
        if (asked.uninitialized + 1) * 2 > k {
            let voters: Vec<(String, String)> = cluster
                .seeds
                .iter()
                .filter(|(id, _)| cluster.initial_members.contains(id))
                .map(|(id, addr)| {
                    let addr = if id == me {
                        cluster.advertise_addr.clone()
                    } else {
                        addr.clone()
                    };
                    (id.clone(), addr)
                })
                .collect();
            tracing::info!(node = %me, voters = ?voters.iter().map(|v| &v.0).collect::<Vec<_>>(), "bootstrapping the metadata cluster");
            if let Err(e) = cluster.meta.initialize(&voters).await {
                tracing::warn!(error = %e, "bootstrap failed; retrying");
            } else {
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(PROBE_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Upserts this node's member record every heartbeat (SPEC §6.2), sooner while it fails.
pub async fn heartbeat(
    cluster: Arc<Cluster>,
    api_addr: String,
    version: String,
    shutdown: CancellationToken,
) {
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let ok = if cluster.admitted() {
            let cmd = MetaCommand::RegisterMember {
                id: cluster.node_id.clone(),
                api_addr: api_addr.clone(),
                cluster_addr: cluster.advertise_addr.clone(),
                version: version.clone(),
                now_ms: now_ms(),
            };
            match cluster.propose(cmd).await {
                Ok(_) if cluster.registered() => true,
                // Registered, and ready, only once the local view has everything committed
                // before: a node that restarted must not answer from an older view (users
                // it does not know yet, topics it thinks absent).
                Ok(_) => match cluster.catch_up().await {
                    Ok(index) => {
                        tracing::info!(node = %cluster.node_id, index, "member registered");
                        cluster.set_registered();
                        true
                    }
                    Err(e) => {
                        tracing::info!(error = %e.message, "registered; metadata still catching up");
                        false
                    }
                },
                Err(e) => {
                    tracing::debug!(error = %e.message, "heartbeat failed");
                    false
                }
            }
        } else {
            false
        };
        let wait = if ok {
            cluster.timing.heartbeat
        } else {
            Duration::from_millis(250).min(cluster.timing.heartbeat)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// The leader's controller: marks members dead after `dead_after` of silence. A new leader
/// first waits `dead_after` itself, so members silent only because the cluster was down (or
/// the old leader's clock ran differently) get their chance to heartbeat.
pub async fn controller(cluster: Arc<Cluster>, shutdown: CancellationToken) {
    let dead_after = cluster.timing.dead_after;
    let tick = (dead_after / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut leader_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = shutdown.cancelled() => return,
        }
        if !cluster.clustered || !cluster.meta.is_leader() {
            leader_since = None;
            continue;
        }
        let since = *leader_since.get_or_insert_with(Instant::now);
        if since.elapsed() < dead_after {
            continue;
        }
        let now = now_ms();
        let view = cluster.meta.view();
        for m in view.members.values() {
            if m.dead || m.id == cluster.node_id {
                continue;
            }
            if now.saturating_sub(m.last_seen_ms) > dead_after.as_millis() as u64 {
                tracing::warn!(member = %m.id, silent_ms = now.saturating_sub(m.last_seen_ms), "marking a silent member dead");
                if let Err(e) = cluster
                    .meta
                    .write(MetaCommand::MarkMemberDead {
                        id: m.id.clone(),
                        last_seen_ms: m.last_seen_ms,
                    })
                    .await
                {
                    tracing::warn!(member = %m.id, error = %e, "could not mark a member dead");
                }
            }
        }
    }
}
