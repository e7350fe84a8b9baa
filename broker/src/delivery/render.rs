//! Consume answers (SPEC §3.5): one message object, or `{"messages":[…]}` for a batch,
//! rendered while the messages are leased and never larger than the byte budget that keeps
//! an owner's answer within one node-RPC frame.

use narad_api::render::{render_key, render_payload, write_json_str};
use narad_storage::StoredRecord;

use super::ReceiptHandle;

/// Writes one message object (SPEC §3.5) into `out`: a leased one with its receipt handle
/// and delivery count, a replayed one without.
pub(crate) fn write_message(
    out: &mut Vec<u8>,
    topic: &str,
    rec: &StoredRecord,
    partition: u32,
    lease: Option<(ReceiptHandle, u32)>,
) {
    // Numbers go in through `itoa`: this runs for every message delivered, and `format!`
    // would cost an allocation and the formatting machinery for each field.
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b"{\"topic\":");
    write_json_str(out, topic);
    out.extend_from_slice(b",\"partition\":");
    out.extend_from_slice(n.format(partition).as_bytes());
    out.extend_from_slice(b",\"offset\":");
    out.extend_from_slice(n.format(rec.offset).as_bytes());
    if let Some(key) = &rec.key {
        let (k, enc) = render_key(key);
        out.extend_from_slice(b",\"key\":");
        write_json_str(out, &k);
        if let Some(enc) = enc {
            out.extend_from_slice(b",\"key_encoding\":");
            write_json_str(out, enc);
        }
    }
    let payload = render_payload(&rec.payload);
    out.extend_from_slice(b",\"payload\":");
    payload.write_json(out);
    if let Some(enc) = payload.encoding() {
        out.extend_from_slice(b",\"payload_encoding\":");
        write_json_str(out, enc);
    }
    out.extend_from_slice(b",\"timestamp\":");
    out.extend_from_slice(n.format(rec.timestamp_ms / 1000).as_bytes());
    if let Some(a) = &rec.attrs {
        crate::attrs::write_json(out, a);
    }
    if let Some((h, delivery_count)) = lease {
        out.extend_from_slice(b",\"receipt_handle\":\"");
        h.write_to(out);
        out.extend_from_slice(b"\",\"delivery_count\":");
        out.extend_from_slice(n.format(delivery_count).as_bytes());
    }
    out.push(b'}');
}

/// Most bytes of JSON in one consume answer (SPEC §11): a batch holds the messages that fit,
/// and always at least one (a message of at most [`crate::api::MAX_BODY`] renders to well under
/// this). It stays below the RPC frame limit with room for the reply's own fields, so an
/// owner's answer to a forwarded consume always fits one frame.
pub const MAX_ANSWER_BYTES: usize = crate::rpc::proto::MAX_PAYLOAD - 64 * 1024;

/// The bytes of kept messages one answer takes: its budget less `{"messages":[` and `]}`.
pub(crate) const PREFETCH_BUDGET: usize = MAX_ANSWER_BYTES - 16;

/// A consume answer rendered while its messages are leased: one message object, or
/// `{"messages":[…]}` for a batch, never more than its byte budget.
pub(crate) struct Answer {
    out: Vec<u8>,
    pub(crate) count: usize,
    batch: bool,
    budget: usize,
}

impl Answer {
    pub(crate) fn new(batch: bool) -> Answer {
        Answer::with_budget(batch, MAX_ANSWER_BYTES)
    }

    pub(crate) fn with_budget(batch: bool, budget: usize) -> Answer {
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

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Adds a leased message if it fits (the first always does); `false` leaves the answer
    /// as it was, and the caller hands the lease back.
    pub(crate) fn push(
        &mut self,
        topic: &str,
        rec: &StoredRecord,
        partition: u32,
        nonce: u64,
        delivery_count: u32,
    ) -> bool {
        let mark = self.out.len();
        if self.count > 0 {
            self.out.push(b',');
        }
        write_message(
            &mut self.out,
            topic,
            rec,
            partition,
            Some((
                ReceiptHandle {
                    partition,
                    offset: rec.offset,
                    nonce,
                },
                delivery_count,
            )),
        );
        // Room for the closing `]}` of a batch.
        if self.count > 0 && self.out.len() + 2 > self.budget {
            self.out.truncate(mark);
            return false;
        }
        self.count += 1;
        true
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        if self.batch {
            self.out.extend_from_slice(b"]}");
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::MAX_BATCH;
    use crate::rpc::RpcReply;
    use bytes::Bytes;

    fn record(offset: u64, payload: &[u8]) -> StoredRecord {
        StoredRecord {
            offset,
            timestamp_ms: 1_000,
            key: None,
            payload: Bytes::copy_from_slice(payload),
            attrs: None,
        }
    }

    #[test]
    fn an_answer_holds_what_fits_its_budget_and_at_least_one() {
        let rec = record(0, &[b'x'; 100]);
        let mut one = Answer::with_budget(true, usize::MAX);
        assert!(one.push("t", &rec, 0, 1, 1));
        let per = one.finish().len();
        // A budget for two and a half messages takes two; the third is refused unchanged.
        let mut a = Answer::with_budget(true, per * 5 / 2);
        assert!(a.push("t", &record(0, &[b'x'; 100]), 0, 1, 1));
        assert!(a.push("t", &record(1, &[b'x'; 100]), 0, 2, 1));
        let before = a.out.clone();
        assert!(!a.push("t", &record(2, &[b'x'; 100]), 0, 3, 1));
        assert_eq!(a.out, before);
        let body = a.finish();
        assert!(body.len() <= per * 5 / 2);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let msgs = v["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[1]["receipt_handle"], "0:1:2");
        // The first message goes in whatever the budget.
        let mut tiny = Answer::with_budget(true, 1);
        assert!(tiny.push("t", &rec, 0, 1, 1));
        assert_eq!(tiny.count, 1);
        let v: serde_json::Value = serde_json::from_slice(&tiny.finish()).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_single_answer_is_one_object() {
        let mut a = Answer::new(false);
        assert!(a.push("t", &record(5, b"{\"a\":1}"), 2, 9, 1));
        let v: serde_json::Value = serde_json::from_slice(&a.finish()).unwrap();
        assert_eq!(v["offset"], 5);
        assert_eq!(v["partition"], 2);
        assert_eq!(v["payload"]["a"], 1);
        assert_eq!(v["receipt_handle"], "2:5:9");
        assert_eq!(v["delivery_count"], 1);
    }

    #[test]
    fn attributes_render_beside_the_key_leased_or_replayed() {
        let mut rec = record(5, b"x");
        let mut b = crate::attrs::Builder::default();
        b.push("traceparent", "00-1-2-01").unwrap();
        b.push("note", "quote \" and \u{1}").unwrap();
        rec.attrs = b.finish();
        for lease in [
            None,
            Some((
                ReceiptHandle {
                    partition: 0,
                    offset: 5,
                    nonce: 1,
                },
                2,
            )),
        ] {
            let mut out = Vec::new();
            write_message(&mut out, "t", &rec, 0, lease);
            let m: narad_api::Message = serde_json::from_slice(&out).unwrap();
            let a = m.attributes.unwrap();
            assert_eq!(a["traceparent"], "00-1-2-01");
            assert_eq!(a["note"], "quote \" and \u{1}");
            assert_eq!(m.delivery_count, lease.map(|l| l.1));
        }
        let mut out = Vec::new();
        write_message(&mut out, "t", &record(5, b"x"), 0, None);
        assert!(!String::from_utf8(out).unwrap().contains("attributes"));
    }

    #[test]
    fn the_largest_batch_of_the_largest_messages_fits_one_rpc_frame() {
        // 100 messages of 1 MiB of control characters (each escaped to six bytes, or sent as
        // base64): the answer stops below the frame limit, the reply's fields included.
        let worst = vec![1u8; crate::api::MAX_BODY];
        let mut a = Answer::new(true);
        let mut n = 0;
        while n < MAX_BATCH && a.push("t", &record(n, &worst), 0, n, 1) {
            n += 1;
        }
        assert!((1..MAX_BATCH).contains(&n), "{n}");
        let body = a.finish();
        assert!(body.len() <= MAX_ANSWER_BYTES);
        let reply = RpcReply::new(200, crate::rpc::proto::JSON, body);
        assert!(reply.encode().unwrap().len() <= crate::rpc::proto::MAX_PAYLOAD);
    }

    proptest::proptest! {
        #[test]
        fn prop_a_message_renders_as_json_the_client_reads_back(
            partition in proptest::prelude::any::<u32>(),
            offset in proptest::prelude::any::<u64>(),
            nonce in proptest::prelude::any::<u64>(),
            count in proptest::prelude::any::<u32>(),
            timestamp_ms in proptest::prelude::any::<u64>(),
            key in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8)),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..16),
        ) {
            let rec = StoredRecord {
                offset,
                timestamp_ms,
                key: key.clone().map(Bytes::from),
                payload: Bytes::from(payload.clone()),
                attrs: None,
            };
            let h = ReceiptHandle { partition, offset, nonce };
            let mut out = Vec::new();
            write_message(&mut out, "t", &rec, partition, Some((h, count)));
            let m: narad_api::Message = serde_json::from_slice(&out).unwrap();
            proptest::prop_assert_eq!(m.partition, partition);
            proptest::prop_assert_eq!(m.offset, offset);
            proptest::prop_assert_eq!(m.timestamp, timestamp_ms / 1000);
            proptest::prop_assert_eq!(m.delivery_count, Some(count));
            let handle = m.receipt_handle.unwrap();
            proptest::prop_assert_eq!(&handle, &h.to_string());
            proptest::prop_assert_eq!(handle.parse::<ReceiptHandle>().unwrap(), h);
            let got = narad_api::render::decode_payload(&m.payload, m.payload_encoding.as_deref());
            proptest::prop_assert_eq!(got.unwrap(), payload);
            let got = m
                .key
                .map(|k| narad_api::render::decode_key(&k, m.key_encoding.as_deref()).unwrap());
            proptest::prop_assert_eq!(got, key);
        }
    }
}
