#!/usr/bin/env bash
# Build forkfleet's web desktop image (the desktop image plus Chromium, fonts
# real pages need, a text editor and a file manager) without Docker and import
# it into containerd as localhost/forkfleet/desktop-web:latest.
#
#   images/desktop-web/build.sh [--no-import] [--rebuild-base]
#
# Env: as images/desktop/build.sh (GUESTD_BIN, FORKFLEET_CONTAINERD_ADDRESS,
# FORKFLEET_NAMESPACE, FORKFLEET_IMAGE_CACHE, MIRROR, SOURCE_DATE_EPOCH), and
#   IMAGE_NAME        default localhost/forkfleet/desktop-web:latest
#   SECURITY_MIRROR   bookworm-security mirror (default: the host's, else
#                     http://deb.debian.org/debian-security)
#
# Steps: (a) the desktop's base rootfs (images/desktop/build.sh --base-only,
# cached); (b) the web base rootfs tar, cached as desktop-web-base-<hash>.tar
# where the hash covers the desktop base's hash, packages.txt, web.sh, ../rootfs.sh and the
# rootfs/ overlay: the desktop base extracted, the overlay copied, web.sh in a
# chroot; (c) guestd; (d) OCI layout (one base layer + guestd); (e) import +
# unpack, skipped when containerd already has that manifest digest unpacked.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${FORKFLEET_IMAGE_CACHE:-/var/cache/forkfleet/images}
address=${FORKFLEET_CONTAINERD_ADDRESS:-/run/forkfleet/containerd/containerd.sock}
namespace=${FORKFLEET_NAMESPACE:-forkfleet}
image_name=${IMAGE_NAME:-localhost/forkfleet/desktop-web:latest}
export PATH=$PATH:/usr/local/go/bin

do_import=1
rebuild_base=0
for arg in "$@"; do
	case $arg in
	--no-import) do_import=0 ;;
	--rebuild-base) rebuild_base=1 ;;
	-h | --help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
	esac
done

image_tag=desktop-web
# shellcheck source=../lib.sh
. "$repo/images/lib.sh"

t_all=$(now_ms)
# (a) the desktop's base
"$repo/images/desktop/build.sh" --base-only
desktop_hash=$(inputs_hash "$repo/images/desktop" "forkfleet-desktop-base v1" packages.txt base.sh slim.sh ../rootfs.sh)
desktop_tar=$cache/desktop-base-$desktop_hash.tar
[[ -f $desktop_tar ]] || die "no desktop base at $desktop_tar"

hash=$(inputs_hash "$here" "forkfleet-desktop-web-base v1 on $desktop_hash" packages.txt web.sh ../rootfs.sh)
base_tar=$cache/desktop-web-base-$hash.tar

# (b) web base rootfs
if [[ -f $base_tar && $rebuild_base -eq 0 ]]; then
	log "base: reusing $base_tar ($(du -m --apparent-size "$base_tar" | cut -f1) MB)"
else
	need_root chroot
	log "base: building $base_tar (desktop base + packages.txt, ~2 min)"
	t=$(now_ms)
	work=$(mktemp -d /var/tmp/forkfleet-desktop-web-base.XXXXXX)
	trap 'rm -rf --one-file-system "$work"' EXIT
	root=$work/rootfs
	mkdir "$root"
	tar --numeric-owner --xattrs --acls -xpf "$desktop_tar" -C "$root"
	apply_overlay "$here/rootfs" "$root"
	mkdir -p "$root/tmp/forkfleet"
	cp "$here/web.sh" "$here/packages.txt" "$root/tmp/forkfleet/"
	security=${SECURITY_MIRROR:-$(apt_mirror bookworm-security http://deb.debian.org/debian-security)}
	# apt needs the host's resolver; the file is emptied again below (the
	# runtime provides it).
	cp -L /etc/resolv.conf "$root/etc/resolv.conf"
	in_chroot "$root" -- SECURITY_MIRROR="$security" bash /tmp/forkfleet/web.sh /tmp/forkfleet/packages.txt ||
		die "web.sh failed in the chroot"
	rm -rf "$root/tmp/forkfleet"
	: >"$root/etc/resolv.conf"
	tar_rootfs "$root" "$base_tar"
	rm -rf --one-file-system "$work"
	trap - EXIT
	log "base: built in $(secs $(($(now_ms) - t))), $(du -m --apparent-size "$base_tar" | cut -f1) MB"
	find "$cache" -maxdepth 1 -name 'desktop-web-base-*.tar' ! -name "desktop-web-base-$hash.tar" -delete
fi

work=$(mktemp -d /var/tmp/forkfleet-desktop-web-build.XXXXXX)
trap 'rm -rf "$work"' EXIT

# (c) guestd
guestd=$(guestd_binary "$repo" "$work")

# (d) OCI layout: the desktop image's config plus TZ,
# set so nothing resolves /etc/localtime and watches
# /usr/share/zoneinfo (Chromium's time zone monitor does when TZ is unset,
# an inotify watch CRIU cannot resolve on an overlay root).
image_tool "$repo" "$work/forkfleet-image"
layout=$cache/desktop-web-oci
desktop_layout "$work/forkfleet-image" "$base_tar" "$guestd" "$layout" "$image_name" "$hash" \
	--env TZ=UTC \
	--label "org.forkfleet.criu.ghost-limit=64M"
log "layout: $layout"

# (e) import + unpack
[[ $do_import -eq 0 ]] || import_layout "$work/forkfleet-image" "$layout" "$address" "$namespace"
log "total $(secs $(($(now_ms) - t_all)))"
