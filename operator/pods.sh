#!/usr/bin/env bash
# The real-pod test (operator/tests/pods.rs) on ../shared/k8s-node: builds the node into
# K8S_NODE (once; reused when built), starts it on a fresh state dir, builds the images from
# the release binaries (no second compile), runs the test, and stops the node again.
# Usage: operator/pods.sh   (root, a Docker engine; after `cargo build --release --workspace`)
# K8S_NODE=DIR: where the node is built (default: a new temporary dir).
set -euo pipefail
cd "$(dirname "$0")/.."
node="$(cd .. && pwd)/shared/k8s-node"
out="${K8S_NODE:-$(mktemp -d)/knode}"
state="$(mktemp -d)/state"
version="$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)"

echo "== k8s-node: build (once) and start [${SECONDS}s]"
operator/build-node.sh "$out"
# Only one node can hold the bridge at a time (and the API server of ../shared/k8s-testenv
# shares its etcd port): callers that run both serialize on this lock.
exec 9>/tmp/k8s.lock
flock 9
# Persistent volumes the test claims (a claimed one is never reused): NaradCluster prod up to
# 4, secure 3, the broker chart's releases nd 3 and nds 3; then the README's quick start 3.
# The node's bridge is knode0 unless something already holds that name (a node another run
# left behind, or one still running): then the first free knodeN, on its own 10.244.N.0/24.
if [ -z "${K8S_NODE_BRIDGE:-}" ]; then
  for n in $(seq 0 9); do
    ip link show "knode$n" >/dev/null 2>&1 && continue
    ip -4 addr show | grep -q "inet 10\.244\.$n\." && continue
    export K8S_NODE_BRIDGE="knode$n" K8S_NODE_NET="10.244.$n"; break
  done
  [ -n "${K8S_NODE_BRIDGE:-}" ] || { echo "no free bridge name knode0..knode9" >&2; exit 1; }
  [ "$K8S_NODE_BRIDGE" = knode0 ] || ip -br link | grep knode | sed 's/^/  (taken: /;s/$/)/'
  echo "the node's bridge: $K8S_NODE_BRIDGE ($K8S_NODE_NET.0/24)"
fi
PV_COUNT=20 bash "$node/start-node.sh" "$out" "$state"
trap 'bash "$node/stop-node.sh" "$state" --purge' EXIT
# shellcheck disable=SC1091
. "$state/env.sh"

echo "== images from the release binaries [${SECONDS}s]"
NARAD_IMAGE_BINARIES=host docker/build.sh all "$version"
# The "new version" of the rolling upgrade: the same binary, reporting another version.
printf 'FROM narad:%s\nENV NARAD_TEST_KNOBS=true NARAD_TEST_VERSION=%s-next\n' "$version" "$version" |
  docker build -q -t "narad:$version-next" - >/dev/null

echo "== the real-pod test [${SECONDS}s]"
NARAD_K8S_NODE_KUBECONFIG="$KUBECONFIG" NARAD_K8S_NODE_VERSION="$version" HELM="$(operator/helm.sh)" \
  cargo test --release --workspace --test pods -- --nocapture
# (--workspace, not -p narad-operator: a package-scoped build resolves the dependencies'
# features differently and compiles most of the workspace again, ~4 min on 2 cores.)
echo "== the README's Kubernetes quick start, as written [${SECONDS}s]"
HELM="$(operator/helm.sh)" KUBECTL="$out/bin/kubectl" operator/quickstart.sh
echo "operator/pods.sh: passed [${SECONDS}s]"
