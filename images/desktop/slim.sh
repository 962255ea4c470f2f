#!/usr/bin/env bash
# slim.sh PACKAGES_FILE
#
# Runs as root INSIDE the image root (chroot from base.sh, or a RUN step of
# the Dockerfile) after the packages of PACKAGES_FILE are installed. Shared by
# both builds so they produce the same tree:
#  1. drops Depends the sandbox never runs through a stand-in package that
#     Provides them at their installed versions, then apt autoremove (dpkg and
#     apt stay consistent for derived images);
#  2. adds the unprivileged agent user; prebuilds the fontconfig cache
#     (nothing writes one at first use);
#  3. smoke-tests Xvfb and checks every program and library still resolves;
#  4. prunes docs (keeping copyright files), man/info pages, locales except
#     en, apt lists and caches, logs, temp files.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
pkgs_file=${1:?usage: slim.sh PACKAGES_FILE}
mapfile -t keep < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$pkgs_file" | grep -v '^$')

# Never run in the sandbox:
#  python3          openbox's openbox-xdg-autostart helper (we start plain openbox)
#  cpp              xrdb in x11-xserver-utils (we load no X resources)
#  libgl1-mesa-dri  swrast/llvmpipe DRI drivers and LLVM (Xvfb runs with -extension GLX)
#  libspectre1 libheif1 libjxl0.7 libid3tag0
#                   imlib2 loaders (PostScript via ghostscript, HEIF/AVIF, JPEG XL,
#                   ID3): openbox loads no image files with showIcons off.
#                   (librsvg2 stays: libobrender links it directly.)
# `apt-get install <name>` in a derived image brings one back (plus
# `apt-get install --reinstall libimlib2` for its loader module).
pruned=(python3 cpp libgl1-mesa-dri libspectre1 libheif1 libjxl0.7 libid3tag0)
pruned_loaders=(ps heif jxl id3)
# Installed only as an alternative of an or-dependency that another listed
# package already satisfies (fontconfig-config: fonts-dejavu-core | ... |
# fonts-urw-base35), which autoremove keeps: 15 MB of PostScript fonts.
unneeded=(fonts-urw-base35)

provides=""
for p in "${pruned[@]}"; do
	v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null) || { echo "slim: $p is not installed; update the prune list" >&2; exit 1; }
	provides="${provides:+$provides, }$p (= $v)"
done
pdir=$(mktemp -d)
mkdir -p "$pdir/DEBIAN"
cat >"$pdir/DEBIAN/control" <<CTL
Package: forkfleet-desktop-pruned
Version: 1
Architecture: all
Maintainer: forkfleet <forkfleet@localhost>
Priority: optional
Section: misc
Provides: $provides
Description: stands in for dependencies the forkfleet sandbox never runs
 See images/desktop/slim.sh in the forkfleet repository. Install the real
 package to get one back.
CTL
dpkg-deb --root-owner-group --build "$pdir" "$pdir.deb" >/dev/null
dpkg -i "$pdir.deb" >/dev/null
rm -rf "$pdir" "$pdir.deb"

# Everything automatic except what we asked for and the base system, so
# autoremove takes what the dropped packages leave behind.
mapfile -t all < <(dpkg-query -W -f='${Package}\n')
mapfile -t base < <(dpkg-query -W -f='${Package} ${Priority} ${Essential}\n' |
	awk '$2=="required" || $2=="important" || $3=="yes" {print $1}')
apt-mark auto "${all[@]}" >/dev/null
apt-mark manual "${base[@]}" >/dev/null
apt-mark manual "${keep[@]}" forkfleet-desktop-pruned >/dev/null
apt-get -y -q purge "${pruned[@]}" >/dev/null
apt-get -y -q --purge autoremove >/dev/null
for p in "${unneeded[@]}"; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
		apt-get -y -q purge "$p" >/dev/null
	fi
done
for p in "${keep[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" | grep -q 'install ok installed' ||
		{ echo "slim: package $p got removed" >&2; exit 1; }
done
apt-get -q check >/dev/null
for l in "${pruned_loaders[@]}"; do
	rm -f "/usr/lib/x86_64-linux-gnu/imlib2/loaders/$l.so"
done

# The unprivileged user agents act as (guestd.json "user"): exec, launch,
# the window manager and the session apps run as agent (uid/gid 1000);
# guestd stays root (it is init and serves X and /proc). Its home holds
# what /root holds for root: openbox's log directory is /dev/null, so
# openbox keeps no log file open (one file fewer for every checkpoint).
useradd --uid 1000 --user-group --create-home --home-dir /home/agent --shell /bin/bash agent
install -d -o agent -g agent -m 0755 /home/agent/.cache
ln -s /dev/null /home/agent/.cache/openbox
chown -h agent:agent /home/agent/.cache/openbox

# Font cache, so no client builds (and writes) one at first use. (Xvfb's
# keymap cannot be prebuilt: xserver 21 compiles it into
# /var/lib/xkb/server-<display>.xkm and deletes it at every start.)
fc-cache -s -f >/dev/null

# Smoke test: Xvfb starts with the pruned GL stack when GLX is off.
Xvfb :99 -nolisten tcp -extension GLX -fp built-ins -screen 0 64x64x24 >/tmp/xvfb.log 2>&1 &
xpid=$!
for _ in $(seq 100); do [ -S /tmp/.X11-unix/X99 ] && break; sleep 0.05; done
[ -S /tmp/.X11-unix/X99 ] || { echo "slim: Xvfb did not start:" >&2; cat /tmp/xvfb.log >&2; exit 1; }
kill "$xpid"
wait "$xpid" 2>/dev/null || true

# Every program and shared object must still resolve its libraries.
missing=$(for f in /usr/bin/* /usr/sbin/* $(find /usr/lib -name '*.so*' -type f); do
	ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^|$f: |"
done || true)
[ -z "$missing" ] || { echo "slim: unresolved libraries after prune:" >&2; echo "$missing" >&2; exit 1; }

# Prune.
find /usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf /usr/share/man /usr/share/info /usr/share/groff /usr/share/lintian /usr/share/linda /usr/share/bug /var/cache/man
find /usr/share/locale -mindepth 1 -maxdepth 1 -type d -not -name 'en' -not -name 'en_*' -exec rm -rf {} +
apt-get clean
rm -rf /var/lib/apt/lists/*
mkdir -p /var/lib/apt/lists/partial
rm -f /var/cache/debconf/*-old /var/lib/dpkg/*-old
find /var/log -type f -delete
rm -rf /tmp/* /tmp/.[!.]* /var/tmp/* /root/.bash_history
