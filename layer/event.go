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
	Token Token  // the file that changed; for Entries, the directory
	Name  string // for Entries: the name (in the raiser's namespace) that changed
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
	mu   sync.RWMutex
	subs []func(Event)
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
// a directory, it maps a name that an event from the bottom of the stack
// carries (the name in the lower namespace of this directory) to this
// layer's name, or ok=false if it has none (the layer's own files).
type NameTranslator interface {
	UpperName(ctx context.Context, lowerName string) (name string, ok bool)
}

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
