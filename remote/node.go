package remote

import (
	"context"
	"errors"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
)

// node is a remote file. It holds no fid of its own identity: a fid per
// uid and connection, walked by path on first use, so that a node outlives
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

	mu   sync.Mutex
	fids map[uint32]*session.Fid // by uid

	// Under pinMu: a node that delayed writes are written back through
	// stays in the tree, whatever the kernel forgets, until they are.
	pinMu     sync.Mutex
	pins      int
	forgotten bool // Forget came while pinned: it runs at the last unpin
}

var _ layer.Node = (*node)(nil)

// KeepsOffsets: the remote tree is the bottom of its stack.
func (n *node) KeepsOffsets() bool { return true }

func (n *node) Token() layer.Token { return n.tok }

// Close ends the client the node belongs to (see FS.Close).
func (n *node) Close() error { return n.fs.Close() }

// Path is the node's names from the attach root.
func (n *node) Path() ([]string, layer.Errno) {
	n.fs.tree.Lock()
	defer n.fs.tree.Unlock()
	var rev []string
	for m := n; !m.isRoot; m = m.parent {
		if m.parent == nil {
			return nil, syscall.ESTALE
		}
		rev = append(rev, m.name)
	}
	names := make([]string, len(rev))
	for i, s := range rev {
		names[len(rev)-1-i] = s
	}
	return names, 0
}

// use returns the live connection, the node's fid on it for ctx's caller,
// the caller, and done, to call when the request no longer uses the fid
// (never nil).
func (n *node) use(ctx context.Context) (*session.Conn, uint32, ident, func(), layer.Errno) {
	id := identOf(ctx)
	c, e := n.fs.ss.Conn(ctx)
	if e != 0 {
		return nil, 0, id, noop, e
	}
	fid, done, e := n.fidOn(c, id.uid)
	return c, fid, id, done, e
}

// fidOn returns the node's fid for uid on c, walking it from uid's attach
// by the node's path if it has none there yet, and done, to call when the
// caller no longer uses it (never nil): until then it stays the node's.
func (n *node) fidOn(c *session.Conn, uid uint32) (uint32, func(), layer.Errno) {
	n.mu.Lock()
	f := n.fids[uid]
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
			n.forgetFid(uid, f)
			f.Drop()
			return 0, noop, syscall.ESTALE
		}
	}
	if n.isRoot {
		rfid, err := c.Root(uid)
		if err != nil {
			return 0, noop, session.Errno(err)
		}
		return rfid, noop, 0 // the attach itself: clunked with its connection only
	}
	fid, e := n.walkPath(c, uid)
	if e != 0 {
		return 0, noop, e
	}
	n.mu.Lock()
	if f := n.fids[uid]; f != nil && f.Conn() == c {
		if ok, _ := f.Pin(); ok {
			n.mu.Unlock()
			go c.Clunk(fid) // another request walked it meanwhile
			return f.Num(), f.Unpin, 0
		}
	}
	nf := n.ownFid(c, uid, fid)
	n.fids[uid] = nf
	n.mu.Unlock()
	return fid, nf.Unpin, 0
}

// walkPath walks a new fid of the node from uid's attach by its path.
func (n *node) walkPath(c *session.Conn, uid uint32) (uint32, layer.Errno) {
	rfid, err := c.Root(uid)
	if err != nil {
		return 0, session.Errno(err)
	}
	names, e := n.Path()
	if e != 0 {
		return 0, e
	}
	fid, q, err := c.Walk(rfid, names)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return 0, syscall.ESTALE // renamed or removed beside us
		}
		return 0, session.Errno(err)
	}
	if q.Path != n.tok.Ino {
		c.Clunk(fid)
		return 0, syscall.ESTALE // the path names another file now
	}
	return fid, 0
}

// hasFid tells whether the node has a fid for uid on c.
func (n *node) hasFid(c *session.Conn, uid uint32) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.fids[uid]
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

// Pin keeps the node in the tree until unpin.
func (n *node) Pin() {
	n.pinMu.Lock()
	n.pins++
	n.pinMu.Unlock()
}

// Unpin ends a pin; the node leaves the tree if the kernel forgot it
// meanwhile, in the background: the caller holds its sfile's lock, and
// forgetting takes the tree's and clunks fids.
func (n *node) Unpin() {
	n.pinMu.Lock()
	n.pins--
	forget := n.pins == 0 && n.forgotten
	n.pinMu.Unlock()
	if forget {
		go n.forget()
	}
}

func (n *node) forget() {
	n.fs.tree.Lock()
	if p := n.parent; p != nil {
		p.children[n.name] = remove(p.children[n.name], n)
		if len(p.children[n.name]) == 0 {
			delete(p.children, n.name)
		}
		n.parent = nil
	}
	n.fs.tree.Unlock()
	n.dropFids()
	n.fs.forgot(n.tok)
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

func remove(ns []*node, n *node) []*node {
	for i, m := range ns {
		if m == n {
			return append(ns[:i], ns[i+1:]...)
		}
	}
	return ns
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
}

// detach cuts the nodes of name in n from the tree, the name being gone;
// they and the nodes beneath them keep their fids, checked before use.
func (n *node) detach(name string) {
	n.fs.tree.Lock()
	var sub []*node
	for _, c := range n.children[name] {
		c.parent = nil
		sub = c.subtree(sub)
	}
	delete(n.children, name)
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
// fid for uid. With want, the file must be that one: if the name is
// another file's, child fails with ESTALE. What it learns is cached if
// nothing changed it since snapshot since.
func (n *node) child(c *session.Conn, dfid, uid uint32, name string, want *p9wire.Qid, out *layer.Attr, since uint64) (*node, layer.Errno) {
	fid, q, err := c.Walk(dfid, []string{name})
	if err != nil {
		if errors.Is(err, syscall.ENOENT) && want == nil {
			n.fs.cc.PutLookup(since, n.tok.Ino, name, uid, 0, 0, nil)
		}
		return nil, session.Errno(err)
	}
	if want != nil && q.Path != want.Path {
		c.Clunk(fid)
		return nil, syscall.ESTALE
	}
	wb := n.fs.wb.Gen(q.Path)
	ra, err := c.Getattr(fid)
	if err != nil {
		c.Clunk(fid)
		return nil, session.Errno(err)
	}
	tok := session.Token(&ra)
	n.fs.cc.PutLookup(since, n.tok.Ino, name, uid, tok.Ino, tok.Gen, &ra.Attr)
	// The server's attributes, with what this client knows better: the
	// size and times of its delayed writes (a hard link's reply names a
	// file the kernel has, whose size it would take).
	*out = ra.Attr
	if !n.fs.wb.OverlayAttrSince(q.Path, out, wb) {
		// A write-back crossed the getattr: its size may predate it.
		if ra, err = c.Getattr(fid); err == nil {
			*out = ra.Attr
		}
		n.fs.wb.OverlayAttr(q.Path, out)
	}
	ch := n.fs.newNode(tok)
	f := ch.ownFid(c, uid, fid)
	ch.fids[uid] = f
	n.adopt(name, ch)
	f.Unpin() // idle now
	return ch, 0
}

func (n *node) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	cc := n.fs.cc
	for try := 0; ; try++ {
		wb := n.fs.wb.Gen(n.tok.Ino)
		since := cc.Snap()
		if a, gen, ok := cc.Attr(n.tok.Ino); ok && gen == n.tok.Gen {
			n.fs.hit(kindStat)
			*out = a
		} else if e := n.getattr(ctx, h, out, since); e != 0 {
			return e
		}
		// An answer that crossed a change (a record, a write-back of
		// ours) is asked again: a kernel keeps what it is given for
		// long, and the change's invalidation went before it.
		if n.fs.wb.OverlayAttrSince(n.tok.Ino, out, wb) && (try == 2 || !cc.Changed(n.tok.Ino, since)) {
			return 0
		}
	}
}

// getattr asks the server, and caches the answer unless a change since
// crossed it.
func (n *node) getattr(ctx context.Context, h layer.Handle, out *layer.Attr, since uint64) layer.Errno {
	cc := n.fs.cc
	n.fs.miss(kindStat)
	c, fid, done, e := n.fidFor(ctx, h)
	defer done()
	if e != 0 {
		return e
	}
	ra, err := c.Getattr(fid)
	if err != nil {
		return session.Errno(err)
	}
	if tok := session.Token(&ra); tok == n.tok {
		cc.PutAttr(since, tok.Ino, tok.Gen, &ra.Attr)
	}
	*out = ra.Attr
	return 0
}

// fidFor is the fid to act on the node with: h's, which reaches the file
// even after it was removed, or the node's.
func (n *node) fidFor(ctx context.Context, h layer.Handle) (*session.Conn, uint32, func(), layer.Errno) {
	if f, ok := h.(*handle); ok && f.n == n {
		c, fid, _, e := f.use(ctx)
		return c, fid, noop, e
	}
	c, fid, _, done, e := n.use(ctx)
	return c, fid, done, e
}

func (n *node) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	defer n.fs.wb.OverlayAttr(n.tok.Ino, out) // after finish
	finish, made := n.fs.wb.BeforeSetattr(ctx, n.tok.Ino, in), false
	defer func() { finish(made) }()
	c, fid, done, e := n.fidFor(ctx, h)
	defer done()
	if e != 0 {
		return e
	}
	var valid, mode uint32
	if in.Valid&layer.SetMode != 0 {
		valid |= p9wire.SetattrMode
		mode = in.Mode & 0o7777
	} else if in.Valid&layer.SetKillSuidgid != 0 {
		// 9P cannot ask for it: clear the bits as a write by the caller
		// would, setgid only with group execute (else it marks mandatory
		// locking).
		ra, err := c.Getattr(fid)
		if err != nil {
			return session.Errno(err)
		}
		m := ra.Attr.Mode
		kill := uint32(unix.S_ISUID)
		if m&0o010 != 0 {
			kill |= unix.S_ISGID
		}
		if m&unix.S_IFMT == unix.S_IFREG && m&kill != 0 {
			valid |= p9wire.SetattrMode
			mode = m & 0o7777 &^ kill
		}
	}
	if in.Valid&layer.SetUid != 0 {
		valid |= p9wire.SetattrUID
	}
	if in.Valid&layer.SetGid != 0 {
		valid |= p9wire.SetattrGID
	}
	if in.Valid&layer.SetSize != 0 {
		valid |= p9wire.SetattrSize
	}
	var atime, mtime [2]uint64
	switch {
	case in.Valid&layer.SetAtimeNow != 0:
		valid |= p9wire.SetattrAtime // without _SET: the server's now
	case in.Valid&layer.SetAtime != 0:
		valid |= p9wire.SetattrAtime | p9wire.SetattrAtimeSet
		atime = [2]uint64{uint64(in.Atime.Unix()), uint64(in.Atime.Nanosecond())}
	}
	switch {
	case in.Valid&layer.SetMtimeNow != 0:
		valid |= p9wire.SetattrMtime
	case in.Valid&layer.SetMtime != 0:
		valid |= p9wire.SetattrMtime | p9wire.SetattrMtimeSet
		mtime = [2]uint64{uint64(in.Mtime.Unix()), uint64(in.Mtime.Nanosecond())}
	}
	if in.Valid&layer.SetCtime != 0 {
		valid |= p9wire.SetattrCtime
	}
	if valid != 0 {
		req := p9wire.Setattr{Fid: fid, Valid: valid, Mode: mode, Uid: in.Uid, Gid: in.Gid, Size: in.Size,
			Atime: atime[0], AtimeNsec: atime[1], Mtime: mtime[0], MtimeNsec: mtime[1]}
		if err := c.Do(&req); err != nil {
			return session.Errno(err)
		}
		made = true
		kind := layer.Attrs
		if in.Valid&layer.SetSize != 0 {
			kind = layer.Data
			n.fs.cc.DropData(n.tok.Ino, 0, 0)
		} else {
			n.fs.cc.DropAttrs(n.tok.Ino)
		}
		n.fs.raise(ctx, kind, n.tok, "")
	}
	since := n.fs.cc.Snap()
	ra, err := c.Getattr(fid)
	if err != nil {
		return session.Errno(err)
	}
	if tok := session.Token(&ra); tok == n.tok {
		n.fs.cc.PutAttr(since, tok.Ino, tok.Gen, &ra.Attr)
	}
	*out = ra.Attr
	return 0
}

func (n *node) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	if e := validName(name); e != 0 {
		return nil, e
	}
	id := identOf(ctx)
	cc := n.fs.cc
	if path, gen, a, found, ok := cc.Lookup(n.tok.Ino, name, id.uid); ok {
		n.fs.hit(kindStat)
		if !found {
			return nil, syscall.ENOENT
		}
		// No fid yet: one is walked by path when a request must go to
		// the server.
		ch := n.fs.newNode(layer.Token{Ino: path, Gen: gen})
		n.adopt(name, ch)
		*out = a
		ch.spriteAttr(ctx, out)
		return ch, 0
	}
	n.fs.miss(kindStat)
	since := cc.Snap()
	c, dfid, id, done, e := n.useDir(ctx, name)
	defer done()
	if e != 0 {
		return nil, e
	}
	ch, e := n.child(c, dfid, id.uid, name, nil, out, since)
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

// spriteAttr makes out, the attributes a lookup found, show the delayed
// writes of the file, if this client holds some or wrote some back
// meanwhile: then as Getattr gives them (on an error, out stays).
func (n *node) spriteAttr(ctx context.Context, out *layer.Attr) {
	if !n.fs.wb.Has(n.tok.Ino) {
		return
	}
	var a layer.Attr
	if n.Getattr(ctx, nil, &a) == 0 {
		*out = a
	}
}

// newMode is the mode to create an object with in the directory dfid:
// the caller's mode masked by its umask, unless the directory has a
// default ACL, which the server's file system then applies instead.
func (n *node) newMode(c *session.Conn, dfid uint32, id ident, mode uint32) uint32 {
	if id.umask&0o777 == 0 {
		return mode
	}
	if fid, _, err := c.Xattrwalk(dfid, "system.posix_acl_default"); err == nil {
		c.Clunk(fid)
		return mode
	}
	return mode &^ (id.umask & 0o777)
}

// make runs mk (which sends the creating request) as the caller, then
// returns the node it made.
func (n *node) make(ctx context.Context, name string, out *layer.Attr, mk func(c *session.Conn, dfid uint32, id ident) error) (layer.Node, layer.Errno) {
	c, dfid, id, done, e := n.useDir(ctx, name)
	defer done()
	if e != 0 {
		return nil, e
	}
	if err := mk(c, dfid, id); err != nil {
		return nil, session.Errno(err)
	}
	n.fs.cc.DropEntry(n.tok.Ino, name)
	n.fs.raise(ctx, layer.Entries, n.tok, name)
	ch, e := n.child(c, dfid, id.uid, name, nil, out, n.fs.cc.Snap())
	if e != 0 {
		return nil, e
	}
	return ch, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, out, func(c *session.Conn, dfid uint32, id ident) error {
		return c.RPC(&p9wire.Mkdir{Dfid: dfid, Name: name, Mode: n.newMode(c, dfid, id, mode&0o7777), Gid: id.gid},
			&p9wire.QidReply{T: p9wire.Tmkdir})
	})
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint64, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, out, func(c *session.Conn, dfid uint32, id ident) error {
		return c.RPC(&p9wire.Mknod{Dfid: dfid, Name: name, Mode: mode&unix.S_IFMT | n.newMode(c, dfid, id, mode&0o7777),
			Major: unix.Major(dev), Minor: unix.Minor(dev), Gid: id.gid}, &p9wire.QidReply{T: p9wire.Tmknod})
	})
}

func (n *node) Symlink(ctx context.Context, target []byte, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, out, func(c *session.Conn, dfid uint32, id ident) error {
		return c.RPC(&p9wire.Symlink{Fid: dfid, Name: name, Target: string(target), Gid: id.gid},
			&p9wire.QidReply{T: p9wire.Tsymlink})
	})
}

func (n *node) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	t, ok := target.(*node)
	if !ok || t.fs != n.fs {
		return nil, syscall.EXDEV
	}
	ch, e := n.make(ctx, name, out, func(c *session.Conn, dfid uint32, id ident) error {
		tfid, tdone, e := t.fidOn(c, id.uid)
		defer tdone()
		if e != 0 {
			return e
		}
		return c.Do(&p9wire.Link{Dfid: dfid, Fid: tfid, Name: name})
	})
	if e == 0 {
		n.fs.cc.DropAttrs(t.tok.Ino)
		n.fs.raise(ctx, layer.Attrs, t.tok, "") // its link count
	}
	return ch, e
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	c, dfid, id, done, e := n.useDir(ctx, name)
	defer done()
	if e != 0 {
		return nil, nil, e
	}
	// Tlcreate turns the fid it is given into the new open file: give it
	// a clone of the directory's.
	hfid, _, err := c.Walk(dfid, nil)
	if err != nil {
		return nil, nil, session.Errno(err)
	}
	r := p9wire.OpenReply{T: p9wire.Tlcreate}
	err = c.RPC(&p9wire.Lcreate{Fid: hfid, Name: name, Flags: openFlags(flags | unix.O_CREAT),
		Mode: n.newMode(c, dfid, id, mode&0o7777), Gid: id.gid}, &r)
	if err != nil {
		c.Clunk(hfid)
		return nil, nil, session.Errno(err)
	}
	q, iounit := r.Qid, r.Iounit
	n.fs.cc.DropEntry(n.tok.Ino, name)
	n.fs.cc.DropData(q.Path, 0, 0) // O_TRUNC, or an old file's QID reused
	n.fs.raise(ctx, layer.Entries, n.tok, name)
	// The node must be the file the handle has open: not what the name
	// is by the time it is walked, if another client replaced it.
	ch, e := n.child(c, dfid, id.uid, name, &q, out, n.fs.cc.Snap())
	if e != 0 {
		// Gone or replaced already: the node is the file we opened, with
		// no path to walk.
		ra, err := c.Getattr(hfid)
		if err != nil {
			c.Clunk(hfid)
			return nil, nil, session.Errno(err)
		}
		*out = ra.Attr
		ch = n.fs.newNode(session.Token(&ra))
	}
	h := &handle{n: ch, fs: n.fs, uid: id.uid, flags: flags &^ (unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC), c: c, fid: hfid, iounit: iounit}
	// (An Uncache of the new file that came before this reply is lost in
	// the gap: the file is new, so another client raced its creation.)
	n.fs.wb.Opened(ch.tok, h, q.Vers, true, n.fs.wb.Uncaches(q.Path))
	if flags&unix.O_TRUNC != 0 {
		n.fs.wb.Truncated(ch.tok.Ino, 0)
	}
	return ch, h, 0
}

func (n *node) Unlink(ctx context.Context, name string) layer.Errno {
	return n.remove(ctx, name, 0)
}

func (n *node) Rmdir(ctx context.Context, name string) layer.Errno {
	return n.remove(ctx, name, unix.AT_REMOVEDIR)
}

func (n *node) remove(ctx context.Context, name string, flags uint32) layer.Errno {
	c, dfid, id, done, e := n.useDir(ctx, name)
	defer done()
	if e != 0 {
		return e
	}
	if flags == 0 {
		n.raiseGone(ctx, c, dfid, id.uid, name) // a file's other links change
	}
	known := n.known(name)
	if err := n.fs.unlinkat(c, dfid, name, flags); err != nil {
		return session.Errno(err)
	}
	for _, p := range known {
		n.fs.wb.Unlinked(p) // before its attributes go: the link count tells
	}
	n.fs.cc.DropEntry(n.tok.Ino, name)
	for _, p := range known {
		n.fs.cc.DropAttrs(p) // links and ctime
	}
	n.detach(name)
	n.fs.raise(ctx, layer.Entries, n.tok, name)
	return 0
}

// known is the QID paths that name in the directory n may be cached as:
// those of its nodes and of the cached lookup. A change of our own to
// the name drops what the cache has of them (the controller does not
// tell us of our own changes).
func (n *node) known(name string) []uint64 {
	var ps []uint64
	if p, ok := n.fs.cc.ChildOf(n.tok.Ino, name); ok {
		ps = append(ps, p)
	}
	n.fs.tree.Lock()
	for _, ch := range n.children[name] {
		ps = append(ps, ch.tok.Ino)
	}
	n.fs.tree.Unlock()
	return ps
}

// raiseGone tells subscribers about the file that name in dfid is, whose
// link count or ctime is about to change. It costs a walk and a getattr,
// so only when someone listens.
func (n *node) raiseGone(ctx context.Context, c *session.Conn, dfid, uid uint32, name string) {
	if !n.fs.st.Events().Active() {
		return
	}
	fid, _, err := c.Walk(dfid, []string{name})
	if err != nil {
		return
	}
	ra, err := c.Getattr(fid)
	c.Clunk(fid)
	if err == nil {
		n.fs.raise(ctx, layer.Attrs, session.Token(&ra), "")
	}
}

// Rename: 9P2000.L's Trenameat has no flags. RENAME_NOREPLACE is a walk
// to the new name first, and EEXIST if it is there: not atomic, another
// client may make the name between the two (layers above use it to keep
// their own files, which only they make). RENAME_EXCHANGE gets EINVAL, as
// from the kernel's own 9P client.
func (n *node) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	d, ok := newDir.(*node)
	if !ok || d.fs != n.fs {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL
	}
	if e := validName(newName); e != 0 {
		return e
	}
	c, dfid, id, done, e := n.useDir(ctx, name)
	defer done()
	if e != 0 {
		return e
	}
	ndfid, ddone, e := d.fidOn(c, id.uid)
	defer ddone()
	if e != 0 {
		return e
	}
	if flags&unix.RENAME_NOREPLACE != 0 {
		fid, _, err := c.Walk(ndfid, []string{newName})
		if err == nil {
			c.Clunk(fid)
			return syscall.EEXIST
		}
		if e := session.Errno(err); e != syscall.ENOENT {
			return e
		}
	}
	d.raiseGone(ctx, c, ndfid, id.uid, newName)
	known := append(n.known(name), d.known(newName)...)
	if err := n.fs.renameat(c, dfid, name, ndfid, newName); err != nil {
		return session.Errno(err)
	}
	n.fs.cc.DropEntry(n.tok.Ino, name)
	n.fs.cc.DropEntry(d.tok.Ino, newName)
	for _, p := range known {
		n.fs.cc.DropAttrs(p) // the moved file's ctime, the replaced one's links
	}
	if n != d || name != newName {
		n.fs.tree.Lock()
		var replaced, sub []*node
		for _, r := range d.children[newName] {
			r.parent = nil // replaced
			replaced = r.subtree(replaced)
		}
		moved := n.children[name]
		delete(n.children, name)
		if len(moved) > 0 {
			if d.children == nil {
				d.children = map[string][]*node{}
			}
			for _, m := range moved {
				m.parent, m.name = d, newName
			}
			d.children[newName] = moved
		} else {
			delete(d.children, newName)
		}
		for _, m := range moved {
			sub = m.subtree(sub)
		}
		n.fs.tree.Unlock()
		// Servers that keep a path per fid (diod, hugelgupf/p9's
		// localfs) do not move the other fids of a renamed file: walk
		// them again by the new path. The fids of the replaced file
		// would reach the moved one there: they are checked before use.
		for _, m := range sub {
			m.dropFids()
		}
		for _, m := range replaced {
			m.keepFids()
		}
	}
	d.raiseGone(ctx, c, ndfid, id.uid, newName) // the moved file's ctime
	n.fs.raise(ctx, layer.Entries, n.tok, name)
	n.fs.raise(ctx, layer.Entries, d.tok, newName)
	return 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, layer.Errno) {
	if t, ok := n.fs.cc.Readlink(n.tok.Ino); ok {
		n.fs.hit(kindLink)
		return t, 0
	}
	n.fs.miss(kindLink)
	since := n.fs.cc.Snap()
	c, fid, _, done, e := n.use(ctx)
	defer done()
	if e != 0 {
		return nil, e
	}
	var r p9wire.ReadlinkReply
	if err := c.RPC(&p9wire.FidReq{T: p9wire.Treadlink, Fid: fid}, &r); err != nil {
		return nil, session.Errno(err)
	}
	target := r.Target
	n.fs.cc.PutLink(since, n.tok.Ino, []byte(target))
	return []byte(target), 0
}

// newFid is a new fid of the node for uid on c, to open: a clone of the
// node's, or, if it has none, walked by path (one walk, not two).
func (n *node) newFid(c *session.Conn, uid uint32) (uint32, layer.Errno) {
	if !n.isRoot && !n.hasFid(c, uid) {
		if fid, e := n.walkPath(c, uid); e != syscall.ESTALE {
			return fid, e
		}
	}
	nfid, done, e := n.fidOn(c, uid)
	if e != 0 {
		return 0, e
	}
	fid, _, err := c.Walk(nfid, nil)
	done()
	return fid, session.Errno(err)
}

// openFid makes a new fid of the node for uid and opens it with flags
// (open(2)'s).
func (n *node) openFid(c *session.Conn, uid, flags uint32) (fid, iounit uint32, q p9wire.Qid, e layer.Errno) {
	if fid, e = n.newFid(c, uid); e != 0 {
		return 0, 0, q, e
	}
	q, iounit, err := c.Lopen(fid, openFlags(flags))
	if err == syscall.EPERM && flags&unix.O_NOATIME != 0 {
		// O_NOATIME is for the owner; it is a wish, not a need.
		q, iounit, err = c.Lopen(fid, openFlags(flags&^unix.O_NOATIME))
	}
	if err != nil {
		c.Clunk(fid)
		return 0, 0, q, session.Errno(err)
	}
	return fid, iounit, q, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	flags &^= unix.O_CREAT | unix.O_EXCL | unix.O_NOCTTY | unix.O_NOFOLLOW
	id := identOf(ctx)
	h := &handle{n: n, fs: n.fs, uid: id.uid, flags: flags &^ unix.O_TRUNC}
	cc := n.fs.cc
	if !n.fs.wb.Sprite() && flags&(unix.O_ACCMODE|unix.O_TRUNC|unix.O_APPEND) == unix.O_RDONLY && cc.MayRead(n.tok.Ino, n.tok.Gen, id.uid) {
		// Opened on the server when a read misses, if one does (Sprite's
		// rules want the server to see every open).
		return h, 0
	}
	defer n.fs.wb.OpenLock(n.tok.Ino)()
	since := cc.Snap()
	uncaches := n.fs.wb.Uncaches(n.tok.Ino)
	c, e := n.fs.ss.Conn(ctx)
	if e != 0 {
		return nil, e
	}
	fid, iounit, q, e := n.openFid(c, id.uid, flags)
	if e != 0 {
		return nil, e
	}
	h.c, h.fid, h.iounit = c, fid, iounit
	n.fs.wb.Opened(n.tok, h, q.Vers, flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0, uncaches)
	if flags&unix.O_TRUNC != 0 {
		cc.DropData(n.tok.Ino, 0, 0)
		n.fs.wb.Truncated(n.tok.Ino, 0)
	} else if flags&unix.O_ACCMODE != unix.O_WRONLY {
		cc.Grant(since, n.tok.Ino, id.uid, false)
	}
	return h, 0
}

func (n *node) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
	id := identOf(ctx)
	cc := n.fs.cc
	touch := cc.Touches(n.tok.Ino)
	if ents, ok := cc.Listing(n.tok.Ino, id.uid); ok && !touch {
		n.fs.hit(kindDir)
		return &cachedDir{ents: ents, h: &handle{n: n, fs: n.fs, uid: id.uid, flags: unix.O_RDONLY | unix.O_DIRECTORY}}, 0
	}
	n.fs.miss(kindDir)
	since := cc.Snap()
	c, e := n.fs.ss.Conn(ctx)
	if e != 0 {
		return nil, e
	}
	flags := uint32(unix.O_RDONLY | unix.O_DIRECTORY)
	fid, iounit, _, e := n.openFid(c, id.uid, flags)
	if e != 0 {
		return nil, e
	}
	return &dir{h: &handle{n: n, fs: n.fs, uid: id.uid, flags: flags, c: c, fid: fid, iounit: iounit}, since: since, keep: true, touch: touch}, 0
}

func (n *node) Statfs(ctx context.Context, out *layer.Statfs) layer.Errno {
	c, fid, _, done, e := n.use(ctx)
	defer done()
	if e != 0 {
		return e
	}
	var r p9wire.StatfsReply
	if err := c.RPC(&p9wire.FidReq{T: p9wire.Tstatfs, Fid: fid}, &r); err != nil {
		return session.Errno(err)
	}
	*out = layer.Statfs{Bsize: r.Bsize, Frsize: r.Bsize, Blocks: r.Blocks, Bfree: r.Bfree, Bavail: r.Bavail,
		Files: r.Files, Ffree: r.Ffree, NameLen: r.Namelen}
	return 0
}

// unsupported tells whether a server's error means it lacks a request.
func unsupported(err error) bool {
	return errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EOPNOTSUPP)
}

// renameat sends Trenameat, or for servers without it (diod before 1.0.25)
// the older Trename, which names the file by a fid.
func (fs *FS) renameat(c *session.Conn, dfid uint32, name string, ndfid uint32, newName string) error {
	if !fs.noRenameat.Load() {
		err := c.Do(&p9wire.Renameat{OldDfid: dfid, OldName: name, NewDfid: ndfid, NewName: newName})
		if !unsupported(err) {
			return err
		}
		fs.noRenameat.Store(true)
	}
	fid, _, err := c.Walk(dfid, []string{name})
	if err != nil {
		return err
	}
	defer c.Clunk(fid)
	return c.Do(&p9wire.Rename{Fid: fid, Dfid: ndfid, Name: newName})
}

// unlinkat sends Tunlinkat, or for servers without it Tremove on a fid
// walked to the name (which a directory's emptiness or the flags then
// decide alike: Tremove removes either kind).
func (fs *FS) unlinkat(c *session.Conn, dfid uint32, name string, flags uint32) error {
	if !fs.noUnlinkat.Load() {
		err := c.Do(&p9wire.Unlinkat{Dfid: dfid, Name: name, Flags: flags})
		if !unsupported(err) {
			return err
		}
		fs.noUnlinkat.Store(true)
	}
	fid, _, err := c.Walk(dfid, []string{name})
	if err != nil {
		return err
	}
	ra, err := c.Getattr(fid)
	if err != nil {
		c.Clunk(fid)
		return err
	}
	isDir := ra.Attr.Mode&unix.S_IFMT == unix.S_IFDIR
	if isDir != (flags&unix.AT_REMOVEDIR != 0) {
		c.Clunk(fid)
		if isDir {
			return syscall.EISDIR
		}
		return syscall.ENOTDIR
	}
	err = c.Do(&p9wire.FidReq{T: p9wire.Tremove, Fid: fid})
	if err == nil || !errors.Is(err, session.ErrLost) {
		c.PutFid(fid) // Tremove clunks, whatever it answers
	}
	return err
}

// openFlags are the wire flags a file is opened with on the server.
// O_DIRECT stays here: it keeps a program's I/O out of this machine's
// page cache, which the kernel above already does; on the server it would
// only ask for aligned I/O, which some servers refuse at open (diod:
// EINVAL).
func openFlags(flags uint32) uint32 { return p9wire.WireFlags(flags &^ unix.O_DIRECT) }
