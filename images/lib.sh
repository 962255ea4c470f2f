# Shared by the image build scripts (sourced, not run).

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

# host_apt_uri SUITE: the first URI of the host's apt sources serving SUITE
# (one-line or deb822 format); empty when none does.
host_apt_uri() {
	local suite=$1 f uri
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -f $f ]] || continue
		uri=$(awk -v s="$suite" '$1=="deb" { for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) { if ($(i+1)==s) { print $i; exit } break } }' "$f")
		[[ -n $uri ]] && { echo "$uri"; return; }
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] || continue
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
				if (types ~ /deb( |$)/ && suites ~ (" " s " ")) { split(uris, u, " "); print u[1]; exit }
			}' "$f")
		[[ -n $uri ]] && { echo "$uri"; return; }
	done
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
