package shard

import (
	"context"
	"slices"
	"sort"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// OpenDir lists an ordinary directory as the layer below does, and a
// managed one by merging its buckets (see the package comment for the
// offsets).
func (n *node) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
	st, e := n.enter(ctx)
	if e != 0 {
		return nil, e
	}
	defer n.fs.conv.RUnlock()
	if !st.managed {
		return n.Lower.OpenDir(ctx)
	}
	s := &stream{n: n, st: st}
	if e := s.readTop(ctx); e != 0 {
		return nil, e
	}
	return s, 0
}

// stream lists a managed directory: ".", "..", then each bucket in turn,
// read whole and ordered by key.
type stream struct {
	n  *node
	st *dirState

	// From the top level, read at the start and on rewind: "." and
	// "..", the buckets that exist, and strays (entries beside the
	// buckets), by the bucket they belong in.
	dots   []layer.DirEntry
	have   [nBuckets]bool
	strays map[int][]layer.DirEntry

	next   int // of dots; len(dots) when in the buckets
	b      int // current bucket; nBuckets at the end
	loaded bool
	ents   []layer.DirEntry // of bucket b, Off set, ordered by Off
	i      int              // next of ents
}

func (s *stream) readTop(ctx context.Context) layer.Errno {
	ls, e := s.n.Lower.OpenDir(ctx)
	if e != 0 {
		return e
	}
	defer ls.Close()
	s.dots, s.have, s.strays = nil, [nBuckets]bool{}, nil
	for {
		ent, ok, e := ls.Next(ctx)
		if e != 0 {
			return e
		}
		if !ok {
			break
		}
		switch {
		case ent.Name == ".":
			ent.Off = offDot
			s.dots = append(s.dots, ent)
		case ent.Name == "..":
			ent.Off = offDotDot
			s.dots = append(s.dots, ent)
		default:
			if b, ok := isBucket(ent); ok {
				s.have[b] = true
				continue
			}
			if s.strays == nil {
				s.strays = map[int][]layer.DirEntry{}
			}
			b, _ := place(ent.Name)
			s.strays[b] = append(s.strays[b], ent)
		}
	}
	slices.SortFunc(s.dots, func(a, b layer.DirEntry) int { return int(a.Off) - int(b.Off) })
	s.next, s.b, s.loaded = 0, 0, false
	return 0
}

// load reads bucket b with the strays that belong in it.
func (s *stream) load(ctx context.Context, b int) layer.Errno {
	s.b, s.loaded, s.ents, s.i = b, true, s.ents[:0], 0
	seen := map[string]bool{}
	add := func(ent layer.DirEntry) {
		if seen[ent.Name] {
			return // a stray moved into its bucket while we read
		}
		seen[ent.Name] = true
		_, key := place(ent.Name)
		ent.Off = offset(b, key)
		s.ents = append(s.ents, ent)
	}
	if e := s.inBucket(ctx, b, func(d layer.Node) layer.Errno { return readAll(ctx, d, add) }); e != 0 {
		return e
	}
	for _, ent := range s.strays[b] {
		add(ent)
	}
	slices.SortFunc(s.ents, func(a, b layer.DirEntry) int {
		switch {
		case a.Off < b.Off:
			return -1
		case a.Off > b.Off:
			return 1
		}
		return 0
	})
	return 0
}

func (s *stream) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if s.next < len(s.dots) {
		s.next++
		return s.dots[s.next-1], true, 0
	}
	for s.b < nBuckets {
		if !s.loaded {
			if !s.hasBucket(s.b) && len(s.strays[s.b]) == 0 {
				s.b++
				continue
			}
			if e := s.load(ctx, s.b); e != 0 {
				return layer.DirEntry{}, false, e
			}
		}
		if s.i < len(s.ents) {
			s.i++
			return s.ents[s.i-1], true, 0
		}
		s.b++
		s.loaded = false
	}
	return layer.DirEntry{}, false, 0
}

// Seek goes to the entry after the one whose offset is off. Offsets name
// a bucket and a key, so the position survives any change of the
// directory: entries made or removed since only show up or not.
func (s *stream) Seek(ctx context.Context, off uint64) layer.Errno {
	switch {
	case off == 0:
		return s.readTop(ctx)
	case off == offDot || off == offDotDot:
		s.next = min(int(off), len(s.dots))
		s.b, s.loaded = 0, false
		return 0
	case off < offset(0, 0):
		return syscall.EINVAL
	}
	s.next = len(s.dots)
	b, key := int(off>>keyBits)-1, off&keyMask
	if b >= nBuckets {
		s.b, s.loaded = nBuckets, false
		return 0
	}
	if e := s.load(ctx, b); e != 0 {
		return e
	}
	s.i = sort.Search(len(s.ents), func(i int) bool { return s.ents[i].Off&keyMask > key })
	return 0
}

// Fsync syncs the top level and every bucket.
func (s *stream) Fsync(ctx context.Context, datasync bool) layer.Errno {
	if e := syncDir(ctx, s.n.Lower, datasync); e != 0 {
		return e
	}
	for b := range nBuckets {
		if e := s.inBucket(ctx, b, func(d layer.Node) layer.Errno { return syncDir(ctx, d, datasync) }); e != 0 {
			return e
		}
	}
	return 0
}

// hasBucket tells whether bucket b existed when the stream read the top
// level or was made through the layer since.
func (s *stream) hasBucket(b int) bool {
	if s.have[b] {
		return true
	}
	s.n.fs.conv.RLock()
	defer s.n.fs.conv.RUnlock()
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.t != nil && s.st.t.exists[b]
}

// inBucket runs fn on bucket b if it exists. A directory converted back
// since the stream began has none.
func (s *stream) inBucket(ctx context.Context, b int, fn func(d layer.Node) layer.Errno) layer.Errno {
	if !s.hasBucket(b) {
		return 0
	}
	s.n.fs.conv.RLock()
	defer s.n.fs.conv.RUnlock()
	if !s.st.managed {
		return 0
	}
	d, e := s.n.bucket(ctx, s.st, b, false)
	if e == 0 {
		e = fn(d)
	}
	if e == syscall.ENOENT {
		return 0
	}
	return e
}

func syncDir(ctx context.Context, d layer.Node, datasync bool) layer.Errno {
	ls, e := d.OpenDir(ctx)
	if e != 0 {
		return e
	}
	defer ls.Close()
	return ls.Fsync(ctx, datasync)
}

func (s *stream) Close() {}
