package export

// Root squash, explained where it bites: a client's root acts as nobody
// here (unless NoRootSquash), so its writes fail with EACCES where nobody
// may not write, and the client's program sees only that. A refused
// request of a squashed root is logged once per client, naming it and
// the flag that lets root act as root, and counted (squash.refused in
// the stats file).

import (
	"encoding/binary"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/shalefs/shale/p9wire"
)

// squashLog counts the refusals and remembers the clients told of.
type squashLog struct {
	refused atomic.Uint64
	mu      sync.Mutex
	told    map[string]bool // by client, its port left out
}

// maxToldClients bounds squashLog.told: past it, refusals are counted
// but no longer logged.
const maxToldClients = 4096

// port is a TCP address's port, left out of a client's name: each
// connection of a client has another.
var port = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+|\[[0-9a-fA-F:.%\w]*\]):\d+`)

// refusedSquashed is told of a request refused with e (EACCES or EPERM);
// body is the request's, whose first field is the fid it acts on for
// every request that acts for a user. It logs once per client if the
// fid's user is a squashed root.
func (c *conn) refusedSquashed(typ uint8, body []byte, e syscall.Errno) {
	if c.s.opts.NoRootSquash || len(body) < 4 || typ == p9wire.Tattach {
		return
	}
	f, fe := c.fid(binary.LittleEndian.Uint32(body))
	if fe != 0 || !f.who.Squashed {
		return
	}
	sl := &c.s.squashed
	sl.refused.Add(1)
	client := port.ReplaceAllString(c.peer.String(), "$1")
	sl.mu.Lock()
	first := !sl.told[client] && len(sl.told) < maxToldClients
	if first {
		if sl.told == nil {
			sl.told = map[string]bool{}
		}
		sl.told[client] = true
	}
	sl.mu.Unlock()
	if first {
		c.s.log.Warn("9p: refused a request of a client's root, which acts as nobody (65534) here (root squash): serve with --no-root-squash to let it act as root, or give nobody the rights it needs",
			"client", c.peer.String(), "request", typeName(typ), "err", e.Error())
	}
}

// typeName is a request type's name as the stats file gives it.
func typeName(typ uint8) string {
	for _, t := range typeNames {
		if t.typ == typ {
			return t.name
		}
	}
	return "type " + strconv.Itoa(int(typ))
}
