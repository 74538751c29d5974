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
# metric SERIES: its value on the daemon's /metrics (0 when absent).
metric() { get "$lport" /metrics 2>/dev/null | awk -v s="$1" '$1 == s {print $2; found=1} END {if (!found) print 0}'; }
# record FIELD: a field of server.qwen's state record.
record() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",]*\).*/\1/p" "$work/state/resources/server.qwen.json" | head -n1; }
