package compress

import (
	"context"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// file is an open regular file of the layer.
type file struct {
	n     *node
	lower layer.Handle
}

// WriteShared passes on the lower file's (layer.WriteShared).
func (f *file) WriteShared() bool { return layer.IsWriteShared(f.lower) }

// lowerHandle returns the handle below h (nil for nil).
func lowerHandle(h layer.Handle) layer.Handle {
	if f, ok := h.(*file); ok {
		return f.lower
	}
	return h
}

func (f *file) lf() lowerFile { return lowerFile{f.n.Lower, f.lower} }

// begin takes the file's lock, shared or exclusive, with the state read
// and current: the lower file's attributes are those it was read at, or
// it is read again. It returns the unlock.
func (s *fstate) begin(ctx context.Context, lf lowerFile, write bool) (func(), layer.Errno) {
	if !write {
		s.mu.RLock()
		a, e := lf.attr(ctx)
		if e != 0 {
			s.mu.RUnlock()
			return nil, e
		}
		if s.current(&a) {
			return s.mu.RUnlock, 0
		}
		// Read it again under the exclusive lock, and serve the read
		// under it too, rather than race other changes for the
		// shared one.
		s.mu.RUnlock()
	}
	s.mu.Lock()
	a, e := lf.attr(ctx)
	if e == 0 && !s.current(&a) {
		e = s.readHeader(ctx, lf, &a)
		if e == 0 && s.kind == kindCompr {
			e = s.readTable(ctx, lf)
		}
	}
	if e != 0 {
		s.known = false
		s.mu.Unlock()
		return nil, e
	}
	return s.mu.Unlock, 0
}

// current tells whether the state describes the lower file of attributes
// a, table included.
func (s *fstate) current(a *layer.Attr) bool {
	return s.known && s.fp == fpOf(a) && (s.kind != kindCompr || s.table)
}

// view takes the file's lock for reading, with its state current; a
// damaged file is EIO.
func (f *file) view(ctx context.Context) (*fstate, func(), layer.Errno) {
	s := f.n.st
	unlock, e := s.begin(ctx, f.lf(), false)
	if e != 0 {
		return nil, nil, e
	}
	if s.kind == kindDamaged {
		unlock()
		return nil, nil, syscall.EIO
	}
	return s, unlock, 0
}

func (f *file) Read(ctx context.Context, dest []byte, off int64) (int, layer.Errno) {
	if len(dest) == 0 || off < 0 {
		return 0, 0
	}
	s, unlock, e := f.view(ctx)
	if e != 0 {
		return 0, e
	}
	defer unlock()
	switch s.kind {
	case kindEmpty:
		return 0, 0
	case kindPlain:
		return f.lower.Read(ctx, dest, off)
	}
	start, size := uint64(off), s.hdr.size
	if start >= size {
		return 0, 0
	}
	end := min(start+uint64(len(dest)), size)
	first := start / blockSize
	p, e := s.readBlocks(ctx, f.lf(), first, (end-1)/blockSize)
	if e != 0 {
		return 0, e
	}
	return copy(dest, p[start-first*blockSize:end-first*blockSize]), 0
}

// update runs fn under the file's exclusive lock, with the events the
// lower layers raise meanwhile held until it is released (a kernel
// request may wait on the lock while an invalidation waits on it).
func (f *file) update(ctx context.Context, fn func(ctx context.Context, s *fstate, lf lowerFile) layer.Errno) layer.Errno {
	return f.n.update(ctx, f.lf(), fn)
}

func (n *node) update(ctx context.Context, lf lowerFile, fn func(ctx context.Context, s *fstate, lf lowerFile) layer.Errno) layer.Errno {
	ctx, flush := layer.Defer(ctx)
	defer flush()
	unlock, e := n.st.begin(ctx, lf, true)
	if e != 0 {
		return e
	}
	defer unlock()
	if n.st.kind == kindDamaged {
		return syscall.EIO
	}
	return fn(ctx, n.st, lf)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	if len(data) == 0 {
		return 0, 0
	}
	k := 0
	e := f.update(ctx, func(ctx context.Context, s *fstate, lf lowerFile) layer.Errno {
		if s.kind == kindPlain {
			var e layer.Errno
			k, e = f.lower.Write(ctx, data, off)
			s.known = false
			return e
		}
		end := uint64(off) + uint64(len(data))
		if off < 0 || end > maxSize {
			return syscall.EFBIG
		}
		e := s.put(ctx, lf, uint64(off), end, data)
		if e == 0 {
			k = len(data)
		}
		return e
	})
	return k, e
}

// put writes data (nil: zeros) over [off, end), growing the file to end
// if it is shorter; mu is held exclusively. Blocks it covers whole are
// replaced; the others are read, changed and stored again.
func (s *fstate) put(ctx context.Context, lf lowerFile, off, end uint64, data []byte) layer.Errno {
	size := s.hdr.size
	newSize := max(size, end)
	var chs []change
	for b := off / blockSize; b*blockSize < end; b++ {
		bs := b * blockSize
		n := min(blockSize, newSize-bs) // the block's length after
		from, to := max(off, bs)-bs, min(end, bs+blockSize)-bs
		if from == 0 && to >= n {
			c := change{blk: b}
			if data != nil {
				c.data = data[bs-off : bs-off+n]
			}
			chs = append(chs, c)
			continue
		}
		p := make([]byte, blockSize)
		if bs < size && s.entryAt(b).kind != kindHole {
			old, e := s.readBlocks(ctx, lf, b, b)
			if e != 0 {
				return e
			}
			copy(p[:min(size-bs, blockSize)], old) // bytes past the size are not the file's
		}
		if data != nil {
			copy(p[from:to], data[bs+from-off:])
		} else {
			clear(p[from:to])
		}
		chs = append(chs, change{blk: b, data: p[:n]})
	}
	return s.commit(ctx, lf, chs, newSize)
}

// truncate sets the size of a regular file; done says whether the layer
// did it (a plain file's size is the lower file's, set below).
func (n *node) truncate(ctx context.Context, lh layer.Handle, size uint64) (done bool, e layer.Errno) {
	if lh == nil {
		if lh, e = n.Lower.Open(ctx, syscall.O_RDWR); e != 0 {
			return false, e
		}
		defer lh.Release(ctx)
	}
	e = n.update(ctx, lowerFile{n.Lower, lh}, func(ctx context.Context, s *fstate, lf lowerFile) layer.Errno {
		if s.kind == kindPlain {
			return 0
		}
		done = true
		if size > maxSize {
			return syscall.EFBIG
		}
		switch {
		case size > s.hdr.size:
			return s.commit(ctx, lf, nil, size)
		case size < s.hdr.size:
			return s.shrink(ctx, lf, size)
		}
		return 0
	})
	return done, e
}

func (f *file) Flush(ctx context.Context, owner uint64) layer.Errno {
	return f.lower.Flush(ctx, owner)
}

func (f *file) Fsync(ctx context.Context, datasync bool) layer.Errno {
	return f.lower.Fsync(ctx, datasync)
}

func (f *file) Release(ctx context.Context) layer.Errno { return f.lower.Release(ctx) }

// fallocate(2) modes the layer serves.
const (
	keepSize  = 0x01 // FALLOC_FL_KEEP_SIZE
	punchHole = 0x02 // FALLOC_FL_PUNCH_HOLE
	zeroRange = 0x10 // FALLOC_FL_ZERO_RANGE
)

// Allocate: a compressed file has no room to reserve (what a block will
// take is known when it is written), so plain allocation only sets the
// size; punching holes and zeroing ranges store zeros, which are holes.
func (f *file) Allocate(ctx context.Context, off, size int64, mode uint32) layer.Errno {
	if off < 0 || size <= 0 {
		return syscall.EINVAL
	}
	end := uint64(off) + uint64(size)
	return f.update(ctx, func(ctx context.Context, s *fstate, lf lowerFile) layer.Errno {
		if s.kind == kindPlain {
			e := f.lower.Allocate(ctx, off, size, mode)
			s.known = false
			return e
		}
		if end > maxSize {
			return syscall.EFBIG
		}
		switch mode {
		case 0:
			return s.commit(ctx, lf, nil, end)
		case keepSize:
			return 0
		case punchHole | keepSize, zeroRange | keepSize:
			if end = min(end, s.hdr.size); uint64(off) >= end {
				return 0
			}
			return s.put(ctx, lf, uint64(off), end, nil)
		case zeroRange:
			return s.put(ctx, lf, uint64(off), end, nil)
		}
		return syscall.EOPNOTSUPP
	})
}

// Lseek serves SEEK_DATA and SEEK_HOLE: holes are the pages (4 KiB) that
// read as zeros, stored or not.
func (f *file) Lseek(ctx context.Context, off int64, whence int) (int64, layer.Errno) {
	s, unlock, e := f.view(ctx)
	if e != 0 {
		return 0, e
	}
	defer unlock()
	if s.kind == kindPlain {
		return f.lower.Lseek(ctx, off, whence)
	}
	const seekData, seekHole = 3, 4
	if whence != seekData && whence != seekHole {
		return 0, syscall.EINVAL
	}
	size := s.hdr.size
	if off < 0 || uint64(off) >= size {
		return 0, syscall.ENXIO
	}
	const page = 4096
	for b := uint64(off) / blockSize; b < blocks(size); b++ {
		var p []byte
		if s.entryAt(b).kind != kindHole {
			if p, e = s.readBlocks(ctx, f.lf(), b, b); e != 0 {
				return 0, e
			}
		}
		for q := max(uint64(off), b*blockSize) &^ (page - 1); q < min((b+1)*blockSize, size); q += page {
			data := p != nil && !allZero(p[q-b*blockSize:min(q-b*blockSize+page, size-b*blockSize)])
			if data == (whence == seekData) {
				return int64(max(q, uint64(off))), 0
			}
		}
	}
	if whence == seekHole {
		return int64(size), 0
	}
	return 0, syscall.ENXIO
}

// CopyFileRange is left to the kernel, which falls back to read and write.
func (f *file) CopyFileRange(ctx context.Context, off int64, dst layer.Handle, dstOff int64, n int, flags uint32) (int, layer.Errno) {
	return 0, syscall.ENOSYS
}

func (f *file) Getlk(ctx context.Context, owner uint64, lk *layer.Lock) layer.Errno {
	return f.lower.Getlk(ctx, owner, lk)
}

func (f *file) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, wait bool) layer.Errno {
	return f.lower.Setlk(ctx, owner, lk, wait)
}
