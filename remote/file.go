package remote

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/cache"
	"github.com/shalefs/shale/remote/session"
	"github.com/shalefs/shale/remote/writeback"
)

// handle is an open remote file (or directory, for dir): a fid of its
// own, opened with Tlopen, opened again on a new connection on first use.
type handle struct {
	n     *node
	fs    *FS
	uid   uint32 // the opener's, for what the cache grants
	who   uint32 // the opener's credentials (session.Who): it acts with them
	flags uint32 // open(2) flags to open again with: no O_TRUNC, O_CREAT, O_EXCL

	reopen    sync.Mutex // one reopen at a time (use)
	mu        sync.Mutex // the fields below; never across a request
	c         *session.Conn
	fid       uint32
	iounit    uint32
	released  bool
	owners    map[lockOwner]bool // lock owners that took locks through it
	locksLost bool               // it held locks on a connection that was lost
}

type lockOwner struct {
	owner uint64
	flock bool
}

var _ layer.Handle = (*handle)(nil)

// use returns the live connection and the handle's fid on it, opening the
// file again if the connection is new since. The open is a request: made
// under reopen, which only the handle's own requests wait for, not under
// mu, which a write-back of the file takes (FidOn) while it holds the
// file's write-back lock, which the open's answer takes in turn.
func (h *handle) use(ctx context.Context) (*session.Conn, uint32, uint32, layer.Errno) {
	return h.useRiding(ctx, nil)
}

// useRiding is use, sending ride with the open if it opens the file (in
// its round trip, where the server keeps the order of a fid's requests).
func (h *handle) useRiding(ctx context.Context, ride *session.Ride) (*session.Conn, uint32, uint32, layer.Errno) {
	c, e := h.fs.ss.Conn(ctx)
	if e != 0 {
		return nil, 0, 0, e
	}
	if fid, iounit, e, ok := h.current(c); ok {
		return c, fid, iounit, e
	}
	h.reopen.Lock()
	defer h.reopen.Unlock()
	if fid, iounit, e, ok := h.current(c); ok {
		return c, fid, iounit, e // another request opened it meanwhile
	}
	since := h.fs.wb.Uncaches(h.n.tok)
	fid, iounit, q, e := h.n.openFid(c, h.who, h.flags, ride)
	if e != 0 {
		return nil, 0, 0, e
	}
	if h.flags&unix.O_DIRECTORY == 0 {
		h.fs.wb.Reopened(h.n.tok, q.Vers, since)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		go c.Clunk(fid)
		return nil, 0, 0, syscall.EBADF
	}
	if len(h.owners) > 0 {
		// The server dropped its locks with the connection; whoever
		// thought it held them learns at its next lock call.
		h.locksLost = true
		for o := range h.takeOwnersLocked() {
			if o.flock {
				h.fs.procUnref(o.owner) // the handle's flock hold
			}
		}
	}
	h.c, h.fid, h.iounit = c, fid, iounit
	return c, fid, iounit, 0
}

// everOpened tells whether the handle was opened on a server: not one a
// delegation answered, until a read or lock needs it there.
func (h *handle) everOpened() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.c != nil
}

// current is the handle's fid if it is open on c (or EBADF if it was
// released); ok is false if it must be opened again.
func (h *handle) current(c *session.Conn) (fid, iounit uint32, e layer.Errno, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.released:
		return 0, 0, syscall.EBADF, true
	case h.c == c:
		return h.fid, h.iounit, 0, true
	}
	return 0, 0, 0, false
}

// Read serves the file's delayed writes over what the cache has; on a
// miss it reads the blocks that cover the request from the server, and
// caches them.
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (int, layer.Errno) {
	if off < 0 {
		return 0, syscall.EINVAL
	}
	k, ok, e := h.fs.wb.Read(h.n.tok, dest, off, h.flags&unix.O_NOATIME != 0, func(dest []byte, off int64) (int, layer.Errno) {
		return h.readClean(ctx, dest, off)
	})
	if !ok {
		k, e = h.readClean(ctx, dest, off)
	}
	h.fs.ctr.readBytes.Add(uint64(k))
	return k, e
}

// readClean reads what the server has, through the cache.
func (h *handle) readClean(ctx context.Context, dest []byte, off int64) (int, layer.Errno) {
	fs := h.fs
	path := h.n.tok.Ino
	touch := fs.cc.Touches(path)
	uncached := fs.wb.Uncached(h.n.tok)
	if !touch && !uncached {
		if k, ok := fs.cc.Read(path, h.n.tok.Gen, dest, off); ok {
			fs.hit(kindData)
			fs.ctr.bytesFromCache.Add(uint64(k))
			return k, 0
		}
	}
	fs.miss(kindData)
	since := fs.cc.Snap()
	c, fid, iounit, e := h.use(ctx)
	if e != 0 {
		// A handle opened from the cache (no Tlopen held the file on the
		// server) of a file removed there since cannot be opened again
		// (ESTALE, ENOENT); an open file stays readable, so what the
		// cache holds of it is served, the atime the read would have
		// moved left alone (the file has no name left to stat it by).
		if touch && (e == syscall.ESTALE || e == syscall.ENOENT) {
			if k, ok := fs.cc.Read(path, h.n.tok.Gen, dest, off); ok {
				fs.ctr.bytesFromCache.Add(uint64(k))
				return k, 0
			}
		}
		return 0, e
	}
	if touch {
		// The server's read moved the atime; or, opened with
		// O_NOATIME (which the server may have refused: openFid),
		// may have.
		defer func() {
			var at time.Time
			if h.flags&unix.O_NOATIME == 0 {
				at = time.Now()
			}
			fs.cc.AtimeMoved(path, at)
		}()
	}
	if !fs.cc.On.Load() || uncached {
		k, err := c.ReadAt(fid, iounit, dest, off)
		fs.ctr.bytesFromServer.Add(uint64(k))
		if err != nil && k == 0 {
			return 0, session.Errno(err)
		}
		return k, 0
	}
	start := off / cache.BlockSize * cache.BlockSize
	end := (off + int64(len(dest)) + cache.BlockSize - 1) / cache.BlockSize * cache.BlockSize
	buf := make([]byte, end-start)
	k, err := c.ReadAt(fid, iounit, buf, start)
	if err != nil && k == 0 {
		return 0, session.Errno(err)
	}
	fs.ctr.bytesFromServer.Add(uint64(k))
	if err == nil {
		fs.cc.PutData(since, path, h.n.tok.Gen, start, buf[:k], k < len(buf))
	}
	if int64(k) <= off-start {
		return 0, 0
	}
	return copy(dest, buf[off-start:k]), 0
}

// Write delays the data (Sprite's rules, remote/writeback), or writes it
// through.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	h.fs.ctr.writeBytes.Add(uint64(len(data)))
	if h.fs.wb.Delaying() {
		if delayed, e := h.fs.wb.Write(ctx, h.n.tok, h.n, h.who, data, off, h.size); delayed {
			if e != 0 {
				return 0, e
			}
			h.fs.raiseRange(ctx, layer.Data, h.n.tok, "", off, int64(len(data)))
			return len(data), 0
		}
	}
	c, fid, iounit, e := h.use(ctx)
	if e != 0 {
		return 0, e
	}
	k, err := c.WriteAt(fid, iounit, data, off)
	h.fs.wb.Ctr.WriteServerBytes.Add(uint64(k))
	if k > 0 || err != nil {
		// What the write changed, wherever it got: an append's offset is
		// the server's, so all of the file then.
		if h.flags&unix.O_APPEND != 0 || err != nil {
			h.fs.cc.DropData(h.n.tok.Ino, 0, 0)
		} else {
			h.fs.cc.DropData(h.n.tok.Ino, uint64(off), uint64(k))
		}
	}
	if k > 0 {
		h.fs.raiseRange(ctx, layer.Data, h.n.tok, "", off, int64(k))
	}
	if err != nil && k == 0 {
		return 0, session.Errno(err)
	}
	return k, 0
}

// posixLock is a lock owner holding POSIX locks on a file.
type posixLock struct {
	file  layer.Token
	owner uint64
}

// holdPosix records that owner holds POSIX locks on h's file: the file
// keeps the owner's proc_id (the caller has it kept already).
func (h *handle) holdPosix(owner uint64) {
	k := posixLock{h.n.tok, owner}
	h.fs.procMu.Lock()
	defer h.fs.procMu.Unlock()
	if !h.fs.posix[k] {
		if p := h.fs.procs[owner]; p != nil {
			h.fs.posix[k] = true
			p.refs++
		}
	}
}

// takePosix records that owner holds no POSIX locks on h's file any more.
// If it held some, it returns true and the owner's proc_id, kept until the
// caller's procUnref: the unlock to send needs it.
func (h *handle) takePosix(owner uint64) (uint32, bool) {
	k := posixLock{h.n.tok, owner}
	h.fs.procMu.Lock()
	defer h.fs.procMu.Unlock()
	if !h.fs.posix[k] {
		return 0, false
	}
	delete(h.fs.posix, k)
	p := h.fs.procs[owner]
	if p == nil {
		return 0, false
	}
	return p.id, true // the file's hold is now the caller's
}

// Flush: the closing owner loses its POSIX locks on the file, taken
// through whichever descriptor; the server's lock owner is the same on
// every fid of the connection.
func (h *handle) Flush(ctx context.Context, owner uint64) layer.Errno {
	h.flushKept(owner)
	proc, held := h.takePosix(owner)
	h.mu.Lock()
	h.delOwnerLocked(lockOwner{owner, false})
	h.mu.Unlock()
	if held {
		if c, fid, _, e := h.use(ctx); e == 0 {
			c.Lock(fid, p9wire.LockUnlock, 0, 0, proc, h.fs.clientID)
		}
		h.fs.procUnref(owner)
	}
	// Another client's stat after this close shows its delayed writes.
	h.fs.wb.Closing(h.n.tok, h.flags&unix.O_ACCMODE != unix.O_RDONLY)
	// Delayed writes that could not be written back fail the close.
	return h.fs.wb.TakeErr(h.n.tok)
}

// Fsync writes the delayed data back, then has the server sync it.
func (h *handle) Fsync(ctx context.Context, datasync bool) layer.Errno {
	e := h.fs.wb.WriteBack(ctx, h.n.tok, writeback.Fsync)
	if lost := h.fs.wb.TakeErr(h.n.tok); e == 0 {
		e = lost
	}
	if e != 0 {
		return e
	}
	// A connection lost under the Tfsync is waited for, and the Tfsync
	// sent again on the next (the bytes were written to the server, which
	// a killed server's machine still has), within the timeout.
	// So is one lost under the reopen of the handle that a new
	// connection needs first (its EIO).
	deadline := time.Now().Add(h.fs.timeout)
	for {
		c, fid, _, e := h.use(ctx)
		if e == syscall.EIO && time.Now().Before(deadline) && ctx.Err() == nil && !h.fs.ss.Closed() {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if e != 0 {
			return e
		}
		err := c.Do(&p9wire.Fsync{Fid: fid, Datasync: datasync})
		if !errors.Is(err, session.ErrLost) || time.Now().After(deadline) {
			return session.Errno(err)
		}
	}
}

// Release clunks the fid; flock locks taken through the handle go with
// the open file, as the kernel sends no unlock for them.
func (h *handle) Release(ctx context.Context) layer.Errno {
	h.releaseKept()
	h.mu.Lock()
	c, fid, owners := h.c, h.fid, h.takeOwnersLocked()
	h.released = true
	h.mu.Unlock()
	h.fs.wb.Released(h.n.tok, h)
	live := c != nil && c.Alive()
	for o := range owners {
		if live {
			if o.flock {
				c.Lock(fid, p9wire.LockUnlock, 0, 0, h.fs.procRef(o.owner), h.fs.clientID)
				h.fs.procUnref(o.owner)
			} else if proc, held := h.takePosix(o.owner); held {
				c.Lock(fid, p9wire.LockUnlock, 0, 0, proc, h.fs.clientID)
				h.fs.procUnref(o.owner)
			}
		}
		if o.flock {
			h.fs.procUnref(o.owner) // the handle's flock hold
		}
	}
	if !live {
		return 0 // the fid went with its connection
	}
	if err := c.Clunk(fid); err != nil && !errors.Is(err, session.ErrLost) {
		return session.Errno(err)
	}
	return 0
}

// Allocate: 9P2000.L has no fallocate.
func (h *handle) Allocate(ctx context.Context, off, size int64, mode uint32) layer.Errno {
	return syscall.EOPNOTSUPP
}

// Lseek: 9P has no SEEK_DATA or SEEK_HOLE, so the file is taken to be all
// data: SEEK_DATA finds off itself, SEEK_HOLE the end of the file, and
// both fail with ENXIO at or past the end.
func (h *handle) Lseek(ctx context.Context, off int64, whence int) (int64, layer.Errno) {
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return 0, syscall.EINVAL
	}
	c, fid, _, e := h.use(ctx)
	if e != 0 {
		return 0, e
	}
	var a layer.Attr
	if _, err := h.fs.attrOf(c, fid, h.n.tok.Ino, &a); err != nil {
		return 0, session.Errno(err)
	}
	size := int64(a.Size)
	switch {
	case off < 0 || off >= size:
		return 0, syscall.ENXIO
	case whence == unix.SEEK_DATA:
		return off, 0
	default:
		return size, 0
	}
}

// CopyFileRange: 9P2000.L has no server-side copy; the kernel falls back
// to reading and writing.
func (h *handle) CopyFileRange(ctx context.Context, off int64, dst layer.Handle, dstOff int64, n int, flags uint32) (int, layer.Errno) {
	return 0, syscall.EOPNOTSUPP
}
