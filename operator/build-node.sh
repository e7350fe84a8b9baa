#!/usr/bin/env bash
# operator/build-node.sh OUT: ../shared/k8s-node/build-node.sh OUT, judged by its outputs.
# That script ends with `etcd --version | head -1` under `set -o pipefail`: when head exits
# before etcd writes its second line, etcd dies of SIGPIPE and the script fails although
# everything was built (likelier at idle priority). So a failed run whose binaries and images
# are all there counts as built; anything missing is a failure, with the script's output.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
out=$1
node="$(cd "$(dirname "$0")/../.." && pwd)/shared/k8s-node"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

complete() {
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl \
           etcd pause helm; do
    [ -x "$out/bin/$b" ] || { echo "node build: $out/bin/$b is missing"; return 1; }
  done
  [ -f "$out/bin/pause.tag" ] && docker image inspect "k8s-node/pause:$(cat "$out/bin/pause.tag")" \
    k8s-node/busybox:1.35 >/dev/null 2>&1 || { echo "node build: its images are missing"; return 1; }
}

if bash "$node/build-node.sh" "$out" >"$log" 2>&1; then
  tail -n 3 "$log"
elif complete; then
  tail -n 3 "$log"
  echo "node build: the script failed at its closing version check; every output is there"
else
  tail -n 60 "$log"; exit 1
fi
