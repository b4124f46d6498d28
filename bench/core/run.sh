#!/usr/bin/env bash
# Benchmarks the shale loop view against native ext4, go-fuse's loopback
# example, bindfs and libfuse's passthrough_ll example, and shale's
# data-transforming layers (rot13, crypt) against the loop view and against
# gocryptfs: the same workloads on each, in one run, the systems
# interleaved in every repetition (ABCDE ABCDE ...) to spread noise.
#
#   bench/core/run.sh [-n RUNS] [-o OUT.md] [-d WORKDIR] [-s SYSTEMS]
#
#   -n RUNS     repetitions of every workload on every system (default 5)
#   -o OUT.md   also write the report (markdown) to OUT.md
#   -d WORKDIR  where lower directories and mount points go (default
#               /var/tmp/shale-bench; must be on a disk file system)
#   -s SYSTEMS  comma-separated subset of: native,shale,shale-nopt,loopback,
#               bindfs,passthrough_ll,rot13,crypt,crypt-noholes,crypt-base,
#               gocryptfs (default: the first six, the loop view's comparison;
#               docs/benchmarks.md has the layers'). crypt-noholes is crypt
#               initialised with --no-holes; crypt-base is crypt served by
#               the shale binary SHALE_BENCH_BASE (an earlier build), to
#               measure a change in one run.
#
# Needs root (drop_caches, allow_other). See docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH=/usr/local/go/bin:$PATH
export LC_ALL=C
. bench/lib.sh

runs=5 out="" work=/var/tmp/shale-bench
systems=native,shale,shale-nopt,loopback,bindfs,passthrough_ll
while getopts "n:o:d:s:h" opt; do
	case $opt in
	n) runs=$OPTARG ;;
	o) out=$OPTARG ;;
	d) work=$OPTARG ;;
	s) systems=$OPTARG ;;
	*) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
	esac
done
positive n "$runs"
[ "$(id -u)" -eq 0 ] || { echo "run.sh: run as root (it drops caches and mounts with allow_other)" >&2; exit 1; }
IFS=, read -r -a syslist <<<"$systems"
for s in "${syslist[@]}"; do
	case $s in native | shale | shale-nopt | loopback | bindfs | passthrough_ll | rot13 | crypt | crypt-noholes | gocryptfs) ;;
	crypt-base) [ -x "${SHALE_BENCH_BASE:-}" ] || { echo "run.sh: crypt-base needs SHALE_BENCH_BASE, the path of an earlier shale binary" >&2; exit 2; } ;;
	*) echo "run.sh: unknown system '$s'" >&2; exit 2 ;;
	esac
done

SRC=/usr/local/go/src       # the source tree the metadata workloads copy
# Smaller values (for trying the harness only; the row names keep saying
# 1 GiB) come from SHALE_BENCH_BIGMB and SHALE_BENCH_RANDSECS.
BIGMB=${SHALE_BENCH_BIGMB:-1024}      # sequential file size (MiB)
RANDSECS=${SHALE_BENCH_RANDSECS:-10}  # 4 KiB random read and write run time (s)
SCRYPT_LOGN=10              # scrypt cost (log2 N) of crypt's and gocryptfs's
                            # fresh configs: mounting fast, not safe

# --- build -----------------------------------------------------------------
log "building bin/shale (scripts/setup.sh), go-fuse's loopback example and libfuse's passthrough_ll"
./scripts/setup.sh >&2
tmp=$(mktemp -d /tmp/shale-bench.XXXXXX)
# A private copy: others rebuilding bin/shale during the run change nothing.
cp bin/shale "$tmp/shale"
shale=$tmp/shale
[ -z "${SHALE_BENCH_BASE:-}" ] || cp "$SHALE_BENCH_BASE" "$tmp/shale-base"
( cd "$root" && CGO_ENABLED=0 go build -o "$tmp/loopback" github.com/hanwen/go-fuse/v2/example/loopback )
gofuse=$(go list -m -f '{{.Version}}' github.com/hanwen/go-fuse/v2)
for t in fio bindfs gocryptfs; do command -v $t >/dev/null || { echo "run.sh: $t missing: run scripts/setup.sh" >&2; exit 1; }; done
# libfuse's low-level passthrough example, built from the source Debian's
# libfuse3-dev ships (never copied into this repository).
pll_src=/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c
[ -r "$pll_src" ] || { echo "run.sh: $pll_src missing: run scripts/setup.sh (libfuse3-dev)" >&2; exit 1; }
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -Wall -O2 $(pkg-config fuse3 --cflags) "$pll_src" -o "$tmp/passthrough_ll" $(pkg-config fuse3 --libs)
libfuse=$(pkg-config fuse3 --modversion)

check_workdir "$work"
results=$tmp/results.tsv
: >"$results"
pass=$tmp/passphrase
echo "shale-bench passphrase" >"$pass"
chmod 600 "$pass" # shale warns about a passphrase file others can read

# --- systems ---------------------------------------------------------------
# target SYS: the directory the workloads use on SYS.
target() { if [ "$1" = native ]; then echo "$work/$1/lower"; else echo "$work/$1/mnt"; fi; }

# daemon_pid MNT: the process serving the FUSE mount at MNT.
daemon_pid() {
	local p
	for p in /proc/[0-9]*; do
		tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF -- "$1" || continue
		ls -l "$p/fd" 2>/dev/null | grep -q ' /dev/fuse$' && { echo "${p#/proc/}"; return; }
	done
}

# cpu_secs PID: user+system CPU time of PID so far, in seconds.
cpu_secs() {
	local hz; hz=$(getconf CLK_TCK)
	if [ -z "$1" ] || [ ! -r "/proc/$1/stat" ]; then echo 0; return; fi
	awk -v hz="$hz" '{ sub(/^.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat"
}

loopback_pid=""
mount_sys() {
	local s=$1 lower=$work/$1/lower mnt=$work/$1/mnt
	mkdir -p "$lower" "$mnt"
	case $s in
	native) return ;;
	shale) "$shale" mount "$lower" "$mnt" ;;
	shale-nopt) "$shale" mount --no-passthrough "$lower" "$mnt" ;;
	rot13) "$shale" mount --layer rot13 "$lower" "$mnt" ;;
	crypt | crypt-noholes | crypt-base)
		# A fresh config in every turn, as for gocryptfs.
		local bin=$shale flags=""
		[ "$s" = crypt-base ] && bin=$tmp/shale-base
		[ "$s" = crypt-noholes ] && flags=--no-holes
		rm -rf "$lower" && mkdir "$lower"
		"$bin" init --layer crypt $flags --passfile "$pass" --scrypt-logn $SCRYPT_LOGN "$lower" >&2
		"$bin" mount --layer crypt --passfile "$pass" "$lower" "$mnt"
		;;
	gocryptfs)
		rm -rf "$lower" && mkdir "$lower"
		gocryptfs -init -q -passfile "$pass" -scryptn $SCRYPT_LOGN "$lower" >&2
		gocryptfs -q -nosyslog -allow_other -passfile "$pass" "$lower" "$mnt" >&2
		;;
	loopback)
		"$tmp/loopback" -q -allow-other "$mnt" "$lower" >>"$tmp/loopback.log" 2>&1 &
		loopback_pid=$!
		;;
	bindfs) bindfs --multithreaded -o default_permissions "$lower" "$mnt" ;;
	passthrough_ll)
		# Its best cache options: a day's timeouts and the page cache kept
		# across opens (cache=always), the kernel's writeback cache, one
		# /dev/fuse descriptor per thread (clone_fd). It forks into the
		# background once mounted.
		"$tmp/passthrough_ll" -o source="$lower",allow_other,default_permissions,cache=always,writeback -o clone_fd "$mnt"
		;;
	esac
	for _ in $(seq 100); do mounted "$mnt" && return; sleep 0.1; done
	echo "run.sh: $s did not mount at $mnt" >&2
	exit 1
}

umount_sys() {
	local s=$1 mnt=$work/$1/mnt
	[ "$s" = native ] && return
	mounted "$mnt" || return 0
	sync
	case $s in
	shale | shale-nopt | rot13 | crypt | crypt-noholes | crypt-base) "$shale" umount "$mnt" || umount -l "$mnt" ;;
	*) umount "$mnt" 2>/dev/null || fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" ;;
	esac
	if [ "$s" = loopback ] && [ -n "$loopback_pid" ]; then
		wait "$loopback_pid" 2>/dev/null || true
		loopback_pid=""
	fi
}

cleanup() {
	local s
	for s in "${syslist[@]}"; do umount_sys "$s" 2>/dev/null || true; done
	rm -rf "$work" "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- workloads -------------------------------------------------------------
# timed SYS WORKLOAD CMD...: runs CMD, records its wall time in seconds.
timed() {
	local s=$1 w=$2; shift 2
	local t0=$EPOCHREALTIME
	"$@" >/dev/null
	local t1=$EPOCHREALTIME
	local secs; secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')
	printf '%s\t%s\t%s\t%s\n' "$rep" "$s" "$w" "$secs" >>"$results"
	log "  $s $w ${secs}s"
}

# resident SYS: how much of the lower directory's large files (the big
# file, under an encrypted name for crypt and gocryptfs) is in the page
# cache; logged before each cold read as a check that caches were dropped.
resident() {
	find "$work/$1/lower" -type f -size +1M -exec fincore --bytes --noheadings -o RES {} + 2>/dev/null |
		awk '{ s += $1 } END { print s + 0 }'
}

record() { printf '%s\t%s\t%s\t%s\n' "$rep" "$1" "$2" "$3" >>"$results"; log "  $1 $2 $3"; }

# The workloads (w_cp, w_find, ...) are bench/lib.sh's.

run_system() {
	local s=$1 d pid c0 c1 t0 t1 iops
	d=$(target "$s")
	mount_sys "$s"
	pid=""
	[ "$s" = native ] || pid=$(daemon_pid "$work/$s/mnt")

	cold; timed "$s" "cp -a" w_cp "$d"
	cold; timed "$s" "find (cold)" w_find "$d"
	timed "$s" "find (warm)" w_find "$d"
	cold; timed "$s" "find|xargs grep (cold)" w_xgrep "$d"
	cold; timed "$s" "grep -r (cold)" w_grep "$d"
	timed "$s" "grep -r (warm)" w_grep "$d"
	cold; timed "$s" "rm -r" w_rm "$d"

	cold
	c0=$(cpu_secs "$pid")
	t0=$EPOCHREALTIME; w_write "$d"; t1=$EPOCHREALTIME
	c1=$(cpu_secs "$pid")
	record "$s" "seq write 1 GiB" "$(awk -v a="$t0" -v b="$t1" -v mb=$BIGMB 'BEGIN { printf "%.1f", mb / (b - a) }')"
	[ "$s" = native ] || record "$s" "daemon CPU during seq write" "$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }')"
	cold
	log "  $s big file resident before seq read: $(resident "$s") bytes"
	c0=$(cpu_secs "$pid")
	t0=$EPOCHREALTIME; w_read "$d"; t1=$EPOCHREALTIME
	c1=$(cpu_secs "$pid")
	record "$s" "seq read 1 GiB" "$(awk -v a="$t0" -v b="$t1" -v mb=$BIGMB 'BEGIN { printf "%.1f", mb / (b - a) }')"
	[ "$s" = native ] || record "$s" "daemon CPU during seq read" "$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }')"
	cold
	log "  $s big file resident before randread: $(resident "$s") bytes"
	iops=$(fio --name=randread --filename="$d/big" --rw=randread --bs=4k --size=${BIGMB}m \
		--runtime=$RANDSECS --time_based --ioengine=psync --numjobs=1 --minimal | awk -F';' '{ print $8 }')
	record "$s" "randread 4 KiB" "$iops"
	# Random 4 KiB writes over the same file; fio's run time (and so its
	# IOPS) includes the final fsync.
	cold
	iops=$(fio --name=randwrite --filename="$d/big" --rw=randwrite --bs=4k --size=${BIGMB}m \
		--runtime=$RANDSECS --time_based --ioengine=psync --numjobs=1 --end_fsync=1 --minimal | awk -F';' '{ print $49 }')
	record "$s" "randwrite 4 KiB" "$iops"
	rm -f "$d/big"
	umount_sys "$s"
}

# --- run -------------------------------------------------------------------
repetitions

# --- report ----------------------------------------------------------------
report=$tmp/report.md
{
	echo "Command: \`bench/core/run.sh $*\` (-n $runs), $(date -u '+%Y-%m-%d %H:%M UTC'), took ${elapsed}s"
	echo
	about_run
	echo "- peers: go-fuse $gofuse example/loopback (-allow-other: allow_other,default_permissions; 1s entry/attr timeouts), $(bindfs --version | head -1) (--multithreaded -o default_permissions; allow_other as root), libfuse $libfuse example/passthrough_ll (-o allow_other,default_permissions,cache=always,writeback -o clone_fd: 86400 s timeouts, pages kept across opens, writeback cache, multithreaded), $(fio --version)"
	echo "- layers: shale --layer rot13; shale --layer crypt and $(gocryptfs -version 2>/dev/null | head -1 | cut -d';' -f1) (Debian package; -allow_other, otherwise its defaults) over configs made fresh in every turn with scrypt log2 N = $SCRYPT_LOGN"
	echo "- source tree: $SRC ($(find "$SRC" | wc -l) entries, $(du -sh "$SRC" | cut -f1))"
	echo
	go run ./bench/core/report -systems "$systems" <"$results"
} >"$report"
publish "$report" "$results"
