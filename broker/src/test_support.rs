//! Fixtures shared by the unit tests of several modules.

use std::path::Path;
use std::time::Duration;

use narad_meta::{Assignment, Meta, MetaCommand, MetaOptions, Topic, TopicConfig};

/// `partitions` partitions with the SPEC's default settings and no retention.
pub fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        retention_ms: 0,
        visibility_timeout_ms: 30_000,
        max_in_flight_per_partition: 1024,
        max_acked_ahead_per_partition: 1024,
        retry_backoff: None,
        dead_letter: None,
        dedup_window_ms: None,
    }
}

/// The metadata command creating topic `name` with [`config`]`(partitions)`.
pub fn create_topic(name: &str, partitions: u32) -> MetaCommand {
    MetaCommand::CreateTopic {
        name: name.into(),
        config: config(partitions),
        owner: None,
        schema: None,
        created_at_ms: 1_000,
    }
}

/// A standalone node `n1`'s metadata in `dir/metastore`, once it leads (bounded: a hang
/// guard).
pub async fn standalone_meta(dir: &Path) -> Meta {
    let meta = Meta::open_standalone(
        &dir.join("metastore"),
        MetaOptions {
            node_id: "n1".into(),
            cluster_addr: String::new(),
        },
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while meta.current_leader().is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a standalone node leads");
    meta
}

/// Node `n1`'s cluster view over `meta`, with the default timing: standalone without `seeds`,
/// clustered with them.
pub fn cluster(
    meta: &Meta,
    auth: crate::rpc::ClusterAuth,
    seeds: Vec<(String, String)>,
) -> std::sync::Arc<crate::cluster::Cluster> {
    std::sync::Arc::new(crate::cluster::Cluster::new(
        "n1".into(),
        meta.clone(),
        crate::rpc::Peers::new("n1", auth),
        seeds,
        vec![],
        String::new(),
        crate::cluster::Timing {
            heartbeat: Duration::from_secs(5),
            dead_after: Duration::from_secs(30),
        },
        100,
    ))
}

/// Topic `name` with id `id` and one partition per entry of `owners` (its owner), with the
/// SPEC's default settings and no retention.
pub fn topic(id: u64, name: &str, owners: &[&str]) -> Topic {
    Topic {
        id,
        name: name.to_string(),
        config: config(owners.len() as u32),
        created_at_ms: 0,
        owner: None,
        schemas: vec![],
        assignments: owners
            .iter()
            .map(|o| Assignment {
                owner: Some(o.to_string()),
                target: None,
                move_id: 0,
            })
            .collect(),
        paused: false,
    }
}
