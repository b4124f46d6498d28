package remote

import (
	"context"
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
	"github.com/shalefs/shale/remote/writeback"
)

// Sprite's rules (remote/writeback) compose here with nodes and handles:
// a node is the File delayed writes go back through, a handle open for
// writing a Writer whose fid they may use.

var (
	_ writeback.File   = (*node)(nil)
	_ writeback.Writer = (*handle)(nil)
)

// OpenWriteBack opens a new fid of n for the credentials who (the
// writeback package's uid) with journal.WriteBack.
// refused is the server's ESTALE to the open itself (not to the walk: a
// file removed): another client wrote the file since this one did.
func (n *node) SetTimes(c *session.Conn, who uint32, atime, mtime time.Time) error {
	fid, done, e := n.fidOn(c, who)
	defer done()
	if e != 0 {
		return e
	}
	req := p9wire.Setattr{Fid: fid, Valid: p9wire.SetattrMtime | p9wire.SetattrMtimeSet,
		Mtime: uint64(mtime.Unix()), MtimeNsec: uint64(mtime.Nanosecond())}
	if !atime.IsZero() {
		req.Valid |= p9wire.SetattrAtime | p9wire.SetattrAtimeSet
		req.Atime, req.AtimeNsec = uint64(atime.Unix()), uint64(atime.Nanosecond())
	}
	return c.Do(&req)
}

func (n *node) OpenWriteBack(c *session.Conn, who uint32) (fid, iounit uint32, refused bool, e layer.Errno) {
	walked := !n.isRoot && !n.hasFid(c, who)
	if fid, e = n.newFid(c, who); e != 0 {
		return 0, 0, false, e
	}
	if walked {
		// Walked by name: the QID path matched, but a new file may have
		// its number (and the name): the generation tells.
		ra, err := c.Getattr(fid)
		if err == nil && session.Token(&ra) != n.tok {
			err = syscall.ESTALE
		}
		if err != nil {
			c.Clunk(fid)
			return 0, 0, false, session.Errno(err)
		}
	}
	_, iounit, err := c.Lopen(fid, openFlags(unix.O_WRONLY)|journal.WriteBack)
	if err != nil {
		c.Clunk(fid)
		e := session.Errno(err)
		return 0, 0, e == syscall.ESTALE, e
	}
	return fid, iounit, false, 0
}

// FidOn is the handle's fid, if it is open on c and writes where it is
// told (not O_APPEND: the server would put every extent at the end) and
// can write (not O_RDONLY, which O_TRUNC alone opens).
func (h *handle) FidOn(c *session.Conn) (fid, iounit uint32, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fid, h.iounit, h.c == c && !h.released && h.flags&unix.O_APPEND == 0 && h.flags&unix.O_ACCMODE != unix.O_RDONLY
}

// Hold opens the handle on the server if it is not open there: one a
// delegation opened without a request (writeback.Return).
func (h *handle) Hold(ctx context.Context) layer.Errno {
	_, _, _, e := h.use(ctx)
	return e
}

// WriteShared: the server found the file open for writing on another
// client too (layer.WriteShared): what it caches of it is not kept.
func (h *handle) WriteShared() bool { return h.fs.wb.Uncached(h.n.tok) }

// size is the file's size on the server, from the cache if it has it.
func (h *handle) size(ctx context.Context) (int64, layer.Errno) {
	if a, gen, ok := h.fs.cc.Attr(h.n.tok.Ino); ok && gen == h.n.tok.Gen {
		return int64(a.Size), 0
	}
	var size int64
	var e layer.Errno
	h.fs.ss.UntilNotLost(ctx, func() bool {
		var c *session.Conn
		var fid uint32
		if c, fid, _, e = h.use(ctx); e != 0 {
			return false
		}
		ra, err := c.Getattr(fid)
		if err != nil {
			e = session.Errno(err)
			return errors.Is(err, session.ErrLost)
		}
		size = int64(ra.Attr.Size)
		return false
	})
	return size, e
}

// send writes a record to the journal of the current connection; lost
// with the connection (the server's wait then ends with its lease).
func (j *jreader) send(r journal.Record) {
	j.mu.Lock()
	c, fid := j.cur, j.fid
	j.mu.Unlock()
	if c == nil {
		return
	}
	c.WriteAt(fid, 0, journal.Append(nil, &r), 0)
}
