#!/bin/sh
# run.sh: the quickstart. Builds the agent and the fake SGLang, serves a small model
# directory on a loopback port, then shows the main job: plan → apply (the download with
# its progress bars on a terminal, then the server launched from it) → a no-op plan (the weights
# confirmed from the download's manifest, not read again) → a changed flag → a verified
# relaunch → status, and ends with agent destroy (unless KEEP=1): a verified stop, never a
# kill by hand. Needs Go, nothing else: no GPU, Incus or network.
set -eu
cd "$(dirname "$0")/../.."
root=${QUICKSTART_ROOT:-/tmp/agent-quickstart}
state="$root/state"
mkdir -p "$root" bin
# go-nvml's header marks some functions deprecated; without this the first build prints
# a hundred lines of C warnings that mean nothing to a newcomer.
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
go build -o bin/agent .
go build -o bin/fake-sglang ./internal/fakesglang
fake="$(pwd)/bin/fake-sglang"
# The model server: 1 MiB/s per response, so that the 16 MiB of weights take a few seconds
# and the progress bar has something to show. It stops when this script ends.
. examples/quickstart/model.sh
quickstart_model "$root" 1048576
trap 'kill "$model_pid" 2>/dev/null || true' EXIT
agent() { bin/agent "$@" --state-dir "$state" -var root="$root" -var fake_sglang="$fake" -var model_url="$model_url" -var port="${QUICKSTART_PORT:-30123}"; }
# Each command in bold on a terminal; saved to a file, piped, or with NO_COLOR set, no
# escape codes at all.
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ] && [ "${TERM:-dumb}" != dumb ]; then
	step() { printf '\n\033[1m$ agent %s\033[0m\n' "$*"; }
else
	step() { printf '\n$ agent %s\n' "$*"; }
fi

step plan examples/quickstart
agent plan examples/quickstart || [ $? -eq 2 ]
step apply examples/quickstart
agent apply examples/quickstart
step "plan examples/quickstart   # converged: the weights confirmed from the manifest, not read; exit 0"
agent plan examples/quickstart
step "plan examples/quickstart -var mem_fraction=0.8   # one flag changed"
agent plan examples/quickstart -var mem_fraction=0.8 || [ $? -eq 2 ]
step "apply examples/quickstart -var mem_fraction=0.8   # verified stop, then verified launch"
agent apply examples/quickstart -var mem_fraction=0.8
step "status examples/quickstart -var mem_fraction=0.8"
agent status examples/quickstart -var mem_fraction=0.8

if [ "${KEEP:-0}" != 1 ]; then
	# Leave nothing running, the agent's way: a verified stop, dependents first.
	step "destroy examples/quickstart -var mem_fraction=0.8   # verified stop; the files go too"
	agent destroy examples/quickstart -var mem_fraction=0.8
	printf '\n(KEEP=1 keeps the server running.) Logs are kept: %s/logs\n' "$root"
fi
