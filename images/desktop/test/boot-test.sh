#!/bin/bash
# Boots the imported desktop image in containerd with an entrypoint override
# that runs test/in-sandbox.sh (Xvfb + openbox + xterm, X liveness through
# xsetroot/xrandr as X clients), and fails unless it passes.
#
#   images/desktop/test/boot-test.sh [SOCKET]   (default $FORKFLEET_CONTAINERD_ADDRESS
#                                                or /run/forkfleet/containerd/containerd.sock)
# Needs ctr, containerd-shim-runc-v2 and runc on PATH.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sock=${1:-${FORKFLEET_CONTAINERD_ADDRESS:-/run/forkfleet/containerd/containerd.sock}}
ns=${FORKFLEET_NAMESPACE:-forkfleet}
image=${IMAGE_NAME:-localhost/forkfleet/desktop:latest}
id=desktop-boot-test-$$
exec ctr -a "$sock" -n "$ns" run --rm \
	--mount "type=bind,src=$here/in-sandbox.sh,dst=/forkfleet-boot-test.sh,options=rbind:ro" \
	"$image" "$id" bash /forkfleet-boot-test.sh
