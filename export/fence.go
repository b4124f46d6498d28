package export

import "time"

// Fencing. A client that opens its journal on a new connection has given
// up its old ones (they timed out, or broke on its side). Requests of
// theirs the server has not read yet (a stalled link or a busy server
// holds them) or is still running must not land after what the client
// does next on the new one: an O_TRUNC open it sent again there, then
// wrote after, would be cut by the old copy landing late, and an old
// write-back's Twrite would put older bytes over newer. So the old
// connections are closed, what they have not read is never served, and
// the journal's open is answered once they have ended (within drainTime).

// fence ends the connections other than c that opened j.
func (s *Server) fence(c *conn, j *jrnl) {
	s.mu.Lock()
	var old []*conn
	for o := range s.conns {
		if o != c && o.journal.Load() == j {
			old = append(old, o)
		}
	}
	s.mu.Unlock()
	if len(old) == 0 {
		return
	}
	for _, o := range old {
		o.fenced.Store(true)
		o.rw.Close()
		o.stop()
	}
	t := time.NewTimer(drainTime)
	defer t.Stop()
	for _, o := range old {
		select {
		case <-o.ended:
		case <-t.C:
			s.log.Warn("9p: a connection its client gave up still has requests running: they may land after the client's next", "client", j.name)
			return
		}
	}
	s.fences.Add(uint64(len(old)))
}
