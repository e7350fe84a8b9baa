#!/usr/bin/env bash
# Fan-out off the produce hot path (SPEC §5.1): runs the shared bench harness's produce and
# full-flow workloads against one node with 0, 1, 4 and 16 fan-out children attached to the
# harness's topic, back to back in one run, and prints the harness's report plus the worst
# child lag seen while the load ran.
#
# The harness creates a fresh topic per workload, so a watcher attaches the children the
# moment that topic appears (detaching them from the previous one); the few messages
# produced before the attach are not copied, which does not matter for throughput.
#
#   NARAD_BIN=target/release/narad BENCH=/path/to/narad-peer-bench e2e/bench/fanout.sh
#
# Knobs: see common.sh; CHILDREN ("0 1 4 16").
set -euo pipefail
source "$(dirname "$0")/common.sh"
CHILDREN=${CHILDREN:-0 1 4 16}
api=127.0.0.1:18945
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# The watcher: attaches children c<n>-0..c<n>-(n-1) to every new bench topic and samples
# their lag until it is killed; prints the largest lag per bench topic as it goes.
cat >"$work/watch.py" <<'EOF'
import json, signal, sys, time, urllib.request
base, n = sys.argv[1], int(sys.argv[2])
children = [f"c{n}-{i}" for i in range(n)]
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
parent, worst, seen = None, 0, None
def done(*_):
    if parent:
        print(f"{parent}: worst child lag {worst} messages", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    _, ts = call("GET", "/v1/topics")
    names = {t["name"] for t in (ts or {}).get("topics", []) if t["name"].startswith("bench-")}
    if seen is None:
        seen = names
        print("ready", flush=True)
    fresh = sorted(names - seen)
    seen |= names
    newest = fresh[-1] if fresh else None
    if newest and n:
        if parent:
            print(f"{parent}: worst child lag {worst} messages", flush=True)
            for c in children:
                call("DELETE", f"/v1/topics/{parent}/children/{c}")
        for c in children:
            call("POST", f"/v1/topics/{newest}/children", {"child": c})
        parent, worst = newest, 0
    if parent:
        _, ch = call("GET", f"/v1/topics/{parent}/children")
        for c in (ch or {}).get("children", []):
            worst = max(worst, c.get("lag_messages", 0))
    time.sleep(0.2)
EOF

for pass in $(seq 1 "$PASSES"); do
    echo "== pass $pass"
    "$NARAD_BIN" server start --dev --addr "$api" --data-dir "$work/node-$pass" \
        >"$work/node-$pass.log" 2>&1 &
    pids+=($!)
    wait_ready "$api"
    for n in $CHILDREN; do
        for i in $(seq 0 $((n - 1))); do
            curl -sf -XPOST "http://$api/v1/topics" -H 'content-type: application/json' \
                -d "{\"name\":\"c$n-$i\",\"partitions\":3}" >/dev/null
        done
        python3 "$work/watch.py" "http://$api" "$n" >"$work/watch-$n.log" &
        watcher=$!
        # The watcher must know the topics that exist before the harness creates its own.
        until grep -q ready "$work/watch-$n.log"; do sleep 0.05; done
        run_bench "children-$n" "http://$api"
        sleep 1
        kill "$watcher"; wait "$watcher" 2>/dev/null || true
        grep -v ready "$work/watch-$n.log" || true
    done
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
done
"$BENCH" report "$out"
echo "results: $out"
