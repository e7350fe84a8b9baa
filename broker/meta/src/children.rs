//! Child links in the state machine (SPEC §5.1–5.4, §3.3 create with `parent`, §3.7):
//! attach, detach, create-with-parent, and the rules other commands must respect while links
//! exist (retention vs delay children, schema history, deletes). Deterministic like the rest
//! of `apply`: every check runs before anything is mutated.

use std::sync::Arc;

use crate::state::fold;
use crate::types::{
    ApplyError, Assignment, ChildLink, MetaCommand, MetaResponse, MetaState, NodeId, RemoteLink,
    SchemaVersion, Topic, TopicConfig, TopicPatch, DELAY_RETENTION_MARGIN_MS, MAX_CHILDREN,
    MAX_FANOUT_DELAY_MS,
};

impl MetaState {
    /// The link of `child` to its parent, if attached.
    pub fn parent_link(&self, child: &str) -> Option<&ChildLink> {
        self.child_links.get(child)
    }

    /// The local children of `parent`, in attach order.
    pub fn children_of(&self, parent: &str) -> Vec<&ChildLink> {
        let mut v: Vec<&ChildLink> = self
            .child_links
            .values()
            .filter(|l| l.parent == parent)
            .collect();
        v.sort_by_key(|l| l.epoch);
        v
    }

    /// The remote child links of `parent` (SPEC §5.5), in attach order.
    pub fn remote_links_of(&self, parent: &str) -> Vec<&RemoteLink> {
        let mut v: Vec<&RemoteLink> = self
            .remote_links
            .get(parent)
            .map(|m| m.values().collect())
            .unwrap_or_default();
        v.sort_by_key(|l| l.epoch);
        v
    }

    /// The remote link `link` of `parent`, if attached.
    pub fn remote_link(&self, parent: &str, link: &str) -> Option<&RemoteLink> {
        self.remote_links.get(parent)?.get(link)
    }

    /// Every remote link of every parent.
    pub fn all_remote_links(&self) -> impl Iterator<Item = &RemoteLink> {
        self.remote_links.values().flat_map(|m| m.values())
    }

    /// Whether `name` has children, local or remote.
    fn is_parent(&self, name: &str) -> bool {
        self.child_links.values().any(|l| l.parent == name)
            || self.remote_links.get(name).is_some_and(|m| !m.is_empty())
    }

    /// Local and remote children of `parent` together (the 108 limit counts both).
    fn child_count(&self, parent: &str) -> usize {
        self.child_links
            .values()
            .filter(|l| l.parent == parent)
            .count()
            + self.remote_links.get(parent).map_or(0, |m| m.len())
    }

    /// `parent`, `child` or `standalone` (SPEC §3.2).
    pub fn role(&self, name: &str) -> &'static str {
        if self.child_links.contains_key(name) {
            "child"
        } else if self.is_parent(name) {
            "parent"
        } else {
            "standalone"
        }
    }

    pub(crate) fn apply_child(&mut self, cmd: &MetaCommand) -> Result<MetaResponse, ApplyError> {
        match cmd {
            MetaCommand::AttachChild {
                parent,
                child,
                delay_ms,
                now_ms,
            } => {
                let p = self.existing_topic(parent)?.clone();
                let c = self.existing_topic(child)?.clone();
                self.check_attach(&p, child, *delay_ms)?;
                let schemas = adopted_schemas(&p, &c)?;
                if schemas != c.schemas {
                    let mut t = Topic::clone(&c);
                    t.schemas = schemas;
                    self.topics.insert(child.clone(), Arc::new(t));
                }
                self.link(&p, child, *delay_ms, false, *now_ms);
                Ok(MetaResponse::Topic(p))
            }
            MetaCommand::DetachChild { parent, child } => {
                self.existing_topic(parent)?;
                match self.child_links.get(child) {
                    Some(l) if l.parent == *parent => {
                        self.child_links.remove(child);
                    }
                    // A remote link is detached by its name, like a local child.
                    _ if self.remote_link(parent, child).is_some() => {
                        let links = self
                            .remote_links
                            .get_mut(parent)
                            .expect("invariant: the link was just found");
                        links.remove(child);
                        if links.is_empty() {
                            self.remote_links.remove(parent);
                        }
                    }
                    _ => {
                        return Err(ApplyError::NotFound(format!(
                            "topic {child} is not attached to {parent}"
                        )))
                    }
                }
                Ok(MetaResponse::Ok)
            }
            MetaCommand::AttachRemoteChild {
                parent,
                link,
                endpoint,
                now_ms,
            } => {
                let p = self.existing_topic(parent)?.clone();
                if let Some(l) = self.child_links.get(parent.as_str()) {
                    return Err(ApplyError::Conflict(format!(
                        "role conflict: topic {parent} is a child of {}; children cannot have \
                         children, local or remote",
                        l.parent
                    )));
                }
                let taken_locally = self
                    .child_links
                    .get(link.as_str())
                    .is_some_and(|l| l.parent == *parent);
                if taken_locally || self.remote_link(parent, link).is_some() {
                    return Err(ApplyError::Conflict(format!(
                        "{link} is already attached to {parent}"
                    )));
                }
                if self.child_count(parent) >= MAX_CHILDREN {
                    return Err(ApplyError::Conflict(format!(
                        "topic {parent} already has {MAX_CHILDREN} children, the most allowed"
                    )));
                }
                self.last_attach_epoch += 1;
                self.remote_links.entry(parent.clone()).or_default().insert(
                    link.clone(),
                    RemoteLink {
                        parent: parent.clone(),
                        link: link.clone(),
                        epoch: self.last_attach_epoch,
                        endpoint: endpoint.clone(),
                        parent_partitions_at_attach: p.config.partitions,
                        attached_at_ms: *now_ms,
                    },
                );
                Ok(MetaResponse::Topic(p))
            }
            MetaCommand::CreateChildTopic {
                name,
                config,
                owner,
                schema,
                created_at_ms,
                parent,
                delay_ms,
            } => {
                if name == parent {
                    return Err(ApplyError::Invalid(
                        "a topic cannot be its own parent".into(),
                    ));
                }
                self.check_new_name(name)?;
                self.check_topic_quota(owner.as_deref())?;
                let p = self.existing_topic(parent)?.clone();
                self.check_attach(&p, name, *delay_ms)?;
                let mut config = config.clone();
                if config.partitions == 0 {
                    config.partitions = p.config.partitions;
                }
                let own: Vec<SchemaVersion> = schema
                    .iter()
                    .map(|s| SchemaVersion {
                        version: 1,
                        schema: s.clone(),
                    })
                    .collect();
                let schemas = adopted_schema_history(&p, name, &own)?;
                let live = self.live_members();
                let assignments = (0..config.partitions)
                    .map(|i| assign_replica(&live, p.assignments.get(i as usize), i))
                    .collect();
                let topic = self.insert_topic(
                    name,
                    config,
                    owner.clone(),
                    schemas,
                    assignments,
                    *created_at_ms,
                );
                self.link(&p, name, *delay_ms, true, *created_at_ms);
                Ok(MetaResponse::Topic(topic))
            }
            other => unreachable!("apply_child called with {other:?}"),
        }
    }

    /// The name checks of a create (`409` taken, or differing only in letter case).
    fn check_new_name(&self, name: &str) -> Result<(), ApplyError> {
        if self.topics.contains_key(name) {
            return Err(ApplyError::Conflict(format!("topic {name} already exists")));
        }
        if let Some(existing) = self.topic_names_folded.get(&fold(name)) {
            return Err(ApplyError::Conflict(format!(
                "topic {name} differs only in letter case from existing topic {existing}"
            )));
        }
        Ok(())
    }

    /// Inserts a new topic with the next id (as `CreateTopic` does).
    fn insert_topic(
        &mut self,
        name: &str,
        config: TopicConfig,
        owner: Option<String>,
        schemas: Vec<SchemaVersion>,
        assignments: Vec<Assignment>,
        created_at_ms: u64,
    ) -> Arc<Topic> {
        let topic = Arc::new(Topic {
            id: self.next_topic_id,
            name: name.to_string(),
            config,
            created_at_ms,
            owner,
            schemas,
            assignments,
            paused: false,
        });
        self.next_topic_id += 1;
        self.topic_names_folded.insert(fold(name), name.to_string());
        self.topics.insert(name.to_string(), topic.clone());
        topic
    }

    fn existing_topic(&self, name: &str) -> Result<&Arc<Topic>, ApplyError> {
        self.topics
            .get(name)
            .ok_or_else(|| ApplyError::NotFound(format!("topic {name} not found")))
    }

    /// Every §5.1 / §5.3 rule of attaching `child` (which may not exist yet) to `parent`.
    fn check_attach(&self, parent: &Topic, child: &str, delay_ms: u64) -> Result<(), ApplyError> {
        let pname = parent.name.as_str();
        if delay_ms > MAX_FANOUT_DELAY_MS {
            return Err(ApplyError::Invalid(format!(
                "delay must be between 0 and {MAX_FANOUT_DELAY_MS} ms (one year)"
            )));
        }
        if child == pname {
            return Err(ApplyError::Conflict(format!(
                "role conflict: topic {child} cannot be its own child"
            )));
        }
        if let Some(l) = self.child_links.get(child) {
            return Err(ApplyError::Conflict(if l.parent == pname {
                format!("topic {child} is already attached to {pname}")
            } else {
                format!(
                    "role conflict: topic {child} is already a child of {} (one parent per child)",
                    l.parent
                )
            }));
        }
        if let Some(l) = self.child_links.get(pname) {
            return Err(ApplyError::Conflict(format!(
                "role conflict: topic {pname} is a child of {}; children cannot have children",
                l.parent
            )));
        }
        if self.remote_link(pname, child).is_some() {
            return Err(ApplyError::Conflict(format!(
                "{child} is already attached to {pname} (a remote link of that name)"
            )));
        }
        if self.is_parent(child) {
            return Err(ApplyError::Conflict(format!(
                "role conflict: topic {child} is a parent; a parent cannot become a child"
            )));
        }
        if self.child_count(pname) >= MAX_CHILDREN {
            return Err(ApplyError::Conflict(format!(
                "topic {pname} already has {MAX_CHILDREN} children, the most allowed"
            )));
        }
        check_delay_retention(pname, parent.config.retention_ms, delay_ms)?;
        Ok(())
    }

    fn link(&mut self, parent: &Topic, child: &str, delay_ms: u64, replica: bool, now_ms: u64) {
        self.last_attach_epoch += 1;
        self.child_links.insert(
            child.to_string(),
            ChildLink {
                parent: parent.name.clone(),
                child: child.to_string(),
                epoch: self.last_attach_epoch,
                delay_ms,
                replica,
                parent_partitions_at_attach: parent.config.partitions,
                attached_at_ms: now_ms,
            },
        );
    }

    /// Rules an alter must respect while links exist (called before any change): a parent's
    /// retention stays `0` or ≥ every delay child's delay + 1 h; an attached child's schema
    /// follows its parent and cannot be changed on its own.
    pub(crate) fn check_alter_links(
        &self,
        current: &Topic,
        patch: &TopicPatch,
    ) -> Result<(), ApplyError> {
        if patch.schema.is_some() {
            if let Some(l) = self.child_links.get(&current.name) {
                return Err(ApplyError::Conflict(format!(
                    "topic {} is attached to {}: its schema follows its parent's",
                    current.name, l.parent
                )));
            }
        }
        if let Some(r) = patch.retention_ms {
            for l in self.children_of(&current.name) {
                check_delay_retention(&current.name, r, l.delay_ms)?;
            }
        }
        Ok(())
    }

    /// After an alter of `parent`: its attached children follow its schema history.
    pub(crate) fn propagate_schema(&mut self, parent: &Topic) {
        let children: Vec<String> = self
            .children_of(&parent.name)
            .into_iter()
            .map(|l| l.child.clone())
            .collect();
        for c in children {
            if let Some(t) = self.topics.get_mut(&c) {
                if t.schemas != parent.schemas {
                    Arc::make_mut(t).schemas = parent.schemas.clone();
                }
            }
        }
    }

    /// After a delete of `name`: its children are detached (keeping their data), and it is
    /// detached from its parent.
    pub(crate) fn unlink_deleted(&mut self, name: &str) {
        self.child_links
            .retain(|child, l| child != name && l.parent != name);
        self.remote_links.remove(name);
    }
}

/// SPEC §5.3: the parent's retention is 0 (forever) or at least delay + 1 h.
fn check_delay_retention(parent: &str, retention_ms: u64, delay_ms: u64) -> Result<(), ApplyError> {
    if delay_ms == 0 || retention_ms == 0 {
        return Ok(());
    }
    let need = delay_ms.saturating_add(DELAY_RETENTION_MARGIN_MS);
    if retention_ms < need {
        return Err(ApplyError::Conflict(format!(
            "retention of parent {parent} ({retention_ms} ms) is too short for a delay child of \
             {delay_ms} ms: it must be 0 (forever) or at least delay + 1 h ({need} ms)"
        )));
    }
    Ok(())
}

/// The schema history an attached child ends up with: a child without schema adopts the
/// parent's; one with a schema must already have the parent's history (409).
fn adopted_schemas(parent: &Topic, child: &Topic) -> Result<Vec<SchemaVersion>, ApplyError> {
    adopted_schema_history(parent, &child.name, &child.schemas)
}

fn adopted_schema_history(
    parent: &Topic,
    child: &str,
    own: &[SchemaVersion],
) -> Result<Vec<SchemaVersion>, ApplyError> {
    if own.is_empty() || same_history(own, &parent.schemas) {
        return Ok(parent.schemas.clone());
    }
    Err(ApplyError::Conflict(format!(
        "schema mismatch: child {child} must have no schema or the schema history of {}",
        parent.name
    )))
}

/// Same versions with the same JSON documents (compared as JSON values, so formatting does
/// not matter).
fn same_history(a: &[SchemaVersion], b: &[SchemaVersion]) -> bool {
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).ok();
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.version == y.version
                && (x.schema == y.schema || {
                    let (px, py) = (parse(&x.schema), parse(&y.schema));
                    px.is_some() && px == py
                })
        })
}

/// SPEC §5.4 placement of a replica child's partition `p`: the first live member on the
/// round-robin ring from p's position (`p mod n`) that does not own parent partition `p`.
/// While parent partition `p` is unassigned the child partition waits (unassigned, never a
/// guess). With one live member there is no other choice. Child partitions beyond the
/// parent's count are placed as usual.
///
/// `assign_unassigned` (on member registration) places waiting replica partitions with this
/// too, after their parents; the rebalance planner keeps twins apart when it can.
pub(crate) fn assign_replica(live: &[NodeId], parent: Option<&Assignment>, p: u32) -> Assignment {
    let unassigned = Assignment {
        owner: None,
        target: None,
        move_id: 0,
    };
    if live.is_empty() {
        return unassigned;
    }
    let start = p as usize % live.len();
    let avoid = match parent {
        None => None,
        Some(a) => match &a.owner {
            None => return unassigned,
            Some(o) => Some(o),
        },
    };
    let owner = (0..live.len())
        .map(|i| &live[(start + i) % live.len()])
        .find(|m| Some(*m) != avoid)
        .unwrap_or(&live[start]);
    Assignment {
        owner: Some(owner.clone()),
        target: None,
        move_id: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(partitions: u32, retention_ms: u64) -> TopicConfig {
        TopicConfig {
            partitions,
            retention_ms,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            retry_backoff: None,
            dead_letter: None,
            dedup_window_ms: None,
        }
    }

    fn create(s: &mut MetaState, name: &str, partitions: u32, schema: Option<&str>) {
        s.apply(&MetaCommand::CreateTopic {
            name: name.into(),
            config: config(partitions, 0),
            owner: None,
            schema: schema.map(str::to_string),
            created_at_ms: 1,
        })
        .unwrap();
    }

    fn attach(parent: &str, child: &str, delay_ms: u64) -> MetaCommand {
        MetaCommand::AttachChild {
            parent: parent.into(),
            child: child.into(),
            delay_ms,
            now_ms: 5,
        }
    }

    fn create_child(name: &str, parent: &str, partitions: u32, delay_ms: u64) -> MetaCommand {
        MetaCommand::CreateChildTopic {
            name: name.into(),
            config: config(partitions, 0),
            owner: None,
            schema: None,
            created_at_ms: 7,
            parent: parent.into(),
            delay_ms,
        }
    }

    fn register(s: &mut MetaState, id: &str) {
        s.apply(&MetaCommand::RegisterMember {
            id: id.into(),
            api_addr: String::new(),
            cluster_addr: String::new(),
            version: "0".into(),
            now_ms: 1,
        })
        .unwrap();
    }

    /// Applies a command that must be refused with the given kind; the state is unchanged.
    fn refused(s: &mut MetaState, cmd: MetaCommand) -> ApplyError {
        let before = s.clone();
        let e = s.apply(&cmd).expect_err("must be refused");
        assert_eq!(*s, before, "a refused command changes nothing");
        e
    }

    fn conflict(e: ApplyError, needle: &str) {
        match e {
            ApplyError::Conflict(m) => assert!(m.contains(needle), "{m}"),
            other => panic!("expected a conflict with {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn attach_detach_and_epochs() {
        let mut s = MetaState::default();
        for t in ["p", "a", "b"] {
            create(&mut s, t, 3, None);
        }
        assert_eq!(s.role("p"), "standalone");
        s.apply(&attach("p", "b", 0)).unwrap();
        s.apply(&attach("p", "a", 1000)).unwrap();
        assert_eq!(s.role("p"), "parent");
        assert_eq!(s.role("a"), "child");
        let kids: Vec<_> = s.children_of("p").iter().map(|l| l.child.clone()).collect();
        assert_eq!(kids, ["b", "a"], "attach order");
        let e1 = s.parent_link("a").unwrap().epoch;
        assert_eq!(s.parent_link("a").unwrap().kind(), "delay");
        assert_eq!(s.parent_link("b").unwrap().kind(), "fanout");
        assert_eq!(s.parent_link("a").unwrap().parent_partitions_at_attach, 3);

        assert!(matches!(
            refused(
                &mut s,
                MetaCommand::DetachChild {
                    parent: "a".into(),
                    child: "b".into()
                }
            ),
            ApplyError::NotFound(_)
        ));
        s.apply(&MetaCommand::DetachChild {
            parent: "p".into(),
            child: "a".into(),
        })
        .unwrap();
        assert_eq!(s.role("a"), "standalone");
        assert!(s.topics.contains_key("a"), "detach keeps the child");
        s.apply(&attach("p", "a", 0)).unwrap();
        assert!(
            s.parent_link("a").unwrap().epoch > e1,
            "a re-attach has a new epoch"
        );
    }

    #[test]
    fn attach_rules_refuse_without_change() {
        let mut s = MetaState::default();
        for t in ["p", "c", "d", "q"] {
            create(&mut s, t, 3, None);
        }
        s.apply(&attach("p", "c", 0)).unwrap();
        assert!(matches!(
            refused(&mut s, attach("nope", "d", 0)),
            ApplyError::NotFound(_)
        ));
        assert!(matches!(
            refused(&mut s, attach("p", "nope", 0)),
            ApplyError::NotFound(_)
        ));
        conflict(refused(&mut s, attach("p", "p", 0)), "own child");
        conflict(refused(&mut s, attach("p", "c", 0)), "already attached");
        conflict(refused(&mut s, attach("q", "c", 0)), "already a child of p");
        conflict(refused(&mut s, attach("c", "d", 0)), "children cannot have");
        conflict(refused(&mut s, attach("q", "p", 0)), "is a parent");
        assert!(matches!(
            refused(&mut s, attach("p", "d", MAX_FANOUT_DELAY_MS + 1)),
            ApplyError::Invalid(_)
        ));
    }

    #[test]
    fn at_most_108_children() {
        let mut s = MetaState::default();
        create(&mut s, "p", 3, None);
        for i in 0..=MAX_CHILDREN {
            create(&mut s, &format!("c{i}"), 3, None);
        }
        for i in 0..MAX_CHILDREN {
            s.apply(&attach("p", &format!("c{i}"), 0)).unwrap();
        }
        conflict(
            refused(&mut s, attach("p", &format!("c{MAX_CHILDREN}"), 0)),
            "108 children",
        );
        conflict(
            refused(&mut s, create_child("extra", "p", 0, 0)),
            "108 children",
        );
    }

    #[test]
    fn delay_needs_parent_retention_at_attach_and_after() {
        let mut s = MetaState::default();
        s.apply(&MetaCommand::CreateTopic {
            name: "p".into(),
            config: config(3, 2 * 3_600_000),
            owner: None,
            schema: None,
            created_at_ms: 1,
        })
        .unwrap();
        create(&mut s, "c", 3, None);
        // 2 h retention: a delay of 1 h + 1 ms needs 2 h + 1 ms.
        conflict(refused(&mut s, attach("p", "c", 3_600_001)), "too short");
        s.apply(&attach("p", "c", 3_600_000)).unwrap();
        let alter = |r| MetaCommand::AlterTopic {
            name: "p".into(),
            patch: TopicPatch {
                retention_ms: Some(r),
                ..Default::default()
            },
        };
        conflict(refused(&mut s, alter(2 * 3_600_000 - 1)), "too short");
        s.apply(&alter(0)).unwrap();
        s.apply(&alter(3 * 3_600_000)).unwrap();
        // Fan-out children impose nothing.
        create(&mut s, "f", 3, None);
        s.apply(&attach("p", "f", 0)).unwrap();
        s.apply(&alter(3 * 3_600_000)).unwrap();
    }

    #[test]
    fn schema_rules() {
        let mut s = MetaState::default();
        create(&mut s, "p", 3, Some(r#"{"type":"object"}"#));
        create(&mut s, "bare", 3, None);
        create(&mut s, "same", 3, Some(r#"{ "type" : "object" }"#));
        create(&mut s, "other", 3, Some(r#"{"type":"array"}"#));
        conflict(refused(&mut s, attach("p", "other", 0)), "schema mismatch");
        s.apply(&attach("p", "bare", 0)).unwrap();
        s.apply(&attach("p", "same", 0)).unwrap();
        assert_eq!(s.topics["bare"].schemas, s.topics["p"].schemas, "adopted");
        // A schema-less child of a parent with a schema: mismatch the other way round.
        create(&mut s, "p2", 3, None);
        create(&mut s, "typed", 3, Some("{}"));
        conflict(refused(&mut s, attach("p2", "typed", 0)), "schema mismatch");
        // Parent schema changes apply to attached children; a child's own change is refused.
        let alter = |name: &str, schema: &str| MetaCommand::AlterTopic {
            name: name.into(),
            patch: TopicPatch {
                schema: Some(schema.into()),
                ..Default::default()
            },
        };
        s.apply(&alter("p", r#"{"type":"object","properties":{}}"#))
            .unwrap();
        assert_eq!(s.topics["bare"].schemas.len(), 2);
        assert_eq!(s.topics["bare"].schemas, s.topics["p"].schemas);
        assert_eq!(s.topics["same"].schemas, s.topics["p"].schemas);
        conflict(refused(&mut s, alter("bare", "{}")), "follows its parent");
    }

    #[test]
    fn delete_unlinks_both_ways() {
        let mut s = MetaState::default();
        for t in ["p", "c1", "c2"] {
            create(&mut s, t, 3, None);
        }
        s.apply(&attach("p", "c1", 0)).unwrap();
        s.apply(&attach("p", "c2", 0)).unwrap();
        s.apply(&MetaCommand::DeleteTopic { name: "c1".into() })
            .unwrap();
        assert_eq!(s.children_of("p").len(), 1);
        s.apply(&MetaCommand::DeleteTopic { name: "p".into() })
            .unwrap();
        assert!(s.child_links.is_empty());
        assert_eq!(s.role("c2"), "standalone");
    }

    #[test]
    fn create_child_inherits_and_is_atomic() {
        let mut s = MetaState::default();
        register(&mut s, "n0");
        register(&mut s, "n1");
        register(&mut s, "n2");
        s.apply(&MetaCommand::CreateTopic {
            name: "p".into(),
            config: config(5, 3_600_000),
            owner: None,
            schema: Some("{}".into()),
            created_at_ms: 1,
        })
        .unwrap();
        let t = match s.apply(&create_child("r", "p", 0, 0)).unwrap() {
            MetaResponse::Topic(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(t.config.partitions, 5, "inherits the parent's count");
        assert_eq!(t.schemas, s.topics["p"].schemas, "adopts the schema");
        assert_eq!(s.parent_link("r").unwrap().kind(), "replica");
        for (pa, ca) in s.topics["p"].assignments.iter().zip(&t.assignments) {
            assert_ne!(pa.owner, ca.owner, "anti-affine");
        }
        // Refusals leave nothing behind.
        conflict(
            refused(&mut s, create_child("late", "p", 0, 3_600_000)),
            "too short",
        );
        conflict(refused(&mut s, create_child("x", "r", 0, 0)), "children");
        conflict(refused(&mut s, create_child("R", "p", 0, 0)), "letter case");
        assert!(matches!(
            refused(&mut s, create_child("p", "p", 0, 0)),
            ApplyError::Invalid(_)
        ));
        assert!(matches!(
            refused(&mut s, create_child("y", "nope", 0, 0)),
            ApplyError::NotFound(_)
        ));
    }

    /// SPEC §5.4 over many cluster and topic sizes, through the state machine: a replica
    /// child created with its parent inherits the partition count and never shares a node
    /// with the parent's copy of a partition while ≥ 2 members live — including partitions
    /// placed later, when a member registers after a time with none live.
    #[test]
    fn replica_children_are_anti_affine_across_cluster_and_topic_sizes() {
        for nodes in 1..=6usize {
            for partitions in 1..=24u32 {
                let mut s = MetaState::default();
                for i in 0..nodes {
                    register(&mut s, &format!("n{i}"));
                }
                create(&mut s, "orders", partitions, None);
                s.apply(&create_child("orders-copy", "orders", 0, 0))
                    .unwrap();
                let (parent, child) = (&s.topics["orders"], &s.topics["orders-copy"]);
                assert_eq!(child.config.partitions, partitions, "inherited count");
                for p in 0..partitions as usize {
                    let (po, co) = (&parent.assignments[p].owner, &child.assignments[p].owner);
                    assert!(
                        po.is_some() && co.is_some(),
                        "n={nodes} parts={partitions} p={p}"
                    );
                    if nodes >= 2 {
                        assert_ne!(po, co, "n={nodes} parts={partitions} p={p}");
                    }
                }
            }
        }
        // Partitions waiting for members: every member dead when the topic and its replica
        // are created; the first member back takes both (the only choice, SPEC §5.4), parent
        // partitions placed before their replicas. Rebalance spreads them when others join.
        let mut s = MetaState::default();
        register(&mut s, "a");
        s.apply(&MetaCommand::MarkMemberDead {
            id: "a".into(),
            last_seen_ms: 1,
        })
        .unwrap();
        create(&mut s, "t", 5, None);
        s.apply(&create_child("t-copy", "t", 0, 0)).unwrap();
        assert!(s.topics["t-copy"]
            .assignments
            .iter()
            .all(|a| a.owner.is_none()));
        register(&mut s, "a");
        for name in ["t", "t-copy"] {
            assert!(s.topics[name]
                .assignments
                .iter()
                .all(|a| a.owner.as_deref() == Some("a")));
        }
    }

    fn remote(parent: &str, link: &str) -> MetaCommand {
        MetaCommand::AttachRemoteChild {
            parent: parent.into(),
            link: link.into(),
            endpoint: crate::types::RemoteEndpoint {
                url: "https://dr.example.com".into(),
                topic: link.into(),
                username: Some("replicator".into()),
                password: Some("s3cret-pw".into()),
                ca_pem: None,
            },
            now_ms: 9,
        }
    }

    #[test]
    fn remote_links_attach_detach_and_rules() {
        let mut s = MetaState::default();
        for t in ["p", "c", "q", "solo"] {
            create(&mut s, t, 3, None);
        }
        s.apply(&attach("p", "c", 0)).unwrap();
        s.apply(&remote("p", "dr")).unwrap();
        s.apply(&remote("solo", "solo-dr")).unwrap();
        assert_eq!(s.role("solo"), "parent", "remote children make a parent");
        let dr = s.remote_link("p", "dr").unwrap();
        assert!(dr.epoch > s.parent_link("c").unwrap().epoch, "own epoch");
        assert_eq!(dr.parent_partitions_at_attach, 3);
        assert_eq!(
            s.remote_links_of("p")
                .iter()
                .map(|l| l.link.as_str())
                .collect::<Vec<_>>(),
            ["dr"]
        );
        assert!(matches!(
            refused(&mut s, remote("nope", "x")),
            ApplyError::NotFound(_)
        ));
        conflict(refused(&mut s, remote("p", "dr")), "already attached");
        conflict(refused(&mut s, remote("p", "c")), "already attached");
        conflict(refused(&mut s, remote("c", "x")), "children cannot have");
        // The names are shared with local children: neither shadows the other.
        create(&mut s, "dr", 3, None);
        conflict(refused(&mut s, attach("p", "dr", 0)), "already attached");
        // A topic with remote children is a parent: it cannot become a child.
        conflict(refused(&mut s, attach("q", "solo", 0)), "is a parent");
        // Detach by link name; a second detach is a 404.
        let epoch = s.remote_link("p", "dr").unwrap().epoch;
        s.apply(&MetaCommand::DetachChild {
            parent: "p".into(),
            child: "dr".into(),
        })
        .unwrap();
        assert!(s.remote_link("p", "dr").is_none());
        assert!(matches!(
            refused(
                &mut s,
                MetaCommand::DetachChild {
                    parent: "p".into(),
                    child: "dr".into()
                }
            ),
            ApplyError::NotFound(_)
        ));
        s.apply(&remote("p", "dr")).unwrap();
        assert!(
            s.remote_link("p", "dr").unwrap().epoch > epoch,
            "fresh epoch"
        );
        // Deleting the parent removes its remote links.
        s.apply(&MetaCommand::DeleteTopic {
            name: "solo".into(),
        })
        .unwrap();
        assert!(s.remote_links_of("solo").is_empty());
        assert!(!s.remote_links.contains_key("solo"));
    }

    #[test]
    fn the_108_limit_counts_local_and_remote() {
        let mut s = MetaState::default();
        create(&mut s, "p", 3, None);
        for i in 0..MAX_CHILDREN / 2 {
            create(&mut s, &format!("c{i}"), 3, None);
            s.apply(&attach("p", &format!("c{i}"), 0)).unwrap();
            s.apply(&remote("p", &format!("r{i}"))).unwrap();
        }
        create(&mut s, "late", 3, None);
        conflict(refused(&mut s, remote("p", "one-more")), "108 children");
        conflict(refused(&mut s, attach("p", "late", 0)), "108 children");
    }

    #[test]
    fn remote_credentials_never_in_debug_output() {
        let mut s = MetaState::default();
        create(&mut s, "p", 3, None);
        let cmd = remote("p", "dr");
        s.apply(&cmd).unwrap();
        for text in [format!("{cmd:?}"), format!("{s:?}"), format!("{s:#?}")] {
            assert!(!text.contains("s3cret-pw"), "{text}");
            assert!(!text.contains("replicator"), "{text}");
            assert!(text.contains("dr.example.com"), "{text}");
        }
        // Stored (and snapshotted) in full.
        let json = serde_json::to_string(&s).unwrap();
        let back: MetaState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            back.remote_link("p", "dr")
                .unwrap()
                .endpoint
                .password
                .as_deref(),
            Some("s3cret-pw")
        );
    }

    #[test]
    fn replica_placement() {
        let live: Vec<NodeId> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let on = |o: &str| Assignment {
            owner: Some(o.into()),
            target: None,
            move_id: 0,
        };
        // p=0 starts at a; parent on a → b.
        assert_eq!(assign_replica(&live, Some(&on("a")), 0).owner.unwrap(), "b");
        // p=1 starts at b; parent on a → b.
        assert_eq!(assign_replica(&live, Some(&on("a")), 1).owner.unwrap(), "b");
        // p=2 starts at c; parent on c → a (wraps).
        assert_eq!(assign_replica(&live, Some(&on("c")), 2).owner.unwrap(), "a");
        // Parent partition unassigned: wait.
        let none = Assignment {
            owner: None,
            target: None,
            move_id: 0,
        };
        assert!(assign_replica(&live, Some(&none), 0).owner.is_none());
        // Beyond the parent's partitions: plain round-robin.
        assert_eq!(assign_replica(&live, None, 4).owner.unwrap(), "b");
        // One live member: the only choice.
        let one = vec!["a".to_string()];
        assert_eq!(assign_replica(&one, Some(&on("a")), 1).owner.unwrap(), "a");
        // Property: with ≥ 2 live members every child partition avoids its parent's owner.
        for n in 2..7usize {
            let live: Vec<NodeId> = (0..n).map(|i| format!("n{i}")).collect();
            for parts in 3..40u32 {
                for p in 0..parts {
                    let parent = on(&live[p as usize % n]);
                    let c = assign_replica(&live, Some(&parent), p);
                    assert_ne!(c.owner, parent.owner, "n={n} p={p}");
                }
            }
        }
    }
}
