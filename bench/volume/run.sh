#!/usr/bin/env bash
# Benchmarks a shale volume (etcd + S3, docs/volume.md) side by side with
# rclone mount (--vfs-cache-mode full) and s3fs over the same S3 server
# (versitygw, started with a 3-member etcd by scripts/engines.sh in the work
# dir), plus the local loop view where a row asks for it: the systems
# interleaved in every repetition, medians and ratios reported (issue 24's
# Targets).
#
#   bench/volume/run.sh [-n RUNS] [-o OUT.md] [-d WORKDIR] [-s SYSTEMS]
#                       [-N FILES] [-b MIB] [-r ROUNDS] [-t SECS]
#
#   -n RUNS     repetitions of every workload on every system (default 3)
#   -o OUT.md   also write the report (markdown) to OUT.md, raw values beside
#   -d WORKDIR  where engines, caches and mount points go (default
#               /var/tmp/shale-volbench; must be on a disk file system)
#   -s SYSTEMS  comma-separated subset of shale,rclone,s3fs,local (default all;
#               local, the loop view over a local directory, runs only the
#               build rows, the hot build target's baseline)
#   -N FILES    files of the metadata workload (default 10000)
#   -b MIB      the sequential file's size (default 1024)
#   -r ROUNDS   changes per repetition in the two-client workload (default 5)
#   -t SECS     how long the second client waits for each change (default 10)
#
# Workloads, in each repetition on each system:
#   md create/stat/list/remove  mdtest's shape on FILES empty files in one
#       directory (bench/volume/fsops md), kernel caches dropped between,
#       as operations (or entries listed) per second; md all: the four
#   seq write (close)   BIGMB by dd, conv=fsync: until close returns
#   seq write (in S3)   until the file is in the bucket too: rclone uploads
#       after close (--vfs-write-back, 5 s); shale and s3fs before it returns
#   seq read (cached)   kernel caches dropped; the system's own caches kept
#   seq read (from S3)  a fresh mount with empty caches
#   go build cold/hot   BurntSushi/toml's cmd/tomlv, as in bench/net/cache.sh
#   two clients         a second mount of the same store (fsops two): time
#       until a rewrite and a new name made on one show on the other, the
#       stale reads (fresh opens after the writer's close that returned the
#       old bytes) and the stat misses
#
# Needs root (drop_caches, allow_other). See docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH=/usr/local/go/bin:$HOME/go/bin:$PATH
export LC_ALL=C
. bench/lib.sh

# The flags, by letter, with their defaults.
declare -A opt=([n]=3 [o]="" [d]=/var/tmp/shale-volbench [s]=shale,rclone,s3fs,local [N]=10000 [b]=1024 [r]=5 [t]=10)
while getopts "n:o:d:s:N:b:r:t:h" o; do
	[[ $o == [nodsNbrt] ]] || { sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
	opt[$o]=$OPTARG
done
for o in n N b r t; do positive "$o" "${opt[$o]}"; done
runs=${opt[n]} out=${opt[o]} work=${opt[d]} systems=${opt[s]}
files=${opt[N]} BIGMB=${opt[b]} rounds=${opt[r]} waitsecs=${opt[t]}
[ "$(id -u)" -eq 0 ] || { echo "run.sh: run as root (it drops caches and mounts with allow_other)" >&2; exit 1; }
IFS=, read -r -a syslist <<<"$systems"
for s in "${syslist[@]}"; do
	[[ $s =~ ^(shale|rclone|s3fs|local)$ ]] || { echo "run.sh: unknown system '$s' (shale, rclone, s3fs, local)" >&2; exit 2; }
done
[ -z "$out" ] || out=$(realpath -m "$out")

# --- build -----------------------------------------------------------------
# scripts/setup.sh installs the peers (Debian's rclone and s3fs), etcd and
# versitygw, and builds bin/shale.
log "building bin/shale and installing the peers (scripts/setup.sh)"
./scripts/setup.sh >&2
for t in rclone s3fs etcd versitygw; do command -v $t >/dev/null || { echo "run.sh: $t missing: run scripts/setup.sh" >&2; exit 1; }; done
tmp=$(mktemp -d /tmp/shale-volbench.XXXXXX)
cp bin/shale "$tmp/shale" # a private copy: others rebuilding bin/shale change nothing
shale=$tmp/shale
go build -o "$tmp/fsops" ./bench/volume/fsops
fsops=$tmp/fsops

# The build runs offline, on this toolchain only (bench/net/cache.sh's).
export GOFLAGS=-buildvcs=false GOPROXY=off GOTOOLCHAIN=local GOTELEMETRY=off GOWORK=off
BUILD=$(go list -m -f '{{.Dir}}' github.com/BurntSushi/toml)
BUILDPKG=./cmd/tomlv
# GOCACHE holds the standard library compiled, copied fresh for each cold
# build, so that it compiles the module's packages and links.
GOCACHE=$tmp/gocache-std go build -o /dev/null std
export GOCACHE=$tmp/gocache

check_workdir "$work"
results=$tmp/results.tsv
: >"$results"

# --- engines ---------------------------------------------------------------
# Our own etcd cluster and versitygw, on ports of their own, so that tests
# running beside the benchmark are not disturbed (nor disturb it).
export SHALE_ENGINES_DIR=$work/engines SHALE_ENGINES_PORT=${SHALE_BENCH_PORT:-25790}
eval "$(./scripts/engines.sh start)"
bucketdir=$SHALE_ENGINES_DIR/buckets/shale
s3url=${SHALE_S3%/shale}
# rclone reads its remote from the environment; the AWS SDK it is built on
# fails on an AWS_CA_BUNDLE (set on some machines) over plain http.
export RCLONE_CONFIG_VGW_TYPE=s3 RCLONE_CONFIG_VGW_PROVIDER=Other RCLONE_CONFIG_VGW_ENDPOINT=$s3url \
	RCLONE_CONFIG_VGW_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID RCLONE_CONFIG_VGW_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY \
	RCLONE_CONFIG_VGW_REGION=$AWS_REGION
s3fspass=$tmp/s3fs.passwd
echo "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" >"$s3fspass"
chmod 600 "$s3fspass"
cachesize=$(( (BIGMB * 2 > 2048 ? BIGMB * 2 : 2048) ))MiB

# --- systems ---------------------------------------------------------------
# Each repetition gives each system a store of its own: a new volume for
# shale, a new prefix of the bucket for rclone and s3fs ($store).

# mount_sys SYS CLIENT: mounts SYS's store at $work/SYS/CLIENT (a or b, two
# clients with caches of their own) and echoes the mount point.
mount_sys() {
	local s=$1 c=$2 mnt=$work/$1/$2 cache=$work/$1/cache-$2
	mkdir -p "$mnt" "$cache"
	case $s in
	shale) "$shale" mount --cache-dir "$cache" --cache-size "$cachesize" "$store" "$mnt" ;;
	rclone) env -u AWS_CA_BUNDLE rclone mount "vgw:shale/$store" "$mnt" --vfs-cache-mode full \
		--cache-dir "$cache" --allow-other --daemon 2>>"$tmp/rclone.log" ;;
	s3fs) s3fs "shale:/$store" "$mnt" -o "url=$s3url,use_path_request_style,passwd_file=$s3fspass,allow_other" ;;
	local) mkdir -p "$work/local/lower" && "$shale" mount "$work/local/lower" "$mnt" ;;
	esac
	for _ in $(seq 100); do mounted "$mnt" && { echo "$mnt"; return; }; sleep 0.1; done
	echo "run.sh: $s did not mount at $mnt" >&2
	exit 1
}

umount_sys() {
	local s=$1 mnt=$work/$1/$2
	mounted "$mnt" || return 0
	sync
	case $s in
	shale | local) "$shale" umount "$mnt" || umount -l "$mnt" ;;
	*) fusermount3 -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || umount -l "$mnt" ;;
	esac
	# rclone --daemon and s3fs end after the unmount; wait for them to go,
	# so that a new mount on the same cache directory does not meet them.
	for _ in $(seq 100); do pgrep -f -- " $mnt( |$)" >/dev/null || break; sleep 0.1; done
}

# new_store SYS: a fresh store for SYS.
new_store() {
	local s=$1
	case $s in
	shale)
		local name=bv$rep-$RANDOM
		"$shale" format --data "$SHALE_S3/$name" "etcd://$SHALE_ETCD/$name" >&2
		store=etcd://$SHALE_ETCD/$name
		;;
	rclone | s3fs) store=$s-$rep-$RANDOM && mkdir -p "$bucketdir/$store" ;;
	local) store="" && rm -rf "$work/local/lower" ;;
	esac
	rm -rf "$work/$s/cache-a" "$work/$s/cache-b"
}

cleanup() {
	local s c
	for s in "${syslist[@]}"; do for c in a b; do umount_sys "$s" "$c" 2>/dev/null || true; done; done
	./scripts/engines.sh stop || true
	rm -rf "$work" "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- workloads -------------------------------------------------------------
record() { printf '%s\t%s\t%s\t%s\n' "$rep" "$1" "$2" "$3" >>"$results"; log "  $1 $2 $3"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }'; }
mbps() { awk -v a="$1" -v b="$EPOCHREALTIME" -v mb="$BIGMB" 'BEGIN { printf "%.1f", mb / (b - a) }'; }

# timed SYS WORKLOAD CMD...: runs CMD, records its wall time in seconds.
timed() {
	local s=$1 w=$2 t0; shift 2
	t0=$EPOCHREALTIME
	"$@" >/dev/null
	record "$s" "$w" "$(since "$t0")"
}

# in_s3 SYS: waits until the big file is in the bucket whole (rclone
# uploads it after close; the others have before close returned).
in_s3() {
	[ "$1" = rclone ] || return 0
	local want=$((BIGMB << 20)) f=$bucketdir/$store/big
	for _ in $(seq 6000); do
		[ "$(stat -c %s "$f" 2>/dev/null || echo 0)" = "$want" ] && return
		sleep 0.1
	done
	echo "run.sh: rclone's upload of $f not done after 600 s" >&2
	exit 1
}

# copy_tree SRC DST: SRC's directories and files, their bytes only: cp
# sets modes, which rclone refuses (EIO).
copy_tree() {
	local f
	(cd "$1" && find . -type d) | while read -r f; do mkdir -p "$2/$f"; done
	(cd "$1" && find . -type f) | while read -r f; do cat "$1/$f" >"$2/$f"; done
}

gobuild() {
	rm -rf "$GOCACHE" && cp -a "$tmp/gocache-std" "$GOCACHE"
	copy_tree "$BUILD" "$1/build"
	cold; timed "$2" "go build cold" w_gobuild "$1"
	cold; timed "$2" "go build hot" w_gobuild "$1"
}

# md SYS DIR: mdtest's four phases, each as operations per second; "md all"
# is the four together (4 x FILES over the sum of their times).
md() {
	local s=$1 p t0 secs sum=0
	mkdir "$2"
	for p in create stat list remove; do
		cold
		t0=$EPOCHREALTIME
		"$fsops" md "$p" "$files" "$2"
		secs=$(since "$t0")
		sum=$(awk -v a="$sum" -v b="$secs" 'BEGIN { print a + b }')
		record "$s" "md $p" "$(awk -v n="$files" -v t="$secs" 'BEGIN { printf "%.1f", n / t }')"
	done
	record "$s" "md all" "$(awk -v n="$files" -v t="$sum" 'BEGIN { printf "%.1f", 4 * n / t }')"
}

run_system() {
	local s=$1 d b t0
	new_store "$s"
	d=$(mount_sys "$s" a)
	if [ "$s" = local ]; then
		gobuild "$d" "$s"
		umount_sys "$s" a
		return
	fi

	md "$s" "$d/md"

	cold
	t0=$EPOCHREALTIME
	w_write "$d"
	record "$s" "seq write (close)" "$(mbps "$t0")"
	in_s3 "$s"
	record "$s" "seq write (in S3)" "$(mbps "$t0")"
	cold
	t0=$EPOCHREALTIME; w_read "$d"; record "$s" "seq read (cached)" "$(mbps "$t0")"
	# A fresh mount with empty caches reads from S3.
	umount_sys "$s" a
	rm -rf "$work/$s/cache-a"
	d=$(mount_sys "$s" a)
	cold
	t0=$EPOCHREALTIME; w_read "$d"; record "$s" "seq read (from S3)" "$(mbps "$t0")"
	rm -f "$d/big"

	gobuild "$d" "$s"

	b=$(mount_sys "$s" b)
	"$fsops" two -rounds "$rounds" -timeout "${waitsecs}s" "$d" "$b" 2>>"$tmp/two.log" >"$tmp/two.out" ||
		log "  $s: the two-client workload failed (see $tmp/two.log)"
	while IFS=$'\t' read -r w v; do record "$s" "$w" "$v"; done <"$tmp/two.out"
	umount_sys "$s" b
	umount_sys "$s" a
}

# --- run -------------------------------------------------------------------
repetitions

# --- report ----------------------------------------------------------------
report=$tmp/report.md
{
	echo "Command: \`bench/volume/run.sh $*\` (-n $runs -N $files -b $BIGMB -r $rounds -t $waitsecs), $(date -u '+%Y-%m-%d %H:%M UTC'), took ${elapsed}s"
	echo
	about_run
	echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (a shared machine: other jobs ran beside the benchmark)"
	echo "- engines on loopback (scripts/engines.sh): etcd $(etcd --version | awk '/etcd Version/ { print $3 }'), 3 members; versitygw $(awk -F= '/^vgw=/ { print $2 }' scripts/setup.sh) (posix backend), both in $work"
	echo "- systems: shale, a volume with blocks of 4 MiB, mounted with --cache-dir (--cache-size $cachesize); Debian's $(rclone version | head -1 | awk '{ print $1, $2 }'): rclone mount --vfs-cache-mode full, its other options default (--vfs-write-back 5s, --dir-cache-time 5m); Debian's s3fs $(s3fs --version | head -1 | grep -o 'V[0-9.]*') with its defaults (no local cache)"
	echo
	go run ./bench/volume/report -systems "$systems" <"$results"
} >"$report"
publish "$report" "$results"
