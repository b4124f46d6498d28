package volume

import (
	"context"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/lock"
)

// handle is an open file: its shared state and the lock owners that used
// it (locks are this client's: see docs/volume.md).
type handle struct {
	f     *fileState
	flags uint32

	locks lock.Open
	seq   seqReads // for read-ahead
}

func (n *node) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	if e := unchecked(ctx); e != 0 {
		return nil, e
	}
	return n.open(ctx, flags, nil)
}

// open opens the file, known as just made if known is not nil.
func (n *node) open(ctx context.Context, flags uint32, known *Inode) (layer.Handle, layer.Errno) {
	f, e := n.fs.acquire(ctx, n.ino, known)
	if e != 0 {
		return nil, e
	}
	h := &handle{f: f, flags: flags}
	if flags&unix.O_ACCMODE != unix.O_WRONLY && flags&unix.O_NOATIME == 0 {
		f.mu.Lock()
		base := f.base
		f.mu.Unlock()
		n.fs.accessed(n.ino, base)
	}
	if flags&unix.O_TRUNC != 0 && flags&unix.O_ACCMODE != unix.O_RDONLY {
		if e := f.truncate(ctx, 0); e != 0 {
			n.fs.release(f)
			return nil, e
		}
		if e := f.writeBack(ctx); e != 0 {
			n.fs.release(f)
			return nil, e
		}
		n.fs.raise(ctx, layer.Data, n.ino, "")
	}
	return h, 0
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (int, layer.Errno) {
	end := off + int64(len(dest))
	if h.seq.sequential(off, end, h.f.bs()) {
		h.f.readAhead(end) // first, to overlap this read's own fetch
	}
	return h.f.read(ctx, dest, off)
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	k, e := h.f.write(ctx, data, off)
	if e == 0 && h.f.fs.st.Events().Active() {
		h.f.fs.st.Events().RaiseIn(ctx, layer.Event{Kind: layer.Data, Token: token(h.f.ino), View: layer.ViewOf(ctx), Off: off, Len: int64(k)})
	}
	return k, e
}

// Flush writes back at every close: the next open, on any client, reads
// what was written (close-to-open).
func (h *handle) Flush(ctx context.Context, owner uint64) layer.Errno {
	h.locks.Flush(h.f.fs.st.Locks(), token(h.f.ino), owner)
	return h.f.writeBack(ctx)
}

func (h *handle) Fsync(ctx context.Context, datasync bool) layer.Errno { return h.f.writeBack(ctx) }

func (h *handle) Release(ctx context.Context) layer.Errno {
	h.locks.Release(h.f.fs.st.Locks(), token(h.f.ino))
	e := h.f.writeBack(ctx)
	h.f.fs.release(h.f)
	return e
}

// Allocate: blocks are objects made when written, so there is nothing to
// reserve; growing the size is all posix_fallocate needs. Punching and
// zeroing write holes and zeros.
func (h *handle) Allocate(ctx context.Context, off, size int64, mode uint32) layer.Errno {
	if off < 0 || size <= 0 {
		return syscall.EINVAL
	}
	keep := mode&unix.FALLOC_FL_KEEP_SIZE != 0
	switch mode &^ unix.FALLOC_FL_KEEP_SIZE {
	case 0:
	case unix.FALLOC_FL_PUNCH_HOLE:
		if !keep {
			return syscall.EOPNOTSUPP // as Linux: punching needs KEEP_SIZE
		}
		if e := h.f.zero(ctx, off, off+size); e != 0 {
			return e
		}
	case unix.FALLOC_FL_ZERO_RANGE:
		if e := h.f.zero(ctx, off, off+size); e != 0 {
			return e
		}
	default:
		return syscall.EOPNOTSUPP
	}
	h.f.mu.Lock()
	grow := !keep && uint64(off+size) > h.f.size
	h.f.mu.Unlock()
	if grow {
		return h.f.truncate(ctx, uint64(off+size))
	}
	return 0
}

// Lseek serves SEEK_DATA and SEEK_HOLE by blocks: a block is data if it
// has an object or bytes not written back, else a hole.
func (h *handle) Lseek(ctx context.Context, off int64, whence int) (int64, layer.Errno) {
	return h.f.seek(off, whence)
}

// CopyFileRange: not here; the kernel copies through reads and writes.
func (h *handle) CopyFileRange(ctx context.Context, off int64, dst layer.Handle, dstOff int64, n int, flags uint32) (int, layer.Errno) {
	return 0, syscall.ENOSYS
}

func (h *handle) Getlk(ctx context.Context, owner uint64, lk *layer.Lock) layer.Errno {
	h.f.fs.st.Locks().Get(token(h.f.ino), owner, lk)
	return 0
}

func (h *handle) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, wait bool) layer.Errno {
	return h.locks.Set(ctx, h.f.fs.st.Locks(), token(h.f.ino), owner, lk, wait)
}
