package export

import (
	"context"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// The requests on the names of a directory of a root, and on a file's
// own name: any fid at the file serves them alike.

// dir is p's node, a directory's, for a request on its entry name.
func (p *place) dir(name string) (layer.Node, syscall.Errno) {
	if badName(name) {
		return nil, syscall.EINVAL
	}
	return p.node(syscall.EROFS)
}

// makeIn serves a request of type typ that makes name in p, a directory,
// with mk: the answer is the new node's QID, and the node, which no fid
// refers to yet, is Forgotten.
func (p *place) makeIn(ctx context.Context, typ uint8, name string, gid uint32,
	mk func(ctx context.Context, dir layer.Node, out *layer.Attr) (layer.Node, syscall.Errno)) (p9wire.Message, syscall.Errno) {
	n, e := p.dir(name)
	if e != 0 {
		return nil, e
	}
	var a layer.Attr
	c, e := mk(p.createCtx(ctx, gid), n, &a)
	if e != 0 {
		return nil, e
	}
	q := qidOf(c.Token(), a.Mode)
	p.c.note(ctx, p.r, q)
	c.Forget()
	return &p9wire.QidReply{T: typ, Qid: q}, 0
}

func (p *place) mkdir(ctx context.Context, m *p9wire.Mkdir) (p9wire.Message, syscall.Errno) {
	return p.makeIn(ctx, p9wire.Tmkdir, m.Name, m.Gid, func(ctx context.Context, n layer.Node, a *layer.Attr) (layer.Node, syscall.Errno) {
		return n.Mkdir(ctx, m.Name, m.Mode&0o7777, a)
	})
}

func (p *place) symlink(ctx context.Context, m *p9wire.Symlink) (p9wire.Message, syscall.Errno) {
	return p.makeIn(ctx, p9wire.Tsymlink, m.Name, m.Gid, func(ctx context.Context, n layer.Node, a *layer.Attr) (layer.Node, syscall.Errno) {
		return n.Symlink(ctx, []byte(m.Target), m.Name, a)
	})
}

func (p *place) mknod(ctx context.Context, m *p9wire.Mknod) (p9wire.Message, syscall.Errno) {
	return p.makeIn(ctx, p9wire.Tmknod, m.Name, m.Gid, func(ctx context.Context, n layer.Node, a *layer.Attr) (layer.Node, syscall.Errno) {
		return n.Mknod(ctx, m.Name, m.Mode&(syscall.S_IFMT|0o7777), unix.Mkdev(m.Major, m.Minor), a)
	})
}

func (p *place) unlinkat(ctx context.Context, m *p9wire.Unlinkat) (p9wire.Message, syscall.Errno) {
	n, e := p.dir(m.Name)
	if e != 0 {
		return nil, e
	}
	if m.Flags&unix.AT_REMOVEDIR != 0 {
		return nil, n.Rmdir(ctx, m.Name)
	}
	p.c.s.sp.reclaimNamed(ctx, p.r, n, m.Name, p.c)
	return nil, n.Unlink(ctx, m.Name)
}

func (p *place) readlink(ctx context.Context, m *p9wire.FidReq) (p9wire.Message, syscall.Errno) {
	n, e := p.node(syscall.EINVAL)
	if e != 0 {
		return nil, e
	}
	b, e := n.Readlink(ctx)
	if e != 0 {
		return nil, e
	}
	return &p9wire.ReadlinkReply{Target: string(b)}, 0
}

// peer returns the node of o's file, which must be of p's root: the
// layers link and rename only within one. The caller has both in use
// (conn.pair).
func (p *place) peer(o *fid) (layer.Node, syscall.Errno) {
	q := o.fileAt()
	if q == nil || q.r != p.r || q.rec == nil {
		return nil, syscall.EXDEV
	}
	return q.rec.n, 0
}

// across returns the nodes of f, a directory, and of o's file, its peer:
// what Tlink and Trenameat act on.
func across(f, o *fid) (layer.Node, layer.Node, syscall.Errno) {
	p := f.fileAt()
	if p == nil {
		return nil, nil, syscall.EROFS // the journal tree's
	}
	n, e := p.node(syscall.EROFS)
	if e != 0 {
		return nil, nil, e
	}
	t, e := p.peer(o)
	return n, t, e
}

// parent is the directory p was walked from and the name it had there:
// what Trename and Tremove act on. A root (or a synthetic directory above
// roots) is a mount: it has no entry of its own to act on (the name it
// shadows in the root above is another file), so it is EBUSY, as a mount
// point is.
func (p *place) parent() (layer.Node, syscall.Errno) {
	n := len(p.up)
	if n == 0 || p.mounts || p.rec == nil || p.up[n-1].rec == nil || p.up[n-1].r != p.r {
		return nil, syscall.EBUSY
	}
	return p.up[n-1].rec.n, 0
}

// rename moves p's file into o's directory as name; p's fid is in use
// exclusively (conn.pair).
func (p *place) rename(ctx context.Context, o *fid, name string) syscall.Errno {
	dir, e := p.parent()
	if e != 0 {
		return e
	}
	nd, e := p.peer(o)
	if e != 0 {
		return e
	}
	if e := p.still(ctx, dir); e != 0 {
		return e
	}
	p.c.s.sp.reclaimNamed(ctx, p.r, dir, p.name, p.c)
	p.c.s.sp.reclaimNamed(ctx, p.r, nd, name, p.c)
	if e := dir.Rename(ctx, p.name, nd, name, 0); e != 0 {
		return e
	}
	// p now hangs below o: its path is o's, and the old one goes.
	q := o.fileAt()
	up := append(slices.Clone(q.up), q.pos)
	for _, u := range up {
		p.c.ref(u)
	}
	for _, u := range p.up {
		p.c.unref(u)
	}
	p.up = up
	p.name = name
	return 0
}

// still tells whether p's name in dir, its parent, is still p's file:
// ENOENT if someone else renamed or removed it.
func (p *place) still(ctx context.Context, dir layer.Node) syscall.Errno {
	var a layer.Attr
	cur, e := dir.Lookup(ctx, p.name, &a)
	if e != 0 {
		return e
	}
	same := cur.Token() == p.rec.n.Token()
	cur.Forget()
	if !same {
		return syscall.ENOENT
	}
	return 0
}

// remove unlinks p's file from the directory it was walked from, if the
// name still is that file's.
func (p *place) remove(ctx context.Context) syscall.Errno {
	dir, e := p.parent()
	if e != 0 {
		return e
	}
	if e := p.still(ctx, dir); e != 0 {
		return e
	}
	if p.mode == syscall.S_IFDIR {
		return dir.Rmdir(ctx, p.name)
	}
	p.c.s.sp.reclaimNamed(ctx, p.r, dir, p.name, p.c)
	return dir.Unlink(ctx, p.name)
}
