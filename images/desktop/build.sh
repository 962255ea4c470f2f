#!/usr/bin/env bash
# Build forkfleet's sandbox desktop image without Docker and import it into
# containerd as localhost/forkfleet/desktop:latest.
#
#   images/desktop/build.sh [--no-import] [--rebuild-base] [--base-only]
#
# Env:
#   GUESTD_BIN                    use this guestd binary instead of building ../../guestd
#   FORKFLEET_CONTAINERD_ADDRESS  containerd socket (default /run/forkfleet/containerd/containerd.sock)
#   FORKFLEET_NAMESPACE           containerd namespace (default forkfleet)
#   FORKFLEET_IMAGE_CACHE         cache dir (default /var/cache/forkfleet/images)
#   IMAGE_NAME                    default localhost/forkfleet/desktop:latest
#   MIRROR                        Debian mirror (default: the host's, from /etc/apt/sources.list*)
#   SOURCE_DATE_EPOCH             mtime/created of the guestd layer and config (default 0)
#
# Steps: (a) base rootfs tar, cached as desktop-base-<sha256 of inputs>.tar
# where the inputs are packages.txt, base.sh, slim.sh, ../rootfs.sh and the rootfs/ overlay (not
# guestd); (b) guestd; (c) OCI layout = base layer + guestd layer, written by
# forkfleet-image; (d) import + unpack into containerd, skipped when containerd
# already has that manifest digest unpacked.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${FORKFLEET_IMAGE_CACHE:-/var/cache/forkfleet/images}
address=${FORKFLEET_CONTAINERD_ADDRESS:-/run/forkfleet/containerd/containerd.sock}
namespace=${FORKFLEET_NAMESPACE:-forkfleet}
image_name=${IMAGE_NAME:-localhost/forkfleet/desktop:latest}
export PATH=$PATH:/usr/local/go/bin

do_import=1
rebuild_base=0
base_only=0
for arg in "$@"; do
	case $arg in
	--no-import) do_import=0 ;;
	--base-only) base_only=1 ;;
	--rebuild-base) rebuild_base=1 ;;
	-h | --help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
	esac
done

image_tag=desktop
# shellcheck source=../lib.sh
. "$here/../lib.sh"

mkdir -p "$cache"
t_all=$(now_ms)
hash=$(inputs_hash "$here" "forkfleet-desktop-base v1" packages.txt base.sh slim.sh ../rootfs.sh)
base_tar=$cache/desktop-base-$hash.tar

# (a) base rootfs
if [[ -f $base_tar && $rebuild_base -eq 0 ]]; then
	log "base: reusing $base_tar ($(du -m --apparent-size "$base_tar" | cut -f1) MB)"
else
	log "base: building $base_tar (debootstrap, ~2-3 min)"
	t=$(now_ms)
	"$here/base.sh" "$base_tar"
	log "base: built in $(secs $(($(now_ms) - t)))"
	# Older bases are dead weight: keep only the current one.
	find "$cache" -maxdepth 1 -name 'desktop-base-*.tar' ! -name "desktop-base-$hash.tar" -delete
fi
# Derived images (images/desktop-web) build on this tar.
[[ $base_only -eq 1 ]] && exit 0

work=$(mktemp -d /var/tmp/forkfleet-desktop-build.XXXXXX)
trap 'rm -rf "$work"' EXIT

# (b) guestd
guestd=$(guestd_binary "$repo" "$work")

# (c) OCI layout
image_tool "$repo" "$work/forkfleet-image"
layout=$cache/desktop-oci
t=$(now_ms)
desktop_layout "$work/forkfleet-image" "$base_tar" "$guestd" "$layout" "$image_name" "$hash"
log "layout: $layout written in $(secs $(($(now_ms) - t)))"

# (d) import + unpack
[[ $do_import -eq 0 ]] || import_layout "$work/forkfleet-image" "$layout" "$address" "$namespace"
log "total $(secs $(($(now_ms) - t_all)))"
