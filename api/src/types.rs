//! Wire types of the `/v1` HTTP API (SPEC §3). Field names and omission rules are the
//! contract with the Go SDK (CLIENT-COMPAT.md): change them only with the SPEC.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

fn is_false(b: &bool) -> bool {
    !*b
}
fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// The one error body: `{"error":"<message>"}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

/// `POST /v1/topics` body. Strict: unknown fields are refused (`owner` is accepted and ignored).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTopicRequest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i64>,
    /// Absent = default; 0 = forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight_per_partition: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_acked_ahead_per_partition: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// A JSON Schema (draft 2020-12) every produced payload must satisfy.
    #[schema(value_type = Option<serde_json::Value>)]
    pub schema: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout_delay_ms: Option<i64>,
    /// Ignored (the owner is the caller).
    #[serde(default, skip_serializing)]
    pub owner: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<RetryBackoff>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// (ext) How long a produce's `Idempotency-Key` is remembered, ms (1 s to 24 h; absent:
    /// 5 minutes; `0` on alter: back to the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<i64>,
}

/// (ext) A topic's dead-letter setting: a message delivered `max_deliveries` times (1 to
/// 1000) without being acknowledged is committed to topic `topic` instead of being delivered
/// again, then settled here. `"max_deliveries": 0` turns it off (on alter).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetter {
    #[serde(default)]
    pub topic: String,
    pub max_deliveries: u32,
}

/// (ext) The answer of `POST /v1/topics/{t}/redrive`: how many messages were moved, and to
/// which topics.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Redriven {
    pub moved: u64,
    /// Messages per target topic.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub to: std::collections::BTreeMap<String, u64>,
    /// Messages left where they were, with why (no target known, the target refused them).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub skipped: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// (ext) Exponential backoff of redeliveries after an expired lease or a plain nack: the
/// message waits `min` after its first delivery, twice that after its second, and so on, at
/// most `max` (Go durations, 1 ms to 12 h; `"min": "0s"` turns it off).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBackoff {
    pub min: String,
    pub max: String,
}

/// `PATCH /v1/topics/{topic}` body. Strict.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AlterTopicRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight_per_partition: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_acked_ahead_per_partition: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// A JSON Schema (draft 2020-12) every produced payload must satisfy.
    #[schema(value_type = Option<serde_json::Value>)]
    pub schema: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_base_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<RetryBackoff>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// (ext) How long a produce's `Idempotency-Key` is remembered, ms (1 s to 24 h; absent:
    /// 5 minutes; `0` on alter: back to the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<i64>,
}

/// The topic record (SPEC §3.2), with stats when read by `GET /v1/topics/{topic}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TopicRecord {
    pub name: String,
    pub partitions: u32,
    pub retention_ms: u64,
    pub visibility_timeout_ms: u64,
    pub max_in_flight_per_partition: u64,
    pub max_acked_ahead_per_partition: u64,
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach_epoch: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub fanout_delay_ms: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_children: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// A JSON Schema (draft 2020-12) every produced payload must satisfy.
    #[schema(value_type = Option<serde_json::Value>)]
    pub schema: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_stats: Option<Vec<PartitionStats>>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub partial: bool,
    /// (ext) The queue's backlog over the partitions in `partition_stats` whose owners
    /// answered (with `partial`, a lower bound), for autoscalers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<Backlog>,
    /// (ext) Consumes answer `204` without leasing while set (`POST …/pause`, `…/resume`);
    /// produce, replay and children go on.
    #[serde(default, skip_serializing_if = "is_false")]
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<RetryBackoff>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// (ext) How long a produce's `Idempotency-Key` is remembered, ms (1 s to 24 h; absent:
    /// 5 minutes; `0` on alter: back to the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<i64>,
}

/// (ext) The body of `POST /v1/topics/{t}/seek`: a partition and an offset, or a time
/// (Unix seconds, like a message's `timestamp`) for one partition or all of them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SeekRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
}

/// (ext) The answer of `POST /v1/topics/{t}/purge` and `…/seek`: each partition's queue
/// frontier before and after.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Repositioned {
    pub topic: String,
    pub partitions: Vec<PartitionFrontier>,
}

/// One partition of [`Repositioned`]: every offset below `frontier` is settled now, and
/// delivery resumes at it.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct PartitionFrontier {
    pub partition: u32,
    pub previous_frontier: u64,
    pub frontier: u64,
}

/// (ext) A queue's backlog: of the messages not settled yet, those waiting for a consumer
/// (`messages`) and those leased now (`in_flight`), and how long the oldest unsettled one has
/// been waiting since its commit.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Backlog {
    pub messages: u64,
    pub in_flight: u64,
    pub oldest_unacked_age_seconds: u64,
}

impl RetryBackoff {
    /// The backoff of `min_ms` and `max_ms` in Go durations (`0, 0`: off).
    pub fn from_ms(min_ms: u64, max_ms: u64) -> RetryBackoff {
        let go = |ms| crate::duration::format_go_duration(std::time::Duration::from_millis(ms));
        RetryBackoff {
            min: go(min_ms),
            max: go(max_ms),
        }
    }

    /// `(min, max)` in milliseconds; `None` when either is not a Go duration.
    pub fn to_ms(&self) -> Option<(u64, u64)> {
        let ms = |v: &str| {
            crate::duration::parse_go_duration(v)
                .ok()
                .map(|d| d.as_millis() as u64)
        };
        Some((ms(&self.min)?, ms(&self.max)?))
    }
}

impl Backlog {
    /// Adds a partition's backlog: counts add up, the age is the oldest.
    pub fn add(&mut self, other: &Backlog) {
        self.messages += other.messages;
        self.in_flight += other.in_flight;
        self.oldest_unacked_age_seconds = self
            .oldest_unacked_age_seconds
            .max(other.oldest_unacked_age_seconds);
    }
}

/// One entry of `partition_stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct PartitionStats {
    pub index: u32,
    pub segments: u64,
    pub oldest_offset: u64,
    pub next_offset: u64,
    pub high_watermark: u64,
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_segment_at: Option<u64>,
    #[serde(default)]
    pub owner_node: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_liveness: Option<String>,
    /// (ext) This partition's backlog (absent when its owner did not answer, or is of a
    /// build that does not report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<Backlog>,
}

/// `GET /v1/topics` answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TopicList {
    pub topics: Vec<TopicRecord>,
    #[serde(default)]
    pub next_page_token: String,
}

/// One element of a batch produce.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchMessage {
    #[schema(value_type = serde_json::Value)]
    pub payload: Box<RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i64>,
    /// (ext) Attributes stored beside the key (names case-insensitive, stored lowercased).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<std::collections::BTreeMap<String, String>>,
    /// (ext) Enters its partition no earlier than this after acceptance (`90s`, `1m`; at
    /// most 15m; `0` or absent: at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// (ext) A retry with the same key within the topic's `dedup_window_ms` is answered but
    /// not stored again (1 to 128 visible ASCII bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// (ext) Longest `delay` of a produce (SQS's limit).
pub const MAX_PRODUCE_DELAY: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// (ext) Parses a produce's `delay` (`90s`, `1m30s`, `1500ms`; 0 = none; not negative) up to
/// [`MAX_PRODUCE_DELAY`].
pub fn parse_produce_delay(v: &str) -> Result<std::time::Duration, String> {
    let d =
        crate::duration::parse_go_duration(v).map_err(|e| format!("invalid delay {v:?}: {e}"))?;
    if d > MAX_PRODUCE_DELAY {
        return Err(format!("delay {v:?} is longer than 15m"));
    }
    Ok(d)
}

/// (ext) A topic's `dedup_window_ms` when it sets none: 5 minutes.
pub const DEFAULT_DEDUP_WINDOW_MS: u64 = 5 * 60 * 1000;
/// (ext) The values a topic's `dedup_window_ms` may take: 1 s to 24 h.
pub const DEDUP_WINDOW_MS: std::ops::RangeInclusive<u64> = 1000..=24 * 3600 * 1000;

/// `POST /v1/topics/{topic}/produce/batch` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchProduceRequest {
    pub messages: Vec<BatchMessage>,
}

/// `202` answer of a batch produce.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BatchProduceResponse {
    pub accepted: usize,
}

/// A consumed (or replayed) message (SPEC §3.5).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Message {
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_encoding: Option<String>,
    #[schema(value_type = serde_json::Value)]
    pub payload: Box<RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_encoding: Option<String>,
    pub timestamp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_handle: Option<String>,
    /// (ext) How often this message was delivered, this delivery included (leased only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_count: Option<u32>,
    /// (ext) The attributes the producer sent (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<std::collections::BTreeMap<String, String>>,
}

/// `GET .../consume?max=M` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MessageBatch {
    pub messages: Vec<Message>,
}

/// Batch ack body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchAckRequest {
    pub receipt_handles: Vec<String>,
}

/// One result of a batch ack.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct AckResult {
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Batch ack answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BatchAckResponse {
    pub results: Vec<AckResult>,
}

/// `GET /v1/cluster/members` element.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MemberInfo {
    pub id: String,
    pub addr: String,
    pub status: String,
    pub draining: bool,
    pub owned_partitions: u64,
    pub outbound_moves: u64,
    pub leader: bool,
    pub version: String,
}

/// `GET /v1/cluster/members` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MemberList {
    pub members: Vec<MemberInfo>,
}

/// `/healthz` and `/readyz` success body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct StatusBody {
    pub status: String,
}

#[cfg(test)]
mod produce_rules_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn delays_parse_up_to_fifteen_minutes() {
        assert_eq!(parse_produce_delay("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_produce_delay("0"), Ok(Duration::ZERO));
        assert_eq!(parse_produce_delay("15m"), Ok(MAX_PRODUCE_DELAY));
        assert!(parse_produce_delay("15m1ms")
            .unwrap_err()
            .contains("longer than 15m"));
        assert!(parse_produce_delay("-1s").is_err());
        assert!(parse_produce_delay("soon").is_err());
    }

    proptest::proptest! {
        #[test]
        fn prop_parse_delay_never_exceeds_the_maximum(s in "\\PC{0,12}|[0-9]{1,7}(ms|s|m|h)") {
            if let Ok(d) = parse_produce_delay(&s) {
                proptest::prop_assert!(d <= MAX_PRODUCE_DELAY);
            }
        }
    }
}
