package writeback

import "sync"

// pathLocks are mutexes by QID path, each made when first wanted and
// dropped once no one holds or waits for it. Taken alone: its own mu
// only guards the map.
type pathLocks struct {
	mu sync.Mutex
	m  map[uint64]*pathLock
}

type pathLock struct {
	mu sync.Mutex
	n  int // holders and waiters, under pathLocks.mu
}

// lock holds path's mutex until the returned function runs.
func (p *pathLocks) lock(path uint64) func() {
	p.mu.Lock()
	if p.m == nil {
		p.m = map[uint64]*pathLock{}
	}
	l := p.m[path]
	if l == nil {
		l = &pathLock{}
		p.m[path] = l
	}
	l.n++
	p.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		p.mu.Lock()
		if l.n--; l.n == 0 {
			delete(p.m, path)
		}
		p.mu.Unlock()
	}
}
