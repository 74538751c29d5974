#!/usr/bin/env bash
# bench/fleet-etcd.sh: issue 40's soak of etcd's own failures. test/fleet's
# TestFleetEtcdRestarts on one fleet (three `agent run`s, three fake SGLang servers, a
# three-member etcd on loopback, max_unavailable = 1, lease 3 s): etcd down 20 s
# mid-rollout and 30 s with a change pending (back with its data), then WIPES rounds
# (default 10) of etcd back on empty data directories at the moment each host's server in
# turn is down mid-restart while the others wait for the permit. A sampler asks every
# server's /health every 20 ms; the result line gives the wipes, the most servers down at
# once (the goal: never above 1), how late the leases were live again after etcd answered
# and how long the fleet took to converge after the 30 s outage. The suite runs one round.
# Usage: bench/fleet-etcd.sh [WIPES]   (needs Go and etcd: sh scripts/install-etcd.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
wipes=${1:-10}
. bench/lib.sh
echo "bench/fleet-etcd.sh: $wipes rounds of etcd emptied under a rollout"
gotest_bench fleet-etcd TestFleetEtcdRestarts ./test/fleet 'sampler:|FLEET ETCD RESULT|servers of the group were down|live again|converged .* after' FLEET_WIPES="$wipes"
