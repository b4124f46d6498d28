#!/usr/bin/env bash
# Starts and stops the engines a volume (docs/volume.md) needs, on loopback:
# a 3-member etcd cluster (Debian's etcd-server) and an S3 server
# (versitygw over a local directory). Tests take them from the variables
# "start" prints; any other etcd and S3 may be given the same way.
#
#   eval "$(scripts/engines.sh start)"   # SHALE_ETCD, SHALE_S3, AWS_*
#   scripts/engines.sh stop
#
# State lives in $SHALE_ENGINES_DIR (default /tmp/shale-engines): the
# members' data, the bucket directory, pids and logs. start is idempotent:
# engines already running are left alone.
set -euo pipefail
dir=${SHALE_ENGINES_DIR:-/tmp/shale-engines}
base=${SHALE_ENGINES_PORT:-23790} # etcd clients base..base+2, peers +10.., S3 +20
export PATH=$PATH:$HOME/go/bin:/usr/local/go/bin
key=shaletest
secret=shaletestsecret

member() { # i: name client-port peer-port
	echo "m$1 $((base + $1)) $((base + 10 + $1))"
}

# alive: the pid in file $1 runs (a zombie, killed but not yet reaped,
# does not count).
alive() {
	local st
	[ -f "$1" ] && st=$(ps -o stat= -p "$(cat "$1")" 2>/dev/null) && [[ $st != Z* ]]
}

start() {
	mkdir -p "$dir"
	command -v etcd >/dev/null || { echo "engines: etcd is missing: run scripts/setup.sh (Debian's etcd-server)" >&2; exit 1; }
	command -v versitygw >/dev/null || { echo "engines: versitygw is missing: run scripts/setup.sh" >&2; exit 1; }
	local cluster="" i
	for i in 0 1 2; do
		read -r name cport pport <<<"$(member $i)"
		cluster+="${cluster:+,}$name=http://127.0.0.1:$pport"
	done
	local endpoints=""
	for i in 0 1 2; do
		read -r name cport pport <<<"$(member $i)"
		endpoints+="${endpoints:+,}127.0.0.1:$cport"
		alive "$dir/$name.pid" && continue
		state=new
		[ -d "$dir/$name.etcd" ] && state=existing
		etcd --name "$name" --data-dir "$dir/$name.etcd" \
			--listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
			--listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
			--initial-cluster "$cluster" --initial-cluster-state "$state" --initial-cluster-token shale-engines \
			--quota-backend-bytes $((2 << 30)) --auto-compaction-mode revision --auto-compaction-retention 100000 \
			>"$dir/$name.log" 2>&1 &
		echo $! >"$dir/$name.pid"
	done
	local s3port=$((base + 20))
	if ! alive "$dir/s3.pid"; then
		mkdir -p "$dir/buckets/shale" "$dir/sidecar"
		ROOT_ACCESS_KEY=$key ROOT_SECRET_KEY=$secret versitygw --port "127.0.0.1:$s3port" \
			posix --sidecar "$dir/sidecar" "$dir/buckets" >"$dir/s3.log" 2>&1 &
		echo $! >"$dir/s3.pid"
	fi
	# Ready when the cluster has a leader and S3 answers.
	local deadline=$((SECONDS + 60))
	until ETCDCTL_API=3 etcdctl --endpoints "$endpoints" --command-timeout 2s endpoint health >/dev/null 2>&1 &&
		curl -s -o /dev/null "http://127.0.0.1:$s3port/"; do
		if [ $SECONDS -ge $deadline ]; then
			echo "engines: not ready after 60s; see the logs in $dir" >&2
			exit 1
		fi
		sleep 0.5
	done
	cat <<EOV
export SHALE_ETCD=$endpoints
export SHALE_S3=http://127.0.0.1:$s3port/shale
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1
EOV
}

stop() {
	local f
	for f in "$dir"/m0.pid "$dir"/m1.pid "$dir"/m2.pid "$dir"/s3.pid; do
		[ -f "$f" ] || continue
		kill "$(cat "$f")" 2>/dev/null || true
		rm -f "$f"
	done
}

case "${1:-}" in
start) start ;;
stop) stop ;;
wipe) stop; rm -rf "$dir" ;;
*) echo "usage: $0 start|stop|wipe" >&2; exit 2 ;;
esac
