// Package stack is what the layers of one stack share, and how a stack is
// built from a spec.
//
// A Stack owns the services every layer and frontend of one stack uses:
// the events its bottom raises, the data locks that order reads and
// read-modify-writes of a file across layers and views, the table of
// advisory locks, and the coherence manager. Constructors of backends,
// layers and frontends take it; nothing travels up a stack by type
// assertion. One Stack, one manager: the manager is made with it.
//
// A program builds a stack by hand (see the example) or from a Spec, the
// form the command line's --layer flags and stack files both take, with
// the layers registered by their packages (Register).
package stack

import (
	"log/slog"
	"sync"

	"github.com/shalefs/shale/coherence"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/lock"
)

// Stack is the shared state of one stack.
type Stack struct {
	events  layer.Events
	locks   lock.Table
	data    [256]sync.RWMutex // data lock stripes, by token
	manager *coherence.Manager
	log     *slog.Logger
}

// Options tune a stack.
type Options struct {
	// CoherenceOff keeps the manager from calling holders back: views then
	// serve each other's changes stale (for tests and benchmarks that show
	// what coherence costs and buys).
	CoherenceOff bool
	// Logger is where the stack's backends and layers log (a mount's or
	// server's --log); nil: nowhere.
	Logger *slog.Logger
}

// New makes an empty stack.
func New(o Options) *Stack {
	s := &Stack{log: o.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.manager = coherence.New(&s.events, o.CoherenceOff)
	return s
}

// Log is the logger of the stack's parts: what they say reaches the user
// through it.
func (s *Stack) Log() *slog.Logger { return s.log }

// Events are the stack's changes: the bottom raises an event for each
// change it makes or notices, and the manager passes them on.
func (s *Stack) Events() *layer.Events { return &s.events }

// Locks is the stack's advisory lock table, keyed by token, so that a lock
// taken through one view conflicts with one taken through any other.
func (s *Stack) Locks() *lock.Table { return &s.locks }

// DataLock is the lock that orders reads and read-modify-writes of tok's
// data across every layer and view of the stack, so that one view's
// partial-block write cannot undo another's.
func (s *Stack) DataLock(tok layer.Token) *sync.RWMutex {
	return &s.data[(tok.Ino^tok.Gen)%uint64(len(s.data))]
}

// Manager is the stack's coherence manager; frontends register their
// caches with it as holders.
func (s *Stack) Manager() *coherence.Manager { return s.manager }
