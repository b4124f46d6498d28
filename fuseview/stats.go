package fuseview

import (
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Counters are what a view's kernel asked of it and what the view told
// the kernel to drop: atomics, bumped on every request (shale stats,
// --metrics). go-fuse counts nothing of its own (RecordLatencies does
// nothing in v2.12), so count.go counts at the RawFileSystem. Several
// views may share one; the zero value is ready.
type Counters struct {
	ops [nOps]opCounter
	// LOOKUPs that found no such name (answered OK with no inode when
	// the kernel may keep that); of those, the names the kernel may keep
	// as missing (negative entries), and those a change made it drop.
	missing, negKept, negDropped atomic.Uint64
	// Coherence: the events the manager passed to the view, and the
	// notifications that dropped the kernel's caches, by what they drop.
	callbacks atomic.Uint64
	inval     [nInvals]atomic.Uint64
}

type opCounter struct {
	n, errs, ns atomic.Uint64
}

// What a notification drops from the kernel's caches.
const (
	invalPages = iota // pages and attributes of a file
	invalAttrs        // attributes only
	invalEntry        // a name (positive or negative entry)
	invalAll          // everything, after lost events
	nInvals
)

var invalNames = [nInvals]string{"pages", "attrs", "entry", "all"}

// OpStats are the requests of one FUSE opcode.
type OpStats struct {
	Count  uint64 `json:"count"`
	Errors uint64 `json:"errors"` // answered with an error (a LOOKUP's "missing" is not one: Stats.Missing)
	Nanos  uint64 `json:"ns"`     // time spent answering them, all together
}

// Stats is a snapshot of Counters.
type Stats struct {
	Requests map[string]OpStats `json:"requests"` // by FUSE opcode: LOOKUP, GETATTR ...
	// Missing are the LOOKUPs that found no such name; NegativeKept the
	// names of them that the kernel may keep as missing; NegativeDropped
	// those a change made it drop.
	Missing         uint64 `json:"missing"`
	NegativeKept    uint64 `json:"negative_kept"`
	NegativeDropped uint64 `json:"negative_dropped"`
	// Callbacks are the coherence manager's events given to the view;
	// Invalidations the notifications they sent the kernel, by kind
	// (pages, attrs, entry, all).
	Callbacks     uint64            `json:"callbacks"`
	Invalidations map[string]uint64 `json:"invalidations"`
}

// Stats returns a snapshot of c: the opcodes with no request are left out.
func (c *Counters) Stats() Stats {
	s := Stats{Requests: map[string]OpStats{}, Invalidations: map[string]uint64{},
		Missing: c.missing.Load(), NegativeKept: c.negKept.Load(), NegativeDropped: c.negDropped.Load(), Callbacks: c.callbacks.Load()}
	for o := range nOps {
		oc := &c.ops[o]
		if n := oc.n.Load(); n > 0 {
			s.Requests[opNames[o]] = OpStats{Count: n, Errors: oc.errs.Load(), Nanos: oc.ns.Load()}
		}
	}
	for k := range nInvals {
		s.Invalidations[invalNames[k]] = c.inval[k].Load()
	}
	return s
}

// done counts a request of o begun at start, answered with st, and
// passes st on.
func (c *Counters) done(o op, start time.Time, st fuse.Status) fuse.Status {
	oc := &c.ops[o]
	oc.n.Add(1)
	oc.ns.Add(uint64(time.Since(start)))
	if st != fuse.OK {
		oc.errs.Add(1)
	}
	return st
}

func (c *Counters) invalidated(kind int) { c.inval[kind].Add(1) }

// looked counts a LOOKUP that ended with e.
func (c *Counters) looked(e syscall.Errno) {
	if e == syscall.ENOENT {
		c.missing.Add(1)
	}
}
