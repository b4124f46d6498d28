package export

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
)

// conn is one client connection: its fids, the requests in flight by tag,
// and the layer nodes its fids hold.
type conn struct {
	s       *Server
	id      uint64
	rw      io.ReadWriteCloser
	peer    p9net.Peer         // who is at the other end: the uids it may attach as
	warned  atomic.Bool        // a refused attach was logged
	ctx     context.Context    // ends with the connection: requests' parent
	stop    context.CancelFunc // ends ctx
	base    context.Context    // ctx without its end: for releases after it
	msize   atomic.Uint32      // set by Tversion, in the loop
	wmu     sync.Mutex         // one reply on the wire at a time
	broken  bool               // a reply failed: no more are sent (wmu)
	slots   chan struct{}      // bounds the requests served at once
	waiting chan struct{}      // bounds those waiting out of their slots (unslot)
	ord     order              // requests in flight by fid (order.go)
	flight  sync.WaitGroup     // requests in flight
	seq     atomic.Uint64      // fids made (fid.seq)

	journal atomic.Pointer[jrnl] // the journal it opened, if any
	fenced  atomic.Bool          // its client gave it up: nothing more is served (fence.go)
	ended   chan struct{}        // closed once it has released all it held

	connState        // admission (admit.go)
	unpend    func() // takes it out of the pending set

	mu    sync.Mutex
	nodes map[nodeKey]*nodeRec
	fids  map[uint32]*fid
	tags  map[uint16]*req
	views map[*root]uint32 // its coherence view of each root it reached
}

// viewOf is c's coherence view of root r, registered when first needed:
// the changes its requests make carry it.
func (c *conn) viewOf(r *root) uint32 {
	m := c.s.st.Manager()
	if m == nil || r == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.views[r]
	if !ok {
		v = m.Register(connView{}, r.n)
		c.views[r] = v
		c.s.ctl.addView(v, c)
	}
	return v
}

// endViews unregisters c's views, at its end.
func (c *conn) endViews() {
	c.mu.Lock()
	views := c.views
	c.views = map[*root]uint32{}
	c.mu.Unlock()
	for _, v := range views {
		c.s.st.Manager().Unregister(v)
		c.s.ctl.forgetView(v)
	}
}

// callerCtx is ctx carrying who, acting through c's view of r.
func (c *conn) callerCtx(ctx context.Context, who layer.Caller, r *root) context.Context {
	if r != nil {
		who.View = c.viewOf(r)
	}
	return layer.WithCaller(ctx, who)
}

// nodeKey names a file of one root's stack: roots may be different layers
// whose tokens mean different files.
type nodeKey struct {
	r   *root
	tok layer.Token
}

// nodeRec is a layer node shared by every fid of the connection that
// refers to its token: a node is Forgotten once, when the last goes.
type nodeRec struct {
	key    nodeKey
	n      layer.Node
	refs   int
	pinned bool // a root: the server's caller owns it
}

// hold returns the record for n, a node that a Lookup or Create of root r
// gave; a node the connection already holds under n's token keeps
// serving, and n is Forgotten.
func (c *conn) hold(r *root, n layer.Node) *nodeRec {
	k := nodeKey{r, n.Token()}
	c.mu.Lock()
	rec, ok := c.nodes[k]
	if !ok {
		rec = &nodeRec{key: k, n: n}
		c.nodes[k] = rec
	}
	rec.refs++
	c.mu.Unlock()
	if ok && rec.n != n {
		n.Forget()
	}
	return rec
}

// holdRoot returns the record of r's root node, which is never Forgotten.
func (c *conn) holdRoot(r *root) *nodeRec {
	k := nodeKey{r, r.n.Token()}
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.nodes[k]
	if !ok {
		rec = &nodeRec{key: k, n: r.n}
		c.nodes[k] = rec
	}
	if rec.n == r.n {
		rec.pinned = true
	}
	rec.refs++
	return rec
}

// ref takes one more reference to p's node.
func (c *conn) ref(p pos) {
	if p.rec != nil {
		c.mu.Lock()
		p.rec.refs++
		c.mu.Unlock()
	}
}

// unref releases one reference to p's node.
func (c *conn) unref(p pos) {
	rec := p.rec
	if rec == nil {
		return
	}
	c.mu.Lock()
	rec.refs--
	gone := rec.refs == 0
	if gone {
		delete(c.nodes, rec.key)
	}
	c.mu.Unlock()
	if gone && !rec.pinned {
		rec.n.Forget()
	}
}

// fid returns the fid numbered n, or EBADF.
func (c *conn) fid(n uint32) (*fid, syscall.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.fids[n]; ok {
		return f, 0
	}
	return nil, syscall.EBADF
}

// full tells whether a new fid would pass MaxFids, before making one
// costs a change (walks, attaches).
func (c *conn) full() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fids) >= c.s.opts.MaxFids
}

// bind numbers f n: a new fid, unless MaxFids are held, or the
// replacement of old (a walk of a fid onto itself).
func (c *conn) bind(n uint32, f *fid, old *fid) syscall.Errno {
	c.mu.Lock()
	cur, used := c.fids[n]
	switch {
	case used && cur != old || !used && old != nil:
		c.mu.Unlock()
		return syscall.EBADF
	case !used && len(c.fids) >= c.s.opts.MaxFids:
		c.mu.Unlock()
		return syscall.EMFILE
	}
	c.fids[n] = f
	c.mu.Unlock()
	if old != nil {
		old.release()
	}
	return 0
}

// unbind forgets the number n and returns its fid, which the caller
// releases.
func (c *conn) unbind(n uint32) (*fid, syscall.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.fids[n]
	if !ok {
		return nil, syscall.EBADF
	}
	delete(c.fids, n)
	return f, 0
}

// releaseAll releases every fid: at the connection's end, and at a
// Tversion, which starts the session again.
func (c *conn) releaseAll() {
	c.mu.Lock()
	fs := make([]*fid, 0, len(c.fids))
	for _, f := range c.fids {
		fs = append(fs, f)
	}
	clear(c.fids)
	c.mu.Unlock()
	for _, f := range fs {
		f.release()
	}
}

// stopReading ends the connection's reading of requests, not its
// replies: a deadline where the stream has one, else it is closed.
func (c *conn) stopReading() {
	if d, ok := c.rw.(interface{ SetReadDeadline(time.Time) error }); ok && d.SetReadDeadline(time.Now()) == nil {
		return
	}
	c.rw.Close()
}

// peerOf is who is at the other end of rw: what its listener says, or, of
// a stream no p9net listener gave, anyone (its owner vouches for it).
func peerOf(rw io.ReadWriteCloser) p9net.Peer {
	if p, ok := p9net.PeerOf(rw); ok {
		return p
	}
	return p9net.Peer{Any: true, Known: true, Principal: "vouched", How: "a connection the server's owner vouches for"}
}
