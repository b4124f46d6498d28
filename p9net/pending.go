package p9net

import (
	"crypto/tls"
	"net"
	"sync"
)

// Pending bounds the connections a server has accepted but not yet
// admitted: those in their TLS handshake, or that have not sent their
// first 9P message. A full set makes room for a newcomer by closing the
// oldest connection of the peer that holds the most, rather than turning
// the newcomer away: connections that never speak would otherwise lock
// out every client that would (each also has a deadline, which alone
// does not help while more keep coming).
type Pending struct {
	max int

	mu     sync.Mutex
	seq    uint64
	n      int
	byPeer map[string][]*pendingEntry // oldest first
}

type pendingEntry struct {
	peer  string
	seq   uint64
	close func()
}

// NewPending is a set of at most max pending connections.
func NewPending(max int) *Pending {
	return &Pending{max: max, byPeer: map[string][]*pendingEntry{}}
}

// Add counts a pending connection of peer, which close ends, and returns
// the function that takes it out (once admitted, or ended): idempotent.
// If the set was full, the oldest of the most numerous peer's is taken out
// and closed first.
func (p *Pending) Add(peer string, close func()) (done func()) {
	e := &pendingEntry{peer: peer, close: close}
	p.mu.Lock()
	var victim *pendingEntry
	if p.n >= p.max {
		victim = p.victimLocked()
		p.removeLocked(victim)
	}
	p.seq++
	e.seq = p.seq
	p.byPeer[peer] = append(p.byPeer[peer], e)
	p.n++
	p.mu.Unlock()
	if victim != nil {
		victim.close()
	}
	return func() {
		p.mu.Lock()
		p.removeLocked(e)
		p.mu.Unlock()
	}
}

// victimLocked is the oldest entry of the peer with the most entries
// (of those, the one whose oldest is oldest).
func (p *Pending) victimLocked() *pendingEntry {
	var v *pendingEntry
	most := 0
	for _, es := range p.byPeer {
		if len(es) > most || len(es) == most && es[0].seq < v.seq {
			v, most = es[0], len(es)
		}
	}
	return v
}

func (p *Pending) removeLocked(e *pendingEntry) {
	if e == nil {
		return
	}
	es := p.byPeer[e.peer]
	for i, x := range es {
		if x == e {
			es = append(es[:i:i], es[i+1:]...)
			p.n--
			if len(es) == 0 {
				delete(p.byPeer, e.peer)
			} else {
				p.byPeer[e.peer] = es
			}
			return
		}
	}
}

// Len is how many connections are pending.
func (p *Pending) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// PeerKey names who is at the other end of c, for per-peer bounds: a
// user of this machine by uid (a unix socket's, from the kernel; a
// loopback TCP one's, as a keyless Listen tells it, PeerOf), another
// machine by IP address. "" is a peer not told apart from others, which
// per-peer bounds exempt: a loopback TCP peer of a keyed listener (its
// key says what it may do, not which local user it is), or one whose uid
// is not known yet (its TLS handshake under way).
func PeerKey(c net.Conn) string {
	if p, ok := PeerOf(c); ok && p.Known && p.Principal == uidPrincipal(p.UID) {
		return p.Principal
	}
	if ic, ok := c.(*identConn); ok {
		c = ic.Conn
	}
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		if !a.IP.IsLoopback() {
			return a.IP.String()
		}
	case *net.UnixAddr:
		if uc, ok := c.(*net.UnixConn); ok {
			if uid, err := unixPeerUID(uc); err == nil {
				return uidPrincipal(uid)
			}
		}
	}
	return ""
}
