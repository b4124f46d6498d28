package export

import (
	"context"
	"io"
	"sync"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shalefs/shale/layer"
)

// conn is one client connection: the files its fids refer to and the
// layer nodes they hold.
type conn struct {
	s   *Server
	id  uint64
	rw  io.ReadWriteCloser
	ctx context.Context

	mu    sync.Mutex
	nodes map[nodeKey]*nodeRec
	files map[*file]struct{} // live files: not yet released
	// lingering are files the library Closed while they may still be in
	// use (file.xattrWalked): released when the connection ends.
	lingering []*file
}

// nodeKey names a file of one root's stack: roots may be different layers
// whose tokens mean different files.
type nodeKey struct {
	r   *root
	tok layer.Token
}

// nodeRec is a layer node shared by every file of the connection that
// refers to its token: a node is Forgotten once, when the last goes.
type nodeRec struct {
	key    nodeKey
	n      layer.Node
	refs   int
	pinned bool // a root: the server's caller owns it
}

// hold returns the record for n, a node that a Lookup, Create or Open of
// root r gave; a node the connection already holds under n's token keeps
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

// drop releases one reference to rec.
func (c *conn) drop(rec *nodeRec) {
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

// add registers a new file, unless the connection holds MaxFids already.
func (c *conn) add(f *file) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.files) >= c.s.opts.MaxFids {
		return linux.EMFILE
	}
	c.files[f] = struct{}{}
	return nil
}

// full tells whether a new file would pass MaxFids, before making one
// costs a change (Create).
func (c *conn) full() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.files) >= c.s.opts.MaxFids
}

// releaseAll releases every file left when the connection has ended:
// the library has clunked every fid, so none should be; this is the
// guarantee that a connection's end leaves nothing.
func (c *conn) releaseAll() {
	c.mu.Lock()
	fs := make([]*file, 0, len(c.files))
	for f := range c.files {
		fs = append(fs, f)
	}
	fs = append(fs, c.lingering...)
	clear(c.files)
	c.lingering = nil
	c.mu.Unlock()
	for _, f := range fs {
		f.release()
	}
}

// live returns the numbers of files and node records the connection
// holds (tests).
func (c *conn) live() (files, nodes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.files), len(c.nodes)
}

// attacher gives each Tattach of a connection a fresh synthetic root, whose
// names are identity names.
type attacher struct{ c *conn }

func (a attacher) Attach() (p9.File, error) {
	f := &file{c: a.c}
	if err := a.c.add(f); err != nil {
		return nil, err
	}
	return f, nil
}
