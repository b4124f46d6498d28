#!/usr/bin/env bash
# Times one FUSE round trip: statfs(2) in a loop (bench/core/statfs), which
# the kernel sends to the server every time, on native, on libfuse's
# hello_ll example (a C server answering from memory: the floor of
# /dev/fuse), libfuse's passthrough_ll, go-fuse's loopback example and the
# shale loop view. Prints the median and fastest round, in microseconds
# per call. Needs root (allow_other) and scripts/setup.sh's packages.
#
#   bench/core/roundtrip.sh [-d WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/go/bin:$PATH
. bench/lib.sh

work=/var/tmp/shale-roundtrip
while getopts "d:h" opt; do
	case $opt in
	d) work=$OPTARG ;;
	*) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
	esac
done
[ "$(id -u)" -eq 0 ] || { echo "roundtrip.sh: run as root (allow_other)" >&2; exit 1; }
ex=/usr/share/doc/libfuse3-dev/examples
[ -r $ex/hello_ll.c ] || { echo "roundtrip.sh: $ex missing: run scripts/setup.sh (libfuse3-dev)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/shale-roundtrip.XXXXXX)
check_workdir "$work"
mkdir -p "$work/lower"
mnts=()
cleanup() {
	local m
	for m in "${mnts[@]}"; do mounted "$m" && { umount "$m" || umount -l "$m"; }; done
	rm -rf "$work" "$tmp"
}
trap cleanup EXIT

CGO_ENABLED=0 go build -o "$tmp/shale" ./cmd/shale
CGO_ENABLED=0 go build -o "$tmp/loopback" github.com/hanwen/go-fuse/v2/example/loopback
go build -o "$tmp/statfs" ./bench/core/statfs
for p in hello_ll passthrough_ll; do
	# shellcheck disable=SC2046 # pkg-config's flags are words
	cc -Wall -O2 $(pkg-config fuse3 --cflags) "$ex/$p.c" -o "$tmp/$p" $(pkg-config fuse3 --libs)
done

# mount_as NAME CMD...: mounts with CMD (which ends with the mount point
# $work/NAME) and waits for it.
mount_as() {
	local m=$work/$1; shift
	mkdir -p "$m"
	mnts+=("$m")
	"$@"
	for _ in $(seq 100); do mounted "$m" && return; sleep 0.1; done
	echo "roundtrip.sh: nothing mounted at $m" >&2
	exit 1
}
mount_as hello_ll "$tmp/hello_ll" "$work/hello_ll"
mount_as passthrough_ll "$tmp/passthrough_ll" -o source="$work/lower",allow_other,default_permissions,cache=always "$work/passthrough_ll"
"$tmp/loopback" -q -allow-other "$work/loopback" "$work/lower" >/dev/null 2>&1 &
mount_as loopback true
mount_as shale "$tmp/shale" mount "$work/lower" "$work/shale"

echo "statfs(2), µs per call (median and fastest of 7 rounds of 20000), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| system | median | fastest |"
echo "|---|---|---|"
for s in native hello_ll passthrough_ll loopback shale; do
	d=$work/$s
	[ $s = native ] && d=$work/lower
	"$tmp/statfs" "$d" | awk -v s="$s" -F'\t' '{ printf "| %s | %s | %s |\n", s, $1, $2 }'
done
