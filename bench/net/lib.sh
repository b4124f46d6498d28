# Shared by the 9P harnesses (bench/net/run.sh, bench/net/cache.sh), sourced
# after bench/lib.sh: ports, the relay's request count, and a timed step.
#
# The harness sets: tmp (its scratch directory, for logs), delay_pid and
# delay_out (the running relay and the file its SIGUSR1 answers go to;
# empty for a row without one), results (the raw results file), rep (the
# repetition) and steptimeout (seconds).

# free_port: a TCP port nothing listens on.
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 20000))
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

# stop PID: ends a process this script started, and reaps it.
# serve_delayed ROW LOWER LOG [FLAGS...]: shale serve LOWER with FLAGS on a
# free port, its log appended to LOG, behind shale delay at the row's
# added round-trip time (ROW is NAME-RTT); sets server_pid and sport,
# delay_pid and delay_out (the proxy's counts), and served_url.
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
	"$shale" delay --listen "127.0.0.1:$dport" --to "127.0.0.1:$sport" --rtt "${r#*-}" >"$delay_out" 2>>"$tmp/delay.log" &
	delay_pid=$!
	wait_listen "$dport" "$delay_pid" "shale delay"
	served_url=9p://127.0.0.1:$dport/
}

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
