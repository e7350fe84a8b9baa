//! Where fan-out copies go: [`ChildCommitter`] commits a batch to one child partition and
//! answers only once it is durable and visible (the same fsync-and-verify commit as a
//! produce). [`RoutedCommitter`] commits locally when this node owns the child partition and
//! hands everything else to a remote committer.
//!
//! The remote committer is `cluster::router::RemoteChildCommitter` (node RPC
//! `CommitProduceBatch` to the child partition's owner, which commits with the same
//! fsync-and-verify path). A dead owner stalls the cursor (`Retry`), as SPEC §5.1 asks:
//! fan-out never reroutes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use narad_meta::Topic;
use narad_storage::NewRecord;

use super::io::IoThreads;
use crate::partition::Registry;
use crate::wal::dispatcher::commit_records;

pub type CommitFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ChildCommitError>> + Send + 'a>>;

/// A failed child commit. Nothing of the batch is visible; the cursor retries it (with
/// backoff) and does not advance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ChildCommitError(pub String);

/// Commits fan-out copies to a child partition.
pub trait ChildCommitter: Send + Sync + 'static {
    /// Commits `records` to partition `partition` of `child` (keys and payloads exact);
    /// `Ok` only once they are fsynced, verified and below the high watermark.
    fn commit(
        &self,
        child: Arc<Topic>,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> CommitFuture<'_>;
}

/// Commits a batch to a child partition this node owns (blocking work on the fan-out I/O
/// threads; the commit wakes the child's waiting consumers).
pub async fn commit_local(
    io: &IoThreads,
    registry: &Registry,
    child: &Topic,
    partition: u32,
    records: Vec<NewRecord>,
) -> Result<(), ChildCommitError> {
    let rt = registry
        .topic(child.id)
        .ok_or_else(|| ChildCommitError(format!("child topic {} is not open here", child.name)))?;
    let part = rt.partition(partition).ok_or_else(|| {
        ChildCommitError(format!(
            "partition {partition} of child topic {} is not open here",
            child.name
        ))
    })?;
    io.run(move || commit_records(&part, &records))
        .await
        .map_err(|e| ChildCommitError(format!("commit task failed: {e}")))?
        .map_err(ChildCommitError)?;
    Ok(())
}

/// Local when this node owns the child partition, else the remote committer (if any).
pub struct RoutedCommitter {
    node_id: String,
    registry: Arc<Registry>,
    io: Arc<IoThreads>,
    remote: Option<Arc<dyn ChildCommitter>>,
}

impl RoutedCommitter {
    pub fn new(
        node_id: String,
        registry: Arc<Registry>,
        io: Arc<IoThreads>,
        remote: Option<Arc<dyn ChildCommitter>>,
    ) -> Self {
        RoutedCommitter {
            node_id,
            registry,
            io,
            remote,
        }
    }
}

impl ChildCommitter for RoutedCommitter {
    fn commit(
        &self,
        child: Arc<Topic>,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> CommitFuture<'_> {
        Box::pin(async move {
            let owner = child
                .assignments
                .get(partition as usize)
                .and_then(|a| a.owner.clone());
            match owner {
                Some(o) if o == self.node_id => {
                    commit_local(&self.io, &self.registry, &child, partition, records).await
                }
                Some(o) => match &self.remote {
                    Some(r) => r.commit(child, partition, records).await,
                    None => Err(ChildCommitError(format!(
                        "partition {partition} of child topic {} is owned by {o}; no remote \
                         commit path on this node",
                        child.name
                    ))),
                },
                None => Err(ChildCommitError(format!(
                    "partition {partition} of child topic {} is not assigned yet",
                    child.name
                ))),
            }
        })
    }
}
