//! Consumes and settles on other owners (SPEC §6.3): a pinned consume or a replay goes to
//! its partition's owner; a queue consume probes the remote owners and keeps what a probe
//! brought beyond its own need for the next consumes here (`prefetch`); settles travel to
//! the owner, coalesced per (owner, topic, kind).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_api::AckResult;
use narad_meta::Topic;

use super::prefetch::Stashed;
use super::{ConsumeAsk, Delivery, SettleKind};
use crate::cluster::calls::{Call, SettleBatch, SettleOne};
use crate::cluster::wire::{ConsumeRequest, SettleRequest};
use crate::cluster::{Cluster, TopicLookup};
use crate::error::{ApiError, ApiResult};
use crate::partition::TopicRuntime;
use crate::rpc::RpcReply;

/// Single settles on their way to an owner: keyed by (owner, topic id, kind).
pub type SettleCoalescer = super::coalesce::Coalescer<(String, u64, SettleKind), String, AckResult>;

/// The bytes of kept messages one answer takes.
const PREFETCH_BUDGET: usize = super::render::PREFETCH_BUDGET;

/// A remote owner's answer to a consume or replay: its body (`200`), nothing (`204`), or its
/// error as the owner gave it.
fn answer(reply: RpcReply) -> ApiResult<Option<Vec<u8>>> {
    match reply.status {
        204 => Ok(None),
        _ if reply.is_success() => Ok(Some(reply.body.to_vec())),
        _ => Err(ApiError::from_reply(&reply)),
    }
}

impl Delivery {
    /// A pinned consume of partition `p`, which `owner` owns, with the consume's full wait.
    pub(super) async fn forward_pinned(
        &self,
        topic: &Topic,
        owner: &str,
        p: u32,
        ask: ConsumeAsk,
    ) -> ApiResult<Option<Vec<u8>>> {
        answer(
            self.forward_consume(owner, topic, Some(p), None, ask.max, ask.wait)
                .await?,
        )
    }

    /// A replay of `partition`, which `owner` owns.
    pub(super) async fn forward_replay(
        &self,
        topic: &Topic,
        owner: &str,
        partition: u32,
        offset: u64,
    ) -> ApiResult<Option<Vec<u8>>> {
        answer(
            self.forward_consume(
                owner,
                topic,
                Some(partition),
                Some(offset),
                None,
                Duration::ZERO,
            )
            .await?,
        )
    }

    /// Sends a consume (a replay with `offset`) to `owner`, which serves it from its own
    /// partitions; waits `wait` plus the default RPC timeout for the answer.
    async fn forward_consume(
        &self,
        owner: &str,
        topic: &Topic,
        partition: Option<u32>,
        offset: Option<u64>,
        max: Option<u32>,
        wait: Duration,
    ) -> ApiResult<RpcReply> {
        let req = ConsumeRequest {
            topic_id: topic.id,
            topic: topic.name.clone(),
            partition,
            offset,
            max,
            wait_ms: wait.as_millis() as u64,
        };
        self.cluster.relay(owner, &req, wait).await
    }

    /// The live owners of the topic's partitions other than this node, rotated per call so
    /// consumers spread over them.
    pub(super) fn remote_owners(&self, topic: &Topic) -> Vec<String> {
        if !self.cluster.clustered {
            return Vec::new();
        }
        let view = self.meta.view();
        let mut owners: Vec<String> = topic
            .assignments
            .iter()
            .filter_map(|a| a.owner.as_deref())
            .filter(|o| *o != self.node_id && Cluster::is_alive(&view, o))
            .map(str::to_string)
            .collect();
        owners.sort();
        owners.dedup();
        if owners.len() > 1 {
            let k = (crate::clock::now_micros() as usize) % owners.len();
            owners.rotate_left(k);
        }
        owners
    }

    /// Up to `want` kept messages of the topic, if there are any; kept messages that can no
    /// longer be handed out go back to their owners.
    pub(super) fn take_kept(&self, topic: &Topic, want: usize) -> Option<Vec<Bytes>> {
        let view = self.meta.view();
        let (kept, stale) = self.prefetch.take(topic.id, want, PREFETCH_BUDGET, |o| {
            Cluster::is_alive(&view, o)
        });
        self.release_kept(topic, stale);
        (!kept.is_empty()).then(|| kept.into_iter().map(|s| s.body).collect())
    }

    /// Asks each remote owner once for messages (`wait` 0); the first `200` wins. With other
    /// consumes of the topic running here it asks for one message each and keeps the extra
    /// ones for them (see `prefetch`), waking them.
    pub(super) async fn probe_remotes(
        &self,
        topic: &Topic,
        rt: &TopicRuntime,
        want: usize,
        max: Option<u32>,
        remotes: &[String],
    ) -> Option<Vec<u8>> {
        let fetch = self.prefetch.fetch_size(topic.id, want);
        let ask = if fetch > want {
            Some(fetch as u32)
        } else {
            max
        };
        for owner in remotes {
            let forwarded = self.forward_consume(owner, topic, None, None, ask, Duration::ZERO);
            let r = match forwarded.await {
                Ok(r) if r.status == 200 => r,
                Ok(_) => continue,
                // Skipped either way: a probe lost after it was sent may have leased messages
                // on the owner, which come back when their visibility timeout runs out (no
                // handle reached anyone), so the consume goes on with the other owners.
                Err(e) => {
                    tracing::debug!(owner = %owner, status = e.status().as_u16(), error = %e.message, "consume probe failed");
                    continue;
                }
            };
            if ask == max {
                return Some(r.body.to_vec());
            }
            let usable = Duration::from_millis(topic.config.visibility_timeout_ms / 2);
            match self.prefetch.split(topic.id, owner, &r.body, want, usable) {
                Ok(split) => {
                    if split.kept > 0 {
                        rt.notify.notify_waiters();
                    }
                    if !split.mine.is_empty() {
                        return Some(super::prefetch::render(&split.mine, max.is_some()));
                    }
                }
                Err(e) => {
                    tracing::warn!(owner = %owner, error = %e, "unreadable batch consume answer");
                }
            }
        }
        None
    }

    /// Releases kept messages that can no longer be handed out (`Nack` to their owners), in
    /// the background.
    pub(super) fn release_kept(&self, topic: &Topic, items: Vec<Stashed>) {
        if items.is_empty() {
            return;
        }
        let mut by_owner: Vec<(String, Vec<String>)> = Vec::new();
        for s in items {
            match by_owner.iter_mut().find(|(o, _)| *o == s.owner) {
                Some((_, v)) => v.push(s.handle),
                None => by_owner.push((s.owner, vec![s.handle])),
            }
        }
        let (cluster, topic) = (self.cluster.clone(), topic.clone());
        tokio::spawn(async move {
            for (owner, handles) in by_owner {
                settle_remote(&cluster, &topic, &owner, handles, SettleKind::Release).await;
            }
        });
    }

    /// Releases every kept message (a stopping node), waiting for the owners' answers.
    pub async fn release_all_kept(&self) {
        let kept = self.prefetch.drain();
        let mut groups: Vec<((u64, String), Vec<String>)> = Vec::new();
        for (topic_id, s) in kept {
            let key = (topic_id, s.owner);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(s.handle),
                None => groups.push((key, vec![s.handle])),
            }
        }
        for ((topic_id, owner), handles) in groups {
            if let TopicLookup::Known(topic) = self.cluster.topic_by_id(topic_id) {
                settle_remote(&self.cluster, &topic, &owner, handles, SettleKind::Release).await;
            }
        }
    }

    /// Settles one handle on its owner; concurrent settles of the same (owner, topic, kind)
    /// travel together in one `AckBatch` call.
    pub(super) async fn settle_remote_one(
        &self,
        topic: &Arc<Topic>,
        owner: String,
        handle: String,
        how: SettleKind,
    ) -> AckResult {
        let key = (owner.clone(), topic.id, how);
        let key_owner = owner.clone();
        let (cluster, t) = (self.cluster.clone(), topic.clone());
        let call = move |handles: Vec<String>| {
            let (cluster, t, owner) = (cluster.clone(), t.clone(), owner.clone());
            async move { settle_remote(&cluster, &t, &owner, handles, how).await }
        };
        self.settles
            .submit(key, handle, call)
            .await
            .unwrap_or_else(|| {
                // The call ran (and may have settled it) but answered nothing for this handle.
                let e = ApiError::uncertain(format!(
                    "the settle call to {} gave no answer for this handle",
                    key_owner
                ));
                AckResult {
                    status: e.status().as_u16(),
                    error: Some(e.message),
                }
            })
    }
}

/// Settles handles on their owner over node RPC (`AckBatch`, or one call per handle with the
/// opcode of its kind for an owner of an older build); one result per handle, in order.
pub(super) async fn settle_remote(
    cluster: &Cluster,
    topic: &Topic,
    owner: &str,
    handles: Vec<String>,
    how: SettleKind,
) -> Vec<AckResult> {
    let n = handles.len();
    let fail = |e: &ApiError| AckResult {
        status: e.status().as_u16(),
        error: Some(e.message.clone()),
    };
    let request =
        |handles: Vec<String>| SettleRequest::new(topic.id, topic.name.clone(), how, handles);
    let batch = SettleBatch(request(handles.clone()));
    match cluster
        .ask_or_older(owner, &batch, SettleBatch::TIMEOUT)
        .await
    {
        Ok(Some(b)) if b.results.len() == n => b.results,
        Ok(Some(_)) => vec![
            fail(&ApiError::internal(format!(
                "bad settle reply from {owner}"
            )));
            n
        ],
        // An owner of an older build cannot delay or set a visibility: it would redeliver
        // early. Nothing was done; the consumer may retry, or settle without the parameter.
        Ok(None) if how.has_parameter() => vec![
            fail(&ApiError::unavailable(
                format!("the owner {owner} of this partition runs an older build without delay and visibility; retry later"),
                5,
            ));
            n
        ],
        // An owner of an older build: one settle per handle with the opcode of its kind.
        Ok(None) => {
            let mut out = Vec::with_capacity(n);
            for h in handles {
                out.push(
                    match cluster.ask(owner, &SettleOne(request(vec![h]))).await {
                        Ok(()) => AckResult {
                            status: 204,
                            error: None,
                        },
                        Err(e) => fail(&e),
                    },
                );
            }
            out
        }
        Err(e) => vec![fail(&e); n],
    }
}
