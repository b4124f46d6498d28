package objstore

// lru is least-recently-used replacement, kept as the baseline the default
// policy is measured against.
type lru struct{ l list }

func newLRU() *lru { return &lru{l: newList()} }

func (p *lru) Add(id uint32) { p.l.pushHead(id) }

func (p *lru) Hit(id uint32) {
	p.l.unlink(id)
	p.l.pushHead(id)
}

func (p *lru) Remove(id uint32) { p.l.unlink(id) }

func (p *lru) Victim() (uint32, bool) { return p.l.tail, p.l.tail != none }

func (p *lru) Walk(fn func(id uint32)) { p.l.walk(fn) }
