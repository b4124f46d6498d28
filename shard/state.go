package shard

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// dirState is what the layer knows about one lower directory, shared by
// every node of it (a directory may be looked up many times), so that a
// conversion made through one node is seen through all.
type dirState struct {
	tok  layer.Token
	refs int // under fs.mu

	initMu sync.Mutex
	ready  bool

	// managed and blocked change only with fs.conv held exclusively.
	managed bool
	blocked layer.Errno // why strays could not be moved into buckets
	// strays: the lower directory may hold entries beside the buckets.
	strays atomic.Bool

	mu sync.Mutex // guards t
	t  *buckets   // while managed
}

// buckets caches a managed directory's buckets.
type buckets struct {
	nodes   [nBuckets]layer.Node // looked up or made; nil: not yet
	exists  [nBuckets]bool       // known to exist
	subdirs [nBuckets]int32      // directories in the bucket; -1: unknown
}

func newBuckets() *buckets {
	t := &buckets{}
	for i := range t.subdirs {
		t.subdirs[i] = -1
	}
	return t
}

// keepBucket caches c as bucket b of st, whose events are then its
// directory's (Translate); st.mu is held.
func (f *fs) keepBucket(st *dirState, b int, c layer.Node) {
	st.t.nodes[b] = c
	f.bmu.Lock()
	f.byBucket[c.Token()] = bucketRef{st, b}
	f.bmu.Unlock()
}

// dropBuckets forgets the bucket nodes t caches.
func (f *fs) dropBuckets(t *buckets) {
	for i, b := range t.nodes {
		if b != nil {
			f.bmu.Lock()
			delete(f.byBucket, b.Token())
			f.bmu.Unlock()
			b.Forget()
			t.nodes[i] = nil
		}
	}
}

// state returns the directory state of n, loading it on first use. The
// caller holds fs.conv (either way).
func (n *node) state(ctx context.Context) (*dirState, layer.Errno) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.st != nil {
		return n.st, 0
	}
	st := n.fs.ref(n.Lower.Token())
	if e := st.load(ctx, n.Lower); e != 0 {
		n.fs.unref(st)
		return nil, e
	}
	n.st = st
	return st, 0
}

func (f *fs) ref(tok layer.Token) *dirState {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.dirs[tok]
	if st == nil {
		st = &dirState{tok: tok}
		f.dirs[tok] = st
	}
	st.refs++
	return st
}

func (f *fs) unref(st *dirState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st.refs--; st.refs > 0 {
		return
	}
	delete(f.dirs, st.tok)
	st.mu.Lock()
	if st.t != nil {
		f.dropBuckets(st.t)
	}
	st.mu.Unlock()
}

// loaded returns the state of the directory with token tok if a node
// holds it, else nil.
func (f *fs) loaded(tok layer.Token) *dirState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dirs[tok]
}

// load reads whether d is managed and, if so, which buckets exist and
// whether strays are left.
func (st *dirState) load(ctx context.Context, d layer.Node) layer.Errno {
	st.initMu.Lock()
	defer st.initMu.Unlock()
	if st.ready {
		return 0
	}
	var a layer.Attr
	if e := d.Getattr(ctx, nil, &a); e != 0 {
		return e
	}
	if a.IsDir() && a.Mode&syscall.S_ISUID != 0 {
		t := newBuckets()
		strays := false
		e := readAll(ctx, d, func(ent layer.DirEntry) {
			if b, ok := isBucket(ent); ok {
				t.exists[b] = true
			} else {
				strays = true
			}
		})
		if e != 0 {
			return e
		}
		st.managed, st.t = true, t
		st.strays.Store(strays)
	}
	st.ready = true
	return 0
}

// isBucket tells whether a lower entry of a managed directory is a bucket.
func isBucket(ent layer.DirEntry) (int, bool) {
	b, ok := bucketIndex(ent.Name)
	return b, ok && (ent.Type == syscall.S_IFDIR || ent.Type == 0)
}

// readAll calls fn for each entry of lower directory d but "." and "..".
func readAll(ctx context.Context, d layer.Node, fn func(layer.DirEntry)) layer.Errno {
	s, e := d.OpenDir(ctx)
	if e != 0 {
		return e
	}
	defer s.Close()
	for {
		ent, ok, e := s.Next(ctx)
		if e != 0 || !ok {
			return e
		}
		if ent.Name != "." && ent.Name != ".." {
			fn(ent)
		}
	}
}

// bucket returns the lower directory of bucket b of managed directory n,
// making it if create is set.
func (n *node) bucket(ctx context.Context, st *dirState, b int, create bool) (layer.Node, layer.Errno) {
	st.mu.Lock()
	if c := st.t.nodes[b]; c != nil {
		st.mu.Unlock()
		return c, 0
	}
	st.mu.Unlock()
	var a layer.Attr
	c, e := n.Lower.Lookup(ctx, bucketName(b), &a)
	if e == syscall.ENOENT && create {
		c, e = n.mkBucket(ctx, b, &a)
		if e == syscall.EEXIST {
			c, e = n.Lower.Lookup(ctx, bucketName(b), &a)
		}
	}
	if e != 0 {
		return nil, e
	}
	if !a.IsDir() {
		c.Forget()
		n.fs.log.Error("shard: a bucket is not a directory", "dir", n.Lower.Token(), "bucket", bucketName(b))
		return nil, syscall.EIO
	}
	n.fixBucket(ctx, b, c, &a)
	st.mu.Lock()
	defer st.mu.Unlock()
	if old := st.t.nodes[b]; old != nil {
		c.Forget()
		return old, 0
	}
	n.fs.keepBucket(st, b, c)
	st.t.exists[b], st.t.subdirs[b] = true, int32(a.Nlink)-2
	return c, 0
}

// mkBucket makes bucket b, as the process: a bucket is the layer's, not
// the caller's. bucket then gives it its directory's owner, group and
// permission bits (fixBucket).
func (n *node) mkBucket(ctx context.Context, b int, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.Lower.Mkdir(asProcess(ctx), bucketName(b), 0o700, out)
}

// fixBucket gives bucket b, with attributes a, its directory's owner,
// group and permission bits, less the mark, where it has others: a bucket
// just made, or one a crash left between its mkdir and this.
func (n *node) fixBucket(ctx context.Context, b int, c layer.Node, a *layer.Attr) {
	var da layer.Attr
	if e := n.Lower.Getattr(ctx, nil, &da); e != 0 {
		return
	}
	want := bucketAttr(&da)
	if a.Mode&0o7777 == want.Mode && a.Uid == want.Uid && a.Gid == want.Gid {
		return
	}
	if e := c.Setattr(asProcess(ctx), nil, want, a); e != 0 {
		// Only a non-root shale over another user's directory gets
		// here; the bucket works, it only reads differently beneath.
		n.fs.log.Warn("shard: cannot give a bucket its directory's owner and mode", "bucket", bucketName(b), "err", e)
	}
}

// bucketAttr is what a bucket of a directory with attributes da gets.
func bucketAttr(da *layer.Attr) *layer.SetAttr {
	return &layer.SetAttr{
		Valid: layer.SetMode | layer.SetUid | layer.SetGid,
		Mode:  da.Mode & 0o7777 &^ syscall.S_ISUID,
		Uid:   da.Uid,
		Gid:   da.Gid,
	}
}

// asProcess hides the caller from the layers below, which then act as
// the shale process (hostfs makes objects as the caller otherwise).
func asProcess(ctx context.Context) context.Context { return noValues{ctx} }

type noValues struct{ context.Context }

func (noValues) Value(any) any { return nil }

// subdirsChanged notes that bucket b may have gained or lost directories.
func (st *dirState) subdirsChanged(b int) {
	st.mu.Lock()
	if st.t != nil { // unless converted back meanwhile (Translate)
		st.t.subdirs[b] = -1
	}
	st.mu.Unlock()
}

// fixNlink replaces the lower link count of a managed directory, which
// counts buckets, by the one users expect: 2 + its subdirectories. Bucket
// counts are cached and refreshed only for buckets whose directories
// changed through the layer.
func (n *node) fixNlink(ctx context.Context, st *dirState, a *layer.Attr) {
	st.mu.Lock()
	defer st.mu.Unlock()
	t := st.t
	var nb, sub uint32
	for b := range nBuckets {
		if !t.exists[b] {
			continue
		}
		if t.subdirs[b] < 0 {
			var ba layer.Attr
			var e layer.Errno
			if c := t.nodes[b]; c != nil {
				e = c.Getattr(ctx, nil, &ba)
			} else if c, e = n.Lower.Lookup(ctx, bucketName(b), &ba); e == 0 {
				// Not kept: bucket keeps buckets, once it has checked
				// their attributes (fixBucket), which it cannot under
				// st.mu.
				c.Forget()
			}
			if e == syscall.ENOENT {
				t.exists[b] = false
				continue
			}
			if e != 0 || ba.Nlink < 2 {
				return // leave the lower count rather than guess
			}
			t.subdirs[b] = int32(ba.Nlink) - 2
		}
		nb++
		sub += uint32(t.subdirs[b])
	}
	if a.Nlink >= 2+nb {
		a.Nlink = a.Nlink - nb + sub
	}
}

// blockedErr is why names cannot be made in a directory with strays.
func (st *dirState) blockedErr() layer.Errno {
	if st.blocked != 0 {
		return st.blocked
	}
	return syscall.EIO
}
