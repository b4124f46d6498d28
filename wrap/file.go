package wrap

import (
	"bytes"
	"context"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// file is an open file of the layer.
type file struct {
	n     *node
	lower layer.Handle
}

func (f *fs) wrapHandle(n *node, h layer.Handle, flags uint32) layer.Handle {
	if f.blocks == nil {
		return h // data passes unchanged
	}
	return &file{n: n, lower: h}
}

// lowerHandle returns the handle below h (nil for nil).
func lowerHandle(h layer.Handle) layer.Handle {
	if f, ok := h.(*file); ok {
		return f.lower
	}
	return h
}

// lowerFlags adapts open flags for the layer below: blocks are read,
// modified and written whole, so a writer must be able to read, and
// appends are placed by the template, not by the lower file system.
func (f *fs) lowerFlags(flags uint32) uint32 {
	if f.blocks == nil {
		return flags
	}
	if flags&syscall.O_ACCMODE == syscall.O_WRONLY {
		// Reading to modify must not count as an access.
		flags = flags&^syscall.O_ACCMODE | syscall.O_RDWR | syscall.O_NOATIME
	}
	return flags &^ syscall.O_APPEND
}

// lowerLen is the lower file's size, through h.
func (n *node) lowerLen(ctx context.Context, h layer.Handle) (uint64, layer.Errno) {
	var a layer.Attr
	if e := n.lower.Getattr(ctx, h, &a); e != 0 {
		return 0, e
	}
	return a.Size, 0
}

// header returns the file's header, making one if the file has none and
// create is set; nil if the layer has no headers or the file is empty.
func (n *node) header(ctx context.Context, h layer.Handle, lowerLen uint64, create bool) ([]byte, layer.Errno) {
	fs := n.fs
	if fs.header == nil {
		return nil, 0
	}
	if lowerLen == 0 {
		if !create {
			return nil, 0
		}
		hdr, err := fs.header.NewHeader()
		if err != nil {
			return nil, syscall.EIO
		}
		if k, e := h.Write(ctx, hdr, 0); e != 0 || uint64(k) != fs.hs {
			return nil, orEIO(e)
		}
		return hdr, 0
	}
	hdr := make([]byte, fs.hs)
	if k, e := h.Read(ctx, hdr, 0); e != 0 || uint64(k) != fs.hs {
		fs.log.Error("wrap: file header cut short", "token", n.Token(), "err", e)
		return nil, syscall.EIO
	}
	if err := fs.header.CheckHeader(hdr); err != nil {
		fs.log.Error("wrap: bad file header", "token", n.Token(), "err", err)
		return nil, syscall.EIO
	}
	return hdr, 0
}

func orEIO(e layer.Errno) layer.Errno {
	if e != 0 {
		return e
	}
	return syscall.EIO
}

// readBlocks returns the plaintext of blocks first..last (fewer at the end
// of the file).
func (n *node) readBlocks(ctx context.Context, h layer.Handle, hdr []byte, first, last uint64) ([]byte, layer.Errno) {
	fs := n.fs
	sb := fs.bs + fs.ov
	buf := make([]byte, (last-first+1)*sb)
	k, e := h.Read(ctx, buf, int64(fs.hs+first*sb))
	if e != 0 {
		return nil, e
	}
	buf = buf[:k]
	out := make([]byte, 0, (last-first+1)*fs.bs)
	for b := first; len(buf) > 0; b++ {
		stored := buf[:min(uint64(len(buf)), sb)]
		buf = buf[len(stored):]
		if uint64(len(stored)) <= fs.ov && fs.ov > 0 {
			fs.log.Error("wrap: block cut short", "token", n.Token(), "block", b)
			return nil, syscall.EIO
		}
		if allZero(stored) {
			// A hole: the lower file system never stored this block.
			out = append(out, make([]byte, uint64(len(stored))-fs.ov)...)
			continue
		}
		var err error
		if out, err = fs.blocks.DecodeBlock(out, hdr, b, stored); err != nil {
			fs.log.Error("wrap: block does not decode", "token", n.Token(), "block", b, "err", err)
			return nil, syscall.EIO
		}
	}
	return out, 0
}

// writeBlocks encodes plain, the whole content of blocks from first on,
// and writes it.
func (n *node) writeBlocks(ctx context.Context, h layer.Handle, hdr []byte, first uint64, plain []byte) layer.Errno {
	fs := n.fs
	out := make([]byte, 0, uint64(len(plain))/fs.bs*(fs.bs+fs.ov)+fs.bs+fs.ov)
	for b := first; len(plain) > 0; b++ {
		blk := plain[:min(uint64(len(plain)), fs.bs)]
		plain = plain[len(blk):]
		var err error
		if out, err = fs.blocks.EncodeBlock(out, hdr, b, blk); err != nil {
			return syscall.EIO
		}
	}
	k, e := h.Write(ctx, out, int64(fs.hs+first*(fs.bs+fs.ov)))
	if e != 0 {
		return e
	}
	if k != len(out) {
		return syscall.EIO
	}
	return 0
}

// allZero compares against a zero block, which the runtime does a word at
// a time.
func allZero(b []byte) bool {
	for len(b) > 0 {
		k := min(len(b), len(zeros))
		if !bytes.Equal(b[:k], zeros[:k]) {
			return false
		}
		b = b[k:]
	}
	return true
}

var zeros [8192]byte

func (f *file) Read(ctx context.Context, dest []byte, off int64) (int, layer.Errno) {
	n, fs := f.n, f.n.fs
	if len(dest) == 0 || off < 0 {
		return 0, 0
	}
	ctx, unlock := n.lockData(ctx, false)
	defer unlock()
	// No stat for the size: the lower read comes back short at the end,
	// and the blocks decode to exactly the bytes there are.
	var hdr []byte
	if fs.header != nil {
		hdr = make([]byte, fs.hs)
		k, e := f.lower.Read(ctx, hdr, 0)
		switch {
		case e != 0:
			return 0, e
		case k == 0:
			return 0, 0 // an empty file
		case uint64(k) != fs.hs:
			fs.log.Error("wrap: file header cut short", "token", n.Token())
			return 0, syscall.EIO
		}
		if err := fs.header.CheckHeader(hdr); err != nil {
			fs.log.Error("wrap: bad file header", "token", n.Token(), "err", err)
			return 0, syscall.EIO
		}
	}
	end := uint64(off) + uint64(len(dest))
	first, last := uint64(off)/fs.bs, (end-1)/fs.bs
	plain, e := n.readBlocks(ctx, f.lower, hdr, first, last)
	if e != 0 {
		return 0, e
	}
	start := uint64(off) - first*fs.bs
	if start >= uint64(len(plain)) {
		return 0, 0
	}
	return copy(dest, plain[start:]), 0
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	n := f.n
	if len(data) == 0 {
		return 0, 0
	}
	ctx, unlock := n.lockData(ctx, true)
	defer unlock()
	if e := n.writeAt(ctx, f.lower, data, uint64(off)); e != 0 {
		return 0, e
	}
	return len(data), 0
}

// writeAt writes data at off, reading first what partial blocks keep;
// the data lock is held.
func (n *node) writeAt(ctx context.Context, h layer.Handle, data []byte, off uint64) layer.Errno {
	fs := n.fs
	ll, e := n.lowerLen(ctx, h)
	if e != 0 {
		return e
	}
	size := fs.plainSize(ll)
	hdr, e := n.header(ctx, h, ll, true)
	if e != 0 {
		return e
	}
	end := off + uint64(len(data))
	first, last := off/fs.bs, (end-1)/fs.bs
	// A partial last block before the write's first block must be made
	// whole: only a file's last block may be short.
	if oldLast := size / fs.bs; size%fs.bs != 0 && oldLast < first {
		blk, e := n.readBlocks(ctx, h, hdr, oldLast, oldLast)
		if e != 0 {
			return e
		}
		blk = append(blk, make([]byte, fs.bs-uint64(len(blk)))...)
		if e := n.writeBlocks(ctx, h, hdr, oldLast, blk); e != 0 {
			return e
		}
	}
	newSize := max(size, end)
	span := make([]byte, min(newSize, (last+1)*fs.bs)-first*fs.bs)
	// Keep the old bytes the write does not cover in its first and last
	// blocks.
	if off > first*fs.bs || (end < uint64(len(span))+first*fs.bs) {
		if first*fs.bs < size {
			old, e := n.readBlocks(ctx, h, hdr, first, last)
			if e != 0 {
				return e
			}
			copy(span, old)
		}
	}
	copy(span[off-first*fs.bs:], data)
	return n.writeBlocks(ctx, h, hdr, first, span)
}

// truncate sets the size to size, through h if given.
func (n *node) truncate(ctx context.Context, h layer.Handle, size uint64) layer.Errno {
	return n.resize(ctx, h, size, false)
}

// grow extends the file to size if it is shorter, deciding under the data
// lock, so that a write that extends it meanwhile is not cut back.
func (n *node) grow(ctx context.Context, h layer.Handle, size uint64) layer.Errno {
	return n.resize(ctx, h, size, true)
}

func (n *node) resize(ctx context.Context, h layer.Handle, size uint64, growOnly bool) layer.Errno {
	lh := lowerHandle(h)
	if lh == nil {
		var e layer.Errno
		if lh, e = n.lower.Open(ctx, syscall.O_RDWR); e != 0 {
			return e
		}
		defer lh.Release(ctx)
	}
	ctx, unlock := n.lockData(ctx, true)
	defer unlock()
	fs := n.fs
	ll, e := n.lowerLen(ctx, lh)
	if e != 0 {
		return e
	}
	old := fs.plainSize(ll)
	if growOnly && size <= old {
		return 0
	}
	set := func(l uint64) layer.Errno {
		var a layer.Attr
		return n.lower.Setattr(ctx, lh, &layer.SetAttr{Valid: layer.SetSize, Size: l}, &a)
	}
	hdr, e := n.header(ctx, lh, ll, size > 0)
	if e != 0 {
		return e
	}
	// Only a file's last block may be short: growing makes the old last
	// block whole (or as long as the new size reaches), shrinking cuts the
	// new last block.
	b, keep := old/fs.bs, uint64(0)
	switch {
	case size > old && old%fs.bs != 0:
		keep = min(size-b*fs.bs, fs.bs)
	case size < old && size%fs.bs != 0:
		b = size / fs.bs
		keep = size % fs.bs
	}
	var blk []byte
	if keep > 0 {
		if blk, e = n.readBlocks(ctx, lh, hdr, b, b); e != 0 {
			return e
		}
		if uint64(len(blk)) > keep {
			blk = blk[:keep]
		}
		blk = append(blk, make([]byte, keep-uint64(len(blk)))...)
	}
	if size > old {
		// Grow first: the lower file system vets the size (EFBIG).
		if e := set(fs.lowerSize(size)); e != 0 || blk == nil {
			return e
		}
		return n.writeBlocks(ctx, lh, hdr, b, blk)
	}
	if blk != nil {
		if e := n.writeBlocks(ctx, lh, hdr, b, blk); e != 0 {
			return e
		}
	}
	return set(fs.lowerSize(size))
}

func (f *file) Flush(ctx context.Context, owner uint64) layer.Errno {
	return f.lower.Flush(ctx, owner)
}

func (f *file) Fsync(ctx context.Context, datasync bool) layer.Errno {
	return f.lower.Fsync(ctx, datasync)
}

func (f *file) Release(ctx context.Context) layer.Errno { return f.lower.Release(ctx) }

// Allocate passes through where offsets mean the same above and below.
// Otherwise it supports preallocation, which may extend the file; the
// other modes address bytes of the lower file the layer has reshaped.
func (f *file) Allocate(ctx context.Context, off, size int64, mode uint32) layer.Errno {
	fs := f.n.fs
	if !fs.sized() {
		return f.lower.Allocate(ctx, off, size, mode)
	}
	const keepSize = 1 // FALLOC_FL_KEEP_SIZE
	if mode&^keepSize != 0 {
		return syscall.EOPNOTSUPP
	}
	end := uint64(off + size)
	if e := f.lower.Allocate(ctx, 0, int64(fs.lowerSize(end)), keepSize); e != 0 {
		return e
	}
	if mode&keepSize != 0 {
		return 0
	}
	return f.n.grow(ctx, f, end)
}

// Lseek passes through where offsets mean the same above and below.
// Otherwise it reports no holes: the layer's blocks do not line up with the
// lower file system's, so every byte below the size counts as data.
func (f *file) Lseek(ctx context.Context, off int64, whence int) (int64, layer.Errno) {
	if !f.n.fs.sized() {
		return f.lower.Lseek(ctx, off, whence)
	}
	var a layer.Attr
	if e := f.n.Getattr(ctx, f, &a); e != 0 {
		return 0, e
	}
	if off < 0 || uint64(off) >= a.Size {
		return 0, syscall.ENXIO
	}
	const seekData, seekHole = 3, 4
	switch whence {
	case seekData:
		return off, 0
	case seekHole:
		return int64(a.Size), 0
	}
	return 0, syscall.EINVAL
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
