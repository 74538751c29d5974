#!/usr/bin/env bash
# bench/xid-burst.sh: what a burst of 1,000 Xid lines costs the GPU fault watch. Runs
# internal/gpu's BenchmarkXidBurst (the kernel log grows by 1,000 real-format Xid lines
# between two polls; one poll reads, parses, looks up and places them) and prints the CPU
# one burst costs. The watch polls once a second, so CPU seconds per burst is the share
# of a core a burst per second costs. Target: under 0.2 core. Needs Go only.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
out=$(go test -run '^$' -bench '^BenchmarkXidBurst$' -benchtime "${BURSTS:-50}x" ./internal/gpu)
echo "$out" | grep -E '^Benchmark' >&2
cpu=$(echo "$out" | awk '/^BenchmarkXidBurst/ {for (i = 1; i <= NF; i++) if ($(i+1) == "cpu-s/burst") print $i}')
awk -v c="$cpu" 'BEGIN {
	printf "1,000 Xid lines per poll: %.4f CPU seconds per burst = %.3f of a core at one burst a second (target < 0.2)\n", c, c
	exit (c < 0.2 ? 0 : 1)
}'
