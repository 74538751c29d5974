# bench/lib.sh: helpers shared by the benchmarks that drive `agent run` (sourced, with
# $work set and $lport the daemon's --listen port).

# freeport: a loopback port free now.
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# ms: the time in milliseconds.
ms() { echo $(($(date +%s%N) / 1000000)); }
# get PORT PATH: an HTTP GET with bash alone.
get() {
	exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
	cat <&3
	exec 3<&-
}
# metric 'NAME{label="v",...}': the value of the first series on the daemon's /metrics of
# that name that carries those labels, whatever others it has (0 when there is none).
metric() {
	get "$lport" /metrics 2>/dev/null | awk -v s="$1" '
		BEGIN { name = s; sub(/\{.*/, "", name); want = s; sub(/^[^{]*\{?/, "", want); sub(/\}$/, "", want); n = split(want, pairs, ",") }
		found { next }
		{ line = $1; ln = line; sub(/\{.*/, "", ln); if (ln != name) next
		  for (i = 1; i <= n; i++) if (pairs[i] != "" && index(line, pairs[i]) == 0) next
		  print $2; found = 1 }
		END { if (!found) print 0 }'
}
# until_for SECONDS WHAT CMD...: run CMD until it succeeds, failing the benchmark with WHAT
# after SECONDS (a renamed metric must not hang a benchmark forever).
until_for() {
	local limit=$(($(date +%s) + $1)) what=$2
	shift 2
	until "$@"; do
		[ "$(date +%s)" -lt "$limit" ] || { echo "timed out waiting for $what" >&2; exit 1; }
		sleep 0.05
	done
}
# record FIELD: a field of server.qwen's state record.
record() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",]*\).*/\1/p" "$work/state/resources/server.qwen.json" | head -n1; }

# gotest_bench NAME TEST PKG PATTERN [ENV=VALUE...]: runs one Go test as a bench (its log in
# a temporary file, the agents' logs beside it through FLEET_LOGS), prints the log's lines
# matching PATTERN and NAME's verdict, and fails when the test does.
gotest_bench() {
	local name=$1 test=$2 pkg=$3 pattern=$4 log status=pass
	shift 4
	export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
	log=$(mktemp "/tmp/agent-bench-$name.XXXXXX")
	mkdir -p "$log.d"
	echo "bench/$name.sh: full log $log, agent logs $log.d"
	env FLEET_LOGS="$log.d" "$@" go test -count=1 -timeout 180m -run "^$test\$" -v "$pkg" >"$log" 2>&1 || status=FAIL
	grep -E "$pattern" "$log" | sed 's/^ *//' || true
	echo "bench/$name.sh: $status"
	[ "$status" = pass ]
}
