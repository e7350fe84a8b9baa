//! The calling side: [`PeerClient`] (one remote node) and [`Peers`] (node id → client).
//!
//! A `PeerClient` connects lazily on the first call, runs the handshake, and multiplexes every
//! concurrent call over that one connection: a writer task drains a queue of frames onto the
//! socket, a reader task hands each reply to its caller through a map of request id →
//! oneshot. When the connection breaks, every caller waiting on it gets
//! [`RpcError::Disconnected`] and the next call reconnects (after a short back-off following a
//! failed connect, so a dead peer costs a fast error rather than a connect per call).
//!
//! While a connection is up, a keepalive pings it whenever it has been quiet for
//! [`PING_INTERVAL`]; no frame at all for [`DEAD_AFTER`] closes it, so a half-open TCP
//! connection (peer host gone) is noticed without waiting for the kernel.
//!
//! # Rolling upgrades: falling back to an older opcode
//!
//! A peer running an older build answers an opcode it does not know with
//! `400 unsupported rpc operation <n>`, surfaced as [`RpcError::PeerTooOld`]. The answer is
//! remembered for the life of the connection (a peer cannot change version without
//! reconnecting), so the next call with that opcode fails at once without a round trip.
//! The usual pattern: try the new operation, fall back to the older shape:
//!
//! ```no_run
//! # use bytes::Bytes;
//! # use narad::rpc::{Opcode, PeerClient, RpcError, COMMIT_TIMEOUT};
//! # async fn f(peer: &PeerClient, batch: Bytes, single: Bytes) -> Result<(), RpcError> {
//! // New peers take the whole batch; old ones only know the single-record commit.
//! let (used, reply) = peer
//!     .call_with_fallback(
//!         &[(Opcode::CommitProduceBatch, batch), (Opcode::CommitProduce, single)],
//!         COMMIT_TIMEOUT,
//!     )
//!     .await?;
//! # let _ = (used, reply); Ok(()) }
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::auth::{self, HANDSHAKE_TIMEOUT};
use super::proto::{
    encode_request, Frame, FrameReader, FrameType, ProtoError, RpcReply, MAX_PAYLOAD,
};
use super::transport::{self, ClusterAuth, ReadHalf, WriteHalf};

/// Default per-request timeout (SPEC §6.3, §11).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout for commits (`CommitProduce`, `CommitProduceBatch`) (SPEC §6.3, §11).
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout for a create forwarded to the leader (SPEC §11).
pub const FORWARDED_CREATE_TIMEOUT: Duration = Duration::from_secs(75);
/// A connection quiet for this long gets a ping.
pub const PING_INTERVAL: Duration = Duration::from_secs(1);
/// A connection that has received nothing for this long is closed.
pub const DEAD_AFTER: Duration = Duration::from_secs(10);
/// After a failed connect, calls fail fast with the same error for this long.
pub const RECONNECT_BACKOFF: Duration = Duration::from_millis(250);
/// After a refused handshake (wrong secret), calls fail fast for this long.
pub const AUTH_BACKOFF: Duration = Duration::from_secs(2);
/// Frames queued for a connection's writer.
const WRITE_QUEUE: usize = 1024;

/// Why a call produced no reply. A reply with a 4xx/5xx status is *not* an error: it is
/// `Ok(RpcReply)` and maps 1:1 to HTTP.
///
/// The variants say whether the peer may have acted on the request
/// ([`RpcError::outcome_unknown`]): `Unreachable`, `NotSent`, `Auth`, `Protocol` and
/// `PeerTooOld` are failures before the request was written to the connection (the peer never
/// saw it); `Timeout`, `Disconnected` and `BadReply` come after it was written (the peer may
/// have executed it). The HTTP answer for each is chosen in one place,
/// `cluster::rpc_error` (`503` for the first group, `502` for the second).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// Could not connect or complete the handshake, no connection within the timeout, or an
    /// unknown node: the peer did not get the request. Safe to retry or to go elsewhere.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// Connected, but the request was never written: the connection closed while it was
    /// queued, or the timeout passed while it waited in the write queue. Safe to retry.
    #[error("request not sent: {0}")]
    NotSent(String),
    /// The request was written; no reply within the timeout. The peer may have executed it.
    #[error("no reply within the timeout, the request was sent")]
    Timeout,
    /// The connection broke after the request was written. The peer may have executed it.
    #[error("connection lost with the request in flight: {0}")]
    Disconnected(String),
    /// The request was written and the answer could not be read (a malformed reply). The
    /// peer may have executed it.
    #[error("unreadable reply: {0}")]
    BadReply(String),
    /// The peer refused our handshake (wrong or missing cluster secret).
    #[error("cluster authentication failed: {0}")]
    Auth(String),
    /// Malformed handshake frames, a request over 16 MiB, or the peer refused to dispatch
    /// the request below the RPC layer (an `Error` frame for it, e.g. `raft not ready`).
    #[error("rpc protocol error: {0}")]
    Protocol(String),
    /// The peer answered `400 unsupported rpc operation <op>`: it runs an older build. Retry
    /// elsewhere, later, or with an older opcode.
    #[error("peer too old: unsupported rpc operation {op}")]
    PeerTooOld { op: u8 },
}

impl RpcError {
    /// Whether the peer may have executed the request: it was written to the connection and
    /// no usable reply came back (timeout, lost connection, unreadable reply).
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            RpcError::Timeout | RpcError::Disconnected(_) | RpcError::BadReply(_)
        )
    }
}

/// Where a call got to, so a timeout can tell "never written" from "written, no answer".
#[derive(Default)]
struct Progress(std::sync::atomic::AtomicU8);

impl Progress {
    const CONNECTING: u8 = 0;
    const QUEUED: u8 = 1;
    const WRITTEN: u8 = 2;

    fn set(&self, v: u8) {
        self.0.store(v, Ordering::Release);
    }
    fn written(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::WRITTEN
    }
    /// The error for a call whose timeout passed at this point.
    fn timed_out(&self, timeout: Duration) -> RpcError {
        match self.0.load(Ordering::Acquire) {
            Self::WRITTEN => RpcError::Timeout,
            Self::QUEUED => RpcError::NotSent(format!(
                "still queued for writing after {} ms",
                timeout.as_millis()
            )),
            _ => RpcError::Unreachable(format!("no connection within {} ms", timeout.as_millis())),
        }
    }
}

/// Where a test fault ([`RpcFault`]) breaks the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Just before the request would be written: it is never sent.
    BeforeSend,
    /// The request is written; when the peer's reply arrives it is dropped and the caller
    /// gets [`RpcError::Disconnected`], as if the connection broke while the reply was on its
    /// way. The peer has acted on the request by the time the caller hears of the failure.
    AfterSend,
}

/// A test-only fault (`NARAD_TEST_RPC_FAULT`, behind `NARAD_TEST_KNOBS`): break the `nth`
/// request (counted from 1, over every peer of the node) with opcode `op`, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcFault {
    pub point: FaultPoint,
    pub op: u8,
    pub nth: u64,
}

impl RpcFault {
    /// Parses `before:<op>:<n>` or `after:<op>:<n>`.
    pub fn parse(s: &str) -> Result<RpcFault, String> {
        let bad = || format!("expected before:<opcode>:<n> or after:<opcode>:<n>, got {s:?}");
        let mut it = s.trim().split(':');
        let (Some(point), Some(op), Some(nth), None) = (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(bad());
        };
        let point = match point {
            "before" => FaultPoint::BeforeSend,
            "after" => FaultPoint::AfterSend,
            _ => return Err(bad()),
        };
        let op = op.parse::<u8>().map_err(|_| bad())?;
        let nth = nth.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(bad)?;
        Ok(RpcFault { point, op, nth })
    }
}

/// The faults of one node and how many requests of each opcode its writers have reached.
#[derive(Debug, Default)]
struct Faults {
    plan: Vec<RpcFault>,
    seen: Mutex<HashMap<u8, u64>>,
}

impl Faults {
    /// Counts a request of `op` about to be written; the fault that fires on it, if any.
    fn on_request(&self, op: u8) -> Option<FaultPoint> {
        if self.plan.is_empty() {
            return None;
        }
        let n = {
            let mut seen = self.seen.lock();
            let n = seen.entry(op).or_insert(0);
            *n += 1;
            *n
        };
        self.plan
            .iter()
            .find(|f| f.op == op && f.nth == n)
            .map(|f| f.point)
    }
}

/// The client of one remote node. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct PeerClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    self_id: String,
    peer_id: String,
    auth: ClusterAuth,
    state: Mutex<State>,
    /// Serialises connection attempts (one connect at a time per peer). Held by the connect
    /// task, not the caller, so a caller giving up (short Raft timeouts) does not abort a
    /// connect that others will use.
    connecting: Arc<tokio::sync::Mutex<()>>,
    /// Test faults, shared by every client of the node ([`Peers::with_faults`]).
    faults: Arc<Faults>,
}

struct State {
    addr: String,
    conn: Option<Arc<Conn>>,
    last_failure: Option<(Instant, RpcError)>,
}

impl PeerClient {
    /// A client for node `peer_id` at `addr` (`host:port` of its cluster port), calling as
    /// `self_id`. Nothing connects until the first call. The challenge's node id must equal
    /// `peer_id` (an address now serving another node is refused as `Unreachable`); an empty
    /// `peer_id` accepts any node (e.g. a seed address whose id is not known yet).
    pub fn new(
        self_id: impl Into<String>,
        peer_id: impl Into<String>,
        addr: impl Into<String>,
        auth: impl Into<ClusterAuth>,
    ) -> PeerClient {
        PeerClient::with_faults(self_id, peer_id, addr, auth, Arc::default())
    }

    fn with_faults(
        self_id: impl Into<String>,
        peer_id: impl Into<String>,
        addr: impl Into<String>,
        auth: impl Into<ClusterAuth>,
        faults: Arc<Faults>,
    ) -> PeerClient {
        PeerClient {
            inner: Arc::new(ClientInner {
                self_id: self_id.into(),
                peer_id: peer_id.into(),
                auth: auth.into(),
                state: Mutex::new(State {
                    addr: addr.into(),
                    conn: None,
                    last_failure: None,
                }),
                connecting: Arc::new(tokio::sync::Mutex::new(())),
                faults,
            }),
        }
    }

    pub fn peer_id(&self) -> &str {
        &self.inner.peer_id
    }

    pub fn addr(&self) -> String {
        self.inner.state.lock().addr.clone()
    }

    /// Points the client at a new address. If it changed, the current connection is closed
    /// (its in-flight calls fail with `Disconnected`) and the next call connects anew.
    pub fn set_addr(&self, addr: &str) {
        let old = {
            let mut st = self.inner.state.lock();
            if st.addr == addr {
                return;
            }
            st.addr = addr.to_owned();
            st.last_failure = None;
            st.conn.take()
        };
        if let Some(c) = old {
            c.close(RpcError::Disconnected("peer address changed".into()));
        }
    }

    /// Closes the current connection, if any (in-flight calls fail with `Disconnected`). The
    /// next call reconnects.
    pub fn close(&self) {
        let old = self.inner.state.lock().conn.take();
        if let Some(c) = old {
            c.close(RpcError::Disconnected("closed by the caller".into()));
        }
    }

    /// Whether a connection is up now (no I/O).
    pub fn is_connected(&self) -> bool {
        self.inner
            .state
            .lock()
            .conn
            .as_ref()
            .is_some_and(|c| !c.is_closed())
    }

    /// Calls `op` with the default 5 s timeout.
    pub async fn call(&self, op: impl Into<u8>, body: Bytes) -> Result<RpcReply, RpcError> {
        self.call_timeout(op, body, DEFAULT_TIMEOUT).await
    }

    /// Calls `op` with `body`, waiting at most `timeout` in all (connect included). Any
    /// status is `Ok`, except `400 unsupported rpc operation <op>` → `PeerTooOld { op }`.
    pub async fn call_timeout(
        &self,
        op: impl Into<u8>,
        body: Bytes,
        timeout: Duration,
    ) -> Result<RpcReply, RpcError> {
        let op = op.into();
        if 1 + body.len() > MAX_PAYLOAD {
            return Err(RpcError::Protocol(format!(
                "request of {} bytes exceeds the 16 MiB frame limit",
                1 + body.len()
            )));
        }
        let payload = encode_request(op, &body);
        let progress = Arc::new(Progress::default());
        let fut = async {
            let (conn, frame) = self
                .exchange(FrameType::Request, payload, Some(op), &progress)
                .await?;
            match frame.kind {
                FrameType::Reply => {
                    let reply = RpcReply::decode(frame.payload)
                        .map_err(|e| RpcError::BadReply(e.to_string()))?;
                    if reply.is_unsupported(op) {
                        conn.unsupported.lock().insert(op);
                        return Err(RpcError::PeerTooOld { op });
                    }
                    Ok(reply)
                }
                other => Err(unexpected(other, &frame.payload)),
            }
        };
        // The future (and its waiter) is gone once `timeout` returns, so a request not
        // written by then never will be: the writer skips frames nobody waits for.
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or_else(|_| Err(progress.timed_out(timeout)))
    }

    /// Tries each `(opcode, body)` in order, moving to the next only on `PeerTooOld`; all
    /// attempts share one `timeout`. Returns the opcode that was answered and its reply, or
    /// the last `PeerTooOld` if the peer knows none of them. Attempts the peer is known not
    /// to support (on this connection) cost no round trip.
    pub async fn call_with_fallback<O: Into<u8> + Copy>(
        &self,
        attempts: &[(O, Bytes)],
        timeout: Duration,
    ) -> Result<(u8, RpcReply), RpcError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = RpcError::Protocol("no operation to try".into());
        for (op, body) in attempts {
            let op: u8 = (*op).into();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.call_timeout(op, body.clone(), left).await {
                Err(e @ RpcError::PeerTooOld { .. }) => {
                    tracing::debug!(peer = %self.inner.peer_id, op, "peer too old for this opcode; falling back");
                    last = e;
                }
                other => return other.map(|r| (op, r)),
            }
        }
        Err(last)
    }

    /// Sends a `Raft` frame and returns the `RaftReply` payload.
    pub async fn raft(&self, payload: Bytes, timeout: Duration) -> Result<Bytes, RpcError> {
        if payload.len() > MAX_PAYLOAD {
            return Err(RpcError::Protocol(format!(
                "raft request of {} bytes exceeds the 16 MiB frame limit",
                payload.len()
            )));
        }
        let progress = Arc::new(Progress::default());
        let fut = async {
            let (_, frame) = self
                .exchange(FrameType::Raft, payload, None, &progress)
                .await?;
            match frame.kind {
                FrameType::RaftReply => Ok(frame.payload),
                other => Err(unexpected(other, &frame.payload)),
            }
        };
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or_else(|_| Err(progress.timed_out(timeout)))
    }

    /// Round-trips a `Ping` (connecting if needed); returns the round-trip time.
    pub async fn ping(&self, timeout: Duration) -> Result<Duration, RpcError> {
        let progress = Arc::new(Progress::default());
        let fut = async {
            let (_, frame) = self
                .exchange(
                    FrameType::Ping,
                    Bytes::from_static(b"ping"),
                    None,
                    &progress,
                )
                .await?;
            match frame.kind {
                FrameType::Pong => Ok(()),
                other => Err(unexpected(other, &frame.payload)),
            }
        };
        let start = Instant::now();
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or_else(|_| Err(progress.timed_out(timeout)))?;
        Ok(start.elapsed())
    }

    /// Sends one frame and waits for the frame answering it, recording in `progress` how
    /// far it got. Retries once on a fresh connection if the current one closed before the
    /// frame could be queued.
    async fn exchange(
        &self,
        kind: FrameType,
        payload: Bytes,
        op: Option<u8>,
        progress: &Arc<Progress>,
    ) -> Result<(Arc<Conn>, Frame), RpcError> {
        for attempt in 0..2 {
            progress.set(Progress::CONNECTING);
            let conn = self.connection().await?;
            if let Some(op) = op {
                if conn.unsupported.lock().contains(&op) {
                    return Err(RpcError::PeerTooOld { op });
                }
            }
            progress.set(Progress::QUEUED);
            match conn.send(kind, payload.clone(), progress.clone()).await {
                Ok(waiter) => {
                    let frame = waiter.wait().await?;
                    return Ok((conn, frame));
                }
                Err(NotSent) if attempt == 0 => continue,
                Err(NotSent) => break,
            }
        }
        Err(RpcError::NotSent(
            "the connection closed before the request could be queued".into(),
        ))
    }

    /// The live connection, connecting (and authenticating) if there is none. The connect
    /// runs in its own task: if this caller times out, the attempt still completes (bounded
    /// by [`HANDSHAKE_TIMEOUT`]) for the next caller.
    async fn connection(&self) -> Result<Arc<Conn>, RpcError> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let guard = self.inner.connecting.clone().lock_owned().await;
        let addr = {
            let mut st = self.inner.state.lock();
            if let Some(c) = st.conn.as_ref().filter(|c| !c.is_closed()) {
                return Ok(c.clone());
            }
            st.conn = None;
            if let Some((at, err)) = &st.last_failure {
                let backoff = match err {
                    RpcError::Auth(_) => AUTH_BACKOFF,
                    _ => RECONNECT_BACKOFF,
                };
                if at.elapsed() < backoff {
                    return Err(err.clone());
                }
            }
            st.addr.clone()
        };
        let inner = self.inner.clone();
        let attempt = tokio::spawn(async move {
            let _one_at_a_time = guard;
            inner.connect_and_store(addr).await
        });
        attempt
            .await
            .unwrap_or_else(|e| Err(RpcError::Unreachable(format!("connect task failed: {e}"))))
    }

    fn live(&self) -> Option<Arc<Conn>> {
        let st = self.inner.state.lock();
        st.conn.as_ref().filter(|c| !c.is_closed()).cloned()
    }
}

impl std::fmt::Debug for PeerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerClient")
            .field("peer_id", &self.inner.peer_id)
            .field("addr", &self.addr())
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl ClientInner {
    async fn connect_and_store(&self, addr: String) -> Result<Arc<Conn>, RpcError> {
        let result = tokio::time::timeout(HANDSHAKE_TIMEOUT, Conn::connect(self, &addr))
            .await
            .unwrap_or_else(|_| {
                Err(RpcError::Unreachable(format!(
                    "connect and handshake with {addr} timed out"
                )))
            });
        let mut st = self.state.lock();
        match result {
            Ok(c) if st.addr == addr => {
                st.conn = Some(c.clone());
                st.last_failure = None;
                Ok(c)
            }
            Ok(c) => {
                c.close(RpcError::Unreachable("peer address changed".into()));
                Err(RpcError::Unreachable(
                    "peer address changed while connecting".into(),
                ))
            }
            Err(e) => {
                tracing::debug!(peer = %self.peer_id, %addr, error = %e, "cluster connect failed");
                st.last_failure = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        if let Some(c) = self.state.get_mut().conn.take() {
            c.close(RpcError::Disconnected("client dropped".into()));
        }
    }
}

/// An answer of the wrong kind: an `Error` frame is the peer refusing to dispatch the
/// request (nothing ran); any other kind is an unreadable answer.
fn unexpected(kind: FrameType, payload: &[u8]) -> RpcError {
    match kind {
        FrameType::Error => RpcError::Protocol(String::from_utf8_lossy(payload).into_owned()),
        other => RpcError::BadReply(format!("unexpected {other:?} frame in answer")),
    }
}

/// The frame could not be queued: the connection is closed (nothing was sent).
struct NotSent;

/// A call waiting for its answer, and how far its frame got.
struct Pending {
    tx: oneshot::Sender<Result<Frame, RpcError>>,
    progress: Arc<Progress>,
    /// Test fault [`FaultPoint::AfterSend`]: its reply is dropped.
    lose_reply: bool,
}

type Waiters = HashMap<u64, Pending>;

/// A frame for the writer. `tracked` frames belong to a registered call ([`Conn::send`]):
/// the writer marks them written under the waiters' lock, and skips those whose caller has
/// gone (timed out) or whose connection closed, so "not marked written" means "never sent".
struct Outgoing {
    frame: Frame,
    tracked: bool,
}

impl Outgoing {
    fn untracked(frame: Frame) -> Outgoing {
        Outgoing {
            frame,
            tracked: false,
        }
    }
}

/// One authenticated connection and its reader, writer and keepalive tasks.
struct Conn {
    tx: mpsc::Sender<Outgoing>,
    /// `None` once closed: nothing can register after the close drained it.
    pending: Mutex<Option<Waiters>>,
    next_id: AtomicU64,
    closed: CancellationToken,
    /// Opcodes this peer answered "unsupported" on this connection.
    unsupported: Mutex<HashSet<u8>>,
    /// Milliseconds since `born` of the last frame received.
    last_rx_ms: AtomicU64,
    born: Instant,
}

impl Conn {
    async fn connect(client: &ClientInner, addr: &str) -> Result<Arc<Conn>, RpcError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| RpcError::Unreachable(format!("connect to {addr}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let split = match &client.auth.tls {
            None => transport::plain(stream),
            Some(tls) => transport::connect_tls(stream, addr, tls)
                .await
                .map_err(|e| RpcError::Auth(format!("{addr}: tls: {e}")))?,
        };
        let mut reader = FrameReader::new(split.read);
        let mut writer = BufWriter::new(split.write);
        client_handshake(client, addr, &split.binding, &mut reader, &mut writer).await?;

        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let conn = Arc::new(Conn {
            tx,
            pending: Mutex::new(Some(HashMap::new())),
            next_id: AtomicU64::new(1),
            closed: CancellationToken::new(),
            unsupported: Mutex::new(HashSet::new()),
            last_rx_ms: AtomicU64::new(0),
            born: Instant::now(),
        });
        tokio::spawn(write_loop(conn.clone(), writer, rx, client.faults.clone()));
        tokio::spawn(read_loop(conn.clone(), reader));
        tokio::spawn(keepalive(conn.clone()));
        tracing::debug!(peer = %client.peer_id, %addr, "cluster connection established");
        Ok(conn)
    }

    fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Fails every waiting call and stops the connection's tasks: a call whose frame was
    /// written gets `reason` (as an outcome-unknown error), one whose frame was not gets
    /// [`RpcError::NotSent`] (the writer writes nothing once the waiters are taken).
    fn close(&self, reason: RpcError) {
        let waiters = self.pending.lock().take();
        self.closed.cancel();
        for (_, w) in waiters.into_iter().flatten() {
            let _ = w.tx.send(Err(closed_error(&reason, w.progress.written())));
        }
    }

    /// Registers a waiter and queues the frame.
    async fn send(
        self: &Arc<Self>,
        kind: FrameType,
        payload: Bytes,
        progress: Arc<Progress>,
    ) -> Result<Waiter, NotSent> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match self.pending.lock().as_mut() {
            Some(p) => p.insert(
                id,
                Pending {
                    tx,
                    progress: progress.clone(),
                    lose_reply: false,
                },
            ),
            None => return Err(NotSent),
        };
        let waiter = Waiter {
            conn: self.clone(),
            id,
            rx: Some(rx),
            progress,
        };
        let out = Outgoing {
            frame: Frame::new(kind, id, payload),
            tracked: true,
        };
        if self.tx.send(out).await.is_err() {
            return Err(NotSent);
        }
        Ok(waiter)
    }

    /// The writer's check before writing a tracked frame: `false` when its caller is gone
    /// or the connection closed (skip it), else it is marked written.
    fn mark_written(&self, id: u64, lose_reply: bool) -> Option<bool> {
        let mut pending = self.pending.lock();
        let p = pending.as_mut()?;
        Some(match p.get_mut(&id) {
            Some(w) => {
                w.progress.set(Progress::WRITTEN);
                w.lose_reply = lose_reply;
                true
            }
            None => false,
        })
    }

    fn touch(&self) {
        self.last_rx_ms
            .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_rx_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }
}

/// A registered call; removes its entry if dropped before the answer (timeout, cancel).
struct Waiter {
    conn: Arc<Conn>,
    id: u64,
    rx: Option<oneshot::Receiver<Result<Frame, RpcError>>>,
    progress: Arc<Progress>,
}

impl Waiter {
    async fn wait(mut self) -> Result<Frame, RpcError> {
        let rx = self.rx.take().expect("waited once");
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(closed_error(
                &RpcError::Disconnected("connection closed".into()),
                self.progress.written(),
            )),
        }
    }
}

/// What a call learns when its connection closes for `reason`: outcome unknown if its frame
/// was written, else not sent.
fn closed_error(reason: &RpcError, written: bool) -> RpcError {
    match (written, reason) {
        (true, r) if r.outcome_unknown() => r.clone(),
        (true, r) => RpcError::Disconnected(r.to_string()),
        (false, r) => RpcError::NotSent(format!(
            "the connection closed before the request was written ({r})"
        )),
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(p) = self.conn.pending.lock().as_mut() {
            p.remove(&self.id);
        }
    }
}

async fn client_handshake(
    client: &ClientInner,
    addr: &str,
    binding: &[u8],
    reader: &mut FrameReader<ReadHalf>,
    writer: &mut BufWriter<WriteHalf>,
) -> Result<(), RpcError> {
    let proto = |e: ProtoError| match e {
        ProtoError::Io(e) => RpcError::Unreachable(format!("{addr}: {e}")),
        e => RpcError::Protocol(format!("{addr}: {e}")),
    };
    let closed =
        || RpcError::Unreachable(format!("{addr} closed the connection during the handshake"));
    let frame = reader.next().await.map_err(proto)?.ok_or_else(closed)?;
    match frame.kind {
        FrameType::AuthChallenge => {}
        FrameType::Error => {
            return Err(RpcError::Auth(
                String::from_utf8_lossy(&frame.payload).into_owned(),
            ))
        }
        other => {
            return Err(RpcError::Protocol(format!(
                "{addr}: expected an auth challenge, got {other:?}"
            )))
        }
    }
    let (nonce, server_id) = auth::decode_challenge(&frame.payload)
        .map_err(|e| RpcError::Protocol(format!("{addr}: {e}")))?;
    if !client.peer_id.is_empty() && server_id != client.peer_id {
        return Err(RpcError::Unreachable(format!(
            "{addr} is node {server_id}, not {}",
            client.peer_id
        )));
    }
    let proof = client
        .auth
        .secret
        .bound_proof(&nonce, &client.self_id, binding);
    let response = Frame::new(
        FrameType::AuthResponse,
        0,
        auth::encode_response(&client.self_id, &proof),
    );
    let bytes = response.encode().map_err(proto)?;
    writer
        .write_all(&bytes)
        .await
        .map_err(|e| proto(e.into()))?;
    writer.flush().await.map_err(|e| proto(e.into()))?;
    let frame = reader.next().await.map_err(proto)?.ok_or_else(closed)?;
    match frame.kind {
        FrameType::AuthOk => Ok(()),
        FrameType::Error => Err(RpcError::Auth(format!(
            "{addr}: {}",
            String::from_utf8_lossy(&frame.payload)
        ))),
        other => Err(RpcError::Protocol(format!(
            "{addr}: expected auth ok, got {other:?}"
        ))),
    }
}

async fn write_loop(
    conn: Arc<Conn>,
    mut w: BufWriter<WriteHalf>,
    mut rx: mpsc::Receiver<Outgoing>,
    faults: Arc<Faults>,
) {
    loop {
        let out = tokio::select! {
            _ = conn.closed.cancelled() => break,
            f = rx.recv() => match f {
                Some(f) => f,
                None => break,
            },
        };
        let mut next = Some(out);
        while let Some(Outgoing { frame: f, tracked }) = next {
            next = rx.try_recv().ok();
            let mut fault = None;
            if tracked {
                if f.kind == FrameType::Request {
                    fault = f.payload.first().and_then(|op| faults.on_request(*op));
                }
                if fault == Some(FaultPoint::BeforeSend) {
                    // Not marked written: its waiter reads NotSent.
                    tracing::warn!(
                        request_id = f.request_id,
                        "test fault: dropping the connection before writing a request"
                    );
                    conn.close(RpcError::Disconnected(
                        "test fault before the request was written".into(),
                    ));
                    return;
                }
                if fault == Some(FaultPoint::AfterSend) {
                    tracing::warn!(
                        request_id = f.request_id,
                        "test fault: the reply to this request will be dropped"
                    );
                }
                match conn.mark_written(f.request_id, fault == Some(FaultPoint::AfterSend)) {
                    None => return,
                    Some(false) => continue,
                    Some(true) => {}
                }
            }
            // Sizes are checked by the callers; an encode failure here is a bug, not I/O.
            let r = match f.encode() {
                Ok(b) => w.write_all(&b).await,
                Err(e) => {
                    conn.close(RpcError::Protocol(e.to_string()));
                    return;
                }
            };
            if let Err(e) = r {
                conn.close(RpcError::Disconnected(format!("write failed: {e}")));
                return;
            }
        }
        if let Err(e) = w.flush().await {
            conn.close(RpcError::Disconnected(format!("write failed: {e}")));
            return;
        }
    }
    let _ = w.shutdown().await;
}

async fn read_loop(conn: Arc<Conn>, mut reader: FrameReader<ReadHalf>) {
    let reason = loop {
        let r = tokio::select! {
            _ = conn.closed.cancelled() => return,
            r = reader.next() => r,
        };
        let frame = match r {
            Ok(Some(f)) => f,
            Ok(None) => break RpcError::Disconnected("connection closed by the peer".into()),
            Err(ProtoError::Io(e)) => break RpcError::Disconnected(format!("read failed: {e}")),
            Err(ProtoError::UnknownFrameType { kind, request_id }) => {
                conn.touch();
                deliver(
                    &conn,
                    request_id,
                    Err(RpcError::Protocol(format!(
                        "unknown frame type {kind} in answer"
                    ))),
                );
                continue;
            }
            Err(e) => break RpcError::Protocol(e.to_string()),
        };
        conn.touch();
        match frame.kind {
            FrameType::Error if frame.request_id == 0 => {
                let msg = String::from_utf8_lossy(&frame.payload).into_owned();
                tracing::warn!(error = %msg, "cluster peer closed the connection with an error");
                break RpcError::Disconnected(msg);
            }
            FrameType::Reply | FrameType::RaftReply | FrameType::Pong | FrameType::Error => {
                let id = frame.request_id;
                deliver(&conn, id, Ok(frame));
            }
            FrameType::Ping => {
                let _ = conn.tx.try_send(Outgoing::untracked(Frame::new(
                    FrameType::Pong,
                    frame.request_id,
                    frame.payload,
                )));
            }
            other => {
                break RpcError::Protocol(format!("unexpected {other:?} frame from the server"));
            }
        }
    };
    conn.close(reason);
}

fn deliver(conn: &Conn, id: u64, r: Result<Frame, RpcError>) {
    let waiter = conn.pending.lock().as_mut().and_then(|p| p.remove(&id));
    if let Some(w) = waiter {
        let r = if w.lose_reply {
            Err(RpcError::Disconnected(
                "test fault: the reply was lost after the request was written".into(),
            ))
        } else {
            r
        };
        let _ = w.tx.send(r);
    }
}

async fn keepalive(conn: Arc<Conn>) {
    loop {
        tokio::select! {
            _ = conn.closed.cancelled() => return,
            _ = tokio::time::sleep(PING_INTERVAL) => {}
        }
        let quiet = conn.quiet_for();
        if quiet >= DEAD_AFTER {
            tracing::warn!(
                quiet_ms = quiet.as_millis() as u64,
                "cluster peer silent; closing the connection"
            );
            conn.close(RpcError::Disconnected(format!(
                "no traffic from the peer for {} s",
                quiet.as_secs()
            )));
            return;
        }
        if quiet >= PING_INTERVAL {
            // Id 0: no waiter; the Pong only refreshes `last_rx`. A full queue means traffic.
            let _ = conn.tx.try_send(Outgoing::untracked(Frame::new(
                FrameType::Ping,
                0,
                Bytes::new(),
            )));
        }
    }
}

/// The clients of every known peer: node id → [`PeerClient`], kept in step with membership.
pub struct Peers {
    self_id: String,
    auth: ClusterAuth,
    clients: RwLock<HashMap<String, PeerClient>>,
    faults: Arc<Faults>,
}

impl Peers {
    pub fn new(self_id: impl Into<String>, auth: impl Into<ClusterAuth>) -> Peers {
        Peers {
            self_id: self_id.into(),
            auth: auth.into(),
            clients: RwLock::new(HashMap::new()),
            faults: Arc::default(),
        }
    }

    /// The same registry with test faults (`NARAD_TEST_RPC_FAULT`) on every client's
    /// connections; requests are counted per opcode over all peers.
    pub fn with_faults(mut self, plan: Vec<RpcFault>) -> Peers {
        self.faults = Arc::new(Faults {
            plan,
            seen: Mutex::default(),
        });
        self
    }

    /// This node's id (what peers see as `from`).
    pub fn self_id(&self) -> &str {
        &self.self_id
    }

    /// The client for `id`, created if new, re-addressed if `addr` changed.
    pub fn upsert(&self, id: &str, addr: &str) -> PeerClient {
        if let Some(c) = self.clients.read().get(id) {
            if c.addr() == addr {
                return c.clone();
            }
        }
        let mut clients = self.clients.write();
        match clients.get(id) {
            Some(c) => {
                c.set_addr(addr);
                c.clone()
            }
            None => {
                let c = PeerClient::with_faults(
                    self.self_id.clone(),
                    id,
                    addr,
                    self.auth.clone(),
                    self.faults.clone(),
                );
                clients.insert(id.to_owned(), c.clone());
                c
            }
        }
    }

    /// Forgets `id` and closes its connection. Returns whether it was known.
    pub fn remove(&self, id: &str) -> bool {
        let removed = self.clients.write().remove(id);
        if let Some(c) = &removed {
            c.close();
        }
        removed.is_some()
    }

    /// Makes the registry exactly `members` (id, cluster address), ignoring this node's own
    /// entry: new ones are added, moved ones re-addressed, missing ones removed.
    pub fn sync<'a>(&self, members: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let wanted: HashMap<&str, &str> = members
            .into_iter()
            .filter(|(id, _)| *id != self.self_id)
            .collect();
        let stale: Vec<String> = self
            .clients
            .read()
            .keys()
            .filter(|id| !wanted.contains_key(id.as_str()))
            .cloned()
            .collect();
        for id in stale {
            self.remove(&id);
        }
        for (id, addr) in wanted {
            self.upsert(id, addr);
        }
    }

    pub fn get(&self, id: &str) -> Option<PeerClient> {
        self.clients.read().get(id).cloned()
    }

    /// Known peer ids, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.clients.read().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Calls `op` on node `id`; an unknown id is `Unreachable`.
    pub async fn call(
        &self,
        id: &str,
        op: impl Into<u8>,
        body: Bytes,
        timeout: Duration,
    ) -> Result<RpcReply, RpcError> {
        let client = self
            .get(id)
            .ok_or_else(|| RpcError::Unreachable(format!("unknown node {id}")))?;
        client.call_timeout(op, body, timeout).await
    }
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("self_id", &self.self_id)
            .field("peers", &self.ids())
            .finish()
    }
}
