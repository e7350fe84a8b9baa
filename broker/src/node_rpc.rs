//! The node-RPC adapter: the server side of every opcode this build serves (SPEC §6.6),
//! beside the HTTP one (`api`); both are given the same [`App`]. Anything else is answered
//! `400 unsupported rpc operation <n>`, which a caller reads as "peer too old".

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use narad_meta::{MetaCommand, MetaError};
use narad_storage::NewRecord;

use crate::app::App;
use crate::clock::now_ms;
use crate::cluster::wire::{
    AssignmentRequest, ChunkRequest, CommitBatch, ConsumeRequest, ForwardProduce, GetTopicReply,
    GetTopicRequest, HandoffRequest, JoinReply, JoinRequest, PartitionRef, ProposeReply,
    ProposeRequest, SettleRequest, StatsRequest, TransferRequest,
};
use crate::cluster::{forward_opcode, TopicLookup};
use crate::delivery::{ConsumeAsk, Delivery};
use crate::error::{ApiError, ErrorCode};
use crate::rpc::{BoxFuture, Caller, Opcode, RpcHandler, RpcReply};
use crate::wal::WalRecord;

/// Serves node RPCs once the node is built (`503` before).
#[derive(Default)]
pub struct NodeRpc {
    app: OnceLock<Arc<App>>,
}

impl NodeRpc {
    pub fn new() -> Arc<NodeRpc> {
        Arc::new(NodeRpc::default())
    }
    pub fn set_app(&self, app: Arc<App>) {
        let _ = self.app.set(app);
    }
}

impl RpcHandler for NodeRpc {
    fn handle<'a>(&'a self, caller: &'a Caller, op: u8, body: Bytes) -> BoxFuture<'a, RpcReply> {
        Box::pin(async move {
            let from = &*caller.node_id;
            let Some(app) = self.app.get().cloned() else {
                return RpcReply::fail(ErrorCode::Starting, "node is starting");
            };
            // Second line behind the handshake: with security on, nothing is served to a
            // caller that proved no secret (a node never runs that way; see `rpc::auth`).
            if app.config.security.enabled && !caller.proven {
                return RpcReply::fail(ErrorCode::Forbidden, crate::rpc::auth::AUTH_FAILED);
            }
            app.metrics
                .rpc_served
                .get_or_create(&crate::metrics::RpcOpLabels { opcode: op })
                .inc();
            // Test knob `NARAD_TEST_RPC_UNSUPPORTED`: play a node of an older build.
            let simulated_unknown = app.config.test.rpc_unsupported.contains(&op);
            let Some(opcode) = Opcode::from_u8(op).filter(|_| !simulated_unknown) else {
                return RpcReply::unsupported(op);
            };
            match opcode {
                Opcode::CreateTopic
                | Opcode::AlterTopic
                | Opcode::DeleteTopic
                | Opcode::RegisterMember
                | Opcode::CreateUser
                | Opcode::UpdateUser
                | Opcode::DeleteUser
                | Opcode::AttachChild
                | Opcode::AttachRemoteChild
                | Opcode::DetachChild
                | Opcode::CompleteMove
                | Opcode::AbortMove
                | Opcode::DecommissionMember => propose(&app, from, opcode, &body).await,
                Opcode::ListPartitionSegments => match json::<PartitionRef>(&body) {
                    Ok(req) => crate::placement::moves::serve_list(&app.moves, req).await,
                    Err(r) => r,
                },
                Opcode::FetchSegmentChunk => match json::<ChunkRequest>(&body) {
                    Ok(req) => crate::placement::moves::serve_chunk(&app.moves, req).await,
                    Err(r) => r,
                },
                Opcode::PrepareHandoff => match json::<HandoffRequest>(&body) {
                    Ok(req) => crate::placement::moves::serve_handoff(&app.moves, from, req).await,
                    Err(r) => r,
                },
                Opcode::GetAssignment => match json::<AssignmentRequest>(&body) {
                    Ok(req) => crate::placement::moves::serve_assignment(&app.moves, req).await,
                    Err(r) => r,
                },
                Opcode::GetTopic => get_topic(&app, &body).await,
                Opcode::TransferLeadership => match json::<TransferRequest>(&body) {
                    Ok(req) => match app.meta.elect_now(req.last_index).await {
                        Ok(()) => RpcReply::new(204, crate::rpc::proto::JSON, Bytes::new()),
                        Err(e) => meta_error_reply(e),
                    },
                    Err(r) => r,
                },
                Opcode::JoinCluster => join(&app, &body).await,
                Opcode::Produce => produce(&app, body, false).await,
                Opcode::ProduceAttrs => produce(&app, body, true).await,
                Opcode::CommitProduceBatch => commit(&app, from, body, None, false).await,
                Opcode::CommitProduceBatchAttrs => commit(&app, from, body, None, true).await,
                Opcode::CommitProduce => commit(&app, from, body, Some(1), false).await,
                Opcode::Consume => match json::<ConsumeRequest>(&body) {
                    Ok(req) => consume(&app.delivery, req).await,
                    Err(r) => r,
                },
                Opcode::Ack | Opcode::ExtendAck | Opcode::Nack | Opcode::AckBatch => {
                    match json::<SettleRequest>(&body) {
                        Ok(req) => settle(&app.delivery, req, opcode == Opcode::AckBatch),
                        Err(r) => r,
                    }
                }
                Opcode::SettleWith => match json::<SettleRequest>(&body) {
                    Ok(req) => settle_with(&app.delivery, req).await,
                    Err(r) => r,
                },
                Opcode::FanoutCursors => {
                    match json::<crate::cluster::wire::ChildCursorsRequest>(&body) {
                        Ok(req) => match app.cluster.topic_by_id(req.parent_id) {
                            TopicLookup::Known(t) => RpcReply::json(
                                200,
                                &app.children.partition_lags(&app.meta.view(), &t),
                            ),
                            _ => RpcReply::fail(ErrorCode::Unavailable, "topic not known here"),
                        },
                        Err(r) => r,
                    }
                }
                Opcode::RemoteLinkStates => {
                    match json::<crate::cluster::wire::ChildCursorsRequest>(&body) {
                        Ok(req) => match app.cluster.topic_by_id(req.parent_id) {
                            TopicLookup::Known(t) => {
                                let states: std::collections::BTreeMap<_, _> = app
                                    .children
                                    .remote_states(&app.meta.view(), &t)
                                    .into_iter()
                                    .map(|(link, s)| {
                                        let state = crate::cluster::wire::RemoteLinkState {
                                            state: s.state.as_str().to_string(),
                                            last_error: s.last_error,
                                        };
                                        (link, state)
                                    })
                                    .collect();
                                RpcReply::json(200, &states)
                            }
                            _ => RpcReply::fail(ErrorCode::Unavailable, "topic not known here"),
                        },
                        Err(r) => r,
                    }
                }
                Opcode::RepositionPartitions => {
                    match json::<crate::cluster::wire::RepositionRequest>(&body) {
                        Ok(req) => match app.topic_by_id_current(req.topic_id).await {
                            TopicLookup::Known(t) => RpcReply::json(
                                200,
                                &app.delivery
                                    .reposition_here(&t, &req.partitions, req.to)
                                    .await,
                            ),
                            _ => RpcReply::fail(ErrorCode::Unavailable, "topic not known here"),
                        },
                        Err(r) => r,
                    }
                }
                Opcode::TopicPartitionStats => match json::<StatsRequest>(&body) {
                    Ok(req) => stats(&app, req).await,
                    Err(r) => r,
                },
                _ => RpcReply::unsupported(op),
            }
        })
    }
}

fn json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, RpcReply> {
    serde_json::from_slice(body)
        .map_err(|e| RpcReply::fail(ErrorCode::BadRequest, format!("bad request: {e}")))
}

fn meta_error_reply(e: MetaError) -> RpcReply {
    ApiError::from(e).to_reply()
}

/// A metadata command forwarded to this node as leader.
async fn propose(app: &App, from: &str, op: Opcode, body: &[u8]) -> RpcReply {
    let req: ProposeRequest = match json(body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let mut cmd = req.command;
    if forward_opcode(&cmd) != Some(op) {
        return RpcReply::fail(
            ErrorCode::BadRequest,
            format!("command does not travel with opcode {}", op.code()),
        );
    }
    if let MetaCommand::RegisterMember { id, now_ms: at, .. } = &mut cmd {
        // Heartbeats are judged on the leader's clock.
        if id != from {
            return RpcReply::fail(ErrorCode::Forbidden, "a node registers only itself");
        }
        *at = now_ms();
        // A member the leader removed after its decommission stays out (it keeps running
        // until it is scaled down, and keeps heartbeating).
        if app.meta.is_leader() && !app.meta.voters().iter().any(|(v, _)| v == from) {
            return RpcReply::fail(ErrorCode::Conflict, "not a voter of this cluster (removed)");
        }
    }
    if app.cluster.handing_off() {
        return RpcReply::fail(
            ErrorCode::LeaderHandingOff,
            "not the metadata leader; handing leadership off",
        );
    }
    if !app.meta.is_leader() {
        let leader = app.meta.current_leader().map(|l| l.0);
        return RpcReply::fail(
            ErrorCode::NotLeader,
            &match leader {
                Some(l) => format!("not the metadata leader; the leader is {l}"),
                None => "not the metadata leader; no leader known".into(),
            },
        );
    }
    match app.cluster.leader_write(cmd).await {
        Ok((response, index)) => RpcReply::json(200, &ProposeReply { response, index }),
        Err(e) => meta_error_reply(e),
    }
}

async fn get_topic(app: &App, body: &[u8]) -> RpcReply {
    let req: GetTopicRequest = match json(body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if !app.meta.is_leader() {
        return RpcReply::fail(ErrorCode::NotLeader, "not the metadata leader");
    }
    match app.meta.barrier().await {
        Ok(index) => RpcReply::json(
            200,
            &GetTopicReply {
                index,
                topic: req
                    .name
                    .and_then(|n| app.meta.view().topics.get(&n).map(|t| (**t).clone())),
            },
        ),
        Err(e) => meta_error_reply(e),
    }
}

async fn join(app: &App, body: &[u8]) -> RpcReply {
    let req: JoinRequest = match json(body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let initialized = app.meta.is_initialized().await;
    let leader = app.meta.current_leader().map(|l| l.0);
    if req.probe || !initialized {
        return RpcReply::json(
            200,
            &JoinReply {
                initialized,
                leader,
                admitted: false,
            },
        );
    }
    if !app.meta.is_leader() {
        return RpcReply::fail(
            ErrorCode::NotLeader,
            format!(
                "not the metadata leader; the leader is {}",
                leader.as_deref().unwrap_or("unknown")
            ),
        );
    }
    if !app.cluster.clustered {
        return RpcReply::fail(ErrorCode::Conflict, "a standalone node cannot be joined");
    }
    match app.meta.add_voter(&req.id, &req.cluster_addr).await {
        Ok(()) => RpcReply::json(
            200,
            &JoinReply {
                initialized: true,
                leader,
                admitted: true,
            },
        ),
        Err(e) => meta_error_reply(e),
    }
}

/// `Produce` (or `ProduceAttrs`, `with_attrs`) from a draining node: `202 {"accepted": n}`
/// once stored here.
async fn produce(app: &App, body: Bytes, with_attrs: bool) -> RpcReply {
    let req = match ForwardProduce::decode(body, with_attrs) {
        Ok(r) => r,
        Err(e) => return RpcReply::fail(ErrorCode::BadRequest, &e),
    };
    let records = req
        .records
        .into_iter()
        .map(|r| WalRecord {
            topic_id: req.topic_id,
            partition: r.partition,
            pinned: r.pinned,
            key: r.key,
            payload: r.payload,
            attrs: r.attrs,
        })
        .collect();
    match app.ingest.store_forwarded(req.topic_id, records).await {
        Ok(accepted) => RpcReply::json(202, &narad_api::BatchProduceResponse { accepted }),
        Err(e) => e.to_reply(),
    }
}

/// `CommitProduceBatch`: commit into a partition this node owns; `200` once visible.
/// `CommitProduceBatch`, `CommitProduceBatchAttrs` (`with_attrs`), or `CommitProduce`
/// (`exactly: Some(1)`: the same encoding holding one record).
async fn commit(
    app: &Arc<App>,
    from: &str,
    body: Bytes,
    exactly: Option<usize>,
    with_attrs: bool,
) -> RpcReply {
    let batch = match CommitBatch::decode(body, with_attrs) {
        Ok(b) => b,
        Err(e) => return RpcReply::fail(ErrorCode::BadRequest, &e),
    };
    if let Some(n) = exactly.filter(|n| *n != batch.records.len()) {
        return RpcReply::fail(
            ErrorCode::BadRequest,
            format!(
                "this operation commits {n} record, got {}",
                batch.records.len()
            ),
        );
    }
    let topic = match app.cluster.topic_by_id(batch.topic_id).for_write() {
        Ok(t) => t,
        Err(e) => return e.to_reply(),
    };
    if !app.cluster.is_mine(&topic, batch.partition) {
        return RpcReply::fail(
            ErrorCode::NotOwner,
            format!(
                "partition {} of {} is not owned by {}",
                batch.partition, topic.name, app.node_id
            ),
        );
    }
    let rt = match app.runtime(&topic) {
        Ok(rt) => rt,
        Err(e) => return e.to_reply(),
    };
    let Some(part) = rt.partition(batch.partition) else {
        return RpcReply::fail(ErrorCode::Unavailable, "partition not open here yet");
    };
    let records: Vec<NewRecord> = batch
        .records
        .into_iter()
        .map(|r| NewRecord {
            key: r.key,
            payload: r.payload,
            attrs: r.attrs,
        })
        .collect();
    let ids: Option<Vec<String>> = tracing::enabled!(target: "narad_trace", tracing::Level::TRACE)
        .then(|| {
            records
                .iter()
                .map(|r| {
                    String::from_utf8_lossy(&r.payload[..r.payload.len().min(20)]).into_owned()
                })
                .collect()
        });
    // Batches from several senders to this partition share a commit.
    let result = crate::group_commit::commit_grouped(&part, records).await;
    if let Some(ids) = ids {
        tracing::trace!(target: "narad_trace", from, partition = part.index, hwm = part.log.high_watermark(), ok = result.is_ok(), records = ?ids, "owner commit");
    }
    match result {
        Ok(()) => RpcReply::new(200, crate::rpc::proto::JSON, Bytes::from_static(b"{}")),
        Err(e) if e.refused => RpcReply::fail(ErrorCode::CommitRefused, &e.reason),
        Err(e) => {
            app.metrics.error("dispatcher", "commit");
            RpcReply::fail(ErrorCode::Internal, format!("commit failed: {}", e.reason))
        }
    }
}

/// A reply carrying a consume or replay answer: `200` with it, `204` without, or the error.
fn answer(r: crate::error::ApiResult<Option<Vec<u8>>>) -> RpcReply {
    match r {
        Ok(Some(body)) => RpcReply::new(200, crate::rpc::proto::JSON, body),
        Ok(None) => RpcReply::new(204, crate::rpc::proto::JSON, Bytes::new()),
        Err(e) => e.to_reply(),
    }
}

/// A consume, pinned consume or replay forwarded by another node: served from this node's
/// own partitions only (never forwarded again); the reply is the HTTP answer.
async fn consume(delivery: &Delivery, req: ConsumeRequest) -> RpcReply {
    let topic = match delivery.topic_by_id_current(req.topic_id).await {
        TopicLookup::Known(t) => t,
        TopicLookup::Deleted => return ApiError::topic_not_found(&req.topic).to_reply(),
        TopicLookup::Unknown => {
            return RpcReply::fail(
                ErrorCode::Unavailable,
                "topic not known on its owner yet; retry",
            );
        }
    };
    if let Some(p) = req.partition {
        if p >= topic.config.partitions {
            return RpcReply::fail(ErrorCode::BadRequest, format!("partition {p} out of range"));
        }
        if !delivery.owns(&topic, p) {
            return RpcReply::fail(
                ErrorCode::Unavailable,
                format!("partition {p} is not owned by this node"),
            );
        }
    }
    if let Some(offset) = req.offset {
        return answer(
            delivery
                .replay_here(&topic, req.partition.unwrap_or(0), offset)
                .await,
        );
    }
    let ask = ConsumeAsk {
        partition: req.partition,
        max: req.max,
        wait: Duration::from_millis(req.wait_ms),
    };
    answer(delivery.consume_here(&topic, ask).await)
}

/// Settles with a parameter forwarded by another node (`SettleWith`): a `BatchAckResponse`
/// once the delays are durable.
async fn settle_with(delivery: &Delivery, req: SettleRequest) -> RpcReply {
    let topic = match delivery.topic_by_id(req.topic_id) {
        TopicLookup::Known(t) => t,
        TopicLookup::Deleted => return ApiError::topic_not_found(&req.topic).to_reply(),
        TopicLookup::Unknown => {
            return RpcReply::fail(ErrorCode::Unavailable, "topic not known here yet; retry")
        }
    };
    if !req.kind().has_parameter() {
        return RpcReply::fail(
            ErrorCode::BadRequest,
            "SettleWith needs a delay or a visibility",
        );
    }
    let results = delivery
        .settle_forwarded_with(&topic, &req.handles, req.kind())
        .await;
    RpcReply::json(200, &narad_api::BatchAckResponse { results })
}

/// Settles forwarded by another node (`Ack`, `ExtendAck`, `Nack`: one handle, `204` or an
/// error; `AckBatch`: a `BatchAckResponse`).
fn settle(delivery: &Delivery, req: SettleRequest, batch: bool) -> RpcReply {
    let topic = match delivery.topic_by_id(req.topic_id) {
        TopicLookup::Known(t) => t,
        TopicLookup::Deleted => return ApiError::topic_not_found(&req.topic).to_reply(),
        TopicLookup::Unknown => {
            return RpcReply::fail(ErrorCode::Unavailable, "topic not known here yet; retry")
        }
    };
    if batch {
        let results = delivery.settle_forwarded(&topic, &req.handles, req.kind());
        return RpcReply::json(200, &narad_api::BatchAckResponse { results });
    }
    match req.handles.first() {
        Some(h) => match delivery.settle_owned(&topic, h, req.kind()) {
            Ok(()) => RpcReply::new(204, crate::rpc::proto::JSON, Bytes::new()),
            Err(e) => e.to_reply(),
        },
        None => RpcReply::fail(ErrorCode::BadRequest, "receipt_handle required"),
    }
}

async fn stats(app: &App, req: StatsRequest) -> RpcReply {
    if let Some(index) = req.min_index {
        app.catch_up_to(index).await;
    }
    let topic = match app.topic_by_id_current(req.topic_id).await {
        TopicLookup::Known(t) => t,
        _ => return RpcReply::fail(ErrorCode::Unavailable, "topic not known here"),
    };
    app.delivery.make_visible(&topic, None).await;
    let stats: Vec<narad_api::PartitionStats> = req
        .partitions
        .iter()
        .filter(|p| app.cluster.is_mine(&topic, **p))
        .map(|p| app.queries.partition_stats(&topic, *p))
        .collect();
    RpcReply::json(200, &stats)
}
