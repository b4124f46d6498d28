package wrap

import (
	"bytes"
	"cmp"
	"context"
	"math"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// file is an open file of the layer.
type file struct {
	n      *node
	lower  layer.Handle
	wronly bool // opened for writing only: the lower handle reads too (lowerFlags)
}

func (f *fs) wrapHandle(n *node, h layer.Handle, flags uint32) layer.Handle {
	if f.blocks == nil {
		return h // data passes unchanged
	}
	return &file{n: n, lower: h, wronly: flags&syscall.O_ACCMODE == syscall.O_WRONLY}
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

// lowerFlags adapts open flags for the layer below (layer.BlockFlags,
// where a BlockCodec stores the data).
func (f *fs) lowerFlags(flags uint32) uint32 {
	if f.blocks == nil {
		return flags
	}
	return layer.BlockFlags(flags)
}

// openLower opens the lower file for flags (lowerFlags). A caller who may
// write the file but not read it (mode 0200) writes all the same, as
// natively: its own open for writing is the check, and the open that
// reads too is the layer's own (layer.AsSelf). Over 9P the lower file
// system checks the caller itself, and would refuse the reading open.
func (n *node) openLower(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	lf := n.fs.lowerFlags(flags)
	h, e := n.Lower.Open(ctx, lf)
	if e != syscall.EACCES || lf&syscall.O_ACCMODE == flags&syscall.O_ACCMODE {
		return h, e
	}
	check, e := n.Lower.Open(ctx, flags)
	if e != 0 {
		return nil, e
	}
	check.Release(ctx)
	return n.Lower.Open(layer.AsSelf(ctx), lf)
}

// lowerLen is the lower file's size, through h.
func (n *node) lowerLen(ctx context.Context, h layer.Handle) (uint64, layer.Errno) {
	var a layer.Attr
	if e := n.Lower.Getattr(ctx, h, &a); e != 0 {
		return 0, e
	}
	return a.Size, 0
}

// header returns the file's header, making one if the file has no data
// and create is set; nil if the layer has no headers or the file is empty.
//
// A file with no data gets a new header even if it holds one: a header
// kept would let someone who can write the lower file system plant
// another file's there (its file ID), so that the blocks written next are
// bound to that file and can be moved into it unseen (gocryptfs' audit,
// finding 2.2).
func (n *node) header(ctx context.Context, h layer.Handle, lowerLen uint64, create bool) ([]byte, layer.Errno) {
	fs := n.fs
	if fs.header == nil {
		return nil, 0
	}
	if fs.plainSize(lowerLen) == 0 {
		if !create {
			return nil, 0
		}
		hdr, err := fs.header.NewHeader()
		if err != nil {
			return nil, syscall.EIO
		}
		if lowerLen > 0 {
			// Bytes after the old header would read as a block.
			if e := n.setLowerSize(ctx, h, 0); e != 0 {
				return nil, e
			}
		}
		if _, e := writeFull(ctx, h, hdr, 0); e != 0 {
			// A header cut short would make the file unreadable.
			n.setLowerSize(ctx, h, 0)
			return nil, e
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
	stored, e := n.readStored(ctx, h, first, last)
	if e != 0 {
		return nil, e
	}
	return n.decodeBlocks(hdr, first, stored)
}

// readStored returns the stored form of blocks first..last (fewer at the
// end of the file).
func (n *node) readStored(ctx context.Context, h layer.Handle, first, last uint64) ([]byte, layer.Errno) {
	sb := n.fs.bs + n.fs.ov
	buf := make([]byte, (last-first+1)*sb)
	k, e := h.Read(ctx, buf, int64(n.fs.hs+first*sb))
	if e != 0 {
		return nil, e
	}
	return buf[:k], 0
}

// decodeBlocks returns the plaintext of buf, the stored form of blocks
// from first on.
func (n *node) decodeBlocks(hdr []byte, first uint64, buf []byte) ([]byte, layer.Errno) {
	fs := n.fs
	sb := fs.bs + fs.ov
	out := make([]byte, 0, (uint64(len(buf))+sb-1)/sb*fs.bs)
	for b := first; len(buf) > 0; b++ {
		stored := buf[:min(uint64(len(buf)), sb)]
		buf = buf[len(stored):]
		if uint64(len(stored)) <= fs.ov && fs.ov > 0 {
			fs.log.Error("wrap: block cut short", "token", n.Token(), "block", b)
			return nil, syscall.EIO
		}
		if allZero(stored) && !fs.fill {
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
// and writes it; it returns how many stored bytes went down, all unless
// the lower file system failed (with its errno).
func (n *node) writeBlocks(ctx context.Context, h layer.Handle, hdr []byte, first uint64, plain []byte) (uint64, layer.Errno) {
	fs := n.fs
	out := make([]byte, 0, uint64(len(plain))/fs.bs*(fs.bs+fs.ov)+fs.bs+fs.ov)
	for b := first; len(plain) > 0; b++ {
		blk := plain[:min(uint64(len(plain)), fs.bs)]
		plain = plain[len(blk):]
		var err error
		if out, err = fs.blocks.EncodeBlock(out, hdr, b, blk); err != nil {
			return 0, syscall.EIO
		}
	}
	return writeFull(ctx, h, out, fs.hs+first*(fs.bs+fs.ov))
}

// writeFull writes all of b at off. A short write goes on with the rest,
// which gets the lower file system's errno (ENOSPC, EDQUOT, EFBIG...); it
// returns how much was written.
func writeFull(ctx context.Context, h layer.Handle, b []byte, off uint64) (uint64, layer.Errno) {
	var done uint64
	for done < uint64(len(b)) {
		k, e := h.Write(ctx, b[done:], int64(off+done))
		switch {
		case e != 0:
			return done, e
		case k <= 0 || uint64(k) > uint64(len(b))-done:
			return done, syscall.EIO // a lower layer that neither writes nor fails
		}
		done += uint64(k)
	}
	return done, 0
}

func (n *node) setLowerSize(ctx context.Context, h layer.Handle, l uint64) layer.Errno {
	var a layer.Attr
	return n.Lower.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetSize, Size: l}, &a)
}

// tooBig reports whether a file of size s cannot be stored: its lower size
// would pass the largest file offset (EFBIG, as the lower file system says
// at its own limit).
func (f *fs) tooBig(s uint64) bool { return s > f.plainSize(math.MaxInt64) }

// An update changes blocks of a file below. The lower file system may stop
// it midway (ENOSPC, EDQUOT, EFBIG), even inside a block, which would then
// not decode; so an update keeps the old content of the blocks it may
// have to put back.
type update struct {
	n   *node
	h   layer.Handle
	hdr []byte
	old []oldBlock
}

type oldBlock struct {
	b     uint64
	plain []byte
	hole  bool // stored as zeros: put back as zeros, which need no room
}

// read returns the plaintext of block b, and keeps it.
func (u *update) read(ctx context.Context, b uint64) ([]byte, layer.Errno) {
	if o, ok := u.kept(b); ok {
		return o.plain, 0
	}
	stored, e := u.n.readStored(ctx, u.h, b, b)
	if e != 0 {
		return nil, e
	}
	p, e := u.n.decodeBlocks(u.hdr, b, stored)
	if e != 0 {
		return nil, e
	}
	u.old = append(u.old, oldBlock{b, p, allZero(stored)})
	return p, 0
}

func (u *update) kept(b uint64) (oldBlock, bool) {
	for _, o := range u.old {
		if o.b == b {
			return o, true
		}
	}
	return oldBlock{}, false
}

func (u *update) write(ctx context.Context, first uint64, plain []byte) (uint64, layer.Errno) {
	return u.n.writeBlocks(ctx, u.h, u.hdr, first, plain)
}

// undo repairs the file after the lower file system stopped a write of
// blocks from first on after k stored bytes, and leaves it size bytes
// long, no longer than it was unless whole blocks of new data reach
// further. The blocks written whole keep their new content; the one it
// stopped inside, and a block before first that was made whole for a
// size the file does not reach, get their old content back.
func (u *update) undo(ctx context.Context, first, k, size uint64) {
	fs := u.n.fs
	sb := fs.bs + fs.ov
	stopped, torn := first+k/sb, k%sb
	var e layer.Errno
	// Every kept block lies within the old size, which size is not below.
	for _, o := range u.old {
		switch {
		case o.b == stopped && torn > 0:
			e = cmp.Or(e, u.putBack(ctx, o, torn))
		case o.b < first && size < (o.b+1)*fs.bs:
			e = cmp.Or(e, u.putBack(ctx, o, sb))
		}
	}
	if _, ok := u.kept(stopped); !ok && torn > 0 && stopped*fs.bs < size {
		// A block the write replaced whole was not read. A lower file
		// system that writes in place stops inside one only to allocate
		// room, so it was a hole: if the rest of it is zeros, it was.
		rest, e1 := u.n.readStored(ctx, u.h, stopped, stopped)
		if e1 == 0 && !allZero(rest[min(torn, uint64(len(rest))):]) {
			e1 = syscall.EIO
		}
		if e1 == 0 {
			e1 = u.zero(ctx, stopped, torn)
		}
		e = cmp.Or(e, e1)
	}
	e = cmp.Or(e, u.n.setLowerSize(ctx, u.h, fs.lowerSize(size)))
	if e != 0 {
		fs.log.Error("wrap: a failed write could not be undone; a block may not decode", "token", u.n.Token(), "block", stopped, "err", e)
	}
}

// putBack stores o as it was, over written bytes of other content at its
// start: a hole gets zeros back where it got data, a block its plaintext,
// encoded again.
func (u *update) putBack(ctx context.Context, o oldBlock, written uint64) layer.Errno {
	if !o.hole {
		_, e := u.write(ctx, o.b, o.plain)
		return e
	}
	return u.zero(ctx, o.b, min(written, uint64(len(o.plain))+u.n.fs.ov))
}

// zero writes k zeros at the start of block b.
func (u *update) zero(ctx context.Context, b, k uint64) layer.Errno {
	fs := u.n.fs
	_, e := writeFull(ctx, u.h, make([]byte, k), fs.hs+b*(fs.bs+fs.ov))
	return e
}

// pad returns p cut or extended with zeros to n bytes.
func pad(p []byte, n uint64) []byte {
	if uint64(len(p)) >= n {
		return p[:n]
	}
	return append(p[:len(p):len(p)], make([]byte, n-uint64(len(p)))...)
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
	if f.wronly {
		return 0, syscall.EBADF
	}
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
	return n.writeAt(ctx, f.lower, data, uint64(off))
}

// writeAt writes data at off, reading first what partial blocks keep;
// the data lock is held. If the lower file system takes only part of it,
// the whole blocks it took are kept, and the count says how much of data
// they hold: a short write, after which the caller's next write gets the
// errno (as the kernel reports a short pwrite). With none of data stored,
// the file is as it was, and the errno is the lower file system's.
func (n *node) writeAt(ctx context.Context, h layer.Handle, data []byte, off uint64) (written int, errno layer.Errno) {
	fs := n.fs
	end := off + uint64(len(data))
	if fs.tooBig(end) {
		return 0, syscall.EFBIG
	}
	ll, e := n.lowerLen(ctx, h)
	if e != 0 {
		return 0, e
	}
	size := fs.plainSize(ll)
	if fs.fill && off > size {
		if e := n.fill(ctx, h, size, off); e != 0 {
			return 0, e
		}
		// A write that stores none of its data fails whole: the gap just
		// filled goes too, or a failed write (ENOSPC for its own blocks)
		// would leave the file grown to off, which natively it never is.
		defer func(from uint64) {
			if written == 0 && errno != 0 {
				n.resizeLocked(ctx, h, from, false)
			}
		}(size)
		if ll, e = n.lowerLen(ctx, h); e != 0 {
			return 0, e
		}
		size = fs.plainSize(ll)
	}
	hdr, e := n.header(ctx, h, ll, true)
	if e != 0 {
		return 0, e
	}
	u := &update{n: n, h: h, hdr: hdr}
	first, last := off/fs.bs, (end-1)/fs.bs
	// Read what the write keeps of its first and last blocks, and the old
	// last block if it is short and the write reaches it or must make it
	// whole (only a file's last block may be short): a failed write puts
	// it back.
	oldLast := size / fs.bs
	for _, b := range []uint64{first, last, oldLast} {
		keeps := b == first && off > b*fs.bs || b == last && end < min(size, (b+1)*fs.bs) ||
			b == oldLast && size%fs.bs != 0 && b <= last
		if keeps && b*fs.bs < size {
			if _, e := u.read(ctx, b); e != 0 {
				return 0, e
			}
		}
	}
	if o, ok := u.kept(oldLast); ok && oldLast < first {
		if k, e := u.write(ctx, oldLast, pad(o.plain, fs.bs)); e != 0 {
			u.undo(ctx, oldLast, k, size)
			return 0, e
		}
	}
	span := make([]byte, min(max(size, end), (last+1)*fs.bs)-first*fs.bs)
	for _, o := range u.old {
		if o.b >= first {
			copy(span[(o.b-first)*fs.bs:], o.plain)
		}
	}
	copy(span[off-first*fs.bs:], data)
	k, e := u.write(ctx, first, span)
	if e == 0 {
		return len(data), 0
	}
	// The blocks stored whole hold data up to ackEnd.
	ackEnd := min(end, (first+k/(fs.bs+fs.ov))*fs.bs)
	if ackEnd <= off {
		u.undo(ctx, first, k, size)
		return 0, e
	}
	u.undo(ctx, first, k, max(size, ackEnd))
	return int(ackEnd - off), 0
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
	fs := n.fs
	if fs.tooBig(size) {
		return syscall.EFBIG
	}
	lh := lowerHandle(h)
	if lh == nil {
		var e layer.Errno
		if lh, e = n.openLower(ctx, syscall.O_WRONLY); e != 0 {
			return e
		}
		defer lh.Release(ctx)
	}
	ctx, unlock := n.lockData(ctx, true)
	defer unlock()
	return n.resizeLocked(ctx, lh, size, growOnly)
}

// resizeLocked is resize through lower handle lh, with the data lock held.
func (n *node) resizeLocked(ctx context.Context, lh layer.Handle, size uint64, growOnly bool) layer.Errno {
	fs := n.fs
	ll, e := n.lowerLen(ctx, lh)
	if e != 0 {
		return e
	}
	old := fs.plainSize(ll)
	if growOnly && size <= old {
		return 0
	}
	if fs.fill && size > old {
		return n.fill(ctx, lh, old, size)
	}
	hdr, e := n.header(ctx, lh, ll, size > 0)
	if e != 0 {
		return e
	}
	u := &update{n: n, h: lh, hdr: hdr}
	// Only a file's last block may be short: growing makes the old last
	// block whole (or as long as the new size reaches), shrinking cuts the
	// new last block. The block first, then the size: grown so, the file
	// reads whole at every step, at a size between the old and the new
	// (with the size first, the old short block would read padded with
	// zeros, which does not decode). A block cut short cannot: until the
	// size follows, it does not decode in either order; rewriting it
	// first keeps a failed write undoable before anything is cut.
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
		p, e := u.read(ctx, b)
		if e != 0 {
			return e
		}
		blk = pad(p, keep)
	}
	if blk != nil {
		if k, e := u.write(ctx, b, blk); e != 0 {
			u.undo(ctx, b, k, old)
			return e
		}
	}
	e = n.setLowerSize(ctx, lh, fs.lowerSize(size))
	if e != 0 && size > old {
		// Refused (EFBIG): the old last block goes back, and a header
		// just made.
		u.undo(ctx, b+1, 0, old)
	}
	return e
}

// fill grows the file from size from to size to with zeros written as
// blocks, for FillHoles; the data lock is held. If the lower file system
// stops it (ENOSPC), the file is cut back to from, whole.
func (n *node) fill(ctx context.Context, h layer.Handle, from, to uint64) layer.Errno {
	// A bounded chunk: a large extension is not one large buffer.
	chunk := uint64(len(zeros)) * 32
	zero := make([]byte, chunk)
	for pos := from; pos < to; {
		k, e := n.writeAt(ctx, h, zero[:min(chunk, to-pos)], pos)
		if e != 0 {
			n.resizeLocked(ctx, h, from, false)
			return e
		}
		pos += uint64(k)
	}
	return 0
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
	if fs.tooBig(end) {
		return syscall.EFBIG
	}
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
