package export

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/journal"
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

// file is the state of one fid.
type file struct {
	c   *conn
	seq uint64 // the order files are made in: conn.pair takes two by it
	who layer.Caller
	pos
	up []pos  // for "..", Trename and Tremove
	jt *jnode // a fid of the journal tree (jtree.go), not of a root

	released bool // guarded by c.mu

	// mu orders operations (read), and the ones that change what the fid
	// is, and its release (write).
	mu     sync.RWMutex
	opened bool
	h      layer.Handle
	so     *spriteOpen // the open as Sprite's rules count it (sprite.go)
	d      layer.DirStream
	xval   []byte    // a Txattrwalk's value or name list
	xset   *xattrSet // what Txattrcreate gathers

	smu  sync.Mutex // the directory stream's position, the xattr being set
	dpos uint64     // offset the stream is at: the Off of the last entry sent
	pend *layer.DirEntry

	omu    sync.Mutex
	owners []uint64 // lock owners that took locks through h
}

// xattrSet is a value being set: Twrites fill it, Tclunk sets it.
type xattrSet struct {
	name  string
	flags uint32
	val   []byte
}

// opCtx is ctx carrying f's caller, through its root's view; f is in use.
func (f *file) opCtx(ctx context.Context) context.Context { return f.c.callerCtx(ctx, f.who, f.r) }

// use starts an operation on f, exclusive if it changes f: false if f has
// been released. done ends it.
func (f *file) use(excl bool) bool {
	if excl {
		f.mu.Lock()
	} else {
		f.mu.RLock()
	}
	f.c.mu.Lock()
	ok := !f.released
	f.c.mu.Unlock()
	if !ok {
		f.done(excl)
	}
	return ok
}

func (f *file) done(excl bool) {
	if excl {
		f.mu.Unlock()
	} else {
		f.mu.RUnlock()
	}
}

// release gives back everything f holds: the POSIX locks of the owners
// that locked through it, its handle or directory stream, its nodes.
func (f *file) release() {
	f.c.mu.Lock()
	if f.released {
		f.c.mu.Unlock()
		return
	}
	f.released = true
	f.c.mu.Unlock()
	f.stopReads()
	f.mu.Lock()
	h, d, so := f.h, f.d, f.so
	f.h, f.d, f.so = nil, nil, nil
	f.mu.Unlock()
	// The connection may have ended: what is given back is not cancelled.
	ctx := f.opCtx(f.c.base)
	if h != nil {
		f.omu.Lock()
		owners := f.owners
		f.owners = nil
		f.omu.Unlock()
		for _, o := range owners {
			h.Flush(ctx, o)
		}
		h.Release(ctx)
	}
	if so != nil {
		f.c.s.sp.close(so, f.c)
	}
	if d != nil {
		d.Close()
	}
	f.c.unref(f.pos)
	for _, p := range f.up {
		f.c.unref(p)
	}
}

// node returns f's layer node, or err for a synthetic directory.
func (f *file) node(err syscall.Errno) (layer.Node, syscall.Errno) {
	if f.rec == nil {
		return nil, err
	}
	return f.rec.n, 0
}

// createGid is the caller for an operation that makes an object with 9P's
// gid argument: the caller's gid for it if the caller is in that group.
func (f *file) createCtx(ctx context.Context, gid uint32) context.Context {
	if gid != p9wire.NoUID {
		gid = f.c.s.squashGid(gid)
	}
	if gid == p9wire.NoUID || gid == f.who.Gid {
		return ctx
	}
	if f.who.Uid != 0 && !slices.Contains(f.who.Supp, gid) {
		return ctx
	}
	w := f.who
	w.Gid = gid
	return f.c.callerCtx(ctx, w, f.r)
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

// walk walks names from f to a new file, which is nil when the walk
// stops short (the QIDs then are those of the names that were found).
func (f *file) walk(ctx context.Context, names []string) (*file, []p9wire.Qid, syscall.Errno) {
	if len(names) > 0 && f.full() {
		return nil, nil, syscall.EMFILE
	}
	if f.jt != nil {
		return f.jwalk(names)
	}
	w := walkState{at: f.pos, up: slices.Clone(f.up)}
	w.at.name = f.name
	f.c.ref(w.at)
	for _, p := range w.up {
		f.c.ref(p)
	}
	w, qids, e := f.walkFrom(ctx, w, names)
	if e != 0 || len(qids) < len(names) {
		return nil, qids, e
	}
	return &file{c: f.c, seq: f.c.seq.Add(1), who: f.who, pos: w.at, up: w.up}, qids, 0
}

// full tells whether the connection holds MaxFids: walks would be vain.
func (f *file) full() bool { return f.c.full() }

// walkFrom walks names from w, whose references it takes: all of them
// (the state it returns holds them), some (the walk stops short, and
// returns the QIDs of the names found, releasing the rest) or none (an
// error: the first name is not there).
func (f *file) walkFrom(ctx context.Context, w walkState, names []string) (walkState, []p9wire.Qid, syscall.Errno) {
	var qids []p9wire.Qid
	for i, name := range names {
		switch name {
		case ".":
		case "..":
			if n := len(w.up); n > 0 { // never above the attach
				f.c.unref(w.at)
				w.at, w.up = w.up[n-1], w.up[:n-1]
			}
		default:
			nx, e := f.step(ctx, w.at, name)
			if e != 0 {
				f.c.unref(w.at)
				for _, p := range w.up {
					f.c.unref(p)
				}
				if i == 0 {
					return walkState{}, nil, e
				}
				return walkState{}, qids, 0
			}
			w.up = append(w.up, w.at)
			w.at = nx
		}
		f.c.note(ctx, w.at.r, w.at.qid())
		qids = append(qids, w.at.qid())
	}
	return w, qids, 0
}

// step finds name below p: a root or a synthetic directory at the top of
// the tree, else a child of p's node.
func (f *file) step(ctx context.Context, p pos, name string) (pos, syscall.Errno) {
	if name == "" || strings.ContainsAny(name, "/\x00") {
		return pos{}, syscall.ENOENT // as Linux: no such entry
	}
	s := f.c.s
	if p.mounts {
		full := name
		if p.mnt != "" {
			full = p.mnt + "/" + name
		}
		_, isRoot := s.roots[full]
		_, isPrefix := s.prefixes[full]
		if isRoot || isPrefix {
			np, e := f.mount(ctx, full)
			np.name = name
			return np, e
		}
	}
	if p.rec == nil {
		return pos{}, syscall.ENOENT
	}
	var a layer.Attr
	cn, e := p.rec.n.Lookup(f.c.callerCtx(ctx, f.who, p.r), name, &a)
	if e != 0 {
		return pos{}, e
	}
	return pos{r: p.r, rec: f.c.hold(p.r, cn), mode: a.Mode & syscall.S_IFMT, name: name}, 0
}

// mount is the position at mnt of the top of the tree: the root of that
// name, or a synthetic directory above roots.
func (f *file) mount(ctx context.Context, mnt string) (pos, syscall.Errno) {
	r, ok := f.c.s.roots[mnt]
	if !ok {
		return pos{mode: syscall.S_IFDIR, mounts: true, mnt: mnt}, 0
	}
	var a layer.Attr
	if e := r.n.Getattr(f.c.callerCtx(ctx, f.who, r), nil, &a); e != 0 {
		return pos{}, e
	}
	return pos{r: r, rec: f.c.holdRoot(r), mode: a.Mode & syscall.S_IFMT, mounts: true, mnt: mnt}, 0
}

var synthAttr = layer.Attr{Mode: syscall.S_IFDIR | 0o555, Nlink: 2}

func (f *file) getattr(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	d.U64() // the mask: everything is cheap to tell
	if d.Err != nil {
		return syscall.EINVAL
	}
	r := p9wire.Rattr{Valid: p9wire.GetattrBasic | p9wire.GetattrGen, Qid: f.qid(), Attr: synthAttr}
	if f.rec != nil {
		if e := f.rec.n.Getattr(ctx, f.h, &r.Attr); e != 0 {
			return e
		}
		r.Gen = f.rec.n.Token().Gen
	}
	m.Getattr(&r)
	return 0
}

func (f *file) setattr(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	valid, mode, uid, gid, size := d.U32(), d.U32(), d.U32(), d.U32(), d.U64()
	asec, ansec, msec, mnsec := d.U64(), d.U64(), d.U64(), d.U64()
	if d.Err != nil {
		return syscall.EINVAL
	}
	n, e := f.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	var s layer.SetAttr
	if valid&p9wire.SetattrMode != 0 {
		s.Valid |= layer.SetMode
		s.Mode = mode & 0o7777
	}
	if valid&p9wire.SetattrUID != 0 {
		s.Valid |= layer.SetUid
		s.Uid = uid
	}
	if valid&p9wire.SetattrGID != 0 {
		s.Valid |= layer.SetGid
		s.Gid = gid
	}
	if valid&p9wire.SetattrSize != 0 {
		s.Valid |= layer.SetSize
		s.Size = size
	}
	// ATIME alone is "now"; with ATIME_SET the time given.
	if valid&p9wire.SetattrAtime != 0 {
		if valid&p9wire.SetattrAtimeSet != 0 {
			s.Valid |= layer.SetAtime
			s.Atime = timeOf(asec, ansec)
		} else {
			s.Valid |= layer.SetAtimeNow
		}
	}
	if valid&p9wire.SetattrMtime != 0 {
		if valid&p9wire.SetattrMtimeSet != 0 {
			s.Valid |= layer.SetMtime
			s.Mtime = timeOf(msec, mnsec)
		} else {
			s.Valid |= layer.SetMtimeNow
		}
	}
	if valid&p9wire.SetattrCtime != 0 && s.Valid == 0 {
		s.Valid = layer.SetCtime
	}
	if s.Valid == 0 {
		return 0
	}
	var out layer.Attr
	if e := n.Setattr(ctx, f.h, &s, &out); e != 0 {
		return e
	}
	if s.Valid&layer.SetSize != 0 && f.rec != nil {
		f.c.s.sp.changed(ctx, interestKey{f.r, f.qid().Path}, f.c)
	}
	return 0
}

func timeOf(sec, nsec uint64) time.Time {
	return time.Unix(int64(sec), int64(nsec%1e9))
}

// openFlags maps Tlopen's flags to this system's open(2) flags. Flags
// that make no sense for a server's descriptor (O_CLOEXEC, O_NOCTTY,
// O_ASYNC) or that would change how it must be used (O_DIRECT wants
// aligned buffers) are dropped, and so are O_CREAT and those about the
// path, which the walk has resolved.
func openFlags(w uint32) (uint32, syscall.Errno) {
	if w&syscall.O_ACCMODE == syscall.O_ACCMODE {
		return 0, syscall.EINVAL
	}
	const keep = unix.O_ACCMODE | unix.O_EXCL | unix.O_TRUNC | unix.O_APPEND | unix.O_NONBLOCK | unix.O_DSYNC | unix.O_NOATIME | unix.O_SYNC
	return p9wire.HostFlags(w) & keep, 0
}

func (f *file) lopen(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	w := d.U32()
	if d.Err != nil {
		return syscall.EINVAL
	}
	writeBack := w&journal.WriteBack != 0
	fl, e := openFlags(w &^ journal.WriteBack)
	if e != 0 {
		return e
	}
	if f.opened || f.xval != nil || f.xset != nil {
		return syscall.EBADF
	}
	q := f.qid()
	if f.rec != nil {
		// Only regular files and directories: opening a fifo would hang
		// the server, a device would be the server's, and clients (Linux
		// v9fs) serve special files themselves.
		n := f.rec.n
		switch f.mode {
		case syscall.S_IFDIR:
			if f.d, e = n.OpenDir(ctx); e != 0 {
				return e
			}
		case syscall.S_IFREG:
			switch {
			case !f.c.s.opts.Sprite:
			case !writeBack:
				write := fl&unix.O_ACCMODE != unix.O_RDONLY || fl&unix.O_TRUNC != 0
				if q.Vers, e = f.spriteOpen(ctx, write, false); e != 0 {
					return e
				}
			default:
				if e = f.c.s.sp.writeBack(interestKey{f.r, q.Path}, f.c); e != 0 {
					return e
				}
			}
			if f.h, e = n.Open(ctx, fl); e != 0 {
				f.spriteClose()
				return e
			}
		default:
			return syscall.EINVAL
		}
	}
	f.opened = true
	m.Qid(q)
	m.U32(0)
	return 0
}

// spriteOpen counts an open of f's regular file under Sprite's rules
// and returns the QID version to answer with.
func (f *file) spriteOpen(ctx context.Context, write, create bool) (uint32, syscall.Errno) {
	so := &spriteOpen{k: interestKey{f.r, f.qid().Path}, write: write}
	v, e := f.c.s.sp.open(ctx, so.k, f.c, write, create)
	if e == 0 {
		f.so = so
	}
	return v, e
}

// spriteClose undoes spriteOpen, for an open that failed after it.
func (f *file) spriteClose() {
	if f.so != nil {
		f.c.s.sp.close(f.so, f.c)
		f.so = nil
	}
}

// lcreate makes name in f's directory; f becomes the new file, open.
func (f *file) lcreate(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	name, w, mode, gid := d.Str(), d.U32(), d.U32(), d.U32()
	if d.Err != nil || badName(name) {
		return syscall.EINVAL
	}
	fl, e := openFlags(w)
	if e != 0 {
		return e
	}
	n, e := f.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	if f.opened || f.xval != nil || f.xset != nil {
		return syscall.EBADF
	}
	var a layer.Attr
	cn, h, e := n.Create(f.createCtx(ctx, gid), name, fl|unix.O_CREAT, mode&0o7777, &a)
	if e != 0 {
		return e
	}
	f.up = append(f.up, f.pos)
	f.pos = pos{r: f.r, rec: f.c.hold(f.r, cn), mode: a.Mode & syscall.S_IFMT, name: name}
	f.h, f.opened = h, true
	f.c.note(ctx, f.r, f.qid())
	q := f.qid()
	if f.c.s.opts.Sprite {
		if q.Vers, e = f.spriteOpen(ctx, true, true); e != 0 {
			return e // the file is made and open: the client's clunk releases it
		}
	}
	m.Qid(q)
	m.U32(0)
	return 0
}

func (f *file) read(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	off, count := d.U64(), d.U32()
	if d.Err != nil {
		return syscall.EINVAL
	}
	count = min(count, f.c.ioMax())
	if f.xval != nil {
		b := f.xval[min(off, uint64(len(f.xval))):]
		m.Bytes(b[:min(len(b), int(count))])
		return 0
	}
	if f.h == nil {
		return syscall.EBADF
	}
	if off > math.MaxInt64-uint64(count) {
		return syscall.EINVAL // as pread(2): the end would overflow
	}
	// Read into the reply, after its count.
	at := len(m.B)
	m.B = append(m.B, make([]byte, 4+int(count))...)
	k, e := f.h.Read(ctx, m.B[at+4:], int64(off))
	if e != 0 {
		return e
	}
	binary.LittleEndian.PutUint32(m.B[at:], uint32(k))
	m.B = m.B[:at+4+k]
	return 0
}

func (f *file) write(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	off, data := d.U64(), d.Bytes()
	if d.Err != nil {
		return syscall.EINVAL
	}
	if x := f.xset; x != nil {
		f.smu.Lock()
		defer f.smu.Unlock()
		if off > uint64(len(x.val)) || uint64(len(data)) > uint64(len(x.val))-off {
			return syscall.EINVAL // past the size Txattrcreate gave
		}
		copy(x.val[off:], data)
		m.U32(uint32(len(data)))
		return 0
	}
	if f.h == nil {
		return syscall.EBADF
	}
	if off > math.MaxInt64-uint64(len(data)) {
		return syscall.EINVAL // as pwrite(2): the end would overflow
	}
	k, e := f.h.Write(ctx, data, int64(off))
	if e != 0 {
		return e
	}
	if f.so != nil {
		f.c.s.sp.changed(ctx, f.so.k, f.c)
	}
	m.U32(uint32(k))
	return 0
}

func (f *file) fsync(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	// datasync[4] is Linux's; some clients (hugelgupf/p9's) send only fid.
	datasync := len(d.B) >= 4 && d.U32() != 0
	switch {
	case f.h != nil:
		return f.h.Fsync(ctx, datasync)
	case f.d != nil:
		return f.d.Fsync(ctx, datasync)
	}
	return 0
}

// direntSize is a dirent's size on the wire: qid[13] offset[8] type[1]
// name[s].
func direntSize(name string) int { return 13 + 8 + 1 + 2 + len(name) }

// dirent appends an entry to a Rreaddir; its type is the d_type.
func dirent(m *p9wire.Enc, q p9wire.Qid, off uint64, mode uint32, name string) {
	m.Qid(q)
	m.U64(off)
	m.U8(uint8(mode >> 12))
	m.Str(name)
}

// readdir answers the entries after offset that fit in count bytes, so
// that the stream stops where the reply does. Entries' QIDs are made of
// DirEntry.Ino and Type, without a Lookup each: Ino is informational in
// the layers (a generally-named layer's tokens may differ), and clients
// take inode numbers from walks; a Lookup per entry would cost more than
// the listing.
func (f *file) readdir(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	offset, count := d.U64(), d.U32()
	if d.Err != nil {
		return syscall.EINVAL
	}
	count = min(count, f.c.ioMax())
	at := len(m.B)
	m.U32(0)
	var e syscall.Errno
	if f.rec == nil {
		if !f.opened {
			return syscall.EBADF
		}
		f.synthReaddir(offset, int(count), m)
	} else {
		e = f.streamReaddir(ctx, offset, int(count), m)
	}
	binary.LittleEndian.PutUint32(m.B[at:], uint32(len(m.B)-at-4))
	return e
}

func (f *file) streamReaddir(ctx context.Context, offset uint64, count int, m *p9wire.Enc) syscall.Errno {
	if f.d == nil {
		return syscall.EBADF
	}
	f.smu.Lock()
	defer f.smu.Unlock()
	if offset != f.dpos {
		f.pend = nil
		if e := f.d.Seek(ctx, offset); e != 0 {
			return e
		}
		f.dpos = offset
	}
	for used := 0; ; {
		var ent layer.DirEntry
		if f.pend != nil {
			ent, f.pend = *f.pend, nil
		} else {
			var ok bool
			var e syscall.Errno
			ent, ok, e = f.d.Next(ctx)
			if e != 0 {
				if used > 0 {
					return 0 // the error comes again on the next call
				}
				return e
			}
			if !ok {
				return 0
			}
		}
		sz := direntSize(ent.Name)
		if used+sz > count {
			f.pend = &ent
			if used == 0 {
				return syscall.EINVAL // not even one entry fits
			}
			return 0
		}
		used += sz
		dirent(m, p9wire.Qid{Type: p9wire.QidType(ent.Type), Path: ent.Ino}, ent.Off, ent.Type, ent.Name)
		f.dpos = ent.Off
	}
}

// synthReaddir lists a synthetic directory: the next components of the
// root names below it, offsets counting entries.
func (f *file) synthReaddir(offset uint64, count int, m *p9wire.Enc) {
	var names []string
	seen := map[string]bool{}
	for name := range f.c.s.roots {
		rest, ok := name, f.mnt == ""
		if !ok {
			rest, ok = strings.CutPrefix(name, f.mnt+"/")
		}
		if !ok || rest == "" {
			continue
		}
		first, _, _ := strings.Cut(rest, "/")
		if !seen[first] {
			seen[first] = true
			names = append(names, first)
		}
	}
	slices.Sort(names)
	used := 0
	for i := offset; i < uint64(len(names)); i++ {
		name := names[i]
		if used += direntSize(name); used > count {
			break
		}
		full := name
		if f.mnt != "" {
			full = f.mnt + "/" + name
		}
		q := synthQID(full)
		if r, ok := f.c.s.roots[full]; ok {
			q = p9wire.Qid{Type: p9wire.QTDir, Path: r.n.Token().Ino}
		}
		dirent(m, q, i+1, syscall.S_IFDIR, name)
	}
}

func (f *file) readlink(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	n, e := f.node(syscall.EINVAL)
	if e != 0 {
		return e
	}
	b, e := n.Readlink(ctx)
	if e != 0 {
		return e
	}
	m.Str(string(b))
	return 0
}

func (f *file) statfs(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	const v9fsMagic = 0x01021997
	s := layer.Statfs{Bsize: 4096, NameLen: 255}
	if f.rec != nil {
		if e := f.rec.n.Statfs(ctx, &s); e != 0 {
			return e
		}
	}
	m.U32(v9fsMagic)
	m.U32(s.Bsize)
	for _, v := range []uint64{s.Blocks, s.Bfree, s.Bavail, s.Files, s.Ffree, 0} { // 0: fsid
		m.U64(v)
	}
	m.U32(s.NameLen)
	return 0
}

// maxXattr bounds xattr values and lists: Linux's XATTR_SIZE_MAX.
const maxXattr = 64 << 10

// xattrwalk makes a file of f's xattr name's value, or of its list of
// names for "".
func (f *file) xattrwalk(ctx context.Context, name string) (*file, syscall.Errno) {
	if f.full() {
		return nil, syscall.EMFILE
	}
	n, e := f.node(syscall.ENODATA)
	if name == "" && e != 0 {
		n, e = nil, 0 // a synthetic directory has no xattrs
	}
	if e != 0 {
		return nil, e
	}
	val := []byte{}
	if n != nil {
		get := func(dest []byte) (int, syscall.Errno) { return n.Getxattr(ctx, name, dest) }
		if name == "" {
			get = func(dest []byte) (int, syscall.Errno) { return n.Listxattr(ctx, dest) }
		}
		if val, e = sized(get); e != 0 {
			return nil, e
		}
	}
	nf := &file{c: f.c, seq: f.c.seq.Add(1), who: f.who, pos: f.pos, xval: val}
	f.c.ref(nf.pos)
	return nf, 0
}

// sized calls get, which works like getxattr(2), first for the size, then
// for the bytes; a value that grows in between is asked for again.
func sized(get func(dest []byte) (int, syscall.Errno)) ([]byte, syscall.Errno) {
	for range 4 {
		k, e := get(nil)
		if e != 0 {
			return nil, e
		}
		if k > maxXattr {
			return nil, syscall.E2BIG
		}
		if k == 0 {
			return []byte{}, 0
		}
		buf := make([]byte, k)
		k, e = get(buf)
		if e == syscall.ERANGE {
			continue
		}
		if e != 0 {
			return nil, e
		}
		return buf[:k], 0
	}
	return nil, syscall.ERANGE
}

// xattrcreate makes f the value of xattr name, which Twrites fill and
// Tclunk sets (commitXattr).
func (f *file) xattrcreate(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	name, size, flags := d.Str(), d.U64(), d.U32()
	if d.Err != nil {
		return syscall.EINVAL
	}
	if _, e := f.node(syscall.ENOTSUP); e != 0 {
		return e
	}
	if size > maxXattr {
		return syscall.E2BIG
	}
	if f.opened || f.xval != nil || f.xset != nil {
		return syscall.EBADF
	}
	f.xset = &xattrSet{name: name, flags: flags, val: make([]byte, size)}
	return 0
}

// commitXattr sets the value a Txattrcreate gathered, if f has one. As
// Linux's client sends it for removexattr(2), a size of 0 with
// XATTR_REPLACE removes; without, it sets an empty value.
func (f *file) commitXattr(ctx context.Context) syscall.Errno {
	if !f.use(true) {
		return syscall.EBADF
	}
	defer f.done(true)
	ctx = f.opCtx(ctx)
	x := f.xset
	if x == nil {
		return 0
	}
	f.xset = nil
	if len(x.val) == 0 && x.flags&unix.XATTR_REPLACE != 0 {
		return f.rec.n.Removexattr(ctx, x.name)
	}
	return f.rec.n.Setxattr(ctx, x.name, x.val, x.flags)
}

// lockOwner is the layers' lock owner of a 9P client's process: the
// connection, the client's name (Linux sends its node name) and its pid.
func (f *file) lockOwner(pid uint32, client string) uint64 {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:], f.c.id)
	binary.LittleEndian.PutUint32(b[8:], pid)
	h := xxhash.New()
	h.Write(b[:])
	h.WriteString(client)
	return h.Sum64()
}

// wireLock is a Tlock's or Tgetlock's range and type as a layer.Lock.
func wireLock(typ uint8, start, length uint64, pid uint32) (layer.Lock, syscall.Errno) {
	lk := layer.Lock{Start: start, End: math.MaxUint64, Pid: pid}
	if length != 0 {
		if length-1 > math.MaxUint64-start {
			return lk, syscall.EINVAL
		}
		lk.End = start + length - 1
	}
	switch typ {
	case p9wire.LockRead:
		lk.Type = syscall.F_RDLCK
	case p9wire.LockWrite:
		lk.Type = syscall.F_WRLCK
	case p9wire.LockUnlock:
		lk.Type = syscall.F_UNLCK
	default:
		return lk, syscall.EINVAL
	}
	return lk, 0
}

// lock sets or clears a POSIX lock. It never waits: a conflicting request
// is answered Blocked, which Linux's client retries while the process
// waits (F_SETLKW) or turns into EAGAIN (F_SETLK).
func (f *file) lock(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	typ, _, start, length, pid, client := d.U8(), d.U32(), d.U64(), d.U64(), d.U32(), d.Str()
	if d.Err != nil {
		return syscall.EINVAL
	}
	if f.h == nil {
		return syscall.EBADF
	}
	lk, e := wireLock(typ, start, length, pid)
	if e != 0 {
		return e
	}
	owner := f.lockOwner(pid, client)
	switch e := f.h.Setlk(ctx, owner, &lk, false); e {
	case 0:
	case syscall.EAGAIN:
		m.U8(p9wire.LockBlocked)
		return 0
	default:
		return e
	}
	if lk.Type != syscall.F_UNLCK {
		f.omu.Lock()
		if !slices.Contains(f.owners, owner) {
			f.owners = append(f.owners, owner)
		}
		f.omu.Unlock()
	}
	m.U8(p9wire.LockSuccess)
	return 0
}

// getlock answers the first lock that would conflict with the one asked,
// or the one asked as an unlock when none does (F_GETLK).
func (f *file) getlock(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	typ, start, length, pid, client := d.U8(), d.U64(), d.U64(), d.U32(), d.Str()
	if d.Err != nil {
		return syscall.EINVAL
	}
	if f.h == nil {
		return syscall.EBADF
	}
	lk, e := wireLock(typ, start, length, pid)
	if e != 0 {
		return e
	}
	if e := f.h.Getlk(ctx, f.lockOwner(pid, client), &lk); e != 0 {
		return e
	}
	switch lk.Type {
	case syscall.F_UNLCK:
		typ = p9wire.LockUnlock
	case syscall.F_RDLCK:
		typ = p9wire.LockRead
		client = ""
	default:
		typ = p9wire.LockWrite
		client = ""
	}
	length = 0
	if lk.End != math.MaxUint64 {
		length = lk.End - lk.Start + 1
	}
	m.U8(typ)
	m.U64(lk.Start)
	m.U64(length)
	m.U32(lk.Pid)
	m.Str(client)
	return 0
}

// made answers a request that made a node no fid refers to yet: its QID,
// and the node is Forgotten.
func (f *file) made(ctx context.Context, m *p9wire.Enc, c layer.Node, a *layer.Attr, e syscall.Errno) syscall.Errno {
	if e != 0 {
		return e
	}
	q := qidOf(c.Token(), a.Mode)
	f.c.note(ctx, f.r, q)
	m.Qid(q)
	c.Forget()
	return 0
}

func (f *file) mkdir(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	name, mode, gid := d.Str(), d.U32(), d.U32()
	if d.Err != nil || badName(name) {
		return syscall.EINVAL
	}
	n, e := f.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	var a layer.Attr
	c, e := n.Mkdir(f.createCtx(ctx, gid), name, mode&0o7777, &a)
	return f.made(ctx, m, c, &a, e)
}

func (f *file) symlink(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	name, target, gid := d.Str(), d.Str(), d.U32()
	if d.Err != nil || badName(name) {
		return syscall.EINVAL
	}
	n, e := f.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	var a layer.Attr
	c, e := n.Symlink(f.createCtx(ctx, gid), []byte(target), name, &a)
	return f.made(ctx, m, c, &a, e)
}

func (f *file) mknod(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	name, mode, major, minor, gid := d.Str(), d.U32(), d.U32(), d.U32(), d.U32()
	if d.Err != nil || badName(name) {
		return syscall.EINVAL
	}
	n, e := f.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	var a layer.Attr
	c, e := n.Mknod(f.createCtx(ctx, gid), name, mode&(syscall.S_IFMT|0o7777), unix.Mkdev(major, minor), &a)
	return f.made(ctx, m, c, &a, e)
}

// peer returns the node of o, which must be of f's root: the layers link
// and rename only within one. The caller has both in use (conn.pair).
func (f *file) peer(o *file) (layer.Node, syscall.Errno) {
	if o.r != f.r || o.rec == nil {
		return nil, syscall.EXDEV
	}
	return o.rec.n, 0
}

// link makes name in f, a directory, a link to o's file.
func (f *file) link(ctx context.Context, o *file, name string) syscall.Errno {
	n, e := f.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	t, e := f.peer(o)
	if e != 0 {
		return e
	}
	var a layer.Attr
	c, e := n.Link(ctx, t, name, &a)
	if e != 0 {
		return e
	}
	c.Forget()
	return 0
}

// renameat moves oldName of f, a directory, to newName of o.
func (f *file) renameat(ctx context.Context, oldName string, o *file, newName string) syscall.Errno {
	n, e := f.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	nd, e := f.peer(o)
	if e != 0 {
		return e
	}
	return n.Rename(ctx, oldName, nd, newName, 0)
}

// parent is the directory f was walked from and the name it had there:
// what Trename and Tremove act on. A root (or a synthetic directory above
// roots) is a mount: it has no entry of its own to act on (the name it
// shadows in the root above is another file), so it is EBUSY, as a mount
// point is.
func (f *file) parent() (layer.Node, syscall.Errno) {
	n := len(f.up)
	if n == 0 || f.mounts || f.rec == nil || f.up[n-1].rec == nil || f.up[n-1].r != f.r {
		return nil, syscall.EBUSY
	}
	return f.up[n-1].rec.n, 0
}

// rename moves f's file into directory o as name; f has itself to itself
// (conn.pair).
func (f *file) rename(ctx context.Context, o *file, name string) syscall.Errno {
	dir, e := f.parent()
	if e != 0 {
		return e
	}
	nd, e := f.peer(o)
	if e != 0 {
		return e
	}
	if e := f.still(ctx, dir); e != 0 {
		return e
	}
	if e := dir.Rename(ctx, f.name, nd, name, 0); e != 0 {
		return e
	}
	// f now hangs below o: its path is o's, and the old one goes.
	up := append(slices.Clone(o.up), o.pos)
	for _, p := range up {
		f.c.ref(p)
	}
	for _, p := range f.up {
		f.c.unref(p)
	}
	f.up = up
	f.name = name
	return 0
}

// still tells whether f's name in dir, its parent, is still f's file:
// ENOENT if someone else renamed or removed it.
func (f *file) still(ctx context.Context, dir layer.Node) syscall.Errno {
	var a layer.Attr
	cur, e := dir.Lookup(ctx, f.name, &a)
	if e != 0 {
		return e
	}
	same := cur.Token() == f.rec.n.Token()
	cur.Forget()
	if !same {
		return syscall.ENOENT
	}
	return 0
}

func (f *file) unlinkat(ctx context.Context, d *p9wire.Dec, m *p9wire.Enc) syscall.Errno {
	name, flags := d.Str(), d.U32()
	if d.Err != nil || badName(name) {
		return syscall.EINVAL
	}
	n, e := f.node(syscall.EROFS)
	if e != 0 {
		return e
	}
	if flags&unix.AT_REMOVEDIR != 0 {
		return n.Rmdir(ctx, name)
	}
	return n.Unlink(ctx, name)
}

// remove unlinks f's file from the directory it was walked from, if the
// name still is that file's.
func (f *file) remove(ctx context.Context) syscall.Errno {
	if !f.use(false) {
		return syscall.EBADF
	}
	defer f.done(false)
	ctx = f.opCtx(ctx)
	dir, e := f.parent()
	if e != 0 {
		return e
	}
	if e := f.still(ctx, dir); e != 0 {
		return e
	}
	if f.mode == syscall.S_IFDIR {
		return dir.Rmdir(ctx, f.name)
	}
	return dir.Unlink(ctx, f.name)
}
