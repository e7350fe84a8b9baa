//! Narad: a queue-first message broker over plain HTTP.
//!
//! The map (who owns what), from the top down; a module imports only from those below it
//! (the `layering` test fails on an import cycle):
//! - `node`: the composition root: builds everything below from a `Config`, spawns every
//!   background task into one task tracker and stops them in order, awaiting each.
//! - `housekeeping`: frontier persistence, retention, idle-log eviction, metadata apply.
//! - `api` (HTTP) and `node_rpc` (the cluster port's server side): the two adapters. They
//!   parse, authorize, call a service and render; they own no state.
//! - `console`: the web console at `/ui` (ext), static files embedded from `console/` whose
//!   script calls `/v1`; it owns no state.
//! - `app`: `App`, the handles to the services both adapters are given.
//! - `queries`: topic statistics from every owner, children's lag, remote links' state,
//!   waiting for the members to apply a topic change.
//! - `placement`: partition moves (`Moves`) and the leader's move and decommission
//!   `Controller`.
//! - `ingest`: produce — partition choice, schema validation, storage (WAL, direct commit,
//!   or a draining node's hand-off).
//! - `delivery`: consume, replay and settle (`Delivery`), here and through other owners
//!   (forwarding, prefetch, coalesced settles).
//! - `health`: starting, ready, in or out of service, stopping (`/readyz`, shutdown signal).
//! - `cluster`: the node's view of its peers (`Cluster`: connections, metadata writes
//!   forwarded to the leader, catch-up reads, owner lookups), membership, the router the
//!   dispatcher and fan-out send records through, node-RPC payloads (`wire`) and the table
//!   of every opcode's types, timeout and fallback (`calls`).
//! - `children`: child topics (SPEC §5): the cursors that copy committed parent records into
//!   child partitions through the same commit path (the copying is "fan-out", SPEC §5.1).
//! - `dedup`: idempotent produce (ext): the idempotency window a partition's commit checks.
//! - `delayed`: delayed produce (ext): the store that holds a produce with a `delay` until
//!   it is due, then stages it in the ingress WAL.
//! - `wal`: the ingress write-ahead log (group commit) and its `dispatcher`, which commits
//!   produced records into partition logs. Its module doc states the durability contract.
//! - `group_commit`: concurrent callers' records into one partition commit (the dispatcher,
//!   peers' commit batches and, with `NARAD_WAL_SKIP_LOCAL`, direct produce).
//! - `partition`: a locally owned partition (log + lease table + persisted frontier) and the
//!   `Registry` of local topics.
//! - `leases`: `LeaseTable`, the pure queue core of a partition (leases, redelivery, frontier,
//!   caps).
//! - `partitioner`: the key → partition hash produce and fan-out share (SPEC §2.3).
//! - `schema`: JSON Schema compile, validate and the compatibility rule.
//! - `rpc`: the cluster port's frames, HMAC handshake, multiplexed client and server, and
//!   the Raft transport over it.
//! - `security`: users, grants, authentication (cache, throttle) and authorization; `tls`:
//!   the reloading TLS configurations of both ports.
//! - `config`: the effective `Config`, layered from defaults, file, env and flags.
//! - `clock`: wall-clock Unix milliseconds and microseconds.
//! - `metrics`, `telemetry`: Prometheus metrics and structured logs.
//! - `error`: `ApiError` with its stable `ErrorCode`, the one error edge: mapped to HTTP
//!   (SPEC §3.11) and carried over node RPC.
//!
//! The partition log itself is the `narad-storage` crate; the Raft metadata is `narad-meta`.
//!
//! One name per thing: child topics are "children" in code, API and metadata (`ChildLink` is
//! the metadata record of one attachment, a "link"). "fanout" remains only where the SPEC fixes
//! it on the wire or on disk: the `fanout.*` configuration keys (`config.fanout`), the
//! `narad_fanout_*` metrics, opcode 17 `FanoutCursors`, the `fanout` kind of a plain child,
//! `fanout_delay_ms`, and the `fanout/` cursor directory of a partition.

pub mod api;
pub mod app;
pub mod attrs;
pub mod children;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod console;
pub mod dedup;
pub mod delayed;
pub mod delivery;
pub mod error;
pub mod group_commit;
pub mod health;
pub mod housekeeping;
pub mod ingest;
#[cfg(test)]
mod layering;
pub mod leases;
pub mod metrics;
pub mod node;
pub mod node_rpc;
pub mod partition;
pub mod partitioner;
pub mod placement;
pub mod queries;
pub mod rpc;
pub mod schema;
pub mod security;
pub mod telemetry;
#[cfg(test)]
mod test_support;
pub mod tls;
pub mod wal;
