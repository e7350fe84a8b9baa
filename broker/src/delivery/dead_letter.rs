//! (ext) Dead-letter topics and redrive (SPEC (ext) §3.9).
//!
//! A topic with `dead_letter: {topic, max_deliveries: N}` never delivers a message an
//! (N+1)th time: the owner of its partition leases it as usual, but instead of handing it to
//! the consumer it stores a copy in the dead-letter topic the way a produce received on this
//! node is stored (fsynced in the WAL, or committed into an owned partition), and only then
//! settles it in the source. A crash in between, a failed store or a settle that finds the
//! lease lapsed leaves the message leased until its lease lapses; its next lease dead-letters
//! it again: at least once into the dead-letter topic, never lost.
//!
//! The copy keeps the payload, the key and the producer's attributes, and carries the
//! broker's attributes [`SOURCE_TOPIC`], [`SOURCE_PARTITION`], [`SOURCE_OFFSET`] and
//! [`DELIVERY_COUNT`]. A redrive (`POST /v1/topics/{dlq}/redrive`) consumes from the
//! dead-letter topic, stores each message in its source topic (or the one asked for) without
//! the broker's attributes, and acknowledges it there only once stored.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use narad_api::{MessageBatch, Redriven};
use narad_meta::Topic;
use narad_storage::StoredRecord;

use super::{ConsumeAsk, Delivery, SettleKind, MAX_BATCH};
use crate::error::{ApiError, ApiResult};
use crate::partition::{QueuePolicy, TopicRuntime};
use crate::rpc::BoxFuture;
use crate::wal::WalRecord;

/// The source topic of a dead-lettered copy.
pub const SOURCE_TOPIC: &str = "narad-dead-letter-source-topic";
/// Its partition in the source topic.
pub const SOURCE_PARTITION: &str = "narad-dead-letter-source-partition";
/// Its offset in that partition.
pub const SOURCE_OFFSET: &str = "narad-dead-letter-source-offset";
/// The delivery that dead-lettered it (the topic's `max_deliveries` + 1, or more after a
/// dead-letter commit was retried).
pub const DELIVERY_COUNT: &str = "narad-dead-letter-delivery-count";

/// Most messages one redrive moves when `max` is not given, and the most it may ask for.
pub const DEFAULT_REDRIVE: u64 = 1000;
pub const MAX_REDRIVE: u64 = 100_000;

/// Where dead-lettered and redriven messages are stored: as a produce received on this node
/// is (`Ingest`).
pub trait Store: Send + Sync {
    /// Stores `records` of `topic`; `Ok` once they are durable on this node.
    fn store<'a>(
        &'a self,
        topic: &'a Topic,
        records: Vec<WalRecord>,
    ) -> BoxFuture<'a, ApiResult<()>>;
    /// The partition of `topic` a record with `key` goes to (as a produce's).
    fn partition_for(&self, topic: &Topic, key: Option<&[u8]>) -> u32;
}

/// A message leased for a delivery past its topic's `max_deliveries`: it goes to the
/// dead-letter topic instead of to the consumer.
pub(crate) struct Doomed {
    pub partition: u32,
    pub rec: StoredRecord,
    pub nonce: u64,
    pub delivery_count: u32,
}

/// Most messages a consume pass sets aside for the dead-letter topic before storing them.
pub(crate) const DOOMED_PER_PASS: usize = MAX_BATCH as usize;

/// The dead-letter copy of `d` (of topic `source`) for partition `partition` of `target`.
pub(crate) fn copy(source: &Topic, d: &Doomed, target: &Topic, partition: u32) -> WalRecord {
    let (p, o, n) = (
        d.partition.to_string(),
        d.rec.offset.to_string(),
        d.delivery_count.to_string(),
    );
    WalRecord {
        topic_id: target.id,
        partition,
        pinned: false,
        key: d.rec.key.clone(),
        payload: d.rec.payload.clone(),
        attrs: crate::attrs::with_reserved(
            d.rec.attrs.as_deref(),
            &[
                (SOURCE_TOPIC, &source.name),
                (SOURCE_PARTITION, &p),
                (SOURCE_OFFSET, &o),
                (DELIVERY_COUNT, &n),
            ],
        ),
    }
}

impl Delivery {
    /// The dead-letter topic of `topic` and its delivery limit, when set and the target
    /// exists (a target that is gone, which only a race with its deletion allows, turns the
    /// setting off until it exists again).
    pub(crate) fn dead_letter_of(&self, topic: &Topic) -> Option<(Arc<Topic>, u32)> {
        let d = topic.config.dead_letter.as_ref()?;
        let target = self.meta.view().topics.get(&d.topic).cloned()?;
        Some((target, d.max_deliveries))
    }

    /// Stores `doomed` (leased messages of `topic`'s partitions here) in `target`, then
    /// settles them. When the store fails they stay leased; their leases lapse and their next
    /// lease tries again.
    pub(crate) async fn dead_letter(
        &self,
        topic: &Topic,
        rt: &TopicRuntime,
        target: &Topic,
        doomed: Vec<Doomed>,
    ) {
        let n = doomed.len() as u64;
        let records = doomed
            .iter()
            .map(|d| {
                let p = self.store.partition_for(target, d.rec.key.as_deref());
                copy(topic, d, target, p)
            })
            .collect();
        if let Err(e) = self.store.store(target, records).await {
            tracing::warn!(topic = %topic.name, dead_letter_topic = %target.name, messages = n, error = %e.message,
                "dead-letter commit failed; the messages are tried again when their leases lapse");
            self.count_n(topic, n, |m| &m.dead_letter_failures);
            return;
        }
        // Settled even past a full acked-ahead window (by at most the in-flight cap): a
        // dead-lettered message must not come back because a consumer holds an earlier one.
        let mut policy = QueuePolicy::of(topic);
        policy.caps.max_acked_ahead = policy
            .caps
            .max_acked_ahead
            .saturating_add(policy.caps.max_in_flight);
        for d in &doomed {
            // Not settled (the lease lapsed): dead-lettered again on its next lease.
            let settled = rt
                .partition(d.partition)
                .is_some_and(|part| part.ack(d.rec.offset, d.nonce, policy).is_ok());
            tracing::debug!(topic = %topic.name, partition = d.partition, offset = d.rec.offset,
                delivery_count = d.delivery_count, dead_letter_topic = %target.name, settled, "dead-lettered");
        }
        self.count_n(topic, n, |m| &m.dead_lettered);
    }

    /// Moves up to `max` messages of `from` (a dead-letter topic) to `to`, or each to the
    /// topic its [`SOURCE_TOPIC`] attribute names: consumed here as any consumer would,
    /// stored as a produce received here, then acknowledged. `target` resolves a topic name
    /// for the caller (its produce grant and existence). A message with no target, or whose
    /// target is refused, is left where it was (released at the end) and counted in
    /// `skipped`.
    pub async fn redrive(
        &self,
        from: &Arc<Topic>,
        to: Option<&Arc<Topic>>,
        max: u64,
        target: impl Fn(&str) -> ApiResult<Arc<Topic>>,
    ) -> ApiResult<Redriven> {
        let mut done = Redriven::default();
        let mut held: Vec<String> = Vec::new();
        let mut targets: BTreeMap<String, ApiResult<Arc<Topic>>> = BTreeMap::new();
        while done.moved + done.skipped < max {
            let want = (max - done.moved - done.skipped).min(MAX_BATCH) as u32;
            let ask = ConsumeAsk {
                partition: None,
                max: Some(want),
                wait: Duration::ZERO,
            };
            let Some(body) = self.consume(from, ask).await? else {
                break;
            };
            let batch: MessageBatch = serde_json::from_slice(&body)
                .map_err(|e| ApiError::internal(format!("reading a consume answer: {e}")))?;
            let mut moves: BTreeMap<String, Move> = BTreeMap::new();
            for m in batch.messages {
                let handle = m.receipt_handle.clone().unwrap_or_default();
                let name = match to {
                    Some(t) => Some(t.name.clone()),
                    None => m
                        .attributes
                        .as_ref()
                        .and_then(|a| a.get(SOURCE_TOPIC).cloned()),
                };
                let resolved = match name {
                    None => Err(ApiError::bad_request(format!(
                        "message {}:{} has no {SOURCE_TOPIC} attribute: give to=",
                        m.partition, m.offset
                    ))),
                    Some(name) => targets
                        .entry(name.clone())
                        .or_insert_with(|| target(&name))
                        .clone(),
                };
                let record = resolved.and_then(|t| {
                    let rec = redriven(&m, &t, |key| self.store.partition_for(&t, key))?;
                    Ok((t, rec))
                });
                match record {
                    Ok((t, rec)) => {
                        let e = moves.entry(t.name.clone()).or_insert_with(|| Move {
                            topic: t.clone(),
                            records: Vec::new(),
                            handles: Vec::new(),
                        });
                        e.records.push(rec);
                        e.handles.push(handle);
                    }
                    Err(e) => {
                        done.skipped += 1;
                        done.last_error = Some(e.message);
                        held.push(handle);
                    }
                }
            }
            for (
                name,
                Move {
                    topic: t,
                    records,
                    handles,
                },
            ) in moves
            {
                let n = records.len() as u64;
                match self.store.store(&t, records).await {
                    Ok(()) => {
                        // Stored: a settle that fails now (the lease lapsed) means a second
                        // copy later, never a lost one.
                        self.settle_batch(from, &handles, SettleKind::Ack).await;
                        done.moved += n;
                        *done.to.entry(name).or_default() += n;
                    }
                    Err(e) => {
                        done.skipped += n;
                        done.last_error = Some(format!("{name}: {}", e.message));
                        held.extend(handles);
                    }
                }
            }
        }
        if !held.is_empty() {
            for chunk in held.chunks(MAX_BATCH as usize) {
                self.settle_batch(from, chunk, SettleKind::Release).await;
            }
        }
        Ok(done)
    }
}

/// A redrive's records for one target topic, and the handles they settle.
struct Move {
    topic: Arc<Topic>,
    records: Vec<WalRecord>,
    handles: Vec<String>,
}

/// The record a redrive stores in `target` for consumed message `m`: its payload, key and
/// the producer's attributes (in name order), without the broker's.
fn redriven(
    m: &narad_api::Message,
    target: &Topic,
    partition_for: impl FnOnce(Option<&[u8]>) -> u32,
) -> ApiResult<WalRecord> {
    let bad = |what: &str, e: narad_api::render::DecodeError| {
        ApiError::internal(format!("message {}:{}: {what}: {e}", m.partition, m.offset))
    };
    let payload = narad_api::render::decode_payload(&m.payload, m.payload_encoding.as_deref())
        .map_err(|e| bad("payload", e))?;
    let key = m
        .key
        .as_deref()
        .map(|k| narad_api::render::decode_key(k, m.key_encoding.as_deref()))
        .transpose()
        .map_err(|e| bad("key", e))?;
    let attrs = match &m.attributes {
        None => None,
        Some(a) => crate::attrs::from_map(a.iter().filter(|(n, _)| !crate::attrs::is_reserved(n)))
            .map_err(ApiError::internal)?,
    };
    let partition = partition_for(key.as_deref());
    Ok(WalRecord {
        topic_id: target.id,
        partition,
        pinned: false,
        key: key.map(Into::into),
        payload: payload.into(),
        attrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn topic(name: &str, id: u64) -> Topic {
        crate::test_support::topic(id, name, &["me", "me", "me"])
    }

    #[test]
    fn a_copy_keeps_payload_key_and_attributes_and_names_its_source() {
        let mut b = crate::attrs::Builder::default();
        b.push("traceparent", "00-1-2-01").unwrap();
        let d = Doomed {
            partition: 2,
            rec: StoredRecord {
                offset: 41,
                timestamp_ms: 5,
                key: Some(Bytes::from_static(b"k")),
                payload: Bytes::from_static(b"\xffpayload"),
                attrs: b.finish(),
            },
            nonce: 9,
            delivery_count: 4,
        };
        let (source, target) = (topic("orders", 1), topic("orders-dlq", 2));
        let w = copy(&source, &d, &target, 1);
        assert_eq!((w.topic_id, w.partition, w.pinned), (2, 1, false));
        assert_eq!(w.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(&w.payload[..], b"\xffpayload");
        let a = w.attrs.unwrap();
        crate::attrs::check(&a).unwrap();
        let pairs: Vec<_> = crate::attrs::Iter(&a).collect();
        assert_eq!(
            pairs,
            [
                ("traceparent", "00-1-2-01"),
                (SOURCE_TOPIC, "orders"),
                (SOURCE_PARTITION, "2"),
                (SOURCE_OFFSET, "41"),
                (DELIVERY_COUNT, "4"),
            ]
        );
        // Dead-lettered again (from the dead-letter topic onwards): the source is replaced.
        let again = Doomed {
            partition: 1,
            rec: StoredRecord {
                attrs: Some(a),
                ..d.rec.clone()
            },
            nonce: 1,
            delivery_count: 2,
        };
        let w = copy(&target, &again, &topic("parking", 3), 0);
        let a = w.attrs.unwrap();
        assert_eq!(crate::attrs::Iter(&a).count(), 5);
        assert_eq!(crate::attrs::get(&a, SOURCE_TOPIC), Some("orders-dlq"));
    }

    #[test]
    fn a_redriven_record_is_the_message_without_the_brokers_attributes() {
        let m: narad_api::Message = serde_json::from_str(
            r#"{"topic":"dlq","partition":0,"offset":3,"key":"/w==","key_encoding":"base64",
                "payload":"aGk=","payload_encoding":"base64","timestamp":1,
                "attributes":{"narad-dead-letter-source-topic":"orders","b":"2","a":"1"},
                "receipt_handle":"0:3:1","delivery_count":1}"#,
        )
        .unwrap();
        let t = topic("orders", 7);
        let mut asked = None;
        let w = redriven(&m, &t, |k| {
            asked = k.map(<[u8]>::to_vec);
            2
        })
        .unwrap();
        assert_eq!(asked.as_deref(), Some(&[0xffu8][..]));
        assert_eq!((w.topic_id, w.partition), (7, 2));
        assert_eq!(&w.payload[..], b"hi");
        let a = w.attrs.unwrap();
        let pairs: Vec<_> = crate::attrs::Iter(&a).collect();
        assert_eq!(pairs, [("a", "1"), ("b", "2")]);
        let only_ours: narad_api::Message = serde_json::from_str(
            r#"{"topic":"dlq","partition":0,"offset":3,"payload":{"x":1},"timestamp":1,
                "attributes":{"narad-dead-letter-source-topic":"orders"}}"#,
        )
        .unwrap();
        let w = redriven(&only_ours, &t, |_| 0).unwrap();
        assert_eq!((w.attrs, &w.payload[..]), (None, &br#"{"x":1}"#[..]));
    }
}
