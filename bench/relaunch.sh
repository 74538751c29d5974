#!/usr/bin/env bash
# bench/relaunch.sh: what warming the weights before a planned stop saves (issue 39).
# A server on MIB of fake weights (the fake SGLang in load mode reads every page of its
# checkpoint at start, as SGLang's loader does) takes a flag change, RUNS times in each of:
#   cold, warm-up on   the weights evicted (posix_fadvise DONTNEED) before the change
#   cold, warm-up off  the same with warm { enabled = false }
#   warm               the weights already in the page cache, warm-up on
# The serving gap is measured from outside: /health sampled every SAMPLE_MS (50) ms, from the last 200
# of the old generation to the first 200 of the new. Prints the medians, the ratios to the
# warm case (goal: cold with warm-up within 1.2×) and what a warm-up on warm weights read
# (goal: under 1 % of the bytes).
# Usage: bench/relaunch.sh   (env RUNS=3, MIB=2048, SHARDS=4, SAMPLE_MS=50; needs Go and python3)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3} mib=${MIB:-2048} shards=${SHARDS:-4} sample_ms=${SAMPLE_MS:-50}
work=$(mktemp -d /var/tmp/agent-bench-relaunch.XXXXXX) # on disk: a tmpfs is never evicted
. bench/lib.sh
sampler=""
cleanup() {
	[ -n "$sampler" ] && kill "$sampler" 2>/dev/null
	pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$work/state/resources/server.qwen.json" 2>/dev/null | head -n1)
	[ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
go build -o "$work/agent" . && go build -o "$work/fake-sglang" ./internal/fakesglang && go build -o "$work/weights" ./bench/weights
"$work/weights" write "$work/model" "$mib" "$shards"
port=$(freeport)
cat >"$work/plan.hcl" <<HCL
variable "mem" { default = 0.8 }
variable "warm" { default = true }
server "qwen" {
  command = ["$work/fake-sglang"]
  flags = {
    "model-path"          = "$work/model"
    "port"                = $port
    "mem-fraction-static" = var.mem
  }
  env = { FAKE_SGLANG = "load", FAKE_SGLANG_DECODE_INTERVAL = "1s" }
  ready {
    http    = "/health"
    timeout = "5m"
    settle  = "0s"
  }
  stop {
    timeout = "5s"
  }
  warm {
    enabled = var.warm
  }
  log_dir = "$work/logs"
}
HCL
agent() { "$work/agent" "$@" --state-dir "$work/state"; }

# The sampler: one line per probe, "MS OK" (OK 1 for a 200).
python3 - "$port" "$sample_ms" >"$work/samples" <<'PY' &
import sys, time, urllib.request
url = "http://127.0.0.1:%s/health" % sys.argv[1]
every = int(sys.argv[2]) / 1000
while True:
    t = time.time()
    try:
        ok = urllib.request.urlopen(url, timeout=1).status == 200
    except Exception:
        ok = False
    print(int(t * 1000), int(ok), flush=True)
    time.sleep(max(0, every - (time.time() - t)))
PY
sampler=$!

# gap FROM TO: the serving gap within [FROM, TO] ms: from the last 200 before the first
# failed probe to the first 200 after the last one ("- " when no probe failed: the
# sampler missed the gap, and the run says so).
gap() {
	awk -v from="$1" -v to="$2" '$1 < from || $1 > to { next }
		$2 == 1 && !failed { before = $1 } $2 == 0 { failed = 1; after = 0 } $2 == 1 && failed && !after { after = $1 }
		END { if (failed && before && after) print after - before; else print "-" }' "$work/samples"
}
# warmfig KEY: the new generation's warm-up figure.
warmfig() { python3 -c 'import json,sys; w=json.load(open(sys.argv[1])).get("warm") or {}; print(w.get(sys.argv[2], 0))' "$work/state/resources/server.qwen.json" "$1"; }
# startms: the new generation's own start, launched to ready, from its record.
startms() {
	python3 - "$work/state/resources/server.qwen.json" <<'PY'
import json, sys, datetime
r = json.load(open(sys.argv[1]))
p = lambda s: datetime.datetime.fromisoformat(s[:26].rstrip('Z'))
print(int((p(r["ready_at"]) - p(r["launched_at"])).total_seconds() * 1000))
PY
}
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

mem=0.8
agent apply "$work/plan.hcl" -var mem=$mem >/dev/null
sampled() { grep -q ' 1$' "$work/samples"; }
until_for 60 "the sampler's first answer" sampled # python starts slowly on a loaded machine
declare -A gaps
warm_read=() warm_total=0
for r in $(seq "$runs"); do
	for mode in cold-on cold-off warm; do
		case $mode in
		cold-*) "$work/weights" evict "$work/model" ;;
		warm) cat "$work/model"/* >/dev/null ;;
		esac
		read -r res total < <("$work/weights" resident "$work/model")
		w=true
		[ "$mode" = cold-off ] && w=false
		if [ "$mem" = 0.8 ]; then mem=0.85; else mem=0.8; fi
		sleep 0.3 # a few samples of the old generation first
		t0=$(ms)
		agent apply "$work/plan.hcl" -var mem=$mem -var warm=$w >/dev/null
		until_for 30 "the new generation's /health" get "$port" /health >/dev/null
		sleep 0.3
		t1=$(ms)
		g=$(gap "$t0" "$t1")
		[ "$g" != - ] && gaps[$mode]+="$g " # "-": the sampler missed the gap, not counted
		line="run $r $mode: resident before $((res >> 20)) of $((total >> 20)) MiB, serving gap $g ms (the new generation's start $(startms) ms), apply $((t1 - t0 - 300)) ms"
		if [ "$w" = true ]; then
			line+=", warm-up read $(($(warmfig read) >> 20)) MiB in $(warmfig seconds) s"
		fi
		[ "$mode" = warm ] && warm_read+=("$(warmfig read)") && warm_total=$total
		echo "$line"
		[ -n "${KEEP:-}" ] && echo "  window $t0..$t1"
	done
done
for mode in cold-on cold-off warm; do
	[ -n "${gaps[$mode]:-}" ] || { echo "no run of $mode measured a gap (the sampler missed every one)" >&2; exit 1; }
done
on=$(median ${gaps[cold-on]}) off=$(median ${gaps[cold-off]}) hot=$(median ${gaps[warm]})
echo "serving gap, median of $runs ($mib MiB in $shards shards, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)):"
echo "  warm weights:          $hot ms"
echo "  cold, warm-up on:      $on ms ($(python3 -c "print('%.2f' % ($on / $hot))")× warm; goal ≤ 1.2×)"
echo "  cold, warm-up off:     $off ms ($(python3 -c "print('%.2f' % ($off / $hot))")× warm)"
most=$(printf '%s\n' "${warm_read[@]}" | sort -n | tail -n1)
echo "  warm-up on warm weights: read median $(median "${warm_read[@]}") bytes, at most $most of $warm_total ($(python3 -c "print('%.3f' % (100 * $most / $warm_total))") %; goal < 1 %)"
