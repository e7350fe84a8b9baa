//! Narad on real pods (`../shared/k8s-node`: a real Kubernetes 1.20 node with a kubelet on
//! this machine's Docker engine), driven the way a user drives it: `helm install` of the
//! operator chart, then NaradCluster, Topic, Secret + User and Grant objects, and clients
//! that reach the brokers only through the client Service (its ClusterIP, through
//! kube-proxy's rules on this node) or from a pod.
//!
//! Under sustained produce and consume (the durability ledger, as user `app`), it:
//! - waits for install → Ready and checks produce and consume from a pod;
//! - rolls an upgrade to a second image of the same binary (`NARAD_TEST_VERSION`) and kills
//!   the leading operator pod in the middle of it;
//! - scales 3 → 4 → 3 twice, by the spec and then through the scale subresource (an HPA
//!   scales out, `kubectl scale` scales in), killing the leading operator pod in the middle
//!   of the last scale-in;
//! - restarts every pod with the `narad.io/restart` annotation (a gated rollout);
//! - drains and counts;
//! - installs a cluster with mutual TLS on the cluster port, HTTPS on the API and a separate
//!   metrics port, once through the operator and once through the broker chart (after its
//!   plain install and `helm test`).
//!
//! It asserts: nothing acknowledged is lost; no produce is refused or fails through the
//! Service; after every step the members are exactly the replicas, none dead or draining,
//! each advertising its pod's DNS name; the phase seen during each step is one that step
//! may show (`Upgrading` only during the upgrade, `Scaling` only while scaling, never
//! `Degraded`); `helm test` passes for the broker chart. It prints the timings and counts.
//!
//! Needs the images `narad:V`, `narad:V-next` (with `NARAD_TEST_VERSION=V-next`) and
//! `narad-operator:V` on the node's Docker engine, and `helm` on PATH; `operator/pods.sh`
//! builds the node and the images and runs it. Runs only with `NARAD_K8S_NODE_KUBECONFIG`;
//! otherwise it says so and passes.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{apply, eventually_within, secret};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, ResourceExt};
use narad_e2e::load::Load;
use narad_operator::crd::{cond, is_true, Grant, NaradCluster, Topic, User};
use narad_tests::{Http, Method};
use serde_json::{json, Value};

const CLUSTER: &str = "prod";
const REPLICAS: usize = 3;
const PRODUCERS: u32 = 6;
const CONSUMERS: usize = 4;
const APP_PASSWORD: &str = "pods-test-app-password";
/// Longest any single step may take on a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(300);
const DRAIN: Duration = Duration::from_secs(180);
/// The brokers' separate metrics listener (`spec.metricsPort`, chart `service.ports.metrics`).
const METRICS_PORT: u16 = 9090;

async fn node_client() -> Option<Client> {
    let path = std::env::var("NARAD_K8S_NODE_KUBECONFIG").ok()?;
    let kc = Kubeconfig::read_from(path).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    Some(Client::try_from(cfg).expect("kube client"))
}

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs helm with `args`; panics with its output when it fails.
fn helm(args: &[&str]) -> String {
    helm_try(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs helm with `args`: its output, or what failed.
fn helm_try(args: &[&str]) -> Result<String, String> {
    let bin = std::env::var("HELM").unwrap_or_else(|_| "helm".into());
    let out = Command::new(&bin)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("{bin}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!("helm {}: {text}", args.join(" ")));
    }
    Ok(text)
}

/// The phases the NaradCluster showed, with the time each was first seen.
#[derive(Clone, Default)]
struct Phases(Arc<Mutex<Vec<(Instant, String)>>>);

impl Phases {
    fn watch(clusters: Api<NaradCluster>) -> (Phases, tokio::task::JoinHandle<()>) {
        let p = Phases::default();
        let seen = p.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(nc) = clusters.get(CLUSTER).await {
                    let phase = nc.status.and_then(|s| s.phase).unwrap_or_default();
                    let mut v = seen.0.lock().unwrap();
                    if v.last().map(|(_, p)| p) != Some(&phase) {
                        v.push((Instant::now(), phase));
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        (p, task)
    }

    /// Waits until the watcher has seen `phase` last: a step settles on a GET of the status,
    /// which may see the final phase up to one poll before the watcher does; without this
    /// wait the next step would count the previous step's phase as the one current at its
    /// start.
    async fn caught_up(&self, phase: &str) {
        eventually_within(
            Duration::from_secs(10),
            &format!("the phase watcher seeing {phase}"),
            || async {
                let v = self.0.lock().unwrap();
                (v.last().map(|(_, p)| p.as_str()) == Some(phase)).then_some(())
            },
        )
        .await;
    }

    /// The phases shown since `from` (and the one current at `from`).
    fn since(&self, from: Instant) -> Vec<String> {
        let v = self.0.lock().unwrap();
        let before = v.iter().rev().find(|(t, _)| *t < from).map(|(_, p)| p);
        before
            .into_iter()
            .chain(v.iter().filter(|(t, _)| *t >= from).map(|(_, p)| p))
            .cloned()
            .collect()
    }

    /// Records a problem unless every phase shown since `from` is one of `allowed`.
    fn check(&self, problems: &Problems, step: &str, from: Instant, allowed: &[&str]) {
        let seen = self.since(from);
        if !seen.iter().all(|p| allowed.contains(&p.as_str())) {
            problems.add(format!("{step}: phases {seen:?}, allowed {allowed:?}"));
        }
        eprintln!("{step}: phases {seen:?}");
    }
}

/// What went wrong, collected over the whole run (so one run reports every kind of
/// failure) and asserted at the end.
#[derive(Clone, Default)]
struct Problems(Arc<Mutex<Vec<String>>>);

impl Problems {
    fn add(&self, p: String) {
        eprintln!("PROBLEM: {p}");
        self.0.lock().unwrap().push(p);
    }

    fn assert_none(&self) {
        let p = self.0.lock().unwrap();
        assert!(p.is_empty(), "{} problems:\n{}", p.len(), p.join("\n"));
    }
}

/// What the cluster and the broker say, through the client Service as admin.
struct Cluster {
    name: String,
    clusters: Api<NaradCluster>,
    stss: Api<StatefulSet>,
    pods: Api<Pod>,
    admin: Http,
    ns: String,
}

/// `GET /v1/cluster/members` through `admin`: the members, or `None` without a 200 in 3 s.
async fn members_via(admin: &Http) -> Option<Vec<Value>> {
    let r = admin
        .request(Method::GET, "/v1/cluster/members")
        .timeout(Duration::from_secs(3))
        .try_send()
        .await
        .ok()?;
    (r.status == 200).then(|| r.json()["members"].as_array().cloned().unwrap_or_default())
}

impl Cluster {
    async fn members(&self) -> Option<Vec<Value>> {
        members_via(&self.admin).await
    }

    /// `Some(members)` once the NaradCluster is Running and Ready with `n` ready replicas
    /// on `version`, the StatefulSet wants `n`, exactly `n` broker pods exist, all on the
    /// update revision, and the members are exactly those pods, alive and not draining.
    async fn settled(&self, n: usize, version: &str) -> Option<Vec<Value>> {
        let name = &self.name;
        let st = self.clusters.get(name).await.ok()?.status?;
        if st.phase.as_deref() != Some("Running")
            || st.ready_replicas != n as i32
            || st.current_version.as_deref() != Some(version)
            || !is_true(&st.conditions, cond::READY)
        {
            return None;
        }
        let sts = self.stss.get(&format!("{name}-narad")).await.ok()?;
        let update = sts.status.as_ref()?.update_revision.clone()?;
        if sts.spec?.replicas != Some(n as i32) {
            return None;
        }
        let pods = self
            .pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
            .await
            .ok()?;
        let brokers: Vec<&Pod> = pods
            .items
            .iter()
            .filter(|p| p.name_any().starts_with(&format!("{name}-narad-")))
            .collect();
        if brokers.len() != n
            || brokers.iter().any(|p| {
                p.labels().get("controller-revision-hash") != Some(&update)
                    || p.metadata.deletion_timestamp.is_some()
            })
        {
            return None;
        }
        let members = self.members().await?;
        let want: Vec<String> = (0..n).map(|i| format!("{name}-narad-{i}")).collect();
        let ids: Vec<String> = members
            .iter()
            .filter_map(|m| m["id"].as_str().map(String::from))
            .collect();
        (ids == want
            && members.iter().all(|m| {
                m["status"] == "alive" && m["draining"] == false && m["version"] == version
            }))
        .then_some(members)
    }

    /// Deletes the NaradCluster and waits until its broker pods are gone.
    async fn delete(&self) {
        let name = &self.name;
        self.clusters
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete NaradCluster {name}: {e}"));
        eventually_within(STEP, &format!("the brokers of {name} gone"), || async {
            let selector = format!("app.kubernetes.io/instance={name}");
            let l = self
                .pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            l.items.is_empty().then_some(())
        })
        .await;
    }

    /// Waits for [`Cluster::settled`]; on timeout prints what it saw.
    async fn wait_settled(&self, what: &str, n: usize, version: &str) -> (Vec<Value>, Duration) {
        let start = Instant::now();
        loop {
            if let Some(m) = self.settled(n, version).await {
                return (m, start.elapsed());
            }
            if start.elapsed() > STEP {
                let nc = self
                    .clusters
                    .get(&self.name)
                    .await
                    .ok()
                    .and_then(|n| n.status);
                panic!(
                    "{what}: not settled on {n} × {version} after {STEP:?}\nstatus: {nc:#?}\nmembers: {:#?}\nevents: {}",
                    self.members().await,
                    kubectl(&self.ns, &["get", "events", "--sort-by=.lastTimestamp"]),
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Deletes (grace period 0) the operator pod that holds the leader lease (every operator
/// pod when the holder is unknown) and returns their names.
async fn kill_leading_operator(c: &Client, ns: &str, pods: &Api<Pod>) -> Vec<String> {
    let leases: Api<Lease> = Api::namespaced(c.clone(), ns);
    let holder = leases
        .get("narad-operator")
        .await
        .ok()
        .and_then(|l| l.spec?.holder_identity);
    let operator_pods = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=narad-operator"))
        .await
        .expect("operator pods");
    let victims: Vec<String> = operator_pods
        .items
        .iter()
        .map(|p| p.name_any())
        .filter(|n| holder.as_deref().is_none_or(|h| h.contains(n.as_str())))
        .collect();
    assert!(
        !victims.is_empty(),
        "no operator pod to kill (lease holder {holder:?})"
    );
    for v in &victims {
        pods.delete(v, &DeleteParams::default().grace_period(0))
            .await
            .expect("delete the operator pod");
    }
    victims
}

fn kubectl(ns: &str, args: &[&str]) -> String {
    Command::new("kubectl")
        .arg("-n")
        .arg(ns)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| e.to_string())
}

/// Runs kubectl in `ns` and fails the test with its output if it fails.
fn kubectl_ok(ns: &str, args: &[&str]) {
    let o = Command::new("kubectl")
        .arg("-n")
        .arg(ns)
        .args(args)
        .output()
        .expect("kubectl");
    assert!(
        o.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// An HPA (autoscaling/v1) on NaradCluster [`CLUSTER`] holding it at `n` replicas.
async fn hpa(hpas: &Api<HorizontalPodAutoscaler>, n: usize) {
    apply(
        hpas,
        CLUSTER,
        json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": CLUSTER},
            "spec": {"scaleTargetRef": {"apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
                                        "name": CLUSTER},
                     "minReplicas": n, "maxReplicas": n, "targetCPUUtilizationPercentage": 80}}),
    )
    .await;
}

/// The ClusterIP of NaradCluster `name`'s client Service and its root admin password (from
/// the security Secret the operator generates), once both exist.
async fn service_and_admin(c: &Client, ns: &str, name: &str) -> (String, String) {
    let svcs: Api<Service> = Api::namespaced(c.clone(), ns);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.clone(), ns);
    let (ip, _) = eventually_within(STEP, &format!("{name}'s client Service"), || async {
        svcs.get(&format!("{name}-narad"))
            .await
            .ok()?
            .spec?
            .cluster_ip
            .filter(|ip| ip != "None")
    })
    .await;
    let (password, _) = eventually_within(STEP, &format!("{name}'s security Secret"), || async {
        let s = secrets.get(&format!("{name}-narad-security")).await.ok()?;
        String::from_utf8(s.data?.get("admin-password")?.0.clone()).ok()
    })
    .await;
    (ip, password)
}

/// Each member advertises its pod's stable DNS name, not a listen address.
fn check_routable(problems: &Problems, members: &[Value], cluster: &str, ns: &str) {
    for m in members {
        let id = m["id"].as_str().unwrap_or_default();
        let addr = m["addr"].as_str().unwrap_or_default();
        if !addr.starts_with(&format!("{id}.{cluster}-narad-headless.{ns}.svc")) {
            problems.add(format!("member {id} advertises {addr:?}"));
        }
    }
}

/// A busybox pod that produces `payload` to `topic` through the client Service and then
/// consumes it; returns its log.
async fn from_a_pod(pods: &Api<Pod>, topic: &str, payload: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("app:{APP_PASSWORD}"));
    let base = format!("http://{CLUSTER}-narad:7942/v1/topics/{topic}");
    let script = format!(
        "wget -q -O- --header 'Authorization: Basic {auth}' --post-data '{payload}' {base}/produce && echo && \
         wget -q -O- --header 'Authorization: Basic {auth}' '{base}/consume?wait=10s'"
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
            "containers": [{"name": "probe", "image": "k8s-node/busybox:1.35",
                "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("probe pod");
    let (phase, _) = eventually_within(STEP, "probe pod finished", || async {
        let p = pods.get("probe").await.ok()?;
        let phase = p.status?.phase?;
        (phase == "Succeeded" || phase == "Failed").then_some(phase)
    })
    .await;
    let log = pods
        .logs("probe", &LogParams::default())
        .await
        .unwrap_or_default();
    assert_eq!(phase, "Succeeded", "probe pod: {log}");
    let _ = pods.delete("probe", &DeleteParams::default()).await;
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narad_on_real_pods_installs_upgrades_and_scales_under_load_losing_nothing() {
    let Some(c) = node_client().await else {
        eprintln!("NARAD_K8S_NODE_KUBECONFIG is not set: skipping the real-pod test");
        return;
    };
    let version = std::env::var("NARAD_K8S_NODE_VERSION")
        .unwrap_or_else(|_| env!("CARGO_PKG_VERSION").into());
    let next = format!("{version}-next");
    let ns = format!("pods-{}", std::process::id());
    let namespaces = common::create_namespace(&c, &ns).await;
    // A new namespace's default ServiceAccount token takes about a second.
    eventually_within(STEP, "default ServiceAccount", || async {
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(c.clone(), &ns);
        sa.get("default")
            .await
            .ok()
            .filter(|s| s.secrets.as_ref().is_some_and(|v| !v.is_empty()))
    })
    .await;

    // --- Install the operator with helm, then the objects a user applies.
    let t_install = Instant::now();
    helm(&[
        "install",
        "op",
        "charts/narad-operator",
        "-n",
        &ns,
        "--set",
        &format!("operator.watchNamespace={ns}"),
        "--set",
        &format!("image.tag={version}"),
        "--set",
        "image.pullPolicy=Never",
        "--wait",
        "--timeout",
        "5m",
    ]);
    let clusters: Api<NaradCluster> = Api::namespaced(c.clone(), &ns);
    let topics: Api<Topic> = Api::namespaced(c.clone(), &ns);
    let users: Api<User> = Api::namespaced(c.clone(), &ns);
    let grants: Api<Grant> = Api::namespaced(c.clone(), &ns);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.clone(), &ns);
    let cluster_spec = |version: &str, replicas: usize| {
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
            "metadata": {"name": CLUSTER},
            "spec": {"version": version, "replicas": replicas,
                "image": {"pullPolicy": "Never"},
                "storage": {"size": "1Gi"},
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"memory": "1Gi"}},
                "defaults": {"visibilityTimeout": "10s"}}})
    };
    apply(&clusters, CLUSTER, cluster_spec(&version, REPLICAS)).await;
    for t in ["orders", "probe"] {
        apply(
            &topics,
            t,
            json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
            "metadata": {"name": t}, "spec": {"clusterRef": {"name": CLUSTER}, "partitions": 6}}),
        )
        .await;
    }
    apply(
        &secrets,
        "app-pw",
        secret("app-pw", &[("password", APP_PASSWORD)]),
    )
    .await;
    apply(&users, "app", json!({"apiVersion": "narad.io/v1alpha1", "kind": "User",
        "metadata": {"name": "app"},
        "spec": {"clusterRef": {"name": CLUSTER}, "passwordSecretRef": {"name": "app-pw", "key": "password"}}}))
    .await;
    for action in ["produce", "consume"] {
        apply(
            &grants,
            &format!("app-{action}"),
            json!({"apiVersion": "narad.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": format!("app-{action}")},
            "spec": {"clusterRef": {"name": CLUSTER}, "user": "app", "action": action,
                     "patterns": ["orders", "probe"]}}),
        )
        .await;
    }

    // The client Service's ClusterIP, reached through kube-proxy's rules on this node.
    let (ip, admin_password) = service_and_admin(&c, &ns, CLUSTER).await;
    let service = format!("http://{ip}:7942");
    let cluster = Cluster {
        name: CLUSTER.into(),
        clusters: clusters.clone(),
        stss: Api::namespaced(c.clone(), &ns),
        pods: Api::namespaced(c.clone(), &ns),
        admin: Http::new(&service).as_user("admin", &admin_password),
        ns: ns.clone(),
    };
    let (phases, phase_watch) = Phases::watch(clusters.clone());
    let problems = Problems::default();
    let (members, _) = cluster.wait_settled("install", REPLICAS, &version).await;
    check_routable(&problems, &members, CLUSTER, &ns);
    phases.caught_up("Running").await;
    let ready = |conds: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>| {
        conds.is_some_and(|c| is_true(&c, cond::READY))
    };
    eventually_within(STEP, "Topics, User and Grants Ready", || async {
        for t in ["orders", "probe"] {
            if !ready(topics.get(t).await.ok()?.status.map(|s| s.conditions)) {
                return None;
            }
        }
        if !ready(users.get("app").await.ok()?.status.map(|s| s.conditions)) {
            return None;
        }
        for g in ["app-produce", "app-consume"] {
            if !ready(grants.get(g).await.ok()?.status.map(|s| s.conditions)) {
                return None;
            }
        }
        Some(())
    })
    .await;
    let t_ready = t_install.elapsed();
    eprintln!("install → Ready (helm install, 3 brokers, topics, user, grants): {t_ready:?}");

    // --- Produce and consume from a pod, by the Service's DNS name.
    let log = from_a_pod(&cluster.pods, "probe", "from-a-pod").await;
    assert!(
        log.contains("\"payload\":\"from-a-pod\""),
        "probe pod log: {log}"
    );

    // --- Sustained load through the Service, as `app`.
    let app_url = format!("http://app:{APP_PASSWORD}@{ip}:7942");
    let load = Load::start(&[app_url], "orders", PRODUCERS, CONSUMERS);
    eventually_within(STEP, "load flowing", || async {
        (load.ledger.acked_count() > 200).then_some(())
    })
    .await;
    eprintln!("before the upgrade: {}", load.progress());

    // --- Rolling upgrade, with the leading operator pod killed once the first broker pod
    // was replaced.
    let update_revision = || async {
        cluster
            .stss
            .get(&format!("{CLUSTER}-narad"))
            .await
            .ok()?
            .status?
            .update_revision
    };
    let old_revision = update_revision().await.expect("the StatefulSet's revision");
    let t = Instant::now();
    let mut spec = cluster_spec(&next, REPLICAS);
    apply(&clusters, CLUSTER, spec.clone()).await;
    eventually_within(STEP, "the first broker pod replaced", || async {
        let update = update_revision().await.filter(|r| *r != old_revision)?;
        let l = cluster.pods.list(&ListParams::default()).await.ok()?;
        l.items
            .iter()
            .any(|p| p.labels().get("controller-revision-hash") == Some(&update))
            .then_some(())
    })
    .await;
    let victims = kill_leading_operator(&c, &ns, &cluster.pods).await;
    eprintln!(
        "killed operator pod(s) {victims:?} {:?} into the upgrade",
        t.elapsed()
    );
    let (members, _) = cluster.wait_settled("upgrade", REPLICAS, &next).await;
    let t_upgrade = t.elapsed();
    check_routable(&problems, &members, CLUSTER, &ns);
    phases.caught_up("Running").await;
    phases.check(&problems, "upgrade", t, &["Running", "Upgrading"]);
    eprintln!(
        "upgrade {version} → {next} (3 pods): {t_upgrade:?}; {}",
        load.progress()
    );

    // --- Scale 3 → 4 → 3, twice: by the spec, then through the scale subresource (an
    // HPA scales out, `kubectl scale` scales in).
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(c.clone(), &ns);
    let mut scale_times = Vec::new();
    for round in 1..=2 {
        for n in [REPLICAS + 1, REPLICAS] {
            let t = Instant::now();
            spec["spec"]["replicas"] = json!(n);
            match (round, n > REPLICAS) {
                (1, _) => apply(&clusters, CLUSTER, spec.clone()).await,
                // An HPA whose minimum is above the current count scales to it without
                // metrics (none are served here), through the scale subresource.
                (_, true) => hpa(&hpas, n).await,
                (_, false) => {
                    let _ = hpas.delete(CLUSTER, &DeleteParams::default()).await;
                    let replicas = format!("--replicas={n}");
                    kubectl_ok(&ns, &["scale", "nc", CLUSTER, &replicas]);
                }
            }
            let what = format!("scale round {round} to {n}");
            if round == 2 && n == REPLICAS {
                // The operator dies in the middle of a scale-in: its successor must finish
                // the decommission and the shrink.
                eventually_within(STEP, "a member draining", || async {
                    let members = cluster.members().await?;
                    members.iter().any(|m| m["draining"] == true).then_some(())
                })
                .await;
                let victims = kill_leading_operator(&c, &ns, &cluster.pods).await;
                eprintln!(
                    "killed operator pod(s) {victims:?} {:?} into {what}",
                    t.elapsed()
                );
            }
            let (members, took) = cluster.wait_settled(&what, n, &next).await;
            check_routable(&problems, &members, CLUSTER, &ns);
            phases.caught_up("Running").await;
            phases.check(&problems, &what, t, &["Running", "Scaling"]);
            eprintln!("{what}: {took:?}; {}", load.progress());
            scale_times.push((what, took));
        }
    }
    // The scale subresource's spec is what the HPA and kubectl wrote; the applies below
    // take spec.replicas back.
    eventually_within(STEP, "the scale subresource at 3", || async {
        let scale = clusters.get_scale(CLUSTER).await.ok()?;
        (scale.spec?.replicas == Some(REPLICAS as i32) && scale.status?.replicas == REPLICAS as i32)
            .then_some(())
    })
    .await;

    // --- narad.io/restart: every pod replaced once, through the gated rollout, under load.
    let t = Instant::now();
    let uids = |l: &[Pod]| -> Vec<(String, String)> {
        let prefix = format!("{CLUSTER}-narad-");
        let mut v: Vec<_> = l
            .iter()
            .filter(|p| p.name_any().starts_with(&prefix))
            .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
            .collect();
        v.sort();
        v
    };
    let before = uids(
        &cluster
            .pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    let old_revision = update_revision().await.expect("the StatefulSet's revision");
    spec["metadata"]["annotations"] = json!({"narad.io/restart": "pods-test-restart-1"});
    apply(&clusters, CLUSTER, spec.clone()).await;
    eventually_within(STEP, "the restart's new revision", || async {
        update_revision().await.filter(|r| *r != old_revision)
    })
    .await;
    let (members, _) = cluster.wait_settled("restart", REPLICAS, &next).await;
    eventually_within(STEP, "every pod replaced by the restart", || async {
        let now = uids(&cluster.pods.list(&ListParams::default()).await.ok()?.items);
        (now.len() == before.len() && now.iter().zip(&before).all(|(a, b)| a.1 != b.1))
            .then_some(())
    })
    .await;
    let t_restart = t.elapsed();
    check_routable(&problems, &members, CLUSTER, &ns);
    phases.caught_up("Running").await;
    phases.check(&problems, "restart", t, &["Running", "Upgrading"]);
    eprintln!("restart (3 pods): {t_restart:?}; {}", load.progress());

    phases.check(
        &problems,
        "the whole run",
        t_install,
        &["", "Creating", "Running", "Upgrading", "Scaling"],
    );

    // --- Drain and count.
    let (report, drained) = load.finish(DRAIN).await;
    phase_watch.abort();
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "real pods: install → Ready {t_ready:?}, upgrade {t_upgrade:?}, scale steps {scale_times:?}, \
         restart {t_restart:?}\n\
         real pods under load: {report}"
    );
    if let Err(e) = &drained {
        eprintln!("drain incomplete: {e:#}");
    }
    assert!(report.produced > 0, "{report}");
    // Nothing acknowledged may be lost, corrupt or foreign, ever; and no produce may be
    // refused or fail through the Service (transport errors, 5xx, 4xx), during the upgrade
    // and the scale steps included. Each failed produce is printed with its cause.
    let mut report = report;
    let rejected = std::mem::take(&mut report.rejected);
    report.assert_ok();
    drained.expect("every acknowledged message consumed");
    let refused = report.ambiguous + rejected.len();
    if refused > 0 {
        for f in &report.failures {
            eprintln!("  failed produce: {f}");
        }
        problems.add(format!(
            "{refused} of {} produces refused or failed through the Service ({} with no \
             answer or 5xx; 4xx: {rejected:?})",
            report.produced + refused,
            report.ambiguous
        ));
    }

    // --- The broker chart's own install, and its helm test (after the operator's cluster
    // is gone, so both fit the node).
    cluster.delete().await;
    // --- A cluster with mutual TLS on the cluster port and HTTPS on the API, with
    // certificates made here: the operator reaches it over HTTPS, and so do clients.
    let t = Instant::now();
    secure_cluster(&c, &ns, &version, &problems).await;
    eprintln!(
        "TLS cluster (cluster mTLS + API HTTPS, 3 pods) Ready and serving: {:?}",
        t.elapsed()
    );

    if let Err(e) = helm_try(&["test", "op", "-n", &ns, "--timeout", "3m"]) {
        problems.add(e);
    }
    let t = Instant::now();
    install_chart("nd", &ns, &next, &[]);
    eprintln!(
        "helm install of the broker chart (3 pods Ready): {:?}",
        t.elapsed()
    );
    if let Err(e) = helm_try(&["test", "nd", "-n", &ns, "--timeout", "3m"]) {
        problems.add(e);
    }
    helm(&["uninstall", "nd", "-n", &ns, "--wait", "--timeout", "3m"]);
    secure_chart(&c, &ns, &next, &problems).await;
    helm(&["uninstall", "op", "-n", &ns, "--wait", "--timeout", "3m"]);
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    problems.assert_none();
}

/// Certificates for release or cluster `name` (client Service `<name>-narad`), signed by `ca`,
/// in labelled Secrets `<name>-api-tls` (the client Service's names) and `<name>-cluster-tls`
/// (every pod of the headless Service), each with tls.crt, tls.key and ca.crt as cert-manager
/// writes them.
async fn tls_secrets(
    c: &Client,
    ns: &str,
    name: &str,
    ca: &narad_tests::certs::TestCa,
    dir: &std::path::Path,
) {
    let service_name = format!("{name}-narad.{ns}.svc");
    let peers = format!("*.{name}-narad-headless.{ns}.svc.cluster.local");
    let api = ca.issue(
        dir,
        &format!("{name}-api"),
        &[&service_name, &format!("{service_name}.cluster.local")],
    );
    let cluster_cert = ca.issue(dir, &format!("{name}-cluster"), &[&peers]);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.clone(), ns);
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    for (kind, files) in [("api", &api), ("cluster", &cluster_cert)] {
        let secret_name = format!("{name}-{kind}-tls");
        apply(
            &secrets,
            &secret_name,
            secret(
                &secret_name,
                &[
                    ("tls.crt", &read(&files.cert)),
                    ("tls.key", &read(&files.key)),
                    ("ca.crt", &read(&files.ca)),
                ],
            ),
        )
        .await;
    }
}

/// `name`'s admin client over HTTPS through its client Service (ClusterIP `ip`), trusting `ca`.
fn https_admin(
    name: &str,
    ns: &str,
    ip: &str,
    ca: &narad_tests::certs::TestCa,
    password: &str,
) -> Http {
    let service_name = format!("{name}-narad.{ns}.svc");
    Http::with_ca_resolving(
        format!("https://{service_name}:7942"),
        ca.pem().as_bytes(),
        &service_name,
        format!("{ip}:7942").parse().unwrap(),
    )
    .as_user("admin", password)
}

/// What a TLS deployment with a separate metrics listener must show through its client
/// Service (ClusterIP `ip`): produce and consume over HTTPS to `topic`; plain HTTP on the API
/// port not served; /metrics served in plain HTTP on port `METRICS_PORT` only (404 on the API
/// port, so an Ingress in front of the API cannot leak it).
async fn serves_tls_and_metrics(
    problems: &Problems,
    what: &str,
    admin: &Http,
    ip: &str,
    topic: &str,
) {
    let payload = format!("{what} over tls");
    admin
        .request(Method::POST, format!("/v1/topics/{topic}/produce"))
        .body(payload.clone())
        .send()
        .await
        .expect(202);
    let m = admin
        .request(Method::GET, format!("/v1/topics/{topic}/consume?wait=10s"))
        .send()
        .await
        .expect_json(200);
    if m["payload"] != payload.as_str() {
        problems.add(format!("{what}: consumed {m}, not {payload:?}"));
    }
    let plain = Http::new(format!("http://{ip}:7942"))
        .request(Method::GET, "/readyz")
        .timeout(Duration::from_secs(5))
        .try_send()
        .await;
    if !plain.as_ref().map_or(true, |r| r.status == 400) {
        problems.add(format!(
            "{what}: plain HTTP on the API port answered {:?}",
            plain.map(|r| r.describe())
        ));
    }
    let on_api = admin.request(Method::GET, "/metrics").send().await;
    if on_api.status != 404 {
        problems.add(format!(
            "{what}: /metrics on the API port answered {}",
            on_api.status
        ));
    }
    let metrics = Http::new(format!("http://{ip}:{METRICS_PORT}"))
        .request(Method::GET, "/metrics")
        .timeout(Duration::from_secs(5))
        .try_send()
        .await;
    match metrics {
        Ok(r) if r.status == 200 && r.text().contains("narad_messages_produced_total") => {}
        other => problems.add(format!(
            "{what}: /metrics on the metrics port: {:?}",
            other.map(|r| r.describe())
        )),
    }
}

/// Installs NaradCluster `secure` with cluster mTLS, API TLS (certificates signed by a CA made
/// here, in labelled Secrets) and a separate metrics port, waits for it to settle, checks
/// that the operator syncs a Topic over HTTPS and [`serves_tls_and_metrics`]; then deletes it.
async fn secure_cluster(c: &Client, ns: &str, version: &str, problems: &Problems) {
    let name = "secure";
    let dir = tempfile::tempdir().unwrap();
    let ca = narad_tests::certs::TestCa::new("pods-test-ca");
    tls_secrets(c, ns, name, &ca, dir.path()).await;
    let clusters: Api<NaradCluster> = Api::namespaced(c.clone(), ns);
    apply(&clusters, name, json!({"apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
        "metadata": {"name": name},
        "spec": {"version": version, "replicas": 3, "image": {"pullPolicy": "Never"},
            "storage": {"size": "1Gi"}, "metricsPort": METRICS_PORT,
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
            "security": {"clusterTLSSecretRef": {"name": "secure-cluster-tls"},
                         "apiTLSSecretRef": {"name": "secure-api-tls"}}}}))
    .await;
    let topics: Api<Topic> = Api::namespaced(c.clone(), ns);
    apply(
        &topics,
        "secure-orders",
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "secure-orders"},
        "spec": {"clusterRef": {"name": name}, "name": "orders", "partitions": 3}}),
    )
    .await;
    let (ip, admin_password) = service_and_admin(c, ns, name).await;
    let admin = https_admin(name, ns, &ip, &ca, &admin_password);
    let cluster = Cluster {
        name: name.into(),
        clusters: clusters.clone(),
        stss: Api::namespaced(c.clone(), ns),
        pods: Api::namespaced(c.clone(), ns),
        admin: admin.clone(),
        ns: ns.into(),
    };
    let (members, _) = cluster
        .wait_settled("TLS cluster install", 3, version)
        .await;
    check_routable(problems, &members, name, ns);
    // The operator created the topic over HTTPS.
    eventually_within(STEP, "Topic secure-orders Ready", || async {
        let t = topics.get("secure-orders").await.ok()?;
        is_true(&t.status?.conditions, cond::READY).then_some(())
    })
    .await;
    serves_tls_and_metrics(problems, "operator TLS cluster", &admin, &ip, "orders").await;
    cluster.delete().await;
}

/// `helm install --wait` of the broker chart as `release` with image `tag`, the requests that
/// fit the node, and `--set` for each of `sets`; on failure it panics with the pods, claims and
/// events of the namespace.
fn install_chart(release: &str, ns: &str, tag: &str, sets: &[String]) {
    let mut args: Vec<String> = ["install", release, "charts/narad", "-n", ns]
        .map(String::from)
        .into();
    let common = [
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".into(),
        "resources.requests.cpu=100m".into(),
        "resources.requests.memory=128Mi".into(),
        "persistence.size=1Gi".into(),
    ];
    for set in common.iter().chain(sets) {
        args.push("--set".into());
        args.push(set.clone());
    }
    args.extend(["--wait", "--timeout", "5m"].map(String::from));
    if let Err(e) = helm_try(&args.iter().map(String::as_str).collect::<Vec<_>>()) {
        panic!(
            "{e}\npods and claims:\n{}\nevents:\n{}",
            kubectl(ns, &["get", "pods,pvc", "-o", "wide"]),
            kubectl(ns, &["get", "events", "--sort-by=.lastTimestamp"]),
        );
    }
}

/// `helm install` of the broker chart as release `nds` with `security.clusterTLS`,
/// `security.apiTLS` (Secrets of cert-manager's shape, made here) and `service.ports.metrics`:
/// three members alive over the mutual-TLS cluster port, each advertising its pod's name;
/// [`serves_tls_and_metrics`]; `helm test` over HTTPS; then uninstalled.
async fn secure_chart(c: &Client, ns: &str, image_tag: &str, problems: &Problems) {
    let name = "nds";
    let dir = tempfile::tempdir().unwrap();
    let ca = narad_tests::certs::TestCa::new("pods-test-chart-ca");
    tls_secrets(c, ns, name, &ca, dir.path()).await;
    let t = Instant::now();
    install_chart(
        name,
        ns,
        image_tag,
        &[
            "security.clusterTLS.enabled=true".into(),
            format!("security.clusterTLS.secretName={name}-cluster-tls"),
            "security.apiTLS.enabled=true".into(),
            format!("security.apiTLS.secretName={name}-api-tls"),
            format!("service.ports.metrics={METRICS_PORT}"),
        ],
    );
    let (ip, admin_password) = service_and_admin(c, ns, name).await;
    let admin = https_admin(name, ns, &ip, &ca, &admin_password);
    let (members, _) = eventually_within(STEP, "the TLS chart's 3 members alive", || async {
        let members = members_via(&admin).await?;
        (members.len() == 3 && members.iter().all(|m| m["status"] == "alive")).then_some(members)
    })
    .await;
    eprintln!(
        "helm install of the broker chart with cluster mTLS, API HTTPS and a metrics port (3 members alive): {:?}",
        t.elapsed()
    );
    check_routable(problems, &members, name, ns);
    admin
        .request(Method::POST, "/v1/topics")
        .json(&json!({"name": "tls-chart", "partitions": 3}))
        .send()
        .await
        .expect(201);
    serves_tls_and_metrics(problems, "TLS chart", &admin, &ip, "tls-chart").await;
    if let Err(e) = helm_try(&["test", name, "-n", ns, "--timeout", "3m"]) {
        problems.add(e);
    }
    helm(&["uninstall", name, "-n", ns, "--wait", "--timeout", "3m"]);
}
