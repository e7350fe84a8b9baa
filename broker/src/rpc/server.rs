//! The cluster-port server: accept, authenticate (see `auth`), then serve frames.
//!
//! Per connection, one reader loop reads frames and one writer task writes replies. Each
//! `Request` and `Raft` frame runs as its own task, so many are in flight per connection and
//! replies go out as they finish (out of order, matched by request id). `Ping` is answered
//! from the reader loop at once, so a slow handler never makes a connection look dead.
//!
//! - Unknown opcodes (not in [`Opcode`]) are answered `400 unsupported rpc operation <n>`
//!   without calling the handler; the handler answers the same ([`RpcReply::unsupported`])
//!   for opcodes it knows of but does not serve.
//! - Protocol errors (bad magic or version, payload over 16 MiB, truncated frame, a frame the
//!   client must not send) get an `Error` frame with request id 0 and the connection closes
//!   once in-flight requests finish. An unknown frame type only fails that request id.
//! - A connection silent for [`IDLE_TIMEOUT`] is closed (clients ping every second or so).
//! - Shutdown: stop accepting, stop reading, let in-flight requests finish and flush their
//!   replies, close; whatever is still running after the grace is aborted.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::auth::{self, AUTH_FAILED, HANDSHAKE_TIMEOUT};
use super::proto::{
    decode_request, Frame, FrameReader, FrameType, Opcode, ProtoError, RpcReply,
    MAX_HANDSHAKE_PAYLOAD, MAX_PAYLOAD,
};
use super::transport::{self, ClusterAuth, ReadHalf, WriteHalf};
use super::BoxFuture;
use crate::error::ErrorCode;

/// A connection with no frame from the client for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests in flight per connection before the server stops reading (backpressure).
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 4096;
/// Cluster-port connections open at once (authenticated or not); more are closed on accept
/// (SPEC §11). A cluster of 108 nodes opens a few per peer.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections still in the handshake at once; more are closed on accept. Before the proof a
/// connection holds at most a ~1 KiB buffer, so this bounds pre-authentication memory to
/// well under a megabyte.
pub const MAX_HANDSHAKES: usize = 256;
/// Frames queued for the writer of one connection.
const WRITE_QUEUE: usize = 1024;

/// Who sent a frame: the node id the caller proved with the cluster secret, and whether that
/// proof means anything (false only on a server with the empty secret, which anyone can prove;
/// see `auth`). Handlers refuse unproven callers whenever security is on.
#[derive(Debug, Clone)]
pub struct Caller {
    pub node_id: Arc<str>,
    pub proven: bool,
}

/// Serves node RPCs. `caller` is who sent the request. `op` is a registered
/// opcode (unregistered ones never reach the handler). Answer [`RpcReply::unsupported`] for an
/// opcode this build does not serve. Errors are replies (`4xx`/`5xx` with `{"error": …}`),
/// mapped 1:1 to HTTP by the forwarding node.
pub trait RpcHandler: Send + Sync + 'static {
    fn handle<'a>(&'a self, caller: &'a Caller, op: u8, body: Bytes) -> BoxFuture<'a, RpcReply>;
}

/// Serves `Raft` frames: the payload is an encoded Raft RPC, the answer its encoded reply
/// (see `raft_net::MetaRaftHandler`). `Err` becomes an `Error` frame for that request.
pub trait RaftHandler: Send + Sync + 'static {
    fn handle_raft<'a>(
        &'a self,
        caller: &'a Caller,
        payload: Bytes,
    ) -> BoxFuture<'a, Result<Bytes, String>>;
}

/// An [`RpcHandler`] from a closure `(from, op, body) -> impl Future<Output = RpcReply>`.
pub fn handler_fn<F, Fut>(f: F) -> Arc<dyn RpcHandler>
where
    F: Fn(String, u8, Bytes) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = RpcReply> + Send + 'static,
{
    struct FnHandler<F>(F);
    impl<F, Fut> RpcHandler for FnHandler<F>
    where
        F: Fn(String, u8, Bytes) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = RpcReply> + Send + 'static,
    {
        fn handle<'a>(
            &'a self,
            caller: &'a Caller,
            op: u8,
            body: Bytes,
        ) -> BoxFuture<'a, RpcReply> {
            Box::pin((self.0)(caller.node_id.to_string(), op, body))
        }
    }
    Arc::new(FnHandler(f))
}

/// Counters of a server (for metrics and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// TCP connections accepted.
    pub accepted: u64,
    /// Connections that passed the handshake.
    pub authenticated: u64,
    /// Connections refused by the handshake (bad proof or malformed response).
    pub auth_failures: u64,
    /// Connections open now.
    pub open: u64,
    /// Request and Raft frames served.
    pub requests: u64,
    /// Connections closed on accept because [`MAX_CONNECTIONS`] or [`MAX_HANDSHAKES`] was
    /// reached.
    pub refused_over_cap: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    authenticated: AtomicU64,
    auth_failures: AtomicU64,
    open: AtomicU64,
    requests: AtomicU64,
    refused_over_cap: AtomicU64,
}

struct Ctx {
    node_id: String,
    auth: ClusterAuth,
    handler: Arc<dyn RpcHandler>,
    raft: RwLock<Option<Arc<dyn RaftHandler>>>,
    counters: Counters,
    handshakes: Arc<tokio::sync::Semaphore>,
}

/// The cluster-port listener. [`RpcServer::shutdown`] stops it and waits; dropping it (or
/// cancelling [`RpcServer::shutdown_token`]) starts the same shutdown without waiting.
pub struct RpcServer {
    local_addr: SocketAddr,
    ctx: Arc<Ctx>,
    shutdown: CancellationToken,
    accept_task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl RpcServer {
    /// Binds `addr` (`host:port`; a Go-style `:port` means every interface) and starts
    /// serving. `node_id` is announced in the challenge; `auth` checks client proofs (the
    /// empty secret is the "no secret" mode documented in `auth`) and, with TLS, makes every
    /// connection mutual TLS first. Raft frames are refused until
    /// [`RpcServer::set_raft_handler`] is called.
    pub async fn bind(
        addr: &str,
        node_id: impl Into<String>,
        auth: impl Into<ClusterAuth>,
        handler: Arc<dyn RpcHandler>,
    ) -> std::io::Result<RpcServer> {
        let auth = auth.into();
        let addr = if addr.starts_with(':') {
            format!("0.0.0.0{addr}")
        } else {
            addr.to_owned()
        };
        let listener = TcpListener::bind(&addr).await?;
        let local_addr = listener.local_addr()?;
        let ctx = Arc::new(Ctx {
            node_id: node_id.into(),
            auth,
            handler,
            raft: RwLock::new(None),
            counters: Counters::default(),
            handshakes: Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES)),
        });
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(accept_loop(listener, ctx.clone(), shutdown.clone()));
        tracing::info!(addr = %local_addr, node = %ctx.node_id, tls = ctx.auth.is_tls(), "cluster port listening");
        Ok(RpcServer {
            local_addr,
            ctx,
            shutdown,
            accept_task: tokio::sync::Mutex::new(Some(task)),
        })
    }

    /// The bound address (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Starts serving `Raft` frames with `handler` (replaces any previous one). Until then
    /// Raft frames get an `Error` ("raft not ready"), which the sender retries.
    pub fn set_raft_handler(&self, handler: Arc<dyn RaftHandler>) {
        *self.ctx.raft.write() = Some(handler);
    }

    /// Cancelling this token stops the server as [`RpcServer::shutdown`] does, without
    /// waiting.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    pub fn stats(&self) -> ServerStats {
        let c = &self.ctx.counters;
        ServerStats {
            accepted: c.accepted.load(Ordering::Relaxed),
            authenticated: c.authenticated.load(Ordering::Relaxed),
            auth_failures: c.auth_failures.load(Ordering::Relaxed),
            open: c.open.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            refused_over_cap: c.refused_over_cap.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting and reading, waits up to `grace` for in-flight requests to finish and
    /// their replies to be written, then closes every connection (aborting what is left).
    /// The port is free when this returns.
    pub async fn shutdown(&self, grace: Duration) {
        self.shutdown.cancel();
        let Some(mut task) = self.accept_task.lock().await.take() else {
            return;
        };
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "cluster connections still busy after the grace; closing them"
            );
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    ctx.counters.accepted.fetch_add(1, Ordering::Relaxed);
                    let permit = if conns.len() < MAX_CONNECTIONS {
                        ctx.handshakes.clone().try_acquire_owned().ok()
                    } else {
                        None
                    };
                    let Some(permit) = permit else {
                        // Closed at once: nothing read, nothing buffered.
                        let n = ctx.counters.refused_over_cap.fetch_add(1, Ordering::Relaxed);
                        if (n + 1).is_power_of_two() {
                            tracing::warn!(%peer, open = conns.len(), refused = n + 1, "cluster port at its connection cap; closing new connections");
                        }
                        drop(stream);
                        continue;
                    };
                    conns.spawn(serve_connection(stream, peer, ctx.clone(), shutdown.clone(), permit));
                }
                Err(e) => {
                    // EMFILE and friends: don't spin.
                    tracing::warn!(error = %e, "cluster port accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    // Connections see the same token: they stop reading and drain. Dropping `conns` (when
    // the shutdown grace aborts this task) aborts them.
    while conns.join_next().await.is_some() {}
}

/// Decrements the open-connection gauge however the connection task ends.
struct OpenGuard<'a>(&'a AtomicU64);
impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<Ctx>,
    shutdown: CancellationToken,
    handshake_permit: tokio::sync::OwnedSemaphorePermit,
) {
    ctx.counters.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(&ctx.counters.open);
    let _ = stream.set_nodelay(true);
    let established = async {
        let split = match &ctx.auth.tls {
            None => transport::plain(stream),
            Some(tls) => {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, transport::accept_tls(stream, tls))
                    .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        ctx.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, error = %e, "cluster connection refused: tls handshake failed");
                        return None;
                    }
                    Err(_) => {
                        ctx.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, "cluster connection refused: no tls handshake in time");
                        return None;
                    }
                }
            }
        };
        // Until the client has proved the secret, only the handshake's small frames.
        let mut reader = FrameReader::with_max_payload(split.read, MAX_HANDSHAKE_PAYLOAD);
        let mut writer = BufWriter::new(split.write);
        let id = handshake(&mut reader, &mut writer, &ctx, peer, &split.binding).await?;
        Some((id, reader, writer))
    };
    let (from, mut reader, writer) = tokio::select! {
        _ = shutdown.cancelled() => return,
        r = established => match r {
            Some(x) => x,
            None => return,
        },
    };
    drop(handshake_permit);
    let caller = Arc::new(Caller {
        node_id: Arc::from(from),
        proven: ctx.auth.secret.proves_identity(),
    });
    let from = caller.node_id.clone();
    tracing::debug!(%peer, node = %from, "cluster connection authenticated");
    // Authenticated: frames up to the protocol's limit from now on.
    reader.set_max_payload(MAX_PAYLOAD);

    let (tx, rx) = mpsc::channel::<Frame>(WRITE_QUEUE);
    let write_task = tokio::spawn(write_loop(writer, rx));
    let mut in_flight: JoinSet<()> = JoinSet::new();
    let idle = tokio::time::sleep(IDLE_TIMEOUT);
    tokio::pin!(idle);
    loop {
        if in_flight.len() >= MAX_IN_FLIGHT_PER_CONNECTION {
            in_flight.join_next().await;
            continue;
        }
        let frame = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => continue,
            _ = &mut idle => {
                tracing::debug!(%peer, node = %from, "closing idle cluster connection");
                break;
            }
            r = reader.next() => r,
        };
        idle.as_mut()
            .reset(tokio::time::Instant::now() + IDLE_TIMEOUT);
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(ProtoError::UnknownFrameType { kind, request_id }) => {
                let msg = format!("unsupported frame type {kind}");
                if tx.send(Frame::error(request_id, &msg)).await.is_err() {
                    break;
                }
                continue;
            }
            Err(ProtoError::Io(e)) => {
                tracing::debug!(%peer, node = %from, error = %e, "cluster connection read failed");
                break;
            }
            Err(e) => {
                tracing::warn!(%peer, node = %from, error = %e, "cluster protocol error; closing the connection");
                let _ = tx
                    .send(Frame::error(0, &format!("protocol error: {e}")))
                    .await;
                break;
            }
        };
        let id = frame.request_id;
        match frame.kind {
            FrameType::Request => {
                ctx.counters.requests.fetch_add(1, Ordering::Relaxed);
                let (op, body) = match decode_request(frame.payload) {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = tx.send(Frame::error(id, &e.to_string())).await;
                        continue;
                    }
                };
                let (ctx, caller, tx) = (ctx.clone(), caller.clone(), tx.clone());
                in_flight.spawn(async move {
                    let reply = if Opcode::from_u8(op).is_none() {
                        RpcReply::unsupported(op)
                    } else {
                        ctx.handler.handle(&caller, op, body).await
                    };
                    let _ = tx.send(reply_frame(id, op, &reply)).await;
                });
            }
            FrameType::Raft => {
                ctx.counters.requests.fetch_add(1, Ordering::Relaxed);
                let handler = ctx.raft.read().clone();
                let Some(handler) = handler else {
                    let _ = tx.send(Frame::error(id, "raft not ready")).await;
                    continue;
                };
                let (caller, tx) = (caller.clone(), tx.clone());
                in_flight.spawn(async move {
                    let frame = match handler.handle_raft(&caller, frame.payload).await {
                        Ok(p) if p.len() <= MAX_PAYLOAD => Frame::new(FrameType::RaftReply, id, p),
                        Ok(p) => Frame::error(
                            id,
                            &format!(
                                "raft reply of {} bytes exceeds the 16 MiB frame limit",
                                p.len()
                            ),
                        ),
                        Err(e) => Frame::error(id, &e),
                    };
                    let _ = tx.send(frame).await;
                });
            }
            FrameType::Ping => {
                if tx
                    .send(Frame::new(FrameType::Pong, id, frame.payload))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            FrameType::Pong => {}
            FrameType::Error => {
                let msg = String::from_utf8_lossy(&frame.payload);
                tracing::debug!(%peer, node = %from, request_id = id, error = %msg, "peer sent an error frame");
                if id == 0 {
                    break;
                }
            }
            kind @ (FrameType::AuthChallenge
            | FrameType::AuthResponse
            | FrameType::AuthOk
            | FrameType::Reply
            | FrameType::RaftReply) => {
                tracing::warn!(%peer, node = %from, ?kind, "unexpected frame from a cluster client; closing the connection");
                let _ = tx
                    .send(Frame::error(
                        0,
                        &format!("protocol error: unexpected {kind:?} frame"),
                    ))
                    .await;
                break;
            }
        }
    }
    // Stop reading; let in-flight requests finish and their replies be written, then close.
    drop(reader);
    while in_flight.join_next().await.is_some() {}
    drop(tx);
    let _ = write_task.await;
}

/// The reply frame for `reply`; one too large for a frame becomes a `500`.
fn reply_frame(id: u64, op: u8, reply: &RpcReply) -> Frame {
    match reply.encode() {
        Ok(p) if p.len() <= MAX_PAYLOAD => Frame::new(FrameType::Reply, id, p),
        Ok(p) => {
            tracing::error!(
                op,
                bytes = p.len(),
                "rpc reply exceeds the 16 MiB frame limit"
            );
            let r = RpcReply::fail(
                ErrorCode::Internal,
                "rpc reply exceeds the 16 MiB frame limit",
            );
            Frame::new(
                FrameType::Reply,
                id,
                r.encode().expect("small reply encodes"),
            )
        }
        Err(e) => {
            let r = RpcReply::fail(ErrorCode::Internal, format!("rpc reply not encodable: {e}"));
            Frame::new(
                FrameType::Reply,
                id,
                r.encode().expect("small reply encodes"),
            )
        }
    }
}

/// Writes queued frames, batching whatever is ready into one flush.
async fn write_loop(mut w: BufWriter<WriteHalf>, mut rx: mpsc::Receiver<Frame>) {
    while let Some(frame) = rx.recv().await {
        let mut next = Some(frame);
        while let Some(f) = next {
            if let Err(e) = write_one(&mut w, &f).await {
                tracing::debug!(error = %e, "cluster connection write failed");
                return;
            }
            next = rx.try_recv().ok();
        }
        if w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

async fn write_one(w: &mut BufWriter<WriteHalf>, f: &Frame) -> Result<(), ProtoError> {
    let bytes = f.encode()?;
    w.write_all(&bytes).await?;
    Ok(())
}

/// Runs the server side of the handshake. `Some(node id)` if the client proved the secret
/// (bound to the TLS session by `binding`; empty on plaintext).
async fn handshake(
    reader: &mut FrameReader<ReadHalf>,
    writer: &mut BufWriter<WriteHalf>,
    ctx: &Ctx,
    peer: SocketAddr,
    binding: &[u8],
) -> Option<String> {
    let nonce = auth::new_nonce();
    let challenge = Frame::new(
        FrameType::AuthChallenge,
        0,
        auth::encode_challenge(&nonce, &ctx.node_id),
    );
    if write_one(writer, &challenge).await.is_err() || writer.flush().await.is_err() {
        return None;
    }
    let refuse = |why: &str, claimed: Option<&str>| {
        ctx.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
        // Never the secret or the proof.
        tracing::warn!(%peer, node = claimed.unwrap_or("?"), reason = why, "cluster connection refused");
    };
    let frame = match tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.next()).await {
        Err(_) => {
            refuse("no auth response in time", None);
            let _ = write_one(writer, &Frame::error(0, AUTH_FAILED)).await;
            let _ = writer.flush().await;
            return None;
        }
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) | Ok(Err(ProtoError::Io(_))) => return None,
        Ok(Err(e)) => {
            refuse("protocol error during the handshake", None);
            let _ = write_one(writer, &Frame::error(0, &format!("protocol error: {e}"))).await;
            let _ = writer.flush().await;
            let _ = writer.shutdown().await;
            return None;
        }
    };
    let verdict = if frame.kind != FrameType::AuthResponse {
        Err(("expected an auth response", None))
    } else {
        match auth::decode_response(&frame.payload) {
            Err(_) => Err(("malformed auth response", None)),
            Ok((id, proof)) if ctx.auth.secret.verify_bound(&nonce, &id, binding, &proof) => Ok(id),
            Ok((id, _)) => Err(("bad authentication proof", Some(id))),
        }
    };
    match verdict {
        Ok(id) => {
            if write_one(writer, &Frame::new(FrameType::AuthOk, 0, Bytes::new()))
                .await
                .is_err()
                || writer.flush().await.is_err()
            {
                return None;
            }
            ctx.counters.authenticated.fetch_add(1, Ordering::Relaxed);
            Some(id)
        }
        Err((why, claimed)) => {
            refuse(why, claimed.as_deref());
            let _ = write_one(writer, &Frame::error(0, AUTH_FAILED)).await;
            let _ = writer.flush().await;
            let _ = writer.shutdown().await;
            None
        }
    }
}
