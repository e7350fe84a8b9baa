//! Purge and seek (SPEC (ext) §3.8): moving the queue frontier of a topic's partitions, on
//! this node's partitions and, through their owners, on others'.

use narad_api::PartitionFrontier;
use narad_meta::Topic;

use super::Delivery;
use crate::cluster::wire::{RepositionOutcome, RepositionRequest};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::partition::{Position, RepositionError};

impl Delivery {
    /// Moves the frontier of `partitions` of `topic` to `to`, each on its owner (one call per
    /// owner, concurrently). Every partition is attempted; when one could not be moved the
    /// answer is its error (the first by partition), naming the others that did not move
    /// either: those that did stay moved, and the request can be repeated.
    pub async fn reposition(
        &self,
        topic: &Topic,
        partitions: &[u32],
        to: Position,
    ) -> ApiResult<Vec<PartitionFrontier>> {
        // A purge covers what this node acknowledged, wherever its owner is.
        self.make_visible(topic, None).await;
        let mut mine = Vec::new();
        let mut by_owner: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
        for &p in partitions {
            match crate::cluster::Cluster::owner(topic, p) {
                Some(o) if o == self.node_id => mine.push(p),
                // Unassigned partitions go under no owner ("").
                o => by_owner
                    .entry(o.unwrap_or_default().to_string())
                    .or_default()
                    .push(p),
            }
        }
        let here = self.reposition_here(topic, &mine, to);
        let view = self.meta.view();
        let remote = by_owner.into_iter().map(|(owner, ps)| {
            let alive = !owner.is_empty() && crate::cluster::Cluster::is_alive(&view, &owner);
            async move {
                let failed = |code: ErrorCode, why: String| -> Vec<RepositionOutcome> {
                    ps.iter()
                        .map(|p| outcome_err(*p, &ApiError::new(code, why.clone())))
                        .collect()
                };
                if owner.is_empty() {
                    return failed(ErrorCode::Unavailable, "it has no owner yet".into());
                }
                if !alive {
                    return failed(ErrorCode::Unavailable, format!("its owner {owner} is down"));
                }
                let req = RepositionRequest {
                    topic_id: topic.id,
                    topic: topic.name.clone(),
                    partitions: ps.clone(),
                    to,
                };
                match self.cluster.ask(&owner, &req).await {
                    Ok(got) => ps
                        .iter()
                        .map(|p| {
                            got.iter()
                                .find(|o| o.partition == *p)
                                .cloned()
                                .unwrap_or_else(|| {
                                    outcome_err(
                                        *p,
                                        &ApiError::unavailable(
                                            format!("{owner} does not own it"),
                                            1,
                                        ),
                                    )
                                })
                        })
                        .collect(),
                    Err(e) => failed(e.code, format!("its owner {owner}: {}", e.message)),
                }
            }
        });
        let (here, remote) = tokio::join!(here, futures::future::join_all(remote));
        let mut all: Vec<RepositionOutcome> = here
            .into_iter()
            .chain(remote.into_iter().flatten())
            .collect();
        all.sort_by_key(|o| o.partition);
        // Messages this node kept for its consumers were leased before: hand them back.
        let kept = self.prefetch.take_all(topic.id);
        self.release_kept(topic, kept);
        let failed: Vec<&RepositionOutcome> = all.iter().filter(|o| o.error.is_some()).collect();
        if let Some(first) = failed.first() {
            let (code, why) = first.error.clone().expect("invariant: filtered on error");
            let code = ErrorCode::from_number(code).unwrap_or(ErrorCode::Unavailable);
            let others: Vec<String> = failed[1..]
                .iter()
                .map(|o| o.partition.to_string())
                .collect();
            let mut message = format!("partition {} of {}: {why}", first.partition, topic.name);
            if !others.is_empty() {
                message.push_str(&format!(
                    " (partitions {} did not move either; the others did)",
                    others.join(", ")
                ));
            }
            return Err(ApiError::new(code, message));
        }
        Ok(all
            .into_iter()
            .map(|o| PartitionFrontier {
                partition: o.partition,
                previous_frontier: o.previous_frontier,
                frontier: o.frontier,
            })
            .collect())
    }

    /// Moves the frontier of those of `partitions` this node owns; the others answer
    /// not-owner (their caller's view is behind).
    pub async fn reposition_here(
        &self,
        topic: &Topic,
        partitions: &[u32],
        to: Position,
    ) -> Vec<RepositionOutcome> {
        if partitions.is_empty() {
            return Vec::new();
        }
        self.make_visible(topic, None).await;
        let rt = match self.runtime(topic) {
            Ok(rt) => rt,
            Err(e) => return partitions.iter().map(|p| outcome_err(*p, &e)).collect(),
        };
        let mut out = Vec::with_capacity(partitions.len());
        for &p in partitions {
            let part = match rt.partition(p) {
                Some(part) if self.owns(topic, p) => part,
                _ => {
                    out.push(outcome_err(
                        p,
                        &ApiError::unavailable(
                            format!("partition {p} is not owned by this node"),
                            1,
                        ),
                    ));
                    continue;
                }
            };
            let moved = tokio::task::spawn_blocking(move || part.reposition(to))
                .await
                .unwrap_or_else(|e| Err(RepositionError::Storage(e.to_string())));
            out.push(match moved {
                Ok((previous, frontier)) => {
                    tracing::info!(topic = %topic.name, partition = p, previous, frontier, ?to, "queue frontier moved");
                    RepositionOutcome {
                        partition: p,
                        previous_frontier: previous,
                        frontier,
                        error: None,
                    }
                }
                Err(e) => outcome_err(p, &reposition_error(e)),
            });
        }
        out
    }
}

fn reposition_error(e: RepositionError) -> ApiError {
    match e {
        RepositionError::Moving => ApiError::unavailable("it is moving to another node; retry", 1),
        RepositionError::OutOfRange {
            offset,
            oldest,
            high_watermark,
        } => ApiError::bad_request(format!(
            "offset {offset} is outside the log: it holds offsets {oldest} up to its high watermark {high_watermark}"
        )),
        RepositionError::Storage(why) => ApiError::internal(why),
    }
}

fn outcome_err(partition: u32, e: &ApiError) -> RepositionOutcome {
    RepositionOutcome {
        partition,
        previous_frontier: 0,
        frontier: 0,
        error: Some((e.code.number(), e.message.clone())),
    }
}
