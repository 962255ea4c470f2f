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

# The functions that shape a base rootfs: a file of their own, an input of
# every base's hash (what is here is not, so a change to it rebuilds no base).
# shellcheck source=rootfs.sh
. "$(dirname "${BASH_SOURCE[0]}")/rootfs.sh"

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

# desktop_layout TOOL BASE_TAR GUESTD LAYOUT NAME BASE_HASH [FLAG...]: writes
# the OCI layout of a desktop image (BASE_TAR, then guestd as the entrypoint)
# with the desktop's config; an image built on the desktop adds its FLAGs.
desktop_layout() {
	local tool=$1 base=$2 guestd=$3 layout=$4 name=$5 hash=$6
	shift 6
	rm -rf "$layout"
	"$tool" build \
		--base "$base" \
		--add "/usr/local/bin/guestd=$guestd" \
		--entrypoint /usr/local/bin/guestd \
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--env HOME=/root \
		--env DISPLAY=:0 \
		--env LANG=C.UTF-8 \
		--workdir /root \
		--label "org.forkfleet.base=$hash" \
		--name "$name" \
		--out "$layout" \
		"$@"
}

# import_layout TOOL LAYOUT ADDRESS NAMESPACE: imports and unpacks LAYOUT into
# the containerd at ADDRESS (the tool skips a manifest it already has unpacked).
import_layout() {
	local t
	[[ -S $3 ]] || die "no containerd socket at $3 (set FORKFLEET_CONTAINERD_ADDRESS, or --no-import)"
	t=$(now_ms)
	"$1" import --address "$3" --namespace "$4" "$2"
	log "import: done in $(secs $(($(now_ms) - t)))"
}
