#!/bin/sh
# install-etcd.sh: install Debian's etcd-server (etcd 3.4 on bookworm) for the fleet
# coordination tests (internal/coord, test/fleet), which start their own members on
# loopback. The package's own etcd.service is disabled where systemd runs: the tests need
# only the binary. Idempotent and quiet when already installed.
set -eu

say() { printf 'install-etcd: %s\n' "$*"; }
die() { printf 'install-etcd: %s\n' "$*" >&2; exit 1; }

if [ "$(dpkg-query -W -f='${Status}' etcd-server 2>/dev/null || true)" = "install ok installed" ]; then
	exit 0
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (try: sudo $0)"
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script supports Debian and Ubuntu only"

say "installing etcd-server"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
if [ -d /run/systemd/system ]; then
	systemctl disable --now etcd.service >/dev/null 2>&1 || true
fi
command -v etcd >/dev/null 2>&1 || die "etcd missing after installing etcd-server"
say "done: $(command -v etcd) ($(dpkg-query -W -f='${Version}' etcd-server))"
