package compress

import (
	"context"
	"slices"

	"github.com/shalefs/shale/layer"
)

// A change gives block blk new content (at most a block, the rest of
// which reads as zeros); nil makes it a hole.
type change struct {
	blk  uint64
	data []byte
	en   entry
	out  []byte // the stored form
}

// commit stores changes (sorted, one per block) and makes the size
// newSize, no smaller than it was; mu is held exclusively and the table
// loaded (or the file empty). Every new extent goes into free space,
// then the entries are switched one by one (each a 32-byte write, whole
// or not at all), then the header: a crash leaves each block old or new,
// and a size that covers no block newer than itself. On failure the
// state is dropped, to be read again from the lower file.
func (s *fstate) commit(ctx context.Context, lf lowerFile, chs []change, newSize uint64) layer.Errno {
	e := s.doCommit(ctx, lf, chs, newSize)
	if e != 0 {
		s.known = false
	}
	return e
}

func (s *fstate) doCommit(ctx context.Context, lf lowerFile, chs []change, newSize uint64) layer.Errno {
	fresh := s.kind == kindEmpty
	if fresh {
		// The header of an empty file first: until it is there, the
		// lower file would read as a plain one, whatever else was
		// written.
		s.hdr = header{tableOff: headerSize}
		if e := writeFull(ctx, lf, s.hdr.encode(), 0); e != 0 {
			return e
		}
		s.ents, s.sp, s.lowerSz, s.kind = nil, space{end: headerSize}, headerSize, kindCompr
	}
	old := s.hdr.size
	newSize = max(newSize, old)
	if newSize > old {
		if e := s.canHold(ctx, lf, newSize); e != 0 {
			return e
		}
		var e layer.Errno
		if chs, e = s.growing(ctx, lf, chs, old, newSize); e != 0 {
			return e
		}
	}
	parallel(len(chs), func(i int) {
		if chs[i].data != nil {
			chs[i].en, chs[i].out = encodeBlock(chs[i].blk, chs[i].data)
		}
	})
	need := s.hdr.tableCap
	for _, c := range chs {
		if c.en.kind != kindHole {
			need = max(need, c.blk+1)
		}
	}
	relocate := need > s.hdr.tableCap
	newTable := s.hdr
	if relocate {
		newTable.tableCap = need
		if !fresh {
			newTable.tableCap = max(need, 2*s.hdr.tableCap)
		}
	}
	// A small file's table goes between the header and the data: one run
	// of bytes. A larger one goes to the end, where its zero pages stay
	// holes (a sparse file's table is mostly zeros).
	bigTable := newTable.tableCap*entrySize >= 8192
	if fresh && !bigTable {
		newTable.tableOff = s.sp.alloc(newTable.tableCap * entrySize)
	}
	// The extents, in free space; adjacent ones in one write.
	var runs []extent
	for i := range chs {
		c := &chs[i]
		if c.en.kind == kindHole {
			continue
		}
		c.en.off = s.sp.alloc(uint64(c.en.n))
		if k := len(runs) - 1; k >= 0 && runs[k].off+runs[k].n == c.en.off {
			runs[k].n += uint64(c.en.n)
		} else {
			runs = append(runs, extent{c.en.off, uint64(c.en.n)})
		}
	}
	ci := 0
	for _, r := range runs {
		buf := make([]byte, 0, r.n)
		for ; uint64(len(buf)) < r.n; ci++ {
			if chs[ci].en.kind != kindHole {
				buf = append(buf, chs[ci].out...)
			}
		}
		if e := writeFull(ctx, lf, buf, r.off); e != 0 {
			s.trimTo(ctx, lf, s.lowerSz)
			return e
		}
		s.lowerSz = max(s.lowerSz, r.off+r.n)
	}
	ents := s.ents
	if relocate {
		ents = append(slices.Clone(s.ents), make([]entry, newTable.tableCap-uint64(len(s.ents)))...)
	}
	var freed []extent
	for _, c := range chs {
		if c.blk < uint64(len(ents)) {
			if o := ents[c.blk]; o.kind == kindZstd || o.kind == kindRaw {
				freed = append(freed, extent{o.off, uint64(o.n)})
			}
			ents[c.blk] = c.en
		}
	}
	if relocate {
		if !fresh || bigTable {
			align := uint64(entrySize)
			if bigTable {
				align = 4096 // so that its zero pages are whole lower pages
			}
			newTable.tableOff = s.sp.allocEnd(newTable.tableCap*entrySize, align, s.lowerSz)
		}
		if !fresh {
			freed = append(freed, extent{s.hdr.tableOff, s.hdr.tableCap * entrySize})
		}
		if e := s.writeTable(ctx, lf, ents, newTable.tableOff, newTable.tableOff >= s.lowerSz); e != 0 {
			return e
		}
	} else if e := s.writeEntries(ctx, lf, ents, chs); e != 0 {
		return e
	}
	newTable.size = newSize
	if fresh || relocate || newSize != old {
		if e := writeFull(ctx, lf, newTable.encode(), 0); e != 0 {
			return e
		}
	}
	s.hdr, s.ents, s.kind = newTable, ents, kindCompr
	for _, f := range freed {
		s.sp.free(f)
	}
	return s.settle(ctx, lf)
}

// canHold asks the lower file system whether it takes files of size
// bytes, where it might not (past 4 GiB): the lower file is set to that
// size and back. Its limit is the layer's, as EFBIG from truncate(2)
// and write(2) shows it, though the layer stores far less.
func (s *fstate) canHold(ctx context.Context, lf lowerFile, size uint64) layer.Errno {
	if size <= max(s.lowerSz, 1<<32) {
		return 0
	}
	if e := lf.setSize(ctx, size); e != 0 {
		return e
	}
	return lf.setSize(ctx, s.lowerSz)
}

// growing adds to chs what a size growing from old to newSize needs: the
// old last block cut to the old size (a shrink leaves stale bytes past
// the size in it), and holes for blocks a crash left entries for.
func (s *fstate) growing(ctx context.Context, lf lowerFile, chs []change, old, newSize uint64) ([]change, layer.Errno) {
	has := func(b uint64) bool {
		_, ok := slices.BinarySearchFunc(chs, b, func(c change, b uint64) int { return cmpU(c.blk, b) })
		return ok
	}
	if ob := old / blockSize; old%blockSize != 0 && !has(ob) && s.entryAt(ob).kind != kindHole {
		p, e := s.readBlocks(ctx, lf, ob, ob)
		if e != 0 {
			return nil, e
		}
		chs = append(chs, change{blk: ob, data: p[:old-ob*blockSize]})
	}
	for b := blocks(old); b < min(blocks(newSize), uint64(len(s.ents))); b++ {
		if s.ents[b].kind != kindHole && !has(b) {
			chs = append(chs, change{blk: b})
		}
	}
	slices.SortFunc(chs, func(a, b change) int { return cmpU(a.blk, b.blk) })
	return chs, 0
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// writeTable writes a whole table at off. If off lies past the lower
// file's end (sparse), pages of zeros (holes) are left unwritten, as the
// lower file reads zeros there, and the file is extended over the table.
func (s *fstate) writeTable(ctx context.Context, lf lowerFile, ents []entry, off uint64, sparse bool) layer.Errno {
	n := uint64(len(ents)) * entrySize
	buf := make([]byte, n)
	for i, en := range ents {
		en.encode(buf[i*entrySize:])
	}
	const page = 4096
	for p := uint64(0); p < n; p += page {
		chunk := buf[p:min(p+page, n)]
		if sparse && allZero(chunk) && off%page == 0 {
			continue
		}
		// Write the run of non-zero pages from here in one go.
		q := p + page
		for q < n && !allZero(buf[q:min(q+page, n)]) {
			q += page
		}
		if e := writeFull(ctx, lf, buf[p:min(q, n)], off+p); e != 0 {
			return e
		}
		p = q - page
	}
	if end := off + n; end > s.lowerSz {
		if e := lf.setSize(ctx, end); e != 0 {
			return e
		}
		s.lowerSz = end
	}
	return 0
}

// writeEntries writes the entries of the changed blocks in place, one
// write for each run of adjacent blocks.
func (s *fstate) writeEntries(ctx context.Context, lf lowerFile, ents []entry, chs []change) layer.Errno {
	for i := 0; i < len(chs); {
		j := i + 1
		for j < len(chs) && chs[j].blk == chs[j-1].blk+1 && chs[j].blk < uint64(len(ents)) {
			j++
		}
		if chs[i].blk >= uint64(len(ents)) {
			i = j // a hole past the table is a hole already
			continue
		}
		buf := make([]byte, (j-i)*entrySize)
		for k := i; k < j; k++ {
			ents[chs[k].blk].encode(buf[(k-i)*entrySize:])
		}
		if e := writeFull(ctx, lf, buf, s.hdr.tableOff+chs[i].blk*entrySize); e != 0 {
			return e
		}
		i = j
	}
	return 0
}

// settle cuts free space off the end of the lower file and takes the
// lower file's attributes as those the state describes.
func (s *fstate) settle(ctx context.Context, lf lowerFile) layer.Errno {
	if e := s.compact(ctx, lf); e != 0 {
		return e
	}
	if s.lowerSz > s.sp.end {
		if e := s.trimTo(ctx, lf, s.sp.end); e != 0 {
			return e
		}
	}
	a, e := lf.attr(ctx)
	if e != 0 {
		return e
	}
	s.fp, s.lowerSz, s.known = fpOf(&a), a.Size, true
	return 0
}

func (s *fstate) trimTo(ctx context.Context, lf lowerFile, n uint64) layer.Errno {
	if e := lf.setSize(ctx, n); e != 0 {
		return e
	}
	s.lowerSz = n
	return 0
}

// shrink cuts the file to size (below its size); mu is held exclusively
// and the table loaded. The header first: blocks past the size are holes
// whatever their entries say, so the entries are cleared after it.
func (s *fstate) shrink(ctx context.Context, lf lowerFile, size uint64) layer.Errno {
	if size == 0 {
		s.known = false
		if e := lf.setSize(ctx, 0); e != 0 {
			return e
		}
		s.kind, s.hdr, s.ents, s.sp, s.lowerSz = kindEmpty, header{}, nil, space{}, 0
		return s.settle(ctx, lf)
	}
	h := s.hdr
	h.size = size
	if e := writeFull(ctx, lf, h.encode(), 0); e != 0 {
		s.known = false
		return e
	}
	s.hdr.size = size
	var chs []change
	var freed []extent
	for b := blocks(size); b < uint64(len(s.ents)); b++ {
		if o := s.ents[b]; o.kind != kindHole {
			chs = append(chs, change{blk: b})
			if o.kind != badKind {
				freed = append(freed, extent{o.off, uint64(o.n)})
			}
			s.ents[b] = entry{}
		}
	}
	if e := s.writeEntries(ctx, lf, s.ents, chs); e != 0 {
		s.known = false
		return e
	}
	for _, f := range freed {
		s.sp.free(f)
	}
	return s.settle(ctx, lf)
}

// compact moves the extents that end the file into gaps before them, a
// few an update: a block rewritten in pieces takes new room each time
// (the old extent stays until its entry is switched), which would
// otherwise leave the file full of holes. Each move is a rewrite of the
// block with the same content, as crash-safe.
func (s *fstate) compact(ctx context.Context, lf lowerFile) layer.Errno {
	for range 16 {
		if len(s.sp.gaps) == 0 {
			return 0
		}
		if tn := s.hdr.tableCap * entrySize; tn > 0 && s.hdr.tableOff+tn == s.sp.end {
			if !slices.ContainsFunc(s.sp.gaps, func(g extent) bool { return g.n >= tn }) {
				return 0
			}
			// The table ends the file: it moves as it grows, a new
			// copy first, then the header.
			h := s.hdr
			h.tableOff = s.sp.alloc(tn)
			if e := s.writeTable(ctx, lf, s.ents, h.tableOff, false); e != 0 {
				return e
			}
			if e := writeFull(ctx, lf, h.encode(), 0); e != 0 {
				return e
			}
			s.sp.free(extent{s.hdr.tableOff, tn})
			s.hdr = h
			continue
		}
		b, ok := s.lastExtent()
		if !ok {
			return 0
		}
		en := s.ents[b]
		if !slices.ContainsFunc(s.sp.gaps, func(g extent) bool { return g.n >= uint64(en.n) }) {
			return 0
		}
		buf := make([]byte, en.n)
		if _, e := readFull(ctx, lf, buf, int64(en.off)); e != 0 {
			return e
		}
		moved := en
		moved.off = s.sp.alloc(uint64(en.n))
		if e := writeFull(ctx, lf, buf, moved.off); e != 0 {
			return e
		}
		s.ents[b] = moved
		if e := s.writeEntries(ctx, lf, s.ents, []change{{blk: b}}); e != 0 {
			return e
		}
		s.sp.free(extent{en.off, uint64(en.n)})
	}
	return 0
}

// lastExtent finds the block whose extent ends the file's used bytes.
func (s *fstate) lastExtent() (uint64, bool) {
	for b := len(s.ents) - 1; b >= 0; b-- {
		if en := s.ents[b]; (en.kind == kindZstd || en.kind == kindRaw) && en.off+uint64(en.n) == s.sp.end {
			return uint64(b), true
		}
	}
	return 0, false
}
