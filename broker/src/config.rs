//! Server configuration (SPEC §7.1, §8): defaults < JSON config file < `NARAD_*` env < flags.
//! Each module gets only its own sub-config.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

mod env_names;
pub use env_names::{is_service_link, EnvReport};

/// Every `NARAD_*` name `narad` reads: what [`Config::load`] looks up and the client
/// commands' [`narad_cli::ENV_NAMES`].
pub fn known_env_names() -> BTreeSet<String> {
    let seen = std::cell::RefCell::new(BTreeSet::new());
    let record = |k: &str| {
        seen.borrow_mut().insert(k.to_string());
        None::<String>
    };
    // With nothing set, every name is looked up (the test knobs to refuse them).
    let _ = Config::default().apply_env(&record);
    let mut names = seen.into_inner();
    names.extend(narad_cli::ENV_NAMES.iter().map(|n| n.to_string()));
    names
}

/// Refuses the `NARAD_*` names of `names` (an environment's) that lie in a section the
/// server reads but are not among [`known_env_names`] (typos of settings), naming the
/// closest known one; reports the other unknown `NARAD_*` names (scripts' own, not
/// settings). Kubernetes service links always pass. See `config/env_names.rs`.
pub fn check_env_names<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<EnvReport, ConfigError> {
    env_names::check(names, &known_env_names())
}

/// Default of `topic.max_topics`.
pub const DEFAULT_MAX_TOPICS: u64 = 10_000;

/// The effective configuration of one `narad server start`.
#[derive(Debug, Clone)]
pub struct Config {
    pub dev: bool,
    pub http: HttpConfig,
    pub cluster: ClusterConfig,
    pub storage: StorageConfig,
    pub topic: TopicDefaults,
    pub log: LogConfig,
    pub security: SecurityConfig,
    /// `fanout.*` (SPEC §8).
    pub fanout: crate::children::ChildrenConfig,
    /// Engine tuning (`NARAD_WAL_LANES`, `NARAD_DISPATCH_*`; see [`Tuning`]).
    pub tuning: Tuning,
    /// `NARAD_TEST_*` knobs (tests only; see [`TestKnobs`]).
    pub test: TestKnobs,
}

/// Engine tuning, from the environment only: not among the SPEC's user settings, for
/// benchmarks and experiments on a given disk. The defaults are what production runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// `NARAD_WAL_LANES` (1–8, default 2): WAL writer threads, each with its own segment
    /// files. The first lane writes alone while it keeps up; the others stand by and take
    /// what is staged once a produce has waited 1 ms for the first lane's running fsync or
    /// 8 requests wait for it. Lanes taking turns at every fsync wrote ~1.15 records per
    /// fsync at 4,000 produces/s on 2 CPUs; with a standby, ~2, for 26 % fewer context
    /// switches and ~10 % less CPU per produce.
    pub wal_lanes: usize,
    /// `NARAD_DISPATCH_LINGER_US` (0–1,000,000, default 5,000): least time between the
    /// starts of two commits of WAL records into one partition. A partition whose last
    /// commit started that long ago commits at once; a busy one commits at most once per
    /// linger with everything that arrived meanwhile. It only delays visibility, never the
    /// `202`. Every partition commit (fsync, read-back, or a node RPC) costs CPU: with 32
    /// producers at 4,000 msgs/s into 8 partitions through the WAL, partition commits per
    /// message fell from 0.87 to 0.36 against committing at once whenever no other commit
    /// ran.
    pub dispatch_linger: Duration,
    /// `NARAD_DISPATCH_IDLE_LINGER_US` (0–1,000,000, default 50,000; never below the
    /// linger): the same for a local partition no consumer waits on. A reader that must see
    /// what was acknowledged (a consume finding less than it asked for, a replay, topic
    /// statistics) has the pending records committed at once instead. With 32 producers at
    /// 4,000 msgs/s into 8 partitions, partition commits per message fall from 0.27 to 0.04.
    pub dispatch_idle_linger: Duration,
    /// `NARAD_DISPATCH_PARALLEL` (1–16, default 8): most local partition commits in flight.
    /// Partitions due together commit together: with 32 producers and 32 consumers at 4,000
    /// msgs/s over 8 partitions, CPU per message of the full flow is 5 % lower with 8 than
    /// with 4 (160 -> 152 us), 12 % higher with 2 and 25 % with 1.
    pub dispatch_parallel: usize,
    /// `NARAD_WAL_SKIP_LOCAL` (default false): true commits a produce to a partition this
    /// node owns straight into the partition log (fsynced and verified before the `202`)
    /// instead of through the WAL and the dispatcher. Each partition then fsyncs for itself,
    /// where the WAL shares one fsync among all partitions and the dispatcher commits each
    /// partition rarely: at 4,000 msgs/s into 8 partitions, 0.81 fsyncs and 6.2 context
    /// switches per message against 0.4 and ~2.5.
    pub wal_skip_local: bool,
    /// `NARAD_WORKER_THREADS` (1–256; default one less than the CPUs this process may use,
    /// at least one): the async runtime's worker threads, which serve HTTP and node RPC.
    /// The WAL lanes and partition commits run on threads of their own; a worker for every
    /// CPU leaves none for them, so workers preempt the storage threads and wake each other
    /// for every task the storage threads hand back. On 2 CPUs at 4,000 msgs/s, one worker
    /// against two: the workers' context switches per produce 2.2 -> 1.2, CPU per message
    /// -10 % for produce (87 -> 78 us) and -17 % for the full flow (175 -> 145 us),
    /// unthrottled throughput unchanged. Read by `main` before the
    /// runtime starts (see [`Tuning::worker_threads_from`]).
    pub worker_threads: usize,
    /// `NARAD_WAL_INLINE` (default true): with one worker, the runtime's own thread writes
    /// and fsyncs the first WAL lane whenever it runs out of work, instead of handing each
    /// produce to the lane's thread and back (`crate::wal::first_lane`); the lane's thread
    /// writes requests over 1 MiB (a large batch), and takes over while fsyncs are slow
    /// (over 20 ms, plus 20 ms per MiB) or the dispatcher is behind. With more
    /// workers it has no effect. On 2 CPUs at 4,000 msgs/s (medians of 3 paired runs):
    /// context switches per produce 2.4 -> 1.2, CPU per message -28 % for produce and -22 %
    /// for the full flow; single-message produce throughput at full load +57 %. Read by
    /// `main` before the runtime starts (see [`Tuning::wal_inline_from`]).
    pub wal_inline: bool,
}

impl Tuning {
    /// `NARAD_WORKER_THREADS` from `get`, or its default for this machine (see
    /// [`Tuning::worker_threads`]); out of range is an error, not a silent default.
    pub fn worker_threads_from(get: &dyn Fn(&str) -> Option<String>) -> Result<usize, ConfigError> {
        const KEY: &str = "NARAD_WORKER_THREADS";
        let Some(v) = get(KEY) else {
            return Ok(default_worker_threads());
        };
        let n: usize = parse_num(KEY, &v)?;
        if !(1..=256).contains(&n) {
            return Err(bad(format!("{KEY} must be between 1 and 256, not {n}")));
        }
        Ok(n)
    }

    /// `NARAD_WAL_INLINE` from `get`, or its default (see [`Tuning::wal_inline`]).
    pub fn wal_inline_from(get: &dyn Fn(&str) -> Option<String>) -> Result<bool, ConfigError> {
        const KEY: &str = "NARAD_WAL_INLINE";
        get(KEY).map_or(Ok(true), |v| parse_bool(KEY, &v))
    }
}

/// One less than the CPUs this process may use (cgroup quotas included), at least one.
fn default_worker_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_sub(1)
        .max(1)
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            worker_threads: default_worker_threads(),
            wal_lanes: 2,
            dispatch_linger: Duration::from_micros(5_000),
            dispatch_idle_linger: Duration::from_micros(50_000),
            dispatch_parallel: 8,
            wal_skip_local: false,
            wal_inline: true,
        }
    }
}

/// The environment switch without which no `NARAD_TEST_*` knob takes effect: a knob set
/// without it stops the node at start (tests set it; production never does).
pub const TEST_KNOBS_SWITCH: &str = "NARAD_TEST_KNOBS";

/// Every `NARAD_TEST_*` variable the broker reads. Each bends a timing or an identity for a
/// test and is not part of the SPEC's user surface.
pub const TEST_KNOB_VARS: [&str; 11] = [
    "NARAD_TEST_CLOCK_OFFSET_MS",
    "NARAD_TEST_IDLE_LOG_EVICTION_MS",
    "NARAD_TEST_HEARTBEAT_MS",
    "NARAD_TEST_DEAD_AFTER_MS",
    "NARAD_TEST_FORCE_PROMOTE_MS",
    "NARAD_TEST_MOVE_HANDOFF_PAUSE_MS",
    "NARAD_TEST_RPC_UNSUPPORTED",
    "NARAD_TEST_VERSION",
    "NARAD_TEST_RPC_FAULT",
    "NARAD_TEST_HOLD_DRAINED_VOTERS",
    "NARAD_TEST_WAL_FSYNC_STALL_MS",
];

/// Test-only knobs, read from `NARAD_TEST_*` only when [`TEST_KNOBS_SWITCH`] is `true`.
#[derive(Debug, Clone, Default)]
pub struct TestKnobs {
    /// Membership heartbeat interval (SPEC: 5 s).
    pub heartbeat: Option<Duration>,
    /// A member is dead after this long without a heartbeat (SPEC: 30 s).
    pub dead_after: Option<Duration>,
    /// How long a move's source stays dead before a complete copy is force-promoted (2 min).
    pub force_promote_after: Option<Duration>,
    /// A pause between a move's pre-copy and its handoff, so tests act mid-move.
    pub move_handoff_pause: Option<Duration>,
    /// Opcodes this node answers as unknown, to play an older build.
    pub rpc_unsupported: Vec<u8>,
    /// The version this member reports in its heartbeats (rolling-upgrade tests).
    pub version: Option<String>,
    /// Node-RPC connections this node breaks at chosen requests (`before:<op>:<n>` or
    /// `after:<op>:<n>`, comma-separated): certain and uncertain forwarding failures.
    pub rpc_faults: Vec<crate::rpc::RpcFault>,
    /// The leader's controller keeps a drained member that is alive among the voters (it
    /// still checks its WAL), so a test can kill it between drained and removed.
    pub hold_drained_voters: bool,
    /// Every write and fsync of the ingress WAL takes this much longer: a slow disk.
    pub wal_fsync_stall: Option<Duration>,
}

#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Listen address, e.g. `0.0.0.0:7942` (`:7942` means all interfaces).
    pub addr: String,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub idle_timeout: Duration,
    pub shutdown_grace: Duration,
    /// `http.shutdown_delay` (ext, default 0): after SIGTERM the node fails `/readyz` at
    /// once but keeps serving everything this long (so load balancers stop routing to it
    /// first), then shuts down gracefully.
    pub shutdown_delay: Duration,
    pub max_consume_wait: Duration,
    /// `http.tls_{cert,key}_file`: both set → the API serves HTTPS only (SPEC row 29, ext).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// `http.metrics_addr` (ext): when set, `/metrics` is served there (plain HTTP, no
    /// credentials) and no longer on the API listener (`404` there).
    pub metrics_addr: Option<String>,
    /// `http.advertise_addr` / `NARAD_ADVERTISE_ADDR` / `--advertise-addr` (ext): the API
    /// address this member reports in `GET /v1/cluster/members` (`host:port` that clients
    /// and peers can reach, e.g. the pod's stable DNS name). Default: the listen address,
    /// or, when that names every interface, the host of the cluster advertise address with
    /// the API port.
    pub advertise_addr: Option<String>,
    /// `http.max_batch_bytes_in_flight` / `NARAD_HTTP_MAX_BATCH_BYTES_IN_FLIGHT` (ext, default
    /// 64 MiB): batch-produce bytes (received plus decoded) this node holds at once; a batch
    /// beyond it is `503` with `Retry-After: 1`, nothing stored.
    pub max_batch_bytes_in_flight: u64,
    /// `http.console_enabled` / `NARAD_HTTP_CONSOLE_ENABLED` (ext, default true): serve the
    /// web console at `/ui` (behind the API's authentication); false leaves `/ui` unrouted.
    pub console_enabled: bool,
}

impl HttpConfig {
    /// The API's TLS files, when configured.
    pub fn tls_files(&self) -> Option<crate::tls::TlsFiles> {
        Some(crate::tls::TlsFiles {
            cert: self.tls_cert_file.clone()?,
            key: self.tls_key_file.clone()?,
            ca: None,
        })
    }
}

#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub node_id: String,
    /// Cluster listener; `None` = standalone default (OS-assigned loopback port).
    pub addr: Option<String>,
    pub advertise_addr: Option<String>,
    /// Seed voters `(id, host:port)`.
    pub peers: Vec<(String, String)>,
    pub initial_members: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    /// `none` or `zstd` (checked by [`Config::validate`]; see [`StorageConfig::log_codec`]).
    pub codec: String,
    /// `fastest`, `default`, `better` or `best` (checked by [`Config::validate`]; see
    /// [`StorageConfig::log_compression_level`]).
    pub compression_level: String,
    /// 0 = off.
    pub idle_log_eviction_ms: u64,
    /// Set by the test knob `NARAD_TEST_IDLE_LOG_EVICTION_MS` (not in the SPEC's user
    /// surface): `idle_log_eviction_ms` came from it and skips the ≥ 60000 validation, so
    /// tests can watch idle logs close within a second.
    pub idle_log_eviction_test_knob: bool,
    /// Test knob (not in the SPEC's user surface): segment size in bytes (default 64 MiB).
    pub segment_max_bytes: u64,
    /// Commit verification re-reads from the device rather than the page cache
    /// (`storage.verify_from_device`, default true).
    pub verify_from_device: bool,
    /// Test knob: how often retention runs (default 60 s).
    pub retention_check_interval: Duration,
    /// Test knob: added to the wall clock for retention decisions (default 0).
    pub clock_offset_ms: i64,
}

impl StorageConfig {
    /// The partition logs' frame codec (`storage.codec`). A value [`Config::validate`]
    /// refuses reads as the default, `none`.
    pub fn log_codec(&self) -> narad_storage::Codec {
        narad_storage::Codec::from_name(&self.codec).unwrap_or_default()
    }

    /// The partition logs' zstd level (`storage.compression_level`). A value
    /// [`Config::validate`] refuses reads as the default, `fastest`.
    pub fn log_compression_level(&self) -> narad_storage::CompressionLevel {
        narad_storage::CompressionLevel::from_name(&self.compression_level).unwrap_or_default()
    }
}

#[derive(Debug, Clone)]
pub struct TopicDefaults {
    pub default_partitions: u32,
    pub max_partitions: u32,
    /// `topic.max_topics` (ext): the most topics (children included) the cluster holds; a
    /// create beyond is `409`. Enforced by the metadata leader with its own value.
    pub max_topics: u64,
    pub default_retention_age_ms: u64,
    pub default_visibility_timeout_ms: u64,
    pub default_max_in_flight_per_partition: u64,
    pub default_max_acked_ahead_per_partition: u64,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    /// `debug|info|warn|error`
    pub level: String,
    /// `json|text`
    pub format: String,
}

#[derive(Debug, Clone)]
pub struct SecurityConfig {
    pub enabled: bool,
    /// Environment only; never logged.
    pub admin_password: Option<String>,
    /// Environment only; never logged.
    pub cluster_secret: Option<String>,
    /// `security.cluster_tls_{cert,key,ca}_file`: all three set → mutual TLS on the cluster
    /// port (SPEC §4.5).
    pub cluster_tls_cert_file: Option<PathBuf>,
    pub cluster_tls_key_file: Option<PathBuf>,
    pub cluster_tls_ca_file: Option<PathBuf>,
}

impl SecurityConfig {
    /// The cluster port's mutual-TLS files, when configured.
    pub fn cluster_tls_files(&self) -> Option<crate::tls::TlsFiles> {
        Some(crate::tls::TlsFiles {
            cert: self.cluster_tls_cert_file.clone()?,
            key: self.cluster_tls_key_file.clone()?,
            ca: Some(self.cluster_tls_ca_file.clone()?),
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            fanout: Default::default(),
            dev: false,
            http: HttpConfig {
                addr: ":7942".into(),
                read_timeout: Duration::from_secs(10),
                write_timeout: Duration::from_secs(30),
                idle_timeout: Duration::from_secs(60),
                shutdown_grace: Duration::from_secs(10),
                shutdown_delay: Duration::ZERO,
                max_consume_wait: Duration::from_secs(10),
                tls_cert_file: None,
                tls_key_file: None,
                metrics_addr: None,
                advertise_addr: None,
                max_batch_bytes_in_flight: 64 * 1024 * 1024,
                console_enabled: true,
            },
            cluster: ClusterConfig {
                node_id: String::new(),
                addr: None,
                advertise_addr: None,
                peers: Vec::new(),
                initial_members: Vec::new(),
            },
            storage: StorageConfig {
                data_dir: PathBuf::from("data"),
                codec: "none".into(),
                compression_level: "fastest".into(),
                idle_log_eviction_ms: 1_800_000,
                idle_log_eviction_test_knob: false,
                segment_max_bytes: 64 * 1024 * 1024,
                verify_from_device: true,
                retention_check_interval: Duration::from_secs(60),
                clock_offset_ms: 0,
            },
            topic: TopicDefaults {
                default_partitions: 3,
                max_partitions: 108,
                max_topics: DEFAULT_MAX_TOPICS,
                default_retention_age_ms: 604_800_000,
                default_visibility_timeout_ms: 30_000,
                default_max_in_flight_per_partition: 1024,
                default_max_acked_ahead_per_partition: 1024,
            },
            log: LogConfig {
                level: "info".into(),
                format: "json".into(),
            },
            security: SecurityConfig {
                enabled: true,
                admin_password: None,
                cluster_secret: None,
                cluster_tls_cert_file: None,
                cluster_tls_key_file: None,
                cluster_tls_ca_file: None,
            },
            tuning: Tuning::default(),
            test: TestKnobs::default(),
        }
    }
}

/// `narad server start` flags (SPEC §7.1). Flags win over env and the config file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerArgs {
    /// Development mode: security off, loopback, ~/.narad/data, text logs, a banner.
    #[arg(long)]
    pub dev: bool,
    /// API listen address (default :7942; 127.0.0.1:7942 with --dev).
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<String>,
    /// Cluster listen address (default :7943).
    #[arg(long, value_name = "HOST:PORT")]
    pub cluster_addr: Option<String>,
    /// API port: the API listen address with this port (as Go Narad's `serve --port`).
    #[arg(long, value_name = "PORT", conflicts_with = "addr")]
    pub port: Option<u16>,
    /// Cluster port: the cluster listen address with this port.
    #[arg(long, value_name = "PORT", conflicts_with = "cluster_addr")]
    pub cluster_port: Option<u16>,
    /// The API address this member reports to clients and peers (e.g. its DNS name).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_addr: Option<String>,
    /// Data directory (default ./data; ~/.narad/data with --dev).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Node id (default: the hostname).
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// Seed voters, id@host:port,... (1 entry or at least 3).
    #[arg(long, value_name = "ID@HOST:PORT,...")]
    pub peers: Option<String>,
    /// JSON config file (unknown keys are refused).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// debug|info|warn|error
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// json|text
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Serve the API over HTTPS with this PEM certificate chain (with --tls-key-file).
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The PEM private key of --tls-cert-file.
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
}

/// `addr` (`host:port`, `:port`, `[v6]:port`) with its port replaced by `port`.
fn with_port(addr: &str, port: u16) -> String {
    match addr.rsplit_once(':') {
        Some((host, _)) => format!("{host}:{port}"),
        None => format!("{addr}:{port}"),
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

fn bad(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

mod file {
    //! The JSON config file: every key optional, unknown keys refused.
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct File {
        pub http: Option<Http>,
        pub cluster: Option<Cluster>,
        pub storage: Option<Storage>,
        pub topic: Option<Topic>,
        pub fanout: Option<Fanout>,
        pub remotes: Option<Remotes>,
        pub log: Option<Log>,
        pub security: Option<Security>,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Http {
        pub addr: Option<String>,
        pub read_timeout: Option<String>,
        pub write_timeout: Option<String>,
        pub idle_timeout: Option<String>,
        pub shutdown_grace: Option<String>,
        pub shutdown_delay: Option<String>,
        pub max_consume_wait: Option<String>,
        pub tls_cert_file: Option<String>,
        pub tls_key_file: Option<String>,
        pub metrics_addr: Option<String>,
        pub advertise_addr: Option<String>,
        pub max_batch_bytes_in_flight: Option<u64>,
        pub console_enabled: Option<bool>,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Peer {
        pub id: String,
        pub addr: String,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Cluster {
        pub node_id: Option<String>,
        pub addr: Option<String>,
        pub advertise_addr: Option<String>,
        pub peers: Option<Vec<Peer>>,
        pub initial_members: Option<Vec<String>>,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Storage {
        pub data_dir: Option<String>,
        pub codec: Option<String>,
        pub compression_level: Option<String>,
        pub idle_log_eviction_ms: Option<u64>,
        pub segment_max_bytes: Option<u64>,
        pub verify_from_device: Option<bool>,
        pub retention_check_interval: Option<String>,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Topic {
        pub default_partitions: Option<u32>,
        pub max_partitions: Option<u32>,
        pub max_topics: Option<u64>,
        pub default_retention_age_ms: Option<u64>,
        pub default_visibility_timeout_ms: Option<u64>,
        pub default_max_in_flight_per_partition: Option<u64>,
        pub default_max_acked_ahead_per_partition: Option<u64>,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Fanout {
        pub max_batch_records: Option<u64>,
        pub max_batch_bytes: Option<u64>,
        pub linger_ms: Option<u64>,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Remotes {
        pub allowed_hosts: Option<Vec<String>>,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Log {
        pub level: Option<String>,
        pub format: Option<String>,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Security {
        pub enabled: Option<bool>,
        pub cluster_tls_cert_file: Option<String>,
        pub cluster_tls_key_file: Option<String>,
        pub cluster_tls_ca_file: Option<String>,
    }
}

fn dur(key: &str, v: &str) -> Result<Duration, ConfigError> {
    narad_api::duration::parse_go_duration(v).map_err(|e| bad(format!("{key}: {e}")))
}

fn parse_peers(s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('@') {
            Some((id, addr)) if !id.is_empty() && !addr.is_empty() => {
                Ok((id.to_string(), addr.to_string()))
            }
            _ => Err(bad(format!("peer {p:?} is not id@host:port"))),
        })
        .collect()
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(bad(format!("{key}: not a boolean: {v:?}"))),
    }
}

fn parse_num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, ConfigError> {
    v.trim()
        .parse()
        .map_err(|_| bad(format!("{key}: not a number: {v:?}")))
}

impl Config {
    /// `fanout.{max_batch_records,max_batch_bytes,linger_ms}`: batches of at least one
    /// record and one byte; linger ≤ 10 s.
    fn apply_fanout(
        &mut self,
        records: Option<String>,
        bytes: Option<String>,
        linger_ms: Option<String>,
    ) -> Result<(), ConfigError> {
        let f = &mut self.fanout;
        if let Some(v) = records {
            f.max_batch_records = parse_num::<usize>("fanout.max_batch_records", &v)?;
            if f.max_batch_records == 0 {
                return Err(bad("fanout.max_batch_records must be at least 1"));
            }
        }
        if let Some(v) = bytes {
            f.max_batch_bytes = parse_num::<usize>("fanout.max_batch_bytes", &v)?;
            if f.max_batch_bytes == 0 {
                return Err(bad("fanout.max_batch_bytes must be at least 1"));
            }
        }
        if let Some(v) = linger_ms {
            let ms = parse_num::<u64>("fanout.linger_ms", &v)?;
            if ms > 10_000 {
                return Err(bad("fanout.linger_ms must be at most 10000"));
            }
            f.linger = std::time::Duration::from_millis(ms);
        }
        Ok(())
    }

    /// Layers defaults < config file < environment (`env` lookup) < flags, then validates.
    pub fn load(
        args: &ServerArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        if let Some(path) = &args.config {
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad(format!("read {}: {e}", path.display())))?;
            let f: file::File =
                serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", path.display())))?;
            c.apply_file(f)?;
        }
        c.apply_env(env)?;
        // Flags.
        c.dev = args.dev;
        if args.dev {
            if args.peers.is_some() {
                return Err(bad("--dev cannot be combined with --peers"));
            }
            c.security.enabled = false;
            c.http.addr = "127.0.0.1:7942".into();
            c.storage.data_dir = dirs::home_dir()
                .unwrap_or_else(|| PathBuf::from("."))
                .join(".narad")
                .join("data");
            c.log.format = "text".into();
            c.cluster.peers.clear();
        }
        if let Some(a) = &args.addr {
            c.http.addr = a.clone();
        }
        if let Some(a) = &args.cluster_addr {
            c.cluster.addr = Some(a.clone());
        }
        if let Some(a) = &args.advertise_addr {
            c.http.advertise_addr = Some(a.clone());
        }
        if let Some(p) = args.port {
            c.http.addr = with_port(&c.http.addr, p);
        }
        if let Some(p) = args.cluster_port {
            // Unset: on the API's host (loopback with --dev).
            let addr = c
                .cluster
                .addr
                .clone()
                .unwrap_or_else(|| c.http.addr.clone());
            c.cluster.addr = Some(with_port(&addr, p));
        }
        if let Some(d) = &args.data_dir {
            c.storage.data_dir = d.clone();
        }
        if let Some(n) = &args.node_id {
            c.cluster.node_id = n.clone();
        }
        if let Some(p) = &args.peers {
            c.cluster.peers = parse_peers(p)?;
        }
        if let Some(l) = &args.log_level {
            c.log.level = l.clone();
        }
        if let Some(f) = &args.log_format {
            c.log.format = f.clone();
        }
        if let Some(f) = &args.tls_cert_file {
            c.http.tls_cert_file = Some(f.clone());
        }
        if let Some(f) = &args.tls_key_file {
            c.http.tls_key_file = Some(f.clone());
        }
        if c.cluster.node_id.is_empty() {
            c.cluster.node_id = hostname::get()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "narad-0".into());
        }
        c.validate()?;
        Ok(c)
    }

    fn apply_file(&mut self, f: file::File) -> Result<(), ConfigError> {
        if let Some(h) = f.http {
            if let Some(v) = h.addr {
                self.http.addr = v;
            }
            if let Some(v) = h.tls_cert_file {
                self.http.tls_cert_file = Some(PathBuf::from(v));
            }
            if let Some(v) = h.tls_key_file {
                self.http.tls_key_file = Some(PathBuf::from(v));
            }
            if let Some(v) = h.metrics_addr {
                self.http.metrics_addr = Some(v);
            }
            if let Some(v) = h.advertise_addr {
                self.http.advertise_addr = Some(v);
            }
            if let Some(v) = h.max_batch_bytes_in_flight {
                self.http.max_batch_bytes_in_flight = v;
            }
            if let Some(v) = h.console_enabled {
                self.http.console_enabled = v;
            }
            for (key, v, slot) in [
                (
                    "http.read_timeout",
                    h.read_timeout,
                    &mut self.http.read_timeout,
                ),
                (
                    "http.write_timeout",
                    h.write_timeout,
                    &mut self.http.write_timeout,
                ),
                (
                    "http.idle_timeout",
                    h.idle_timeout,
                    &mut self.http.idle_timeout,
                ),
                (
                    "http.shutdown_grace",
                    h.shutdown_grace,
                    &mut self.http.shutdown_grace,
                ),
                (
                    "http.shutdown_delay",
                    h.shutdown_delay,
                    &mut self.http.shutdown_delay,
                ),
                (
                    "http.max_consume_wait",
                    h.max_consume_wait,
                    &mut self.http.max_consume_wait,
                ),
            ] {
                if let Some(v) = v {
                    *slot = dur(key, &v)?;
                }
            }
        }
        if let Some(cl) = f.cluster {
            if let Some(v) = cl.node_id {
                self.cluster.node_id = v;
            }
            if cl.addr.is_some() {
                self.cluster.addr = cl.addr;
            }
            if cl.advertise_addr.is_some() {
                self.cluster.advertise_addr = cl.advertise_addr;
            }
            if let Some(p) = cl.peers {
                self.cluster.peers = p.into_iter().map(|p| (p.id, p.addr)).collect();
            }
            if let Some(m) = cl.initial_members {
                self.cluster.initial_members = m;
            }
        }
        if let Some(s) = f.storage {
            if let Some(v) = s.data_dir {
                self.storage.data_dir = PathBuf::from(v);
            }
            if let Some(v) = s.codec {
                self.storage.codec = v;
            }
            if let Some(v) = s.compression_level {
                self.storage.compression_level = v;
            }
            if let Some(v) = s.idle_log_eviction_ms {
                self.storage.idle_log_eviction_ms = v;
            }
            if let Some(v) = s.segment_max_bytes {
                self.storage.segment_max_bytes = v;
            }
            if let Some(v) = s.verify_from_device {
                self.storage.verify_from_device = v;
            }
            if let Some(v) = s.retention_check_interval {
                self.storage.retention_check_interval =
                    dur("storage.retention_check_interval", &v)?;
            }
        }
        if let Some(t) = f.topic {
            let d = &mut self.topic;
            d.default_partitions = t.default_partitions.unwrap_or(d.default_partitions);
            d.max_partitions = t.max_partitions.unwrap_or(d.max_partitions);
            d.max_topics = t.max_topics.unwrap_or(d.max_topics);
            d.default_retention_age_ms = t
                .default_retention_age_ms
                .unwrap_or(d.default_retention_age_ms);
            d.default_visibility_timeout_ms = t
                .default_visibility_timeout_ms
                .unwrap_or(d.default_visibility_timeout_ms);
            d.default_max_in_flight_per_partition = t
                .default_max_in_flight_per_partition
                .unwrap_or(d.default_max_in_flight_per_partition);
            d.default_max_acked_ahead_per_partition = t
                .default_max_acked_ahead_per_partition
                .unwrap_or(d.default_max_acked_ahead_per_partition);
        }
        if let Some(fo) = f.fanout {
            self.apply_fanout(
                fo.max_batch_records.map(|v| v.to_string()),
                fo.max_batch_bytes.map(|v| v.to_string()),
                fo.linger_ms.map(|v| v.to_string()),
            )?;
        }
        if let Some(hosts) = f.remotes.and_then(|r| r.allowed_hosts) {
            self.fanout.remote_hosts =
                crate::children::hosts::HostPolicy::parse(hosts.iter().map(String::as_str))
                    .map_err(bad)?;
        }
        if let Some(l) = f.log {
            if let Some(v) = l.level {
                self.log.level = v;
            }
            if let Some(v) = l.format {
                self.log.format = v;
            }
        }
        if let Some(s) = f.security {
            if let Some(v) = s.enabled {
                self.security.enabled = v;
            }
            for (v, slot) in [
                (
                    s.cluster_tls_cert_file,
                    &mut self.security.cluster_tls_cert_file,
                ),
                (
                    s.cluster_tls_key_file,
                    &mut self.security.cluster_tls_key_file,
                ),
                (
                    s.cluster_tls_ca_file,
                    &mut self.security.cluster_tls_ca_file,
                ),
            ] {
                if let Some(v) = v {
                    *slot = Some(PathBuf::from(v));
                }
            }
        }
        Ok(())
    }

    fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let get = |k: &str| env(k).filter(|v| !v.is_empty());
        self.apply_tuning(&get)?;
        if let Some(v) = get("NARAD_HTTP_ADDR") {
            self.http.addr = v;
        }
        if let Some(v) = get("NARAD_HTTP_METRICS_ADDR") {
            self.http.metrics_addr = Some(v);
        }
        if let Some(v) = get("NARAD_ADVERTISE_ADDR") {
            self.http.advertise_addr = Some(v);
        }
        if let Some(v) = get("NARAD_HTTP_MAX_BATCH_BYTES_IN_FLIGHT") {
            self.http.max_batch_bytes_in_flight =
                parse_num("NARAD_HTTP_MAX_BATCH_BYTES_IN_FLIGHT", &v)?;
        }
        if let Some(v) = get("NARAD_HTTP_CONSOLE_ENABLED") {
            self.http.console_enabled = parse_bool("NARAD_HTTP_CONSOLE_ENABLED", &v)?;
        }
        for (key, slot) in [
            ("NARAD_HTTP_READ_TIMEOUT", &mut self.http.read_timeout),
            ("NARAD_HTTP_WRITE_TIMEOUT", &mut self.http.write_timeout),
            ("NARAD_HTTP_IDLE_TIMEOUT", &mut self.http.idle_timeout),
            ("NARAD_HTTP_SHUTDOWN_GRACE", &mut self.http.shutdown_grace),
            ("NARAD_HTTP_SHUTDOWN_DELAY", &mut self.http.shutdown_delay),
            (
                "NARAD_HTTP_MAX_CONSUME_WAIT",
                &mut self.http.max_consume_wait,
            ),
            (
                "NARAD_STORAGE_RETENTION_CHECK_INTERVAL",
                &mut self.storage.retention_check_interval,
            ),
        ] {
            if let Some(v) = get(key) {
                *slot = dur(key, &v)?;
            }
        }
        if let Some(v) = get("NARAD_NODE_ID") {
            self.cluster.node_id = v;
        }
        if let Some(v) = get("NARAD_CLUSTER_ADDR") {
            self.cluster.addr = Some(v);
        }
        if let Some(v) = get("NARAD_CLUSTER_ADVERTISE_ADDR") {
            self.cluster.advertise_addr = Some(v);
        }
        if let Some(v) = get("NARAD_CLUSTER_PEERS") {
            self.cluster.peers = parse_peers(&v)?;
        }
        if let Some(v) = get("NARAD_CLUSTER_INITIAL_MEMBERS") {
            self.cluster.initial_members = v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
        }
        if let Some(v) = get("NARAD_DATA_DIR") {
            self.storage.data_dir = PathBuf::from(v);
        }
        if let Some(v) = get("NARAD_STORAGE_SEGMENT_MAX_BYTES") {
            self.storage.segment_max_bytes = parse_num("NARAD_STORAGE_SEGMENT_MAX_BYTES", &v)?;
        }
        if let Some(v) = get("NARAD_STORAGE_VERIFY_FROM_DEVICE") {
            self.storage.verify_from_device = parse_bool("NARAD_STORAGE_VERIFY_FROM_DEVICE", &v)?;
        }
        self.apply_test_knobs(&get)?;
        let t = &mut self.topic;
        if let Some(v) = get("NARAD_TOPIC_DEFAULT_PARTITIONS") {
            t.default_partitions = parse_num("NARAD_TOPIC_DEFAULT_PARTITIONS", &v)?;
        }
        if let Some(v) = get("NARAD_TOPIC_MAX_PARTITIONS") {
            t.max_partitions = parse_num("NARAD_TOPIC_MAX_PARTITIONS", &v)?;
        }
        if let Some(v) = get("NARAD_TOPIC_MAX_TOPICS") {
            t.max_topics = parse_num("NARAD_TOPIC_MAX_TOPICS", &v)?;
        }
        if let Some(v) = get("NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS") {
            t.default_retention_age_ms = parse_num("NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS", &v)?;
        }
        if let Some(v) = get("NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS") {
            t.default_visibility_timeout_ms =
                parse_num("NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = get("NARAD_TOPIC_DEFAULT_MAX_IN_FLIGHT_PER_PARTITION") {
            t.default_max_in_flight_per_partition =
                parse_num("NARAD_TOPIC_DEFAULT_MAX_IN_FLIGHT_PER_PARTITION", &v)?;
        }
        if let Some(v) = get("NARAD_TOPIC_DEFAULT_MAX_ACKED_AHEAD_PER_PARTITION") {
            t.default_max_acked_ahead_per_partition =
                parse_num("NARAD_TOPIC_DEFAULT_MAX_ACKED_AHEAD_PER_PARTITION", &v)?;
        }
        self.apply_fanout(
            get("NARAD_FANOUT_MAX_BATCH_RECORDS"),
            get("NARAD_FANOUT_MAX_BATCH_BYTES"),
            get("NARAD_FANOUT_LINGER_MS"),
        )?;
        if let Some(v) = get("NARAD_REMOTES_ALLOWED_HOSTS") {
            self.fanout.remote_hosts =
                crate::children::hosts::HostPolicy::parse(v.split(',')).map_err(bad)?;
        }
        if let Some(v) = get("NARAD_LOG_LEVEL") {
            self.log.level = v;
        }
        if let Some(v) = get("NARAD_LOG_FORMAT") {
            self.log.format = v;
        }
        if let Some(v) = get("NARAD_SECURITY_ENABLED") {
            self.security.enabled = parse_bool("NARAD_SECURITY_ENABLED", &v)?;
        }
        self.security.admin_password = get("NARAD_ADMIN_PASSWORD");
        self.security.cluster_secret = get("NARAD_CLUSTER_SECRET");
        for (key, slot) in [
            (
                "NARAD_CLUSTER_TLS_CERT_FILE",
                &mut self.security.cluster_tls_cert_file,
            ),
            (
                "NARAD_CLUSTER_TLS_KEY_FILE",
                &mut self.security.cluster_tls_key_file,
            ),
            (
                "NARAD_CLUSTER_TLS_CA_FILE",
                &mut self.security.cluster_tls_ca_file,
            ),
            ("NARAD_HTTP_TLS_CERT_FILE", &mut self.http.tls_cert_file),
            ("NARAD_HTTP_TLS_KEY_FILE", &mut self.http.tls_key_file),
        ] {
            if let Some(v) = get(key) {
                *slot = Some(PathBuf::from(v));
            }
        }
        Ok(())
    }

    /// `NARAD_WAL_LANES`, `NARAD_DISPATCH_LINGER_US`, `NARAD_DISPATCH_IDLE_LINGER_US`,
    /// `NARAD_DISPATCH_PARALLEL`, `NARAD_WAL_SKIP_LOCAL`, `NARAD_WORKER_THREADS`,
    /// `NARAD_WAL_INLINE` (see
    /// [`Tuning`]); a value out of range stops the node rather than being ignored.
    fn apply_tuning(&mut self, get: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let ranged = |key: &str, lo: u64, hi: u64| -> Result<Option<u64>, ConfigError> {
            let Some(v) = get(key) else { return Ok(None) };
            let n: u64 = parse_num(key, &v)?;
            if !(lo..=hi).contains(&n) {
                return Err(bad(format!("{key} must be between {lo} and {hi}, not {n}")));
            }
            Ok(Some(n))
        };
        let t = &mut self.tuning;
        t.worker_threads = Tuning::worker_threads_from(get)?;
        t.wal_inline = Tuning::wal_inline_from(get)?;
        if let Some(n) = ranged("NARAD_WAL_LANES", 1, 8)? {
            t.wal_lanes = n as usize;
        }
        if let Some(n) = ranged("NARAD_DISPATCH_LINGER_US", 0, 1_000_000)? {
            t.dispatch_linger = Duration::from_micros(n);
        }
        if let Some(n) = ranged("NARAD_DISPATCH_IDLE_LINGER_US", 0, 1_000_000)? {
            t.dispatch_idle_linger = Duration::from_micros(n);
        }
        if let Some(n) = ranged(
            "NARAD_DISPATCH_PARALLEL",
            1,
            crate::wal::dispatcher::MAX_PARALLEL as u64,
        )? {
            t.dispatch_parallel = n as usize;
        }
        if let Some(v) = get("NARAD_WAL_SKIP_LOCAL") {
            t.wal_skip_local = parse_bool("NARAD_WAL_SKIP_LOCAL", &v)?;
        }
        Ok(())
    }

    /// `NARAD_TEST_*`: only behind [`TEST_KNOBS_SWITCH`]; a knob without the switch is an
    /// error rather than silently ignored (someone meant it to do something).
    fn apply_test_knobs(
        &mut self,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let enabled = match get(TEST_KNOBS_SWITCH) {
            Some(v) => parse_bool(TEST_KNOBS_SWITCH, &v)?,
            None => false,
        };
        if !enabled {
            return match TEST_KNOB_VARS.iter().find(|k| get(k).is_some()) {
                Some(k) => Err(bad(format!(
                    "{k} is a test knob: it takes effect only with {TEST_KNOBS_SWITCH}=true, which is for tests, never production"
                ))),
                None => Ok(()),
            };
        }
        let ms = |k: &str| -> Result<Option<Duration>, ConfigError> {
            get(k)
                .map(|v| parse_num::<u64>(k, &v).map(Duration::from_millis))
                .transpose()
        };
        if let Some(v) = get("NARAD_TEST_CLOCK_OFFSET_MS") {
            self.storage.clock_offset_ms = parse_num("NARAD_TEST_CLOCK_OFFSET_MS", &v)?;
        }
        // Any idle-log eviction time in ms, below the 60000 floor too (0 = off).
        if let Some(v) = get("NARAD_TEST_IDLE_LOG_EVICTION_MS") {
            self.storage.idle_log_eviction_ms = parse_num("NARAD_TEST_IDLE_LOG_EVICTION_MS", &v)?;
            self.storage.idle_log_eviction_test_knob = true;
        }
        let t = &mut self.test;
        t.heartbeat = ms("NARAD_TEST_HEARTBEAT_MS")?;
        t.dead_after = ms("NARAD_TEST_DEAD_AFTER_MS")?;
        t.force_promote_after = ms("NARAD_TEST_FORCE_PROMOTE_MS")?;
        t.move_handoff_pause = ms("NARAD_TEST_MOVE_HANDOFF_PAUSE_MS")?;
        t.wal_fsync_stall = ms("NARAD_TEST_WAL_FSYNC_STALL_MS")?;
        if let Some(v) = get("NARAD_TEST_RPC_UNSUPPORTED") {
            t.rpc_unsupported = v
                .split(',')
                .map(|s| parse_num::<u8>("NARAD_TEST_RPC_UNSUPPORTED", s.trim()))
                .collect::<Result<_, _>>()?;
        }
        t.version = get("NARAD_TEST_VERSION");
        if let Some(v) = get("NARAD_TEST_RPC_FAULT") {
            t.rpc_faults = v
                .split(',')
                .map(|s| {
                    crate::rpc::RpcFault::parse(s)
                        .map_err(|e| bad(format!("NARAD_TEST_RPC_FAULT: {e}")))
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = get("NARAD_TEST_HOLD_DRAINED_VOTERS") {
            t.hold_drained_voters = parse_bool("NARAD_TEST_HOLD_DRAINED_VOTERS", &v)?;
        }
        Ok(())
    }

    /// Refuses configurations that cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !["debug", "info", "warn", "error"].contains(&self.log.level.as_str()) {
            return Err(bad(format!(
                "log level must be debug, info, warn or error, got {:?}",
                self.log.level
            )));
        }
        if !["json", "text"].contains(&self.log.format.as_str()) {
            return Err(bad(format!(
                "log format must be json or text, got {:?}",
                self.log.format
            )));
        }
        if self.cluster.addr.as_deref() == Some(self.http.addr.as_str()) {
            return Err(bad("the API and cluster addresses must differ"));
        }
        if let Some(a) = &self.http.advertise_addr {
            let port = a.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
            if !matches!(port, Some((h, Ok(p))) if !h.is_empty() && p != 0) {
                return Err(bad(
                    "http.advertise_addr (NARAD_ADVERTISE_ADDR) must be host:port with a host",
                ));
            }
        }
        if let Some(m) = &self.http.metrics_addr {
            if m.is_empty() {
                return Err(bad("http.metrics_addr must be host:port (or :port)"));
            }
            if *m == self.http.addr || self.cluster.addr.as_deref() == Some(m.as_str()) {
                return Err(bad(
                    "http.metrics_addr must differ from the API and cluster addresses",
                ));
            }
        }
        let n = self.cluster.peers.len();
        if n == 2 {
            return Err(bad("--peers needs 1 entry or at least 3"));
        }
        for m in &self.cluster.initial_members {
            if !self.cluster.peers.iter().any(|(id, _)| id == m) {
                return Err(bad(format!("initial member {m} is not in the peers")));
            }
        }
        if self.security.enabled && n > 0 && self.security.cluster_secret.is_none() {
            return Err(bad(
                "NARAD_CLUSTER_SECRET is required with security on and peers",
            ));
        }
        let s = &self.security;
        let set = [
            &s.cluster_tls_cert_file,
            &s.cluster_tls_key_file,
            &s.cluster_tls_ca_file,
        ]
        .iter()
        .filter(|f| f.is_some())
        .count();
        if set != 0 && set != 3 {
            return Err(bad("cluster TLS needs all of NARAD_CLUSTER_TLS_CERT_FILE, NARAD_CLUSTER_TLS_KEY_FILE and NARAD_CLUSTER_TLS_CA_FILE (security.cluster_tls_{cert,key,ca}_file), or none"));
        }
        if self.http.tls_cert_file.is_some() != self.http.tls_key_file.is_some() {
            return Err(bad("HTTP TLS needs both NARAD_HTTP_TLS_CERT_FILE and NARAD_HTTP_TLS_KEY_FILE (http.tls_{cert,key}_file, --tls-cert-file/--tls-key-file), or neither"));
        }
        if let Some(s) = &self.security.cluster_secret {
            if s.len() < crate::rpc::auth::MIN_SECRET_LEN {
                return Err(bad(format!(
                    "NARAD_CLUSTER_SECRET must be at least {} bytes, got {}",
                    crate::rpc::auth::MIN_SECRET_LEN,
                    s.len()
                )));
            }
        }
        let t = &self.topic;
        if t.max_topics == 0 {
            return Err(bad("topic.max_topics must be at least 1"));
        }
        if t.max_partitions < 3 || t.max_partitions > 108 {
            return Err(bad("topic.max_partitions must be between 3 and 108"));
        }
        if t.default_partitions < 3 || t.default_partitions > t.max_partitions {
            return Err(bad(
                "topic.default_partitions must be between 3 and topic.max_partitions",
            ));
        }
        if t.default_retention_age_ms != 0 && t.default_retention_age_ms < 3_600_000 {
            return Err(bad(
                "topic.default_retention_age_ms must be 0 or at least 3600000",
            ));
        }
        if self.http.max_batch_bytes_in_flight == 0 {
            return Err(bad("http.max_batch_bytes_in_flight must be at least 1"));
        }
        if self.http.max_consume_wait >= self.http.write_timeout
            || self.http.max_consume_wait > self.http.shutdown_grace
        {
            return Err(bad("http.max_consume_wait must be below the write timeout and at most the shutdown grace"));
        }
        if self.storage.segment_max_bytes < 4096 {
            return Err(bad("storage.segment_max_bytes must be at least 4096"));
        }
        if narad_storage::Codec::from_name(&self.storage.codec).is_none() {
            return Err(bad(format!(
                "storage.codec must be none or zstd, got {:?}",
                self.storage.codec
            )));
        }
        if narad_storage::CompressionLevel::from_name(&self.storage.compression_level).is_none() {
            return Err(bad(format!(
                "storage.compression_level must be fastest, default, better or best, got {:?}",
                self.storage.compression_level
            )));
        }
        if self.storage.idle_log_eviction_ms != 0
            && self.storage.idle_log_eviction_ms < 60_000
            && !self.storage.idle_log_eviction_test_knob
        {
            return Err(bad(
                "storage.idle_log_eviction_ms must be 0 or at least 60000",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(args: ServerArgs, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load(&args, &move |k: &str| env.get(k).cloned())
    }

    #[test]
    fn tuning_from_env_is_checked() {
        assert_eq!(
            load(ServerArgs::default(), &[]).unwrap().tuning,
            Tuning::default()
        );
        let c = load(
            ServerArgs::default(),
            &[
                ("NARAD_WAL_LANES", "1"),
                ("NARAD_DISPATCH_LINGER_US", "0"),
                ("NARAD_DISPATCH_IDLE_LINGER_US", "7"),
                ("NARAD_DISPATCH_PARALLEL", "16"),
                ("NARAD_WAL_SKIP_LOCAL", "true"),
                ("NARAD_WORKER_THREADS", "3"),
                ("NARAD_WAL_INLINE", "false"),
            ],
        )
        .unwrap();
        assert_eq!(
            c.tuning,
            Tuning {
                worker_threads: 3,
                wal_lanes: 1,
                dispatch_linger: Duration::ZERO,
                dispatch_idle_linger: Duration::from_micros(7),
                dispatch_parallel: 16,
                wal_skip_local: true,
                wal_inline: false,
            }
        );
        for (k, v) in [
            ("NARAD_WAL_LANES", "0"),
            ("NARAD_WAL_LANES", "9"),
            ("NARAD_WAL_LANES", "two"),
            ("NARAD_DISPATCH_LINGER_US", "1000001"),
            ("NARAD_DISPATCH_LINGER_US", "-1"),
            ("NARAD_DISPATCH_IDLE_LINGER_US", "1000001"),
            ("NARAD_DISPATCH_PARALLEL", "0"),
            ("NARAD_DISPATCH_PARALLEL", "17"),
            ("NARAD_WAL_SKIP_LOCAL", "sometimes"),
            ("NARAD_WORKER_THREADS", "0"),
            ("NARAD_WORKER_THREADS", "257"),
            ("NARAD_WORKER_THREADS", "many"),
            ("NARAD_WAL_INLINE", "sometimes"),
        ] {
            let e = load(ServerArgs::default(), &[(k, v)])
                .unwrap_err()
                .to_string();
            assert!(e.contains(k), "{k}={v}: {e}");
        }
    }

    #[test]
    fn every_variable_the_chart_and_the_operator_set_is_one_the_broker_reads() {
        let read = known_env_names();
        for name in TEST_KNOB_VARS
            .iter()
            .chain(&["NARAD_WAL_LANES", "NARAD_HTTP_TLS_CERT_FILE"])
        {
            assert!(read.contains(*name), "{name} is not looked up: {read:?}");
        }
        // `- name: NARAD_…` in the chart's StatefulSet; `env("NARAD_…"` and `"NARAD_…",` in
        // the operator's.
        let chart = include_str!("../../charts/narad/templates/statefulset.yaml");
        let operator = include_str!("../../operator/src/resources/statefulset.rs");
        let names = |text: &str, before: &str| -> Vec<String> {
            text.match_indices(before)
                .map(|(i, _)| {
                    let rest = &text[i + before.len()..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                        .unwrap_or(rest.len());
                    format!("NARAD_{}", &rest[..end])
                })
                .collect()
        };
        let from_chart = names(chart, "name: NARAD_");
        let from_operator = names(operator, "\"NARAD_");
        assert!(from_chart.len() >= 20, "{from_chart:?}");
        assert!(from_operator.len() >= 15, "{from_operator:?}");
        for name in from_chart.iter().chain(&from_operator) {
            assert!(
                read.contains(name),
                "{name} is set for the broker by the chart or the operator, but the broker never reads it"
            );
        }
    }

    #[test]
    fn console_enabled_from_file_and_env() {
        assert!(
            load(ServerArgs::default(), &[])
                .unwrap()
                .http
                .console_enabled
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(&f, r#"{"http":{"console_enabled":false}}"#).unwrap();
        let args = ServerArgs {
            config: Some(f),
            ..Default::default()
        };
        assert!(!load(args.clone(), &[]).unwrap().http.console_enabled);
        let c = load(args, &[("NARAD_HTTP_CONSOLE_ENABLED", "true")]).unwrap();
        assert!(c.http.console_enabled);
        let c = load(
            ServerArgs::default(),
            &[("NARAD_HTTP_CONSOLE_ENABLED", "false")],
        )
        .unwrap();
        assert!(!c.http.console_enabled);
        let e = load(
            ServerArgs::default(),
            &[("NARAD_HTTP_CONSOLE_ENABLED", "maybe")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("NARAD_HTTP_CONSOLE_ENABLED"), "{e}");
    }

    #[test]
    fn shutdown_delay_from_file_and_env() {
        let c = load(ServerArgs::default(), &[]).unwrap();
        assert_eq!(c.http.shutdown_delay, Duration::ZERO);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(&f, r#"{"http":{"shutdown_delay":"2s"}}"#).unwrap();
        let args = ServerArgs {
            config: Some(f),
            ..Default::default()
        };
        let c = load(args.clone(), &[]).unwrap();
        assert_eq!(c.http.shutdown_delay, Duration::from_secs(2));
        let c = load(args, &[("NARAD_HTTP_SHUTDOWN_DELAY", "5s")]).unwrap();
        assert_eq!(c.http.shutdown_delay, Duration::from_secs(5));
        let e = load(
            ServerArgs::default(),
            &[("NARAD_HTTP_SHUTDOWN_DELAY", "soon")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("NARAD_HTTP_SHUTDOWN_DELAY"), "{e}");
    }

    #[test]
    fn storage_codec_and_level_from_file_are_checked() {
        use narad_storage::{Codec, CompressionLevel};
        let c = load(ServerArgs::default(), &[]).unwrap();
        assert_eq!(
            (c.storage.log_codec(), c.storage.log_compression_level()),
            (Codec::None, CompressionLevel::Fastest)
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        let with = |storage: &str| {
            std::fs::write(&f, format!(r#"{{"storage":{storage}}}"#)).unwrap();
            load(
                ServerArgs {
                    config: Some(f.clone()),
                    ..Default::default()
                },
                &[],
            )
        };
        let c = with(r#"{"codec":"zstd"}"#).unwrap();
        assert_eq!(
            (c.storage.log_codec(), c.storage.log_compression_level()),
            (Codec::Zstd, CompressionLevel::Fastest)
        );
        for (name, level) in [
            ("fastest", CompressionLevel::Fastest),
            ("default", CompressionLevel::Default),
            ("better", CompressionLevel::Better),
            ("best", CompressionLevel::Best),
        ] {
            let c = with(&format!(
                r#"{{"codec":"zstd","compression_level":"{name}"}}"#
            ))
            .unwrap();
            assert_eq!(c.storage.log_compression_level(), level, "{name}");
        }
        let c = with(r#"{"codec":"none","compression_level":"best"}"#).unwrap();
        assert_eq!(c.storage.log_codec(), Codec::None);
        for bad_codec in ["lz4", "ZSTD", "", "gzip"] {
            let e = with(&format!(r#"{{"codec":"{bad_codec}"}}"#)).unwrap_err();
            assert!(
                e.0.contains("storage.codec must be none or zstd")
                    && e.0.contains(&format!("{bad_codec:?}")),
                "{e}"
            );
        }
        let e = with(r#"{"codec":"zstd","compression_level":"max"}"#).unwrap_err();
        assert!(
            e.0.contains("storage.compression_level must be fastest, default, better or best")
                && e.0.contains(r#""max""#),
            "{e}"
        );
        let e = with(r#"{"compression_level":"9"}"#).unwrap_err();
        assert!(e.0.contains("storage.compression_level"), "{e}");
    }

    #[test]
    fn remote_allowed_hosts_from_file_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(
            &f,
            r#"{"remotes":{"allowed_hosts":["queue.example.com","10.0.0.0/8"]}}"#,
        )
        .unwrap();
        let args = ServerArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let c = load(ServerArgs::default(), &[]).unwrap();
        assert!(!c.fanout.remote_hosts.is_configured());
        let c = load(args.clone(), &[]).unwrap();
        assert!(c.fanout.remote_hosts.check("10.1.1.1").is_ok());
        assert!(c.fanout.remote_hosts.check("127.0.0.1").is_err());
        let c = load(
            args,
            &[("NARAD_REMOTES_ALLOWED_HOSTS", "127.0.0.1, *.corp")],
        )
        .unwrap();
        assert!(c.fanout.remote_hosts.check("127.0.0.1").is_ok());
        assert!(c.fanout.remote_hosts.check("a.corp").is_ok());
        assert!(c.fanout.remote_hosts.check("10.1.1.1").is_err());
        let e = load(
            ServerArgs::default(),
            &[("NARAD_REMOTES_ALLOWED_HOSTS", "http://x")],
        )
        .unwrap_err();
        assert!(e.0.contains("remotes.allowed_hosts"), "{e:?}");
    }

    #[test]
    fn layering_flags_over_env_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(&f, r#"{"http":{"addr":"127.0.0.1:1","max_consume_wait":"5s"},"log":{"level":"warn"},"topic":{"default_partitions":4}}"#).unwrap();
        let args = ServerArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let c = load(args.clone(), &[]).unwrap();
        assert_eq!(c.http.addr, "127.0.0.1:1");
        assert_eq!(c.http.max_consume_wait, Duration::from_secs(5));
        assert_eq!(c.log.level, "warn");
        assert_eq!(c.topic.default_partitions, 4);
        let c = load(
            args.clone(),
            &[
                ("NARAD_HTTP_ADDR", "127.0.0.1:2"),
                ("NARAD_LOG_LEVEL", "debug"),
            ],
        )
        .unwrap();
        assert_eq!(c.http.addr, "127.0.0.1:2");
        assert_eq!(c.log.level, "debug");
        let c = load(
            ServerArgs {
                addr: Some("127.0.0.1:3".into()),
                ..args
            },
            &[("NARAD_HTTP_ADDR", "127.0.0.1:2")],
        )
        .unwrap();
        assert_eq!(c.http.addr, "127.0.0.1:3");
    }

    #[test]
    fn dev_mode_defaults() {
        let c = load(
            ServerArgs {
                dev: true,
                ..Default::default()
            },
            &[("NARAD_SECURITY_ENABLED", "true")],
        )
        .unwrap();
        assert!(!c.security.enabled);
        assert_eq!(c.http.addr, "127.0.0.1:7942");
        assert!(c.storage.data_dir.ends_with(".narad/data"));
        assert_eq!(c.log.format, "text");
        assert!(load(
            ServerArgs {
                dev: true,
                peers: Some("a@h:1".into()),
                ..Default::default()
            },
            &[]
        )
        .is_err());
    }

    #[test]
    fn topic_count_limit() {
        let c = load(ServerArgs::default(), &[]).unwrap();
        assert_eq!(c.topic.max_topics, DEFAULT_MAX_TOPICS);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(&f, r#"{"topic":{"max_topics":5}}"#).unwrap();
        let args = ServerArgs {
            config: Some(f),
            ..Default::default()
        };
        assert_eq!(load(args.clone(), &[]).unwrap().topic.max_topics, 5);
        // The environment wins over the file.
        let c = load(args, &[("NARAD_TOPIC_MAX_TOPICS", "7")]).unwrap();
        assert_eq!(c.topic.max_topics, 7);
        for v in ["0", "many", "-1"] {
            let env = [("NARAD_TOPIC_MAX_TOPICS", v)];
            assert!(load(ServerArgs::default(), &env).is_err(), "{v}");
        }
    }

    #[test]
    fn metrics_listener_address() {
        let c = load(ServerArgs::default(), &[]).unwrap();
        assert_eq!(c.http.metrics_addr, None);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(&f, r#"{"http":{"metrics_addr":"127.0.0.1:9090"}}"#).unwrap();
        let args = ServerArgs {
            config: Some(f),
            ..Default::default()
        };
        let c = load(args.clone(), &[]).unwrap();
        assert_eq!(c.http.metrics_addr.as_deref(), Some("127.0.0.1:9090"));
        let c = load(args, &[("NARAD_HTTP_METRICS_ADDR", ":9191")]).unwrap();
        assert_eq!(c.http.metrics_addr.as_deref(), Some(":9191"));
        // It cannot share the API's or the cluster port's address.
        let env = [("NARAD_HTTP_METRICS_ADDR", ":7942")];
        assert!(load(ServerArgs::default(), &env).is_err());
        let args = ServerArgs {
            cluster_addr: Some("127.0.0.1:9300".into()),
            ..Default::default()
        };
        let env = [("NARAD_HTTP_METRICS_ADDR", "127.0.0.1:9300")];
        assert!(load(args, &env).is_err());
    }

    #[test]
    fn port_flags_replace_the_port_of_the_listen_addresses() {
        let args = ServerArgs {
            port: Some(8080),
            cluster_port: Some(7946),
            ..Default::default()
        };
        let c = load(args.clone(), &[]).unwrap();
        assert_eq!(c.http.addr, ":8080");
        assert_eq!(c.cluster.addr.as_deref(), Some(":7946"));
        // The host of the configured (or --dev) address stays.
        let c = load(
            args.clone(),
            &[
                ("NARAD_HTTP_ADDR", "10.0.0.5:1"),
                ("NARAD_CLUSTER_ADDR", "[::1]:2"),
            ],
        )
        .unwrap();
        assert_eq!(c.http.addr, "10.0.0.5:8080");
        assert_eq!(c.cluster.addr.as_deref(), Some("[::1]:7946"));
        let dev = ServerArgs {
            dev: true,
            port: Some(9000),
            cluster_port: Some(7946),
            data_dir: Some(std::env::temp_dir()),
            ..Default::default()
        };
        let c = load(dev, &[]).unwrap();
        assert_eq!(c.http.addr, "127.0.0.1:9000");
        assert_eq!(c.cluster.addr.as_deref(), Some("127.0.0.1:7946"));
    }

    #[test]
    fn invalid_configurations_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(&f, r#"{"http":{"adr":":1"}}"#).unwrap();
        let e = load(
            ServerArgs {
                config: Some(f),
                ..Default::default()
            },
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        assert!(load(
            ServerArgs {
                addr: Some(":1".into()),
                cluster_addr: Some(":1".into()),
                ..Default::default()
            },
            &[]
        )
        .is_err());
        assert!(load(
            ServerArgs {
                peers: Some("a@h:1,b@h:2".into()),
                ..Default::default()
            },
            &[]
        )
        .is_err());
        assert!(load(
            ServerArgs {
                log_level: Some("loud".into()),
                ..Default::default()
            },
            &[]
        )
        .is_err());
        assert!(load(
            ServerArgs::default(),
            &[("NARAD_HTTP_MAX_CONSUME_WAIT", "1m")]
        )
        .is_err());
    }

    #[test]
    fn idle_log_eviction_floor_and_test_knob() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(&f, r#"{"storage":{"idle_log_eviction_ms":500}}"#).unwrap();
        let args = || ServerArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let e = load(args(), &[]).unwrap_err();
        assert!(e.to_string().contains("idle_log_eviction_ms"), "{e}");
        // The test knob bypasses the floor (and wins over the file).
        let knobs = (TEST_KNOBS_SWITCH, "true");
        let c = load(args(), &[knobs, ("NARAD_TEST_IDLE_LOG_EVICTION_MS", "250")]).unwrap();
        assert_eq!(c.storage.idle_log_eviction_ms, 250);
        assert!(load(
            ServerArgs::default(),
            &[knobs, ("NARAD_TEST_IDLE_LOG_EVICTION_MS", "soon")]
        )
        .is_err());
    }

    #[test]
    fn test_knobs_need_the_switch() {
        for k in TEST_KNOB_VARS {
            let v = match k {
                "NARAD_TEST_VERSION" => "9.9.9",
                "NARAD_TEST_RPC_FAULT" => "after:31:1",
                "NARAD_TEST_HOLD_DRAINED_VOTERS" => "true",
                _ => "5",
            };
            let e = load(ServerArgs::default(), &[(k, v)]).unwrap_err();
            assert!(e.to_string().contains(k), "{e}");
            let e = load(
                ServerArgs::default(),
                &[(TEST_KNOBS_SWITCH, "false"), (k, v)],
            )
            .unwrap_err();
            assert!(e.to_string().contains("NARAD_TEST_KNOBS=true"), "{e}");
            load(
                ServerArgs::default(),
                &[(TEST_KNOBS_SWITCH, "true"), (k, v)],
            )
            .unwrap();
        }
        let c = load(
            ServerArgs::default(),
            &[
                (TEST_KNOBS_SWITCH, "true"),
                ("NARAD_TEST_HEARTBEAT_MS", "250"),
                ("NARAD_TEST_RPC_UNSUPPORTED", "11, 31"),
                ("NARAD_TEST_VERSION", "0.2.0"),
            ],
        )
        .unwrap();
        assert_eq!(c.test.heartbeat, Some(Duration::from_millis(250)));
        assert_eq!(c.test.rpc_unsupported, vec![11, 31]);
        assert_eq!(c.test.version.as_deref(), Some("0.2.0"));
        assert!(load(
            ServerArgs::default(),
            &[
                (TEST_KNOBS_SWITCH, "true"),
                ("NARAD_TEST_RPC_UNSUPPORTED", "x")
            ]
        )
        .is_err());
        // Without any knob the switch alone changes nothing.
        let c = load(ServerArgs::default(), &[(TEST_KNOBS_SWITCH, "true")]).unwrap();
        assert!(c.test.heartbeat.is_none() && c.test.version.is_none());
    }

    #[test]
    fn cluster_secret_length_and_tls_files_all_or_none() {
        let peers = ("NARAD_CLUSTER_PEERS", "a@h:1,b@h:2,c@h:3");
        let id = ("NARAD_NODE_ID", "a");
        let e = load(
            ServerArgs::default(),
            &[
                peers,
                id,
                ("NARAD_CLUSTER_SECRET", "0123456789abcdef0123456789abcde"),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("at least 32 bytes, got 31"), "{e}");
        assert!(!e.to_string().contains("0123456789"), "secret in {e}");
        let secret = ("NARAD_CLUSTER_SECRET", "0123456789abcdef0123456789abcdef");
        load(ServerArgs::default(), &[peers, id, secret]).unwrap();
        // Security off does not make a short secret fine.
        assert!(load(
            ServerArgs::default(),
            &[
                ("NARAD_SECURITY_ENABLED", "false"),
                ("NARAD_CLUSTER_SECRET", "short")
            ]
        )
        .is_err());

        let cert = ("NARAD_CLUSTER_TLS_CERT_FILE", "/tls/tls.crt");
        let key = ("NARAD_CLUSTER_TLS_KEY_FILE", "/tls/tls.key");
        let ca = ("NARAD_CLUSTER_TLS_CA_FILE", "/tls/ca.crt");
        for partial in [vec![cert], vec![cert, key], vec![key, ca], vec![ca]] {
            let mut env = vec![peers, id, secret];
            env.extend(partial);
            let e = load(ServerArgs::default(), &env).unwrap_err();
            assert!(
                e.to_string().contains("all of NARAD_CLUSTER_TLS_CERT_FILE"),
                "{e}"
            );
        }
        let c = load(ServerArgs::default(), &[peers, id, secret, cert, key, ca]).unwrap();
        let files = c.security.cluster_tls_files().unwrap();
        assert_eq!(
            files.ca.as_deref(),
            Some(std::path::Path::new("/tls/ca.crt"))
        );

        // The config file's keys are known too.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(
            &f,
            r#"{"security":{"cluster_tls_cert_file":"/c","cluster_tls_key_file":"/k","cluster_tls_ca_file":"/a"},"http":{"tls_cert_file":"/hc","tls_key_file":"/hk"}}"#,
        )
        .unwrap();
        let c = load(
            ServerArgs {
                config: Some(f),
                ..Default::default()
            },
            &[],
        )
        .unwrap();
        assert!(c.security.cluster_tls_files().is_some());
        assert_eq!(
            c.http.tls_files().unwrap().key,
            std::path::PathBuf::from("/hk")
        );
        let e = load(
            ServerArgs::default(),
            &[("NARAD_HTTP_TLS_CERT_FILE", "/hc")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("HTTP TLS needs both"), "{e}");
    }
}
