//! Topic → broker topic. `plan_topic` compares the desired topic with the broker's record
//! and returns the calls that converge them (create; detach, alter, attach); the shell runs
//! them: `409` on create reads back and re-plans, `404` on delete counts as done.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event};
use kube::{Api, ResourceExt};
use narad_api::{
    AlterTopicRequest, AttachChildRequest, CreateTopicRequest, DeadLetter, RetryBackoff,
    TopicRecord,
};
use serde_json::value::RawValue;

use super::*;
use crate::crd::validate::{
    check_dead_letter, check_dedup_window, check_retry_backoff, check_topic,
};
use crate::crd::{
    parse_duration_ms, parse_retention_ms, ChildStatus, DeletionPolicy, ManagementPolicy, Topic,
    TopicBacklog, TopicDefaults, TopicStatus, FINALIZER,
};

/// The topic as the broker should have it.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredTopic {
    pub name: String,
    /// Partitions to create with (spec, else the cluster default; a replica child without a
    /// count inherits its parent's).
    pub create_partitions: Option<u32>,
    /// Partitions to converge to, when the spec sets them.
    pub partitions: Option<u32>,
    pub retention_ms: u64,
    pub visibility_timeout_ms: Option<u64>,
    pub max_in_flight: Option<u64>,
    pub max_acked_ahead: Option<u64>,
    pub schema: Option<serde_json::Value>,
    pub parent: Option<String>,
    pub replica: bool,
    pub delay_ms: Option<u64>,
    /// `(min, max)` in ms when the spec sets a retry backoff; `min` 0 means none.
    pub retry_backoff_ms: Option<(u64, u64)>,
    /// `(topic, max_deliveries)` when the spec sets a dead-letter topic; `("", 0)` means none.
    pub dead_letter: Option<(String, u32)>,
    /// The idempotency window in ms when the spec sets one.
    pub dedup_window_ms: Option<u64>,
}

/// One broker call.
#[derive(Debug, Clone, PartialEq)]
pub enum TopicAction {
    /// `POST /v1/topics` (with `parent` for a replica child).
    Create,
    /// `PATCH /v1/topics/{t}` with only the differing fields.
    Alter(AlterFields),
    /// `POST /v1/topics/{parent}/children`.
    Attach { parent: String, delay_ms: u64 },
    /// `DELETE /v1/topics/{parent}/children/{t}`.
    Detach { parent: String },
}

/// The fields of an alter (a comparable mirror of [`AlterTopicRequest`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlterFields {
    pub partitions: Option<u32>,
    pub retention_ms: Option<u64>,
    pub visibility_timeout_ms: Option<u64>,
    pub max_in_flight: Option<u64>,
    pub max_acked_ahead: Option<u64>,
    pub schema: Option<(serde_json::Value, u32)>,
    /// `(min, max)` in ms; `(0, 0)` turns the backoff off.
    pub retry_backoff_ms: Option<(u64, u64)>,
    /// `(topic, max_deliveries)`; `("", 0)` turns dead-lettering off.
    pub dead_letter: Option<(String, u32)>,
    pub dedup_window_ms: Option<u64>,
}

impl AlterFields {
    fn is_empty(&self) -> bool {
        *self == AlterFields::default()
    }

    /// The names of the fields set, as the spec calls them.
    pub fn names(&self) -> Vec<&'static str> {
        let AlterFields {
            partitions,
            retention_ms,
            visibility_timeout_ms,
            max_in_flight,
            max_acked_ahead,
            schema,
            retry_backoff_ms,
            dead_letter,
            dedup_window_ms,
        } = self;
        [
            ("partitions", partitions.is_some()),
            ("retention", retention_ms.is_some()),
            ("visibilityTimeout", visibility_timeout_ms.is_some()),
            ("maxInFlightPerPartition", max_in_flight.is_some()),
            ("maxAckedAheadPerPartition", max_acked_ahead.is_some()),
            ("schema", schema.is_some()),
            ("retryBackoff", retry_backoff_ms.is_some()),
            ("deadLetter", dead_letter.is_some()),
            ("dedupWindow", dedup_window_ms.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect()
    }

    /// The wire request.
    pub fn request(&self) -> AlterTopicRequest {
        let (schema, base) = match &self.schema {
            Some((s, v)) => (Some(raw(s)), Some(i64::from(*v))),
            None => (None, None),
        };
        AlterTopicRequest {
            partitions: self.partitions.map(i64::from),
            retention_ms: self.retention_ms.map(|v| v as i64),
            visibility_timeout_ms: self.visibility_timeout_ms.map(|v| v as i64),
            max_in_flight_per_partition: self.max_in_flight.map(|v| v as i64),
            max_acked_ahead_per_partition: self.max_acked_ahead.map(|v| v as i64),
            schema,
            schema_base_version: base,
            retry_backoff: self.retry_backoff_ms.map(wire_backoff),
            dead_letter: self.dead_letter.clone().map(wire_dead_letter),
            dedup_window_ms: self.dedup_window_ms.map(|v| v as i64),
        }
    }
}

/// A dead-letter setting as the broker takes it.
fn wire_dead_letter((topic, max_deliveries): (String, u32)) -> DeadLetter {
    DeadLetter {
        topic,
        max_deliveries,
    }
}

/// A backoff in ms as the broker takes it (Go durations).
fn wire_backoff((min, max): (u64, u64)) -> RetryBackoff {
    RetryBackoff::from_ms(min, max)
}

fn raw(v: &serde_json::Value) -> Box<RawValue> {
    RawValue::from_string(v.to_string()).expect("invariant: serialized JSON is valid")
}

/// The desired topic from the spec and the cluster's defaults.
pub fn desired_topic(topic: &Topic, defaults: &TopicDefaults) -> Result<DesiredTopic, String> {
    let s = &topic.spec;
    let replica = s.replica.unwrap_or(false);
    let partitions = s.partitions.map(|p| p as u32);
    let create_partitions = match (partitions, replica) {
        (Some(p), _) => Some(p),
        (None, true) => None,
        (None, false) => Some(defaults.partitions as u32),
    };
    Ok(DesiredTopic {
        name: topic.topic_name(),
        create_partitions,
        partitions,
        retention_ms: parse_retention_ms(s.retention.as_deref().unwrap_or(&defaults.retention))?,
        visibility_timeout_ms: s
            .visibility_timeout
            .as_deref()
            .map(parse_duration_ms)
            .transpose()?,
        max_in_flight: s.max_in_flight_per_partition.map(|v| v as u64),
        max_acked_ahead: s.max_acked_ahead_per_partition.map(|v| v as u64),
        schema: s.schema.clone(),
        parent: s.parent.clone(),
        replica,
        delay_ms: s.delay.as_deref().map(parse_duration_ms).transpose()?,
        retry_backoff_ms: s
            .retry_backoff
            .as_ref()
            .map(check_retry_backoff)
            .transpose()?
            .map(|(min, max)| if min == 0 { (0, 0) } else { (min, max) }),
        dead_letter: s
            .dead_letter
            .as_ref()
            .map(|d| check_dead_letter(d, &topic.topic_name()))
            .transpose()?,
        dedup_window_ms: s
            .dedup_window
            .as_deref()
            .map(check_dedup_window)
            .transpose()?,
    })
}

/// The create request of a desired topic.
pub fn create_request(d: &DesiredTopic) -> CreateTopicRequest {
    CreateTopicRequest {
        name: d.name.clone(),
        partitions: d.create_partitions.map(i64::from),
        retention_ms: Some(d.retention_ms as i64),
        visibility_timeout_ms: d.visibility_timeout_ms.map(|v| v as i64),
        max_in_flight_per_partition: d.max_in_flight.map(|v| v as i64),
        max_acked_ahead_per_partition: d.max_acked_ahead.map(|v| v as i64),
        schema: d.schema.as_ref().map(raw),
        parent: if d.replica { d.parent.clone() } else { None },
        fanout_delay_ms: if d.replica {
            d.delay_ms.map(|v| v as i64)
        } else {
            None
        },
        owner: None,
        retry_backoff: d
            .retry_backoff_ms
            .filter(|(min, _)| *min != 0)
            .map(wire_backoff),
        dead_letter: d
            .dead_letter
            .clone()
            .filter(|(_, n)| *n != 0)
            .map(wire_dead_letter),
        dedup_window_ms: d.dedup_window_ms.filter(|v| *v != 0).map(|v| v as i64),
    }
}

/// The calls that make the broker's topic (`observed`, `None` if absent) match `d`, in
/// order; `Err` when the difference cannot be applied (a shrinking partition count).
/// Only what the spec declares is compared: `paused` (set through the broker's pause and
/// resume) is not, so a paused topic stays paused.
pub fn plan_topic(
    d: &DesiredTopic,
    observed: Option<&TopicRecord>,
) -> Result<Vec<TopicAction>, String> {
    let Some(o) = observed else {
        let mut plan = vec![TopicAction::Create];
        if let (Some(parent), false) = (&d.parent, d.replica) {
            plan.push(TopicAction::Attach {
                parent: parent.clone(),
                delay_ms: d.delay_ms.unwrap_or(0),
            });
        }
        return Ok(plan);
    };
    let mut plan = Vec::new();
    let want_delay = d.delay_ms.unwrap_or(0);
    let relink = match (&o.parent, &d.parent) {
        (Some(have), Some(want)) => have != want || o.fanout_delay_ms != want_delay,
        (None, None) => false,
        _ => true,
    };
    if relink {
        if let Some(have) = &o.parent {
            plan.push(TopicAction::Detach {
                parent: have.clone(),
            });
        }
    }
    let mut alter = AlterFields::default();
    if let Some(p) = d.partitions {
        if p < o.partitions {
            return Err(format!(
                "partitions may only grow: the broker has {}, spec asks {p}",
                o.partitions
            ));
        }
        if p > o.partitions {
            alter.partitions = Some(p);
        }
    }
    if d.retention_ms != o.retention_ms {
        alter.retention_ms = Some(d.retention_ms);
    }
    if let Some(v) = d
        .visibility_timeout_ms
        .filter(|v| *v != o.visibility_timeout_ms)
    {
        alter.visibility_timeout_ms = Some(v);
    }
    if let Some(v) = d
        .max_in_flight
        .filter(|v| *v != o.max_in_flight_per_partition)
    {
        alter.max_in_flight = Some(v);
    }
    if let Some(v) = d
        .max_acked_ahead
        .filter(|v| *v != o.max_acked_ahead_per_partition)
    {
        alter.max_acked_ahead = Some(v);
    }
    if let Some(want) = d.retry_backoff_ms {
        let have = o
            .retry_backoff
            .as_ref()
            .and_then(RetryBackoff::to_ms)
            .unwrap_or((0, 0));
        if have != want {
            alter.retry_backoff_ms = Some(want);
        }
    }
    if let Some(want) = &d.dead_letter {
        let have = o
            .dead_letter
            .as_ref()
            .map_or((String::new(), 0), |d| (d.topic.clone(), d.max_deliveries));
        if have != *want {
            alter.dead_letter = Some(want.clone());
        }
    }
    if let Some(want) = d.dedup_window_ms {
        let have = o
            .dedup_window_ms
            .map_or(narad_api::DEFAULT_DEDUP_WINDOW_MS, |v| v as u64);
        if have != want {
            alter.dedup_window_ms = Some(want);
        }
    }
    if let Some(want) = &d.schema {
        let have: Option<serde_json::Value> = o
            .schema
            .as_ref()
            .and_then(|s| serde_json::from_str(s.get()).ok());
        if have.as_ref() != Some(want) {
            alter.schema = Some((want.clone(), o.schema_version));
        }
    }
    if !alter.is_empty() {
        plan.push(TopicAction::Alter(alter));
    }
    if relink {
        if let Some(want) = &d.parent {
            plan.push(TopicAction::Attach {
                parent: want.clone(),
                delay_ms: want_delay,
            });
        }
    }
    Ok(plan)
}

/// A remote child link (SPEC §5.5) as desired or as the broker lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteLink {
    pub name: String,
    pub url: String,
    pub topic: String,
}

/// One remote-link call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteAction {
    /// `POST /v1/topics/{t}/children` with `remote` (credentials from the Secret).
    Attach(String),
    /// `DELETE /v1/topics/{t}/children/{link}`.
    Detach(String),
}

/// The desired remote links of a spec (`topic` defaults to the link name).
pub fn desired_remote_links(topic: &Topic) -> Vec<RemoteLink> {
    topic
        .spec
        .remote_children
        .iter()
        .map(|r| RemoteLink {
            name: r.name.clone(),
            url: r.url.trim_end_matches('/').to_string(),
            topic: r.topic.clone().unwrap_or_else(|| r.name.clone()),
        })
        .collect()
}

/// Converges remote links: attach the missing, re-attach the changed (detach first, a
/// fresh start), detach those this operator attached (`applied`) that left the spec. Links
/// nobody declared are left alone.
pub fn plan_remote(
    desired: &[RemoteLink],
    observed: &[RemoteLink],
    applied: &[String],
) -> Vec<RemoteAction> {
    let mut plan = Vec::new();
    for o in observed {
        let gone = !desired.iter().any(|d| d.name == o.name) && applied.contains(&o.name);
        if gone {
            plan.push(RemoteAction::Detach(o.name.clone()));
        }
    }
    for d in desired {
        match observed.iter().find(|o| o.name == d.name) {
            None => plan.push(RemoteAction::Attach(d.name.clone())),
            Some(o) if o.url.trim_end_matches('/') != d.url || o.topic != d.topic => {
                plan.push(RemoteAction::Detach(d.name.clone()));
                plan.push(RemoteAction::Attach(d.name.clone()));
            }
            Some(_) => {}
        }
    }
    plan
}

/// The status fields read from the broker's record, and the immutables as applied.
pub fn observed_status(status: &mut TopicStatus, d: &DesiredTopic, rec: &TopicRecord) {
    read_status(status, rec);
    status.replica = Some(d.replica);
    status.delay_ms = d.delay_ms;
}

/// The status fields read from the broker's record (what a `managementPolicy: Observe`
/// Topic reports: nothing is applied, so nothing applied is recorded).
pub fn read_status(status: &mut TopicStatus, rec: &TopicRecord) {
    status.topic_name = Some(rec.name.clone());
    status.partitions = Some(rec.partitions as i32);
    status.role = Some(rec.role.clone());
    status.owner = rec.owner.clone();
    status.partition_owners = rec
        .partition_stats
        .as_ref()
        .map(|ps| ps.iter().map(|p| p.owner_node.clone()).collect())
        .unwrap_or_default();
    status.backlog = backlog_status(rec);
    // Reported, never converged: pause and resume belong to the broker's API (see plan_topic).
    status.paused = Some(rec.paused);
}

/// The status fields of a broker topic that does not exist (an observed one): cleared, so
/// nothing stale is reported.
pub fn clear_read_status(status: &mut TopicStatus) {
    status.partitions = None;
    status.role = None;
    status.owner = None;
    status.partition_owners.clear();
    status.children.clear();
    status.backlog = None;
    status.paused = None;
}

/// The spec fields of a `managementPolicy: Observe` Topic that differ from the broker's
/// record, each as `field: spec …, broker …`. Only fields the spec declares are compared
/// (a left-out retention is not the cluster default here); none of them is ever applied.
pub fn observed_differences(t: &Topic, d: &DesiredTopic, rec: &TopicRecord) -> Vec<String> {
    let s = &t.spec;
    let mut out = Vec::new();
    let mut differ = |field: &str, spec: String, broker: String| {
        if spec != broker {
            out.push(format!("{field}: spec {spec}, broker {broker}"));
        }
    };
    let ms = |v: u64| format!("{v} ms");
    if let Some(p) = d.partitions {
        differ("partitions", p.to_string(), rec.partitions.to_string());
    }
    if s.retention.is_some() {
        differ("retention", ms(d.retention_ms), ms(rec.retention_ms));
    }
    if let Some(v) = d.visibility_timeout_ms {
        differ("visibilityTimeout", ms(v), ms(rec.visibility_timeout_ms));
    }
    if let Some(v) = d.max_in_flight {
        differ(
            "maxInFlightPerPartition",
            v.to_string(),
            rec.max_in_flight_per_partition.to_string(),
        );
    }
    if let Some(v) = d.max_acked_ahead {
        differ(
            "maxAckedAheadPerPartition",
            v.to_string(),
            rec.max_acked_ahead_per_partition.to_string(),
        );
    }
    let backoff = |(min, max): (u64, u64)| {
        if min == 0 {
            "none".to_string()
        } else {
            format!("{min}-{max} ms")
        }
    };
    if let Some(want) = d.retry_backoff_ms {
        let have = rec
            .retry_backoff
            .as_ref()
            .and_then(RetryBackoff::to_ms)
            .unwrap_or((0, 0));
        differ("retryBackoff", backoff(want), backoff(have));
    }
    let dead_letter = |(topic, n): (String, u32)| {
        if n == 0 {
            "none".to_string()
        } else {
            format!("{topic:?} after {n} deliveries")
        }
    };
    if let Some(want) = &d.dead_letter {
        let have = rec
            .dead_letter
            .as_ref()
            .map_or((String::new(), 0), |d| (d.topic.clone(), d.max_deliveries));
        differ("deadLetter", dead_letter(want.clone()), dead_letter(have));
    }
    if let Some(v) = d.dedup_window_ms {
        let have = rec
            .dedup_window_ms
            .map_or(narad_api::DEFAULT_DEDUP_WINDOW_MS, |v| v as u64);
        differ("dedupWindow", ms(v), ms(have));
    }
    if let Some(want) = &d.schema {
        let have: Option<serde_json::Value> = rec
            .schema
            .as_ref()
            .and_then(|s| serde_json::from_str(s.get()).ok());
        // Named, not printed: a schema can be long.
        let version = |v: u32| format!("a different one (version {v})");
        match have {
            Some(h) if h == *want => {}
            Some(_) => differ("schema", "set".into(), version(rec.schema_version)),
            None => differ("schema", "set".into(), "none".into()),
        }
    }
    if let Some(want) = &d.parent {
        let have = rec.parent.clone().unwrap_or_else(|| "none".into());
        differ("parent", want.clone(), have);
    }
    if let Some(v) = d.delay_ms {
        differ("delay", ms(v), ms(rec.fanout_delay_ms));
    }
    for link in &s.remote_children {
        if !rec.remote_children.contains(&link.name) {
            differ(
                "remoteChildren",
                format!("link {:?}", link.name),
                "has no such link".into(),
            );
        }
    }
    out
}

/// `status.backlog` from the broker's record.
fn backlog_status(rec: &TopicRecord) -> Option<TopicBacklog> {
    rec.backlog.map(|b| TopicBacklog {
        messages: b.messages,
        in_flight: b.in_flight,
        oldest_unacked_age_seconds: b.oldest_unacked_age_seconds,
    })
}

async fn get_topic(
    b: &narad_api::Client,
    name: &str,
) -> Result<Option<TopicRecord>, narad_api::Error> {
    match b.get_topic(name, None).await {
        Ok(r) => Ok(Some(r)),
        Err(e) if e.status() == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}

async fn run_action(
    b: &narad_api::Client,
    d: &DesiredTopic,
    a: &TopicAction,
) -> Result<(), narad_api::Error> {
    match a {
        TopicAction::Create => b.create_topic(&create_request(d)).await.map(drop),
        TopicAction::Alter(f) => b.alter_topic(&d.name, &f.request()).await.map(drop),
        TopicAction::Attach { parent, delay_ms } => b
            .attach_child(
                parent,
                &AttachChildRequest {
                    child: d.name.clone(),
                    delay_ms: (*delay_ms > 0).then_some(*delay_ms as i64),
                    remote: None,
                },
            )
            .await
            .map(drop),
        TopicAction::Detach { parent } => match b.detach_child(parent, &d.name).await {
            Err(e) if e.status() == Some(404) => Ok(()),
            r => r,
        },
    }
}

/// The Event of an action `run_action` took for `t`.
pub fn action_notice(t: &Topic, d: &DesiredTopic, a: &TopicAction) -> Notice {
    let name = &d.name;
    match a {
        TopicAction::Create => Notice::normal(
            "Created",
            "Create",
            match &d.parent {
                Some(p) => format!("created topic {name} on the broker, a replica child of {p}"),
                None => format!("created topic {name} on the broker"),
            },
        ),
        TopicAction::Alter(f) => {
            let fields = f.names().join(", ");
            change_notice(
                t.metadata.generation,
                t.status.as_ref().and_then(|s| s.observed_generation),
                format!("altered topic {name} on the broker to the changed spec: {fields}"),
                format!(
                    "topic {name} had been changed on the broker outside the operator; \
                     set back to the spec: {fields}"
                ),
            )
        }
        TopicAction::Attach { parent, .. } => Notice::normal(
            "Attached",
            "Update",
            format!("attached topic {name} to {parent} as a replica child"),
        ),
        TopicAction::Detach { parent } => Notice::normal(
            "Detached",
            "Update",
            format!("detached topic {name} from {parent}"),
        ),
    }
}

/// Converges the broker topic: plan, run; a `409` on create reads back and re-plans once.
/// Each action that succeeded is pushed to `done`, also when a later one fails.
pub async fn converge(
    b: &narad_api::Client,
    d: &DesiredTopic,
    done: &mut Vec<TopicAction>,
) -> Result<Result<TopicRecord, String>, narad_api::Error> {
    let mut observed = get_topic(b, &d.name).await?;
    for _attempt in 0..2 {
        let plan = match plan_topic(d, observed.as_ref()) {
            Ok(p) => p,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let mut conflict = false;
        for a in &plan {
            match run_action(b, d, a).await {
                Err(e) if e.status() == Some(409) && *a == TopicAction::Create => {
                    conflict = true;
                    break;
                }
                r => r?,
            }
            done.push(a.clone());
        }
        observed = get_topic(b, &d.name).await?;
        if !conflict {
            break;
        }
    }
    match observed {
        Some(r) => Ok(Ok(r)),
        None => Err(narad_api::Error::Api(narad_api::HttpError {
            status: 404,
            message: format!("topic {:?} vanished while reconciling", d.name),
            retry_after: None,
        })),
    }
}

/// The controller's entry point for Topics.
pub async fn reconcile(topic: Arc<Topic>, ctx: Arc<Context>) -> Result<Action> {
    let ns = topic.namespace().unwrap_or_else(|| "default".into());
    let api: Api<Topic> = Api::namespaced(ctx.client.clone(), &ns);
    let key = object_key(&*topic);
    if paused(&*topic) {
        return hold_paused(&ctx, &api, &*topic).await;
    }
    let r = finalizer(&api, FINALIZER, topic, |event| async {
        match event {
            Event::Apply(t) => apply(&api, &t, &ctx).await,
            Event::Cleanup(t) => cleanup(&t, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if r.is_ok() {
        ctx.succeeded(&key);
    }
    r
}

async fn apply(api: &Api<Topic>, t: &Topic, ctx: &Context) -> Result<Action> {
    let gen = t.metadata.generation;
    let mut status = t.status.clone().unwrap_or_default();
    let name = t.topic_name();
    let exists = status.topic_name.is_some();
    if let Err(msg) = check_topic(&name, &t.spec, &status) {
        set_ready_synced(
            &mut status.conditions,
            (exists, "Invalid", &msg),
            (false, "Invalid", &msg),
            gen,
        );
        write_status(ctx, api, t, &status).await?;
        return Err(Error::Invalid(msg));
    }
    let ns = t.namespace().unwrap_or_else(|| "default".into());
    let broker = match broker_for(ctx, &ns, &t.spec.cluster_ref.name).await? {
        Ok(b) => b,
        Err(u) => {
            let (reason, msg) = u.condition(&t.spec.cluster_ref.name);
            set_ready_synced(
                &mut status.conditions,
                (false, reason, &msg),
                (false, reason, &msg),
                gen,
            );
            write_status(ctx, api, t, &status).await?;
            return Err(Error::Waiting(msg));
        }
    };
    let desired = desired_topic(t, &broker.cluster.spec.defaults).map_err(Error::Invalid)?;
    let b = &broker.client;
    if t.spec.management_policy == ManagementPolicy::Observe {
        return observe(api, t, ctx, b, &desired, status).await;
    }
    if let Some(parent) = &desired.parent {
        let ready = match get_topic(b, parent).await {
            Ok(p) => p.is_some(),
            Err(e) => return broker_failed(ctx, api, t, status, e, exists).await,
        };
        if !ready {
            let msg = format!("parent topic {parent:?} does not exist yet");
            set_ready_synced(
                &mut status.conditions,
                (false, "WaitingForParent", &msg),
                (false, "WaitingForParent", &msg),
                gen,
            );
            write_status(ctx, api, t, &status).await?;
            return Err(Error::Waiting(msg));
        }
    }
    let mut done = Vec::new();
    let converged = converge(b, &desired, &mut done).await;
    for a in &done {
        ctx.publish(t, &action_notice(t, &desired, a)).await;
    }
    let rec = match converged {
        Ok(Ok(rec)) => rec,
        Ok(Err(refusal)) => {
            set_ready_synced(
                &mut status.conditions,
                (exists, "Invalid", &refusal),
                (false, "Invalid", &refusal),
                gen,
            );
            write_status(ctx, api, t, &status).await?;
            return Err(Error::Invalid(refusal));
        }
        Err(e) => return broker_failed(ctx, api, t, status, e, exists).await,
    };
    observed_status(&mut status, &desired, &rec);
    let links = desired_remote_links(t);
    if !links.is_empty() || !status.remote_links.is_empty() {
        let refused =
            match converge_remote(ctx, &ns, t, b, &desired.name, &links, &mut status).await {
                Ok(r) => r
                    .err()
                    .map(|r| (r.reason, r.message.clone(), Error::Waiting(r.message))),
                Err(Error::Broker(e)) => return broker_failed(ctx, api, t, status, e, true).await,
                Err(other) => Some(("KubernetesError", other.to_string(), other)),
            };
        if let Some((reason, msg, err)) = refused {
            set_ready_synced(
                &mut status.conditions,
                (true, reason, &msg),
                (false, reason, &msg),
                gen,
            );
            write_status(ctx, api, t, &status).await?;
            return Err(err);
        }
    }
    read_children(b, &rec, &mut status).await;
    status.observed_generation = gen;
    set_ready_synced(
        &mut status.conditions,
        (true, "Synced", ""),
        (true, "Synced", ""),
        gen,
    );
    write_status(ctx, api, t, &status).await?;
    Ok(Action::requeue(ctx.resync))
}

/// `status.children` of a parent (kept as they were when the list cannot be read), none
/// otherwise. Read only.
async fn read_children(b: &narad_api::Client, rec: &TopicRecord, status: &mut TopicStatus) {
    if rec.role == "parent" {
        if let Ok(list) = b.list_children(&rec.name).await {
            status.children = list
                .children
                .into_iter()
                .map(|c| ChildStatus {
                    name: c.name,
                    kind: c.kind,
                    lag_messages: c.lag_messages,
                    state: c.state,
                })
                .collect();
        }
    } else {
        status.children.clear();
    }
}

/// `managementPolicy: Observe`: reads the broker topic and reports it, with the declared
/// spec fields that differ; sends the broker nothing that changes it. A topic that does not
/// exist is `NotFound` and looked up again after the resync period.
async fn observe(
    api: &Api<Topic>,
    t: &Topic,
    ctx: &Context,
    b: &narad_api::Client,
    d: &DesiredTopic,
    mut status: TopicStatus,
) -> Result<Action> {
    let gen = t.metadata.generation;
    let rec = match get_topic(b, &d.name).await {
        Ok(r) => r,
        Err(e) => {
            let exists = status.partitions.is_some();
            return broker_failed(ctx, api, t, status, e, exists).await;
        }
    };
    status.observed_generation = gen;
    let Some(rec) = rec else {
        let msg = format!(
            "topic {:?} does not exist on the broker; managementPolicy Observe never creates              it (looked up again every {} s)",
            d.name,
            ctx.resync.as_secs()
        );
        tracing::info!(topic = %d.name, "observed topic not found on the broker");
        clear_read_status(&mut status);
        set_ready_synced(
            &mut status.conditions,
            (false, "NotFound", &msg),
            (false, "NotFound", &msg),
            gen,
        );
        write_status(ctx, api, t, &status).await?;
        return Ok(Action::requeue(ctx.resync));
    };
    read_status(&mut status, &rec);
    read_children(b, &rec, &mut status).await;
    let differences = observed_differences(t, d, &rec);
    let msg = if differences.is_empty() {
        format!(
            "topic {:?} observed read-only (managementPolicy Observe)",
            d.name
        )
    } else {
        tracing::info!(topic = %d.name, ?differences, "observed topic differs from the spec; not applied");
        format!(
            "topic {:?} observed read-only (managementPolicy Observe); not applied, the spec \
             differs from the broker in {}",
            d.name,
            differences.join("; ")
        )
    };
    set_ready_synced(
        &mut status.conditions,
        (true, "Observed", &msg),
        (true, "Observed", &msg),
        gen,
    );
    write_status(ctx, api, t, &status).await?;
    Ok(Action::requeue(ctx.resync))
}

/// Runs [`plan_remote`] against the broker's current links; records what is attached.
/// Stops at the first link whose credentials Secret is refused (see [`secrets`]): nothing of
/// that Secret is read and nothing is attached with it.
async fn converge_remote(
    ctx: &Context,
    ns: &str,
    t: &Topic,
    b: &narad_api::Client,
    name: &str,
    links: &[RemoteLink],
    status: &mut TopicStatus,
) -> Result<Result<(), secrets::Refusal>> {
    let observed: Vec<RemoteLink> = b
        .list_children(name)
        .await?
        .children
        .into_iter()
        .filter(|c| c.kind == "remote")
        .map(|c| {
            let r = c.remote.unwrap_or_default();
            RemoteLink {
                name: c.name,
                url: r.url,
                topic: r.topic,
            }
        })
        .collect();
    for action in plan_remote(links, &observed, &status.remote_links) {
        match action {
            RemoteAction::Detach(link) => match b.detach_child(name, &link).await {
                Err(e) if e.status() != Some(404) => return Err(e.into()),
                _ => status.remote_links.retain(|l| *l != link),
            },
            RemoteAction::Attach(link) => {
                let spec = t
                    .spec
                    .remote_children
                    .iter()
                    .find(|r| r.name == link)
                    .expect("invariant: planned from the spec");
                let (mut username, mut password) = (None, None);
                if let Some(cref) = &spec.credentials_secret_ref {
                    let secret = match secrets::credentials_secret(ctx, ns, &cref.name).await? {
                        Ok(s) => s,
                        Err(r) => return Ok(Err(r)),
                    };
                    let data = secret.data.unwrap_or_default();
                    let get = |k: &str| {
                        data.get(k)
                            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                    };
                    username = get(&cref.username_key);
                    password = get(&cref.password_key);
                    if username.is_none() || password.is_none() {
                        return Ok(Err(secrets::Refusal {
                            reason: "SecretNotFound",
                            message: format!(
                                "Secret {} lacks {} or {}",
                                cref.name, cref.username_key, cref.password_key
                            ),
                        }));
                    }
                }
                let d = links
                    .iter()
                    .find(|l| l.name == link)
                    .expect("invariant: desired");
                let req = AttachChildRequest {
                    child: link.clone(),
                    delay_ms: None,
                    remote: Some(narad_api::RemoteTarget {
                        url: d.url.clone(),
                        topic: Some(d.topic.clone()),
                        username,
                        password,
                        ca_pem: None,
                    }),
                };
                b.attach_child(name, &req).await?;
                if !status.remote_links.contains(&link) {
                    status.remote_links.push(link);
                }
            }
        }
    }
    // Links declared and present count as ours (e.g. attached before a status was written).
    for l in links {
        if observed.iter().any(|o| o.name == l.name) && !status.remote_links.contains(&l.name) {
            status.remote_links.push(l.name.clone());
        }
    }
    Ok(Ok(()))
}

async fn broker_failed(
    ctx: &Context,
    api: &Api<Topic>,
    t: &Topic,
    mut status: TopicStatus,
    e: narad_api::Error,
    exists: bool,
) -> Result<Action> {
    let reason = broker_reason(&e, "NotFound");
    let msg = e.to_string();
    set_ready_synced(
        &mut status.conditions,
        (exists, reason, &msg),
        (false, reason, &msg),
        t.metadata.generation,
    );
    write_status(ctx, api, t, &status).await?;
    Err(Error::Broker(e))
}

/// Why a `DeleteIfEmpty` topic cannot be deleted yet (`None`: it is empty): messages waiting
/// or in flight, or a backlog the broker could not read whole (an owner down or moving).
pub fn deletion_blocked(rec: &TopicRecord) -> Option<String> {
    let Some(b) = rec.backlog.as_ref().filter(|_| !rec.partial) else {
        return Some(format!(
            "deletionPolicy DeleteIfEmpty: the backlog of {} cannot be read whole; deletion waits",
            rec.name
        ));
    };
    (b.messages > 0 || b.in_flight > 0).then(|| {
        format!(
            "deletionPolicy DeleteIfEmpty: {} has {} messages waiting and {} in flight; deletion waits until it is empty",
            rec.name, b.messages, b.in_flight
        )
    })
}

async fn cleanup(t: &Topic, ctx: &Context) -> Result<Action> {
    if t.spec.management_policy == ManagementPolicy::Observe {
        tracing::info!(topic = %t.topic_name(), "observed topic released; the broker topic is left as it is");
        return Ok(Action::await_change());
    }
    if t.spec.deletion_policy == DeletionPolicy::Retain {
        return Ok(Action::await_change());
    }
    let ns = t.namespace().unwrap_or_else(|| "default".into());
    let broker = match broker_for(ctx, &ns, &t.spec.cluster_ref.name).await? {
        Ok(b) => b,
        Err(u) => return u.cleanup_error().map_or(Ok(Action::await_change()), Err),
    };
    let b = &broker.client;
    let name = t
        .status
        .as_ref()
        .and_then(|s| s.topic_name.clone())
        .unwrap_or_else(|| t.topic_name());
    if let Some(rec) = get_topic(b, &name).await? {
        if t.spec.deletion_policy == DeletionPolicy::DeleteIfEmpty {
            if let Some(msg) = deletion_blocked(&rec) {
                let api: Api<Topic> = Api::namespaced(ctx.client.clone(), &ns);
                let mut status = t.status.clone().unwrap_or_default();
                status.backlog = backlog_status(&rec);
                set_ready_synced(
                    &mut status.conditions,
                    (false, "NotEmpty", &msg),
                    (false, "NotEmpty", &msg),
                    t.metadata.generation,
                );
                write_status(ctx, &api, t, &status).await?;
                return Err(Error::Waiting(msg));
            }
        }
        if let Some(parent) = rec.parent {
            match b.detach_child(&parent, &name).await {
                Err(e) if e.status() != Some(404) => return Err(e.into()),
                _ => {}
            }
        }
        match b.delete_topic(&name).await {
            Err(e) if e.status() != Some(404) => return Err(e.into()),
            _ => {}
        }
        let n = Notice::normal(
            "Deleted",
            "Delete",
            format!(
                "deleted topic {name} on the broker (deletionPolicy {:?})",
                t.spec.deletion_policy
            ),
        );
        ctx.publish(t, &n).await;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn topic(spec: serde_json::Value) -> Topic {
        let mut s = json!({"clusterRef": {"name": "prod"}});
        s.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "narad.io/v1alpha1", "kind": "Topic",
            "metadata": {"name": "orders", "namespace": "default"},
            "spec": s,
        }))
        .unwrap()
    }

    #[test]
    fn every_action_has_an_event_naming_what_changed() {
        let mut t = topic(json!({"name": "orders", "partitions": 6}));
        let d = desired(json!({"name": "orders", "partitions": 6}));
        let n = action_notice(&t, &d, &TopicAction::Create);
        assert_eq!(
            (n.reason.as_str(), n.action, n.warning),
            ("Created", "Create", false)
        );
        assert!(n.message.contains("orders"), "{}", n.message);
        let alter = TopicAction::Alter(AlterFields {
            partitions: Some(6),
            retention_ms: Some(1),
            ..Default::default()
        });
        // Applied at this generation already: the broker was changed behind the operator.
        t.metadata.generation = Some(2);
        t.status = Some(TopicStatus {
            observed_generation: Some(2),
            ..Default::default()
        });
        let n = action_notice(&t, &d, &alter);
        assert_eq!(n.reason, "DriftCorrected");
        assert!(
            n.message.ends_with("partitions, retention"),
            "{}",
            n.message
        );
        t.metadata.generation = Some(3);
        assert_eq!(action_notice(&t, &d, &alter).reason, "Updated");
        let parent = "raw".to_string();
        let attach = TopicAction::Attach {
            parent: parent.clone(),
            delay_ms: 0,
        };
        assert_eq!(action_notice(&t, &d, &attach).reason, "Attached");
        let n = action_notice(&t, &d, &TopicAction::Detach { parent });
        assert!(n.reason == "Detached" && n.message.contains("raw"), "{n:?}");
    }

    fn desired(spec: serde_json::Value) -> DesiredTopic {
        desired_topic(&topic(spec), &TopicDefaults::default()).unwrap()
    }

    /// A setting turned off (`off`): a create leaves `field` out, it is in sync with a broker
    /// topic without it, and one with it (`on`) is altered to `want`.
    fn off_converges(off: &DesiredTopic, on: &TopicRecord, field: &str, want: serde_json::Value) {
        assert!(serde_json::to_value(create_request(off)).unwrap()[field].is_null());
        assert!(plan_topic(off, Some(&record(json!({}))))
            .unwrap()
            .is_empty());
        let plan = plan_topic(off, Some(on)).unwrap();
        assert_eq!(only_alter(&plan), json!({ field: want }));
    }

    /// The request of a plan that is one alter, as JSON.
    fn only_alter(plan: &[TopicAction]) -> serde_json::Value {
        let [TopicAction::Alter(f)] = plan else {
            panic!("{plan:?}")
        };
        serde_json::to_value(f.request()).unwrap()
    }

    fn record(v: serde_json::Value) -> TopicRecord {
        let mut r = json!({"name": "orders", "partitions": 3, "retention_ms": 43200000u64,
            "visibility_timeout_ms": 30000, "max_in_flight_per_partition": 1024,
            "max_acked_ahead_per_partition": 1024, "created_at": 1, "role": "standalone"});
        r.as_object_mut()
            .unwrap()
            .extend(v.as_object().unwrap().clone());
        serde_json::from_value(r).unwrap()
    }

    #[test]
    fn desired_uses_cluster_defaults() {
        let d = desired(json!({}));
        assert_eq!(d.name, "orders");
        assert_eq!(d.create_partitions, Some(3));
        assert_eq!(d.partitions, None);
        assert_eq!(d.retention_ms, 43_200_000);
        let d = desired(
            json!({"name": "o2", "partitions": 6, "retention": "forever",
            "visibilityTimeout": "1m"}),
        );
        assert_eq!(
            (d.name.as_str(), d.partitions, d.retention_ms),
            ("o2", Some(6), 0)
        );
        assert_eq!(d.visibility_timeout_ms, Some(60_000));
        let d = desired(json!({"parent": "raw", "replica": true}));
        assert_eq!(
            d.create_partitions, None,
            "a replica inherits the parent's count"
        );
    }

    #[test]
    fn create_when_absent() {
        let d = desired(json!({"partitions": 6}));
        assert_eq!(plan_topic(&d, None).unwrap(), vec![TopicAction::Create]);
        let req = serde_json::to_value(create_request(&d)).unwrap();
        assert_eq!(
            req,
            json!({"name": "orders", "partitions": 6, "retention_ms": 43200000})
        );
    }

    #[test]
    fn child_creates_then_attaches_replica_creates_with_parent() {
        let d = desired(json!({"parent": "raw", "delay": "1h"}));
        assert_eq!(
            plan_topic(&d, None).unwrap(),
            vec![
                TopicAction::Create,
                TopicAction::Attach {
                    parent: "raw".into(),
                    delay_ms: 3_600_000
                }
            ]
        );
        assert_eq!(create_request(&d).parent, None);
        let d = desired(json!({"parent": "raw", "replica": true, "delay": "1h"}));
        assert_eq!(plan_topic(&d, None).unwrap(), vec![TopicAction::Create]);
        let req = create_request(&d);
        assert_eq!(req.parent.as_deref(), Some("raw"));
        assert_eq!(req.fanout_delay_ms, Some(3_600_000));
    }

    #[test]
    fn in_sync_means_no_calls() {
        let d = desired(json!({"partitions": 3}));
        assert!(plan_topic(&d, Some(&record(json!({})))).unwrap().is_empty());
        // Settings the spec leaves out are not managed.
        let d = desired(json!({}));
        let r = record(json!({"partitions": 9, "visibility_timeout_ms": 5000}));
        assert!(plan_topic(&d, Some(&r)).unwrap().is_empty());
    }

    #[test]
    fn alter_only_differences() {
        let d =
            desired(json!({"partitions": 6, "retention": "7d", "maxInFlightPerPartition": 1024}));
        let plan = plan_topic(&d, Some(&record(json!({})))).unwrap();
        assert_eq!(
            plan,
            vec![TopicAction::Alter(AlterFields {
                partitions: Some(6),
                retention_ms: Some(604_800_000),
                ..Default::default()
            })]
        );
        let TopicAction::Alter(f) = &plan[0] else {
            unreachable!()
        };
        assert_eq!(
            serde_json::to_value(f.request()).unwrap(),
            json!({"partitions": 6, "retention_ms": 604800000})
        );
    }

    #[test]
    fn retry_backoff_converges_only_when_declared() {
        let d = desired(json!({"retryBackoff": {"min": "1s", "max": "5m"}}));
        assert_eq!(d.retry_backoff_ms, Some((1_000, 300_000)));
        assert_eq!(
            serde_json::to_value(create_request(&d)).unwrap()["retry_backoff"],
            json!({"min": "1s", "max": "5m0s"})
        );
        // The broker renders Go durations; equal values in another spelling are in sync.
        let same = record(json!({"retry_backoff": {"min": "1000ms", "max": "5m0s"}}));
        assert!(plan_topic(&d, Some(&same)).unwrap().is_empty());
        let plan = plan_topic(&d, Some(&record(json!({})))).unwrap();
        assert_eq!(
            only_alter(&plan),
            json!({"retry_backoff": {"min": "1s", "max": "5m0s"}})
        );
        // "0s" turns a backoff the broker has off, and is in sync with none.
        let off = desired(json!({"retryBackoff": {"min": "0s", "max": "1h"}}));
        assert_eq!(off.retry_backoff_ms, Some((0, 0)));
        off_converges(
            &off,
            &same,
            "retry_backoff",
            json!({"min": "0s", "max": "0s"}),
        );
        // Left out of the spec, the broker's backoff is not managed.
        assert!(plan_topic(&desired(json!({})), Some(&same))
            .unwrap()
            .is_empty());
        // Out of range: the spec is refused before any call.
        for (min, max) in [("5m", "1s"), ("1s", "13h")] {
            let t = topic(json!({"retryBackoff": {"min": min, "max": max}}));
            let err = desired_topic(&t, &TopicDefaults::default()).unwrap_err();
            assert!(err.contains("retryBackoff"), "{err}");
        }
    }

    #[test]
    fn dedup_window_converges_only_when_declared() {
        let d = desired(json!({"dedupWindow": "10m"}));
        assert_eq!(d.dedup_window_ms, Some(600_000));
        assert_eq!(
            serde_json::to_value(create_request(&d)).unwrap()["dedup_window_ms"],
            json!(600_000)
        );
        let same = record(json!({"dedup_window_ms": 600_000}));
        assert!(plan_topic(&d, Some(&same)).unwrap().is_empty());
        let plan = plan_topic(&d, Some(&record(json!({})))).unwrap();
        assert_eq!(only_alter(&plan), json!({"dedup_window_ms": 600_000}));
        // The broker's default (absent in its record) is in sync with a spec that names it.
        let default = desired(json!({"dedupWindow": "5m"}));
        assert!(plan_topic(&default, Some(&record(json!({}))))
            .unwrap()
            .is_empty());
        assert_eq!(
            only_alter(&plan_topic(&default, Some(&same)).unwrap()),
            json!({"dedup_window_ms": 300_000})
        );
        // Left out of the spec, the broker's window is not managed.
        assert!(plan_topic(&desired(json!({})), Some(&same))
            .unwrap()
            .is_empty());
        for bad in ["500ms", "25h"] {
            let t = topic(json!({"dedupWindow": bad}));
            let err = desired_topic(&t, &TopicDefaults::default()).unwrap_err();
            assert!(err.contains("dedupWindow"), "{err}");
        }
    }

    #[test]
    fn delete_if_empty_waits_for_an_empty_backlog_read_whole() {
        let empty =
            json!({"backlog": {"messages": 0, "in_flight": 0, "oldest_unacked_age_seconds": 0}});
        assert_eq!(deletion_blocked(&record(empty.clone())), None);
        let msg = deletion_blocked(&record(
            json!({"backlog": {"messages": 3, "in_flight": 0, "oldest_unacked_age_seconds": 9}}),
        ))
        .unwrap();
        assert!(msg.contains("3 messages waiting and 0 in flight"), "{msg}");
        let msg = deletion_blocked(&record(
            json!({"backlog": {"messages": 0, "in_flight": 1, "oldest_unacked_age_seconds": 9}}),
        ))
        .unwrap();
        assert!(msg.contains("1 in flight"), "{msg}");
        // Unknown is not empty: no backlog (an older broker), or a partial one.
        assert!(deletion_blocked(&record(json!({})))
            .unwrap()
            .contains("cannot be read whole"));
        let mut partial = empty;
        partial["partial"] = json!(true);
        assert!(deletion_blocked(&record(partial)).is_some());
    }

    #[test]
    fn dead_letter_converges_only_when_declared() {
        let d = desired(json!({"deadLetter": {"topic": "orders-dlq", "maxDeliveries": 5}}));
        assert_eq!(d.dead_letter, Some(("orders-dlq".into(), 5)));
        assert_eq!(
            serde_json::to_value(create_request(&d)).unwrap()["dead_letter"],
            json!({"topic": "orders-dlq", "max_deliveries": 5})
        );
        let same = record(json!({"dead_letter": {"topic": "orders-dlq", "max_deliveries": 5}}));
        assert!(plan_topic(&d, Some(&same)).unwrap().is_empty());
        for other in [
            json!({}),
            json!({"dead_letter": {"topic": "orders-dlq", "max_deliveries": 4}}),
            json!({"dead_letter": {"topic": "elsewhere", "max_deliveries": 5}}),
        ] {
            let plan = plan_topic(&d, Some(&record(other))).unwrap();
            assert_eq!(
                only_alter(&plan),
                json!({"dead_letter": {"topic": "orders-dlq", "max_deliveries": 5}})
            );
        }
        // maxDeliveries 0 turns it off, and is in sync with none.
        let off = desired(json!({"deadLetter": {"maxDeliveries": 0}}));
        off_converges(
            &off,
            &same,
            "dead_letter",
            json!({"topic": "", "max_deliveries": 0}),
        );
        // Left out of the spec, the broker's setting is not managed.
        assert!(plan_topic(&desired(json!({})), Some(&same))
            .unwrap()
            .is_empty());
        // Refused before any call.
        for bad in [
            json!({"topic": "orders-dlq", "maxDeliveries": 1001}),
            json!({"maxDeliveries": 3}),
            json!({"topic": "bad name", "maxDeliveries": 3}),
        ] {
            let t = topic(json!({ "deadLetter": bad }));
            let err = desired_topic(&t, &TopicDefaults::default()).unwrap_err();
            assert!(err.contains("deadLetter"), "{err}");
        }
        let own =
            topic(json!({"name": "orders", "deadLetter": {"topic": "orders", "maxDeliveries": 3}}));
        let err = desired_topic(&own, &TopicDefaults::default()).unwrap_err();
        assert!(err.contains("own dead-letter"), "{err}");
    }

    #[test]
    fn partitions_never_shrink() {
        let d = desired(json!({"partitions": 3}));
        let err = plan_topic(&d, Some(&record(json!({"partitions": 6})))).unwrap_err();
        assert!(err.contains("only grow"), "{err}");
    }

    #[test]
    fn schema_change_is_conditional_on_the_read_version() {
        let d = desired(json!({"schema": {"type": "object"}}));
        let r = record(json!({"schema": {"type": "object"}, "schema_version": 2}));
        assert!(plan_topic(&d, Some(&r)).unwrap().is_empty());
        let d = desired(json!({"schema": {"type": "object", "properties": {"a": {}}}}));
        let plan = plan_topic(&d, Some(&r)).unwrap();
        let TopicAction::Alter(f) = &plan[0] else {
            panic!("{plan:?}")
        };
        let req = serde_json::to_value(f.request()).unwrap();
        assert_eq!(req["schema_base_version"], 2);
        assert_eq!(req["schema"]["properties"], json!({"a": {}}));
    }

    #[test]
    fn links_converge() {
        // Attached elsewhere → detach, then attach to the desired parent.
        let d = desired(json!({"parent": "raw"}));
        let r = record(json!({"role": "child", "parent": "other"}));
        assert_eq!(
            plan_topic(&d, Some(&r)).unwrap(),
            vec![
                TopicAction::Detach {
                    parent: "other".into()
                },
                TopicAction::Attach {
                    parent: "raw".into(),
                    delay_ms: 0
                }
            ]
        );
        // Not attached (broker drift) → attach.
        let r = record(json!({}));
        assert_eq!(
            plan_topic(&d, Some(&r)).unwrap(),
            vec![TopicAction::Attach {
                parent: "raw".into(),
                delay_ms: 0
            }]
        );
        // Parent removed from the spec → detach.
        let d = desired(json!({}));
        let r = record(json!({"role": "child", "parent": "raw"}));
        assert_eq!(
            plan_topic(&d, Some(&r)).unwrap(),
            vec![TopicAction::Detach {
                parent: "raw".into()
            }]
        );
        // Same parent and delay → nothing.
        let d = desired(json!({"parent": "raw", "delay": "1h"}));
        let r = record(json!({"role": "child", "parent": "raw", "fanout_delay_ms": 3600000}));
        assert!(plan_topic(&d, Some(&r)).unwrap().is_empty());
    }

    fn link(name: &str, url: &str, topic: &str) -> RemoteLink {
        RemoteLink {
            name: name.into(),
            url: url.into(),
            topic: topic.into(),
        }
    }

    #[test]
    fn remote_links_converge() {
        let t = topic(json!({"remoteChildren": [
            {"name": "dr", "url": "https://dr.example.com/"},
            {"name": "eu", "url": "https://eu.example.com", "topic": "orders-eu"}]}));
        let want = desired_remote_links(&t);
        assert_eq!(
            want,
            vec![
                link("dr", "https://dr.example.com", "dr"),
                link("eu", "https://eu.example.com", "orders-eu"),
            ]
        );
        // Missing → attach; in sync → nothing.
        assert_eq!(
            plan_remote(&want, &[link("dr", "https://dr.example.com", "dr")], &[]),
            vec![RemoteAction::Attach("eu".into())]
        );
        assert!(plan_remote(&want, &want, &[]).is_empty());
        // Changed target → detach, then attach (a fresh start).
        let moved = vec![link("dr", "https://old.example.com", "dr"), want[1].clone()];
        assert_eq!(
            plan_remote(&want, &moved, &[]),
            vec![
                RemoteAction::Detach("dr".into()),
                RemoteAction::Attach("dr".into())
            ]
        );
        // Removed from the spec: detached only if the operator attached it.
        let extra = vec![
            want[0].clone(),
            want[1].clone(),
            link("old", "https://x", "x"),
            link("theirs", "https://y", "y"),
        ];
        assert_eq!(
            plan_remote(&want, &extra, &["old".to_string()]),
            vec![RemoteAction::Detach("old".into())]
        );
    }

    #[test]
    fn status_from_record() {
        let d = desired(json!({}));
        let r = record(
            json!({"owner": "admin", "role": "parent", "partition_stats": [
            {"index": 0, "segments": 0, "oldest_offset": 0, "next_offset": 0, "high_watermark": 0,
             "size_bytes": 0, "owner_node": "prod-narad-1", "status": "ok"},
            {"index": 1, "segments": 0, "oldest_offset": 0, "next_offset": 0, "high_watermark": 0,
             "size_bytes": 0, "owner_node": "prod-narad-0", "status": "ok"}]}),
        );
        let mut s = TopicStatus::default();
        observed_status(&mut s, &d, &r);
        assert_eq!(s.topic_name.as_deref(), Some("orders"));
        assert_eq!(s.owner.as_deref(), Some("admin"));
        assert_eq!(s.partition_owners, vec!["prod-narad-1", "prod-narad-0"]);
        assert_eq!(s.role.as_deref(), Some("parent"));
        assert_eq!(s.backlog, None, "a broker that reports none");
        assert_eq!(s.paused, Some(false));
        let r = record(
            json!({"backlog": {"messages": 7, "in_flight": 2, "oldest_unacked_age_seconds": 40}}),
        );
        observed_status(&mut s, &d, &r);
        assert_eq!(
            s.backlog,
            Some(TopicBacklog {
                messages: 7,
                in_flight: 2,
                oldest_unacked_age_seconds: 40
            })
        );
        observed_status(&mut s, &d, &record(json!({"paused": true})));
        assert_eq!(s.paused, Some(true));
        observed_status(&mut s, &d, &record(json!({})));
        assert_eq!(s.paused, Some(false), "resumed on the broker");
        let s = serde_json::to_value(&s).unwrap();
        assert_eq!(s["paused"], json!(false), "{s}");
    }

    #[test]
    fn observe_compares_only_declared_fields() {
        let differences = |spec: serde_json::Value, rec: serde_json::Value| {
            let t = topic(spec);
            let d = desired_topic(&t, &TopicDefaults::default()).unwrap();
            observed_differences(&t, &d, &record(rec))
        };
        // Nothing declared: a broker topic with other values than the cluster defaults is
        // not a difference (the left-out retention is not the default 12h here).
        assert!(differences(
            json!({"managementPolicy": "Observe"}),
            json!({"retention_ms": 3_600_000u64, "partitions": 9})
        )
        .is_empty());
        // Declared and equal: none.
        assert!(differences(
            json!({"partitions": 3, "retention": "12h", "visibilityTimeout": "30s"}),
            json!({})
        )
        .is_empty());
        // Declared and different: each named with both values.
        let d = differences(
            json!({"partitions": 6, "retention": "2h", "maxInFlightPerPartition": 10,
                   "deadLetter": {"topic": "dlq", "maxDeliveries": 3}, "dedupWindow": "10m",
                   "retryBackoff": {"min": "1s", "max": "1m"}, "parent": "orders-src",
                   "remoteChildren": [{"name": "dr", "url": "https://dr.example.com"}]}),
            json!({"dead_letter": {"topic": "other", "max_deliveries": 5}}),
        );
        assert_eq!(
            d,
            vec![
                "partitions: spec 6, broker 3",
                "retention: spec 7200000 ms, broker 43200000 ms",
                "maxInFlightPerPartition: spec 10, broker 1024",
                "retryBackoff: spec 1000-60000 ms, broker none",
                "deadLetter: spec \"dlq\" after 3 deliveries, broker \"other\" after 5 deliveries",
                "dedupWindow: spec 600000 ms, broker 300000 ms",
                "parent: spec orders-src, broker none",
                "remoteChildren: spec link \"dr\", broker has no such link",
            ]
        );
        // A smaller partition count is reported, not refused (nothing is applied).
        assert_eq!(
            differences(json!({"partitions": 3}), json!({"partitions": 12})),
            vec!["partitions: spec 3, broker 12"]
        );
    }

    #[test]
    fn observe_reads_without_recording_anything_applied() {
        let mut s = TopicStatus::default();
        read_status(
            &mut s,
            &record(json!({"backlog": {"messages": 1, "in_flight": 0,
                "oldest_unacked_age_seconds": 2}})),
        );
        assert_eq!(s.partitions, Some(3));
        assert_eq!((s.replica, s.delay_ms), (None, None));
        assert!(s.backlog.is_some());
        clear_read_status(&mut s);
        assert_eq!((s.partitions, s.backlog, s.paused), (None, None, None));
        assert_eq!(
            s.topic_name.as_deref(),
            Some("orders"),
            "the name stays recorded"
        );
    }

    #[test]
    fn a_paused_topic_is_not_drift() {
        // Pausing is done through the broker; the operator never resumes (or pauses) one.
        for spec in [json!({}), json!({"partitions": 3, "retention": "12h"})] {
            let d = desired(spec);
            let paused = record(json!({"paused": true}));
            assert!(paused.paused);
            assert!(plan_topic(&d, Some(&paused)).unwrap().is_empty());
        }
        // A real difference alters only that, and the request says nothing of pausing.
        let d = desired(json!({"retention": "7d"}));
        let plan = plan_topic(&d, Some(&record(json!({"paused": true})))).unwrap();
        assert_eq!(only_alter(&plan), json!({"retention_ms": 604800000}));
    }
}
