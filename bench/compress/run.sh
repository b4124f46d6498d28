#!/usr/bin/env bash
# Benchmarks the compress layer (docs/compress.md), in one run:
#
#  (a) stored size of trees (default /usr/local/go/src and /usr/share/doc)
#      copied into a compress mount, against the original, zstd -3 of each
#      file on its own, and a tar.zst of the tree (zstd -3, the floor);
#  (b) bench/lib.sh's core workloads on compress, rot13 and the loop view
#      without passthrough (shale mount --no-passthrough: a layer that
#      changes data cannot use passthrough), interleaved in every
#      repetition, with medians and ratios;
#  (c) sequential write of 1 GiB of text (compressible but not zeros,
#      which the layer stores as holes) on the same three.
#
#   bench/compress/run.sh [-n RUNS] [-d WORKDIR] [TREE...]
#
# Needs root (drop_caches, allow_other). Numbers in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH=/usr/local/go/bin:$PATH
export LC_ALL=C
. bench/lib.sh

runs=3 work=/var/tmp/shale-bench-compress
while getopts "n:d:h" opt; do
	case $opt in
	n) runs=$OPTARG ;;
	d) work=$OPTARG ;;
	*) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
trees=("$@")
[ ${#trees[@]} -gt 0 ] || trees=(/usr/local/go/src /usr/share/doc)
[ "$(id -u)" -eq 0 ] || { echo "run.sh: run as root" >&2; exit 1; }
SRC=/usr/local/go/src
BIGMB=${SHALE_BENCH_BIGMB:-1024}
systems=(compress rot13 loop)

./scripts/setup.sh >&2
tmp=$(mktemp -d /tmp/shale-bench-compress.XXXXXX)
cp bin/shale "$tmp/shale"
shale=$tmp/shale
check_workdir "$work"
results=$tmp/results.tsv
: >"$results"

mnt_of() { echo "$work/$1/mnt"; }
mount_sys() {
	local lower=$work/$1/lower mnt=$work/$1/mnt
	rm -rf "$lower" && mkdir -p "$lower" "$mnt"
	case $1 in
	compress) "$shale" mount --layer compress "$lower" "$mnt" ;;
	rot13) "$shale" mount --layer rot13 "$lower" "$mnt" ;;
	loop) "$shale" mount --no-passthrough "$lower" "$mnt" ;;
	esac
}
umount_sys() { mounted "$(mnt_of "$1")" && { sync; "$shale" umount "$(mnt_of "$1")"; } || true; }
cleanup() {
	local s
	for s in "${systems[@]}"; do umount_sys "$s" 2>/dev/null || true; done
	rm -rf "$work" "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# row SYS WORKLOAD VALUE
row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$results"; log "  $1 $2 $3"; }
secs() { local t0=$EPOCHREALTIME; "$@" >/dev/null; awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }'; }

# --- (a) stored size ---------------------------------------------------------
sizes=$tmp/sizes.md
{
	echo "| tree | original | compress | zstd -3 per file | tar.zst (floor) | compress / per-file zstd |"
	echo "|---|---|---|---|---|---|"
} >"$sizes"
mount_sys compress
for t in "${trees[@]}"; do
	log "stored size of $t"
	name=$(basename "$t")
	cp -a "$t" "$(mnt_of compress)/$name"
	sync
	orig=$(du -sb "$t" | cut -f1); orig_k=$(du -sk "$t" | cut -f1)
	comp=$(du -sb "$work/compress/lower/$name" | cut -f1); comp_k=$(du -sk "$work/compress/lower/$name" | cut -f1)
	zdir=$tmp/zst-$name
	mkdir -p "$zdir"
	( cd "$t" && find . -type f -print0 | while IFS= read -r -d '' f; do
		mkdir -p "$zdir/$(dirname "$f")"; zstd -3 -q -c -- "$f" >"$zdir/$f.zst"; done )
	zst=$(du -sb "$zdir" | cut -f1); zst_k=$(du -sk "$zdir" | cut -f1)
	floor=$(tar -C "$t" -cf - . | zstd -3 -q -c | wc -c)
	diff -r --no-dereference "$t" "$(mnt_of compress)/$name" >/dev/null || { echo "run.sh: $name differs through the mount" >&2; exit 1; }
	awk -v n="$name" -v o="$orig" -v ok="$orig_k" -v c="$comp" -v ck="$comp_k" -v z="$zst" -v zk="$zst_k" -v f="$floor" 'BEGIN {
		m = 1048576
		printf "| %s | %.1f MiB (du %.1f) | %.1f MiB (du %.1f) | %.1f MiB (du %.1f) | %.1f MiB | %.3f (du %.3f) |\n", n, o/m, ok/1024, c/m, ck/1024, z/m, zk/1024, f/m, c/z, ck/zk
	}' >>"$sizes"
	rm -rf "$zdir" "$(mnt_of compress)/$name"
done
umount_sys compress

# --- (b), (c) workloads, interleaved -----------------------------------------
text_write() { yes "$(head -c 200 "$SRC/go/ast/ast.go" | tr '\n' ' ')" | head -c $((BIGMB << 20)) | dd of="$1/big" bs=1M iflag=fullblock conv=fsync status=none; }
for rep in $(seq "$runs"); do
	log "repetition $rep of $runs"
	for s in "${systems[@]}"; do
		mount_sys "$s"
		d=$(mnt_of "$s")
		cold; row "$s" "cp -a" "$(secs w_cp "$d")"
		cold; row "$s" "find (cold)" "$(secs w_find "$d")"
		row "$s" "find (warm)" "$(secs w_find "$d")"
		cold; row "$s" "grep -r (cold)" "$(secs w_grep "$d")"
		row "$s" "grep -r (warm)" "$(secs w_grep "$d")"
		cold; row "$s" "rm -r" "$(secs w_rm "$d")"
		cold; row "$s" "seq write 1 GiB zeros (MB/s)" "$(awk -v t="$(secs w_write "$d")" -v mb="$BIGMB" 'BEGIN { printf "%.1f", mb / t }')"
		cold; row "$s" "seq read 1 GiB zeros (MB/s)" "$(awk -v t="$(secs w_read "$d")" -v mb="$BIGMB" 'BEGIN { printf "%.1f", mb / t }')"
		rm -f "$d/big"
		cold; row "$s" "seq write 1 GiB text (MB/s)" "$(awk -v t="$(secs text_write "$d")" -v mb="$BIGMB" 'BEGIN { printf "%.1f", mb / t }')"
		cold; row "$s" "seq read 1 GiB text (MB/s)" "$(awk -v t="$(secs w_read "$d")" -v mb="$BIGMB" 'BEGIN { printf "%.1f", mb / t }')"
		rm -f "$d/big"
		umount_sys "$s"
	done
done

# --- report ------------------------------------------------------------------
{
	echo "Command: \`bench/compress/run.sh $*\` (-n $runs), $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	about_run
	echo
	cat "$sizes"
	echo
	echo "Medians of $runs runs (seconds, or MB/s where the row says so); ratios: compress against rot13 and against the loop view (for times, compress/other: > 1 is slower; for MB/s, other/compress: > 1 is slower)."
	echo
	echo "| workload | compress | rot13 | loop (no passthrough) | vs rot13 | vs loop |"
	echo "|---|---|---|---|---|---|"
	awk -F'\t' '
		{ k = $1 SUBSEP $2; v[k, ++n[k]] = $3; if (!($2 in seen)) { seen[$2] = 1; order[++w] = $2 } }
		function med(k,   a, i, j, c, t) { c = n[k]; for (i = 1; i <= c; i++) a[i] = v[k, i]
			for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
			return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2 }
		END { for (i = 1; i <= w; i++) { x = order[i]
			c = med("compress" SUBSEP x); r = med("rot13" SUBSEP x); l = med("loop" SUBSEP x)
			if (x ~ /MB\/s/) printf "| %s | %.1f | %.1f | %.1f | %.2f | %.2f |\n", x, c, r, l, r / c, l / c
			else printf "| %s | %.3f | %.3f | %.3f | %.2f | %.2f |\n", x, c, r, l, c / r, c / l } }' "$results"
}
