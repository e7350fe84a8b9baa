#!/usr/bin/env bash
# What CI runs for the Kubernetes part: the operator's unit and mocked-API-server tests,
# the CRD regeneration check, and `helm lint --strict` + `helm template` of both charts.
# Usage: operator/ci.sh   (from anywhere; HELM=/path/to/helm to use a given helm)
# With K8S_TESTENV=DIR it also builds (once, into DIR) and starts the real Kubernetes 1.20
# API server of ../shared/k8s-testenv, runs the operator's envtest against it and a real
# broker, and installs, upgrades and uninstalls both charts there.
# PROFILE=release reuses a release build (what .ci/run does); SKIP_UNIT=1 skips the operator's
# unit tests when the workspace test run already ran them.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE="${PROFILE:-debug}"
flag=()
[ "$PROFILE" = release ] && flag=(--release)

if [ -z "${SKIP_UNIT:-}" ]; then
  echo "== operator tests (unit, mocked API server, CRD/CEL)"
  cargo test "${flag[@]}" -p narad-operator
fi

echo "== CRDs regenerate without a diff"
# The workspace build's binary when there is one (a package-scoped `cargo run` would resolve
# features for the operator alone and rebuild the dependency tree).
target_dir="${CARGO_TARGET_DIR:-target}"
operator_bin="$target_dir/$PROFILE/narad-operator"
[ -x "$operator_bin" ] || cargo build -q "${flag[@]}" --workspace
"$operator_bin" crdgen --out crds
"$operator_bin" crdgen --out charts/narad-operator/crds
git diff --exit-code -- crds charts/narad-operator/crds

HELM="$(operator/helm.sh)"

echo "== helm lint --strict and template"
for chart in charts/narad charts/narad-operator; do
  "$HELM" lint --strict "$chart"
  "$HELM" template ci "$chart" --include-crds > /dev/null
done
# Variants that switch optional parts on.
r0="$(mktemp -d)"
"$HELM" template ci charts/narad --set replicaCount=5 --set loadBalancer.enabled=true \
  --set ingress.enabled=true --set ingress.host=narad.example.com --set serviceMonitor.enabled=true \
  --set security.clusterTLS.enabled=true --set security.clusterTLS.secretName=tls \
  --set security.apiTLS.enabled=true --set security.apiTLS.secretName=api-tls \
  --set-json 'remotes.allowedHosts=["narad-dr.example.com","*.corp.example","10.0.0.0/8"]' \
  --set-json 'narad.config={"storage":{"idle_log_eviction_ms":600000}}' > "$r0/variants.yaml"
grep -q 'value: "narad-dr.example.com,\*.corp.example,10.0.0.0/8"' "$r0/variants.yaml"
grep -q 'scheme: HTTPS' "$r0/variants.yaml"
"$HELM" template ci charts/narad --set serviceMonitor.enabled=true --set service.ports.metrics=9090 \
  --set security.apiTLS.enabled=true --set security.apiTLS.secretName=api-tls > /dev/null
"$HELM" template ci charts/narad-operator --set operator.watchNamespace=apps > /dev/null
# The Grafana dashboard ConfigMap: off by default; on, it carries the sidecar's label and the
# dashboard JSON whole (parsed back out of the rendered YAML).
"$HELM" template ci charts/narad --set grafanaDashboard.enabled=true \
  --set-json 'grafanaDashboard.annotations={"grafana_folder":"Narad"}' > "$r0/dashboard.yaml"
python3 - "$r0/dashboard.yaml" charts/narad/dashboards/narad.json <<'PY'
import json, sys
docs = open(sys.argv[1]).read().split("\n---\n")
cm = [d for d in docs if "kind: ConfigMap" in d and "ci-narad-dashboard" in d]
assert len(cm) == 1, "one dashboard ConfigMap"
text = cm[0]
assert 'grafana_dashboard: "1"' in text and "grafana_folder: Narad" in text, text[:400]
body = text.split("narad.json: |-\n", 1)[1]
embedded = "\n".join(l[4:] for l in body.splitlines())
assert json.loads(embedded) == json.load(open(sys.argv[2])), "the embedded dashboard is the file"
PY
if "$HELM" template ci charts/narad | grep -q 'ci-narad-dashboard'; then
  echo "the dashboard ConfigMap is rendered by default" >&2; exit 1
fi
# Issue 14: what the default render must carry (orderly shutdown, stable advertised address,
# a generated admin password the helm test authenticates with, a test pod outside the
# brokers' selector, not-ready addresses on the headless Service only). Piped greps write
# to /dev/null: grep -q would close the pipe early, and pipefail fails the writer.
d0="$(mktemp -d)"
"$HELM" template ci charts/narad > "$d0/narad.yaml"
grep -q 'terminationGracePeriodSeconds: 30$' "$d0/narad.yaml"
grep -A1 'name: NARAD_HTTP_SHUTDOWN_DELAY' "$d0/narad.yaml" | grep 'value: "5s"' > /dev/null
grep -A1 'name: NARAD_CLUSTER_ADVERTISE_ADDR' "$d0/narad.yaml" \
  | grep -F 'value: "$(POD_NAME).ci-narad-headless.default.svc.cluster.local:7943"' > /dev/null
grep -qE '^  admin-password: [A-Za-z0-9+/=]{40,}$' "$d0/narad.yaml"
grep -q 'key: admin-password' "$d0/narad.yaml"
grep -A4 'name: ci-narad-test-api' "$d0/narad.yaml" | grep 'app.kubernetes.io/name: narad-test' > /dev/null
test "$(grep -c 'publishNotReadyAddresses: true' "$d0/narad.yaml")" = 1
grep -B12 'publishNotReadyAddresses: true' "$d0/narad.yaml" | grep 'name: ci-narad-headless' > /dev/null
"$HELM" template ci charts/narad --set narad.shutdownDelay=1m \
  --set-json 'narad.config={"http":{"shutdown_grace":"20s"}}' | grep 'terminationGracePeriodSeconds: 95$' > /dev/null
if "$HELM" template ci charts/narad --set narad.shutdownDelay=5 > /dev/null 2>&1; then
  echo "a shutdownDelay without a unit rendered" >&2; exit 1
fi
# The console: on by default, off with narad.consoleEnabled=false.
grep -A1 'name: NARAD_HTTP_CONSOLE_ENABLED' "$d0/narad.yaml" | grep 'value: "true"' > /dev/null
"$HELM" template ci charts/narad --set narad.consoleEnabled=false \
  | grep -A1 'name: NARAD_HTTP_CONSOLE_ENABLED' | grep 'value: "false"' > /dev/null
# The operator: external endpoints off unless switched on; Events and ServiceAccounts in RBAC.
"$HELM" template ci charts/narad-operator > "$d0/op.yaml"
if grep -q NARAD_OPERATOR_ALLOW_EXTERNAL_ENDPOINTS "$d0/op.yaml"; then
  echo "external endpoints allowed by default" >&2; exit 1
fi
"$HELM" template ci charts/narad-operator --set operator.allowExternalEndpoints=true \
  | grep -A1 'name: NARAD_OPERATOR_ALLOW_EXTERNAL_ENDPOINTS' | grep 'value: "true"' > /dev/null
grep -B1 'resources: \["events"\]' "$d0/op.yaml" | grep 'events.k8s.io' > /dev/null
grep -q 'resources: \["serviceaccounts"\]' "$d0/op.yaml"
# Rendered manifests are valid Kubernetes objects (offline, strict schemas).
KV="${KUBERNETES_VALIDATE:-$(command -v kubernetes-validate || true)}"
if [ -z "$KV" ]; then
  v="$(mktemp -d)"; python3 -m venv "$v"; "$v/bin/pip" install -q kubernetes-validate
  KV="$v/bin/kubernetes-validate"
fi
r="$(mktemp -d)"
"$HELM" template ci charts/narad > "$r/narad.yaml"
"$HELM" template ci charts/narad --set loadBalancer.enabled=true --set ingress.enabled=true \
  --set ingress.host=narad.example.com --set security.clusterTLS.enabled=true \
  --set security.clusterTLS.secretName=tls --set service.ports.metrics=9090 \
  --set security.apiTLS.enabled=true --set security.apiTLS.secretName=api-tls \
  --set-json 'remotes.allowedHosts=["*"]' \
  --set-json 'narad.config={"a":1}' > "$r/narad-all.yaml"
"$HELM" template ci charts/narad-operator > "$r/operator.yaml"
"$HELM" template ci charts/narad-operator --set operator.watchNamespace=apps > "$r/operator-ns.yaml"
"$KV" --strict --quiet -k 1.33.0 "$r"/*.yaml
# Shapes the broker refuses fail at render time.
if "$HELM" template ci charts/narad --set initialClusterSize=2 > /dev/null 2>&1; then
  echo "an even initialClusterSize rendered" >&2; exit 1
fi
if "$HELM" template ci charts/narad --set replicaCount=2 --set initialClusterSize=1 > /dev/null 2>&1; then
  echo "replicaCount 2 rendered" >&2; exit 1
fi
if "$HELM" template ci charts/narad --set-json 'remotes.allowedHosts=["a,b"]' > /dev/null 2>&1; then
  echo "an allowedHosts entry with a comma rendered" >&2; exit 1
fi
if [ -n "${K8S_TESTENV:-}" ]; then
  tenv="$(cd .. && pwd)/shared/k8s-testenv"
  [ -x "$K8S_TESTENV/bin/kube-apiserver" ] || bash "$tenv/build.sh" "$K8S_TESTENV"
  state="$K8S_TESTENV/run-ci"; rm -rf "$state"
  # etcd on 127.0.0.1:2379, as ../shared/k8s-node's: one of the two at a time.
  exec 9>/tmp/k8s.lock
  flock 9
  bash "$tenv/start.sh" "$K8S_TESTENV/bin" "$state"
  trap 'bash "$tenv/stop.sh" "$state"' EXIT
  export KUBECONFIG="$state/kubeconfig"

  echo "== envtest: operator against the real API server and real brokers (rollout included)"
  [ -x "$target_dir/$PROFILE/narad" ] || cargo build "${flag[@]}" --workspace
  NARAD_K8S_KUBECONFIG="$KUBECONFIG" NARAD_BIN="$(cd "$target_dir/$PROFILE" && pwd)/narad" \
    cargo test "${flag[@]}" --workspace --test envtest --test rollout

  echo "== helm install / upgrade / uninstall against the API server"
  kubectl create namespace helm-ci
  "$HELM" install op charts/narad-operator -n helm-ci --wait=false
  "$HELM" install nd charts/narad -n helm-ci
  kubectl -n helm-ci get statefulset/nd-narad service/nd-narad service/nd-narad-headless pdb/nd-narad secret/nd-narad-security
  "$HELM" upgrade nd charts/narad -n helm-ci --set replicaCount=5
  test "$(kubectl -n helm-ci get statefulset nd-narad -o jsonpath='{.spec.replicas}')" = 5
  "$HELM" upgrade op charts/narad-operator -n helm-ci --set operator.watchNamespace=helm-ci
  test "$(kubectl -n helm-ci auth can-i patch topics.narad.io/status --as system:serviceaccount:helm-ci:op-narad-operator)" = yes
  test "$(kubectl -n helm-ci auth can-i delete secrets --as system:serviceaccount:helm-ci:op-narad-operator)" = no
  test "$(kubectl -n helm-ci auth can-i create events.events.k8s.io --as system:serviceaccount:helm-ci:op-narad-operator)" = yes
  test "$(kubectl -n helm-ci auth can-i patch serviceaccounts --as system:serviceaccount:helm-ci:op-narad-operator)" = yes
  # Every owned kind is read before it is applied (its Event says whether it was created,
  # changed or left alone).
  for kind in services configmaps serviceaccounts statefulsets.apps poddisruptionbudgets.policy; do
    test "$(kubectl -n helm-ci auth can-i get "$kind" --as system:serviceaccount:helm-ci:op-narad-operator)" = yes
  done
  "$HELM" uninstall nd -n helm-ci
  "$HELM" uninstall op -n helm-ci
  kubectl delete namespace helm-ci --wait=false
fi
echo "operator/ci.sh: all checks passed"
