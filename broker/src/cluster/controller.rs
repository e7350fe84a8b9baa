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

use bytes::Bytes;
use narad_meta::{MetaCommand, MetaState, NodeId};
use tokio::time::Instant;

use super::wire::{AssignmentReply, AssignmentRequest};
use crate::node::Node;
use crate::rpc::Opcode;

/// Most moves in flight at once.
pub const MAX_INFLIGHT: usize = 8;
/// The controller never removes a voter below this many.
pub const MIN_VOTERS: usize = 3;

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
pub async fn run(node: Arc<Node>) {
    let tick = (node.cluster.timing.heartbeat / 5)
        .clamp(Duration::from_millis(100), Duration::from_secs(1));
    // Members this leader has seen; a new one triggers a rebalance.
    let mut known: Option<BTreeSet<NodeId>> = None;
    let mut rebalance = false;
    let mut last_note = Instant::now() - Duration::from_secs(60);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = node.shutdown_signal() => return,
        }
        if !node.cluster.clustered || !node.meta.is_leader() {
            known = None;
            continue;
        }
        let view = node.meta.view();
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
        abort_stuck(&node, &view).await;
        let view = node.meta.view();
        let budget = MAX_INFLIGHT.saturating_sub(inflight(&view));
        let moves = plan(&view, budget, !rebalance);
        if rebalance && moves.is_empty() && inflight(&view) == 0 {
            rebalance = false;
            tracing::info!("partitions balanced");
        }
        for m in moves {
            tracing::info!(topic = %m.topic, partition = m.partition, from = %m.from, to = %m.to, "starting a partition move");
            if let Err(e) = node
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
        let noted =
            finish_decommissions(&node, last_note.elapsed() >= Duration::from_secs(30)).await;
        if noted {
            last_note = Instant::now();
        }
    }
}

/// Aborts moves whose target died, drains or left: they cannot finish (moves whose source
/// is down wait for it).
async fn abort_stuck(node: &Node, view: &MetaState) {
    for t in view.topics.values() {
        for (p, a) in t.assignments.iter().enumerate() {
            let Some(to) = &a.target else { continue };
            let ok = view.members.get(to).is_some_and(|m| !m.dead && !m.draining);
            if ok {
                continue;
            }
            tracing::warn!(topic = %t.name, partition = p, to = %to, "aborting a move whose target is dead or draining");
            if let Err(e) = node
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

/// Records in member `id`'s ingress WAL not yet committed (`None`: unknown now).
async fn wal_outstanding(node: &Node, id: &str) -> Option<u64> {
    if id == node.node_id {
        return Some(node.wal.outstanding() as u64);
    }
    let body = serde_json::to_vec(&AssignmentRequest {
        topic_id: None,
        partition: 0,
    })
    .expect("invariant: serialises");
    let r = node
        .cluster
        .call(
            id,
            Opcode::GetAssignment,
            Bytes::from(body),
            Duration::from_secs(5),
        )
        .await
        .ok()?;
    if !r.is_success() {
        return None;
    }
    serde_json::from_slice::<AssignmentReply>(&r.body)
        .ok()
        .map(|a| a.wal_outstanding)
}

/// Removes drained members: once a draining member holds no partition and its WAL is empty,
/// it leaves the voters (never below [`MIN_VOTERS`]) and then the member list. Returns
/// whether it logged that a drained member must stay a voter.
async fn finish_decommissions(node: &Node, note: bool) -> bool {
    let view = node.meta.view();
    let voters: Vec<NodeId> = node.meta.voters().into_iter().map(|v| v.0).collect();
    let mut noted = false;
    for m in view.members.values() {
        if !m.draining || view.partitions_of(&m.id) > 0 {
            continue;
        }
        if !voters.contains(&m.id) {
            match node
                .meta
                .write(MetaCommand::RemoveMember { id: m.id.clone() })
                .await
            {
                Ok(_) => tracing::info!(member = %m.id, "drained member removed"),
                Err(e) => {
                    tracing::warn!(member = %m.id, error = %e, "could not remove a drained member")
                }
            }
            continue;
        }
        if m.dead {
            continue;
        }
        if voters.len() <= MIN_VOTERS {
            if note {
                tracing::info!(member = %m.id, voters = voters.len(), "member drained; it stays a voter (never fewer than {MIN_VOTERS})");
                noted = true;
            }
            continue;
        }
        match wal_outstanding(node, &m.id).await {
            Some(0) => {}
            _ => continue,
        }
        tracing::info!(member = %m.id, "member drained (no partitions, empty WAL); removing it from the voters");
        if let Err(e) = node.meta.remove_voter(&m.id, MIN_VOTERS).await {
            tracing::warn!(member = %m.id, error = %e, "could not remove a drained voter");
        }
        // One membership change at a time; the member record goes on the next pass.
        break;
    }
    noted
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_meta::{Assignment, Member, Topic, TopicConfig};

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
                Arc::new(Topic {
                    id: i as u64,
                    name: name.to_string(),
                    config: TopicConfig {
                        partitions: owners.len() as u32,
                        retention_ms: 0,
                        visibility_timeout_ms: 30_000,
                        max_in_flight_per_partition: 1024,
                        max_acked_ahead_per_partition: 1024,
                    },
                    created_at_ms: 0,
                    owner: None,
                    schemas: vec![],
                    assignments: owners
                        .iter()
                        .map(|o| Assignment {
                            owner: Some(o.to_string()),
                            target: None,
                            move_id: 0,
                        })
                        .collect(),
                }),
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
}
