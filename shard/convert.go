package shard

import (
	"context"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// Setattr converts a directory when its setuid bit changes: setting it
// marks the directory managed and moves its entries into buckets,
// clearing it moves them back. The kernel has checked that the caller
// may chmod (owner or root).
func (n *node) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	var cur layer.Attr
	if in.Valid&(layer.SetMode|layer.SetUid|layer.SetGid) == 0 || n.Lower.Getattr(ctx, h, &cur) != 0 || !cur.IsDir() {
		if e := n.Lower.Setattr(ctx, h, in, out); e != 0 {
			return e
		}
		n.fixAttr(ctx, out)
		return 0
	}
	f := n.fs
	f.conv.RLock()
	st, e := n.state(ctx)
	if e != 0 {
		f.conv.RUnlock()
		return e
	}
	want := st.managed
	if in.Valid&layer.SetMode != 0 {
		want = in.Mode&syscall.S_ISUID != 0
	}
	if want == st.managed {
		defer f.conv.RUnlock()
		return n.setattrSame(ctx, st, h, in, out)
	}
	f.conv.RUnlock()
	f.conv.Lock()
	defer f.conv.Unlock()
	switch {
	case want == st.managed: // converted meanwhile
		return n.setattrSame(ctx, st, h, in, out)
	case want:
		return n.convert(ctx, st, h, in, out)
	default:
		return n.unconvert(ctx, st, h, in, out)
	}
}

// setattrSame changes the attributes of a directory that stays as it is;
// buckets follow a managed directory's owner, group and mode.
func (n *node) setattrSame(ctx context.Context, st *dirState, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	if e := n.Lower.Setattr(ctx, h, in, out); e != 0 || !st.managed {
		return e
	}
	if e := n.keepMark(ctx, h, out); e != 0 {
		return e
	}
	for b := range nBuckets {
		st.mu.Lock()
		ok := st.t.exists[b]
		st.mu.Unlock()
		if !ok {
			continue
		}
		if d, e := n.bucket(ctx, st, b, false); e == 0 {
			var a layer.Attr
			d.Setattr(asProcess(ctx), nil, bucketAttr(out), &a)
		}
	}
	n.fixNlink(ctx, st, out)
	return 0
}

// keepMark sets the mark of managed directory n again if the lower
// setattr that left it with attributes out cleared it: POSIX lets chown
// clear the setuid bit of a directory (older XFS did, for owners without
// CAP_FSETID), and an unmarked directory would show its buckets. Only a
// mode without the bit, asked for from above, unmarks.
func (n *node) keepMark(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	if out.Mode&syscall.S_ISUID != 0 {
		return 0
	}
	in := &layer.SetAttr{Valid: layer.SetMode, Mode: out.Mode&0o7777 | syscall.S_ISUID}
	if e := n.Lower.Setattr(asProcess(ctx), h, in, out); e != 0 {
		n.fs.log.Error("shard: cannot set the mark again on a managed directory", "dir", n.Lower.Token(), "err", e)
		return e
	}
	return 0
}

// convert marks directory n managed, then moves its entries into buckets.
// A crash in between leaves a managed directory with strays, which reads
// whole and is finished on its next use. fs.conv is held exclusively.
func (n *node) convert(ctx context.Context, st *dirState, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	var bad string
	if e := readAll(ctx, n.Lower, func(ent layer.DirEntry) {
		if _, ok := bucketIndex(ent.Name); ok {
			bad = ent.Name
		}
	}); e != 0 {
		return e
	}
	if bad != "" {
		// It would read as a bucket once the directory is marked.
		n.fs.log.Warn("shard: cannot mark a directory holding a name reserved for buckets; rename it first", "dir", n.Lower.Token(), "name", bad)
		return syscall.EINVAL
	}
	if e := n.Lower.Setattr(ctx, h, in, out); e != 0 {
		return e
	}
	if e := n.keepMark(ctx, h, out); e != 0 {
		return e
	}
	st.mu.Lock()
	st.t = newBuckets()
	st.mu.Unlock()
	st.managed, st.blocked = true, 0
	st.strays.Store(true)
	if e := n.finish(ctx, st); e != 0 {
		return e
	}
	if e := n.Lower.Getattr(ctx, h, out); e != 0 {
		return e
	}
	n.fixNlink(ctx, st, out)
	return 0
}

// settle finishes an interrupted conversion of n, if it still needs it.
func (n *node) settle(ctx context.Context, st *dirState) {
	n.fs.conv.Lock()
	defer n.fs.conv.Unlock()
	if !st.strays.Load() {
		return
	}
	if !st.managed {
		st.strays.Store(false)
		return
	}
	n.finish(ctx, st)
}

// finish moves the strays of managed directory n into their buckets.
// What cannot be moved stays a stray, listed and found but blocking new
// names (a stray of the same name could be made twice otherwise).
// fs.conv is held exclusively.
func (n *node) finish(ctx context.Context, st *dirState) layer.Errno {
	var names []string
	var bs []int
	if e := readAll(ctx, n.Lower, func(ent layer.DirEntry) {
		if b, ok := isBucket(ent); ok {
			bs = append(bs, b)
		} else {
			names = append(names, ent.Name)
		}
	}); e != 0 {
		st.blocked = e
		return e
	}
	st.mu.Lock()
	for _, b := range bs {
		st.t.exists[b] = true
	}
	st.mu.Unlock()
	var first layer.Errno
	for _, name := range names {
		b, _ := place(name)
		d, e := n.bucket(ctx, st, b, true)
		if e == 0 {
			e = n.Lower.Rename(ctx, name, d, name, renameNoreplace)
			st.subdirsChanged(b)
		}
		if e != 0 && first == 0 {
			n.fs.log.Error("shard: cannot move an entry into its bucket", "dir", n.Lower.Token(), "name", name, "err", e)
			first = e
		}
	}
	st.blocked = first
	st.strays.Store(first != 0)
	return first
}

// unconvert moves the entries of managed directory n out of their
// buckets, removes the buckets and clears the mark, in that order: until
// the mark goes, a crash leaves a managed directory with strays, which
// reads whole (and its next use moves them back). fs.conv is held
// exclusively.
func (n *node) unconvert(ctx context.Context, st *dirState, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	type entry struct {
		d    layer.Node
		name string
	}
	var bs []int
	if e := readAll(ctx, n.Lower, func(ent layer.DirEntry) {
		if b, ok := isBucket(ent); ok {
			bs = append(bs, b)
		}
	}); e != 0 {
		return e
	}
	var ents []entry
	var bad string
	for _, b := range bs {
		d, e := n.bucket(ctx, st, b, false)
		if e == 0 {
			e = readAll(ctx, d, func(ent layer.DirEntry) {
				if _, ok := bucketIndex(ent.Name); ok {
					bad = ent.Name
				}
				ents = append(ents, entry{d, ent.Name})
			})
		}
		if e != 0 {
			return e
		}
	}
	if bad != "" {
		// At the top level it would read as a bucket.
		n.fs.log.Warn("shard: cannot unmark a directory holding a name reserved for buckets; rename it first", "dir", n.Lower.Token(), "name", bad)
		return syscall.EINVAL
	}
	st.strays.Store(true)
	for _, ent := range ents {
		if e := ent.d.Rename(ctx, ent.name, n.Lower, ent.name, renameNoreplace); e != 0 {
			n.fs.log.Error("shard: cannot move an entry out of its bucket", "dir", n.Lower.Token(), "name", ent.name, "err", e)
			return e
		}
	}
	st.mu.Lock()
	n.fs.dropBuckets(st.t)
	st.t = newBuckets()
	st.mu.Unlock()
	for _, b := range bs {
		if e := n.Lower.Rmdir(ctx, bucketName(b)); e != 0 {
			return e
		}
	}
	if e := n.Lower.Setattr(ctx, h, in, out); e != 0 {
		return e
	}
	st.mu.Lock()
	st.t = nil
	st.mu.Unlock()
	st.managed, st.blocked = false, 0
	st.strays.Store(false)
	return 0
}

// emptyManaged removes the buckets of name in lower directory d if it is
// an empty managed directory, so that it can be removed or replaced; it
// fails with ENOTEMPTY if it holds entries. fs.conv is held exclusively.
func (f *fs) emptyManaged(ctx context.Context, d layer.Node, name string) layer.Errno {
	var a layer.Attr
	c, e := d.Lookup(ctx, name, &a)
	if e != 0 {
		return e
	}
	defer c.Forget()
	if !a.IsDir() || a.Mode&syscall.S_ISUID == 0 {
		return 0
	}
	var bs []int
	stray := false
	if e := readAll(ctx, c, func(ent layer.DirEntry) {
		if b, ok := isBucket(ent); ok {
			bs = append(bs, b)
		} else {
			stray = true
		}
	}); e != 0 {
		return e
	}
	if stray {
		return syscall.ENOTEMPTY
	}
	// A node of it may be loaded: its cached buckets are going.
	st := f.loaded(c.Token())
	if st != nil {
		st.mu.Lock()
		if st.t != nil {
			f.dropBuckets(st.t)
			st.t = newBuckets()
			for _, b := range bs {
				st.t.exists[b] = true
			}
		}
		st.mu.Unlock()
	}
	for _, b := range bs {
		if e := c.Rmdir(ctx, bucketName(b)); e != 0 {
			return e
		}
		if st != nil {
			st.mu.Lock()
			if st.t != nil {
				st.t.exists[b] = false
			}
			st.mu.Unlock()
		}
	}
	return 0
}
