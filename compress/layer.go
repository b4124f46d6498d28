package compress

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

func init() {
	stack.Register(stack.Kind{
		Name:  "compress",
		Short: "compress file data with zstd, block by block (over crypt: --layer crypt --layer compress)",
		Check: func(layers []string, i int) error {
			// Encrypted data does not compress: compress must see the
			// plaintext, so it goes above crypt.
			if j := slices.Index(layers[i+1:], "crypt"); j >= 0 {
				return fmt.Errorf("layer compress below crypt gains nothing (ciphertext does not compress): stack it above, --layer crypt --layer compress")
			}
			return nil
		},
		Open: func(ctx context.Context, st *stack.Stack, lower layer.Node, dir string, l stack.Layer) (layer.Node, error) {
			return New(lower), nil
		},
	})
}

// New stacks a compress layer over lower. lower stays the caller's:
// Forget on the new root does not forget it.
func New(lower layer.Node) layer.Node {
	f := &fs{files: map[layer.Token]*fstate{}}
	return &node{PassThrough: layer.PassThrough{Lower: lower}, fs: f, root: true}
}

// fs is one compress layer: the states of the files its nodes hold.
type fs struct {
	mu    sync.Mutex
	files map[layer.Token]*fstate
}

func (f *fs) acquire(tok layer.Token) *fstate {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.files[tok]
	if s == nil {
		s = &fstate{tok: tok}
		f.files[tok] = s
	}
	s.refs++
	return s
}

func (f *fs) release(s *fstate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.refs--; s.refs == 0 {
		delete(f.files, s.tok)
	}
}

// node is a node of the layer. A file above is one file below for all
// its life (the layer updates it in place), so the lower token names it:
// the layer keeps it, as docs/coherence.md says a layer may then.
type node struct {
	layer.PassThrough
	fs   *fs
	root bool
	st   *fstate // regular files only
}

var (
	_ layer.Node           = (*node)(nil)
	_ layer.NameTranslator = (*node)(nil)
)

// child wraps a node the layer below produced, with attributes out
// (whose size it turns into the layer's) and, if one is open, a handle.
func (n *node) child(ctx context.Context, c layer.Node, out *layer.Attr, lh layer.Handle) (*node, layer.Errno) {
	m := &node{PassThrough: layer.PassThrough{Lower: c}, fs: n.fs}
	if out.Mode&syscall.S_IFMT == syscall.S_IFREG {
		m.st = n.fs.acquire(c.Token())
		if e := m.fixAttr(ctx, lh, out); e != 0 {
			m.Forget()
			return nil, e
		}
	}
	return m, 0
}

func (n *node) Forget() {
	if n.st != nil {
		n.fs.release(n.st)
	}
	if !n.root {
		n.Lower.Forget()
	}
}

// KeepsOffsets: a block's place below is not its place above.
func (n *node) KeepsOffsets() bool { return false }

// Translate passes on the events beneath, with a Data event's range
// widened to the whole file: its offsets are the lower file's.
func (n *node) Translate(ev layer.Event) []layer.Event {
	evs := layer.Translate(n.Lower, ev)
	for i := range evs {
		if evs[i].Kind == layer.Data {
			evs[i].Off, evs[i].Len = 0, 0
		}
	}
	return evs
}

// UpperName: names are the layer beneath's.
func (n *node) UpperName(ctx context.Context, lower string) (string, bool) {
	if t, ok := n.Lower.(layer.NameTranslator); ok {
		return t.UpperName(ctx, lower)
	}
	return lower, true
}

// fixAttr turns a regular file's lower attributes into the layer's: the
// size is the logical one; st_blocks stays the lower file's, the stored
// size.
func (n *node) fixAttr(ctx context.Context, lh layer.Handle, a *layer.Attr) layer.Errno {
	if n.st == nil || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0
	}
	size, e := n.logicalSize(ctx, lh, a)
	if e != 0 {
		return e
	}
	a.Size = size
	return 0
}

// logicalSize gives the size above of the file whose lower attributes are
// a, reading its header only if the lower file changed since it was last
// read.
func (n *node) logicalSize(ctx context.Context, lh layer.Handle, a *layer.Attr) (uint64, layer.Errno) {
	s, fp := n.st, fpOf(a)
	s.mu.RLock()
	if s.known && s.fp == fp {
		size := s.sizeOf(a)
		s.mu.RUnlock()
		return size, 0
	}
	s.mu.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known || s.fp != fp {
		if lh == nil && a.Size > 0 {
			h, e := n.Lower.Open(ctx, syscall.O_RDONLY|syscall.O_NOATIME)
			if e != 0 {
				return 0, e
			}
			defer h.Release(ctx)
			lh = h
		}
		if e := s.readHeader(ctx, lowerFile{n.Lower, lh}, a); e != 0 {
			return 0, e
		}
	}
	return s.sizeOf(a), 0
}

// sizeOf is the size above; a the lower attributes s describes.
func (s *fstate) sizeOf(a *layer.Attr) uint64 {
	if s.kind == kindCompr {
		return s.hdr.size
	}
	return a.Size // plain, empty, or damaged (so that it can be removed)
}

func (n *node) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	lh := lowerHandle(h)
	if e := n.Lower.Getattr(ctx, lh, out); e != 0 {
		return e
	}
	return n.fixAttr(ctx, lh, out)
}

func (n *node) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	lh := lowerHandle(h)
	if in.Valid&layer.SetSize != 0 && n.st != nil {
		done, e := n.truncate(ctx, lh, in.Size)
		if e != 0 {
			return e
		}
		if done {
			rest := *in
			rest.Valid &^= layer.SetSize
			if rest.Valid&(layer.SetMtime|layer.SetMtimeNow) == 0 {
				// As the lower file system's truncate would.
				rest.Valid |= layer.SetMtimeNow
			}
			in = &rest
		}
	}
	if e := n.Lower.Setattr(ctx, lh, in, out); e != 0 {
		return e
	}
	return n.fixAttr(ctx, lh, out)
}

func (n *node) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	c, e := n.Lower.Lookup(ctx, name, out)
	if e != 0 {
		return nil, e
	}
	return n.made(ctx, c, out, nil, 0)
}

// made wraps a node just found or made, or passes on the error.
func (n *node) made(ctx context.Context, c layer.Node, out *layer.Attr, lh layer.Handle, e layer.Errno) (layer.Node, layer.Errno) {
	if e != 0 {
		return nil, e
	}
	m, e := n.child(ctx, c, out, lh)
	if e != 0 {
		return nil, e
	}
	return m, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	c, e := n.Lower.Mkdir(ctx, name, mode, out)
	return n.made(ctx, c, out, nil, e)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint64, out *layer.Attr) (layer.Node, layer.Errno) {
	c, e := n.Lower.Mknod(ctx, name, mode, dev, out)
	return n.made(ctx, c, out, nil, e)
}

func (n *node) Symlink(ctx context.Context, target []byte, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	c, e := n.Lower.Symlink(ctx, target, name, out)
	return n.made(ctx, c, out, nil, e)
}

func (n *node) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	c, e := n.Lower.Link(ctx, t.Lower, name, out)
	return n.made(ctx, c, out, nil, e)
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	c, lh, e := n.Lower.Create(ctx, name, layer.BlockFlags(flags), mode, out)
	if e != 0 {
		return nil, nil, e
	}
	m, e := n.child(ctx, c, out, lh)
	if e != 0 {
		lh.Release(ctx)
		return nil, nil, e
	}
	return m, &file{n: m, lower: lh}, 0
}

func (n *node) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	d, ok := newDir.(*node)
	if !ok {
		return syscall.EXDEV
	}
	return n.Lower.Rename(ctx, name, d.Lower, newName, flags)
}

func (n *node) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	lh, e := n.Lower.Open(ctx, layer.BlockFlags(flags))
	if e != 0 {
		return nil, e
	}
	if n.st == nil {
		return lh, 0 // not a regular file: nothing to translate
	}
	return &file{n: n, lower: lh}, 0
}
