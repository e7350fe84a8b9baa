//! Node-to-node RPC on the cluster port (SPEC §4.5, §6.6, §11): one TCP port (7943) carries
//! both node RPCs and the metadata Raft traffic.
//!
//! - `proto`: the frame format, frame types, the opcode registry, request/reply payloads.
//! - `auth`: the HMAC challenge–response every connection starts with; [`ClusterSecret`].
//! - `server`: [`RpcServer`]: accepts, authenticates, dispatches requests concurrently to an
//!   [`RpcHandler`], Raft frames to a [`RaftHandler`]; graceful shutdown.
//! - `client`: [`PeerClient`] (one multiplexed connection per peer, lazy connect, reconnect,
//!   per-request timeouts, typed [`RpcError`]s) and the [`Peers`] registry.
//! - `transport`: plain TCP or mutual TLS under the frames, [`ClusterAuth`] (secret + TLS).
//! - `raft_net`: [`RpcRaftTransport`] (narad-meta's `RaftTransport` over `Raft` frames) and
//!   [`MetaRaftHandler`] (the receiving side, `Meta::handle_raft_rpc`).
//!
//! # Semantics in one paragraph
//!
//! A reply carries an HTTP status that the forwarding node returns to its own client 1:1; a
//! non-2xx reply is `Ok(RpcReply)`, not an error. `RpcError` is for everything below that:
//! `Unreachable` and `NotSent` (never written to the connection: safe to retry or go
//! elsewhere), `Timeout`, `Disconnected` and `BadReply` (written, outcome unknown:
//! [`RpcError::outcome_unknown`]), `Auth`, `Protocol`, and `PeerTooOld { op }` (the peer
//! answered `400 unsupported rpc operation <op>` with code `RpcUnsupported`: retry
//! elsewhere, later, or with an older opcode — see [`PeerClient::call_with_fallback`]). This
//! is what keeps mixed-version rolling upgrades safe. A non-2xx reply's body carries the
//! stable `crate::error::ErrorCode`, which callers decide on (`ApiError::from_reply`); the
//! opcodes' request and reply types, timeouts and fallbacks are in one table,
//! `crate::cluster::calls`.

pub mod auth;
pub mod client;
pub mod proto;
pub mod raft_net;
pub mod server;
pub mod transport;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;

pub use auth::ClusterSecret;
pub use client::{
    FaultPoint, PeerClient, Peers, RpcError, RpcFault, COMMIT_TIMEOUT, DEFAULT_TIMEOUT,
};
pub use proto::{Opcode, RpcReply};
pub use raft_net::{MetaRaftHandler, RpcRaftTransport};
pub use server::{handler_fn, Caller, RaftHandler, RpcHandler, RpcServer, ServerStats};
pub use transport::ClusterAuth;

/// A boxed, sendable future (keeps the handler traits object-safe without `async_trait`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
