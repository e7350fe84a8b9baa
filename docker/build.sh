#!/usr/bin/env bash
# Builds the broker and operator images without pulling any base image (FROM scratch).
# Usage: docker/build.sh [narad|operator|all] [TAG]   (PROFILE=release by default)
#
# Release default: static musl binaries (needs `rustup target add x86_64-unknown-linux-musl`
# and Debian's musl-tools for the C parts: mimalloc, ring), staged with the host's CA bundle.
#
# NARAD_IMAGE_BINARIES=host: no second compile; stages the host's (glibc) binaries from
# NARAD_IMAGE_BIN_DIR (default $CARGO_TARGET_DIR/<profile>, built beforehand, e.g. by
# `cargo build --release --workspace`) plus exactly the shared libraries `ldd` lists for
# them (Debian's libc6 and libgcc-s1, with the dynamic loader) at their host paths. CI builds
# its images this way (a musl build of both binaries costs a second full compile).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"; tag="${2:-$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)}"
profile="${PROFILE:-release}"
pdir="$profile"; [ "$profile" = dev ] && pdir=debug
mode="${NARAD_IMAGE_BINARIES:-musl}"
target=x86_64-unknown-linux-musl
tdir="${CARGO_TARGET_DIR:-target}"
case "$mode" in
  musl)
    command -v musl-gcc >/dev/null || { echo "musl-gcc missing: apt-get install musl-tools" >&2; exit 1; }
    export CC_x86_64_unknown_linux_musl=musl-gcc
    bindir="$tdir/$target/$pdir" ;;
  host) bindir="${NARAD_IMAGE_BIN_DIR:-$tdir/$pdir}" ;;
  *) echo "NARAD_IMAGE_BINARIES must be musl or host, not $mode" >&2; exit 2 ;;
esac

# stage <context-dir> <binary>: rootfs/ (copied to /), data/ and tmp/ (owned by 10001).
stage() {
  local ctx="$1" bin="$2"
  rm -rf "$ctx"; mkdir -p "$ctx"/rootfs/{usr/local/bin,etc/ssl/certs} "$ctx"/{data,tmp}
  [ -x "$bindir/$bin" ] || { echo "$bindir/$bin missing (build it first)" >&2; exit 1; }
  cp "$bindir/$bin" "$ctx/rootfs/usr/local/bin/"
  strip "$ctx/rootfs/usr/local/bin/$bin"
  if [ "$mode" = host ]; then
    # Exactly what the dynamic loader needs: the absolute paths in ldd's output (the
    # loader itself included), symlinks resolved.
    local libs
    libs=$(ldd "$bindir/$bin" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i}')
    for lib in $libs; do
      mkdir -p "$ctx/rootfs$(dirname "$lib")"
      cp -L "$lib" "$ctx/rootfs$lib"
    done
  fi
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/rootfs/etc/ssl/certs/"
  echo "narad:x:10001:10001:narad:/var/lib/narad:/sbin/nologin" > "$ctx/rootfs/etc/passwd"
  echo "narad:x:10001:" > "$ctx/rootfs/etc/group"
}

build() { # build <package> <binary> <image> <dockerfile>
  if [ "$mode" = musl ]; then
    cargo build --profile "$profile" --target "$target" -p "$1" --bin "$2"
  fi
  stage "$tdir/docker-$2" "$2"
  docker build -q -f "docker/$4.Dockerfile" -t "$3:$tag" "$tdir/docker-$2"
  echo "built $3:$tag ($mode binaries)"
}

if [ "$what" = narad ] || [ "$what" = all ]; then
  build narad narad narad narad
fi
if [ "$what" = operator ] || [ "$what" = all ]; then
  build narad-operator narad-operator narad-operator operator
fi
