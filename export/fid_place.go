package export

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// pos is a place in a connection's tree: a node of a root (rec != nil),
// or a synthetic directory above roots whose names have a '/' (or above
// them all when there is no default root).
type pos struct {
	r      *root
	rec    *nodeRec
	mode   uint32 // the type bits, for QIDs
	mounts bool   // names resolve to roots first, from mnt: the top of the tree
	mnt    string
	name   string // how it was reached from the position above
}

// walkState is where a walk is: a position and the ones above it, up to
// the attach's, each holding a reference to its node.
type walkState struct {
	at pos
	up []pos
}

// place is where a fid at a file of a root is, and what such a fid
// answers while it is not open: the kinds at a file (fileFid, xattrFid)
// embed it.
type place struct {
	*fid
	pos
	up []pos // for "..", Trename and Tremove
}

func (p *place) at() *place { return p }

// node returns p's layer node, or err for a synthetic directory.
func (p *place) node(err syscall.Errno) (layer.Node, syscall.Errno) {
	if p.rec == nil {
		return nil, err
	}
	return p.rec.n, 0
}

// createCtx is the caller for an operation that makes an object with 9P's
// gid argument: the caller's gid for it if the caller is in that group.
func (p *place) createCtx(ctx context.Context, gid uint32) context.Context {
	if gid != p9wire.NoUID {
		gid = p.c.s.squashGid(gid)
	}
	if gid == p9wire.NoUID || gid == p.who.Gid {
		return ctx
	}
	if p.who.Uid != 0 && !slices.Contains(p.who.Supp, gid) {
		return ctx
	}
	w := p.who
	w.Gid = gid
	return p.c.callerCtx(ctx, w, p.r)
}

// badName tells whether name cannot be one entry of a directory: the
// layers never see such names (the kernel stops them before FUSE).
func badName(names ...string) bool {
	for _, name := range names {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return true
		}
	}
	return false
}

func qidOf(tok layer.Token, mode uint32) p9wire.Qid {
	// Version stays 0: file versions come with the journal.
	return p9wire.Qid{Type: p9wire.QidType(mode), Path: tok.Ino}
}

// synthQID is the QID of a synthetic directory: far from any inode number.
func synthQID(mnt string) p9wire.Qid {
	return p9wire.Qid{Type: p9wire.QTDir, Path: xxhash.Sum64String("\x00"+mnt) | 1<<63}
}

func (p *pos) qid() p9wire.Qid {
	if p.rec == nil {
		return synthQID(p.mnt)
	}
	return qidOf(p.rec.n.Token(), p.mode)
}

// walk walks names from p to a new fid, which is nil when the walk stops
// short (the QIDs then are those of the names that were found).
func (p *place) walk(ctx context.Context, names []string) (*fid, []p9wire.Qid, syscall.Errno) {
	w := walkState{at: p.pos, up: slices.Clone(p.up)}
	p.c.ref(w.at)
	for _, u := range w.up {
		p.c.ref(u)
	}
	w, qids, e := p.walkFrom(ctx, w, names)
	if e != 0 || len(qids) < len(names) {
		return nil, qids, e
	}
	nf := p.c.newFid(p.who)
	nf.is = &fileFid{place: place{fid: nf, pos: w.at, up: w.up}}
	return nf, qids, 0
}

// walkFrom walks names from w, whose references it takes: all of them
// (the state it returns holds them), some (the walk stops short, and
// returns the QIDs of the names found, releasing the rest) or none (an
// error: the first name is not there).
func (p *place) walkFrom(ctx context.Context, w walkState, names []string) (walkState, []p9wire.Qid, syscall.Errno) {
	var qids []p9wire.Qid
	for i, name := range names {
		switch name {
		case ".":
		case "..":
			if n := len(w.up); n > 0 { // never above the attach
				p.c.unref(w.at)
				w.at, w.up = w.up[n-1], w.up[:n-1]
			}
		default:
			nx, e := p.step(ctx, w.at, name)
			if e != 0 {
				p.c.unref(w.at)
				for _, u := range w.up {
					p.c.unref(u)
				}
				if i == 0 {
					return walkState{}, nil, e
				}
				return walkState{}, qids, 0
			}
			w.up = append(w.up, w.at)
			w.at = nx
		}
		p.c.note(ctx, w.at.r, w.at.qid())
		qids = append(qids, w.at.qid())
	}
	return w, qids, 0
}

// step finds name below at: a root or a synthetic directory at the top of
// the tree, else a child of at's node.
func (p *place) step(ctx context.Context, at pos, name string) (pos, syscall.Errno) {
	if name == "" || strings.ContainsAny(name, "/\x00") {
		return pos{}, syscall.ENOENT // as Linux: no such entry
	}
	s := p.c.s
	if at.mounts {
		full := name
		if at.mnt != "" {
			full = at.mnt + "/" + name
		}
		_, isRoot := s.roots[full]
		_, isPrefix := s.prefixes[full]
		if isRoot || isPrefix {
			np, e := p.mount(ctx, full)
			np.name = name
			return np, e
		}
	}
	if at.rec == nil {
		return pos{}, syscall.ENOENT
	}
	var a layer.Attr
	cn, e := at.rec.n.Lookup(p.c.callerCtx(ctx, p.who, at.r), name, &a)
	if e != 0 {
		return pos{}, e
	}
	return pos{r: at.r, rec: p.c.hold(at.r, cn), mode: a.Mode & syscall.S_IFMT, name: name}, 0
}

// mount is the position at mnt of the top of the tree: the root of that
// name, or a synthetic directory above roots.
func (p *place) mount(ctx context.Context, mnt string) (pos, syscall.Errno) {
	r, ok := p.c.s.roots[mnt]
	if !ok {
		return pos{mode: syscall.S_IFDIR, mounts: true, mnt: mnt}, 0
	}
	var a layer.Attr
	if e := r.n.Getattr(p.c.callerCtx(ctx, p.who, r), nil, &a); e != 0 {
		return pos{}, e
	}
	return pos{r: r, rec: p.c.holdRoot(r), mode: a.Mode & syscall.S_IFMT, mounts: true, mnt: mnt}, 0
}

var synthAttr = layer.Attr{Mode: syscall.S_IFDIR | 0o555, Nlink: 2}

func (p *place) getattr(ctx context.Context, m *p9wire.Getattr) (p9wire.Message, syscall.Errno) {
	return p.attr(ctx, nil)
}

// attr answers a Tgetattr (the mask is ignored: everything is cheap to
// tell), through h if p is open.
func (p *place) attr(ctx context.Context, h layer.Handle) (p9wire.Message, syscall.Errno) {
	r := &p9wire.Rattr{Valid: p9wire.GetattrBasic | p9wire.GetattrGen, Qid: p.qid(), Attr: synthAttr}
	if p.rec != nil {
		if e := p.rec.n.Getattr(ctx, h, &r.Attr); e != 0 {
			return nil, e
		}
		if p.c.s.opts.Sprite && p.mode&syscall.S_IFMT == syscall.S_IFREG {
			// Another client's delayed writes (sprite_held.go).
			if e := p.c.s.sp.overlayHeld(ctx, interestKey{p.r, r.Qid.Path}, p.c, &r.Attr); e != 0 {
				return nil, e
			}
		}
		r.Gen = p.rec.n.Token().Gen
	}
	return r, 0
}

func (p *place) setattr(ctx context.Context, m *p9wire.Setattr) (p9wire.Message, syscall.Errno) {
	return nil, p.setattrs(ctx, nil, m)
}

// setattrs serves a Tsetattr, through h if p is open.
func (p *place) setattrs(ctx context.Context, h layer.Handle, m *p9wire.Setattr) syscall.Errno {
	n, e := p.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	var s layer.SetAttr
	if m.Valid&p9wire.SetattrMode != 0 {
		s.Valid |= layer.SetMode
		s.Mode = m.Mode & 0o7777
	}
	if m.Valid&p9wire.SetattrUID != 0 {
		s.Valid |= layer.SetUid
		s.Uid = m.Uid
	}
	if m.Valid&p9wire.SetattrGID != 0 {
		s.Valid |= layer.SetGid
		s.Gid = m.Gid
	}
	if m.Valid&p9wire.SetattrSize != 0 {
		s.Valid |= layer.SetSize
		s.Size = m.Size
	}
	// ATIME alone is "now"; with ATIME_SET the time given. So for MTIME.
	for _, t := range []struct {
		bit, given uint32
		now, at    layer.SetAttrMask
		sec, nsec  uint64
		out        *time.Time
	}{
		{p9wire.SetattrAtime, p9wire.SetattrAtimeSet, layer.SetAtimeNow, layer.SetAtime, m.Atime, m.AtimeNsec, &s.Atime},
		{p9wire.SetattrMtime, p9wire.SetattrMtimeSet, layer.SetMtimeNow, layer.SetMtime, m.Mtime, m.MtimeNsec, &s.Mtime},
	} {
		switch {
		case m.Valid&t.bit == 0:
		case m.Valid&t.given == 0:
			s.Valid |= t.now
		default:
			s.Valid |= t.at
			*t.out = timeOf(t.sec, t.nsec)
		}
	}
	if m.Valid&p9wire.SetattrCtime != 0 && s.Valid == 0 {
		s.Valid = layer.SetCtime
	}
	if s.Valid == 0 {
		return 0
	}
	var out layer.Attr
	e = n.Setattr(ctx, h, &s, &out)
	if e == syscall.EPERM && killsPriv(ctx, n, h, &s) && n.Setattr(ctx, h, &s, &out) == 0 {
		e = 0 // else the chmod's own EPERM, not the write check's EACCES
	}
	if e != 0 {
		return e
	}
	if s.Valid&layer.SetSize != 0 {
		p.c.s.sp.changed(ctx, interestKey{p.r, p.qid().Path}, p.c)
	}
	return 0
}

// killsPriv tells whether s, refused, is the mode change a client's
// kernel sends for a write or truncation by a caller other than the
// owner (9P2000.L cannot say so): the file's mode without some (or none)
// of its setuid and setgid bits, and nothing else changed. It marks it so
// (SetKillSuidgid): anyone who may write the file may make it.
func killsPriv(ctx context.Context, n layer.Node, h layer.Handle, s *layer.SetAttr) bool {
	if s.Valid&layer.SetMode == 0 {
		return false
	}
	var a layer.Attr
	if n.Getattr(ctx, h, &a) != 0 || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return false
	}
	cur := a.Mode & 0o7777
	// Nothing to clear is one too: a truncation by the caller, just made
	// below, cleared them already.
	if kill := cur &^ s.Mode; kill&^(syscall.S_ISUID|syscall.S_ISGID) != 0 || s.Mode&^cur != 0 {
		return false
	}
	s.Valid |= layer.SetKillSuidgid
	return true
}

func timeOf(sec, nsec uint64) time.Time {
	return time.Unix(int64(sec), int64(nsec%1e9))
}

func (p *place) statfs(ctx context.Context, m *p9wire.FidReq) (p9wire.Message, syscall.Errno) {
	const v9fsMagic = 0x01021997
	s := layer.Statfs{Bsize: 4096, NameLen: 255}
	if p.rec != nil {
		if e := p.rec.n.Statfs(ctx, &s); e != 0 {
			return nil, e
		}
	}
	return &p9wire.StatfsReply{FsType: v9fsMagic, Bsize: s.Bsize, Blocks: s.Blocks, Bfree: s.Bfree,
		Bavail: s.Bavail, Files: s.Files, Ffree: s.Ffree, Namelen: s.NameLen}, 0
}

// A place is not open: it has nothing to list, sync or lock.

func (p *place) readdir(context.Context, *p9wire.Read) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EBADF
}

func (p *place) fsync(context.Context, *p9wire.Fsync) (p9wire.Message, syscall.Errno) {
	return nil, 0
}

func (p *place) lock(context.Context, *p9wire.Lock) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EBADF
}

func (p *place) getlock(context.Context, *p9wire.Getlock) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EBADF
}

func (p *place) interrupt()                          {}
func (p *place) clunk(context.Context) syscall.Errno { return 0 }

// free gives back p's references.
func (p *place) free(context.Context) {
	p.c.unref(p.pos)
	for _, u := range p.up {
		p.c.unref(u)
	}
}
