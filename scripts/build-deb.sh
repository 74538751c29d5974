#!/bin/sh
# build-deb.sh: build the agent's Debian package, OUTDIR/agent_VERSION_ARCH.deb (OUTDIR
# defaults to dist/), and print its path. Needs Go, gcc (cgo) and dpkg-deb.
#
# Contents: /usr/bin/agent; /lib/systemd/system/agent.service (packaging/agent.service);
# /etc/agent/plan.hcl (a conffile, mode 0600 in a 0700 directory: a commented example
# that manages nothing); /usr/share/doc/agent (README.md, docs/, copyright). Install:
#   dpkg -i agent_VERSION_ARCH.deb && systemctl enable --now agent
#
# VERSION overrides the version (default: 0~git<commit time>.<commit>, or 0~dev outside
# git). Maintainer scripts: packaging/deb/.
set -eu
cd "$(dirname "$0")/.."
out=${1:-dist}

if [ -z "${VERSION:-}" ]; then
	if stamp=$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S 2>/dev/null) && rev=$(git rev-parse --short=12 HEAD 2>/dev/null); then
		VERSION="0~git$stamp.$rev"
	else
		VERSION=0~dev
	fi
fi
arch=$(dpkg --print-architecture)
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root

install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/usr/share/doc/agent/docs"
install -d -m 0700 "$root/etc/agent"
go build -trimpath -o "$root/usr/bin/agent" . 2>"$work/build.log" || { cat "$work/build.log" >&2; exit 1; }
chmod 0755 "$root/usr/bin/agent"
install -m 0644 packaging/agent.service "$root/lib/systemd/system/agent.service"
install -m 0600 packaging/plan.hcl "$root/etc/agent/plan.hcl"
install -m 0644 README.md "$root/usr/share/doc/agent/README.md"
(cd docs && find . -name '*.md' -type f) | while read -r f; do
	install -D -m 0644 "docs/$f" "$root/usr/share/doc/agent/docs/$f"
done
for f in packaging/*.rules.yml; do
	[ -e "$f" ] && install -D -m 0644 "$f" "$root/usr/share/doc/agent/examples/$(basename "$f")"
done
cat >"$root/usr/share/doc/agent/copyright" <<'COPYRIGHT'
agent: declarative provisioning agent for GPU inference hosts.
Copyright: the agent authors. License: see the source repository.
COPYRIGHT

for s in postinst prerm postrm; do
	install -m 0755 "packaging/deb/$s" "$root/DEBIAN/$s"
done
echo /etc/agent/plan.hcl >"$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: agent
Version: $VERSION
Architecture: $arch
Maintainer: agent maintainers <root@localhost>
Installed-Size: $size
Depends: libc6
Section: admin
Priority: optional
Description: declarative provisioning agent for GPU inference hosts
 An HCL plan says what must be true on a host (the NVIDIA driver, Incus containers,
 model weights, SGLang servers with tuned flags); the agent observes the host, shows
 the difference and applies only what is needed, verifying every step. agent.service
 runs its reconcile loop on /etc/agent/plan.hcl.
CONTROL

mkdir -p "$out"
deb="$out/agent_${VERSION}_$arch.deb"
dpkg-deb --root-owner-group -Zxz -z1 --build "$root" "$deb" >/dev/null
echo "$deb"
