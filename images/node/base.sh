#!/usr/bin/env bash
# base.sh ROOTFS_TAR_OUT CRIU_TREE
#
# Builds the forkfleet node image's base rootfs WITHOUT Docker and writes it
# as an uncompressed tar. Called by build.sh only when no cached tar matches
# the hash of its inputs (packages.txt, this script, prune.sh, the rootfs/
# overlay, the CRIU .debs). Needs root, debootstrap and the host's Debian mirror.
#
# Steps: debootstrap minbase + packages.txt; CRIU_TREE (the host's private
# CRIU, unpacked from the same .debs by build.sh) as /opt/forkfleet/criu;
# overlay rootfs/; prune.sh (as the Dockerfile); tar with numeric owners in a stable order.
set -euo pipefail

out=${1:?usage: base.sh ROOTFS_TAR_OUT CRIU_TREE}
criu=${2:?usage: base.sh ROOTFS_TAR_OUT CRIU_TREE}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
suite=bookworm
arch=amd64

log() { printf '[node-base] %s\n' "$*" >&2; }
die() { printf '[node-base] error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap)"
for t in debootstrap tar; do
	command -v "$t" >/dev/null || die "missing tool: $t"
done
[[ -x $criu/usr/sbin/criu ]] || die "$criu holds no usr/sbin/criu"

# shellcheck source=../lib.sh
. "$here/../lib.sh"
mirror=${MIRROR:-$(host_apt_uri "$suite")}
mirror=${mirror:-http://deb.debian.org/debian}

mapfile -t pkgs < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/packages.txt" | grep -v '^$')
[[ ${#pkgs[@]} -gt 0 ]] || die "packages.txt lists no packages"

work=$(mktemp -d /var/tmp/forkfleet-node-base.XXXXXX)
root=$work/rootfs
trap 'rm -rf --one-file-system "$work"' EXIT

t0=$SECONDS
log "debootstrap $suite ($arch, minbase) from $mirror: ${pkgs[*]}"
include=$(IFS=,; echo "${pkgs[*]}")
debootstrap --variant=minbase --arch="$arch" --components=main \
	--include="$include" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
	{ tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
log "debootstrap done in $((SECONDS - t0)) s"

install -d -m 0755 "$root/opt/forkfleet"
cp -a "$criu" "$root/opt/forkfleet/criu"
chown -R 0:0 "$root/opt/forkfleet/criu"
apply_overlay "$here/rootfs" "$root"

"$here/prune.sh" "$root"
# Host-specific files debootstrap copied in; the runtime provides them.
: >"$root/etc/resolv.conf"
echo forkfleet-node >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"

tmp_out="$out.tmp.$$"
tar --numeric-owner --sort=name --xattrs --acls -C "$root" \
	--exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' --exclude='./run/*' \
	-cf "$tmp_out" .
mv -f "$tmp_out" "$out"
log "base rootfs: $(du -m --apparent-size "$out" | cut -f1) MB tar, built in $((SECONDS - t0)) s"
