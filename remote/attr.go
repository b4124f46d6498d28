package remote

import (
	"context"
	"errors"
	"time"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
)

func (n *node) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	cc := n.fs.cc
	for try := 0; ; try++ {
		wb := n.fs.wb.Gen(n.tok.Ino)
		since := cc.Snap()
		if a, gen, ok := cc.Attr(n.tok.Ino); ok && gen == n.tok.Gen {
			n.fs.hit(kindStat)
			*out = a
		} else if e := n.getattr(ctx, h, out, since); e != 0 {
			return e
		}
		// An answer that crossed a change (a record, a write-back of
		// ours) is asked again: a kernel keeps what it is given for
		// long, and the change's invalidation went before it.
		if n.fs.wb.OverlayAttrSince(n.tok, out, wb) && (try == 2 || !cc.Changed(n.tok.Ino, since)) {
			return 0
		}
	}
}

// getattr asks the server, and caches the answer unless a change since
// crossed it.
func (n *node) getattr(ctx context.Context, h layer.Handle, out *layer.Attr, since uint64) layer.Errno {
	n.fs.miss(kindStat)
	return n.fetchAttr(ctx, h, out, since)
}

// fetchAttr is getattr's request, for getattr and refreshes.
func (n *node) fetchAttr(ctx context.Context, h layer.Handle, out *layer.Attr, since uint64) layer.Errno {
	cc := n.fs.cc
	c, fid, done, e := n.fidFor(ctx, h)
	defer done()
	if e != 0 {
		return e
	}
	ra, err := c.Getattr(fid)
	if err != nil {
		return session.Errno(err)
	}
	if tok := session.Token(&ra); tok == n.tok {
		cc.PutAttr(since, tok.Ino, tok.Gen, &ra.Attr)
	}
	*out = ra.Attr
	return 0
}

// attrOf asks the server for the attributes of fid, a file numbered
// path: ra as the server gave them, out with what this client knows
// better (the size and times of its delayed writes). Asked again if a
// write-back crossed the request: out would show neither the data it
// took nor the server's size after it.
func (fs *FS) attrOf(c *session.Conn, fid uint32, path uint64, out *layer.Attr) (p9wire.Rattr, error) {
	for {
		wb := fs.wb.Gen(path)
		ra, err := c.Getattr(fid)
		if err != nil {
			return ra, err
		}
		*out = ra.Attr
		if fs.wb.OverlayAttrSince(session.Token(&ra), out, wb) {
			return ra, nil
		}
	}
}

// fidFor is the fid to act on the node with: h's, which reaches the file
// even after it was removed, or the node's.
func (n *node) fidFor(ctx context.Context, h layer.Handle) (*session.Conn, uint32, func(), layer.Errno) {
	if f, ok := h.(*handle); ok && f.n == n && f.everOpened() {
		c, fid, _, e := f.use(ctx)
		return c, fid, noop, e
	}
	// A handle a delegation opened without a request (the server never
	// saw it) asks through the node's fid: opening it for a stat would
	// cost a walk, a Tlopen and a clunk.
	c, fid, _, done, e := n.use(ctx)
	return c, fid, done, e
}

func (n *node) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	defer n.fs.wb.OverlayAttr(n.tok, out) // after finish
	if n.keepTimes(ctx, in, out) {
		return 0
	}
	finish, made := n.fs.wb.BeforeSetattr(ctx, n.tok, in), false
	defer func() { finish(made) }()
	c, fid, done, e := n.fidFor(ctx, h)
	defer func() { done() }()
	if e != 0 {
		return e
	}
	var valid, mode uint32
	if in.Valid&layer.SetMode != 0 {
		valid |= p9wire.SetattrMode
		mode = in.Mode & 0o7777
	}
	if in.Valid&layer.SetUid != 0 {
		valid |= p9wire.SetattrUID
	}
	if in.Valid&layer.SetGid != 0 {
		valid |= p9wire.SetattrGID
	}
	if in.Valid&layer.SetSize != 0 {
		valid |= p9wire.SetattrSize
	}
	var atime, mtime [2]uint64
	switch {
	case in.Valid&layer.SetAtimeNow != 0:
		valid |= p9wire.SetattrAtime // without _SET: the server's now
	case in.Valid&layer.SetAtime != 0:
		valid |= p9wire.SetattrAtime | p9wire.SetattrAtimeSet
		atime = [2]uint64{uint64(in.Atime.Unix()), uint64(in.Atime.Nanosecond())}
	}
	switch {
	case in.Valid&layer.SetMtimeNow != 0:
		valid |= p9wire.SetattrMtime
	case in.Valid&layer.SetMtime != 0:
		valid |= p9wire.SetattrMtime | p9wire.SetattrMtimeSet
		mtime = [2]uint64{uint64(in.Mtime.Unix()), uint64(in.Mtime.Nanosecond())}
	}
	if in.Valid&layer.SetCtime != 0 {
		valid |= p9wire.SetattrCtime
	}
	if valid != 0 {
		req := p9wire.Setattr{Fid: fid, Valid: valid, Mode: mode, Uid: in.Uid, Gid: in.Gid, Size: in.Size,
			Atime: atime[0], AtimeNsec: atime[1], Mtime: mtime[0], MtimeNsec: mtime[1]}
		var err error
		n.fs.ss.UntilNotLost(ctx, func() bool {
			if err = c.Do(&req); !errors.Is(err, session.ErrLost) {
				return false
			}
			// The server may have made it without answering (a
			// truncation the client would then write past): sent again
			// on the next connection, a setting made twice is made once.
			done()
			if c, fid, done, e = n.fidFor(ctx, h); e != 0 {
				done = noop
				return false
			}
			req.Fid = fid
			return true
		})
		if e != 0 {
			return e
		}
		if err != nil {
			return session.Errno(err)
		}
		made = true
		kind := layer.Attrs
		if in.Valid&layer.SetSize != 0 {
			kind = layer.Data
			n.fs.cc.DropData(n.tok.Ino, 0, 0)
		} else {
			n.fs.cc.DropAttrs(n.tok.Ino)
		}
		n.fs.raise(ctx, kind, n.tok, "")
	}
	since := n.fs.cc.Snap()
	ra, err := c.Getattr(fid)
	if err != nil {
		return session.Errno(err)
	}
	if tok := session.Token(&ra); tok == n.tok {
		n.fs.cc.PutAttr(since, tok.Ino, tok.Gen, &ra.Attr)
	}
	*out = ra.Attr
	return 0
}

// keepTimes keeps a setting of times alone with the file's delayed
// writes (writeback.KeepTimes), if the caller owns the file, as its
// cached attributes say: the server lets the owner set them, so they may
// wait for the data. out is the cached attributes (the kept times are
// overlaid after). Another caller's setting goes to the server, which
// alone knows whether it may.
func (n *node) keepTimes(ctx context.Context, in *layer.SetAttr, out *layer.Attr) bool {
	if !n.fs.wb.Has(n.tok) {
		return false
	}
	a, gen, ok := n.fs.cc.Attr(n.tok.Ino)
	if !ok || gen != n.tok.Gen || a.Uid != identOf(ctx).uid {
		return false
	}
	if !n.fs.wb.KeepTimes(n.tok, whoOf(ctx), in, time.Now()) {
		return false
	}
	*out = a
	n.fs.raise(ctx, layer.Attrs, n.tok, "")
	return true
}

// spriteAttr makes out, the attributes a lookup found, show the delayed
// writes of the file, if this client holds some or wrote some back
// meanwhile: then as Getattr gives them (on an error, out stays).
func (n *node) spriteAttr(ctx context.Context, out *layer.Attr) {
	if !n.fs.wb.Has(n.tok) {
		return
	}
	var a layer.Attr
	if n.Getattr(ctx, nil, &a) == 0 {
		*out = a
	}
}

func (n *node) Readlink(ctx context.Context) ([]byte, layer.Errno) {
	if t, ok := n.fs.cc.Readlink(n.tok.Ino); ok {
		n.fs.hit(kindLink)
		return t, 0
	}
	n.fs.miss(kindLink)
	since := n.fs.cc.Snap()
	c, fid, _, done, e := n.use(ctx)
	defer done()
	if e != 0 {
		return nil, e
	}
	var r p9wire.ReadlinkReply
	if err := c.RPC(&p9wire.FidReq{T: p9wire.Treadlink, Fid: fid}, &r); err != nil {
		return nil, session.Errno(err)
	}
	target := r.Target
	n.fs.cc.PutLink(since, n.tok.Ino, []byte(target))
	return []byte(target), 0
}

func (n *node) Statfs(ctx context.Context, out *layer.Statfs) layer.Errno {
	c, fid, _, done, e := n.use(ctx)
	defer done()
	if e != 0 {
		return e
	}
	var r p9wire.StatfsReply
	if err := c.RPC(&p9wire.FidReq{T: p9wire.Tstatfs, Fid: fid}, &r); err != nil {
		return session.Errno(err)
	}
	*out = layer.Statfs{Bsize: r.Bsize, Frsize: r.Bsize, Blocks: r.Blocks, Bfree: r.Bfree, Bavail: r.Bavail,
		Files: r.Files, Ffree: r.Ffree, NameLen: r.Namelen}
	return 0
}
