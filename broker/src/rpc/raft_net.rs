//! Raft over the cluster port: narad-meta's [`RaftTransport`] on `Raft`/`RaftReply` frames.
//!
//! **Encoding: JSON.** A `Raft` frame's payload is `serde_json` of [`RaftRequest`], a
//! `RaftReply` frame's is `serde_json` of [`RaftReply`]. Both are serde types built from
//! openraft's (whose serde shape openraft keeps stable within a major version), metadata
//! traffic is small, and JSON is debuggable and already a dependency. Limits that follow:
//! a snapshot chunk (openraft default 3 MiB of bytes, a JSON array of up to ~4 bytes per
//! byte, ≈ 12 MiB) fits a 16 MiB frame; an `AppendEntries` whose JSON exceeds 16 MiB (only
//! with hundreds of megabyte-sized schemas in flight at once) is refused locally as a
//! `Network` error. Changing the encoding later needs a new frame type (append-only), not a
//! new meaning of this one.
//!
//! **Connections.** The transport keeps its own [`Peers`], so Raft traffic has its own TCP
//! connection per peer, separate from node RPCs: a 16 MiB segment chunk on the RPC
//! connection never delays a heartbeat. Peer addresses come from the Raft membership
//! ([`MetaNode::addr`]) on every send.
//!
//! **Errors.** `Unreachable` and `Auth` → `TransportError::Unreachable` (openraft backs off),
//! `Timeout` → `Timeout`, anything else (lost connection, protocol error, the peer's
//! "raft not ready") → `Network` (retried soon).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_meta::raft::BoxFuture as MetaBoxFuture;
use narad_meta::{Meta, MetaNode, RaftReply, RaftRequest, RaftTransport, TransportError};

use super::client::{Peers, RpcError};
use super::server::{Caller, RaftHandler};
use super::transport::ClusterAuth;
use super::BoxFuture;

/// The sending side: implements [`RaftTransport`] for `Meta::open`.
pub struct RpcRaftTransport {
    peers: Peers,
}

impl RpcRaftTransport {
    /// `self_id`: this node's id (authenticated as the caller); `secret`: the cluster secret.
    pub fn new(self_id: impl Into<String>, auth: impl Into<ClusterAuth>) -> RpcRaftTransport {
        RpcRaftTransport {
            peers: Peers::new(self_id, auth),
        }
    }

    /// The per-peer Raft connections (e.g. to drop a removed voter's).
    pub fn peers(&self) -> &Peers {
        &self.peers
    }
}

fn transport_error(e: RpcError) -> TransportError {
    match e {
        RpcError::Unreachable(m) | RpcError::NotSent(m) => TransportError::Unreachable(m),
        RpcError::Auth(m) => TransportError::Unreachable(format!("authentication failed: {m}")),
        RpcError::Timeout => TransportError::Timeout,
        other => TransportError::Network(other.to_string()),
    }
}

impl RaftTransport for RpcRaftTransport {
    fn send<'a>(
        &'a self,
        target: &'a MetaNode,
        req: RaftRequest,
        timeout: Duration,
    ) -> MetaBoxFuture<'a, Result<RaftReply, TransportError>> {
        Box::pin(async move {
            let client = self.peers.upsert(&target.name, &target.addr);
            let kind = req.kind();
            let payload = serde_json::to_vec(&req)
                .map_err(|e| TransportError::Network(format!("encode raft {kind}: {e}")))?;
            drop(req);
            let reply = client
                .raft(Bytes::from(payload), timeout)
                .await
                .map_err(transport_error)?;
            serde_json::from_slice(&reply)
                .map_err(|e| TransportError::Network(format!("decode raft {kind} reply: {e}")))
        })
    }
}

/// The receiving side: serves `Raft` frames with `Meta::handle_raft_rpc`. Install it with
/// `RpcServer::set_raft_handler` once the `Meta` is open. With `require_proof` (security on)
/// it refuses Raft frames from callers whose handshake proved nothing (see `auth`).
pub struct MetaRaftHandler {
    meta: Meta,
    require_proof: bool,
}

impl MetaRaftHandler {
    pub fn new(meta: Meta, require_proof: bool) -> Arc<MetaRaftHandler> {
        Arc::new(MetaRaftHandler {
            meta,
            require_proof,
        })
    }
}

impl RaftHandler for MetaRaftHandler {
    fn handle_raft<'a>(
        &'a self,
        caller: &'a Caller,
        payload: Bytes,
    ) -> BoxFuture<'a, Result<Bytes, String>> {
        Box::pin(async move {
            let from = &*caller.node_id;
            if self.require_proof && !caller.proven {
                return Err(super::auth::AUTH_FAILED.to_string());
            }
            let req: RaftRequest = serde_json::from_slice(&payload).map_err(|e| {
                tracing::warn!(node = from, error = %e, "undecodable raft request");
                format!("bad raft request: {e}")
            })?;
            drop(payload);
            let reply = self.meta.handle_raft_rpc(req).await;
            serde_json::to_vec(&reply)
                .map(Bytes::from)
                .map_err(|e| format!("encode raft reply: {e}"))
        })
    }
}
