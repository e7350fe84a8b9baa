//! The committed CRDs are what the Rust types generate, and their CEL rules hold: each rule
//! is evaluated here with kube-cel on the generated `openAPIV3Schema`, since the 1.20 test
//! API server ignores `x-kubernetes-validations`.

use std::path::PathBuf;

use narad_operator::crd::{all_crds, crd_yaml};
use serde_json::{json, Value};

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds")
}

/// Fails when `crds/` (or the operator chart's copy) differs from a regeneration
/// (`narad-operator crdgen --out crds`).
#[test]
fn committed_crds_match_the_types() {
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/narad-operator/crds");
    for (file, crd) in all_crds() {
        for path in [crds_dir().join(file), chart.join(file)] {
            let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; run `narad-operator crdgen --out crds`",
                    path.display()
                )
            });
            assert!(
                committed == crd_yaml(&crd),
                "{} is stale; run `cargo run -p narad-operator -- crdgen --out crds`",
                path.display()
            );
        }
    }
}

fn schema(kind: &str) -> Value {
    let crd = all_crds()
        .into_iter()
        .find(|(_, c)| c.spec.names.kind == kind)
        .unwrap()
        .1;
    let v = serde_json::to_value(&crd.spec.versions[0]).unwrap();
    v["schema"]["openAPIV3Schema"].clone()
}

fn obj(kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "narad.io/v1alpha1", "kind": kind,
           "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

/// Runs the CEL rules of `kind` on `new` (an update of `old` when given); the messages of
/// the failed rules.
fn cel(kind: &str, new: &Value, old: Option<&Value>) -> Vec<String> {
    match kube_cel::Validator::new().validate(&schema(kind), new, old) {
        Ok(()) => vec![],
        Err(e) => e.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

fn assert_ok(kind: &str, new: &Value, old: Option<&Value>) {
    let errs = cel(kind, new, old);
    assert!(errs.is_empty(), "{kind}: unexpected {errs:?} for {new}");
}

fn assert_refused(kind: &str, new: &Value, old: Option<&Value>, msg: &str) {
    let errs = cel(kind, new, old);
    assert!(
        errs.iter().any(|e| e.contains(msg)),
        "{kind}: expected {msg:?}, got {errs:?} for {new}"
    );
}

#[test]
fn naradcluster_rules() {
    let nc = |spec: Value| obj("NaradCluster", "prod", spec);
    assert_ok(
        "NaradCluster",
        &nc(json!({"version": "1", "replicas": 3, "storage": {"size": "10Gi"}})),
        None,
    );
    assert_ok(
        "NaradCluster",
        &nc(json!({"version": "1", "replicas": 1, "storage": {"size": "10Gi"}})),
        None,
    );
    assert_refused(
        "NaradCluster",
        &nc(json!({"version": "1", "replicas": 2, "storage": {"size": "10Gi"}})),
        None,
        "replicas must be 1",
    );
    assert_refused(
        "NaradCluster",
        &nc(
            json!({"version": "1", "replicas": 5, "initialClusterSize": 4, "storage": {"size": "1Gi"}}),
        ),
        None,
        "odd",
    );
    assert_refused(
        "NaradCluster",
        &nc(
            json!({"version": "1", "replicas": 3, "initialClusterSize": 5, "storage": {"size": "1Gi"}}),
        ),
        None,
        "replicas must be",
    );
    let old = nc(json!({"version": "1", "replicas": 3, "storage": {"size": "10Gi"}}));
    // Scaling out keeps the (defaulted) initial size: fine.
    assert_ok(
        "NaradCluster",
        &nc(json!({"version": "1", "replicas": 5, "storage": {"size": "10Gi"}})),
        Some(&old),
    );
    assert_ok(
        "NaradCluster",
        &nc(
            json!({"version": "1", "replicas": 5, "initialClusterSize": 3, "storage": {"size": "10Gi"}}),
        ),
        Some(&old),
    );
    assert_refused(
        "NaradCluster",
        &nc(
            json!({"version": "1", "replicas": 5, "initialClusterSize": 5, "storage": {"size": "10Gi"}}),
        ),
        Some(&old),
        "initialClusterSize is immutable",
    );
    assert_ok(
        "NaradCluster",
        &nc(json!({"version": "1", "replicas": 3, "storage": {"size": "20Gi"}})),
        Some(&old),
    );
    assert_refused(
        "NaradCluster",
        &nc(json!({"version": "1", "replicas": 3, "storage": {"size": "5Gi"}})),
        Some(&old),
        "storage.size may only grow",
    );
}

#[test]
fn topic_rules() {
    let t = |spec: Value| {
        let mut s = json!({"clusterRef": {"name": "prod"}});
        s.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        obj("Topic", "orders", s)
    };
    assert_ok("Topic", &t(json!({"partitions": 6})), None);
    assert_ok(
        "Topic",
        &t(json!({"parent": "raw", "replica": true, "delay": "1h"})),
        None,
    );
    assert_refused(
        "Topic",
        &t(json!({"replica": true})),
        None,
        "replica needs parent",
    );
    assert_refused(
        "Topic",
        &t(json!({"delay": "1h"})),
        None,
        "delay needs parent",
    );
    assert_refused(
        "Topic",
        &t(json!({"parent": "raw", "remoteChildren": [{"name": "dr", "url": "https://x"}]})),
        None,
        "parents only",
    );
    let old = t(json!({"name": "orders", "partitions": 6, "parent": "raw", "delay": "1h"}));
    assert_ok(
        "Topic",
        &t(json!({"name": "orders", "partitions": 12, "parent": "raw", "delay": "1h"})),
        Some(&old),
    );
    assert_refused(
        "Topic",
        &t(json!({"name": "orders", "partitions": 3, "parent": "raw", "delay": "1h"})),
        Some(&old),
        "partitions may only grow",
    );
    assert_refused(
        "Topic",
        &t(json!({"partitions": 6, "parent": "raw", "delay": "1h"})),
        Some(&old),
        "name is immutable",
    );
    assert_refused(
        "Topic",
        &t(json!({"name": "o2", "partitions": 6, "parent": "raw", "delay": "1h"})),
        Some(&old),
        "name is immutable",
    );
    assert_refused(
        "Topic",
        &t(json!({"name": "orders", "partitions": 6, "parent": "raw", "delay": "2h"})),
        Some(&old),
        "delay is immutable",
    );
    assert_refused(
        "Topic",
        &t(
            json!({"name": "orders", "partitions": 6, "parent": "raw", "delay": "1h", "replica": true}),
        ),
        Some(&old),
        "replica is immutable",
    );
}

#[test]
fn user_rules() {
    let spec = json!({"clusterRef": {"name": "prod"}, "passwordSecretRef": {"name": "s", "key": "password"}});
    assert_ok("User", &obj("User", "billing", spec.clone()), None);
    assert_refused(
        "User",
        &obj("User", "admin", spec.clone()),
        None,
        "root user admin",
    );
    let mut named = spec.clone();
    named["username"] = json!("admin");
    assert_refused("User", &obj("User", "ops", named), None, "root user admin");
    for (policy, ok) in [("Delete", true), ("Retain", true), ("DeleteIfEmpty", false)] {
        let mut p = spec.clone();
        p["deletionPolicy"] = json!(policy);
        if ok {
            assert_ok("User", &obj("User", "billing", p), None);
        } else {
            assert_refused("User", &obj("User", "billing", p), None, "for topics");
        }
    }
    let mut a = spec.clone();
    a["username"] = json!("billing");
    let mut b = spec;
    b["username"] = json!("billing2");
    assert_refused(
        "User",
        &obj("User", "x", b),
        Some(&obj("User", "x", a)),
        "username is immutable",
    );
}

#[test]
fn grant_rules() {
    let g = |action: &str, patterns: Value| {
        obj(
            "Grant",
            "g",
            json!({"clusterRef": {"name": "prod"}, "user": "billing",
                                 "action": action, "patterns": patterns}),
        )
    };
    assert_ok("Grant", &g("produce", json!(["orders-*"])), None);
    assert_ok("Grant", &g("admin", json!([])), None);
    assert_refused(
        "Grant",
        &g("admin", json!(["x"])),
        None,
        "admin takes no patterns",
    );
    assert_refused("Grant", &g("consume", json!([])), None, "at least one");
}

/// Every property under `schema` (recursively: nested objects and list items) whose
/// description is missing or empty, as `path.to.field`; `path` names `schema` itself, whose
/// own description is checked too.
fn undescribed(path: &str, schema: &Value, out: &mut Vec<String>) {
    if schema["description"]
        .as_str()
        .is_none_or(|d| d.trim().is_empty())
    {
        out.push(path.to_string());
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, prop) in props {
            undescribed(&format!("{path}.{name}"), prop, out);
        }
    }
    // A list's items are described by the list itself; their fields are walked.
    if let Some(props) = schema["items"]["properties"].as_object() {
        for (name, prop) in props {
            undescribed(&format!("{path}[].{name}"), prop, out);
        }
    }
}

#[test]
fn the_description_walk_finds_what_is_missing() {
    let schema = json!({"description": "d", "properties": {
        "a": {"description": "a", "properties": {"b": {"type": "string"}}},
        "l": {"description": "l", "items": {"properties": {"c": {"description": " "}}}},
        "e": {"description": "e"}}});
    let mut out = Vec::new();
    undescribed("spec", &schema, &mut out);
    assert_eq!(out, vec!["spec.a.b", "spec.l[].c"]);
}

/// `kubectl scale nc` and a HorizontalPodAutoscaler: the scale subresource maps the replicas
/// and the pods' selector, both of which the status carries.
#[test]
fn naradcluster_has_a_scale_subresource() {
    let nc = all_crds()
        .into_iter()
        .find(|(_, c)| c.spec.names.kind == "NaradCluster")
        .unwrap()
        .1;
    let v = &nc.spec.versions[0];
    let scale = v.subresources.as_ref().unwrap().scale.as_ref().unwrap();
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(
        scale.label_selector_path.as_deref(),
        Some(".status.selector")
    );
    let status = &schema("NaradCluster")["properties"]["status"]["properties"];
    assert_eq!(status["replicas"]["type"], "integer");
    assert_eq!(status["selector"]["type"], "string");
    for (_, other) in all_crds()
        .into_iter()
        .filter(|(_, c)| c.spec.names.kind != "NaradCluster")
    {
        assert!(other.spec.versions[0]
            .subresources
            .as_ref()
            .unwrap()
            .scale
            .is_none());
    }
}

/// `managementPolicy` is an enum with `Manage` as default.
#[test]
fn topic_management_policy_is_an_enum() {
    let p = &schema("Topic")["properties"]["spec"]["properties"]["managementPolicy"];
    assert_eq!(p["enum"], json!(["Manage", "Observe"]), "{p}");
    assert_eq!(p["default"], "Manage");
}

#[test]
fn schemas_describe_fields_and_columns() {
    for (_, crd) in all_crds() {
        let v = &crd.spec.versions[0];
        assert!(
            v.subresources.as_ref().unwrap().status.is_some(),
            "{}: status subresource",
            crd.spec.names.kind
        );
        let cols = v.additional_printer_columns.as_ref().unwrap();
        assert!(cols.iter().any(|c| c.name == "Age"));
        let s = serde_json::to_value(v.schema.as_ref().unwrap()).unwrap();
        let spec = &s["openAPIV3Schema"]["properties"]["spec"];
        let mut undocumented = Vec::new();
        undescribed("spec", spec, &mut undocumented);
        assert!(
            undocumented.is_empty(),
            "{}: fields without a description (kubectl explain shows nothing): {undocumented:?}",
            crd.spec.names.kind
        );
    }
    let nc = serde_json::to_value(&all_crds()[0].1).unwrap();
    let spec =
        &nc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(spec["replicas"]["default"], 3);
    assert_eq!(
        spec["defaults"]["properties"]["retention"]["default"],
        "12h"
    );
    assert_eq!(spec["pvcDeletionPolicy"]["default"], "Retain");
    assert_eq!(spec["config"]["x-kubernetes-preserve-unknown-fields"], true);
}
