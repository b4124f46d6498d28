package shard

import (
	"context"
	"log/slog"
	"sync"
	"syscall"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// fs is one shard layer.
type fs struct {
	// conv orders conversions (and the removal of a managed directory's
	// buckets), held exclusively, against every namespace operation,
	// which holds it shared: an operation must not see a directory
	// half-way between layouts. Conversions are rare administrative acts.
	conv sync.RWMutex

	mu   sync.Mutex
	dirs map[layer.Token]*dirState

	// byBucket finds the bucket nodes that dirs' states cache by token,
	// to translate their events (events.go). It is taken last.
	bmu      sync.Mutex
	byBucket map[layer.Token]bucketRef

	log *slog.Logger
}

// New stacks a shard layer over lower, in st. lower stays the caller's:
// Forget on the new root does not forget it.
func New(ctx context.Context, st *stack.Stack, lower layer.Node) (layer.Node, error) {
	f := &fs{dirs: map[layer.Token]*dirState{}, byBucket: map[layer.Token]bucketRef{}, log: st.Log()}
	return f.node(lower, true), nil
}

func init() {
	stack.Register(stack.Kind{
		Name:  "shard",
		Short: "huge flat directories kept in hashed subdirectories (Usenetfs); chmod u+s DIR marks one",
		Open: func(ctx context.Context, st *stack.Stack, lower layer.Node, dir string, l stack.Layer) (layer.Node, error) {
			return New(ctx, st, lower)
		},
	})
}

// node is a node of the layer over a node of the layer below. Only
// directories hold a state.
type node struct {
	layer.PassThrough
	fs   *fs
	root bool

	mu sync.Mutex
	st *dirState // loaded on first use
}

func (f *fs) wrap(c layer.Node) layer.Node { return f.node(c, false) }

func (f *fs) node(lower layer.Node, root bool) *node {
	return &node{PassThrough: layer.PassThrough{Lower: lower}, fs: f, root: root}
}

func (n *node) Forget() {
	n.mu.Lock()
	st := n.st
	n.st = nil
	n.mu.Unlock()
	if st != nil {
		n.fs.unref(st)
	}
	if !n.root {
		n.Lower.Forget()
	}
}

// enter begins a namespace operation in directory n: it holds conversions
// off (the caller releases fs.conv with RUnlock) and returns n's state,
// finishing an interrupted conversion first if it can.
func (n *node) enter(ctx context.Context) (*dirState, layer.Errno) {
	for try := 0; ; try++ {
		n.fs.conv.RLock()
		st, e := n.state(ctx)
		if e != 0 {
			n.fs.conv.RUnlock()
			return nil, e
		}
		if try > 0 || !st.strays.Load() {
			return st, 0
		}
		n.fs.conv.RUnlock()
		n.settle(ctx, st)
	}
}

// enter2 is enter for an operation in two directories, n and d.
func (n *node) enter2(ctx context.Context, d *node) (st, dst *dirState, e layer.Errno) {
	for try := 0; ; try++ {
		if st, e = n.enter(ctx); e != 0 {
			return nil, nil, e
		}
		if dst, e = d.state(ctx); e != 0 {
			n.fs.conv.RUnlock()
			return nil, nil, e
		}
		if try > 0 || !dst.strays.Load() {
			return st, dst, 0
		}
		n.fs.conv.RUnlock()
		d.settle(ctx, dst)
	}
}

// creating returns the lower directory where name is to be made in n.
func (n *node) creating(ctx context.Context, st *dirState, name string) (layer.Node, int, layer.Errno) {
	if !st.managed {
		return n.Lower, 0, 0
	}
	b, e := where(name)
	if e != 0 {
		return nil, 0, e
	}
	if st.strays.Load() {
		// A stray of the same name may exist beside the buckets.
		return nil, 0, st.blockedErr()
	}
	d, e := n.bucket(ctx, st, b, true)
	return d, b, e
}

// existing runs op on the lower directory that holds name in n: its
// bucket, or, for a stray, the top level.
func (n *node) existing(ctx context.Context, st *dirState, name string, op func(d layer.Node) layer.Errno) (int, layer.Errno) {
	if !st.managed {
		return 0, op(n.Lower)
	}
	b, e := where(name)
	if e != 0 {
		return 0, e
	}
	d, e := n.bucket(ctx, st, b, false)
	if e == 0 {
		e = op(d)
	}
	if e == syscall.ENOENT && st.strays.Load() {
		if _, ok := bucketIndex(name); !ok {
			e = op(n.Lower)
		}
	}
	return b, e
}

// nameMax is NAME_MAX: the longest entry name the layers below take.
const nameMax = 255

// where gives the bucket of name in a managed directory. It refuses a
// name too long for any entry as the file system below would: a name's
// bucket often does not exist, and its lookup would answer ENOENT.
func where(name string) (int, layer.Errno) {
	if len(name) > nameMax {
		return 0, syscall.ENAMETOOLONG
	}
	b, _ := place(name)
	return b, 0
}

// changed records a change of the entries of managed directory n, in
// bucket b: its mtime and ctime advance as a flat directory's would (the
// lower change touched only the bucket), and dirs says whether the
// bucket's directories may have changed.
func (n *node) changed(ctx context.Context, st *dirState, b int, dirs bool) {
	if !st.managed {
		return
	}
	if dirs {
		st.subdirsChanged(b)
	}
	var a layer.Attr
	n.Lower.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetMtimeNow}, &a)
}

func (n *node) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	if e := n.Lower.Getattr(ctx, h, out); e != 0 {
		return e
	}
	n.fixAttr(ctx, out)
	return 0
}

// fixAttr adjusts the link count of a managed directory.
func (n *node) fixAttr(ctx context.Context, a *layer.Attr) {
	if !a.IsDir() || a.Mode&syscall.S_ISUID == 0 {
		return
	}
	n.fs.conv.RLock()
	defer n.fs.conv.RUnlock()
	n.fixAttrHeld(ctx, a)
}

// fixAttrHeld is fixAttr for a caller that holds fs.conv: a shared lock
// must not be taken twice, or a waiting conversion deadlocks both.
func (n *node) fixAttrHeld(ctx context.Context, a *layer.Attr) {
	if !a.IsDir() || a.Mode&syscall.S_ISUID == 0 {
		return
	}
	if st, e := n.state(ctx); e == 0 && st.managed {
		n.fixNlink(ctx, st, a)
	}
}

func (n *node) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	st, e := n.enter(ctx)
	if e != 0 {
		return nil, e
	}
	defer n.fs.conv.RUnlock()
	var c layer.Node
	_, e = n.existing(ctx, st, name, func(d layer.Node) (e layer.Errno) {
		c, e = d.Lookup(ctx, name, out)
		return e
	})
	if e != 0 {
		return nil, e
	}
	return n.child(ctx, c, out), 0
}

// child wraps a node the layer below produced.
func (n *node) child(ctx context.Context, c layer.Node, out *layer.Attr) layer.Node {
	w := n.fs.node(c, false)
	w.fixAttrHeld(ctx, out)
	return w
}

// make makes name in n with mk, in its bucket when n is managed.
func (n *node) make(ctx context.Context, name string, dir bool, out *layer.Attr, mk func(d layer.Node) (layer.Node, layer.Errno)) (layer.Node, layer.Errno) {
	st, e := n.enter(ctx)
	if e != 0 {
		return nil, e
	}
	defer n.fs.conv.RUnlock()
	d, b, e := n.creating(ctx, st, name)
	if e != 0 {
		return nil, e
	}
	c, e := mk(d)
	if e != 0 {
		return nil, e
	}
	n.changed(ctx, st, b, dir)
	return n.fs.node(c, false), 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, true, out, func(d layer.Node) (layer.Node, layer.Errno) {
		return d.Mkdir(ctx, name, mode, out)
	})
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint64, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, false, out, func(d layer.Node) (layer.Node, layer.Errno) {
		return d.Mknod(ctx, name, mode, dev, out)
	})
}

func (n *node) Symlink(ctx context.Context, target []byte, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.make(ctx, name, false, out, func(d layer.Node) (layer.Node, layer.Errno) {
		return d.Symlink(ctx, target, name, out)
	})
}

func (n *node) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	return n.make(ctx, name, false, out, func(d layer.Node) (layer.Node, layer.Errno) {
		return d.Link(ctx, t.Lower, name, out)
	})
}

// Create returns the lower handle itself: data passes unchanged (and so
// may go through FUSE passthrough).
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	var h layer.Handle
	c, e := n.make(ctx, name, false, out, func(d layer.Node) (c layer.Node, e layer.Errno) {
		c, h, e = d.Create(ctx, name, flags, mode, out)
		return c, e
	})
	if e != 0 {
		return nil, nil, e
	}
	return c, h, 0
}

func (n *node) Unlink(ctx context.Context, name string) layer.Errno {
	st, e := n.enter(ctx)
	if e != 0 {
		return e
	}
	defer n.fs.conv.RUnlock()
	b, e := n.existing(ctx, st, name, func(d layer.Node) layer.Errno { return d.Unlink(ctx, name) })
	if e == 0 {
		n.changed(ctx, st, b, false)
	}
	return e
}

func (n *node) Rmdir(ctx context.Context, name string) layer.Errno {
	st, e := n.enter(ctx)
	if e != 0 {
		return e
	}
	b, e := n.existing(ctx, st, name, func(d layer.Node) layer.Errno { return d.Rmdir(ctx, name) })
	if e == syscall.ENOTEMPTY && n.isManagedChild(ctx, st, name) {
		// Its empty buckets keep it from going: remove them, alone.
		n.fs.conv.RUnlock()
		n.fs.conv.Lock()
		defer n.fs.conv.Unlock()
		b, e = n.existing(ctx, st, name, func(d layer.Node) layer.Errno {
			if e := n.fs.emptyManaged(ctx, d, name); e != 0 {
				return e
			}
			return d.Rmdir(ctx, name)
		})
	} else {
		defer n.fs.conv.RUnlock()
	}
	if e == 0 {
		n.changed(ctx, st, b, true)
	}
	return e
}

// isManagedChild tells whether name in n is a managed directory.
func (n *node) isManagedChild(ctx context.Context, st *dirState, name string) bool {
	var a layer.Attr
	_, e := n.existing(ctx, st, name, func(d layer.Node) layer.Errno {
		c, e := d.Lookup(ctx, name, &a)
		if e == 0 {
			c.Forget()
		}
		return e
	})
	return e == 0 && a.IsDir() && a.Mode&syscall.S_ISUID != 0
}

const (
	renameNoreplace = 1 << 0
	renameExchange  = 1 << 1
)

// Rename moves the entry between the lower directories that hold the two
// names; the names themselves do not change.
func (n *node) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	d, ok := newDir.(*node)
	if !ok {
		return syscall.EXDEV
	}
	st, dst, e := n.enter2(ctx, d)
	if e != 0 {
		return e
	}
	e = n.rename(ctx, st, name, d, dst, newName, flags)
	if e == syscall.ENOTEMPTY && flags&renameExchange == 0 && d.isManagedChild(ctx, dst, newName) {
		// The target is an empty managed directory but for its
		// buckets: remove them, alone, and try again.
		n.fs.conv.RUnlock()
		n.fs.conv.Lock()
		defer n.fs.conv.Unlock()
		_, e = d.existing(ctx, dst, newName, func(dd layer.Node) layer.Errno {
			return n.fs.emptyManaged(ctx, dd, newName)
		})
		if e == 0 {
			e = n.rename(ctx, st, name, d, dst, newName, flags)
		}
		return e
	}
	n.fs.conv.RUnlock()
	return e
}

func (n *node) rename(ctx context.Context, st *dirState, name string, d *node, dst *dirState, newName string, flags uint32) layer.Errno {
	to, tb, e := d.creating(ctx, dst, newName)
	if e != 0 {
		return e
	}
	fb, e := n.existing(ctx, st, name, func(from layer.Node) layer.Errno {
		return from.Rename(ctx, name, to, newName, flags)
	})
	if e != 0 {
		return e
	}
	n.changed(ctx, st, fb, true)
	if d.Lower.Token() != n.Lower.Token() || tb != fb {
		d.changed(ctx, dst, tb, true)
	}
	return 0
}
