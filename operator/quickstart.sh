#!/usr/bin/env bash
# The README's Kubernetes quick start, run as written on a running ../shared/k8s-node (pods.sh
# calls it after the real-pod test; the node is purged afterwards, so nothing is cleaned up):
# the block from `helm install narad-operator` to the curl from a pod is cut out of README.md
# and run by bash unchanged. Then a rollout to an image that does not exist shows what
# `kubectl describe nc prod` tells about a stuck cluster.
# Needs: KUBECONFIG of the node, the images narad:V and narad-operator:V in its Docker engine,
# helm and kubectl on PATH (HELM/KUBECTL name others), the machine's curl.
set -euo pipefail
cd "$(dirname "$0")/.."
HELM="${HELM:-helm}"
KUBECTL="${KUBECTL:-kubectl}"
helm() { "$HELM" "$@"; }
kubectl() { "$KUBECTL" "$@"; }
export -f helm kubectl
export HELM KUBECTL

# The image the README's curl runs in, stood in for (no registry is reachable here): this
# machine's curl with the libraries it links, FROM scratch, under the README's tag.
image=$(sed -n 's/.*--image=\([^ ]*\).*/\1/p' README.md | head -1)
[ -n "$image" ] || { echo "quickstart: no --image= in the README" >&2; exit 1; }
if ! docker image inspect "$image" >/dev/null 2>&1; then
  ctx=$(mktemp -d)
  curl_bin=$(command -v curl)
  for f in "$curl_bin" $(ldd "$curl_bin" | grep -o '/[^ ]*'); do
    mkdir -p "$ctx/root$(dirname "$f")"; cp -L "$f" "$ctx/root$f"
  done
  [ -f /etc/ssl/certs/ca-certificates.crt ] &&
    { mkdir -p "$ctx/root/etc/ssl/certs"; cp /etc/ssl/certs/ca-certificates.crt "$ctx/root/etc/ssl/certs/"; }
  printf 'FROM scratch\nCOPY root /\nENV PATH=/usr/bin:/bin\n' > "$ctx/Dockerfile"
  docker build -q -t "$image" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "quickstart: $image stands in for the README's curl image"
fi

block=$(awk '/^    helm install narad-operator/{on=1} on{print} on && /\/v1\/topics\/orders\/produce$/{exit}' README.md |
  sed 's/^    //')
[ -n "$block" ] && grep -q 'kubectl run' <<<"$block" || { echo "quickstart: the README block was not found" >&2; exit 1; }
echo "== the README's Kubernetes quick start [${SECONDS}s]"
out=$(bash -euo pipefail -c "$block" 2>&1) || { echo "$out"; echo "quickstart: the README's commands failed" >&2; exit 1; }
echo "$out"
# The curl prints the produce's status (202: fsynced on the node that took it).
grep -qx '202' <<<"$out" || { echo "quickstart: the curl from a pod did not get 202" >&2; exit 1; }
echo "quickstart: the README's commands passed [${SECONDS}s]"

echo "== a stuck rollout, as kubectl describe tells it [${SECONDS}s]"
kubectl patch nc prod --type merge -p '{"spec":{"version":"0.1.0-missing"}}' >/dev/null
for _ in $(seq 1 120); do
  d=$(kubectl describe nc prod)
  # The condition names what the replaced pod's container waits for, once the kubelet
  # has tried the pull.
  if grep -q 'ReplacingPod' <<<"$d" && grep -q 'PodNotReady' <<<"$d" &&
     grep -qE 'ErrImagePull|ImagePullBackOff' <<<"$d"; then
    echo "$d"
    echo "quickstart: the stuck rollout is described [${SECONDS}s]"
    exit 0
  fi
  sleep 2
done
kubectl describe nc prod
echo "quickstart: the stuck rollout never showed ReplacingPod, PodNotReady and the pull error" >&2
exit 1
