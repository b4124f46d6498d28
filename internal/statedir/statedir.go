// Package statedir is where shale keeps state that outlives a process:
// shale serve's serving markers, and the conflict copies of delayed
// writes a client could not write back.
package statedir

import (
	"fmt"
	"os"
	"path/filepath"
)

// Dir is /var/lib/shale as root, else $XDG_STATE_HOME/shale or
// ~/.local/state/shale.
func Dir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/shale"
	}
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "shale")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "shale")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("shale-state-%d", os.Geteuid()))
}
