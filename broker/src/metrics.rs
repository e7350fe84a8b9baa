//! Prometheus metrics (SPEC §9), prefix `narad_`. Hot paths hold cloned handles (an `Arc`
//! inside each metric) so that counting costs no label lookup or allocation; gauges of
//! queue and storage state are refreshed when `/metrics` is scraped.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

/// Every `reason` of `remote_child_send_errors_total`: `children::remote::error_reason`'s and
/// `RemoteSendError::reason`'s (the series of a link that is gone are removed by these).
pub const SEND_ERROR_REASONS: [&str; 11] = [
    "rejected",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "timeout",
    "conflict",
    "throttled",
    "server_error",
    "unexpected_status",
    "network",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub route: &'static str,
    pub method: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub topic: String,
    pub partition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub topic: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub topic: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AckReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub component: &'static str,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChildLabels {
    pub parent: String,
    pub child: String,
}

/// `remote_child_send_errors_total{parent, child, reason}` (SPEC §9 ext).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RemoteSendErrorLabels {
    pub parent: String,
    pub child: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChildPartitionLabels {
    pub parent: String,
    pub child: String,
    pub partition: String,
}

/// Most partitions a topic can have (SPEC §11): the partition label of a topic's series
/// never goes beyond.
const MAX_PARTITIONS: u32 = 108;

/// Every `outcome` of `consume_wait_seconds` (SPEC §9); [`Metrics::forget_topic`] removes each.
pub const CONSUME_OUTCOMES: [&str; 4] = ["hit", "timeout", "no_wait", "cancelled"];

/// Every `reason` of `produce_rejections_total`; [`Metrics::forget_topic`] removes each.
pub const REJECT_REASONS: [&str; 3] = ["schema", "delayed_child", "quota"];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// Handles of one partition's hot-path metrics.
#[derive(Clone)]
pub struct PartitionMetrics {
    pub produced: Counter,
    pub produced_bytes: Counter,
    pub consumed: Counter,
    pub consumed_bytes: Counter,
    pub corrupt_skipped: Counter,
    pub dropped: Counter,
    pub fsync_seconds: Histogram,
    pub flush_seconds: Histogram,
    pub flush_bytes: Counter,
    /// (ext) The topic's records dropped as repeats of an idempotency key (one series per
    /// topic, shared by its partitions).
    pub dedup_dropped: Counter,
}

/// Every metric family of the node.
pub struct Metrics {
    pub registry: Registry,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: HistogramFamily<HttpLabels>,
    pub http_in_flight: Gauge,
    pub http_bytes_in: Family<RouteLabels, Counter>,
    pub http_bytes_out: Family<RouteLabels, Counter>,
    pub produced: Family<PartitionLabels, Counter>,
    pub produced_bytes: Family<PartitionLabels, Counter>,
    pub consumed: Family<PartitionLabels, Counter>,
    pub consumed_bytes: Family<PartitionLabels, Counter>,
    pub produce_rejections: Family<ReasonLabels, Counter>,
    pub consume_wait: HistogramFamily<OutcomeLabels>,
    pub consume_empty: Family<TopicLabels, Counter>,
    pub consumer_lag: Family<PartitionLabels, Gauge>,
    pub consumer_dropped: Family<PartitionLabels, Counter>,
    pub oldest_unconsumed_age: Family<PartitionLabels, Gauge>,
    pub inflight: Family<PartitionLabels, Gauge>,
    pub acked_ahead: Family<PartitionLabels, Gauge>,
    pub corrupt_skipped: Family<PartitionLabels, Counter>,
    pub ack_rejected: Family<AckReasonLabels, Counter>,
    pub ack_extended: Family<TopicLabels, Counter>,
    pub nack: Family<TopicLabels, Counter>,
    /// (ext) Messages of a topic committed to its dead-letter topic.
    pub dead_lettered: Family<TopicLabels, Counter>,
    /// (ext) Dead-letter commits of a topic's messages that did not happen (retried when
    /// their lease lapses).
    pub dead_letter_failures: Family<TopicLabels, Counter>,
    /// (ext) Records not stored because their idempotency key was committed within the
    /// window, and keyed records sent to another partition than their key's (a retry may
    /// then be stored twice).
    pub dedup_dropped: Family<TopicLabels, Counter>,
    pub dedup_split: Counter,
    pub fsync_duration: HistogramFamily<PartitionLabels>,
    pub flush_duration: HistogramFamily<PartitionLabels>,
    pub flush_bytes: Family<PartitionLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub partition_size: Family<PartitionLabels, Gauge>,
    pub segments: Family<PartitionLabels, Gauge>,
    pub topic_bytes: Family<TopicLabels, Gauge>,
    /// (ext) Messages of the topic's partitions on this node that wait for a consumer.
    pub topic_backlog: Family<TopicLabels, Gauge>,
    pub retention_bytes_deleted: Family<PartitionLabels, Counter>,
    pub retention_messages_deleted: Family<PartitionLabels, Counter>,
    pub retention_run_duration: Histogram,
    pub data_dir_size: Gauge,
    pub data_dir_available: Gauge,
    pub open_partition_logs: Gauge,
    pub idle_logs_evicted: Counter,
    pub topics_total: Gauge,
    pub partitions_total: Gauge,
    pub boot_duration: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub build_info: Family<VersionLabels, Gauge>,
    pub raft_is_leader: Gauge,
    pub cluster_members: Family<StatusLabels, Gauge>,
    pub wal_fsyncs: Counter,
    pub wal_records: Counter,
    pub wal_first_lane_takeovers: Counter,
    /// (ext) Delayed produces this node holds until due, and those it handed over.
    pub delayed_held: Gauge,
    pub delayed_released: Counter,
    pub children: ChildMetrics,
    /// Failed sends of remote child links (SPEC §9 ext), by reason.
    pub remote_child_send_errors: Family<RemoteSendErrorLabels, Counter>,
    /// Moves this node copies in as target (SPEC §9 `moves_*`).
    pub moves_inflight: Gauge,
    pub moves_total: Family<MoveOutcomeLabels, Counter>,
    pub moves_duration: Histogram,
    pub moves_bytes: Counter,
    /// Records re-produced from old copies a force promotion left behind.
    pub moves_salvaged: Counter,
    /// `narad_rpc_served_total{opcode}`: node RPCs this node answered, by opcode (unknown
    /// ones included: they show a newer peer talking to this build).
    pub rpc_served: Family<RpcOpLabels, Counter>,
    /// The HTTP series of each (route, method, status) a request was answered with, looked
    /// up once (see [`Metrics::http_answered`]).
    http_series: parking_lot::RwLock<foldhash::HashMap<HttpLabels, HttpSeries>>,
}

/// The `http_*` series of one (route, method, status). The byte counters are made on their
/// first non-zero count, so a route that never carries a body has no byte series.
struct HttpSeries {
    requests: Counter,
    duration: Histogram,
    bytes_in: OnceLock<Counter>,
    bytes_out: OnceLock<Counter>,
}

/// Adds `n` to `route`'s counter in `family`, resolved into `cell` on first use.
fn count_bytes(
    cell: &OnceLock<Counter>,
    family: &Family<RouteLabels, Counter>,
    route: &'static str,
    n: u64,
) {
    cell.get_or_init(|| family.get_or_create(&RouteLabels { route }).clone())
        .inc_by(n);
}

/// What the edge measured of one answered request.
pub struct HttpAnswer {
    pub seconds: f64,
    /// Request body bytes (`Content-Length`).
    pub bytes_in: u64,
    /// Response body bytes, when known up front.
    pub bytes_out: Option<u64>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcOpLabels {
    pub opcode: u8,
}

/// `moves_total{outcome}`: `completed`, `force_promoted` (and `aborted`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MoveOutcomeLabels {
    pub outcome: &'static str,
}

/// Child-topic metrics (SPEC §9 "Children").
pub struct ChildMetrics {
    pub lag: Family<ChildPartitionLabels, Gauge>,
    pub due_lag: Family<ChildPartitionLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub committed: Family<ChildLabels, Counter>,
    pub dropped: Family<ChildLabels, Counter>,
    pub batch_records: Histogram,
    pub batch_bytes: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

macro_rules! reg {
    ($r:expr, $name:literal, $help:literal, $m:expr) => {{
        let m = $m;
        $r.register($name, $help, m.clone());
        m
    }};
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("narad");
        Metrics {
            http_requests: reg!(
                r,
                "http_requests",
                "HTTP requests answered",
                Family::default()
            ),
            http_duration: reg!(
                r,
                "http_request_duration_seconds",
                "HTTP request duration",
                HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram)
            ),
            http_in_flight: reg!(
                r,
                "http_requests_in_flight",
                "HTTP requests being served",
                Gauge::default()
            ),
            http_bytes_in: reg!(
                r,
                "http_request_bytes_in",
                "HTTP request body bytes",
                Family::default()
            ),
            http_bytes_out: reg!(
                r,
                "http_response_bytes_out",
                "HTTP response body bytes",
                Family::default()
            ),
            produced: reg!(
                r,
                "messages_produced",
                "Messages committed to partitions",
                Family::default()
            ),
            produced_bytes: reg!(
                r,
                "bytes_produced",
                "Payload bytes committed to partitions",
                Family::default()
            ),
            consumed: reg!(
                r,
                "messages_consumed",
                "Messages delivered under a lease",
                Family::default()
            ),
            consumed_bytes: reg!(
                r,
                "bytes_consumed",
                "Payload bytes delivered under a lease",
                Family::default()
            ),
            produce_rejections: reg!(
                r,
                "produce_rejections",
                "Produces refused",
                Family::default()
            ),
            consume_wait: reg!(
                r,
                "consume_wait_seconds",
                "Time consumes waited",
                HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram)
            ),
            consume_empty: reg!(
                r,
                "consume_empty",
                "Consumes answered 204",
                Family::default()
            ),
            consumer_lag: reg!(
                r,
                "consumer_lag_messages",
                "High watermark minus committed frontier",
                Family::default()
            ),
            consumer_dropped: reg!(
                r,
                "consumer_dropped_messages",
                "Unacked messages removed by retention",
                Family::default()
            ),
            oldest_unconsumed_age: reg!(
                r,
                "oldest_unconsumed_message_age_seconds",
                "Age of the oldest unsettled message",
                Family::default()
            ),
            inflight: reg!(r, "inflight_size", "Leased messages", Family::default()),
            acked_ahead: reg!(
                r,
                "acked_ahead_size",
                "Acked offsets parked above the frontier",
                Family::default()
            ),
            corrupt_skipped: reg!(
                r,
                "consumer_corrupt_skipped",
                "Unreadable records skipped by consumers",
                Family::default()
            ),
            ack_rejected: reg!(
                r,
                "ack_rejected",
                "Acks, extends and nacks refused",
                Family::default()
            ),
            ack_extended: reg!(r, "ack_extended", "Leases extended", Family::default()),
            nack: reg!(r, "nack", "Deliveries handed back", Family::default()),
            dead_lettered: reg!(
                r,
                "dead_lettered_messages",
                "Messages committed to the topic's dead-letter topic after their last allowed delivery",
                Family::default()
            ),
            dead_letter_failures: reg!(
                r,
                "dead_letter_failures",
                "Dead-letter commits that did not happen (tried again when the lease lapses)",
                Family::default()
            ),
            dedup_dropped: reg!(
                r,
                "dedup_dropped",
                "Produced records not stored because their idempotency key was committed within the topic's window",
                Family::default()
            ),
            dedup_split: reg!(
                r,
                "dedup_split",
                "Records with an idempotency key sent to another partition than their key's (dead or failing owner): a retry of one may be stored twice",
                Counter::default()
            ),
            flush_duration: reg!(
                r,
                "storage_flush_duration_seconds",
                "Partition append (write of new frames) time",
                HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram)
            ),
            flush_bytes: reg!(
                r,
                "storage_flush_bytes",
                "Payload bytes appended to partitions",
                Family::default()
            ),
            errors: reg!(
                r,
                "errors",
                "Internal errors by component and kind",
                Family::default()
            ),
            fsync_duration: reg!(
                r,
                "storage_fsync_duration_seconds",
                "Partition fsync + read-back verification time",
                HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram)
            ),
            partition_size: reg!(
                r,
                "partition_size_bytes",
                "Bytes on disk per partition",
                Family::default()
            ),
            segments: reg!(r, "segments", "Segments per partition", Family::default()),
            topic_backlog: reg!(
                r,
                "topic_backlog_messages",
                "Unsettled messages not leased now, on this node's partitions of the topic (sum over nodes for the topic's backlog)",
                Family::default()
            ),
            topic_bytes: reg!(
                r,
                "topic_bytes",
                "Bytes on disk per topic (this node)",
                Family::default()
            ),
            retention_bytes_deleted: reg!(
                r,
                "storage_retention_bytes_deleted",
                "Bytes removed by retention",
                Family::default()
            ),
            retention_messages_deleted: reg!(
                r,
                "storage_retention_messages_deleted",
                "Messages removed by retention",
                Family::default()
            ),
            retention_run_duration: reg!(
                r,
                "storage_retention_run_duration_seconds",
                "Retention pass time",
                latency_histogram()
            ),
            data_dir_size: reg!(
                r,
                "data_dir_size_bytes",
                "Bytes used by the data dir's file system",
                Gauge::default()
            ),
            data_dir_available: reg!(
                r,
                "data_dir_available_bytes",
                "Bytes available on the data dir's file system",
                Gauge::default()
            ),
            open_partition_logs: reg!(
                r,
                "open_partition_logs",
                "Partition logs this node holds",
                Gauge::default()
            ),
            idle_logs_evicted: reg!(
                r,
                "idle_logs_evicted",
                "Partition logs closed for idleness",
                Counter::default()
            ),
            topics_total: reg!(
                r,
                "topics_total",
                "Topics in the metadata",
                Gauge::default()
            ),
            partitions_total: reg!(
                r,
                "partitions_total",
                "Partitions in the metadata",
                Gauge::default()
            ),
            boot_duration: reg!(
                r,
                "boot_duration_seconds",
                "Time from start to serving",
                Gauge::default()
            ),
            build_info: reg!(r, "build_info", "Build information", Family::default()),
            raft_is_leader: reg!(
                r,
                "raft_is_leader",
                "1 when this node leads the metadata Raft group",
                Gauge::default()
            ),
            cluster_members: reg!(r, "cluster_members", "Members by status", Family::default()),
            moves_inflight: reg!(
                r,
                "moves_inflight",
                "Partition moves this node is copying in",
                Gauge::default()
            ),
            moves_total: reg!(r, "moves", "Finished partition moves", Family::default()),
            moves_salvaged: reg!(
                r,
                "moves_salvaged_records",
                "Records re-produced from a force-promoted partition's old copy",
                Counter::default()
            ),
            rpc_served: reg!(
                r,
                "rpc_served",
                "Node RPCs answered, by opcode",
                Family::default()
            ),
            moves_duration: reg!(
                r,
                "moves_duration_seconds",
                "Time from the start of a copy to the flip",
                Histogram::new(exponential_buckets(0.1, 2.0, 12))
            ),
            moves_bytes: reg!(
                r,
                "moves_bytes",
                "Bytes copied by partition moves",
                Counter::default()
            ),
            wal_fsyncs: reg!(
                r,
                "wal_group_commits",
                "Ingress WAL group commits (one write + fdatasync each)",
                Counter::default()
            ),
            wal_records: reg!(
                r,
                "wal_records",
                "Records written to the ingress WAL",
                Counter::default()
            ),
            wal_first_lane_takeovers: reg!(
                r,
                "wal_first_lane_takeovers",
                "Times a slow ingress WAL write and fsync (over 20 ms) moved the WAL's first lane off the runtime thread to its own",
                Counter::default()
            ),
            delayed_held: reg!(
                r,
                "delayed_messages",
                "Delayed produces held on this node until they are due",
                Gauge::default()
            ),
            delayed_released: reg!(
                r,
                "delayed_released_messages",
                "Delayed produces handed to their partitions when due",
                Counter::default()
            ),
            children: ChildMetrics {
                lag: reg!(
                    r,
                    "fanout_lag_messages",
                    "Parent records not yet copied to the child",
                    Family::default()
                ),
                due_lag: reg!(
                    r,
                    "fanout_due_lag_seconds",
                    "How long the oldest uncopied record has been due",
                    Family::default()
                ),
                committed: reg!(
                    r,
                    "fanout_committed",
                    "Records copied to the child",
                    Family::default()
                ),
                dropped: reg!(
                    r,
                    "fanout_child_dropped_messages",
                    "Parent records that retention removed before they were copied",
                    Family::default()
                ),
                batch_records: reg!(
                    r,
                    "fanout_batch_records",
                    "Records per fan-out batch",
                    Histogram::new(exponential_buckets(1.0, 4.0, 7))
                ),
                batch_bytes: reg!(
                    r,
                    "fanout_batch_bytes",
                    "Bytes per fan-out batch",
                    Histogram::new(exponential_buckets(256.0, 4.0, 9))
                ),
            },
            remote_child_send_errors: reg!(
                r,
                "remote_child_send_errors",
                "Failed sends of remote child links (retried, blocked or skipped), by reason",
                Family::default()
            ),
            http_series: Default::default(),
            registry: r,
        }
    }

    /// Counts one answered request in `http_requests_total`,
    /// `http_request_duration_seconds` and the body byte counters of its route. The series
    /// of a (route, method, status) are looked up in their families once: every later
    /// request costs one read lock and a fast hash, not four lookups with SipHash.
    pub fn http_answered(&self, labels: HttpLabels, a: HttpAnswer) {
        if let Some(series) = self.http_series.read().get(&labels) {
            return self.count_http(series, labels.route, a);
        }
        let mut map = self.http_series.write();
        let series = map.entry(labels.clone()).or_insert_with(|| HttpSeries {
            requests: self.http_requests.get_or_create(&labels).clone(),
            duration: self.http_duration.get_or_create(&labels).clone(),
            bytes_in: OnceLock::new(),
            bytes_out: OnceLock::new(),
        });
        self.count_http(series, labels.route, a);
    }

    fn count_http(&self, series: &HttpSeries, route: &'static str, a: HttpAnswer) {
        series.requests.inc();
        series.duration.observe(a.seconds);
        if a.bytes_in > 0 {
            count_bytes(&series.bytes_in, &self.http_bytes_in, route, a.bytes_in);
        }
        if let Some(n) = a.bytes_out {
            count_bytes(&series.bytes_out, &self.http_bytes_out, route, n);
        }
    }

    /// Hot-path handles for one partition.
    pub fn partition(&self, topic: &str, partition: u32) -> PartitionMetrics {
        let l = PartitionLabels {
            topic: topic.to_string(),
            partition: partition.to_string(),
        };
        PartitionMetrics {
            produced: self.produced.get_or_create(&l).clone(),
            produced_bytes: self.produced_bytes.get_or_create(&l).clone(),
            consumed: self.consumed.get_or_create(&l).clone(),
            consumed_bytes: self.consumed_bytes.get_or_create(&l).clone(),
            corrupt_skipped: self.corrupt_skipped.get_or_create(&l).clone(),
            dropped: self.consumer_dropped.get_or_create(&l).clone(),
            fsync_seconds: self.fsync_duration.get_or_create(&l).clone(),
            flush_seconds: self.flush_duration.get_or_create(&l).clone(),
            flush_bytes: self.flush_bytes.get_or_create(&l).clone(),
            dedup_dropped: self
                .dedup_dropped
                .get_or_create(&TopicLabels {
                    topic: topic.to_string(),
                })
                .clone(),
        }
    }

    /// Counts an internal error (`narad_errors_total{component,kind}`).
    pub fn error(&self, component: &'static str, kind: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels { component, kind })
            .inc();
    }

    /// Removes the series of `topic` again if `view` (this replica) has applied its deletion:
    /// a request (or a scrape) that was under way while the topic was deleted must not bring
    /// back the series that [`Metrics::forget_topic`] removed. A topic the replica has not
    /// caught up with yet (id at or above `next_topic_id`) is not deleted; a name in use
    /// again keeps its series (they are the new topic's).
    pub fn forget_if_deleted(&self, view: &narad_meta::MetaState, topic: &narad_meta::Topic) {
        if topic.id < view.next_topic_id && !view.topics.contains_key(&topic.name) {
            self.forget_topic(&topic.name);
        }
    }

    /// Drops every series of a deleted topic: each family labelled `topic`, per topic or per
    /// (topic, partition) for every partition a topic can have. (The fan-out families are
    /// labelled `parent`/`child` and go with their link: [`Metrics::forget_link`].)
    pub fn forget_topic(&self, topic: &str) {
        let t = TopicLabels {
            topic: topic.to_string(),
        };
        self.consume_empty.remove(&t);
        self.ack_extended.remove(&t);
        self.nack.remove(&t);
        self.dead_lettered.remove(&t);
        self.dead_letter_failures.remove(&t);
        self.dedup_dropped.remove(&t);
        self.topic_bytes.remove(&t);
        self.topic_backlog.remove(&t);
        for outcome in CONSUME_OUTCOMES {
            self.consume_wait.remove(&OutcomeLabels {
                topic: topic.to_string(),
                outcome,
            });
        }
        for reason in REJECT_REASONS {
            self.produce_rejections.remove(&ReasonLabels {
                topic: topic.to_string(),
                reason,
            });
        }
        // Partition families are keyed by (topic, partition): remove up to the max count.
        for p in 0..MAX_PARTITIONS {
            let l = PartitionLabels {
                topic: topic.to_string(),
                partition: p.to_string(),
            };
            for f in [
                &self.produced,
                &self.produced_bytes,
                &self.consumed,
                &self.consumed_bytes,
                &self.consumer_dropped,
                &self.corrupt_skipped,
                &self.retention_bytes_deleted,
                &self.retention_messages_deleted,
                &self.flush_bytes,
            ] {
                f.remove(&l);
            }
            for g in [
                &self.consumer_lag,
                &self.oldest_unconsumed_age,
                &self.inflight,
                &self.acked_ahead,
                &self.partition_size,
                &self.segments,
            ] {
                g.remove(&l);
            }
            self.fsync_duration.remove(&l);
            self.flush_duration.remove(&l);
        }
    }

    /// Drops the series of a child link (`parent`, `child`) that is gone: detached, or one of
    /// its topics deleted (`child` is the link name for a remote link).
    pub fn forget_link(&self, parent: &str, child: &str) {
        let l = ChildLabels {
            parent: parent.to_string(),
            child: child.to_string(),
        };
        self.children.committed.remove(&l);
        self.children.dropped.remove(&l);
        for reason in SEND_ERROR_REASONS {
            self.remote_child_send_errors
                .remove(&RemoteSendErrorLabels {
                    parent: parent.to_string(),
                    child: child.to_string(),
                    reason,
                });
        }
        for p in 0..MAX_PARTITIONS {
            let l = ChildPartitionLabels {
                parent: parent.to_string(),
                child: child.to_string(),
                partition: p.to_string(),
            };
            self.children.lag.remove(&l);
            self.children.due_lag.remove(&l);
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("invariant: writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample lines of `name` (a family lists its series in no set order: sorted).
    fn series<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        let mut lines: Vec<&str> = text.lines().filter(|l| l.starts_with(name)).collect();
        lines.sort_unstable();
        lines
    }

    #[test]
    fn answered_requests_count_in_their_families() {
        let m = Metrics::new();
        let labels = |status| HttpLabels {
            route: "/v1/topics/{topic}/produce",
            method: "POST",
            status,
        };
        let answer = |bytes_in, bytes_out| HttpAnswer {
            seconds: 0.001,
            bytes_in,
            bytes_out,
        };
        m.http_answered(labels(202), answer(0, None));
        let text = m.encode();
        // A route that carried no body has no byte series.
        assert!(
            series(&text, "narad_http_request_bytes_in").is_empty(),
            "{text}"
        );
        assert!(
            series(&text, "narad_http_response_bytes_out").is_empty(),
            "{text}"
        );
        m.http_answered(labels(202), answer(256, Some(40)));
        m.http_answered(labels(202), answer(100, Some(2)));
        m.http_answered(labels(400), answer(0, Some(90)));
        let text = m.encode();
        let route = "route=\"/v1/topics/{topic}/produce\"";
        assert_eq!(
            series(&text, "narad_http_requests_total"),
            [
                format!("narad_http_requests_total{{{route},method=\"POST\",status=\"202\"}} 3"),
                format!("narad_http_requests_total{{{route},method=\"POST\",status=\"400\"}} 1"),
            ]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "narad_http_request_duration_seconds_count{{{route},method=\"POST\",status=\"202\"}} 3"
            )),
            "{text}"
        );
        assert_eq!(
            series(&text, "narad_http_request_bytes_in"),
            [format!("narad_http_request_bytes_in_total{{{route}}} 356").as_str()],
            "{text}"
        );
        assert_eq!(
            series(&text, "narad_http_response_bytes_out"),
            [format!("narad_http_response_bytes_out_total{{{route}}} 132").as_str()],
            "{text}"
        );
    }
}
