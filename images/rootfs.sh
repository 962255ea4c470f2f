# The functions that shape an image's base rootfs (sourced by lib.sh, not
# run). Every base's inputs hash covers this file: a change here rebuilds them.

# debootstrap_rootfs ROOT SUITE PACKAGES_TXT: a minbase (amd64) of SUITE with
# the packages PACKAGES_TXT lists, from MIRROR or the host's mirror. Its log
# is kept beside ROOT; its tail is printed when it fails.
debootstrap_rootfs() {
	local root=$1 suite=$2 list=$3 mirror pkgs t0=$SECONDS
	mirror=${MIRROR:-$(apt_mirror "$suite")}
	mapfile -t pkgs < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$list" | grep -v '^$')
	[[ ${#pkgs[@]} -gt 0 ]] || die "$list lists no packages"
	log "debootstrap $suite (amd64, minbase) from $mirror: ${pkgs[*]}"
	debootstrap --variant=minbase --arch=amd64 --components=main \
		--include="$(IFS=,; echo "${pkgs[*]}")" "$suite" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
		{ tail -n 30 "$root.debootstrap.log" >&2; die "debootstrap failed (log above)"; }
	log "debootstrap done in $((SECONDS - t0)) s"
}

# in_chroot ROOT [UNSHARE_FLAG...] -- VAR=VALUE... COMMAND...: runs COMMAND in
# a chroot of ROOT with only the given environment, inside a private mount
# namespace (plus the flags, e.g. --net) where /proc and /dev are mounted:
# they vanish with the namespace, even on failure.
in_chroot() {
	local root=$1 flags=()
	shift
	while [[ $1 != -- ]]; do flags+=("$1"); shift; done
	shift
	# shellcheck disable=SC2016 # $ROOT expands in the inner shell, on purpose
	unshare --mount --fork "${flags[@]}" env ROOT="$root" bash -euo pipefail -c '
		mount --make-rprivate /
		mount -t proc proc "$ROOT/proc"
		mount --rbind /dev "$ROOT/dev"
		chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"
	' in_chroot "$@"
}

# host_files ROOT HOSTNAME: the files debootstrap copied from the build host
# replaced by the sandbox's own (the runtime fills resolv.conf).
host_files() {
	: >"$1/etc/resolv.conf"
	echo "$2" >"$1/etc/hostname"
	printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$1/etc/hosts"
}

# tar_rootfs ROOT OUT: ROOT as an uncompressed tar with numeric owners in a
# stable order, written beside OUT and renamed. dev, proc, sys and run keep
# only their directories: the runtime mounts them.
tar_rootfs() {
	local tmp="$2.tmp.$$"
	tar --numeric-owner --sort=name --xattrs --acls -C "$1" \
		--exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' --exclude='./run/*' \
		-cf "$tmp" .
	mv -f "$tmp" "$2"
}

# apply_overlay SRC ROOT: copies SRC's files and symlinks over ROOT. Directory
# modes come from ROOT (or 0755 for new ones), not from the checkout's umask.
apply_overlay() {
	local src=$1 root=$2
	(
		cd "$src"
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
}
