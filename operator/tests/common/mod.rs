//! What the tests against the real API server share: the client from
//! `NARAD_K8S_KUBECONFIG`, bounded polling, CRD installation, server-side apply, a test
//! namespace and the operator run in-process.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use narad_operator::crd::all_crds;
use narad_operator::reconcile::Context;
use serde_json::json;

/// Longest wait for any convergence (the operator normally needs well under 2 s).
pub const WAIT: Duration = Duration::from_secs(60);

/// The test server's client, or `None` when `NARAD_K8S_KUBECONFIG` is not set.
pub async fn client() -> Option<Client> {
    let path = std::env::var("NARAD_K8S_KUBECONFIG").ok()?;
    let kc = Kubeconfig::read_from(path).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    Some(Client::try_from(cfg).expect("kube client"))
}

/// Polls `f` until it returns `Some`, at most [`WAIT`]; the elapsed time with the value.
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(WAIT, what, f).await
}

/// Polls `f` every 100 ms until it returns `Some`, at most `limit`.
pub async fn eventually_within<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return (v, start.elapsed());
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates or replaces the four CRDs and waits until they are established.
pub async fn install_crds(c: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    for (_, crd) in all_crds() {
        let name = crd.metadata.name.clone().unwrap();
        // Create or replace, not server-side apply: a 1.20 server refuses an applied CRD that
        // carries `x-kubernetes-validations` (unknown there), while create/replace drop it.
        match crds.get_opt(&name).await.expect("get CRD") {
            None => {
                // Another test binary may have created it meanwhile.
                if let Err(e) = crds.create(&PostParams::default(), &crd).await {
                    assert!(
                        matches!(&e, kube::Error::Api(s) if s.code == 409),
                        "create CRD: {e}"
                    );
                }
            }
            Some(old) => {
                let mut crd = crd.clone();
                crd.metadata.resource_version = old.metadata.resource_version;
                crds.replace(&name, &PostParams::default(), &crd)
                    .await
                    .expect("replace CRD");
            }
        }
        eventually(&format!("CRD {name} established"), || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let c = crds.get(&name).await.ok()?;
                c.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            }
        })
        .await;
    }
}

/// Server-side applies `body` as the test's field manager.
pub async fn apply<K>(api: &Api<K>, name: &str, body: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("narad-envtest").force(),
        &Patch::Apply(&body),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

/// A Secret manifest with `stringData`, labelled `narad.io/credentials: "true"` (the
/// operator uses no other Secret).
pub fn secret(name: &str, data: &[(&str, &str)]) -> serde_json::Value {
    let mut s = unlabelled_secret(name, data);
    s["metadata"]["labels"] = json!({"narad.io/credentials": "true"});
    s
}

/// A Secret manifest with `stringData` and no labels (the operator refuses it).
pub fn unlabelled_secret(name: &str, data: &[(&str, &str)]) -> serde_json::Value {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data})
}

/// Creates namespace `name`.
pub async fn create_namespace(c: &Client, name: &str) -> Api<Namespace> {
    let namespaces: Api<Namespace> = Api::all(c.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .expect("namespace");
    namespaces
}

/// The operator's controllers, in-process, watching only `ns`, with drift correction every
/// `resync`. Returns the task and the server's minor version.
pub async fn start_operator(
    c: &Client,
    ns: &str,
    resync: Duration,
) -> (tokio::task::JoinHandle<()>, u32) {
    let info = c.apiserver_version().await.unwrap();
    let minor = narad_operator::resources::parse_minor(&info.minor).unwrap();
    let mut ctx = Context::new(c.clone());
    ctx.resync = resync;
    // The tests' clusters point the operator at brokers outside Kubernetes.
    ctx.allow_external_endpoints = true;
    ctx.wait_retry = Duration::from_millis(500);
    ctx.pdb_api_version = narad_operator::resources::pdb_api_version(minor).into();
    let task = tokio::spawn(narad_operator::run::controllers(
        Arc::new(ctx),
        Some(ns.to_string()),
    ));
    (task, minor)
}

/// The operator's Events about `kind`/`name` in `ns` (events.k8s.io/v1): `(type, reason,
/// note)` each, oldest first.
pub async fn events(c: &Client, ns: &str, kind: &str, name: &str) -> Vec<(String, String, String)> {
    use k8s_openapi::api::events::v1::Event;
    let api: Api<Event> = Api::namespaced(c.clone(), ns);
    let mut list = match api.list(&Default::default()).await {
        Ok(l) => l.items,
        Err(_) => return Vec::new(),
    };
    list.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    list.into_iter()
        .filter(|e| {
            e.reporting_controller.as_deref() == Some("narad-operator")
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
        })
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits (at most [`WAIT`]) for an Event about `kind`/`name` of `type_` and `reason` whose
/// note contains `note`; returns the note. A timeout lists the Events there were.
pub async fn expect_event(
    c: &Client,
    ns: &str,
    (kind, name): (&str, &str),
    type_: &str,
    reason: &str,
    note: &str,
) -> String {
    let start = Instant::now();
    loop {
        let seen = events(c, ns, kind, name).await;
        if let Some((_, _, n)) = seen
            .iter()
            .find(|(t, r, n)| t == type_ && r == reason && n.contains(note))
        {
            return n.clone();
        }
        assert!(
            start.elapsed() < WAIT,
            "timed out waiting for a {type_} Event {reason} ({note}) about {kind} {name}; \
             its Events: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
