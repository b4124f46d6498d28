package p9net

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
)

// listenUnix listens on the unix socket a with lc's mode and group from
// the start: it is made in a directory of its own, private to this
// process, given its mode and group there, and then moved into place, so
// that no one connects to it in between. A socket left by a dead server
// is replaced; one a live server answers on is not.
func (lc ListenConfig) listenUnix(a Addr) (net.Listener, error) {
	dir := filepath.Dir(a.Address)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("listen on %s: %v", a, err)
	}
	if c, err := net.Dial("unix", a.Address); err == nil {
		c.Close()
		return nil, fmt.Errorf("listen on %s: a server already answers there: stop it or choose another path", a)
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		os.Remove(a.Address)
	}
	tmp, err := os.MkdirTemp(dir, ".shale-listen-")
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %v", a, err)
	}
	defer os.Remove(tmp)
	p := filepath.Join(tmp, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %v", a, err)
	}
	// Its name moves: the server removes it at its end (shale serve).
	l.SetUnlinkOnClose(false)
	mode := lc.SocketMode
	if mode == 0 {
		mode = 0o660
	}
	err = os.Chmod(p, mode.Perm())
	if err == nil && lc.SocketGID > 0 {
		err = os.Lchown(p, -1, lc.SocketGID)
	}
	if err == nil {
		err = os.Rename(p, a.Address)
	}
	if err != nil {
		l.Close()
		os.Remove(p)
		return nil, fmt.Errorf("listen on %s: %v", a, err)
	}
	return l, nil
}
