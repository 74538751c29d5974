#!/usr/bin/env bash
# bench/idle.sh: the daemon's idle cost. Runs `agent run` on the converged quickstart plan
# with --interval 10s for DURATION seconds (default 60) and prints its CPU share (user +
# system ticks from /proc/PID/stat over wall time) and its RSS (VmRSS at the end, VmHWM
# peak). Targets: under 0.5% of a core and under 40 MiB. Needs Go only.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-60}
work=$(mktemp -d /tmp/agent-bench-idle.XXXXXX)
agent_pid="" model_pid=""
cleanup() {
	[ -n "$agent_pid" ] && kill -TERM "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
	pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$work/state/resources/server.qwen.json" 2>/dev/null | head -n1)
	[ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null || true
	[ -n "$model_pid" ] && kill "$model_pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
go build -o "$work/agent" . && go build -o "$work/fake-sglang" ./internal/fakesglang
. examples/quickstart/model.sh
quickstart_model "$work" # the quickstart's model directory on a loopback port
port=${PORT:-30199}
vars=(--state-dir "$work/state" -var root="$work" -var fake_sglang="$work/fake-sglang" -var model_url="$model_url" -var port="$port")
"$work/agent" apply examples/quickstart "${vars[@]}" >/dev/null
"$work/agent" run examples/quickstart "${vars[@]}" --interval 10s --listen 127.0.0.1:0 --log-level warn 2>"$work/run.log" &
agent_pid=$!
sleep 5 # the first pass
ticks() { awk '{print $14 + $15}' "/proc/$agent_pid/stat"; }
t0=$(ticks); s0=$(date +%s%N)
sleep "$duration"
t1=$(ticks); s1=$(date +%s%N)
hz=$(getconf CLK_TCK)
cpu=$(awk -v t=$((t1 - t0)) -v hz="$hz" -v ns=$((s1 - s0)) 'BEGIN {printf "%.3f", 100 * (t / hz) / (ns / 1e9)}')
rss=$(awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$agent_pid/status")
hwm=$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$agent_pid/status")
echo "agent run, interval 10s, ${duration}s idle: CPU ${cpu}% of a core (target < 0.5%), RSS ${rss} MiB, peak ${hwm} MiB (target < 40 MiB)"
