//! The node-RPC table (SPEC §6.6): for every opcode, the request it carries, the reply it
//! answers with, how long a caller waits by default, and the older opcode a caller falls back
//! to when the peer's build predates it. [`TABLE`] is the one place to read all of it; the
//! tests keep it complete and in step with the typed calls.
//!
//! [`Call`] ties a request type to its opcode, reply type and timeout, so a caller writes
//! `cluster.ask(&to, &GetTopicRequest { .. })` and gets the `GetTopicReply` or an `ApiError`
//! with its code (`Cluster::ask`): no body built by hand, no status checked at the call site.
//! A call whose row has a fallback is made with `Cluster::ask_or_older`, which says when the
//! peer predates the opcode. [`Relay`] is the one other kind: a request whose answer is the
//! HTTP answer itself (`Consume`), returned as it came (`Cluster::relay`).
//! The wire types themselves are in `wire`; the server side dispatches in `node_rpc`.

use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::wire::{
    AssignmentReply, AssignmentRequest, ChildCursorsRequest, ChunkRequest, CommitBatch,
    ConsumeRequest, ForwardProduce, GetTopicReply, GetTopicRequest, HandoffReply, HandoffRequest,
    JoinReply, JoinRequest, PartitionRef, ProposeReply, ProposeRequest, RemoteLinkState,
    RepositionOutcome, RepositionRequest, SegmentList, SettleRequest, StatsRequest,
    TransferRequest,
};
use crate::error::{ApiError, ApiResult};
use crate::rpc::{Opcode, RpcReply, COMMIT_TIMEOUT, DEFAULT_TIMEOUT};

/// A typed node RPC: the request type, its opcode (some request types travel with several),
/// the reply type and the default timeout.
pub trait Call {
    type Reply;
    /// How long a caller waits for the answer unless it says otherwise.
    const TIMEOUT: Duration;
    /// The opcode this request travels with.
    fn opcode(&self) -> Opcode;
    /// The request body.
    fn encode(&self) -> Bytes;
    /// The reply body of a 2xx answer.
    fn decode(reply: RpcReply) -> Result<Self::Reply, String>;
}

/// What a caller makes of node `id`'s answer to the typed call `op`: a refusal is the peer's
/// error with its code; a `2xx` is decoded, and one that cannot be read is the uncertain `502`
/// (the peer got the request, so it may have acted on it).
pub fn read_answer<C: Call>(id: &str, op: Opcode, reply: RpcReply) -> ApiResult<C::Reply> {
    if !reply.is_success() {
        return Err(ApiError::from_reply(&reply));
    }
    C::decode(reply)
        .map_err(|e| ApiError::uncertain(format!("unreadable {op} answer from {id}: {e}")))
}

/// A call whose request is JSON unless an encoding is given; its reply is JSON unless a
/// decoding is given.
macro_rules! json_call {
    ($req:ty => $reply:ty, $timeout:expr, |$r:ident| $op:expr) => {
        json_call!($req => $reply, $timeout, |$r| $op, |reply| json(&reply.body));
    };
    ($req:ty => $reply:ty, $timeout:expr, |$r:ident| $op:expr, |$rep:ident| $decode:expr) => {
        json_call!($req => $reply, $timeout, |$r| $op, |$rep| $decode,
            |req| json_body(req));
    };
    ($req:ty => $reply:ty, $timeout:expr, |$r:ident| $op:expr, |$rep:ident| $decode:expr,
        |$e:ident| $encode:expr) => {
        impl Call for $req {
            type Reply = $reply;
            const TIMEOUT: Duration = $timeout;
            fn opcode(&self) -> Opcode {
                let $r = self;
                $op
            }
            fn encode(&self) -> Bytes {
                let $e = self;
                $encode
            }
            fn decode($rep: RpcReply) -> Result<$reply, String> {
                $decode
            }
        }
    };
}

/// A JSON request body.
fn json_body<T: serde::Serialize>(req: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(req).expect("invariant: a wire request serialises"))
}

fn json<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

json_call!(ProposeRequest => ProposeReply, super::FORWARD_TIMEOUT,
    |r| super::forward_opcode(&r.command).expect("invariant: only forwardable commands are sent"));
json_call!(GetTopicRequest => GetTopicReply, DEFAULT_TIMEOUT, |_r| Opcode::GetTopic);
json_call!(JoinRequest => JoinReply, Duration::from_secs(30), |_r| Opcode::JoinCluster);
json_call!(AssignmentRequest => AssignmentReply, DEFAULT_TIMEOUT, |_r| Opcode::GetAssignment);
json_call!(PartitionRef => SegmentList, DEFAULT_TIMEOUT, |_r| Opcode::ListPartitionSegments);
json_call!(HandoffRequest => HandoffReply, DEFAULT_TIMEOUT, |_r| Opcode::PrepareHandoff);
json_call!(StatsRequest => Vec<narad_api::PartitionStats>, DEFAULT_TIMEOUT,
    |_r| Opcode::TopicPartitionStats);
json_call!(RepositionRequest => Vec<RepositionOutcome>, DEFAULT_TIMEOUT,
    |_r| Opcode::RepositionPartitions);
// `TransferLeadership` (32) answers `204` without a body.
json_call!(TransferRequest => (), super::HANDOFF_RETRY, |_r| Opcode::TransferLeadership,
    |_reply| Ok(()));
// `FetchSegmentChunk` (23) answers the raw bytes.
json_call!(ChunkRequest => Bytes, Duration::from_secs(30), |_r| Opcode::FetchSegmentChunk,
    |reply| Ok(reply.body));

/// `FanoutCursors` (17) and `RemoteLinkStates` (33) ask the same thing of a parent's owner:
/// the request names which.
#[derive(serde::Serialize)]
#[serde(transparent)]
pub struct CursorLags(pub ChildCursorsRequest);
#[derive(serde::Serialize)]
#[serde(transparent)]
pub struct RemoteLinkStates(pub ChildCursorsRequest);
json_call!(CursorLags => std::collections::BTreeMap<String, std::collections::BTreeMap<u32, u64>>,
    DEFAULT_TIMEOUT, |_r| Opcode::FanoutCursors);
json_call!(RemoteLinkStates => std::collections::BTreeMap<String, RemoteLinkState>,
    DEFAULT_TIMEOUT, |_r| Opcode::RemoteLinkStates);

// `Produce` (1), sent by a draining node: the records in the binary `ForwardProduce`
// encoding, `202 {"accepted": n}` once they are fsynced in the callee's WAL.
// With attributes on a record: `ProduceAttrs` (37), the same with each record's block.
json_call!(ForwardProduce => narad_api::BatchProduceResponse, COMMIT_TIMEOUT,
    |r| if r.has_attrs() { Opcode::ProduceAttrs } else { Opcode::Produce },
    |reply| json(&reply.body), |req| req.encode());
// `CommitProduceBatch` (11): `200` once the records are visible; a peer too old for it gets
// one `CommitOne` per record (the table's fallback). With attributes on a record:
// `CommitProduceBatchAttrs` (36), which has no fallback (the attributes are never dropped).
json_call!(CommitBatch => (), COMMIT_TIMEOUT,
    |r| if r.has_attrs() { Opcode::CommitProduceBatchAttrs } else { Opcode::CommitProduceBatch },
    |_reply| Ok(()), |req| req.encode());
/// `CommitProduce` (10): the `CommitBatch` encoding holding exactly one record.
pub struct CommitOne(pub CommitBatch);
json_call!(CommitOne => (), COMMIT_TIMEOUT, |_r| Opcode::CommitProduce,
    |_reply| Ok(()), |req| req.0.encode());

/// `Ack` (3), `ExtendAck` (18) or `Nack` (19), by the request's kind: one receipt handle,
/// `204` once settled.
#[derive(serde::Serialize)]
#[serde(transparent)]
pub struct SettleOne(pub SettleRequest);
json_call!(SettleOne => (), DEFAULT_TIMEOUT, |r| r.0.kind().opcode(), |_reply| Ok(()));
/// `AckBatch` (31): several receipt handles of one kind, one result per handle in order; a
/// peer too old for it gets one `SettleOne` per handle (the table's fallback).
#[derive(serde::Serialize)]
#[serde(transparent)]
pub struct SettleBatch(pub SettleRequest);
json_call!(SettleBatch => narad_api::BatchAckResponse, DEFAULT_TIMEOUT,
    |r| if r.0.kind().has_parameter() { Opcode::SettleWith } else { Opcode::AckBatch });

/// A call whose answer is the HTTP answer itself: the forwarding node gives its client the
/// status, headers and body as they came (`Cluster::relay`), so nothing is decoded here.
pub trait Relay {
    /// How long a caller waits for the answer beyond what the request itself waits.
    const TIMEOUT: Duration;
    /// The opcode this request travels with.
    fn opcode(&self) -> Opcode;
    /// The request body.
    fn encode(&self) -> Bytes;
}

/// `Consume` (2): a consume, pinned consume or replay, run by the partitions' owner.
impl Relay for ConsumeRequest {
    const TIMEOUT: Duration = DEFAULT_TIMEOUT;
    fn opcode(&self) -> Opcode {
        Opcode::Consume
    }
    fn encode(&self) -> Bytes {
        json_body(self)
    }
}

/// How an opcode's reply is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Read as the named type ([`Call::decode`]).
    Typed(&'static str),
    /// The HTTP answer itself: the forwarding node returns it to its client 1:1
    /// ([`Relay`]).
    Http,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub op: Opcode,
    /// The request body's type (`wire`).
    pub request: &'static str,
    pub reply: Reply,
    /// The default wait (`Call::TIMEOUT` for typed calls).
    pub timeout: Duration,
    /// The opcode a caller uses instead when the peer answers this one as unsupported.
    pub fallback: Option<Opcode>,
    /// Whether this build serves it (a number may be reserved and never served).
    pub served: bool,
}

const fn row(op: Opcode, request: &'static str, reply: Reply, timeout: Duration) -> Row {
    Row {
        op,
        request,
        reply,
        timeout,
        fallback: None,
        served: true,
    }
}

const PROPOSE: &str = "ProposeRequest";
const PROPOSED: Reply = Reply::Typed("ProposeReply");
const FORWARD: Duration = super::FORWARD_TIMEOUT;
const SETTLE: &str = "SettleOne";
/// Done: `2xx` without a body to read; refusals carry an error code.
const DONE: Reply = Reply::Typed("()");

/// Every opcode, in number order.
pub const TABLE: &[Row] = &[
    row(
        Opcode::Produce,
        "ForwardProduce",
        Reply::Typed("BatchProduceResponse"),
        COMMIT_TIMEOUT,
    ),
    row(
        Opcode::Consume,
        "ConsumeRequest",
        Reply::Http,
        DEFAULT_TIMEOUT,
    ),
    row(Opcode::Ack, SETTLE, DONE, DEFAULT_TIMEOUT),
    row(Opcode::CreateTopic, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::AlterTopic, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::DeleteTopic, PROPOSE, PROPOSED, FORWARD),
    Row {
        served: false,
        ..row(Opcode::PurgeTopic, "-", Reply::Typed("-"), DEFAULT_TIMEOUT)
    },
    row(
        Opcode::TopicPartitionStats,
        "StatsRequest",
        Reply::Typed("Vec<PartitionStats>"),
        DEFAULT_TIMEOUT,
    ),
    row(Opcode::RegisterMember, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::CommitProduce, "CommitOne", DONE, COMMIT_TIMEOUT),
    Row {
        fallback: Some(Opcode::CommitProduce),
        ..row(
            Opcode::CommitProduceBatch,
            "CommitBatch",
            DONE,
            COMMIT_TIMEOUT,
        )
    },
    row(Opcode::CreateUser, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::UpdateUser, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::DeleteUser, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::AttachChild, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::DetachChild, PROPOSE, PROPOSED, FORWARD),
    row(
        Opcode::FanoutCursors,
        "CursorLags",
        Reply::Typed("BTreeMap<String, BTreeMap<u32, u64>>"),
        DEFAULT_TIMEOUT,
    ),
    row(Opcode::ExtendAck, SETTLE, DONE, DEFAULT_TIMEOUT),
    row(Opcode::Nack, SETTLE, DONE, DEFAULT_TIMEOUT),
    row(
        Opcode::GetTopic,
        "GetTopicRequest",
        Reply::Typed("GetTopicReply"),
        DEFAULT_TIMEOUT,
    ),
    row(
        Opcode::JoinCluster,
        "JoinRequest",
        Reply::Typed("JoinReply"),
        Duration::from_secs(30),
    ),
    row(
        Opcode::ListPartitionSegments,
        "PartitionRef",
        Reply::Typed("SegmentList"),
        DEFAULT_TIMEOUT,
    ),
    row(
        Opcode::FetchSegmentChunk,
        "ChunkRequest",
        Reply::Typed("Bytes"),
        Duration::from_secs(30),
    ),
    row(
        Opcode::PrepareHandoff,
        "HandoffRequest",
        Reply::Typed("HandoffReply"),
        DEFAULT_TIMEOUT,
    ),
    row(Opcode::DecommissionMember, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::CompleteMove, PROPOSE, PROPOSED, FORWARD),
    row(Opcode::AbortMove, PROPOSE, PROPOSED, FORWARD),
    row(
        Opcode::GetAssignment,
        "AssignmentRequest",
        Reply::Typed("AssignmentReply"),
        DEFAULT_TIMEOUT,
    ),
    row(Opcode::AttachRemoteChild, PROPOSE, PROPOSED, FORWARD),
    Row {
        served: false,
        ..row(
            Opcode::ConsumeBatch,
            "-",
            Reply::Typed("-"),
            DEFAULT_TIMEOUT,
        )
    },
    Row {
        fallback: Some(Opcode::Ack),
        ..row(
            Opcode::AckBatch,
            "SettleBatch",
            Reply::Typed("BatchAckResponse"),
            DEFAULT_TIMEOUT,
        )
    },
    row(
        Opcode::TransferLeadership,
        "TransferRequest",
        Reply::Typed("()"),
        super::HANDOFF_RETRY,
    ),
    row(
        Opcode::RemoteLinkStates,
        "RemoteLinkStates",
        Reply::Typed("BTreeMap<String, RemoteLinkState>"),
        DEFAULT_TIMEOUT,
    ),
    row(
        Opcode::RepositionPartitions,
        "RepositionRequest",
        Reply::Typed("Vec<RepositionOutcome>"),
        DEFAULT_TIMEOUT,
    ),
    row(
        Opcode::SettleWith,
        "SettleBatch",
        Reply::Typed("BatchAckResponse"),
        DEFAULT_TIMEOUT,
    ),
    row(
        Opcode::CommitProduceBatchAttrs,
        "CommitBatch",
        DONE,
        COMMIT_TIMEOUT,
    ),
    row(
        Opcode::ProduceAttrs,
        "ForwardProduce",
        Reply::Typed("BatchProduceResponse"),
        COMMIT_TIMEOUT,
    ),
];

/// The row of `op`.
pub fn row_of(op: Opcode) -> &'static Row {
    &TABLE[usize::from(op.code()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::wire::SettleKind;
    use narad_meta::MetaCommand;

    #[test]
    fn the_table_has_every_opcode_once_in_number_order_and_fallbacks_are_older() {
        assert_eq!(TABLE.len(), Opcode::ALL.len());
        for (row, op) in TABLE.iter().zip(Opcode::ALL) {
            assert_eq!(row.op, op, "the table is in number order");
            assert_eq!(row_of(op).op, op);
            if let Some(f) = row.fallback {
                assert!(f.code() < op.code(), "{op} falls back to the newer {f}");
                assert!(row_of(f).served, "{op} falls back to the unserved {f}");
            }
        }
    }

    /// The name of a type as the table writes it (the path's last segment, generics kept).
    fn short<T: ?Sized>() -> String {
        let full = std::any::type_name::<T>();
        let mut out = String::new();
        let mut word = String::new();
        for c in full.chars() {
            if c.is_alphanumeric() || c == '_' || c == ':' {
                word.push(c);
            } else {
                out.push_str(word.rsplit("::").next().unwrap_or(""));
                word.clear();
                out.push(c);
            }
        }
        out.push_str(word.rsplit("::").next().unwrap_or(""));
        out
    }

    thread_local! {
        /// The opcodes the checks below saw, for the completeness check.
        static SEEN: std::cell::RefCell<std::collections::BTreeSet<u8>> = Default::default();
    }

    /// A typed call agrees with its row: request and reply types, timeout.
    fn agrees<C: Call>(req: &C) {
        SEEN.with(|s| s.borrow_mut().insert(req.opcode().code()));
        let row = row_of(req.opcode());
        assert!(row.served, "{}", req.opcode());
        assert_eq!(row.request, short::<C>(), "{}", req.opcode());
        assert_eq!(
            row.reply,
            Reply::Typed(Box::leak(short::<C::Reply>().into_boxed_str())),
            "{}",
            req.opcode()
        );
        assert_eq!(row.timeout, C::TIMEOUT, "{}", req.opcode());
    }

    #[test]
    fn every_typed_call_matches_its_row() {
        let cursors = || ChildCursorsRequest {
            parent_id: 1,
            parent: "p".into(),
        };
        agrees(&GetTopicRequest { name: None });
        agrees(&JoinRequest {
            id: "n".into(),
            cluster_addr: "a".into(),
            probe: true,
        });
        agrees(&AssignmentRequest {
            topic_id: None,
            partition: 0,
        });
        agrees(&PartitionRef {
            topic_id: 1,
            partition: 0,
        });
        agrees(&HandoffRequest {
            topic_id: 1,
            partition: 0,
            move_id: 1,
        });
        agrees(&StatsRequest {
            topic_id: 1,
            topic: "t".into(),
            partitions: vec![],
            min_index: None,
        });
        agrees(&RepositionRequest {
            topic_id: 1,
            topic: "t".into(),
            partitions: vec![0],
            to: crate::partition::Position::End,
        });
        agrees(&CursorLags(cursors()));
        agrees(&RemoteLinkStates(cursors()));
        agrees(&TransferRequest { last_index: 1 });
        agrees(&ChunkRequest {
            topic_id: 1,
            partition: 0,
            base: 0,
            pos: 0,
            len: 1,
        });
        agrees(&ProposeRequest {
            command: MetaCommand::DeleteUser {
                username: "u".into(),
            },
        });
        agrees(&ForwardProduce {
            topic_id: 1,
            records: vec![],
        });
        let attrs = Some(Bytes::from_static(&[1, b'a', 0, 0]));
        agrees(&ForwardProduce {
            topic_id: 1,
            records: vec![crate::cluster::wire::ForwardRecord {
                partition: 0,
                pinned: false,
                key: None,
                payload: Bytes::from_static(b"p"),
                attrs: attrs.clone(),
            }],
        });
        let commit = || CommitBatch {
            topic_id: 1,
            partition: 0,
            records: vec![],
        };
        agrees(&commit());
        agrees(&CommitBatch {
            records: vec![crate::cluster::wire::CommitRecord {
                key: None,
                payload: Bytes::from_static(b"p"),
                attrs,
            }],
            ..commit()
        });
        agrees(&CommitOne(commit()));
        let settle = |how| SettleRequest::new(1, "t".into(), how, vec![]);
        for how in [
            SettleKind::Ack,
            SettleKind::Extend,
            SettleKind::Nack,
            SettleKind::Release,
        ] {
            agrees(&SettleOne(settle(how)));
        }
        agrees(&SettleBatch(settle(SettleKind::Ack)));
        agrees(&SettleBatch(settle(SettleKind::Delay(30_000))));
        agrees(&SettleBatch(settle(SettleKind::ExtendFor(60_000))));
        relays(&ConsumeRequest {
            topic_id: 1,
            topic: "t".into(),
            partition: None,
            offset: None,
            max: None,
            wait_ms: 0,
        });
        // Every served opcode has its typed call or relay (a proposal's opcode is its
        // command's, checked below), so no caller builds a body by hand.
        let seen = SEEN.with(|s| s.borrow().clone());
        for row in TABLE.iter().filter(|r| r.served && r.request != PROPOSE) {
            assert!(
                seen.contains(&row.op.code()),
                "{} has no typed call",
                row.op
            );
        }
        for row in TABLE.iter().filter(|r| !r.served) {
            assert_eq!(
                (row.request, row.reply),
                ("-", Reply::Typed("-")),
                "{}",
                row.op
            );
        }
    }

    /// A relayed call agrees with its row: request type, an HTTP reply, timeout.
    fn relays<R: Relay>(req: &R) {
        SEEN.with(|s| s.borrow_mut().insert(req.opcode().code()));
        let row = row_of(req.opcode());
        assert!(row.served, "{}", req.opcode());
        assert_eq!(row.request, short::<R>(), "{}", req.opcode());
        assert_eq!(row.reply, Reply::Http, "{}", req.opcode());
        assert_eq!(row.timeout, R::TIMEOUT, "{}", req.opcode());
    }

    #[test]
    fn every_forwardable_command_travels_with_a_propose_row() {
        for row in TABLE.iter().filter(|r| r.request == PROPOSE) {
            assert_eq!(row.reply, PROPOSED, "{}", row.op);
            assert_eq!(row.timeout, FORWARD, "{}", row.op);
        }
    }
}
