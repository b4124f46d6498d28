# Shared by the 9P harnesses (bench/net/run.sh, bench/net/cache.sh,
# bench/net/sprite.sh), sourced after bench/lib.sh: ports, the relay's
# request count, a timed step, and the comparison with a base build (-B).
#
# The harness sets: tmp (its scratch directory, for logs), delay_pid and
# delay_out (the running relay and the file its SIGUSR1 answers go to;
# empty for a row without one), results (the raw results file), rep (the
# repetition) and steptimeout (seconds); shale (the binary its rows run),
# and for -B shale_cur, base_rev and rowlist (see "A base build" below).

# usage: the script's comment block after its first line, unmarked.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

# free_port: a TCP port nothing listens on, below the kernel's ephemeral
# range: a port in it may be taken by an outgoing connection (of a test
# suite running beside) between this check and the bind, which then
# fails "address already in use".
free_port() {
	local p lo
	read -r lo _ </proc/sys/net/ipv4/ip_local_port_range
	[ "$lo" -gt 12000 ] || lo=32768
	while :; do
		p=$((10000 + RANDOM % (lo - 10000)))
		[ -z "$(ss -Hltn "sport = :$p")" ] && { echo $p; return; }
	done
}

# wait_listen PORT PID WHAT: waits until PORT is listened on, failing if
# PID ends first.
wait_listen() {
	for _ in $(seq 100); do
		[ -n "$(ss -Hltn "sport = :$1")" ] && return
		kill -0 "$2" 2>/dev/null || { echo "${0##*/}: $3 exited before listening on port $1 (log: $tmp/*.log)" >&2; exit 1; }
		sleep 0.1
	done
	echo "${0##*/}: $3 did not listen on port $1 in 10s" >&2
	exit 1
}

# serve_delayed ROW LOWER LOG [FLAGS...]: shale serve LOWER with FLAGS on a
# free port, its log appended to LOG, behind shale delay at the row's
# added round-trip time (ROW is NAME-RTT); sets server_pid and sport,
# delay_pid and delay_out (the proxy's counts), and served_url. The relay
# is the harness's own build (shale_cur) where it sets one, for a base
# build's rows (-B) too: it delays and counts alike whichever build it
# carries.
serve_delayed() {
	local r=$1 lower=$2 log=$3 dport
	shift 3
	sport=$(free_port)
	"$shale" serve "$@" --listen "tcp:127.0.0.1:$sport" "$lower" >>"$log" 2>&1 &
	server_pid=$!
	wait_listen "$sport" "$server_pid" "shale serve"
	dport=$(free_port)
	delay_out=$tmp/delay-$r.out
	: >"$delay_out"
	"${shale_cur:-$shale}" delay --listen "127.0.0.1:$dport" --to "127.0.0.1:$sport" --rtt "${r#*-}" >"$delay_out" 2>>"$tmp/delay.log" &
	delay_pid=$!
	wait_listen "$dport" "$delay_pid" "shale delay"
	served_url=9p://127.0.0.1:$dport/
}

# stop PID: ends a process this script started, and reaps it.
stop() {
	[ -n "$1" ] || return 0
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# requests: the 9P requests the relay has counted so far ("-" without one).
requests() {
	[ -n "$delay_pid" ] || { echo -; return; }
	local n0 n
	n0=$(wc -l <"$delay_out")
	kill -USR1 "$delay_pid"
	for _ in $(seq 100); do
		n=$(wc -l <"$delay_out")
		[ "$n" -gt "$n0" ] && { tail -n 1 "$delay_out" | awk '{ print $2 }'; return; }
		sleep 0.05
	done
	echo "${0##*/}: shale delay did not answer SIGUSR1" >&2
	exit 1
}

# step ROW WORKLOAD FUNC DIR: runs FUNC DIR under the step timeout and
# records its wall time (or "timeout" or "failed") and the requests it
# sent. Returns 1 if it did not finish.
step() {
	local r=$1 w=$2 f=$3 d=$4 q0 q1 t0 t1 rc=0 v unit=""
	q0=$(requests)
	t0=$EPOCHREALTIME
	timeout -k 10 "$steptimeout" bash -c "set -o pipefail; $f \"\$1\" >/dev/null" _ "$d" || rc=$?
	t1=$EPOCHREALTIME
	q1=$(requests)
	case $rc in
	0) v=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }') unit=s ;;
	124 | 137) v=timeout ;;
	*) v=failed unit=" (exit $rc)" ;;
	esac
	[ "$q0" = - ] || q1=$((q1 - q0))
	printf '%s\t%s\t%s\t%s\t%s\n' "$rep" "$r" "$w" "$v" "$q1" >>"$results"
	log "  $r $w: $v$unit, $q1 requests"
	[ "$rc" -eq 0 ]
}

# --- A base build (-B REV) ---------------------------------------------------
# With -B REV a harness runs every network row twice a repetition: on its
# own build (shale_cur, the work tree's) and on REV's, as the row's twin
# SYSTEM@base-RTT (cached-50ms and cached@base-50ms), the server and the
# client of either from the one build; the loop view (no network) runs
# once, on the harness's build. The twins run one right after the other,
# the harness's build first in odd repetitions and the base's first in
# even ones, so that a machine getting busier or quieter slows both alike.
# The report then sets each step's median on one against the other's
# (report -base).

# base_check REV: ends the script, in one line, unless REV (given to -B)
# names a commit of this repository; sets base_commit to its hash.
base_check() {
	base_commit=$(git -C "$root" rev-parse --verify --quiet "$1^{commit}") ||
		{ echo "${0##*/}: -B wants a commit of $root, got '$1'" >&2; exit 2; }
}

# build_base: base_commit's cmd/shale built into $tmp/shale-base, as
# scripts/setup.sh builds bin/shale, from its tree exported into
# $tmp/base-src (git archive: the repository, its work tree and bin/ stay
# as they are), which goes once built; sets shale_base.
build_base() {
	local src=$tmp/base-src
	log "building $tmp/shale-base from $base_rev (${base_commit:0:12})"
	rm -rf "$src"
	mkdir -p "$src"
	git -C "$root" archive "$base_commit" | tar -x -C "$src"
	local rc=0
	(cd "$src" && CGO_ENABLED=0 go build -o "$tmp/shale-base" ./cmd/shale) || rc=$?
	rm -rf "$src"
	[ "$rc" -eq 0 ] || { echo "${0##*/}: go build ./cmd/shale of $base_rev failed" >&2; exit 1; }
	shale_base=$tmp/shale-base
}

# base_rows: with -B, each network row of rowlist followed by its twin
# on the base build; rowlist as it was without.
base_rows() {
	[ -n "$base_rev" ] || return 0
	local r all=()
	for r in "${rowlist[@]}"; do
		all+=("$r")
		[[ $r != *-* ]] || all+=("${r%%-*}@base-${r#*-}")
	done
	rowlist=("${all[@]}")
}

# rep_rows: the rows repetition $rep runs, in order: rowlist, with each
# network row's twin before it in even repetitions (-B).
rep_rows() {
	local i n=${#rowlist[@]}
	for ((i = 0; i < n; i++)); do
		if [ $((rep % 2)) -eq 0 ] && [[ ${rowlist[i]} != *@base-* ]] && ((i + 1 < n)) && [[ ${rowlist[i + 1]} == *@base-* ]]; then
			echo "${rowlist[i + 1]}"
			echo "${rowlist[i]}"
			i=$((i + 1))
		else
			echo "${rowlist[i]}"
		fi
	done
}

# use_build ROW: sets shale to the build ROW runs on.
use_build() {
	case $1 in
	*@base-*) shale=$shale_base ;;
	*) shale=$shale_cur ;;
	esac
}

# about_base: the report's line on the base build (nothing without -B).
about_base() {
	[ -n "$base_rev" ] || return 0
	local subj
	subj=$(git -C "$root" log -1 --format=%s "$base_commit")
	[ ${#subj} -le 72 ] || subj="${subj:0:71}…"
	echo "- base (-B $base_rev): $(git -C "$root" log -1 --format='%h, %cs' "$base_commit"): $subj; each network row also as SYSTEM@base, its shale serve and shale mount built from there (\`git archive\`, \`CGO_ENABLED=0 go build\`); the relay is this build's for both; the twins run back to back, this build first in odd repetitions, the base first in even ones"
}

# base_report MODE RESULTS: with -B, the report's comparison of each
# network row with its twin on the base build (report MODE -base), from
# the raw results in RESULTS.
base_report() {
	[ -n "$base_rev" ] || return 0
	echo
	go run ./bench/net/report "$1" -base "$base_rev" -rows "$rows" -timeout "$steptimeout" <"$2"
}
