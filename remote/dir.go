package remote

import (
	"context"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
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
		var b p9wire.Enc
		b.U32(fid)
		b.U64(d.off)
		b.U32(uint32(c.ioSize(iounit)))
		r, err := c.rpc(p9wire.Treaddir, b.B)
		if err != nil {
			return layer.DirEntry{}, false, errno(err)
		}
		n := r.U32()
		data := r.Take(int(n))
		if r.Err != nil {
			c.fail(p9wire.ErrProto)
			return layer.DirEntry{}, false, errno(errLost)
		}
		ents := &p9wire.Dec{B: data}
		for len(ents.B) > 0 {
			q := ents.Qid()
			off := ents.U64()
			typ := ents.U8()
			name := ents.Str()
			if ents.Err != nil {
				c.fail(p9wire.ErrProto)
				return layer.DirEntry{}, false, errno(errLost)
			}
			d.buf = append(d.buf, layer.DirEntry{Name: name, Ino: q.Path, Type: uint32(typ) << 12, Off: off})
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
