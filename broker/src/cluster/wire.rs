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
}

impl SettleKind {
    /// The opcode a single settle of this kind travels with.
    pub fn opcode(self) -> crate::rpc::Opcode {
        match self {
            SettleKind::Ack => crate::rpc::Opcode::Ack,
            SettleKind::Extend => crate::rpc::Opcode::ExtendAck,
            SettleKind::Nack => crate::rpc::Opcode::Nack,
        }
    }
}

/// `Ack` (3), `ExtendAck` (18), `Nack` (19): one receipt handle. `AckBatch` (31): several,
/// answered with one status per handle (`narad_api::BatchAckResponse`).
#[derive(Debug, Serialize, Deserialize)]
pub struct SettleRequest {
    pub topic_id: u64,
    pub topic: String,
    pub how: SettleKind,
    pub handles: Vec<String>,
}

/// `TopicPartitionStats` (8): the stats of the listed partitions the callee owns; the reply
/// is a JSON array of `narad_api::PartitionStats`.
#[derive(Debug, Serialize, Deserialize)]
pub struct StatsRequest {
    pub topic_id: u64,
    pub topic: String,
    pub partitions: Vec<u32>,
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
    /// Records in the callee's ingress WAL not yet committed to their partitions.
    pub wal_outstanding: u64,
}

/// `FanoutCursors` (17): the lag of every fan-out cursor the callee runs for parent
/// partitions of `parent_id`; the reply is `{child: {partition: lag}}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct FanoutCursorsRequest {
    pub parent_id: u64,
    pub parent: String,
}

/// A record of a `CommitProduceBatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    pub key: Option<Bytes>,
    pub payload: Bytes,
}

/// `CommitProduceBatch` (11): records for one partition, committed by its owner with the
/// same fsync-and-verify commit as a local one; `200` only once they are visible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitBatch {
    pub topic_id: u64,
    pub partition: u32,
    pub records: Vec<CommitRecord>,
}

const NO_KEY: u32 = u32::MAX;

impl CommitBatch {
    /// `topic_id u64 | partition u32 | count u32 | count × (key_len u32 (MAX = none) | key |
    /// payload_len u32 | payload)`, big-endian.
    pub fn encode(&self) -> Bytes {
        let size: usize = 16
            + self
                .records
                .iter()
                .map(|r| 8 + r.key.as_ref().map_or(0, |k| k.len()) + r.payload.len())
                .sum::<usize>();
        let mut buf = BytesMut::with_capacity(size);
        buf.put_u64(self.topic_id);
        buf.put_u32(self.partition);
        buf.put_u32(self.records.len() as u32);
        for r in &self.records {
            match &r.key {
                Some(k) => {
                    buf.put_u32(k.len() as u32);
                    buf.put_slice(k);
                }
                None => buf.put_u32(NO_KEY),
            }
            buf.put_u32(r.payload.len() as u32);
            buf.put_slice(&r.payload);
        }
        buf.freeze()
    }

    /// Parses [`CommitBatch::encode`]'s output; keys and payloads share `buf` (no copy).
    pub fn decode(mut buf: Bytes) -> Result<CommitBatch, String> {
        fn need(buf: &Bytes, n: usize, what: &str) -> Result<(), String> {
            if buf.remaining() < n {
                Err(format!("commit batch truncated in {what}"))
            } else {
                Ok(())
            }
        }
        need(&buf, 16, "header")?;
        let topic_id = buf.get_u64();
        let partition = buf.get_u32();
        let count = buf.get_u32() as usize;
        // Every record takes at least 8 bytes: refuse counts the payload cannot hold.
        if count > buf.remaining() / 8 {
            return Err(format!("commit batch claims {count} records"));
        }
        let mut records = Vec::with_capacity(count);
        for _ in 0..count {
            need(&buf, 4, "key length")?;
            let klen = buf.get_u32();
            let key = if klen == NO_KEY {
                None
            } else {
                need(&buf, klen as usize, "key")?;
                Some(buf.split_to(klen as usize))
            };
            need(&buf, 4, "payload length")?;
            let plen = buf.get_u32() as usize;
            need(&buf, plen, "payload")?;
            records.push(CommitRecord {
                key,
                payload: buf.split_to(plen),
            });
        }
        if buf.has_remaining() {
            return Err(format!(
                "{} trailing bytes after the records",
                buf.remaining()
            ));
        }
        Ok(CommitBatch {
            topic_id,
            partition,
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_batch_round_trips() {
        let b = CommitBatch {
            topic_id: 7,
            partition: 3,
            records: vec![
                CommitRecord {
                    key: Some(Bytes::from_static(b"k1")),
                    payload: Bytes::from_static(b"hello"),
                },
                CommitRecord {
                    key: None,
                    payload: Bytes::from_static(b"x"),
                },
                CommitRecord {
                    key: Some(Bytes::new()),
                    payload: Bytes::from(vec![0u8; 70_000]),
                },
            ],
        };
        assert_eq!(CommitBatch::decode(b.encode()).unwrap(), b);
    }

    #[test]
    fn commit_batch_refuses_truncation_and_garbage() {
        let b = CommitBatch {
            topic_id: 1,
            partition: 0,
            records: vec![CommitRecord {
                key: Some(Bytes::from_static(b"key")),
                payload: Bytes::from_static(b"payload"),
            }],
        };
        let enc = b.encode();
        for cut in 0..enc.len() {
            assert!(
                CommitBatch::decode(enc.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        let mut extra = enc.to_vec();
        extra.push(0);
        assert!(CommitBatch::decode(Bytes::from(extra)).is_err());
        // A huge count with no bytes behind it is refused before allocating.
        let mut huge = BytesMut::new();
        huge.put_u64(1);
        huge.put_u32(0);
        huge.put_u32(u32::MAX - 1);
        assert!(CommitBatch::decode(huge.freeze()).is_err());
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
