package layer

import (
	"context"
	"sync"
)

// An Event says that something about a file changed: what caches holding
// it must drop. Backends raise them for changes they make and for changes
// they notice beneath them; the coherence manager passes them on.
type Event struct {
	Kind  EventKind
	Token Token // the file that changed; for Entries, the directory
	// Name is, for Entries, the entry that changed, in the form the node
	// of directory Token understands (NameTranslator): at the bottom of
	// the stack, its name there. A layer that shows several lower
	// directories as one (shard's buckets) puts the one it was in first,
	// "bucket/name": '/' is in no name, so the form cannot be mistaken.
	Name string
	// Off and Len bound a Data change; Len 0 means the whole file. They
	// are offsets of the raiser's file; layers that reshape files widen
	// the range to the whole file.
	Off, Len int64
	// View is the view whose request made the change (Caller.View), 0 for
	// changes made beside the stack. That view's kernel already knows.
	View uint32
}

// EventKind says what changed.
type EventKind uint8

const (
	Attrs      EventKind = iota // attributes (mode, owner, times, links, xattrs)
	Data                        // contents, and so size and times
	Entries                     // a name in a directory was added, removed or replaced
	Everything                  // unknown changes anywhere (events were lost): drop all
)

// Events fans events out to subscribers. The zero value is ready.
type Events struct {
	mu    sync.RWMutex
	subs  []func(Event)
	syncs []func() // OnSync
}

// Subscribe registers fn for every later event. fn runs on the raiser's
// goroutine, holding none of its locks, and must not block for long.
func (s *Events) Subscribe(fn func(Event)) {
	s.mu.Lock()
	s.subs = append(s.subs, fn)
	s.mu.Unlock()
}

// Active reports whether anyone listens, so raisers may skip work.
func (s *Events) Active() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.subs) > 0
}

// Raise delivers ev to every subscriber.
func (s *Events) Raise(ev Event) {
	s.mu.RLock()
	subs := s.subs
	s.mu.RUnlock()
	for _, fn := range subs {
		fn(ev)
	}
}

// NameTranslator is implemented by nodes of layers that change names: for
// a directory, it maps the Name of an Entries event about it (see Event)
// to this layer's name, or ok=false if it has none (the layer's own
// files). A node that is not one keeps the name.
type NameTranslator interface {
	UpperName(ctx context.Context, lowerName string) (name string, ok bool)
}

// EventTranslator is implemented by the nodes of layers (a view's root is
// asked): Translate gives what an event raised at the bottom of the stack
// means in this layer, after the layers beneath have translated it. Every
// layer of shale keeps the tokens of the layer beneath (docs/coherence.md
// says why), so a layer has work here only where its objects are not one
// to one with those beneath: shard moves its buckets' events onto their
// managed directory and drops those that only its buckets see. The result
// may hold any number of events.
//
// Translate runs on the raiser's goroutine, which may hold any layer's
// locks: it must not take one that a layer holds while it calls the
// layers beneath it.
type EventTranslator interface {
	Translate(ev Event) []Event
}

// Translate gives the events ev means at node n's layer.
func Translate(n Node, ev Event) []Event {
	if t, ok := n.(EventTranslator); ok {
		return t.Translate(ev)
	}
	return []Event{ev}
}

// Translate: a layer built on PassThrough shows each lower object as one of
// its own, under the same token, so its events are those beneath; a layer
// that folds objects together overrides it.
func (p *PassThrough) Translate(ev Event) []Event { return Translate(p.Lower, ev) }

// Deferred holds the events raised while a request holds a lock that a
// kernel request may wait on: delivering them then could deadlock (an
// invalidation waits for a page that a reader holds, while the reader
// waits for our lock). Whoever takes such a lock defers, and flushes after
// releasing it.
type Deferred struct {
	mu  sync.Mutex
	evs []deferred
}

type deferred struct {
	to *Events
	ev Event
}

type deferredKey struct{}

// Defer returns ctx, with a Deferred that collects its events if ctx has
// none yet; flush delivers them (a no-op for an inherited one).
func Defer(ctx context.Context) (context.Context, func()) {
	if ctx.Value(deferredKey{}) != nil {
		return ctx, func() {}
	}
	d := &Deferred{}
	return context.WithValue(ctx, deferredKey{}, d), d.flush
}

func (d *Deferred) flush() {
	d.mu.Lock()
	evs := d.evs
	d.evs = nil
	d.mu.Unlock()
	for _, e := range evs {
		e.to.Raise(e.ev)
	}
}

// RaiseIn delivers ev now, or when ctx's Deferred is flushed.
func (s *Events) RaiseIn(ctx context.Context, ev Event) {
	if d, ok := ctx.Value(deferredKey{}).(*Deferred); ok {
		d.mu.Lock()
		d.evs = append(d.evs, deferred{s, ev})
		d.mu.Unlock()
		return
	}
	s.Raise(ev)
}

// OffsetKeeper is implemented by nodes that can tell whether file offsets
// mean the same in their layer and at the bottom of the stack (no layer
// beneath reshapes data): then a change's byte range applies to them too.
type OffsetKeeper interface {
	KeepsOffsets() bool
}
