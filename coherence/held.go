package coherence

import (
	"slices"
	"sync"

	"github.com/shalefs/shale/layer"
)

// Held is the bookkeeping of a holder, whatever its frontend: what it
// caches of each file, by token, and the files its own requests are at
// work on. I is the frontend's handle of a cached file (a FUSE inode, a
// 9P fid). The zero value is ready.
type Held[I comparable] struct {
	mu       sync.Mutex
	byToken  map[layer.Token][]I
	inflight map[layer.Token]int
	reading  map[layer.Token][]chan struct{}
	// missed: the changes that found no handle of their file (Missed),
	// by token, numbered by misses; floor: numbers below it forgotten.
	missed        map[layer.Token]uint64
	misses, floor uint64
}

// maxMissed bounds Held.missed: past it the record starts afresh.
const maxMissed = 4096

// Add records i under tok. A token may have several handles for a moment
// (hard links, racing lookups); stale tells which of them the frontend no
// longer holds, so they are dropped.
func (h *Held[I]) Add(tok layer.Token, i I, stale func(I) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byToken == nil {
		h.byToken = map[layer.Token][]I{}
	}
	is := h.byToken[tok][:0:0]
	for _, o := range h.byToken[tok] {
		if !stale(o) {
			is = append(is, o)
		}
	}
	h.byToken[tok] = append(is, i)
}

// Remove forgets i under tok.
func (h *Held[I]) Remove(tok layer.Token, i I) {
	h.mu.Lock()
	defer h.mu.Unlock()
	removeFrom(h.byToken, tok, i)
}

// removeFrom takes x out of m[k], and k out of m once nothing is left.
func removeFrom[T comparable](m map[layer.Token][]T, k layer.Token, x T) {
	s := m[k]
	if i := slices.Index(s, x); i >= 0 {
		s = slices.Delete(s, i, i+1)
	}
	if len(s) == 0 {
		delete(m, k)
	} else {
		m[k] = s
	}
}

// Of returns the handles held under tok.
func (h *Held[I]) Of(tok layer.Token) []I {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]I(nil), h.byToken[tok]...)
}

// All returns every handle held.
func (h *Held[I]) All() []I {
	h.mu.Lock()
	defer h.mu.Unlock()
	var all []I
	for _, is := range h.byToken {
		all = append(all, is...)
	}
	return all
}

// Busy marks a request of this holder at work on tok until the returned
// function runs. While it is, the frontend's client (the kernel) may hold
// locks of tok (its pages during a WRITE, a directory's lock during a
// create) until the reply, so an invalidation of tok must not be waited
// for: if that request is itself waiting to invalidate another holder
// whose client holds locks our requester waits on, neither could go on.
func (h *Held[I]) Busy(tok layer.Token) func() {
	h.mu.Lock()
	if h.inflight == nil {
		h.inflight = map[layer.Token]int{}
	}
	h.inflight[tok]++
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		if h.inflight[tok]--; h.inflight[tok] == 0 {
			delete(h.inflight, tok)
		}
		h.mu.Unlock()
	}
}

// IsBusy tells whether a request is at work on tok (Busy).
func (h *Held[I]) IsBusy(tok layer.Token) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inflight[tok] > 0
}

// Reading marks a read of this holder's client in flight on tok until
// the returned function runs (WaitReads).
func (h *Held[I]) Reading(tok layer.Token) func() {
	done := make(chan struct{})
	h.mu.Lock()
	if h.reading == nil {
		h.reading = map[layer.Token][]chan struct{}{}
	}
	h.reading[tok] = append(h.reading[tok], done)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		removeFrom(h.reading, tok, done)
		h.mu.Unlock()
		close(done)
	}
}

// WaitReads returns once the reads in flight on tok when it was called
// have ended; later ones do not hold it up.
func (h *Held[I]) WaitReads(tok layer.Token) {
	h.mu.Lock()
	rs := append([]chan struct{}(nil), h.reading[tok]...)
	h.mu.Unlock()
	for _, r := range rs {
		<-r
	}
}

// Missed records a change of tok that found no handle of it: a request
// of the frontend may be making one (a lookup in flight), which must not
// keep what it found before the change (Changed).
func (h *Held[I]) Missed(tok layer.Token) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.missed) >= maxMissed {
		h.missed, h.floor = nil, h.misses+1
	}
	if h.missed == nil {
		h.missed = map[layer.Token]uint64{}
	}
	h.misses++
	h.missed[tok] = h.misses
}

// Mark is where the misses stand, for Changed.
func (h *Held[I]) Mark() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.misses
}

// Changed tells whether a change of tok found no handle after mark (or
// may have: one forgotten since).
func (h *Held[I]) Changed(tok layer.Token, mark uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return mark < h.floor || h.missed[tok] > mark
}
