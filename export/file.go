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
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
)

// file is what the library's fids refer to. It is one of:
//
//   - an attach root (who == nil): the synthetic directory Attach returns,
//     whose only names are identity names;
//   - a synthetic directory (rec == nil): the level below an identity when
//     there is no default root, or a component of root names with '/';
//   - a node of a root (rec != nil).
//
// Files at the top of the tree (mounts) resolve root names before the
// names of their node: that is how an attach name reaches its root.
type file struct {
	c      *conn
	who    *layer.Caller   // nil for an attach root
	ctx    context.Context // carries who, with r's view
	r      *root           // nil for synthetic files
	rec    *nodeRec
	mode   uint32 // the type bits, for QIDs
	mounts bool   // names resolve to roots first, from mnt
	mnt    string

	released bool // guarded by c.mu

	// What works around hugelgupf/p9 v0.3.0's count of xattr fids (see
	// xattrWalked): guarded by c.mu.
	parent      *file // the file the library holds as this one's parent fid
	extraCloses int   // Closes still to come from xattr fids sharing f
	lingers     bool  // the library may Close f while it is in use

	// mu orders operations (read) before release (write).
	mu     sync.RWMutex
	opened bool
	h      layer.Handle
	d      layer.DirStream

	dmu  sync.Mutex // the directory stream's position
	dpos uint64     // offset the stream is at: the Off of the last entry sent
	pend *layer.DirEntry

	omu    sync.Mutex
	owners []uint64 // lock owners that took locks through h
}

var _ p9.File = (*file)(nil)

// Close is the library's last reference going, or one it miscounted
// (xattrWalked).
func (f *file) Close() error {
	f.c.mu.Lock()
	if f.extraCloses > 0 {
		f.extraCloses--
		f.c.mu.Unlock()
		return nil
	}
	delete(f.c.files, f)
	if f.lingers {
		f.c.lingering = append(f.c.lingering, f)
		f.c.mu.Unlock()
		return nil
	}
	f.c.mu.Unlock()
	f.release()
	return nil
}

// xattrWalked accounts for an xattr fid the library is about to make of f
// (after a GetXattr or ListXattrs, and only then, it does). It shares f's
// File without a reference, so clunking it Closes f once more than f's own
// fids do; and it drops a reference on f's parent fid it never took, so the
// parent, and from there its ancestors, may be Closed while still in use.
// Those then linger, served as before, until the connection ends.
func (f *file) xattrWalked() {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	f.extraCloses++
	for p := f.parent; p != nil && !p.lingers; p = p.parent {
		p.lingers = true
	}
}

// release gives back everything f holds: the POSIX locks of the owners
// that locked through it, its handle or directory stream, its node.
func (f *file) release() {
	f.c.mu.Lock()
	if f.released {
		f.c.mu.Unlock()
		return
	}
	f.released = true
	f.c.mu.Unlock()
	f.mu.Lock()
	h, d := f.h, f.d
	f.h, f.d = nil, nil
	f.mu.Unlock()
	if h != nil {
		f.omu.Lock()
		owners := f.owners
		f.owners = nil
		f.omu.Unlock()
		for _, o := range owners {
			h.Flush(f.ctx, o)
		}
		h.Release(f.ctx)
	}
	if d != nil {
		d.Close()
	}
	if f.rec != nil {
		f.c.drop(f.rec)
	}
}

// use starts an operation on f: false if f has been released (by the
// library's miscount or the connection's end), which it then answers
// EBADF. done ends it.
func (f *file) use() bool {
	f.mu.RLock()
	f.c.mu.Lock()
	ok := !f.released
	f.c.mu.Unlock()
	if !ok {
		f.mu.RUnlock()
	}
	return ok
}

func (f *file) done() { f.mu.RUnlock() }

// errno turns a layer's error into the library's, which it sends as is:
// a syscall.Errno would be mapped through os errors first, which turns
// EPERM into EACCES and ENOTEMPTY into EEXIST.
func errno(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return linux.Errno(e)
}

// node returns f's layer node, or the error for a synthetic file.
func (f *file) node() (layer.Node, error) {
	if f.rec == nil {
		return nil, linux.EROFS
	}
	return f.rec.n, nil
}

// newFile makes the file of a node below f (or of a root), registered with
// the connection. rec is consumed.
func (f *file) newFile(r *root, rec *nodeRec, mode uint32, mounts bool, mnt string) (*file, error) {
	nf := &file{c: f.c, who: f.who, ctx: f.c.callerCtx(f.who, r), r: r, rec: rec, mode: mode & syscall.S_IFMT, mounts: mounts, mnt: mnt}
	if err := f.c.add(nf); err != nil {
		if rec != nil {
			f.c.drop(rec)
		}
		return nil, err
	}
	return nf, nil
}

// callerCtx is the context of the operations of a file of root r for who.
func (c *conn) callerCtx(who *layer.Caller, r *root) context.Context {
	if who == nil {
		return c.ctx
	}
	w := *who
	if r != nil {
		w.View = r.view
	}
	return layer.WithCaller(c.ctx, w)
}

// createCtx is ctx for an operation that makes an object with 9P's gid
// argument: the caller's gid for it if the caller is in that group.
func (f *file) createCtx(gid p9.GID) context.Context {
	if !gid.Ok() || f.who == nil || uint32(gid) == f.who.Gid {
		return f.ctx
	}
	if f.who.Uid != 0 && !slices.Contains(f.who.Supp, uint32(gid)) {
		return f.ctx
	}
	w := *f.who
	w.Gid = uint32(gid)
	if f.r != nil {
		w.View = f.r.view
	}
	return layer.WithCaller(f.c.ctx, w)
}

func qidOf(tok layer.Token, mode uint32) p9.QID {
	// Version stays 0: file versions come with the journal.
	return p9.QID{Type: p9.FileMode(mode).QIDType(), Path: tok.Ino}
}

// synthQID is the QID of a synthetic directory: far from any inode number.
func synthQID(mnt string) p9.QID {
	return p9.QID{Type: p9.TypeDir, Path: xxhash.Sum64String("\x00"+mnt) | 1<<63}
}

var fullMask = p9.AttrMask{Mode: true, NLink: true, UID: true, GID: true, RDev: true, ATime: true, MTime: true, CTime: true, INo: true, Size: true, Blocks: true, Gen: true}

func toAttr(a *layer.Attr, tok layer.Token) p9.Attr {
	return p9.Attr{
		Mode: p9.FileMode(a.Mode), UID: p9.UID(a.Uid), GID: p9.GID(a.Gid),
		NLink: p9.NLink(a.Nlink), RDev: p9.Dev(a.Rdev), Size: a.Size,
		BlockSize: uint64(a.Blksize), Blocks: a.Blocks,
		ATimeSeconds: uint64(a.Atime.Unix()), ATimeNanoSeconds: uint64(a.Atime.Nanosecond()),
		MTimeSeconds: uint64(a.Mtime.Unix()), MTimeNanoSeconds: uint64(a.Mtime.Nanosecond()),
		CTimeSeconds: uint64(a.Ctime.Unix()), CTimeNanoSeconds: uint64(a.Ctime.Nanosecond()),
		Gen: tok.Gen,
	}
}

var synthAttr = p9.Attr{Mode: p9.ModeDirectory | 0o555, NLink: 2}

// Walk walks zero names (a copy of f) or one; the library never asks more.
func (f *file) Walk(names []string) ([]p9.QID, p9.File, error) {
	qids, nf, _, _, err := f.WalkGetAttr(names)
	return qids, nf, err
}

func (f *file) WalkGetAttr(names []string) ([]p9.QID, p9.File, p9.AttrMask, p9.Attr, error) {
	if !f.use() {
		return nil, nil, p9.AttrMask{}, p9.Attr{}, linux.EBADF
	}
	defer f.done()
	switch len(names) {
	case 0:
		nf, err := f.clone()
		if err != nil {
			return nil, nil, p9.AttrMask{}, p9.Attr{}, err
		}
		nf.parent = f.parent // as the library's copy of the fid
		_, mask, attr, err := nf.getAttr()
		if err != nil {
			nf.Close()
			return nil, nil, p9.AttrMask{}, p9.Attr{}, err
		}
		return nil, nf, mask, attr, nil
	case 1:
		nf, qid, attr, err := f.walk(names[0])
		if err != nil {
			return nil, nil, p9.AttrMask{}, p9.Attr{}, err
		}
		nf.parent = f
		return []p9.QID{qid}, nf, fullMask, attr, nil
	}
	return nil, nil, p9.AttrMask{}, p9.Attr{}, linux.EINVAL
}

// clone makes another file of what f is, unopened.
func (f *file) clone() (*file, error) {
	nf := &file{c: f.c, who: f.who, ctx: f.ctx, r: f.r, rec: f.rec, mode: f.mode, mounts: f.mounts, mnt: f.mnt}
	if err := f.c.add(nf); err != nil {
		return nil, err
	}
	if nf.rec != nil {
		f.c.mu.Lock()
		nf.rec.refs++
		f.c.mu.Unlock()
	}
	return nf, nil
}

// walk finds name below f.
func (f *file) walk(name string) (*file, p9.QID, p9.Attr, error) {
	s := f.c.s
	if f.who == nil {
		uid, ok := p9net.ParseIdentity(name)
		if !ok {
			return nil, p9.QID{}, p9.Attr{}, linux.ENOENT
		}
		who := s.caller(uid)
		// f is the attach root: its files are the caller's.
		top := &file{c: f.c, who: &who}
		return top.mount("")
	}
	if f.mounts {
		full := name
		if f.mnt != "" {
			full = f.mnt + "/" + name
		}
		if _, ok := s.roots[full]; ok {
			return f.mount(full)
		}
		if _, ok := s.prefixes[full]; ok {
			return f.mount(full)
		}
	}
	n, err := f.node()
	if err != nil {
		return nil, p9.QID{}, p9.Attr{}, linux.ENOENT
	}
	if f.c.full() {
		return nil, p9.QID{}, p9.Attr{}, linux.EMFILE
	}
	var a layer.Attr
	cn, e := n.Lookup(f.ctx, name, &a)
	if e != 0 {
		return nil, p9.QID{}, p9.Attr{}, errno(e)
	}
	tok := cn.Token()
	nf, err := f.newFile(f.r, f.c.hold(f.r, cn), a.Mode, false, "")
	if err != nil {
		return nil, p9.QID{}, p9.Attr{}, err
	}
	return nf, qidOf(tok, a.Mode), toAttr(&a, tok), nil
}

// mount makes the file at mnt of the top of the tree: the root of that
// name, or a synthetic directory above roots, for f's caller.
func (f *file) mount(mnt string) (*file, p9.QID, p9.Attr, error) {
	s := f.c.s
	r, ok := s.roots[mnt]
	if !ok {
		nf, err := f.newFileFor(f.who, nil, nil, syscall.S_IFDIR, mnt)
		if err != nil {
			return nil, p9.QID{}, p9.Attr{}, err
		}
		return nf, synthQID(mnt), synthAttr, nil
	}
	var a layer.Attr
	ctx := f.c.callerCtx(f.who, r)
	if e := r.n.Getattr(ctx, nil, &a); e != 0 {
		return nil, p9.QID{}, p9.Attr{}, errno(e)
	}
	nf, err := f.newFileFor(f.who, r, f.c.holdRoot(r), a.Mode, mnt)
	if err != nil {
		return nil, p9.QID{}, p9.Attr{}, err
	}
	tok := r.n.Token()
	return nf, qidOf(tok, a.Mode), toAttr(&a, tok), nil
}

// newFileFor is newFile for a file at the top of the tree, for who.
func (f *file) newFileFor(who *layer.Caller, r *root, rec *nodeRec, mode uint32, mnt string) (*file, error) {
	nf := &file{c: f.c, who: who, ctx: f.c.callerCtx(who, r), r: r, rec: rec, mode: mode & syscall.S_IFMT, mounts: true, mnt: mnt}
	if err := f.c.add(nf); err != nil {
		if rec != nil {
			f.c.drop(rec)
		}
		return nil, err
	}
	return nf, nil
}

func (f *file) GetAttr(req p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	if !f.use() {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, linux.EBADF
	}
	defer f.done()
	return f.getAttr()
}

func (f *file) getAttr() (p9.QID, p9.AttrMask, p9.Attr, error) {
	if f.rec == nil {
		return synthQID(f.mnt), fullMask, synthAttr, nil
	}
	var a layer.Attr
	if e := f.rec.n.Getattr(f.ctx, f.h, &a); e != 0 {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, errno(e)
	}
	tok := f.rec.n.Token()
	return qidOf(tok, a.Mode), fullMask, toAttr(&a, tok), nil
}

func (f *file) SetAttr(valid p9.SetAttrMask, attr p9.SetAttr) error {
	if !f.use() {
		return linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return err
	}
	var s layer.SetAttr
	if valid.Permissions {
		s.Valid |= layer.SetMode
		s.Mode = uint32(attr.Permissions) & 0o7777
	}
	if valid.UID {
		s.Valid |= layer.SetUid
		s.Uid = uint32(attr.UID)
	}
	if valid.GID {
		s.Valid |= layer.SetGid
		s.Gid = uint32(attr.GID)
	}
	if valid.Size {
		s.Valid |= layer.SetSize
		s.Size = attr.Size
	}
	// ATIME alone is "now"; with ATIME_SET the time given.
	if valid.ATime {
		if valid.ATimeNotSystemTime {
			s.Valid |= layer.SetAtime
			s.Atime = timeOf(attr.ATimeSeconds, attr.ATimeNanoSeconds)
		} else {
			s.Valid |= layer.SetAtimeNow
		}
	}
	if valid.MTime {
		if valid.MTimeNotSystemTime {
			s.Valid |= layer.SetMtime
			s.Mtime = timeOf(attr.MTimeSeconds, attr.MTimeNanoSeconds)
		} else {
			s.Valid |= layer.SetMtimeNow
		}
	}
	if valid.CTime && s.Valid == 0 {
		s.Valid = layer.SetCtime
	}
	if s.Valid == 0 {
		return nil
	}
	var out layer.Attr
	return errno(n.Setattr(f.ctx, f.h, &s, &out))
}

func timeOf(sec, nsec uint64) time.Time {
	return time.Unix(int64(sec), int64(nsec%1e9))
}

// openFlags maps Tlopen's flags (9P2000.L's, Linux's x86 values) to this
// system's open(2) flags. Flags that make no sense for a server's
// descriptor (O_CLOEXEC, O_NOCTTY, O_ASYNC) or that would change how it
// must be used (O_DIRECT wants aligned buffers) are dropped.
func openFlags(fl p9.OpenFlags) (uint32, error) {
	var o uint32
	switch fl & p9.OpenFlagsModeMask {
	case p9.ReadOnly:
		o = unix.O_RDONLY
	case p9.WriteOnly:
		o = unix.O_WRONLY
	case p9.ReadWrite:
		o = unix.O_RDWR
	default:
		return 0, linux.EINVAL
	}
	for _, m := range [...]struct{ dotl, os uint32 }{
		{0o200, unix.O_EXCL},
		{0o1000, unix.O_TRUNC},
		{0o2000, unix.O_APPEND},
		{0o4000, unix.O_NONBLOCK},
		{0o10000, unix.O_DSYNC},
		{0o1000000, unix.O_NOATIME},
		{0o4000000, unix.O_SYNC},
	} {
		if uint32(fl)&m.dotl != 0 {
			o |= m.os
		}
	}
	return o, nil
}

func (f *file) Open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	fl, err := openFlags(mode)
	if err != nil {
		return p9.QID{}, 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.c.mu.Lock()
	released := f.released
	f.c.mu.Unlock()
	// An xattr fid shares its file: it is opened once only.
	if released || f.opened {
		return p9.QID{}, 0, linux.EBADF
	}
	if f.rec == nil {
		f.opened = true
		return synthQID(f.mnt), 0, nil
	}
	// Only regular files and directories: opening a fifo would hang the
	// server, a device would be the server's, and clients (Linux v9fs)
	// serve special files themselves.
	if f.mode != syscall.S_IFREG && f.mode != syscall.S_IFDIR {
		return p9.QID{}, 0, linux.EINVAL
	}
	n := f.rec.n
	if f.mode == syscall.S_IFDIR {
		d, e := n.OpenDir(f.ctx)
		if e != 0 {
			return p9.QID{}, 0, errno(e)
		}
		f.d, f.opened = d, true
	} else {
		h, e := n.Open(f.ctx, fl)
		if e != 0 {
			return p9.QID{}, 0, errno(e)
		}
		f.h, f.opened = h, true
	}
	return qidOf(n.Token(), f.mode), 0, nil
}

func (f *file) ReadAt(p []byte, offset int64) (int, error) {
	if !f.use() {
		return 0, linux.EBADF
	}
	defer f.done()
	if f.h == nil || offset < 0 {
		return 0, linux.EBADF
	}
	k, e := f.h.Read(f.ctx, p, offset)
	return k, errno(e)
}

func (f *file) WriteAt(p []byte, offset int64) (int, error) {
	if !f.use() {
		return 0, linux.EBADF
	}
	defer f.done()
	if f.h == nil || offset < 0 {
		return 0, linux.EBADF
	}
	k, e := f.h.Write(f.ctx, p, offset)
	return k, errno(e)
}

func (f *file) FSync() error {
	if !f.use() {
		return linux.EBADF
	}
	defer f.done()
	switch {
	case f.h != nil:
		return errno(f.h.Fsync(f.ctx, false))
	case f.d != nil:
		return errno(f.d.Fsync(f.ctx, false))
	}
	return nil
}

// direntSize is a Dirent's size on the wire: qid[13] offset[8] type[1]
// name[s].
func direntSize(name string) int { return 13 + 8 + 1 + 2 + len(name) }

// Readdir returns the entries after offset that fit in count bytes, so
// that the stream stops where the reply does. Entries' QIDs are made of
// DirEntry.Ino and Type, without a Lookup each: Ino is informational in
// the layers (a generally-named layer's tokens may differ), and clients
// take inode numbers from walks; a Lookup per entry would cost more than
// the listing.
func (f *file) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	if !f.use() {
		return nil, linux.EBADF
	}
	defer f.done()
	if f.rec == nil {
		if f.who == nil {
			return nil, nil // an attach root lists nothing: names are identities
		}
		return f.synthReaddir(offset, count)
	}
	if f.d == nil {
		return nil, linux.EBADF
	}
	f.dmu.Lock()
	defer f.dmu.Unlock()
	if offset != f.dpos {
		f.pend = nil
		if e := f.d.Seek(f.ctx, offset); e != 0 {
			return nil, errno(e)
		}
		f.dpos = offset
	}
	var out p9.Dirents
	used := 0
	for {
		var e layer.DirEntry
		if f.pend != nil {
			e, f.pend = *f.pend, nil
		} else {
			var ok bool
			var en syscall.Errno
			e, ok, en = f.d.Next(f.ctx)
			if en != 0 {
				if len(out) > 0 {
					return out, nil // the error comes again on the next call
				}
				return nil, errno(en)
			}
			if !ok {
				return out, nil
			}
		}
		sz := direntSize(e.Name)
		if used+sz > int(count) {
			f.pend = &e
			if len(out) == 0 {
				return nil, linux.EINVAL // not even one entry fits
			}
			return out, nil
		}
		used += sz
		t := p9.FileMode(e.Type).QIDType()
		out = append(out, p9.Dirent{QID: p9.QID{Type: t, Path: e.Ino}, Offset: e.Off, Type: t, Name: e.Name})
		f.dpos = e.Off
	}
}

// synthReaddir lists a synthetic directory: the next components of the
// root names below it, offsets counting entries.
func (f *file) synthReaddir(offset uint64, count uint32) (p9.Dirents, error) {
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
	var out p9.Dirents
	used := 0
	for i := offset; i < uint64(len(names)); i++ {
		name := names[i]
		if used += direntSize(name); used > int(count) {
			break
		}
		full := name
		if f.mnt != "" {
			full = f.mnt + "/" + name
		}
		q := synthQID(full)
		if r, ok := f.c.s.roots[full]; ok {
			q = p9.QID{Type: p9.TypeDir, Path: r.n.Token().Ino}
		}
		out = append(out, p9.Dirent{QID: q, Offset: i + 1, Type: q.Type, Name: name})
	}
	return out, nil
}

func (f *file) Readlink() (string, error) {
	if !f.use() {
		return "", linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return "", linux.EINVAL
	}
	b, e := n.Readlink(f.ctx)
	return string(b), errno(e)
}

func (f *file) StatFS() (p9.FSStat, error) {
	if !f.use() {
		return p9.FSStat{}, linux.EBADF
	}
	defer f.done()
	const v9fsMagic = 0x01021997
	n, err := f.node()
	if err != nil {
		return p9.FSStat{Type: v9fsMagic, BlockSize: 4096, NameLength: 255}, nil
	}
	var s layer.Statfs
	if e := n.Statfs(f.ctx, &s); e != 0 {
		return p9.FSStat{}, errno(e)
	}
	return p9.FSStat{
		Type: v9fsMagic, BlockSize: s.Bsize,
		Blocks: s.Blocks, BlocksFree: s.Bfree, BlocksAvailable: s.Bavail,
		Files: s.Files, FilesFree: s.Ffree, NameLength: s.NameLen,
	}, nil
}

// maxXattr bounds xattr values and lists: Linux's XATTR_SIZE_MAX.
const maxXattr = 64 << 10

func (f *file) GetXattr(attr string) ([]byte, error) {
	if !f.use() {
		return nil, linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return nil, linux.ENODATA
	}
	b, err := sized(func(dest []byte) (int, syscall.Errno) { return n.Getxattr(f.ctx, attr, dest) })
	if err == nil {
		f.xattrWalked()
	}
	return b, err
}

func (f *file) ListXattrs() ([]string, error) {
	if !f.use() {
		return nil, linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		f.xattrWalked()
		return nil, nil
	}
	b, err := sized(func(dest []byte) (int, syscall.Errno) { return n.Listxattr(f.ctx, dest) })
	if err != nil {
		return nil, err
	}
	f.xattrWalked()
	var names []string
	for name := range strings.SplitSeq(strings.TrimSuffix(string(b), "\x00"), "\x00") {
		if name != "" {
			names = append(names, name)
		}
	}
	return names, nil
}

// sized calls get, which works like getxattr(2), first for the size, then
// for the bytes; a value that grows in between is asked for again.
func sized(get func(dest []byte) (int, syscall.Errno)) ([]byte, error) {
	for range 4 {
		k, e := get(nil)
		if e != 0 {
			return nil, errno(e)
		}
		if k > maxXattr {
			return nil, linux.E2BIG
		}
		if k == 0 {
			return []byte{}, nil
		}
		buf := make([]byte, k)
		k, e = get(buf)
		if e == syscall.ERANGE {
			continue
		}
		if e != 0 {
			return nil, errno(e)
		}
		return buf[:k], nil
	}
	return nil, linux.ERANGE
}

func (f *file) SetXattr(attr string, data []byte, flags p9.XattrFlags) error {
	if !f.use() {
		return linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return linux.ENOTSUP
	}
	return errno(n.Setxattr(f.ctx, attr, data, uint32(flags)))
}

func (f *file) RemoveXattr(attr string) error {
	if !f.use() {
		return linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return linux.ENODATA
	}
	return errno(n.Removexattr(f.ctx, attr))
}

// lockOwner is the layers' lock owner of a 9P client's process: the
// connection, the client's name (Linux sends its node name) and its pid.
func (f *file) lockOwner(pid int, client string) uint64 {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:], f.c.id)
	binary.LittleEndian.PutUint32(b[8:], uint32(pid))
	d := xxhash.New()
	d.Write(b[:])
	d.WriteString(client)
	return d.Sum64()
}

// Lock sets or clears a POSIX lock. It never waits: a conflicting request
// is answered LockStatusBlocked, which Linux's client retries while the
// process waits (F_SETLKW) or turns into EAGAIN (F_SETLK). Tgetlock, hence
// F_GETLK, the library answers ENOSYS itself.
func (f *file) Lock(pid int, locktype p9.LockType, flags p9.LockFlags, start, length uint64, client string) (p9.LockStatus, error) {
	if !f.use() {
		return p9.LockStatusError, linux.EBADF
	}
	defer f.done()
	if f.h == nil {
		return p9.LockStatusError, linux.EBADF
	}
	lk := layer.Lock{Start: start, End: math.MaxUint64, Pid: uint32(pid)}
	if length != 0 {
		if length-1 > math.MaxUint64-start {
			return p9.LockStatusError, linux.EINVAL
		}
		lk.End = start + length - 1
	}
	switch locktype {
	case p9.ReadLock:
		lk.Type = syscall.F_RDLCK
	case p9.WriteLock:
		lk.Type = syscall.F_WRLCK
	case p9.Unlock:
		lk.Type = syscall.F_UNLCK
	default:
		return p9.LockStatusError, linux.EINVAL
	}
	owner := f.lockOwner(pid, client)
	switch e := f.h.Setlk(f.ctx, owner, &lk, false); e {
	case 0:
	case syscall.EAGAIN:
		return p9.LockStatusBlocked, nil
	default:
		return p9.LockStatusError, errno(e)
	}
	if lk.Type != syscall.F_UNLCK {
		f.omu.Lock()
		if !slices.Contains(f.owners, owner) {
			f.owners = append(f.owners, owner)
		}
		f.omu.Unlock()
	}
	return p9.LockStatusOK, nil
}

func (f *file) Create(name string, flags p9.OpenFlags, perms p9.FileMode, uid p9.UID, gid p9.GID) (p9.File, p9.QID, uint32, error) {
	if !f.use() {
		return nil, p9.QID{}, 0, linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return nil, p9.QID{}, 0, err
	}
	fl, err := openFlags(flags)
	if err != nil {
		return nil, p9.QID{}, 0, err
	}
	if f.c.full() {
		return nil, p9.QID{}, 0, linux.EMFILE
	}
	var a layer.Attr
	cn, h, e := n.Create(f.createCtx(gid), name, fl|unix.O_CREAT, uint32(perms)&0o7777, &a)
	if e != 0 {
		return nil, p9.QID{}, 0, errno(e)
	}
	tok := cn.Token()
	nf, err := f.newFile(f.r, f.c.hold(f.r, cn), a.Mode, false, "")
	if err != nil {
		h.Release(f.ctx)
		return nil, p9.QID{}, 0, err
	}
	nf.h, nf.opened = h, true
	nf.parent = f
	return nf, qidOf(tok, a.Mode), 0, nil
}

// made answers a call that made a node no file refers to yet: its QID,
// and the node is Forgotten.
func made(c layer.Node, a *layer.Attr, e syscall.Errno) (p9.QID, error) {
	if e != 0 {
		return p9.QID{}, errno(e)
	}
	q := qidOf(c.Token(), a.Mode)
	c.Forget()
	return q, nil
}

func (f *file) Mkdir(name string, perms p9.FileMode, uid p9.UID, gid p9.GID) (p9.QID, error) {
	if !f.use() {
		return p9.QID{}, linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return p9.QID{}, err
	}
	var a layer.Attr
	c, e := n.Mkdir(f.createCtx(gid), name, uint32(perms)&0o7777, &a)
	return made(c, &a, e)
}

func (f *file) Symlink(oldName, newName string, uid p9.UID, gid p9.GID) (p9.QID, error) {
	if !f.use() {
		return p9.QID{}, linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return p9.QID{}, err
	}
	var a layer.Attr
	c, e := n.Symlink(f.createCtx(gid), []byte(oldName), newName, &a)
	return made(c, &a, e)
}

func (f *file) Mknod(name string, mode p9.FileMode, major, minor uint32, uid p9.UID, gid p9.GID) (p9.QID, error) {
	if !f.use() {
		return p9.QID{}, linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return p9.QID{}, err
	}
	var a layer.Attr
	c, e := n.Mknod(f.createCtx(gid), name, uint32(mode)&(syscall.S_IFMT|0o7777), unix.Mkdev(major, minor), &a)
	return made(c, &a, e)
}

// peer returns the node of another file of f's root: the layers link and
// rename only within one.
func (f *file) peer(o p9.File) (layer.Node, error) {
	of, ok := o.(*file)
	if !ok || of.c != f.c || of.r != f.r || of.rec == nil {
		return nil, linux.EXDEV
	}
	return of.rec.n, nil
}

func (f *file) Link(target p9.File, newName string) error {
	if !f.use() {
		return linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return err
	}
	t, err := f.peer(target)
	if err != nil {
		return err
	}
	var a layer.Attr
	c, e := n.Link(f.ctx, t, newName, &a)
	_, err = made(c, &a, e)
	return err
}

// Rename is never called on the server: the library serves Trename with
// RenameAt on the parent.
func (f *file) Rename(newDir p9.File, newName string) error { return linux.ENOSYS }

func (f *file) RenameAt(oldName string, newDir p9.File, newName string) error {
	if !f.use() {
		return linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return err
	}
	d, err := f.peer(newDir)
	if err != nil {
		return err
	}
	return errno(n.Rename(f.ctx, oldName, d, newName, 0))
}

// Renamed needs nothing: files hold nodes, which renames leave valid.
func (f *file) Renamed(newDir p9.File, newName string) {}

func (f *file) UnlinkAt(name string, flags uint32) error {
	if !f.use() {
		return linux.EBADF
	}
	defer f.done()
	n, err := f.node()
	if err != nil {
		return err
	}
	if flags&unix.AT_REMOVEDIR != 0 {
		return errno(n.Rmdir(f.ctx, name))
	}
	return errno(n.Unlink(f.ctx, name))
}
