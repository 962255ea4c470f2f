#!/bin/bash
# forkfleet host setup: puts the host stack in place and starts containerd.
#
#   deploy/host-setup.sh                   set up (idempotent; about a second when done)
#   deploy/host-setup.sh --packages P...   install Debian packages P (make peers), recorded for --uninstall
#   deploy/host-setup.sh --prometheus      unpack Debian's prometheus and promtool into /var/cache/forkfleet/prometheus
#                                          for the tests (make test-tools); nothing is installed or started
#   deploy/host-setup.sh --registry        unpack Debian's docker-registry into /var/cache/forkfleet/registry for the
#                                          tests and benchd (make test-tools); nothing is installed or started
#   deploy/host-setup.sh --stop            stop the project's containerd
#   deploy/host-setup.sh --uninstall [--keep-caches]
#                                          undo the setup: every sandbox, containerd namespace, image,
#                                          snapshot, state, log, config, unit and package it installed;
#                                          --keep-caches keeps the slow caches keyed by their inputs
#                                          (containerd build, CRIU .debs, image base tarballs, prometheus, registry,
#                                          the kube-apiserver build of deploy/kubernetes/apiserver)
#   deploy/host-setup.sh --help
#
# Called by `make demo` and `make test`. Needs root. Works on a fresh Debian 12
# host with only the Debian archive and the Go module proxy reachable, and on a
# host that already has containerd >= 2.4 and/or CRIU >= 4.2. Prints one line
# per step and exits non-zero with the reason when a step cannot be done.
# The contract (paths, env keys, start/stop) is in deploy/README.md.
set -euo pipefail

# ---------------------------------------------------------------- constants

readonly CONTAINERD_VERSION=2.4.2 # built when no usable containerd is installed
readonly CONTAINERD_MIN=2.4       # an installed containerd this new is reused
readonly CRIU_MIN=4.2             # 4.1 cannot dump AF_INET sockets on kernels >= 6.16
readonly CRIU_SUITE=${FORKFLEET_CRIU_SUITE:-sid}
readonly CRIU_BASE_SUITE=${FORKFLEET_CRIU_BASE_SUITE:-trixie}
readonly NAMESPACE=forkfleet

readonly ETC_DIR=/etc/forkfleet
readonly LIB_DIR=/var/lib/forkfleet
readonly LOG_DIR=/var/log/forkfleet
readonly CACHE_DIR=/var/cache/forkfleet
readonly RUN_DIR=/run/forkfleet

readonly CONTAINERD_CACHE=$CACHE_DIR/containerd-v$CONTAINERD_VERSION/bin
readonly CONTAINERD_BUILD_LOG=$LOG_DIR/containerd-build.log
readonly CONTAINERD_CONFIG=$ETC_DIR/containerd.toml
readonly CONTAINERD_ROOT=$LIB_DIR/containerd
readonly CONTAINERD_STATE=$RUN_DIR/containerd
readonly CONTAINERD_SOCK=$CONTAINERD_STATE/containerd.sock
readonly CONTAINERD_LOG=$LOG_DIR/containerd.log
readonly SUPERVISOR=/usr/local/libexec/forkfleet/containerd-supervise
readonly SUPERVISOR_PIDFILE=$RUN_DIR/containerd.pid
readonly DAEMON_PIDFILE=$RUN_DIR/containerd-daemon.pid
readonly STOPFILE=$RUN_DIR/containerd.stop
readonly START_TIMEOUT=${FORKFLEET_CONTAINERD_START_TIMEOUT:-30}

readonly CRIU_PREFIX=/opt/forkfleet/criu
readonly CRIU_WRAPPER=/usr/local/sbin/criu
readonly CRIU_CONF=$ETC_DIR/criu.conf
readonly CRIU_CACHE=$CACHE_DIR/criu
readonly CRIU_FEATURES=$LIB_DIR/criu-features.txt
readonly WRAPPER_MARKER='# forkfleet-criu-wrapper'
# Preloaded into the private CRIU (see step_criu_preload).
readonly CRIU_PRELOAD_SO=$LIB_DIR/criu-preload.so
# The private CRIU's answer to VERSION, which its wrapper sends runc
# (see step_criu_version).
readonly CRIU_VERSION_CACHE=$LIB_DIR/criu-version.cache

readonly HOST_ENV=$ETC_DIR/host.env
readonly LOCKFILE=$LIB_DIR/host-setup.lock
# What --uninstall undoes: the Debian packages this script installed (one
# per line) and the kernel settings it changed, with their earlier values.
readonly PACKAGES_INSTALLED=$LIB_DIR/packages.installed
readonly ORIGINALS=$LIB_DIR/originals.env

readonly APT_PACKAGES=(
	runc debootstrap xvfb openbox xterm x11-utils x11-xserver-utils
	libturbojpeg0-dev libx11-dev nftables iproute2 procps psmisc btrfs-progs gcc libc6-dev dbus-daemon
	tesseract-ocr tesseract-ocr-eng ffmpeg
)

# Sandboxes' writable layers: a btrfs filesystem with quotas in a
# preallocated file (see step_layers).
readonly LAYERS_DIR=$LIB_DIR/layers
readonly LAYERS_IMG=$LIB_DIR/layers.img
readonly LAYERS_UNIT=var-lib-forkfleet-layers.mount
readonly LAYERS_OPTIONS=loop,noatime,nodiscard

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR

# The daemon, runc and criu must see /usr/local first (CRIU wrapper, containerd).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

# Filled in by the steps, written to host.env at the end.
CONTAINERD_BIN=""
CTR_BIN=""
CONTAINERD_VER=""
RUNC_VER=""
CRIU_BIN=""
CRIU_VER=""

# ---------------------------------------------------------------- output

START_US=${EPOCHREALTIME/./}
STEP_US=$START_US

elapsed_ms() { local now=${EPOCHREALTIME/./}; echo $(((now - $1) / 1000)); }

# step NAME STATUS MESSAGE: one line per step, with the step's own duration.
step() {
	printf 'host-setup: %-11s %-5s %s (%d ms)\n' "$1" "$2" "$3" "$(elapsed_ms "$STEP_US")"
	STEP_US=${EPOCHREALTIME/./}
}
note() { printf 'host-setup: %-11s       %s\n' "$1" "$2"; }
die() {
	printf 'host-setup: ERROR: %s\n' "$*" >&2
	exit 1
}

# ---------------------------------------------------------------- helpers

version_ge() { dpkg --compare-versions "$1" ge "$2"; }

# containerd --version prints e.g.
#   containerd github.com/containerd/containerd/v2 2.4.2+unknown
#   containerd containerd.io v2.4.2 <commit>
containerd_version_of() {
	local out
	out=$("$1" --version 2>/dev/null) || return 1
	out=$(awk '{print $3}' <<<"$out")
	out=${out#v}
	out=${out%%+*}
	[[ -n $out ]] && echo "$out"
}

criu_version_of() {
	"$1" --version 2>/dev/null | awk '/^Version:/ {print $2; exit}'
}

ctr_answers() {
	[[ -S $CONTAINERD_SOCK && -n $CTR_BIN ]] || return 1
	timeout 5 "$CTR_BIN" -a "$CONTAINERD_SOCK" version >/dev/null 2>&1
}

is_systemd_host() { [[ $(cat /proc/1/comm 2>/dev/null) == systemd && -d /run/systemd/system ]]; }

# install_file SRC DST MODE: copy when the content differs. Returns 0 when it
# changed something, 1 when DST was already up to date.
install_file() {
	local src=$1 dst=$2 mode=$3
	if [[ -f $dst ]] && cmp -s "$src" "$dst"; then
		chmod "$mode" "$dst"
		return 1
	fi
	mkdir -p "$(dirname "$dst")"
	install -m "$mode" "$src" "$dst.tmp.$$"
	mv -f "$dst.tmp.$$" "$dst"
	return 0
}

# write_file DST MODE < content: like install_file, for generated content.
write_file() {
	local dst=$1 mode=$2 tmp
	tmp=$(mktemp "$LIB_DIR/.write.XXXXXX")
	cat >"$tmp"
	if install_file "$tmp" "$dst" "$mode"; then
		rm -f "$tmp"
		return 0
	fi
	rm -f "$tmp"
	return 1
}

pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

read_pidfile() { [[ -f $1 ]] && tr -dc '0-9' <"$1"; }

supervisor_pid() {
	local pid
	pid=$(read_pidfile "$SUPERVISOR_PIDFILE") || return 1
	pid_alive "$pid" || return 1
	# A recycled pid must not be mistaken for the supervisor.
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q containerd-supervise || return 1
	echo "$pid"
}

# ---------------------------------------------------------------- 1. apt

# Another apt/dpkg run (the lead starts one in the background at boot) may
# hold the locks: wait for them instead of failing.
apt_get() {
	local attempt out rc
	for attempt in $(seq 1 120); do
		rc=0
		out=$(apt-get -q -y -o DPkg::Lock::Timeout=600 "$@" 2>&1) || rc=$?
		if ((rc == 0)); then
			return 0
		fi
		if grep -qE 'Could not get lock|Unable to lock|is another process using it' <<<"$out"; then
			((attempt == 1)) && note apt "waiting for the apt/dpkg lock held by another process"
			sleep 5
			continue
		fi
		printf '%s\n' "$out" | tail -n 20 >&2
		return "$rc"
	done
	echo "$out" | tail -n 5 >&2
	return 1
}

# step_apt [P...]: installs the packages among P (default APT_PACKAGES) that
# are missing.
step_apt() {
	local installed missing=() p want=("$@")
	((${#want[@]})) || want=("${APT_PACKAGES[@]}")
	installed=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "${want[@]}" 2>/dev/null |
		awk '$1 == "ii" {print $2}') || true
	for p in "${want[@]}"; do
		grep -qxF "$p" <<<"$installed" || missing+=("$p")
	done
	if ((${#missing[@]} == 0)); then
		step apt skip "all ${#want[@]} packages installed"
		return
	fi
	note apt "missing: ${missing[*]}"
	apt_get update || die "apt-get update failed"
	apt_get install --no-install-recommends "${missing[@]}" ||
		die "apt-get install ${missing[*]} failed"
	record_packages "${missing[@]}"
	step apt "done" "installed ${missing[*]}"
}

# record_packages P...: remembers packages this script installed, for --uninstall.
record_packages() {
	local p
	for p in "$@"; do
		grep -qxF "$p" "$PACKAGES_INSTALLED" 2>/dev/null || echo "$p" >>"$PACKAGES_INSTALLED"
	done
}

# record_original KEY VALUE: keeps the first value a setting had before this
# script changed it, for --uninstall.
record_original() {
	grep -q "^$1=" "$ORIGINALS" 2>/dev/null || echo "$1=$2" >>"$ORIGINALS"
}

# ---------------------------------------------------------------- 2. containerd

# Waits for a build started elsewhere (same command, same cache) to finish:
# its log ends with "rc=N".
wait_for_foreign_build() {
	local waited=0
	[[ -f $CONTAINERD_BUILD_LOG ]] || return 1
	grep -q '^rc=' "$CONTAINERD_BUILD_LOG" && return 0
	pgrep -f 'containerd/v2/cmd/' >/dev/null 2>&1 || return 1
	note containerd "a build of v$CONTAINERD_VERSION is running (log $CONTAINERD_BUILD_LOG): waiting for it"
	while ! grep -q '^rc=' "$CONTAINERD_BUILD_LOG"; do
		if ! pgrep -f 'containerd/v2/cmd/' >/dev/null 2>&1; then
			sleep 2
			grep -q '^rc=' "$CONTAINERD_BUILD_LOG" && break
			return 1
		fi
		((waited >= 1200)) && die "containerd build still running after 20 min; see $CONTAINERD_BUILD_LOG"
		sleep 2
		waited=$((waited + 2))
	done
	return 0
}

cache_complete() {
	local b
	for b in containerd containerd-shim-runc-v2 ctr; do
		[[ -x $CONTAINERD_CACHE/$b ]] || return 1
	done
	[[ $(containerd_version_of "$CONTAINERD_CACHE/containerd") == "$CONTAINERD_VERSION" ]]
}

build_containerd() {
	local go tmp rc=0
	go=$(command -v go || true)
	[[ -z $go && -x /usr/local/go/bin/go ]] && go=/usr/local/go/bin/go
	[[ -n $go ]] || die "containerd >= $CONTAINERD_MIN is not installed and Go is missing to build v$CONTAINERD_VERSION (expected /usr/local/go/bin/go)"
	note containerd "building v$CONTAINERD_VERSION with $go (about 4 min; log $CONTAINERD_BUILD_LOG)"
	tmp=$CONTAINERD_CACHE.tmp.$$
	rm -rf "$tmp"
	mkdir -p "$tmp" "$LOG_DIR"
	{
		echo "# $(date -u +%FT%TZ) host-setup.sh: go install containerd v$CONTAINERD_VERSION"
		HOME=${HOME:-/root} GOBIN=$tmp CGO_ENABLED=0 GOFLAGS=-tags=no_btrfs,no_devmapper,no_zfs,no_aufs \
			"$go" install \
			"github.com/containerd/containerd/v2/cmd/containerd@v$CONTAINERD_VERSION" \
			"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v$CONTAINERD_VERSION" \
			"github.com/containerd/containerd/v2/cmd/ctr@v$CONTAINERD_VERSION" || rc=$?
		echo "rc=$rc"
	} >"$CONTAINERD_BUILD_LOG" 2>&1
	if ((rc != 0)); then
		rm -rf "$tmp"
		tail -n 15 "$CONTAINERD_BUILD_LOG" >&2
		die "building containerd v$CONTAINERD_VERSION failed (rc=$rc); see $CONTAINERD_BUILD_LOG"
	fi
	rm -rf "$CONTAINERD_CACHE"
	mv "$tmp" "$CONTAINERD_CACHE"
}

step_containerd() {
	local found ver dir shim ctr b how changed=0
	found=$(command -v containerd || true)
	if [[ -n $found ]]; then
		ver=$(containerd_version_of "$found" || true)
		dir=$(dirname "$found")
		shim=$dir/containerd-shim-runc-v2
		[[ -x $shim ]] || shim=$(command -v containerd-shim-runc-v2 || true)
		ctr=$dir/ctr
		[[ -x $ctr ]] || ctr=$(command -v ctr || true)
		if [[ -n $ver ]] && version_ge "$ver" "$CONTAINERD_MIN" && [[ -n $shim && -n $ctr ]]; then
			CONTAINERD_BIN=$found CTR_BIN=$ctr CONTAINERD_VER=$ver
			step containerd skip "using installed $found $ver (shim $shim)"
			return
		fi
		note containerd "installed $found is ${ver:-of unknown version} or lacks shim/ctr: installing v$CONTAINERD_VERSION into /usr/local/bin"
	fi

	if cache_complete; then
		how="reused cached build $CONTAINERD_CACHE"
	elif wait_for_foreign_build && cache_complete; then
		how="reused the build that was running ($CONTAINERD_BUILD_LOG)"
	else
		build_containerd
		cache_complete || die "build finished but $CONTAINERD_CACHE lacks containerd/containerd-shim-runc-v2/ctr v$CONTAINERD_VERSION"
		how="built v$CONTAINERD_VERSION into $CONTAINERD_CACHE"
	fi
	for b in containerd containerd-shim-runc-v2 ctr; do
		# mv over the old file: a running containerd keeps its inode.
		install_file "$CONTAINERD_CACHE/$b" "/usr/local/bin/$b" 0755 && changed=1
	done
	CONTAINERD_BIN=/usr/local/bin/containerd CTR_BIN=/usr/local/bin/ctr
	CONTAINERD_VER=$(containerd_version_of "$CONTAINERD_BIN")
	step containerd "done" "$how; installed containerd, containerd-shim-runc-v2, ctr $CONTAINERD_VER in /usr/local/bin$( ((changed)) || echo ' (already there)')"
}

# ---------------------------------------------------------------- 3. runc

step_runc() {
	local runc
	runc=$(command -v runc || true)
	[[ -n $runc ]] || die "runc not found after the apt step (package runc)"
	RUNC_VER=$("$runc" --version 2>/dev/null | awk 'NR == 1 {print $3}')
	[[ -n $RUNC_VER ]] || die "$runc --version gave no version"
	version_ge "${RUNC_VER%%+*}" 1.1 || die "runc $RUNC_VER at $runc is older than 1.1"
	step runc skip "using $runc $RUNC_VER"
}

# ---------------------------------------------------------------- 4. /run tmpfs (CRIU kdat cache)

# Why: CRIU probes ~40 kernel features on every invocation (35-50 ms, 80-160 ms
# under load) unless it can reuse /run/criu.kdat. It loads that file from
# anywhere, but it only WRITES it (via /run/criu.kdat.tmp + rename) when fstatfs
# says tmpfs, because the cache must vanish on reboot and kernel change. The
# path is compiled in (KDAT_RUNDIR), so the file cannot be moved elsewhere, and
# a pre-seeded copy on ext4 would both outlive a kernel upgrade and be unlinked
# by CRIU on its next failed save.
#
# Fix: make /run a tmpfs, as it is on every systemd host, without disturbing
# what already lives there: a new tmpfs is prepared off to the side, every
# directory of the old /run is recursively bind-mounted into it (open files,
# listening sockets such as /run/dbus/* or a host containerd's socket keep
# working, writes still land in the same inodes), top-level sockets/fifos are
# bind-mounted too, plain files and symlinks are copied, and then the tmpfs is
# moved onto /run in one atomic mount --move. Nothing is lost; the host keeps
# its old /run underneath, and after a reboot it is back to the plain disk
# directory until this script runs again (when the cache must be rebuilt anyway).
step_run_tmpfs() {
	local fstype staging e name
	fstype=$(stat -f -c %T /run)
	if [[ $fstype == tmpfs ]]; then
		step run-tmpfs skip "/run is a tmpfs: CRIU can keep /run/criu.kdat"
		return
	fi
	if [[ $(findmnt -n -o PROPAGATION / 2>/dev/null) == shared* ]]; then
		# mount --move refuses to move out of a shared parent.
		die "/run is $fstype (not tmpfs) and / is a shared mount, so it cannot be replaced atomically; mount a tmpfs on /run at boot (as systemd does) and rerun"
	fi
	staging=$(mktemp -d "$LIB_DIR/run-staging.XXXXXX")
	if ! mount -t tmpfs -o mode=0755,nosuid,nodev,size=20% tmpfs "$staging"; then
		rmdir "$staging"
		die "cannot mount a tmpfs (need CAP_SYS_ADMIN) for /run; CRIU would re-probe kernel features on every call"
	fi
	# errexit does not apply inside a subshell tested with ||: check each call.
	(
		shopt -s nullglob dotglob
		for e in /run/*; do
			name=${e##*/}
			# A kdat cache from a disk /run may predate a kernel change, and a
			# stale criu.kdat.tmp (see step_kdat) would block every save.
			[[ $name == criu.kdat || $name == criu.kdat.tmp ]] && continue
			if [[ -L $e || -f $e ]]; then
				cp -a "$e" "$staging/$name" || exit 1
			elif [[ -d $e ]]; then
				mkdir "$staging/$name" || exit 1
				mount --rbind "$e" "$staging/$name" || exit 1
			else
				touch "$staging/$name" || exit 1
				mount --bind "$e" "$staging/$name" || exit 1
			fi
		done
		mount --move "$staging" /run || exit 1
	) || {
		umount -R "$staging" 2>/dev/null || umount -R -l "$staging" 2>/dev/null || true
		rmdir "$staging" 2>/dev/null || true
		die "replacing /run ($fstype) with a tmpfs failed; nothing was changed"
	}
	rmdir "$staging"
	step run-tmpfs "done" "/run was $fstype: now a tmpfs with the old entries bind-mounted/copied in, so CRIU keeps /run/criu.kdat"
}

# ---------------------------------------------------------------- 5. CRIU

is_our_wrapper() { [[ -f $1 ]] && grep -qF "$WRAPPER_MARKER" "$1"; }

criu_usable() {
	local v
	v=$(criu_version_of "$1") || return 1
	[[ -n $v ]] && version_ge "$v" "$CRIU_MIN" && "$1" check >/dev/null 2>&1
}

# apt_mirror [SUITE [FALLBACK]]: the Debian mirror the host's apt sources use
# for SUITE (default: the host's own release), FALLBACK (default
# deb.debian.org's) when none does. The CRIU suites and the image builds reuse it. Handles deb822 (*.sources) and
# one-line (*.list) sources.
apt_mirror() {
	local codename=${1:-} f uri
	# shellcheck source=/dev/null
	[[ -n $codename ]] || codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -f $f ]] || continue
		uri=$(awk -v c="$codename" '
			$1 == "deb" {
				i = 2
				if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
				if ($(i + 1) == c) { print $i; exit }
			}' "$f")
		[[ -n $uri ]] && echo "${uri%/}" && return
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] || continue
		uri=$(awk -v c="$codename" '
			function flush() {
				if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " c " ")) { split(uris, u, " "); print u[1]; found = 1 }
				types = uris = suites = enabled = ""
			}
			/^[ \t]*$/ { flush(); if (found) exit; next }
			/^[ \t]*#/ { next }
			{ key = tolower($1); sub(/:$/, "", key); val = $0; sub(/^[^:]*:[ \t]*/, "", val)
			  if (key == "types") types = val; else if (key == "uris") uris = val
			  else if (key == "suites") suites = val; else if (key == "enabled") enabled = tolower(val) }
			END { if (!found) flush() }' "$f" | head -n 1)
		[[ -n $uri ]] && echo "${uri%/}" && return
	done
	echo "${2:-http://deb.debian.org/debian}"
}

# Private apt: own sources.list (the CRIU suites only), lists, cache, status
# and preferences; the host's sources, lists, status and pins are neither read
# nor written. The host's apt.conf.d is still honoured for network settings
# (proxy, Check-Valid-Until) because the fetch runs on this host's network.
PRIV_APT=()
setup_private_apt() {
	local dir=$1 mirror=$2 signed=""
	mkdir -p "$dir/etc/sources.list.d" "$dir/etc/preferences.d" "$dir/lists/partial" \
		"$dir/state" "$dir/cache/archives/partial"
	: >"$dir/state/status"
	[[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] &&
		signed="signed-by=/usr/share/keyrings/debian-archive-keyring.gpg "
	cat >"$dir/etc/sources.list" <<-EOF
		deb [${signed}target=Packages] $mirror $CRIU_SUITE main
		deb [${signed}target=Packages] $mirror $CRIU_BASE_SUITE main
	EOF
	# Libraries come from the base suite unless the CRIU build needs newer.
	cat >"$dir/etc/preferences" <<-EOF
		Package: *
		Pin: release n=$CRIU_BASE_SUITE
		Pin-Priority: 990

		Package: *
		Pin: release n=$CRIU_SUITE
		Pin-Priority: 100
	EOF
	PRIV_APT=(
		-o "Dir::State=$dir/state" -o "Dir::State::Lists=$dir/lists"
		-o "Dir::State::status=$dir/state/status" -o "Dir::Cache=$dir/cache"
		-o "Dir::Cache::archives=$dir/cache/archives"
		-o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
		-o "Dir::Etc::sourcelist=$dir/etc/sources.list" -o "Dir::Etc::sourceparts=$dir/etc/sources.list.d"
		-o "Dir::Etc::preferences=$dir/etc/preferences" -o "Dir::Etc::preferencesparts=$dir/etc/preferences.d"
		-o "Dir::Log=$dir/log" -o "APT::Install-Recommends=false" -o "Acquire::Languages=none"
	)
}

# Downloads criu from $CRIU_SUITE with its full library closure into
# $CRIU_CACHE/<version>/debs and prints the version. apt's resolver picks the
# base suite for each library unless a $CRIU_SUITE package needs a newer one;
# those are added as pkg/$CRIU_SUITE one by one as apt names them.
download_criu() {
	local mirror aptdir ver debs out rc attempt pkgs=("criu/$CRIU_SUITE") add
	mirror=$(apt_mirror)
	aptdir=$CRIU_CACHE/apt
	setup_private_apt "$aptdir" "$mirror"
	note criu "fetching criu from $mirror $CRIU_SUITE (+ $CRIU_BASE_SUITE libraries) with a private apt config in $aptdir" >&2
	apt-get -q "${PRIV_APT[@]}" update >"$aptdir/update.log" 2>&1 || {
		tail -n 10 "$aptdir/update.log" >&2
		die "private apt-get update for $CRIU_SUITE/$CRIU_BASE_SUITE at $mirror failed"
	}
	ver=$(apt-cache "${PRIV_APT[@]}" madison criu | awk -F'|' -v s="$CRIU_SUITE/" '$3 ~ s {gsub(/ /, "", $2); print $2; exit}')
	[[ -n $ver ]] || die "no criu package in $CRIU_SUITE at $mirror"
	version_ge "$ver" "$CRIU_MIN" || die "criu in $CRIU_SUITE is $ver, older than $CRIU_MIN"
	debs=$CRIU_CACHE/$ver/debs
	mkdir -p "$debs/partial"
	for attempt in $(seq 1 10); do
		rc=0
		out=$(apt-get -q -y "${PRIV_APT[@]}" -o "Dir::Cache::archives=$debs" install -d "${pkgs[@]}" 2>&1) || rc=$?
		((rc == 0)) && break
		add=$(sed -n 's/^ *\(criu : \|[^ ]* : \)\?Depends: \([^ ]*\) .* but .* is to be installed.*/\2/p' <<<"$out" | sort -u)
		if [[ -z $add ]] || ((attempt == 10)); then
			printf '%s\n' "$out" | tail -n 15 >&2
			die "cannot resolve criu $ver's dependencies from $CRIU_SUITE/$CRIU_BASE_SUITE"
		fi
		while read -r p; do pkgs+=("$p/$CRIU_SUITE"); done <<<"$add"
	done
	rm -rf "$debs/partial" "$debs/lock"
	printf '%s\n' "${pkgs[@]}" >"$CRIU_CACHE/$ver/requested"
	touch "$CRIU_CACHE/$ver/complete"
	echo "$ver"
}

newest_cached_criu() {
	local d v best=""
	for d in "$CRIU_CACHE"/*/complete; do
		[[ -f $d ]] || continue
		v=$(basename "$(dirname "$d")")
		version_ge "$v" "$CRIU_MIN" || continue
		if [[ -z $best ]] || version_ge "$v" "$best"; then best=$v; fi
	done
	[[ -n $best ]] && echo "$best"
}

multiarch_loader() {
	case $(dpkg --print-architecture) in
	amd64) echo "x86_64-linux-gnu usr/lib64/ld-linux-x86-64.so.2" ;;
	arm64) echo "aarch64-linux-gnu usr/lib/ld-linux-aarch64.so.1" ;;
	*) die "private CRIU install supports amd64 and arm64, not $(dpkg --print-architecture)" ;;
	esac
}

# unpack_criu VERSION DIR: CRIU VERSION's cached .debs unpacked into DIR
# (made), the tree $CRIU_PREFIX holds (also images/node/build.sh's).
unpack_criu() {
	local ver=$1 new=$2 debs=$CRIU_CACHE/$1/debs triplet loader d
	read -r triplet loader < <(multiarch_loader)
	mkdir -p "$new"
	for d in "$debs"/*.deb; do
		dpkg -x "$d" "$new" || die "dpkg -x $d failed"
	done
	[[ -x $new/usr/sbin/criu && -e $new/$loader ]] || die "criu $ver packages lack usr/sbin/criu or the loader $loader"
	echo "$ver" >"$new/.forkfleet-criu-version"
}

install_private_criu() {
	local ver=$1 new=$CRIU_PREFIX.new.$$
	rm -rf "$new"
	unpack_criu "$ver" "$new"
	rm -rf "$CRIU_PREFIX.old"
	[[ -d $CRIU_PREFIX ]] && mv "$CRIU_PREFIX" "$CRIU_PREFIX.old"
	mv "$new" "$CRIU_PREFIX"
	rm -rf "$CRIU_PREFIX.old"
	write_criu_wrapper || true
}

# write_criu_wrapper: the private CRIU's wrapper, with its preload library
# once step_criu_preload built it. Returns 0 when it changed.
write_criu_wrapper() {
	local preload="" tmp rc=1
	[[ -f $CRIU_PRELOAD_SO ]] && preload=$CRIU_PRELOAD_SO
	tmp=$(mktemp "$LIB_DIR/.criu-wrapper.XXXXXX")
	build_criu_wrapper "$tmp" "$preload" || {
		rm -f "$tmp"
		die "cannot build $SCRIPT_DIR/criu/wrapper.c"
	}
	install_file "$tmp" "$CRIU_WRAPPER" 0755 && rc=0
	rm -f "$tmp"
	return $rc
}

# build_criu_wrapper OUT [PRELOAD [CACHE]]: the wrapper of the private CRIU
# in $CRIU_PREFIX (deploy/criu/wrapper.c, a program: no shell per CRIU run),
# preloading PRELOAD when given and answering runc's VERSION probes from
# CACHE (default $CRIU_VERSION_CACHE, written by step_criu_version; also
# images/node/binaries.sh's, whose preload and cache lie outside the node's
# host paths).
build_criu_wrapper() {
	local out=$1 preload=${2:-} cache=${3:-$CRIU_VERSION_CACHE} triplet loader
	read -r triplet loader < <(multiarch_loader)
	# No libc (see wrapper.c): its own _start and system calls.
	gcc -O2 -Wall -Werror -static -nostdlib -no-pie -fno-pie -ffreestanding -fno-stack-protector \
		-fno-tree-loop-distribute-patterns -o "$out" \
		-DCRIU_LOADER="\"$CRIU_PREFIX/$loader\"" \
		-DCRIU_LIBPATH="\"$CRIU_PREFIX/usr/lib/$triplet:$CRIU_PREFIX/lib/$triplet\"" \
		-DCRIU_BINARY="\"$CRIU_PREFIX/usr/sbin/criu\"" \
		-DCRIU_CONF="\"$CRIU_CONF\"" \
		-DCRIU_PRELOAD="\"$preload\"" \
		-DCRIU_VERSION_CACHE="\"$cache\"" \
		"$SCRIPT_DIR/criu/wrapper.c"
}

# Runs `criu check --all` and keeps the list of missing features: these are
# reported, not fatal (soft-dirty is absent on these kernels, which only rules
# out pre-dump/incremental dumps).
record_criu_features() {
	local out
	out=$("$CRIU_BIN" check --all 2>&1 || true)
	{
		echo "# criu $CRIU_VER check --all, $(date -u +%FT%TZ), kernel $(uname -r)"
		grep -E '^(Warn|Error)' <<<"$out" | sed -E 's/^(Warn|Error) *\([^)]*\): *//' | grep -v 'kdat cache' || true
	} >"$CRIU_FEATURES"
}

missing_features_summary() {
	local n
	[[ -f $CRIU_FEATURES ]] || return 0
	n=$(grep -vc '^#' "$CRIU_FEATURES" || true)
	if ((n == 0)); then
		echo "no kernel features missing"
	else
		echo "missing: $(grep -v '^#' "$CRIU_FEATURES" | paste -sd ';' -)"
	fi
}

# criu_conf: $CRIU_CONF's content (also images/node/build.sh's).
criu_conf() {
	cat <<-'EOF'
		# CRIU options for forkfleet (installed by deploy/host-setup.sh).
		# iptables-restore is not installed on these hosts; nftables is in-process.
		network-lock nftables
	EOF
}

step_criu_config() {
	if criu_conf | write_file "$CRIU_CONF" 0644; then
		step criu-conf "done" "wrote $CRIU_CONF (network-lock nftables)"
	else
		step criu-conf skip "$CRIU_CONF up to date"
	fi
}

step_criu() {
	local p ver how
	# 1) our wrapper from an earlier run, 2) a CRIU the host already has,
	# 3) the private install.
	if is_our_wrapper "$CRIU_WRAPPER" && [[ -f $CRIU_PREFIX/.forkfleet-criu-version ]] && criu_usable "$CRIU_WRAPPER"; then
		CRIU_BIN=$CRIU_WRAPPER CRIU_VER=$(criu_version_of "$CRIU_WRAPPER")
		[[ -f $CRIU_FEATURES ]] || record_criu_features
		step criu skip "private CRIU $CRIU_VER ($CRIU_WRAPPER -> $CRIU_PREFIX) passes criu check; $(missing_features_summary)"
		return
	fi
	while read -r p; do
		[[ -n $p ]] || continue
		is_our_wrapper "$p" && continue
		if criu_usable "$p"; then
			CRIU_BIN=$p CRIU_VER=$(criu_version_of "$p")
			record_criu_features
			step criu skip "host CRIU $p $CRIU_VER passes criu check; $(missing_features_summary)"
			note criu "host CRIU does not read $CRIU_CONF by itself: clients pass it (runc annotation org.criu.config) or set CRIU_CONFIG_FILE"
			return
		fi
		note criu "host $p ($(criu_version_of "$p" || echo '?')) is older than $CRIU_MIN or fails criu check: not used"
	done < <(type -ap criu 2>/dev/null | xargs -r readlink -f | awk '!seen[$0]++')

	if ver=$(newest_cached_criu); then
		how="from cached .debs in $CRIU_CACHE/$ver"
	else
		ver=$(download_criu)
		how="downloaded to $CRIU_CACHE/$ver"
	fi
	install_private_criu "$ver"
	hash -r
	CRIU_BIN=$CRIU_WRAPPER
	CRIU_VER=$(criu_version_of "$CRIU_WRAPPER" || true)
	[[ -n $CRIU_VER ]] || die "installed CRIU $ver but $CRIU_WRAPPER --version fails"
	local out
	out=$("$CRIU_WRAPPER" check 2>&1) || {
		printf '%s\n' "$out" | tail -n 15 >&2
		die "private CRIU $CRIU_VER fails criu check"
	}
	record_criu_features
	step criu "done" "installed CRIU $CRIU_VER $how into $CRIU_PREFIX, wrapper $CRIU_WRAPPER; criu check passes; $(missing_features_summary)"
}

# The private CRIU's preload library, built from deploy/criu/{syscall,rlimits,ksm,uffd,loglevel}.c:
# - rlimits.c: CRIU reads every dumped task's resource limits with prlimit(2),
#   which the kernel allows across users only with CAP_SYS_RESOURCE. Root on
#   some hosts (these VMs) lacks it, and a sandbox whose agent runs as its own
#   user next to a root guestd could never be checkpointed. The shim answers
#   such a refused read from /proc/<pid>/limits; with the capability it never
#   acts.
# - ksm.c: CRIU opts itself into KSM, so every process it restores inherits
#   the opt-in that CRIU does not restore (replicas of one checkpoint merge
#   what they map after their restore too).
# - uffd.c: a lazy restore's tasks get their userfaultfd from /dev/userfaultfd
#   (opened by CRIU as root before it forks them, closed in each task once its
#   uffd exists) when userfaultfd(2) refuses them in their user namespace, so
#   vm.unprivileged_userfaultfd stays 0 (docs/security.md); and a lazy
#   restore's writable premap of a reservation that the heuristic overcommit
#   refuses is made again with MAP_NORESERVE (Chromium's, docs/security.md).
# - loglevel.c: a restore request's log level (runc always asks for debug,
#   4, a line per write(2)) is lowered to the level its CRIU config file
#   names (controld writes the line: 4 when it logs at debug), else to 2,
#   warnings and errors, as controld's dumps.
# - syscall.c: the one syscall() override, offering refused calls to the above.
# build_criu_preload OUT: the preload library (also images/node/build.sh's).
build_criu_preload() {
	gcc -O2 -Wall -shared -fPIC -o "$1" "$SCRIPT_DIR"/criu/{syscall,rlimits,ksm,uffd,loglevel}.c
}

step_criu_preload() {
	local tmp eff changed=0
	if [[ $CRIU_BIN != "$CRIU_WRAPPER" ]]; then
		eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
		if (((0x$eff >> 24) & 1)); then
			step criu-preload skip "host CRIU $CRIU_BIN, and root has CAP_SYS_RESOURCE; restored processes are not opted into KSM (only guestd and what it starts after a restore)"
		else
			step criu-preload skip "host CRIU $CRIU_BIN: root lacks CAP_SYS_RESOURCE here, so sandboxes running their agent as a user of its own cannot be checkpointed (create them with run_as_root, or use the private CRIU)"
		fi
		return
	fi
	tmp=$(mktemp "$LIB_DIR/.criu-preload.XXXXXX.so")
	build_criu_preload "$tmp" || {
		rm -f "$tmp"
		die "cannot build $SCRIPT_DIR/criu/*.c"
	}
	install_file "$tmp" "$CRIU_PRELOAD_SO" 0644 && changed=1
	rm -f "$tmp"
	write_criu_wrapper && changed=1
	rm -f "$LIB_DIR/criu-rlimits.so" # the library's name before ksm.c
	if ((changed)); then
		"$CRIU_WRAPPER" check >/dev/null 2>&1 || die "CRIU with $CRIU_PRELOAD_SO preloaded fails criu check"
		step criu-preload "done" "$CRIU_WRAPPER preloads $CRIU_PRELOAD_SO (prlimit reads of other users' tasks from /proc/<pid>/limits; KSM opt-in for restored processes; lazy restores' userfaultfds from /dev/userfaultfd and unreserved premaps; restores logged at warning level)"
	else
		step criu-preload skip "$CRIU_WRAPPER preloads $CRIU_PRELOAD_SO"
	fi
}

# Records the private CRIU's answer to VERSION for its wrapper. runc asks
# CRIU's version before every restore with a `criu swrk` of its own (about
# 5 ms of CPU per replica of a fork, loading CRIU only for that); the
# wrapper answers it from this record while the record's key (size, mtime,
# inode and device of $CRIU_PREFIX/usr/sbin/criu) is the binary's, so a
# CRIU replaced without this step answers for itself again.
step_criu_version() {
	local before=""
	if [[ $CRIU_BIN != "$CRIU_WRAPPER" ]]; then
		step criu-version skip "host CRIU $CRIU_BIN: runc asks it for its version before every restore"
		return
	fi
	[[ -f $CRIU_VERSION_CACHE ]] && before=$(od -An -tx1 "$CRIU_VERSION_CACHE")
	"$CRIU_WRAPPER" forkfleet-record-version "$CRIU_VERSION_CACHE" || die "cannot record CRIU's VERSION answer in $CRIU_VERSION_CACHE"
	if [[ $before == "$(od -An -tx1 "$CRIU_VERSION_CACHE")" ]]; then
		step criu-version skip "$CRIU_WRAPPER answers runc's VERSION probes from $CRIU_VERSION_CACHE"
	else
		step criu-version "done" "recorded CRIU's VERSION answer in $CRIU_VERSION_CACHE: $CRIU_WRAPPER answers runc's probes without starting CRIU"
	fi
}

# Proves the kdat cache: after one call the cache exists, and later calls load
# it (CRIU logs "Loaded kdat cache" at -v4).
step_kdat() {
	local t1 t2 s log
	# CRIU saves through an O_EXCL /run/criu.kdat.tmp and, when a save fails
	# (e.g. on a disk /run), unlinks the cache but leaves the .tmp behind: from
	# then on every save fails silently. A .tmp without a cache is such debris
	# unless another criu is saving this very moment, so only old ones go.
	if [[ ! -f /run/criu.kdat && -n $(find /run/criu.kdat.tmp -maxdepth 0 -mmin +0.1 2>/dev/null) ]]; then
		rm -f /run/criu.kdat.tmp
		note kdat "removed stale /run/criu.kdat.tmp that blocked CRIU from saving its cache"
	fi
	s=${EPOCHREALTIME/./}
	"$CRIU_BIN" check >/dev/null 2>&1 || die "criu check failed"
	t1=$(elapsed_ms "$s")
	[[ -f /run/criu.kdat ]] || die "/run/criu.kdat missing after criu check (/run is $(stat -f -c %T /run))"
	s=${EPOCHREALTIME/./}
	log=$("$CRIU_BIN" check -v4 --log-file /dev/stdout 2>&1) || die "criu check failed"
	t2=$(elapsed_ms "$s")
	grep -q 'Loaded kdat cache' <<<"$log" || die "criu does not load /run/criu.kdat"
	step kdat ok "/run/criu.kdat present and loaded (criu check ${t1} ms, cached run ${t2} ms)"
}

# ---------------------------------------------------------------- 6. containerd config

CONFIG_CHANGED=0
step_containerd_config() {
	local src=$SCRIPT_DIR/containerd/config.toml
	[[ -f $src ]] || die "template $src missing"
	mkdir -p "$ETC_DIR" "$CONTAINERD_ROOT" "$LOG_DIR"
	if install_file "$src" "$CONTAINERD_CONFIG" 0644; then
		CONFIG_CHANGED=1
		step config "done" "installed $CONTAINERD_CONFIG from deploy/containerd/config.toml"
	else
		step config skip "$CONTAINERD_CONFIG up to date"
	fi
}

# ---------------------------------------------------------------- 7. start containerd

wait_for_socket() {
	local deadline=$((SECONDS + START_TIMEOUT))
	while ((SECONDS < deadline)); do
		ctr_answers && return 0
		sleep 0.1
	done
	return 1
}

# Validating first turns a config typo into an immediate, precise error
# instead of a daemon that crash-loops until the start timeout.
check_containerd_config() {
	local out
	out=$("$CONTAINERD_BIN" --config "$CONTAINERD_CONFIG" config dump 2>&1 >/dev/null) ||
		die "containerd rejects $CONTAINERD_CONFIG: $(grep -v 'migrated from version' <<<"$out" | tail -n 3)"
}

install_units() {
	local changed=0 u tmp
	for u in forkfleet-containerd forkfleet-controld; do
		tmp=$(mktemp "$LIB_DIR/.unit.XXXXXX")
		# The unit names /usr/local/bin/containerd; point it at a reused host binary.
		sed "s|/usr/local/bin/containerd |$CONTAINERD_BIN |" "$SCRIPT_DIR/systemd/$u.service" >"$tmp"
		install_file "$tmp" "/etc/systemd/system/$u.service" 0644 && changed=1
		rm -f "$tmp"
	done
	((changed)) && systemctl daemon-reload
	return 0
}

stop_supervised() {
	local pid dpid i
	pid=$(supervisor_pid || true)
	dpid=$(read_pidfile "$DAEMON_PIDFILE" || true)
	if [[ -z $pid ]] && ! pid_alive "$dpid"; then
		return 1
	fi
	mkdir -p "$RUN_DIR"
	touch "$STOPFILE"
	if [[ -n $pid ]]; then
		kill -TERM "$pid" 2>/dev/null || true
	else
		kill -TERM "$dpid" 2>/dev/null || true
	fi
	for ((i = 0; i < 300; i++)); do
		if ! pid_alive "$pid" && ! pid_alive "$dpid"; then
			rm -f "$STOPFILE"
			return 0
		fi
		sleep 0.1
	done
	die "containerd (supervisor ${pid:-none}, daemon ${dpid:-none}) did not stop within 30s; see $CONTAINERD_LOG"
}

step_start() {
	if ctr_answers && ((CONFIG_CHANGED == 0)); then
		step start skip "containerd already answers on $CONTAINERD_SOCK"
		return
	fi
	check_containerd_config
	if is_systemd_host; then
		install_units
		if ((CONFIG_CHANGED)); then
			systemctl restart forkfleet-containerd.service || die "systemctl restart forkfleet-containerd failed"
		else
			systemctl enable --now forkfleet-containerd.service || die "systemctl start forkfleet-containerd failed"
		fi
		if ! wait_for_socket; then
			journalctl -u forkfleet-containerd.service -n 25 --no-pager >&2 || true
			die "containerd did not answer on $CONTAINERD_SOCK within ${START_TIMEOUT}s (journalctl -u forkfleet-containerd)"
		fi
		step start "done" "forkfleet-containerd.service running, socket $CONTAINERD_SOCK"
		return
	fi

	install_file "$SCRIPT_DIR/containerd-supervise.sh" "$SUPERVISOR" 0755 || true
	if ((CONFIG_CHANGED)) && stop_supervised; then
		note start "config changed: stopped the running containerd to restart it"
	fi
	local pid
	if pid=$(supervisor_pid); then
		note start "supervisor pid $pid is running (restarting containerd?): waiting for the socket"
	else
		if ctr_answers; then
			die "something not started by forkfleet answers on $CONTAINERD_SOCK; stop it first"
		fi
		mkdir -p "$RUN_DIR" "$LOG_DIR"
		rm -f "$STOPFILE"
		# Keep one previous log; the daemon holds its log open, so rotate
		# only here, when nothing is writing it.
		if [[ -f $CONTAINERD_LOG ]] && (($(stat -c %s "$CONTAINERD_LOG") > 64 * 1024 * 1024)); then
			mv -f "$CONTAINERD_LOG" "$CONTAINERD_LOG.1"
		fi
		FORKFLEET_CONTAINERD_BIN=$CONTAINERD_BIN setsid -f "$SUPERVISOR" </dev/null >>"$CONTAINERD_LOG" 2>&1 9>&-
	fi
	if ! wait_for_socket; then
		echo "---- last lines of $CONTAINERD_LOG" >&2
		tail -n 25 "$CONTAINERD_LOG" >&2 || true
		# Do not leave a daemon crash-looping behind a failed setup.
		stop_supervised || true
		die "containerd did not answer on $CONTAINERD_SOCK within ${START_TIMEOUT}s; stopped it again (log $CONTAINERD_LOG)"
	fi
	pid=$(supervisor_pid || echo '?')
	step start "done" "containerd $CONTAINERD_VER answers on $CONTAINERD_SOCK (supervisor pid $pid, log $CONTAINERD_LOG)"
}

# ---------------------------------------------------------------- 8. KSM

# Forked replicas only share anonymous memory through KSM (CRIU copies every
# page); sandboxes opt in with prctl(PR_SET_MEMORY_MERGE). ksmd cost 30-35% of
# a vCPU at a fixed high rate here, so prefer the kernel's scan-time advisor
# (6.7+), which adapts pages_to_scan within a CPU budget. Its default ceiling
# (30000 pages per wake-up) is where it sits with the few hundred MB of
# mergeable memory a host like this has: ksmd then took 22-26% of a vCPU
# around an idle pool of 4 frozen replicas, stealing from claims. At 3000 it
# took 3-6% and the replicas still reached the same PSS within 20 s (9.5 vs
# 9.3 MB).
ksm_write() {
	local f=/sys/kernel/mm/ksm/$1
	[[ -w $f ]] || return 0
	[[ $(cat "$f") == "$2" ]] && return 0
	record_original "ksm_$1" "$(cat "$f")"
	echo "$2" >"$f" 2>/dev/null || note ksm "could not set $1=$2"
}

# Lazy restores (controld.md "Lazy restore") make their tasks' userfaultfds
# from /dev/userfaultfd, which controld hands to CRIU (docs/security.md):
# vm.unprivileged_userfaultfd is left as it is. Nothing to change here; the
# step says what the host offers. vm.overcommit_memory is left as it is too:
# restore mode AUTO restores lazily unless it is 2 (strict accounting refuses
# the writable premaps of Chromium's reservations; under 0 the CRIU preload's
# uffd.c makes them MAP_NORESERVE).
step_userfaultfd() {
	local oc
	oc=$(cat /proc/sys/vm/overcommit_memory 2>/dev/null || echo "?")
	if [[ -c /dev/userfaultfd ]]; then
		step userfaultfd skip "/dev/userfaultfd present: lazy restores need no vm.unprivileged_userfaultfd; vm.overcommit_memory=$oc (AUTO restores lazily unless it is 2)"
	else
		note userfaultfd "no /dev/userfaultfd (Linux 6.1+, CONFIG_USERFAULTFD): forks restore eagerly only (LAZY fails FAILED_PRECONDITION)"
	fi
}

step_ksm() {
	local k=/sys/kernel/mm/ksm
	if [[ ! -e $k/run ]]; then
		step ksm skip "$k/run absent: kernel without CONFIG_KSM, replicas will not share memory"
		return
	fi
	if [[ -e $k/advisor_mode ]]; then
		ksm_write advisor_mode scan-time
		ksm_write advisor_max_cpu "${FORKFLEET_KSM_MAX_CPU:-20}"
		ksm_write advisor_target_scan_time "${FORKFLEET_KSM_TARGET_SCAN_S:-10}"
		ksm_write advisor_max_pages_to_scan "${FORKFLEET_KSM_MAX_PAGES:-3000}"
	else
		ksm_write pages_to_scan "${FORKFLEET_KSM_PAGES_TO_SCAN:-1000}"
	fi
	ksm_write sleep_millisecs "${FORKFLEET_KSM_SLEEP_MS:-50}"
	[[ -e $k/smart_scan ]] && ksm_write smart_scan 1
	ksm_write run 1
	[[ $(cat "$k/run") == 1 ]] || die "could not enable KSM ($k/run)"
	if [[ -e $k/advisor_mode ]]; then
		step ksm ok "run=1, advisor scan-time (max_cpu $(cat $k/advisor_max_cpu)%, target $(cat $k/advisor_target_scan_time)s, at most $(cat $k/advisor_max_pages_to_scan) pages), sleep $(cat $k/sleep_millisecs) ms"
	else
		step ksm ok "run=1, pages_to_scan $(cat $k/pages_to_scan), sleep $(cat $k/sleep_millisecs) ms"
	fi
}

# ---------------------------------------------------------------- 8b. conntrack

# CRIU saves the conntrack entries of a sandbox's network namespace by walking
# the kernel's conntrack hash table, which is one table for all namespaces,
# and it walks it twice per dump (entries, then expectations). The kernel
# sizes the table from RAM: 262144 buckets on a 24 GB host took 8.6 ms per
# walk here, 17 ms of every checkpoint's frozen window; 16384 buckets take
# 0.5 ms. Sandboxes have only a loopback, so the table serves the host's own
# NAT and firewall; with fewer buckets it still holds nf_conntrack_max
# entries, in longer chains once it fills. Only ever lowered;
# FORKFLEET_CONNTRACK_BUCKETS=0 leaves the kernel's size alone.
readonly CONNTRACK_SYSCTL=/etc/sysctl.d/90-forkfleet-conntrack.conf

step_conntrack() {
	local f=/proc/sys/net/netfilter/nf_conntrack_buckets want=${FORKFLEET_CONNTRACK_BUCKETS:-16384} cur
	if [[ ! -e $f ]]; then
		step conntrack skip "no conntrack in this kernel: nothing for CRIU to walk"
		return
	fi
	[[ $want =~ ^[0-9]+$ ]] || die "FORKFLEET_CONNTRACK_BUCKETS=$want is not a number"
	cur=$(cat "$f")
	if ((want == 0)); then
		step conntrack skip "FORKFLEET_CONNTRACK_BUCKETS=0: kept $cur buckets (each checkpoint walks them twice)"
		return
	fi
	((cur > want)) && record_original conntrack_buckets "$cur"
	if ((cur > want)) && ! echo "$want" >"$f" 2>/dev/null; then
		# Writable only from the host's network namespace: not fatal, but
		# every dump then walks the bigger table (controld warns too).
		step conntrack warn "could not lower $f from $cur to $want: each checkpoint walks $cur buckets twice"
		return
	fi
	if [[ -d /etc/sysctl.d ]]; then
		write_file "$CONNTRACK_SYSCTL" 0644 <<-EOF || true
			# forkfleet (deploy/host-setup.sh): CRIU walks this table twice per checkpoint.
			net.netfilter.nf_conntrack_buckets = $(cat "$f")
		EOF
	fi
	step conntrack ok "$(cat "$f") hash buckets (was $cur)"
}

# ---------------------------------------------------------------- 8c. forwarding

# Sandboxes in network mode egress reach the outside through a router
# namespace of their own and the host, which must forward IPv4 between
# their uplinks and its own interfaces. controld's nftables table (inet
# forkfleet) confines what is forwarded for sandboxes; forwarding of other
# traffic is governed by the host's own firewall, as on any router.
# FORKFLEET_IP_FORWARD=0 leaves it off (mode egress is then refused).
readonly FORWARD_SYSCTL=/etc/sysctl.d/90-forkfleet-forward.conf

step_forward() {
	local f=/proc/sys/net/ipv4/ip_forward
	if [[ ${FORKFLEET_IP_FORWARD:-1} == 0 ]]; then
		step forward skip "FORKFLEET_IP_FORWARD=0: ip_forward is $(cat "$f"); sandbox network mode egress needs 1"
		return
	fi
	[[ $(cat "$f") != 1 ]] && record_original ip_forward "$(cat "$f")"
	if [[ $(cat "$f") != 1 ]] && ! echo 1 >"$f" 2>/dev/null; then
		step forward warn "could not set net.ipv4.ip_forward=1: sandbox network mode egress is unavailable"
		return
	fi
	if [[ -d /etc/sysctl.d ]]; then
		write_file "$FORWARD_SYSCTL" 0644 <<-EOF || true
			# forkfleet (deploy/host-setup.sh): sandboxes in network mode egress are routed through the host.
			net.ipv4.ip_forward = 1
		EOF
	fi
	step forward ok "net.ipv4.ip_forward=1 (sandbox egress)"
}

# ---------------------------------------------------------------- 8d. layers

# Every sandbox writes into a writable layer of its own with a disk quota
# (controld's limits.disk): a btrfs subvolume whose quota group the kernel
# holds to the quota, root in the sandbox included. The btrfs lives in a
# file preallocated on the host's disk at setup, so sandbox writes never
# take space from the host: the most they can take is the file's size,
# reserved once. This kernel has neither XFS quotas nor ext4's quota
# formats (CONFIG_XFS_QUOTA, CONFIG_QFMT_V2 unset); btrfs quota groups
# need neither. Size: FORKFLEET_LAYERS_SIZE (e.g. 64G) at creation,
# default the smaller of 16 GiB and a quarter of the free space. Mount
# options: nodiscard, or the loop device would punch holes into the
# preallocated file and give its space back to the host.
layers_mounted() { findmnt -rn -o FSTYPE --mountpoint "$LAYERS_DIR" 2>/dev/null | grep -qx btrfs; }

layers_size() {
	local want=${FORKFLEET_LAYERS_SIZE:-} free
	if [[ -n $want ]]; then
		numfmt --from=iec "$want" 2>/dev/null || die "FORKFLEET_LAYERS_SIZE=$want is not a size (e.g. 64G)"
		return
	fi
	free=$(($(stat -f -c '%a * %S' "$LIB_DIR")))
	free=$((free / 4 / (1 << 30) * (1 << 30)))
	((free > 16 << 30)) && free=$((16 << 30))
	((free >= 1 << 30)) || die "less than 4 GiB free on $LIB_DIR for the sandboxes' layers (set FORKFLEET_LAYERS_SIZE)"
	echo "$free"
}

make_layers_image() {
	local size tmp=$LAYERS_IMG.tmp how=preallocated
	size=$(layers_size)
	rm -f "$tmp"
	if ! fallocate -l "$size" "$tmp" 2>/dev/null; then
		# A filesystem without fallocate: sparse, so sandbox writes take
		# host space as they go (never more than the file's size).
		truncate -s "$size" "$tmp"
		how="sparse (no fallocate on $(stat -f -c %T "$LIB_DIR"))"
	fi
	# -q still prints a note on its 5.15 defaults to stdout.
	mkfs.btrfs -q -f -L forkfleet-layers -m single -d single "$tmp" >/dev/null || die "mkfs.btrfs $tmp failed"
	mv -f "$tmp" "$LAYERS_IMG"
	echo "$(numfmt --to=iec "$size") $how"
}

install_layers_unit() {
	write_file "/etc/systemd/system/$LAYERS_UNIT" 0644 <<-EOF || true
		# forkfleet sandboxes' writable layers (deploy/host-setup.sh): btrfs
		# with quotas in a preallocated file; controld needs it mounted.
		[Unit]
		Description=forkfleet sandbox layers (btrfs with quotas)
		Before=forkfleet-controld.service

		[Mount]
		What=$LAYERS_IMG
		Where=$LAYERS_DIR
		Type=btrfs
		Options=$LAYERS_OPTIONS

		[Install]
		WantedBy=multi-user.target
	EOF
	systemctl daemon-reload
	systemctl enable --now "$LAYERS_UNIT" >/dev/null 2>&1 || die "systemctl enable --now $LAYERS_UNIT failed"
}

step_layers() {
	local made="" size used
	if ! layers_mounted; then
		if findmnt -rn --mountpoint "$LAYERS_DIR" >/dev/null 2>&1; then
			die "$LAYERS_DIR is a mount point, but not btrfs: unmount it first"
		fi
		[[ -f $LAYERS_IMG ]] || made=$(make_layers_image)
		mkdir -p "$LAYERS_DIR"
		if is_systemd_host; then
			install_layers_unit
		else
			mount -o "$LAYERS_OPTIONS" "$LAYERS_IMG" "$LAYERS_DIR" || die "mount $LAYERS_IMG on $LAYERS_DIR failed"
		fi
	fi
	# Quotas stay enabled once on (the quota tree lives in the filesystem).
	if ! btrfs qgroup show "$LAYERS_DIR" >/dev/null 2>&1; then
		btrfs quota enable "$LAYERS_DIR" || die "btrfs quota enable $LAYERS_DIR failed"
	fi
	chmod 0700 "$LAYERS_DIR"
	size=$(df -B1 --output=size "$LAYERS_DIR" | tail -n 1 | tr -d ' ')
	used=$(df -B1 --output=used "$LAYERS_DIR" | tail -n 1 | tr -d ' ')
	if [[ -n $made ]]; then
		step layers "done" "made $LAYERS_IMG ($made), btrfs with quotas on $LAYERS_DIR"
	else
		step layers ok "btrfs with quotas on $LAYERS_DIR: $(numfmt --to=iec "$size"), $(numfmt --to=iec "$used") used"
	fi
}

# ---------------------------------------------------------------- 8e. user namespaces

# Every sandbox runs in a user namespace of its own, its ids 0..65535 a range
# of host ids no other sandbox holds (controld/internal/userns): root in a
# sandbox is an unprivileged user of the host. The ranges are subordinate
# ids of the name "forkfleet" in /etc/subuid and /etc/subgid, so that no
# other tool (useradd, podman) hands them out. No user of that name is
# made: nothing logs in as it, it only names the reservation. Default
# 2^30 ids from 2^30 (16384 sandboxes at once), above the range useradd
# allocates from (SUB_UID_MAX 600100000) and below 2^31 (signed 32-bit
# ids); FORKFLEET_SUBID_START and FORKFLEET_SUBID_COUNT choose others at
# the first setup. An entry already there is kept.
readonly SUBID_USER=forkfleet

subid_entry() { awk -F: -v u="$SUBID_USER" '$1 == u {print $2 ":" $3; exit}' "$1" 2>/dev/null; }

# subid_overlaps FILE START COUNT: prints the first other entry of FILE
# whose ids meet [START, START+COUNT).
subid_overlaps() {
	awk -F: -v u="$SUBID_USER" -v s="$2" -v n="$3" \
		'$1 != u && NF >= 3 && $2 < s + n && s < $2 + $3 {print; exit}' "$1" 2>/dev/null
}

step_userns() {
	local start=${FORKFLEET_SUBID_START:-1073741824} count=${FORKFLEET_SUBID_COUNT:-1073741824} f added=() have
	local max
	max=$(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0)
	((max > 0)) || die "user namespaces are off (user.max_user_namespaces=$max): sandboxes run in user namespaces of their own (set it, or userns.enabled=false in controld's config)"
	((count >= 65536 && start > 0 && start + count <= 4294967295)) ||
		die "FORKFLEET_SUBID_START=$start FORKFLEET_SUBID_COUNT=$count: at least 65536 ids, all below 2^32"
	for f in /etc/subuid /etc/subgid; do
		have=$(subid_entry "$f")
		if [[ -n $have ]]; then
			continue
		fi
		local other
		other=$(subid_overlaps "$f" "$start" "$count")
		[[ -z $other ]] || die "$f: the range $start+$count for $SUBID_USER meets '$other' (choose FORKFLEET_SUBID_START)"
		[[ -f $f ]] || install -m 0644 /dev/null "$f"
		printf '%s:%s:%s\n' "$SUBID_USER" "$start" "$count" >>"$f"
		added+=("$f")
	done
	if ((${#added[@]})); then
		for f in "${added[@]}"; do record_original "${f#/etc/}" added; done
		step userns "done" "reserved $SUBID_USER:$start:$count in ${added[*]} ($((count / 65536)) sandbox ranges)"
	else
		step userns skip "$SUBID_USER's subordinate ids: uids $(subid_entry /etc/subuid), gids $(subid_entry /etc/subgid)"
	fi
}

# ---------------------------------------------------------------- 9. systemd units

step_units() {
	local u
	for u in forkfleet-containerd forkfleet-controld; do
		[[ -f $SCRIPT_DIR/systemd/$u.service ]] || die "$SCRIPT_DIR/systemd/$u.service missing"
	done
	if is_systemd_host; then
		install_units
		# Enabled, so both come back after a reboot. controld starts once its
		# binary is installed (deploy/controld-up.sh, make demo).
		systemctl enable forkfleet-containerd.service forkfleet-controld.service >/dev/null 2>&1 ||
			die "systemctl enable forkfleet-containerd.service forkfleet-controld.service failed"
		step units ok "forkfleet-containerd.service and forkfleet-controld.service in /etc/systemd/system, enabled"
	else
		step units skip "PID 1 is $(cat /proc/1/comm), not systemd: units stay in deploy/systemd"
	fi
}

# ---------------------------------------------------------------- 10. host.env

step_env() {
	if write_file "$HOST_ENV" 0644 <<-EOF; then
		# forkfleet host stack, written by deploy/host-setup.sh. KEY=VALUE, no quoting:
		# usable from make (include), sh (. file) and systemd (EnvironmentFile).
		FORKFLEET_CONTAINERD_ADDRESS=$CONTAINERD_SOCK
		FORKFLEET_CONTAINERD_NAMESPACE=$NAMESPACE
		FORKFLEET_CONTAINERD_VERSION=$CONTAINERD_VER
		FORKFLEET_CONTAINERD_BIN=$CONTAINERD_BIN
		FORKFLEET_CTR=$CTR_BIN
		FORKFLEET_RUNC_VERSION=$RUNC_VER
		FORKFLEET_CRIU=$CRIU_BIN
		FORKFLEET_CRIU_VERSION=$CRIU_VER
		FORKFLEET_CRIU_CONFIG=$CRIU_CONF
		FORKFLEET_LAYERS_DIR=$LAYERS_DIR
	EOF
		step env "done" "wrote $HOST_ENV"
	else
		step env skip "$HOST_ENV up to date"
	fi
}

# ---------------------------------------------------------------- uninstall

# The cgroup parents of every sandbox controld and its tests create
# (containerdrt: <parent>/<id>, parents /forkfleet and /forkfleet-test-*).
sandbox_cgroups() {
	find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d -name 'forkfleet*' 2>/dev/null
}

# kill_sandboxes SIGKILLs every process in those cgroups (thawing frozen
# ones, or the signal never lands) and removes the cgroups, deepest first.
kill_sandboxes() {
	local d f n=0 i
	for i in 1 2 3 4 5 6 7 8 9 10; do
		n=0
		while read -r d; do
			while read -r f; do
				while read -r pid; do
					[[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null && n=$((n + 1))
				done <"$f"
			done < <(find "$d" -name cgroup.procs 2>/dev/null)
			find "$d" -name freezer.state 2>/dev/null | while read -r f; do echo THAWED >"$f" 2>/dev/null || true; done
			find "$d" -name cgroup.freeze 2>/dev/null | while read -r f; do echo 0 >"$f" 2>/dev/null || true; done
		done < <(sandbox_cgroups)
		((n == 0)) && break
		sleep 0.3
	done
	sandbox_cgroups | while read -r d; do
		find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
	[[ -z $(sandbox_cgroups) ]] || note uninstall "cgroups left behind: $(sandbox_cgroups | head -n 3 | paste -sd ' ')" >&2
	echo "$n"
}

# unmount_under DIR: unmounts every mount at or below DIR, deepest first.
unmount_under() {
	local m
	findmnt -rn -o TARGET | awk -v d="$1" 'index($0, d) == 1' | sort -r | while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
	done
}

# remove_if_ours FILE CACHED: removes an installed binary that is the copy of
# the cached build this script installed (a host's own containerd stays).
remove_if_ours() {
	[[ -f $1 && -f $2 ]] && cmp -s "$1" "$2" && rm -f "$1"
	return 0
}

main_uninstall() {
	local keep=$1 b n pkgs=() key val f
	# controld first: it would recreate warm slots while sandboxes die.
	if is_systemd_host; then
		systemctl disable --now forkfleet-controld.service forkfleet-containerd.service >/dev/null 2>&1 || true
	fi
	"$SCRIPT_DIR/controld-up.sh" --stop >/dev/null 2>&1 || true
	pkill -KILL -x controld 2>/dev/null || true
	n=$(kill_sandboxes)
	step sandboxes "done" "killed $n sandbox processes, removed their cgroups"
	main_stop
	# Shims of the project's containerd exit with it only once their task is
	# deleted: after a wipe nothing will delete them.
	pkill -KILL -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" 2>/dev/null || true
	unmount_under "$CONTAINERD_ROOT"
	unmount_under "$RUN_DIR"
	# Anything else mounted in the state directory (a loop-mounted layer
	# filesystem is detached with its last unmount: mount -o loop autoclears).
	unmount_under "$LIB_DIR"
	# Sandbox networks (controld/internal/network): the host ends of the
	# sandboxes' uplinks (their namespaces went with the unmounts above) and
	# controld's nftables table.
	ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep '^ffh' | xargs -r -n1 ip link delete 2>/dev/null || true
	nft delete table inet forkfleet 2>/dev/null || true
	# The layers' btrfs: unmounting a loop mount detaches its loop device.
	if is_systemd_host; then
		systemctl disable --now "$LAYERS_UNIT" >/dev/null 2>&1 || true
		rm -f "/etc/systemd/system/$LAYERS_UNIT"
	fi
	unmount_under "$LAYERS_DIR"
	rm -f "$LAYERS_IMG" "$LAYERS_IMG.tmp"
	# Every containerd namespace, image, snapshot and sandbox state, CRIU's
	# images, controld's state, the logs, the host config.
	rm -rf "$CONTAINERD_ROOT" "$RUN_DIR" "$LOG_DIR" "$ETC_DIR" /run/criu.kdat /run/criu.kdat.tmp
	step state "done" "removed $LIB_DIR/*, $RUN_DIR, $LOG_DIR, $ETC_DIR"
	for b in containerd containerd-shim-runc-v2 ctr; do
		remove_if_ours "/usr/local/bin/$b" "$CONTAINERD_CACHE/$b"
	done
	rm -f /usr/local/bin/controld /usr/local/bin/forkfleet-log /usr/local/bin/forkfleet-nethook "$SUPERVISOR" "$CONNTRACK_SYSCTL" "$FORWARD_SYSCTL"
	rmdir "$(dirname "$SUPERVISOR")" 2>/dev/null || true
	is_our_wrapper "$CRIU_WRAPPER" && rm -f "$CRIU_WRAPPER"
	rm -rf "$CRIU_PREFIX"
	rmdir "$(dirname "$CRIU_PREFIX")" 2>/dev/null || true
	if is_systemd_host; then
		rm -f /etc/systemd/system/forkfleet-containerd.service /etc/systemd/system/forkfleet-controld.service
		systemctl daemon-reload || true
	fi
	step files "done" "removed the installed binaries, CRIU, units and sysctl file"
	# The sandboxes' subordinate ids, where this script reserved them.
	for f in /etc/subuid /etc/subgid; do
		if grep -qx "${f#/etc/}=added" "$ORIGINALS" 2>/dev/null && [[ -f $f ]]; then
			sed -i "/^$SUBID_USER:/d" "$f"
			step userns "done" "removed $SUBID_USER's subordinate ids from $f"
		fi
	done
	# Kernel settings back to what they were before the first setup.
	if [[ -f $ORIGINALS ]]; then
		while IFS='=' read -r key val; do
			case $key in
			ksm_*) f=/sys/kernel/mm/ksm/${key#ksm_} ;;
			conntrack_buckets) f=/proc/sys/net/netfilter/nf_conntrack_buckets ;;
			ip_forward) f=/proc/sys/net/ipv4/ip_forward ;;
			*) continue ;;
			esac
			[[ -w $f ]] && echo "$val" >"$f" 2>/dev/null || note uninstall "could not restore $f to $val"
		done <"$ORIGINALS"
		step kernel "done" "restored $(wc -l <"$ORIGINALS") KSM/conntrack/forwarding settings; /run stays a tmpfs until reboot"
	fi
	if [[ -f $PACKAGES_INSTALLED ]]; then
		mapfile -t pkgs <"$PACKAGES_INSTALLED"
	fi
	if ((${#pkgs[@]})); then
		apt_get purge "${pkgs[@]}" || die "apt-get purge ${pkgs[*]} failed"
		step packages "done" "purged ${pkgs[*]}"
	fi
	rm -rf "$LIB_DIR"
	if ((keep)); then
		# Keyed by their inputs: the containerd build by its version, CRIU
		# by its .debs' version, image bases by the hash of their inputs,
		# prometheus by its package's version, the kube-apiserver by its
		# sources' hash (deploy/kubernetes/apiserver/build.sh).
		find "$CACHE_DIR" -mindepth 1 -maxdepth 1 ! -name 'containerd-v*' ! -name criu ! -name images ! -name prometheus ! -name registry ! -name kube-apiserver -exec rm -rf {} +
		find "$CACHE_DIR/images" -mindepth 1 -maxdepth 1 ! -name '*-base-*.tar' -exec rm -rf {} + 2>/dev/null || true
		step caches keep "kept $(ls -d "$CACHE_DIR"/containerd-v* "$CACHE_DIR"/criu "$CACHE_DIR"/images/*-base-*.tar "$CACHE_DIR"/prometheus "$CACHE_DIR"/registry "$CACHE_DIR"/kube-apiserver 2>/dev/null | paste -sd ' ')"
	else
		rm -rf "$CACHE_DIR"
		step caches "done" "removed $CACHE_DIR"
	fi
	# Stale X server locks of killed test desktops would make the next Xvfb
	# on that display number fail.
	for f in /tmp/.X*-lock; do
		[[ -f $f ]] || continue
		kill -0 "$(tr -dc 0-9 <"$f")" 2>/dev/null && continue
		n=${f#/tmp/.X}
		rm -f "$f" "/tmp/.X11-unix/X${n%-lock}"
	done
	printf 'host-setup: uninstalled in %d ms: the host is as deploy/host-setup.sh found it%s\n' \
		"$(elapsed_ms "$START_US")" "$( ((keep)) && echo ', but for the caches kept')"
}

# ---------------------------------------------------------------- main

usage() {
	sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# ---------------------------------------------------------------- test servers

# The tests run a real Prometheus against controld (its dashboard's queries,
# promtool check metrics, the alert rules' promtool tests) and a real OCI
# registry (Debian's docker-registry) for checkpoints moved between hosts.
# Debian's packages would install and start servers; only their binaries
# are needed, so each .deb is downloaded and unpacked into the cache, keyed
# by its version, and the tests start the servers on loopback themselves.
readonly PROMETHEUS_CACHE=$CACHE_DIR/prometheus
readonly REGISTRY_CACHE=$CACHE_DIR/registry

# unpack_deb PACKAGE CACHE BIN...: the binaries /usr/bin/BIN of the Debian
# package PACKAGE's candidate version, in CACHE/<version>/bin (CACHE/bin
# links there).
unpack_deb() {
	local pkg=$1 cache=$2 version dir deb b ok=1
	shift 2
	version=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
	if [[ -z $version || $version == "(none)" ]]; then
		apt_get update || die "apt-get update failed"
		version=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
	fi
	[[ -n $version && $version != "(none)" ]] || die "no $pkg package in the Debian archive"
	dir=$cache/${version//[^A-Za-z0-9.+~-]/_}
	for b in "$@"; do [[ -x $dir/bin/$b ]] || ok=0; done
	if ((ok)); then
		ln -sfn "$dir/bin" "$cache/bin"
		step "$pkg" skip "$pkg $version in $cache/bin"
		return
	fi
	rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/deb"
	(cd "$dir.tmp/deb" && apt_get download "$pkg=$version") || die "apt-get download $pkg=$version failed"
	deb=$(compgen -G "$dir.tmp/deb/${pkg}_*.deb" | head -n 1)
	dpkg -x "$deb" "$dir.tmp/root" || die "dpkg -x $deb failed"
	mkdir -p "$dir.tmp/bin"
	for b in "$@"; do cp "$dir.tmp/root/usr/bin/$b" "$dir.tmp/bin/"; done
	rm -rf "$dir.tmp/deb" "$dir.tmp/root" "$dir"
	mv "$dir.tmp" "$dir"
	ln -sfn "$dir/bin" "$cache/bin"
	step "$pkg" "done" "$* $version unpacked into $dir/bin ($cache/bin)"
}

step_prometheus() {
	unpack_deb prometheus "$PROMETHEUS_CACHE" prometheus promtool
}

step_registry() {
	unpack_deb docker-registry "$REGISTRY_CACHE" docker-registry
}

main_stop() {
	if is_systemd_host && systemctl is-active --quiet forkfleet-containerd.service; then
		systemctl stop forkfleet-containerd.service
		step stop "done" "stopped forkfleet-containerd.service (sandbox shims keep running)"
	elif stop_supervised; then
		step stop "done" "stopped containerd and its supervisor (sandbox shims keep running)"
	else
		step stop skip "the project's containerd is not running"
	fi
}

main() {
	local mode=setup keep=0 pkgs=()
	case ${1:-} in
	"") ;;
	--stop) mode=stop ;;
	--prometheus) mode=prometheus ;;
	--registry) mode=registry ;;
	--packages)
		mode=packages
		shift
		pkgs=("$@")
		((${#pkgs[@]})) || die "--packages needs package names"
		set --
		;;
	--uninstall)
		mode=uninstall
		case ${2:-} in
		"") ;;
		--keep-caches) keep=1 ;;
		*) die "unknown argument '$2' (try --help)" ;;
		esac
		;;
	-h | --help)
		usage
		return 0
		;;
	*) die "unknown argument '$1' (try --help)" ;;
	esac
	[[ $(id -u) == 0 ]] || die "must run as root"
	mkdir -p "$LIB_DIR" "$LOG_DIR" "$ETC_DIR"

	# One setup at a time (make demo and make test may race). The lock fd is
	# closed by the supervisor, so a running daemon does not hold it.
	exec 9>"$LOCKFILE"
	if ! flock -n 9; then
		note lock "another host-setup.sh is running: waiting"
		flock -w 1800 9 || die "timed out waiting for $LOCKFILE"
	fi

	case $mode in
	stop)
		main_stop
		return
		;;
	packages)
		step_apt "${pkgs[@]}"
		return
		;;
	prometheus)
		step_prometheus
		return
		;;
	registry)
		step_registry
		return
		;;
	uninstall)
		main_uninstall "$keep"
		return
		;;
	esac

	step_apt
	step_containerd
	step_runc
	step_run_tmpfs
	step_criu_config
	step_criu
	step_criu_preload
	step_criu_version
	step_kdat
	step_containerd_config
	step_start
	step_ksm
	step_userfaultfd
	step_conntrack
	step_forward
	step_layers
	step_userns
	step_units
	step_env
	printf 'host-setup: ready in %d ms: containerd %s at %s (namespace %s), runc %s, criu %s (%s)\n' \
		"$(elapsed_ms "$START_US")" "$CONTAINERD_VER" "$CONTAINERD_SOCK" "$NAMESPACE" "$RUNC_VER" "$CRIU_VER" "$CRIU_BIN"
}

# Sourced (images/node/build.sh and its Dockerfile reuse the containerd and
# CRIU steps' functions): define only.
[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@"
