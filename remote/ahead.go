package remote

import (
	"context"
	"sync"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/session"
)

// Lookups ahead of the kernel's READDIRPLUS. The kernel looks up every
// entry a READDIRPLUS returns, and go-fuse's bridge asks the layer for
// them one after another: on a cold cache each is a walk and a Tgetattr,
// so a directory of 30 names at 50 ms of round trip took 3 s (a build's
// first listing of its package). When a lookup misses on the name a
// server listing of the directory returned last, the names that listing
// has read but not returned yet are looked up ahead, aheadWidth at once,
// into the cache, where the kernel's next lookups find them; each of
// those lookups starts the next. A plain READDIR, whose names no lookup
// follows, sends nothing more; one that follows a READDIRPLUS (the kernel
// chooses each time) at most aheadWidth lookups.
//
// The lookups ahead are made as the caller of the lookup that started
// them, whose later lookups they answer (the cache keeps who may search
// the directory); their fids are clunked, as the cache answers without
// one. One that fails puts nothing, and the kernel's lookup asks itself.

// aheadWidth is how many names are looked up ahead of the kernel.
const aheadWidth = 16

// ahead is one server listing's names, for lookups ahead.
type ahead struct {
	n *node

	mu     sync.Mutex
	last   string          // the name returned last
	next   []string        // names read, not returned yet, not looked up ahead
	unused map[string]bool // names looked up ahead the kernel has not looked up yet
	on     bool            // the kernel looks the names up: started
	who    uint32          // as whom to look up
	flying map[string]chan struct{}
	ended  bool // the stream closed: nothing more is started
}

// listed is told of the names a Treaddir read (the stream's buffer).
func (a *ahead) listed(ents []layer.DirEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range ents {
		if e.Name != "." && e.Name != ".." {
			a.next = append(a.next, e.Name)
		}
	}
}

// returned is told of each entry the stream returns: if it was not
// looked up ahead yet, it no longer will be (names are returned in the
// order they were read, and looked up ahead from the front).
func (a *ahead) returned(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last = name
	if len(a.next) > 0 && a.next[0] == name {
		a.next = a.next[1:]
	}
}

// end stops lookups ahead; those in flight finish.
func (a *ahead) end() {
	a.mu.Lock()
	a.ended = true
	a.mu.Unlock()
	a.n.listing.CompareAndSwap(a, nil)
}

// fillLocked starts lookups ahead until aheadWidth names looked up ahead
// wait for the kernel's.
func (a *ahead) fillLocked() {
	for a.on && !a.ended && len(a.unused) < aheadWidth && len(a.next) > 0 {
		name := a.next[0]
		a.next = a.next[1:]
		if a.flying == nil {
			a.flying = map[string]chan struct{}{}
			a.unused = map[string]bool{}
		}
		a.unused[name] = true
		done := make(chan struct{})
		a.flying[name] = done
		a.n.fs.ctr.lookupsAhead.Add(1)
		go a.lookup(name, a.who, done)
	}
}

func (a *ahead) lookup(name string, who uint32, done chan struct{}) {
	fid, c := a.fetch(name, who)
	// The kernel's lookup waits for the cache, not for the clunk.
	a.mu.Lock()
	delete(a.flying, name)
	close(done)
	a.mu.Unlock()
	if c != nil {
		c.Clunk(fid)
	}
}

// fetch looks name up on the server as who, into the cache, and returns
// the fid it walked and its connection (nil if it failed).
func (a *ahead) fetch(name string, who uint32) (uint32, *session.Conn) {
	fs := a.n.fs
	since := fs.cc.Snap()
	c, e := fs.ss.Conn(context.Background())
	if e != 0 {
		return 0, nil
	}
	dfid, dirDone, e := a.n.fidOn(c, who)
	defer dirDone()
	if e != 0 {
		return 0, nil
	}
	var out layer.Attr
	fid, _, e := a.n.lookupOn(c, dfid, who, name, nil, &out, since)
	if e != 0 {
		return 0, nil
	}
	return fid, c
}

// lookAhead is told of a lookup of name that missed the cache, as who: if
// a server listing of n returned name last, the kernel is looking its
// entries up (READDIRPLUS), and the names after it are looked up ahead.
func (n *node) lookAhead(name string, who uint32) {
	a := n.listing.Load()
	if a == nil || !n.fs.cc.On.Load() {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.on && a.last == name {
		a.on, a.who = true, who
		a.fillLocked()
	}
}

// awaitAhead is told of the kernel's lookup of name: it waits for the
// lookup ahead of name in flight, if there is one, and starts the next.
func (n *node) awaitAhead(name string) {
	a := n.listing.Load()
	if a == nil {
		return
	}
	a.mu.Lock()
	done := a.flying[name]
	if a.unused[name] {
		delete(a.unused, name)
		a.fillLocked()
	}
	a.mu.Unlock()
	if done != nil {
		<-done
	}
}
