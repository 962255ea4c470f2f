#!/usr/bin/env bash
# binaries.sh OUT
#
# Writes the node image's binaries as a tree under OUT, with deploy/host-setup.sh's
# own functions: the entrypoint forkfleet-node, containerd, containerd-shim-runc-v2
# and ctr (host-setup's build, stripped), controld, forkfleet-log,
# forkfleet-nethook and forkfleetctl in usr/local/bin; CRIU's wrapper (a program) in usr/local/sbin/criu, its
# preload library in usr/local/lib/forkfleet (outside the DaemonSet's host
# paths /var/lib/forkfleet and /run/forkfleet, which would hide an image's
# file there) and etc/forkfleet/criu.conf. The wrapper runs the private CRIU
# of /opt/forkfleet/criu, which base.sh (or the Dockerfile) unpacks from the
# same .debs. Shared by build.sh and the Dockerfile.
#
# Env: VERSION (the binaries' version; default git describe, as make build).
set -euo pipefail

out=${1:?usage: binaries.sh OUT}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
version=${VERSION:-$(git -C "$repo" describe --tags --always --dirty 2>/dev/null || echo dev)}

# shellcheck source=../../deploy/host-setup.sh
. "$repo/deploy/host-setup.sh"
export PATH=$PATH:/usr/local/go/bin

die() { printf '[node-binaries] error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$LIB_DIR" "$LOG_DIR" "$out/usr/local/bin" "$out/usr/local/sbin" "$out/usr/local/lib/forkfleet" "$out/etc/forkfleet"
# host-setup's containerd build and CRIU .debs: the host's own when it made
# them, else made now the same way.
if ! cache_complete; then
	build_containerd
	cache_complete || die "$CONTAINERD_CACHE lacks containerd v$CONTAINERD_VERSION after the build"
fi
newest_cached_criu >/dev/null || download_criu >/dev/null

for b in containerd containerd-shim-runc-v2 ctr; do
	strip -o "$out/usr/local/bin/$b" "$CONTAINERD_CACHE/$b"
done
ldflags="-s -w -X main.version=$version"
(cd "$repo/controld" && go build -trimpath -ldflags "$ldflags" -o "$out/usr/local/bin/controld" ./cmd/controld &&
	CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/usr/local/bin/forkfleet-log" ./cmd/forkfleet-log &&
	CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/usr/local/bin/forkfleet-nethook" ./cmd/forkfleet-nethook) ||
	die "controld's binaries do not build"
(cd "$repo/api" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/usr/local/bin/forkfleetctl" ./cmd/forkfleetctl) ||
	die "forkfleetctl does not build"
build_criu_preload "$out/usr/local/lib/forkfleet/criu-preload.so" || die "the CRIU preload library does not build"
# The wrapper answers runc's VERSION probes from /run/forkfleet/criu-version.cache,
# which forkfleet-node records at its start (the image's CRIU has a new inode in
# every container).
build_criu_wrapper "$out/usr/local/sbin/criu" /usr/local/lib/forkfleet/criu-preload.so /run/forkfleet/criu-version.cache ||
	die "the CRIU wrapper does not build"
chmod 0755 "$out/usr/local/sbin/criu"
criu_conf >"$out/etc/forkfleet/criu.conf"
install -m 0755 "$here/forkfleet-node" "$out/usr/local/bin/forkfleet-node"
