#!/usr/bin/env bash
# Installs and (re)starts controld on a host prepared by host-setup.sh.
#
#   deploy/controld-up.sh BINARY   install BINARY as /usr/local/bin/controld (and its
#                                  helpers forkfleet-log and forkfleet-nethook beside
#                                  it) and (re)start it
#   deploy/controld-up.sh --stop   stop it (sandboxes keep running; controld reconciles at start)
#
# Under systemd it uses forkfleet-controld.service (Type=notify). Elsewhere it
# runs controld in the background with a pid file and a log file.
set -euo pipefail

readonly BIN_DST=/usr/local/bin/controld
# controld's helpers, found beside its own binary: the log writer the
# runtime hands containerd's shim for every sandbox's stdio, and the hook
# runc runs for every sandbox's network (controld/cmd/forkfleet-nethook).
readonly HELPERS=(forkfleet-log forkfleet-nethook)
readonly PIDFILE=/run/forkfleet/controld.pid
readonly LOG=/var/log/forkfleet/controld.log
readonly SOCK=/run/forkfleet/controld.sock
UNIT_SRC="$(cd "$(dirname "$0")" && pwd)/systemd/forkfleet-controld.service"
readonly UNIT_SRC

say() { printf 'controld-up: %s\n' "$*"; }
die() { printf 'controld-up: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root"

systemd_running() { [ -d /run/systemd/system ]; }

stop_background() {
	local pid
	[ -f "$PIDFILE" ] || return 0
	pid=$(cat "$PIDFILE")
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid"
		# Graceful shutdown drains in-flight calls; give it the same budget as the unit.
		for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$pid" 2>/dev/null; then
			say "controld (pid $pid) did not stop in 30 s; killing it"
			kill -KILL "$pid" || true
		fi
		say "stopped controld (pid $pid)"
	fi
	rm -f "$PIDFILE"
}

if [ "${1:-}" = "--stop" ]; then
	if systemd_running; then
		systemctl stop forkfleet-controld.service && say "stopped forkfleet-controld.service"
	else
		stop_background
	fi
	exit 0
fi

src=${1:-}
if [ -z "$src" ] || [ ! -x "$src" ]; then die "usage: $0 BINARY | --stop"; fi
for h in "${HELPERS[@]}"; do
	h_src="$(dirname "$src")/$h"
	[ -x "$h_src" ] || die "$h_src missing: controld needs its helpers beside it (make build makes them)"
	install -m 0755 "$h_src" "/usr/local/bin/$h.new"
	mv -f "/usr/local/bin/$h.new" "/usr/local/bin/$h"
done
install -m 0755 "$src" "$BIN_DST.new"
mv -f "$BIN_DST.new" "$BIN_DST"
mkdir -p /run/forkfleet /var/log/forkfleet

if systemd_running; then
	install -m 0644 "$UNIT_SRC" /etc/systemd/system/forkfleet-controld.service
	systemctl daemon-reload
	systemctl enable forkfleet-controld.service >/dev/null 2>&1
	systemctl restart forkfleet-controld.service
	say "restarted forkfleet-controld.service"
else
	stop_background
	# A controld that was killed leaves its socket behind: the wait below
	# must see the new one.
	rm -f "$SOCK"
	# setsid: controld must not die with the shell that started it. Every
	# descriptor above stderr is closed first: a caller that holds a lock
	# (`flock /tmp/forkfleet-bench.lock deploy/controld-up.sh ...`) would
	# otherwise have it held by controld for controld's whole life.
	# shellcheck disable=SC2016 # expanded by the inner shell, on purpose
	setsid bash -c 'for f in /proc/$$/fd/*; do n=${f##*/}; [ "$n" -gt 2 ] && eval "exec $n>&-"; done; exec "$0"' \
		"$BIN_DST" >>"$LOG" 2>&1 </dev/null &
	echo $! >"$PIDFILE"
	say "started controld (pid $(cat "$PIDFILE"), log $LOG)"
fi

for _ in $(seq 1 200); do
	if [ -S "$SOCK" ]; then
		say "controld is serving on unix://$SOCK"
		exit 0
	fi
	if ! systemd_running && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
		tail -n 30 "$LOG" >&2 || true
		die "controld exited during start-up (log above)"
	fi
	sleep 0.05
done
tail -n 30 "$LOG" >&2 || true
die "controld did not open $SOCK within 10 s (log above)"
