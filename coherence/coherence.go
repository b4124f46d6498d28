// Package coherence keeps every cache of a stack coherent: one Manager per
// stack hears every change the stack's bottom makes or notices (its
// layer.Events) and calls back each registered holder (a FUSE view: the
// kernel's page, attribute and name caches) to drop what it holds, before
// the request that made the change returns. The view that made a change is
// skipped: the kernel already updated its caches from the reply.
//
// This is the UCLA design cut to what shale's layers cache today: only the
// kernels hold caches, every layer shares the token of the file beneath
// it, and layers that change names translate the names of events across
// themselves (layer.NameTranslator). See docs/coherence.md.
package coherence

import (
	"sync"

	"github.com/shalefs/shale/layer"
)

// A Holder caches something of the stack's files and drops it on demand.
type Holder interface {
	Invalidate(ev layer.Event)
}

// Manager dispatches a stack's events to its holders.
type Manager struct {
	mu      sync.RWMutex
	holders map[uint32]Holder
	next    uint32
	off     bool
}

// New makes the manager of the stack whose bottom raises events on src.
// With off set it registers holders but never calls them back (for tests
// and benchmarks that show what coherence costs and buys).
func New(src *layer.Events, off bool) *Manager {
	m := &Manager{holders: map[uint32]Holder{}, off: off}
	src.Subscribe(m.dispatch)
	return m
}

// Register adds a holder and returns its view number, which the holder's
// requests carry in layer.Caller.View.
func (m *Manager) Register(h Holder) uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	m.holders[m.next] = h
	return m.next
}

// Unregister removes the holder of view v.
func (m *Manager) Unregister(v uint32) {
	m.mu.Lock()
	delete(m.holders, v)
	m.mu.Unlock()
}

func (m *Manager) dispatch(ev layer.Event) {
	if m.off {
		return
	}
	m.mu.RLock()
	hs := make([]Holder, 0, len(m.holders))
	for v, h := range m.holders {
		if v != ev.View {
			hs = append(hs, h)
		}
	}
	m.mu.RUnlock()
	for _, h := range hs {
		h.Invalidate(ev)
	}
}
