package remote

import (
	"context"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
)

// dir lists a remote directory with Treaddir. Offsets are the server's
// cookies (for diod and shale serve, the host file system's d_off), so
// Seek is exact and survives a reconnect, when the directory is opened
// again on the new connection.
type dir struct {
	h   *handle
	off uint64           // where the next Treaddir starts
	buf []layer.DirEntry // entries read and not yet returned
	eof bool

	// A listing read whole from the start, without a Seek, is cached if
	// nothing changed the directory since snapshot since.
	since uint64
	keep  bool
	all   []layer.DirEntry
	touch bool // the first Treaddir moves the directory's atime
	quiet bool // a refresh's (refresh.go): no lookups ahead
	// timesMoved: it did, at movedAt, and the cached atime is not moved yet.
	timesMoved bool
	movedAt    time.Time
	ahead      *ahead // the names read, for lookups ahead (ahead.go)
	// first is the reply to a Treaddir of count firstCount at offset 0,
	// sent with the open, until the stream reads it or seeks elsewhere.
	first      *p9wire.DataReply
	firstCount int
}

func (d *dir) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if len(d.buf) == 0 && !d.eof {
		r := p9wire.DataReply{T: p9wire.Treaddir}
		var c *session.Conn
		var count int
		if d.first != nil && d.off == 0 {
			d.h.mu.Lock()
			r, count, c = *d.first, d.firstCount, d.h.c
			d.h.mu.Unlock()
		} else {
			var e layer.Errno
			if c, count, e = d.h.readdir(ctx, d.off, 0, &r); e != 0 {
				return layer.DirEntry{}, false, e
			}
		}
		d.first = nil
		if d.touch {
			// The Treaddir moved the atime: the cached one moves too,
			// once the listing is kept (the tick before would refuse it).
			d.touch, d.timesMoved, d.movedAt = false, true, time.Now()
		}
		ents := &p9wire.Dec{B: r.Data}
		for len(ents.B) > 0 {
			q := ents.Qid()
			off := ents.U64()
			typ := ents.U8()
			name := ents.Str()
			if ents.Err != nil {
				c.Fail(p9wire.ErrProto)
				return layer.DirEntry{}, false, session.Errno(session.ErrLost)
			}
			d.buf = append(d.buf, layer.DirEntry{Name: name, Ino: q.Path, Type: uint32(typ) << 12, Off: off})
		}
		// A server that fills its replies ended the listing with one
		// that has room left for another entry: no Treaddir for nothing.
		d.eof = len(d.buf) == 0 || c.Caps()&journal.FillsReaddir != 0 && len(r.Data)+journal.MaxDirent <= count
		if len(d.buf) > 0 && d.h.fs.cc.On.Load() && !d.quiet {
			if d.ahead == nil {
				d.ahead = &ahead{n: d.h.n}
				d.h.n.listing.Store(d.ahead)
			}
			d.ahead.listed(d.buf)
		}
		if d.keep {
			d.all = append(d.all, d.buf...)
			if d.eof {
				d.keep = false
				d.h.fs.cc.PutListing(d.since, d.h.n.tok.Ino, d.h.uid, d.all)
				d.all = nil
			}
		}
		if !d.keep {
			d.moveAtime()
		}
	}
	if len(d.buf) == 0 {
		return layer.DirEntry{}, false, 0
	}
	e := d.buf[0]
	d.buf = d.buf[1:]
	d.off = e.Off
	if d.ahead != nil {
		d.ahead.returned(e.Name)
	}
	return e, true, 0
}

// readdir reads h's entries at off into r with a Treaddir of count, or
// as many as a reply holds if count is 0, which it returns. A handle
// opened lazily opens here, the Treaddir in the open's round trip.
func (h *handle) readdir(ctx context.Context, off uint64, count int, r *p9wire.DataReply) (*session.Conn, int, layer.Errno) {
	want := count
	req := func(c *session.Conn, fid, iounit uint32) (p9wire.Message, p9wire.Message) {
		if count = want; count == 0 {
			count = c.IOSize(iounit)
		}
		return &p9wire.Read{T: p9wire.Treaddir, Fid: fid, Offset: off, Count: uint32(count)}, r
	}
	ride := &session.Ride{Make: func(c *session.Conn, fid uint32) (p9wire.Message, p9wire.Message) {
		return req(c, fid, 0) // the open's iounit is not known yet
	}}
	c, fid, iounit, e := h.useRiding(ctx, ride)
	if e != 0 {
		return nil, 0, e
	}
	err := ride.Err
	if !ride.Sent {
		err = c.RPC(req(c, fid, iounit))
	}
	return c, count, session.Errno(err)
}

// endAhead stops the lookups ahead of the stream's names.
func (d *dir) endAhead() {
	if d.ahead != nil {
		d.ahead.end()
		d.ahead = nil
	}
}

func (d *dir) Seek(ctx context.Context, off uint64) layer.Errno {
	if off != 0 {
		d.first = nil
	}
	d.endAhead()
	d.off, d.buf, d.eof = off, nil, false
	d.keep, d.all = false, nil
	d.moveAtime()
	return 0
}

// moveAtime moves the directory's cached atime if a Treaddir moved it.
func (d *dir) moveAtime() {
	if d.timesMoved {
		d.timesMoved = false
		d.h.fs.cc.AtimeMoved(d.h.n.tok.Ino, d.movedAt)
	}
}

// cachedDir lists a directory from the cache: the server's entries and
// offsets as a dir read them, so that Seek means the same.
type cachedDir struct {
	ents  []layer.DirEntry
	since uint64 // taken before ents
	i     int
	h     *handle // not opened on the server until an Fsync, or touch
	// touch: the listing moves the directory's atime (relatime), which
	// only the server can do: the first Next reads one entry there (the
	// host's getdents moves the atime whatever the count).
	touch bool
	// srv lists from the server instead: the directory changed between
	// the open and the start of the listing.
	srv *dir
}

func (d *cachedDir) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if d.srv != nil {
		return d.srv.Next(ctx)
	}
	if d.i == 0 && d.h.fs.cc.Changed(d.h.n.tok.Ino, d.since) || d.touch && d.moveAtime(ctx) != 0 {
		// A change reached us after the kernel's OPENDIR, before its
		// READDIR. The kernel, told of it, has fetched the new mtime, and
		// would keep the listing taken at open as the one of that mtime,
		// until the next change. (Or the Treaddir that moves the atime
		// failed: the server's listing says why.)
		d.srv = &dir{h: d.h, since: d.h.fs.cc.Snap(), keep: true, touch: true}
		return d.srv.Next(ctx)
	}
	if d.i >= len(d.ents) {
		return layer.DirEntry{}, false, 0
	}
	d.i++
	return d.ents[d.i-1], true, 0
}

// moveAtime moves the directory's atime on the server with one
// Treaddir, and the cached atime with it; the cached listing, kept
// current by the journal, stands for the rest (the server's whole
// listing would be two Treaddirs, and as many entries again).
func (d *cachedDir) moveAtime(ctx context.Context) layer.Errno {
	d.touch = false
	if _, _, e := d.h.readdir(ctx, 0, journal.MaxDirent, &p9wire.DataReply{T: p9wire.Treaddir}); e != 0 {
		return e
	}
	d.h.fs.cc.AtimeMoved(d.h.n.tok.Ino, time.Now())
	return 0
}

// Seek finds the entry whose offset is off; one the listing does not
// have (it came from another stream) ends the listing.
func (d *cachedDir) Seek(ctx context.Context, off uint64) layer.Errno {
	if d.srv != nil {
		return d.srv.Seek(ctx, off)
	}
	d.i = 0
	if off == 0 {
		return 0
	}
	for i, e := range d.ents {
		if e.Off == off {
			d.i = i + 1
			return 0
		}
	}
	d.i = len(d.ents)
	return 0
}

// Fsync opens the directory on the server, to sync it there.
func (d *cachedDir) Fsync(ctx context.Context, datasync bool) layer.Errno {
	return d.h.Fsync(ctx, datasync)
}

func (d *cachedDir) Close() {
	if d.srv != nil {
		d.srv.Close()
		return
	}
	if d.touch {
		d.h.fs.ctr.dirOpensUnsent.Add(1) // it would have moved the atime, but read nothing
	}
	d.h.Release(context.Background())
}

func (d *dir) Fsync(ctx context.Context, datasync bool) layer.Errno {
	return d.h.Fsync(ctx, datasync)
}

func (d *dir) Close() {
	if !d.h.everOpened() {
		d.h.fs.ctr.dirOpensUnsent.Add(1) // opened lazily, and never read (OpenDir)
	}
	d.moveAtime()
	d.endAhead()
	d.h.Release(context.Background())
}
