package fuseview

import (
	"context"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shalefs/shale/layer"
)

// inode adapts a layer.Node to go-fuse's node API.
type inode struct {
	fs.Inode
	v    *view
	h    *held
	born time.Time // for notifyContent
	// listed: the kernel may hold a listing of this directory (opened
	// with FOPEN_CACHE_DIR), which changing must drop.
	listed  atomic.Bool
	forgets atomic.Uint64 // OnForget's calls (forget.go)
	neg     negatives     // names its LOOKUPs found missing (negative.go)
	execs   atomic.Int32  // its handles opened to run it (Open)
	settled atomic.Bool   // the request that made it has ended (hold)
}

// held is the layer node an inode serves. It is released once: when the
// kernel forgets the inode, or, for an inode go-fuse discarded because it
// already knew the file (hard links, racing lookups), when the inode is
// garbage.
type held struct {
	n    layer.Node
	done atomic.Bool
}

func (h *held) release() {
	if h.done.CompareAndSwap(false, true) {
		h.n.Forget()
	}
}

func (v *view) newInode(n layer.Node) *inode {
	in := &inode{v: v, h: &held{n: n}, born: time.Now()}
	runtime.AddCleanup(in, (*held).release, in.h)
	return in
}

// hold records in as cached, once go-fuse has made it (NewInode,
// NewNodeFS): the manager's events ask it whether it is Forgotten. Until
// the requests at work now have ended it is not dropped as stale: go-fuse
// links the winner of racing lookups of a file only after their replies,
// and a racing lookup that dropped it kept only its own losing inode, so
// that no change reached the kernel's caches of the file again.
func (v *view) hold(in *inode) {
	v.cached.Add(in.node().Token(), in, (*inode).stale)
	v.makers.after(func() { in.settled.Store(true) })
}

// stale tells whether the kernel neither holds in nor can come to.
func (in *inode) stale() bool { return in.settled.Load() && in.Forgotten() }

func (i *inode) node() layer.Node { return i.h.n }

// caller attaches the FUSE request's caller and this view to ctx for the
// layers below.
func (v *view) caller(ctx context.Context) context.Context { return v.attach(ctx, false) }

// creator is caller for CREATE, MKDIR and MKNOD: it adds the umask the
// kernel sent (rawFS), which the bottom of the stack applies.
func (v *view) creator(ctx context.Context) context.Context { return v.attach(ctx, true) }

func (v *view) attach(ctx context.Context, umask bool) context.Context {
	fc, ok := ctx.(*fuse.Context)
	if !ok {
		return ctx
	}
	c := layer.Caller{Uid: fc.Caller.Uid, Gid: fc.Caller.Gid, Pid: fc.Caller.Pid, View: v.id}
	if umask {
		c.Umask = uint32(v.raw.noted(ctx))
	}
	return layer.WithCaller(ctx, c)
}

func fillAttr(a *layer.Attr, tok layer.Token, out *fuse.Attr) {
	out.Ino = tok.Ino
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Uid = a.Uid
	out.Gid = a.Gid
	out.Rdev = uint32(a.Rdev)
	out.Size = a.Size
	out.Blocks = a.Blocks
	out.Blksize = a.Blksize
	out.SetTimes(&a.Atime, &a.Mtime, &a.Ctime)
}

// child returns the inode for a node a directory operation produced:
// always a new one, which go-fuse swaps, under its own lock, for the
// inode the kernel holds of the same file if it holds one. Handing back
// that inode ourselves (GetChild) raced with the kernel's FORGET of it:
// go-fuse then brought it back to life after OnForget had let its layer
// node go, and the kernel used a node whose file had no names (ESTALE,
// and a remote client's delayed writes with no path to go back by). A
// new inode that loses the swap lets its layer node go when collected.
func (i *inode) child(ctx context.Context, c layer.Node, a *layer.Attr, out *fuse.EntryOut) *fs.Inode {
	tok := c.Token()
	fillAttr(a, tok, &out.Attr)
	in := i.v.newInode(c)
	ch := i.NewInode(ctx, in, fs.StableAttr{Mode: a.Mode, Ino: tok.Ino, Gen: tok.Gen})
	i.v.hold(in)
	return ch
}

// Lookup keeps the names found missing, when coherent (negative.go).
func (i *inode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if i.v.mgr == nil {
		ch, e := i.lookup(ctx, name, out)
		i.v.ctr.looked(e)
		return ch, e
	}
	i.neg.looking(name)
	ch, e := i.lookup(ctx, name, out)
	i.v.ctr.looked(e)
	switch kept := i.neg.found(name, e == syscall.ENOENT); {
	case kept:
		i.v.ctr.negKept.Add(1)
	case e == syscall.ENOENT:
		// Not kept: go-fuse leaves ENOENT with a timeout set as it is.
		out.SetEntryTimeout(time.Nanosecond)
	}
	return ch, e
}

func (i *inode) lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var a layer.Attr
	mark := i.v.cached.Mark()
	c, e := i.node().Lookup(i.v.caller(ctx), name, &a)
	if e != 0 {
		return nil, e
	}
	tok := c.Token()
	ch := i.child(ctx, c, &a, out)
	if i.v.cached.Changed(tok, mark) {
		// Changed while we looked, before the kernel knew the file to be
		// told: what we found may be older; the kernel asks again.
		out.SetAttrTimeout(time.Nanosecond)
	}
	return ch, 0
}

func (i *inode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var a layer.Attr
	if e := i.node().Getattr(i.v.caller(ctx), layerHandle(f), &a); e != 0 {
		return e
	}
	fillAttr(&a, i.node().Token(), &out.Attr)
	return 0
}

func (i *inode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	defer i.v.cached.Busy(i.node().Token())()
	var s layer.SetAttr
	if m, ok := in.GetMode(); ok {
		s.Valid |= layer.SetMode
		s.Mode = m
	}
	if u, ok := in.GetUID(); ok {
		s.Valid |= layer.SetUid
		s.Uid = u
	}
	if g, ok := in.GetGID(); ok {
		s.Valid |= layer.SetGid
		s.Gid = g
	}
	if sz, ok := in.GetSize(); ok {
		s.Valid |= layer.SetSize
		s.Size = sz
	}
	if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
		s.Valid |= layer.SetAtimeNow
	} else if t, ok := in.GetATime(); ok {
		s.Valid |= layer.SetAtime
		s.Atime = t
	}
	if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
		s.Valid |= layer.SetMtimeNow
	} else if t, ok := in.GetMTime(); ok {
		s.Valid |= layer.SetMtime
		s.Mtime = t
	}
	var a layer.Attr
	if e := i.node().Setattr(i.v.caller(ctx), layerHandle(f), &s, &a); e != 0 {
		return e
	}
	fillAttr(&a, i.node().Token(), &out.Attr)
	return 0
}

func (i *inode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	defer i.changing(name)()
	var a layer.Attr
	c, e := i.node().Mkdir(i.v.creator(ctx), name, mode, &a)
	if e != 0 {
		return nil, e
	}
	return i.child(ctx, c, &a, out), 0
}

func (i *inode) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	defer i.changing(name)()
	var a layer.Attr
	c, e := i.node().Mknod(i.v.creator(ctx), name, mode, uint64(dev), &a)
	if e != 0 {
		return nil, e
	}
	return i.child(ctx, c, &a, out), 0
}

func (i *inode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	defer i.changing(name)()
	var a layer.Attr
	c, e := i.node().Symlink(i.v.caller(ctx), []byte(target), name, &a)
	if e != 0 {
		return nil, e
	}
	return i.child(ctx, c, &a, out), 0
}

func (i *inode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	defer i.changing(name)()
	t, ok := target.(*inode)
	if !ok {
		return nil, syscall.EXDEV
	}
	var a layer.Attr
	c, e := i.node().Link(i.v.caller(ctx), t.node(), name, &a)
	if e != 0 {
		return nil, e
	}
	return i.child(ctx, c, &a, out), 0
}

func (i *inode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	defer i.changing(name)()
	var a layer.Attr
	c, h, e := i.node().Create(i.v.creator(ctx), name, flags, mode, &a)
	if e != 0 {
		return nil, nil, 0, e
	}
	return i.child(ctx, c, &a, out), i.v.newHandle(h, c.Token(), nil), i.v.openFlags(h) &^ fuse.FOPEN_KEEP_CACHE, 0
}

func (i *inode) Unlink(ctx context.Context, name string) syscall.Errno {
	defer i.changing(name)()
	return i.node().Unlink(i.v.caller(ctx), name)
}

func (i *inode) Rmdir(ctx context.Context, name string) syscall.Errno {
	defer i.changing(name)()
	return i.node().Rmdir(i.v.caller(ctx), name)
}

func (i *inode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	p, ok := newParent.(*inode)
	if !ok {
		return syscall.EXDEV
	}
	defer i.changing(name)()
	defer p.changing(newName)()
	return i.node().Rename(i.v.caller(ctx), name, p.node(), newName, flags)
}

func (i *inode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	return i.node().Readlink(i.v.caller(ctx))
}

func (i *inode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	// A program running from the file holds it against writing, which
	// the kernel checks for a read-only open with O_TRUNC only after
	// OPEN, where the view truncates (atomic O_TRUNC): it would fail the
	// open with ETXTBSY and leave the file empty. The kernel keeps an
	// exec's handle open while the program runs, so the view refuses
	// first. (It keeps a program interpreter's too, whose truncation the
	// kernel would allow; and it releases a handle only after the program
	// has been reaped, for a moment more.)
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE == syscall.O_RDONLY && i.execs.Load() > 0 {
		return nil, 0, syscall.ETXTBSY
	}
	// Others who may hold delayed writes of the file (an export's 9P
	// clients) write them back first.
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	i.v.mgr.Open(ctx, i.v.id, i.node().Token(), write)
	h, e := i.node().Open(i.v.caller(ctx), flags&^syscall.O_TRUNC)
	if e != 0 {
		return nil, 0, e
	}
	if flags&syscall.O_TRUNC != 0 {
		if e := i.truncate(ctx, h, flags); e != 0 {
			h.Release(i.v.caller(ctx))
			return nil, 0, e
		}
	}
	var execs *atomic.Int32
	if flags&fuse.FMODE_EXEC != 0 {
		execs = &i.execs
		execs.Add(1)
	}
	return i.v.newHandle(h, i.node().Token(), execs), i.v.openFlags(h), 0
}

// truncate empties the file for an open with O_TRUNC. The kernel leaves
// that to OPEN (atomic O_TRUNC, view.go) rather than a SETATTR ahead of
// it, during which it ignores the size READs find: a READ answered then
// left the old size over a page of zeros, which a program reading while
// another rewrote the file got as its contents. It is the SETATTR every
// layer knows, which tells the other views too; through the new handle
// if it may write, as ftruncate, else by the caller's permission.
func (i *inode) truncate(ctx context.Context, h layer.Handle, flags uint32) syscall.Errno {
	defer i.v.cached.Busy(i.node().Token())()
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		h = nil
	}
	var a layer.Attr
	return i.node().Setattr(i.v.caller(ctx), h, &layer.SetAttr{Valid: layer.SetSize}, &a)
}

func (i *inode) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	d, e := i.node().OpenDir(i.v.caller(ctx))
	if e != 0 {
		return nil, 0, e
	}
	if !i.v.opts.KeepCache {
		return &dirHandle{d: d, v: i.v}, 0, 0
	}
	// The kernel keeps the listing: changes through this view drop it
	// (changing), and those through others or beside the stack too
	// (holder.go). Marked again at each READDIR: a handle the view keeps
	// for READDIRs with none (opendir.go) outlives a drop.
	i.listed.Store(true)
	return &dirHandle{d: d, v: i.v, listed: &i.listed}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// changing marks a request that changes i's entry name: busy while it
// runs (holder.go), and the kernel's listing of i dropped before the
// reply. The kernel starts a fresh listing after its own changes, but an
// open stream that seeks would list, from its cache, names since removed.
// The kernel's entry for name is now the reply's, not one the view kept
// as missing (negative.go).
func (i *inode) changing(name string) func() {
	done := i.v.cached.Busy(i.node().Token())
	return func() {
		i.neg.made(name)
		if i.listed.Swap(false) {
			i.NotifyContent(0, 0)
		}
		done()
	}
}

func (i *inode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var s layer.Statfs
	if e := i.node().Statfs(i.v.caller(ctx), &s); e != 0 {
		return e
	}
	*out = fuse.StatfsOut{
		Blocks: s.Blocks, Bfree: s.Bfree, Bavail: s.Bavail,
		Files: s.Files, Ffree: s.Ffree,
		Bsize: s.Bsize, Frsize: s.Frsize, NameLen: s.NameLen,
	}
	return 0
}

func (i *inode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	k, e := i.node().Getxattr(i.v.caller(ctx), attr, dest)
	return uint32(k), e
}

func (i *inode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return i.node().Setxattr(i.v.caller(ctx), attr, data, flags)
}

func (i *inode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	k, e := i.node().Listxattr(i.v.caller(ctx), dest)
	return uint32(k), e
}

func (i *inode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return i.node().Removexattr(i.v.caller(ctx), attr)
}

func (i *inode) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, n uint64, flags uint64) (uint32, syscall.Errno) {
	src, dst := layerHandle(fhIn), layerHandle(fhOut)
	if src == nil || dst == nil {
		return 0, syscall.EBADF
	}
	k, e := src.CopyFileRange(i.v.caller(ctx), int64(offIn), dst, int64(offOut), int(n), uint32(flags))
	return uint32(k), e
}
