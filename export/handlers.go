package export

import (
	"context"
	"strings"
	"syscall"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// A handler decodes a request from d and serves it: it returns the reply,
// nil for one that says only success, or the error to answer. Handlers
// decode the whole request before they act, and act only if d.Err is nil
// (malformed: EINVAL).
type handler func(c *conn, ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno)

var handlers [256]handler

func init() {
	handlers[p9wire.Tauth] = (*conn).auth
	handlers[p9wire.Tattach] = (*conn).attach
	handlers[p9wire.Twalk] = (*conn).walk
	handlers[p9wire.Txattrwalk] = (*conn).xattrwalk
	handlers[p9wire.Tclunk] = (*conn).clunk
	handlers[p9wire.Tremove] = waitingNames((*conn).remove)
	handlers[p9wire.Tlink] = waitingNames((*conn).link)
	handlers[p9wire.Trenameat] = waitingNames((*conn).renameat)
	handlers[p9wire.Trename] = waitingNames((*conn).rename)

	handlers[p9wire.Tgetattr] = on(0, anyKind, kind.getattr)
	handlers[p9wire.Tstatfs] = on(lax, anyKind, kind.statfs)
	handlers[p9wire.Tlopen] = on(changes, anyKind, kind.lopen)
	handlers[p9wire.Tlcreate] = waitingNames(on(changes, anyKind, kind.lcreate))
	handlers[p9wire.Tread] = on(0, anyKind, kind.read)
	handlers[p9wire.Twrite] = on(0, anyKind, kind.write)
	handlers[p9wire.Treaddir] = on(0, anyKind, kind.readdir)
	handlers[p9wire.Tfsync] = on(lax, anyKind, kind.fsync)
	handlers[p9wire.Tsetattr] = on(0, fileOf, fileKind.setattr)
	handlers[p9wire.Txattrcreate] = on(changes, fileOf, fileKind.xattrcreate)
	handlers[p9wire.Tlock] = on(0, fileOf, fileKind.lock)
	handlers[p9wire.Tgetlock] = on(0, fileOf, fileKind.getlock)
	handlers[p9wire.Tmkdir] = waitingNames(on(0, placeOf, (*place).mkdir))
	handlers[p9wire.Tsymlink] = waitingNames(on(0, placeOf, (*place).symlink))
	handlers[p9wire.Tmknod] = waitingNames(on(0, placeOf, (*place).mknod))
	handlers[p9wire.Tunlinkat] = waitingNames(on(0, placeOf, (*place).unlinkat))
	handlers[p9wire.Treadlink] = on(lax, placeOf, (*place).readlink)
}

// How a request on one fid is served.
const (
	changes = 1 << iota // it changes what the fid is: it has the fid to itself
	lax                 // served even when short: it needs no more than the fid
)

// What serves a request on one fid: any kind, the kinds at a file of a
// root, or that file's place, which requests on the names in it act on.
// The journal tree's fids are none of the last two (EOPNOTSUPP).
func anyKind(f *fid) (kind, bool) { return f.is, true }

func fileOf(f *fid) (fileKind, bool) {
	k, ok := f.is.(fileKind)
	return k, ok
}

func placeOf(f *fid) (*place, bool) {
	p := f.fileAt()
	return p, p != nil
}

// decode decodes a request of type M from d: nil if it is malformed.
func decode[M any, P interface {
	*M
	p9wire.Message
}](d *p9wire.Dec) P {
	m := P(new(M))
	m.Decode(d)
	if d.Err != nil {
		return nil
	}
	return m
}

// on is the handler of the requests of type M on one fid: op serves them
// with what as finds the fid is, the fid in use (exclusively if it
// changes) meanwhile. An unknown fid is EBADF, and a fid as does not find
// EOPNOTSUPP, before a malformed body is EINVAL.
func on[M any, P interface {
	*M
	p9wire.Message
}, K any](how int, as func(*fid) (K, bool), op func(K, context.Context, P) (p9wire.Message, syscall.Errno)) handler {
	return func(c *conn, ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
		var head p9wire.FidReq // every request on one fid names it first
		hd := p9wire.Dec{B: d.B}
		head.Decode(&hd)
		if hd.Err != nil {
			return nil, syscall.EINVAL // not even the fid: never fid 0
		}
		m := P(new(M))
		m.Decode(d)
		f, e := c.fid(head.Fid)
		if e != 0 {
			return nil, e
		}
		x := how&changes != 0
		if !f.use(x) {
			return nil, syscall.EBADF
		}
		defer f.done(x)
		k, ok := as(f)
		if !ok {
			return nil, syscall.EOPNOTSUPP
		}
		// The client may cache what it learns of the fid's file.
		ctx = f.enter(ctx)
		if d.Err != nil && how&lax == 0 {
			return nil, syscall.EINVAL
		}
		return op(k, ctx, m)
	}
}

// attach: n_uname, else uname in the user database, else nobody, if the
// connection's peer may attach as that uid (EPERM), with the groups its
// afid claims (creds.go) or else the user database's; the attach name is
// a root's, maybe followed by a path below it.
func (c *conn) attach(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	m := decode[p9wire.Attach](d)
	if m == nil {
		return nil, syscall.EINVAL
	}
	uid, e := c.attacher(m.Uname, m.NUname)
	if e != 0 {
		return nil, e
	}
	claim, e := c.credsOf(m.Afid, uid)
	if e != 0 {
		return nil, e
	}
	if c.full() {
		return nil, syscall.EMFILE
	}
	who := c.s.caller(uid)
	if claim != nil {
		who = *claim
	}
	if strings.Trim(m.Aname, "/") == journal.Aname {
		// The QID is the root's, not the fid's: once bound, a pipelined
		// request on the fid (a Tlcreate) may change what it names.
		at := jpos{typ: jRoot}
		if e := c.bind(m.Fid, c.newJournalFid(who, at), nil); e != 0 {
			return nil, e
		}
		return &p9wire.QidReply{T: p9wire.Tattach, Qid: at.qid()}, 0
	}
	f := c.newFid(who)
	p := place{fid: f}
	top, e := p.mount(ctx, "")
	if e != 0 {
		return nil, e
	}
	var names []string
	if rest := strings.Trim(m.Aname, "/"); rest != "" {
		names = strings.Split(rest, "/")
	}
	w, qids, e := p.walkFrom(ctx, walkState{at: top}, names)
	if e != 0 {
		return nil, e
	}
	if len(qids) < len(names) {
		return nil, syscall.ENOENT // the name after the last QID
	}
	// The attach's file is the top of its tree: ".." stops there.
	for _, u := range w.up {
		c.unref(u)
	}
	p.pos = w.at
	f.is = &fileFid{place: p}
	q := p.qid() // before the bind, as for the journal tree's
	if e := c.bind(m.Fid, f, nil); e != 0 {
		f.release()
		return nil, e
	}
	c.note(ctx, p.r, q)
	return &p9wire.QidReply{T: p9wire.Tattach, Qid: q}, 0
}

func (c *conn) walk(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	m := decode[p9wire.Walk](d)
	if m == nil {
		return nil, syscall.EINVAL
	}
	var qids []p9wire.Qid
	e := c.fork(m.Fid, m.NewFid, true, func(f *fid) (nf *fid, e syscall.Errno) {
		if len(m.Names) > 0 && c.full() {
			return nil, syscall.EMFILE // the new fid could not be bound
		}
		nf, qids, e = f.is.walk(ctx, m.Names)
		return nf, e
	})
	if e != 0 {
		return nil, e
	}
	return &p9wire.WalkReply{Qids: qids}, 0
}

func (c *conn) xattrwalk(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	m := decode[p9wire.Xattrwalk](d)
	if m == nil {
		return nil, syscall.EINVAL
	}
	var size uint64
	e := c.fork(m.Fid, m.NewFid, false, func(f *fid) (*fid, syscall.Errno) {
		ctx := f.enter(ctx)
		if c.full() {
			return nil, syscall.EMFILE
		}
		x, e := f.is.xattrwalk(ctx, m.Name)
		if e != 0 {
			return nil, e
		}
		size = uint64(len(x.val))
		return x.fid, 0
	})
	if e != 0 {
		return nil, e
	}
	return &p9wire.XattrwalkReply{Size: size}, 0
}

// fork serves a request that makes a fid from fid n, with n in use, and
// numbers it newfid: mk makes it, or nil when there is nothing to number
// (a walk that stopped short). A walk may number it n, which it replaces.
func (c *conn) fork(n, newfid uint32, walk bool, mk func(f *fid) (*fid, syscall.Errno)) syscall.Errno {
	f, e := c.fid(n)
	if e != 0 {
		return e
	}
	if !f.use(false) {
		return syscall.EBADF
	}
	nf, e := mk(f)
	f.done(false)
	if e != 0 || nf == nil {
		return e
	}
	var old *fid
	if walk && newfid == n {
		old = f
	}
	if e := c.bind(newfid, nf, old); e != 0 {
		nf.release()
		return e
	}
	return 0
}

// clunk forgets a fid; a value Txattrcreate gathered is set now, and its
// error is the clunk's.
func (c *conn) clunk(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	f, e := c.unbindReq(d)
	if e != 0 {
		return nil, e
	}
	return nil, f.clunk(ctx)
}

// remove removes a fid's file and clunks the fid, even when it fails.
func (c *conn) remove(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	f, e := c.unbindReq(d)
	if e != 0 {
		return nil, e
	}
	defer f.release()
	if !f.use(false) {
		return nil, syscall.EBADF
	}
	defer f.done(false)
	if _, ok := f.is.(*xattrFid); ok {
		return nil, syscall.EOPNOTSUPP // an xattr's value, not its file (clunked all the same)
	}
	p := f.fileAt()
	if p == nil {
		return nil, syscall.EBUSY // the journal tree's, as a root's
	}
	return nil, p.remove(f.opCtx(ctx))
}

// unbindReq unbinds the fid of a Tclunk or Tremove.
func (c *conn) unbindReq(d *p9wire.Dec) (*fid, syscall.Errno) {
	m := decode[p9wire.FidReq](d)
	if m == nil {
		return nil, syscall.EINVAL
	}
	return c.unbind(m.Fid)
}

// link makes a name in a directory a link to a fid's file.
func (c *conn) link(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	m := decode[p9wire.Link](d)
	if m == nil || badName(m.Name) {
		return nil, syscall.EINVAL
	}
	return nil, c.pair(m.Dfid, false, m.Fid, func(f, o *fid) syscall.Errno {
		n, t, e := across(f, o)
		if e != 0 {
			return e
		}
		var a layer.Attr
		cn, e := n.Link(f.opCtx(ctx), t, m.Name, &a)
		if e != 0 {
			return e
		}
		cn.Forget()
		return 0
	})
}

func (c *conn) renameat(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	m := decode[p9wire.Renameat](d)
	if m == nil || badName(m.OldName, m.NewName) {
		return nil, syscall.EINVAL
	}
	return nil, c.pair(m.OldDfid, false, m.NewDfid, func(f, o *fid) syscall.Errno {
		n, nd, e := across(f, o)
		if e != 0 {
			return e
		}
		ctx := f.opCtx(ctx)
		r := f.fileAt().r
		c.s.sp.reclaimNamed(ctx, r, n, m.OldName, c)
		c.s.sp.reclaimNamed(ctx, r, nd, m.NewName, c)
		return n.Rename(ctx, m.OldName, nd, m.NewName, 0)
	})
}

func (c *conn) rename(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	m := decode[p9wire.Rename](d)
	if m == nil || badName(m.Name) {
		return nil, syscall.EINVAL
	}
	return nil, c.pair(m.Fid, true, m.Dfid, func(f, o *fid) syscall.Errno {
		if o == f {
			return syscall.EINVAL // into itself
		}
		if _, ok := f.is.(*xattrFid); ok {
			return syscall.EOPNOTSUPP // an xattr's value, not its file
		}
		p := f.fileAt()
		if p == nil {
			return syscall.EBUSY // the journal tree's, as a root's
		}
		return p.rename(f.opCtx(ctx), o, m.Name)
	})
}

// pair serves op on fids a and b (which may be one), both in use for the
// whole of it, a exclusively if excl: neither changes what it is nor is
// released meanwhile. Two fids are taken in the order they were made, so
// that requests on the same two never wait for each other.
func (c *conn) pair(a uint32, excl bool, b uint32, op func(f, o *fid) syscall.Errno) syscall.Errno {
	f, e := c.fid(a)
	if e != 0 {
		return e
	}
	o, e := c.fid(b)
	if e != 0 {
		return e
	}
	if o == f {
		if !f.use(excl) {
			return syscall.EBADF
		}
		defer f.done(excl)
		return op(f, f)
	}
	type user struct {
		f    *fid
		excl bool
	}
	us := [2]user{{f, excl}, {o, false}}
	if o.seq < f.seq {
		us[0], us[1] = us[1], us[0]
	}
	if !us[0].f.use(us[0].excl) {
		return syscall.EBADF
	}
	defer us[0].f.done(us[0].excl)
	if !us[1].f.use(us[1].excl) {
		return syscall.EBADF
	}
	defer us[1].f.done(us[1].excl)
	return op(f, o)
}
