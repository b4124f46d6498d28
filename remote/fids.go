package remote

import "container/list"

// defaultIdleFids is how many idle node fids a connection keeps.
const defaultIdleFids = 1024

// nodeFid is a node's fid for one uid on one connection.
//
// The kernel forgets nodes only under memory pressure, and a server bounds
// the fids of a connection (shale serve: --max-fids, 4096 by default), so
// a node's fid cannot live as long as the node: a request pins the fid it
// uses, an unpinned one is idle, and a connection keeps at most maxIdle
// idle ones, clunking the least recently used. Its node walks a new one by
// path on its next use. Open handles have fids of their own, never
// clunked so; nor are the fids of nodes without a path (see keepFids).
type nodeFid struct {
	c   *conn
	fid uint32
	n   *node
	uid uint32

	// Under c.mu.
	refs     int           // requests using it
	gone     bool          // no longer its node's: clunked once refs is 0
	elem     *list.Element // in c.idle while idle
	pathless bool          // its node has no path: never idle, checked before use
}

// newNodeFid is fid as n's for uid on c, pinned by the caller.
func newNodeFid(c *conn, n *node, uid, fid uint32) *nodeFid {
	return &nodeFid{c: c, fid: fid, n: n, uid: uid, refs: 1}
}

// pin marks f in use by a request; false if it was dropped. pathless
// tells whether its node has lost its path.
func (f *nodeFid) pin() (ok, pathless bool) {
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

// keep marks f as the fid of a node with no path: it cannot be walked
// again, so it is not clunked as idle.
func (f *nodeFid) keep() {
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	f.pathless = true
	if f.elem != nil {
		c.idle.Remove(f.elem)
		f.elem = nil
	}
}

// unpin ends a request's use of f. An idle fid past the connection's
// bound is clunked, the least recently used first, before unpin returns:
// the next walk must not find the server's fids all taken.
func (f *nodeFid) unpin() {
	c := f.c
	c.mu.Lock()
	f.refs--
	if f.refs > 0 {
		c.mu.Unlock()
		return
	}
	var clunk []*nodeFid
	if f.gone {
		clunk = append(clunk, f)
	} else if !f.pathless {
		f.elem = c.idle.PushBack(f)
		for c.idle.Len() > c.maxIdle {
			o := c.idle.Remove(c.idle.Front()).(*nodeFid)
			o.elem, o.gone = nil, true
			clunk = append(clunk, o)
		}
	}
	c.mu.Unlock()
	for _, o := range clunk {
		o.n.forgetFid(o)
		if c.alive() {
			c.clunk(o.fid)
		}
	}
}

// drop takes f from its node: it is clunked now if idle, else when the
// last request using it ends.
func (f *nodeFid) drop() {
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
	if idle && c.alive() {
		go c.clunk(f.fid)
	}
}

// forgetFid removes f from n's fids if it is there still.
func (n *node) forgetFid(f *nodeFid) {
	n.mu.Lock()
	if n.fids[f.uid] == f {
		delete(n.fids, f.uid)
	}
	n.mu.Unlock()
}

// idleFids is how many idle node fids c keeps (for tests).
func (c *conn) idleFids() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idle.Len()
}

func noop() {}
