package remote

import (
	"context"

	"github.com/shalefs/shale/layer"
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
}

func (d *dir) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if len(d.buf) == 0 && !d.eof {
		c, fid, iounit, e := d.h.use(ctx)
		if e != 0 {
			return layer.DirEntry{}, false, e
		}
		var b enc
		b.u32(fid)
		b.u64(d.off)
		b.u32(uint32(c.ioSize(iounit)))
		r, err := c.rpc(tReaddir, b.b)
		if err != nil {
			return layer.DirEntry{}, false, errno(err)
		}
		n := r.u32()
		data := r.take(int(n))
		if r.err != nil {
			c.fail(errProto)
			return layer.DirEntry{}, false, errno(errLost)
		}
		ents := &dec{b: data}
		for len(ents.b) > 0 {
			q := ents.qid()
			off := ents.u64()
			typ := ents.u8()
			name := ents.str()
			if ents.err != nil {
				c.fail(errProto)
				return layer.DirEntry{}, false, errno(errLost)
			}
			d.buf = append(d.buf, layer.DirEntry{Name: name, Ino: q.path, Type: uint32(typ) << 12, Off: off})
		}
		d.eof = len(d.buf) == 0
	}
	if len(d.buf) == 0 {
		return layer.DirEntry{}, false, 0
	}
	e := d.buf[0]
	d.buf = d.buf[1:]
	d.off = e.Off
	return e, true, 0
}

func (d *dir) Seek(ctx context.Context, off uint64) layer.Errno {
	d.off, d.buf, d.eof = off, nil, false
	return 0
}

func (d *dir) Fsync(ctx context.Context, datasync bool) layer.Errno {
	return d.h.Fsync(ctx, datasync)
}

func (d *dir) Close() { d.h.Release(context.Background()) }
