package remote

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
)

// node is a remote file. It holds no fid of its own identity: a fid per
// caller's credentials and connection, walked by path on first use, so that a node outlives
// connections and serves every caller as itself; a connection keeps a
// bounded number of them (see session.Fid).
type node struct {
	fs     *FS
	tok    layer.Token
	isRoot bool

	// Under fs.tree. A node that is neither the root nor anyone's child
	// (its name was removed or replaced) has no path: it cannot walk new
	// fids (ESTALE), and keeps those it has (see keepFids).
	parent   *node
	name     string
	children map[string][]*node // nodes given out for each name, not yet forgotten

	// listing is the names a stream listing the directory from the
	// server read, to look up ahead of the kernel (ahead.go).
	listing atomic.Pointer[ahead]

	mu   sync.Mutex
	fids map[uint32]*session.Fid // by credentials (session.Who)

	// Under pinMu: a node that delayed writes are written back through
	// stays in the tree, whatever the kernel forgets, until they are.
	pinMu     sync.Mutex
	pins      int
	forgotten bool // Forget came while pinned: it runs at the last unpin
	// removed (under fs.tree): this client removed the node's name, or
	// renamed another file over it.
	removed bool
	// kept (under fs.tree): a directory Forget came for while a pinned
	// node was beneath it: it keeps its name until that one's unpin, as
	// the pinned node's path goes through it.
	kept bool
}

var _ layer.Node = (*node)(nil)

// KeepsOffsets: the remote tree is the bottom of its stack.
func (n *node) KeepsOffsets() bool { return true }

func (n *node) Token() layer.Token { return n.tok }

// Close ends the client the node belongs to (see FS.Close).
func (n *node) Close() error { return n.fs.Close() }

// Path is the node's names from the attach root, or another of its
// file's (a hard link, through another node); ESTALE if its file has no
// name this client knows: it removed the last, or renamed another file
// over it.
func (n *node) Path() ([]string, layer.Errno) {
	if ps := n.paths(); len(ps) > 0 {
		return ps[0], 0
	}
	return nil, syscall.ESTALE
}

// paths is every name of the node's file this client knows, its own
// first.
func (n *node) paths() [][]string {
	n.fs.tree.Lock()
	defer n.fs.tree.Unlock()
	var ps [][]string
	if p, ok := n.ownPathLocked(); ok {
		ps = append(ps, p)
	}
	for _, m := range n.fs.named[n.tok] {
		if p, ok := m.ownPathLocked(); m != n && ok {
			ps = append(ps, p)
		}
	}
	return ps
}

// Removed tells whether no name of the node's file is known any more,
// the node's own removed by this client.
func (n *node) Removed() bool {
	if _, e := n.Path(); e == 0 {
		return false
	}
	n.fs.tree.Lock()
	defer n.fs.tree.Unlock()
	return n.removed
}

// ownPathLocked is the node's own names from the root; fs.tree is held.
func (n *node) ownPathLocked() ([]string, bool) {
	var rev []string
	for m := n; !m.isRoot; m = m.parent {
		if m.parent == nil {
			return nil, false
		}
		rev = append(rev, m.name)
	}
	names := make([]string, len(rev))
	for i, s := range rev {
		names[len(rev)-1-i] = s
	}
	return names, true
}

// use returns the live connection, the node's fid on it for ctx's caller,
// the caller, and done, to call when the request no longer uses the fid
// (never nil).
func (n *node) use(ctx context.Context) (*session.Conn, uint32, ident, func(), layer.Errno) {
	id := identOf(ctx)
	id.who = whoOf(ctx)
	c, e := n.fs.ss.Conn(ctx)
	if e != 0 {
		return nil, 0, id, noop, e
	}
	fid, done, e := n.fidOn(c, id.who)
	return c, fid, id, done, e
}

// fidOn returns the node's fid for the credentials who on c, walking it
// from their attach by the node's path if it has none there yet, and
// done, to call when the caller no longer uses it (never nil): until then
// it stays the node's.
func (n *node) fidOn(c *session.Conn, who uint32) (uint32, func(), layer.Errno) {
	n.mu.Lock()
	f := n.fids[who]
	n.mu.Unlock()
	if f != nil && f.Conn() == c {
		if ok, pathless := f.Pin(); ok {
			if !pathless {
				return f.Num(), f.Unpin, 0
			}
			// On servers that keep a path per fid (diod) it reaches
			// whatever has the name now, or nothing.
			ra, err := c.Getattr(f.Num())
			if err == nil && session.Token(&ra) == n.tok {
				return f.Num(), f.Unpin, 0
			}
			f.Unpin()
			if err != nil && errors.Is(err, session.ErrLost) {
				return 0, noop, session.Errno(err)
			}
			n.forgetFid(who, f)
			f.Drop()
			return 0, noop, syscall.ESTALE
		}
	}
	if n.isRoot {
		rfid, err := c.Root(who)
		if err != nil {
			return 0, noop, session.Errno(err)
		}
		return rfid, noop, 0 // the attach itself: clunked with its connection only
	}
	fid, e := n.walkPath(c, who)
	if e != 0 {
		return 0, noop, e
	}
	n.mu.Lock()
	if f := n.fids[who]; f != nil && f.Conn() == c {
		if ok, _ := f.Pin(); ok {
			n.mu.Unlock()
			go c.Clunk(fid) // another request walked it meanwhile
			return f.Num(), f.Unpin, 0
		}
	}
	nf := n.ownFid(c, who, fid)
	n.fids[who] = nf
	n.mu.Unlock()
	return fid, nf.Unpin, 0
}

// walkPath walks a new fid of the node from the attach of the
// credentials who by its path.
func (n *node) walkPath(c *session.Conn, who uint32) (uint32, layer.Errno) {
	rfid, err := c.Root(who)
	if err != nil {
		return 0, session.Errno(err)
	}
	for _, names := range n.paths() {
		fid, q, err := c.Walk(rfid, names)
		switch {
		case errors.Is(err, syscall.ENOENT):
			continue // renamed or removed beside us
		case err != nil:
			return 0, session.Errno(err)
		case q.Path != n.tok.Ino:
			c.Clunk(fid)
			n.fs.log.Debug("a name of the file leads to another now", "qid", n.tok.Ino, "name", "/"+strings.Join(names, "/"), "found", q.Path)
			continue
		}
		return fid, 0
	}
	n.fs.log.Debug("no name this client knows leads to the file", "qid", n.tok.Ino, "names", len(n.paths()))
	return 0, syscall.ESTALE
}

// hasFid tells whether the node has a fid for the credentials who on c.
func (n *node) hasFid(c *session.Conn, who uint32) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.fids[who]
	return f != nil && f.Conn() == c
}

// Forget clunks the node's fids and leaves the tree; a node pinned by
// delayed writes does so once they are written back.
func (n *node) Forget() {
	n.pinMu.Lock()
	if n.pins > 0 {
		n.forgotten = true
		n.pinMu.Unlock()
		return
	}
	n.pinMu.Unlock()
	n.forget()
}

// Pin keeps the node in the tree until Unpin, and the directories above
// it, whatever the kernel forgets meanwhile (a reconnection's
// invalidation of everything, an unmount: the write-back walks by path).
func (n *node) Pin() {
	n.pinMu.Lock()
	defer n.pinMu.Unlock()
	if n.pins++; n.pins == 1 {
		n.fs.tree.Lock()
		n.fs.pinned[n] = true
		n.fs.tree.Unlock()
	}
}

// Unpin ends a pin; the node leaves the tree if the kernel forgot it
// meanwhile, and so do the directories above it kept for it, in the
// background: the caller holds its sfile's lock, and forgetting takes
// the tree's and clunks fids.
func (n *node) Unpin() {
	n.pinMu.Lock()
	n.pins--
	last := n.pins == 0
	forget := last && n.forgotten
	var above []*node
	if last {
		n.fs.tree.Lock()
		delete(n.fs.pinned, n)
		above = n.aboveLocked()
		n.fs.tree.Unlock()
	}
	n.pinMu.Unlock()
	if !last {
		return
	}
	go func() {
		if forget {
			n.forget()
		}
		n.fs.tree.Lock()
		defer n.fs.tree.Unlock()
		for _, m := range above {
			if m.kept && !m.pinnedBelowLocked() {
				m.kept = false
				m.unnameLocked()
			}
		}
	}()
}

// aboveLocked is the directories the write-back of n's file may walk
// through: above n, and above the other nodes of its file, whose names
// are its path once n's own went (a hard link's); fs.tree is held.
func (n *node) aboveLocked() []*node {
	var above []*node
	for _, t := range n.twinsLocked() {
		for m := t.parent; m != nil; m = m.parent {
			above = append(above, m)
		}
	}
	return above
}

// pinnedBelowLocked tells whether a pinned node is beneath n, by its own
// names or its file's others; fs.tree is held.
func (n *node) pinnedBelowLocked() bool {
	if len(n.children) == 0 {
		return false
	}
	for p := range n.fs.pinned {
		if slices.Contains(p.aboveLocked(), n) {
			return true
		}
	}
	return false
}

// forget takes the node from the tree, unless another node of its file
// lives: then it keeps its name there, as the file's (the kernel has one
// inode for a file's names and serves them all through its first node;
// the others it forgets, and with them the names the file has here).
// The last node of a file to go takes the names with it.
func (n *node) forget() {
	n.fs.tree.Lock()
	switch {
	case n.parent == nil:
	case n.fs.othersLive(n):
	case n.pinnedBelowLocked():
		n.kept = true
	default:
		n.unnameLocked()
	}
	n.fs.tree.Unlock()
	n.dropFids()
	if n.fs.forgot(n) {
		n.fs.tree.Lock()
		if ns := n.fs.named[n.tok]; len(ns) > 0 {
			n.fs.log.Debug("the file's last node went: the names this client knew of it go", "qid", n.tok.Ino, "names", len(ns))
		}
		for _, m := range slices.Clone(n.fs.named[n.tok]) {
			if m.pinnedBelowLocked() {
				m.kept = true
			} else {
				m.unnameLocked()
			}
		}
		n.fs.tree.Unlock()
	}
}

// unnameLocked takes the node's name from the tree; fs.tree is held.
func (n *node) unnameLocked() {
	if p := n.parent; p != nil {
		p.children[n.name] = remove(p.children[n.name], n)
		if len(p.children[n.name]) == 0 {
			delete(p.children, n.name)
		}
		n.parent = nil
	}
	if ns := remove(n.fs.named[n.tok], n); len(ns) > 0 {
		n.fs.named[n.tok] = ns
	} else {
		delete(n.fs.named, n.tok)
	}
}

// subtree appends n and the nodes beneath it; fs.tree is held.
func (n *node) subtree(to []*node) []*node {
	to = append(to, n)
	for _, cs := range n.children {
		for _, c := range cs {
			to = c.subtree(to)
		}
	}
	return to
}

// keepFids keeps the node's fids, its name being gone: they are its one
// way to the file (an unlinked file still open, say, on servers whose fids
// are files), checked to be still the node's file before each use, as on
// servers that keep a path per fid (diod) they reach whatever has the
// name next, or nothing.
func (n *node) keepFids() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, f := range n.fids {
		f.SetPathless()
	}
}

// dropFids clunks the node's fids (those requests use, when they are
// done): later requests walk new ones.
func (n *node) dropFids() {
	n.mu.Lock()
	fids := n.fids
	n.fids = map[uint32]*session.Fid{}
	n.mu.Unlock()
	for _, f := range fids {
		f.Drop()
	}
}

// adopt makes c the node of name in n.
func (n *node) adopt(name string, c *node) {
	n.fs.tree.Lock()
	defer n.fs.tree.Unlock()
	if n.children == nil {
		n.children = map[string][]*node{}
	}
	c.parent, c.name = n, name
	n.children[name] = append(n.children[name], c)
	n.fs.named[c.tok] = append(n.fs.named[c.tok], c)
}

// twinsLocked is n and the other nodes of its file in the tree; fs.tree
// is held. A directory the kernel forgot while a node beneath it was
// pinned by delayed writes stays (kept), and the kernel's next lookup of
// it makes another node of it: the pinned node's name is in the old one,
// and changes through the new one must reach it.
func (n *node) twinsLocked() []*node {
	ts := []*node{n}
	for _, m := range n.fs.named[n.tok] {
		if m != n {
			ts = append(ts, m)
		}
	}
	return ts
}

// childrenLocked is the nodes of name in every node of the directory n;
// fs.tree is held.
func (n *node) childrenLocked(name string) []*node {
	var cs []*node
	for _, t := range n.twinsLocked() {
		cs = append(cs, t.children[name]...)
	}
	return cs
}

// detach cuts the nodes of name in n (in each of its twins) from the
// tree, the name being gone; they and the nodes beneath them keep their
// fids, checked before use.
func (n *node) detach(name string) {
	n.fs.tree.Lock()
	var sub []*node
	for _, c := range n.childrenLocked(name) {
		sub = c.subtree(sub)
	}
	for _, c := range n.childrenLocked(name) {
		c.removed = true
		c.unnameLocked()
	}
	n.fs.tree.Unlock()
	for _, m := range sub {
		m.keepFids()
	}
}

// validName refuses names the kernel would never send but a buggy layer
// above might: the server would resolve them.
func validName(name string) layer.Errno {
	if name == "" || name == "." || name == ".." {
		return syscall.EINVAL
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return syscall.EINVAL
		}
	}
	if len(name) > 255 {
		return syscall.ENAMETOOLONG
	}
	return 0
}

// useDir is use for an operation on name in the directory n.
func (n *node) useDir(ctx context.Context, name string) (*session.Conn, uint32, ident, func(), layer.Errno) {
	if e := validName(name); e != 0 {
		return nil, 0, ident{}, noop, e
	}
	return n.use(ctx)
}

// child walks to name in the directory dfid and makes its node, with a
// fid for the credentials who. With want, the file must be that one: if the name is
// another file's, child fails with ESTALE. What it learns is cached if
// nothing changed it since snapshot since.
func (n *node) child(c *session.Conn, dfid, who uint32, name string, want *p9wire.Qid, out *layer.Attr, since uint64) (*node, layer.Errno) {
	fid, tok, e := n.lookupOn(c, dfid, who, name, want, out, since)
	if e != 0 {
		return nil, e
	}
	ch := n.fs.newNode(tok)
	f := ch.ownFid(c, who, fid)
	ch.fids[who] = f
	n.adopt(name, ch)
	f.Unpin() // idle now
	return ch, 0
}

// lookupOn walks to name in the directory dfid as who and asks its
// attributes into out, caching both if nothing changed them since
// snapshot since (a name that is not there too), and returns the fid it
// walked, the caller's to keep or clunk. With want, the file must be
// that one (else ESTALE).
func (n *node) lookupOn(c *session.Conn, dfid, who uint32, name string, want *p9wire.Qid, out *layer.Attr, since uint64) (uint32, layer.Token, layer.Errno) {
	uid := session.UID(who)
	// The Tgetattr goes with the walk where the server keeps a fid's
	// order: the file, and its write-back generation, are not known yet.
	var ra p9wire.Rattr
	getattr := &session.Ride{Make: func(_ *session.Conn, fid uint32) (p9wire.Message, p9wire.Message) {
		return &p9wire.Getattr{Fid: fid, Mask: p9wire.GetattrAll}, &ra
	}}
	all := n.fs.wb.GenAll()
	var fid uint32
	var q p9wire.Qid
	var err error
	if c.Caps()&journal.OrdersFids != 0 {
		fid, q, err = c.WalkAnd(dfid, []string{name}, getattr)
	} else {
		fid, q, err = c.Walk(dfid, []string{name})
	}
	if err != nil {
		if errors.Is(err, syscall.ENOENT) && want == nil {
			n.fs.cc.PutLookup(since, n.tok.Ino, name, uid, 0, 0, nil)
		}
		return 0, layer.Token{}, session.Errno(err)
	}
	if want != nil && q.Path != want.Path {
		c.Clunk(fid)
		return 0, layer.Token{}, syscall.ESTALE
	}
	// What this client knows better than the server goes in out: a hard
	// link's reply names a file the kernel has, whose size it would take.
	if getattr.Sent && getattr.Err == nil {
		*out = ra.Attr
	}
	if !getattr.Sent || getattr.Err != nil || !n.fs.wb.OverlayAttrSinceAll(session.Token(&ra), out, all) {
		ra, err = n.fs.attrOf(c, fid, q.Path, out)
	}
	if err != nil {
		c.Clunk(fid)
		return 0, layer.Token{}, session.Errno(err)
	}
	tok := session.Token(&ra)
	n.fs.cc.PutLookup(since, n.tok.Ino, name, uid, tok.Ino, tok.Gen, &ra.Attr)
	return fid, tok, 0
}

func (n *node) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	if e := validName(name); e != 0 {
		return nil, e
	}
	id := identOf(ctx)
	cc := n.fs.cc
	// A lookup ahead of the kernel (ahead.go) may be bringing it, or
	// have brought it: waited for, and the next started.
	n.awaitAhead(name)
	path, gen, a, found, ok := cc.Lookup(n.tok.Ino, name, id.uid)
	if !ok {
		return n.lookupMiss(ctx, name, out)
	}
	n.fs.hit(kindStat)
	if !found {
		return nil, syscall.ENOENT
	}
	// No fid yet: one is walked by path when a request must go to the
	// server.
	ch := n.fs.newNode(layer.Token{Ino: path, Gen: gen})
	n.adopt(name, ch)
	*out = a
	ch.spriteAttr(ctx, out)
	return ch, 0
}

// lookupMiss asks the server for name, which the cache does not answer.
func (n *node) lookupMiss(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	cc := n.fs.cc
	n.fs.miss(kindStat)
	since := cc.Snap()
	c, dfid, id, done, e := n.useDir(ctx, name)
	defer done()
	if e != 0 {
		return nil, e
	}
	n.lookAhead(name, id.who)
	ch, e := n.child(c, dfid, id.who, name, nil, out, since)
	if e != 0 {
		return nil, e
	}
	if cc.Changed(ch.tok.Ino, since) {
		// The answer crossed a change: ask again (see Getattr).
		var a layer.Attr
		if ch.Getattr(ctx, nil, &a) == 0 {
			*out = a
		}
	} else {
		ch.spriteAttr(ctx, out)
	}
	return ch, 0
}
