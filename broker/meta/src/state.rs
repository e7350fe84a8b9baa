//! `MetaState::apply`: the pure, deterministic core of the metadata state machine.
//!
//! Every replica applies the same commands in the same order and must reach the same state,
//! so nothing here reads a clock, draws a random number or iterates a hash map: times come in
//! the command and every collection is a `BTreeMap`. A refused command (`ApplyError`) leaves
//! the state exactly as it was — each arm validates everything before it mutates anything.

use std::sync::Arc;

use crate::types::{
    Action, ApplyError, Assignment, Grant, Member, MetaCommand, MetaResponse, MetaState, NodeId,
    SalvageClaim, SchemaVersion, Topic, TopicPatch, User, ROOT_USERNAME,
};

impl MetaState {
    /// Applies one command. Deterministic; on `Err` the state is unchanged.
    pub fn apply(&mut self, cmd: &MetaCommand) -> Result<MetaResponse, ApplyError> {
        match cmd {
            MetaCommand::CreateTopic {
                name,
                config,
                owner,
                schema,
                created_at_ms,
            } => {
                if self.topics.contains_key(name) {
                    return Err(ApplyError::Conflict(format!("topic {name} already exists")));
                }
                let folded = fold(name);
                if let Some(existing) = self.topic_names_folded.get(&folded) {
                    return Err(ApplyError::Conflict(format!(
                        "topic {name} differs only in letter case from existing topic {existing}"
                    )));
                }
                if config.partitions == 0 {
                    return Err(ApplyError::Invalid(
                        "a topic needs at least one partition".into(),
                    ));
                }
                self.check_topic_quota(owner.as_deref())?;
                let live = self.live_members();
                let assignments = (0..config.partitions).map(|p| assign(&live, p)).collect();
                let topic = Arc::new(Topic {
                    id: self.next_topic_id,
                    name: name.clone(),
                    config: config.clone(),
                    created_at_ms: *created_at_ms,
                    owner: owner.clone(),
                    schemas: schema
                        .iter()
                        .map(|s| SchemaVersion {
                            version: 1,
                            schema: s.clone(),
                        })
                        .collect(),
                    assignments,
                    paused: false,
                });
                self.next_topic_id += 1;
                self.topic_names_folded.insert(folded, name.clone());
                self.topics.insert(name.clone(), topic.clone());
                Ok(MetaResponse::Topic(topic))
            }
            MetaCommand::AlterTopic { name, patch } => {
                let current = self
                    .topics
                    .get(name)
                    .ok_or_else(|| ApplyError::NotFound(format!("topic {name} not found")))?;
                self.check_alter_links(current, patch)?;
                let altered = self.altered(current, patch)?;
                let altered = Arc::new(altered);
                self.topics.insert(name.clone(), altered.clone());
                if patch.schema.is_some() {
                    self.propagate_schema(&altered);
                }
                Ok(MetaResponse::Topic(altered))
            }
            MetaCommand::DeleteTopic { name } => {
                let topic = self
                    .topics
                    .remove(name)
                    .ok_or_else(|| ApplyError::NotFound(format!("topic {name} not found")))?;
                self.topic_names_folded.remove(&fold(name));
                self.unlink_deleted(name);
                self.salvage.retain(|c| c.topic_id != topic.id);
                Ok(MetaResponse::Deleted(topic))
            }
            MetaCommand::RegisterMember {
                id,
                api_addr,
                cluster_addr,
                version,
                now_ms,
            } => {
                let draining = self.members.get(id).is_some_and(|m| m.draining);
                self.members.insert(
                    id.clone(),
                    Member {
                        id: id.clone(),
                        api_addr: api_addr.clone(),
                        cluster_addr: cluster_addr.clone(),
                        version: version.clone(),
                        last_seen_ms: *now_ms,
                        dead: false,
                        draining,
                    },
                );
                self.assign_unassigned();
                Ok(MetaResponse::Ok)
            }
            MetaCommand::MarkMemberDead { id, last_seen_ms } => {
                let m = self
                    .members
                    .get_mut(id)
                    .ok_or_else(|| ApplyError::NotFound(format!("member {id} not found")))?;
                if m.last_seen_ms == *last_seen_ms && !m.dead {
                    m.dead = true;
                }
                Ok(MetaResponse::Ok)
            }
            MetaCommand::StartMove { .. }
            | MetaCommand::CompleteMove { .. }
            | MetaCommand::ForceCompleteMove { .. }
            | MetaCommand::SalvageDone { .. }
            | MetaCommand::AbortMove { .. }
            | MetaCommand::SetDraining { .. }
            | MetaCommand::RemoveMember { .. } => self.apply_move(cmd),
            MetaCommand::CreateUser { .. }
            | MetaCommand::SetGrants { .. }
            | MetaCommand::SetPassword { .. }
            | MetaCommand::SetQuotas { .. }
            | MetaCommand::DeleteUser { .. }
            | MetaCommand::SeedRoot { .. } => self.apply_user(cmd),
            MetaCommand::AttachChild { .. }
            | MetaCommand::DetachChild { .. }
            | MetaCommand::CreateChildTopic { .. }
            | MetaCommand::AttachRemoteChild { .. } => self.apply_child(cmd),
        }
    }

    /// Live members (neither dead nor draining), sorted by id.
    pub fn live_members(&self) -> Vec<NodeId> {
        // BTreeMap iteration is already in id order.
        self.members
            .values()
            .filter(|m| !m.dead && !m.draining)
            .map(|m| m.id.clone())
            .collect()
    }

    /// Refuses a new topic of `owner` when it already owns its `max_topics` (409).
    pub(crate) fn check_topic_quota(&self, owner: Option<&str>) -> Result<(), ApplyError> {
        let Some(owner) = owner else { return Ok(()) };
        let Some(max) = self.users.get(owner).and_then(|u| u.quotas.max_topics) else {
            return Ok(());
        };
        let owned = self
            .topics
            .values()
            .filter(|t| t.owner.as_deref() == Some(owner))
            .count() as u64;
        if owned >= max {
            return Err(ApplyError::QuotaExceeded(format!(
                "user {owner} owns {owned} topics, its max_topics quota is {max}"
            )));
        }
        Ok(())
    }

    /// Looks a topic up by exact name.
    pub fn topic(&self, name: &str) -> Option<&Arc<Topic>> {
        self.topics.get(name)
    }

    /// Validates `patch` against `current` and returns the altered topic; mutates nothing.
    fn altered(&self, current: &Topic, patch: &TopicPatch) -> Result<Topic, ApplyError> {
        let current_version = current.current_schema().map_or(0, |s| s.version);
        if let Some(base) = patch.schema_base_version {
            if base != current_version {
                return Err(ApplyError::Conflict(
                    "topic changed since it was read".into(),
                ));
            }
        }
        if let Some(partitions) = patch.partitions {
            if partitions <= current.config.partitions {
                return Err(ApplyError::Invalid(format!(
                    "partitions can only grow: topic {} has {}, requested {}",
                    current.name, current.config.partitions, partitions
                )));
            }
        }

        let mut topic = current.clone();
        if let Some(partitions) = patch.partitions {
            let live = self.live_members();
            let from = topic.config.partitions;
            topic
                .assignments
                .extend((from..partitions).map(|p| assign(&live, p)));
            topic.config.partitions = partitions;
        }
        if let Some(v) = patch.retention_ms {
            topic.config.retention_ms = v;
        }
        if let Some(v) = patch.visibility_timeout_ms {
            topic.config.visibility_timeout_ms = v;
        }
        if let Some(v) = patch.max_in_flight_per_partition {
            topic.config.max_in_flight_per_partition = v;
        }
        if let Some(v) = patch.max_acked_ahead_per_partition {
            topic.config.max_acked_ahead_per_partition = v;
        }
        if let Some(v) = patch.paused {
            topic.paused = v;
        }
        if let Some(b) = patch.retry_backoff {
            topic.config.retry_backoff = (b.min_ms > 0).then_some(b);
        }
        if let Some(w) = patch.dedup_window_ms {
            topic.config.dedup_window_ms = (w > 0).then_some(w);
        }
        if let Some(d) = &patch.dead_letter {
            topic.config.dead_letter = (d.max_deliveries > 0).then(|| d.clone());
        }
        if let Some(schema) = &patch.schema {
            topic.schemas.push(SchemaVersion {
                version: current_version + 1,
                schema: schema.clone(),
            });
        }
        Ok(topic)
    }

    /// Gives every unassigned partition an owner, round-robin over the live members.
    fn assign_unassigned(&mut self) {
        let live = self.live_members();
        if live.is_empty() {
            return;
        }
        // Replica children last, so their parents' partitions are placed first (SPEC §5.4:
        // a replica partition waits for its parent partition, then avoids its owner).
        let replica_parent = |name: &str| {
            self.child_links
                .get(name)
                .filter(|l| l.replica)
                .map(|l| l.parent.clone())
        };
        let (replicas, plain): (Vec<String>, Vec<String>) = self
            .topics
            .iter()
            .filter(|(_, t)| t.assignments.iter().any(|a| a.owner.is_none()))
            .map(|(n, _)| n.clone())
            .partition(|n| replica_parent(n).is_some());
        for name in plain {
            let topic = Arc::make_mut(self.topics.get_mut(&name).expect("invariant: listed"));
            for (p, a) in topic.assignments.iter_mut().enumerate() {
                if a.owner.is_none() {
                    a.owner = Some(live[p % live.len()].clone());
                }
            }
        }
        for name in replicas {
            let parent = replica_parent(&name)
                .and_then(|pn| self.topics.get(&pn).cloned())
                .map(|t| t.assignments.clone())
                .unwrap_or_default();
            let topic = Arc::make_mut(self.topics.get_mut(&name).expect("invariant: listed"));
            for (p, a) in topic.assignments.iter_mut().enumerate() {
                if a.owner.is_none() {
                    *a = crate::children::assign_replica(&live, parent.get(p), p as u32);
                }
            }
        }
    }
}

// Moves, draining and member removal (SPEC §6.5). The controller and the movers propose;
// apply keeps the invariants: a move starts only from the current owner to a live,
// non-draining member, completes only as the compare-and-swap of the move that is in
// flight, and a member is forgotten only once it owns nothing.
impl MetaState {
    /// The compare-and-swap of a move's flip: `Ok(true)` while move `move_id` from `from` to
    /// `to` is in flight, `Ok(false)` when `to` already owns the partition with no move (a
    /// retried flip), else 409.
    fn flip_pending(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        from: &str,
        to: &str,
        move_id: u64,
    ) -> Result<bool, ApplyError> {
        let a = self.assignment(topic, topic_id, partition)?;
        if a.owner.as_deref() == Some(to) && a.target.is_none() {
            return Ok(false);
        }
        if a.owner.as_deref() != Some(from)
            || a.target.as_deref() != Some(to)
            || a.move_id != move_id
        {
            return Err(ApplyError::Conflict(format!(
                "move {move_id} of partition {partition} of {topic} is no longer in flight"
            )));
        }
        Ok(true)
    }

    /// `owner := to`, no move in flight.
    fn flip(&mut self, topic: &str, partition: u32, to: &str) {
        self.set_assignment(
            topic,
            partition,
            Assignment {
                owner: Some(to.to_string()),
                target: None,
                move_id: 0,
            },
        );
    }

    /// The assignment of partition `partition` of `topic`, checking the topic id (a topic
    /// re-created under the same name is another topic).
    fn assignment(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
    ) -> Result<&Assignment, ApplyError> {
        let t = self
            .topics
            .get(topic)
            .filter(|t| t.id == topic_id)
            .ok_or_else(|| ApplyError::NotFound(format!("topic {topic} not found")))?;
        t.assignments.get(partition as usize).ok_or_else(|| {
            ApplyError::NotFound(format!("topic {topic} has no partition {partition}"))
        })
    }

    fn set_assignment(&mut self, topic: &str, partition: u32, a: Assignment) {
        let t = self
            .topics
            .get_mut(topic)
            .expect("invariant: checked by assignment()");
        Arc::make_mut(t).assignments[partition as usize] = a;
    }

    /// Partitions `id` owns or is the target of.
    pub fn partitions_of(&self, id: &str) -> usize {
        self.topics
            .values()
            .flat_map(|t| t.assignments.iter())
            .filter(|a| a.owner.as_deref() == Some(id) || a.target.as_deref() == Some(id))
            .count()
    }

    fn apply_move(&mut self, cmd: &MetaCommand) -> Result<MetaResponse, ApplyError> {
        match cmd {
            MetaCommand::StartMove {
                topic,
                topic_id,
                partition,
                from,
                to,
            } => {
                let a = self.assignment(topic, *topic_id, *partition)?;
                if a.owner.as_deref() != Some(from.as_str()) {
                    return Err(ApplyError::Conflict(format!(
                        "partition {partition} of {topic} is not owned by {from}"
                    )));
                }
                if a.target.is_some() {
                    return Err(ApplyError::Conflict(format!(
                        "partition {partition} of {topic} is already moving"
                    )));
                }
                if to == from {
                    return Err(ApplyError::Invalid("a move needs another node".into()));
                }
                match self.members.get(to) {
                    Some(m) if !m.dead && !m.draining => {}
                    _ => {
                        return Err(ApplyError::Conflict(format!(
                            "{to} is not a live, non-draining member"
                        )))
                    }
                }
                let mut a = a.clone();
                self.last_move_id += 1;
                a.target = Some(to.clone());
                a.move_id = self.last_move_id;
                self.set_assignment(topic, *partition, a);
                Ok(MetaResponse::Ok)
            }
            MetaCommand::CompleteMove {
                topic,
                topic_id,
                partition,
                from,
                to,
                move_id,
            } => {
                if self.flip_pending(topic, *topic_id, *partition, from, to, *move_id)? {
                    self.flip(topic, *partition, to);
                }
                Ok(MetaResponse::Ok)
            }
            MetaCommand::ForceCompleteMove {
                topic,
                topic_id,
                partition,
                from,
                to,
                move_id,
                high_watermark,
            } => {
                if !self.flip_pending(topic, *topic_id, *partition, from, to, *move_id)? {
                    return Ok(MetaResponse::Ok);
                }
                if !self.members.get(from).is_some_and(|m| m.dead) {
                    return Err(ApplyError::Conflict(format!(
                        "{from} is not marked dead: the move completes by handoff"
                    )));
                }
                self.flip(topic, *partition, to);
                self.salvage.retain(|c| {
                    !(c.topic_id == *topic_id && c.partition == *partition && c.from == *from)
                });
                self.salvage.push(SalvageClaim {
                    topic_id: *topic_id,
                    partition: *partition,
                    from: from.clone(),
                    high_watermark: *high_watermark,
                });
                Ok(MetaResponse::Ok)
            }
            MetaCommand::SalvageDone {
                topic_id,
                partition,
                from,
            } => {
                self.salvage.retain(|c| {
                    !(c.topic_id == *topic_id && c.partition == *partition && c.from == *from)
                });
                Ok(MetaResponse::Ok)
            }
            MetaCommand::AbortMove {
                topic,
                topic_id,
                partition,
                move_id,
            } => {
                let a = self.assignment(topic, *topic_id, *partition)?;
                if a.target.is_some() && a.move_id == *move_id {
                    let mut a = a.clone();
                    a.target = None;
                    a.move_id = 0;
                    self.set_assignment(topic, *partition, a);
                }
                Ok(MetaResponse::Ok)
            }
            MetaCommand::SetDraining { id, draining } => {
                let m = self
                    .members
                    .get_mut(id)
                    .ok_or_else(|| ApplyError::NotFound(format!("member {id} not found")))?;
                m.draining = *draining;
                if !*draining {
                    self.assign_unassigned();
                }
                Ok(MetaResponse::Ok)
            }
            MetaCommand::RemoveMember { id } => {
                let m = self
                    .members
                    .get(id)
                    .ok_or_else(|| ApplyError::NotFound(format!("member {id} not found")))?;
                if !m.draining {
                    return Err(ApplyError::Conflict(format!("member {id} is not draining")));
                }
                let n = self.partitions_of(id);
                if n > 0 {
                    return Err(ApplyError::Conflict(format!(
                        "member {id} still holds {n} partitions"
                    )));
                }
                self.members.remove(id);
                Ok(MetaResponse::Ok)
            }
            other => unreachable!("apply_move called with another command: {other:?}"),
        }
    }
}

// Users and grants (SPEC §4). The proposer validates names, grants and who may do what
// (`narad::security::authz`) and hashes passwords; apply only keeps the invariants that must
// hold whoever proposes: names unique, exactly one root, root neither deleted nor regranted.
impl MetaState {
    /// Looks a user up by exact name.
    pub fn user(&self, username: &str) -> Option<&Arc<User>> {
        self.users.get(username)
    }

    /// The root user, once seeded.
    pub fn root_user(&self) -> Option<&Arc<User>> {
        self.users.values().find(|u| u.root)
    }

    fn bump_user_version(&mut self) -> u64 {
        let v = self.next_user_version;
        self.next_user_version += 1;
        v
    }

    fn existing_user(&self, username: &str) -> Result<&Arc<User>, ApplyError> {
        self.users
            .get(username)
            .ok_or_else(|| ApplyError::NotFound(format!("user {username} not found")))
    }

    /// Stores a changed `user` as of `now_ms` with a fresh version (which invalidates every
    /// cached credential of it).
    fn replace_user(&mut self, mut user: User, now_ms: u64) -> MetaResponse {
        user.updated_at_ms = now_ms;
        user.version = self.bump_user_version();
        let user = Arc::new(user);
        self.users.insert(user.username.clone(), user.clone());
        MetaResponse::User(user)
    }

    fn apply_user(&mut self, cmd: &MetaCommand) -> Result<MetaResponse, ApplyError> {
        match cmd {
            MetaCommand::CreateUser {
                username,
                password_hash,
                grants,
                root,
                now_ms,
            } => {
                if self.users.contains_key(username) {
                    return Err(ApplyError::Conflict(format!(
                        "user {username} already exists"
                    )));
                }
                if *root && self.root_user().is_some() {
                    return Err(ApplyError::Conflict("a root user already exists".into()));
                }
                let user = Arc::new(User {
                    username: username.clone(),
                    password_hash: password_hash.clone(),
                    grants: grants.clone(),
                    root: *root,
                    created_at_ms: *now_ms,
                    updated_at_ms: *now_ms,
                    version: self.bump_user_version(),
                    quotas: Default::default(),
                });
                self.users.insert(username.clone(), user.clone());
                Ok(MetaResponse::User(user))
            }
            MetaCommand::SetGrants {
                username,
                grants,
                now_ms,
            } => {
                let current = self.existing_user(username)?;
                if current.root {
                    return Err(ApplyError::Conflict(format!(
                        "the grants of root user {username} are fixed"
                    )));
                }
                let user = User {
                    grants: grants.clone(),
                    ..User::clone(current)
                };
                Ok(self.replace_user(user, *now_ms))
            }
            MetaCommand::SetPassword {
                username,
                password_hash,
                now_ms,
            } => {
                let user = User {
                    password_hash: password_hash.clone(),
                    ..User::clone(self.existing_user(username)?)
                };
                Ok(self.replace_user(user, *now_ms))
            }
            MetaCommand::SetQuotas {
                username,
                quotas,
                now_ms,
            } => {
                let current = self.existing_user(username)?;
                if current.root {
                    return Err(ApplyError::Conflict(format!(
                        "root user {username} has no quotas"
                    )));
                }
                let user = User {
                    quotas: *quotas,
                    ..User::clone(current)
                };
                Ok(self.replace_user(user, *now_ms))
            }
            MetaCommand::DeleteUser { username } => {
                if self.existing_user(username)?.root {
                    return Err(ApplyError::Conflict(format!(
                        "root user {username} cannot be deleted"
                    )));
                }
                let user = self
                    .users
                    .remove(username)
                    .expect("invariant: checked to exist above");
                Ok(MetaResponse::UserDeleted(user))
            }
            MetaCommand::SeedRoot {
                password_hash,
                now_ms,
            } => {
                if !self.users.is_empty() {
                    return Ok(MetaResponse::Ok);
                }
                let user = Arc::new(User {
                    username: ROOT_USERNAME.to_string(),
                    password_hash: password_hash.clone(),
                    grants: vec![Grant {
                        action: Action::Admin,
                        patterns: vec![],
                    }],
                    root: true,
                    created_at_ms: *now_ms,
                    updated_at_ms: *now_ms,
                    version: self.bump_user_version(),
                    quotas: Default::default(),
                });
                self.users.insert(ROOT_USERNAME.to_string(), user.clone());
                Ok(MetaResponse::User(user))
            }
            other => unreachable!("apply_user called with a non-user command: {other:?}"),
        }
    }
}

/// Partition `p` → live member `p mod n`; unassigned when nobody is live.
fn assign(live: &[NodeId], p: u32) -> Assignment {
    Assignment {
        owner: (!live.is_empty()).then(|| live[p as usize % live.len()].clone()),
        target: None,
        move_id: 0,
    }
}

/// The case-folded form of a topic name (names are ASCII `[A-Za-z0-9._-]`).
pub(crate) fn fold(name: &str) -> String {
    name.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TopicConfig;

    fn config(partitions: u32) -> TopicConfig {
        TopicConfig {
            partitions,
            retention_ms: 604_800_000,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            retry_backoff: None,
            dead_letter: None,
            dedup_window_ms: None,
        }
    }

    fn create(name: &str, partitions: u32) -> MetaCommand {
        MetaCommand::CreateTopic {
            name: name.into(),
            config: config(partitions),
            owner: None,
            schema: None,
            created_at_ms: 1_767_225_600_000,
        }
    }

    fn register(id: &str, now_ms: u64) -> MetaCommand {
        MetaCommand::RegisterMember {
            id: id.into(),
            api_addr: format!("{id}:7942"),
            cluster_addr: format!("{id}:7943"),
            version: "0.1.0".into(),
            now_ms,
        }
    }

    fn alter(name: &str, patch: TopicPatch) -> MetaCommand {
        MetaCommand::AlterTopic {
            name: name.into(),
            patch,
        }
    }

    fn topic(resp: MetaResponse) -> Arc<Topic> {
        match resp {
            MetaResponse::Topic(t) => t,
            other => panic!("expected a topic, got {other:?}"),
        }
    }

    fn owners(t: &Topic) -> Vec<Option<&str>> {
        t.assignments.iter().map(|a| a.owner.as_deref()).collect()
    }

    #[test]
    fn create_assigns_ids_and_round_robin() {
        let mut s = MetaState::default();
        for id in ["narad-2", "narad-0", "narad-1"] {
            s.apply(&register(id, 1)).unwrap();
        }
        let t = topic(s.apply(&create("orders", 5)).unwrap());
        assert_eq!(t.id, 0);
        assert_eq!(t.config.partitions, 5);
        assert_eq!(
            owners(&t),
            [
                Some("narad-0"),
                Some("narad-1"),
                Some("narad-2"),
                Some("narad-0"),
                Some("narad-1")
            ]
        );
        assert!(t.assignments.iter().all(|a| a.target.is_none()));
        assert!(t.schemas.is_empty());
        let t2 = topic(s.apply(&create("payments", 3)).unwrap());
        assert_eq!(t2.id, 1);
        assert_eq!(s.next_topic_id, 2);
        assert_eq!(s.topic("orders"), Some(&t));
    }

    #[test]
    fn create_skips_dead_and_draining_members() {
        let mut s = MetaState::default();
        for id in ["a", "b", "c", "d"] {
            s.apply(&register(id, 1)).unwrap();
        }
        s.members.get_mut("b").unwrap().dead = true;
        s.members.get_mut("c").unwrap().draining = true;
        let t = topic(s.apply(&create("t", 4)).unwrap());
        assert_eq!(owners(&t), [Some("a"), Some("d"), Some("a"), Some("d")]);
    }

    #[test]
    fn create_without_members_is_unassigned_until_one_registers() {
        let mut s = MetaState::default();
        let t = topic(s.apply(&create("t", 3)).unwrap());
        assert_eq!(owners(&t), [None, None, None]);
        s.apply(&register("n1", 5)).unwrap();
        assert_eq!(owners(&s.topics["t"]), [Some("n1"); 3]);
        // A second member does not steal assigned partitions (assignments are sticky).
        s.apply(&register("n0", 6)).unwrap();
        assert_eq!(owners(&s.topics["t"]), [Some("n1"); 3]);
    }

    #[test]
    fn create_with_schema_is_version_1() {
        let mut s = MetaState::default();
        let cmd = MetaCommand::CreateTopic {
            name: "s".into(),
            config: config(3),
            owner: Some("svc".into()),
            schema: Some(r#"{"type":"object"}"#.into()),
            created_at_ms: 42,
        };
        let t = topic(s.apply(&cmd).unwrap());
        assert_eq!(
            t.current_schema(),
            Some(&SchemaVersion {
                version: 1,
                schema: r#"{"type":"object"}"#.into()
            })
        );
        assert_eq!(t.owner.as_deref(), Some("svc"));
        assert_eq!(t.created_at_ms, 42);
    }

    #[test]
    fn create_refuses_exact_and_case_duplicates() {
        let mut s = MetaState::default();
        s.apply(&create("Orders", 3)).unwrap();
        let before = s.clone();
        match s.apply(&create("Orders", 3)) {
            Err(ApplyError::Conflict(m)) => assert_eq!(m, "topic Orders already exists"),
            other => panic!("{other:?}"),
        }
        match s.apply(&create("orders", 3)) {
            Err(ApplyError::Conflict(m)) => {
                assert!(m.contains("differs only in letter case"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        match s.apply(&create("ORDERS", 3)) {
            Err(ApplyError::Conflict(m)) => {
                assert!(m.contains("differs only in letter case"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s, before, "a refused create changes nothing");
    }

    #[test]
    fn ids_are_never_reused() {
        let mut s = MetaState::default();
        let a = topic(s.apply(&create("t", 3)).unwrap());
        match s
            .apply(&MetaCommand::DeleteTopic { name: "t".into() })
            .unwrap()
        {
            MetaResponse::Deleted(d) => assert_eq!(d, a),
            other => panic!("{other:?}"),
        }
        assert!(s.topics.is_empty());
        assert!(s.topic_names_folded.is_empty());
        // Re-create under the same name, and under a case variant: new ids each time.
        let b = topic(s.apply(&create("t", 3)).unwrap());
        assert_eq!((a.id, b.id), (0, 1));
        s.apply(&MetaCommand::DeleteTopic { name: "t".into() })
            .unwrap();
        let c = topic(s.apply(&create("T", 3)).unwrap());
        assert_eq!(c.id, 2);
        assert_eq!(s.next_topic_id, 3);
    }

    #[test]
    fn delete_missing_is_not_found() {
        let mut s = MetaState::default();
        assert!(matches!(
            s.apply(&MetaCommand::DeleteTopic { name: "x".into() }),
            Err(ApplyError::NotFound(_))
        ));
        assert_eq!(s, MetaState::default());
    }

    #[test]
    fn pause_and_resume_change_only_the_flag_and_older_records_read_unpaused() {
        let mut s = MetaState::default();
        s.apply(&register("a", 1)).unwrap();
        let before = topic(s.apply(&create("t", 3)).unwrap());
        assert!(!before.paused);
        let pause = TopicPatch {
            paused: Some(true),
            ..Default::default()
        };
        let paused = topic(s.apply(&alter("t", pause.clone())).unwrap());
        assert!(paused.paused);
        assert_eq!(
            Topic {
                paused: false,
                ..(*paused).clone()
            },
            *before
        );
        // Idempotent, and resumed by the opposite patch.
        assert!(topic(s.apply(&alter("t", pause)).unwrap()).paused);
        let resumed = TopicPatch {
            paused: Some(false),
            ..Default::default()
        };
        assert_eq!(*topic(s.apply(&alter("t", resumed)).unwrap()), *before);
        // A topic and a patch written by a build without the flag.
        let mut old = serde_json::to_value(&*before).unwrap();
        old.as_object_mut().unwrap().remove("paused");
        assert!(!serde_json::from_value::<Topic>(old).unwrap().paused);
        let patch: TopicPatch = serde_json::from_str(r#"{"partitions":4,"retention_ms":null,"visibility_timeout_ms":null,"max_in_flight_per_partition":null,"max_acked_ahead_per_partition":null,"schema":null,"schema_base_version":null}"#).unwrap();
        assert_eq!(patch.paused, None);
    }

    #[test]
    fn a_backoff_doubles_from_min_to_max_without_overflow() {
        use crate::types::Backoff;
        let b = Backoff {
            min_ms: 250,
            max_ms: 1_000,
        };
        let waits: Vec<u64> = (0..5).map(|n| b.after(n)).collect();
        assert_eq!(waits, [250, 250, 500, 1_000, 1_000]);
        let huge = Backoff {
            min_ms: u64::MAX / 2,
            max_ms: u64::MAX,
        };
        assert_eq!(huge.after(3), u64::MAX);
        assert_eq!(b.after(u32::MAX), 1_000);
        // Set and cleared through a patch.
        let mut s = MetaState::default();
        s.apply(&register("a", 1)).unwrap();
        s.apply(&create("t", 3)).unwrap();
        let set = TopicPatch {
            retry_backoff: Some(b),
            ..Default::default()
        };
        let t = topic(s.apply(&alter("t", set)).unwrap());
        assert_eq!(t.config.retry_backoff, Some(b));
        let off = TopicPatch {
            retry_backoff: Some(Backoff {
                min_ms: 0,
                max_ms: 0,
            }),
            ..Default::default()
        };
        assert_eq!(
            topic(s.apply(&alter("t", off)).unwrap())
                .config
                .retry_backoff,
            None
        );
    }

    #[test]
    fn alter_missing_is_not_found() {
        let mut s = MetaState::default();
        assert!(matches!(
            s.apply(&alter("x", TopicPatch::default())),
            Err(ApplyError::NotFound(_))
        ));
    }

    #[test]
    fn alter_grows_and_assigns_new_partitions_round_robin() {
        let mut s = MetaState::default();
        s.apply(&register("a", 1)).unwrap();
        s.apply(&register("b", 1)).unwrap();
        s.apply(&create("t", 3)).unwrap();
        assert_eq!(owners(&s.topics["t"]), [Some("a"), Some("b"), Some("a")]);
        s.apply(&register("c", 2)).unwrap();
        let t = topic(
            s.apply(&alter(
                "t",
                TopicPatch {
                    partitions: Some(6),
                    ..Default::default()
                },
            ))
            .unwrap(),
        );
        // Old partitions stay put; new partition p → live[p mod 3].
        assert_eq!(
            owners(&t),
            [
                Some("a"),
                Some("b"),
                Some("a"),
                Some("a"),
                Some("b"),
                Some("c")
            ]
        );
        assert_eq!(t.config.partitions, 6);
        assert_eq!(t.id, 0, "altering keeps the id");
    }

    #[test]
    fn alter_refuses_shrink_or_same() {
        let mut s = MetaState::default();
        s.apply(&create("t", 4)).unwrap();
        for p in [3, 4] {
            let before = s.clone();
            let r = s.apply(&alter(
                "t",
                TopicPatch {
                    partitions: Some(p),
                    retention_ms: Some(1),
                    ..Default::default()
                },
            ));
            assert!(matches!(r, Err(ApplyError::Invalid(_))), "{r:?}");
            assert_eq!(s, before, "a failing field leaves everything unchanged");
        }
    }

    #[test]
    fn alter_replaces_fields_and_appends_schema() {
        let mut s = MetaState::default();
        s.apply(&create("t", 3)).unwrap();
        let t = topic(
            s.apply(&alter(
                "t",
                TopicPatch {
                    retention_ms: Some(0),
                    visibility_timeout_ms: Some(5_000),
                    max_in_flight_per_partition: Some(7),
                    max_acked_ahead_per_partition: Some(8),
                    schema: Some("{}".into()),
                    schema_base_version: Some(0),
                    ..Default::default()
                },
            ))
            .unwrap(),
        );
        assert_eq!(t.config.retention_ms, 0);
        assert_eq!(t.config.visibility_timeout_ms, 5_000);
        assert_eq!(t.config.max_in_flight_per_partition, 7);
        assert_eq!(t.config.max_acked_ahead_per_partition, 8);
        assert_eq!(t.config.partitions, 3);
        assert_eq!(t.current_schema().unwrap().version, 1);
        let t = topic(
            s.apply(&alter(
                "t",
                TopicPatch {
                    schema: Some(r#"{"type":"object"}"#.into()),
                    schema_base_version: Some(1),
                    ..Default::default()
                },
            ))
            .unwrap(),
        );
        assert_eq!(
            t.schemas.iter().map(|v| v.version).collect::<Vec<_>>(),
            [1, 2],
            "history is kept, oldest first"
        );
        assert_eq!(s.topics["t"], t);
    }

    #[test]
    fn alter_schema_base_conflict_is_atomic() {
        let mut s = MetaState::default();
        s.apply(&register("a", 1)).unwrap();
        s.apply(&MetaCommand::CreateTopic {
            name: "t".into(),
            config: config(3),
            owner: None,
            schema: Some("{}".into()),
            created_at_ms: 1,
        })
        .unwrap();
        let before = s.clone();
        for base in [0, 2] {
            let r = s.apply(&alter(
                "t",
                TopicPatch {
                    partitions: Some(9),
                    retention_ms: Some(1),
                    schema: Some(r#"{"type":"object"}"#.into()),
                    schema_base_version: Some(base),
                    ..Default::default()
                },
            ));
            match r {
                Err(ApplyError::Conflict(m)) => assert_eq!(m, "topic changed since it was read"),
                other => panic!("{other:?}"),
            }
            assert_eq!(s, before);
        }
        // The base alone (no schema) is also a precondition.
        let r = s.apply(&alter(
            "t",
            TopicPatch {
                retention_ms: Some(1),
                schema_base_version: Some(1),
                ..Default::default()
            },
        ));
        assert_eq!(topic(r.unwrap()).config.retention_ms, 1);
    }

    #[test]
    fn register_member_upserts_and_keeps_draining() {
        let mut s = MetaState::default();
        assert_eq!(s.apply(&register("a", 1)).unwrap(), MetaResponse::Ok);
        {
            let m = s.members.get_mut("a").unwrap();
            m.dead = true;
            m.draining = true;
        }
        s.apply(&MetaCommand::RegisterMember {
            id: "a".into(),
            api_addr: "new:1".into(),
            cluster_addr: "new:2".into(),
            version: "0.2.0".into(),
            now_ms: 99,
        })
        .unwrap();
        assert_eq!(
            s.members["a"],
            Member {
                id: "a".into(),
                api_addr: "new:1".into(),
                cluster_addr: "new:2".into(),
                version: "0.2.0".into(),
                last_seen_ms: 99,
                dead: false,
                draining: true,
            }
        );
        // A draining member is not live: it gets no unassigned partitions.
        s.apply(&create("t", 2)).unwrap();
        assert_eq!(owners(&s.topics["t"]), [None, None]);
        s.apply(&register("b", 100)).unwrap();
        assert_eq!(owners(&s.topics["t"]), [Some("b"), Some("b")]);
    }

    #[test]
    fn apply_is_deterministic() {
        let cmds = [
            register("n2", 1),
            create("x", 3),
            register("n1", 2),
            create("y", 4),
            alter(
                "x",
                TopicPatch {
                    partitions: Some(5),
                    ..Default::default()
                },
            ),
            MetaCommand::DeleteTopic { name: "y".into() },
            create("Y", 3),
        ];
        let run = || {
            let mut s = MetaState::default();
            let rs: Vec<_> = cmds.iter().map(|c| s.apply(c)).collect();
            (s, rs)
        };
        assert_eq!(run(), run());
        // And the state round-trips through serde (snapshots).
        let (s, _) = run();
        let back: MetaState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}

#[cfg(test)]
mod user_tests {
    use super::*;
    use crate::types::Quotas;

    fn grant(action: Action, patterns: &[&str]) -> Grant {
        Grant {
            action,
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
        }
    }

    fn create_user(name: &str, hash: &str, now_ms: u64) -> MetaCommand {
        MetaCommand::CreateUser {
            username: name.into(),
            password_hash: hash.into(),
            grants: vec![grant(Action::Produce, &["orders-*"])],
            root: false,
            now_ms,
        }
    }

    fn seed(hash: &str, now_ms: u64) -> MetaCommand {
        MetaCommand::SeedRoot {
            password_hash: hash.into(),
            now_ms,
        }
    }

    fn user(resp: MetaResponse) -> Arc<User> {
        match resp {
            MetaResponse::User(u) => u,
            other => panic!("expected a user, got {other:?}"),
        }
    }

    fn refused(s: &mut MetaState, cmd: MetaCommand) -> ApplyError {
        let before = s.clone();
        let e = s.apply(&cmd).expect_err("must be refused");
        assert_eq!(*s, before, "a refused command changes nothing");
        e
    }

    #[test]
    fn seed_root_only_when_no_user_exists_and_never_overwrites() {
        let mut s = MetaState::default();
        let root = user(s.apply(&seed("h1", 10)).unwrap());
        assert_eq!(root.username, ROOT_USERNAME);
        assert!(root.root && root.is_admin());
        assert_eq!(root.grants, vec![grant(Action::Admin, &[])]);
        assert_eq!((root.created_at_ms, root.updated_at_ms), (10, 10));
        assert_eq!(s.root_user(), Some(&root));
        // Idempotent: a later seed (another node, a restart) changes nothing.
        let before = s.clone();
        assert_eq!(s.apply(&seed("h2", 20)).unwrap(), MetaResponse::Ok);
        assert_eq!(s, before);
        assert_eq!(s.user("admin").unwrap().password_hash, "h1");

        // Users exist but none is root (e.g. created while security was off): no seeding.
        let mut s = MetaState::default();
        s.apply(&create_user("billing", "h", 1)).unwrap();
        assert_eq!(s.apply(&seed("h2", 20)).unwrap(), MetaResponse::Ok);
        assert!(s.root_user().is_none());
        assert_eq!(s.users.len(), 1);
    }

    #[test]
    fn create_user_and_conflicts() {
        let mut s = MetaState::default();
        s.apply(&seed("root", 1)).unwrap();
        let u = user(s.apply(&create_user("billing", "h", 5)).unwrap());
        assert_eq!(u.username, "billing");
        assert_eq!(u.password_hash, "h");
        assert!(!u.root && !u.is_admin());
        assert_eq!((u.created_at_ms, u.updated_at_ms), (5, 5));
        assert_eq!(s.user("billing"), Some(&u));
        assert!(s.user("Billing").is_none(), "names are case-sensitive");
        match refused(&mut s, create_user("billing", "other", 6)) {
            ApplyError::Conflict(m) => assert_eq!(m, "user billing already exists"),
            other => panic!("{other:?}"),
        }
        match refused(&mut s, create_user("admin", "other", 6)) {
            ApplyError::Conflict(m) => assert_eq!(m, "user admin already exists"),
            other => panic!("{other:?}"),
        }
        // Exactly one root.
        let second_root = MetaCommand::CreateUser {
            username: "root2".into(),
            password_hash: "h".into(),
            grants: vec![],
            root: true,
            now_ms: 7,
        };
        assert!(matches!(
            refused(&mut s, second_root),
            ApplyError::Conflict(_)
        ));
    }

    #[test]
    fn set_grants() {
        let mut s = MetaState::default();
        s.apply(&seed("root", 1)).unwrap();
        let u0 = user(s.apply(&create_user("billing", "h", 5)).unwrap());
        let new = vec![
            grant(Action::Consume, &["orders", "pay-*"]),
            grant(Action::Create, &["*"]),
        ];
        let u = user(
            s.apply(&MetaCommand::SetGrants {
                username: "billing".into(),
                grants: new.clone(),
                now_ms: 9,
            })
            .unwrap(),
        );
        assert_eq!(u.grants, new);
        assert_eq!((u.created_at_ms, u.updated_at_ms), (5, 9));
        assert_eq!(u.password_hash, "h");
        assert!(u.version > u0.version);
        // Empty grants are allowed (a user with no rights).
        let u = user(
            s.apply(&MetaCommand::SetGrants {
                username: "billing".into(),
                grants: vec![],
                now_ms: 10,
            })
            .unwrap(),
        );
        assert!(u.grants.is_empty());
        match refused(
            &mut s,
            MetaCommand::SetGrants {
                username: "nobody".into(),
                grants: vec![],
                now_ms: 9,
            },
        ) {
            ApplyError::NotFound(m) => assert_eq!(m, "user nobody not found"),
            other => panic!("{other:?}"),
        }
        // Root's grants are fixed, whoever proposes.
        assert!(matches!(
            refused(
                &mut s,
                MetaCommand::SetGrants {
                    username: "admin".into(),
                    grants: vec![],
                    now_ms: 9,
                }
            ),
            ApplyError::Conflict(_)
        ));
    }

    #[test]
    fn quotas_are_set_per_user_and_max_topics_counts_owned_topics() {
        let mut s = MetaState::default();
        s.apply(&seed("root", 1)).unwrap();
        let u0 = user(s.apply(&create_user("billing", "h", 5)).unwrap());
        assert!(u0.quotas.is_none());
        let q = Quotas {
            produce_msgs_per_s: Some(100),
            produce_bytes_per_s: None,
            max_topics: Some(2),
            consume_in_flight: Some(10),
        };
        let set = |q| MetaCommand::SetQuotas {
            username: "billing".into(),
            quotas: q,
            now_ms: 9,
        };
        let u = user(s.apply(&set(q)).unwrap());
        assert_eq!(u.quotas, q);
        assert!(u.version > u0.version, "cached credentials see the change");
        let owned = |name: &str, owner: Option<&str>| MetaCommand::CreateTopic {
            name: name.into(),
            config: crate::types::TopicConfig {
                partitions: 3,
                retention_ms: 3_600_000,
                visibility_timeout_ms: 30_000,
                max_in_flight_per_partition: 1024,
                max_acked_ahead_per_partition: 1024,
                retry_backoff: None,
                dead_letter: None,
                dedup_window_ms: None,
            },
            owner: owner.map(String::from),
            schema: None,
            created_at_ms: 1,
        };
        s.apply(&owned("a", Some("billing"))).unwrap();
        s.apply(&owned("other", Some("admin"))).unwrap();
        s.apply(&owned("b", Some("billing"))).unwrap();
        match refused(&mut s, owned("c", Some("billing"))) {
            ApplyError::QuotaExceeded(m) => {
                assert_eq!(m, "user billing owns 2 topics, its max_topics quota is 2")
            }
            other => panic!("{other:?}"),
        }
        // Deleting one frees its place; without an owner (security off) nothing counts.
        s.apply(&MetaCommand::DeleteTopic { name: "a".into() })
            .unwrap();
        s.apply(&owned("c", Some("billing"))).unwrap();
        s.apply(&owned("d", None)).unwrap();
        // Lifting the quota (all None) lifts the limit; the record serializes without it.
        let u = user(s.apply(&set(Quotas::default())).unwrap());
        assert!(!serde_json::to_string(&*u).unwrap().contains("quotas"));
        s.apply(&owned("e", Some("billing"))).unwrap();
        assert!(matches!(
            refused(
                &mut s,
                MetaCommand::SetQuotas {
                    username: "admin".into(),
                    quotas: q,
                    now_ms: 9
                }
            ),
            ApplyError::Conflict(_)
        ));
        assert!(matches!(
            refused(
                &mut s,
                MetaCommand::SetQuotas {
                    username: "nobody".into(),
                    quotas: q,
                    now_ms: 9
                }
            ),
            ApplyError::NotFound(_)
        ));
    }

    #[test]
    fn set_password_changes_hash_and_version() {
        let mut s = MetaState::default();
        s.apply(&seed("root", 1)).unwrap();
        let u0 = user(s.apply(&create_user("billing", "h", 5)).unwrap());
        let u = user(
            s.apply(&MetaCommand::SetPassword {
                username: "billing".into(),
                password_hash: "h2".into(),
                now_ms: 5, // same millisecond: the version still changes
            })
            .unwrap(),
        );
        assert_eq!(u.password_hash, "h2");
        assert_eq!(u.grants, u0.grants);
        assert_ne!(u.version, u0.version);
        // Root may have its password changed (authz decides who may ask).
        let r = user(
            s.apply(&MetaCommand::SetPassword {
                username: "admin".into(),
                password_hash: "r2".into(),
                now_ms: 6,
            })
            .unwrap(),
        );
        assert!(r.root);
        assert_eq!(r.password_hash, "r2");
        assert!(matches!(
            refused(
                &mut s,
                MetaCommand::SetPassword {
                    username: "nobody".into(),
                    password_hash: "x".into(),
                    now_ms: 7,
                }
            ),
            ApplyError::NotFound(_)
        ));
    }

    #[test]
    fn delete_user_and_recreate_gets_a_new_version() {
        let mut s = MetaState::default();
        s.apply(&seed("root", 1)).unwrap();
        let u0 = user(s.apply(&create_user("billing", "h", 5)).unwrap());
        match s
            .apply(&MetaCommand::DeleteUser {
                username: "billing".into(),
            })
            .unwrap()
        {
            MetaResponse::UserDeleted(d) => assert_eq!(d, u0),
            other => panic!("{other:?}"),
        }
        assert!(s.user("billing").is_none());
        assert!(matches!(
            refused(
                &mut s,
                MetaCommand::DeleteUser {
                    username: "billing".into()
                }
            ),
            ApplyError::NotFound(_)
        ));
        match refused(
            &mut s,
            MetaCommand::DeleteUser {
                username: "admin".into(),
            },
        ) {
            ApplyError::Conflict(m) => assert_eq!(m, "root user admin cannot be deleted"),
            other => panic!("{other:?}"),
        }
        // Same name, same hash, same millisecond: still a different version.
        let u1 = user(s.apply(&create_user("billing", "h", 5)).unwrap());
        assert_ne!(u1.version, u0.version);
    }

    #[test]
    fn users_are_deterministic_and_survive_snapshots() {
        let cmds = [
            seed("root", 1),
            create_user("a", "ha", 2),
            create_user("b", "hb", 3),
            MetaCommand::SetGrants {
                username: "a".into(),
                grants: vec![grant(Action::Admin, &[])],
                now_ms: 4,
            },
            MetaCommand::DeleteUser {
                username: "b".into(),
            },
            MetaCommand::SetPassword {
                username: "a".into(),
                password_hash: "ha2".into(),
                now_ms: 5,
            },
        ];
        let run = || {
            let mut s = MetaState::default();
            let rs: Vec<_> = cmds.iter().map(|c| s.apply(c)).collect();
            (s, rs)
        };
        assert_eq!(run(), run());
        let (s, _) = run();
        let back: MetaState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert!(back.user("a").unwrap().is_admin());
    }

    #[test]
    fn old_snapshots_without_users_still_load() {
        let mut s = MetaState::default();
        s.apply(&MetaCommand::CreateTopic {
            name: "t".into(),
            config: crate::types::TopicConfig {
                partitions: 3,
                retention_ms: 0,
                visibility_timeout_ms: 30_000,
                max_in_flight_per_partition: 1024,
                max_acked_ahead_per_partition: 1024,
                retry_backoff: None,
                dead_letter: None,
                dedup_window_ms: None,
            },
            owner: None,
            schema: None,
            created_at_ms: 1,
        })
        .unwrap();
        let mut v: serde_json::Value = serde_json::to_value(&s).unwrap();
        let obj = v.as_object_mut().unwrap();
        obj.remove("users");
        obj.remove("next_user_version");
        let back: MetaState = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        assert!(back.users.is_empty());
    }

    #[test]
    fn debug_never_shows_the_hash() {
        let mut s = MetaState::default();
        let u = user(s.apply(&seed("$argon2id$secret", 1)).unwrap());
        let dbg = format!("{u:?} {s:?}");
        assert!(!dbg.contains("secret"), "{dbg}");
    }
}

#[cfg(test)]
mod move_tests {
    use super::*;
    use crate::types::TopicConfig;

    fn register(id: &str, now_ms: u64) -> MetaCommand {
        MetaCommand::RegisterMember {
            id: id.into(),
            api_addr: format!("{id}:7942"),
            cluster_addr: format!("{id}:7943"),
            version: "0.1.0".into(),
            now_ms,
        }
    }

    /// Members a, b, c; topic `t` (id 0) with 3 partitions on a, b, c.
    fn cluster() -> MetaState {
        let mut s = MetaState::default();
        for id in ["a", "b", "c"] {
            s.apply(&register(id, 1)).unwrap();
        }
        s.apply(&MetaCommand::CreateTopic {
            name: "t".into(),
            config: TopicConfig {
                partitions: 3,
                retention_ms: 0,
                visibility_timeout_ms: 30_000,
                max_in_flight_per_partition: 1024,
                max_acked_ahead_per_partition: 1024,
                retry_backoff: None,
                dead_letter: None,
                dedup_window_ms: None,
            },
            owner: None,
            schema: None,
            created_at_ms: 1,
        })
        .unwrap();
        s
    }

    fn start(p: u32, from: &str, to: &str) -> MetaCommand {
        MetaCommand::StartMove {
            topic: "t".into(),
            topic_id: 0,
            partition: p,
            from: from.into(),
            to: to.into(),
        }
    }

    fn complete(p: u32, from: &str, to: &str, move_id: u64) -> MetaCommand {
        MetaCommand::CompleteMove {
            topic: "t".into(),
            topic_id: 0,
            partition: p,
            from: from.into(),
            to: to.into(),
            move_id,
        }
    }

    fn abort(p: u32, move_id: u64) -> MetaCommand {
        MetaCommand::AbortMove {
            topic: "t".into(),
            topic_id: 0,
            partition: p,
            move_id,
        }
    }

    fn a(s: &MetaState, p: usize) -> Assignment {
        s.topics["t"].assignments[p].clone()
    }

    fn refused(s: &mut MetaState, cmd: MetaCommand) -> ApplyError {
        let before = s.clone();
        let e = s.apply(&cmd).expect_err("must be refused");
        assert_eq!(*s, before, "a refused command changes nothing");
        e
    }

    #[test]
    fn start_move_sets_target_and_a_fresh_id() {
        let mut s = cluster();
        s.apply(&register("d", 2)).unwrap();
        s.apply(&start(0, "a", "d")).unwrap();
        assert_eq!(
            a(&s, 0),
            Assignment {
                owner: Some("a".into()),
                target: Some("d".into()),
                move_id: 1
            }
        );
        s.apply(&start(1, "b", "d")).unwrap();
        assert_eq!(a(&s, 1).move_id, 2);
        // Already moving, wrong owner, self, unknown / dead / draining target, wrong topic id.
        assert!(matches!(
            refused(&mut s, start(0, "a", "c")),
            ApplyError::Conflict(_)
        ));
        assert!(matches!(
            refused(&mut s, start(2, "a", "d")),
            ApplyError::Conflict(_)
        ));
        assert!(matches!(
            refused(&mut s, start(2, "c", "c")),
            ApplyError::Invalid(_)
        ));
        assert!(matches!(
            refused(&mut s, start(2, "c", "zz")),
            ApplyError::Conflict(_)
        ));
        s.apply(&MetaCommand::MarkMemberDead {
            id: "b".into(),
            last_seen_ms: 1,
        })
        .unwrap();
        assert!(matches!(
            refused(&mut s, start(2, "c", "b")),
            ApplyError::Conflict(_)
        ));
        s.apply(&MetaCommand::SetDraining {
            id: "a".into(),
            draining: true,
        })
        .unwrap();
        assert!(matches!(
            refused(&mut s, start(2, "c", "a")),
            ApplyError::Conflict(_)
        ));
        let wrong_id = MetaCommand::StartMove {
            topic: "t".into(),
            topic_id: 9,
            partition: 2,
            from: "c".into(),
            to: "d".into(),
        };
        assert!(matches!(refused(&mut s, wrong_id), ApplyError::NotFound(_)));
        assert!(matches!(
            refused(&mut s, start(7, "c", "d")),
            ApplyError::NotFound(_)
        ));
    }

    #[test]
    fn complete_move_is_a_compare_and_swap() {
        let mut s = cluster();
        s.apply(&register("d", 2)).unwrap();
        s.apply(&start(0, "a", "d")).unwrap();
        // Wrong id, wrong source, wrong target: refused.
        assert!(matches!(
            refused(&mut s, complete(0, "a", "d", 7)),
            ApplyError::Conflict(_)
        ));
        assert!(matches!(
            refused(&mut s, complete(0, "b", "d", 1)),
            ApplyError::Conflict(_)
        ));
        assert!(matches!(
            refused(&mut s, complete(0, "a", "c", 1)),
            ApplyError::Conflict(_)
        ));
        s.apply(&complete(0, "a", "d", 1)).unwrap();
        assert_eq!(
            a(&s, 0),
            Assignment {
                owner: Some("d".into()),
                target: None,
                move_id: 0
            }
        );
        // A retried flip is answered Ok and changes nothing.
        let before = s.clone();
        s.apply(&complete(0, "a", "d", 1)).unwrap();
        assert_eq!(s, before);
    }

    #[test]
    fn a_forced_flip_needs_a_dead_owner_and_leaves_a_salvage_claim() {
        let mut s = cluster();
        s.apply(&register("d", 2)).unwrap();
        s.apply(&start(0, "a", "d")).unwrap();
        let force = |move_id, hwm| MetaCommand::ForceCompleteMove {
            topic: "t".into(),
            topic_id: 0,
            partition: 0,
            from: "a".into(),
            to: "d".into(),
            move_id,
            high_watermark: hwm,
        };
        // The owner is alive: the move must complete by handoff.
        assert!(matches!(
            refused(&mut s, force(1, 40)),
            ApplyError::Conflict(_)
        ));
        s.apply(&MetaCommand::MarkMemberDead {
            id: "a".into(),
            last_seen_ms: 1,
        })
        .unwrap();
        // Wrong move id: refused even with a dead owner.
        assert!(matches!(
            refused(&mut s, force(9, 40)),
            ApplyError::Conflict(_)
        ));
        s.apply(&force(1, 40)).unwrap();
        assert_eq!(a(&s, 0).owner.as_deref(), Some("d"));
        assert_eq!(a(&s, 0).target, None);
        assert_eq!(
            s.salvage_claim(0, 0, "a").map(|c| c.high_watermark),
            Some(40)
        );
        // Retried: Ok, unchanged.
        let before = s.clone();
        s.apply(&force(1, 40)).unwrap();
        assert_eq!(s, before);
        // Settled once; settling again is a no-op.
        let done = MetaCommand::SalvageDone {
            topic_id: 0,
            partition: 0,
            from: "a".into(),
        };
        s.apply(&done).unwrap();
        assert!(s.salvage.is_empty());
        s.apply(&done).unwrap();
        // Deleting the topic drops its claims.
        s.apply(&start(1, "b", "d")).unwrap();
        s.apply(&MetaCommand::MarkMemberDead {
            id: "b".into(),
            last_seen_ms: 1,
        })
        .unwrap();
        s.apply(&MetaCommand::ForceCompleteMove {
            topic: "t".into(),
            topic_id: 0,
            partition: 1,
            from: "b".into(),
            to: "d".into(),
            move_id: 2,
            high_watermark: 3,
        })
        .unwrap();
        assert_eq!(s.salvage.len(), 1);
        s.apply(&MetaCommand::DeleteTopic { name: "t".into() })
            .unwrap();
        assert!(s.salvage.is_empty());
    }

    #[test]
    fn an_aborted_move_never_completes_even_when_restarted() {
        let mut s = cluster();
        s.apply(&register("d", 2)).unwrap();
        s.apply(&start(0, "a", "d")).unwrap();
        s.apply(&abort(0, 1)).unwrap();
        assert_eq!(a(&s, 0).target, None);
        // Idempotent, and an abort of another id leaves a newer move alone.
        s.apply(&abort(0, 1)).unwrap();
        s.apply(&start(0, "a", "d")).unwrap();
        assert_eq!(a(&s, 0).move_id, 2);
        let before = s.clone();
        s.apply(&abort(0, 1)).unwrap();
        assert_eq!(s, before);
        // The old move's late flip is refused; the new one's goes through.
        assert!(matches!(
            refused(&mut s, complete(0, "a", "d", 1)),
            ApplyError::Conflict(_)
        ));
        s.apply(&complete(0, "a", "d", 2)).unwrap();
        assert_eq!(a(&s, 0).owner.as_deref(), Some("d"));
        // Abort after completion: no-op.
        let before = s.clone();
        s.apply(&abort(0, 2)).unwrap();
        assert_eq!(s, before);
    }

    #[test]
    fn draining_survives_heartbeats_and_gates_placement_and_removal() {
        let mut s = cluster();
        assert!(matches!(
            refused(
                &mut s,
                MetaCommand::SetDraining {
                    id: "zz".into(),
                    draining: true
                }
            ),
            ApplyError::NotFound(_)
        ));
        s.apply(&MetaCommand::SetDraining {
            id: "c".into(),
            draining: true,
        })
        .unwrap();
        s.apply(&register("c", 5)).unwrap();
        assert!(s.members["c"].draining, "a heartbeat keeps draining");
        assert_eq!(s.live_members(), ["a", "b"]);
        // Not removable while it owns a partition (or is a move target).
        match refused(&mut s, MetaCommand::RemoveMember { id: "c".into() }) {
            ApplyError::Conflict(m) => assert_eq!(m, "member c still holds 1 partitions"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            refused(&mut s, MetaCommand::RemoveMember { id: "a".into() }),
            ApplyError::Conflict(_)
        ));
        s.apply(&start(2, "c", "a")).unwrap();
        s.apply(&complete(2, "c", "a", 1)).unwrap();
        s.apply(&MetaCommand::RemoveMember { id: "c".into() })
            .unwrap();
        assert!(!s.members.contains_key("c"));
        // Cancelling a decommission makes the member live again.
        s.apply(&MetaCommand::SetDraining {
            id: "b".into(),
            draining: true,
        })
        .unwrap();
        s.apply(&MetaCommand::SetDraining {
            id: "b".into(),
            draining: false,
        })
        .unwrap();
        assert_eq!(s.live_members(), ["a", "b"]);
        // And the state round-trips (snapshots), move ids included.
        let back: MetaState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.last_move_id, 1);
    }
}
