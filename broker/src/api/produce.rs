//! Produce routes (SPEC §3.4): single and batch. A `202` is sent only once the records are
//! fsynced on this node: committed and verified in a partition log this node owns, or in the
//! ingress WAL.

use axum::body::Body;
use axum::extract::{Extension, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use narad_api::{BatchMessage, BatchProduceResponse};
use narad_meta::Topic;
use serde_json::value::RawValue;

use super::encoding::Bodies;
use super::{find_topic, json, read_coded, AppState, Name, Query, MAX_BODY};
use crate::cluster::wire::{ForwardProduce, ForwardRecord};
use crate::cluster::{rpc_error, Cluster, TopicLookup};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::node::Node;
use crate::partition::TopicRuntime;
use crate::rpc::{Opcode, RpcReply, COMMIT_TIMEOUT};
use crate::security::{authz, Caller};
use crate::wal::WalRecord;

/// Most messages in one batch produce (SPEC §11).
pub const MAX_BATCH: usize = 1000;

/// Largest batch produce body, decoded (SPEC §11). Every element's stored bytes are no more
/// than its JSON text, so a batch within this limit always fits one forwarded `Produce` frame
/// (see `batch_within_limits_fits_one_rpc_frame`).
pub const MAX_BATCH_BODY: usize = 16 * 1024 * 1024;

/// Most bytes of an oversized single produce body read and discarded (then the connection
/// closes).
const MAX_DRAIN: u64 = 16 * 1024 * 1024;

/// Most bytes of an oversized batch body read and discarded.
const MAX_BATCH_DRAIN: u64 = 2 * MAX_BATCH_BODY as u64;

/// SPEC §2.3: pinned, else key hash, else round robin; an unpinned choice whose owner
/// membership marks dead walks forward to the first partition with a live owner (if none,
/// the original choice stands: the WAL holds the message until the owner returns).
fn choose_partition(
    node: &Node,
    topic: &Topic,
    rt: &TopicRuntime,
    key: Option<&[u8]>,
    pinned: Option<u32>,
) -> u32 {
    let n = topic.config.partitions;
    let p = match (pinned, key) {
        (Some(p), _) => return p,
        (None, Some(k)) => crate::partitioner::key_partition(k, n),
        (None, None) => rt.next_produce_partition(n),
    };
    if !node.cluster.clustered {
        return p;
    }
    let view = node.meta.view();
    let live = |q: u32| Cluster::owner(topic, q).is_some_and(|o| Cluster::is_alive(&view, o));
    (0..n).map(|i| (p + i) % n).find(|q| live(*q)).unwrap_or(p)
}

fn validate_schema(node: &Node, topic: &Topic, body: &[u8]) -> ApiResult<()> {
    if let Some(s) = topic.current_schema() {
        let validator = node
            .schemas
            .validator(topic.id, s.version, &s.schema)
            .map_err(ApiError::internal)?;
        if let Err(reason) = crate::schema::validate(&validator, body) {
            node.reject(topic, "schema");
            return Err(ApiError::bad_request(reason));
        }
    }
    Ok(())
}

/// Stores accepted records on this node (SPEC §1): fsynced in the WAL (one fsync shared by
/// every partition's records), from which the dispatcher commits them. With
/// `NARAD_WAL_SKIP_LOCAL`, a record for a partition this node owns (and has open) is
/// committed straight into that partition's log instead: fsynced, read back and verified,
/// hence visible, before the `202`; one whose direct commit did not happen (a partition
/// frozen for a move, a failing disk) goes through the WAL.
async fn stage(node: &Node, topic: &Topic, records: Vec<WalRecord>) -> ApiResult<()> {
    let records = if node.config.tuning.wal_skip_local {
        commit_owned(node, topic, records).await
    } else {
        records
    };
    if records.is_empty() {
        return Ok(());
    }
    node.wal
        .append(records)
        .await
        .map_err(|e| ApiError::unavailable(e.to_string(), 1))
}

/// Commits the records whose partition this node owns and has open (group commit per
/// partition); returns the others and those whose commit did not happen.
async fn commit_owned(node: &Node, topic: &Topic, records: Vec<WalRecord>) -> Vec<WalRecord> {
    let owned = |p: u32| {
        node.cluster
            .is_mine(topic, p)
            .then(|| node.registry.local(topic.id, p))
            .flatten()
    };
    let Some(first) = records.first().map(|r| r.partition) else {
        return records;
    };
    // One partition (every single produce): no grouping.
    if records.iter().all(|r| r.partition == first) {
        return match owned(first) {
            Some(part) => commit_direct(&part, records).await,
            None => records,
        };
    }
    let mut by_partition: std::collections::BTreeMap<u32, Vec<WalRecord>> = Default::default();
    for r in records {
        by_partition.entry(r.partition).or_default().push(r);
    }
    let mut rest = Vec::new();
    let mut commits = Vec::new();
    for (p, recs) in by_partition {
        match owned(p) {
            Some(part) => commits.push(async move { commit_direct(&part, recs).await }),
            None => rest.extend(recs),
        }
    }
    for failed in futures::future::join_all(commits).await {
        rest.extend(failed);
    }
    rest
}

/// Commits records of one local partition; returns them if the commit did not happen.
async fn commit_direct(
    part: &std::sync::Arc<crate::partition::Partition>,
    records: Vec<WalRecord>,
) -> Vec<WalRecord> {
    let n = records.len();
    let (topic_id, partition) = (part.topic_id, part.index);
    let pinned: Vec<bool> = records.iter().map(|r| r.pinned).collect();
    let batch = records
        .into_iter()
        .map(|r| narad_storage::NewRecord {
            key: r.key,
            payload: r.payload,
        })
        .collect();
    match crate::group_commit::commit_grouped(part, batch).await {
        Ok(()) => Vec::new(),
        Err(failed) => {
            tracing::warn!(topic_id, partition, records = n, refused = failed.refused, reason = %failed.reason,
                "direct commit into an owned partition did not happen; the records go through the wal");
            failed
                .records
                .into_iter()
                .zip(pinned)
                .map(|(r, pinned)| WalRecord {
                    topic_id,
                    partition,
                    pinned,
                    key: r.key,
                    payload: r.payload,
                })
                .collect()
        }
    }
}

/// Whether this node is draining (decommission, SPEC §6.5): it stores no new produce, so its
/// WAL empties.
fn draining(node: &Node) -> bool {
    node.meta
        .view()
        .members
        .get(&node.node_id)
        .is_some_and(|m| m.draining)
}

/// The refusal of a draining node that found no other node to store a produce: nothing was
/// stored, so the text is the one clients read as "safe to resend elsewhere"
/// (CLIENT-COMPAT §4.2).
fn decommissioned(node: &Node, why: &str) -> ApiError {
    ApiError::unavailable(
        format!(
            "node {} is being decommissioned and takes no new produce ({why}); retry on another node",
            node.node_id
        ),
        1,
    )
}

/// Stores accepted records: in this node's WAL, or, on a draining node, in the WAL of a live
/// node that is not draining (SPEC §6.5), whose `202` the producer then gets.
async fn store(node: &Node, topic: &Topic, records: Vec<WalRecord>) -> ApiResult<()> {
    if node.cluster.clustered && draining(node) {
        forward(node, records).await
    } else {
        stage(node, topic, records).await
    }
}

/// A draining node's produce: `Produce` to each live, non-draining member in turn (rotated
/// per call) until one stores it. A target that did not get it (unreachable, an older build,
/// itself draining or refusing with `503`) passes to the next; one that may have stored it
/// without answering ends the attempt with the uncertain `502` (a resend may duplicate).
async fn forward(node: &Node, records: Vec<WalRecord>) -> ApiResult<()> {
    let Some(topic_id) = records.first().map(|r| r.topic_id) else {
        return Ok(());
    };
    let body = ForwardProduce {
        topic_id,
        records: records
            .into_iter()
            .map(|r| ForwardRecord {
                partition: r.partition,
                pinned: r.pinned,
                key: r.key,
                payload: r.payload,
            })
            .collect(),
    }
    .encode();
    let mut targets: Vec<String> = {
        let view = node.meta.view();
        let mut t: Vec<String> = view
            .members
            .values()
            .filter(|m| m.id != node.node_id && !m.dead && !m.draining)
            .map(|m| m.id.clone())
            .collect();
        t.sort();
        t
    };
    if targets.len() > 1 {
        let k = (crate::clock::now_micros() as usize) % targets.len();
        targets.rotate_left(k);
    }
    let mut last = String::from("no live node that is not draining");
    for target in targets {
        match node
            .cluster
            .rpc_call(&target, Opcode::Produce, body.clone(), COMMIT_TIMEOUT)
            .await
        {
            Ok(r) if r.is_success() => return Ok(()),
            Ok(r) if r.status == 503 => {
                last = format!("{target} answered {}", ApiError::from_reply(&r).message);
            }
            Ok(r) => return Err(ApiError::from_reply(&r)),
            Err(e) if e.outcome_unknown() => return Err(rpc_error(&target, &e)),
            Err(e) => last = format!("{target}: {e}"),
        }
        tracing::debug!(to = %target, reason = %last, "forwarded produce not taken; trying the next node");
    }
    Err(decommissioned(node, &last))
}

/// `Produce` (1) from a draining node: stores the records in this node's WAL as a produce
/// received here would be (`202 {"accepted": n}`); `503` when this node drains too, or does
/// not know the topic yet.
pub async fn serve_forwarded(node: &Node, body: Bytes) -> RpcReply {
    let req = match ForwardProduce::decode(body) {
        Ok(r) => r,
        Err(e) => return RpcReply::fail(ErrorCode::BadRequest, &e),
    };
    let topic = match node.cluster.topic_by_id(req.topic_id) {
        TopicLookup::Known(t) => t,
        TopicLookup::Deleted => return RpcReply::fail(ErrorCode::TopicNotFound, "topic deleted"),
        TopicLookup::Unknown => {
            return RpcReply::fail(ErrorCode::Unavailable, "topic not known here yet")
        }
    };
    if draining(node) {
        return decommissioned(node, "asked to store a forwarded produce").to_reply();
    }
    let n = topic.config.partitions;
    if let Some(r) = req.records.iter().find(|r| r.partition >= n) {
        return RpcReply::fail(
            ErrorCode::BadRequest,
            &format!(
                "partition {} out of range: {} has {n}",
                r.partition, topic.name
            ),
        );
    }
    let accepted = req.records.len();
    let records = req
        .records
        .into_iter()
        .map(|r| WalRecord {
            topic_id: topic.id,
            partition: r.partition,
            pinned: r.pinned,
            key: r.key,
            payload: r.payload,
        })
        .collect();
    match stage(node, &topic, records).await {
        Ok(()) => RpcReply::json(202, &BatchProduceResponse { accepted }),
        Err(e) => e.to_reply(),
    }
}

/// The topic of a produce: the `produce` grant (`403`, whether or not it exists), then
/// existence (`404`).
async fn produce_target(
    node: &Node,
    caller: &Caller,
    name: &str,
) -> ApiResult<std::sync::Arc<Topic>> {
    let topic = find_topic(node, name).await;
    authz::produce(caller, name, topic.as_deref())?;
    let topic = topic.ok_or_else(|| ApiError::topic_not_found(name))?;
    // SPEC §5.3: a delay child receives only delayed copies of its parent.
    if let Some(link) = node
        .meta
        .view()
        .parent_link(name)
        .filter(|l| l.delay_ms > 0)
    {
        node.reject(&topic, "delayed_child");
        return Err(ApiError::conflict(format!(
            "produce to a delayed child topic is not allowed: {name} receives the copies of \
             {} after {} ms",
            link.parent, link.delay_ms
        )));
    }
    Ok(topic)
}

pub async fn produce(
    State(node): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
    Extension(bodies): Extension<std::sync::Arc<Bodies>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let topic = produce_target(&node, &caller, &name).await?;
    let q = Query::parse(q.as_deref());
    let pinned = q.partition(topic.config.partitions)?;
    let key = q
        .one("key")?
        .filter(|k| !k.is_empty())
        .map(Bytes::copy_from_slice);
    let (payload, _) =
        read_coded(&headers, body, MAX_BODY, MAX_DRAIN, &bodies.decoders, None).await?;
    if payload.is_empty() {
        return Err(ApiError::bad_request("message body is empty"));
    }
    validate_schema(&node, &topic, &payload)?;
    let rt = node.runtime(&topic)?;
    let partition = choose_partition(&node, &topic, &rt, key.as_deref(), pinned);
    store(
        &node,
        &topic,
        vec![WalRecord {
            topic_id: topic.id,
            partition,
            pinned: pinned.is_some(),
            key,
            payload,
        }],
    )
    .await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// A batch body whose elements are parsed one by one, so that an error names its element
/// (borrowed from the body: no copy of each element).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatch<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

fn decode_b64(what: &str, s: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| format!("{what} is not valid base64: {e}"))
}

/// A batch element as it is stored: payload, key (an empty key is none), pinned partition.
#[derive(Debug, PartialEq, Eq)]
struct BatchElement {
    payload: Bytes,
    key: Option<Bytes>,
    pinned: Option<u32>,
}

/// Decodes element `i` of a batch for a topic of `n` partitions: `400`, or `413` for a
/// payload over [`MAX_BODY`].
fn decode_batch_element(i: usize, raw: &RawValue, n: u32) -> ApiResult<BatchElement> {
    let fail = |msg: String| ApiError::bad_request(format!("message {i}: {msg}"));
    let m: BatchMessage = serde_json::from_str(raw.get()).map_err(|e| fail(format!("{e}")))?;
    let payload: Bytes = match m.payload_encoding.as_deref() {
        None | Some("") => Bytes::copy_from_slice(m.payload.get().as_bytes()),
        Some("base64") => {
            let s: String = serde_json::from_str(m.payload.get())
                .map_err(|_| fail("a base64 payload must be a JSON string".into()))?;
            Bytes::from(decode_b64("payload", &s).map_err(fail)?)
        }
        Some(other) => return Err(fail(format!("unknown payload_encoding {other:?}"))),
    };
    if payload.is_empty() {
        return Err(fail("payload is empty".into()));
    }
    if payload.len() > MAX_BODY {
        return Err(ApiError::too_large(format!(
            "message {i}: payload exceeds {MAX_BODY} bytes"
        )));
    }
    let key: Option<Bytes> = match (m.key.as_deref(), m.key_encoding.as_deref()) {
        (None, _) => None,
        (Some(k), None | Some("")) => Some(Bytes::copy_from_slice(k.as_bytes())),
        (Some(k), Some("base64")) => Some(Bytes::from(decode_b64("key", k).map_err(fail)?)),
        (Some(_), Some(other)) => return Err(fail(format!("unknown key_encoding {other:?}"))),
    }
    .filter(|k| !k.is_empty());
    let pinned = match m.partition {
        None => None,
        Some(p) if p >= 0 && (p as u64) < n as u64 => Some(p as u32),
        Some(p) => {
            return Err(fail(format!(
                "partition {p} out of range: the topic has {n} partitions"
            )))
        }
    };
    Ok(BatchElement {
        payload,
        key,
        pinned,
    })
}

pub async fn produce_batch(
    State(node): State<AppState>,
    caller: Caller,
    Name(name): Name,
    Extension(bodies): Extension<std::sync::Arc<Bodies>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let topic = produce_target(&node, &caller, &name).await?;
    // Held until the answer: the bytes of this batch count against the node's budget.
    let (body, _guard) = read_coded(
        &headers,
        body,
        MAX_BATCH_BODY,
        MAX_BATCH_DRAIN,
        &bodies.decoders,
        Some(bodies.budget.guard()),
    )
    .await?;
    if body.is_empty() {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    }
    let req: RawBatch<'_> = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    if req.messages.is_empty() || req.messages.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "a batch holds 1 to {MAX_BATCH} messages, got {}",
            req.messages.len()
        )));
    }
    let rt = node.runtime(&topic)?;
    let n = topic.config.partitions;
    let mut records = Vec::with_capacity(req.messages.len());
    for (i, raw) in req.messages.iter().copied().enumerate() {
        let BatchElement {
            payload,
            key,
            pinned,
        } = decode_batch_element(i, raw, n)?;
        if let Err(e) = validate_schema(&node, &topic, &payload) {
            return Err(ApiError::bad_request(format!("message {i}: {}", e.message)));
        }
        let partition = choose_partition(&node, &topic, &rt, key.as_deref(), pinned);
        records.push(WalRecord {
            topic_id: topic.id,
            partition,
            pinned: pinned.is_some(),
            key,
            payload,
        });
    }
    let accepted = records.len();
    store(&node, &topic, records).await?;
    Ok(json(
        StatusCode::ACCEPTED,
        &BatchProduceResponse { accepted },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forwarded `Produce` of a draining node (SPEC §6.5) carries a whole batch in one
    /// frame: per record it adds 13 bytes, while each element's JSON spends at least
    /// `{"payload":}` and a separator on top of its stored bytes.
    #[test]
    fn batch_within_limits_fits_one_rpc_frame() {
        let per = MAX_BATCH_BODY / MAX_BATCH;
        let payload = format!("\"{}\"", "x".repeat(per - 40));
        let one = format!("{{\"payload\":{payload},\"key\":\"k\"}}");
        let mut body = String::from("{\"messages\":[");
        for i in 0..MAX_BATCH {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&one);
        }
        body.push_str("]}");
        assert!(body.len() <= MAX_BATCH_BODY, "{}", body.len());
        let req: RawBatch<'_> = serde_json::from_str(&body).unwrap();
        let records = req
            .messages
            .iter()
            .enumerate()
            .map(|(i, raw)| {
                let e = decode_batch_element(i, raw, 1).unwrap();
                ForwardRecord {
                    partition: 0,
                    pinned: false,
                    key: e.key,
                    payload: e.payload,
                }
            })
            .collect();
        let encoded = ForwardProduce {
            topic_id: 1,
            records,
        }
        .encode();
        assert!(
            encoded.len() < crate::rpc::proto::MAX_PAYLOAD && encoded.len() < body.len(),
            "{} vs {}",
            encoded.len(),
            body.len()
        );
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use narad_api::render::{encode_batch_payload, render_key};
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            vec(any::<u8>(), 0..32),
            any::<String>().prop_map(String::into_bytes),
            "[ ]?(\\{\"a\":[0-9]{1,3}\\}|[0-9]{1,4}|\"[a-z]{0,4}\"|true|null)[ ]?"
                .prop_map(String::into_bytes),
        ]
    }

    /// A batch element as the SDKs write it (`encode_batch_payload`, keys rendered as text
    /// or base64).
    fn element(payload: &[u8], key: Option<&[u8]>, partition: Option<i64>) -> Box<RawValue> {
        let (p, payload_encoding) = encode_batch_payload(payload);
        let (key, key_encoding) = match key {
            Some(k) => {
                let (text, enc) = render_key(k);
                (Some(text.into_owned()), enc.map(str::to_string))
            }
            None => (None, None),
        };
        let m = BatchMessage {
            payload: p,
            payload_encoding: payload_encoding.map(str::to_string),
            key,
            key_encoding,
            partition,
        };
        serde_json::value::to_raw_value(&m).unwrap()
    }

    proptest! {
        /// What a client encodes is stored byte for byte: payload, key (empty = none),
        /// partition when in range.
        #[test]
        fn prop_batch_element_roundtrip(
            payload in bytes(),
            key in proptest::option::of(bytes()),
            partition in proptest::option::of(prop_oneof![0..8i64, any::<i64>()]),
            n in 1..8u32,
        ) {
            let raw = element(&payload, key.as_deref(), partition);
            match decode_batch_element(3, &raw, n) {
                Ok(e) => {
                    prop_assert_eq!(&e.payload[..], &payload[..]);
                    prop_assert_eq!(e.key.as_deref(), key.as_deref().filter(|k| !k.is_empty()));
                    prop_assert_eq!(e.pinned.map(i64::from), partition);
                }
                Err(e) => {
                    prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST);
                    prop_assert!(e.message.starts_with("message 3: "));
                    prop_assert!(
                        payload.is_empty() || partition.is_some_and(|p| p < 0 || p >= i64::from(n)),
                        "{}", e.message
                    );
                }
            }
        }

        /// Elements with arbitrary field values and types: 400 or 413, never a panic.
        #[test]
        fn prop_batch_element_arbitrary(
            fields in vec(
                (
                    prop_oneof![
                        Just("payload"),
                        Just("payload_encoding"),
                        Just("key"),
                        Just("key_encoding"),
                        Just("partition"),
                        Just("other"),
                    ],
                    prop_oneof![
                        Just("\"base64\"".to_string()),
                        Just("\"\"".to_string()),
                        Just("null".to_string()),
                        any::<i64>().prop_map(|n| n.to_string()),
                        "-?[0-9]{1,22}(\\.[0-9])?",
                        any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
                        "\"[A-Za-z0-9+/]{0,8}={0,2}\"",
                        Just("{\"a\":[1,{}]}".to_string()),
                    ],
                ),
                0..6,
            ),
            n in 1..8u32,
        ) {
            let body = format!(
                "{{{}}}",
                fields
                    .iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let Ok(raw) = RawValue::from_string(body) else { return Ok(()) };
            match decode_batch_element(0, &raw, n) {
                Ok(e) => {
                    prop_assert!(!e.payload.is_empty() && e.payload.len() <= MAX_BODY);
                    prop_assert!(e.key.as_ref().is_none_or(|k| !k.is_empty()));
                    prop_assert!(e.pinned.is_none_or(|p| p < n));
                }
                Err(e) => prop_assert!(
                    e.status() == StatusCode::BAD_REQUEST || e.status() == StatusCode::PAYLOAD_TOO_LARGE
                ),
            }
        }
    }
}
