#!/usr/bin/env bash
# Runs the shared bench harness's Narad workloads against one node with security off and one
# with security on (HTTP Basic on every request, credentials in the URL), back to back in one
# run, and prints the harness's report (SPEC §4: security must not cost the hot path).
#
#   NARAD_BIN=target/release/narad BENCH=/path/to/narad-peer-bench e2e/bench/security-on-off.sh
#
# Knobs: see common.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true; }
trap cleanup EXIT

for pass in $(seq 1 "$PASSES"); do
    for mode in off on; do
        echo "== pass $pass: security $mode"
        if [ "$mode" = off ]; then
            "$NARAD_BIN" server start --dev --addr 127.0.0.1:18970 --data-dir "$work/$mode-$pass" \
                >"$work/$mode-$pass.log" 2>&1 &
            url=http://127.0.0.1:18970
        else
            NARAD_ADMIN_PASSWORD=bench-secret "$NARAD_BIN" server start --addr 127.0.0.1:18970 \
                --data-dir "$work/$mode-$pass" >"$work/$mode-$pass.log" 2>&1 &
            url=http://admin:bench-secret@127.0.0.1:18970
        fi
        pid=$!
        wait_ready 127.0.0.1:18970
        run_bench "security-$mode" "$url"
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
    done
done
"$BENCH" report "$out"
echo "results: $out"
