//! The operator against a real Kubernetes API server (`../shared/k8s-testenv`: 1.20, no
//! kubelet, so no pod runs) and a real `narad` broker process started here, which the
//! operator reaches through the NaradCluster's explicit `spec.endpoint` (with
//! `allowExternalEndpoint`, since it is not the cluster's own Service).
//!
//! Runs only when `NARAD_K8S_KUBECONFIG` names the test server's kubeconfig (and `NARAD_BIN`
//! or the workspace target has a `narad` binary); otherwise it says so and passes. Each
//! wait is bounded by [`WAIT`]; the operator's resync is 2 s so drift repair is observable.

mod common;

use std::time::Duration;

use common::{apply, client, eventually, expect_event, install_crds, secret};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret, Service};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::Api;
use narad_api::AlterTopicRequest;
use narad_operator::crd::{all_crds, cond, is_true, Grant, NaradCluster, Topic, User};
use narad_tests::server::{Server, ServerOpts};
use serde_json::json;

const ADMIN_PASSWORD: &str = "envtest-admin-secret";

fn ready(conds: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>) -> bool {
    conds.is_some_and(|c| is_true(c, cond::READY))
}

fn reason(conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], t: &str) -> String {
    conds
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

/// Compares the descriptions of the fields under `generated` (a CRD's schema) with those
/// `served` by `/openapi/v2`: every generated property must be served with the same,
/// non-empty description; nested properties are compared where the server publishes them.
/// Returns how many fields were compared; the differences go to `out`.
fn compare_descriptions(
    path: &str,
    generated: &serde_json::Value,
    served: &serde_json::Value,
    out: &mut Vec<String>,
) -> usize {
    let mut n = 0;
    let Some(props) = generated["properties"].as_object() else {
        return 0;
    };
    for (name, g) in props {
        let field = format!("{path}.{name}");
        let s = &served["properties"][name];
        n += 1;
        match (g["description"].as_str(), s["description"].as_str()) {
            (Some(want), Some(have)) if !want.is_empty() && want == have => {}
            (want, have) => out.push(format!("{field}: generated {want:?}, served {have:?}")),
        }
        if s.get("properties").is_some() {
            n += compare_descriptions(&field, g, s, out);
        }
        if s["items"].get("properties").is_some() {
            n += compare_descriptions(&format!("{field}[]"), &g["items"], &s["items"], out);
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_reconciles_against_a_real_api_server_and_broker() {
    let Some(c) = client().await else {
        eprintln!("skipped: NARAD_K8S_KUBECONFIG is not set (see ../shared/k8s-testenv)");
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter("narad_operator=debug")
        .with_test_writer()
        .try_init();
    install_crds(&c).await;
    let ns = format!("narad-it-{}", std::process::id());
    let namespaces = common::create_namespace(&c, &ns).await;

    let broker = Server::start(ServerOpts::secured(ADMIN_PASSWORD)).await;
    let admin =
        narad_api::Client::new(&broker.url(), Some(("admin".into(), ADMIN_PASSWORD.into())))
            .unwrap();

    // The operator, in-process, watching only this namespace.
    let (operator, minor) = common::start_operator(&c, &ns, Duration::from_secs(2)).await;

    // --- What `kubectl explain` reads: `/openapi/v2` serves every kind's spec fields with
    // the descriptions of the CRDs (nested fields too, where a 1.20 server publishes them:
    // it drops the properties of nullable objects from v2).
    let (checked, t_openapi) = eventually("spec descriptions served in /openapi/v2", || async {
        let req = http::Request::get("/openapi/v2").body(Vec::new()).unwrap();
        let doc: serde_json::Value = c.request(req).await.ok()?;
        let mut checked = 0;
        for (_, crd) in all_crds() {
            let kind = &crd.spec.names.kind;
            let def = &doc["definitions"][format!("io.narad.v1alpha1.{kind}")];
            let served = &def["properties"]["spec"];
            served.get("properties")?;
            let v = serde_json::to_value(&crd.spec.versions[0]).unwrap();
            let generated = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
            let mut missing = Vec::new();
            checked += compare_descriptions("spec", generated, served, &mut missing);
            if !missing.is_empty() {
                // Published a moment after the CRD changes: looked at again until the wait
                // ends; what is still missing then is printed above the timeout.
                eprintln!("{kind}: /openapi/v2 lacks these descriptions: {missing:?}");
                return None;
            }
        }
        Some(checked)
    })
    .await;
    eprintln!(
        "/openapi/v2: {checked} spec field descriptions of the four kinds served ({t_openapi:?})"
    );

    // --- CRDs reject invalid objects (OpenAPI schema; CEL is ignored by 1.20).
    let topics: Api<Topic> = Api::namespaced(c.clone(), &ns);
    let bad = json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic", "metadata": {"name": "bad"},
                     "spec": {"clusterRef": {"name": "prod"}, "partitions": 2}});
    let e = topics
        .create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 422), "{e}");
    let grants: Api<Grant> = Api::namespaced(c.clone(), &ns);
    let bad = json!({"apiVersion": "narad.io/v1alpha1", "kind": "Grant", "metadata": {"name": "bad"},
                     "spec": {"clusterRef": {"name": "prod"}, "user": "u", "action": "delete", "patterns": ["x"]}});
    let raw: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns, &ApiResource::erase::<Grant>(&()));
    let e = raw
        .create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 422), "{e}");

    // --- NaradCluster → owned objects, status from the real broker.
    let secrets: Api<Secret> = Api::namespaced(c.clone(), &ns);
    apply(
        &secrets,
        "prod-narad-security",
        secret(
            "prod-narad-security",
            &[("admin-password", ADMIN_PASSWORD), ("cluster-secret", "c")],
        ),
    )
    .await;
    // A storage class that allows expansion, for the storage growth below.
    let storage_class = format!("narad-expandable-{}", std::process::id());
    let classes: Api<DynamicObject> = Api::all_with(
        c.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("storage.k8s.io", "v1", "StorageClass"),
            "storageclasses",
        ),
    );
    apply(
        &classes,
        &storage_class,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": storage_class}, "provisioner": "narad.io/envtest",
        "allowVolumeExpansion": true}),
    )
    .await;
    let clusters: Api<NaradCluster> = Api::namespaced(c.clone(), &ns);
    let prod = |size: &str| {
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
        "metadata": {"name": "prod"}, "spec": {"version": "0.1.0", "endpoint": broker.url(),
        "allowExternalEndpoint": true,
        "storage": {"size": size, "storageClassName": storage_class}}})
    };
    apply(&clusters, "prod", prod("10Gi")).await;
    let stss: Api<StatefulSet> = Api::namespaced(c.clone(), &ns);
    let (sts, _) = eventually("StatefulSet prod-narad", || async {
        stss.get_opt("prod-narad").await.ok().flatten()
    })
    .await;
    let spec = sts.spec.unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    assert_eq!(
        spec.update_strategy.unwrap().type_.as_deref(),
        Some("OnDelete")
    );
    let svcs: Api<Service> = Api::namespaced(c.clone(), &ns);
    assert!(svcs.get_opt("prod-narad").await.unwrap().is_some());
    let headless = svcs.get("prod-narad-headless").await.unwrap();
    assert_eq!(headless.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    let (group, version) = narad_operator::resources::pdb_api_version(minor)
        .split_once('/')
        .unwrap();
    let pdbs: Api<DynamicObject> = Api::namespaced_with(
        c.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, "PodDisruptionBudget"),
            "poddisruptionbudgets",
        ),
    );
    assert_eq!(
        pdbs.get("prod-narad").await.unwrap().data["spec"]["maxUnavailable"],
        1
    );
    let (nc, _) = eventually("NaradCluster status with members", || async {
        clusters
            .get("prod")
            .await
            .ok()
            .filter(|n| n.status.as_ref().is_some_and(|s| !s.members.is_empty()))
    })
    .await;
    let st = nc.status.unwrap();
    assert_eq!(st.initial_cluster_size, Some(3));
    assert!(st.leader.is_some(), "{st:?}");

    // --- Events (`kubectl describe nc prod`): every object created, and a change made to
    // one behind the operator's back set back (the client Service's port here).
    let prod_ref = ("NaradCluster", "prod");
    for what in [
        "Service prod-narad-headless",
        "Service prod-narad",
        "ServiceAccount prod-narad",
        "PodDisruptionBudget prod-narad",
        "StatefulSet prod-narad",
    ] {
        let note = format!("created {what}");
        eventually(&format!("Event Created: {note}"), || async {
            common::events(&c, &ns, prod_ref.0, prod_ref.1)
                .await
                .iter()
                .any(|(t, r, n)| (t.as_str(), r.as_str(), n) == ("Normal", "Created", &note))
                .then_some(())
        })
        .await;
    }
    let patch_service = |body: serde_json::Value| {
        let svcs = svcs.clone();
        async move {
            svcs.patch("prod-narad", &PatchParams::default(), &Patch::Merge(body))
                .await
                .unwrap();
        }
    };
    let selector = |svc: Service| svc.spec?.selector?.get("app.kubernetes.io/name").cloned();
    patch_service(json!({"spec": {"selector": {"app.kubernetes.io/name": "drifted"}}})).await;
    eventually("the client Service's selector set back", || async {
        (selector(svcs.get("prod-narad").await.ok()?)?.as_str() == "narad").then_some(())
    })
    .await;
    expect_event(
        &c,
        &ns,
        prod_ref,
        "Normal",
        "DriftCorrected",
        "Service prod-narad had been changed outside the operator",
    )
    .await;
    // An edit that makes the operator's own version invalid (a second port named `api`):
    // the API server's refusal is a Warning Event, until the edit is undone.
    patch_service(json!({"spec": {"ports": [
        {"name": "api", "port": 9999, "targetPort": 9999, "protocol": "TCP"}]}}))
    .await;
    expect_event(
        &c,
        &ns,
        prod_ref,
        "Warning",
        "ReconcileFailed",
        "Duplicate value",
    )
    .await;
    patch_service(json!({"spec": {"ports": [
        {"name": "api", "port": narad_operator::resources::API_PORT, "targetPort": "api",
         "protocol": "TCP"}]}}))
    .await;

    // --- storage.size growth reaches the claims (the claim template is immutable). The
    // StatefulSet controller creates the claims; the test provisions a volume for each
    // (pre-bound, so the binder binds them), as a real provisioner would.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), &ns);
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let mut volumes = Vec::new();
    for i in 0..3 {
        let claim = format!("data-prod-narad-{i}");
        let (pvc, _) = eventually(&format!("claim {claim}"), || async {
            pvcs.get_opt(&claim).await.ok().flatten()
        })
        .await;
        let pv = format!("{ns}-{i}");
        pvs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": format!("/tmp/{pv}")}, "storageClassName": storage_class,
                     "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": ns, "name": claim, "uid": pvc.metadata.uid}}}))
            .unwrap(),
        )
        .await
        .expect("create volume");
        volumes.push(pv);
    }
    let request = |p: &PersistentVolumeClaim| {
        p.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    eventually("claims bound", || async {
        let l = pvcs.list(&Default::default()).await.ok()?;
        (l.items.len() == 3
            && l.items
                .iter()
                .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")))
        .then_some(())
    })
    .await;
    apply(&clusters, "prod", prod("20Gi")).await;
    let (_, t_expand) = eventually("claims expanded to 20Gi", || async {
        let l = pvcs.list(&Default::default()).await.ok()?;
        l.items.iter().all(|p| request(p) == "20Gi").then_some(())
    })
    .await;
    let vct = stss
        .get("prod-narad")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_claim_templates;
    assert_eq!(
        request(&vct.unwrap()[0]),
        "10Gi",
        "the claim template keeps its creation size"
    );
    // Shrinking is refused by the operator (CEL is ignored by 1.20) and changes nothing.
    apply(&clusters, "prod", prod("5Gi")).await;
    eventually("shrink refused", || async {
        let n = clusters.get("prod").await.ok()?;
        (reason(&n.status?.conditions, cond::READY) == "Invalid").then_some(())
    })
    .await;
    expect_event(&c, &ns, prod_ref, "Warning", "Invalid", "storage").await;
    assert!(pvcs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .all(|p| request(p) == "20Gi"));
    apply(&clusters, "prod", prod("20Gi")).await;
    eventually("valid again", || async {
        let n = clusters.get("prod").await.ok()?;
        (reason(&n.status?.conditions, cond::READY) != "Invalid").then_some(())
    })
    .await;
    // --- The scale subresource (`kubectl scale nc prod --replicas 4`, an HPA): it reads
    // the status's pod count and selector and writes spec.replicas, which the operator
    // applies as every replica change (scale-in through decommission).
    let selector = "app.kubernetes.io/instance=prod,app.kubernetes.io/name=narad";
    eventually("scale subresource: 3 pods and their selector", || async {
        let st = clusters.get_scale("prod").await.ok()?.status?;
        (st.replicas == 3 && st.selector.as_deref() == Some(selector)).then_some(())
    })
    .await;
    let scale_to = |n: i32| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch_scale(
                    "prod",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": n}})),
                )
                .await
                .unwrap_or_else(|e| panic!("scale to {n}: {e}"));
        }
    };
    scale_to(4).await;
    let (_, t_scale) = eventually("scaled to 4 through the scale subresource", || async {
        let n = clusters.get("prod").await.ok()?;
        let sts = stss.get("prod-narad").await.ok()?;
        let scale = clusters.get_scale("prod").await.ok()?;
        (n.spec.replicas == 4
            && sts.spec?.replicas == Some(4)
            && scale.spec?.replicas == Some(4)
            && scale.status?.replicas == 4)
            .then_some(())
    })
    .await;
    // Two is refused by the operator (CEL is ignored by 1.20): nothing shrinks.
    scale_to(2).await;
    eventually("replicas 2 refused", || async {
        let n = clusters.get("prod").await.ok()?;
        (reason(&n.status?.conditions, cond::READY) == "Invalid").then_some(())
    })
    .await;
    assert_eq!(
        stss.get("prod-narad").await.unwrap().spec.unwrap().replicas,
        Some(4)
    );
    // Back to 3: prod-narad-3 is no member of this broker's cluster, so nothing is left to
    // decommission and the StatefulSet shrinks.
    scale_to(3).await;
    eventually("scaled back to 3", || async {
        let sts = stss.get("prod-narad").await.ok()?;
        let st = clusters.get_scale("prod").await.ok()?.status?;
        (sts.spec?.replicas == Some(3) && st.replicas == 3).then_some(())
    })
    .await;

    // --- narad.io/restart: a new value is a new pod template (a new revision, which the
    // operator rolls pod by pod as an upgrade: tests/rollout.rs); the same value again, or
    // the annotation removed, changes nothing.
    let template = || async {
        let sts = stss.get("prod-narad").await.ok()?;
        let value = sts
            .spec?
            .template
            .metadata?
            .annotations
            .unwrap_or_default()
            .get("narad.io/restartedAt")
            .cloned();
        Some((value, sts.status?.update_revision?))
    };
    let (_, rev0) = template().await.expect("the StatefulSet's revision");
    // Each pass also changes the client Service's annotations, so the generation moves and
    // the status's observedGeneration says when the operator has seen it.
    let restart = |value: Option<&str>, pass: &str| {
        let mut body = prod("20Gi");
        body["spec"]["replicas"] = json!(3);
        body["spec"]["service"] = json!({"annotations": {"narad.io/envtest-pass": pass}});
        if let Some(v) = value {
            body["metadata"]["annotations"] = json!({"narad.io/restart": v});
        }
        body
    };
    let seen = || async {
        let n = clusters.get("prod").await.ok()?;
        (n.status?.observed_generation == n.metadata.generation).then_some(())
    };
    apply(
        &clusters,
        "prod",
        restart(Some("2026-12-06T09:00:00Z"), "1"),
    )
    .await;
    let (rev1, _) = eventually("the restart value in the pod template", || async {
        let (value, rev) = template().await?;
        (value.as_deref() == Some("2026-12-06T09:00:00Z") && rev != rev0).then_some(rev)
    })
    .await;
    for (value, pass) in [(Some("2026-12-06T09:00:00Z"), "2"), (None, "3")] {
        apply(&clusters, "prod", restart(value, pass)).await;
        eventually(&format!("pass {pass} reconciled"), seen).await;
        assert_eq!(
            template().await.unwrap(),
            (Some("2026-12-06T09:00:00Z".to_string()), rev1.clone()),
            "pass {pass}: the template did not change"
        );
    }

    // A cluster without a security Secret gets one generated, labelled for Narad.
    apply(
        &clusters,
        "gen",
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
        "metadata": {"name": "gen"}, "spec": {"version": "0.1.0", "endpoint": "http://127.0.0.1:1",
        "allowExternalEndpoint": true}}),
    )
    .await;
    let (gen, _) = eventually("generated security Secret", || async {
        secrets.get_opt("gen-narad-security").await.ok().flatten()
    })
    .await;
    assert_eq!(
        gen.metadata.labels.as_ref().unwrap()["narad.io/credentials"],
        "true"
    );
    let data = gen.data.unwrap();
    assert!(data.contains_key("cluster-secret") && data.contains_key("admin-password"));
    // An endpoint other than the cluster's own Service, without the opt-in: refused, and
    // nothing is created for it (not even its security Secret).
    apply(
        &clusters,
        "far",
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
        "metadata": {"name": "far"}, "spec": {"version": "0.1.0", "endpoint": broker.url()}}),
    )
    .await;
    eventually("far EndpointNotAllowed", || async {
        let n = clusters.get("far").await.ok()?;
        (reason(&n.status?.conditions, cond::READY) == "EndpointNotAllowed").then_some(())
    })
    .await;
    assert!(secrets
        .get_opt("far-narad-security")
        .await
        .unwrap()
        .is_none());
    assert!(stss.get_opt("far-narad").await.unwrap().is_none());

    // --- Topic → broker topic; changes and drift reach the broker.
    apply(&topics, "orders", json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "orders"}, "spec": {"clusterRef": {"name": "prod"}, "partitions": 3, "retention": "2h"}})).await;
    let (_, t_create) = eventually("Topic orders Ready", || async {
        topics
            .get("orders")
            .await
            .ok()
            .filter(|t| ready(t.status.as_ref().map(|s| &s.conditions)))
            .map(drop)
    })
    .await;
    let rec = admin.get_topic("orders", None).await.unwrap();
    assert_eq!((rec.partitions, rec.retention_ms), (3, 7_200_000));
    let orders_ref = ("Topic", "orders");
    expect_event(
        &c,
        &ns,
        orders_ref,
        "Normal",
        "Created",
        "created topic orders",
    )
    .await;
    apply(&topics, "orders", json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "orders"}, "spec": {"clusterRef": {"name": "prod"}, "partitions": 6, "retention": "2h",
            "retryBackoff": {"min": "1s", "max": "1m"}}})).await;
    let (_, t_partitions) = eventually("6 partitions and the backoff on the broker", || async {
        admin
            .get_topic("orders", None)
            .await
            .ok()
            .filter(|r| {
                let b = r.retry_backoff.as_ref();
                r.partitions == 6
                    && b.map(|b| (b.min.as_str(), b.max.as_str())) == Some(("1s", "1m0s"))
            })
            .map(drop)
    })
    .await;
    admin
        .alter_topic(
            "orders",
            &AlterTopicRequest {
                retention_ms: Some(10_800_000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let (_, t_drift) = eventually("retention drift repaired", || async {
        admin
            .get_topic("orders", None)
            .await
            .ok()
            .filter(|r| r.retention_ms == 7_200_000)
            .map(drop)
    })
    .await;
    for (reason, note) in [
        ("Updated", "partitions, retryBackoff"),
        ("DriftCorrected", "set back to the spec: retention"),
    ] {
        expect_event(&c, &ns, orders_ref, "Normal", reason, note).await;
    }
    // A dead-letter topic, then the setting that names it.
    apply(
        &topics,
        "orders-dlq",
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "orders-dlq"}, "spec": {"clusterRef": {"name": "prod"}}}),
    )
    .await;
    eventually("orders-dlq on the broker", || async {
        admin.get_topic("orders-dlq", None).await.ok().map(drop)
    })
    .await;
    apply(&topics, "orders", json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "orders"}, "spec": {"clusterRef": {"name": "prod"}, "partitions": 6, "retention": "2h",
            "retryBackoff": {"min": "1s", "max": "1m"},
            "deadLetter": {"topic": "orders-dlq", "maxDeliveries": 3}}})).await;
    eventually("the dead-letter setting on the broker", || async {
        let rec = admin.get_topic("orders", None).await.ok()?;
        let d = rec.dead_letter?;
        (d.topic == "orders-dlq" && d.max_deliveries == 3).then_some(())
    })
    .await;

    // Paused by its annotation, a change of the spec stays off the broker (Synced=False,
    // reason Paused) for longer than a resync; once the annotation goes, it is applied.
    let orders = |annotations: serde_json::Value| {
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "orders", "annotations": annotations}, "spec": {"clusterRef": {"name": "prod"},
            "partitions": 6, "retention": "2h", "retryBackoff": {"min": "1s", "max": "1m"},
            "deadLetter": {"topic": "orders-dlq", "maxDeliveries": 3}, "dedupWindow": "10m"}})
    };
    apply(
        &topics,
        "orders",
        orders(json!({"narad.io/pause-reconciliation": "true"})),
    )
    .await;
    eventually("orders Paused", || async {
        let t = topics.get("orders").await.ok()?;
        let conds = t.status?.conditions;
        let synced = conds.iter().find(|c| c.type_ == cond::SYNCED)?;
        (synced.status == "False" && synced.reason == "Paused").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rec = admin.get_topic("orders", None).await.unwrap();
    assert_eq!(
        rec.dedup_window_ms, None,
        "a paused Topic's change reached the broker"
    );
    apply(&topics, "orders", orders(json!({}))).await;
    eventually("the dedup window on the broker once unpaused", || async {
        let rec = admin.get_topic("orders", None).await.ok()?;
        (rec.dedup_window_ms == Some(600_000)).then_some(())
    })
    .await;

    // --- managementPolicy Observe: an existing broker topic is adopted read-only.
    admin
        .create_topic(&narad_api::CreateTopicRequest {
            name: "legacy".into(),
            partitions: Some(4),
            retention_ms: Some(10_800_000),
            ..Default::default()
        })
        .await
        .expect("a topic made outside the operator");
    let observe = |name: &str, extra: serde_json::Value| {
        let mut spec = json!({"clusterRef": {"name": "prod"}, "managementPolicy": "Observe"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
            "metadata": {"name": name}, "spec": spec})
    };
    // The spec differs (partitions, retention): reported, never applied.
    apply(
        &topics,
        "legacy",
        observe("legacy", json!({"partitions": 6, "retention": "2h"})),
    )
    .await;
    let (st, t_observe) = eventually("legacy Observed", || async {
        let st = topics.get("legacy").await.ok()?.status?;
        let ready = st.conditions.iter().find(|c| c.type_ == cond::READY)?;
        (ready.status == "True" && ready.reason == "Observed").then_some(st)
    })
    .await;
    assert_eq!(st.partitions, Some(4));
    let synced = st
        .conditions
        .iter()
        .find(|c| c.type_ == cond::SYNCED)
        .unwrap();
    assert_eq!(
        (synced.status.as_str(), synced.reason.as_str()),
        ("True", "Observed")
    );
    for want in [
        "partitions: spec 6, broker 4",
        "retention: spec 7200000 ms, broker 10800000 ms",
    ] {
        assert!(synced.message.contains(want), "{}", synced.message);
    }
    // A message produced on the broker shows in the backlog: a later pass read it, and
    // still changed nothing.
    admin
        .produce("legacy", b"kept".to_vec(), None, None)
        .await
        .unwrap();
    eventually("legacy's backlog observed", || async {
        let b = topics.get("legacy").await.ok()?.status?.backlog?;
        (b.messages == 1).then_some(())
    })
    .await;
    let rec = admin.get_topic("legacy", None).await.unwrap();
    assert_eq!((rec.partitions, rec.retention_ms), (4, 10_800_000));
    // A topic that does not exist is NotFound and not created; once it exists it is
    // observed (looked up again every resync).
    apply(&topics, "later", observe("later", json!({}))).await;
    eventually("later NotFound", || async {
        let t = topics.get("later").await.ok()?;
        (reason(&t.status?.conditions, cond::READY) == "NotFound").then_some(())
    })
    .await;
    assert_eq!(
        admin.get_topic("later", None).await.unwrap_err().status(),
        Some(404),
        "an observed topic is never created"
    );
    admin
        .create_topic(&narad_api::CreateTopicRequest {
            name: "later".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    eventually("later Observed once it exists", || async {
        let t = topics.get("later").await.ok()?;
        (reason(&t.status?.conditions, cond::READY) == "Observed").then_some(())
    })
    .await;
    // Deleting the resource leaves the broker topic (deletionPolicy is not used).
    for name in ["legacy", "later"] {
        topics.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("observed Topics released", || async {
        (topics.get_opt("legacy").await.ok()?.is_none()
            && topics.get_opt("later").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    for name in ["legacy", "later"] {
        assert!(
            admin.get_topic(name, None).await.is_ok(),
            "{name}: an observed topic is never deleted"
        );
    }

    // A child attaches to its parent; a child of a missing parent waits.
    apply(&topics, "orders-audit", json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "orders-audit"}, "spec": {"clusterRef": {"name": "prod"}, "parent": "orders"}})).await;
    // Attached on a broker that serves child topics; on one that does not (yet), the
    // topic exists and Synced=False carries the broker's status code and message.
    eventually("orders-audit attached, or the refusal reported", || async {
        let rec = admin.get_topic("orders-audit", None).await.ok()?;
        if rec.parent.as_deref() == Some("orders") {
            return Some(());
        }
        let t = topics.get("orders-audit").await.ok()?;
        let conds = t.status?.conditions;
        let synced = conds.iter().find(|c| c.type_ == cond::SYNCED)?;
        (synced.status == "False" && synced.message.starts_with("http 404")).then_some(())
    })
    .await;
    // A remote link to a second (secured) broker: attached with the credentials from the
    // Secret, messages cross it, and removing the entry detaches it. A broker without remote
    // children refuses the attach instead (404 route or 400): the refusal must show.
    let dr = Server::start(ServerOpts::secured("dr-admin-secret")).await;
    let dr_admin =
        narad_api::Client::new(&dr.url(), Some(("admin".into(), "dr-admin-secret".into())))
            .unwrap();
    dr_admin
        .create_topic(&narad_api::CreateTopicRequest {
            name: "mirrored".into(),
            ..Default::default()
        })
        .await
        .expect("topic on the remote cluster");
    apply(
        &secrets,
        "dr-creds",
        secret(
            "dr-creds",
            &[("username", "admin"), ("password", "dr-admin-secret")],
        ),
    )
    .await;
    let mirrored = |links: serde_json::Value| {
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "mirrored"}, "spec": {"clusterRef": {"name": "prod"}, "remoteChildren": links}})
    };
    apply(
        &topics,
        "mirrored",
        mirrored(
            json!([{"name": "mirrored-dr", "url": dr.url(), "topic": "mirrored",
             "credentialsSecretRef": {"name": "dr-creds"}}]),
        ),
    )
    .await;
    let (attached, t_remote) =
        eventually("mirrored-dr attached, or the refusal reported", || async {
            let t = topics.get("mirrored").await.ok()?;
            let st = t.status?;
            if st.remote_links == vec!["mirrored-dr".to_string()] {
                return Some(true);
            }
            let synced = st.conditions.iter().find(|c| c.type_ == cond::SYNCED)?;
            (synced.status == "False"
                && (synced.message.starts_with("http 404")
                    || synced.message.starts_with("http 400")))
            .then_some(false)
        })
        .await;
    if attached {
        let kids = admin.list_children("mirrored").await.unwrap().children;
        let link = kids
            .iter()
            .find(|c| c.name == "mirrored-dr")
            .expect("link on the broker");
        assert_eq!(link.kind, "remote", "{kids:?}");
        admin
            .produce("mirrored", b"{\"across\":1}".to_vec(), None, None)
            .await
            .expect("produce on the parent");
        eventually("the message on the remote cluster", || async {
            let m = dr_admin
                .consume("mirrored", Some(Duration::from_secs(1)), None)
                .await
                .ok()??;
            let v: serde_json::Value = serde_json::from_str(m.payload.get()).ok()?;
            (v == json!({"across": 1})).then_some(())
        })
        .await;
        apply(&topics, "mirrored", mirrored(json!([]))).await;
        eventually("mirrored-dr detached", || async {
            let kids = admin.list_children("mirrored").await.ok()?.children;
            kids.iter().all(|c| c.name != "mirrored-dr").then_some(())
        })
        .await;
        eprintln!("remote link attached in {t_remote:?}, crossed and detached");
    } else {
        eprintln!("this broker refuses remote children; the refusal was reported");
    }
    apply(&topics, "orphan", json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "orphan"}, "spec": {"clusterRef": {"name": "prod"}, "parent": "nope"}})).await;
    eventually("orphan WaitingForParent", || async {
        let t = topics.get("orphan").await.ok()?;
        (reason(&t.status?.conditions, cond::READY) == "WaitingForParent").then_some(())
    })
    .await;

    // --- User + Grants → broker user with the union of its grants.
    apply(
        &secrets,
        "billing-pw",
        secret("billing-pw", &[("password", "pw-1")]),
    )
    .await;
    let users: Api<User> = Api::namespaced(c.clone(), &ns);
    apply(&users, "billing", json!({"apiVersion": "narad.io/v1alpha1", "kind": "User", "metadata": {"name": "billing"},
        "spec": {"clusterRef": {"name": "prod"}, "passwordSecretRef": {"name": "billing-pw", "key": "password"}}})).await;
    for (name, action, patterns) in [
        ("billing-produce", "produce", json!(["orders*"])),
        ("billing-consume", "consume", json!(["orders"])),
    ] {
        apply(&grants, name, json!({"apiVersion": "narad.io/v1alpha1", "kind": "Grant", "metadata": {"name": name},
            "spec": {"clusterRef": {"name": "prod"}, "user": "billing", "action": action, "patterns": patterns}})).await;
    }
    let want = |u: &narad_api::User| {
        let mut g: Vec<(String, Vec<String>)> = u
            .grants
            .iter()
            .map(|g| (g.action.clone(), g.patterns.clone()))
            .collect();
        g.sort();
        g
    };
    let (_, t_grants) = eventually("billing's grants", || async {
        let u = admin.get_user("billing").await.ok()?;
        (want(&u)
            == vec![
                ("consume".to_string(), vec!["orders".to_string()]),
                ("produce".to_string(), vec!["orders*".to_string()]),
            ])
        .then_some(())
    })
    .await;
    expect_event(
        &c,
        &ns,
        ("User", "billing"),
        "Normal",
        "Created",
        "created user billing",
    )
    .await;
    let billing =
        narad_api::Client::new(&broker.url(), Some(("billing".into(), "pw-1".into()))).unwrap();
    billing
        .produce("orders", b"hello".to_vec(), None, None)
        .await
        .expect("billing may produce");
    // Changing a Grant's patterns reaches the broker.
    apply(&grants, "billing-produce", json!({"apiVersion": "narad.io/v1alpha1", "kind": "Grant", "metadata": {"name": "billing-produce"},
        "spec": {"clusterRef": {"name": "prod"}, "user": "billing", "action": "produce", "patterns": ["orders", "audit-*"]}})).await;
    let (_, t_grant_change) = eventually("changed patterns", || async {
        let u = admin.get_user("billing").await.ok()?;
        u.grants
            .iter()
            .any(|g| g.action == "produce" && g.patterns.contains(&"audit-*".to_string()))
            .then_some(())
    })
    .await;
    // Broker-side drift of the grants is repaired.
    admin.put_grants("billing", &[]).await.unwrap();
    eventually("grant drift repaired", || async {
        admin
            .get_user("billing")
            .await
            .ok()
            .filter(|u| u.grants.len() == 2)
            .map(drop)
    })
    .await;
    // Whichever reconciler repaired it (the User's or a Grant's) said so.
    eventually("an Event for the grant repair", || async {
        let mut n = 0;
        for obj in [
            ("User", "billing"),
            ("Grant", "billing-produce"),
            ("Grant", "billing-consume"),
        ] {
            n += common::events(&c, &ns, obj.0, obj.1)
                .await
                .iter()
                .filter(|(_, r, note)| r == "GrantsSet" && note.contains("audit-*"))
                .count();
        }
        (n > 0).then_some(())
    })
    .await;
    // spec.quotas reaches the broker, and its drift is repaired.
    apply(&users, "billing", json!({"apiVersion": "narad.io/v1alpha1", "kind": "User", "metadata": {"name": "billing"},
        "spec": {"clusterRef": {"name": "prod"}, "passwordSecretRef": {"name": "billing-pw", "key": "password"},
                 "quotas": {"produceMsgsPerS": 1000, "maxTopics": 4}}})).await;
    let want_quotas = narad_api::Quotas {
        produce_msgs_per_s: Some(1000),
        max_topics: Some(4),
        ..Default::default()
    };
    eventually("billing's quotas", || async {
        let u = admin.get_user("billing").await.ok()?;
        (u.quotas.as_ref() == Some(&want_quotas)).then_some(())
    })
    .await;
    admin
        .put_quotas("billing", &narad_api::Quotas::default())
        .await
        .unwrap();
    eventually("quota drift repaired", || async {
        let u = admin.get_user("billing").await.ok()?;
        (u.quotas.as_ref() == Some(&want_quotas)).then_some(())
    })
    .await;
    // A password Secret without the narad.io/credentials label is refused.
    apply(
        &secrets,
        "plain-pw",
        common::unlabelled_secret("plain-pw", &[("password", "pw-x")]),
    )
    .await;
    apply(&users, "plain", json!({"apiVersion": "narad.io/v1alpha1", "kind": "User", "metadata": {"name": "plain"},
        "spec": {"clusterRef": {"name": "prod"}, "passwordSecretRef": {"name": "plain-pw", "key": "password"}}})).await;
    eventually("plain SecretNotLabelled", || async {
        let u = users.get("plain").await.ok()?;
        (reason(&u.status?.conditions, cond::READY) == "SecretNotLabelled").then_some(())
    })
    .await;
    assert_eq!(
        admin.get_user("plain").await.unwrap_err().status(),
        Some(404),
        "no user made from an unlabelled Secret"
    );
    // A Grant for a missing User waits.
    apply(&grants, "ghost", json!({"apiVersion": "narad.io/v1alpha1", "kind": "Grant", "metadata": {"name": "ghost"},
        "spec": {"clusterRef": {"name": "prod"}, "user": "ghost", "action": "consume", "patterns": ["x"]}})).await;
    eventually("ghost WaitingForUser", || async {
        let g = grants.get("ghost").await.ok()?;
        (reason(&g.status?.conditions, cond::READY) == "WaitingForUser").then_some(())
    })
    .await;
    // A new password in the Secret is applied.
    apply(
        &secrets,
        "billing-pw",
        secret("billing-pw", &[("password", "pw-2")]),
    )
    .await;
    let billing2 =
        narad_api::Client::new(&broker.url(), Some(("billing".into(), "pw-2".into()))).unwrap();
    eventually("new password works", || async {
        billing2
            .list_topics_page(Some(1), None)
            .await
            .ok()
            .map(drop)
    })
    .await;
    // Deleting a Grant removes it from the union.
    grants
        .delete("billing-consume", &DeleteParams::default())
        .await
        .unwrap();
    eventually("consume grant gone", || async {
        admin
            .get_user("billing")
            .await
            .ok()
            .filter(|u| u.grants.iter().all(|g| g.action != "consume"))
            .map(drop)
    })
    .await;

    // --- Deletion honours finalizers and deletionPolicy.
    apply(
        &topics,
        "kept",
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic", "metadata": {"name": "kept"},
        "spec": {"clusterRef": {"name": "prod"}, "deletionPolicy": "Retain"}}),
    )
    .await;
    eventually("kept on the broker", || async {
        admin.get_topic("kept", None).await.ok().map(drop)
    })
    .await;
    eventually("kept has the finalizer", || async {
        topics
            .get("kept")
            .await
            .ok()
            .filter(|t| {
                t.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
            })
            .map(drop)
    })
    .await;
    topics
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    topics
        .delete("orders-audit", &DeleteParams::default())
        .await
        .unwrap();
    eventually("resources gone", || async {
        (topics.get_opt("kept").await.ok()?.is_none()
            && topics.get_opt("orders-audit").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    assert!(
        admin.get_topic("kept", None).await.is_ok(),
        "Retain keeps the broker topic"
    );
    assert_eq!(
        admin
            .get_topic("orders-audit", None)
            .await
            .unwrap_err()
            .status(),
        Some(404),
        "Delete removes it"
    );
    // DeleteIfEmpty: the resource stays (NotEmpty) while a message waits, and goes once the
    // topic is drained.
    apply(
        &topics,
        "drained",
        json!({"apiVersion": "narad.io/v1alpha1", "kind": "Topic", "metadata": {"name": "drained"},
        "spec": {"clusterRef": {"name": "prod"}, "deletionPolicy": "DeleteIfEmpty"}}),
    )
    .await;
    eventually("drained Ready", || async {
        topics
            .get("drained")
            .await
            .ok()
            .filter(|t| ready(t.status.as_ref().map(|s| &s.conditions)))
            .map(drop)
    })
    .await;
    admin
        .produce("drained", b"last".to_vec(), None, None)
        .await
        .unwrap();
    topics
        .delete("drained", &DeleteParams::default())
        .await
        .unwrap();
    eventually("drained NotEmpty", || async {
        let t = topics.get("drained").await.ok()?;
        (reason(&t.status?.conditions, cond::READY) == "NotEmpty").then_some(())
    })
    .await;
    expect_event(
        &c,
        &ns,
        ("Topic", "drained"),
        "Warning",
        "NotEmpty",
        "1 messages waiting",
    )
    .await;
    assert!(
        admin.get_topic("drained", None).await.is_ok(),
        "kept while not empty"
    );
    let m = loop {
        if let Some(m) = admin
            .consume("drained", Some(Duration::from_secs(5)), None)
            .await
            .unwrap()
        {
            break m;
        }
    };
    admin
        .ack("drained", m.receipt_handle.as_deref().unwrap())
        .await
        .unwrap();
    eventually("drained deleted once empty", || async {
        (topics.get_opt("drained").await.ok()?.is_none()
            && admin.get_topic("drained", None).await.err()?.status() == Some(404))
        .then_some(())
    })
    .await;
    expect_event(
        &c,
        &ns,
        ("Topic", "drained"),
        "Normal",
        "Deleted",
        "deleted topic drained",
    )
    .await;
    users
        .delete("billing", &DeleteParams::default())
        .await
        .unwrap();
    eventually("billing deleted on the broker", || async {
        (admin.get_user("billing").await.err()?.status() == Some(404)).then_some(())
    })
    .await;

    // Deleting the NaradCluster releases the dependents without calling the broker.
    clusters
        .delete("prod", &DeleteParams::default())
        .await
        .unwrap();
    topics
        .delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    eventually("orders released", || async {
        topics.get_opt("orders").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        admin.get_topic("orders", None).await.is_ok(),
        "the broker was not called"
    );

    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "envtest timings: topic create→Ready {t_create:?}, partitions change→broker {t_partitions:?}, \
         drift repair {t_drift:?}, grants→broker {t_grants:?}, grant change→broker {t_grant_change:?}, \
         storage.size growth→claims {t_expand:?}, scale subresource→StatefulSet {t_scale:?}, \
         observed topic→status {t_observe:?}"
    );
    operator.abort();
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    for pv in volumes {
        let _ = pvs.delete(&pv, &DeleteParams::default()).await;
    }
    let _ = classes
        .delete(&storage_class, &DeleteParams::default())
        .await;
}
