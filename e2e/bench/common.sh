# Shared by the bench scripts here: their knobs, a work dir, and helpers. Sourced, not run.
# Knobs: PASSES (2), DURATION (6), PAYLOAD (256), PRODUCERS (32), CONSUMERS (32).
NARAD_BIN=${NARAD_BIN:?path to the narad binary}
BENCH=${BENCH:?path to narad-peer-bench (build ../shared/bench)}
PASSES=${PASSES:-2}
DURATION=${DURATION:-6}
PAYLOAD=${PAYLOAD:-256}
PRODUCERS=${PRODUCERS:-32}
CONSUMERS=${CONSUMERS:-32}
work=$(mktemp -d)
out=$work/results.jsonl

# Waits until the node at HOST:PORT answers /readyz.
wait_ready() {
    for _ in $(seq 1 300); do
        curl -sf "http://$1/readyz" >/dev/null && return 0
        sleep 0.1
    done
    echo "node $1 not ready" >&2
    return 1
}

# Runs the harness's Narad produce and full-flow workloads: run_bench LABEL URL.
run_bench() {
    "$BENCH" run --system narad --url "$2" --label "$1" --workload produce,flow \
        --payload "$PAYLOAD" --producers "$PRODUCERS" --consumers "$CONSUMERS" \
        --duration "$DURATION" --json-out "$out"
}
