#!/usr/bin/env bash
# Interleaved A/B of controld builds on the real stack (benchd/README.md, "A/B").
#
#   benchd/ab.sh [--rounds 6] [--suites boot,checkpoint,fork] [--out DIR] [--note TEXT]
#                NAME=REV[:userns=off] NAME=REV[:userns=off]...
#   benchd/ab.sh --exec CMD NAME=REV[:userns=off]...
#
#   benchd/ab.sh --out benchd/results/2026-12-02/cost-ab \
#       before=2fca658 after=main userns-off=main:userns=off
#
# Each variant is a commit's controld and desktop image (built in a temporary
# worktree, cached under $FORKFLEET_AB_CACHE by commit), imported into a
# containerd namespace of its own and served by a private controld: own
# socket, namespace, state and checkpoint dirs, network table and range,
# cgroup parent (when the commit's controld has the key), no TCP listeners
# but a gateway on a free loopback port. The shared controld
# (/run/forkfleet/controld.sock) and other namespaces are never touched.
#
# The suites run in rounds; each round visits every variant, the order
# rotating by one per round, so drift of the host's load spreads over all of
# them. One benchd (this checkout's) drives them all. Measuring holds
# /tmp/forkfleet-bench.lock (TEAM.md); building does not.
#
# Results: DIR/rounds/NAME/rN/... (every run and its spans), then
# DIR/SUITE-NAME.json pooled over the rounds (benchd pool: config.pooled_from,
# config.loads, config.ab*) and DIR/compare-NAME.txt (benchd compare
# --threshold 5 of the first variant against NAME). On exit, interrupted or
# not, every variant's sandboxes, checkpoints and pools are deleted through
# its controld, the controld stopped, and its namespace emptied and removed
# with whatever the controld left (warm slots, networks, layers, cgroups).
#
# --exec runs CMD (bash -c) instead of the rounds, under the lock, with the
# same private controlds: AB_SOCKET_<NAME> and AB_NAMESPACE_<NAME> (NAME upper
# case, - as _) name each one's socket and namespace (a profile of one build).
#
# Env: FORKFLEET_AB_CACHE (default /var/cache/forkfleet/ab), AB_BOOT_FLAGS,
# AB_CHECKPOINT_FLAGS, AB_FORK_FLAGS (override each suite's flags below).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${FORKFLEET_AB_CACHE:-/var/cache/forkfleet/ab}
lock=/tmp/forkfleet-bench.lock
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
set -a
# shellcheck disable=SC1091 # written by deploy/host-setup.sh
. /etc/forkfleet/host.env
set +a
address=${FORKFLEET_CONTAINERD_ADDRESS:-/run/forkfleet/containerd/containerd.sock}
ctr_bin=${FORKFLEET_CTR:-ctr}
layers_dir=${FORKFLEET_LAYERS_DIR:-/var/lib/forkfleet/layers}
net_run=/run/forkfleet/net

# The A/B's measurement: bare and 300 MB checkpoints, memory and disk forks
# at 1, 8 and 16; peers and KSM waits are left to the suites' own runs.
boot_flags=${AB_BOOT_FLAGS:---boot-n 10 --boot-floor=false}
checkpoint_flags=${AB_CHECKPOINT_FLAGS:---checkpoint-n 10 --checkpoint-podman=false}
fork_flags=${AB_FORK_FLAGS:---fork-ns 1,8,16 --fork-reps 3 --fork-ksm-wait 0 --fork-podman=false --fork-ram-mb 0}

say() { printf 'ab: %s\n' "$*" >&2; }
die() { printf 'ab: error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

rounds=6
suites=boot,checkpoint,fork
out=
note=
exec_cmd=
specs=()
while [ $# -gt 0 ]; do
	case $1 in
	--rounds) rounds=$2; shift 2 ;;
	--suites) suites=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--note) note=$2; shift 2 ;;
	--exec) exec_cmd=$2; shift 2 ;;
	-h | --help) usage ;;
	-*) die "unknown flag $1" ;;
	*) specs+=("$1"); shift ;;
	esac
done
[ "$(id -u)" -eq 0 ] || die "run as root (containerd, CRIU, cgroups)"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds $rounds: want a positive number"
if [ -z "$exec_cmd" ]; then
	[ -n "$out" ] || die "--out DIR is required"
	[ ${#specs[@]} -ge 2 ] || usage
else
	[ ${#specs[@]} -ge 1 ] || usage
	out=${out:-$(mktemp -d /tmp/forkfleet-ab-exec.XXXXXX)}
fi
[ -S "$address" ] || die "no containerd at $address (make host)"
IFS=, read -r -a suite_list <<<"$suites"
for s in "${suite_list[@]}"; do
	case $s in boot | checkpoint | fork) ;; *) die "suite $s: the A/B runs boot, checkpoint and fork" ;; esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

# NAME=REV[:userns=off] -> names[i], revs[i], shas[i], userns[i].
names=() revs=() shas=() userns=()
for spec in "${specs[@]}"; do
	name=${spec%%=*} rest=${spec#*=}
	rev=${rest%%:*} opt=
	[ "$rev" != "$rest" ] && opt=${rest#*:}
	[[ $name =~ ^[a-z0-9][a-z0-9-]{0,15}$ ]] || die "variant name $name: lower case letters, digits and -, at most 16"
	for n in "${names[@]}"; do [ "$n" != "$name" ] || die "variant $name named twice"; done
	case $opt in "") u=default ;; userns=off) u=off ;; *) die "$spec: option $opt (userns=off)" ;; esac
	sha=$(git -C "$repo" rev-parse --verify --quiet "$rev^{commit}") || die "$rev: not a commit of $repo"
	names+=("$name") revs+=("$rev") shas+=("$sha") userns+=("$u")
done

tag=$$
work=$(mktemp -d /var/tmp/forkfleet-ab.XXXXXX)
pids=() socks=() nss=() tables=() prefixes=() cgparents=()
worktrees=()

# ---- cleanup: runs on every exit ----------------------------------------
sweep_namespace() { # ns: remove everything a controld left in it, then it
	local ns=$1 c=("$ctr_bin" --address "$address" -n "$1") id pass left
	for id in $("${c[@]}" tasks ls -q 2>/dev/null); do
		"${c[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
	done
	for id in $("${c[@]}" tasks ls -q 2>/dev/null); do
		"${c[@]}" tasks rm -f "$id" >/dev/null 2>&1 || true
	done
	for id in $("${c[@]}" containers ls -q 2>/dev/null); do
		"${c[@]}" containers rm "$id" >/dev/null 2>&1 || true
	done
	for id in $("${c[@]}" leases ls -q 2>/dev/null); do
		"${c[@]}" leases rm "$id" >/dev/null 2>&1 || true
	done
	for id in $("${c[@]}" images ls -q 2>/dev/null); do
		"${c[@]}" images rm --sync "$id" >/dev/null 2>&1 || true
	done
	# Children before parents: a pass removes the leaves.
	for pass in $(seq 1 20); do
		left=$("${c[@]}" snapshots --snapshotter overlayfs ls 2>/dev/null | awk 'NR > 1 { print $1 }')
		[ -n "$left" ] || break
		for id in $left; do "${c[@]}" snapshots --snapshotter overlayfs rm "$id" >/dev/null 2>&1 || true; done
	done
	for id in $("${c[@]}" content ls -q 2>/dev/null); do
		"${c[@]}" content rm "$id" >/dev/null 2>&1 || true
	done
	"$ctr_bin" --address "$address" namespaces rm "$ns" >/dev/null 2>&1 ||
		say "namespace $ns not removed: $("$ctr_bin" --address "$address" namespaces rm "$ns" 2>&1 | tail -1)"
	# The sandboxes' networks (bind-mounted namespaces), layers and state.
	if [ -d "$net_run/$ns" ]; then
		find "$net_run/$ns" -type f -exec umount -l {} \; 2>/dev/null || true
		rm -rf "${net_run:?}/$ns"
	fi
	if [ -d "$layers_dir/$ns" ]; then
		for id in "$layers_dir/$ns"/*; do
			[ -e "$id" ] || continue
			btrfs subvolume delete "$id" >/dev/null 2>&1 || rm -rf "$id"
		done
		rmdir "$layers_dir/$ns" 2>/dev/null || true
	fi
}

stop_variant() { # i
	local i=$1 sock=${socks[$1]} pid=${pids[$1]} ctl=("$work/forkfleetctl" --address "unix://${socks[$1]}" -o json)
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ -S "$sock" ]; then
		# Through controld first: it tears its sandboxes down whole.
		local id
		for id in $("${ctl[@]}" pool list 2>/dev/null | jq -r '.pools[]?.id'); do "${ctl[@]}" pool delete "$id" >/dev/null 2>&1 || true; done
		for id in $("${ctl[@]}" sandbox list --page-size 1000 2>/dev/null | jq -r '.sandboxes[]?.id'); do "${ctl[@]}" sandbox delete "$id" >/dev/null 2>&1 || true; done
		for id in $("${ctl[@]}" checkpoint list 2>/dev/null | jq -r '.checkpoints[]?.id'); do "${ctl[@]}" checkpoint delete --cascade "$id" >/dev/null 2>&1 || true; done
	fi
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	sweep_namespace "${nss[$i]}"
	[ -n "${tables[$i]}" ] && nft delete table inet "${tables[$i]}" 2>/dev/null || true
	if [ -n "${prefixes[$i]}" ]; then
		local l
		for l in $(ip -o link show | awk -F': ' '{ print $2 }' | sed 's/@.*//' | grep "^${prefixes[$i]}" || true); do
			ip link del "$l" 2>/dev/null || true
		done
	fi
	if [ -n "${cgparents[$i]}" ]; then
		find /sys/fs/cgroup/*/"${cgparents[$i]#/}" -depth -type d -exec rmdir {} \; 2>/dev/null || true
	fi
}

cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	for i in "${!nss[@]}"; do stop_variant "$i"; done
	for w in "${worktrees[@]}"; do git -C "$repo" worktree remove --force "$w" >/dev/null 2>&1 || true; done
	rm -rf "$work"
	say "cleaned up (exit $rc)"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- build: one controld and desktop image per commit (cached) -----------
build_commit() { # sha -> $cache/sha/{bin,images/desktop-oci}
	local sha=$1 dir=$cache/$1 src=$work/src-${1:0:12} buildfd
	mkdir -p "$cache"
	# Two runs building one commit at once would remove each other's output.
	exec {buildfd}>"$cache/$sha.lock"
	flock "$buildfd"
	if [ -f "$dir/.done" ]; then
		say "${sha:0:12}: cached in $dir"
		exec {buildfd}>&-
		return
	fi
	rm -rf "$dir"
	mkdir -p "$dir/images"
	say "${sha:0:12}: building controld and the desktop image (nice 19)"
	git -C "$repo" worktree add --detach "$src" "$sha" >/dev/null 2>&1
	worktrees+=("$src")
	nice -n 19 make -C "$src" build BIN="$dir/bin" >"$dir/build.log" 2>&1 ||
		die "${sha:0:12}: make build failed ($dir/build.log)"
	# The debootstrapped base is shared by every commit with the same inputs.
	local t
	for t in /var/cache/forkfleet/images/desktop-base-*.tar; do
		[ -f "$t" ] || continue
		ln -f "$t" "$dir/images/" 2>/dev/null || cp "$t" "$dir/images/"
	done
	FORKFLEET_IMAGE_CACHE=$dir/images nice -n 19 "$src/images/desktop/build.sh" --no-import >>"$dir/build.log" 2>&1 ||
		die "${sha:0:12}: the desktop image did not build ($dir/build.log)"
	find "$dir/images" -maxdepth 1 -name 'desktop-base-*.tar' -delete
	git -C "$repo" worktree remove --force "$src" >/dev/null 2>&1 || true
	touch "$dir/.done"
	exec {buildfd}>&-
}
for sha in $(printf '%s\n' "${shas[@]}" | sort -u); do build_commit "$sha"; done
say "building this checkout's benchd and forkfleetctl (one client for every variant)"
(cd "$repo/benchd" && nice -n 19 go build -o "$work/benchd" ./cmd/benchd)
(cd "$repo/api" && nice -n 19 go build -o "$work/forkfleetctl" ./cmd/forkfleetctl)

# ---- start: one private controld per variant -----------------------------
start_variant() { # i
	local i=$1 name=${names[$1]} sha=${shas[$1]} bin=$cache/${shas[$1]}/bin v=$work/v-${names[$1]}
	local ns="ab-$name-$tag" printed cfg=$v/controld.toml
	mkdir -p "$v"
	nss[i]=$ns socks[i]=$v/controld.sock pids[i]= tables[i]= prefixes[i]= cgparents[i]=
	printed=$("$bin/controld" --print-config)
	: >"$cfg"
	if grep -q '^\[network\]' <<<"$printed"; then
		# Its own nftables table, interface prefix and uplink range: the
		# shared controld holds the default ones.
		tables[i]=ffab$i prefixes[i]=ffb$i
		printf '[network]\ntable = "ffab%d"\nif_prefix = "ffb%d"\nuplink_cidr = "10.%d.0.0/16"\n' "$i" "$i" $((230 + i)) >>"$cfg"
	fi
	if grep -q '^cgroup_parent' <<<"$printed"; then
		cgparents[i]=/forkfleet-ab-$name-$tag
		printf '[containerd]\ncgroup_parent = "%s"\n' "${cgparents[$i]}" >>"$cfg"
	fi
	if [ "${userns[$i]}" = off ]; then
		grep -q '^\[userns\]' <<<"$printed" || die "$name: ${sha:0:12}'s controld has no userns.enabled"
		printf '[userns]\nenabled = false\n' >>"$cfg"
	fi
	"$bin/forkfleet-image" import --address "$address" --namespace "$ns" "$cache/$sha/images/desktop-oci" >"$v/import.log" 2>&1 ||
		die "$name: image import into $ns failed ($v/import.log)"
	local args=(--config "$cfg" --state-dir "$v/state" --checkpoint-dir "$v/checkpoints"
		--grpc-unix "${socks[$i]}" --grpc-tcp= --gateway-listen 127.0.0.1:0 --metrics-listen=
		--containerd-namespace "$ns" --token-file "$v/no.token")
	setsid "$bin/controld" "${args[@]}" >"$v/controld.log" 2>&1 </dev/null &
	pids[i]=$!
	for _ in $(seq 1 600); do
		[ -S "${socks[$i]}" ] && "$work/forkfleetctl" --address "unix://${socks[$i]}" sandbox list >/dev/null 2>&1 && break
		kill -0 "${pids[$i]}" 2>/dev/null || { tail -n 20 "$v/controld.log" >&2; die "$name: controld exited"; }
		sleep 0.1
	done
	say "$name: controld ${sha:0:12} (userns ${userns[$i]}) on ${socks[$i]}, namespace $ns"
}
for i in "${!names[@]}"; do start_variant "$i"; done

# ---- measure: rounds, order rotating -------------------------------------
flags_of() {
	case $1 in boot) echo "$boot_flags" ;; checkpoint) echo "$checkpoint_flags" ;; fork) echo "$fork_flags" ;; esac
}
exec {lockfd}>"$lock"
say "waiting for $lock"
flock "$lockfd"
if [ -n "$exec_cmd" ]; then
	for i in "${!names[@]}"; do
		v=${names[$i]^^}
		export "AB_SOCKET_${v//-/_}=${socks[$i]}" "AB_NAMESPACE_${v//-/_}=${nss[$i]}"
	done
	say "running: $exec_cmd (load $(cut -d' ' -f1-3 /proc/loadavg))"
	rc=0
	bash -c "$exec_cmd" || rc=$?
	flock -u "$lockfd"
	exit "$rc"
fi
k=${#names[@]}
loads=()
failed=0
mkdir -p "$out/rounds"
for r in $(seq 1 "$rounds"); do
	loads+=("r$r $(cut -d' ' -f1-3 /proc/loadavg)")
	for j in $(seq 0 $((k - 1))); do
		i=$(((j + r - 1) % k))
		for s in "${suite_list[@]}"; do
			say "round $r/$rounds: ${names[$i]} $s (load $(cut -d' ' -f1 /proc/loadavg))"
			rc=0
			# shellcheck disable=SC2046 # the flags are words
			(cd "$repo" && "$work/benchd" run --suite "$s" --controld-socket "${socks[$i]}" \
				--out "$out/rounds/${names[$i]}/r$r" $(flags_of "$s")) >>"$out/rounds/run.log" 2>&1 || rc=$?
			if [ "$rc" -ne 0 ]; then
				say "round $r: ${names[$i]} $s failed, exit $rc (rounds/run.log)"
				failed=$((failed + 1))
			fi
		done
	done
done
loads+=("end $(cut -d' ' -f1-3 /proc/loadavg)")
flock -u "$lockfd"

# ---- pool and compare ----------------------------------------------------
desc="interleaved A/B (benchd/ab.sh), $rounds rounds, order rotating; variants:"
for i in "${!names[@]}"; do
	desc+=" ${names[$i]}=${shas[$i]:0:12}"
	[ "${userns[$i]}" = off ] && desc+=" (userns.enabled=false)"
done
[ -n "$note" ] && desc+="; $note"
for s in "${suite_list[@]}"; do
	for i in "${!names[@]}"; do
		mapfile -t files < <(find "$out/rounds/${names[$i]}" -name "$s-*.json" | sort -V)
		[ ${#files[@]} -gt 0 ] || { say "no $s runs of ${names[$i]}"; continue; }
		rel=()
		for f in "${files[@]}"; do rel+=("${f#"$out"/}"); done
		(cd "$out" && "$work/benchd" pool --out "$out/$s-${names[$i]}.json" --set "ab=$desc" \
			--set "ab.variant=${names[$i]}" --set "ab.commit=${shas[$i]}" --set "ab.userns=${userns[$i]}" \
			--set "ab.loads=${loads[*]}" "${rel[@]}") >/dev/null
	done
done
for i in "${!names[@]}"; do
	[ "$i" -eq 0 ] && continue
	{
		echo "# ${names[0]} (${shas[0]:0:12}) -> ${names[$i]} (${shas[$i]:0:12}, userns ${userns[$i]}); load: ${loads[*]}"
		for s in "${suite_list[@]}"; do
			"$work/benchd" compare --threshold 5 "$out/$s-${names[0]}.json" "$out/$s-${names[$i]}.json" || true
		done
	} >"$out/compare-${names[$i]}.txt"
done
say "done: $out (load by round: ${loads[*]}; $failed failed runs)"
[ "$failed" -eq 0 ]
