package wrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// fs is one layer built from hooks.
type fs struct {
	blocks BlockCodec
	header FileHeader
	names  NameCodec
	dirs   DirIDer
	links  LinkCodec
	attrs  SetattrChecker
	xattrs XattrCodec
	fill   bool // Hooks.FillHoles

	bs, ov, hs uint64 // block size, block overhead, header size
	log        *slog.Logger
	st         *stack.Stack

	lowerRoot layer.Node // where long targets' sidecars are (names.go)
	linkSizes sync.Map   // layer.Token → uint64, by linkSize

	// Crash safety (names.go).
	tag     string              // names this instance's temporaries
	seq     atomic.Uint64       // numbers them
	tidy    sync.Mutex          // serialises removals of leftovers and repairs
	pending map[pendingName]int // long names being made, under tidy
}

// Hooks are what a layer built on the template provides; each is optional,
// and what is nil passes through unchanged. Named fields, not interfaces
// found by assertion: a hook with a mistyped method does not compile,
// where it would otherwise be dropped without a word.
type Hooks struct {
	Blocks BlockCodec
	Header FileHeader
	Names  NameCodec
	Dirs   DirIDer
	Links  LinkCodec
	Attrs  SetattrChecker
	Xattrs XattrCodec
	// FillHoles stores every block encoded: growing a file or filling a
	// hole writes encoded zeros, and a block stored as all zeros is
	// decoded like any other (and fails, for an authenticating codec),
	// not read as a hole. Without it, someone who can write the lower
	// file system can zero blocks, or grow a file with zeros, unseen.
	FillHoles bool
}

// New builds a layer of st over lower from hooks. lower stays the
// caller's: Forget on the new root does not forget it.
func New(ctx context.Context, st *stack.Stack, lower layer.Node, hooks Hooks) (layer.Node, error) {
	f := &fs{log: st.Log(), lowerRoot: lower, st: st,
		blocks: hooks.Blocks, header: hooks.Header, names: hooks.Names,
		dirs: hooks.Dirs, links: hooks.Links, attrs: hooks.Attrs,
		xattrs: hooks.Xattrs, fill: hooks.FillHoles,
		tag: newTag(), pending: map[pendingName]int{}}
	if f.header != nil && f.blocks == nil {
		return nil, errors.New("wrap: a FileHeader needs a BlockCodec")
	}
	if f.dirs != nil && f.names == nil {
		// It hides the temporaries directories are made under.
		return nil, errors.New("wrap: a DirIDer needs a NameCodec")
	}
	if f.blocks != nil {
		f.bs, f.ov = uint64(f.blocks.BlockSize()), uint64(f.blocks.Overhead())
		if f.bs == 0 {
			return nil, errors.New("wrap: BlockSize must be positive")
		}
	}
	if f.header != nil {
		f.hs = uint64(f.header.HeaderSize())
	}
	root := &node{PassThrough: layer.PassThrough{Lower: lower}, fs: f, root: true}
	if f.dirs != nil {
		// The root's identity is the layer's to make (when it sets up a
		// directory), never the template's: one made here over a lost one
		// would hide every entry of the root for good.
		if _, e := root.id(ctx); e != 0 {
			return nil, fmt.Errorf("wrap: the root directory's identity file (%s): %v", f.dirs.DirIDFile(), e)
		}
	}
	return root, nil
}

// sized reports whether the layer changes file sizes.
func (f *fs) sized() bool { return f.blocks != nil && (f.ov != 0 || f.hs != 0) }

// plainSize is the size above of a lower file of size l.
func (f *fs) plainSize(l uint64) uint64 {
	if !f.sized() {
		return l
	}
	if l <= f.hs {
		return 0
	}
	n, sb := l-f.hs, f.bs+f.ov
	s := n / sb * f.bs
	if rem := n % sb; rem > f.ov {
		s += rem - f.ov
	}
	return s
}

// lowerSize is the size below of a file of size s above.
func (f *fs) lowerSize(s uint64) uint64 {
	if !f.sized() || s == 0 {
		return s
	}
	l := f.hs + s/f.bs*(f.bs+f.ov)
	if r := s % f.bs; r > 0 {
		l += r + f.ov
	}
	return l
}

// node is a node of the layer, over a node of the layer below.
type node struct {
	layer.PassThrough
	fs   *fs
	root bool

	mu      sync.Mutex
	dirID   []byte // cached identity for NameCodec
	xattrID []byte // cached identity for XattrCodec (xattr.go)
}

func (f *fs) wrapNode(lower layer.Node) *node {
	return &node{PassThrough: layer.PassThrough{Lower: lower}, fs: f}
}

// KeepsOffsets tells whether offsets mean the same here and at the bottom
// of the stack: this layer must not reshape data, nor any beneath.
func (n *node) KeepsOffsets() bool {
	if n.fs.sized() {
		return false
	}
	k, ok := n.Lower.(layer.OffsetKeeper)
	return ok && k.KeepsOffsets()
}

type dataLocked struct{}

// lockData takes the file's data lock for reading or writing blocks,
// unless a layer above already holds it for this request; the returned
// context tells the layers below that it is held.
func (n *node) lockData(ctx context.Context, write bool) (context.Context, func()) {
	if ctx.Value(dataLocked{}) != nil {
		return ctx, func() {}
	}
	l := n.fs.st.DataLock(n.Token())
	// Events raised under the lock wait until it is released.
	ctx, flush := layer.Defer(ctx)
	ctx = context.WithValue(ctx, dataLocked{}, true)
	if write {
		l.Lock()
		return ctx, func() { l.Unlock(); flush() }
	}
	l.RLock()
	return ctx, func() { l.RUnlock(); flush() }
}

func (n *node) Forget() {
	if !n.root {
		n.Lower.Forget()
	}
}

// fixAttr turns lower attributes into the layer's.
func (n *node) fixAttr(ctx context.Context, a *layer.Attr) {
	switch a.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		a.Size = n.fs.plainSize(a.Size)
	case syscall.S_IFLNK:
		if n.fs.links != nil {
			a.Size = n.linkSize(ctx, a.Size)
		}
	}
}

func (n *node) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	if e := n.Lower.Getattr(ctx, lowerHandle(h), out); e != 0 {
		return e
	}
	n.fixAttr(ctx, out)
	return 0
}

func (n *node) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	if n.fs.attrs != nil {
		var cur layer.Attr
		if e := n.Getattr(ctx, h, &cur); e != 0 {
			return e
		}
		if e := n.fs.attrs.CheckSetattr(ctx, &cur, in); e != 0 {
			return e
		}
	}
	if in.Valid&layer.SetSize != 0 && n.fs.blocks != nil {
		if e := n.truncate(ctx, h, in.Size); e != 0 {
			return e
		}
		rest := *in
		rest.Valid &^= layer.SetSize
		in = &rest
	}
	if e := n.Lower.Setattr(ctx, lowerHandle(h), in, out); e != 0 {
		return e
	}
	n.fixAttr(ctx, out)
	return 0
}

// child wraps a node the layer below produced.
func (n *node) child(ctx context.Context, c layer.Node, out *layer.Attr) layer.Node {
	w := n.fs.wrapNode(c)
	w.fixAttr(ctx, out)
	return w
}

func (n *node) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	lname, e := n.encodeName(ctx, name)
	if e != 0 {
		return nil, e
	}
	c, e := n.Lower.Lookup(ctx, lname, out)
	if e != 0 {
		return nil, e
	}
	return n.child(ctx, c, out), 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.makeNamed(ctx, name, out, func(lname string) (layer.Node, layer.Errno) {
		if n.fs.dirs == nil {
			return n.Lower.Mkdir(ctx, lname, mode, out)
		}
		return n.mkdirWithID(ctx, lname, mode, out)
	})
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint64, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.makeNamed(ctx, name, out, func(lname string) (layer.Node, layer.Errno) {
		return n.Lower.Mknod(ctx, lname, mode, dev, out)
	})
}

func (n *node) Symlink(ctx context.Context, target []byte, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	if n.fs.links == nil {
		return n.makeNamed(ctx, name, out, func(lname string) (layer.Node, layer.Errno) {
			return n.Lower.Symlink(ctx, target, lname, out)
		})
	}
	if len(target) > linkMax {
		return nil, syscall.ENAMETOOLONG
	}
	stored, err := n.fs.links.EncodeLink(target)
	if err != nil {
		return nil, errnoOf(err, syscall.ENAMETOOLONG)
	}
	return n.makeNamed(ctx, name, out, func(lname string) (layer.Node, layer.Errno) {
		t, side, e := n.fs.putLink(ctx, stored)
		if e != 0 {
			return nil, e
		}
		c, e := n.Lower.Symlink(ctx, t, lname, out)
		if e != 0 && side != "" {
			n.fs.lowerRoot.Unlink(ctx, side)
		}
		return c, e
	})
}

func (n *node) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	return n.makeNamed(ctx, name, out, func(lname string) (layer.Node, layer.Errno) {
		return n.Lower.Link(ctx, t.Lower, lname, out)
	})
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	var h layer.Handle
	c, e := n.makeNamed(ctx, name, out, func(lname string) (layer.Node, layer.Errno) {
		c, lh, e := n.Lower.Create(ctx, lname, n.fs.lowerFlags(flags), mode, out)
		h = lh
		return c, e
	})
	if e != 0 {
		return nil, nil, e
	}
	return c, n.fs.wrapHandle(c.(*node), h, flags), 0
}

// makeNamed makes a child under its encoded name, with the long-name
// sidecar first if the name needs one.
func (n *node) makeNamed(ctx context.Context, name string, out *layer.Attr, mk func(lname string) (layer.Node, layer.Errno)) (layer.Node, layer.Errno) {
	lname, e := n.encodeName(ctx, name)
	if e != 0 {
		return nil, e
	}
	defer n.makingLong(lname)()
	if e := n.writeSidecar(ctx, lname, name); e != 0 {
		return nil, e
	}
	c, e := mk(lname)
	if e != 0 {
		n.dropSidecar(ctx, lname) // unless the name's file exists (EEXIST)
		return nil, e
	}
	return n.child(ctx, c, out), 0
}

func (n *node) Unlink(ctx context.Context, name string) layer.Errno {
	return n.removeNamed(ctx, name, n.unlink)
}

// unlink removes lower entry lname, and the sidecar of a long target if
// lname was its last link.
func (n *node) unlink(ctx context.Context, lname string) layer.Errno {
	finish := n.dropLink(ctx, lname)
	e := n.Lower.Unlink(ctx, lname)
	finish(e != 0)
	return e
}

func (n *node) Rmdir(ctx context.Context, name string) layer.Errno {
	return n.removeNamed(ctx, name, n.rmdir)
}

func (n *node) removeNamed(ctx context.Context, name string, rm func(context.Context, string) layer.Errno) layer.Errno {
	lname, e := n.encodeName(ctx, name)
	if e != 0 {
		return e
	}
	if e := rm(ctx, lname); e != 0 {
		return e
	}
	n.removeSidecar(ctx, lname)
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	d, ok := newDir.(*node)
	if !ok {
		return syscall.EXDEV
	}
	from, e := n.encodeName(ctx, name)
	if e != 0 {
		return e
	}
	to, e := d.encodeName(ctx, newName)
	if e != 0 {
		return e
	}
	if flags&unixRenameExchange != 0 {
		// Each side's sidecar must hold the other's name afterwards.
		if e := n.Lower.Rename(ctx, from, d.Lower, to, flags); e != 0 {
			return e
		}
		d.writeSidecar(ctx, to, newName)
		n.writeSidecar(ctx, from, name)
		return 0
	}
	defer d.makingLong(to)()
	if e := d.writeSidecar(ctx, to, newName); e != 0 {
		return e
	}
	// A directory replaced by the rename must be empty above: its identity
	// file and the leftovers of crashes alone must not keep it. A symlink
	// replaced may be a long target's last link. Renaming an entry onto
	// itself, or with RENAME_NOREPLACE, replaces nothing.
	finish, finishLink := func(bool) {}, func(bool) {}
	if flags&unixRenameNoReplace == 0 && (from != to || n.Lower.Token() != d.Lower.Token()) {
		if finish, e = d.emptyDir(ctx, to); e != 0 && e != syscall.ENOENT && e != syscall.ENOTDIR {
			return e
		}
		finishLink = d.dropLink(ctx, to)
	}
	e = n.Lower.Rename(ctx, from, d.Lower, to, flags)
	finish(e != 0)
	finishLink(e != 0)
	if e != 0 {
		return e
	}
	// Renaming a link onto another link of the same file leaves both.
	n.dropSidecar(ctx, from)
	return 0
}

const (
	unixRenameNoReplace = 1 << 0 // RENAME_NOREPLACE
	unixRenameExchange  = 1 << 1 // RENAME_EXCHANGE
)

func (n *node) Readlink(ctx context.Context) ([]byte, layer.Errno) {
	t, e := n.Lower.Readlink(ctx)
	if e != 0 || n.fs.links == nil {
		return t, e
	}
	t, e = n.fs.getLink(ctx, t)
	if e != 0 {
		n.fs.log.Error("wrap: a long symlink target's sidecar is missing or damaged", "token", n.Token(), "errno", e)
		return nil, syscall.EIO
	}
	p, err := n.fs.links.DecodeLink(t)
	if err != nil {
		n.fs.log.Error("wrap: symlink target does not decode", "token", n.Token(), "err", err)
		return nil, syscall.EIO
	}
	return p, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	h, e := n.openLower(ctx, flags)
	if e != 0 {
		return nil, e
	}
	return n.fs.wrapHandle(n, h, flags), 0
}

// errnoOf returns the Errno inside err, or def.
func errnoOf(err error, def layer.Errno) layer.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return def
}
