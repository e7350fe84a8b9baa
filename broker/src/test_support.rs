//! Fixtures shared by the unit tests of several modules.

use narad_meta::{Assignment, Topic, TopicConfig};

/// Topic `name` with id `id` and one partition per entry of `owners` (its owner), with the
/// SPEC's default settings and no retention.
pub fn topic(id: u64, name: &str, owners: &[&str]) -> Topic {
    Topic {
        id,
        name: name.to_string(),
        config: TopicConfig {
            partitions: owners.len() as u32,
            retention_ms: 0,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
        },
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
    }
}
