#!/usr/bin/env bash
# Download benchmark (issues 3 and 15): the agent against aria2c and curl on loopback, each
# against the others in one run.
#
#   bench/download.sh                                  # full run
#   CAP_MIB=64 BIG_MIB=1024 MID_MIB=256 bench/download.sh   # a quick run
#
# 1. A capped CDN: CAP_N × CAP_MIB MiB from bench/downloadserve pacing each connection at
#    RATE_MIB MiB/s after DELAY of time to first byte (model CDNs cap each connection):
#    the agent (concurrency CAP_N, connections CONNECTIONS per file, at most MAX_CONNECTIONS)
#    vs `aria2c -x16 -s16 -j CAP_N` vs `curl --parallel`. The agent's peak RSS here is with
#    CAP_N × CONNECTIONS connections (32 by default).
# 2. Uncapped: one MID_MIB and one BIG_MIB file, the agent (start-up, sha256, fsync and rename
#    included) vs curl and vs curl followed by `sync` of its file (the agent makes its file
#    durable before the rename; curl does not).
# 3. SIGKILL of the agent at 45 % of the MID_MIB file, then a resume: the bytes fetched again.
# 4. Issue 28, on the same capped CDN and against the same aria2c: (a) the plan minus its
#    `size =` lines (sizes learned from HEAD, and from the first range where HEAD is refused);
#    (b) a straggler: the first connection paced at STRAG_KIB KiB/s (a sixteenth of the cap
#    by default), agent and aria2c each on a fresh count of connections; (c) a second host
#    with a mirror: the agent's capped-CDN result served by an uncapped downloadserve as
#    `mirrors`, the origin's bytes counted (goal <= 5 %); aria2c given both URLs per file.
#    ROUNDS rounds (default 3) of every command of (a)-(c) in turn, aria2c on the same
#    CDN included: the medians are compared, so a load that drifts during the run (a shared
#    machine) weighs on both sides.
# HOG=N starts N busy loops (one core each) beside every measurement: the same run under CPU
# contention (issue 39: is the learned-size path slower than the declared one there?).
# Needs curl, aria2c (Debian package aria2; the bench only, no test needs it), GNU time, bc;
# as root with apt-get, the script installs whichever is missing.
set -euo pipefail

CAP_N=${CAP_N:-4}
CAP_MIB=${CAP_MIB:-128}
RATE_MIB=${RATE_MIB:-16}
DELAY=${DELAY:-20ms}
CONNECTIONS=${CONNECTIONS:-8}
MAX_CONNECTIONS=${MAX_CONNECTIONS:-32}
MID_MIB=${MID_MIB:-512}
STRAG_KIB=${STRAG_KIB:-$((RATE_MIB * 1024 / 16))}
ROUNDS=${ROUNDS:-3}
BIG_MIB=${BIG_MIB:-4096}
HOG=${HOG:-0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/agent-bench.XXXXXX)}
mkdir -p "$WORK"/src
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

need() { for tool in curl aria2c /usr/bin/time bc; do command -v "$tool" >/dev/null || return 1; done; }
if ! need && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
	echo "== installing curl aria2 time bc (apt-get)"
	apt-get install -y -qq curl aria2 time bc >/dev/null 2>&1 ||
		{ apt-get update -qq >/dev/null && apt-get install -y -qq curl aria2 time bc >/dev/null; }
fi
for tool in curl aria2c /usr/bin/time bc; do
	command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install -y curl aria2 time bc)" >&2; exit 1; }
done

echo "== build"
(cd "$ROOT" && CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations} go build -o "$WORK/agent" . && go build -o "$WORK/serve" ./bench/downloadserve)

echo "== data: $CAP_N × ${CAP_MIB} MiB, ${MID_MIB} MiB, ${BIG_MIB} MiB (urandom)"
for i in $(seq 1 "$CAP_N"); do head -c $((CAP_MIB << 20)) /dev/urandom >"$WORK/src/shard-$i.bin"; done
head -c $((MID_MIB << 20)) /dev/urandom >"$WORK/src/mid.bin"
head -c $((BIG_MIB << 20)) /dev/urandom >"$WORK/src/big.bin"
(cd "$WORK/src" && sha256sum ./*.bin >"$WORK/sums")
sync

for _ in $(seq 1 "$HOG"); do
	sh -c 'while :; do :; done' &
	PIDS+=($!)
done
[ "$HOG" -gt 0 ] && echo "== $HOG busy loops beside every measurement"

# serve NAME ARGS...: starts downloadserve on the data, sets ${NAME}_BASE.
serve() {
	local name=$1; shift
	"$WORK/serve" -dir "$WORK/src" -port-file "$WORK/$name.port" "$@" &
	PIDS+=($!)
	for _ in $(seq 100); do [ -s "$WORK/$name.port" ] && break; sleep 0.1; done
	printf -v "${name}_BASE" 'http://127.0.0.1:%s' "$(cat "$WORK/$name.port")"
}
serve cdn -rate $((RATE_MIB << 20)) -delay "$DELAY"
serve nohead -rate $((RATE_MIB << 20)) -delay "$DELAY" -refuse-head
serve strag -rate $((RATE_MIB << 20)) -delay "$DELAY" -congested 1 -congested-rate $((STRAG_KIB << 10))
serve plain

# plan NAME BASE FILES... writes a plan downloading FILES from BASE into $WORK/out/NAME;
# NOSIZE=1 leaves out the sizes, MIRROR=URL adds `mirrors = [URL]`.
plan() {
	local name=$1 base=$2; shift 2
	{
		echo "download \"$name\" {"
		echo "  dest            = \"$WORK/out/$name\""
		echo "  concurrency     = $CAP_N"
		echo "  connections     = $CONNECTIONS"
		echo "  max_connections = $MAX_CONNECTIONS"
		[ -n "${MIRROR:-}" ] && echo "  mirrors         = [\"$MIRROR\"]"
		for f in "$@"; do
			local sum size
			sum=$(awk -v f="./$f" '$2 == f {print $1}' "$WORK/sums")
			size=$(stat -c %s "$WORK/src/$f")
			if [ -n "${NOSIZE:-}" ]; then
				printf '  file "%s" {\n    url    = "%s/%s"\n    sha256 = "%s"\n  }\n' "$f" "$base" "$f" "$sum"
			else
				printf '  file "%s" {\n    url    = "%s/%s"\n    sha256 = "%s"\n    size   = %s\n  }\n' "$f" "$base" "$f" "$sum" "$size"
			fi
		done
		echo "}"
	} >"$WORK/$name.hcl"
}

now() { date +%s.%N; }
# timed LABEL CMD...: runs CMD with an empty destination, prints seconds.
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
maxconns() { curl -s "$cdn_BASE/_maxconns"; }

SHARDS=$(cd "$WORK/src" && ls shard-*.bin)
# shellcheck disable=SC2086
plan cap "$cdn_BASE" $SHARDS
plan mid "$plain_BASE" mid.bin
plan big "$plain_BASE" big.bin
CAP_TOTAL=$((CAP_MIB * CAP_N))

echo "== capped CDN: $CAP_N × ${CAP_MIB} MiB, ${RATE_MIB} MiB/s per connection, ${DELAY} to first byte"
urls=(); for f in $SHARDS; do urls+=("$cdn_BASE/$f"); done
printf '%s\n' "${urls[@]}" >"$WORK/urls"
curl_args=(); for f in $SHARDS; do curl_args+=(-o "$WORK/out/$f" "$cdn_BASE/$f"); done
t_cap_agent=$(timed cap-agent /usr/bin/time -v -o "$WORK/time-cap" "$WORK/agent" apply "$WORK/cap.hcl" --state-dir "$WORK/state")
conns_agent=$(maxconns)
rm -rf "$WORK/mirror" && cp -a "$WORK/out/cap" "$WORK/mirror" # the first host's verified download
t_cap_aria=$(timed cap-aria2 aria2c -q -x16 -s16 -j "$CAP_N" --file-allocation=none -d "$WORK/out" -i "$WORK/urls")
t_cap_curl=$(timed cap-curl curl -sf --parallel --parallel-max "$CAP_N" "${curl_args[@]}")

echo "== issue 28: sizes learned, a straggler, a mirror (same CDN; straggler at ${STRAG_KIB} KiB/s)"
# shellcheck disable=SC2086
NOSIZE=1 plan capnosize "$cdn_BASE" $SHARDS
# shellcheck disable=SC2086
NOSIZE=1 plan capnohead "$nohead_BASE" $SHARDS
# shellcheck disable=SC2086
plan strag "$strag_BASE" $SHARDS
serve mirror -dir "$WORK/mirror"
# shellcheck disable=SC2086
MIRROR="$mirror_BASE" plan capmirror "$cdn_BASE" $SHARDS
surls=(); for f in $SHARDS; do surls+=("$strag_BASE/$f"); done
printf '%s\n' "${surls[@]}" >"$WORK/strag-urls"
: >"$WORK/mirror-urls"
for f in $SHARDS; do printf '%s/%s\t%s/%s\n' "$mirror_BASE" "$f" "$cdn_BASE" "$f" >>"$WORK/mirror-urls"; done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
r_aria=(); r_sized=(); r_nosize=(); r_nohead=(); r_strag=(); r_strag_aria=(); r_mirror=(); r_mirror_aria=()
o_agent=0; o_aria=0
for round in $(seq "$ROUNDS"); do
	echo "   round $round of $ROUNDS"
	r_aria+=("$(timed cap-aria2 aria2c -q -x16 -s16 -j "$CAP_N" --file-allocation=none -d "$WORK/out" -i "$WORK/urls")")
	r_sized+=("$(timed cap-agent "$WORK/agent" apply "$WORK/cap.hcl" --state-dir "$WORK/state")")
	r_nosize+=("$(timed nosize-agent "$WORK/agent" apply "$WORK/capnosize.hcl" --state-dir "$WORK/state")")
	r_nohead+=("$(timed nohead-agent "$WORK/agent" apply "$WORK/capnohead.hcl" --state-dir "$WORK/state")")
	curl -s "$strag_BASE/_reset" >/dev/null
	r_strag+=("$(timed strag-agent "$WORK/agent" apply "$WORK/strag.hcl" --state-dir "$WORK/state")")
	curl -s "$strag_BASE/_reset" >/dev/null
	r_strag_aria+=("$(timed strag-aria2 aria2c -q -x16 -s16 -j "$CAP_N" --file-allocation=none -d "$WORK/out" -i "$WORK/strag-urls")")
	o0=$(curl -s "$cdn_BASE/_stats")
	r_mirror+=("$(timed mirror-agent "$WORK/agent" apply "$WORK/capmirror.hcl" --state-dir "$WORK/state")")
	o1=$(curl -s "$cdn_BASE/_stats")
	r_mirror_aria+=("$(timed mirror-aria2 aria2c -q -x16 -s16 -j "$CAP_N" --file-allocation=none -d "$WORK/out" -i "$WORK/mirror-urls")")
	o2=$(curl -s "$cdn_BASE/_stats")
	o_agent=$((o_agent + o1 - o0))
	o_aria=$((o_aria + o2 - o1))
done
t28_aria=$(median "${r_aria[@]}")
t_sized_agent=$(median "${r_sized[@]}")
t_nosize_agent=$(median "${r_nosize[@]}")
t_nohead_agent=$(median "${r_nohead[@]}")
t_strag_agent=$(median "${r_strag[@]}")
t_strag_aria=$(median "${r_strag_aria[@]}")
t_mirror_agent=$(median "${r_mirror[@]}")
t_mirror_aria=$(median "${r_mirror_aria[@]}")
pct() { echo "scale=2; 100 * $1 / ($ROUNDS * $CAP_TOTAL * 1048576)" | bc -l; }
origin_agent=$(pct "$o_agent")
origin_aria=$(pct "$o_aria")

echo "== uncapped: ${MID_MIB} MiB and ${BIG_MIB} MiB"
t_mid_curl=$(timed mid-curl curl -sf -o "$WORK/out/mid.bin" "$plain_BASE/mid.bin")
t_mid_curlsync=$(timed mid-curlsync sh -c "curl -sf -o '$WORK/out/mid.bin' '$plain_BASE/mid.bin' && sync '$WORK/out/mid.bin'")
t_mid_agent=$(timed mid-agent /usr/bin/time -v -o "$WORK/time-mid" "$WORK/agent" apply "$WORK/mid.hcl" --state-dir "$WORK/state")
t_big_curl=$(timed big-curl curl -sf -o "$WORK/out/big.bin" "$plain_BASE/big.bin")
t_big_curlsync=$(timed big-curlsync sh -c "curl -sf -o '$WORK/out/big.bin' '$plain_BASE/big.bin' && sync '$WORK/out/big.bin'")
t_big_agent=$(timed big-agent /usr/bin/time -v -o "$WORK/time-big" "$WORK/agent" apply "$WORK/big.hcl" --state-dir "$WORK/state")

echo "== SIGKILL at 45 % of the ${MID_MIB} MiB file, then resume"
rm -rf "$WORK/out" "$WORK/state"; mkdir -p "$WORK/out"
before=$(curl -s "$plain_BASE/_stats")
"$WORK/agent" apply "$WORK/mid.hcl" --state-dir "$WORK/state" >"$WORK/kill.log" 2>&1 &
apid=$!
half=$(((MID_MIB << 20) * 45 / 100))
while kill -0 "$apid" 2>/dev/null; do
	s=$(($(curl -s "$plain_BASE/_stats") - before))
	[ "$s" -ge "$half" ] && break
	sleep 0.02
done
kill -9 "$apid" 2>/dev/null || true
wait "$apid" 2>/dev/null || true
killed_at=$(($(curl -s "$plain_BASE/_stats") - before))
"$WORK/agent" apply "$WORK/mid.hcl" --state-dir "$WORK/state" >>"$WORK/kill.log" 2>&1
(cd "$WORK/out/mid" && sha256sum -c --quiet <(awk '$2 == "./mid.bin"' "$WORK/sums"))
refetched=$(($(curl -s "$plain_BASE/_stats") - before - (MID_MIB << 20)))

echo
echo "== results (loopback, $(nproc) cores)"
printf '%-44s %8s s  %8s MiB/s\n' \
	"capped: agent ($CONNECTIONS per file, ≤ $MAX_CONNECTIONS)" "$t_cap_agent" "$(mibs $CAP_TOTAL "$t_cap_agent")" \
	"capped: aria2c -x16 -s16 -j $CAP_N" "$t_cap_aria" "$(mibs $CAP_TOTAL "$t_cap_aria")" \
	"capped: curl --parallel" "$t_cap_curl" "$(mibs $CAP_TOTAL "$t_cap_curl")" \
	"${MID_MIB} MiB: curl" "$t_mid_curl" "$(mibs "$MID_MIB" "$t_mid_curl")" \
	"${MID_MIB} MiB: curl then sync" "$t_mid_curlsync" "$(mibs "$MID_MIB" "$t_mid_curlsync")" \
	"${MID_MIB} MiB: agent (sha256, fsync)" "$t_mid_agent" "$(mibs "$MID_MIB" "$t_mid_agent")" \
	"${BIG_MIB} MiB: curl" "$t_big_curl" "$(mibs "$BIG_MIB" "$t_big_curl")" \
	"${BIG_MIB} MiB: curl then sync" "$t_big_curlsync" "$(mibs "$BIG_MIB" "$t_big_curlsync")" \
	"${BIG_MIB} MiB: agent (sha256, fsync)" "$t_big_agent" "$(mibs "$BIG_MIB" "$t_big_agent")"
echo "issue 28, medians of $ROUNDS rounds:"
printf '%-44s %8s s  %8s MiB/s\n' \
	"capped: aria2c -x16 -s16 -j $CAP_N" "$t28_aria" "$(mibs $CAP_TOTAL "$t28_aria")" \
	"capped: agent, sizes in the plan" "$t_sized_agent" "$(mibs $CAP_TOTAL "$t_sized_agent")" \
	"no sizes: agent (HEAD)" "$t_nosize_agent" "$(mibs $CAP_TOTAL "$t_nosize_agent")" \
	"no sizes: agent (HEAD refused: first range)" "$t_nohead_agent" "$(mibs $CAP_TOTAL "$t_nohead_agent")" \
	"straggler: agent" "$t_strag_agent" "$(mibs $CAP_TOTAL "$t_strag_agent")" \
	"straggler: aria2c -x16 -s16 -j $CAP_N" "$t_strag_aria" "$(mibs $CAP_TOTAL "$t_strag_aria")" \
	"mirror: agent" "$t_mirror_agent" "$(mibs $CAP_TOTAL "$t_mirror_agent")" \
	"mirror: aria2c (mirror and origin URLs)" "$t_mirror_aria" "$(mibs $CAP_TOTAL "$t_mirror_aria")"
echo "ratio capped agent/aria2c:          $(ratio "$t_cap_aria" "$t_cap_agent")   (target ≥ 1.0)"
echo "ratio no sizes agent/aria2c:        $(ratio "$t28_aria" "$t_nosize_agent") (HEAD), $(ratio "$t28_aria" "$t_nohead_agent") (first range)   (target ≥ 0.9); sized $(ratio "$t28_aria" "$t_sized_agent")"
echo "ratio straggler agent/aria2c:       $(ratio "$t_strag_aria" "$t_strag_agent")   (target ≥ 0.8); agent straggler/capped $(ratio "$t_sized_agent" "$t_strag_agent"), against aria2c on the uncongested CDN $(ratio "$t28_aria" "$t_strag_agent")"
echo "origin bytes with a mirror:         agent ${origin_agent} %   (target ≤ 5 %), aria2c given both URLs ${origin_aria} %; time agent/aria2c $(ratio "$t_mirror_aria" "$t_mirror_agent")"
echo "ratio capped agent/curl:            $(ratio "$t_cap_curl" "$t_cap_agent")"
echo "ratio ${MID_MIB} MiB agent/curl-then-sync: $(ratio "$t_mid_curlsync" "$t_mid_agent")   (target ≥ 0.95); agent/curl $(ratio "$t_mid_curl" "$t_mid_agent")"
echo "ratio ${BIG_MIB} MiB agent/curl-then-sync: $(ratio "$t_big_curlsync" "$t_big_agent")   (target ≥ 0.95); agent/curl $(ratio "$t_big_curl" "$t_big_agent")"
echo "agent peak RSS: capped $(rss "$WORK/time-cap") MiB with up to $conns_agent connections at once, ${MID_MIB} MiB $(rss "$WORK/time-mid") MiB, ${BIG_MIB} MiB $(rss "$WORK/time-big") MiB   (target < 64)"
echo "SIGKILL at $((killed_at >> 20)) MiB sent; bytes fetched again after restart: $refetched (bytes in socket buffers at the kill count as fetched again)"
