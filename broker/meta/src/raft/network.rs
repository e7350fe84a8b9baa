//! The Raft network: openraft's `RaftNetworkFactory` over a pluggable [`RaftTransport`].
//!
//! A transport moves one [`RaftRequest`] to a peer and brings back its [`RaftReply`]; both are
//! serde types, so the node-to-node RPC layer can ship them as JSON (or anything else) without
//! knowing openraft. On the receiving node it hands the request to
//! [`crate::Meta::handle_raft_rpc`] and sends the reply back unchanged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RPCTypes, RaftNetwork, RaftNetworkFactory};
use serde::{Deserialize, Serialize};

use super::{MetaNode, RaftNodeId, TypeConfig};

/// A boxed, sendable future (the transport trait is object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One Raft RPC, as sent from a leader/candidate to a peer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RaftRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<RaftNodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

impl RaftRequest {
    pub fn kind(&self) -> &'static str {
        match self {
            RaftRequest::AppendEntries(_) => "append_entries",
            RaftRequest::Vote(_) => "vote",
            RaftRequest::InstallSnapshot(_) => "install_snapshot",
        }
    }
}

/// The peer's answer to a [`RaftRequest`] (same variant), including its Raft-level refusal.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftReply {
    AppendEntries(Result<AppendEntriesResponse<RaftNodeId>, RaftError<RaftNodeId>>),
    Vote(Result<VoteResponse<RaftNodeId>, RaftError<RaftNodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<RaftNodeId>, RaftError<RaftNodeId, InstallSnapshotError>>,
    ),
}

/// Why a transport could not deliver a request or bring back its reply.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The peer is down or refuses connections: openraft backs off before retrying.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// No reply within the deadline.
    #[error("rpc timed out")]
    Timeout,
    /// Any other failure (connection reset, bad reply): openraft retries soon.
    #[error("rpc failed: {0}")]
    Network(String),
}

/// Node-to-node delivery of Raft RPCs. Implemented by the cluster RPC layer.
pub trait RaftTransport: Send + Sync + 'static {
    /// Sends `req` to `target` (its string id and cluster address) and waits at most `timeout`
    /// for the reply produced by the peer's `Meta::handle_raft_rpc`.
    fn send<'a>(
        &'a self,
        target: &'a MetaNode,
        req: RaftRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<RaftReply, TransportError>>;
}

/// The transport of a standalone node: there are no peers, every send fails.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTransport;

impl RaftTransport for NoTransport {
    fn send<'a>(
        &'a self,
        target: &'a MetaNode,
        _req: RaftRequest,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<RaftReply, TransportError>> {
        Box::pin(async move {
            Err(TransportError::Unreachable(format!(
                "standalone node has no transport to {target}"
            )))
        })
    }
}

/// openraft's network factory: one [`PeerClient`] per replication target.
#[derive(Clone)]
pub(crate) struct NetworkFactory {
    pub(crate) self_id: RaftNodeId,
    pub(crate) transport: Arc<dyn RaftTransport>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: RaftNodeId, node: &MetaNode) -> PeerClient {
        PeerClient {
            self_id: self.self_id,
            target,
            node: node.clone(),
            transport: self.transport.clone(),
        }
    }
}

pub(crate) struct PeerClient {
    self_id: RaftNodeId,
    target: RaftNodeId,
    node: MetaNode,
    transport: Arc<dyn RaftTransport>,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<RaftNodeId, MetaNode, E>;

impl PeerClient {
    async fn call<E: std::error::Error>(
        &self,
        action: RPCTypes,
        req: RaftRequest,
        option: &RPCOption,
    ) -> Result<RaftReply, RpcErr<E>> {
        let timeout = option.soft_ttl();
        self.transport
            .send(&self.node, req, timeout)
            .await
            .map_err(|e| match e {
                TransportError::Unreachable(_) => RPCError::Unreachable(Unreachable::new(&e)),
                TransportError::Timeout => RPCError::Timeout(Timeout {
                    action,
                    id: self.self_id,
                    target: self.target,
                    timeout,
                }),
                TransportError::Network(_) => RPCError::Network(NetworkError::new(&e)),
            })
    }

    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<RaftNodeId, MetaNode, E> {
        RPCError::RemoteError(RemoteError::new_with_node(
            self.target,
            self.node.clone(),
            e,
        ))
    }

    fn mismatch<E: std::error::Error>(
        &self,
        reply: &RaftReply,
    ) -> RPCError<RaftNodeId, MetaNode, E> {
        let e = TransportError::Network(format!("mismatched raft reply {reply:?}"));
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<RaftNodeId>, RpcErr<RaftError<RaftNodeId>>> {
        match self
            .call(
                RPCTypes::AppendEntries,
                RaftRequest::AppendEntries(rpc),
                &option,
            )
            .await?
        {
            RaftReply::AppendEntries(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.mismatch(&other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<RaftNodeId>,
        RpcErr<RaftError<RaftNodeId, InstallSnapshotError>>,
    > {
        match self
            .call(
                RPCTypes::InstallSnapshot,
                RaftRequest::InstallSnapshot(rpc),
                &option,
            )
            .await?
        {
            RaftReply::InstallSnapshot(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.mismatch(&other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<RaftNodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<RaftNodeId>, RpcErr<RaftError<RaftNodeId>>> {
        match self
            .call(RPCTypes::Vote, RaftRequest::Vote(rpc), &option)
            .await?
        {
            RaftReply::Vote(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.mismatch(&other)),
        }
    }
}
