package main

import (
	"log/slog"
	"strings"

	"github.com/coreos/go-systemd/v22/daemon"
)

// notify tells systemd how a unit of Type=notify fares (sd_notify): each
// of state is one line, such as READY=1. Without $NOTIFY_SOCKET, when
// systemd did not start us so, it does nothing.
func notify(logger *slog.Logger, state ...string) {
	if _, err := daemon.SdNotify(false, strings.Join(state, "\n")); err != nil {
		logger.Warn("telling systemd how the mount fares", "state", state, "err", err)
	}
}

// servingStatus is the STATUS= line systemctl status shows for p.
func servingStatus(p *plan) string {
	var mnts []string
	for _, v := range p.spec.Views {
		mnts = append(mnts, v.Mountpoint)
	}
	return "STATUS=serving " + p.spec.Lower + " at " + strings.Join(mnts, ", ")
}
