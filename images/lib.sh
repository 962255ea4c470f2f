# Shared by the image build scripts (sourced, not run). A script sets
# image_tag (its name in log lines) before it sources this file.

# apt_mirror, and host-setup's other functions (node's build uses them);
# once only, as host-setup's constants are readonly.
# shellcheck source=../deploy/host-setup.sh
[[ -v CONTAINERD_VERSION ]] || . "$(dirname "${BASH_SOURCE[0]}")/../deploy/host-setup.sh"

log() { printf '[%s] %s\n' "${image_tag:-image}" "$*" >&2; }
die() { printf '[%s] error: %s\n' "${image_tag:-image}" "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }
secs() { awk -v ms="$1" 'BEGIN { printf "%.1f s", ms / 1000 }'; }

# need_root WHY and need_tools TOOL...: a build stops up front, naming what is missing.
need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root ($1)"; }
need_tools() {
	local t
	for t in "$@"; do
		command -v "$t" >/dev/null || die "missing tool: $t"
	done
}

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

# inputs_hash DIR TAG [EXTRA...]: hash of everything that shapes an image's
# base rootfs: packages.txt and the *.sh scripts named in EXTRA, then every
# path of DIR/rootfs with its contents, executable bit or symlink target, in a
# stable order. Directory modes are left out: they depend on the checkout's
# umask, and the builds do not use them. TAG names the image (and the
# scheme's version), so two images never share a hash.
inputs_hash() {
	local dir=$1 tag=$2
	shift 2
	(
		cd "$dir"
		{
			echo "$tag"
			for f in "$@"; do
				printf '%s %s\n' "$f" "$(sha256sum <"$f" | cut -d' ' -f1)"
			done
			find rootfs -print0 | LC_ALL=C sort -z | while IFS= read -r -d '' p; do
				if [[ -L $p ]]; then
					printf 'L %s -> %s\n' "$p" "$(readlink "$p")"
				elif [[ -d $p ]]; then
					printf 'D %s\n' "$p"
				else
					x=-; [[ -x $p ]] && x=x
					printf 'F %s %s %s\n' "$p" "$x" "$(sha256sum <"$p" | cut -d' ' -f1)"
				fi
			done
		} | sha256sum | cut -c1-16
	)
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

# guestd_version REPO: the version stamped into an image's guestd: the date
# and commit of the last change to what guestd is built from (guestd/, api/),
# -dirty with uncommitted changes there. It changes only when guestd's
# sources do, so an image rebuilt for another reason keeps its guestd layer.
guestd_version() {
	local repo=$1 v
	v=$(git -C "$repo" log -1 --format=%cd-%h --date=format:%Y%m%d -- guestd api 2>/dev/null) || v=
	[[ -n $v ]] || { echo dev; return; }
	git -C "$repo" diff --quiet HEAD -- guestd api 2>/dev/null || v=$v-dirty
	echo "$v"
}

# guestd_binary REPO WORK: the guestd an image carries, GUESTD_BIN when set,
# else REPO's guestd built into WORK; prints its path.
guestd_binary() {
	local repo=$1 work=$2 t
	if [[ -n ${GUESTD_BIN:-} ]]; then
		[[ -x $GUESTD_BIN ]] || die "GUESTD_BIN=$GUESTD_BIN is not an executable file"
		log "guestd: using $GUESTD_BIN"
		echo "$GUESTD_BIN"
		return
	fi
	t=$(now_ms)
	(cd "$repo/guestd" && CGO_ENABLED=1 go build -trimpath -ldflags="-s -w -X main.version=$(guestd_version "$repo")" -o "$work/guestd" ./cmd/guestd) >&2 ||
		die "guestd does not build; pass GUESTD_BIN=<path> to use a prebuilt binary"
	log "guestd: built in $(secs $(($(now_ms) - t)))"
	echo "$work/guestd"
}

# image_tool REPO OUT: builds forkfleet-image (writes and imports OCI layouts) at OUT.
image_tool() {
	(cd "$1/controld" && CGO_ENABLED=0 go build -trimpath -o "$2" ./cmd/forkfleet-image) ||
		die "forkfleet-image does not build"
}
