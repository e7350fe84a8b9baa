#!/usr/bin/env bash
# Runs the shared bench harness's Narad workloads against one node and against a three-node
# cluster on this machine (all nodes on the same cores), back to back in one run, and prints
# the harness's report. Producers and consumers reach the cluster through one node (the
# harness takes one URL), so 2/3 of the commits cross node RPC and consumers probe remote
# owners: the worst case for the cluster.
#
#   NARAD_BIN=target/release/narad BENCH=/path/to/narad-peer-bench e2e/bench/cluster-vs-single.sh
#
# Knobs: see common.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

for pass in $(seq 1 "$PASSES"); do
    echo "== pass $pass: single node"
    "$NARAD_BIN" server start --dev --addr 127.0.0.1:18940 --data-dir "$work/single-$pass" \
        >"$work/single-$pass.log" 2>&1 &
    pids+=($!)
    wait_ready 127.0.0.1:18940
    run_bench single-node http://127.0.0.1:18940
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

    echo "== pass $pass: three-node cluster, clients on n0"
    peers=n0@127.0.0.1:18960,n1@127.0.0.1:18961,n2@127.0.0.1:18962
    first=${#pids[@]}
    for i in 0 1 2; do
        NARAD_SECURITY_ENABLED=false "$NARAD_BIN" server start --node-id "n$i" \
            --addr "127.0.0.1:1895$i" --cluster-addr "127.0.0.1:1896$i" \
            --data-dir "$work/cluster-$pass-n$i" --peers "$peers" \
            >"$work/cluster-$pass-n$i.log" 2>&1 &
        pids+=($!)
    done
    for i in 0 1 2; do wait_ready "127.0.0.1:1895$i"; done
    run_bench cluster-3-nodes http://127.0.0.1:18950
    for p in "${pids[@]:$first}"; do kill "$p"; done
    wait 2>/dev/null || true
done
"$BENCH" report "$out"
echo "results: $out"
