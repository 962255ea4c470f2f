#!/usr/bin/env bash
# Builds (or reuses) the kube-apiserver of this directory (Kubernetes' API server with an embedded etcd, from
# Go modules only) for deploy/kubernetes's server-side dry run (`make kube-apiserver`).
#
# A cold build compiles most of Kubernetes (minutes of both cores), so the binary is cached by its inputs:
# this directory's go.mod, go.sum and Go sources, this script and the Go version. It is kept in
# $CACHE/<key>/kube-apiserver with $CACHE/bin linking to the current key (the test runs $CACHE/bin/kube-apiserver);
# other keys are removed once a build succeeds. deploy/host-setup.sh --uninstall --keep-caches keeps $CACHE.
#
#   deploy/kubernetes/apiserver/build.sh        build or reuse, print the binary's path
set -euo pipefail
cd "$(dirname "$0")"
export PATH=/usr/local/go/bin:$PATH
CACHE=${FORKFLEET_KUBE_APISERVER_CACHE:-/var/cache/forkfleet/kube-apiserver}

# Not in the repository's go.work: Kubernetes' requirements would raise the
# versions every other module builds with. No VCS stamp: the same inputs give
# the same binary in any checkout.
export GOWORK=off GOFLAGS="-trimpath -buildvcs=false"

key=$({
	go version
	cat build.sh go.mod go.sum
	find . -name '*.go' -print0 | sort -z | xargs -0 cat
} | sha256sum | cut -c1-16)
dir=$CACHE/$key

if [[ -x $dir/kube-apiserver ]]; then
	ln -sfn "$key" "$CACHE/bin"
	echo "kube-apiserver: reused $dir/kube-apiserver ($("$dir/kube-apiserver" -version))" >&2
	echo "$CACHE/bin/kube-apiserver"
	exit 0
fi

# The version Kubernetes' release builds stamp (/version, kube-apiserver
# --version), from the module's requirement.
kver=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
major=${kver#v}
major=${major%%.*}
minor=${kver#v*.}
minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=$major"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"

start=$(date +%s)
tmp=$CACHE/$key.tmp.$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
echo "kube-apiserver: building $kver from Go modules (a cold build takes minutes) into $dir" >&2
go build -ldflags "$ldflags" -o "$tmp/kube-apiserver" .
# vet reuses the build's compiled packages: seconds here, where `make check`
# (outside this module) would compile all of Kubernetes again.
go vet ./...
got=$("$tmp/kube-apiserver" -version)
[[ $got == "kube-apiserver $kver, "* ]] || {
	echo "kube-apiserver: built binary reports '$got', want $kver" >&2
	exit 1
}
rm -rf "$dir"
mv "$tmp" "$dir"
ln -sfn "$key" "$CACHE/bin"
find "$CACHE" -mindepth 1 -maxdepth 1 ! -name "$key" ! -name bin ! -name "*.tmp.*" -exec rm -rf {} +
echo "kube-apiserver: built $got in $(($(date +%s) - start)) s" >&2
echo "$CACHE/bin/kube-apiserver"
