//! The dispatcher's [`Router`]: placement from the metadata, local partitions from the
//! registry, remote owners over node RPC.

use std::sync::Arc;

use narad_storage::NewRecord;

use super::calls::{Call, CommitOne};
use super::wire::{CommitBatch, CommitRecord};
use super::{Cluster, TopicLookup};
use crate::error::ApiError;
use crate::partition::Registry;
use crate::rpc::BoxFuture;
use crate::wal::dispatcher::{Route, Router};

pub struct NodeRouter {
    pub cluster: Arc<Cluster>,
    pub registry: Arc<Registry>,
}

impl Router for NodeRouter {
    fn route(&self, topic_id: u64, partition: u32) -> Route {
        let topic = match self.cluster.topic_by_id(topic_id) {
            TopicLookup::Known(t) => t,
            TopicLookup::Deleted => return Route::Gone,
            TopicLookup::Unknown => return Route::NotReady,
        };
        match Cluster::owner(&topic, partition) {
            None => Route::NotReady,
            Some(o) if o == self.cluster.node_id => {
                match self.registry.local(topic_id, partition) {
                    Some(p) => Route::Local(p),
                    None => Route::NotReady,
                }
            }
            Some(o) => Route::Remote {
                owner: o.to_string(),
                dead: !Cluster::is_alive(&self.cluster.meta.view(), o),
            },
        }
    }

    fn lazy(&self, topic_id: u64, partition: u32) -> bool {
        self.registry
            .topic(topic_id)
            .is_some_and(|rt| rt.consumers_waiting() == 0 && rt.partition(partition).is_some())
    }

    fn reroute(&self, topic_id: u64, from: u32, usable: &dyn Fn(u32) -> bool) -> Option<u32> {
        let TopicLookup::Known(topic) = self.cluster.topic_by_id(topic_id) else {
            return None;
        };
        let view = self.cluster.meta.view();
        let n = topic.config.partitions;
        (1..n).map(|i| (from + i) % n).find(|p| {
            usable(*p) && Cluster::owner(&topic, *p).is_some_and(|o| Cluster::is_alive(&view, o))
        })
    }

    fn commit_remote(
        &self,
        owner: String,
        topic_id: u64,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> BoxFuture<'static, Result<(), String>> {
        let cluster = self.cluster.clone();
        // The wire form, at the edge.
        let batch = CommitBatch {
            topic_id,
            partition,
            records: records
                .into_iter()
                .map(|r| CommitRecord {
                    key: r.key,
                    payload: r.payload,
                    attrs: r.attrs,
                })
                .collect(),
        };
        Box::pin(async move { commit_on(&cluster, &owner, batch).await })
    }
}

/// Commits `batch` on `owner` with `CommitProduceBatch`; a peer too old for it (SPEC §6.6)
/// gets one `CommitProduce` per record instead. A failure part-way fails the whole batch,
/// whose re-send then duplicates the records already committed (never a gap). A batch with
/// attributes (`CommitProduceBatchAttrs`) has no older form: a peer too old for it fails the
/// commit (retried by the caller until the peer is upgraded), never drops the attributes.
pub async fn commit_on(cluster: &Cluster, owner: &str, batch: CommitBatch) -> Result<(), String> {
    let failed = |e: ApiError| format!("commit on {owner}: {e}");
    match cluster
        .ask_or_older(owner, &batch, CommitBatch::TIMEOUT)
        .await
    {
        Ok(Some(())) => return Ok(()),
        Ok(None) if batch.has_attrs() => {
            return Err(format!(
                "commit on {owner}: the peer is too old for message attributes"
            ))
        }
        Ok(None) => {}
        Err(e) => return Err(failed(e)),
    }
    let CommitBatch {
        topic_id,
        partition,
        records,
    } = batch;
    for record in records {
        let one = CommitOne(CommitBatch {
            topic_id,
            partition,
            records: vec![record],
        });
        cluster.ask(owner, &one).await.map_err(failed)?;
    }
    Ok(())
}

/// Fan-out copies to a child partition owned by another node: `CommitProduceBatch` to its
/// owner, which commits with the same fsync-and-verify commit (SPEC §5.1). Fan-out never
/// reroutes: a dead owner stalls the cursor until it returns.
pub struct RemoteChildCommitter {
    pub cluster: Arc<Cluster>,
}

impl crate::children::ChildCommitter for RemoteChildCommitter {
    fn commit(
        &self,
        child: Arc<narad_meta::Topic>,
        partition: u32,
        records: Vec<narad_storage::NewRecord>,
    ) -> crate::children::sink::CommitFuture<'_> {
        Box::pin(async move {
            let owner = Cluster::owner(&child, partition)
                .ok_or_else(|| {
                    crate::children::ChildCommitError(format!(
                        "partition {partition} of child topic {} is not assigned yet",
                        child.name
                    ))
                })?
                .to_string();
            let batch = CommitBatch {
                topic_id: child.id,
                partition,
                records: records
                    .into_iter()
                    .map(|r| super::wire::CommitRecord {
                        key: r.key,
                        payload: r.payload,
                        attrs: r.attrs,
                    })
                    .collect(),
            };
            commit_on(&self.cluster, &owner, batch)
                .await
                .map_err(crate::children::ChildCommitError)
        })
    }
}
