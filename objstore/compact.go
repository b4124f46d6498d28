package objstore

import "fmt"

// compact makes a free run of nb blocks aligned to align when free space
// suffices but is scattered. It slides objects toward the start of the
// store, closing the holes between them, until the hole it gathers is long
// enough: first from the stretch of the store where free space is densest,
// so that it moves as little as it can, then, if that reaches the end, from
// block 0, which ends with nearly all free space in one run (large objects
// keep their page alignment, which can leave gaps of a few blocks).
//
// The paper moved an object toward the front when the area around it was
// mostly free; sliding is the same move made only when an allocation needs
// it, and it costs a copy of the live data it passes over.
func (s *Store) compact(nb, align uint32) (uint32, bool, error) {
	s.q.drain() // the moves read objects back from the device
	s.compactions++
	for _, from := range []uint32{s.alloc.densest(nb), 0} {
		b, ok, err := s.slide(s.alloc.nextFree(from), nb, align)
		if ok || err != nil {
			return b, ok, err
		}
	}
	return 0, false, nil
}

// slide moves objects down into the hole starting at w until the hole holds
// an aligned run of nb blocks, and returns the run's start.
func (s *Store) slide(w, nb, align uint32) (uint32, bool, error) {
	var buf []byte
	for w < s.alloc.n {
		o := s.alloc.nextUsed(w)
		if b := alignUp(w, align); uint64(b)+uint64(nb) <= uint64(o) {
			return b, true, nil
		}
		if o == s.alloc.n {
			return 0, false, nil
		}
		id, err := s.objectAt(o)
		if err != nil {
			return 0, false, err
		}
		e := s.idx.at(id)
		k := blocksFor(int64(e.size))
		dst := alignUp(w, alignFor(int64(e.size)))
		if dst >= o {
			w = o + k // already as low as its alignment allows
			continue
		}
		if need := int(k) * blockSize; cap(buf) < need {
			buf = alignedBuf(need)
		}
		b := buf[:int(k)*blockSize]
		if err := s.dev.readAt(b, int64(superBlocks+o)*blockSize); err != nil {
			return 0, false, err
		}
		if err := s.dev.writev([][]byte{b}, int64(superBlocks+dst)*blockSize); err != nil {
			return 0, false, err
		}
		s.alloc.release(o, k)
		s.alloc.set(dst, k, true)
		e.block = dst
		w = dst + k
		s.moved += uint64(k)
	}
	return 0, false, nil
}

// objectAt finds the id of the object that starts at block b. Its header
// names its hash; should the header be unreadable (a failed write), the
// index is searched instead.
func (s *Store) objectAt(b uint32) (uint32, error) {
	hb := make([]byte, headerSize)
	if err := s.dev.readAt(hb, int64(superBlocks+b)*blockSize); err == nil {
		if hd, ok := decodeHeader(hb); ok {
			if id, _, ok := s.idx.find(hd.hash); ok && s.idx.at(id).block == b {
				return id, nil
			}
		}
	}
	found, ok := uint32(0), false
	s.pol.Walk(func(id uint32) {
		if s.idx.at(id).block == b {
			found, ok = id, true
		}
	})
	if !ok {
		return 0, fmt.Errorf("block %d is in use but no object starts there: %w", b, ErrCorrupt)
	}
	return found, nil
}
