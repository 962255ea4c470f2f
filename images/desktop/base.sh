#!/usr/bin/env bash
# base.sh ROOTFS_TAR_OUT
#
# Builds the forkfleet desktop base rootfs WITHOUT Docker and writes it as an
# uncompressed tar. Called by build.sh only when no cached tar matches the
# hash of (packages.txt, this script, slim.sh, ../rootfs.sh, rootfs/ overlay). Needs root, debootstrap,
# unshare and network access to the host's Debian mirror.
#
# Steps: debootstrap minbase + packages.txt; overlay rootfs/; slim.sh in a
# chroot (drops runtime-unneeded dependencies, prebuilds the font cache,
# smoke-tests Xvfb, prunes docs/man/locales/apt state; the Dockerfile runs the
# same script); tar with numeric owners in a stable order.
set -euo pipefail

out=${1:?usage: base.sh ROOTFS_TAR_OUT}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
suite=bookworm

image_tag=base
# shellcheck source=../lib.sh
. "$here/../lib.sh"
need_root "debootstrap, chroot"
need_tools debootstrap unshare chroot tar

work=$(mktemp -d /var/tmp/forkfleet-desktop-base.XXXXXX)
root=$work/rootfs
cleanup() {
	# Mounts live in a private mount namespace (unshare -m) and die with it;
	# this only removes files. FORKFLEET_BASE_KEEP=1 keeps them to debug.
	if [[ -n ${FORKFLEET_BASE_KEEP:-} ]]; then log "kept $work"; return; fi
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT

t0=$SECONDS
debootstrap_rootfs "$root" "$suite" "$here/packages.txt"

log "applying overlay $here/rootfs"
apply_overlay "$here/rootfs" "$root"

# Everything in the chroot runs in private mount and network namespaces:
# /proc and /dev are mounted into the chroot and vanish with the namespace
# even on failure, and slim.sh's smoke-test Xvfb cannot collide with an X
# server on the host through its abstract socket.
log "slimming in chroot (slim.sh: drop unused deps, font cache, smoke test, prune)"
mkdir -p "$root/tmp/forkfleet"
cp "$here/slim.sh" "$here/packages.txt" "$root/tmp/forkfleet/"
in_chroot "$root" --net -- bash /tmp/forkfleet/slim.sh /tmp/forkfleet/packages.txt
rm -rf "$root/tmp/forkfleet"
host_files "$root" forkfleet

log "writing $out"
tar_rootfs "$root" "$out"
log "base rootfs: $(du -m --apparent-size "$out" | cut -f1) MB tar, $(du -sm "$root" | cut -f1) MB on disk, built in $((SECONDS - t0)) s"
