#!/usr/bin/env bash
# Benchmarks the caching 9P client (issue 12, journal callbacks): a Go build
# twice (cold, then hot) and bench/core's metadata workload, on the local
# loop view and on `shale mount 9p://` of `shale serve` uncached, caching in
# memory, and caching on disk (--cache-dir), each at several added
# round-trip times (`shale delay`), side by side in one run. Then the
# client is restarted (unmounted and mounted again) and the build, find and
# grep run once more. Per step and row: the median time and the 9P
# requests the client sent (counted by the relay); then the requests the
# hot run saves, a restarted client's requests against a cold start's, and
# the targets. With -p, also a plot of time against latency. With -B,
# each network row also on another revision's build, and the times of one
# set against the other's.
#
#   bench/net/cache.sh [-n RUNS] [-o OUT.md] [-p OUT.png] [-d WORKDIR]
#                      [-l RTTS] [-s SYSTEMS] [-t SECS] [-T TREE] [-G WHERE]
#                      [-B REV]
#
#   -n RUNS     repetitions of every row (default 3)
#   -o OUT.md   also write the report (markdown) to OUT.md, the raw
#               results to OUT.tsv
#   -p OUT.png  draw time against latency (bench/net/plot) into OUT.png
#   -d WORKDIR  where lower directories, mount points and disk caches go
#               (default /var/tmp/shale-netbench2; a disk file system)
#   -l RTTS     comma-separated added round-trip times in whole ms
#               (default 0,10,50,100)
#   -s SYSTEMS  comma-separated, of: local (the loop view, once per
#               repetition: it has no network), uncached (shale serve,
#               the client with --cache-size off: no journal, nothing
#               cached, close-to-open), cached (the caching client, in
#               memory), disk (the caching client with --cache-dir),
#               deleg (cached, the server granting read delegations:
#               shale serve --delegate; not with -B, whose base may
#               predate the flag) (default local,uncached,cached,disk)
#   -t SECS     a step that runs longer is stopped and reported as
#               "timeout >SECS s" (default 150)
#   -T TREE     the tree the metadata workload copies (default
#               /usr/local/go/src/container, 14 entries: at 100 ms its cp -a
#               alone is some 25 s uncached; go/printer's 53 entries
#               would be 90 s)
#   -G WHERE    where the build's GOCACHE lives: local (default; a fresh
#               one per row in the scratch directory) or mount (on the
#               mount beside the sources, as for a network home
#               directory: every build then looks up each of the 73
#               standard packages it links in the cache over the network,
#               some 4,800 requests uncached: minutes a build at 50 ms)
#   -B REV      also build REV (a git revision of this repository, e.g.
#               669a1f9 or HEAD~1) into a private binary, and run every
#               network row (uncached, cached, disk) on it as well, as
#               SYSTEM@base: server and client from REV's build, the relay
#               this build's. Each repetition runs a row on both builds
#               back to back, this build first in odd repetitions, REV's
#               first in even ones. The report adds, per row and step, the
#               median of each and current ÷ base, and ends with the worst
#               ratio: PASS if no step of any row is more than 5% slower
#               than on REV, else MISS. An even RUNS gives both builds
#               the first turn as often. The plot draws this build only.
#
# The build: BurntSushi/toml's cmd/tomlv (shale's own dependency, from the
# module cache: no network), the module copied into LOWER before each row,
# built with `go build -o tomlv ./cmd/tomlv` in it on the mount. GOCACHE
# starts each row holding the standard library compiled (made once at the
# start), so the cold build compiles the module's packages and links; the
# standard library's sources stay in GOROOT. The hot build is the same
# command again: nothing to compile, the sources read and hashed, the
# binary's build ID checked (a "hot make").
#
# The restart: the mount is ended and made again, kernel caches dropped,
# and the build (nothing to compile), find and grep -r run once more. For
# the cached row that is a client's cold start; for the disk row a restart
# with its cache on disk: the report sets one against the other. The
# uncached row skips it (it caches nothing to lose).
#
# Needs root (drop_caches, cp -a setting owners through the mount).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH=/usr/local/go/bin:$PATH
export LC_ALL=C
. bench/lib.sh
. bench/net/lib.sh

runs=3 out="" png="" work=/var/tmp/shale-netbench2 steptimeout=150
rtts=0,10,50,100 systems=local,uncached,cached,disk gocachein=local
SRC=/usr/local/go/src/container base_rev=""
while getopts "n:o:p:d:l:s:t:T:G:B:h" opt; do
	case $opt in
	n) runs=$OPTARG ;;
	o) out=$OPTARG ;;
	p) png=$OPTARG ;;
	d) work=$OPTARG ;;
	l) rtts=$OPTARG ;;
	s) systems=$OPTARG ;;
	t) steptimeout=$OPTARG ;;
	T) SRC=$OPTARG ;;
	G) gocachein=$OPTARG ;;
	B) base_rev=$OPTARG ;;
	*) usage; exit 2 ;;
	esac
done
positive n "$runs"
positive t "$steptimeout"
[ -z "$base_rev" ] || base_check "$base_rev"
[[ $gocachein =~ ^(local|mount)$ ]] || { echo "cache.sh: -G wants local or mount, got '$gocachein'" >&2; exit 2; }
[ -d "$SRC" ] || { echo "cache.sh: source tree $SRC is not a directory" >&2; exit 2; }
SRC=$(realpath "$SRC")
[ -z "$png" ] || png=$(realpath -m "$png")
[ -z "$out" ] || out=$(realpath -m "$out")
[ "$(id -u)" -eq 0 ] || { echo "cache.sh: run as root (it drops caches, and cp -a sets owners)" >&2; exit 1; }
IFS=, read -r -a rttlist <<<"$rtts"
IFS=, read -r -a syslist <<<"$systems"
for l in "${rttlist[@]}"; do
	[[ $l =~ ^[0-9]+$ ]] || { echo "cache.sh: -l wants whole milliseconds, got '$l'" >&2; exit 2; }
done
for s in "${syslist[@]}"; do
	[[ $s =~ ^(local|uncached|cached|disk|deleg)$ ]] || { echo "cache.sh: unknown system '$s' (local, uncached, cached, disk, deleg)" >&2; exit 2; }
done
# The rows, in the order they run in every repetition: local once (no
# network to delay), then each system at each latency.
rowlist=()
for s in "${syslist[@]}"; do [ "$s" != local ] || rowlist+=(local); done
for l in "${rttlist[@]}"; do
	for s in "${syslist[@]}"; do [ "$s" = local ] || rowlist+=("$s-${l}ms"); done
done
base_rows
rows=$(IFS=,; echo "${rowlist[*]}")

# The build runs offline, on this toolchain only.
export GOFLAGS=-buildvcs=false GOPROXY=off GOTOOLCHAIN=local GOTELEMETRY=off GOWORK=off
BUILD=$(go list -m -f '{{.Dir}}' github.com/BurntSushi/toml)
[ -d "$BUILD/cmd/tomlv" ] || { echo "cache.sh: $BUILD/cmd/tomlv missing: run scripts/setup.sh (go build fetches shale's modules)" >&2; exit 1; }
BUILDPKG=./cmd/tomlv
# The workloads run under timeout(1), in a shell of their own.
export SRC BUILDPKG
export -f w_cp w_find w_grep w_rm w_gobuild

# --- build -----------------------------------------------------------------
log "building bin/shale (scripts/setup.sh)"
./scripts/setup.sh >&2
tmp=$(mktemp -d /tmp/shale-netbench2.XXXXXX)
# A private copy: others rebuilding bin/shale during the run change nothing.
cp bin/shale "$tmp/shale"
shale=$tmp/shale shale_cur=$tmp/shale

check_workdir "$work"
results=$tmp/results.tsv
: >"$results"

# The standard library compiled, once: each row's GOCACHE starts as a copy.
log "compiling the standard library packages tomlv needs into a seed GOCACHE"
cp -a "$BUILD" "$tmp/tree" && chmod -R u+w "$tmp/tree"
(cd "$tmp/tree" && GOCACHE=$tmp/seed go build $(go list -deps -f '{{if .Standard}}{{.ImportPath}}{{end}}' "$BUILDPKG"))
rm -rf "$tmp/tree"

# --- rows ------------------------------------------------------------------
# A remote row runs shale serve on one port, the relay on another, and
# shale's 9P client mounting the relay's; the 0 ms rows go through the
# relay too, which counts the requests.
server_pid="" delay_pid="" delay_out="" mnt_url="" mnt_opts=()

start_row() {
	local r=$1 lower=$work/$1/lower sport
	mkdir -p "$lower" "$work/$r/mnt"
	# The module, and GOCACHE with only the standard library, in LOWER
	# directly (or locally): nothing of them is in any client's cache.
	cp -a "$BUILD" "$lower/build" && chmod -R u+w "$lower/build"
	if [ "$gocachein" = mount ]; then
		cp -a "$tmp/seed" "$lower/gocache"
		export GOCACHE=$work/$r/mnt/gocache
	else
		rm -rf "$tmp/gocache"
		cp -a "$tmp/seed" "$tmp/gocache"
		export GOCACHE=$tmp/gocache
	fi
	use_build "$r"
	mnt_opts=()
	local serve_opts=()
	case ${r/@base/} in
	local) mnt_url=$lower; return ;;
	uncached-*) mnt_opts=(--cache-size off) ;;
	disk-*) mnt_opts=(--cache-dir "$work/$r/cachedir") ;;
	deleg-*) serve_opts=(--delegate) ;;
	esac
	# Root unsquashed: cp -a sets owners.
	serve_delayed "$r" "$lower" "$tmp/serve.log" --no-root-squash "${serve_opts[@]}"
	mnt_url=$served_url
}

# mount_row ROW: mounts the row's tree. A disk cache is saved by the
# process of the mount before, after its unmount returned: a mount that
# finds it still held is tried again.
mount_row() {
	local mnt=$work/$1/mnt i
	for i in $(seq 50); do
		"$shale" mount "${mnt_opts[@]}" "$mnt_url" "$mnt" 2>>"$tmp/mount.log" && break
		[ "$i" -lt 50 ] || { echo "cache.sh: $1 did not mount at $mnt (log: $tmp/mount.log)" >&2; exit 1; }
		sleep 0.2
	done
	for _ in $(seq 100); do mounted "$mnt" && return; sleep 0.1; done
	echo "cache.sh: $1 did not mount at $mnt" >&2
	exit 1
}

umount_row() {
	local mnt=$work/$1/mnt
	if mounted "$mnt"; then
		sync
		"$shale" umount "$mnt" || umount -l "$mnt"
	fi
}

# restart_row ROW: ends the row's client and starts another, as a user
# would: the disk cache's state is written by the process of the mount
# after its unmount returned, and a mount made before that starts empty
# (seen: twice a cold start's requests), so it is waited for; and a new
# client serves nothing from its cache until its journal has answered or
# a second has passed (docs/network.md, "Disconnection"), so the steps
# start once it serves.
restart_row() {
	local r=$1 mnt=$work/$1/mnt
	umount_row "$r"
	if [[ ${r/@base/} == disk-* ]]; then
		for _ in $(seq 100); do [ -e "$work/$r/cachedir/state" ] && break; sleep 0.1; done
		[ -e "$work/$r/cachedir/state" ] || log "  $r: no $work/$r/cachedir/state 10 s after the unmount"
	fi
	mount_row "$r"
	if [ "$r" != local ]; then
		stat "$mnt/build" >/dev/null
		for _ in $(seq 50); do "$shale" stats "$mnt" 2>/dev/null | grep -q '^caching *on' && break; sleep 0.1; done
		sleep 1.5
	fi
}

end_row() {
	use_build "$1"
	umount_row "$1"
	stop "$delay_pid"
	stop "$server_pid"
	delay_pid="" server_pid="" delay_out=""
	# Whatever a stopped step left behind goes, so every turn starts empty.
	rm -rf "$work/$1"
}

cleanup() {
	local r
	for r in "${rowlist[@]}"; do end_row "$r" 2>/dev/null || true; done
	rm -rf "$work" "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# REV's build (-B), once cleanup removes it whatever happens.
[ -z "$base_rev" ] || build_base

run_row() {
	local r=$1 d=$work/$1/mnt lower=$work/$1/lower
	start_row "$r"
	mount_row "$r"
	cold
	step "$r" "build (cold)" w_gobuild "$d" || true
	step "$r" "build (hot)" w_gobuild "$d" || true
	cold
	if ! step "$r" "cp -a" w_cp "$d"; then
		# The steps after it need the whole tree: it is finished in
		# LOWER directly, which the server sees.
		log "  $r: completing the tree in $lower directly"
		rm -rf "$lower/src" && cp -a "$SRC" "$lower/src"
	fi
	cold; step "$r" "find (cold)" w_find "$d" || true
	step "$r" "find (warm)" w_find "$d" || true
	cold; step "$r" "grep -r (cold)" w_grep "$d" || true
	step "$r" "grep -r (warm)" w_grep "$d" || true
	if [[ ${r/@base/} != uncached-* ]]; then
		# The client restarts: same server, same relay, same cache dir.
		restart_row "$r"
		cold
		step "$r" "build (restart)" w_gobuild "$d" || true
		step "$r" "find (restart)" w_find "$d" || true
		step "$r" "grep -r (restart)" w_grep "$d" || true
	fi
	cold; step "$r" "rm -r" w_rm "$d" || true
	end_row "$r"
}

# --- run -------------------------------------------------------------------
start=$EPOCHREALTIME
for rep in $(seq "$runs"); do
	log "repetition $rep of $runs"
	for r in $(rep_rows); do run_row "$r"; done
done
elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
# The raw results first: a report or plot redrawn from them needs no rerun.
[ -z "$out" ] || cp "$results" "${out%.md}.tsv"

# --- report ----------------------------------------------------------------
report=$tmp/report.md
unset GOCACHE
{
	echo "Command: \`bench/net/cache.sh $*\` (-n $runs -l $rtts -s $systems -t $steptimeout -G $gocachein${base_rev:+ -B $base_rev}), $(date -u '+%Y-%m-%d %H:%M UTC'), took ${elapsed}s"
	echo
	about_run
	about_base
	echo "- shale serve --no-root-squash LOWER, mounted by shale's 9P client through \`shale delay\` (loopback, half the RTT each way); uncached: \`--cache-size off\`; disk: \`--cache-dir\`"
	echo "- build: \`go build -o tomlv $BUILDPKG\` of $(basename "$BUILD") ($(find "$BUILD" -name '*.go' | wc -l) .go files), GOCACHE $([ "$gocachein" = mount ] && echo "on the mount" || echo "local"), seeded with the standard library; $(go version | cut -d' ' -f3)"
	echo "- metadata tree: $SRC ($(find "$SRC" | wc -l) entries, $(du -sh "$SRC" | cut -f1))"
	echo
	go run ./bench/net/report -cache -rows "$rows" -timeout "$steptimeout" <"$results"
	base_report -cache "$results"
} >"$report"
cat "$report"
if [ -n "$png" ]; then
	go run ./bench/net/plot -rows "$rows" -timeout "$steptimeout" -o "$png" <"$results"
	log "plot in $png"
fi
if [ -n "$out" ]; then
	cp "$report" "$out"
	log "report in $out, raw results in ${out%.md}.tsv"
fi
