//! The cluster-port wire format (SPEC §6.6): frames, frame types, opcodes, request and reply
//! payloads. Pure encoding and decoding plus two small async helpers; no connection state.
//!
//! # Frame
//!
//! | offset | size | field | notes |
//! |---|---|---|---|
//! | 0 | 4 | magic | ASCII `NRD1` |
//! | 4 | 1 | protocol version | [`PROTOCOL_VERSION`] (= 1); any other value is a protocol error |
//! | 5 | 1 | frame type | [`FrameType`] |
//! | 6 | 8 | request id | u64 big-endian; `0` for connection-level frames (auth, connection errors) |
//! | 14 | 4 | payload length | u32 big-endian, ≤ [`MAX_PAYLOAD`] (16 MiB); larger → protocol error, connection closed |
//! | 18 | n | payload | depends on the frame type |
//!
//! # Payloads
//!
//! | frame type | direction | payload |
//! |---|---|---|
//! | 1 AuthChallenge | server → client | 32-byte nonce ‖ server node id (UTF-8, rest of payload) |
//! | 2 AuthResponse | client → server | u16 node-id length ‖ node id (UTF-8) ‖ 32-byte HMAC-SHA256 proof |
//! | 3 AuthOk | server → client | empty: the proof was accepted |
//! | 4 Error | either | UTF-8 message. Request id 0: the connection is about to close; otherwise the request with that id failed below the RPC layer |
//! | 5 Ping | either | opaque (≤ 64 bytes by convention), echoed by Pong |
//! | 6 Pong | either | the Ping's payload, same request id |
//! | 7 Request | client → server | opcode u8 ‖ opcode body |
//! | 8 Reply | server → client | status u16 ‖ u16 content-type length ‖ content type (UTF-8) ‖ body (rest) |
//! | 9 Raft | client → server | a Raft RPC (see `raft_net`: JSON of `narad_meta::RaftRequest`) |
//! | 10 RaftReply | server → client | the Raft RPC's answer (JSON of `narad_meta::RaftReply`) |
//!
//! A non-2xx `Reply` body is `{"error": message, "code": n}`: `n` is the stable
//! [`ErrorCode`] number (append-only like everything here). Builds before codes sent the
//! same body without `"code"`; a receiver reads such a reply by its status alone.
//!
//! Frame-type numbers and opcodes are append-only: never renumbered, never reused.

use std::fmt;
use std::io;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{ApiError, ErrorCode};

/// The 4-byte magic every frame starts with.
pub const MAGIC: [u8; 4] = *b"NRD1";
/// The only protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;
/// Bytes before the payload: magic, version, type, request id, length.
pub const HEADER_LEN: usize = 4 + 1 + 1 + 8 + 4;
/// Largest payload of one frame (SPEC §11: frame ≤ 16 MiB).
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// What a frame carries. Stable numbers, append-only.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameType {
    /// Server → client on connect: nonce and the server's node id.
    AuthChallenge = 1,
    /// Client → server: its node id and the HMAC proof.
    AuthResponse = 2,
    /// Server → client: the proof was accepted; requests may flow.
    AuthOk = 3,
    /// A failure below the RPC layer (request id 0: the whole connection, about to close).
    Error = 4,
    /// Liveness probe; answered by a `Pong` with the same id and payload.
    Ping = 5,
    /// Answer to a `Ping`.
    Pong = 6,
    /// An RPC request: opcode and body.
    Request = 7,
    /// An RPC reply: status, content type, body.
    Reply = 8,
    /// A Raft RPC to the receiving node's metadata Raft.
    Raft = 9,
    /// The answer to a `Raft` frame.
    RaftReply = 10,
}

impl FrameType {
    pub fn from_u8(v: u8) -> Option<FrameType> {
        Some(match v {
            1 => FrameType::AuthChallenge,
            2 => FrameType::AuthResponse,
            3 => FrameType::AuthOk,
            4 => FrameType::Error,
            5 => FrameType::Ping,
            6 => FrameType::Pong,
            7 => FrameType::Request,
            8 => FrameType::Reply,
            9 => FrameType::Raft,
            10 => FrameType::RaftReply,
            _ => return None,
        })
    }
}

/// Why bytes on the cluster port could not be read as a frame. Every variant closes the
/// connection (the stream can no longer be trusted to be in sync), except where noted.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("bad frame magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// The payload was consumed, so the stream is still in sync; the receiver may answer an
    /// `Error` frame for `request_id` and go on.
    #[error("unknown frame type {kind}")]
    UnknownFrameType { kind: u8, request_id: u64 },
    #[error("frame payload of {0} bytes exceeds the 16 MiB limit")]
    Oversize(u64),
    /// Larger than this reader accepts now (a server before the handshake completed).
    #[error("frame payload of {len} bytes exceeds the {max} bytes accepted here")]
    OverLimit { len: u64, max: usize },
    /// The stream ended inside a frame.
    #[error("truncated frame")]
    Truncated,
    /// A payload that does not parse for its frame type.
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

/// One frame.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameType,
    pub request_id: u64,
    pub payload: Bytes,
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the payload: it may be an auth proof or a message body.
        f.debug_struct("Frame")
            .field("kind", &self.kind)
            .field("request_id", &self.request_id)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub request_id: u64,
    pub len: usize,
}

impl Frame {
    pub fn new(kind: FrameType, request_id: u64, payload: impl Into<Bytes>) -> Frame {
        Frame {
            kind,
            request_id,
            payload: payload.into(),
        }
    }

    /// A connection-level or per-request `Error` frame.
    pub fn error(request_id: u64, message: &str) -> Frame {
        Frame::new(
            FrameType::Error,
            request_id,
            Bytes::copy_from_slice(message.as_bytes()),
        )
    }

    /// Appends the encoded frame to `buf`. Fails (writing nothing) if the payload is too big.
    pub fn encode_into(&self, buf: &mut BytesMut) -> Result<(), ProtoError> {
        if self.payload.len() > MAX_PAYLOAD {
            return Err(ProtoError::Oversize(self.payload.len() as u64));
        }
        buf.reserve(HEADER_LEN + self.payload.len());
        buf.put_slice(&MAGIC);
        buf.put_u8(PROTOCOL_VERSION);
        buf.put_u8(self.kind as u8);
        buf.put_u64(self.request_id);
        buf.put_u32(self.payload.len() as u32);
        buf.put_slice(&self.payload);
        Ok(())
    }

    pub fn encode(&self) -> Result<Bytes, ProtoError> {
        let mut buf = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        self.encode_into(&mut buf)?;
        Ok(buf.freeze())
    }

    /// Decodes one frame from the front of `buf`, consuming it. `Ok(None)`: more bytes are
    /// needed (nothing consumed). Header errors are reported as soon as the header is complete,
    /// before waiting for (or allocating) the payload.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, ProtoError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let header = parse_header(buf[..HEADER_LEN].try_into().expect("header length"))?;
        if buf.len() < HEADER_LEN + header.len {
            return Ok(None);
        }
        buf.advance(HEADER_LEN);
        let payload = buf.split_to(header.len).freeze();
        finish(header, payload).map(Some)
    }
}

/// Validates magic, version and length of an 18-byte header.
pub fn parse_header(h: &[u8; HEADER_LEN]) -> Result<Header, ProtoError> {
    let magic: [u8; 4] = h[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(ProtoError::BadMagic(magic));
    }
    if h[4] != PROTOCOL_VERSION {
        return Err(ProtoError::BadVersion(h[4]));
    }
    let kind = h[5];
    let request_id = u64::from_be_bytes(h[6..14].try_into().expect("8 bytes"));
    let len = u32::from_be_bytes(h[14..18].try_into().expect("4 bytes"));
    if len as usize > MAX_PAYLOAD {
        return Err(ProtoError::Oversize(u64::from(len)));
    }
    Ok(Header {
        kind,
        request_id,
        len: len as usize,
    })
}

fn finish(header: Header, payload: Bytes) -> Result<Frame, ProtoError> {
    match FrameType::from_u8(header.kind) {
        Some(kind) => Ok(Frame {
            kind,
            request_id: header.request_id,
            payload,
        }),
        None => Err(ProtoError::UnknownFrameType {
            kind: header.kind,
            request_id: header.request_id,
        }),
    }
}

/// Largest payload a server accepts before the handshake has authenticated the client: the
/// `AuthResponse` (2 + 255 + 32 bytes) with room to spare. Anything larger closes the
/// connection before a byte of it is buffered.
pub const MAX_HANDSHAKE_PAYLOAD: usize = 1024;
/// Bytes the reader asks the stream for at most per read: a frame's buffer grows with the
/// bytes that arrived, never with the length its header announces.
const READ_CHUNK: usize = 64 * 1024;

/// Reads frames from a byte stream through a buffer. [`FrameReader::next`] is cancel-safe
/// (it can sit in a `select!`): partial frames stay in the buffer.
///
/// Memory: the buffer starts small and grows as bytes arrive (at most about twice what was
/// received for the frame in progress), so an announced length costs nothing until the bytes
/// are sent. [`FrameReader::set_max_payload`] lowers the accepted frame size (a server keeps it
/// at [`MAX_HANDSHAKE_PAYLOAD`] until the client has proved the secret).
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max_payload: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader accepting frames up to [`MAX_PAYLOAD`].
    pub fn new(inner: R) -> FrameReader<R> {
        FrameReader::with_max_payload(inner, MAX_PAYLOAD)
    }

    /// A reader accepting payloads up to `max_payload` (≤ [`MAX_PAYLOAD`]) bytes; larger ones
    /// are [`ProtoError::OverLimit`] as soon as their header is in.
    pub fn with_max_payload(inner: R, max_payload: usize) -> FrameReader<R> {
        FrameReader {
            inner,
            buf: BytesMut::new(),
            max_payload: max_payload.min(MAX_PAYLOAD),
        }
    }

    pub fn set_max_payload(&mut self, max_payload: usize) {
        self.max_payload = max_payload.min(MAX_PAYLOAD);
    }

    /// The next frame. `Ok(None)`: clean end of stream at a frame boundary; end of stream
    /// inside a frame is [`ProtoError::Truncated`]. Header errors (bad magic, version,
    /// oversize) are reported as soon as the 18 header bytes are in, before the payload.
    pub async fn next(&mut self) -> Result<Option<Frame>, ProtoError> {
        loop {
            let want = if self.buf.len() >= HEADER_LEN {
                let header = parse_header(self.buf[..HEADER_LEN].try_into().expect("header"))?;
                if header.len > self.max_payload {
                    return Err(ProtoError::OverLimit {
                        len: header.len as u64,
                        max: self.max_payload,
                    });
                }
                if let Some(frame) = Frame::decode(&mut self.buf)? {
                    return Ok(Some(frame));
                }
                HEADER_LEN + header.len - self.buf.len()
            } else {
                HEADER_LEN - self.buf.len()
            };
            // At least the header, at most one chunk beyond what is buffered: growth follows
            // arrival. (Reading past the frame is fine: the rest stays for the next one.)
            self.buf.reserve(want.clamp(HEADER_LEN, READ_CHUNK));
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ProtoError::Truncated)
                };
            }
        }
    }

    /// Bytes the read buffer holds room for (tests: memory follows arrival).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Reads one frame from an unbuffered stream (bytes past the frame may be consumed: use a
/// [`FrameReader`] for a stream of frames).
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, ProtoError> {
    FrameReader::new(r).next().await
}

/// Writes one frame (no flush).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &Frame,
) -> Result<(), ProtoError> {
    let bytes = frame.encode()?;
    w.write_all(&bytes).await?;
    Ok(())
}

/// The node RPC operations (SPEC §6.6). **Append-only**: a number is never reused and an
/// opcode's body never changes meaning; a new shape of an operation gets a new opcode. A node
/// that does not know an opcode answers `400` `unsupported rpc operation <n>`
/// ([`RpcReply::unsupported`]), which callers read as "peer too old".
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Opcode {
    /// Store produced records in the receiving node's ingress WAL: a draining node's produce,
    /// handed to a live node (SPEC §6.5; `cluster::wire::ForwardProduce`).
    Produce = 1,
    /// Consume from partitions the receiving node owns (forwarded or probing consume).
    Consume = 2,
    /// Ack a receipt handle at the partition owner.
    Ack = 3,
    /// Create a topic (metadata write, sent to the Raft leader).
    CreateTopic = 4,
    /// Alter a topic (metadata write, sent to the leader).
    AlterTopic = 5,
    /// Delete a topic (metadata write, sent to the leader).
    DeleteTopic = 6,
    /// Purge a topic's messages.
    PurgeTopic = 7,
    /// Stats of the partitions the receiving node owns.
    TopicPartitionStats = 8,
    /// Member heartbeat / registration (sent to the leader).
    RegisterMember = 9,
    /// Commit one WAL record into a partition the receiving node owns (dispatcher; 30 s).
    CommitProduce = 10,
    /// Commit a batch of WAL records into one owned partition (dispatcher; 30 s).
    CommitProduceBatch = 11,
    /// Create a user (metadata write, sent to the leader).
    CreateUser = 12,
    /// Update a user's password or grants (sent to the leader).
    UpdateUser = 13,
    /// Delete a user (sent to the leader).
    DeleteUser = 14,
    /// Attach a child topic (sent to the leader).
    AttachChild = 15,
    /// Detach a child topic (sent to the leader).
    DetachChild = 16,
    /// Fan-out cursor state of partitions the receiving node owns.
    FanoutCursors = 17,
    /// Extend a lease at the partition owner.
    ExtendAck = 18,
    /// Nack (release) a lease at the partition owner.
    Nack = 19,
    /// Read a topic as the leader sees it (catch-up before a `404`).
    GetTopic = 20,
    /// Ask the leader to admit a node as a voter (join-only start).
    JoinCluster = 21,
    /// List a partition's segments (move / rebalance copy).
    ListPartitionSegments = 22,
    /// Fetch a chunk of a segment file (move / rebalance copy).
    FetchSegmentChunk = 23,
    /// Ask the owner to freeze a partition before the final copy of a move.
    PrepareHandoff = 24,
    /// Mark a member draining (sent to the leader).
    DecommissionMember = 25,
    /// Compare-and-swap flip `owner := target` (sent to the leader).
    CompleteMove = 26,
    /// Abandon a move (sent to the leader).
    AbortMove = 27,
    /// Read one partition's assignment as the leader sees it.
    GetAssignment = 28,
    /// Attach a remote (other cluster) child topic (sent to the leader).
    AttachRemoteChild = 29,
    /// Consume up to N messages at the partition owner.
    ConsumeBatch = 30,
    /// Ack several receipt handles at the partition owner.
    AckBatch = 31,
    /// The leader, shutting down, asks a caught-up voter to take over: it starts an election
    /// at once (Narad's extension of the registry).
    TransferLeadership = 32,
    /// `state` and `last_error` of the remote-child cursors the callee runs for a parent
    /// (Narad's extension of the registry).
    RemoteLinkStates = 33,
    /// Move the queue frontier of partitions the callee owns: a purge or a seek (Narad's
    /// extension of the registry).
    RepositionPartitions = 34,
    /// Settle receipt handles with a parameter (a nack with a delay, an extend with its own
    /// visibility timeout) at the partition owner; answered like `AckBatch` (Narad's
    /// extension of the registry).
    SettleWith = 35,
    /// `CommitProduceBatch` of records some of which carry attributes: the same encoding
    /// with each record's attribute block after its payload (Narad's extension of the
    /// registry). Never downgraded to `CommitProduceBatch`: a peer too old for it fails the
    /// commit, which is retried, rather than lose the attributes.
    CommitProduceBatchAttrs = 36,
    /// `Produce` of records some of which carry attributes (flag bit 1 of each record's
    /// flags byte, then the attribute block after the payload; Narad's extension of the
    /// registry).
    ProduceAttrs = 37,
}

impl Opcode {
    /// Every opcode, in numeric order.
    pub const ALL: [Opcode; 37] = [
        Opcode::Produce,
        Opcode::Consume,
        Opcode::Ack,
        Opcode::CreateTopic,
        Opcode::AlterTopic,
        Opcode::DeleteTopic,
        Opcode::PurgeTopic,
        Opcode::TopicPartitionStats,
        Opcode::RegisterMember,
        Opcode::CommitProduce,
        Opcode::CommitProduceBatch,
        Opcode::CreateUser,
        Opcode::UpdateUser,
        Opcode::DeleteUser,
        Opcode::AttachChild,
        Opcode::DetachChild,
        Opcode::FanoutCursors,
        Opcode::ExtendAck,
        Opcode::Nack,
        Opcode::GetTopic,
        Opcode::JoinCluster,
        Opcode::ListPartitionSegments,
        Opcode::FetchSegmentChunk,
        Opcode::PrepareHandoff,
        Opcode::DecommissionMember,
        Opcode::CompleteMove,
        Opcode::AbortMove,
        Opcode::GetAssignment,
        Opcode::AttachRemoteChild,
        Opcode::ConsumeBatch,
        Opcode::AckBatch,
        Opcode::TransferLeadership,
        Opcode::RemoteLinkStates,
        Opcode::RepositionPartitions,
        Opcode::SettleWith,
        Opcode::CommitProduceBatchAttrs,
        Opcode::ProduceAttrs,
    ];

    pub fn from_u8(v: u8) -> Option<Opcode> {
        match v {
            1..=37 => Some(Opcode::ALL[usize::from(v) - 1]),
            _ => None,
        }
    }

    /// The number on the wire.
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op as u8
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}({})", self, *self as u8)
    }
}

/// A `Request` payload: opcode byte then body.
pub fn encode_request(op: u8, body: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(1 + body.len());
    buf.put_u8(op);
    buf.put_slice(body);
    buf.freeze()
}

/// Splits a `Request` payload into opcode and body (zero-copy).
pub fn decode_request(mut payload: Bytes) -> Result<(u8, Bytes), ProtoError> {
    if payload.is_empty() {
        return Err(ProtoError::Malformed("request: no opcode"));
    }
    let op = payload.get_u8();
    Ok((op, payload))
}

/// `application/json`, the usual reply content type.
pub const JSON: &str = "application/json";

/// An RPC reply: an HTTP-vocabulary status, a content type and a body, so the forwarding node
/// can answer its HTTP client 1:1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcReply {
    pub status: u16,
    pub content_type: String,
    pub body: Bytes,
}

/// How an [`ApiError`] travels on the cluster port (the one mapping from a reply back to the
/// error, too).
impl ApiError {
    /// The error as a node-RPC reply: its status, and `{"error": message, "code": n}`.
    pub fn to_reply(&self) -> RpcReply {
        RpcReply::json(
            self.status().as_u16(),
            &WireError {
                error: self.message.clone(),
                code: Some(self.code.number()),
            },
        )
    }

    /// The error a non-2xx node-RPC reply carries: its code when the reply has one this build
    /// knows, else the generic code of its status (a peer of an older build sends none); the
    /// message of its `{"error": …}` body, else the raw body.
    pub fn from_reply(reply: &RpcReply) -> ApiError {
        let (message, number) = match serde_json::from_slice::<WireError>(&reply.body) {
            Ok(e) => (e.error, e.code),
            Err(_) => (String::from_utf8_lossy(&reply.body).into_owned(), None),
        };
        let code = number
            .and_then(ErrorCode::from_number)
            .unwrap_or_else(|| ErrorCode::for_status(reply.status));
        ApiError::new(code, message)
    }
}

/// The error body on the cluster port: the HTTP API's `{"error": …}` plus the code (absent in
/// replies of builds that predate codes; ignored by them).
#[derive(serde::Serialize, serde::Deserialize)]
struct WireError {
    error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
}

impl RpcReply {
    pub fn new(status: u16, content_type: impl Into<String>, body: impl Into<Bytes>) -> RpcReply {
        RpcReply {
            status,
            content_type: content_type.into(),
            body: body.into(),
        }
    }

    /// A JSON reply.
    pub fn json<T: serde::Serialize + ?Sized>(status: u16, value: &T) -> RpcReply {
        match serde_json::to_vec(value) {
            Ok(body) => RpcReply::new(status, JSON, body),
            Err(e) => RpcReply::fail(ErrorCode::Internal, format!("reply not serialisable: {e}")),
        }
    }

    /// An error reply: the code's status and `{"error": message, "code": n}`.
    pub fn fail(code: ErrorCode, message: impl Into<String>) -> RpcReply {
        ApiError::new(code, message).to_reply()
    }

    /// The message every node answers for an opcode it does not know.
    pub fn unsupported_message(op: u8) -> String {
        format!("unsupported rpc operation {op}")
    }

    /// `400` `{"error":"unsupported rpc operation <op>","code":21}`: what a node answers for
    /// an opcode it does not know (the caller's `RpcError::PeerTooOld`).
    pub fn unsupported(op: u8) -> RpcReply {
        RpcReply::fail(ErrorCode::RpcUnsupported, RpcReply::unsupported_message(op))
    }

    /// Whether this is the "unsupported rpc operation `op`" answer: by its code; from a build
    /// that predates codes, by the exact body those builds send for `op` (a frozen wire
    /// constant of that protocol, not a message read for meaning).
    pub fn is_unsupported(&self, op: u8) -> bool {
        if self.status != 400 {
            return false;
        }
        #[derive(serde::Deserialize)]
        struct E {
            error: String,
            code: Option<u16>,
        }
        match serde_json::from_slice::<E>(&self.body) {
            Ok(E { code: Some(n), .. }) => n == ErrorCode::RpcUnsupported.number(),
            Ok(E { error, code: None }) => error == RpcReply::unsupported_message(op),
            Err(_) => false,
        }
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The `Reply` payload. Fails if the content type is longer than 65535 bytes.
    pub fn encode(&self) -> Result<Bytes, ProtoError> {
        let ct = self.content_type.as_bytes();
        let ct_len = u16::try_from(ct.len())
            .map_err(|_| ProtoError::Malformed("reply: content type too long"))?;
        let mut buf = BytesMut::with_capacity(2 + 2 + ct.len() + self.body.len());
        buf.put_u16(self.status);
        buf.put_u16(ct_len);
        buf.put_slice(ct);
        buf.put_slice(&self.body);
        Ok(buf.freeze())
    }

    /// Parses a `Reply` payload (the body is zero-copy).
    pub fn decode(mut payload: Bytes) -> Result<RpcReply, ProtoError> {
        if payload.len() < 4 {
            return Err(ProtoError::Malformed("reply: short header"));
        }
        let status = payload.get_u16();
        let ct_len = usize::from(payload.get_u16());
        if payload.len() < ct_len {
            return Err(ProtoError::Malformed("reply: truncated content type"));
        }
        let ct = payload.split_to(ct_len);
        let content_type = std::str::from_utf8(&ct)
            .map_err(|_| ProtoError::Malformed("reply: content type not UTF-8"))?
            .to_owned();
        Ok(RpcReply {
            status,
            content_type,
            body: payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: FrameType, id: u64, payload: &[u8]) -> Frame {
        Frame::new(kind, id, Bytes::copy_from_slice(payload))
    }

    #[test]
    fn header_layout_is_big_endian_and_fixed() {
        let f = frame(FrameType::Request, 0x0102_0304_0506_0708, b"\x01xyz");
        let b = f.encode().unwrap();
        assert_eq!(&b[0..4], b"NRD1");
        assert_eq!(b[4], 1);
        assert_eq!(b[5], 7);
        assert_eq!(&b[6..14], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[14..18], &[0, 0, 0, 4]);
        assert_eq!(&b[18..], b"\x01xyz");
        assert_eq!(b.len(), HEADER_LEN + 4);
    }

    #[test]
    fn frame_type_numbers_are_stable() {
        let expected = [
            (FrameType::AuthChallenge, 1),
            (FrameType::AuthResponse, 2),
            (FrameType::AuthOk, 3),
            (FrameType::Error, 4),
            (FrameType::Ping, 5),
            (FrameType::Pong, 6),
            (FrameType::Request, 7),
            (FrameType::Reply, 8),
            (FrameType::Raft, 9),
            (FrameType::RaftReply, 10),
        ];
        for (t, n) in expected {
            assert_eq!(t as u8, n);
            assert_eq!(FrameType::from_u8(n), Some(t));
        }
        assert_eq!(FrameType::from_u8(0), None);
        assert_eq!(FrameType::from_u8(11), None);
    }

    #[test]
    fn opcode_registry_matches_the_spec() {
        let spec = "1 Produce, 2 Consume, 3 Ack, 4 CreateTopic, 5 AlterTopic, 6 DeleteTopic, \
            7 PurgeTopic, 8 TopicPartitionStats, 9 RegisterMember, 10 CommitProduce, \
            11 CommitProduceBatch, 12 CreateUser, 13 UpdateUser, 14 DeleteUser, 15 AttachChild, \
            16 DetachChild, 17 FanoutCursors, 18 ExtendAck, 19 Nack, 20 GetTopic, \
            21 JoinCluster, 22 ListPartitionSegments, 23 FetchSegmentChunk, 24 PrepareHandoff, \
            25 DecommissionMember, 26 CompleteMove, 27 AbortMove, 28 GetAssignment, \
            29 AttachRemoteChild, 30 ConsumeBatch, 31 AckBatch, 32 TransferLeadership, 33 RemoteLinkStates, \
            34 RepositionPartitions, 35 SettleWith, 36 CommitProduceBatchAttrs, 37 ProduceAttrs";
        let entries: Vec<(u8, &str)> = spec
            .split(',')
            .map(|e| {
                let (n, name) = e.trim().split_once(' ').unwrap();
                (n.parse().unwrap(), name)
            })
            .collect();
        assert_eq!(entries.len(), Opcode::ALL.len());
        for (n, name) in entries {
            let op = Opcode::from_u8(n).unwrap();
            assert_eq!(op as u8, n);
            assert_eq!(format!("{op:?}"), name);
            assert_eq!(op.to_string(), format!("{name}({n})"));
        }
        assert_eq!(Opcode::from_u8(0), None);
        assert_eq!(Opcode::from_u8(38), None);
        assert_eq!(Opcode::from_u8(255), None);
    }

    #[test]
    fn round_trips_every_type_and_sizes() {
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        for (i, n) in (1..=10u8).enumerate() {
            let kind = FrameType::from_u8(n).unwrap();
            let payload: Vec<u8> = (0..(i * 37)).map(|b| b as u8).collect();
            let f = frame(kind, u64::MAX - i as u64, &payload);
            f.encode_into(&mut buf).unwrap();
            frames.push(f);
        }
        // An empty payload and one at exactly the limit.
        let max = Frame::new(FrameType::Request, 7, vec![0xAB; MAX_PAYLOAD]);
        max.encode_into(&mut buf).unwrap();
        frames.push(max);
        let empty = frame(FrameType::AuthOk, 0, b"");
        empty.encode_into(&mut buf).unwrap();
        frames.push(empty);
        for f in frames {
            assert_eq!(Frame::decode(&mut buf).unwrap(), Some(f));
        }
        assert!(buf.is_empty());
        assert_eq!(Frame::decode(&mut buf).unwrap(), None);
    }

    #[test]
    fn truncated_frames_wait_for_more_bytes() {
        let f = frame(FrameType::Reply, 42, b"hello world");
        let full = f.encode().unwrap();
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert_eq!(Frame::decode(&mut buf).unwrap(), None, "cut at {cut}");
            assert_eq!(buf.len(), cut, "nothing consumed at {cut}");
        }
        let mut buf = BytesMut::from(&full[..]);
        assert_eq!(Frame::decode(&mut buf).unwrap(), Some(f));
    }

    #[tokio::test]
    async fn async_reader_distinguishes_clean_eof_from_truncation() {
        let f = frame(FrameType::Request, 9, b"\x04{}");
        let full = f.encode().unwrap();
        let mut r: &[u8] = &full;
        assert_eq!(read_frame(&mut r).await.unwrap(), Some(f));
        assert!(read_frame(&mut r).await.unwrap().is_none());
        for cut in 1..full.len() {
            let mut r: &[u8] = &full[..cut];
            assert!(
                matches!(read_frame(&mut r).await, Err(ProtoError::Truncated)),
                "cut at {cut}"
            );
        }
    }

    #[tokio::test]
    async fn bad_magic_version_and_oversize_are_refused() {
        let good = frame(FrameType::Ping, 1, b"p").encode().unwrap();

        let mut bad = BytesMut::from(&good[..]);
        bad[0] = b'X';
        assert!(matches!(Frame::decode(&mut bad), Err(ProtoError::BadMagic(m)) if &m == b"XRD1"));
        let mut r: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";
        assert!(matches!(
            read_frame(&mut r).await,
            Err(ProtoError::BadMagic(_))
        ));

        let mut bad = BytesMut::from(&good[..]);
        bad[4] = 2;
        assert!(matches!(
            Frame::decode(&mut bad),
            Err(ProtoError::BadVersion(2))
        ));

        // Oversize is refused from the header alone: no payload needed, nothing allocated.
        let mut h = BytesMut::from(&good[..HEADER_LEN]);
        h[14..18].copy_from_slice(&((MAX_PAYLOAD as u32) + 1).to_be_bytes());
        assert!(matches!(
            Frame::decode(&mut h.clone()),
            Err(ProtoError::Oversize(n)) if n == MAX_PAYLOAD as u64 + 1
        ));
        let mut r: &[u8] = &h;
        assert!(matches!(
            read_frame(&mut r).await,
            Err(ProtoError::Oversize(_))
        ));
        h[14..18].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Frame::decode(&mut h),
            Err(ProtoError::Oversize(_))
        ));

        // And never encoded.
        let big = Frame::new(FrameType::Request, 1, vec![0u8; MAX_PAYLOAD + 1]);
        assert!(matches!(big.encode(), Err(ProtoError::Oversize(_))));
        let mut buf = BytesMut::new();
        assert!(big.encode_into(&mut buf).is_err());
        assert!(buf.is_empty());
    }

    #[test]
    fn unknown_frame_type_consumes_the_frame_and_keeps_sync() {
        let mut buf = BytesMut::new();
        frame(FrameType::Ping, 5, b"a")
            .encode_into(&mut buf)
            .unwrap();
        buf[5] = 200;
        frame(FrameType::Ping, 6, b"b")
            .encode_into(&mut buf)
            .unwrap();
        assert!(matches!(
            Frame::decode(&mut buf),
            Err(ProtoError::UnknownFrameType {
                kind: 200,
                request_id: 5
            })
        ));
        assert_eq!(
            Frame::decode(&mut buf).unwrap(),
            Some(frame(FrameType::Ping, 6, b"b"))
        );
    }

    #[test]
    fn request_payload_round_trip() {
        let p = encode_request(Opcode::CommitProduceBatch.into(), b"{\"x\":1}");
        assert_eq!(p[0], 11);
        let (op, body) = decode_request(p).unwrap();
        assert_eq!((op, &body[..]), (11, &b"{\"x\":1}"[..]));
        let (op, body) = decode_request(Bytes::from_static(&[31])).unwrap();
        assert_eq!((op, body.len()), (31, 0));
        assert!(decode_request(Bytes::new()).is_err());
    }

    #[test]
    fn reply_payload_round_trip_and_truncation() {
        let r = RpcReply::new(202, "application/octet-stream", &b"\x00\x01binary"[..]);
        let enc = r.encode().unwrap();
        assert_eq!(&enc[0..2], &202u16.to_be_bytes());
        assert_eq!(&enc[2..4], &24u16.to_be_bytes());
        assert_eq!(RpcReply::decode(enc.clone()).unwrap(), r);
        for cut in 0..(4 + 24) {
            assert!(RpcReply::decode(enc.slice(..cut)).is_err(), "cut at {cut}");
        }
        // Empty content type and body.
        let r = RpcReply::new(204, "", Bytes::new());
        assert_eq!(RpcReply::decode(r.encode().unwrap()).unwrap(), r);
        let mut bad = BytesMut::from(&RpcReply::new(200, "ab", Bytes::new()).encode().unwrap()[..]);
        bad[4] = 0xff;
        assert!(RpcReply::decode(bad.freeze()).is_err());
        let long = RpcReply::new(200, "x".repeat(70_000), Bytes::new());
        assert!(long.encode().is_err());
    }

    #[test]
    fn unsupported_reply_shape() {
        let r = RpcReply::unsupported(42);
        assert_eq!(r.status, 400);
        assert_eq!(r.content_type, JSON);
        assert_eq!(
            &r.body[..],
            br#"{"error":"unsupported rpc operation 42","code":21}"#
        );
        assert!(r.is_unsupported(42));
        assert!(
            !RpcReply::fail(ErrorCode::NotFound, "unsupported rpc operation 42").is_unsupported(42)
        );
        assert!(
            !RpcReply::fail(ErrorCode::BadRequest, "unsupported rpc operation 42")
                .is_unsupported(42)
        );
        // A build before error codes: the same answer without a code, for that opcode only.
        let old = |body: &'static [u8]| RpcReply::new(400, JSON, body);
        assert!(old(br#"{"error":"unsupported rpc operation 42"}"#).is_unsupported(42));
        assert!(!old(br#"{"error":"unsupported rpc operation 42"}"#).is_unsupported(41));
        assert!(!old(br#"{"error":"bad body"}"#).is_unsupported(42));
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::ReadBuf;

    fn frame_type() -> impl Strategy<Value = FrameType> {
        (1..=10u8).prop_map(|n| FrameType::from_u8(n).unwrap())
    }

    fn frame() -> impl Strategy<Value = Frame> {
        (frame_type(), any::<u64>(), vec(any::<u8>(), 0..300))
            .prop_map(|(kind, id, payload)| Frame::new(kind, id, payload))
    }

    fn header(kind: u8, id: u64, len: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = PROTOCOL_VERSION;
        h[5] = kind;
        h[6..14].copy_from_slice(&id.to_be_bytes());
        h[14..18].copy_from_slice(&len.to_be_bytes());
        h
    }

    /// Wire bytes: garbage, or garbage behind a well-formed header (any kind, any length).
    fn wire_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            vec(any::<u8>(), 0..128),
            (
                any::<u8>(),
                any::<u64>(),
                prop_oneof![0..64u32, any::<u32>()],
                vec(any::<u8>(), 0..128)
            )
                .prop_map(|(kind, id, len, rest)| {
                    let mut b = header(kind, id, len).to_vec();
                    b.extend(rest);
                    b
                }),
        ]
    }

    /// An in-memory stream that hands out its bytes in the given chunk sizes.
    struct Chunked {
        data: Vec<u8>,
        pos: usize,
        sizes: Vec<usize>,
        reads: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let size = this.sizes[this.reads % this.sizes.len()];
            this.reads += 1;
            let n = size.min(this.data.len() - this.pos).min(buf.remaining());
            buf.put_slice(&this.data[this.pos..this.pos + n]);
            this.pos += n;
            Poll::Ready(Ok(()))
        }
    }

    fn chunked(data: Vec<u8>, sizes: Vec<usize>) -> Chunked {
        Chunked {
            data,
            pos: 0,
            sizes,
            reads: 0,
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    proptest! {
        #[test]
        fn prop_frame_roundtrip(frames in vec(frame(), 1..6)) {
            let mut buf = BytesMut::new();
            for f in &frames {
                f.encode_into(&mut buf).unwrap();
            }
            for f in &frames {
                prop_assert_eq!(Frame::decode(&mut buf).unwrap(), Some(f.clone()));
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(Frame::decode(&mut buf).unwrap(), None);
        }

        /// Every strict prefix of a frame asks for more bytes and consumes nothing.
        #[test]
        fn prop_frame_truncated_needs_more(f in frame(), cut in any::<prop::sample::Index>()) {
            let full = f.encode().unwrap();
            let cut = cut.index(full.len());
            let mut buf = BytesMut::from(&full[..cut]);
            prop_assert_eq!(Frame::decode(&mut buf).unwrap(), None);
            prop_assert_eq!(&buf[..], &full[..cut]);
        }

        /// Arbitrary bytes: Ok(None) consumes nothing and allocates nothing, whatever length a
        /// header announces; a frame consumes exactly its header and payload.
        #[test]
        fn prop_frame_decode_never_panics(b in wire_bytes()) {
            let mut buf = BytesMut::from(&b[..]);
            loop {
                let (len, cap) = (buf.len(), buf.capacity());
                match Frame::decode(&mut buf) {
                    Ok(None) => {
                        prop_assert_eq!((buf.len(), buf.capacity()), (len, cap));
                        break;
                    }
                    Ok(Some(f)) => prop_assert_eq!(buf.len(), len - HEADER_LEN - f.payload.len()),
                    Err(ProtoError::UnknownFrameType { .. }) => prop_assert!(buf.len() < len),
                    Err(_) => break,
                }
            }
        }

        #[test]
        fn prop_parse_header_checks_every_field(h in prop_oneof![
            any::<[u8; HEADER_LEN]>(),
            (any::<u8>(), any::<u64>(), any::<u32>()).prop_map(|(k, id, len)| header(k, id, len)),
        ]) {
            let len = u32::from_be_bytes(h[14..18].try_into().unwrap());
            match parse_header(&h) {
                Ok(p) => {
                    prop_assert!(h[0..4] == MAGIC && h[4] == PROTOCOL_VERSION);
                    prop_assert!(p.len <= MAX_PAYLOAD);
                    prop_assert_eq!(p, Header {
                        kind: h[5],
                        request_id: u64::from_be_bytes(h[6..14].try_into().unwrap()),
                        len: len as usize,
                    });
                }
                Err(ProtoError::BadMagic(m)) => prop_assert!(m != MAGIC && m == h[0..4]),
                Err(ProtoError::BadVersion(v)) => prop_assert!(v != PROTOCOL_VERSION && h[0..4] == MAGIC),
                Err(ProtoError::Oversize(n)) => prop_assert!(n == len as u64 && n as usize > MAX_PAYLOAD),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }

        /// A stream of frames arrives in any chunking; the reader yields each frame once and
        /// then a clean end.
        #[test]
        fn prop_frame_reader_any_chunking(
            frames in vec(frame(), 0..5),
            sizes in vec(1..64usize, 1..8),
        ) {
            let mut wire = BytesMut::new();
            for f in &frames {
                f.encode_into(&mut wire).unwrap();
            }
            let got = block_on(async {
                let mut r = FrameReader::new(chunked(wire.to_vec(), sizes));
                let mut got = Vec::new();
                while let Some(f) = r.next().await.unwrap() {
                    got.push(f);
                }
                got
            });
            prop_assert_eq!(got, frames);
        }

        /// A header announcing up to 16 MiB with only a few bytes behind it: the stream ends
        /// as `Truncated`, and the buffer grew with what arrived, not with the announcement.
        #[test]
        fn prop_frame_reader_memory_follows_arrival(
            len in prop_oneof![1..4096u32, Just(MAX_PAYLOAD as u32)],
            sent in vec(any::<u8>(), 0..4096),
            sizes in vec(1..2048usize, 1..4),
        ) {
            let sent = &sent[..sent.len().min(len as usize - 1)];
            let mut wire = header(FrameType::Request as u8, 1, len).to_vec();
            wire.extend_from_slice(sent);
            let received = wire.len();
            let (res, cap) = block_on(async {
                let mut r = FrameReader::new(chunked(wire, sizes));
                let res = r.next().await;
                (res, r.buffer_capacity())
            });
            prop_assert!(matches!(res, Err(ProtoError::Truncated)), "{:?}", res);
            prop_assert!(cap <= 2 * (received + READ_CHUNK), "capacity {} for {} bytes", cap, received);
        }

        /// Over a reader's limit (a server before the handshake): refused from the header
        /// alone, before a byte of the payload is buffered.
        #[test]
        fn prop_frame_reader_limit_refuses_at_the_header(
            max in 0..=MAX_HANDSHAKE_PAYLOAD,
            over in prop_oneof![1..64u32, 1..=u32::MAX],
            sent in vec(any::<u8>(), 0..256),
            sizes in vec(1..64usize, 1..4),
        ) {
            let len = (max as u32).saturating_add(over);
            let mut wire = header(FrameType::AuthResponse as u8, 0, len).to_vec();
            wire.extend_from_slice(&sent);
            let (res, cap) = block_on(async {
                let mut r = FrameReader::with_max_payload(chunked(wire, sizes), max);
                let res = r.next().await;
                (res, r.buffer_capacity())
            });
            if len as usize > MAX_PAYLOAD {
                prop_assert!(matches!(res, Err(ProtoError::Oversize(_))), "{:?}", res);
            } else {
                prop_assert!(
                    matches!(res, Err(ProtoError::OverLimit { len: l, max: m }) if l == len as u64 && m == max),
                    "{:?}", res
                );
            }
            prop_assert!(cap <= 4 * HEADER_LEN, "capacity {}", cap);
        }

        #[test]
        fn prop_read_frame_arbitrary_stream(b in wire_bytes(), sizes in vec(1..32usize, 1..4)) {
            let res = block_on(async { read_frame(&mut chunked(b.clone(), sizes)).await });
            match res {
                Ok(None) => prop_assert!(b.is_empty()),
                Ok(Some(f)) => prop_assert_eq!(&f.encode().unwrap()[..], &b[..HEADER_LEN + f.payload.len()]),
                Err(_) => {}
            }
        }

        #[test]
        fn prop_request_roundtrip(op in any::<u8>(), body in vec(any::<u8>(), 0..128)) {
            let (o, b) = decode_request(encode_request(op, &body)).unwrap();
            prop_assert_eq!((o, &b[..]), (op, &body[..]));
        }

        #[test]
        fn prop_decode_request_arbitrary(b in vec(any::<u8>(), 0..64)) {
            match decode_request(Bytes::from(b.clone())) {
                Ok((op, body)) => prop_assert_eq!(encode_request(op, &body), Bytes::from(b)),
                Err(_) => prop_assert!(b.is_empty()),
            }
        }

        #[test]
        fn prop_reply_roundtrip(
            status in any::<u16>(),
            ct in prop_oneof![Just(JSON.to_string()), any::<String>()],
            body in vec(any::<u8>(), 0..128),
        ) {
            let r = RpcReply::new(status, ct, body);
            let enc = r.encode().unwrap();
            prop_assert_eq!(RpcReply::decode(enc.clone()).unwrap(), r.clone());
            // Cut inside the status, the length or the content type: an error, never a
            // shorter content type.
            for cut in 0..4 + r.content_type.len() {
                prop_assert!(RpcReply::decode(enc.slice(..cut)).is_err(), "cut at {}", cut);
            }
        }

        /// Arbitrary reply payloads decode or fail; what decodes re-encodes to the same bytes.
        #[test]
        fn prop_reply_decode_arbitrary(b in prop_oneof![
            vec(any::<u8>(), 0..64),
            (any::<u16>(), 0..40u16, vec(any::<u8>(), 0..48)).prop_map(|(s, l, rest)| {
                let mut b = s.to_be_bytes().to_vec();
                b.extend_from_slice(&l.to_be_bytes());
                b.extend(rest);
                b
            }),
        ]) {
            if let Ok(r) = RpcReply::decode(Bytes::from(b.clone())) {
                prop_assert_eq!(r.encode().unwrap(), Bytes::from(b));
            }
        }
    }
}
