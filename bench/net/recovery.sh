#!/usr/bin/env bash
# Measures recovery after a server crash (issue 22's target: at most the
# grace period plus 1 s before the first client write-back lands). Per
# round: client A (shale mount 9p://, delayed write of an hour, so only a
# recall writes its data back) writes a file; the server is killed (-9)
# and started again on the same address and LOWER (it finds its marker:
# opens wait --grace for reclaims); client B then reads the file. A
# reclaims on its new connection, B's open recalls A's data, and the
# time from the new server's start to B reading A's bytes is the
# recovery time. Prints every round's time, the median and the worst, and
# the ratio of the worst to grace + 1 s (PASS at most 1).
#
#   bench/net/recovery.sh [-n ROUNDS] [-g GRACE] [-d WORKDIR]
#
#   -n ROUNDS   rounds (default 10)
#   -g GRACE    the server's --grace, in whole seconds (default 2)
#   -d WORKDIR  where LOWER and the mount points go (default
#               /var/tmp/shale-recovery)
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/lib.sh
. bench/net/lib.sh

rounds=10 grace=2 work=/var/tmp/shale-recovery
while getopts n:g:d:h o; do
	case $o in
	n) positive -n "$OPTARG"; rounds=$OPTARG ;;
	g) positive -g "$OPTARG"; grace=$OPTARG ;;
	d) work=$OPTARG ;;
	*) usage; exit 2 ;;
	esac
done

./scripts/setup.sh >/dev/null
tmp=$(mktemp -d /tmp/shale-recovery.XXXXXX)
cp bin/shale "$tmp/shale"
shale=$tmp/shale
server_pid=
cleanup() {
	for m in "$work/a" "$work/b"; do "$shale" umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
	stop "$server_pid"
	rm -rf "$tmp"
}
trap cleanup EXIT
rm -rf "$work"
mkdir -p "$work/lower" "$work/a" "$work/b"
port=$(free_port)
serve() {
	"$shale" serve --no-root-squash --grace "${grace}s" --listen "tcp:127.0.0.1:$port" "$work/lower" >>"$tmp/serve.log" 2>&1 &
	server_pid=$!
	wait_listen "$port" "$server_pid" "shale serve"
}
serve
url=9p://127.0.0.1:$port/
"$shale" mount --write-delay 1h --log "$tmp/a.log" "$url" "$work/a"
"$shale" mount --log "$tmp/b.log" "$url" "$work/b"

times=()
for r in $(seq "$rounds"); do
	want="round $r: written on A, delayed $(date +%s%N)"
	echo "$want" >"$work/a/f$r"
	[ ! -s "$work/lower/f$r" ] || { echo "recovery.sh: round $r: LOWER has f$r already: the write was not delayed" >&2; exit 1; }
	kill -9 "$server_pid"
	wait "$server_pid" 2>/dev/null || true
	start=$(date +%s%N)
	serve
	got=$(cat "$work/b/f$r")
	end=$(date +%s%N)
	[ "$got" = "$want" ] || { echo "recovery.sh: round $r: B read '$got', want A's '$want'" >&2; exit 1; }
	ms=$(((end - start) / 1000000))
	times+=("$ms")
	echo "round $r: B read A's delayed write ${ms} ms after the restart (grace ${grace} s)"
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
median=$(echo "$sorted" | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
worst=$(echo "$sorted" | tail -1)
limit=$(((grace + 1) * 1000))
verdict=PASS
[ "$worst" -le "$limit" ] || verdict=MISS
echo "recovery after kill -9, $rounds rounds, grace ${grace} s: median ${median} ms, worst ${worst} ms; worst / (grace + 1 s) = $(awk "BEGIN {printf \"%.2f\", $worst / $limit}") ($verdict)"
