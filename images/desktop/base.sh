#!/usr/bin/env bash
# base.sh ROOTFS_TAR_OUT
#
# Builds the forkfleet desktop base rootfs WITHOUT Docker and writes it as an
# uncompressed tar. Called by build.sh only when no cached tar matches the
# hash of (packages.txt, this script, slim.sh, rootfs/ overlay). Needs root, debootstrap,
# unshare and network access to the host's Debian mirror.
#
# Steps: debootstrap minbase + packages.txt; overlay rootfs/; slim.sh in a
# chroot (drops runtime-unneeded dependencies, prebuilds the font cache,
# smoke-tests Xvfb, prunes docs/man/locales/apt state; the Dockerfile runs the
# same script); tar with numeric owners in a stable order.
set -euo pipefail

out=${1:?usage: base.sh ROOTFS_TAR_OUT}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
suite=bookworm
arch=amd64

log() { printf '[base] %s\n' "$*" >&2; }
die() { printf '[base] error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, chroot)"
for t in debootstrap unshare chroot tar; do
	command -v "$t" >/dev/null || die "missing tool: $t"
done

# The host's Debian mirror (first non-security URI serving $suite) unless
# MIRROR is given, so builds use the same, reachable, possibly pinned mirror.
detect_mirror() {
	local f uri
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -f $f ]] || continue
		uri=$(awk -v s="$suite" '$1=="deb" { for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) { if ($(i+1)==s && $i !~ /security/) { print $i; exit } break } }' "$f")
		[[ -n $uri ]] && { echo "$uri"; return; }
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] || continue
		# deb822: paragraphs separated by blank lines.
		uri=$(awk -v s="$suite" '
			BEGIN { RS=""; FS="\n" }
			{
				uris=""; suites=""; types=""
				for (i=1;i<=NF;i++) {
					if ($i ~ /^URIs:/)   { uris=$i;   sub(/^URIs:[ \t]*/, "", uris) }
					if ($i ~ /^Suites:/) { suites=" " $i " " }
					if ($i ~ /^Types:/)  { types=$i }
					if ($i ~ /^Enabled:[ \t]*no/) { types="" }
				}
				if (types ~ /deb( |$)/ && suites ~ (" " s " ") && uris !~ /security/) { split(uris, u, " "); print u[1]; exit }
			}' "$f")
		[[ -n $uri ]] && { echo "$uri"; return; }
	done
	echo "http://deb.debian.org/debian"
}
mirror=${MIRROR:-$(detect_mirror)}

mapfile -t pkgs < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/packages.txt" | grep -v '^$')
[[ ${#pkgs[@]} -gt 0 ]] || die "packages.txt lists no packages"

work=$(mktemp -d /var/tmp/forkfleet-desktop-base.XXXXXX)
root=$work/rootfs
cleanup() {
	# Mounts live in a private mount namespace (unshare -m) and die with it;
	# this only removes files. FORKFLEET_BASE_KEEP=1 keeps them to debug.
	if [[ -n ${FORKFLEET_BASE_KEEP:-} ]]; then log "kept $work"; return; fi
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT

t0=$SECONDS
log "debootstrap $suite ($arch, minbase) from $mirror: ${pkgs[*]}"
include=$(IFS=,; echo "${pkgs[*]}")
debootstrap --variant=minbase --arch="$arch" --components=main \
	--include="$include" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
	{ tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
log "debootstrap done in $((SECONDS - t0)) s"

log "applying overlay $here/rootfs"
# Files and symlinks only: directory modes come from debootstrap (or 0755
# for new ones), not from the checkout's umask.
(
	cd "$here/rootfs"
	find . -mindepth 1 -type d -print0 | while IFS= read -r -d '' d; do
		[[ -d $root/$d ]] || install -d -m 0755 -o 0 -g 0 "$root/$d"
	done
	find . \( -type f -o -type l \) -print0 | while IFS= read -r -d '' f; do
		rm -f "$root/$f"
		if [[ -L $f ]]; then
			ln -s "$(readlink "$f")" "$root/$f"
		else
			mode=0644; [[ -x $f ]] && mode=0755
			install -m "$mode" -o 0 -g 0 "$f" "$root/$f"
		fi
	done
)

# Everything in the chroot runs in private mount and network namespaces:
# /proc and /dev are mounted into the chroot and vanish with the namespace
# even on failure, and slim.sh's smoke-test Xvfb cannot collide with an X
# server on the host through its abstract socket.
log "slimming in chroot (slim.sh: drop unused deps, font cache, smoke test, prune)"
mkdir -p "$root/tmp/forkfleet"
cp "$here/slim.sh" "$here/packages.txt" "$root/tmp/forkfleet/"
# shellcheck disable=SC2016 # $ROOT expands in the inner shell, on purpose
unshare --mount --net --fork env ROOT="$root" bash -euo pipefail -c '
	mount --make-rprivate /
	mount -t proc proc "$ROOT/proc"
	mount --rbind /dev "$ROOT/dev"
	chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
		bash /tmp/forkfleet/slim.sh /tmp/forkfleet/packages.txt
'
rm -rf "$root/tmp/forkfleet"
# Host-specific files debootstrap copied in; the runtime provides them.
: >"$root/etc/resolv.conf"
echo forkfleet >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"

log "writing $out"
tmp_out="$out.tmp.$$"
# dev, proc, sys, run: the runtime mounts them; keep only the directories.
tar --numeric-owner --sort=name --xattrs --acls -C "$root" \
	--exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' --exclude='./run/*' \
	-cf "$tmp_out" .
mv -f "$tmp_out" "$out"
log "base rootfs: $(du -m --apparent-size "$out" | cut -f1) MB tar, $(du -sm "$root" | cut -f1) MB on disk, built in $((SECONDS - t0)) s"
