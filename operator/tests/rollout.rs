//! A rolling upgrade driven by the operator against a real Kubernetes API server
//! (`../shared/k8s-testenv`: 1.20, no scheduler, no kubelet) and three real `narad`
//! processes, with this test playing the kubelet (SPEC §10.3).
//!
//! The brokers run as the StatefulSet's pods would: node IDs `prod-narad-0..2`, security
//! off. The test:
//! - marks each pod the StatefulSet controller creates `Running` and `Ready` once its node
//!   answers `/readyz` (the kubelet's readiness probe);
//! - when the operator deletes a pod, records the cluster's members at that moment, stops
//!   that node's process with SIGTERM (as the kubelet would), starts it again on the same
//!   data dir as the new version (`NARAD_TEST_VERSION`, so the member reports it), and marks
//!   the replacement pod ready once the node is ready again;
//! - stands in for the client Service: the operator reaches the brokers through a TCP
//!   forwarder to the nodes whose pods are ready;
//! - keeps producing and consuming (`narad_e2e::load::Load`, with the durability ledger) on
//!   all three nodes throughout.
//!
//! After the upgrade it sets the `narad.io/restart` annotation, which rolls the pods again
//! the same way (same version).
//!
//! It asserts: pods are replaced highest ordinal first, one at a time, each deletion only
//! after the previous replacement was marked ready (by resourceVersion order, the API
//! server's own sequence) and while all members were alive, a leader existed and the
//! previous member reported the new version; the NaradCluster ends `Running` on the new
//! version; every message that got a `202` is consumed (lost = 0); duplicates are reported.
//!
//! Runs only with `NARAD_K8S_KUBECONFIG` (like `envtest.rs`); otherwise it says so and
//! passes.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{apply, client, eventually_within, install_crds};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use narad_e2e::load::Load;
use narad_e2e::{ClusterOpts, TestCluster};
use narad_operator::crd::{cond, is_true, NaradCluster};
use serde_json::{json, Value};

const NODES: usize = 3;
/// The whole rollout (three restarts on a loaded 2-core machine) must end within this.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);
const PRODUCERS: u32 = 8;
const CONSUMERS_PER_NODE: usize = 2;
const DRAIN: Duration = Duration::from_secs(120);

fn ordinal(pod: &str) -> usize {
    pod.rsplit('-').next().unwrap().parse().unwrap()
}

fn resource_version(p: &Pod) -> u64 {
    // etcd3 revisions: one global, increasing sequence (compared here as a test oracle).
    p.resource_version()
        .and_then(|v| v.parse().ok())
        .expect("numeric resourceVersion")
}

/// What the kubelet stand-in observed.
#[derive(Debug, Clone)]
enum Seen {
    /// Pod `ordinal` (uid) deleted at this resourceVersion; the members just then.
    Deleted {
        ordinal: usize,
        rv: u64,
        at: Instant,
        members: Vec<Value>,
    },
    /// Pod `ordinal` (uid) marked ready; the resourceVersion the status write produced.
    Ready {
        ordinal: usize,
        uid: String,
        rv: u64,
        at: Instant,
    },
}

/// The client Service: forwards each connection to a node whose pod is ready.
async fn service(backends: Vec<SocketAddr>, ready: Arc<Mutex<Vec<bool>>>) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let mut next = 0usize;
        loop {
            let Ok((mut inbound, _)) = l.accept().await else {
                return;
            };
            next += 1;
            let order: Vec<SocketAddr> = {
                let r = ready.lock().unwrap();
                (0..backends.len())
                    .map(|k| (next + k) % backends.len())
                    .filter(|&i| r[i])
                    .map(|i| backends[i])
                    .collect()
            };
            tokio::spawn(async move {
                for addr in order {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(addr).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        return;
                    }
                }
            });
        }
    });
    url
}

/// `GET /v1/cluster/members` from the first node that answers.
async fn members(urls: &[String]) -> Vec<Value> {
    for u in urls {
        let r = narad_tests::Http::new(u)
            .request(narad_tests::Method::GET, "/v1/cluster/members")
            .timeout(Duration::from_secs(2))
            .try_send()
            .await;
        if let Ok(r) = r {
            if r.status == 200 {
                if let Ok(v) = serde_json::from_slice::<Value>(&r.body) {
                    return v["members"].as_array().cloned().unwrap_or_default();
                }
            }
        }
    }
    Vec::new()
}

/// Marks `pod` running and ready (what the kubelet reports once the readiness probe passes);
/// returns the resourceVersion of the write.
async fn mark_ready(pods: &Api<Pod>, pod: &str) -> Option<u64> {
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "startTime": now,
        "conditions": [cond("Initialized"), cond("PodScheduled"), cond("ContainersReady"), cond("Ready")],
    }});
    let p = pods
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .ok()?;
    Some(resource_version(&p))
}

/// The kubelet stand-in: reacts to the pod watch until `done` is set.
async fn kubelet(
    pods: Api<Pod>,
    mut cluster: TestCluster,
    new_version: String,
    ready: Arc<Mutex<Vec<bool>>>,
    log: Arc<Mutex<Vec<Seen>>>,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> TestCluster {
    let urls: Vec<String> = (0..NODES).map(|i| cluster.url(i)).collect();
    let mut marked: Vec<Option<String>> = vec![None; NODES];
    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().labels("app.kubernetes.io/instance=prod"),
    )
    .boxed();
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let ev = match tokio::time::timeout(Duration::from_millis(200), stream.next()).await {
            Err(_) => continue,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                eprintln!("kubelet: watch error {e}; re-watching");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Ok(Some(Ok(ev))) => ev,
        };
        let (pod, deleted) = match ev {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                let gone = p.metadata.deletion_timestamp.is_some();
                (p, gone)
            }
            watcher::Event::Delete(p) => (p, true),
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        let name = pod.name_any();
        let i = ordinal(&name);
        let uid = pod.uid().unwrap_or_default();
        if deleted {
            if marked[i].as_deref() != Some(uid.as_str()) {
                continue; // not a pod this kubelet runs (or already handled)
            }
            // The members at the moment of the deletion, before this node stops.
            let at = Instant::now();
            let m = members(&urls).await;
            log.lock().unwrap().push(Seen::Deleted {
                ordinal: i,
                rv: resource_version(&pod),
                at,
                members: m,
            });
            marked[i] = None;
            ready.lock().unwrap()[i] = false;
            // SIGTERM, then the "new version" on the same data dir.
            let t = Instant::now();
            let st = cluster.nodes[i].server.stop().await;
            eprintln!(
                "kubelet: {name} deleted; narad stopped ({st}) in {:?}",
                t.elapsed()
            );
            cluster.nodes[i]
                .server
                .set_env("NARAD_TEST_VERSION", new_version.clone());
            cluster.restart(i).await;
            cluster.wait_ready(i).await;
            eprintln!("kubelet: {name}'s node ready again after {:?}", t.elapsed());
            // The replacement may exist already (its event is then behind us in the stream
            // or queued); mark whatever pod holds the name now.
            if let Ok(Some(p)) = pods.get_opt(&name).await {
                if p.metadata.deletion_timestamp.is_none() {
                    let uid = p.uid().unwrap_or_default();
                    if let Some(rv) = mark_ready(&pods, &name).await {
                        eprintln!("kubelet: {name} (replacement) marked ready");
                        log.lock().unwrap().push(Seen::Ready {
                            ordinal: i,
                            uid: uid.clone(),
                            rv,
                            at: Instant::now(),
                        });
                        marked[i] = Some(uid);
                        ready.lock().unwrap()[i] = true;
                    }
                }
            }
            continue;
        }
        if marked[i].as_deref() == Some(uid.as_str()) {
            continue; // already running and ready
        }
        if marked[i].is_some() {
            // A new uid under a marked name: its predecessor's deletion is still queued in
            // the stream; handle it when it comes (marked stays with the old uid).
            continue;
        }
        if cluster.nodes[i].server.is_running() {
            cluster.wait_ready(i).await;
            if let Some(rv) = mark_ready(&pods, &name).await {
                log.lock().unwrap().push(Seen::Ready {
                    ordinal: i,
                    uid: uid.clone(),
                    rv,
                    at: Instant::now(),
                });
                marked[i] = Some(uid);
                ready.lock().unwrap()[i] = true;
            }
        }
    }
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_upgrade_with_the_test_as_kubelet_loses_nothing() {
    let Some(c) = client().await else {
        eprintln!("skipped: NARAD_K8S_KUBECONFIG is not set (see ../shared/k8s-testenv)");
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter("narad_operator=info")
        .with_test_writer()
        .try_init();
    install_crds(&c).await;
    let ns = format!("narad-roll-{}", std::process::id());
    let namespaces = common::create_namespace(&c, &ns).await;

    // Three brokers named as the StatefulSet's pods.
    let ids = (0..NODES).map(|i| format!("prod-narad-{i}")).collect();
    let cluster = TestCluster::start_with(
        NODES,
        ClusterOpts {
            ids,
            ..ClusterOpts::default()
        },
    )
    .await;
    let urls: Vec<String> = (0..NODES).map(|i| cluster.url(i)).collect();
    let old_version = members(&urls).await[0]["version"]
        .as_str()
        .expect("member version")
        .to_string();
    let new_version = format!("{old_version}-next");
    cluster
        .http(0)
        .create_topic(&json!({"name": "orders", "partitions": 6, "visibility_timeout_ms": 5000}))
        .await;

    let ready = Arc::new(Mutex::new(vec![false; NODES]));
    let backends = urls
        .iter()
        .map(|u| u.trim_start_matches("http://").parse().unwrap())
        .collect();
    let service_url = service(backends, ready.clone()).await;

    // The operator with its production requeue periods (drift every 5 min is not needed).
    let (operator, _) = common::start_operator(&c, &ns, Duration::from_secs(300)).await;
    let clusters: Api<NaradCluster> = Api::namespaced(c.clone(), &ns);
    let spec = |version: &str| {
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
        "metadata": {"name": "prod"}, "spec": {"version": version, "endpoint": service_url, "allowExternalEndpoint": true,
        "security": {"enabled": false}}})
    };
    apply(&clusters, "prod", spec(&old_version)).await;

    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    let log = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kubelet = tokio::spawn(kubelet(
        pods.clone(),
        cluster,
        new_version.clone(),
        ready.clone(),
        log.clone(),
        done.clone(),
    ));

    let running_on = |version: String| {
        let clusters = clusters.clone();
        move || {
            let clusters = clusters.clone();
            let version = version.clone();
            async move {
                let st = clusters.get("prod").await.ok()?.status?;
                (st.phase.as_deref() == Some("Running")
                    && st.current_version.as_deref() == Some(version.as_str())
                    && st.ready_replicas == NODES as i32
                    && is_true(&st.conditions, cond::READY))
                .then_some(st)
            }
        }
    };
    eventually_within(
        Duration::from_secs(60),
        "NaradCluster Running on the old version",
        running_on(old_version.clone()),
    )
    .await;

    // Sustained load over all three nodes, then the upgrade.
    let load = Load::start(&urls, "orders", PRODUCERS, CONSUMERS_PER_NODE);
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("before the upgrade: {}", load.progress());
    let t_upgrade = Instant::now();
    apply(&clusters, "prod", spec(&new_version)).await;
    let stss: Api<StatefulSet> = Api::namespaced(c.clone(), &ns);
    let (st, rollout) = eventually_within(ROLLOUT_TIMEOUT, "rollout complete", || {
        assert!(!kubelet.is_finished(), "the kubelet stand-in stopped");
        let f = running_on(new_version.clone());
        let (stss, pods) = (stss.clone(), pods.clone());
        async move {
            // Every pod on the update revision (for OnDelete a 1.20 server does not advance
            // currentRevision), and the cluster Running on the new version.
            let update = stss.get("prod-narad").await.ok()?.status?.update_revision?;
            let l = pods.list(&Default::default()).await.ok()?;
            let on_update = l
                .items
                .iter()
                .filter(|p| p.labels().get("controller-revision-hash") == Some(&update))
                .count();
            if on_update != NODES {
                return None;
            }
            f().await
        }
    })
    .await;
    eprintln!(
        "rollout {old_version} → {new_version} done in {rollout:?} (from the spec change: {:?}); {}",
        t_upgrade.elapsed(),
        load.progress()
    );
    assert!(
        st.members
            .iter()
            .all(|m| m.version == new_version && m.status == "alive"),
        "{st:?}"
    );

    // --- `narad.io/restart`: a new value rolls the pods again through the same gated
    // rollout (checked with the upgrade's deletions below), on the same version.
    let rev_upgrade = stss
        .get("prod-narad")
        .await
        .unwrap()
        .status
        .unwrap()
        .update_revision
        .unwrap();
    let t_restart = Instant::now();
    let mut restart = spec(&new_version);
    restart["metadata"]["annotations"] = json!({"narad.io/restart": "2026-12-06T09:00:00Z"});
    apply(&clusters, "prod", restart).await;
    let (rev_restart, _) = eventually_within(
        Duration::from_secs(60),
        "the restart value in the pod template",
        || {
            let stss = stss.clone();
            let rev_upgrade = rev_upgrade.clone();
            async move {
                let sts = stss.get("prod-narad").await.ok()?;
                let value = sts
                    .spec?
                    .template
                    .metadata?
                    .annotations?
                    .get("narad.io/restartedAt")
                    .cloned();
                let rev = sts.status?.update_revision?;
                (value.as_deref() == Some("2026-12-06T09:00:00Z") && rev != rev_upgrade)
                    .then_some(rev)
            }
        },
    )
    .await;
    let (st, restart_took) = eventually_within(ROLLOUT_TIMEOUT, "restart complete", || {
        assert!(!kubelet.is_finished(), "the kubelet stand-in stopped");
        let f = running_on(new_version.clone());
        let (pods, rev) = (pods.clone(), rev_restart.clone());
        async move {
            let l = pods.list(&Default::default()).await.ok()?;
            let on_restart = l
                .items
                .iter()
                .filter(|p| p.labels().get("controller-revision-hash") == Some(&rev))
                .count();
            if on_restart != NODES {
                return None;
            }
            f().await
        }
    })
    .await;
    eprintln!(
        "restart done in {restart_took:?} (from the annotation: {:?}); {}",
        t_restart.elapsed(),
        load.progress()
    );
    assert!(st.members.iter().all(|m| m.status == "alive"), "{st:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (report, drained) = load.finish(DRAIN).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _cluster = kubelet.await.expect("kubelet");

    // --- The order the kubelet saw.
    let log = log.lock().unwrap().clone();
    for e in &log {
        match e {
            Seen::Deleted {
                ordinal, rv, at, ..
            } => eprintln!(
                "  {:>+7.2}s deleted prod-narad-{ordinal} (rv {rv})",
                at.duration_since(t_upgrade).as_secs_f64()
            ),
            Seen::Ready {
                ordinal, rv, at, ..
            } => eprintln!(
                "  {:>+7.2}s ready   prod-narad-{ordinal} (rv {rv})",
                at.checked_duration_since(t_upgrade)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(-(t_upgrade.duration_since(*at).as_secs_f64()))
            ),
        }
    }
    let deletions: Vec<(usize, u64, &Vec<Value>)> = log
        .iter()
        .filter_map(|e| match e {
            Seen::Deleted {
                ordinal,
                rv,
                members,
                ..
            } => Some((*ordinal, *rv, members)),
            _ => None,
        })
        .collect();
    assert_eq!(
        deletions.iter().map(|d| d.0).collect::<Vec<_>>(),
        vec![2, 1, 0, 2, 1, 0],
        "one pod at a time, highest ordinal first (the upgrade, then the restart)"
    );
    let restart_deletions = log
        .iter()
        .filter(|e| matches!(e, Seen::Deleted { at, .. } if *at >= t_restart))
        .count();
    assert_eq!(
        restart_deletions, NODES,
        "the restart replaced each pod once, and nothing rolled before it"
    );
    for (k, (ordinal, rv, members)) in deletions.iter().enumerate() {
        // The cluster was healthy when the operator deleted this pod.
        assert_eq!(members.len(), NODES, "members at deletion {k}: {members:?}");
        assert!(
            members.iter().all(|m| m["status"] == "alive"),
            "all alive when prod-narad-{ordinal} was deleted: {members:?}"
        );
        assert!(
            members.iter().any(|m| m["leader"] == true),
            "a leader when prod-narad-{ordinal} was deleted: {members:?}"
        );
        assert!(members.iter().all(|m| m["draining"] != true));
        if k == 0 {
            continue;
        }
        // The previous replacement was marked ready before this deletion, and its member
        // reported the new version.
        let prev = deletions[k - 1].0;
        let prev_ready = log
            .iter()
            .filter_map(|e| match e {
                Seen::Ready { ordinal, rv: r, .. }
                    if *ordinal == prev && *r > deletions[k - 1].1 =>
                {
                    Some(*r)
                }
                _ => None,
            })
            .min()
            .unwrap_or_else(|| panic!("prod-narad-{prev}'s replacement never marked ready"));
        assert!(
            prev_ready < *rv,
            "prod-narad-{ordinal} deleted (rv {rv}) before prod-narad-{prev}'s replacement was ready (rv {prev_ready})"
        );
        let pm = members
            .iter()
            .find(|m| m["id"] == format!("prod-narad-{prev}").as_str())
            .expect("previous member");
        assert_eq!(pm["version"], new_version.as_str(), "{pm}");
    }
    // Each replacement pod is a new object (the StatefulSet controller recreated it).
    let uids: std::collections::BTreeSet<String> = log
        .iter()
        .filter_map(|e| match e {
            Seen::Ready { uid, .. } => Some(uid.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        uids.len(),
        3 * NODES,
        "3 original pods, 3 upgraded and 3 restarted"
    );

    // Past the test harness's capture, so CI logs show the numbers.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "rolling upgrade under load: {report}\nrolling upgrade (3 pods, operator-driven): \
         duration {rollout:?}, lost {}, duplicates {}",
        report.lost.len(),
        report.duplicates
    );
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    assert!(report.produced > 0, "{report}");
    report.assert_ok();

    operator.abort();
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
