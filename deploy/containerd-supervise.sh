#!/bin/bash
# Supervisor for forkfleet's containerd on hosts without systemd.
#
# host-setup.sh installs this file as /usr/local/libexec/forkfleet/containerd-supervise
# and starts it detached (setsid, stdio on the log). It runs containerd in the
# foreground, restarts it when it dies (with backoff when it dies right after
# starting), and stops for good on SIGTERM/SIGINT or when the stop file exists.
#
# Files (all fixed, see deploy/README.md):
#   /run/forkfleet/containerd.pid          pid of THIS supervisor: send it SIGTERM to stop
#   /run/forkfleet/containerd-daemon.pid   pid of the current containerd process
#   /run/forkfleet/containerd.stop         present = do not (re)start containerd
#   /var/log/forkfleet/containerd.log      containerd's and this supervisor's output
set -uo pipefail

readonly CONFIG=${FORKFLEET_CONTAINERD_CONFIG:-/etc/forkfleet/containerd.toml}
readonly CONTAINERD=${FORKFLEET_CONTAINERD_BIN:-/usr/local/bin/containerd}
readonly RUNDIR=/run/forkfleet
readonly PIDFILE=$RUNDIR/containerd.pid
readonly DAEMON_PIDFILE=$RUNDIR/containerd-daemon.pid
readonly STOPFILE=$RUNDIR/containerd.stop
readonly STOP_GRACE_SECONDS=20

# The shim and runc inherit this PATH; runc execs "criu" from it, and the
# forkfleet CRIU >= 4.2 wrapper is in /usr/local/sbin.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf '%s containerd-supervise[%d]: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$$" "$*"; }

# Descriptors inherited from whoever ran host-setup (make, a test harness)
# must not stay open for the lifetime of the daemon: a pipe held open here
# would keep the caller waiting for EOF.
# Bash itself reads this script through one descriptor: keep that one.
self=$(readlink -f "$0")
for fd_path in "/proc/$$/fd/"*; do
	fd=${fd_path##*/}
	if [[ $fd =~ ^[0-9]+$ ]] && ((fd > 2)) && [[ $(readlink "$fd_path" 2>/dev/null) != "$self" ]]; then
		eval "exec $fd>&-" 2>/dev/null || true
	fi
done

stopping=0
child=0

# shellcheck disable=SC2317 # invoked through trap
on_stop() {
	stopping=1
	if ((child > 0)) && kill -0 "$child" 2>/dev/null; then
		log "stop requested: sending SIGTERM to containerd pid $child"
		kill -TERM "$child" 2>/dev/null || true
	fi
}
trap on_stop TERM INT

# containerd, and through it every shim, runc, CRIU and sandbox, runs at the
# host's normal priority whoever (re)started it: host-setup run from
# `nice -n 19 make test` put all of them at nice 19, level with the builds
# beside them, and every benchmark's boots and restores with them.
renice -n 0 -p "$$" >/dev/null 2>&1 || true

mkdir -p "$RUNDIR"
echo "$$" >"$PIDFILE"
log "supervising $CONTAINERD --config $CONFIG"

backoff=1
while ((stopping == 0)) && [[ ! -e $STOPFILE ]]; do
	started=$SECONDS
	"$CONTAINERD" --config "$CONFIG" &
	child=$!
	echo "$child" >"$DAEMON_PIDFILE"
	log "containerd started, pid $child"

	# wait returns early (status > 128) when a trapped signal arrives; keep
	# waiting until the child is really gone. Bash keeps the status of a
	# finished background job, so a second wait after an interrupted one still
	# reports the real exit status (127 only if it was already collected).
	while :; do
		wait "$child"
		status=$?
		if kill -0 "$child" 2>/dev/null; then
			continue
		fi
		wait "$child" 2>/dev/null
		again=$?
		if ((again != 127)); then
			status=$again
		fi
		break
	done
	rm -f "$DAEMON_PIDFILE"
	child=0

	if ((stopping == 1)) || [[ -e $STOPFILE ]]; then
		log "containerd exited (status $status) after stop request"
		break
	fi
	# A daemon that ran for a while gets restarted at once; one that keeps
	# dying at startup (bad config, port in use) is retried slower and slower
	# so the log stays readable.
	if ((SECONDS - started >= 30)); then
		backoff=1
	fi
	log "containerd exited unexpectedly (status $status); restarting in ${backoff}s"
	sleep "$backoff" &
	wait $! 2>/dev/null
	if ((backoff < 30)); then
		backoff=$((backoff * 2))
	fi
done

# Stop requested: make sure nothing is left behind if containerd ignored TERM.
if ((child > 0)); then
	for ((i = 0; i < STOP_GRACE_SECONDS * 10; i++)); do
		kill -0 "$child" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$child" 2>/dev/null; then
		log "containerd pid $child did not exit in ${STOP_GRACE_SECONDS}s: SIGKILL"
		kill -KILL "$child" 2>/dev/null || true
	fi
fi
rm -f "$PIDFILE" "$DAEMON_PIDFILE"
log "supervisor exiting"
exit 0
