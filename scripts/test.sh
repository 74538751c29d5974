#!/bin/sh
# test.sh: run every test of the agent, the way CI does, on a fresh Debian machine.
#
# It first installs what the tests need and a fresh machine lacks (as root; skipped when
# already present): gcc for cgo (go-nvml), the Incus daemon from bookworm-backports and a
# static busybox for the container tests. Then: go vet, the whole suite, and a short run
# of the fuzz targets. With CI=true a test that would skip for a missing Incus fails.
set -eu
cd "$(dirname "$0")/.."

if ! command -v gcc >/dev/null 2>&1; then
	echo "test.sh: installing gcc (cgo)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
fi
sh scripts/install-incus.sh

# go-nvml's header marks some functions deprecated; the warnings are noise.
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

go vet ./...
go test -count=1 -timeout 30m ./...

# A few seconds of each parser's fuzz target (the seed corpora already ran above).
for target in ./plans:FuzzLoad ./internal/proc:FuzzParseStat ./internal/sglang:FuzzParseLine; do
	pkg=${target%%:*}
	name=${target##*:}
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "${FUZZTIME:-5s}" "$pkg"
done
