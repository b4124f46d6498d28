#!/usr/bin/env bash
# Counts the FUSE requests shale's views receive, by opcode, for a fixed
# workload: the round trips a change to fuseview saves, without timing
# (deterministic on a busy machine, where timed runs are not).
#
#   bench/core/count.sh [-s SYSTEMS] [-t TREE] [-d WORKDIR] [-b BIN]
#
#   -s SYSTEMS  comma-separated subset of: shale (the loop view),
#               shale-nopt (--no-passthrough), crypt (default: shale)
#   -t TREE     the source tree the workloads copy (default
#               /usr/local/go/src/net/http, as docs/coherence.md counts)
#   -d WORKDIR  where lower directories and mount points go (default
#               /var/tmp/shale-count)
#   -b BIN      the shale binary to count (default: bin/shale, built)
#
# The workloads are bench/lib.sh's (cp -a, find, grep -r, rm -r), cold
# (after drop_caches) and warm. The view runs with --debug, and each phase
# ends when its log has been quiet for a while (RELEASE and FORGET come
# after the system calls return). Prints one table: a row per workload
# and opcode, and the total per workload. Needs root (drop_caches).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/go/bin:$PATH
export LC_ALL=C
. bench/lib.sh

systems=shale SRC=/usr/local/go/src/net/http work=/var/tmp/shale-count bin=""
while getopts "s:t:d:b:h" opt; do
	case $opt in
	s) systems=$OPTARG ;;
	t) SRC=$OPTARG ;;
	d) work=$OPTARG ;;
	b) bin=$OPTARG ;;
	*) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
	esac
done
[ "$(id -u)" -eq 0 ] || { echo "count.sh: run as root (it drops caches)" >&2; exit 1; }
[ -d "$SRC" ] || { echo "count.sh: no tree at $SRC; give one with -t" >&2; exit 2; }
IFS=, read -r -a syslist <<<"$systems"
for s in "${syslist[@]}"; do
	case $s in shale | shale-nopt | crypt) ;; *) echo "count.sh: unknown system '$s'" >&2; exit 2 ;; esac
done
if [ -z "$bin" ]; then
	CGO_ENABLED=0 go build -o bin/shale ./cmd/shale
	bin=bin/shale
	build="shale $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (dirty tree)')"
else
	build="the shale binary $bin"
fi
tmp=$(mktemp -d /tmp/shale-count.XXXXXX)
cp "$bin" "$tmp/shale"
shale=$tmp/shale
echo "shale-count passphrase" >"$tmp/pass"
chmod 600 "$tmp/pass"
check_workdir "$work"

cleanup() {
	local s
	for s in "${syslist[@]}"; do mounted "$work/$s/mnt" && { "$shale" umount "$work/$s/mnt" || umount -l "$work/$s/mnt"; }; done
	rm -rf "$work" "$tmp"
}
trap cleanup EXIT

# quiet LOG: returns once LOG has not grown for 0.5 s.
quiet() {
	local a b
	a=$(stat -c %s "$1")
	while sleep 0.5; do
		b=$(stat -c %s "$1")
		[ "$a" = "$b" ] && return
		a=$b
	done
}

# phase SYS NAME CMD...: runs CMD and counts the requests logged meanwhile.
phase() {
	local s=$1 name=$2 lg=$work/$1/log from; shift 2
	quiet "$lg"
	from=$(stat -c %s "$lg")
	"$@" >/dev/null
	quiet "$lg"
	tail -c +"$((from + 1))" "$lg" |
		grep -oE 'rx [0-9]+: [A-Z_]+|tx 0: +NOTIFY_[A-Z_]+' |
		awk -v s="$s" -v w="$name" '{ op = $NF; n[op]++; t++ }
			END { printf "%s\t%s\t(total)\t%d\n", s, w, t + 0; for (op in n) printf "%s\t%s\t%s\t%d\n", s, w, op, n[op] }' |
		sort -t"$(printf '\t')" -k3,3 >>"$tmp/counts"
}

: >"$tmp/counts"
for s in "${syslist[@]}"; do
	lower=$work/$s/lower mnt=$work/$s/mnt
	mkdir -p "$lower" "$mnt"
	flags=()
	case $s in
	shale-nopt) flags=(--no-passthrough) ;;
	crypt)
		"$shale" init --layer crypt --passfile "$tmp/pass" --scrypt-logn 10 "$lower" >&2
		flags=(--layer crypt --passfile "$tmp/pass")
		;;
	esac
	"$shale" mount --debug --log "$work/$s/log" "${flags[@]}" "$lower" "$mnt"
	for _ in $(seq 100); do mounted "$mnt" && break; sleep 0.1; done
	mounted "$mnt" || { echo "count.sh: $s did not mount at $mnt" >&2; exit 1; }
	log "counting $s"
	phase "$s" "cp -a" w_cp "$mnt"
	cold
	phase "$s" "find (cold)" w_find "$mnt"
	phase "$s" "find (warm)" w_find "$mnt"
	cold
	phase "$s" "grep -r (cold)" w_grep "$mnt"
	phase "$s" "grep -r (warm)" w_grep "$mnt"
	phase "$s" "ls -lR (warm)" ls -lR "$mnt/src"
	cold
	phase "$s" "rm -r" w_rm "$mnt"
	"$shale" umount "$mnt"
done

echo "Requests by opcode: \`bench/core/count.sh -s $systems -t $SRC\` ($(find "$SRC" -type f | wc -l) files, $(find "$SRC" -type d | wc -l) directories), $build, kernel $(uname -r)"
echo
awk -F'\t' '
	{ k = $1 " | " $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
	$3 == "(total)" { total[k] = $4; next }
	{ ops[k] = ops[k] (ops[k] == "" ? "" : ", ") $3 " " $4 }
	END { for (i = 1; i <= n; i++) print "| " order[i] " | " total[order[i]] " | " ops[order[i]] " |" }' "$tmp/counts" | { echo "| system | workload | requests | by opcode |"; echo "|---|---|---|---|"; cat; }
