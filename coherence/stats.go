package coherence

import (
	"sync/atomic"

	"github.com/shalefs/shale/layer"
)

// counters are the manager's: the events its stack raised, and the
// holders it called back with them.
type counters struct {
	events    [layer.Everything + 1]atomic.Uint64 // by kind
	beside    atomic.Uint64                       // made beside the stack (View 0)
	callbacks atomic.Uint64
}

var kindNames = [layer.Everything + 1]string{"attrs", "data", "entries", "everything"}

// Stats is a snapshot of a manager's counters.
type Stats struct {
	// Events are the changes the stack made or noticed, by kind (attrs,
	// data, entries, everything); Beside those of them no view's request
	// made: noticed in the lower file system (other programs' changes,
	// and writes through FUSE passthrough, which are the kernel's), or
	// told by a 9P server (other clients').
	Events map[string]uint64 `json:"events"`
	Beside uint64            `json:"beside"`
	// Callbacks are the calls of holders (views, the 9P export) to drop
	// what they hold, one per holder and event.
	Callbacks uint64 `json:"callbacks"`
}

// Stats returns the manager's counters; a nil manager has none.
func (m *Manager) Stats() Stats {
	s := Stats{Events: map[string]uint64{}}
	if m == nil {
		return s
	}
	for k := range m.ctr.events {
		s.Events[kindNames[k]] = m.ctr.events[k].Load()
	}
	s.Beside, s.Callbacks = m.ctr.beside.Load(), m.ctr.callbacks.Load()
	return s
}

// count counts ev, as dispatch hears it.
func (c *counters) count(ev layer.Event) {
	if int(ev.Kind) < len(c.events) {
		c.events[ev.Kind].Add(1)
	}
	if ev.View == 0 {
		c.beside.Add(1)
	}
}
