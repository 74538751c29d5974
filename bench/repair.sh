#!/usr/bin/env bash
# bench/repair.sh: time to repair a killed server under `agent run` while a download is
# in flight (issue 12), then the daemon's idle cost (bench/idle.sh).
#
# The plan is the quickstart (the fake SGLang, with its deliberate 1 s slow start, and a
# smoke test) plus a download of BLOB_MIB (default 64) MiB served on loopback at RATE_KIB
# (default 1024) KiB/s by bench/downloadserve, so the download is in flight throughout.
# Each of RUNS (default 5) runs starts `agent run` (resync interval 30 s: a repair owes
# nothing to it), waits until the server is verified, SIGKILLs the server's process
# group, and measures until the daemon counts the repair verified
# (agent_repairs_total). A fresh daemon per run (the previous one SIGKILLed, as a crash
# would) keeps each kill independent: kills seconds apart under one daemon are a crash
# loop, and back off by design. Printed per run: the wall time from the kill to the
# verified repair, the daemon's own time to repair (detection → verified,
# agent_time_to_repair_seconds) and the fake server's own start-to-ready time
# (launched_at → ready_at). A repair is verified only after the server stayed ready for
# its ready.settle (the quickstart keeps the default, 3 s), so the goal is on the agent's
# own share: the daemon's time less the server's start and the settle, under 0.5 s. Then bench/idle.sh IDLE_SECONDS (default
# 60; 0 skips it). Needs Go only.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
blob_mib=${BLOB_MIB:-64}
rate_kib=${RATE_KIB:-1024}
work=$(mktemp -d /tmp/agent-bench-repair.XXXXXX)
agent_pid="" serve_pid="" model_pid=""
cleanup() {
	[ -n "$agent_pid" ] && kill -9 "$agent_pid" 2>/dev/null || true
	[ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
	[ -n "$model_pid" ] && kill "$model_pid" 2>/dev/null || true
	pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$work/state/resources/server.qwen.json" 2>/dev/null | head -n1)
	[ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
go build -o "$work/agent" . && go build -o "$work/fake-sglang" ./internal/fakesglang && go build -o "$work/serve" ./bench/downloadserve
. examples/quickstart/model.sh
quickstart_model "$work" # the quickstart's own model directory, unpaced
mkdir -p "$work/srv" "$work/plan"
head -c $((blob_mib << 20)) /dev/urandom >"$work/srv/blob.bin"
sha=$(sha256sum "$work/srv/blob.bin" | cut -d' ' -f1)
"$work/serve" -dir "$work/srv" -rate $((rate_kib * 1024)) -port-file "$work/serve.port" &
serve_pid=$!
while [ ! -s "$work/serve.port" ]; do sleep 0.05; done
sport=$(cat "$work/serve.port")
cp examples/quickstart/quickstart.hcl "$work/plan/"
cat >"$work/plan/download.hcl" <<HCL
download "blob" {
  file "blob.bin" {
    url    = "http://127.0.0.1:$sport/blob.bin"
    sha256 = "$sha"
    size   = $((blob_mib << 20))
  }
  dest        = "\${var.root}/blobs"
  concurrency = 1
  connections = 1 # one paced stream, so the download stays in flight throughout
}
HCL
. bench/lib.sh
port=$(freeport) lport=$(freeport)

walls=() owns=() readies=()
for run in $(seq "$runs"); do
	"$work/agent" run "$work/plan" --state-dir "$work/state" --interval 30s --listen "127.0.0.1:$lport" --log-level warn \
		-var root="$work" -var fake_sglang="$work/fake-sglang" -var model_url="$model_url" -var port="$port" 2>>"$work/run.log" &
	agent_pid=$!
	healthy() { [ "$(metric 'agent_resource_healthy{resource="server.qwen"}')" = 1 ]; }
	until_for 120 "server.qwen verified (agent_resource_healthy)" healthy
	r0=$(metric 'agent_repairs_total{resource="server.qwen"}')
	s0=$(metric 'agent_time_to_repair_seconds_sum{resource="server.qwen"}')
	pid=$(record pid)
	t0=$(ms)
	kill -9 -- "-$pid"
	repaired() { [ "$(metric 'agent_repairs_total{resource="server.qwen"}')" != "$r0" ]; }
	until_for 120 "the repair counted (agent_repairs_total)" repaired
	t1=$(ms)
	s1=$(metric 'agent_time_to_repair_seconds_sum{resource="server.qwen"}')
	ready=$(python3 - "$work/state/resources/server.qwen.json" <<'PY'
import json, sys, datetime
r = json.load(open(sys.argv[1]))
p = lambda s: datetime.datetime.fromisoformat(s[:26].rstrip('Z'))
print(int((p(r["ready_at"]) - p(r["launched_at"])).total_seconds() * 1000))
PY
)
	sent=$(get "$sport" /_stats | tail -n1)
	[ "$sent" -lt $((blob_mib << 20)) ] || { echo "run $run: the download was no longer in flight ($sent bytes sent); raise BLOB_MIB" >&2; exit 1; }
	own=$(awk -v a="$s0" -v b="$s1" 'BEGIN {printf "%d", (b - a) * 1000}')
	walls+=($((t1 - t0))) owns+=("$own") readies+=("$ready")
	echo "run $run: killed pid $pid; repaired and verified in $((t1 - t0)) ms (daemon's own detection → verified: $own ms; the fake server's start-to-ready: $ready ms); download in flight: $((sent >> 20)) of $blob_mib MiB sent"
	kill -9 "$agent_pid"
	wait "$agent_pid" 2>/dev/null || true
	agent_pid=""
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
max() { printf '%s\n' "$@" | sort -n | tail -n1; }
settle_ms=3000 # the quickstart's ready block keeps the default ready.settle (3 s)
shares=()
for i in "${!owns[@]}"; do shares+=($((owns[i] - readies[i] - settle_ms))); done
echo "time to repair under agent run, download in flight, $runs runs: median $(median "${walls[@]}") ms, max $(max "${walls[@]}") ms; daemon's own median $(median "${owns[@]}") ms, of which the fake server's start-to-ready median $(median "${readies[@]}") ms and ready.settle $settle_ms ms; the agent's own share median $(median "${shares[@]}") ms (goal < 500 ms)"
kill "$serve_pid" 2>/dev/null || true
serve_pid=""
if [ "${IDLE_SECONDS:-60}" != 0 ]; then
	bench/idle.sh "${IDLE_SECONDS:-60}"
fi
