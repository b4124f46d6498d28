package remote

import (
	"context"
	"syscall"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
	"golang.org/x/sys/unix"
)

// newFid is a new fid of the node for the credentials who on c, to open:
// a clone of the node's, or, if it has none, walked by path (one walk,
// not two).
func (n *node) newFid(c *session.Conn, who uint32) (uint32, layer.Errno) {
	if !n.isRoot && !n.hasFid(c, who) {
		if fid, e := n.walkPath(c, who); e != syscall.ESTALE {
			return fid, e
		}
	}
	nfid, done, e := n.fidOn(c, who)
	if e != 0 {
		return 0, e
	}
	fid, _, err := c.Walk(nfid, nil)
	done()
	return fid, session.Errno(err)
}

// openFid makes a new fid of the node for the credentials who and opens
// it with flags (open(2)'s); ride, if not nil, goes with the open where
// the server keeps the order of a fid's requests (session.Ride).
func (n *node) openFid(c *session.Conn, who, flags uint32, ride *session.Ride) (fid, iounit uint32, q p9wire.Qid, e layer.Errno) {
	var err error
	if c.Caps()&journal.OrdersFids != 0 && (n.isRoot || n.hasFid(c, who)) {
		// The clone and its open in one round trip: the server keeps
		// their order.
		nfid, done, e := n.fidOn(c, who)
		if e != 0 {
			return 0, 0, q, e
		}
		fid, q, iounit, err = c.WalkOpen(nfid, openFlags(flags), ride)
		done()
		if fid == 0 {
			return 0, 0, q, session.Errno(err)
		}
	} else {
		if fid, e = n.newFid(c, who); e != 0 {
			return 0, 0, q, e
		}
		q, iounit, err = c.Lopen(fid, openFlags(flags))
	}
	if err == syscall.EPERM && flags&unix.O_NOATIME != 0 {
		// O_NOATIME is for the owner; it is a wish, not a need.
		q, iounit, err = c.Lopen(fid, openFlags(flags&^unix.O_NOATIME))
	}
	if err != nil {
		c.Clunk(fid)
		return 0, 0, q, session.Errno(err)
	}
	return fid, iounit, q, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	flags &^= unix.O_CREAT | unix.O_EXCL | unix.O_NOCTTY | unix.O_NOFOLLOW
	id := identOf(ctx)
	h := &handle{n: n, fs: n.fs, uid: id.uid, who: whoOf(ctx), flags: flags &^ unix.O_TRUNC}
	cc := n.fs.cc
	if flags&(unix.O_ACCMODE|unix.O_TRUNC|unix.O_APPEND) == unix.O_RDONLY && cc.MayRead(n.tok.Ino, n.tok.Gen, id.uid) &&
		(!n.fs.wb.Sprite() || n.fs.wb.OpenDelegated(n.tok, h)) {
		// Opened on the server when a read misses, if one does: Sprite's
		// rules want the server to see every open, unless it delegated
		// them (writeback/deleg.go).
		return h, 0
	}
	if flags&(unix.O_ACCMODE|unix.O_TRUNC) != unix.O_RDONLY {
		// The server may end this client's delegation as it answers:
		// the locks kept under it go there first (keptlocks.go).
		defer n.fs.kept.opening(ctx, n.tok.Ino)()
	}
	defer n.fs.wb.OpenLock(n.tok.Ino)()
	if flags&unix.O_TRUNC != 0 {
		if e := n.fs.wb.BeforeTrunc(ctx, n.tok); e != 0 {
			return nil, e
		}
	}
	since := cc.Snap()
	uncaches := n.fs.wb.Uncaches(n.tok)
	var (
		c           *session.Conn
		fid, iounit uint32
		q           p9wire.Qid
		e           layer.Errno
	)
	// An open whose connection is lost under it is sent again on the
	// next: the server may have made it (an O_TRUNC truncated) without
	// answering, and the client's delayed writes, kept for a failed
	// open, would land on the truncated file as holes. Opening again is
	// harmless: an O_TRUNC twice truncates once.
	n.fs.ss.UntilNotLost(ctx, func() bool {
		if c, e = n.fs.ss.Conn(ctx); e != 0 {
			return false
		}
		fid, iounit, q, e = n.openFid(c, h.who, flags, nil)
		return e != 0 && !c.Alive()
	})
	if e == syscall.EIO && flags&unix.O_TRUNC != 0 {
		n.mayHaveChanged(ctx)
	}
	if e != 0 {
		return nil, e
	}
	if n.fs.wb.Sprite() {
		// Our journal is applied up to this open: a name it changed
		// no longer leads here (revalidate.go).
		if e := n.stillNamed(c, h.who); e != 0 {
			c.Clunk(fid)
			return nil, e
		}
	}
	h.c, h.fid, h.iounit = c, fid, iounit
	n.fs.wb.Opened(n.tok, h, q.Vers, flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0, uncaches)
	if flags&unix.O_TRUNC != 0 {
		cc.DropData(n.tok.Ino, 0, 0)
		n.fs.wb.Truncated(n.tok, 0)
	} else if flags&unix.O_ACCMODE != unix.O_WRONLY {
		cc.Grant(since, n.tok.Ino, n.tok.Gen, id.uid, false)
	}
	return h, 0
}

func (n *node) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
	return n.openDir(ctx, identOf(ctx).uid, whoOf(ctx), false)
}

// openDir opens the directory for uid, acting as who; quiet, for a
// refresh, it starts no lookups ahead.
func (n *node) openDir(ctx context.Context, uid, who uint32, quiet bool) (layer.DirStream, layer.Errno) {
	cc := n.fs.cc
	since := cc.Snap()
	touch := cc.Touches(n.tok.Ino)
	ents, listed := cc.Listing(n.tok.Ino, uid)
	if listed {
		// Listed by this user before (so it may), and cached. If the
		// listing moves the atime (relatime), the directory opens on the
		// server at the first READDIR, to move it there, if one comes; a
		// kernel that lists from its own cache sends none.
		if touch {
			n.fs.miss(kindDir)
		} else {
			n.fs.hit(kindDir)
		}
		return &cachedDir{ents: ents, since: since, touch: touch, h: &handle{n: n, fs: n.fs, uid: uid, who: who, flags: unix.O_RDONLY | unix.O_DIRECTORY}}, 0
	}
	n.fs.miss(kindDir)
	c, e := n.fs.ss.Conn(ctx)
	if e != 0 {
		return nil, e
	}
	flags := uint32(unix.O_RDONLY | unix.O_DIRECTORY)
	// The first Treaddir goes with the open, in its round trip: the
	// kernel's READDIR follows.
	first := &p9wire.DataReply{T: p9wire.Treaddir}
	count := 0
	ride := &session.Ride{Make: func(c *session.Conn, fid uint32) (p9wire.Message, p9wire.Message) {
		count = c.IOSize(0)
		return &p9wire.Read{T: p9wire.Treaddir, Fid: fid, Count: uint32(count)}, first
	}}
	fid, iounit, _, e := n.openFid(c, who, flags, ride)
	if e != 0 {
		return nil, e
	}
	d := &dir{h: &handle{n: n, fs: n.fs, uid: uid, who: who, flags: flags, c: c, fid: fid, iounit: iounit}, since: since, keep: true, touch: touch, quiet: quiet}
	if ride.Sent && ride.Err == nil {
		d.first, d.firstCount = first, count
	}
	return d, 0
}

// openFlags are the wire flags a file is opened with on the server.
// O_DIRECT stays here: it keeps a program's I/O out of this machine's
// page cache, which the kernel above already does; on the server it would
// only ask for aligned I/O, which some servers refuse at open (diod:
// EINVAL).
func openFlags(flags uint32) uint32 { return p9wire.WireFlags(flags &^ unix.O_DIRECT) }

// mayHaveChanged is told of a change to the file the server may have
// made without the client knowing (an O_TRUNC open whose connection was
// lost, and no other came in time): nothing of it stays cached, here or
// in the kernels above, whose sizes come back only with a lookup, so its
// names go too (else an O_APPEND write lands at the old size, past the
// truncated end).
func (n *node) mayHaveChanged(ctx context.Context) {
	n.fs.cc.DropData(n.tok.Ino, 0, 0)
	n.fs.cc.DropAttrs(n.tok.Ino)
	n.fs.raise(ctx, layer.Data, n.tok, "")
	type name struct {
		dir  layer.Token
		name string
	}
	var names []name
	n.fs.tree.Lock()
	for _, t := range n.twinsLocked() {
		if t.parent != nil {
			names = append(names, name{t.parent.tok, t.name})
		}
	}
	n.fs.tree.Unlock()
	for _, m := range names {
		n.fs.cc.DropEntry(m.dir.Ino, m.name)
		n.fs.raise(ctx, layer.Entries, m.dir, m.name)
	}
}
