#!/usr/bin/env bash
# web.sh PACKAGES_FILE
#
# Runs as root INSIDE the desktop image root (chroot from build.sh, or a RUN
# step of the Dockerfile): installs PACKAGES_FILE (Depends only) from the
# image's bookworm mirror plus bookworm-security, then prebuilds the font
# cache, checks the browser resolves its libraries and starts headless, and
# drops apt's state. The desktop's dpkg excludes (/etc/dpkg/dpkg.cfg.d/
# forkfleet-slim) keep docs, man pages and locales out as packages install.
#
# Env: SECURITY_MIRROR (default http://deb.debian.org/debian-security).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
pkgs_file=${1:?usage: web.sh PACKAGES_FILE}
mapfile -t pkgs < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$pkgs_file" | grep -v '^$')
security=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}

added=/etc/apt/sources.list.d/forkfleet-web-security.list
echo "deb $security bookworm-security main" >"$added"
apt-get -q update >/dev/null
apt-get -y -q install --no-install-recommends "${pkgs[@]}" >/dev/null
apt-mark manual "${pkgs[@]}" >/dev/null
apt-get -q check >/dev/null
rm -f "$added"

# Chromium keeps its metrics histograms in a 4 MiB file it maps and then
# deletes (BrowserMetrics/BrowserMetrics-*.pma): a deleted file CRIU copies
# into every checkpoint (a "ghost") and writes back into every replica's
# layer. A plain file where that directory would go makes the mapped file
# impossible to create, and Chromium keeps the histograms in its own memory
# instead (its persistent-histograms setup falls back to local memory),
# which KSM merges across replicas. Metrics are off anyway (policies).
install -d -o agent -g agent -m 0700 /home/agent/.config /home/agent/.config/chromium
install -o root -g root -m 0444 /dev/null /home/agent/.config/chromium/BrowserMetrics

# Font cache, so neither the browser nor GTK writes one at first use.
fc-cache -s -f >/dev/null

# The browser and the apps must resolve every library (the desktop dropped
# some hard Depends it never runs; see images/desktop/slim.sh).
missing=$(for f in /usr/lib/chromium/chromium /usr/bin/l3afpad /usr/bin/pcmanfm; do
	ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^|$f: |"
done || true)
[ -z "$missing" ] || { echo "web: unresolved libraries:" >&2; echo "$missing" >&2; exit 1; }
# Smoke test: the browser runs and renders (headless, no X needed).
out=$(/usr/lib/chromium/chromium --headless=new --no-sandbox --disable-gpu --no-first-run \
	--user-data-dir=/tmp/web-smoke --dump-dom 'data:text/html,<p id=x>forkfleet-smoke</p>' 2>/tmp/web-smoke.log) ||
	{ cat /tmp/web-smoke.log >&2; echo "web: chromium --headless failed" >&2; exit 1; }
grep -q forkfleet-smoke <<<"$out" || { cat /tmp/web-smoke.log >&2; echo "web: chromium rendered no DOM" >&2; exit 1; }

apt-get clean
rm -rf /var/lib/apt/lists/*
mkdir -p /var/lib/apt/lists/partial
rm -f /var/cache/debconf/*-old /var/lib/dpkg/*-old
find /var/log -type f -delete
rm -rf /tmp/* /tmp/.[!.]* /var/tmp/* /root/.bash_history /root/.cache/fontconfig /root/.config /root/.pki
