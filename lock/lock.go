// Package lock keeps advisory locks — POSIX byte-range locks (fcntl) and
// whole-file flock locks — for the files of a stack, keyed by file token.
//
// The host cannot keep them for us: every process reaches a file through
// the one descriptor shale holds, so the host would see a single owner.
// Owners here are the kernel's lock owners: a process's file table for
// POSIX locks, an open file for flock. As in Linux, the two kinds do not
// conflict with each other.
package lock

import (
	"context"
	"math"
	"slices"
	"sync"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// Table holds the locks of many files. The zero Table is ready to use.
type Table struct {
	mu      sync.Mutex
	files   map[layer.Token]*file
	waiting map[uint64]uint64 // POSIX owner -> owner it waits for
}

type file struct {
	held    []held
	changed chan struct{} // closed and replaced whenever locks are released
}

type held struct {
	owner uint64
	layer.Lock
}

func overlap(a, b *layer.Lock) bool { return a.Start <= b.End && b.Start <= a.End }

// conflicts reports whether h blocks a request by owner for lk.
func (h *held) conflicts(owner uint64, lk *layer.Lock) bool {
	return h.owner != owner && h.Flock == lk.Flock && overlap(&h.Lock, lk) &&
		(h.Type == syscall.F_WRLCK || lk.Type == syscall.F_WRLCK)
}

func (f *file) conflict(owner uint64, lk *layer.Lock) *held {
	for i := range f.held {
		if f.held[i].conflicts(owner, lk) {
			return &f.held[i]
		}
	}
	return nil
}

// Get reports the first lock that would block lk, or sets lk.Type to
// F_UNLCK if none would.
func (t *Table) Get(tok layer.Token, owner uint64, lk *layer.Lock) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.files[tok]; f != nil {
		if h := f.conflict(owner, lk); h != nil {
			*lk = h.Lock
			return
		}
	}
	lk.Type = syscall.F_UNLCK
}

// Set takes, changes or (with F_UNLCK) releases owner's lock over lk's
// range. If another owner's lock is in the way it fails with EAGAIN, or
// with wait it blocks until the way is clear, ctx ends (EINTR), or waiting
// would deadlock (EDEADLK).
func (t *Table) Set(ctx context.Context, tok layer.Token, owner uint64, lk *layer.Lock, wait bool) layer.Errno {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.files == nil {
		t.files = map[layer.Token]*file{}
		t.waiting = map[uint64]uint64{}
	}
	f := t.files[tok]
	if f == nil {
		f = &file{changed: make(chan struct{})}
		t.files[tok] = f
	}
	if lk.Flock && lk.Type != syscall.F_UNLCK {
		// As in Linux, converting a flock lock first drops the old one,
		// so two holders upgrading at once do not wait for each other.
		f.replace(owner, &layer.Lock{End: math.MaxUint64, Type: syscall.F_UNLCK, Flock: true})
	}
	if lk.Type != syscall.F_UNLCK {
		for {
			h := f.conflict(owner, lk)
			if h == nil {
				break
			}
			if !wait {
				return syscall.EAGAIN
			}
			if !lk.Flock && t.deadlocks(owner, h.owner) {
				return syscall.EDEADLK
			}
			changed := f.changed
			if !lk.Flock {
				t.waiting[owner] = h.owner
			}
			t.mu.Unlock()
			select {
			case <-changed:
			case <-ctx.Done():
				t.mu.Lock()
				delete(t.waiting, owner)
				return syscall.EINTR
			}
			t.mu.Lock()
			delete(t.waiting, owner)
			// The file's entry may have been dropped while we waited.
			if f = t.files[tok]; f == nil {
				f = &file{changed: make(chan struct{})}
				t.files[tok] = f
			}
		}
	}
	f.replace(owner, lk)
	if len(f.held) == 0 {
		delete(t.files, tok)
	}
	return 0
}

// deadlocks reports whether owner waiting for blocker closes a cycle.
func (t *Table) deadlocks(owner, blocker uint64) bool {
	for i := 0; i < len(t.waiting)+1; i++ {
		if blocker == owner {
			return true
		}
		next, ok := t.waiting[blocker]
		if !ok {
			return false
		}
		blocker = next
	}
	return false
}

// replace makes owner's locks of lk's kind over lk's range exactly lk
// (none for F_UNLCK), splitting the owner's locks that straddle its ends
// and merging neighbours of the same type, as fcntl does.
func (f *file) replace(owner uint64, lk *layer.Lock) {
	released := false
	var out []held
	for _, h := range f.held {
		if h.owner != owner || h.Flock != lk.Flock || !overlap(&h.Lock, lk) {
			out = append(out, h)
			continue
		}
		released = released || h.Type != lk.Type || lk.Type == syscall.F_UNLCK
		if h.Start < lk.Start {
			left := h
			left.End = lk.Start - 1
			out = append(out, left)
		}
		if h.End > lk.End {
			right := h
			right.Start = lk.End + 1
			out = append(out, right)
		}
	}
	if lk.Type != syscall.F_UNLCK {
		nl := held{owner, *lk}
		// Merge with adjacent locks of the same owner and type.
		out = slices.DeleteFunc(out, func(h held) bool {
			if h.owner != owner || h.Flock != lk.Flock || h.Type != lk.Type {
				return false
			}
			if h.End != math.MaxUint64 && h.End+1 == nl.Start {
				nl.Start = h.Start
				return true
			}
			if nl.End != math.MaxUint64 && nl.End+1 == h.Start {
				nl.End = h.End
				return true
			}
			return false
		})
		out = append(out, nl)
	}
	f.held = out
	if released {
		close(f.changed)
		f.changed = make(chan struct{})
	}
}

// Release drops every lock owner holds on tok of the given kind: POSIX
// locks when a descriptor of the file is closed, flock locks when the open
// file is released.
func (t *Table) Release(tok layer.Token, owner uint64, flock bool) {
	t.Set(context.Background(), tok, owner, &layer.Lock{Start: 0, End: math.MaxUint64, Type: syscall.F_UNLCK, Flock: flock}, false)
}

// Held is a lock and its owner.
type Held struct {
	Owner uint64
	layer.Lock
}

// Take removes every lock of tok and returns them: they move elsewhere
// (a client's kept locks to its server); those waiting for them look
// again.
func (t *Table) Take(tok layer.Token) []Held {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.files[tok]
	if f == nil {
		return nil
	}
	hs := make([]Held, len(f.held))
	for i, h := range f.held {
		hs[i] = Held{h.owner, h.Lock}
	}
	delete(t.files, tok)
	close(f.changed)
	return hs
}

// Has tells whether owner holds a lock of tok of the kind flock says.
func (t *Table) Has(tok layer.Token, owner uint64, flock bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.files[tok]; f != nil {
		for _, h := range f.held {
			if h.owner == owner && h.Flock == flock {
				return true
			}
		}
	}
	return false
}
