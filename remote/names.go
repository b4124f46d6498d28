package remote

import (
	"context"
	"errors"
	"slices"
	"syscall"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
	"golang.org/x/sys/unix"
)

func remove(ns []*node, n *node) []*node {
	for i, m := range ns {
		if m == n {
			return append(ns[:i], ns[i+1:]...)
		}
	}
	return ns
}

// newMode is the mode to create an object with in the directory dfid:
// the caller's mode masked by its umask, unless the directory has a
// default ACL, which the server's file system then applies instead.
// Whether it has one is cached as getxattr(2)'s answers are (absent
// only): a build's creates in one directory ask once.
func (n *node) newMode(c *session.Conn, dfid uint32, id ident, mode uint32) uint32 {
	if id.umask&0o777 == 0 {
		return mode
	}
	const acl = "system.posix_acl_default"
	cc := n.fs.cc
	if _, absent, ok := cc.Xattr(n.tok.Ino, acl, id.uid); ok && absent {
		return mode &^ (id.umask & 0o777)
	}
	since := cc.Snap()
	fid, _, err := c.Xattrwalk(dfid, acl)
	if err == nil {
		c.Clunk(fid)
		return mode
	}
	if e := session.Errno(err); e == syscall.ENODATA || e == syscall.EINVAL {
		cc.PutXattr(since, n.tok.Ino, n.tok.Gen, acl, id.uid, nil, true) // EINVAL: as readXattr says
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
	n.ownEntryChanged(ctx, name)
	n.fs.raise(ctx, layer.Entries, n.tok, name)
	ch, e := n.child(c, dfid, id.who, name, nil, out, n.fs.cc.Snap())
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
		tfid, tdone, e := t.fidOn(c, id.who)
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
	if flags&unix.O_EXCL == 0 {
		// It may open a file that is there for writing, which may end
		// this client's delegation of it: its kept locks go first
		// (keptlocks.go), those of the files the name is known for.
		for _, p := range n.known(name) {
			defer n.fs.kept.opening(ctx, p)()
		}
	}
	c, dfid, id, done, e := n.useDir(ctx, name)
	defer done()
	if e != 0 {
		return nil, nil, e
	}
	// Tlcreate turns the fid it is given into the new open file: give it
	// a clone of the directory's, in the same round trip where the server
	// keeps the order of a fid's requests.
	r := p9wire.OpenReply{T: p9wire.Tlcreate}
	lcreate := &session.Ride{Make: func(_ *session.Conn, fid uint32) (p9wire.Message, p9wire.Message) {
		return &p9wire.Lcreate{Fid: fid, Name: name, Flags: openFlags(flags | unix.O_CREAT),
			Mode: n.newMode(c, dfid, id, mode&0o7777), Gid: id.gid}, &r
	}}
	var hfid uint32
	var err error
	if c.Caps()&journal.OrdersFids != 0 {
		hfid, _, err = c.WalkAnd(dfid, nil, lcreate)
	} else if hfid, _, err = c.Walk(dfid, nil); err == nil {
		err = c.RPC(lcreate.Make(c, hfid))
	}
	if hfid == 0 {
		return nil, nil, session.Errno(err)
	}
	if err == nil {
		err = lcreate.Err
	}
	if err != nil {
		c.Clunk(hfid)
		return nil, nil, session.Errno(err)
	}
	q, iounit := r.Qid, r.Iounit
	n.ownEntryChanged(ctx, name)
	n.fs.cc.DropData(q.Path, 0, 0) // O_TRUNC, or an old file's QID reused
	n.fs.raise(ctx, layer.Entries, n.tok, name)
	// The node must be the file the handle has open: not what the name
	// is by the time it is walked, if another client replaced it.
	since := n.fs.cc.Snap()
	ch, e := n.child(c, dfid, id.who, name, &q, out, since)
	if e == 0 && out.Uid == id.uid && out.Mode&0o400 != 0 {
		// The server made the file as the caller (it owns it), whose
		// access is the mode's owner bits, ACL or not: its first open
		// for reading need not ask (cache.Grant).
		n.fs.cc.Grant(since, ch.tok.Ino, ch.tok.Gen, id.uid, false)
	}
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
	h := &handle{n: ch, fs: n.fs, uid: id.uid, who: id.who, flags: flags &^ (unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC), c: c, fid: hfid, iounit: iounit}
	// (An Uncache of the new file that came before this reply is lost in
	// the gap: the file is new, so another client raced its creation.)
	n.fs.wb.Opened(ch.tok, h, q.Vers, true, n.fs.wb.Uncaches(ch.tok))
	if flags&unix.O_TRUNC != 0 {
		n.fs.wb.Truncated(ch.tok, 0)
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
	var links map[uint64]uint32
	if flags == 0 {
		links = n.unlinking(ctx, c, dfid, name, known)
	}
	defer n.fs.wb.NameChange(known)()
	if err := n.fs.unlinkat(c, dfid, name, flags); err != nil && !n.lostButMade(ctx, err, name, known, nil, "") {
		return session.Errno(err)
	}
	for _, p := range known {
		n.fs.wb.Unlinked(p, links[p])
	}
	n.ownEntryChanged(ctx, name)
	for _, p := range known {
		n.fs.cc.DropAttrs(p) // links and ctime
	}
	n.detach(name)
	n.fs.raise(ctx, layer.Entries, n.tok, name)
	return 0
}

// unlinking is the link counts, before name in dfid goes, of the files
// it may be that have delayed writes here, told to the write-behind: one
// with other names writes them back first (writeback.Unlinking). A count
// not cached costs a walk and a getattr, for such files only.
func (n *node) unlinking(ctx context.Context, c *session.Conn, dfid uint32, name string, known []uint64) map[uint64]uint32 {
	links := map[uint64]uint32{}
	asked := false
	for _, p := range known {
		if !n.fs.wb.Dirty(p) {
			continue
		}
		if a, _, ok := n.fs.cc.Attr(p); ok {
			links[p] = a.Nlink
		} else if !asked {
			asked = true
			if fid, q, err := c.Walk(dfid, []string{name}); err == nil {
				if ra, err := c.Getattr(fid); err == nil && slices.Contains(known, q.Path) {
					links[q.Path] = uint32(ra.Attr.Nlink)
				}
				c.Clunk(fid)
			}
		}
	}
	for p, nlink := range links {
		n.fs.wb.Unlinking(ctx, p, nlink)
	}
	return links
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
	for _, ch := range n.childrenLocked(name) {
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
	ndfid, ddone, e := d.fidOn(c, id.who)
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
	movedKnown, overKnown := n.known(name), d.known(newName)
	known := append(slices.Clone(movedKnown), overKnown...)
	same := n.tok == d.tok && name == newName
	var replaced []uint64 // what newName was, not another name of the moved file
	if !same {
		for _, p := range overKnown {
			if !slices.Contains(movedKnown, p) {
				replaced = append(replaced, p)
			}
		}
	}
	links := d.unlinking(ctx, c, ndfid, newName, replaced)
	defer n.fs.wb.NameChange(known)()
	if err := n.fs.renameat(c, dfid, name, ndfid, newName); err != nil && !n.lostButMade(ctx, err, name, movedKnown, d, newName) {
		return session.Errno(err)
	}
	for _, p := range replaced {
		n.fs.wb.Unlinked(p, links[p])
	}
	n.ownEntryChanged(ctx, name)
	d.ownEntryChanged(ctx, newName)
	for _, p := range known {
		n.fs.cc.DropAttrs(p) // the moved file's ctime, the replaced one's links
	}
	if !same {
		// In every node of each directory (see twinsLocked), not only
		// the ones the kernel named.
		n.fs.tree.Lock()
		moved := n.childrenLocked(name)
		var replaced, sub []*node
		for _, r := range d.childrenLocked(newName) {
			replaced = r.subtree(replaced)
		}
		for _, r := range d.childrenLocked(newName) {
			r.removed = true // replaced
			r.unnameLocked()
		}
		for _, t := range n.twinsLocked() {
			delete(t.children, name)
		}
		if len(moved) > 0 {
			if d.children == nil {
				d.children = map[string][]*node{}
			}
			for _, m := range moved {
				m.parent, m.name = d, newName
			}
			d.children[newName] = moved
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

// lostButMade tells, of a removal of name in n (to is nil) or a rename of
// it to newName in to whose connection was lost under it (err), whether
// the server made it all the same. The next connection is made only once
// the server has fenced the lost one (export/fence.go): what it carried
// has landed, or never will; so the names tell. known are the QID paths
// the name had here; with none, it cannot tell: false.
func (n *node) lostButMade(ctx context.Context, err error, name string, known []uint64, to *node, newName string) bool {
	if !errors.Is(err, session.ErrLost) || len(known) == 0 {
		return false
	}
	old, there, ok := n.nameIs(ctx, name)
	if !ok || there && slices.Contains(known, old) {
		return false // unknown, or the name is still the file's: not made
	}
	if to == nil {
		return true // removed (or replaced by another client: gone here all the same)
	}
	q, there, ok := to.nameIs(ctx, newName)
	return ok && there && slices.Contains(known, q)
}

// nameIs walks name in the directory n on the current connection: its
// QID path, whether it is there, and ok false if that cannot be told.
func (n *node) nameIs(ctx context.Context, name string) (path uint64, there, ok bool) {
	c, dfid, _, done, e := n.use(ctx)
	defer done()
	if e != 0 {
		return 0, false, false
	}
	fid, q, err := c.Walk(dfid, []string{name})
	switch {
	case err == nil:
		c.Clunk(fid)
		return q.Path, true, true
	case errors.Is(err, syscall.ENOENT):
		return 0, false, true
	}
	return 0, false, false
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
