#!/usr/bin/env bash
# bench/server.sh: the agent's own overhead around a server, on the quickstart plan.
#   - a no-op `agent plan` of the converged quickstart (whole process: start, load the
#     plan, observe 2 resources, print), median of N runs; target < 50 ms;
#   - a relaunch on a changed flag: the apply's wall time minus the fake server's own
#     start-to-ready time (launched_at → ready_at in the state record, which includes its
#     deliberate 1 s slow start) — what remains is the agent: the verified stop (signal,
#     wait, port free, GPU release), the new log generation, the alive/log checks, the
#     smoke test and the verification plan; target < 300 ms.
# Usage: bench/server.sh [RUNS]   (needs Go; no GPU, no network)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
work=$(mktemp -d /tmp/agent-bench-server.XXXXXX)
model_pid=""
trap 'pid=$(sed -n "s/.*\"pid\": *\([0-9]*\).*/\1/p" "$work/state/resources/server.qwen.json" 2>/dev/null | head -n1); [ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null; [ -n "$model_pid" ] && kill "$model_pid" 2>/dev/null; rm -rf "$work"' EXIT
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
go build -o "$work/agent" . && go build -o "$work/fake-sglang" ./internal/fakesglang
. examples/quickstart/model.sh
quickstart_model "$work" # the quickstart's model directory on a loopback port
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 30177)
agent() { "$work/agent" "$@" --state-dir "$work/state" -var root="$work" -var fake_sglang="$work/fake-sglang" -var model_url="$model_url" -var port="$port"; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

agent apply examples/quickstart >/dev/null

times=()
for _ in $(seq "$runs"); do
	t0=$(ms); agent plan examples/quickstart >/dev/null; t1=$(ms)
	times+=($((t1 - t0)))
done
noop=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')

over=()
mem=0.85
for i in $(seq 5); do
	if [ "$mem" = 0.85 ]; then mem=0.8; else mem=0.85; fi
	t0=$(ms); agent apply examples/quickstart -var mem_fraction=$mem >/dev/null; t1=$(ms)
	server=$(python3 - "$work/state/resources/server.qwen.json" <<'PY' 2>/dev/null || echo 0
import json, sys, datetime
r = json.load(open(sys.argv[1]))
p = lambda s: datetime.datetime.fromisoformat(s[:26].rstrip('Z'))
print(int((p(r["ready_at"]) - p(r["launched_at"])).total_seconds() * 1000))
PY
)
	over+=($((t1 - t0 - server)))
	echo "relaunch $i: apply $((t1 - t0)) ms, server's own start to ready $server ms, agent $((t1 - t0 - server)) ms"
done
relaunch=$(printf '%s\n' "${over[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "no-op plan (median of $runs): ${noop} ms (target < 50 ms)"
echo "relaunch overhead (median of 5): ${relaunch} ms (target < 300 ms)"
