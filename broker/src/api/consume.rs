//! Consume, replay and settle routes (SPEC §3.5, §3.6).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use narad_api::render::{render_key, render_payload, write_json_str};
use narad_api::{AckResult, BatchAckRequest, BatchAckResponse};
use narad_meta::Topic;
use narad_storage::{StorageError, StoredRecord};
use tokio::time::Instant;

use super::{find_topic, json, json_response, parse_json, read_body, AppState, Name, Query};
use crate::cluster::wire::{ConsumeRequest, SettleKind, SettleRequest};
use crate::cluster::{Cluster, TopicLookup};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::leases::SettleError;
use crate::node::Node;
use crate::partition::{Leased, QueuePolicy, TopicRuntime};
use crate::rpc::{Opcode, RpcReply};
use crate::security::{authz, Caller};

/// The topic of a consume, replay, ack, extend or nack: the `consume` grant (`403`, whether
/// or not it exists), then existence (`404`).
async fn consume_target(node: &Node, caller: &Caller, name: &str) -> ApiResult<Arc<Topic>> {
    let topic = find_topic(node, name).await;
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

/// Most bytes of JSON in one consume answer (SPEC §11): a batch holds the messages that fit,
/// and always at least one (a message of at most [`super::MAX_BODY`] renders to well under
/// this). It stays below the RPC frame limit with room for the reply's own fields, so an
/// owner's answer to a forwarded consume always fits one frame.
pub const MAX_ANSWER_BYTES: usize = crate::rpc::proto::MAX_PAYLOAD - 64 * 1024;

/// The bytes of kept messages one answer takes: its budget less `{"messages":[` and `]}`.
const PREFETCH_BUDGET: usize = MAX_ANSWER_BYTES - 16;

/// A consume answer rendered while its messages are leased: one message object, or
/// `{"messages":[…]}` for a batch, never more than its byte budget.
struct Answer {
    out: Vec<u8>,
    count: usize,
    batch: bool,
    budget: usize,
}

impl Answer {
    fn new(batch: bool) -> Answer {
        Answer::with_budget(batch, MAX_ANSWER_BYTES)
    }

    fn with_budget(batch: bool, budget: usize) -> Answer {
        let mut out = Vec::with_capacity(512);
        if batch {
            out.extend_from_slice(b"{\"messages\":[");
        }
        Answer {
            out,
            count: 0,
            batch,
            budget,
        }
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Adds a leased message if it fits (the first always does); `false` leaves the answer
    /// as it was, and the caller hands the lease back.
    fn push(&mut self, topic: &str, rec: &StoredRecord, partition: u32, nonce: u64) -> bool {
        let mark = self.out.len();
        if self.count > 0 {
            self.out.push(b',');
        }
        write_message(
            &mut self.out,
            topic,
            rec,
            partition,
            Some((rec.offset, nonce)),
        );
        // Room for the closing `]}` of a batch.
        if self.count > 0 && self.out.len() + 2 > self.budget {
            self.out.truncate(mark);
            return false;
        }
        self.count += 1;
        true
    }

    fn finish(mut self) -> Vec<u8> {
        if self.batch {
            self.out.extend_from_slice(b"]}");
        }
        self.out
    }
}

/// Leases messages from the topic's local partitions (or only `only`) into `out`, up to `max`
/// and as many as its byte budget holds. A message that does not fit is handed back at once,
/// so nothing is leased that the answer does not carry.
fn try_lease(
    topic: &Topic,
    rt: &TopicRuntime,
    only: Option<u32>,
    max: usize,
    out: &mut Answer,
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
        while out.count < max {
            match part.lease(policy) {
                Leased::Message(rec, d) => {
                    if !out.push(&topic.name, &rec, part.index, d.nonce) {
                        part.hand_back(d.offset, d.nonce);
                        return Ok(());
                    }
                    part.metrics.consumed.inc();
                    part.metrics.consumed_bytes.inc_by(rec.payload.len() as u64);
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
        if out.count >= max {
            break;
        }
    }
    Ok(())
}

/// What a consume found.
enum Found {
    /// Leased here, rendered.
    Local(Vec<u8>),
    /// A remote owner's answer, passed on as it is.
    Remote(RpcReply),
    /// Messages leased on remote owners (prefetched), rendered one by one.
    Prefetched(Vec<Bytes>),
    Nothing,
}

/// How often a waiting consume asks remote owners again (SPEC §6.3).
const REPROBE_EVERY: Duration = Duration::from_millis(250);

/// The queue consume loop: local partitions first, then each of `remotes` once (a
/// non-blocking, local-only scan on the owner), then waits until `deadline` for a local
/// commit, nack or expiry, asking the remote owners again every 250 ms.
#[allow(clippy::too_many_arguments)]
async fn lease_spread(
    node: &Arc<Node>,
    topic: &Topic,
    rt: &TopicRuntime,
    only: Option<u32>,
    want: usize,
    max: Option<u32>,
    deadline: Instant,
    remotes: &[String],
) -> ApiResult<Found> {
    let mut got = Answer::new(max.is_some());
    let mut next_probe = Instant::now();
    loop {
        let notified = rt.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Prefetched messages first: their leases already run.
        if !remotes.is_empty() {
            let view = node.meta.view();
            let (kept, stale) = node
                .cluster
                .prefetch
                .take(topic.id, want, PREFETCH_BUDGET, |o| {
                    Cluster::is_alive(&view, o)
                });
            release_kept(node, topic, stale);
            if !kept.is_empty() {
                return Ok(Found::Prefetched(
                    kept.into_iter().map(|s| s.body).collect(),
                ));
            }
        }
        try_lease(topic, rt, only, want, &mut got)?;
        if !got.is_empty() {
            return Ok(Found::Local(got.finish()));
        }
        if !remotes.is_empty() && Instant::now() >= next_probe {
            if let Some(found) = probe_remotes(node, topic, rt, want, max, remotes).await {
                return Ok(found);
            }
            next_probe = Instant::now() + REPROBE_EVERY;
        }
        let now = Instant::now();
        if now >= deadline || node.is_shutting_down() {
            return Ok(Found::Nothing);
        }
        let mut wake = rt
            .next_deadline()
            .map(|d| Instant::from_std(d) + Duration::from_millis(1))
            .unwrap_or(deadline)
            .min(deadline);
        if !remotes.is_empty() {
            wake = wake.min(next_probe);
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(wake) => {}
            _ = node.shutdown_signal() => {}
        }
    }
}

/// Asks each remote owner once for messages (`wait` 0); the first `200` wins. With other
/// consumes of the topic running here it asks for one message each and keeps the extra
/// ones for them (see `cluster::prefetch`), waking them.
async fn probe_remotes(
    node: &Node,
    topic: &Topic,
    rt: &TopicRuntime,
    want: usize,
    max: Option<u32>,
    remotes: &[String],
) -> Option<Found> {
    let fetch = node.cluster.prefetch.fetch_size(topic.id, want);
    let ask = if fetch > want {
        Some(fetch as u32)
    } else {
        max
    };
    for owner in remotes {
        let req = ConsumeRequest {
            topic_id: topic.id,
            topic: topic.name.clone(),
            partition: None,
            offset: None,
            max: ask,
            wait_ms: 0,
        };
        let r = match forward_consume(node, owner, &req).await {
            Ok(r) if r.status == 200 => r,
            Ok(_) => continue,
            // Skipped either way: a probe lost after it was sent may have leased messages on
            // the owner, which come back when their visibility timeout runs out (no handle
            // reached anyone), so the consume goes on with the other owners.
            Err(e) => {
                tracing::debug!(owner = %owner, status = e.status().as_u16(), error = %e.message, "consume probe failed");
                continue;
            }
        };
        if ask == max {
            return Some(Found::Remote(r));
        }
        let usable = Duration::from_millis(topic.config.visibility_timeout_ms / 2);
        match node
            .cluster
            .prefetch
            .split(topic.id, owner, &r.body, want, usable)
        {
            Ok(split) => {
                if split.kept > 0 {
                    rt.notify.notify_waiters();
                }
                if !split.mine.is_empty() {
                    return Some(Found::Prefetched(split.mine));
                }
            }
            Err(e) => {
                tracing::warn!(owner = %owner, error = %e, "unreadable batch consume answer");
            }
        }
    }
    None
}

/// Releases kept messages that can no longer be handed out (`Nack` to their owners), in the
/// background.
fn release_kept(node: &Arc<Node>, topic: &Topic, items: Vec<crate::cluster::prefetch::Stashed>) {
    if items.is_empty() {
        return;
    }
    let mut by_owner: Vec<(String, Vec<String>)> = Vec::new();
    for s in items {
        match by_owner.iter_mut().find(|(o, _)| *o == s.owner) {
            Some((_, v)) => v.push(s.handle),
            None => by_owner.push((s.owner, vec![s.handle])),
        }
    }
    let (node, topic) = (node.clone(), topic.clone());
    tokio::spawn(async move {
        for (owner, handles) in by_owner {
            settle_remote(&node, &topic, &owner, handles, SettleKind::Nack).await;
        }
    });
}

/// Releases every kept message (a stopping node), waiting for the owners' answers.
pub async fn release_all_kept(node: &Arc<Node>) {
    let kept = node.cluster.prefetch.drain();
    let mut groups: Vec<((u64, String), Vec<String>)> = Vec::new();
    for (topic_id, s) in kept {
        let key = (topic_id, s.owner);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(s.handle),
            None => groups.push((key, vec![s.handle])),
        }
    }
    for ((topic_id, owner), handles) in groups {
        if let TopicLookup::Known(topic) = node.cluster.topic_by_id(topic_id) {
            settle_remote(node, &topic, &owner, handles, SettleKind::Nack).await;
        }
    }
}

async fn forward_consume(node: &Node, owner: &str, req: &ConsumeRequest) -> ApiResult<RpcReply> {
    let body = serde_json::to_vec(req).expect("invariant: a consume request serialises");
    node.cluster
        .call(
            owner,
            Opcode::Consume,
            Bytes::from(body),
            Duration::from_millis(req.wait_ms) + crate::rpc::DEFAULT_TIMEOUT,
        )
        .await
}

/// The live owners of the topic's partitions other than this node, rotated per call so
/// consumers spread over them.
fn remote_owners(node: &Node, topic: &Topic) -> Vec<String> {
    if !node.cluster.clustered {
        return Vec::new();
    }
    let view = node.meta.view();
    let mut owners: Vec<String> = topic
        .assignments
        .iter()
        .filter_map(|a| a.owner.as_deref())
        .filter(|o| *o != node.node_id && Cluster::is_alive(&view, o))
        .map(str::to_string)
        .collect();
    owners.sort();
    owners.dedup();
    if owners.len() > 1 {
        let k = (crate::clock::now_micros() as usize) % owners.len();
        owners.rotate_left(k);
    }
    owners
}

/// The owner of partition `p` when it is another node (`503` if it is unassigned).
fn remote_owner_of(node: &Node, topic: &Topic, p: u32) -> ApiResult<Option<String>> {
    match Cluster::owner(topic, p) {
        Some(o) if o == node.node_id => Ok(None),
        Some(o) => Ok(Some(o.to_string())),
        None => Err(ApiError::unavailable(
            format!("partition {p} of {} has no owner yet", topic.name),
            1,
        )),
    }
}

fn reply_response(reply: RpcReply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
    if status == StatusCode::NO_CONTENT {
        return StatusCode::NO_CONTENT.into_response();
    }
    if !reply.is_success() {
        return ApiError::from_reply(&reply).into_response();
    }
    json_response(status, reply.body.to_vec())
}

pub async fn consume(
    State(node): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let topic = consume_target(&node, &caller, &name).await?;
    let q = Query::parse(q.as_deref());
    let partition = q.partition(topic.config.partitions)?;
    let offset = q.text("offset")?;
    let max = parse_max(q.text("max")?)?;
    let wait = parse_wait(q.text("wait")?, node.config.http.max_consume_wait)?;
    if let Some(o) = offset {
        let offset = parse_offset(o)?;
        let Some(partition) = partition else {
            return Err(ApiError::bad_request("offset needs partition"));
        };
        if max.is_some() {
            return Err(ApiError::bad_request("max cannot be combined with offset"));
        }
        if let Some(owner) = remote_owner_of(&node, &topic, partition)? {
            let req = ConsumeRequest {
                topic_id: topic.id,
                topic: topic.name.clone(),
                partition: Some(partition),
                offset: Some(offset),
                max: None,
                wait_ms: 0,
            };
            return Ok(reply_response(forward_consume(&node, &owner, &req).await?));
        }
        return Ok(match replay(&node, &topic, partition, offset)? {
            Some(body) => json_response(StatusCode::OK, body),
            None => StatusCode::NO_CONTENT.into_response(),
        });
    }
    let started = Instant::now();
    let deadline = started + wait;
    let want = max.unwrap_or(1) as usize;
    let found = match partition {
        // A pinned consume goes to the owner with its full wait.
        Some(p) => match remote_owner_of(&node, &topic, p)? {
            Some(owner) => {
                let req = ConsumeRequest {
                    topic_id: topic.id,
                    topic: topic.name.clone(),
                    partition: Some(p),
                    offset: None,
                    max,
                    wait_ms: wait.as_millis() as u64,
                };
                let reply = forward_consume(&node, &owner, &req).await?;
                if reply.status == 204 {
                    Found::Nothing
                } else {
                    Found::Remote(reply)
                }
            }
            None => {
                let rt = node.runtime(&topic)?;
                lease_spread(&node, &topic, &rt, Some(p), want, max, deadline, &[]).await?
            }
        },
        None => {
            let rt = node.runtime(&topic)?;
            let remotes = remote_owners(&node, &topic);
            let _consuming = node.cluster.prefetch.enter(topic.id);
            lease_spread(&node, &topic, &rt, None, want, max, deadline, &remotes).await?
        }
    };
    let empty = matches!(found, Found::Nothing);
    let outcome = match (empty, wait.is_zero()) {
        (_, true) => "no_wait",
        (false, false) => "hit",
        (true, false) if node.is_shutting_down() => "cancelled",
        (true, false) => "timeout",
    };
    node.observe_consume_wait(&topic, outcome, started.elapsed());
    match found {
        Found::Nothing => {
            node.consume_empty(&topic);
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Found::Remote(reply) => Ok(reply_response(reply)),
        Found::Prefetched(bodies) => Ok(json_response(
            StatusCode::OK,
            crate::cluster::prefetch::render(&bodies, max.is_some()),
        )),
        Found::Local(body) => Ok(json_response(StatusCode::OK, body)),
    }
}

/// A consume, pinned consume or replay forwarded by another node: served from this node's
/// own partitions only (never forwarded again); the reply is the HTTP answer.
pub async fn serve_forwarded(node: &Arc<Node>, req: ConsumeRequest) -> RpcReply {
    let topic = match node.topic_by_id_current(req.topic_id).await {
        TopicLookup::Known(t) => t,
        TopicLookup::Deleted => {
            return ApiError::topic_not_found(&req.topic).to_reply();
        }
        TopicLookup::Unknown => {
            return RpcReply::fail(
                ErrorCode::Unavailable,
                "topic not known on its owner yet; retry",
            );
        }
    };
    if let Some(p) = req.partition {
        if p >= topic.config.partitions {
            return RpcReply::fail(
                ErrorCode::BadRequest,
                &format!("partition {p} out of range"),
            );
        }
        if !node.cluster.is_mine(&topic, p) {
            return RpcReply::fail(
                ErrorCode::Unavailable,
                &format!("partition {p} is not owned by this node"),
            );
        }
    }
    if let Some(offset) = req.offset {
        let p = req.partition.unwrap_or(0);
        return match replay(node, &topic, p, offset) {
            Ok(Some(body)) => RpcReply::new(200, crate::rpc::proto::JSON, body),
            Ok(None) => RpcReply::new(204, crate::rpc::proto::JSON, Bytes::new()),
            Err(e) => e.to_reply(),
        };
    }
    let rt = match node.runtime(&topic) {
        Ok(rt) => rt,
        Err(e) => return e.to_reply(),
    };
    let wait = Duration::from_millis(req.wait_ms).min(node.config.http.max_consume_wait);
    let want = req.max.unwrap_or(1).clamp(1, MAX_BATCH as u32) as usize;
    match lease_spread(
        node,
        &topic,
        &rt,
        req.partition,
        want,
        req.max,
        Instant::now() + wait,
        &[],
    )
    .await
    {
        Ok(Found::Local(body)) => RpcReply::new(200, crate::rpc::proto::JSON, body),
        Ok(_) => RpcReply::new(204, crate::rpc::proto::JSON, Bytes::new()),
        Err(e) => e.to_reply(),
    }
}

/// Reads one record of a local partition: `None` when `offset` is not written yet.
fn replay(node: &Node, topic: &Topic, partition: u32, offset: u64) -> ApiResult<Option<Vec<u8>>> {
    let rt = node.runtime(topic)?;
    let part = rt.partition(partition).ok_or_else(|| {
        ApiError::unavailable(format!("partition {partition} is not open on this node"), 1)
    })?;
    part.touch();
    match part.log.read(offset) {
        Ok(Some(rec)) => {
            let mut out = Vec::with_capacity(rec.payload.len() + 128);
            write_message(&mut out, &topic.name, &rec, partition, None);
            Ok(Some(out))
        }
        Ok(None) => Ok(None),
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

/// `max`: a batch of 1 to [`MAX_BATCH`] messages; absent, one message (unbatched body).
fn parse_max(v: Option<&str>) -> ApiResult<Option<u32>> {
    match v {
        None => Ok(None),
        Some(s) => match s.parse::<u64>() {
            Ok(m) if (1..=MAX_BATCH).contains(&m) => Ok(Some(m as u32)),
            _ => Err(ApiError::bad_request(format!(
                "max must be an integer from 1 to {MAX_BATCH}, got {s:?}"
            ))),
        },
    }
}

/// `wait`: a Go duration (absent, empty or negative: no wait), at most `cap`.
fn parse_wait(v: Option<&str>, cap: Duration) -> ApiResult<Duration> {
    let wait = match v {
        None | Some("") => Duration::ZERO,
        Some(s) => narad_api::duration::parse_go_duration_nonnegative(s)
            .map_err(|e| ApiError::bad_request(format!("invalid wait {s:?}: {e}")))?,
    };
    Ok(wait.min(cap))
}

/// `offset` of a replay.
fn parse_offset(o: &str) -> ApiResult<u64> {
    o.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!("offset must be a non-negative integer, got {o:?}"))
    })
}

fn parse_extend(v: Option<&str>) -> ApiResult<SettleKind> {
    match v {
        None | Some("") | Some("false") => Ok(SettleKind::Ack),
        Some("true") | Some("1") => Ok(SettleKind::Extend),
        Some("0") => Ok(SettleKind::Nack),
        Some(other) => Err(ApiError::bad_request(format!(
            "extend must be true, 1, 0 or false, got {other:?}"
        ))),
    }
}

/// Parses `partition:offset:nonce`.
fn parse_handle(h: &str) -> ApiResult<(u32, u64, u64)> {
    let bad = || ApiError::bad_request(format!("malformed receipt_handle {h:?}"));
    if h.is_empty() {
        return Err(ApiError::bad_request("receipt_handle is empty"));
    }
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

fn stale(node: &Node, why: &str) -> ApiError {
    node.ack_rejected("stale");
    ApiError::gone(format!(
        "lease expired, superseded or already settled ({why})"
    ))
}

/// Settles one handle of a partition this node owns.
fn settle_local(node: &Node, topic: &Topic, handle: &str, how: SettleKind) -> ApiResult<()> {
    let (p, offset, nonce) = parse_handle(handle)?;
    let rt = node.runtime(topic)?;
    let Some(part) = (p < topic.config.partitions)
        .then(|| rt.partition(p))
        .flatten()
    else {
        return Err(stale(node, "no such partition"));
    };
    let policy = QueuePolicy::of(topic);
    let res = match how {
        SettleKind::Ack => part.ack(offset, nonce, policy),
        SettleKind::Extend => part.extend(offset, nonce, policy),
        SettleKind::Nack => part.nack(offset, nonce),
    };
    match res {
        Ok(()) => {
            match how {
                SettleKind::Extend => node.count_extend(topic),
                SettleKind::Nack => {
                    node.count_nack(topic);
                    rt.wake_consumers(1);
                }
                SettleKind::Ack => {}
            }
            Ok(())
        }
        Err(SettleError::Stale) => Err(stale(node, "handle no longer valid")),
        Err(SettleError::AckedAheadFull) => {
            node.ack_rejected("acked_ahead_full");
            Err(ApiError::unavailable(
                format!("acked-ahead limit reached on partition {p}: an earlier message is still unsettled; retry"),
                1,
            ))
        }
    }
}

/// Where a handle is settled: `None` here, else the owner's id.
fn settle_owner(node: &Node, topic: &Topic, handle: &str) -> ApiResult<Option<String>> {
    let (p, _, _) = parse_handle(handle)?;
    if p >= topic.config.partitions {
        return Err(stale(node, "no such partition"));
    }
    remote_owner_of(node, topic, p)
}

/// Settles handles on their owner over node RPC; one result per handle, in order.
async fn settle_remote(
    node: &Node,
    topic: &Topic,
    owner: &str,
    handles: Vec<String>,
    how: SettleKind,
) -> Vec<AckResult> {
    let n = handles.len();
    let fail = |e: &ApiError| AckResult {
        status: e.status().as_u16(),
        error: Some(e.message.clone()),
    };
    let request = |handles: Vec<String>| {
        Bytes::from(
            serde_json::to_vec(&SettleRequest {
                topic_id: topic.id,
                topic: topic.name.clone(),
                how,
                handles,
            })
            .expect("invariant: a settle request serialises"),
        )
    };
    let timeout = crate::rpc::DEFAULT_TIMEOUT;
    let cluster = &node.cluster;
    match cluster
        .rpc_call(owner, Opcode::AckBatch, request(handles.clone()), timeout)
        .await
    {
        Ok(r) if r.is_success() => match serde_json::from_slice::<BatchAckResponse>(&r.body) {
            Ok(b) if b.results.len() == n => b.results,
            _ => vec![
                fail(&ApiError::internal(format!(
                    "bad settle reply from {owner}"
                )));
                n
            ],
        },
        Ok(r) => vec![fail(&ApiError::from_reply(&r)); n],
        // An owner of an older build: one settle per handle with the opcode of its kind.
        Err(crate::rpc::RpcError::PeerTooOld { .. }) => {
            let mut out = Vec::with_capacity(n);
            for h in handles {
                out.push(
                    match cluster
                        .call(owner, how.opcode(), request(vec![h]), timeout)
                        .await
                    {
                        Ok(r) if r.is_success() => AckResult {
                            status: 204,
                            error: None,
                        },
                        Ok(r) => fail(&ApiError::from_reply(&r)),
                        Err(e) => fail(&e),
                    },
                );
            }
            out
        }
        Err(e) => vec![fail(&crate::cluster::rpc_error(owner, &e)); n],
    }
}

/// Single settles on their way to an owner: keyed by (owner, topic id, kind).
pub type SettleCoalescer =
    crate::cluster::coalesce::Coalescer<(String, u64, SettleKind), String, AckResult>;

/// Settles one handle on its owner; concurrent settles of the same (owner, topic, kind)
/// travel together in one `AckBatch` call.
async fn settle_remote_one(
    node: &AppState,
    topic: &Arc<Topic>,
    owner: String,
    handle: String,
    how: SettleKind,
) -> AckResult {
    let key = (owner.clone(), topic.id, how);
    let key_owner = owner.clone();
    let (n, t) = (node.clone(), topic.clone());
    let call = move |handles: Vec<String>| {
        let (n, t, owner) = (n.clone(), t.clone(), owner.clone());
        async move { settle_remote(&n, &t, &owner, handles, how).await }
    };
    node.settles
        .submit(key, handle, call)
        .await
        .unwrap_or_else(|| {
            // The call ran (and may have settled it) but answered nothing for this handle.
            let e = ApiError::uncertain(format!(
                "the settle call to {} gave no answer for this handle",
                key_owner
            ));
            AckResult {
                status: e.status().as_u16(),
                error: Some(e.message),
            }
        })
}

/// Settle requests forwarded by another node (`Ack`, `ExtendAck`, `Nack`: one handle, `204`
/// or an error; `AckBatch`: a `BatchAckResponse`).
pub fn settle_forwarded(node: &Arc<Node>, req: SettleRequest, batch: bool) -> RpcReply {
    let topic = match node.cluster.topic_by_id(req.topic_id) {
        TopicLookup::Known(t) => t,
        TopicLookup::Deleted => return ApiError::topic_not_found(&req.topic).to_reply(),
        TopicLookup::Unknown => {
            return RpcReply::fail(ErrorCode::Unavailable, "topic not known here yet; retry")
        }
    };
    let one = |h: &str| -> ApiResult<()> {
        let (p, _, _) = parse_handle(h)?;
        if p < topic.config.partitions && !node.cluster.is_mine(&topic, p) {
            return Err(ApiError::unavailable(
                format!("partition {p} is not owned by this node"),
                1,
            ));
        }
        settle_local(node, &topic, h, req.how)
    };
    if batch {
        let results: Vec<AckResult> = req
            .handles
            .iter()
            .map(|h| match one(h) {
                Ok(()) => AckResult {
                    status: 204,
                    error: None,
                },
                Err(e) => AckResult {
                    status: e.status().as_u16(),
                    error: Some(e.message),
                },
            })
            .collect();
        return RpcReply::json(200, &BatchAckResponse { results });
    }
    match req.handles.first().map(|h| one(h)) {
        Some(Ok(())) => RpcReply::new(204, crate::rpc::proto::JSON, Bytes::new()),
        Some(Err(e)) => e.to_reply(),
        None => RpcReply::fail(ErrorCode::BadRequest, "receipt_handle required"),
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
    let topic = consume_target(&node, &caller, &name).await?;
    let q = Query::parse(q.as_deref());
    let how = parse_extend(q.text("extend")?)?;
    if let Some(handle) = q.text("receipt_handle")? {
        match settle_owner(&node, &topic, handle)? {
            None => settle_local(&node, &topic, handle, how)?,
            Some(owner) => {
                let r = settle_remote_one(&node, &topic, owner, handle.to_string(), how).await;
                if r.status != 204 {
                    return Err(ApiError::new(
                        ErrorCode::for_status(r.status),
                        r.error.unwrap_or_default(),
                    ));
                }
            }
        }
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
    let mut results: Vec<Option<AckResult>> = vec![None; req.receipt_handles.len()];
    // Remote handles grouped by owner: (owner, [(index, handle)]).
    let mut remote: Vec<(String, Vec<(usize, String)>)> = Vec::new();
    for (i, h) in req.receipt_handles.iter().enumerate() {
        let local = match settle_owner(&node, &topic, h) {
            Ok(None) => settle_local(&node, &topic, h, how),
            Ok(Some(owner)) => {
                match remote.iter_mut().find(|(o, _)| *o == owner) {
                    Some((_, v)) => v.push((i, h.clone())),
                    None => remote.push((owner, vec![(i, h.clone())])),
                }
                continue;
            }
            Err(e) => Err(e),
        };
        results[i] = Some(match local {
            Ok(()) => AckResult {
                status: 204,
                error: None,
            },
            Err(e) => AckResult {
                status: e.status().as_u16(),
                error: Some(e.message),
            },
        });
    }
    for (owner, items) in remote {
        let (idx, handles): (Vec<usize>, Vec<String>) = items.into_iter().unzip();
        let answers = settle_remote(&node, &topic, &owner, handles, how).await;
        for (i, r) in idx.into_iter().zip(answers) {
            results[i] = Some(r);
        }
    }
    let results = results
        .into_iter()
        .map(|r| r.expect("invariant: every handle got a result"))
        .collect();
    Ok(json(StatusCode::OK, &BatchAckResponse { results }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: u64, payload: &[u8]) -> StoredRecord {
        StoredRecord {
            offset,
            timestamp_ms: 1_000,
            key: None,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn an_answer_holds_what_fits_its_budget_and_at_least_one() {
        let rec = record(0, &[b'x'; 100]);
        let mut one = Answer::with_budget(true, usize::MAX);
        assert!(one.push("t", &rec, 0, 1));
        let per = one.finish().len();
        // A budget for two and a half messages takes two; the third is refused unchanged.
        let mut a = Answer::with_budget(true, per * 5 / 2);
        assert!(a.push("t", &record(0, &[b'x'; 100]), 0, 1));
        assert!(a.push("t", &record(1, &[b'x'; 100]), 0, 2));
        let before = a.out.clone();
        assert!(!a.push("t", &record(2, &[b'x'; 100]), 0, 3));
        assert_eq!(a.out, before);
        let body = a.finish();
        assert!(body.len() <= per * 5 / 2);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let msgs = v["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[1]["receipt_handle"], "0:1:2");
        // The first message goes in whatever the budget.
        let mut tiny = Answer::with_budget(true, 1);
        assert!(tiny.push("t", &rec, 0, 1));
        assert_eq!(tiny.count, 1);
        let v: serde_json::Value = serde_json::from_slice(&tiny.finish()).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_single_answer_is_one_object() {
        let mut a = Answer::new(false);
        assert!(a.push("t", &record(5, b"{\"a\":1}"), 2, 9));
        let v: serde_json::Value = serde_json::from_slice(&a.finish()).unwrap();
        assert_eq!(v["offset"], 5);
        assert_eq!(v["partition"], 2);
        assert_eq!(v["payload"]["a"], 1);
        assert_eq!(v["receipt_handle"], "2:5:9");
    }

    #[test]
    fn the_largest_batch_of_the_largest_messages_fits_one_rpc_frame() {
        // 100 messages of 1 MiB of control characters (each escaped to six bytes, or sent as
        // base64): the answer stops below the frame limit, the reply's fields included.
        let worst = vec![1u8; super::super::MAX_BODY];
        let mut a = Answer::new(true);
        let mut n = 0;
        while n < MAX_BATCH && a.push("t", &record(n, &worst), 0, n) {
            n += 1;
        }
        assert!(n >= 1 && n < MAX_BATCH, "{n}");
        let body = a.finish();
        assert!(body.len() <= MAX_ANSWER_BYTES);
        let reply = RpcReply::new(200, crate::rpc::proto::JSON, body);
        assert!(reply.encode().unwrap().len() <= crate::rpc::proto::MAX_PAYLOAD);
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use narad_api::duration::{format_go_duration, parse_go_duration_signed};
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[+-]?[0-9]{0,22}",
            "[0-9:+-]{0,30}",
            "(true|false|0|1|TRUE|True| true|)",
        ]
    }

    proptest! {
        /// Receipt handles are `partition:offset:nonce`; every handle a node hands out parses
        /// back to its parts.
        #[test]
        fn prop_receipt_handle_roundtrip(p in any::<u32>(), o in any::<u64>(), n in any::<u64>()) {
            prop_assert_eq!(parse_handle(&format!("{p}:{o}:{n}")).unwrap(), (p, o, n));
        }

        #[test]
        fn prop_receipt_handle_arbitrary(h in prop_oneof![
            text(),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(p, o, n)| format!("{p}:{o}:{n}")),
            "([0-9]{1,21}:){0,4}[0-9]{0,21}",
        ]) {
            match parse_handle(&h) {
                Ok((p, o, n)) => {
                    let parts: Vec<&str> = h.split(':').collect();
                    prop_assert_eq!(parts.len(), 3);
                    prop_assert_eq!(parts[0].parse::<u32>().ok(), Some(p));
                    prop_assert_eq!(parts[1].parse::<u64>().ok(), Some(o));
                    prop_assert_eq!(parts[2].parse::<u64>().ok(), Some(n));
                }
                Err(e) => prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST),
            }
        }

        #[test]
        fn prop_extend_accepts_only_its_five_forms(v in proptest::option::of(text())) {
            let want = match v.as_deref() {
                None | Some("") | Some("false") => Some(SettleKind::Ack),
                Some("true") | Some("1") => Some(SettleKind::Extend),
                Some("0") => Some(SettleKind::Nack),
                Some(_) => None,
            };
            prop_assert_eq!(parse_extend(v.as_deref()).ok(), want);
        }

        #[test]
        fn prop_max_is_one_to_max_batch(v in proptest::option::of(prop_oneof![
            text(),
            (0..=MAX_BATCH + 2).prop_map(|n| n.to_string()),
        ])) {
            match (parse_max(v.as_deref()), v.as_deref()) {
                (Ok(None), None) => {}
                (Ok(Some(m)), Some(s)) => {
                    prop_assert_eq!(s.parse::<u64>().ok(), Some(m as u64));
                    prop_assert!((1..=MAX_BATCH).contains(&(m as u64)));
                }
                (Err(e), Some(s)) => {
                    prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST);
                    prop_assert!(s.parse::<u64>().map_or(true, |m| !(1..=MAX_BATCH).contains(&m)));
                }
                (r, v) => prop_assert!(false, "{:?} for {:?}", r, v),
            }
        }

        #[test]
        fn prop_offset_is_any_u64(o in prop_oneof![text(), any::<u64>().prop_map(|n| n.to_string())]) {
            prop_assert_eq!(parse_offset(&o).ok(), o.parse::<u64>().ok());
        }

        /// `wait` is the Go duration, negative as none, capped; anything unparsable is 400.
        #[test]
        fn prop_wait_is_a_capped_go_duration(
            v in prop_oneof![
                text(),
                "[-+]?[0-9]{0,20}(\\.[0-9]{0,3})?(ns|us|ms|s|m|h|d|)",
                any::<u64>().prop_map(|n| format_go_duration(Duration::from_nanos(n >> 1))),
            ],
            cap_ms in 0..120_000u64,
        ) {
            let cap = Duration::from_millis(cap_ms);
            match (parse_wait(Some(&v), cap), parse_go_duration_signed(&v)) {
                (Ok(w), _) if v.is_empty() => prop_assert_eq!(w, Duration::ZERO),
                (Ok(w), Ok(n)) => prop_assert_eq!(w, Duration::from_nanos(n.max(0) as u64).min(cap)),
                (Err(e), Err(_)) => prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST),
                (r, p) => prop_assert!(false, "{:?} {:?} for {:?}", r, p, v),
            }
            prop_assert_eq!(parse_wait(None, cap).unwrap(), Duration::ZERO);
        }
    }
}
