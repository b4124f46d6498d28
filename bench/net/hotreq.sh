#!/usr/bin/env bash
# Counts the 9P requests of a hot Go build on a caching 9P mount, by type
# (shale stats, no timing: the machine may be busy): shale serve [FLAGS]
# of a copy of the tomlv module, shale mount of it, `go build` twice; the
# requests of the second build.
#
#   bench/net/hotreq.sh [SERVE FLAGS...]      e.g. --delegate
#
# HOTREQ_SEED=std seeds GOCACHE with the standard library only and drops
# the kernel's caches before the first build, as bench/net/cache.sh does:
# the first build then compiles the module, reading its sources through
# the mount. HOTREQ_TRACE=FILE writes the second build's requests there
# (and the first's to FILE.first),
# one a line (the mount's debug log). It ends with the requests sent
# behind another without waiting (pipelined) and the round trips left,
# and says on stderr what the first build (with the mount's start) sent.
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOFLAGS=-buildvcs=false GOPROXY=off GOTOOLCHAIN=local GOTELEMETRY=off GOWORK=off
go build -o bin/shale ./cmd/shale
shale=$PWD/bin/shale
src=$(go list -m -f '{{.Dir}}' github.com/BurntSushi/toml)
w=$(mktemp -d /var/tmp/shale-hotreq.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() { umount "$w/mnt" 2>/dev/null || true; kill "$spid" 2>/dev/null || true; rm -rf "$w"; }
mkdir -p "$w/lower" "$w/mnt"
cp -a "$src" "$w/lower/build" && chmod -R u+w "$w/lower/build"
export GOCACHE=$w/gocache
case ${HOTREQ_SEED:-all} in
all) (cd "$w/lower/build" && go build -o /dev/null ./cmd/tomlv) ;; # the standard library and the module, compiled
std) (cd "$w/lower/build" && go build $(go list -deps -f '{{if .Standard}}{{.ImportPath}}{{end}}' ./cmd/tomlv)) ;;
*) echo "hotreq.sh: HOTREQ_SEED wants all or std, got '$HOTREQ_SEED'" >&2; exit 2 ;;
esac
"$shale" serve "$@" --no-root-squash --listen "tcp:127.0.0.1:$port" "$w/lower" >"$w/serve.log" 2>&1 &
spid=$!
trap cleanup EXIT
mopts=()
[ -z "${HOTREQ_TRACE:-}" ] || mopts=(--log-level debug --log "$w/mount.log")
for _ in $(seq 100); do "$shale" mount "${mopts[@]}" "9p://127.0.0.1:$port/" "$w/mnt" 2>/dev/null && break; sleep 0.1; done
if [ "${HOTREQ_SEED:-all}" = std ]; then
	for _ in $(seq 50); do "$shale" stats "$w/mnt" 2>/dev/null | grep -q '^caching *on' && break; sleep 0.1; done
	sync
	echo 3 >/proc/sys/vm/drop_caches
fi
(cd "$w/mnt/build" && go build -o tomlv ./cmd/tomlv)
"$shale" stats --json "$w/mnt" >"$w/s1.json"
[ -z "${HOTREQ_TRACE:-}" ] || lines=$(wc -l <"$w/mount.log")
(cd "$w/mnt/build" && go build -o tomlv ./cmd/tomlv)
"$shale" stats --json "$w/mnt" >"$w/s2.json"
if [ -n "${HOTREQ_TRACE:-}" ]; then
	tail -n +"$((lines + 1))" "$w/mount.log" | { grep -F 'msg="9p request"' || true; } | sed 's/^.*msg="9p request" //' >"$HOTREQ_TRACE"
	head -n "$lines" "$w/mount.log" | grep -F 'msg="9p request"' | sed 's/^.*msg="9p request" //' >"$HOTREQ_TRACE.first"
fi
python3 - "$w/s1.json" "$w/s2.json" <<'PY'
import json, sys
s1, s2 = (json.load(open(f)) for f in sys.argv[1:3])
a, b = s1.get("requests", {}), s2.get("requests", {})
d = {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0)}
for k in sorted(d):
    print(f"{k}\t{d[k]}")
print(f"total\t{sum(d.values())}")
# Requests sent behind another without waiting: the rest are round trips.
piped = s2.get("pipelined", 0) - s1.get("pipelined", 0)
print(f"pipelined\t{piped}")
print(f"round trips\t{sum(d.values()) - piped}")
# The first build, with the mount's own start.
cold, cpiped = sum(a.values()), s1.get("pipelined", 0)
print(f"first build: {cold} requests, {cold - cpiped} round trips", file=sys.stderr)
PY
