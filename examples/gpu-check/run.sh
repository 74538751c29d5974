#!/bin/sh
# gpu-check: build the agent on a GPU host and print `agent status` for its NVIDIA
# driver: the real driver version, each GPU, its memory and the processes using it.
#
# Unattended and read-only: nothing is installed, loaded or rebooted (the plan has no
# installer and no package), state goes to a temporary directory, and every step has a
# deadline, so the whole run stays under five minutes. It needs Go (see go.mod) and, for
# NVML (memory and processes), a C compiler; without one it builds with CGO_ENABLED=0 and
# says that memory and processes are not visible.
#
#   examples/gpu-check/run.sh            # from anywhere in the repository
#
# Exit status: 0 healthy, 3 degraded (the status says why), 1 anything else, with the
# reason on stderr (no GPU driver on this host, no Go, a build failure).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

fail() {
	echo "gpu-check: $*" >&2
	exit 1
}

# The loaded driver version, as the agent reads it.
if [ -r /proc/driver/nvidia/version ]; then
	version=$(awk '/NVRM version/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+(\.[0-9]+)+$/) { print $i; exit } }' /proc/driver/nvidia/version)
elif [ -r /sys/module/nvidia/version ]; then
	version=$(tr -d '[:space:]' </sys/module/nvidia/version)
else
	fail "no NVIDIA kernel module is loaded (no /proc/driver/nvidia/version, no /sys/module/nvidia/version): this is not a GPU host, or its driver is not installed or not loaded"
fi
[ -n "$version" ] || fail "cannot read the driver version from /proc/driver/nvidia/version: $(head -n 1 /proc/driver/nvidia/version)"

command -v go >/dev/null 2>&1 || fail "no go command on PATH: install Go $(awk '/^go / { print $2 }' "$repo/go.mod") to build the agent"
command -v timeout >/dev/null 2>&1 || fail "no timeout command (coreutils) on PATH"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

cgo=1
if ! command -v "${CC:-gcc}" >/dev/null 2>&1; then
	echo "gpu-check: no C compiler (${CC:-gcc}): building without cgo, so NVML is not used and GPU memory and processes are not visible" >&2
	cgo=0
fi

echo "gpu-check: building the agent (CGO_ENABLED=$cgo) in $repo" >&2
if ! (cd "$repo" && CGO_ENABLED=$cgo CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}" timeout 240 go build -o "$tmp/agent" .); then
	fail "go build failed or took longer than 240 s"
fi

echo "gpu-check: loaded driver $version; agent status:" >&2
rc=0
timeout 60 "$tmp/agent" status "$here/plan.hcl" --state-dir "$tmp/state" -var "driver_version=$version" || rc=$?
case $rc in
0 | 3) ;;
124) fail "agent status took longer than 60 s" ;;
*) fail "agent status failed (exit $rc)" ;;
esac

# nvidia-smi's own view, to compare with the agent's, when it is installed.
if command -v nvidia-smi >/dev/null 2>&1; then
	echo >&2
	echo "gpu-check: nvidia-smi, for comparison:" >&2
	timeout 30 nvidia-smi --query-gpu=index,name,pci.bus_id,memory.used,memory.total,persistence_mode --format=csv || true
	timeout 30 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv || true
fi
exit "$rc"
