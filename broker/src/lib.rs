//! Narad: a queue-first message broker over plain HTTP.
//!
//! The map (who owns what):
//! - `config`: the effective `Config`, layered from defaults, file, env and flags.
//! - `node`: the composition root: builds everything below, spawns the background tasks and
//!   stops them in order. `Node` holds the handles, and also the cross-node stats and lag
//!   queries, root seeding, frontier persistence, retention and idle-log eviction.
//! - `wal`: the ingress write-ahead log (group commit) and its `dispatcher`, which commits
//!   produced records into partition logs. Its module doc states the durability contract.
//! - `group_commit`: concurrent callers' records into one partition commit (a produce to a
//!   partition this node owns skips the WAL and commits here; peers' commit batches too).
//! - `fanout`: child topics (SPEC §5): cursors copying committed parent records into child
//!   partitions through the same commit path.
//! - `partition`: a locally owned partition (log + lease table + persisted frontier) and the
//!   `Registry` of local topics.
//! - `partitioner`: the key → partition hash produce and fan-out share (SPEC §2.3).
//! - `leases`: `LeaseTable`, the pure queue core of a partition (leases, redelivery, frontier,
//!   caps).
//! - `schema`: JSON Schema compile, validate and the compatibility rule.
//! - `delivery`: consume, replay and settle (`Delivery`), here and through other owners
//!   (forwarding, prefetch, coalesced settles); knows neither HTTP nor the RPC server.
//! - `api`: the HTTP routes; owns no state.
//! - `cluster`: the node's view of its peers (`Cluster`: connections, metadata writes
//!   forwarded to the leader, catch-up reads, owner lookups), membership, the leader's
//!   controller, partition moves, the node-RPC server side (`handler`), its payloads
//!   (`wire`) and the table of every opcode's types, timeout and fallback (`calls`).
//! - `rpc`: the cluster port's frames, HMAC handshake, multiplexed client and server, and
//!   the Raft transport over it.
//! - `security`: users, grants, authentication (cache, throttle) and authorization; `tls`:
//!   the reloading TLS configurations of both ports.
//! - `clock`: wall-clock Unix milliseconds and microseconds.
//! - `metrics`, `telemetry`: Prometheus metrics and structured logs.
//! - `error`: `ApiError` with its stable `ErrorCode`, the one error edge: mapped to HTTP
//!   (SPEC §3.11) and carried over node RPC.
//!
//! The partition log itself is the `narad-storage` crate; the Raft metadata is `narad-meta`.

pub mod api;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod delivery;
pub mod error;
pub mod fanout;
pub mod group_commit;
pub mod leases;
pub mod metrics;
pub mod node;
pub mod partition;
pub mod partitioner;
pub mod rpc;
pub mod schema;
pub mod security;
pub mod telemetry;
#[cfg(test)]
mod test_support;
pub mod tls;
pub mod wal;
