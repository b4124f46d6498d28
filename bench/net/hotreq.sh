#!/usr/bin/env bash
# Counts the 9P requests of a hot Go build on a caching 9P mount, by type
# (shale stats, no timing: the machine may be busy): shale serve [FLAGS]
# of a copy of the tomlv module, shale mount of it, `go build` twice; the
# requests of the second build.
#
#   bench/net/hotreq.sh [SERVE FLAGS...]      e.g. --delegate
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
(cd "$w/lower/build" && go build -o /dev/null ./cmd/tomlv) # the standard library, compiled
"$shale" serve "$@" --no-root-squash --listen "tcp:127.0.0.1:$port" "$w/lower" >"$w/serve.log" 2>&1 &
spid=$!
trap cleanup EXIT
for _ in $(seq 100); do "$shale" mount "9p://127.0.0.1:$port/" "$w/mnt" 2>/dev/null && break; sleep 0.1; done
(cd "$w/mnt/build" && go build -o tomlv ./cmd/tomlv)
"$shale" stats --json "$w/mnt" >"$w/s1.json"
(cd "$w/mnt/build" && go build -o tomlv ./cmd/tomlv)
"$shale" stats --json "$w/mnt" >"$w/s2.json"
python3 - "$w/s1.json" "$w/s2.json" <<'PY'
import json, sys
a, b = (json.load(open(f)).get("requests", {}) for f in sys.argv[1:3])
d = {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0)}
for k in sorted(d):
    print(f"{k}\t{d[k]}")
print(f"total\t{sum(d.values())}")
PY
