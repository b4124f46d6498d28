package objstore

// sieve is SIEVE (Zhang et al., NSDI'24): a FIFO queue with one visited bit
// per object and a hand that moves from the oldest object toward the newest.
// A hit only sets the bit, so hits take no lock-heavy list surgery; the hand
// clears bits and evicts the first unvisited object it meets. New objects
// enter at the head unvisited, so one-hit wonders leave quickly while
// objects that are read stay where they are. Memory: 8 bytes of links and
// one bit per object.
type sieve struct {
	l       list
	visited chunked[uint64]
	hand    uint32
}

func newSieve() *sieve { return &sieve{l: newList(), hand: none} }

func (s *sieve) bit(id uint32) (*uint64, uint64) {
	return s.visited.at(id >> 6), 1 << (id & 63)
}

func (s *sieve) Add(id uint32) {
	s.l.pushHead(id)
	s.visited.grow(id >> 6)
	w, m := s.bit(id)
	*w &^= m
}

func (s *sieve) Hit(id uint32) {
	w, m := s.bit(id)
	*w |= m
}

func (s *sieve) Remove(id uint32) {
	if s.hand == id {
		s.hand = s.l.at(id).newer
	}
	s.l.unlink(id)
}

func (s *sieve) Victim() (uint32, bool) {
	if s.l.tail == none {
		return 0, false
	}
	o := s.hand
	for {
		if o == none {
			o = s.l.tail
		}
		w, m := s.bit(o)
		if *w&m == 0 {
			break
		}
		*w &^= m
		o = s.l.at(o).newer
	}
	s.hand = s.l.at(o).newer
	return o, true
}

func (s *sieve) Walk(fn func(id uint32)) { s.l.walk(fn) }
