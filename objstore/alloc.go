package objstore

import "math/bits"

// allocator tracks free blocks of the data area in a bitmap, one bit a block
// (a 2 GiB store costs 512 KiB). Objects are contiguous, so the first used
// block after a free one always starts an object; compaction relies on that.
// Allocation is next-fit from a cursor: consecutive creates land next to
// each other, which lets the write queue merge them into one write.
type allocator struct {
	used   []uint64 // bit set = block in use; bits past n are set
	n      uint32   // blocks in the data area
	free   uint32
	cursor uint32
}

func newAllocator(n uint32) *allocator {
	a := &allocator{used: make([]uint64, (uint64(n)+63)/64), n: n, free: n}
	if r := n % 64; r != 0 {
		a.used[len(a.used)-1] = ^uint64(0) << r
	}
	return a
}

// next returns the first block in [p, limit) whose bit equals set, or
// limit (at most n) if there is none.
func (a *allocator) next(p, limit uint32, set bool) uint32 {
	limit = min(limit, a.n)
	if p >= limit {
		return limit
	}
	for w := p / 64; w*64 < limit; w++ {
		word := a.used[w]
		if !set {
			word = ^word
		}
		if w == p/64 {
			word &= ^uint64(0) << (p % 64)
		}
		if word != 0 {
			return min(w*64+uint32(bits.TrailingZeros64(word)), limit)
		}
	}
	return limit
}

func (a *allocator) nextUsed(p uint32) uint32 { return a.next(p, a.n, true) }
func (a *allocator) nextFree(p uint32) uint32 { return a.next(p, a.n, false) }

// find returns the start, a multiple of align, of a free run of k blocks,
// searching from the cursor to the end and then from the start.
func (a *allocator) find(k, align uint32) (uint32, bool) {
	if k > a.free {
		return 0, false
	}
	if b, ok := a.scan(a.cursor, a.n, k, align); ok {
		return b, true
	}
	return a.scan(0, a.cursor, k, align)
}

// scan looks for a free run of k blocks aligned to align that starts in
// [from, to).
func (a *allocator) scan(from, to, k, align uint32) (uint32, bool) {
	for p := from; p < to; {
		z := a.nextFree(p)
		if z >= to {
			return 0, false
		}
		if z = alignUp(z, align); z >= a.n || a.n-z < k {
			return 0, false
		}
		// Look no further than k blocks: the run is long enough or it is not.
		o := a.next(z, z+k, true)
		if o-z >= k {
			return z, true
		}
		p = o
	}
	return 0, false
}

// set marks [b, b+k) used or free.
func (a *allocator) set(b, k uint32, used bool) {
	for p := b; p < b+k; {
		w, off := p/64, p%64
		span := min(64-off, b+k-p)
		m := (^uint64(0) >> (64 - span)) << off
		if used {
			a.used[w] |= m
		} else {
			a.used[w] &^= m
		}
		p += span
	}
	if used {
		a.free -= k
	} else {
		a.free += k
	}
}

func (a *allocator) take(b, k uint32) {
	a.set(b, k, true)
	a.cursor = b + k
}

func (a *allocator) release(b, k uint32) { a.set(b, k, false) }

// isFree reports whether all of [b, b+k) is free.
func (a *allocator) isFree(b, k uint32) bool {
	return uint64(b)+uint64(k) <= uint64(a.n) && a.next(b, b+k, true) == b+k
}

// largest returns the longest free run, for fragmentation reports.
func (a *allocator) largest() uint32 {
	var best uint32
	for p := a.nextFree(0); p < a.n; p = a.nextFree(p) {
		o := a.nextUsed(p)
		best = max(best, o-p)
		p = o
	}
	return best
}

// densest returns the start of the stretch with the most free blocks among
// those long enough to hold nb free blocks at the store's average density.
// Compaction starting there moves the least data to gather nb blocks.
func (a *allocator) densest(nb uint32) uint32 {
	words := len(a.used)
	span := int(min(uint64(nb)*uint64(a.n)/uint64(max(a.free, 1))/64+1, uint64(words)))
	freeIn := func(w int) int { return 64 - bits.OnesCount64(a.used[w]) }
	sum := 0
	for w := 0; w < span; w++ {
		sum += freeIn(w)
	}
	best, start := sum, 0
	for w := span; w < words; w++ {
		if sum += freeIn(w) - freeIn(w-span); sum > best {
			best, start = sum, w-span+1
		}
	}
	return uint32(start * 64)
}
