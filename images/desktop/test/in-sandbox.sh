#!/bin/bash
# Runs INSIDE the desktop image (mounted by boot-test.sh): starts the desktop
# the way guestd.json describes, then checks that X answers, openbox and xterm
# stay up, openbox loaded its config and holds no log file, and that booting
# wrote nothing to the rootfs but /var/lib/xkb (Xvfb's keymap scratch dir).
set -u
fail=0
bad() { echo "FAIL: $*"; fail=1; }
touch /tmp/.boot-marker
t0=$(date +%s%N)
Xvfb :0 -nolisten tcp -noreset -extension GLX -s 0 -dpi 96 -fp built-ins -screen 0 1280x800x24 >/tmp/xvfb.log 2>&1 &
xvfb=$!
for _ in $(seq 500); do [ -S /tmp/.X11-unix/X0 ] && break; sleep 0.01; done
[ -S /tmp/.X11-unix/X0 ] || { cat /tmp/xvfb.log; bad "no X socket"; exit 1; }
echo "X socket after $((($(date +%s%N) - t0) / 1000000)) ms"
xsetroot -solid '#2f3b4c' || bad "xsetroot could not talk to X"
xrandr --current | head -1 | grep -q 'current 1280 x 800' || bad "screen is not 1280x800"
openbox --config-file /etc/forkfleet/openbox/rc.xml --sm-disable >/tmp/openbox-stderr.txt 2>&1 &
ob=$!
xterm -fa "DejaVu Sans Mono" -fs 11 -ut -geometry 100x30+40+40 >/tmp/xterm.log 2>&1 &
xt=$!
sleep 2
files_of() { for fd in /proc/"$1"/fd/*; do readlink "$fd"; done | grep -v -E '^(socket|pipe|anon_inode)' | sort -u | tr '\n' ' '; }
for p in "$xvfb" "$ob" "$xt"; do
	[ -d /proc/"$p" ] || { bad "pid $p died"; continue; }
	echo "$(cat /proc/"$p"/comm): pid $p, RSS $(awk '/VmRSS/ {print $2, $3}' /proc/"$p"/status), files: $(files_of "$p")"
done
files_of "$ob" | grep -q 'openbox/openbox\.log' && bad "openbox holds a log file open"
grep -i error /tmp/openbox-stderr.txt && bad "openbox config error"
[ -s /tmp/xterm.log ] && { cat /tmp/xterm.log; bad "xterm complained"; }
written=$(find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp \) -prune -o -newer /tmp/.boot-marker -print 2>/dev/null | grep -v '^/var/lib/xkb$')
[ -z "$written" ] || bad "boot wrote to the rootfs: $written"
kill $xt $ob $xvfb 2>/dev/null
[ $fail -eq 0 ] && echo "BOOT TEST PASSED"
exit $fail
