package remote

import (
	"context"
	"time"

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
	// timesMoved: it did, at movedAt, and the cached atime is not moved yet.
	timesMoved bool
	movedAt    time.Time
	ahead      *ahead // the names read, for lookups ahead (ahead.go)
}

func (d *dir) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if len(d.buf) == 0 && !d.eof {
		c, fid, iounit, e := d.h.use(ctx)
		if e != 0 {
			return layer.DirEntry{}, false, e
		}
		r := p9wire.DataReply{T: p9wire.Treaddir}
		err := c.RPC(&p9wire.Read{T: p9wire.Treaddir, Fid: fid, Offset: d.off, Count: uint32(c.IOSize(iounit))}, &r)
		if err != nil {
			return layer.DirEntry{}, false, session.Errno(err)
		}
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
		d.eof = len(d.buf) == 0
		if !d.eof && d.h.fs.cc.On.Load() {
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

// endAhead stops the lookups ahead of the stream's names.
func (d *dir) endAhead() {
	if d.ahead != nil {
		d.ahead.end()
		d.ahead = nil
	}
}

func (d *dir) Seek(ctx context.Context, off uint64) layer.Errno {
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
	h     *handle // not opened on the server until an Fsync
	// srv lists from the server instead: the directory changed between
	// the open and the start of the listing.
	srv *dir
}

func (d *cachedDir) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if d.srv != nil {
		return d.srv.Next(ctx)
	}
	if d.i == 0 && d.h.fs.cc.Changed(d.h.n.tok.Ino, d.since) {
		// A change reached us after the kernel's OPENDIR, before its
		// READDIR. The kernel, told of it, has fetched the new mtime, and
		// would keep the listing taken at open as the one of that mtime,
		// until the next change.
		d.srv = &dir{h: d.h, since: d.h.fs.cc.Snap(), keep: true, touch: true}
		return d.srv.Next(ctx)
	}
	if d.i >= len(d.ents) {
		return layer.DirEntry{}, false, 0
	}
	d.i++
	return d.ents[d.i-1], true, 0
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
