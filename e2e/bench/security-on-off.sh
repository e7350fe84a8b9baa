#!/usr/bin/env bash
# Runs the shared bench harness's Narad workloads against one node with security off and one
# with security on (HTTP Basic on every request, credentials in the URL), back to back in one
# run, and prints the harness's report (SPEC §4: security must not cost the hot path).
#
#   NARAD_BIN=target/release/narad BENCH=/path/to/narad-peer-bench e2e/bench/security-on-off.sh
#
# Knobs: PASSES (2), DURATION (6), PAYLOAD (256), PRODUCERS (32), CONSUMERS (32).
set -euo pipefail
NARAD_BIN=${NARAD_BIN:?path to the narad binary}
BENCH=${BENCH:?path to narad-peer-bench (build ../shared/bench)}
PASSES=${PASSES:-2}
DURATION=${DURATION:-6}
PAYLOAD=${PAYLOAD:-256}
PRODUCERS=${PRODUCERS:-32}
CONSUMERS=${CONSUMERS:-32}
work=$(mktemp -d)
out=$work/results.jsonl
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true; }
trap cleanup EXIT

wait_ready() {
    for _ in $(seq 1 300); do
        curl -sf "http://$1/readyz" >/dev/null && return 0
        sleep 0.1
    done
    echo "node $1 not ready" >&2
    return 1
}

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
        "$BENCH" run --system narad --url "$url" --label "security-$mode" --workload produce,flow \
            --payload "$PAYLOAD" --producers "$PRODUCERS" --consumers "$CONSUMERS" \
            --duration "$DURATION" --json-out "$out"
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
    done
done
"$BENCH" report "$out"
echo "results: $out"
