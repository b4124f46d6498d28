#!/usr/bin/env bash
# Installs shale where a distribution would, or removes it again:
#
#   scripts/install.sh [install]     # build, then install
#   scripts/install.sh uninstall     # remove what install put
#
# PREFIX (default /usr/local) and DESTDIR (default none, for packaging)
# say where:
#   $PREFIX/bin/shale                     the command; for type fuse.shale
#                                         mount(8) finds it through mount.fuse3
#   /sbin/mount.shale                     a link to it, which mount(8) runs
#                                         for type shale (mount -t shale)
#   $PREFIX/share/man/man1/shale*.1       manual pages, from the commands' help
#   $PREFIX/lib/systemd/system/shale@.service, shale-serve@.service
#                                         the units of /etc/shale/NAME.toml:
#                                         its views mounted, or its exports served
#   /etc/shale/                           for stack files and passfiles, mode 700
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
bin=$DESTDIR$PREFIX/bin
man=$DESTDIR$PREFIX/share/man/man1
unit=$DESTDIR$PREFIX/lib/systemd/system
helper=$DESTDIR/sbin/mount.shale

case "${1:-install}" in
install)
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# As scripts/setup.sh builds it (static, without cgo), but apart:
	# tests may be running bin/shale.
	CGO_ENABLED=0 go build -buildvcs=auto -o "$tmp/shale" ./cmd/shale
	install -d "$bin" "$man" "$unit" "$(dirname "$helper")"
	install -m 755 "$tmp/shale" "$bin/shale"
	mkdir "$tmp/man"
	"$tmp/shale" man "$tmp/man"
	install -m 644 "$tmp"/man/*.1 "$man/"
	for u in shale@.service shale-serve@.service; do
		sed "s|@BINDIR@|$PREFIX/bin|g" "scripts/$u" >"$tmp/$u"
		install -m 644 "$tmp/$u" "$unit/$u"
	done
	ln -sfn "$PREFIX/bin/shale" "$helper"
	install -d -m 700 "$DESTDIR/etc/shale"
	if [ -z "$DESTDIR" ]; then
		command -v mandb >/dev/null && mandb -q 2>/dev/null || true
		[ -d /run/systemd/system ] && systemctl daemon-reload || true
	fi
	echo "installed shale in $bin, its manual pages in $man, shale@.service and shale-serve@.service in $unit"
	;;
uninstall)
	rm -f "$bin/shale" "$man"/shale.1 "$man"/shale-*.1 "$unit/shale@.service" "$unit/shale-serve@.service" "$helper"
	# /etc/shale stays: it holds the administrator's stack files and keys.
	rmdir "$DESTDIR/etc/shale" 2>/dev/null || true
	if [ -z "$DESTDIR" ]; then
		[ -d /run/systemd/system ] && systemctl daemon-reload || true
	fi
	echo "removed shale from $bin, $man and $unit"
	;;
*)
	echo "usage: $0 [install|uninstall]" >&2
	exit 2
	;;
esac
