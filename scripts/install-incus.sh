#!/bin/sh
# install-incus.sh: install what the Incus integration tests need
# (internal/incus/incustest): the Incus daemon and a static busybox; debootstrap, which
# builds the Debian root filesystem of the service test (test/service); and promtool
# (Debian's prometheus package) for the alerting rules' tests (packaging/).
#
# Run as root on Debian bookworm (incus comes from bookworm-backports, which
# is enabled if missing, on the mirror the host already uses) or on a newer
# Debian/Ubuntu that ships incus in its main archive. Idempotent and quiet
# when everything is already installed.
#
# INCUS_PACKAGE selects the daemon package: incus-base (default: the daemon,
# client and container tooling, without QEMU) or incus (adds virtual-machine
# support, several hundred MB more).
set -eu

INCUS_PACKAGE=${INCUS_PACKAGE:-incus-base}
PACKAGES="$INCUS_PACKAGE busybox-static uidmap debootstrap prometheus"

say() { printf 'install-incus: %s\n' "$*"; }
die() { printf 'install-incus: %s\n' "$*" >&2; exit 1; }

installed() {
	for p in "$@"; do
		case $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) in
		"install ok installed") ;;
		*) return 1 ;;
		esac
	done
}

if installed $PACKAGES; then
	exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (try: sudo $0)"
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script supports Debian and Ubuntu only"

. /etc/os-release
codename=${VERSION_CODENAME:-}
release_opt=""

if [ "$codename" = bookworm ]; then
	if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
		# Reuse the Debian mirror the host already uses.
		mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
			grep -v '^[[:space:]]*#' | grep -o 'https\?://[^[:space:]]*' | grep -E '/debian/?$' | head -n 1 || true)
		[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list*: add a bookworm-backports line by hand"
		mirror=${mirror%/}
		say "enabling bookworm-backports from $mirror"
		echo "deb $mirror bookworm-backports main" >/etc/apt/sources.list.d/bookworm-backports.list
	fi
	release_opt="-t bookworm-backports"
fi

had_prometheus=""
installed prometheus && had_prometheus=yes

say "installing $PACKAGES"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the option and list is intended
apt-get install -y -qq --no-install-recommends $release_opt $PACKAGES >/dev/null

# The prometheus package starts a Prometheus server where systemd runs: the tests need
# only its promtool.
if [ -d /run/systemd/system ] && [ -z "$had_prometheus" ]; then
	systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi

incusd=""
for p in /usr/libexec/incus/incusd /usr/lib/incus/incusd /usr/sbin/incusd; do
	[ -x "$p" ] && incusd=$p && break
done
[ -n "$incusd" ] || die "incusd not found after installing $INCUS_PACKAGE"
[ -x /bin/busybox ] || die "/bin/busybox missing after installing busybox-static"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap missing after installing it"
command -v promtool >/dev/null 2>&1 || die "promtool missing after installing prometheus"
say "done: $incusd ($(dpkg-query -W -f='${Version}' "$INCUS_PACKAGE")), /bin/busybox, debootstrap, promtool"
