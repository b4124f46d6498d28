# Shared by the benchmark harnesses (bench/core/run.sh, bench/net/run.sh),
# sourced from the repository root: logging, mount checks, cold caches and
# the workloads, so that every harness runs the same ones.
#
# The workloads read two variables the harness sets: SRC, the source tree
# the metadata workloads copy, and BIGMB, the sequential file's size in MiB.
# Each takes the directory to work in.

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }

mounted() { awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }

cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# check_workdir DIR: makes DIR and sets fstype to its file system's type;
# exits if that is memory or FUSE, whose numbers would not be the disk's.
check_workdir() {
	mkdir -p "$1"
	fstype=$(stat -f -c %T "$1")
	case $fstype in tmpfs | ramfs | fuse* | overlay*) echo "run.sh: $1 is on $fstype; pick a disk file system with -d" >&2; exit 1 ;; esac
}

w_cp() { cp -a "$SRC" "$1/src"; }
w_find() { find "$1/src" | wc -l; }
# A batch of files (or a tree) with no match is grep's exit 1, not an error.
w_xgrep() { find "$1/src" -type f -print0 | xargs -0 sh -c 'grep -l "func main" "$@"; [ $? -le 1 ]' grep | wc -l; }
w_grep() { { grep -r -l "func main" "$1/src" || [ $? -eq 1 ]; } | wc -l; }
w_rm() { rm -r "$1/src"; }
w_write() { dd if=/dev/zero of="$1/big" bs=1M count=$BIGMB conv=fsync status=none; }
w_read() { dd if="$1/big" of=/dev/null bs=1M status=none; }
# w_gobuild DIR: `go build` of package $BUILDPKG of the Go module in
# DIR/build, the binary written beside it (bench/net/cache.sh; GOCACHE and
# the other go variables as the harness exports them).
w_gobuild() { (cd "$1/build" && go build -o prog "$BUILDPKG"); }

# about_run prints the lines a report gives after its command: shale's
# commit, the machine, the kernel and the work dir ($root, $work, $fstype).
about_run() {
	echo "- shale: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$root" diff --quiet 2>/dev/null || echo ' (dirty tree)')"
	echo "- machine: $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM"
	echo "- kernel: $(uname -r); work dir $work on $fstype ($(df --output=source "$work" | tail -1))"
}

# positive FLAG VALUE: ends the script, in one line, unless VALUE (given
# to -FLAG) is a positive whole number.
positive() {
	[[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "$(basename "$0"): -$1 wants a positive number, got '$2'" >&2; exit 2; }
}

# repetitions: runs run_system for every system of syslist (in that order)
# in each of $runs repetitions, with $rep set, and sets elapsed to the
# seconds it all took.
repetitions() {
	local start=$EPOCHREALTIME s
	for rep in $(seq "$runs"); do
		log "repetition $rep of $runs"
		for s in "${syslist[@]}"; do run_system "$s"; done
	done
	elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
}

# publish REPORT RESULTS: prints the report, and with -o ($out) copies it
# there and the raw results beside it (OUT.tsv).
publish() {
	cat "$1"
	[ -n "$out" ] || return 0
	cp "$1" "$out"
	cp "$2" "${out%.md}.tsv"
	log "report in $out, raw results in ${out%.md}.tsv"
}
