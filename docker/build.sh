#!/usr/bin/env bash
# Builds the broker and operator images without pulling any base image: static musl
# binaries (needs `rustup target add x86_64-unknown-linux-musl` and Debian's musl-tools
# for the C parts: mimalloc, ring), staged into a scratch context with the host's CA
# bundle. Usage: docker/build.sh [narad|operator|all] [TAG]   (PROFILE=release by default)
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"; tag="${2:-$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)}"
profile="${PROFILE:-release}"
target=x86_64-unknown-linux-musl
command -v musl-gcc >/dev/null || { echo "musl-gcc missing: apt-get install musl-tools" >&2; exit 1; }
export CC_x86_64_unknown_linux_musl=musl-gcc
tdir="${CARGO_TARGET_DIR:-target}"

stage() { # stage <context-dir> <binary>
  local ctx="$1" bin="$2"
  rm -rf "$ctx"; mkdir -p "$ctx"/{bin,etc/ssl/certs,var/lib/narad,tmp}
  local pdir="$profile"; [ "$profile" = dev ] && pdir=debug
  cp "$tdir/$target/$pdir/$bin" "$ctx/bin/"
  strip "$ctx/bin/$bin"
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/etc/ssl/certs/"
  echo "narad:x:10001:10001:narad:/var/lib/narad:/sbin/nologin" > "$ctx/etc/passwd"
  echo "narad:x:10001:" > "$ctx/etc/group"
}

if [ "$what" = narad ] || [ "$what" = all ]; then
  cargo build --profile "$profile" --target "$target" -p narad --bin narad
  stage "$tdir/docker-narad" narad
  docker build -f docker/narad.Dockerfile -t "narad:$tag" "$tdir/docker-narad"
fi
if [ "$what" = operator ] || [ "$what" = all ]; then
  cargo build --profile "$profile" --target "$target" -p narad-operator --bin narad-operator
  stage "$tdir/docker-operator" narad-operator
  docker build -f docker/operator.Dockerfile -t "narad-operator:$tag" "$tdir/docker-operator"
fi
