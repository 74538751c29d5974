#!/bin/sh
# test.sh: run every test of the agent, the way CI does, on a fresh Debian machine.
#
# It first installs what the tests need and a fresh machine lacks (as root; skipped when
# already present): gcc for cgo (go-nvml), the Incus daemon from bookworm-backports and a
# static busybox for the container tests, debootstrap for the service test (test/service,
# which builds a Debian root filesystem once and caches it in /var/cache/agent-test),
# promtool for the alerting rules and etcd-server for the fleet coordination tests
# (scripts/install-etcd.sh). Then: go vet, the whole suite, and a short run of the fuzz
# targets. With CI=true a test that would skip for a missing one of them fails.
set -eu
cd "$(dirname "$0")/.."

if ! command -v gcc >/dev/null 2>&1; then
	echo "test.sh: installing gcc (cgo)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
fi
sh scripts/install-incus.sh
sh scripts/install-etcd.sh

# go-nvml's header marks some functions deprecated; the warnings are noise.
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

go vet ./...
# ./resources, the longest package, raises its own -parallel to 4 (its tests mostly wait):
# see its TestMain. An explicit -parallel here would override it.
go test -count=1 -timeout 30m ./...

# A few seconds of each parser's fuzz target (the seed corpora already ran above). The
# budget is a number of executions, not a duration: Go 1.26's fuzz coordinator can fail a
# duration-limited run with a bare "context deadline exceeded" and no failing input when
# the deadline lands while a worker is busy (golang/go#75804), which a loaded CI machine
# makes likely. FUZZTIME overrides every budget (e.g. FUZZTIME=60s for a longer look).
for target in ./plans:FuzzLoad:15000 ./plans:FuzzParseChunks:20000 ./internal/proc:FuzzParseStat:50000 ./internal/engines:FuzzParseLine:100000 ./internal/engines:FuzzScan:30000 ./internal/gpu:FuzzParseXidLine:50000; do
	pkg=${target%%:*}
	rest=${target#*:}
	name=${rest%%:*}
	execs=${rest#*:}
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "${FUZZTIME:-${execs}x}" "$pkg"
done
