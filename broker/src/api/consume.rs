//! Consume, replay and settle routes (SPEC §3.5, §3.6).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_api::render::{render_key, render_payload, write_json_str};
use narad_api::{AckResult, BatchAckRequest, BatchAckResponse};
use narad_meta::Topic;
use narad_storage::{StorageError, StoredRecord};
use tokio::time::Instant;

use super::{find_topic, json, json_response, parse_json, read_body, AppState, Name, Query};
use crate::error::{ApiError, ApiResult};
use crate::node::Node;
use crate::partition::{Leased, Partition, QueuePolicy, TopicRuntime};
use crate::queue::SettleError;
use crate::security::{authz, Caller};

/// The topic of a consume, replay, ack, extend or nack: the `consume` grant (`403`, whether
/// or not it exists), then existence (`404`).
fn consume_target(node: &Node, caller: &Caller, name: &str) -> ApiResult<Arc<Topic>> {
    let topic = find_topic(node, name);
    authz::consume(caller, name, topic.as_deref())?;
    topic.ok_or_else(|| ApiError::topic_not_found(name))
}

/// Most messages in one batch consume or ack (SPEC §11).
pub const MAX_BATCH: u64 = 100;

/// Writes one message object (SPEC §3.5) into `out`.
fn write_message(
    out: &mut Vec<u8>,
    topic: &str,
    rec: &StoredRecord,
    partition: u32,
    handle: Option<(u64, u64)>,
) {
    out.extend_from_slice(b"{\"topic\":");
    write_json_str(out, topic);
    out.extend_from_slice(
        format!(",\"partition\":{partition},\"offset\":{}", rec.offset).as_bytes(),
    );
    if let Some(key) = &rec.key {
        let (k, enc) = render_key(key);
        out.extend_from_slice(b",\"key\":");
        write_json_str(out, &k);
        if let Some(enc) = enc {
            out.extend_from_slice(format!(",\"key_encoding\":\"{enc}\"").as_bytes());
        }
    }
    let payload = render_payload(&rec.payload);
    out.extend_from_slice(b",\"payload\":");
    payload.write_json(out);
    if let Some(enc) = payload.encoding() {
        out.extend_from_slice(format!(",\"payload_encoding\":\"{enc}\"").as_bytes());
    }
    out.extend_from_slice(format!(",\"timestamp\":{}", rec.timestamp_ms / 1000).as_bytes());
    if let Some((offset, nonce)) = handle {
        out.extend_from_slice(
            format!(",\"receipt_handle\":\"{partition}:{offset}:{nonce}\"").as_bytes(),
        );
    }
    out.push(b'}');
}

/// Leases up to `max` messages from the topic's partitions (or only `only`).
fn try_lease(
    node: &Node,
    topic: &Topic,
    rt: &TopicRuntime,
    only: Option<u32>,
    max: usize,
    out: &mut Vec<(Arc<Partition>, StoredRecord, u64)>,
) -> ApiResult<()> {
    let policy = QueuePolicy::of(topic);
    let parts = rt.partitions();
    if parts.is_empty() {
        return Ok(());
    }
    let n = parts.len();
    let start = rt.next_consume_start() as usize;
    for i in 0..n {
        let part = &parts[(start + i) % n];
        if only.is_some_and(|o| o != part.index) {
            continue;
        }
        while out.len() < max {
            match part.lease(policy) {
                Leased::Message(rec, d) => {
                    part.metrics.consumed.inc();
                    part.metrics.consumed_bytes.inc_by(rec.payload.len() as u64);
                    out.push((part.clone(), rec, d.nonce));
                }
                Leased::Nothing => break,
                Leased::Failed(e) if out.is_empty() => {
                    return Err(ApiError::unavailable(
                        format!("partition {} cannot be read now: {e}", part.index),
                        1,
                    ));
                }
                Leased::Failed(_) => break,
            }
        }
        if out.len() >= max {
            break;
        }
    }
    let _ = node;
    Ok(())
}

pub async fn consume(
    State(node): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let topic = consume_target(&node, &caller, &name)?;
    let q = Query::parse(q.as_deref());
    let partition = q.partition(topic.config.partitions)?;
    let offset = q.text("offset")?;
    let max = match q.text("max")? {
        None => None,
        Some(s) => match s.parse::<u64>() {
            Ok(m) if (1..=MAX_BATCH).contains(&m) => Some(m as usize),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "max must be an integer from 1 to {MAX_BATCH}, got {s:?}"
                )))
            }
        },
    };
    let wait = match q.text("wait")? {
        None | Some("") => Duration::ZERO,
        Some(s) => narad_api::duration::parse_go_duration_nonnegative(s)
            .map_err(|e| ApiError::bad_request(format!("invalid wait {s:?}: {e}")))?,
    }
    .min(node.config.http.max_consume_wait);
    if let Some(o) = offset {
        let offset = o.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("offset must be a non-negative integer, got {o:?}"))
        })?;
        let Some(partition) = partition else {
            return Err(ApiError::bad_request("offset needs partition"));
        };
        if max.is_some() {
            return Err(ApiError::bad_request("max cannot be combined with offset"));
        }
        return replay(&node, &topic, partition, offset);
    }
    let rt = node.runtime(&topic)?;
    let want = max.unwrap_or(1);
    let started = Instant::now();
    let deadline = started + wait;
    let mut got = Vec::new();
    loop {
        let notified = rt.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        try_lease(&node, &topic, &rt, partition, want, &mut got)?;
        if !got.is_empty() {
            break;
        }
        let now = Instant::now();
        if now >= deadline || node.is_shutting_down() {
            break;
        }
        let wake = rt
            .next_deadline()
            .map(|d| Instant::from_std(d) + Duration::from_millis(1))
            .unwrap_or(deadline)
            .min(deadline);
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(wake) => {}
            _ = node.shutdown_signal() => {}
        }
    }
    let outcome = match (got.is_empty(), wait.is_zero()) {
        (false, true) => "no_wait",
        (false, false) => "hit",
        (true, true) => "no_wait",
        (true, false) => {
            if node.is_shutting_down() {
                "cancelled"
            } else {
                "timeout"
            }
        }
    };
    node.observe_consume_wait(&topic.name, outcome, started.elapsed());
    if got.is_empty() {
        node.consume_empty(&topic.name);
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let mut out = Vec::with_capacity(256 * got.len());
    if max.is_some() {
        out.extend_from_slice(b"{\"messages\":[");
        for (i, (part, rec, nonce)) in got.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_message(
                &mut out,
                &topic.name,
                rec,
                part.index,
                Some((rec.offset, *nonce)),
            );
        }
        out.extend_from_slice(b"]}");
    } else {
        let (part, rec, nonce) = &got[0];
        write_message(
            &mut out,
            &topic.name,
            rec,
            part.index,
            Some((rec.offset, *nonce)),
        );
    }
    Ok(json_response(StatusCode::OK, out))
}

fn replay(node: &Node, topic: &Topic, partition: u32, offset: u64) -> ApiResult<Response> {
    let rt = node.runtime(topic)?;
    let part = rt.partition(partition).ok_or_else(|| {
        ApiError::unavailable(format!("partition {partition} is not open on this node"), 1)
    })?;
    part.touch();
    match part.log.read(offset) {
        Ok(Some(rec)) => {
            let mut out = Vec::with_capacity(rec.payload.len() + 128);
            write_message(&mut out, &topic.name, &rec, partition, None);
            Ok(json_response(StatusCode::OK, out))
        }
        Ok(None) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(StorageError::Gone { offset, oldest }) => Err(ApiError::gone(format!(
            "offset {offset} is gone: the oldest retained offset is {oldest}"
        ))),
        Err(StorageError::Unreadable { offset, reason }) => {
            tracing::error!(topic = %topic.name, partition, offset, reason = %reason, "replay of an unreadable record");
            Err(ApiError::gone(format!(
                "offset {offset} is permanently unreadable"
            )))
        }
        Err(e) => Err(ApiError::internal(format!("read failed: {e}"))),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Settle {
    Ack,
    Extend,
    Nack,
}

fn parse_extend(v: Option<&str>) -> ApiResult<Settle> {
    match v {
        None | Some("") | Some("false") => Ok(Settle::Ack),
        Some("true") | Some("1") => Ok(Settle::Extend),
        Some("0") => Ok(Settle::Nack),
        Some(other) => Err(ApiError::bad_request(format!(
            "extend must be true, 1, 0 or false, got {other:?}"
        ))),
    }
}

/// Parses `partition:offset:nonce`.
fn parse_handle(h: &str) -> ApiResult<(u32, u64, u64)> {
    let bad = || ApiError::bad_request(format!("malformed receipt_handle {h:?}"));
    let mut it = h.split(':');
    let (Some(p), Some(o), Some(n), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    Ok((
        p.parse().map_err(|_| bad())?,
        o.parse().map_err(|_| bad())?,
        n.parse().map_err(|_| bad())?,
    ))
}

fn settle_one(
    node: &Node,
    topic: &Topic,
    rt: &TopicRuntime,
    handle: &str,
    how: Settle,
) -> ApiResult<()> {
    if handle.is_empty() {
        return Err(ApiError::bad_request("receipt_handle is empty"));
    }
    let (p, offset, nonce) = parse_handle(handle)?;
    let stale = |why: &str| {
        node.ack_rejected("stale");
        ApiError::gone(format!(
            "lease expired, superseded or already settled ({why})"
        ))
    };
    let Some(part) = (p < topic.config.partitions)
        .then(|| rt.partition(p))
        .flatten()
    else {
        return Err(stale("no such partition"));
    };
    let policy = QueuePolicy::of(topic);
    let res = match how {
        Settle::Ack => part.ack(offset, nonce, policy),
        Settle::Extend => part.extend(offset, nonce, policy),
        Settle::Nack => part.nack(offset, nonce),
    };
    match res {
        Ok(()) => {
            match how {
                Settle::Extend => node.count_extend(&topic.name),
                Settle::Nack => {
                    node.count_nack(&topic.name);
                    rt.wake_consumers(1);
                }
                Settle::Ack => {}
            }
            Ok(())
        }
        Err(SettleError::Stale) => Err(stale("handle no longer valid")),
        Err(SettleError::AckedAheadFull) => {
            node.ack_rejected("acked_ahead_full");
            Err(ApiError::unavailable(
                format!("acked-ahead limit reached on partition {p}: an earlier message is still unsettled; retry"),
                1,
            ))
        }
    }
}

pub async fn ack(
    State(node): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let topic = consume_target(&node, &caller, &name)?;
    let q = Query::parse(q.as_deref());
    let how = parse_extend(q.text("extend")?)?;
    let rt = node.runtime(&topic)?;
    if let Some(handle) = q.text("receipt_handle")? {
        settle_one(&node, &topic, &rt, handle, how)?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let body = read_body(&headers, body).await?;
    if body.is_empty() {
        return Err(ApiError::bad_request("receipt_handle required"));
    }
    let req: BatchAckRequest = parse_json(&body)?;
    if req.receipt_handles.is_empty() || req.receipt_handles.len() as u64 > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "receipt_handles holds 1 to {MAX_BATCH} handles, got {}",
            req.receipt_handles.len()
        )));
    }
    let results = req
        .receipt_handles
        .iter()
        .map(|h| match settle_one(&node, &topic, &rt, h, how) {
            Ok(()) => AckResult {
                status: 204,
                error: None,
            },
            Err(e) => AckResult {
                status: e.status.as_u16(),
                error: Some(e.message),
            },
        })
        .collect();
    Ok(json(StatusCode::OK, &BatchAckResponse { results }))
}
