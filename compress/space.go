package compress

import (
	"slices"
	"sort"
)

// space keeps which bytes of a lower file are free: the gaps between the
// extents the committed header, table and entries name, and everything
// from end on. New extents never go where the committed state points, so
// a crash at any moment leaves every block whole, old or new.
type space struct {
	gaps []extent // sorted, disjoint, not touching one another or end
	end  uint64
}

type extent struct{ off, n uint64 }

// newSpace builds the free space of a file from the extents in use.
func newSpace(used []extent) space {
	slices.SortFunc(used, func(a, b extent) int {
		switch {
		case a.off < b.off:
			return -1
		case a.off > b.off:
			return 1
		}
		return 0
	})
	var s space
	for _, u := range used {
		if u.off > s.end {
			s.gaps = append(s.gaps, extent{s.end, u.off - s.end})
		}
		s.end = max(s.end, u.off+u.n)
	}
	return s
}

// alloc finds room for n bytes: the first gap that holds them, else the
// end.
func (s *space) alloc(n uint64) uint64 {
	for i, g := range s.gaps {
		if g.n >= n {
			if g.n == n {
				s.gaps = slices.Delete(s.gaps, i, i+1)
			} else {
				s.gaps[i] = extent{g.off + n, g.n - n}
			}
			return g.off
		}
	}
	off := s.end
	s.end += n
	return off
}

// allocEnd takes n bytes at the end, from an offset aligned to align (a
// power of two), for a table: the bytes beyond the lower file's end read
// as zeros, so only its non-zero pages need writing.
func (s *space) allocEnd(n, align, lowerLen uint64) uint64 {
	off := (max(s.end, lowerLen) + align - 1) &^ (align - 1)
	if off > s.end {
		s.free(extent{s.end, off - s.end})
	}
	s.end = off + n
	return off
}

// free gives an extent back.
func (s *space) free(e extent) {
	if e.n == 0 {
		return
	}
	i := sort.Search(len(s.gaps), func(i int) bool { return s.gaps[i].off > e.off })
	s.gaps = slices.Insert(s.gaps, i, e)
	// Coalesce with the next, then the previous.
	if i+1 < len(s.gaps) && s.gaps[i].off+s.gaps[i].n == s.gaps[i+1].off {
		s.gaps[i].n += s.gaps[i+1].n
		s.gaps = slices.Delete(s.gaps, i+1, i+2)
	}
	if i > 0 && s.gaps[i-1].off+s.gaps[i-1].n == s.gaps[i].off {
		s.gaps[i-1].n += s.gaps[i].n
		s.gaps = slices.Delete(s.gaps, i, i+1)
		i--
	}
	if last := s.gaps[len(s.gaps)-1]; last.off+last.n >= s.end {
		s.end = last.off
		s.gaps = s.gaps[:len(s.gaps)-1]
	}
}

// stored is the bytes in use.
func (s *space) stored() uint64 {
	n := s.end
	for _, g := range s.gaps {
		n -= g.n
	}
	return n
}
