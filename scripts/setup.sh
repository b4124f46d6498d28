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
# zstd: compress's known-answer check and the stored-size benchmark's floor;
# etcd-server, etcd-client, curl: the metadata engine of volumes and its
# etcdctl, for scripts/engines.sh (docs/volume.md); rclone, s3fs: the
# volume's benchmark peers over the same S3 server (bench/volume/run.sh).
pkgs=(fuse3 fio stress-ng bindfs gocryptfs libfuse3-dev gcc pkgconf attr sqlite3 diod zstd etcd-server etcd-client curl rclone s3fs)
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

# pjdfstest, the Rust port of the POSIX file system test suite (BSD-2), for
# test/conformance TestPjdfstest (docs/pjdfstest.md). It needs Rust 1.85 or
# later: rustup's cargo; Debian 12's cargo 0.66 (rustc 1.63) cannot build it.
pjd=0.2.2
if ! { pjdfstest --version || "$HOME/.cargo/bin/pjdfstest" --version; } 2>/dev/null | grep -qx "pjdfstest $pjd"; then
	command -v cargo >/dev/null || PATH=$HOME/.cargo/bin:$PATH
	command -v cargo >/dev/null || { echo "setup: pjdfstest $pjd needs cargo with Rust 1.85 or later (rustup) to build: install it, then run $0 again" >&2; exit 1; }
	cargo install --quiet --locked pjdfstest --version "$pjd"
fi

# versitygw, a real S3 server over a local directory, for volumes' block
# stores in tests (scripts/engines.sh). Debian's etcd-server package enables
# a service; the engines script runs its own members instead.
vgw=v1.8.0
if ! [ -x "$HOME/go/bin/versitygw" ]; then
	go install "github.com/versity/versitygw/cmd/versitygw@$vgw"
fi
systemctl disable --now etcd >/dev/null 2>&1 || true

# CGO off: a static binary, and the credential switching of hostfs acts on
# single threads, which cgo's thread handling does not disturb.
CGO_ENABLED=0 go build -o bin/shale ./cmd/shale
