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
// into the cache, where the kernel's next lookups find them; each later
// entry the listing returns keeps the window full. A plain READDIR, whose
// names no lookup follows, sends nothing more.
//
// The lookups ahead are made as the caller of the lookup that started
// them, whose later lookups they answer (the cache keeps who may search
// the directory); their fids are clunked, as the cache answers without
// one. One that fails puts nothing, and the kernel's lookup asks itself.

// aheadWidth is how many lookups ahead are in flight for one listing.
const aheadWidth = 16

// ahead is one server listing's names, for lookups ahead.
type ahead struct {
	n *node

	mu     sync.Mutex
	last   string   // the name returned last
	next   []string // names read, not returned yet, not looked up ahead
	on     bool     // the kernel looks the names up: started
	who    uint32   // as whom to look up
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

// returned is told of each entry the stream returns: it no longer waits
// to be looked up ahead, and the window is topped up.
func (a *ahead) returned(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last = name
	if len(a.next) > 0 && a.next[0] == name {
		a.next = a.next[1:]
	}
	a.fillLocked()
}

// end stops lookups ahead; those in flight finish.
func (a *ahead) end() {
	a.mu.Lock()
	a.ended = true
	a.mu.Unlock()
	a.n.listing.CompareAndSwap(a, nil)
}

// fillLocked starts lookups ahead until aheadWidth are in flight.
func (a *ahead) fillLocked() {
	for a.on && !a.ended && len(a.flying) < aheadWidth && len(a.next) > 0 {
		name := a.next[0]
		a.next = a.next[1:]
		if a.flying == nil {
			a.flying = map[string]chan struct{}{}
		}
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
	a.fillLocked()
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

// awaitAhead waits for a lookup ahead of name in flight, if there is
// one, and tells whether there was.
func (n *node) awaitAhead(name string) bool {
	a := n.listing.Load()
	if a == nil {
		return false
	}
	a.mu.Lock()
	done := a.flying[name]
	a.mu.Unlock()
	if done == nil {
		return false
	}
	<-done
	return true
}
