#!/usr/bin/env bash
# bench/fleet.sh: issue 31's fault bench. Three `agent run`s coordinated through a real etcd
# (Debian's etcd-server on loopback) roll a flag change RUNS times (default 50) across
# three fake SGLang servers with max_unavailable = 1, while a killer SIGKILLs a random
# agent every 0.3-2.8 s and starts it again 0.1-1 s later (as systemd's Restart= would).
# A sampler asks every server's /health every 20 ms; the result line gives the runs, the
# kills and the most servers down at once (the goal: never above 1). FLEET_SEED replays a
# run. The suite runs the same test with 2 runs (test/fleet, TestFleetRandomKills).
# Usage: bench/fleet.sh [RUNS]   (needs Go and etcd: sh scripts/install-etcd.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-50}
. bench/lib.sh
echo "bench/fleet.sh: $runs rollouts with random kills"
gotest_bench fleet TestFleetRandomKills ./test/fleet 'sampler:|FLEET RESULT|servers of the group were down' FLEET_RUNS="$runs"
