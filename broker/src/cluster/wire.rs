//! Payloads of the node RPCs Narad's cluster uses (SPEC §6.6). Each opcode's payload is fixed
//! forever (a new shape gets a new opcode); this file is where they are defined.
//!
//! JSON for the control plane and the consume path (small, debuggable), a compact binary
//! encoding for `CommitProduceBatch` (the data path: up to 4 MiB of payloads per call).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use narad_meta::{MetaCommand, MetaResponse, Topic};
use serde::{Deserialize, Serialize};

/// A metadata command forwarded to the leader (opcodes 4, 5, 6, 9, 12, 13, 14).
#[derive(Debug, Serialize, Deserialize)]
pub struct ProposeRequest {
    pub command: MetaCommand,
}

/// The leader's answer to a forwarded command: what apply returned and the log index it was
/// applied at, so the forwarding node can wait until its own replica has applied it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProposeReply {
    pub response: MetaResponse,
    pub index: u64,
}

/// `GetTopic` (20): asks the leader for a current read (after a Raft barrier) of one topic,
/// or only for the index its state is current to (`name: None`).
#[derive(Debug, Serialize, Deserialize)]
pub struct GetTopicRequest {
    pub name: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct GetTopicReply {
    pub index: u64,
    pub topic: Option<Topic>,
}

/// `JoinCluster` (21). With `probe`, nothing changes: the peer only says whether it belongs
/// to an initialized cluster (an initial member with an empty disk asks this before it
/// bootstraps). Without, the leader adds the node as a voter (idempotent); others answer
/// `503` "not the metadata leader".
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinRequest {
    pub id: String,
    pub cluster_addr: String,
    #[serde(default)]
    pub probe: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct JoinReply {
    pub initialized: bool,
    pub leader: Option<String>,
    pub admitted: bool,
}

/// `Consume` (2): a consume, pinned consume or replay run on the partitions' owner. The reply
/// is exactly the HTTP answer (200 with the message body, 204, or an error).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsumeRequest {
    pub topic_id: u64,
    pub topic: String,
    pub partition: Option<u32>,
    pub offset: Option<u64>,
    /// `max` as the client gave it (it decides the body's shape).
    pub max: Option<u32>,
    pub wait_ms: u64,
}

/// How a lease is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SettleKind {
    Ack,
    Extend,
    Nack,
    /// A lease whose message no consumer was given (one a node prefetched and released): back
    /// at once, as a nack, but not counted as a delivery. Never on the wire itself: a
    /// [`SettleRequest`] carries it as `nack` with `unused`.
    #[serde(skip)]
    Release,
    /// A nack whose message is delivered again no earlier than this many milliseconds from
    /// now (`delay=`). Travels only with `SettleWith` (35).
    Delay(u64),
    /// An extend to this many milliseconds from now instead of the topic's visibility
    /// timeout (`visibility=`). Travels only with `SettleWith` (35).
    #[serde(rename = "extend_for")]
    ExtendFor(u64),
}

impl SettleKind {
    /// The opcode a single settle of this kind travels with.
    pub fn opcode(self) -> crate::rpc::Opcode {
        match self {
            SettleKind::Ack => crate::rpc::Opcode::Ack,
            SettleKind::Extend => crate::rpc::Opcode::ExtendAck,
            SettleKind::Nack | SettleKind::Release => crate::rpc::Opcode::Nack,
            SettleKind::Delay(_) | SettleKind::ExtendFor(_) => crate::rpc::Opcode::SettleWith,
        }
    }

    /// A settle with a parameter, which an owner of an older build cannot honour (it would
    /// redeliver early): sent only with `SettleWith` (35), never downgraded.
    pub fn has_parameter(self) -> bool {
        matches!(self, SettleKind::Delay(_) | SettleKind::ExtendFor(_))
    }
}

/// `Ack` (3), `ExtendAck` (18), `Nack` (19): one receipt handle. `AckBatch` (31): several,
/// answered with one status per handle (`narad_api::BatchAckResponse`).
#[derive(Debug, Serialize, Deserialize)]
pub struct SettleRequest {
    pub topic_id: u64,
    pub topic: String,
    how: SettleKind,
    pub handles: Vec<String>,
    /// With `how` = `nack`: the messages were never given to a consumer
    /// ([`SettleKind::Release`]). An owner of an older build ignores it and counts the
    /// delivery.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    unused: bool,
}

impl SettleRequest {
    pub fn new(topic_id: u64, topic: String, how: SettleKind, handles: Vec<String>) -> Self {
        let unused = how == SettleKind::Release;
        SettleRequest {
            topic_id,
            topic,
            how: if unused { SettleKind::Nack } else { how },
            handles,
            unused,
        }
    }

    /// How the handles are settled.
    pub fn kind(&self) -> SettleKind {
        match self.how {
            SettleKind::Nack if self.unused => SettleKind::Release,
            how => how,
        }
    }
}

/// `TopicPartitionStats` (8): the stats of the listed partitions the callee owns; the reply
/// is a JSON array of `narad_api::PartitionStats`.
#[derive(Debug, Serialize, Deserialize)]
pub struct StatsRequest {
    pub topic_id: u64,
    pub topic: String,
    pub partitions: Vec<u32>,
    /// The callee first waits (bounded) until it has applied this metadata index and opened
    /// its partitions: a node that changed a topic asks every live member so before it
    /// answers its client (read-your-writes on every node, SPEC §3.3). Older callees ignore
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_index: Option<u64>,
}

/// `RepositionPartitions` (34): move the queue frontier of the listed partitions the callee
/// owns (a purge: `End`; a seek). The reply is one [`RepositionOutcome`] per partition.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepositionRequest {
    pub topic_id: u64,
    pub topic: String,
    pub partitions: Vec<u32>,
    pub to: crate::partition::Position,
}

/// One partition of a `RepositionPartitions` reply: the frontiers before and after, or why
/// it did not move (`status` and `error` as in an HTTP error answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositionOutcome {
    pub partition: u32,
    #[serde(default)]
    pub previous_frontier: u64,
    #[serde(default)]
    pub frontier: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<(u16, String)>,
}

/// `ListPartitionSegments` (22): a partition the callee owns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionRef {
    pub topic_id: u64,
    pub partition: u32,
}

/// One segment file of a partition log (name inside `log/`, base offset, committed size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    pub name: String,
    pub base: u64,
    pub size: u64,
    pub sealed: bool,
}

impl From<narad_storage::SegmentFile> for SegmentInfo {
    fn from(f: narad_storage::SegmentFile) -> Self {
        SegmentInfo {
            name: f.name,
            base: f.base,
            size: f.size,
            sealed: f.sealed,
        }
    }
}

/// The reply to `ListPartitionSegments`: the log's files with their committed sizes, oldest
/// first, and the committed offsets they hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SegmentList {
    pub high_watermark: u64,
    pub oldest_offset: u64,
    pub files: Vec<SegmentInfo>,
    /// The queue's committed frontier and the fan-out cursor files at that instant: what a
    /// copy force-promoted from this listing starts from (SPEC §6.5). Absent from a peer
    /// that does not report them (then the frontier is the oldest offset: redeliveries).
    #[serde(default)]
    pub frontier: Option<u64>,
    #[serde(default)]
    pub small_files: Vec<SmallFile>,
}

/// Largest chunk `FetchSegmentChunk` returns (SPEC §6.5 copies: ≤ 4 MiB per call).
pub const MAX_CHUNK: u32 = 4 * 1024 * 1024;

/// `FetchSegmentChunk` (23): up to `len` (≤ [`MAX_CHUNK`]) committed bytes of segment
/// `base` from byte `pos`; the reply body is the raw bytes (`application/octet-stream`),
/// empty at the committed end; `410` when retention removed the segment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkRequest {
    pub topic_id: u64,
    pub partition: u32,
    pub base: u64,
    pub pos: u64,
    pub len: u32,
}

/// `PrepareHandoff` (24): the target of move `move_id` asks the owner to freeze the
/// partition for the final copy. Refused (`409`) unless the owner's view shows that move in
/// flight to the caller (`503` while its view may be behind).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandoffRequest {
    pub topic_id: u64,
    pub partition: u32,
    pub move_id: u64,
}

/// A file of the partition directory outside the log, copied whole (fan-out cursors).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SmallFile {
    /// Relative to the partition directory (`fanout/<name>`).
    pub path: String,
    pub bytes: Vec<u8>,
}

/// The frozen partition's exact state: what the copy must reproduce.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandoffReply {
    pub high_watermark: u64,
    pub oldest_offset: u64,
    /// The committed consumer frontier.
    pub frontier: u64,
    pub files: Vec<SegmentInfo>,
    pub small_files: Vec<SmallFile>,
    /// How long the freeze lasts unless the move completes (ms).
    pub freeze_ms: u64,
}

/// `GetAssignment` (28). With a topic: the leader's current (barrier-confirmed) assignment
/// of one partition. Either way the callee also reports its own WAL backlog (a draining node
/// is removed only once it is empty).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssignmentRequest {
    pub topic_id: Option<u64>,
    pub partition: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssignmentReply {
    /// The log index the answer is current to (0 when not asked for an assignment).
    pub index: u64,
    /// `None` when the topic or partition does not exist (or none was asked for).
    pub assignment: Option<narad_meta::Assignment>,
    /// Records in the callee's ingress WAL not yet committed to their partitions, plus the
    /// delayed produces its delay store holds (ext; both must empty before it leaves).
    pub wal_outstanding: u64,
}

/// `FanoutCursors` (17): the lag of every fan-out cursor the callee runs for parent
/// partitions of `parent_id`; the reply is `{child: {partition: lag}}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ChildCursorsRequest {
    pub parent_id: u64,
    pub parent: String,
}

/// A record of a `CommitProduceBatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    pub key: Option<Bytes>,
    pub payload: Bytes,
    /// (ext) The record's attribute block (`crate::attrs`).
    pub attrs: Option<Bytes>,
}

/// `CommitProduceBatch` (11): records for one partition, committed by its owner with the
/// same fsync-and-verify commit as a local one; `200` only once they are visible. A batch
/// some of whose records carry attributes travels as `CommitProduceBatchAttrs` (36).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitBatch {
    pub topic_id: u64,
    pub partition: u32,
    pub records: Vec<CommitRecord>,
}

const NO_KEY: u32 = u32::MAX;
/// The attribute-block length of a record without attributes (in the attribute encodings).
const NO_ATTRS: u32 = u32::MAX;

/// `key_len u32 (NO_KEY = none) | key | payload_len u32 | payload`: the record body both
/// [`CommitBatch`] and [`ForwardProduce`] carry; `with_attrs` (the encodings of opcodes 36
/// and 37), then `attrs_len u32 (NO_ATTRS = none) | attrs`.
fn put_record(
    buf: &mut BytesMut,
    key: Option<&Bytes>,
    payload: &[u8],
    attrs: Option<&Bytes>,
    with_attrs: bool,
) {
    match key {
        Some(k) => {
            buf.put_u32(k.len() as u32);
            buf.put_slice(k);
        }
        None => buf.put_u32(NO_KEY),
    }
    buf.put_u32(payload.len() as u32);
    buf.put_slice(payload);
    match attrs {
        _ if !with_attrs => {}
        None => buf.put_u32(NO_ATTRS),
        Some(a) => {
            buf.put_u32(a.len() as u32);
            buf.put_slice(a);
        }
    }
}

/// The bytes [`put_record`] writes for one record.
fn record_len(
    key: Option<&Bytes>,
    payload: &[u8],
    attrs: Option<&Bytes>,
    with_attrs: bool,
) -> usize {
    8 + key.map_or(0, |k| k.len())
        + payload.len()
        + if with_attrs {
            4 + attrs.map_or(0, |a| a.len())
        } else {
            0
        }
}

/// Reads what [`put_record`] wrote; everything shares `buf` (no copy). `codec` names the
/// message in errors. An attribute block is checked (`crate::attrs::check`): a peer never
/// gets a malformed one stored.
fn get_record(
    buf: &mut Bytes,
    codec: &str,
    with_attrs: bool,
) -> Result<(Option<Bytes>, Bytes, Option<Bytes>), String> {
    need(buf, 4, codec, "key length")?;
    let klen = buf.get_u32();
    let key = if klen == NO_KEY {
        None
    } else {
        need(buf, klen as usize, codec, "key")?;
        Some(buf.split_to(klen as usize))
    };
    need(buf, 4, codec, "payload length")?;
    let plen = buf.get_u32() as usize;
    need(buf, plen, codec, "payload")?;
    let payload = buf.split_to(plen);
    let mut attrs = None;
    if with_attrs {
        need(buf, 4, codec, "attributes length")?;
        let alen = buf.get_u32();
        if alen != NO_ATTRS {
            need(buf, alen as usize, codec, "attributes")?;
            let a = buf.split_to(alen as usize);
            crate::attrs::check(&a).map_err(|e| format!("{codec}: {e}"))?;
            attrs = Some(a);
        }
    }
    Ok((key, payload, attrs))
}

fn need(buf: &Bytes, n: usize, codec: &str, what: &str) -> Result<(), String> {
    if buf.remaining() < n {
        Err(format!("{codec} truncated in {what}"))
    } else {
        Ok(())
    }
}

fn no_trailing(buf: &Bytes) -> Result<(), String> {
    match buf.remaining() {
        0 => Ok(()),
        n => Err(format!("{n} trailing bytes after the records")),
    }
}

impl CommitBatch {
    /// Whether a record carries attributes (the batch then needs opcode 36).
    pub fn has_attrs(&self) -> bool {
        self.records.iter().any(|r| r.attrs.is_some())
    }

    /// `topic_id u64 | partition u32 | count u32 | count × (key_len u32 (MAX = none) | key |
    /// payload_len u32 | payload [| attrs_len u32 (MAX = none) | attrs])`, big-endian; the
    /// attribute fields when [`CommitBatch::has_attrs`] (opcode 36), else not (opcode 11).
    pub fn encode(&self) -> Bytes {
        let with_attrs = self.has_attrs();
        let size: usize = 16
            + self
                .records
                .iter()
                .map(|r| record_len(r.key.as_ref(), &r.payload, r.attrs.as_ref(), with_attrs))
                .sum::<usize>();
        let mut buf = BytesMut::with_capacity(size);
        buf.put_u64(self.topic_id);
        buf.put_u32(self.partition);
        buf.put_u32(self.records.len() as u32);
        for r in &self.records {
            put_record(
                &mut buf,
                r.key.as_ref(),
                &r.payload,
                r.attrs.as_ref(),
                with_attrs,
            );
        }
        buf.freeze()
    }

    /// Parses [`CommitBatch::encode`]'s output (`with_attrs`: of opcode 36); keys, payloads
    /// and attributes share `buf` (no copy).
    pub fn decode(mut buf: Bytes, with_attrs: bool) -> Result<CommitBatch, String> {
        const CODEC: &str = "commit batch";
        need(&buf, 16, CODEC, "header")?;
        let topic_id = buf.get_u64();
        let partition = buf.get_u32();
        let count = buf.get_u32() as usize;
        // Every record takes at least 8 bytes: refuse counts the payload cannot hold.
        if count > buf.remaining() / 8 {
            return Err(format!("commit batch claims {count} records"));
        }
        let mut records = Vec::with_capacity(count);
        for _ in 0..count {
            let (key, payload, attrs) = get_record(&mut buf, CODEC, with_attrs)?;
            records.push(CommitRecord {
                key,
                payload,
                attrs,
            });
        }
        no_trailing(&buf)?;
        Ok(CommitBatch {
            topic_id,
            partition,
            records,
        })
    }
}

/// `Produce` (1): records a draining node accepted from a producer, handed to a live node to
/// store in its own ingress WAL (SPEC §6.5); `202` once they are fsynced there. Partitions
/// are already chosen (and the schema checked) by the sender. With attributes on any record
/// it travels as `ProduceAttrs` (37).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardProduce {
    pub topic_id: u64,
    pub records: Vec<ForwardRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardRecord {
    pub partition: u32,
    pub pinned: bool,
    pub key: Option<Bytes>,
    pub payload: Bytes,
    pub attrs: Option<Bytes>,
}

impl ForwardProduce {
    /// Whether a record carries attributes (the request then needs opcode 37).
    pub fn has_attrs(&self) -> bool {
        self.records.iter().any(|r| r.attrs.is_some())
    }

    /// `topic_id u64 | count u32 | count × (partition u32 | pinned u8 | key_len u32 (MAX =
    /// none) | key | payload_len u32 | payload [| attrs_len u32 (MAX = none) | attrs])`,
    /// big-endian; the attribute fields when [`ForwardProduce::has_attrs`] (opcode 37).
    pub fn encode(&self) -> Bytes {
        let with_attrs = self.has_attrs();
        let size: usize = 12
            + self
                .records
                .iter()
                .map(|r| 5 + record_len(r.key.as_ref(), &r.payload, r.attrs.as_ref(), with_attrs))
                .sum::<usize>();
        let mut buf = BytesMut::with_capacity(size);
        buf.put_u64(self.topic_id);
        buf.put_u32(self.records.len() as u32);
        for r in &self.records {
            buf.put_u32(r.partition);
            buf.put_u8(u8::from(r.pinned));
            put_record(
                &mut buf,
                r.key.as_ref(),
                &r.payload,
                r.attrs.as_ref(),
                with_attrs,
            );
        }
        buf.freeze()
    }

    /// Parses [`ForwardProduce::encode`]'s output (`with_attrs`: of opcode 37); everything
    /// shares `buf`.
    pub fn decode(mut buf: Bytes, with_attrs: bool) -> Result<ForwardProduce, String> {
        const CODEC: &str = "forwarded produce";
        need(&buf, 12, CODEC, "header")?;
        let topic_id = buf.get_u64();
        let count = buf.get_u32() as usize;
        if count > buf.remaining() / 13 {
            return Err(format!("forwarded produce claims {count} records"));
        }
        let mut records = Vec::with_capacity(count);
        for _ in 0..count {
            need(&buf, 5, CODEC, "record header")?;
            let partition = buf.get_u32();
            let pinned = match buf.get_u8() {
                0 => false,
                1 => true,
                b => return Err(format!("bad pinned flag {b}")),
            };
            let (key, payload, attrs) = get_record(&mut buf, CODEC, with_attrs)?;
            records.push(ForwardRecord {
                partition,
                pinned,
                key,
                payload,
                attrs,
            });
        }
        no_trailing(&buf)?;
        Ok(ForwardProduce { topic_id, records })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_travels_as_an_unused_nack_that_older_owners_read_as_a_nack() {
        let release = SettleRequest::new(1, "t".into(), SettleKind::Release, vec!["0:1:2".into()]);
        let v = serde_json::to_value(&release).unwrap();
        assert_eq!(v["how"], "nack");
        assert_eq!(v["unused"], true);
        let back: SettleRequest = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back.kind(), SettleKind::Release);
        // What an older owner sees of it, and what an older sender sends: a nack.
        let mut old = v;
        old.as_object_mut().unwrap().remove("unused");
        let back: SettleRequest = serde_json::from_value(old).unwrap();
        assert_eq!(back.kind(), SettleKind::Nack);
        // Other kinds carry no `unused`.
        for how in [SettleKind::Ack, SettleKind::Extend, SettleKind::Nack] {
            let v = serde_json::to_value(SettleRequest::new(1, "t".into(), how, vec![])).unwrap();
            assert!(v.get("unused").is_none(), "{how:?}");
            assert_eq!(
                serde_json::from_value::<SettleRequest>(v).unwrap().kind(),
                how
            );
        }
    }

    #[test]
    fn forward_produce_round_trips_and_refuses_truncation() {
        let f = ForwardProduce {
            topic_id: 9,
            records: vec![
                ForwardRecord {
                    partition: 2,
                    pinned: true,
                    key: Some(Bytes::from_static(b"k")),
                    payload: Bytes::from_static(b"{\"a\":1}"),
                    attrs: None,
                },
                ForwardRecord {
                    partition: 0,
                    pinned: false,
                    key: None,
                    payload: Bytes::from_static(b"x"),
                    attrs: None,
                },
            ],
        };
        let mut with_attrs = f.clone();
        with_attrs.records[1].attrs = attrs_block(&[("traceparent", "00-1-2-01")]);
        for (f, opcode_37) in [(f, false), (with_attrs, true)] {
            assert_eq!(f.has_attrs(), opcode_37);
            let enc = f.encode();
            assert_eq!(ForwardProduce::decode(enc.clone(), opcode_37).unwrap(), f);
            // Read with the other opcode's shape, the bytes do not parse.
            assert!(ForwardProduce::decode(enc.clone(), !opcode_37).is_err());
            for cut in 0..enc.len() {
                assert!(
                    ForwardProduce::decode(enc.slice(..cut), opcode_37).is_err(),
                    "cut {cut}"
                );
            }
            let mut long = enc.to_vec();
            long.push(0);
            assert!(ForwardProduce::decode(Bytes::from(long), opcode_37).is_err());
        }
    }

    fn attrs_block(pairs: &[(&str, &str)]) -> Option<Bytes> {
        let mut b = crate::attrs::Builder::default();
        for (n, v) in pairs {
            b.push(n, v).unwrap();
        }
        b.finish()
    }

    #[test]
    fn a_malformed_attribute_block_from_a_peer_is_refused() {
        let b = CommitBatch {
            topic_id: 1,
            partition: 0,
            records: vec![CommitRecord {
                key: None,
                payload: Bytes::from_static(b"p"),
                attrs: Some(Bytes::from_static(&[1, b'A', 0, 0])),
            }],
        };
        let e = CommitBatch::decode(b.encode(), true).unwrap_err();
        assert!(e.contains("lowercased"), "{e}");
    }

    #[test]
    fn commit_batch_round_trips() {
        let b = CommitBatch {
            topic_id: 7,
            partition: 3,
            records: vec![
                CommitRecord {
                    key: Some(Bytes::from_static(b"k1")),
                    payload: Bytes::from_static(b"hello"),
                    attrs: None,
                },
                CommitRecord {
                    key: None,
                    payload: Bytes::from_static(b"x"),
                    attrs: None,
                },
                CommitRecord {
                    key: Some(Bytes::new()),
                    payload: Bytes::from(vec![0u8; 70_000]),
                    attrs: None,
                },
            ],
        };
        assert_eq!(CommitBatch::decode(b.encode(), false).unwrap(), b);
        let mut with_attrs = b.clone();
        with_attrs.records[2].attrs = attrs_block(&[("a", "1"), ("b", "")]);
        assert_eq!(
            CommitBatch::decode(with_attrs.encode(), true).unwrap(),
            with_attrs
        );
        // Without attributes the bytes are those of opcode 11, as before attributes existed.
        assert_eq!(
            with_attrs.encode().len(),
            b.encode().len() + 3 * 4 + attrs_block(&[("a", "1"), ("b", "")]).unwrap().len()
        );
    }

    #[test]
    fn commit_batch_refuses_truncation_and_garbage() {
        let b = CommitBatch {
            topic_id: 1,
            partition: 0,
            records: vec![CommitRecord {
                key: Some(Bytes::from_static(b"key")),
                payload: Bytes::from_static(b"payload"),
                attrs: None,
            }],
        };
        let enc = b.encode();
        for cut in 0..enc.len() {
            assert!(
                CommitBatch::decode(enc.slice(..cut), false).is_err(),
                "cut at {cut}"
            );
        }
        let mut extra = enc.to_vec();
        extra.push(0);
        assert!(CommitBatch::decode(Bytes::from(extra), false).is_err());
        // A huge count with no bytes behind it is refused before allocating.
        let mut huge = BytesMut::new();
        huge.put_u64(1);
        huge.put_u32(0);
        huge.put_u32(u32::MAX - 1);
        assert!(CommitBatch::decode(huge.clone().freeze(), false).is_err());
        assert!(CommitBatch::decode(huge.freeze(), true).is_err());
    }
}

/// `TransferLeadership` (32): the successor starts an election once its log reaches
/// `last_index` (the old leader's last entry).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransferRequest {
    pub last_index: u64,
}

/// One remote link's status in a `RemoteLinkStates` (33) reply, keyed by link name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteLinkState {
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = CommitRecord> {
        (
            proptest::option::of(vec(any::<u8>(), 0..32)),
            vec(any::<u8>(), 0..128),
            proptest::option::of(proptest::collection::btree_map(
                "[a-z]{1,8}",
                "[ -~]{0,8}",
                1..4,
            )),
        )
            .prop_map(|(key, payload, attrs)| CommitRecord {
                key: key.map(Bytes::from),
                payload: Bytes::from(payload),
                attrs: attrs.and_then(|m| crate::attrs::from_map(m.iter()).unwrap()),
            })
    }

    fn batch() -> impl Strategy<Value = CommitBatch> {
        (any::<u64>(), any::<u32>(), vec(record(), 0..8)).prop_map(
            |(topic_id, partition, records)| CommitBatch {
                topic_id,
                partition,
                records,
            },
        )
    }

    /// Commit-batch bytes: garbage, or a header with any count in front of length fields
    /// that are small or huge (up to `u32::MAX`, the "no key" marker included).
    fn batch_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            vec(any::<u8>(), 0..96),
            (
                any::<u64>(),
                prop_oneof![0..6u32, any::<u32>()],
                vec(
                    (
                        prop_oneof![Just(NO_KEY), 0..8u32, any::<u32>()],
                        prop_oneof![0..8u32, any::<u32>()],
                        vec(any::<u8>(), 0..16),
                    ),
                    0..5,
                ),
            )
                .prop_map(|(topic, count, recs)| {
                    let mut b = BytesMut::new();
                    b.put_u64(topic);
                    b.put_u32(0);
                    b.put_u32(count);
                    for (klen, plen, data) in recs {
                        b.put_u32(klen);
                        b.put_u32(plen);
                        b.put_slice(&data);
                    }
                    b.to_vec()
                }),
        ]
    }

    proptest! {
        #[test]
        fn prop_commit_batch_roundtrip(b in batch()) {
            let enc = b.encode();
            prop_assert_eq!(CommitBatch::decode(enc, b.has_attrs()).unwrap(), b);
        }

        /// Every strict prefix and every longer buffer is refused.
        #[test]
        fn prop_commit_batch_truncation_and_trailing_bytes(
            b in batch(),
            cut in any::<prop::sample::Index>(),
            extra in vec(any::<u8>(), 1..8),
        ) {
            let enc = b.encode();
            let a = b.has_attrs();
            prop_assert!(CommitBatch::decode(enc.slice(..cut.index(enc.len())), a).is_err());
            let mut longer = enc.to_vec();
            longer.extend(extra);
            prop_assert!(CommitBatch::decode(Bytes::from(longer), a).is_err());
        }

        /// Arbitrary bytes (huge counts and lengths included) never panic or allocate what
        /// the input cannot hold; what decodes re-encodes to the same bytes.
        #[test]
        fn prop_commit_batch_decode_arbitrary(b in batch_bytes()) {
            if let Ok(d) = CommitBatch::decode(Bytes::from(b.clone()), false) {
                prop_assert!(d.records.capacity() <= b.len() / 8);
                prop_assert_eq!(&d.encode()[..], &b[..]);
            }
            if let Ok(d) = CommitBatch::decode(Bytes::from(b.clone()), true) {
                prop_assert!(d.records.capacity() <= b.len() / 8);
                if d.has_attrs() {
                    prop_assert_eq!(&d.encode()[..], &b[..]);
                }
            }
        }
    }

    fn consume_request() -> impl Strategy<Value = ConsumeRequest> {
        (
            any::<u64>(),
            any::<String>(),
            any::<Option<u32>>(),
            any::<Option<u64>>(),
            any::<Option<u32>>(),
            any::<u64>(),
        )
            .prop_map(|(topic_id, topic, partition, offset, max, wait_ms)| {
                ConsumeRequest {
                    topic_id,
                    topic,
                    partition,
                    offset,
                    max,
                    wait_ms,
                }
            })
    }

    fn settle_request() -> impl Strategy<Value = SettleRequest> {
        (
            any::<u64>(),
            any::<String>(),
            prop_oneof![
                Just(SettleKind::Ack),
                Just(SettleKind::Extend),
                Just(SettleKind::Nack),
                Just(SettleKind::Release)
            ],
            vec(any::<String>(), 0..4),
        )
            .prop_map(|(topic_id, topic, how, handles)| {
                SettleRequest::new(topic_id, topic, how, handles)
            })
    }

    /// One JSON body of each opcode the handler decodes with serde (`handler.rs`), as the
    /// sender encodes it.
    fn json_bodies() -> impl Strategy<Value = Vec<Vec<u8>>> {
        let to = |v: serde_json::Result<Vec<u8>>| v.unwrap();
        (
            consume_request(),
            settle_request(),
            (any::<u64>(), any::<String>(), vec(any::<u32>(), 0..4)),
            (
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u32>(),
            ),
            (any::<Option<u64>>(), any::<u32>(), any::<u64>()),
            (
                any::<String>(),
                any::<String>(),
                any::<bool>(),
                any::<Option<String>>(),
            ),
            (any::<String>(), any::<String>(), any::<u64>()),
        )
            .prop_map(move |(c, s, st, ch, asg, join, misc)| {
                vec![
                    to(serde_json::to_vec(&c)),
                    to(serde_json::to_vec(&s)),
                    to(serde_json::to_vec(&StatsRequest {
                        topic_id: st.0,
                        topic: st.1,
                        partitions: st.2,
                        min_index: None,
                    })),
                    to(serde_json::to_vec(&ChunkRequest {
                        topic_id: ch.0,
                        partition: ch.1,
                        base: ch.2,
                        pos: ch.3,
                        len: ch.4,
                    })),
                    to(serde_json::to_vec(&PartitionRef {
                        topic_id: ch.0,
                        partition: ch.1,
                    })),
                    to(serde_json::to_vec(&HandoffRequest {
                        topic_id: ch.0,
                        partition: ch.1,
                        move_id: ch.2,
                    })),
                    to(serde_json::to_vec(&AssignmentRequest {
                        topic_id: asg.0,
                        partition: asg.1,
                    })),
                    to(serde_json::to_vec(&TransferRequest { last_index: asg.2 })),
                    to(serde_json::to_vec(&JoinRequest {
                        id: join.0,
                        cluster_addr: join.1,
                        probe: join.2,
                    })),
                    to(serde_json::to_vec(&GetTopicRequest { name: join.3 })),
                    to(serde_json::to_vec(&ChildCursorsRequest {
                        parent_id: misc.2,
                        parent: misc.0.clone(),
                    })),
                    to(serde_json::to_vec(&ProposeRequest {
                        command: MetaCommand::AttachChild {
                            parent: misc.0,
                            child: misc.1,
                            delay_ms: misc.2,
                            now_ms: misc.2 / 2,
                        },
                    })),
                ]
            })
    }

    /// Decodes `body` as every JSON opcode body; the result is thrown away (only "no panic"
    /// counts for a mutated body).
    fn decode_all(body: &[u8]) -> usize {
        fn ok<T: serde::de::DeserializeOwned>(b: &[u8]) -> usize {
            serde_json::from_slice::<T>(b).is_ok() as usize
        }
        ok::<ConsumeRequest>(body)
            + ok::<SettleRequest>(body)
            + ok::<StatsRequest>(body)
            + ok::<ChunkRequest>(body)
            + ok::<PartitionRef>(body)
            + ok::<HandoffRequest>(body)
            + ok::<AssignmentRequest>(body)
            + ok::<TransferRequest>(body)
            + ok::<JoinRequest>(body)
            + ok::<GetTopicRequest>(body)
            + ok::<ChildCursorsRequest>(body)
            + ok::<ProposeRequest>(body)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Each JSON opcode body decodes back to a value that encodes the same: u64 ids and
        /// offsets keep every bit, strings every character.
        #[test]
        fn prop_json_opcode_bodies_roundtrip(bodies in json_bodies()) {
            fn same<T: serde::de::DeserializeOwned + serde::Serialize>(b: &[u8]) -> bool {
                serde_json::to_vec(&serde_json::from_slice::<T>(b).unwrap()).unwrap() == b
            }
            let checks = [
                same::<ConsumeRequest>(&bodies[0]),
                same::<SettleRequest>(&bodies[1]),
                same::<StatsRequest>(&bodies[2]),
                same::<ChunkRequest>(&bodies[3]),
                same::<PartitionRef>(&bodies[4]),
                same::<HandoffRequest>(&bodies[5]),
                same::<AssignmentRequest>(&bodies[6]),
                same::<TransferRequest>(&bodies[7]),
                same::<JoinRequest>(&bodies[8]),
                same::<GetTopicRequest>(&bodies[9]),
                same::<ChildCursorsRequest>(&bodies[10]),
                same::<ProposeRequest>(&bodies[11]),
            ];
            prop_assert!(checks.iter().all(|c| *c), "{:?}", checks);
        }

        /// Truncated and byte-flipped bodies are refused or decoded, never a panic.
        #[test]
        fn prop_json_opcode_bodies_mutated(
            bodies in json_bodies(),
            which in any::<prop::sample::Index>(),
            cut in any::<prop::sample::Index>(),
            flips in vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        ) {
            let mut b = bodies[which.index(bodies.len())].clone();
            for (at, v) in flips {
                let at = at.index(b.len());
                b[at] = v;
            }
            let cut = cut.index(b.len() + 1);
            decode_all(&b[..cut]);
            // Unmutated and whole, a body decodes as its own type at least.
            prop_assert!(decode_all(&bodies[which.index(bodies.len())]) >= 1);
        }
    }
}
