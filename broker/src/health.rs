//! A node's life cycle as others see it: starting, ready, in or out of service, stopping,
//! shut down (SPEC §3.10). `/readyz`, `/healthz`, the placement tasks and every background
//! loop read it here; the composition root (`node`) is the only writer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use narad_meta::{Meta, MetaState};
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;

/// Readiness and shutdown of this node. Holds only the handles it reads.
pub struct Health {
    node_id: String,
    meta: Meta,
    cluster: Arc<Cluster>,
    /// Requests need credentials: readiness then waits for the root admin's seeding.
    security_on: bool,
    /// Recovery and startup reconciliation are done.
    started: AtomicBool,
    /// SIGTERM arrived: `/readyz` fails while the node still serves for
    /// `http.shutdown_delay`, before the graceful shutdown.
    stopping: AtomicBool,
    /// `/readyz` answered ready once.
    was_ready: AtomicBool,
    /// Cancelled when the graceful shutdown begins; every background task ends on it.
    shutdown: CancellationToken,
}

impl Health {
    pub fn new(node_id: String, meta: Meta, cluster: Arc<Cluster>, security_on: bool) -> Health {
        Health {
            node_id,
            meta,
            cluster,
            security_on,
            started: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            was_ready: AtomicBool::new(false),
            shutdown: CancellationToken::new(),
        }
    }

    /// `/readyz` (SPEC §3.10): recovery done, admitted to the cluster with a leader known and
    /// this node registered, and, with security on, the root admin seeded.
    /// Once ready, a node stays ready while it runs: losing the metadata quorum later must
    /// not take it out of service, since produce and consume go on without one (SPEC §1.1).
    pub fn is_ready(&self) -> bool {
        if self.was_ready.load(Ordering::Acquire) {
            return true;
        }
        let ready = self.startup_done()
            && self.cluster.admitted()
            && self.cluster.registered()
            && self.meta.current_leader().is_some()
            && (!self.security_on || seeding_settled(&self.meta.view()));
        if ready {
            self.was_ready.store(true, Ordering::Release);
        }
        ready
    }

    /// Why `/readyz` is not ready (for its error body).
    pub fn not_ready_reason(&self) -> &'static str {
        if !self.startup_done() {
            "starting up"
        } else if !self.cluster.admitted() {
            "not admitted to the cluster yet"
        } else if self.meta.current_leader().is_none() {
            "no metadata leader"
        } else if !self.cluster.registered() {
            "member not registered yet"
        } else {
            "root admin not seeded yet"
        }
    }

    /// Why a ready node takes itself out of service (`/readyz` 503, liveness unaffected):
    /// it is draining (it takes no new produce, SPEC §6.5) or no longer a member (it left
    /// the voters or its member record is gone). `None`: in service, or standalone.
    pub fn out_of_service(&self) -> Option<String> {
        if !self.cluster.clustered || !self.cluster.registered() {
            return None;
        }
        match self.meta.view().members.get(&self.node_id) {
            None => {
                return Some(format!(
                    "node {} is not a member of the cluster",
                    self.node_id
                ))
            }
            Some(m) if m.draining => {
                return Some(format!(
                    "node {} is draining (decommission): it takes no new produce",
                    self.node_id
                ))
            }
            Some(_) => {}
        }
        if !self.meta.voters().iter().any(|(id, _)| *id == self.node_id) {
            return Some(format!(
                "node {} is no longer a member of the cluster (not a voter)",
                self.node_id
            ));
        }
        None
    }

    /// Recovery and startup reconciliation are done (readiness but for root seeding).
    pub fn startup_done(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    /// The composition root finished starting the node.
    pub fn set_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    /// `/readyz` fails from now on; the node still serves until the shutdown begins.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Whether the node is on its way out: `/readyz` fails, though it may still serve
    /// (`http.shutdown_delay`).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire) || self.is_shutting_down()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    pub fn shutdown_signal(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.shutdown.cancelled()
    }

    /// The token every background task ends on (cancelled by [`Health::begin_shutdown`]).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The graceful shutdown begins: background tasks end.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }
}

/// Whether root seeding is over: the root admin exists, or users exist without one (created
/// while security was off; `SeedRoot` never adds root next to existing users, so waiting
/// would never end — the seeding task warns about it instead).
pub fn seeding_settled(view: &MetaState) -> bool {
    view.root_user().is_some() || !view.users.is_empty()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use narad_meta::MetaCommand;

    use super::*;

    /// A standalone node's metadata, cluster view and health, nothing started yet.
    async fn standalone(dir: &std::path::Path, security_on: bool) -> (Meta, Arc<Cluster>, Health) {
        let meta = crate::test_support::standalone_meta(dir).await;
        let auth = crate::rpc::ClusterAuth::new(crate::rpc::ClusterSecret::random(), None);
        let cluster = crate::test_support::cluster(&meta, auth, vec![]);
        let health = Health::new("n1".into(), meta.clone(), cluster.clone(), security_on);
        (meta, cluster, health)
    }

    async fn register(meta: &Meta, cluster: &Cluster) {
        meta.write(MetaCommand::RegisterMember {
            id: "n1".into(),
            api_addr: "127.0.0.1:7942".into(),
            cluster_addr: String::new(),
            version: "test".into(),
            now_ms: 0,
        })
        .await
        .unwrap();
        cluster.set_registered();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ready_once_started_and_registered_and_then_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let (meta, cluster, health) = standalone(dir.path(), false).await;
        assert!(!health.is_ready());
        assert_eq!(health.not_ready_reason(), "starting up");
        health.set_started();
        assert!(!health.is_ready());
        assert_eq!(health.not_ready_reason(), "member not registered yet");
        register(&meta, &cluster).await;
        assert!(health.is_ready());
        // Standalone: always in service.
        assert_eq!(health.out_of_service(), None);
        // Stopping fails readiness probes elsewhere (`/readyz` looks at is_stopping), but a
        // node that was ready stays ready: losing a quorum must not take it out of service.
        health.set_stopping();
        assert!(health.is_stopping() && !health.is_shutting_down());
        assert!(health.is_ready());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_security_on_readiness_waits_for_the_root_admin() {
        let dir = tempfile::tempdir().unwrap();
        let (meta, cluster, health) = standalone(dir.path(), true).await;
        health.set_started();
        register(&meta, &cluster).await;
        assert!(!health.is_ready());
        assert_eq!(health.not_ready_reason(), "root admin not seeded yet");
        meta.write(MetaCommand::SeedRoot {
            password_hash: "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaA".into(),
            now_ms: 0,
        })
        .await
        .unwrap();
        assert!(health.is_ready());
    }

    #[tokio::test]
    async fn the_shutdown_signal_reaches_every_holder_of_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let (_meta, _cluster, health) = standalone(dir.path(), false).await;
        let token = health.shutdown_token();
        assert!(!health.is_shutting_down() && !health.is_stopping());
        health.begin_shutdown();
        assert!(token.is_cancelled());
        assert!(health.is_shutting_down() && health.is_stopping());
        tokio::time::timeout(Duration::from_secs(1), health.shutdown_signal())
            .await
            .expect("the signal resolves once the shutdown began");
    }
}
