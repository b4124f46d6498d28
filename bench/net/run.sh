#!/usr/bin/env bash
# Benchmarks shale over 9P: `shale serve` and diod, each mounted by shale's
# 9P client (`shale mount 9p://...`) through a relay that adds network
# latency (`shale delay`), against the local loop view, with bench/core's
# workloads. Per workload and row: the median time, its ratio to the loop
# view's, and the 9P requests the step sent (counted by the relay).
#
#   bench/net/run.sh [-n RUNS] [-o OUT.md] [-d WORKDIR] [-s ROWS] [-t SECS]
#                    [-T TREE] [-b MIB]
#
#   -n RUNS     repetitions of every workload on every row (default 3)
#   -o OUT.md   also write the report (markdown) to OUT.md
#   -d WORKDIR  where lower directories and mount points go (default
#               /var/tmp/shale-netbench; must be on a disk file system)
#   -s ROWS     comma-separated rows: loop (the loop view), serve-RTTms
#               (shale serve), diod-RTTms (diod), RTT in whole ms (default
#               loop,serve-0ms,serve-10ms,serve-50ms,diod-0ms,diod-10ms,diod-50ms)
#   -t SECS     a step that runs longer is stopped and reported as
#               "timeout >SECS s" (default 300)
#   -T TREE     the source tree the metadata workloads copy (default
#               /usr/local/go/src/net/http, 129 entries: small enough for
#               50 ms)
#   -b MIB      sequential file size in MiB (default 1024)
#
# Every row copies the same tree, so that the ratios compare like with
# like; the default is a subtree of Go's sources because a metadata step
# costs round trips per file (cp -a about 16, find about 3): the whole of
# /usr/local/go/src (12,800 entries) would take from half an hour to three
# hours per step at 50 ms. A step still too slow is stopped at -t (at
# 50 ms, diod's 1 GiB steps: some 18,000 requests of 64 KiB); if that was cp -a or the sequential write, the
# tree or file is completed in LOWER directly (both servers see it) so the
# steps after it have their input.
#
# Needs root (drop_caches, diod serving every user) and diod
# (apt-get install -y diod).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH=/usr/local/go/bin:$PATH
export LC_ALL=C
. bench/lib.sh
. bench/net/lib.sh

runs=3 out="" work=/var/tmp/shale-netbench steptimeout=300
rows=loop,serve-0ms,serve-10ms,serve-50ms,diod-0ms,diod-10ms,diod-50ms
SRC=/usr/local/go/src/net/http BIGMB=1024
while getopts "n:o:d:s:t:T:b:h" opt; do
	case $opt in
	n) runs=$OPTARG ;;
	o) out=$OPTARG ;;
	d) work=$OPTARG ;;
	s) rows=$OPTARG ;;
	t) steptimeout=$OPTARG ;;
	T) SRC=$OPTARG ;;
	b) BIGMB=$OPTARG ;;
	*) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
	esac
done
positive n "$runs"
positive t "$steptimeout"
positive b "$BIGMB"
[ -d "$SRC" ] || { echo "run.sh: source tree $SRC is not a directory" >&2; exit 2; }
SRC=$(realpath "$SRC")
[ "$(id -u)" -eq 0 ] || { echo "run.sh: run as root (it drops caches, and diod serves every user only as root)" >&2; exit 1; }
IFS=, read -r -a rowlist <<<"$rows"
needdiod=""
for r in "${rowlist[@]}"; do
	[[ $r =~ ^(loop|(serve|diod)-[0-9]+ms)$ ]] || { echo "run.sh: unknown row '$r' (loop, serve-RTTms, diod-RTTms)" >&2; exit 2; }
	[[ $r == diod-* ]] && needdiod=1
done
[ -z "$needdiod" ] || command -v diod >/dev/null || { echo "run.sh: diod missing: apt-get install -y diod" >&2; exit 1; }
# The workloads run under timeout(1), in a shell of their own.
export SRC BIGMB
export -f w_cp w_find w_grep w_rm w_write w_read

# --- build -----------------------------------------------------------------
log "building bin/shale (scripts/setup.sh)"
./scripts/setup.sh >&2
tmp=$(mktemp -d /tmp/shale-netbench.XXXXXX)
# A private copy: others rebuilding bin/shale during the run change nothing.
cp bin/shale "$tmp/shale"
shale=$tmp/shale

check_workdir "$work"
results=$tmp/results.tsv
: >"$results"

# --- rows ------------------------------------------------------------------
# A 9P row runs a server (shale serve or diod) on one port, the relay on
# another, and shale's 9P client mounting the relay's. Every row, the 0 ms
# ones too, goes through the relay, which counts the requests.
server_pid="" delay_pid="" delay_out=""

mount_row() {
	local r=$1 lower=$work/$1/lower mnt=$work/$1/mnt
	mkdir -p "$lower" "$mnt"
	if [ "$r" = loop ]; then
		"$shale" mount "$lower" "$mnt"
	else
		local kind=${r%%-*} rtt=${r#*-} sport dport url
		sport=$(free_port)
		case $kind in
		serve)
			# Root unsquashed, as diod leaves it: cp -a sets owners.
			"$shale" serve --no-root-squash --listen "tcp:127.0.0.1:$sport" "$lower" >>"$tmp/serve.log" 2>&1 &
			server_pid=$!
			url=9p://127.0.0.1:PORT/
			;;
		diod)
			# No auth (-n), the export only, no config file; squashing
			# stays off, so files keep their owners as cp -a sets them.
			diod -f -n -c /dev/null -e "$lower" -l "127.0.0.1:$sport" >>"$tmp/diod.log" 2>&1 &
			server_pid=$!
			# diod's attach name is the exported path.
			url=9p://127.0.0.1:PORT/$lower
			;;
		esac
		wait_listen "$sport" "$server_pid" "$kind"
		dport=$(free_port)
		delay_out=$tmp/delay-$r.out
		: >"$delay_out"
		"$shale" delay --listen "127.0.0.1:$dport" --to "127.0.0.1:$sport" --rtt "$rtt" >"$delay_out" 2>>"$tmp/delay.log" &
		delay_pid=$!
		wait_listen "$dport" "$delay_pid" "shale delay"
		"$shale" mount "${url/PORT/$dport}" "$mnt"
	fi
	for _ in $(seq 100); do mounted "$mnt" && return; sleep 0.1; done
	echo "run.sh: $r did not mount at $mnt" >&2
	exit 1
}

umount_row() {
	local r=$1 mnt=$work/$1/mnt
	if mounted "$mnt"; then
		sync
		"$shale" umount "$mnt" || umount -l "$mnt"
	fi
	stop "$delay_pid"
	stop "$server_pid"
	delay_pid="" server_pid="" delay_out=""
	# Whatever a stopped step left behind goes with the lower directory,
	# so every turn starts empty.
	rm -rf "$work/$r/lower"
}

cleanup() {
	local r
	for r in "${rowlist[@]}"; do umount_row "$r" 2>/dev/null || true; done
	rm -rf "$work" "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

run_row() {
	local r=$1 d=$work/$1/mnt lower=$work/$1/lower
	mount_row "$r"
	cold
	if ! step "$r" "cp -a" w_cp "$d"; then
		# The steps after it need the whole tree: it is finished in
		# LOWER directly, which both servers see.
		log "  $r: completing the tree in $lower directly"
		rm -rf "$lower/src" && cp -a "$SRC" "$lower/src"
	fi
	cold; step "$r" "find (cold)" w_find "$d" || true
	step "$r" "find (warm)" w_find "$d" || true
	cold; step "$r" "grep -r (cold)" w_grep "$d" || true
	step "$r" "grep -r (warm)" w_grep "$d" || true
	cold; step "$r" "rm -r" w_rm "$d" || true
	cold
	if ! step "$r" "seq write" w_write "$d"; then
		log "  $r: writing the big file in $lower directly"
		dd if=/dev/zero of="$lower/big" bs=1M count="$BIGMB" conv=fsync status=none
	fi
	cold; step "$r" "seq read" w_read "$d" || true
	umount_row "$r"
}

# --- run -------------------------------------------------------------------
start=$EPOCHREALTIME
for rep in $(seq "$runs"); do
	log "repetition $rep of $runs"
	for r in "${rowlist[@]}"; do run_row "$r"; done
done
elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')

# --- report ----------------------------------------------------------------
report=$tmp/report.md
{
	echo "Command: \`bench/net/run.sh $*\` (-n $runs -t $steptimeout), $(date -u '+%Y-%m-%d %H:%M UTC'), took ${elapsed}s"
	echo
	about_run
	[[ $rows != *serve-* ]] || echo "- shale serve --no-root-squash LOWER (as diod, root acts as root), mounted by shale's 9P client"
	[ -z "$needdiod" ] || echo "- diod: $(dpkg-query -W -f='${Version}' diod 2>/dev/null || echo '?') (-n -e LOWER, no squashing), mounted by shale's 9P client"
	echo "- latency: \`shale delay\` on loopback, half the RTT each way, no rate limit"
	echo "- source tree: $SRC ($(find "$SRC" | wc -l) entries, $(du -sh "$SRC" | cut -f1)); sequential file $BIGMB MiB"
	echo
	go run ./bench/net/report -rows "$rows" -mib "$BIGMB" -timeout "$steptimeout" <"$results"
} >"$report"
cat "$report"
if [ -n "$out" ]; then
	cp "$report" "$out"
	cp "$results" "${out%.md}.tsv"
	log "report in $out, raw results in ${out%.md}.tsv"
fi
