//! The dispatcher's [`Router`]: placement from the metadata, local partitions from the
//! registry, remote owners over node RPC.

use std::sync::Arc;

use bytes::Bytes;

use super::wire::CommitBatch;
use super::{reply_error, Cluster, TopicLookup};
use crate::partition::Registry;
use crate::rpc::{BoxFuture, Opcode, COMMIT_TIMEOUT};
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
                match self
                    .registry
                    .topic(topic_id)
                    .and_then(|rt| rt.partition(partition).map(|p| (rt, p)))
                {
                    Some((rt, p)) => Route::Local(rt, p),
                    None => Route::NotReady,
                }
            }
            Some(o) => Route::Remote {
                owner: o.to_string(),
                dead: !Cluster::is_alive(&self.cluster.meta.view(), o),
            },
        }
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
        batch: CommitBatch,
    ) -> BoxFuture<'static, Result<(), String>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let body: Bytes = batch.encode();
            match cluster
                .call(&owner, Opcode::CommitProduceBatch, body, COMMIT_TIMEOUT)
                .await
            {
                Ok(r) if r.is_success() => Ok(()),
                Ok(r) => Err(format!("{owner} answered {}", reply_error(&r))),
                Err(e) => Err(e.message),
            }
        })
    }
}

/// Fan-out copies to a child partition owned by another node: `CommitProduceBatch` to its
/// owner, which commits with the same fsync-and-verify commit (SPEC §5.1). Fan-out never
/// reroutes: a dead owner stalls the cursor until it returns.
pub struct RemoteChildCommitter {
    pub cluster: Arc<Cluster>,
}

impl crate::fanout::ChildCommitter for RemoteChildCommitter {
    fn commit(
        &self,
        child: Arc<narad_meta::Topic>,
        partition: u32,
        records: Vec<narad_storage::NewRecord>,
    ) -> crate::fanout::sink::CommitFuture<'_> {
        Box::pin(async move {
            let owner = Cluster::owner(&child, partition)
                .ok_or_else(|| {
                    crate::fanout::CommitError(format!(
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
                    })
                    .collect(),
            };
            match self
                .cluster
                .call(
                    &owner,
                    Opcode::CommitProduceBatch,
                    batch.encode(),
                    COMMIT_TIMEOUT,
                )
                .await
            {
                Ok(r) if r.is_success() => Ok(()),
                Ok(r) => Err(crate::fanout::CommitError(format!(
                    "{owner} answered {}",
                    reply_error(&r)
                ))),
                Err(e) => Err(crate::fanout::CommitError(e.message)),
            }
        })
    }
}
