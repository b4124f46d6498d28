package export

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shalefs/shale/p9net"
)

// Admission: bounds no client can break by connecting and saying
// nothing, or by staying connected and doing nothing.
//
// A connection is pending until its first 9P message: it must send it
// within FirstTimeout, and at most maxPending are pending at once (the
// oldest of the most numerous peer goes to make room, p9net.Pending).
// Its first message admits it to one of MaxConns sessions, at most
// MaxConnsPerPeer of one peer. When they are all taken, the idle session
// that has been so longest is closed to make room (reaped), in this
// order: sessions without fids, then those without open files, then the
// rest. A session is idle when it has had no request for Idle and none is
// being served but journal reads, which a caching client keeps waiting
// all the time. A reaped client that wants to go on redials, as after
// any lost connection: its journal and its claim to delayed writes
// outlive the connection (journal.go, sprite.go). With no idle session to
// reap, the newcomer waits for one, in turn (first come, first served),
// up to FirstTimeout (or Idle if longer), then is refused (EUSERS).

// Defaults of the admission bounds (Options).
const (
	defaultIdle = 2 * time.Second
	minPending  = 64
)

// connState is what admission knows of a connection.
type connState struct {
	peerKey  string // its peer for per-peer bounds (p9net.PeerKey)
	admitted bool   // holds a session (Server.mu)
	reaped   bool   // closed to admit another (Server.mu)

	last     atomic.Int64 // unix nanoseconds of the last request read
	inflight atomic.Int32 // requests being served
	parked   atomic.Int32 // of those, journal reads waiting for records
	handles  atomic.Int32 // open file handles
}

// peerKeyOf is the peer of rw for per-peer bounds ("" for none).
func peerKeyOf(rw io.ReadWriteCloser) string {
	if c, ok := rw.(net.Conn); ok {
		return p9net.PeerKey(c)
	}
	return ""
}

// readDeadline sets rw's read deadline if it has one.
func readDeadline(rw io.ReadWriteCloser, t time.Time) {
	if d, ok := rw.(interface{ SetReadDeadline(time.Time) error }); ok {
		d.SetReadDeadline(t)
	}
}

// admit admits c at its first message (which came at now): true if it
// now holds a session. It lifts the first message's deadline.
func (c *conn) admit() bool {
	s := c.s
	deadline := time.Now().Add(max(s.opts.Idle, s.opts.FirstTimeout))
	defer s.unwait(c)
	for {
		victim, ok := s.trySession(c)
		if ok {
			break
		}
		if victim != nil {
			s.reapOne(victim)
			continue
		}
		if !time.Now().Before(deadline) {
			s.refused.Add(1)
			s.log.Warn("9p: every session is busy; refusing a client", "max", s.opts.MaxConns, "per-peer", s.opts.MaxConnsPerPeer, "peer", c.peer.String())
			return false
		}
		t := time.NewTimer(recheck)
		select {
		case <-t.C:
		case <-c.ctx.Done(): // evicted from the pending set, or draining
			t.Stop()
			return false
		}
	}
	c.unpend()
	readDeadline(c.rw, time.Time{})
	// A drain may have stopped its reading meanwhile (drainAll).
	select {
	case <-s.drain:
		c.stopReading()
	default:
	}
	return true
}

// trySession gives c a session if one is free for it (those waiting
// longer come first); else it names the session to reap for it, if any.
func (s *Server) trySession(c *conn) (victim *conn, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.waiting[c]; !ok {
		s.tickets++
		s.waiting[c] = s.tickets
	}
	ahead := 0
	for _, t := range s.waiting {
		if t < s.waiting[c] {
			ahead++
		}
	}
	perPeer := c.peerKey != "" && s.peers[c.peerKey] >= s.opts.MaxConnsPerPeer
	if !perPeer && s.sessions+ahead < s.opts.MaxConns {
		s.sessions++
		if c.peerKey != "" {
			s.peers[c.peerKey]++
		}
		c.admitted = true
		c.last.Store(time.Now().UnixNano()) // not idle since a wait before
		return nil, true
	}
	// The peer's own idle sessions make room for it.
	if perPeer {
		return s.idlestLocked(c.peerKey), false
	}
	// Idle sessions make room for those waiting, in turn: c reaps one if
	// there are enough for those ahead of it.
	if s.idleCountLocked() > ahead+s.sessions-s.opts.MaxConns {
		return s.idlestLocked(""), false
	}
	return nil, false
}

// unwait ends c's wait for a session.
func (s *Server) unwait(c *conn) {
	s.mu.Lock()
	delete(s.waiting, c)
	s.mu.Unlock()
}

// isIdle tells whether c, a session, may be reaped now: quiet for Idle,
// or for a tenth of it if it holds nothing a reconnection would lose or
// redo (no journal, no open file, no fid but an attach's), as a flood of
// sessions that attach and wait does.
func (s *Server) isIdle(c *conn, now int64) bool {
	if c.inflight.Load() != c.parked.Load() {
		return false
	}
	quiet := now - c.last.Load()
	if quiet >= s.opts.Idle.Nanoseconds() {
		return true
	}
	if quiet < s.opts.Idle.Nanoseconds()/10 || c.journal.Load() != nil || c.handles.Load() > 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fids) <= 1
}

// idleCountLocked is how many sessions are idle.
func (s *Server) idleCountLocked() int {
	now, n := time.Now().UnixNano(), 0
	for c := range s.conns {
		if c.admitted && s.isIdle(c, now) {
			n++
		}
	}
	return n
}

// idlestLocked is the session to reap first (of peer, unless ""), or nil
// if none is idle.
func (s *Server) idlestLocked(peer string) *conn {
	now := time.Now().UnixNano()
	var best *conn
	bestRank, bestLast := 0, int64(0)
	for c := range s.conns {
		if !c.admitted || peer != "" && c.peerKey != peer || !s.isIdle(c, now) {
			continue
		}
		last := c.last.Load()
		c.mu.Lock()
		rank := 0
		switch {
		case c.handles.Load() > 0:
			rank = 2
		case len(c.fids) > 0:
			rank = 1
		}
		c.mu.Unlock()
		if best == nil || rank < bestRank || rank == bestRank && last < bestLast {
			best, bestRank, bestLast = c, rank, last
		}
	}
	return best
}

// reapOne closes v, an idle session, to make room: its session is free at
// once, before its requests end and its fids are released.
func (s *Server) reapOne(v *conn) {
	s.mu.Lock()
	if !v.admitted {
		s.mu.Unlock()
		return // ended, or reaped by another meanwhile
	}
	s.releaseSessionLocked(v)
	v.reaped = true
	s.mu.Unlock()
	s.reaped.Add(1)
	s.log.Info("9p: closing an idle connection to admit another", "idle", time.Since(time.Unix(0, v.last.Load())).Round(time.Millisecond), "peer", v.peer.String(), "conn", v.id)
	v.stop()
	go v.rw.Close() // a TLS close may write: not under anyone's wait
}

// releaseSessionLocked frees c's session.
func (s *Server) releaseSessionLocked(c *conn) {
	if !c.admitted {
		return
	}
	c.admitted = false
	s.sessions--
	if c.peerKey != "" {
		if s.peers[c.peerKey]--; s.peers[c.peerKey] <= 0 {
			delete(s.peers, c.peerKey)
		}
	}
}

// refuse answers a first message that was not admitted.
func (c *conn) refuse(tag uint16) { c.send(nil, tag, rerror(tag, syscall.EUSERS)) }
