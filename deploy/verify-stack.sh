#!/bin/bash
# Smoke test of the host stack that host-setup.sh installed, without images or
# a registry: a busybox container (Debian's busybox-static) is
#   1. run, checkpointed (--leave-running) and restored as a second container
#      with runc + CRIU directly; the restored copy must continue the source's
#      in-memory counter (it restarts from 1 if memory was not restored);
#   2. run through containerd (ctr run --rootfs, namespace forkfleet) and
#      checkpointed through the shim (ctr task checkpoint --image-path), which
#      proves containerd's PATH reaches the CRIU >= 4.2 wrapper.
# Prints timings. Needs root and a ready host (deploy/host-setup.sh).
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C

readonly ENV_FILE=/etc/forkfleet/host.env
readonly BB_CACHE=/var/cache/forkfleet/busybox
[[ -f $ENV_FILE ]] || {
	echo "verify-stack: $ENV_FILE missing: run deploy/host-setup.sh first" >&2
	exit 1
}
# shellcheck source=/dev/null
. "$ENV_FILE"

work=$(mktemp -d /var/tmp/forkfleet-verify.XXXXXX)
runc_root=/run/forkfleet/runc-verify
ctr=("$FORKFLEET_CTR" -a "$FORKFLEET_CONTAINERD_ADDRESS" -n "$FORKFLEET_CONTAINERD_NAMESPACE")
ctr_id=verify-$$

ms_since() { echo $(((${EPOCHREALTIME/./} - $1) / 1000)); }
now() { echo "${EPOCHREALTIME/./}"; }
fail() {
	echo "verify-stack: FAIL: $*" >&2
	exit 1
}
cleanup() {
	runc --root "$runc_root" delete -f src >/dev/null 2>&1 || true
	runc --root "$runc_root" delete -f fork >/dev/null 2>&1 || true
	"${ctr[@]}" task kill -s KILL "$ctr_id" >/dev/null 2>&1 || true
	sleep 0.2
	"${ctr[@]}" task rm -f "$ctr_id" >/dev/null 2>&1 || true
	"${ctr[@]}" container rm "$ctr_id" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

# busybox rootfs
if ! compgen -G "$BB_CACHE/busybox-static_*.deb" >/dev/null; then
	mkdir -p "$BB_CACHE"
	(cd "$BB_CACHE" && apt-get -q download busybox-static >/dev/null 2>&1) ||
		fail "apt-get download busybox-static failed"
fi
dpkg -x "$(compgen -G "$BB_CACHE/busybox-static_*.deb" | head -n 1)" "$work/bb"
mkdir -p "$work/bundle/rootfs/"{bin,proc,sys,dev,tmp,etc,run}
cp "$work/bb/bin/busybox" "$work/bundle/rootfs/bin/"
for a in sh sleep echo cat; do ln -s busybox "$work/bundle/rootfs/bin/$a"; done
# shellcheck disable=SC2016 # expanded by the container's shell
counter='i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done'

(cd "$work/bundle" && runc spec)
python3 - "$work/bundle/config.json" "$counter" <<'EOF'
import json, sys
path, script = sys.argv[1], sys.argv[2]
spec = json.load(open(path))
spec["process"]["terminal"] = False
spec["process"]["args"] = ["/bin/sh", "-c", script]
spec["root"]["readonly"] = False
json.dump(spec, open(path, "w"), indent=1)
EOF

# 1. runc + CRIU
(cd "$work/bundle" && runc --root "$runc_root" run -d src </dev/null >/dev/null 2>&1) || fail "runc run"
sleep 1
t=$(now)
runc --root "$runc_root" checkpoint --leave-running --image-path "$work/img" --work-path "$work/dump" src ||
	fail "runc checkpoint (log $work/dump/dump.log)"
t_dump=$(ms_since "$t")
at_dump=$(cat "$work/bundle/rootfs/tmp/count")
cp -a "$work/bundle" "$work/fork"
echo 0 >"$work/fork/rootfs/tmp/count"
t=$(now)
(cd "$work/fork" && runc --root "$runc_root" restore -d --image-path "$work/img" --work-path "$work/restore" fork </dev/null >/dev/null 2>&1) ||
	fail "runc restore (log $work/restore/restore.log)"
t_restore=$(ms_since "$t")
sleep 0.5
fork_count=$(cat "$work/fork/rootfs/tmp/count")
src_count=$(cat "$work/bundle/rootfs/tmp/count")
((fork_count > at_dump)) || fail "restored counter $fork_count did not continue from $at_dump"
grep -q 'Loaded kdat cache' "$work/dump/dump.log" || echo "verify-stack: note: CRIU did not use /run/criu.kdat"
grep -q "Parsing config file $FORKFLEET_CRIU_CONFIG" "$work/dump/dump.log" ||
	echo "verify-stack: note: CRIU did not read $FORKFLEET_CRIU_CONFIG"
echo "verify-stack: runc+criu  ok: checkpoint --leave-running ${t_dump} ms (counter $at_dump), restore ${t_restore} ms; fork continued to $fork_count, source to $src_count"

# 2. containerd + shim + runc + CRIU
mkdir -p "$work/ctr-rootfs"
cp -a "$work/bundle/rootfs/." "$work/ctr-rootfs/"
t=$(now)
"${ctr[@]}" run -d --rootfs "$work/ctr-rootfs" "$ctr_id" /bin/sh -c "$counter" 2>&1 | grep -v DEPRECATION || true
"${ctr[@]}" task ls 2>/dev/null | grep -q "^$ctr_id .*RUNNING" || fail "ctr run --rootfs: task not running"
t_run=$(ms_since "$t")
sleep 0.5
t=$(now)
"${ctr[@]}" task checkpoint --image-path "$work/ctr-img" --work-path "$work/ctr-dump" "$ctr_id" 2>&1 | grep -v DEPRECATION || true
[[ -f $work/ctr-img/inventory.img ]] || fail "ctr task checkpoint wrote no image (log $work/ctr-dump/dump.log)"
t_cdump=$(ms_since "$t")
"${ctr[@]}" task ls 2>/dev/null | grep -q "^$ctr_id .*RUNNING" || fail "task not running after checkpoint"
echo "verify-stack: containerd ok: ctr run --rootfs ${t_run} ms, task checkpoint (leave running) ${t_cdump} ms via $(awk '/Version:/ {print "criu " $3; exit}' "$work/ctr-dump/dump.log")"
