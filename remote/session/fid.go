package session

import "container/list"

// Fid is a fid its owner keeps on a connection across requests (a node's
// fid for one uid, in remote).
//
// The kernel forgets nodes only under memory pressure, and a server bounds
// the fids of a connection (shale serve: --max-fids, 4096 by default), so
// a kept fid cannot live as long as its owner: a request pins the fid it
// uses, an unpinned one is idle, and a connection keeps at most MaxIdle
// idle ones, clunking the least recently used and telling its owner
// (evicted), which walks a new one on its next use. A fid marked Pathless
// is never idle: its owner has no other way to its file.
type Fid struct {
	c       *Conn
	num     uint32
	evicted func(*Fid)

	// Under c.mu.
	refs     int           // requests using it
	gone     bool          // no longer its owner's: clunked once refs is 0
	elem     *list.Element // in c.idle while idle
	pathless bool          // never idle, checked by its owner before use
}

// Own makes fid num of c one its owner keeps, pinned by the caller;
// evicted is told when c clunks it as idle.
func (c *Conn) Own(num uint32, evicted func(*Fid)) *Fid {
	return &Fid{c: c, num: num, evicted: evicted, refs: 1}
}

// Conn is the connection f belongs to.
func (f *Fid) Conn() *Conn { return f.c }

// Num is f's number on the wire.
func (f *Fid) Num() uint32 { return f.num }

// Pin marks f in use by a request; false if it was dropped. pathless
// tells whether its owner has lost its path (SetPathless).
func (f *Fid) Pin() (ok, pathless bool) {
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.gone {
		return false, false
	}
	f.refs++
	if f.elem != nil {
		c.idle.Remove(f.elem)
		f.elem = nil
	}
	return true, f.pathless
}

// SetPathless marks f as the fid of an owner with no path: it cannot be
// walked again, so it is not clunked as idle.
func (f *Fid) SetPathless() {
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	f.pathless = true
	if f.elem != nil {
		c.idle.Remove(f.elem)
		f.elem = nil
	}
}

// Unpin ends a request's use of f. An idle fid past the connection's
// bound is clunked, the least recently used first, before Unpin returns:
// the next walk must not find the server's fids all taken.
func (f *Fid) Unpin() {
	c := f.c
	c.mu.Lock()
	f.refs--
	if f.refs > 0 {
		c.mu.Unlock()
		return
	}
	var clunk []*Fid
	if f.gone {
		clunk = append(clunk, f)
	} else if !f.pathless {
		f.elem = c.idle.PushBack(f)
		for c.idle.Len() > c.maxIdle {
			o := c.idle.Remove(c.idle.Front()).(*Fid)
			o.elem, o.gone = nil, true
			clunk = append(clunk, o)
		}
	}
	c.mu.Unlock()
	for _, o := range clunk {
		o.evicted(o)
		if c.Alive() {
			c.Clunk(o.num)
		}
	}
}

// Drop takes f from its owner: it is clunked now if idle, else when the
// last request using it ends.
func (f *Fid) Drop() {
	c := f.c
	c.mu.Lock()
	if f.gone {
		c.mu.Unlock()
		return
	}
	f.gone = true
	if f.elem != nil {
		c.idle.Remove(f.elem)
		f.elem = nil
	}
	idle := f.refs == 0
	c.mu.Unlock()
	if idle && c.Alive() {
		go c.Clunk(f.num)
	}
}

// IdleFids is how many idle fids c keeps (for tests).
func (c *Conn) IdleFids() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idle.Len()
}
