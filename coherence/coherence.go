// Package coherence keeps every cache of a stack coherent: one Manager per
// stack hears every change the stack's bottom makes or notices (its
// layer.Events) and calls back each registered holder (a FUSE view: the
// kernel's page, attribute and name caches) to drop what it holds, before
// the request that made the change returns. The view that made a change is
// skipped: the kernel already updated its caches from the reply.
//
// This is the UCLA design cut to what shale's layers cache today: only the
// kernels hold caches, every layer shares the token of the file beneath
// it, a layer whose objects are not one to one with those beneath
// translates events across itself (layer.EventTranslator: shard's
// buckets), and layers that change names translate the names of events
// (layer.NameTranslator). See docs/coherence.md.
package coherence

import (
	"context"
	"sync"

	"github.com/shalefs/shale/layer"
)

// A Holder caches something of the stack's files and drops it on demand.
type Holder interface {
	Invalidate(ev layer.Event)
}

// An Opener is a Holder that acts before a file is opened through another
// view: the 9P export, whose clients may hold delayed writes of it (Sprite's
// recall, package export).
type Opener interface {
	Opening(ctx context.Context, tok layer.Token, write bool)
}

// Manager dispatches a stack's events to its holders.
type Manager struct {
	mu      sync.RWMutex
	holders map[uint32]holder
	next    uint32
	off     bool
	ctr     counters // stats.go
}

// holder is a registered Holder and the node it holds the stack at.
type holder struct {
	h  Holder
	at layer.Node
}

// New makes the manager of the stack whose bottom raises events on src.
// With off set it registers holders but never calls them back (for tests
// and benchmarks that show what coherence costs and buys).
func New(src *layer.Events, off bool) *Manager {
	m := &Manager{holders: map[uint32]holder{}, off: off}
	src.Subscribe(m.dispatch)
	return m
}

// Register adds a holder of the files beneath node at (a view's root) and
// returns its view number, which the holder's requests carry in
// layer.Caller.View. The holder is given events as at's layer translates
// them (layer.Translate).
func (m *Manager) Register(h Holder, at layer.Node) uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	m.holders[m.next] = holder{h, at}
	return m.next
}

// Unregister removes the holder of view v.
func (m *Manager) Unregister(v uint32) {
	m.mu.Lock()
	delete(m.holders, v)
	m.mu.Unlock()
}

// Open tells the Openers other than view v that v opens tok, and returns
// once they have acted (bounded by their own timeouts).
func (m *Manager) Open(ctx context.Context, v uint32, tok layer.Token, write bool) {
	if m == nil || m.off {
		return
	}
	m.mu.RLock()
	var openers []Opener
	for id, h := range m.holders {
		if o, ok := h.h.(Opener); ok && id != v {
			openers = append(openers, o)
		}
	}
	m.mu.RUnlock()
	for _, o := range openers {
		o.Opening(ctx, tok, write)
	}
}

func (m *Manager) dispatch(ev layer.Event) {
	m.ctr.count(ev)
	if m.off {
		return
	}
	m.mu.RLock()
	hs := make([]holder, 0, len(m.holders))
	for v, h := range m.holders {
		if v != ev.View {
			hs = append(hs, h)
		}
	}
	m.mu.RUnlock()
	// Holders at one node share its translation.
	translated := map[layer.Node][]layer.Event{}
	for _, h := range hs {
		evs, ok := translated[h.at]
		if !ok {
			evs = layer.Translate(h.at, ev)
			translated[h.at] = evs
		}
		for _, e := range evs {
			h.h.Invalidate(e)
		}
		m.ctr.callbacks.Add(uint64(len(evs)))
	}
}
