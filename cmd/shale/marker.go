package main

// The serving marker of shale serve: a file kept while a server serves,
// removed when it ends cleanly. Found at start, it says the previous
// server of the same address and LOWER ended without a clean stop (a
// crash, kill -9, a power cut): its clients may hold delayed writes the
// new server knows nothing of, so opens wait --grace for them to reclaim.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/statedir"
)

// markerPath is the marker of a server listening on listen (as
// p9net.Addr.String gives it) serving what (an absolute LOWER, a 9p://
// URL or an absolute stack file).
func markerPath(listen, what string) string { return stateFile("serving-", listen, what) }

// stateFile is the file of the state dir named prefix and a hash of
// listen and what.
func stateFile(prefix, listen, what string) string {
	h := sha256.Sum256([]byte(listen + "\x00" + what))
	return filepath.Join(statedir.Dir(), prefix+hex.EncodeToString(h[:8]))
}

// marker is a serving marker made by openMarker.
type marker struct {
	path    string
	f       *os.File // locked while this process serves
	existed bool     // it was there before: the last server did not end cleanly
}

// openMarker takes the marker of listen and what: it tells whether it was
// there (an unclean end), and fails if another live server holds it.
// A marker that cannot be made is no reason not to serve: err is then
// nil and m has no file (warn tells why).
func openMarker(listen, what string) (m *marker, warn, err error) {
	m = &marker{path: markerPath(listen, what)}
	if err := os.MkdirAll(filepath.Dir(m.path), 0o755); err != nil {
		return m, err, nil
	}
	_, statErr := os.Lstat(m.path)
	m.existed = statErr == nil
	f, err := os.OpenFile(m.path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return m, err, nil
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(m.path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			pid := strings.Fields(string(b))
			who := "another shale serve"
			if len(pid) > 0 {
				who += " (pid " + pid[0] + ")"
			}
			return nil, nil, fmt.Errorf("%s serves %s on %s already (it holds %s): stop it first", who, what, listen, m.path)
		}
		return m, err, nil
	}
	f.Truncate(0)
	f.WriteString(strconv.Itoa(os.Getpid()) + " " + listen + " " + what + "\n")
	m.f = f
	return m, nil, nil
}

// done ends the marker, removing it if remove: at a clean end, or when
// nothing was served and the marker was not there before (what it told
// of is still to be recovered from).
func (m *marker) done(remove bool) {
	if m == nil || m.f == nil {
		return
	}
	if remove {
		os.Remove(m.path)
	}
	m.f.Close() // and the lock with it
	m.f = nil
}

// rightsPath is where a server of listen and what keeps its clients'
// rights to reclaim delayed writes (export.Options.RightsFile): beside
// its marker, and kept across clean ends too.
func rightsPath(listen, what string) string { return stateFile("rights-", listen, what) }
