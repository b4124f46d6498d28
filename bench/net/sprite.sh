#!/usr/bin/env bash
# Benchmarks Sprite's consistency rules (issue 13, seeds/001): a C build on
# two clients of one `shale serve`, each mounting it with shale's 9P client
# (`shale mount 9p://…`) through a relay that adds round-trip time
# (`shale delay`), with delayed write (`--write-delay 30s`) and with
# write-through (`--write-delay 0`), against the local loop view
# (`shale mount LOWER MNT`, two views of one LOWER), side by side in one
# run. Per configuration, medians of the runs: the written bytes that
# never reached the server, the opens that needed a consistency action,
# the 9P requests of both clients and those delayed write saves, and the
# wall time against the loop view's; beside Sprite's numbers. With -B,
# each network configuration also on another revision's build, and the
# times of one set against the other's.
#
#   bench/net/sprite.sh [-n RUNS] [-o OUT.md] [-d WORKDIR] [-l RTTS]
#                       [-s SYSTEMS] [-F FILES] [-j JOBS] [-t SECS]
#                       [-B REV]
#
#   -n RUNS     repetitions of every configuration (default 3; 1 for a
#               quick try)
#   -o OUT.md   also write the report (markdown) to OUT.md, the raw
#               results to OUT.tsv
#   -d WORKDIR  where lower directories and mount points go (default
#               /var/tmp/shale-spritebench; a disk file system)
#   -l RTTS     comma-separated added round-trip times in whole ms
#               (default 0,50)
#   -s SYSTEMS  comma-separated, of: local (the loop view, once per
#               repetition: it has no network), delay (shale serve, the
#               clients with --write-delay 30s), wt (the same with
#               --write-delay 0: write-through), off (shale serve
#               --sprite=false: Network II's caching client, no Sprite
#               rules; not in the default), deleg (delay with shale serve
#               --delegate: delegations, locks kept under them; not in
#               the default) (default local,delay,wt)
#   -F FILES    .c files in the generated tree (default 24)
#   -j JOBS     make -j (default 2)
#   -t SECS     a step that runs longer is stopped and reported as
#               "timeout" (default 300)
#   -B REV      also build REV (a git revision of this repository, e.g.
#               669a1f9 or HEAD~1) into a private binary, and run every
#               network configuration (delay, wt, off) on it as well, as
#               SYSTEM@base: server and both clients from REV's build, the
#               relay this build's. Each repetition runs a configuration
#               on both builds back to back, this build first in odd
#               repetitions, REV's first in even ones. The report adds,
#               per configuration and step (and the wall time), the median
#               of each and current ÷ base, and ends with the worst ratio:
#               PASS if none is more than 5% slower than on REV, else MISS.
#               An even RUNS gives both builds the first turn as often.
#
# The tree, generated once: FILES modules of about 5 KB of C (a table and
# eight switch-heavy functions each, 11 KB of assembly, 5 KB of object),
# a main.c, include/sprite.h which every file includes, and a Makefile:
# every module compiled with gcc -O1 -Iinclude, archived with
# `ar rcs libsprite.a`, linked with main.o into prog. Both clients use the
# tree's directory and one TMPDIR (LOWER/tmp, as a shared /tmp), both on
# the mount: gcc writes each module's assembly there and deletes it once
# as(1) has made the object (the compiler temporaries of seeds/001).
#
# Per configuration and repetition, on a new server (and relay) and two
# new client mounts, A and B:
#   build A   A runs `make -j JOBS` of the tree
#   build B   B edits include/sprite.h (sed -i: SALT 1 becomes 2, which
#             changes what the program prints) and runs `make -j JOBS`:
#             every object is out of date, so each compile opens A's
#             object for writing and ar and the link open A's
#             libsprite.a and prog: sequential write sharing, which makes
#             the server recall A's delayed writes
#   clean     B runs `make clean`
# Each build runs its program: the report says how many objects B's make
# compiled and whether B's program printed what SALT 2 gives (a build
# that skipped objects links stale ones). Then `shale stats --json` of
# each client and `shale stats 9p://SERVER/` (straight to the server, not
# through the relay) are read. The loop view runs the same steps on two
# views of one LOWER. Kernel caches are dropped before each
# configuration.
#
# Needs root (drop_caches), gcc, make, ar (binutils) and jq.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH=/usr/local/go/bin:$PATH
export LC_ALL=C
. bench/lib.sh
. bench/net/lib.sh

runs=3 out="" work=/var/tmp/shale-spritebench steptimeout=300
rtts=0,50 systems=local,delay,wt files=24 jobs=2 base_rev=""
while getopts "n:o:d:l:s:F:j:t:B:h" opt; do
	case $opt in
	n) runs=$OPTARG ;;
	o) out=$OPTARG ;;
	d) work=$OPTARG ;;
	l) rtts=$OPTARG ;;
	s) systems=$OPTARG ;;
	F) files=$OPTARG ;;
	j) jobs=$OPTARG ;;
	t) steptimeout=$OPTARG ;;
	B) base_rev=$OPTARG ;;
	*) usage; exit 2 ;;
	esac
done
positive n "$runs"
positive t "$steptimeout"
positive F "$files"
positive j "$jobs"
[ -z "$base_rev" ] || base_check "$base_rev"
[ "$files" -le 100 ] || { echo "sprite.sh: -F wants at most 100 files, got $files" >&2; exit 2; }
[ -z "$out" ] || out=$(realpath -m "$out")
IFS=, read -r -a rttlist <<<"$rtts"
IFS=, read -r -a syslist <<<"$systems"
for l in "${rttlist[@]}"; do
	[[ $l =~ ^[0-9]+$ ]] || { echo "sprite.sh: -l wants whole milliseconds, got '$l'" >&2; exit 2; }
done
for s in "${syslist[@]}"; do
	[[ $s =~ ^(local|delay|wt|off|deleg)$ ]] || { echo "sprite.sh: unknown system '$s' (local, delay, wt, off, deleg)" >&2; exit 2; }
done
# One line, and a non-zero exit, for a missing tool.
for t in gcc make ar jq ss timeout pgrep go; do
	command -v "$t" >/dev/null || { echo "sprite.sh: $t is missing (apt-get install -y gcc make binutils jq iproute2 procps; Go in /usr/local/go)" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "sprite.sh: run as root (it drops caches)" >&2; exit 1; }
# The rows, in the order they run in every repetition: local once (no
# network to delay), then each system at each latency.
rowlist=()
for s in "${syslist[@]}"; do [ "$s" != local ] || rowlist+=(local); done
for l in "${rttlist[@]}"; do
	for s in "${syslist[@]}"; do [ "$s" = local ] || rowlist+=("$s-${l}ms"); done
done
base_rows
rows=$(IFS=,; echo "${rowlist[*]}")

# gen_tree DIR N: the C tree (see the top).
gen_tree() {
	local d=$1 n=$2 i j
	mkdir -p "$d/src" "$d/include"
	{
		echo '#ifndef SPRITE_H'
		echo '#define SPRITE_H'
		echo '#include <stddef.h>'
		echo '#include <stdint.h>'
		echo '#define SALT 1'
		echo 'struct rec { uint32_t key; uint32_t val; char name[24]; };'
		for ((i = 0; i < n; i++)); do printf 'uint64_t mod%02d(const struct rec *r, size_t n);\n' $i; done
		echo '#endif'
	} >"$d/include/sprite.h"
	for ((i = 0; i < n; i++)); do
		{
			echo '#include <string.h>'
			echo '#include "sprite.h"'
			printf 'static const uint32_t tab[64] = {'
			for ((j = 0; j < 64; j++)); do printf '%d,' $(((i * 2654435761 + j * 40503) % 65521)); done
			echo '};'
			for ((j = 0; j < 8; j++)); do
				cat <<-C
				static uint64_t step$j(const struct rec *r, uint64_t h)
				{
					uint64_t x = h ^ (r->key * ${i}${j}1ULL);
					for (int k = 0; k < (int)sizeof r->name && r->name[k]; k++) {
						switch ((r->name[k] + $j) & 7) {
						case 0: x = x * 31 + tab[(k + $j) & 63]; break;
						case 1: x ^= x >> 13; x += r->val; break;
						case 2: x = (x << 7) | (x >> 57); break;
						case 3: x -= tab[r->name[k] & 63] * (uint64_t)$i; break;
						case 4: x += strlen(r->name) * $j; break;
						case 5: x ^= (uint64_t)r->val << ($j + 1); break;
						default: x = x * 0x9e3779b97f4a7c15ULL + $j; break;
						}
					}
					return x;
				}
				C
			done
			printf 'uint64_t mod%02d(const struct rec *r, size_t n)\n{\n\tuint64_t h = %d + SALT;\n\tfor (size_t i = 0; i < n; i++) {\n' $i $i
			for ((j = 0; j < 8; j++)); do printf '\t\th = step%d(&r[i], h);\n' $j; done
			printf '\t}\n\treturn h;\n}\n'
		} >"$d/src/m$(printf %02d $i).c"
	done
	{
		echo '#include <stdio.h>'
		echo '#include "sprite.h"'
		echo 'int main(void)'
		echo '{'
		echo '	struct rec r[4] = {{1, 2, "alpha"}, {3, 4, "beta"}, {5, 6, "gamma"}, {7, 8, "delta"}};'
		echo '	uint64_t h = 0;'
		for ((i = 0; i < n; i++)); do printf '\th ^= mod%02d(r, 4);\n' $i; done
		echo '	printf("%llu\n", (unsigned long long)h);'
		echo '	return 0;'
		echo '}'
	} >"$d/src/main.c"
	{
		echo '# Generated by bench/net/sprite.sh.'
		echo 'CC = gcc'
		echo 'CFLAGS = -O1 -Iinclude'
		printf 'OBJS ='
		for ((i = 0; i < n; i++)); do printf ' src/m%02d.o' $i; done
		echo
		echo 'prog: src/main.o libsprite.a'
		printf '\t$(CC) -o $@ src/main.o libsprite.a\n'
		echo 'libsprite.a: $(OBJS)'
		printf '\tar rcs $@ $(OBJS)\n'
		echo 'src/%.o: src/%.c include/sprite.h'
		printf '\t$(CC) $(CFLAGS) -c -o $@ $<\n'
		echo 'clean:'
		printf '\trm -f prog libsprite.a src/*.o\n'
	} >"$d/Makefile"
}

# The steps, each given its client's mount point (…/a or …/b). TMPDIR is
# the shared tmp on the mount. make's commands go to $STEPLOG/CLIENT.make
# (the compiles are counted) and the program's output to
# $STEPLOG/CLIENT.out, checked against what a local build prints.
w_build() { (cd "$1/tree" && TMPDIR=$1/tmp make -j"$JOBS" >"$STEPLOG/${1##*/}.make" && ./prog >"$STEPLOG/${1##*/}.out"); }
w_rebuild() {
	(cd "$1/tree" && sed -i 's/^#define SALT 1$/#define SALT 2/' include/sprite.h &&
		TMPDIR=$1/tmp make -j"$JOBS" >"$STEPLOG/${1##*/}.make" && ./prog >"$STEPLOG/${1##*/}.out")
}
w_clean() { (cd "$1/tree" && make -s clean); }
export JOBS=$jobs STEPLOG=""
export -f w_build w_rebuild w_clean

# --- build -----------------------------------------------------------------
tmp=$(mktemp -d /tmp/shale-spritebench.XXXXXX)
results=$tmp/steps.tsv raw=$tmp/results.tsv
: >"$results"
: >"$raw"
server_pid="" delay_pid="" delay_out="" timeout_pid=""
# step (bench/net/lib.sh) and this script run timeout(1) in the
# foreground, where bash holds a signal's trap until the command ends
# (minutes for a step at 50 ms): it runs in the background instead, and
# is waited for, so that INT and TERM end the run at once; cleanup stops
# it (timeout passes the signal on to its command's process group).
timeout() {
	command timeout "$@" &
	timeout_pid=$!
	wait "$timeout_pid"
}
cleanup() {
	local rc=$? r
	if [ -n "$timeout_pid" ] && kill -0 "$timeout_pid" 2>/dev/null; then
		# A step still runs: its processes (timeout's process group) end
		# before the mounts and the server do, or a write of theirs waits
		# for a server that is gone (30 s a request).
		stop "$timeout_pid"
		for _ in $(seq 100); do pgrep -g "$timeout_pid" >/dev/null || break; sleep 0.1; done
		kill -KILL -- "-$timeout_pid" 2>/dev/null || true
	fi
	for r in "${rowlist[@]}"; do end_row "$r" 2>/dev/null || true; done
	rm -rf "$work"
	if [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ]; then
		echo "sprite.sh: failed (exit $rc); the logs of the server, relay and mounts are kept in $tmp" >&2
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building $tmp/shale from the work tree"
# A private binary: others rebuilding bin/shale during the run change nothing.
(CGO_ENABLED=0 go build -o "$tmp/shale" ./cmd/shale) || { echo "sprite.sh: go build ./cmd/shale failed" >&2; exit 1; }
shale=$tmp/shale shale_cur=$tmp/shale
[ -z "$base_rev" ] || build_base
check_workdir "$work"
gen_tree "$tmp/tree" "$files"
# What the program prints built with SALT 1 (A's build) and 2 (B's, after
# its edit of the header), built locally.
(cd "$tmp/tree" && TMPDIR=$tmp make -s -j"$jobs" && ./prog >"$tmp/expect1" &&
	sed -i 's/^#define SALT 1$/#define SALT 2/' include/sprite.h && make -s -j"$jobs" && ./prog >"$tmp/expect2" &&
	sed -i 's/^#define SALT 2$/#define SALT 1/' include/sprite.h && make -s clean) ||
	{ echo "sprite.sh: the generated tree does not build locally ($tmp/tree)" >&2; exit 1; }
! cmp -s "$tmp/expect1" "$tmp/expect2" || { echo "sprite.sh: the generated program prints the same with SALT 1 and 2" >&2; exit 1; }

# --- rows ------------------------------------------------------------------
# start_row ROW: LOWER holds a fresh copy of the tree and an empty tmp; a
# remote row starts shale serve and the relay, and sets opts to the
# clients' mount flags and url to what they mount.
opts=() url="" sport=""
start_row() {
	local r=$1 lower=$work/$1/lower sprite=true serveflags=()
	use_build "$r"
	mkdir -p "$lower/tmp" "$work/$r/a" "$work/$r/b"
	STEPLOG=$tmp/steps/$rep-$r
	mkdir -p "$STEPLOG"
	chmod 1777 "$lower/tmp"
	cp -a "$tmp/tree" "$lower/tree"
	case ${r/@base/} in
	local) url=$lower opts=(); return ;;
	delay-*) opts=(--write-delay 30s) ;;
	deleg-*) opts=(--write-delay 30s) serveflags=(--delegate) ;;
	wt-*) opts=(--write-delay 0) ;;
	off-*) opts=() sprite=false ;;
	esac
	# Root unsquashed: make runs as root.
	serve_delayed "$r" "$lower" "$tmp/serve-$r.log" --sprite="$sprite" --no-root-squash "${serveflags[@]}"
	url=$served_url
}

# mount_client ROW CLIENT: mounts the row's tree for client a or b, its
# log in the scratch directory.
mount_client() {
	local mnt=$work/$1/$2
	timeout 60 "$shale" mount "${opts[@]}" --log "$tmp/mount-$1-$2.log" "$url" "$mnt" 2>>"$tmp/mount.log" ||
		{ echo "sprite.sh: $1: shale mount ${opts[*]} $url $mnt failed (log: $tmp/mount.log, $tmp/mount-$1-$2.log)" >&2; exit 1; }
	for _ in $(seq 100); do mounted "$mnt" && return; sleep 0.1; done
	echo "sprite.sh: $1 did not mount at $mnt" >&2
	exit 1
}

end_row() {
	local c mnt
	use_build "$1"
	for c in a b; do
		mnt=$work/$1/$c
		if mounted "$mnt"; then
			timeout 60 "$shale" umount "$mnt" 2>>"$tmp/mount.log" || {
				log "  $1: shale umount $mnt failed or took over 60 s: lazy unmount"
				umount -l "$mnt"
			}
		fi
	done
	stop "$delay_pid"
	stop "$server_pid"
	delay_pid="" server_pid="" delay_out=""
	rm -rf "$work/$1"
}

# counters ROW: one raw line, "rep<TAB>row<TAB>key=value…": the steps'
# times and the relay's requests (from step's lines), each client's
# stats --json, and the server's sprite.* lines.
counters() {
	local r=$1 c j line n
	line=$(awk -F'\t' -v rep="$rep" -v r="$r" '$1 == rep && $2 == r {
		k = $3 == "build A" ? "a" : $3 == "build B" ? "b" : "clean"
		printf "\tt_%s=%s\tq_%s=%s", k, $4, k, $5 }' "$results")
	# The compiles each build ran, and whether its program printed what
	# the local build of its header does.
	for c in a b; do
		[ -e "$STEPLOG/$c.make" ] || continue
		n=$(grep -c -- ' -c -o ' "$STEPLOG/$c.make" || true)
		line+=$(printf '\t%s_compiled=%s\t%s_right=%s' "$c" "$n" "$c" "$(cmp -s "$STEPLOG/$c.out" "$tmp/expect$([ $c = a ] && echo 1 || echo 2)" && echo 1 || echo 0)")
	done
	[ "$r" != local ] || { printf '%s\t%s%s\n' "$rep" "$r" "$line" >>"$raw"; return; }
	for c in a b; do
		j=$(timeout 30 "$shale" stats --json "$work/$r/$c" 2>>"$tmp/stats.log") || { log "  $r: shale stats --json of client $c failed or hung (log: $tmp/stats.log)"; continue; }
		line+=$(jq -r --arg c "$c" '
			[["requests", ([.requests[]?] | add // 0)], ["journal_reads", .journal_reads]]
			+ (.sprite // {} | [
				["write_bytes", .write_bytes], ["write_server_bytes", .write_server_bytes],
				["discarded_bytes", .discarded_bytes], ["lost_bytes", .lost_bytes],
				["dirty_bytes", .dirty_bytes], ["opens", .opens], ["opens_stale", .opens_stale],
				["opens_nocache", .opens_nocache], ["recalls", .recalls], ["uncaches", .uncaches]]
				+ [(.writebacks // {}) | to_entries[] | ["wb_" + .key, .value]])
			| map(select(.[1] != null) | "\t\($c)_\(.[0])=\(.[1])") | join("")' <<<"$j")
	done
	line+=$(timeout 30 "$shale" stats --format raw "9p://127.0.0.1:$sport/" 2>>"$tmp/stats.log" |
		awk '$1 ~ /^sprite\./ { printf "\ts_%s=%s", substr($1, 8), $2 }') || log "  $r: shale stats of the server failed or hung (log: $tmp/stats.log)"
	printf '%s\t%s%s\n' "$rep" "$r" "$line" >>"$raw"
}

run_row() {
	local r=$1
	start_row "$r"
	mount_client "$r" a
	mount_client "$r" b
	cold
	step "$r" "build A" w_build "$work/$r/a" &&
		step "$r" "build B" w_rebuild "$work/$r/b" &&
		step "$r" "clean" w_clean "$work/$r/b" || log "  $r: a step did not finish: the rest of the row is skipped"
	counters "$r"
	end_row "$r"
}

# --- run -------------------------------------------------------------------
start=$EPOCHREALTIME
for rep in $(seq "$runs"); do
	log "repetition $rep of $runs"
	for r in $(rep_rows); do run_row "$r"; done
done
elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
# The raw results first: a report redrawn from them needs no rerun.
[ -z "$out" ] || cp "$raw" "${out%.md}.tsv"
# Whatever the product logged above INFO (warnings, errors).
warn=$(cat "$tmp"/serve-*.log "$tmp"/mount-*.log 2>/dev/null | grep -v 'level=INFO' || true)

# --- report ----------------------------------------------------------------
report=$tmp/report.md
{
	echo "Command: \`bench/net/sprite.sh $*\` (-n $runs -l $rtts -s $systems -F $files -j $jobs -t $steptimeout${base_rev:+ -B $base_rev}), $(date -u '+%Y-%m-%d %H:%M UTC'), took ${elapsed}s"
	echo
	about_run
	about_base
	echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (the machine is shared: other sessions' tests run beside)"
	echo "- shale serve --sprite=true --no-root-squash LOWER; two clients, each \`shale mount [--write-delay 30s | --write-delay 0] 9p://…\` through one \`shale delay\` (loopback, half the RTT each way); local: two loop views \`shale mount LOWER MNT\`"
	echo "- tree: $files modules + main.c, $(cat "$tmp"/tree/src/*.c | wc -c) bytes of C; gcc -O1, make -j$jobs, TMPDIR on the mount; $(gcc --version | head -1)"
	echo
	go run ./bench/net/report -sprite -rows "$rows" -timeout "$steptimeout" <"$raw"
	if [ -n "$warn" ]; then
		echo
		echo "Logged by shale serve and the mounts during the run ($(wc -l <<<"$warn") lines; first 10):"
		echo
		head -n 10 <<<"$warn" | sed 's/^/    /'
	fi
	base_report -sprite "$raw"
} >"$report"
cat "$report"
if [ -n "$out" ]; then
	cp "$report" "$out"
	log "report in $out, raw results in ${out%.md}.tsv"
fi
