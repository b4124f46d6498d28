#!/usr/bin/env bash
# Installs what shale needs on a fresh Debian machine and builds bin/shale.
# Idempotent: packages already present are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

# fuse3: fusermount3 for unprivileged users; fio, stress-ng: stress tests and
# benchmarks; bindfs, gocryptfs: benchmark peers; libfuse3-dev, gcc,
# pkgconf: libfuse's passthrough_ll example, a peer built from the source
# that package ships; attr: getfattr/setfattr;
# sqlite3: two WAL writers in two views (test/coherence); diod: a 9P server
# and independent 9P clients (diodls, diodcat, diodload) for test/net;
# zstd: compress's known-answer check and the stored-size benchmark's floor.
pkgs=(fuse3 fio stress-ng bindfs gocryptfs libfuse3-dev gcc pkgconf attr sqlite3 diod zstd)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ -e /dev/fuse ] || { modprobe fuse 2>/dev/null || true; }

# CGO off: a static binary, and the credential switching of hostfs acts on
# single threads, which cgo's thread handling does not disturb.
CGO_ENABLED=0 go build -o bin/shale ./cmd/shale
