#!/usr/bin/env bash
# bench/upgrade.sh: issue 38's driver upgrade across a fleet. test/fleet's
# TestDriverUpgradeOneHostAtATime on three `agent run`s coordinated through etcd 3.4 on
# loopback (host_disruptions { max_unavailable = 1 }, lease 2 s), each host with a fake
# host root (AGENT_HOST_ROOT: NVIDIA driver 570.172.08, a fake .run installer) and a
# reboot hook for its command runner (AGENT_HOST_RUNNER: systemctl reboot kills the agent
# and its server; 3 s later the test writes a new boot id with the new driver loaded and
# starts the agent again). The driver's version changes in the three hosts' plan at once,
# ROUNDS times (default 5), back and forth between 570.172.08 and 580.95.05; the first
# round SIGKILLs the first host's agent at its reboot request (it asks again). A sampler
# asks every server's /health every 20 ms. Per host and round: how long its server was
# down (reboot to /health 200 on the new driver), how long it held the host permit and
# where that time went; per round the fleet's total; the result line gives the ranges
# (the killed host left out) and the most hosts down at once (the goal: never above 1).
# The suite runs one round: test/fleet TestDriverUpgradeOneHostAtATime is its short
# version (it prints the same lines and fails when two hosts are down at once).
# Usage: bench/upgrade.sh [ROUNDS]   (as root: each host has its own UTS and mount
# namespaces; needs Go and etcd: sh scripts/install-etcd.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
. bench/lib.sh
echo "bench/upgrade.sh: $rounds driver upgrades of three hosts, one host at a time"
gotest_bench upgrade TestDriverUpgradeOneHostAtATime ./test/fleet 'sampler:|round [0-9]+|UPGRADE RESULT|down at once|outside its host permit' UPGRADE_ROUNDS="$rounds"
