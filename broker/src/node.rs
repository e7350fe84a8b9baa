//! The composition root: builds a node from its `Config`, starts its tasks, serves HTTP,
//! and shuts down in order (stop taking requests, let in-flight ones finish, flush).

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use narad_meta::{Meta, MetaCommand, MetaOptions};
use narad_storage::LogConfig;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::app::App;
use crate::clock::now_ms;
use crate::cluster::router::NodeRouter;
use crate::cluster::{membership, Cluster, Timing};
use crate::config::Config;
use crate::health::Health;
use crate::ingest::Ingest;
use crate::metrics::{Metrics, VersionLabels};
use crate::node_rpc::NodeRpc;
use crate::partition::Registry;
use crate::placement::{Controller, Moves};
use crate::queries::Queries;
use crate::security::Authenticator;
use crate::wal::dispatcher::Dispatcher;
use crate::wal::{Wal, WalOptions};

/// Threads for the fan-out engine's blocking work (reads, child commits, cursor files), at
/// a lower CPU priority than produce: one can read while the other waits for an fsync.
const FANOUT_IO_THREADS: usize = 2;

/// The most a shutdown waits for the dispatcher to empty the WAL.
const DRAIN_WAL: Duration = Duration::from_secs(5);
/// The most a shutdown waits for the background tasks to end once signalled.
const TASKS_END: Duration = Duration::from_secs(5);

/// The version this binary reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// An exclusive lock on the data dir, so two processes never share one.
struct DirLock(#[allow(dead_code, reason = "held for its flock")] fs::File);

impl DirLock {
    fn acquire(dir: &Path) -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd;
        let path = dir.join("LOCK");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        narad_storage::dirs::sync_dir(dir).with_context(|| format!("fsync {}", dir.display()))?;
        // SAFETY: flock on a file descriptor we own; no memory is touched.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            anyhow::bail!(
                "data dir {} is in use by another narad process",
                dir.display()
            );
        }
        Ok(DirLock(f))
    }
}

/// Turns `:7942` into `0.0.0.0:7942`.
pub fn listen_addr(addr: &str) -> String {
    if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    }
}

/// A running server (for `main` and for in-process tests).
pub struct Running {
    pub app: Arc<App>,
    pub addr: SocketAddr,
    /// The cluster port (node RPC and Raft).
    pub cluster_addr: SocketAddr,
    /// The metrics listener (`http.metrics_addr`), when configured.
    pub metrics_addr: Option<SocketAddr>,
    rpc: crate::rpc::RpcServer,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
    metrics_server: Option<tokio::task::JoinHandle<()>>,
    dispatcher: tokio::task::JoinHandle<()>,
    /// Every background task of the node (housekeeping, membership, placement, seeding).
    tasks: TaskTracker,
    /// The data dir's lock, released when the node has stopped.
    _lock: DirLock,
}

impl Running {
    /// Graceful shutdown: refuse new work, give in-flight requests the grace period, let the
    /// dispatcher drain (bounded), persist frontiers and the WAL checkpoint.
    ///
    /// With `http.shutdown_delay`, `/readyz` fails at once and the node keeps serving
    /// everything (produce, consume, settle) for that long first, so a load balancer that
    /// still routes to it (kube-proxy after a pod deletion) gets answers, not refused
    /// connections, until it has taken the node out.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let app = self.app.clone();
        app.health.set_stopping();
        let delay = app.config.http.shutdown_delay;
        if !delay.is_zero() {
            tracing::info!(
                delay_ms = delay.as_millis() as u64,
                "stopping: /readyz fails; serving on until the shutdown delay ends"
            );
            tokio::time::sleep(delay).await;
        }
        tracing::info!("shutting down");
        app.health.begin_shutdown();
        for rt in app.registry.all() {
            rt.notify.notify_waiters();
        }
        // A leader hands off first, so metadata writes pause for one election round instead
        // of an election timeout after this node's Raft stops.
        app.cluster.hand_off_leadership().await;
        let grace = app.config.http.shutdown_grace;
        match tokio::time::timeout(grace, self.server).await {
            Ok(r) => r??,
            Err(_) => tracing::warn!("in-flight requests outlived the shutdown grace"),
        }
        if let Some(m) = self.metrics_server {
            // Stopped by the same signal; a scrape in flight gets a moment to finish.
            if tokio::time::timeout(Duration::from_secs(1), m)
                .await
                .is_err()
            {
                tracing::debug!("a scrape outlived the shutdown");
            }
        }
        // Messages prefetched from remote owners go back to them at once.
        app.delivery.release_all_kept().await;
        // Let the dispatcher commit what the WAL holds, so a restart re-sends little (what
        // it cannot commit in time, for an owner that is down, stays in the WAL).
        if !within(DRAIN_WAL, app.wal.drained()).await {
            tracing::info!(
                records = app.wal.outstanding(),
                "records stay in the WAL for the next start (their owners did not take them in time)"
            );
        }
        app.children.shutdown().await;
        self.rpc.shutdown(Duration::from_secs(1)).await;
        self.dispatcher.abort();
        let _ = self.dispatcher.await;
        // Every background task has seen the shutdown signal; wait for them to end.
        self.tasks.close();
        if !within(TASKS_END, self.tasks.wait()).await {
            tracing::warn!(
                tasks = self.tasks.len(),
                "background tasks outlived the shutdown"
            );
        }
        app.registry.persist_frontiers();
        app.wal.close();
        app.delayed.close();
        app.meta.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Whether `f` ended within `limit` (a shutdown step that may not hold the stop up longer).
async fn within(limit: Duration, f: impl std::future::Future<Output = ()>) -> bool {
    tokio::time::timeout(limit, f).await.is_ok()
}

/// Starts a node: opens storage, recovers, joins its cluster (in the background), and serves
/// HTTP on `config.http.addr`.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let boot = Instant::now();
    let data_dir = config.storage.data_dir.clone();
    // Everything this process creates is its own: files 0600, directories 0700 (the metadata
    // holds password hashes and remote-link credentials; logs hold messages).
    // SAFETY: umask only swaps the process's file-mode mask.
    unsafe {
        libc::umask(0o077);
    }
    narad_storage::dirs::create_dir_all_durable(&data_dir)
        .with_context(|| format!("create data dir {}", data_dir.display()))?;
    // A data dir made by an older build may be world-readable: close it (nothing below it is
    // reachable without search permission on it).
    {
        use std::os::unix::fs::PermissionsExt;
        match fs::set_permissions(&data_dir, fs::Permissions::from_mode(0o700)) {
            Ok(()) => {}
            // A volume root this process does not own (a Kubernetes PVC: root with the pod's
            // fsGroup): its mode is the platform's, and what the node creates in it is still
            // private (umask 077).
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!(data_dir = %data_dir.display(), error = %e,
                    "the data dir is not this process's to restrict; the files it creates there are private (0600/0700)");
            }
            Err(e) => {
                return Err(e).with_context(|| format!("restrict data dir {}", data_dir.display()))
            }
        }
    }
    let lock = DirLock::acquire(&data_dir)?;
    let node_id = config.cluster.node_id.clone();
    let clustered = !config.cluster.peers.is_empty();

    // The cluster port first: Raft needs it from the moment the metadata node starts.
    // Standalone without an explicit address it is an OS-assigned loopback port, so
    // standalone servers run side by side (SPEC §7.1).
    let cluster_listen = config.cluster.addr.clone().unwrap_or_else(|| {
        if clustered {
            ":7943".into()
        } else {
            "127.0.0.1:0".into()
        }
    });
    // The configured secret; a standalone node without one makes a random secret nobody else
    // knows, so its cluster port serves no one. Only a cluster with security off and no secret
    // runs on the empty secret (SPEC §4.5; `rpc::auth`).
    let secret = match &config.security.cluster_secret {
        Some(s) => crate::rpc::ClusterSecret::new(s.clone().into_bytes()),
        None if !clustered => crate::rpc::ClusterSecret::random(),
        None => {
            tracing::warn!("security is off and NARAD_CLUSTER_SECRET is unset: any process that reaches the cluster port is trusted as a member");
            crate::rpc::ClusterSecret::none()
        }
    };
    // Mutual TLS on the cluster port when configured; files that do not load stop the node.
    let cluster_tls = match config.security.cluster_tls_files() {
        Some(files) => Some(
            crate::tls::ReloadingTls::load(files, crate::tls::TlsRole::ClusterMutual)
                .context("cluster TLS")?,
        ),
        None => {
            if clustered && config.security.enabled {
                tracing::warn!("cluster port is plaintext: set NARAD_CLUSTER_TLS_{{CERT,KEY,CA}}_FILE for mutual TLS, or keep the cluster network private (SPEC §4.5)");
            }
            None
        }
    };
    let auth = crate::rpc::ClusterAuth::new(secret, cluster_tls);
    // HTTPS on the API when configured; files that do not load stop the node.
    let http_tls = match config.http.tls_files() {
        Some(files) => Some(
            crate::tls::ReloadingTls::load(files, crate::tls::TlsRole::ApiServer)
                .context("HTTP TLS")?,
        ),
        None => None,
    };
    let rpc_handler = NodeRpc::new();
    let rpc = crate::rpc::RpcServer::bind(
        &listen_addr(&cluster_listen),
        node_id.clone(),
        auth.clone(),
        rpc_handler.clone(),
    )
    .await
    .with_context(|| format!("listen on cluster address {cluster_listen}"))?;
    let cluster_addr = rpc.local_addr();
    let advertise_addr = config
        .cluster
        .advertise_addr
        .clone()
        .or_else(|| {
            config
                .cluster
                .peers
                .iter()
                .find(|(id, _)| *id == node_id)
                .map(|(_, a)| a.clone())
        })
        .unwrap_or_else(|| routable(cluster_addr, &node_id));

    let meta_opts = MetaOptions {
        node_id: node_id.clone(),
        cluster_addr: advertise_addr.clone(),
    };
    let meta = if clustered {
        Meta::open(
            &data_dir.join("metastore"),
            meta_opts,
            Arc::new(crate::rpc::RpcRaftTransport::new(
                node_id.clone(),
                auth.clone(),
            )),
        )
        .await
    } else {
        Meta::open_standalone(&data_dir.join("metastore"), meta_opts).await
    }
    .context("open metadata")?;
    rpc.set_raft_handler(crate::rpc::MetaRaftHandler::new(
        meta.clone(),
        config.security.enabled,
    ));

    let listener = TcpListener::bind(listen_addr(&config.http.addr))
        .await
        .with_context(|| format!("listen on {}", config.http.addr))?;
    let addr = listener.local_addr()?;
    // The metrics listener, bound now so that a taken port stops the start.
    let metrics_listener = match &config.http.metrics_addr {
        Some(a) => Some(
            TcpListener::bind(listen_addr(a))
                .await
                .with_context(|| format!("listen on {a} (http.metrics_addr)"))?,
        ),
        None => None,
    };
    let metrics_addr = metrics_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;

    let cluster = Arc::new(Cluster::new(
        node_id.clone(),
        meta.clone(),
        crate::rpc::Peers::new(node_id.clone(), auth).with_faults(config.test.rpc_faults.clone()),
        config.cluster.peers.clone(),
        config.cluster.initial_members.clone(),
        advertise_addr,
        Timing::new(&config.test),
        config.topic.max_topics,
    ));
    let api_addr = api_advertise(
        config.http.advertise_addr.as_deref(),
        addr,
        &cluster.advertise_addr,
    );
    if !clustered {
        meta.write(MetaCommand::RegisterMember {
            id: node_id.clone(),
            api_addr: api_addr.clone(),
            cluster_addr: String::new(),
            version: VERSION.to_string(),
            now_ms: now_ms(),
        })
        .await
        .context("register this node")?;
        cluster.set_registered();
    }

    let metrics = Arc::new(Metrics::new());
    metrics
        .build_info
        .get_or_create(&VersionLabels { version: VERSION })
        .set(1);
    let log_cfg = LogConfig {
        segment_max_bytes: config.storage.segment_max_bytes,
        verify_from_device: config.storage.verify_from_device,
        preallocate: true,
        codec: config.storage.log_codec(),
        compression_level: config.storage.log_compression_level(),
        ..LogConfig::default()
    };
    let registry = Arc::new(Registry::new(
        data_dir.join("topics"),
        log_cfg,
        metrics.clone(),
    )?);
    registry
        .reconcile(&meta.view(), &node_id)
        .context("open partitions")?;

    let opened = Wal::open(
        &data_dir.join("ingress"),
        WalOptions {
            lanes: config.tuning.wal_lanes,
            // Taken only where `main` built the runtime that writes it (one worker).
            inline: config
                .tuning
                .wal_inline
                .then(crate::wal::InlineOptions::default),
            stall_each_write: config.test.wal_fsync_stall,
            ..WalOptions::default()
        },
    )
    .context("open the ingress wal")?;
    let (delayed, releaser) =
        crate::delayed::Delayed::open(&data_dir.join("delayed")).context("open the delay store")?;
    // Cluster hook: the remote committer for child partitions owned by other nodes.
    let child_io = crate::children::io::IoThreads::start(FANOUT_IO_THREADS)
        .context("start the fan-out I/O threads")?;
    // Remote-child passwords are sealed at rest (`security::sealing`): with a key derived from
    // the cluster secret every member shares, or a standalone node's key file.
    let credentials = match &config.security.cluster_secret {
        Some(s) => Some(Arc::new(
            crate::security::sealing::CredentialKey::from_secret(s.as_bytes()),
        )),
        None if !clustered => Some(Arc::new(
            crate::security::sealing::CredentialKey::from_key_file(&config.storage.data_dir)
                .context("the remote-child credential key")?,
        )),
        None => {
            tracing::warn!("NARAD_CLUSTER_SECRET is unset: remote-child passwords are stored unsealed in the metadata");
            None
        }
    };
    let mut children_config = config.fanout.clone();
    children_config.credentials = credentials.clone();
    let children = crate::children::Children::new(
        meta.clone(),
        registry.clone(),
        metrics.clone(),
        Arc::new(crate::children::RoutedCommitter::new(
            node_id.clone(),
            registry.clone(),
            child_io.clone(),
            Some(Arc::new(crate::cluster::router::RemoteChildCommitter {
                cluster: cluster.clone(),
            })),
        )),
        children_config,
        child_io,
    );
    if !clustered {
        children.confirm_view();
    }
    let health = Arc::new(Health::new(
        node_id.clone(),
        meta.clone(),
        cluster.clone(),
        config.security.enabled,
    ));
    let (visibility, demands) = crate::wal::dispatcher::Visibility::new(opened.wal.clone());
    let ingest = Arc::new(Ingest::new(
        node_id.clone(),
        meta.clone(),
        cluster.clone(),
        registry.clone(),
        opened.wal.clone(),
        metrics.clone(),
        config.tuning.wal_skip_local,
    ));
    let delivery = Arc::new(crate::delivery::Delivery::new(crate::delivery::Parts {
        meta: meta.clone(),
        registry: registry.clone(),
        cluster: cluster.clone(),
        metrics: metrics.clone(),
        max_wait: config.http.max_consume_wait,
        visibility,
        store: ingest.clone(),
        shutdown: health.shutdown_token(),
    }));
    let tasks = TaskTracker::new();
    let moves = Arc::new(Moves::new(
        node_id.clone(),
        meta.clone(),
        cluster.clone(),
        registry.clone(),
        opened.wal.clone(),
        delayed.clone(),
        metrics.clone(),
        health.clone(),
        &config.test,
        tasks.clone(),
    ));
    let controller = Arc::new(Controller::new(
        node_id.clone(),
        meta.clone(),
        cluster.clone(),
        opened.wal.clone(),
        delayed.clone(),
        health.clone(),
        config.test.hold_drained_voters,
    ));
    let queries = Arc::new(Queries::new(
        node_id.clone(),
        meta.clone(),
        registry.clone(),
        cluster.clone(),
        delivery.clone(),
        children.clone(),
    ));
    let app = Arc::new(App {
        credentials,
        config: config.clone(),
        node_id: node_id.clone(),
        meta: meta.clone(),
        wal: opened.wal.clone(),
        delayed: delayed.clone(),
        registry: registry.clone(),
        metrics: metrics.clone(),
        ingest,
        auth: Authenticator::default(),
        lease_counts: Default::default(),
        children,
        cluster: cluster.clone(),
        delivery,
        queries,
        health,
        moves,
        controller,
        data_dir: data_dir.clone(),
    });
    rpc_handler.set_app(app.clone());

    let dispatcher = Dispatcher::new(
        opened.wal.clone(),
        Arc::new(NodeRouter {
            cluster: cluster.clone(),
            registry: registry.clone(),
        }),
        metrics.clone(),
        config.tuning.dispatch_linger,
        config.tuning.dispatch_idle_linger,
        config.tuning.dispatch_parallel,
    );
    let dispatcher = tokio::spawn(dispatcher.run(opened.recovered, opened.durable_rx, demands));

    crate::housekeeping::spawn(&app, &tasks);
    tasks.spawn(releaser.run(Arc::new(opened.wal.clone()), app.health.shutdown_token()));
    if clustered {
        let token = app.health.shutdown_token();
        tasks.spawn(membership::establish(cluster.clone(), token.clone()));
        // The test knob `NARAD_TEST_VERSION` changes the version this member reports, so a
        // rolling-upgrade test can restart the same binary as the "new" version.
        let member_version = app
            .config
            .test
            .version
            .clone()
            .unwrap_or_else(|| VERSION.to_string());
        tasks.spawn(membership::heartbeat(
            cluster.clone(),
            api_addr,
            member_version,
            token.clone(),
        ));
        tasks.spawn(membership::controller(cluster.clone(), token));
        tasks.spawn(crate::placement::moves::run(app.moves.clone()));
        tasks.spawn(crate::placement::controller::run(app.controller.clone()));
    }
    app.children.sync().await;
    if app.security_on() {
        tasks.spawn(crate::security::seeding::seed_root(
            app.meta.clone(),
            app.config.security.admin_password.clone(),
            app.health.shutdown_token(),
        ));
    }

    let decoders =
        crate::api::encoding::Decoders::for_this_machine().context("start the decoding threads")?;
    let router = crate::api::router(app.clone(), decoders);
    let shutdown = app.health.shutdown_token();
    let timeouts = crate::api::server::HttpTimeouts {
        read: config.http.read_timeout,
        write: config.http.write_timeout,
        idle: config.http.idle_timeout,
    };
    let https = http_tls.is_some();
    // Plain HTTP and no credentials, like `/metrics` on the API listener (SPEC §9); the point
    // is a port that is not the public one.
    let metrics_server = metrics_listener.map(|l| {
        let router = crate::api::metrics_router(app.clone());
        let shutdown = app.health.shutdown_token();
        tokio::spawn(crate::api::server::serve(
            l, router, timeouts, None, shutdown,
        ))
    });
    let server = tokio::spawn(async move {
        crate::api::server::serve(listener, router, timeouts, http_tls, shutdown).await;
        Ok(())
    });
    app.health.set_started();
    metrics.boot_duration.set(boot.elapsed().as_secs_f64());
    tracing::info!(addr = %addr, cluster_addr = %cluster_addr, node_id = %app.node_id, data_dir = %data_dir.display(), clustered, https, boot_ms = boot.elapsed().as_millis() as u64, "narad listening");
    if let Some(m) = metrics_addr {
        tracing::info!(metrics_addr = %m, "metrics listening (plain HTTP, GET /metrics)");
    }
    Ok(Running {
        app,
        _lock: lock,
        addr,
        cluster_addr,
        metrics_addr,
        rpc,
        server,
        metrics_server,
        dispatcher,
        tasks,
    })
}

/// An address peers can reach a listener at: its own, unless it listens on every interface
/// (then this node's id, which is its resolvable host name in a StatefulSet).
/// The API address this member reports (`http.advertise_addr`): as configured; else the
/// bound address, unless it names every interface: then the host of the cluster advertise
/// address (a name peers resolve, e.g. `narad-0.narad-headless:7943`) with the API port.
fn api_advertise(configured: Option<&str>, bound: SocketAddr, cluster_advertise: &str) -> String {
    if let Some(a) = configured {
        return a.to_string();
    }
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    match cluster_advertise.rsplit_once(':') {
        Some((host, _)) if !host.is_empty() && !is_unspecified_host(host) => {
            format!("{host}:{}", bound.port())
        }
        _ => bound.to_string(),
    }
}

fn is_unspecified_host(host: &str) -> bool {
    host.trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
}

fn routable(bound: SocketAddr, node_id: &str) -> String {
    if bound.ip().is_unspecified() {
        format!("{node_id}:{}", bound.port())
    } else {
        bound.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertised_api_address_is_routable() {
        let any: SocketAddr = "0.0.0.0:7942".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:7942".parse().unwrap();
        // Configured wins.
        assert_eq!(
            api_advertise(Some("narad-0.narad-headless.ns.svc:7942"), any, "x:7943"),
            "narad-0.narad-headless.ns.svc:7942"
        );
        // A bound address that names one interface is reachable as it is.
        assert_eq!(api_advertise(None, lo, "narad-0:7943"), "127.0.0.1:7942");
        // Every interface: the cluster advertise host with the API port.
        assert_eq!(
            api_advertise(None, any, "narad-0.narad-headless:7943"),
            "narad-0.narad-headless:7942"
        );
        assert_eq!(api_advertise(None, any, "[fd00::5]:7943"), "[fd00::5]:7942");
        // Nothing better known.
        assert_eq!(api_advertise(None, any, "0.0.0.0:7943"), "0.0.0.0:7942");
        assert_eq!(api_advertise(None, any, "[::]:7943"), "0.0.0.0:7942");
        assert_eq!(api_advertise(None, any, ""), "0.0.0.0:7942");
    }
}
