#!/bin/sh
# run.sh: the quickstart. Builds the agent and the fake SGLang, then shows the main job:
# plan → apply → a no-op plan → a changed flag → a verified relaunch → status, and stops
# the server at the end (unless KEEP=1). Needs Go, nothing else: no GPU, Incus or network.
set -eu
cd "$(dirname "$0")/../.."
root=${QUICKSTART_ROOT:-/tmp/agent-quickstart}
state="$root/state"
mkdir -p "$root" bin
go build -o bin/agent .
go build -o bin/fake-sglang ./internal/fakesglang
fake="$(pwd)/bin/fake-sglang"
agent() { bin/agent "$@" --state-dir "$state" -var root="$root" -var fake_sglang="$fake" -var port="${QUICKSTART_PORT:-30123}"; }
step() { printf '\n\033[1m$ agent %s\033[0m\n' "$*"; }

step plan examples/quickstart
agent plan examples/quickstart || [ $? -eq 2 ]
step apply examples/quickstart
agent apply examples/quickstart
step "plan examples/quickstart   # converged: nothing to do, exit 0"
agent plan examples/quickstart
step "plan examples/quickstart -var mem_fraction=0.8   # one flag changed"
agent plan examples/quickstart -var mem_fraction=0.8 || [ $? -eq 2 ]
step "apply examples/quickstart -var mem_fraction=0.8   # verified stop, then verified launch"
agent apply examples/quickstart -var mem_fraction=0.8
step "status examples/quickstart -var mem_fraction=0.8"
agent status examples/quickstart -var mem_fraction=0.8

if [ "${KEEP:-0}" != 1 ]; then
	# Leave nothing running: stop the server the agent's way (ensure the plan without it).
	pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$state/resources/server.qwen.json" | head -n1)
	[ -n "$pid" ] && kill -15 "-$pid" 2>/dev/null || true
	printf '\nStopped the quickstart server (KEEP=1 keeps it running). Logs: %s/logs\n' "$root"
fi
