//! Wiring: one kube-runtime `Controller` per kind, started once this replica leads.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::{Api, ResourceExt};

use crate::crd::{Grant, NaradCluster, Topic, User};
use crate::reconcile::{self, error_policy, Context};

fn api<K>(client: &kube::Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn drain<S, T, E>(name: &'static str, s: S)
where
    S: futures::Stream<Item = Result<T, E>>,
    E: std::fmt::Display,
{
    s.for_each(|r| async move {
        if let Err(e) = r {
            tracing::debug!(controller = name, error = %e, "reconcile");
        }
    })
    .await
}

/// Runs `fut` (one reconciliation of `kind`) and records its outcome and duration.
async fn observed(
    kind: &'static str,
    ctx: Arc<Context>,
    fut: impl std::future::Future<Output = reconcile::Result<kube::runtime::controller::Action>>,
) -> reconcile::Result<kube::runtime::controller::Action> {
    let start = std::time::Instant::now();
    let r = fut.await;
    let result = match &r {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    ctx.metrics.observe(kind, result, start.elapsed());
    r
}

/// Runs the four controllers until they all stop (watch all namespaces, or `ns` only).
pub async fn controllers(ctx: Arc<Context>, ns: Option<String>) {
    let c = ctx.client.clone();
    let ns = ns.as_deref();
    let wc = watcher::Config::default();

    let clusters = Controller::new(api::<NaradCluster>(&c, ns), wc.clone())
        .owns(api::<StatefulSet>(&c, ns), wc.clone())
        .owns(api::<Service>(&c, ns), wc.clone())
        .owns(api::<ConfigMap>(&c, ns), wc.clone())
        // Broker pods (owned by the StatefulSet, not the NaradCluster): a pod deleted,
        // recreated or becoming ready moves a rollout on at once.
        .watches(
            api::<Pod>(&c, ns),
            watcher::Config::default().labels("app.kubernetes.io/name=narad"),
            |p: Pod| {
                let instance = p.labels().get("app.kubernetes.io/instance")?.clone();
                let mut r = ObjectRef::<NaradCluster>::new(&instance);
                if let Some(ns) = p.namespace() {
                    r = r.within(&ns);
                }
                Some(r)
            },
        )
        .shutdown_on_signal()
        .run(
            |o, c| {
                observed(
                    "naradcluster",
                    c.clone(),
                    reconcile::cluster::reconcile(o, c),
                )
            },
            error_policy,
            ctx.clone(),
        );

    let topics = Controller::new(api::<Topic>(&c, ns), wc.clone())
        .shutdown_on_signal()
        .run(
            |o, c| observed("topic", c.clone(), reconcile::topic::reconcile(o, c)),
            error_policy,
            ctx.clone(),
        );

    let users_ctl = Controller::new(api::<User>(&c, ns), wc.clone());
    let user_store = users_ctl.store();
    let store2 = user_store.clone();
    // Only Secrets marked for Narad: no other Secret's data enters the operator's cache (a
    // label removed reads as a deletion, so its Users are refused at once).
    let labelled = watcher::Config::default().labels(&format!(
        "{}={}",
        crate::crd::CREDENTIALS_LABEL,
        crate::crd::CREDENTIALS_LABEL_VALUE
    ));
    let users = users_ctl
        .watches(api::<Secret>(&c, ns), labelled, move |s: Secret| {
            // A password Secret changed: its Users re-apply the password.
            let ns = s.namespace();
            store2
                .state()
                .into_iter()
                .filter(|u| u.namespace() == ns && u.spec.password_secret_ref.name == s.name_any())
                .map(|u| ObjectRef::from_obj(&*u))
                .collect::<Vec<_>>()
        })
        .watches(api::<Grant>(&c, ns), wc.clone(), |g: Grant| {
            // A Grant changed: its User's union changed.
            let mut r = ObjectRef::new(&g.spec.user);
            if let Some(ns) = g.namespace() {
                r = r.within(&ns);
            }
            Some(r)
        })
        .shutdown_on_signal()
        .run(
            |o, c| observed("user", c.clone(), reconcile::user::reconcile(o, c)),
            error_policy,
            ctx.clone(),
        );

    let grants_ctl = Controller::new(api::<Grant>(&c, ns), wc.clone());
    let grant_store = grants_ctl.store();
    let grants = grants_ctl
        .watches(api::<User>(&c, ns), wc.clone(), move |u: User| {
            // A User became ready (or changed): its waiting Grants retry.
            let ns = u.namespace();
            grant_store
                .state()
                .into_iter()
                .filter(|g| g.namespace() == ns && g.spec.user == u.name_any())
                .map(|g| ObjectRef::from_obj(&*g))
                .collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(
            |o, c| observed("grant", c.clone(), reconcile::grant::reconcile(o, c)),
            error_policy,
            ctx.clone(),
        );

    tokio::join!(
        drain("naradcluster", clusters),
        drain("topic", topics),
        drain("user", users),
        drain("grant", grants),
    );
}
