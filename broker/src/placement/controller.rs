//! The leader's move controller (SPEC §6.5): rebalance when a node joins, shed the
//! partitions of draining nodes, abort moves that cannot finish, and remove drained members
//! from the voters.
//!
//! Planning is a pure function of the metadata ([`plan`]): each live, non-draining node
//! should hold ⌊T/R⌋ or ⌈T/R⌉ partitions (T: partitions on live nodes, draining ones
//! included; R: live, non-draining nodes). Partitions of dead owners stay put and do not
//! count. A partition with a move in flight counts at its target. The fewest moves: every
//! partition of a draining node moves, and a node gives away only what it holds beyond its
//! quota; the ⌈T/R⌉ quotas go to the nodes that already hold the most.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use narad_meta::{MetaCommand, MetaState, NodeId};
use tokio::time::Instant;

use crate::cluster::wire::AssignmentRequest;
use crate::cluster::Cluster;
use crate::health::Health;

/// Most moves in flight at once.
pub const MAX_INFLIGHT: usize = 8;
/// The controller never removes a voter below this many.
pub const MIN_VOTERS: usize = 3;

/// The leader's controller: plans and starts moves, aborts stuck ones, removes drained
/// members. Holds only the handles it uses, and the reasons it publishes.
pub struct Controller {
    pub node_id: String,
    pub meta: narad_meta::Meta,
    pub cluster: Arc<Cluster>,
    pub wal: crate::wal::Wal,
    /// (ext) Delayed produces held here (a drained member leaves once its store is empty).
    pub delayed: crate::delayed::Delayed,
    pub health: Arc<Health>,
    /// Test knob `NARAD_TEST_HOLD_DRAINED_VOTERS`.
    pub hold_drained_voters: bool,
    /// The leader's reasons why drained members are not removed yet (empty elsewhere).
    reasons: parking_lot::Mutex<BTreeMap<String, String>>,
}

impl Controller {
    pub fn new(
        node_id: String,
        meta: narad_meta::Meta,
        cluster: Arc<Cluster>,
        wal: crate::wal::Wal,
        delayed: crate::delayed::Delayed,
        health: Arc<Health>,
        hold_drained_voters: bool,
    ) -> Controller {
        Controller {
            node_id,
            meta,
            cluster,
            wal,
            delayed,
            health,
            hold_drained_voters,
            reasons: Default::default(),
        }
    }

    /// Why drained member `id` is not removed yet, when this node leads and knows.
    pub fn decommission_reason(&self, id: &str) -> Option<String> {
        self.reasons.lock().get(id).cloned()
    }

    fn set_decommission_reasons(&self, reasons: BTreeMap<String, String>) {
        *self.reasons.lock() = reasons;
    }
}

/// A move the controller wants started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub from: NodeId,
    pub to: NodeId,
}

/// Moves in flight in `view`.
pub fn inflight(view: &MetaState) -> usize {
    view.topics
        .values()
        .flat_map(|t| t.assignments.iter())
        .filter(|a| a.target.is_some())
        .count()
}

/// Where each partition is (its owner, or its target while moving), and its replica twins
/// (SPEC §5.4: partition p of a replica child and partition p of its parent), so planning
/// can keep the two copies apart.
struct Placement<'a> {
    holder: BTreeMap<(&'a str, u32), &'a str>,
    twins: BTreeMap<(&'a str, u32), Vec<(&'a str, u32)>>,
}

impl<'a> Placement<'a> {
    fn new(view: &'a MetaState) -> Self {
        let mut twins: BTreeMap<(&str, u32), Vec<(&str, u32)>> = BTreeMap::new();
        for l in view.child_links.values().filter(|l| l.replica) {
            let (Some(parent), Some(child)) =
                (view.topics.get(&l.parent), view.topics.get(&l.child))
            else {
                continue;
            };
            for p in 0..parent.config.partitions.min(child.config.partitions) {
                twins
                    .entry((&child.name, p))
                    .or_default()
                    .push((&parent.name, p));
                twins
                    .entry((&parent.name, p))
                    .or_default()
                    .push((&child.name, p));
            }
        }
        Placement {
            holder: BTreeMap::new(),
            twins,
        }
    }

    /// Whether partition `p` of `name` on node `to` would share it with a twin.
    fn conflicts(&self, name: &str, p: u32, to: &str) -> bool {
        self.twins
            .get(&(name, p))
            .is_some_and(|ts| ts.iter().any(|t| self.holder.get(t) == Some(&to)))
    }
}

/// The receiver of partition `p` of `name` from `from`: below its quota (any node when only
/// shedding); then one that holds no replica twin of it (balance first, anti-affinity when
/// it can), fewest of this topic, most room, id.
#[allow(clippy::too_many_arguments)]
fn receiver<'a>(
    count: &BTreeMap<&'a str, usize>,
    per_topic: &BTreeMap<(&'a str, &'a str), usize>,
    quota: &BTreeMap<&'a str, usize>,
    placement: &Placement<'_>,
    shed_only: bool,
    name: &str,
    p: u32,
    from: &str,
) -> Option<&'a str> {
    count
        .iter()
        .filter(|(id, c)| **id != from && (**c < quota[*id] || shed_only))
        .min_by(|(a, ca), (b, cb)| {
            let ta = per_topic.get(&(*a, name)).copied().unwrap_or(0);
            let tb = per_topic.get(&(*b, name)).copied().unwrap_or(0);
            placement
                .conflicts(name, p, a)
                .cmp(&placement.conflicts(name, p, b))
                .then(ta.cmp(&tb))
                .then((**ca as i64 - quota[*a] as i64).cmp(&(**cb as i64 - quota[*b] as i64)))
                .then(a.cmp(b))
        })
        .map(|(id, _)| *id)
}

/// The moves that balance `view` (see the module doc), at most `budget` of them, in a
/// deterministic order. With `shed_only`, only the moves off draining nodes.
pub fn plan(view: &MetaState, budget: usize, shed_only: bool) -> Vec<PlannedMove> {
    let eligible: Vec<&NodeId> = view
        .members
        .values()
        .filter(|m| !m.dead && !m.draining)
        .map(|m| &m.id)
        .collect();
    if eligible.is_empty() || budget == 0 {
        return Vec::new();
    }
    let alive = |id: &str| view.members.get(id).is_some_and(|m| !m.dead);
    let draining = |id: &str| view.members.get(id).is_some_and(|m| m.draining);
    // Per eligible node: partitions it holds (or receives); per (node, topic) for spread.
    let mut count: BTreeMap<&str, usize> = eligible.iter().map(|id| (id.as_str(), 0)).collect();
    let mut per_topic: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    // Movable partitions per eligible owner, and every partition of draining owners.
    let mut movable: BTreeMap<&str, Vec<(&str, u64, u32)>> = BTreeMap::new();
    let mut shed: Vec<(&str, u64, u32, &str)> = Vec::new();
    let mut placement = Placement::new(view);
    for t in view.topics.values() {
        for (p, a) in t.assignments.iter().enumerate() {
            let holder = match (&a.owner, &a.target) {
                (_, Some(to)) => to.as_str(),
                (Some(o), None) => o.as_str(),
                (None, None) => continue,
            };
            placement.holder.insert((t.name.as_str(), p as u32), holder);
            if let Some(c) = count.get_mut(holder) {
                *c += 1;
                *per_topic.entry((holder, t.name.as_str())).or_default() += 1;
                if a.target.is_none() {
                    movable
                        .entry(holder)
                        .or_default()
                        .push((t.name.as_str(), t.id, p as u32));
                }
            } else if a.target.is_none() && alive(holder) && draining(holder) {
                shed.push((t.name.as_str(), t.id, p as u32, holder));
            }
        }
    }
    let r = eligible.len();
    let total: usize = count.values().sum::<usize>() + shed.len();
    let (q, extra) = (total / r, total % r);
    // The ⌈T/R⌉ quotas go to the nodes holding the most (fewest moves).
    let mut order: Vec<&str> = count.keys().copied().collect();
    order.sort_by(|a, b| count[b].cmp(&count[a]).then(a.cmp(b)));
    let quota: BTreeMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, if i < extra { q + 1 } else { q }))
        .collect();
    let mut out = Vec::new();
    // Every partition of a draining node moves.
    for (name, topic_id, p, from) in shed {
        if out.len() >= budget {
            return out;
        }
        let Some(to) = receiver(
            &count, &per_topic, &quota, &placement, shed_only, name, p, from,
        ) else {
            continue;
        };
        *count.get_mut(to).expect("invariant: a counted node") += 1;
        *per_topic.entry((to, name)).or_default() += 1;
        placement.holder.insert((name, p), to);
        out.push(PlannedMove {
            topic: name.to_string(),
            topic_id,
            partition: p,
            from: from.to_string(),
            to: to.to_string(),
        });
    }
    if shed_only {
        return out;
    }
    // Then each node's surplus, one partition at a time: the topic whose best receiver
    // holds fewest of it, then the topic the donor holds most of.
    for id in &order {
        let mut mine = movable.remove(id).unwrap_or_default();
        while count[id] > quota[id] && !mine.is_empty() {
            if out.len() >= budget {
                return out;
            }
            let best = (0..mine.len())
                .filter_map(|i| {
                    let (name, _, p) = mine[i];
                    let to = receiver(
                        &count, &per_topic, &quota, &placement, shed_only, name, p, id,
                    )?;
                    let at_to = per_topic.get(&(to, name)).copied().unwrap_or(0);
                    let at_me = per_topic.get(&(*id, name)).copied().unwrap_or(0);
                    // Prefer moving a partition that shares its node with its twin, then
                    // moves that create no sharing.
                    let clean_now = !placement.conflicts(name, p, id);
                    Some((
                        clean_now,
                        placement.conflicts(name, p, to),
                        at_to,
                        std::cmp::Reverse(at_me),
                        name,
                        std::cmp::Reverse(p),
                        i,
                        to,
                    ))
                })
                .min();
            let Some((_, _, _, _, _, _, i, to)) = best else {
                break;
            };
            let (name, topic_id, p) = mine.remove(i);
            placement.holder.insert((name, p), to);
            *count.get_mut(to).expect("invariant: a counted node") += 1;
            *per_topic.entry((to, name)).or_default() += 1;
            *count.get_mut(id).expect("invariant: a counted node") -= 1;
            *per_topic.entry((*id, name)).or_default() -= 1;
            out.push(PlannedMove {
                topic: name.to_string(),
                topic_id,
                partition: p,
                from: id.to_string(),
                to: to.to_string(),
            });
        }
    }
    out
}

/// The leader's controller loop for moves and decommission. Runs until shutdown.
pub async fn run(ctl: Arc<Controller>) {
    let tick = (ctl.cluster.timing.heartbeat / 5)
        .clamp(Duration::from_millis(100), Duration::from_secs(1));
    // Members this leader has seen; a new one triggers a rebalance.
    let mut known: Option<BTreeSet<NodeId>> = None;
    let mut rebalance = false;
    let mut decommissions = Decommissions::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = ctl.health.shutdown_signal() => return,
        }
        if !ctl.cluster.clustered || !ctl.meta.is_leader() {
            known = None;
            // A later term starts from what it sees itself.
            decommissions = Decommissions::default();
            ctl.set_decommission_reasons(BTreeMap::new());
            continue;
        }
        let view = ctl.meta.view();
        let members: BTreeSet<NodeId> = view.members.keys().cloned().collect();
        match &known {
            None => {
                // A new leader: rebalance if a live node holds nothing while others do.
                let t: usize = view.topics.values().map(|t| t.assignments.len()).sum();
                rebalance = t > 0
                    && view
                        .members
                        .values()
                        .any(|m| !m.dead && !m.draining && view.partitions_of(&m.id) == 0);
            }
            Some(k) => {
                if members.iter().any(|m| !k.contains(m)) {
                    tracing::info!("a member joined; rebalancing partitions");
                    rebalance = true;
                }
            }
        }
        known = Some(members);
        abort_stuck(&ctl, &view).await;
        let view = ctl.meta.view();
        let budget = MAX_INFLIGHT.saturating_sub(inflight(&view));
        let moves = plan(&view, budget, !rebalance);
        if rebalance && moves.is_empty() && inflight(&view) == 0 {
            rebalance = false;
            tracing::info!("partitions balanced");
        }
        for m in moves {
            tracing::info!(topic = %m.topic, partition = m.partition, from = %m.from, to = %m.to, "starting a partition move");
            if let Err(e) = ctl
                .meta
                .write(MetaCommand::StartMove {
                    topic: m.topic.clone(),
                    topic_id: m.topic_id,
                    partition: m.partition,
                    from: m.from.clone(),
                    to: m.to.clone(),
                })
                .await
            {
                tracing::warn!(topic = %m.topic, partition = m.partition, error = %e, "could not start a move");
            }
        }
        finish_decommissions(&ctl, &mut decommissions).await;
    }
}

/// Aborts moves whose target died, drains or left: they cannot finish (moves whose source
/// is down wait for it).
async fn abort_stuck(ctl: &Controller, view: &MetaState) {
    for t in view.topics.values() {
        for (p, a) in t.assignments.iter().enumerate() {
            let Some(to) = &a.target else { continue };
            let ok = view.members.get(to).is_some_and(|m| !m.dead && !m.draining);
            if ok {
                continue;
            }
            tracing::warn!(topic = %t.name, partition = p, to = %to, "aborting a move whose target is dead or draining");
            if let Err(e) = ctl
                .meta
                .write(MetaCommand::AbortMove {
                    topic: t.name.clone(),
                    topic_id: t.id,
                    partition: p as u32,
                    move_id: a.move_id,
                })
                .await
            {
                tracing::warn!(error = %e, "could not abort a move");
            }
        }
    }
}

/// Records in member `id`'s ingress WAL not yet committed, plus its held delayed produces
/// (`None`: unknown now).
async fn wal_outstanding(ctl: &Controller, id: &str) -> Option<u64> {
    if id == ctl.node_id {
        return Some(crate::delayed::to_hand_over(&ctl.wal, &ctl.delayed));
    }
    let req = AssignmentRequest {
        topic_id: None,
        partition: 0,
    };
    ctl.cluster
        .ask(id, &req)
        .await
        .ok()
        .map(|a| a.wal_outstanding)
}

/// What the leader knows of a drained member's ingress WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalReport {
    /// It reported an empty WAL while draining with no partitions. A draining node takes no
    /// new produce, so it stays empty: its data has moved, even if it dies afterwards.
    Empty,
    /// It reported records not yet committed to their partitions.
    Outstanding(u64),
    /// It never reported an empty WAL to this leader (or could not be asked).
    Unknown,
}

/// What the controller does with a draining member next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// It still holds (or receives) partitions: the moves go on.
    Shedding,
    /// It left the voters: remove its member record.
    RemoveMember,
    /// Remove it from the voters (the member record goes on a later pass).
    RemoveVoter,
    /// It must stay for now; the reason says why (logged, and shown by the leader's
    /// `GET /v1/cluster/members` as `decommission_reason`).
    Wait(String),
}

/// The next decommission step for draining member `id` (see [`Step`]). Never leaves fewer
/// than [`MIN_VOTERS`] voters, and never proposes a voter change that the live voters could
/// not commit (a majority of the voters alive both before and after it, as a joint change
/// needs). A dead member goes only when its WAL was reported empty before it died.
pub fn decommission_step(
    view: &MetaState,
    voters: &[NodeId],
    id: &str,
    wal: WalReport,
    hold_alive: bool,
) -> Step {
    let Some(m) = view.members.get(id) else {
        return Step::Shedding;
    };
    if view.partitions_of(id) > 0 {
        return Step::Shedding;
    }
    if !voters.iter().any(|v| v == id) {
        return Step::RemoveMember;
    }
    if voters.len() <= MIN_VOTERS {
        return Step::Wait(format!(
            "drained; it stays a voter because the cluster keeps at least {MIN_VOTERS} voters \
             (add a node to remove it)"
        ));
    }
    match (m.dead, wal) {
        (_, WalReport::Empty) => {}
        (false, WalReport::Outstanding(n)) => {
            return Step::Wait(format!(
                "its WAL and delay store hold {n} records not yet handed to their partitions"
            ))
        }
        (false, WalReport::Unknown) => {
            return Step::Wait("its WAL could not be checked".into());
        }
        (true, _) => {
            return Step::Wait(
                "dead before it reported an empty WAL: records it accepted may be only on its \
                 disk; restart it so the drain can finish"
                    .into(),
            )
        }
    }
    let alive = |v: &NodeId| view.members.get(v).is_some_and(|m| !m.dead);
    let alive_before = voters.iter().filter(|v| alive(v)).count();
    let alive_after = voters.iter().filter(|v| *v != id && alive(v)).count();
    let (before, after) = (voters.len(), voters.len() - 1);
    if alive_before <= before / 2 || alive_after <= after / 2 {
        return Step::Wait(format!(
            "removing it needs a majority of the voters alive: {alive_after} of the {after} \
             other voters are"
        ));
    }
    if hold_alive && !m.dead {
        return Step::Wait("held by NARAD_TEST_HOLD_DRAINED_VOTERS".into());
    }
    Step::RemoveVoter
}

/// The leader's decommission bookkeeping across controller passes.
#[derive(Default)]
pub struct Decommissions {
    /// Draining members that reported an empty WAL with no partitions left.
    wal_empty: BTreeSet<NodeId>,
    /// The reason last logged per member, and when (logged again on change or every 30 s).
    logged: BTreeMap<NodeId, (String, Instant)>,
}

/// Removes drained members (see [`decommission_step`]): a draining member with no partitions
/// and an empty WAL leaves the voters and then the member list. Its WAL is checked while it
/// is alive and the answer kept, so a member that dies after it drained is removed too.
/// Publishes why a drained member stays to [`Controller::decommission_reason`].
async fn finish_decommissions(ctl: &Controller, state: &mut Decommissions) {
    let view = ctl.meta.view();
    let voters: Vec<NodeId> = ctl.meta.voters().into_iter().map(|v| v.0).collect();
    state
        .wal_empty
        .retain(|id| view.members.get(id).is_some_and(|m| m.draining));
    state.logged.retain(|id, _| view.members.contains_key(id));
    let mut reasons = BTreeMap::new();
    let draining: Vec<NodeId> = view
        .members
        .values()
        .filter(|m| m.draining)
        .map(|m| m.id.clone())
        .collect();
    for id in draining {
        let m = &view.members[&id];
        let mut wal = if state.wal_empty.contains(&id) {
            WalReport::Empty
        } else {
            WalReport::Unknown
        };
        if !m.dead && wal != WalReport::Empty && view.partitions_of(&id) == 0 {
            wal = match wal_outstanding(ctl, &id).await {
                Some(0) => {
                    tracing::info!(member = %id, "drained member reported an empty WAL");
                    state.wal_empty.insert(id.clone());
                    WalReport::Empty
                }
                Some(n) => WalReport::Outstanding(n),
                None => WalReport::Unknown,
            };
        }
        let step = decommission_step(&view, &voters, &id, wal, ctl.hold_drained_voters);
        match step {
            Step::Shedding => {}
            Step::RemoveMember => {
                match ctl
                    .meta
                    .write(MetaCommand::RemoveMember { id: id.clone() })
                    .await
                {
                    Ok(_) => tracing::info!(member = %id, dead = m.dead, "drained member removed"),
                    Err(e) => {
                        tracing::warn!(member = %id, error = %e, "could not remove a drained member")
                    }
                }
            }
            Step::RemoveVoter => {
                tracing::info!(member = %id, dead = m.dead, voters = voters.len(), "member drained (no partitions, empty WAL); removing it from the voters");
                if let Err(e) = ctl.meta.remove_voter(&id, MIN_VOTERS).await {
                    tracing::warn!(member = %id, error = %e, "could not remove a drained voter");
                }
                // One membership change at a time; the member record goes on a later pass.
                break;
            }
            Step::Wait(reason) => {
                let due = match state.logged.get(&id) {
                    Some((last, at)) => *last != reason || at.elapsed() >= Duration::from_secs(30),
                    None => true,
                };
                if due {
                    tracing::info!(member = %id, dead = m.dead, voters = voters.len(), reason = %reason, "drained member not removed yet");
                    state
                        .logged
                        .insert(id.clone(), (reason.clone(), Instant::now()));
                }
                reasons.insert(id.clone(), reason);
            }
        }
    }
    ctl.set_decommission_reasons(reasons);
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_meta::Member;

    fn member(id: &str, dead: bool, draining: bool) -> Member {
        Member {
            id: id.into(),
            api_addr: String::new(),
            cluster_addr: String::new(),
            version: String::new(),
            last_seen_ms: 0,
            dead,
            draining,
        }
    }

    /// `members`: (id, dead, draining); `topics`: name → owner per partition.
    fn state(members: &[(&str, bool, bool)], topics: &[(&str, &[&str])]) -> MetaState {
        let mut s = MetaState::default();
        for (id, dead, draining) in members {
            s.members
                .insert(id.to_string(), member(id, *dead, *draining));
        }
        for (i, (name, owners)) in topics.iter().enumerate() {
            s.topics.insert(
                name.to_string(),
                Arc::new(crate::test_support::topic(i as u64, name, owners)),
            );
        }
        s
    }

    /// Applies planned moves as if they completed; returns partitions per member.
    fn after(s: &MetaState, moves: &[PlannedMove]) -> BTreeMap<String, usize> {
        let mut s = s.clone();
        for m in moves {
            let t = Arc::make_mut(s.topics.get_mut(&m.topic).unwrap());
            let a = &mut t.assignments[m.partition as usize];
            assert_eq!(a.owner.as_deref(), Some(m.from.as_str()), "{m:?}");
            assert!(a.target.is_none(), "one move per partition: {m:?}");
            a.owner = Some(m.to.clone());
        }
        let mut out: BTreeMap<String, usize> = s.members.keys().map(|k| (k.clone(), 0)).collect();
        for t in s.topics.values() {
            for a in &t.assignments {
                *out.entry(a.owner.clone().unwrap()).or_default() += 1;
            }
        }
        out
    }

    const ALIVE: bool = false;

    #[test]
    fn a_joined_node_gets_its_share_with_the_fewest_moves() {
        // 12 partitions over a, b, c (4 each); d joins: 12/4 = 3 each, 3 moves.
        let s = state(
            &[
                ("a", ALIVE, false),
                ("b", ALIVE, false),
                ("c", ALIVE, false),
                ("d", ALIVE, false),
            ],
            &[
                ("x", &["a", "b", "c", "a", "b", "c"]),
                ("y", &["a", "b", "c", "a", "b", "c"]),
            ],
        );
        let moves = plan(&s, 100, false);
        assert_eq!(moves.len(), 3, "{moves:?}");
        assert!(moves.iter().all(|m| m.to == "d"));
        let counts = after(&s, &moves);
        assert!(counts.values().all(|c| *c == 3), "{counts:?}");
        // Spread: d gets partitions of both topics.
        let topics: BTreeSet<&str> = moves.iter().map(|m| m.topic.as_str()).collect();
        assert_eq!(topics.len(), 2, "{moves:?}");
        // The budget caps the moves started at once; planning again with the moves in
        // flight plans only the rest.
        let first = plan(&s, 2, false);
        assert_eq!(first.len(), 2);
        let mut s2 = s.clone();
        for m in &first {
            let t = Arc::make_mut(s2.topics.get_mut(&m.topic).unwrap());
            t.assignments[m.partition as usize].target = Some(m.to.clone());
        }
        let rest = plan(&s2, 100, false);
        assert_eq!(rest.len(), 1, "{rest:?}");
        assert_eq!(inflight(&s2), 2);
    }

    /// SPEC §5.4/§6.5: a replica and its parent that had to share one node (it was the only
    /// one alive) are pulled apart by the rebalance when others join, balance first.
    #[test]
    fn rebalance_separates_replica_twins() {
        let mut s = state(
            &[
                ("a", ALIVE, false),
                ("b", ALIVE, false),
                ("c", ALIVE, false),
            ],
            &[("t", &["a"; 5]), ("t-copy", &["a"; 5]), ("u", &["b", "c"])],
        );
        s.child_links.insert(
            "t-copy".into(),
            narad_meta::ChildLink {
                parent: "t".into(),
                child: "t-copy".into(),
                epoch: 1,
                delay_ms: 0,
                replica: true,
                parent_partitions_at_attach: 5,
                attached_at_ms: 0,
            },
        );
        let moves = plan(&s, 100, false);
        let counts = after(&s, &moves);
        assert!(counts.values().all(|c| (4..=4).contains(c)), "{counts:?}");
        let mut owner: BTreeMap<(String, u32), String> = BTreeMap::new();
        for t in s.topics.values() {
            for (p, a) in t.assignments.iter().enumerate() {
                owner.insert((t.name.clone(), p as u32), a.owner.clone().unwrap());
            }
        }
        for m in &moves {
            owner.insert((m.topic.clone(), m.partition), m.to.clone());
        }
        for p in 0..5 {
            assert_ne!(
                owner[&("t".to_string(), p)],
                owner[&("t-copy".to_string(), p)],
                "partition {p} shares a node: {moves:?}"
            );
        }
    }

    #[test]
    fn uneven_totals_stay_within_floor_and_ceil() {
        for (t, r) in [(7usize, 3usize), (10, 4), (5, 4), (3, 4), (13, 5), (1, 2)] {
            let ids: Vec<String> = (0..r).map(|i| format!("n{i}")).collect();
            let members: Vec<(&str, bool, bool)> =
                ids.iter().map(|i| (i.as_str(), ALIVE, false)).collect();
            // Everything on n0.
            let owners: Vec<&str> = vec!["n0"; t];
            let s = state(&members, &[("x", &owners)]);
            let moves = plan(&s, 1000, false);
            let counts = after(&s, &moves);
            let (lo, hi) = (t / r, t.div_ceil(r));
            assert!(
                counts.values().all(|c| (lo..=hi).contains(c)),
                "T={t} R={r}: {counts:?}"
            );
            assert_eq!(moves.len(), t - hi, "fewest moves for T={t} R={r}");
            // Balanced already: nothing to do.
            assert!(plan(
                &{
                    let mut s2 = s.clone();
                    for m in &moves {
                        let tt = Arc::make_mut(s2.topics.get_mut(&m.topic).unwrap());
                        tt.assignments[m.partition as usize].owner = Some(m.to.clone());
                    }
                    s2
                },
                1000,
                false
            )
            .is_empty());
        }
    }

    #[test]
    fn dead_owners_partitions_stay_put_and_dead_nodes_receive_nothing() {
        let s = state(
            &[("a", ALIVE, false), ("b", true, false), ("c", ALIVE, false)],
            &[("x", &["a", "a", "a", "a", "b", "b"])],
        );
        let moves = plan(&s, 100, false);
        assert!(
            moves.iter().all(|m| m.from != "b" && m.to != "b"),
            "{moves:?}"
        );
        let counts = after(&s, &moves);
        assert_eq!(counts["a"], 2);
        assert_eq!(counts["c"], 2);
        assert_eq!(counts["b"], 2, "a dead owner keeps its partitions");
    }

    #[test]
    fn draining_nodes_shed_everything_and_receive_nothing() {
        let s = state(
            &[
                ("a", ALIVE, false),
                ("b", ALIVE, false),
                ("c", ALIVE, false),
                ("d", ALIVE, true),
            ],
            &[("x", &["a", "b", "c", "d", "d", "d"])],
        );
        // Shedding alone (no rebalance asked): all of d's partitions move, spread.
        let moves = plan(&s, 100, true);
        assert_eq!(moves.len(), 3, "{moves:?}");
        assert!(moves.iter().all(|m| m.from == "d" && m.to != "d"));
        let counts = after(&s, &moves);
        assert_eq!(counts["d"], 0);
        assert!(
            ["a", "b", "c"].iter().all(|n| counts[*n] == 2),
            "{counts:?}"
        );
        // A full plan gives the same result.
        assert_eq!(after(&s, &plan(&s, 100, false)), counts);
        // Shedding respects the budget too.
        assert_eq!(plan(&s, 1, true).len(), 1);
        // A dead draining node's partitions wait for it.
        let s = state(
            &[("a", ALIVE, false), ("d", true, true)],
            &[("x", &["a", "d"])],
        );
        assert!(plan(&s, 100, false).is_empty());
    }

    #[test]
    fn no_eligible_node_plans_nothing() {
        let s = state(&[("a", ALIVE, true)], &[("x", &["a", "a"])]);
        assert!(plan(&s, 100, false).is_empty());
        let s = state(
            &[("a", ALIVE, false), ("b", ALIVE, false)],
            &[("x", &["a", "b"])],
        );
        assert!(plan(&s, 100, false).is_empty());
    }

    fn ids(v: &[&str]) -> Vec<NodeId> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Issue 14: a drained member that dies before it leaves the voters goes too, once its
    /// WAL was reported empty; never below MIN_VOTERS, never without a live majority, and
    /// each refusal says why.
    #[test]
    fn drained_members_leave_alive_or_dead_within_the_safety_rules() {
        let four = ids(&["a", "b", "c", "d"]);
        let drained = |d_dead: bool| {
            state(
                &[
                    ("a", ALIVE, false),
                    ("b", ALIVE, false),
                    ("c", ALIVE, false),
                    ("d", d_dead, true),
                ],
                &[("x", &["a", "b", "c"])],
            )
        };
        let step = |s: &MetaState, voters: &[NodeId], wal, hold| {
            decommission_step(s, voters, "d", wal, hold)
        };
        // Alive, empty WAL: leaves the voters; then the member list.
        let s = drained(ALIVE);
        assert_eq!(step(&s, &four, WalReport::Empty, false), Step::RemoveVoter);
        assert_eq!(
            step(&s, &ids(&["a", "b", "c"]), WalReport::Empty, false),
            Step::RemoveMember
        );
        // Dead after its WAL was reported empty: removed the same way.
        let s = drained(true);
        assert_eq!(step(&s, &four, WalReport::Empty, false), Step::RemoveVoter);
        // The test hold keeps only live members.
        assert_eq!(step(&s, &four, WalReport::Empty, true), Step::RemoveVoter);
        assert!(matches!(
            step(&drained(ALIVE), &four, WalReport::Empty, true),
            Step::Wait(r) if r.contains("NARAD_TEST_HOLD_DRAINED_VOTERS")
        ));
        // Dead before its WAL was reported empty: stays, and says why.
        assert!(matches!(
            step(&s, &four, WalReport::Unknown, false),
            Step::Wait(r) if r.contains("dead before it reported an empty WAL")
        ));
        // Alive with records outstanding: waits for them.
        assert!(matches!(
            step(&drained(ALIVE), &four, WalReport::Outstanding(7), false),
            Step::Wait(r) if r.contains("7 records")
        ));
        // Never fewer than MIN_VOTERS.
        let three = ids(&["a", "c", "d"]);
        assert!(matches!(
            step(&s, &three, WalReport::Empty, false),
            Step::Wait(r) if r.contains("at least 3 voters")
        ));
        // A quorum must remain: with b dead too, 2 of the 3 others are alive (a majority of
        // 3, and of 4 with d dead? 2 of 4 is not), so the change could not commit.
        let mut s2 = drained(true);
        s2.members.get_mut("b").unwrap().dead = true;
        assert!(matches!(
            step(&s2, &four, WalReport::Empty, false),
            Step::Wait(r) if r.contains("majority")
        ));
        // Five voters, d and b dead: 3 of 5 alive before, 3 of 4 after: allowed.
        s2.members.insert("e".into(), member("e", ALIVE, false));
        let five = ids(&["a", "b", "c", "d", "e"]);
        assert_eq!(step(&s2, &five, WalReport::Empty, false), Step::RemoveVoter);
        // Still holding partitions (or receiving one): the moves go on, nothing to say.
        let s3 = state(
            &[("a", ALIVE, false), ("d", true, true)],
            &[("x", &["a", "d"])],
        );
        assert_eq!(step(&s3, &four, WalReport::Empty, false), Step::Shedding);
    }
}
