//! Produce routes (SPEC §3.4): single and batch. They parse, authorize and hand the records
//! to `ingest`, whose `Ok` means fsynced on this node (committed and verified in a partition
//! log this node owns, or in the ingress WAL): only then is the `202` sent.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use narad_api::{BatchMessage, BatchProduceRequest, BatchProduceResponse, ErrorBody};
use narad_meta::Topic;
use serde_json::value::RawValue;

use super::encoding::Bodies;
use super::{find_topic, json, read_coded, AppState, Name, Query, MAX_BODY};
use crate::app::App;
use crate::error::{ApiError, ApiResult};
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

/// The topic of a produce: the `produce` grant (`403`, whether or not it exists), then
/// existence (`404`).
async fn produce_target(
    app: &App,
    caller: &Caller,
    name: &str,
) -> ApiResult<std::sync::Arc<Topic>> {
    let topic = find_topic(app, name).await;
    authz::produce(caller, name, topic.as_deref())?;
    let topic = topic.ok_or_else(|| ApiError::topic_not_found(name))?;
    // SPEC §5.3: a delay child receives only delayed copies of its parent.
    if let Some(link) = app.meta.view().parent_link(name).filter(|l| l.delay_ms > 0) {
        app.ingest.reject(&topic, "delayed_child");
        return Err(ApiError::conflict(format!(
            "produce to a delayed child topic is not allowed: {name} receives the copies of \
             {} after {} ms",
            link.parent, link.delay_ms
        )));
    }
    Ok(topic)
}

/// Produce one message: the body (1 byte to 1 MiB, any bytes) is the payload.
///
/// `202` means the message is fsynced on this node; never retry a `202`. A timed-out or
/// `5xx` produce is ambiguous: a retry may store it twice, unless it carries an
/// `Idempotency-Key`.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/produce",
    tag = "messages",
    operation_id = "produce",
    params(
        super::openapi::TopicPath,
        ("key" = Option<String>, Query, description = "The message key (percent-decoded, any bytes; empty = none); keyed messages go to the key's partition."),
        ("partition" = Option<u32>, Query, description = "Pin the partition."),
        ("delay" = Option<String>, Query, description = "(ext) Enter the partition no earlier than this after acceptance: a Go duration up to `15m`."),
        ("Idempotency-Key" = Option<String>, Header, description = "(ext) A retry with the same key within the topic's `dedup_window_ms` is answered `202` but not stored again (1-128 visible ASCII bytes)."),
        ("Narad-Attr-*" = Option<String>, Header, description = "(ext) Each `Narad-Attr-<name>` header is an attribute stored beside the message."),
        ("Content-Encoding" = Option<String>, Header, description = "`gzip` or `zstd` for a compressed body."),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The message, 1 byte to 1 MiB, any bytes (`Content-Type` is ignored)."),
    responses(
        (status = 202, description = "Durably accepted (fsynced on this node)."),
        (status = 400, description = "Empty body, bad or repeated `partition`/`key`/`delay`, a bad attribute or idempotency key, a schema violation.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
        (status = 409, description = "The topic is a delay child (it takes no produce).", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn produce(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
    State(bodies): State<std::sync::Arc<Bodies>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let topic = produce_target(&app, &caller, &name).await?;
    let q = Query::parse(q.as_deref());
    let pinned = q.partition(topic.config.partitions)?;
    let key = q
        .one("key")?
        .filter(|k| !k.is_empty())
        .map(Bytes::copy_from_slice);
    let attrs = crate::attrs::from_headers(&headers).map_err(ApiError::bad_request)?;
    let idempotency_key = idempotency_header(&headers)?;
    let delay = match q.text("delay")? {
        Some(d) => narad_api::parse_produce_delay(d).map_err(ApiError::bad_request)?,
        None => Duration::ZERO,
    };
    let (payload, _) =
        read_coded(&headers, body, MAX_BODY, MAX_DRAIN, &bodies.decoders, None).await?;
    if payload.is_empty() {
        return Err(ApiError::bad_request("message body is empty"));
    }
    app.ingest.validate_schema(&topic, &payload)?;
    app.ingest.admit(&caller, &topic, 1, payload.len() as u64)?;
    let rt = app.runtime(&topic)?;
    let (record, delay) = BatchElement {
        payload,
        key,
        pinned,
        attrs,
        delay,
        idempotency_key,
    }
    .into_record(&app, &topic, &rt);
    if delay.is_zero() {
        app.ingest.store(&topic, vec![record]).await?;
    } else {
        app.ingest
            .store_delayed(&app.delayed, vec![(record, delay)])
            .await?;
    }
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

/// A produced message (a batch element, or a single produce's): payload, key (an empty key is
/// none), pinned partition, the producer's attribute block, (ext) delay (zero: none), (ext)
/// idempotency key.
#[derive(Debug, PartialEq, Eq)]
struct BatchElement {
    payload: Bytes,
    key: Option<Bytes>,
    pinned: Option<u32>,
    attrs: Option<Bytes>,
    delay: Duration,
    idempotency_key: Option<String>,
}

impl BatchElement {
    /// The record to store, in the partition its key (else its idempotency key, else the
    /// round robin) picks, its idempotency key among the broker's attributes, with its delay.
    fn into_record(
        self,
        app: &App,
        topic: &Topic,
        rt: &crate::partition::TopicRuntime,
    ) -> (WalRecord, Duration) {
        let partition = app.ingest.choose_partition(
            topic,
            rt,
            self.key.as_deref(),
            self.idempotency_key.as_deref(),
            self.pinned,
        );
        let record = WalRecord {
            topic_id: topic.id,
            partition,
            pinned: self.pinned.is_some(),
            key: self.key,
            payload: self.payload,
            attrs: match &self.idempotency_key {
                Some(k) => {
                    crate::attrs::with_reserved(self.attrs.as_deref(), &[(crate::dedup::ATTR, k)])
                }
                None => self.attrs,
            },
        };
        (record, self.delay)
    }
}

/// (ext) The `Idempotency-Key` header, if given (once, 1 to 128 visible ASCII bytes).
fn idempotency_header(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let mut values = headers.get_all(crate::dedup::HEADER).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::bad_request(
            "Idempotency-Key given more than once",
        ));
    }
    let k = crate::dedup::check_key(v.as_bytes()).map_err(ApiError::bad_request)?;
    Ok(Some(k.to_string()))
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
    let attrs = match &m.attributes {
        None => None,
        Some(a) => crate::attrs::from_map(a).map_err(fail)?,
    };
    let delay = match m.delay.as_deref() {
        None => Duration::ZERO,
        Some(d) => narad_api::parse_produce_delay(d).map_err(fail)?,
    };
    let idempotency_key = match m.idempotency_key.as_deref() {
        None => None,
        Some(k) => Some(
            crate::dedup::check_key(k.as_bytes())
                .map_err(fail)?
                .to_string(),
        ),
    };
    Ok(BatchElement {
        payload,
        key,
        pinned,
        attrs,
        delay,
        idempotency_key,
    })
}

/// (ext) Produce 1 to 100 messages with one fsync; all are validated before any is stored.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/produce/batch",
    tag = "messages",
    operation_id = "produceBatch",
    params(
        super::openapi::TopicPath,
        ("Content-Encoding" = Option<String>, Header, description = "`gzip` or `zstd` for a compressed body."),
    ),
    request_body = BatchProduceRequest,
    responses(
        (status = 202, description = "All durably accepted.", body = BatchProduceResponse),
        (status = 400, description = "The first invalid element, with a message starting `message <i>: `.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
        (status = 409, description = "The topic is a delay child.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn produce_batch(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    State(bodies): State<std::sync::Arc<Bodies>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let topic = produce_target(&app, &caller, &name).await?;
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
    let rt = app.runtime(&topic)?;
    let n = topic.config.partitions;
    let mut records = Vec::with_capacity(req.messages.len());
    let mut delayed = Vec::new();
    for (i, raw) in req.messages.iter().copied().enumerate() {
        let element = decode_batch_element(i, raw, n)?;
        if let Err(e) = app.ingest.validate_schema(&topic, &element.payload) {
            return Err(ApiError::bad_request(format!("message {i}: {}", e.message)));
        }
        let (record, delay) = element.into_record(&app, &topic, &rt);
        if delay.is_zero() {
            records.push(record);
        } else {
            delayed.push((record, delay));
        }
    }
    let accepted = records.len() + delayed.len();
    let bytes = records
        .iter()
        .chain(delayed.iter().map(|(r, _)| r))
        .map(|r| r.payload.len() as u64)
        .sum();
    app.ingest.admit(&caller, &topic, accepted as u64, bytes)?;
    // Both parts durable before the 202: the delayed ones in the delay store.
    tokio::try_join!(
        app.ingest.store(&topic, records),
        app.ingest.store_delayed(&app.delayed, delayed)
    )?;
    Ok(json(
        StatusCode::ACCEPTED,
        &BatchProduceResponse { accepted },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::wire::{ForwardProduce, ForwardRecord};

    /// The forwarded `Produce` of a draining node (SPEC §6.5) carries a whole batch in one
    /// frame: per record it adds 13 bytes, while each element's JSON spends at least
    /// `{"payload":}` and a separator on top of its stored bytes.
    /// With attributes too: a block takes 3 bytes of lengths per pair and 4 for its length,
    /// its JSON at least 6 per pair and `,"attributes":{}`.
    #[test]
    fn batch_within_limits_fits_one_rpc_frame() {
        let per = MAX_BATCH_BODY / MAX_BATCH;
        let attrs: Vec<String> = (0..16)
            .map(|i| format!("\"a{i:02}\":\"{}\"", "v".repeat(400)))
            .collect();
        let attrs = format!(",\"attributes\":{{{}}}", attrs.join(","));
        let payload = format!("\"{}\"", "x".repeat(per - 40 - attrs.len()));
        let one = format!("{{\"payload\":{payload},\"key\":\"k\"{attrs}}}");
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
                    attrs: e.attrs,
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
            attributes: None,
            delay: None,
            idempotency_key: None,
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
                        Just("attributes"),
                        Just("delay"),
                        Just("idempotency_key"),
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
                        Just("{\"a\":\"1\",\"A\":\"2\"}".to_string()),
                        Just("{\"trace.id\":\"x\"}".to_string()),
                        Just("{}".to_string()),
                        Just("\"90s\"".to_string()),
                        Just("\"16m\"".to_string()),
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
                    prop_assert!(e.attrs.as_deref().is_none_or(|a| crate::attrs::check(a).is_ok()));
                    prop_assert!(e.delay <= narad_api::MAX_PRODUCE_DELAY);
                    prop_assert!(e.idempotency_key.as_deref().is_none_or(|k| crate::dedup::check_key(k.as_bytes()).is_ok()));
                }
                Err(e) => prop_assert!(
                    e.status() == StatusCode::BAD_REQUEST || e.status() == StatusCode::PAYLOAD_TOO_LARGE
                ),
            }
        }
    }
}
