#!/usr/bin/env bash
# base.sh ROOTFS_TAR_OUT CRIU_TREE
#
# Builds the forkfleet node image's base rootfs WITHOUT Docker and writes it
# as an uncompressed tar. Called by build.sh only when no cached tar matches
# the hash of its inputs (packages.txt, this script, prune.sh, ../rootfs.sh, the rootfs/
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

image_tag=node-base
# shellcheck source=../lib.sh
. "$here/../lib.sh"
need_root debootstrap
need_tools debootstrap tar
[[ -x $criu/usr/sbin/criu ]] || die "$criu holds no usr/sbin/criu"

work=$(mktemp -d /var/tmp/forkfleet-node-base.XXXXXX)
root=$work/rootfs
trap 'rm -rf --one-file-system "$work"' EXIT

t0=$SECONDS
debootstrap_rootfs "$root" "$suite" "$here/packages.txt"

install -d -m 0755 "$root/opt/forkfleet"
cp -a "$criu" "$root/opt/forkfleet/criu"
chown -R 0:0 "$root/opt/forkfleet/criu"
apply_overlay "$here/rootfs" "$root"

"$here/prune.sh" "$root"
host_files "$root" forkfleet-node
tar_rootfs "$root" "$out"
log "base rootfs: $(du -m --apparent-size "$out" | cut -f1) MB tar, built in $((SECONDS - t0)) s"
