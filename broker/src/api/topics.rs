//! Topic routes (SPEC §3.3): create, list, get (with partition stats), alter, delete.

use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_api::{
    AlterTopicRequest, CreateTopicRequest, ErrorBody, RetryBackoff, TopicList, TopicRecord,
};
use narad_meta::{
    Backoff, DeadLetter, MetaCommand, MetaResponse, MetaState, Topic, TopicConfig, TopicPatch,
    MAX_FANOUT_DELAY_MS,
};
use serde_json::value::RawValue;

use super::{find_topic, json, managed_topic, read_json, AppState, Name, Query};
use crate::app::App;
use crate::clock::now_ms;
use crate::error::{ApiError, ApiResult};
use crate::schema;
use crate::security::{audit, authz, Caller};

/// Longest topic name in bytes.
pub const MAX_NAME_LEN: usize = 200;
/// Longest visibility timeout: one year.
pub const MAX_VISIBILITY_MS: i64 = 365 * 24 * 3600 * 1000;
/// Shortest non-zero retention: one hour.
pub const MIN_RETENTION_MS: i64 = 3_600_000;
const DEFAULT_LIST_LIMIT: u64 = 100;
const MAX_LIST_LIMIT: u64 = 1000;

/// `delay_ms` / `fanout_delay_ms`: 0 (none) to one year (`400` outside).
pub fn check_delay(field: &str, v: u64) -> ApiResult<u64> {
    if v > MAX_FANOUT_DELAY_MS {
        return Err(ApiError::bad_request(format!(
            "{field} must be between 0 and {MAX_FANOUT_DELAY_MS} (one year)"
        )));
    }
    Ok(v)
}

/// SPEC §2.1: 1–200 bytes of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn validate_name(name: &str) -> ApiResult<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(ApiError::bad_request(format!(
            "topic name must be 1 to {MAX_NAME_LEN} bytes long"
        )));
    }
    if name == "." || name == ".." {
        return Err(ApiError::bad_request(
            "topic name must not be \".\" or \"..\"",
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(ApiError::bad_request(format!(
            "invalid topic name {name:?}: only [A-Za-z0-9._-] allowed"
        )));
    }
    Ok(())
}

fn non_negative(field: &str, v: Option<i64>) -> ApiResult<Option<u64>> {
    match v {
        Some(n) if n < 0 => Err(ApiError::bad_request(format!(
            "{field} must not be negative"
        ))),
        other => Ok(other.map(|n| n as u64)),
    }
}

fn check_retention(v: u64) -> ApiResult<u64> {
    if v != 0 && v < MIN_RETENTION_MS as u64 {
        return Err(ApiError::bad_request(format!(
            "retention_ms must be 0 (forever) or at least {MIN_RETENTION_MS} (1 h)"
        )));
    }
    Ok(v)
}

fn check_visibility(v: u64) -> ApiResult<u64> {
    if v > MAX_VISIBILITY_MS as u64 {
        return Err(ApiError::bad_request(
            "visibility_timeout_ms must be at most one year",
        ));
    }
    Ok(v)
}

/// Longest `retry_backoff` wait: 12 hours.
const MAX_BACKOFF: Duration = Duration::from_secs(12 * 3600);

/// `retry_backoff`: `min` and `max` Go durations, 1 ms ≤ `min` ≤ `max` ≤ 12 h; `min` 0 turns
/// it off (returned with `min_ms` 0).
fn check_backoff(b: &RetryBackoff) -> ApiResult<Backoff> {
    let parse = |name: &str, v: &str| {
        narad_api::duration::parse_go_duration(v)
            .map_err(|e| ApiError::bad_request(format!("invalid retry_backoff.{name} {v:?}: {e}")))
    };
    let min = parse("min", &b.min)?;
    if min.is_zero() {
        return Ok(Backoff {
            min_ms: 0,
            max_ms: 0,
        });
    }
    let max = parse("max", &b.max)?;
    if min < Duration::from_millis(1) || max < min || max > MAX_BACKOFF {
        return Err(ApiError::bad_request(format!(
            "retry_backoff needs 1ms <= min <= max <= 12h, got min {:?} and max {:?}",
            b.min, b.max
        )));
    }
    Ok(Backoff {
        min_ms: min.as_millis() as u64,
        max_ms: max.as_millis() as u64,
    })
}

/// (ext) `dedup_window_ms`: 1 s to 24 h ([`narad_api::DEDUP_WINDOW_MS`]); on alter 0 goes
/// back to the default (`Some(0)`).
fn check_dedup_window(v: i64, alter: bool) -> ApiResult<u64> {
    let range = narad_api::DEDUP_WINDOW_MS;
    match u64::try_from(v) {
        Ok(0) if alter => Ok(0),
        Ok(w) if range.contains(&w) => Ok(w),
        _ => Err(ApiError::bad_request(format!(
            "dedup_window_ms must be {} to {} (1s to 24h{}), got {v}",
            range.start(),
            range.end(),
            if alter {
                "; 0 goes back to the default 5m"
            } else {
                ""
            }
        ))),
    }
}

/// Most deliveries a `dead_letter` setting allows before the message is dead-lettered.
pub const MAX_DEAD_LETTER_DELIVERIES: u32 = 1000;

/// `dead_letter` of topic `name`: `max_deliveries` 1 to 1000 and a target that exists, is not
/// the topic itself, and the caller may produce to (`403` before `404`, as a produce);
/// `max_deliveries` 0 turns it off (returned as is).
fn check_dead_letter(
    view: &MetaState,
    caller: &Caller,
    name: &str,
    d: &narad_api::DeadLetter,
) -> ApiResult<DeadLetter> {
    if d.max_deliveries == 0 {
        return Ok(DeadLetter {
            topic: String::new(),
            max_deliveries: 0,
        });
    }
    if d.max_deliveries > MAX_DEAD_LETTER_DELIVERIES {
        return Err(ApiError::bad_request(format!(
            "dead_letter.max_deliveries must be 1 to {MAX_DEAD_LETTER_DELIVERIES} (0 turns it off), got {}",
            d.max_deliveries
        )));
    }
    if d.topic.is_empty() {
        return Err(ApiError::bad_request("dead_letter.topic is missing"));
    }
    if d.topic == name {
        return Err(ApiError::bad_request(
            "a topic cannot be its own dead-letter topic",
        ));
    }
    let target = view.topics.get(&d.topic).map(|t| &**t);
    authz::produce(caller, &d.topic, target).map_err(|denied| match denied {
        authz::Denied::NotFound(_) => {
            ApiError::not_found(format!("dead-letter topic {} not found", d.topic))
        }
        other => other.into(),
    })?;
    Ok(DeadLetter {
        topic: d.topic.clone(),
        max_deliveries: d.max_deliveries,
    })
}

/// The topics whose dead-letter topic is `name` (a topic they name cannot be deleted).
fn dead_letter_sources<'a>(view: &'a MetaState, name: &str) -> Vec<&'a str> {
    view.topics
        .values()
        .filter(|t| {
            t.config
                .dead_letter
                .as_ref()
                .is_some_and(|d| d.topic == name)
        })
        .map(|t| t.name.as_str())
        .collect()
}

fn check_partitions(app: &App, p: u64) -> ApiResult<u32> {
    let max = app.config.topic.max_partitions as u64;
    if !(3..=max).contains(&p) {
        return Err(ApiError::bad_request(format!(
            "partitions must be between 3 and {max}"
        )));
    }
    Ok(p as u32)
}

fn check_schema(raw: &RawValue) -> ApiResult<String> {
    let text = raw.get().to_string();
    schema::compile(&text).map_err(ApiError::bad_request)?;
    Ok(text)
}

/// The topic record of SPEC §3.2 (without stats), with its links as `view` has them.
pub fn record(view: &MetaState, t: &Topic) -> TopicRecord {
    let schema = t.current_schema();
    let link = view.parent_link(&t.name);
    TopicRecord {
        name: t.name.clone(),
        partitions: t.config.partitions,
        retention_ms: t.config.retention_ms,
        visibility_timeout_ms: t.config.visibility_timeout_ms,
        max_in_flight_per_partition: t.config.max_in_flight_per_partition,
        max_acked_ahead_per_partition: t.config.max_acked_ahead_per_partition,
        created_at: t.created_at_ms,
        owner: t.owner.clone(),
        role: view.role(&t.name).into(),
        parent: link.map(|l| l.parent.clone()),
        attach_epoch: link.map(|l| l.epoch.to_string()),
        fanout_delay_ms: link.map_or(0, |l| l.delay_ms),
        children: view
            .children_of(&t.name)
            .into_iter()
            .map(|l| l.child.clone())
            .collect(),
        remote_children: view
            .remote_links_of(&t.name)
            .into_iter()
            .map(|l| l.link.clone())
            .collect(),
        schema: schema.and_then(|s| RawValue::from_string(s.schema.clone()).ok()),
        schema_version: schema.map_or(0, |s| s.version),
        paused: t.paused,
        retry_backoff: t
            .config
            .retry_backoff
            .map(|b| RetryBackoff::from_ms(b.min_ms, b.max_ms)),
        dead_letter: t
            .config
            .dead_letter
            .as_ref()
            .map(|d| narad_api::DeadLetter {
                topic: d.topic.clone(),
                max_deliveries: d.max_deliveries,
            }),
        dedup_window_ms: t.config.dedup_window_ms.map(|w| w as i64),
        ..Default::default()
    }
}

/// Create a topic.
///
/// The answer follows the commit of the record and its partition assignments, so the topic
/// is usable at once on every node. With `parent` the topic is born attached (a replica
/// child, or with `fanout_delay_ms` a delay child); a failed attach leaves nothing behind.
#[utoipa::path(
    post,
    path = "/v1/topics",
    tag = "topics",
    operation_id = "createTopic",
    request_body = CreateTopicRequest,
    responses(
        (status = 201, description = "Created: the topic record.", body = TopicRecord),
        (status = 400, description = "Bad name, bounds, JSON, schema, own parent, `fanout_delay_ms` without `parent` or outside 0-1 year.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "The parent does not exist.", body = ErrorBody),
        (status = 409, description = "The name is taken (case-insensitively), a parent role conflict or child limit, the parent's retention is too short.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let req: CreateTopicRequest = read_json(&headers, body).await?;
    validate_name(&req.name)?;
    if req.parent.as_deref() == Some(req.name.as_str()) {
        return Err(ApiError::bad_request("a topic cannot be its own parent"));
    }
    {
        // `create` on the name (403); with a parent, the parent exists (404) and the caller
        // owns it or is admin (403). A sent `owner` is ignored: the owner is the caller.
        let view = app.meta.view();
        let parent = req
            .parent
            .as_deref()
            .map(|p| (p, view.topics.get(p).map(|t| &**t)));
        authz::create(&caller, &req.name, parent)?;
    }
    let d = &app.config.topic;
    let partitions = match non_negative("partitions", req.partitions)? {
        // A child created with its parent inherits the parent's count (resolved in apply).
        None | Some(0) if req.parent.is_some() => 0,
        None | Some(0) => d.default_partitions,
        Some(p) => check_partitions(&app, p)?,
    };
    let retention_ms = match non_negative("retention_ms", req.retention_ms)? {
        None => d.default_retention_age_ms,
        Some(r) => check_retention(r)?,
    };
    let visibility_timeout_ms =
        match non_negative("visibility_timeout_ms", req.visibility_timeout_ms)? {
            None | Some(0) => d.default_visibility_timeout_ms,
            Some(v) => check_visibility(v)?,
        };
    let max_in_flight = non_negative(
        "max_in_flight_per_partition",
        req.max_in_flight_per_partition,
    )?
    .filter(|v| *v > 0)
    .unwrap_or(d.default_max_in_flight_per_partition);
    let max_acked_ahead = non_negative(
        "max_acked_ahead_per_partition",
        req.max_acked_ahead_per_partition,
    )?
    .filter(|v| *v > 0)
    .unwrap_or(d.default_max_acked_ahead_per_partition);
    let delay = non_negative("fanout_delay_ms", req.fanout_delay_ms)?;
    if req.parent.is_none() && delay.is_some_and(|d| d > 0) {
        return Err(ApiError::bad_request("fanout_delay_ms needs parent"));
    }
    let delay = check_delay("fanout_delay_ms", delay.unwrap_or(0))?;
    let schema = req.schema.as_deref().map(check_schema).transpose()?;
    let config = TopicConfig {
        partitions,
        retention_ms,
        visibility_timeout_ms,
        max_in_flight_per_partition: max_in_flight,
        max_acked_ahead_per_partition: max_acked_ahead,
        retry_backoff: req
            .retry_backoff
            .as_ref()
            .map(check_backoff)
            .transpose()?
            .filter(|b| b.min_ms > 0),
        dead_letter: req
            .dead_letter
            .as_ref()
            .map(|d| check_dead_letter(&app.meta.view(), &caller, &req.name, d))
            .transpose()?
            .filter(|d| d.max_deliveries > 0),
        dedup_window_ms: req
            .dedup_window_ms
            .map(|w| check_dedup_window(w, false))
            .transpose()?,
    };
    let cmd = match &req.parent {
        Some(parent) => {
            if !app.meta.view().topics.contains_key(parent) {
                return Err(ApiError::not_found(format!(
                    "parent topic {parent} not found"
                )));
            }
            // Created and attached in one metadata command: a refused attach (409) leaves
            // nothing behind. Placement of the replica's partitions is decided in apply.
            MetaCommand::CreateChildTopic {
                name: req.name.clone(),
                config,
                owner: caller.owner(),
                schema,
                created_at_ms: now_ms(),
                parent: parent.clone(),
                delay_ms: delay,
            }
        }
        None => MetaCommand::CreateTopic {
            name: req.name.clone(),
            config,
            owner: caller.owner(),
            schema,
            created_at_ms: now_ms(),
        },
    };
    let topic = app.propose_topic(cmd).await?;
    app.apply_topics()?;
    app.children.sync().await;
    app.queries.await_members_applied(&topic).await;
    audit::event("topic.create", caller.actor(), &topic.name);
    if let Some(parent) = &req.parent {
        audit::event(
            "topic.attach",
            caller.actor(),
            &format!("{parent}/{}", topic.name),
        );
    }
    Ok(json(StatusCode::CREATED, &record(&app.meta.view(), &topic)))
}

/// `limit` of a topic listing: at least 1, larger values capped at [`MAX_LIST_LIMIT`].
fn parse_limit(v: Option<&str>) -> ApiResult<u64> {
    match v {
        None => Ok(DEFAULT_LIST_LIMIT),
        Some(s) => match s.parse::<i64>() {
            Ok(n) if n >= 1 => Ok((n as u64).min(MAX_LIST_LIMIT)),
            _ => Err(ApiError::bad_request(format!(
                "limit must be an integer of at least 1, got {s:?}"
            ))),
        },
    }
}

/// Pages over the topics the caller sees (SPEC §4.3), by name: the token is the last name
/// of the previous page and the next page holds visible names strictly greater than it.
#[utoipa::path(
    get,
    path = "/v1/topics",
    tag = "topics",
    operation_id = "listTopics",
    params(
        ("limit" = Option<u32>, Query, description = "Page size: 1 to 1000 (larger is capped), default 100."),
        ("page_token" = Option<String>, Query, description = "The previous page's `next_page_token`: this page holds names strictly greater."),
    ),
    responses(
        (status = 200, description = "Topics in ascending name order (with security on, only those the caller sees); `next_page_token` is `\"\"` when nothing follows.", body = TopicList),
        (status = 400, description = "`limit` is not an integer or is below 1.", body = ErrorBody),
    ),
)]
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let q = Query::parse(q.as_deref());
    let limit = parse_limit(q.text("limit")?)?;
    let token = q.text("page_token")?.unwrap_or("");
    let view = app.meta.view();
    let start = if token.is_empty() {
        Bound::Unbounded
    } else {
        Bound::Excluded(token.to_string())
    };
    let mut it = view
        .topics
        .range((start, Bound::Unbounded))
        .filter(|(_, t)| authz::visible(&caller, t));
    let page: Vec<TopicRecord> = it
        .by_ref()
        .take(limit as usize)
        .map(|(_, t)| record(&view, t))
        .collect();
    let next_page_token = if it.next().is_some() {
        page.last().map(|r| r.name.clone()).unwrap_or_default()
    } else {
        String::new()
    };
    Ok(json(
        StatusCode::OK,
        &TopicList {
            topics: page,
            next_page_token,
        },
    ))
}

/// Read a topic: its record plus `partition_stats` (one entry per partition, or only
/// `partition`) and `backlog`; `partial` when an owner could not answer (its entry is a
/// placeholder with `status: owner_unavailable`).
#[utoipa::path(
    get,
    path = "/v1/topics/{topic}",
    tag = "topics",
    operation_id = "getTopic",
    params(
        super::openapi::TopicPath,
        ("partition" = Option<u32>, Query, description = "Only this partition's stats."),
    ),
    responses(
        (status = 200, description = "The topic record with stats.", body = TopicRecord),
        (status = 400, description = "`partition` out of range or not a number.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let topic = find_topic(&app, &name).await;
    authz::view(&caller, &name, topic.as_deref())?;
    let topic = topic.ok_or_else(|| ApiError::topic_not_found(&name))?;
    let q = Query::parse(q.as_deref());
    let only = q.partition(topic.config.partitions)?;
    let mut rec = record(&app.meta.view(), &topic);
    let wanted: Vec<u32> = (0..topic.config.partitions)
        .filter(|p| only.is_none_or(|o| o == *p))
        .collect();
    let stats = app.queries.topic_stats(&topic, &wanted).await;
    rec.partial = stats.iter().any(|s| s.status != "ok");
    let mut backlog = narad_api::Backlog::default();
    for b in stats.iter().filter_map(|s| s.backlog.as_ref()) {
        backlog.add(b);
    }
    rec.backlog = Some(backlog);
    rec.partition_stats = Some(stats);
    Ok(json(StatusCode::OK, &rec))
}

/// Alter a topic: every field given is validated first, then applied as one change.
#[utoipa::path(
    patch,
    path = "/v1/topics/{topic}",
    tag = "topics",
    operation_id = "alterTopic",
    params(super::openapi::TopicPath),
    request_body = AlterTopicRequest,
    responses(
        (status = 200, description = "The altered topic record.", body = TopicRecord),
        (status = 400, description = "No field, an unknown field, a value out of bounds, fewer partitions.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
        (status = 409, description = "Retention below a delay child's need, schema base mismatch, schema change on an attached child.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn alter(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let topic = managed_topic(&app, &caller, &name).await?;
    let req: AlterTopicRequest = read_json(&headers, body).await?;
    let mut patch = TopicPatch::default();
    if let Some(p) = non_negative("partitions", req.partitions)? {
        if p <= topic.config.partitions as u64 {
            return Err(ApiError::bad_request(format!(
                "partitions can only grow: the topic has {}, asked for {p}",
                topic.config.partitions
            )));
        }
        patch.partitions = Some(check_partitions(&app, p)?);
    }
    if let Some(r) = non_negative("retention_ms", req.retention_ms)? {
        patch.retention_ms = Some(check_retention(r)?);
    }
    let d = &app.config.topic;
    if let Some(v) = non_negative("visibility_timeout_ms", req.visibility_timeout_ms)? {
        patch.visibility_timeout_ms = Some(if v == 0 {
            d.default_visibility_timeout_ms
        } else {
            check_visibility(v)?
        });
    }
    if let Some(v) = non_negative(
        "max_in_flight_per_partition",
        req.max_in_flight_per_partition,
    )? {
        patch.max_in_flight_per_partition = Some(if v == 0 {
            d.default_max_in_flight_per_partition
        } else {
            v
        });
    }
    if let Some(v) = non_negative(
        "max_acked_ahead_per_partition",
        req.max_acked_ahead_per_partition,
    )? {
        patch.max_acked_ahead_per_partition = Some(if v == 0 {
            d.default_max_acked_ahead_per_partition
        } else {
            v
        });
    }
    if let Some(raw) = req.schema.as_deref() {
        let text = check_schema(raw)?;
        if let Some(current) = topic.current_schema() {
            schema::check_compatible(&current.schema, &text).map_err(ApiError::bad_request)?;
        }
        patch.schema = Some(text);
    }
    if let Some(b) = &req.retry_backoff {
        patch.retry_backoff = Some(check_backoff(b)?);
    }
    if let Some(d) = &req.dead_letter {
        patch.dead_letter = Some(check_dead_letter(&app.meta.view(), &caller, &name, d)?);
    }
    if let Some(w) = req.dedup_window_ms {
        patch.dedup_window_ms = Some(check_dedup_window(w, true)?);
    }
    if let Some(v) = non_negative("schema_base_version", req.schema_base_version)? {
        patch.schema_base_version = Some(v as u32);
    }
    let changes = TopicPatch {
        schema_base_version: None,
        ..patch.clone()
    };
    if changes == TopicPatch::default() {
        return Err(ApiError::bad_request("nothing to change: give at least one of partitions, retention_ms, visibility_timeout_ms, max_in_flight_per_partition, max_acked_ahead_per_partition, schema, retry_backoff, dead_letter, dedup_window_ms"));
    }
    let updated = app
        .propose_topic(MetaCommand::AlterTopic {
            name: name.clone(),
            patch,
        })
        .await?;
    app.apply_topics()?;
    app.queries.await_members_applied(&updated).await;
    Ok(json(StatusCode::OK, &record(&app.meta.view(), &updated)))
}

/// Delete a topic and every node's data of it; its children are detached (keeping their
/// data) and it is detached from its parent.
#[utoipa::path(
    delete,
    path = "/v1/topics/{topic}",
    tag = "topics",
    operation_id = "deleteTopic",
    params(super::openapi::TopicPath),
    responses(
        (status = 204, description = "Deleted."),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
        (status = 409, description = "(ext) Another topic names it as its dead-letter topic.", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
) -> ApiResult<Response> {
    authz::manage(&caller, &name, find_topic(&app, &name).await.as_deref())?;
    {
        let view = app.meta.view();
        let sources = dead_letter_sources(&view, &name);
        if !sources.is_empty() {
            return Err(ApiError::conflict(format!(
                "topic {name} is the dead-letter topic of {}: change their dead_letter first",
                sources.join(", ")
            )));
        }
    }
    let deleted: Arc<Topic> = match app
        .propose(MetaCommand::DeleteTopic { name: name.clone() })
        .await?
    {
        MetaResponse::Deleted(t) => t,
        other => {
            return Err(ApiError::internal(format!(
                "unexpected metadata answer {other:?}"
            )))
        }
    };
    app.ingest.forget_topic(deleted.id);
    // Cursors copying into or out of it stop before its data goes.
    app.children.sync().await;
    app.apply_topics()?;
    app.queries.await_members_applied(&deleted).await;
    audit::event("topic.delete", caller.actor(), &name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn prop_list_limit(v in proptest::option::of(prop_oneof![
            any::<String>(),
            "[+-]?[0-9]{0,20}",
            any::<i64>().prop_map(|n| n.to_string()),
        ])) {
            match (parse_limit(v.as_deref()), v.as_deref().map(str::parse::<i64>)) {
                (Ok(l), None) => prop_assert_eq!(l, DEFAULT_LIST_LIMIT),
                (Ok(l), Some(Ok(n))) => {
                    prop_assert!(n >= 1);
                    prop_assert_eq!(l, (n as u64).min(MAX_LIST_LIMIT));
                }
                (Err(e), Some(n)) => {
                    prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST);
                    prop_assert!(n.map_or(true, |n| n < 1));
                }
                (r, n) => prop_assert!(false, "{:?} for {:?}", r, n),
            }
        }
    }
}
