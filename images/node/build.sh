#!/usr/bin/env bash
# Build forkfleet's node image (the DaemonSet's, deploy/kubernetes) without
# Docker, as an OCI layout in $FORKFLEET_IMAGE_CACHE/node-oci.
#
#   images/node/build.sh
#
# Env:
#   FORKFLEET_IMAGE_CACHE  cache dir (default /var/cache/forkfleet/images)
#   IMAGE_NAME             default localhost/forkfleet/node:latest (deploy/kubernetes/README.md, "Image")
#   VERSION                the binaries' version (default: git describe, as make build)
#   MIRROR                 Debian mirror (default: the host's, from /etc/apt/sources.list*)
#   SOURCE_DATE_EPOCH      mtime/created of the binaries' layer and config (default 0)
#
# The host stack of deploy/host-setup.sh in an image, built by its own
# functions: containerd, its shim and ctr (host-setup's build, cached in
# /var/cache/forkfleet/containerd-v*), runc, nft and ip (Debian), the private
# CRIU (the same .debs host-setup installs, cached in /var/cache/forkfleet/criu)
# with its wrapper and preload library, controld, forkfleet-log,
# forkfleet-nethook and forkfleetctl; its entrypoint forkfleet-node runs
# containerd and then controld in one container.
#
# Steps: (a) binaries.sh (shared with the Dockerfile): containerd's build and
# the CRIU .debs (host-setup's caches, made when missing), the Go builds,
# CRIU's wrapper and preload; (b) base rootfs tar (base.sh), cached as
# node-base-<hash>.tar where the inputs are packages.txt, base.sh, prune.sh, ../rootfs.sh,
# the rootfs/ overlay and the CRIU .debs; (c) the OCI layout =
# base layer + binaries layer, rewritten only when the hash of everything in
# it changed (node-oci.inputs).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${FORKFLEET_IMAGE_CACHE:-/var/cache/forkfleet/images}
image_name=${IMAGE_NAME:-localhost/forkfleet/node:latest}
version=${VERSION:-$(git -C "$repo" describe --tags --always --dirty 2>/dev/null || echo dev)}

case ${1:-} in
"") ;;
-h | --help) sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
esac

# lib.sh, and through it host-setup.sh's functions (newest_cached_criu,
# unpack_criu) and constants.
image_tag=node
# shellcheck source=../lib.sh
. "$here/../lib.sh"
export PATH=$PATH:/usr/local/go/bin

need_root "debootstrap, host-setup's caches"
mkdir -p "$cache" "$LIB_DIR" "$LOG_DIR"
t_all=$(now_ms)

work=$(mktemp -d /var/tmp/forkfleet-node-build.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT

# (a) the binaries (binaries.sh: host-setup's containerd build and CRIU
# .debs, made when missing; the Go builds; CRIU's wrapper and preload).
t=$(now_ms)
VERSION=$version "$here/binaries.sh" "$work/tree"
log "binaries: built in $(secs $(($(now_ms) - t)))"
image_tool "$repo" "$work/forkfleet-image"

# (b) base rootfs, with the CRIU the wrapper runs.
criu_ver=$(newest_cached_criu) || die "no CRIU .debs in $CRIU_CACHE after binaries.sh"
criu_debs=$(cd "$CRIU_CACHE/$criu_ver/debs" && ls ./*.deb | LC_ALL=C sort | sha256sum | cut -c1-16)
hash=$(inputs_hash "$here" "forkfleet-node-base v1 criu $criu_ver $criu_debs" packages.txt base.sh prune.sh ../rootfs.sh)
base_tar=$cache/node-base-$hash.tar
if [[ -f $base_tar ]]; then
	log "base: reusing $base_tar ($(du -m --apparent-size "$base_tar" | cut -f1) MB)"
else
	log "base: building $base_tar (debootstrap, ~1-2 min)"
	t=$(now_ms)
	unpack_criu "$criu_ver" "$work/criu"
	"$here/base.sh" "$base_tar" "$work/criu"
	log "base: built in $(secs $(($(now_ms) - t)))"
	find "$cache" -maxdepth 1 -name 'node-base-*.tar' ! -name "node-base-$hash.tar" -delete
fi

adds=()
while IFS= read -r -d '' f; do
	adds+=("/${f#./}=$work/tree/${f#./}")
done < <(cd "$work/tree" && find . -type f -print0 | LC_ALL=C sort -z)
config=(
	--entrypoint /usr/local/bin/forkfleet-node
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	--workdir /
	--label "org.forkfleet.base=$hash"
	--label "org.opencontainers.image.version=$version"
	--label "org.forkfleet.containerd.version=$CONTAINERD_VERSION"
	--label "org.forkfleet.criu.version=$criu_ver"
)

# (c) OCI layout, unless the one there has these very inputs.
layout=$cache/node-oci
key=$({
	echo "$image_name $hash ${SOURCE_DATE_EPOCH:-0}"
	printf '%s\n' "${config[@]}"
	for a in "${adds[@]}"; do printf '%s %s\n' "${a%%=*}" "$(sha256sum <"${a#*=}" | cut -d' ' -f1)"; done
} | sha256sum | cut -c1-16)
if [[ -f $layout/index.json && $(cat "$cache/node-oci.inputs" 2>/dev/null) == "$key" ]]; then
	log "layout: reusing $layout (inputs $key)"
else
	rm -rf "$layout" "$cache/node-oci.inputs"
	t=$(now_ms)
	add_flags=()
	for a in "${adds[@]}"; do add_flags+=(--add "$a"); done
	"$work/forkfleet-image" build --base "$base_tar" "${add_flags[@]}" "${config[@]}" \
		--name "$image_name" --out "$layout"
	echo "$key" >"$cache/node-oci.inputs"
	log "layout: $layout written in $(secs $(($(now_ms) - t)))"
fi
log "$image_name: $(du -sm --apparent-size "$layout" | cut -f1) MB; total $(secs $(($(now_ms) - t_all)))"
