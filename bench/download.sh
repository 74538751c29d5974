#!/usr/bin/env bash
# Download benchmark (issue 3, point 7): the agent against curl and aria2c on loopback.
#
#   bench/download.sh                       # 1 × 4 GiB and 8 × 512 MiB
#   BIG_MIB=256 SMALL_MIB=32 bench/download.sh   # a quick run
#
# Prints throughput per tool and the ratios, the agent's peak RSS (GNU time's maximum
# resident set size), and the bytes fetched again after the agent is SIGKILLed at 45% of
# the big file (the default checkpoint is 64 MiB; the server counts bytes it wrote, so what
# was in the loopback socket buffers when the agent died counts as fetched again).
# Env: BIG_MIB (4096), SMALL_MIB (512), SMALL_N (8), CONCURRENCY (4), WORK (a temp dir).
set -euo pipefail

BIG_MIB=${BIG_MIB:-4096}
SMALL_MIB=${SMALL_MIB:-512}
SMALL_N=${SMALL_N:-8}
CONCURRENCY=${CONCURRENCY:-4}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/agent-bench.XXXXXX)}
mkdir -p "$WORK"/src
SERVER_PID=
cleanup() {
	[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
	[ -z "${KEEP:-}" ] && rm -rf "$WORK"
}
trap cleanup EXIT

for tool in curl aria2c /usr/bin/time; do
	command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install -y curl aria2 time)" >&2; exit 1; }
done

echo "== build"
(cd "$ROOT" && CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations} go build -o "$WORK/agent" . && go build -o "$WORK/serve" ./bench/downloadserve)

echo "== data: 1 × ${BIG_MIB} MiB, ${SMALL_N} × ${SMALL_MIB} MiB (urandom)"
head -c $((BIG_MIB << 20)) /dev/urandom >"$WORK/src/big.bin"
for i in $(seq 1 "$SMALL_N"); do head -c $((SMALL_MIB << 20)) /dev/urandom >"$WORK/src/part-$i.bin"; done
(cd "$WORK/src" && sha256sum ./*.bin >"$WORK/sums")
sync

"$WORK/serve" -dir "$WORK/src" -port-file "$WORK/port" &
SERVER_PID=$!
for _ in $(seq 50); do [ -s "$WORK/port" ] && break; sleep 0.1; done
BASE="http://127.0.0.1:$(cat "$WORK/port")"
stats() { curl -s "$BASE/_stats"; }

# plan NAME FILES... writes a plan downloading FILES into $WORK/out/NAME.
plan() {
	local name=$1; shift
	{
		echo "download \"$name\" {"
		echo "  dest        = \"$WORK/out/$name\""
		echo "  concurrency = $CONCURRENCY"
		for f in "$@"; do
			local sum size
			sum=$(awk -v f="./$f" '$2 == f {print $1}' "$WORK/sums")
			size=$(stat -c %s "$WORK/src/$f")
			printf '  file "%s" {\n    url    = "%s/%s"\n    sha256 = "%s"\n    size   = %s\n  }\n' "$f" "$BASE" "$f" "$sum" "$size"
		done
		echo "}"
	} >"$WORK/$name.hcl"
}

now() { date +%s.%N; }
# timed LABEL CMD...: runs CMD with a cold destination, prints seconds.
timed() {
	local label=$1; shift
	rm -rf "$WORK/out" "$WORK/state"; mkdir -p "$WORK/out"; sync
	local t0 t1
	t0=$(now)
	"$@" >"$WORK/$label.log" 2>&1 || { echo "$label failed:" >&2; cat "$WORK/$label.log" >&2; exit 1; }
	t1=$(now)
	echo "$t1 - $t0" | bc -l
}
mibs() { echo "scale=1; $1 / $2" | bc -l; }
ratio() { echo "scale=2; $1 / $2" | bc -l; }
rss() { awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2/1024}' "$1"; }

SMALL_FILES=$(cd "$WORK/src" && ls part-*.bin)
plan big big.bin
# shellcheck disable=SC2086
plan set $SMALL_FILES
BIG_TOTAL=$BIG_MIB
SET_TOTAL=$((SMALL_MIB * SMALL_N))

echo "== single file (${BIG_MIB} MiB)"
t_curl_big=$(timed curl-big curl -sf -o "$WORK/out/big.bin" "$BASE/big.bin")
t_aria_big=$(timed aria2-big aria2c -q -x1 -s1 --file-allocation=none --check-integrity=false -d "$WORK/out" "$BASE/big.bin")
t_agent_big=$(timed agent-big /usr/bin/time -v -o "$WORK/time-big" "$WORK/agent" apply "$WORK/big.hcl" --state-dir "$WORK/state")

echo "== set (${SMALL_N} × ${SMALL_MIB} MiB, ${CONCURRENCY} at once)"
urls=(); for f in $SMALL_FILES; do urls+=("$BASE/$f"); done
curl_args=(); for f in $SMALL_FILES; do curl_args+=(-o "$WORK/out/$f" "$BASE/$f"); done
t_curl_set=$(timed curl-set curl -sf --parallel --parallel-max "$CONCURRENCY" "${curl_args[@]}")
printf '%s\n' "${urls[@]}" >"$WORK/urls"
t_aria_set=$(timed aria2-set aria2c -q -j "$CONCURRENCY" -x1 -s1 --file-allocation=none -d "$WORK/out" -i "$WORK/urls")
t_agent_set=$(timed agent-set /usr/bin/time -v -o "$WORK/time-set" "$WORK/agent" apply "$WORK/set.hcl" --state-dir "$WORK/state")

echo "== SIGKILL in the middle of the big file, then resume"
rm -rf "$WORK/out" "$WORK/state"; mkdir -p "$WORK/out"
before=$(stats)
"$WORK/agent" apply "$WORK/big.hcl" --state-dir "$WORK/state" >"$WORK/kill.log" 2>&1 &
apid=$!
# Kill at 45%: not on a checkpoint boundary.
half=$(((BIG_MIB << 20) * 45 / 100))
while kill -0 "$apid" 2>/dev/null; do
	s=$(stat -c %s "$WORK/out/big/.big.bin.partial" 2>/dev/null || echo 0)
	[ "$s" -ge "$half" ] && break
	sleep 0.05
done
kill -9 "$apid" 2>/dev/null || true
wait "$apid" 2>/dev/null || true
killed_at=$(( $(stats) - before ))
"$WORK/agent" apply "$WORK/big.hcl" --state-dir "$WORK/state" >>"$WORK/kill.log" 2>&1
(cd "$WORK/out/big" && sha256sum -c --quiet <(awk '$2 == "./big.bin"' "$WORK/sums"))
refetched=$(( $(stats) - before - (BIG_MIB << 20) ))

echo
echo "== results (loopback, $(nproc) cores)"
printf '%-34s %8s s  %8s MiB/s\n' \
	"single: curl" "$t_curl_big" "$(mibs $BIG_TOTAL "$t_curl_big")" \
	"single: aria2c" "$t_aria_big" "$(mibs $BIG_TOTAL "$t_aria_big")" \
	"single: agent (incl. sha256)" "$t_agent_big" "$(mibs $BIG_TOTAL "$t_agent_big")" \
	"set: curl --parallel" "$t_curl_set" "$(mibs $SET_TOTAL "$t_curl_set")" \
	"set: aria2c -j" "$t_aria_set" "$(mibs $SET_TOTAL "$t_aria_set")" \
	"set: agent (incl. sha256)" "$t_agent_set" "$(mibs $SET_TOTAL "$t_agent_set")"
echo "ratio single agent/curl:   $(ratio "$t_curl_big" "$t_agent_big")   (target ≥ 0.9)"
echo "ratio single agent/aria2c: $(ratio "$t_aria_big" "$t_agent_big")"
echo "ratio set agent/aria2c:    $(ratio "$t_aria_set" "$t_agent_set")   (target ≥ 1.0)"
echo "ratio set agent/curl:      $(ratio "$t_curl_set" "$t_agent_set")"
echo "agent peak RSS: single $(rss "$WORK/time-big") MiB, set $(rss "$WORK/time-set") MiB   (target < 64)"
echo "SIGKILL at $((killed_at >> 20)) MiB sent; bytes fetched again after restart: $refetched ($((refetched >> 20)) MiB; checkpoint 64 MiB)"
